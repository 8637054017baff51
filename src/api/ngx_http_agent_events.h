
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_EVENTS_H_INCLUDED_
#define _NGX_HTTP_AGENT_EVENTS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_format.h"


/* the running turn's stream, or 204 when none runs */
#define NGX_HTTP_AGENT_EVENTS_TURN  0x01


/* agent_events: a conversation's events as text/event-stream */
ngx_int_t ngx_http_agent_events_handler(ngx_http_request_t *r);

/* a subscriber of conversation id, in a format: what the handler starts */
ngx_int_t ngx_http_agent_events_stream(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t after, ngx_http_agent_events_format_t *format, ngx_uint_t flags);

/* new events of a conversation: this worker's subscribers of it catch up */
void ngx_http_agent_events_deliver(ngx_str_t *id);

/* graceful shutdown: end every event stream of this worker */
void ngx_http_agent_events_shutdown(void);

/* the request and the answer's head: ngx_http_agent_events_request.c */
ngx_int_t ngx_http_agent_events_request_not_allowed(ngx_http_request_t *r);
ngx_int_t ngx_http_agent_events_request_after(ngx_http_request_t *r,
    uint64_t *after);
ngx_int_t ngx_http_agent_events_request_header(ngx_http_request_t *r,
    ngx_http_agent_events_format_t *format);
ngx_int_t ngx_http_agent_events_header_add(ngx_http_request_t *r,
    char *key, char *value);


#endif /* _NGX_HTTP_AGENT_EVENTS_H_INCLUDED_ */
