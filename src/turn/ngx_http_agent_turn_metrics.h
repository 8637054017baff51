
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_TURN_METRICS_H_INCLUDED_
#define _NGX_HTTP_AGENT_TURN_METRICS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_turn.h"


/*
 * A model call's start and end, as the metrics count them and the audit
 * records them: ngx_http_agent_turn_metrics.c
 */
void ngx_http_agent_turn_call_start(ngx_http_agent_turn_t *t);
void ngx_http_agent_turn_call_end(ngx_http_agent_turn_t *t,
    ngx_http_agent_call_e outcome, ngx_str_t *reason);

/* the turn goes with its model call still running: it is cancelled */
void ngx_http_agent_turn_call_abort(ngx_http_agent_turn_t *t);

/* the reply's first piece arrived */
void ngx_http_agent_turn_first_chunk(ngx_http_agent_turn_t *t);

/* the turn a request started, kept with the request */
typedef struct {
    ngx_str_t                     id;
    ngx_uint_t                    turn;
} ngx_http_agent_turn_mark_t;

ngx_int_t ngx_http_agent_turn_mark(ngx_http_request_t *r, ngx_str_t *id,
    ngx_uint_t turn);

/* the turn r started, or NULL */
ngx_http_agent_turn_mark_t *ngx_http_agent_turn_started(
    ngx_http_request_t *r);


#endif /* _NGX_HTTP_AGENT_TURN_METRICS_H_INCLUDED_ */
