
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_SPANS_H_INCLUDED_
#define _NGX_HTTP_AGENT_SPANS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_turn.h"


/* a turn that ended, as the exporter builds its spans */
typedef struct {
    ngx_str_t                    *events;     /* user_msg ... terminal */
    ngx_uint_t                    nevents;
    ngx_str_t                     id;         /* the conversation */
    ngx_str_t                     agent;
    ngx_flag_t                    content;
} ngx_http_agent_spans_turn_t;


/* a subrequest of the turn carries the traceparent of its span */
ngx_int_t ngx_http_agent_spans_header(ngx_http_agent_turn_t *t,
    ngx_http_agent_sub_t *sub, ngx_http_request_t *sr);

/* an assistant_msg's fields, with what its chat span needs */
ngx_int_t ngx_http_agent_spans_reply(ngx_http_agent_turn_t *t,
    ngx_str_t *fields);

/* a turn_failed's fields, with the failed call's attempts made again */
ngx_int_t ngx_http_agent_spans_failed(ngx_http_agent_turn_t *t,
    ngx_str_t *reason);

/* the turn's spans, OTLP/JSON objects, into the array g has open */
ngx_int_t ngx_http_agent_spans_build(ngx_pool_t *pool, yajl_gen g,
    ngx_http_agent_spans_turn_t *turn, ngx_uint_t *nspans);


#endif /* _NGX_HTTP_AGENT_SPANS_H_INCLUDED_ */
