
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_TRACE_H_INCLUDED_
#define _NGX_HTTP_AGENT_TRACE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"


#define NGX_HTTP_AGENT_TRACE_ID_LEN      16
#define NGX_HTTP_AGENT_SPAN_ID_LEN       8
/* "00-" trace "-" span "-" flags */
#define NGX_HTTP_AGENT_TRACEPARENT_LEN   55
/* W3C's bound on tracestate (32 members of at most 256 bytes, and more) */
#define NGX_HTTP_AGENT_TRACESTATE_MAX    512
/* a sampling ratio is kept in millionths */
#define NGX_HTTP_AGENT_TRACE_ONE         1000000


/*
 * A turn's trace context, as its user_msg keeps it: the trace, the
 * turn's own span (invoke_agent), the caller's span if a traceparent
 * came with the message, and whether the turn is sampled.  Every other
 * span of the turn has an id derived from these and from what it is (a
 * model call's number in the turn, a tool call's id), so that the span
 * a subrequest names in its traceparent and the span exported at the
 * turn's end are the same, whichever worker does either.
 */

typedef struct {
    u_char                        trace_id[NGX_HTTP_AGENT_TRACE_ID_LEN];
    u_char                        span_id[NGX_HTTP_AGENT_SPAN_ID_LEN];
    u_char                        parent_id[NGX_HTTP_AGENT_SPAN_ID_LEN];
    ngx_str_t                     state;
    unsigned                      valid:1;
    unsigned                      parent:1;
    unsigned                      sampled:1;
} ngx_http_agent_trace_t;


/*
 * A turn ended (its terminal event was just logged): the exporter's, set
 * at configuration when agent_trace is on (zone locked)
 */
extern void  (*ngx_http_agent_trace_ended_locked)(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_event_t *ev);


ngx_int_t ngx_http_agent_trace_parse(ngx_str_t *traceparent,
    ngx_http_agent_trace_t *tc);
void ngx_http_agent_trace_start(ngx_http_agent_trace_t *tc,
    ngx_uint_t ratio);
void ngx_http_agent_trace_span(ngx_http_agent_trace_t *tc, char *what,
    ngx_str_t *key, u_char *span);
u_char *ngx_http_agent_trace_header(u_char *p, ngx_http_agent_trace_t *tc,
    u_char *span);
void ngx_http_agent_trace_request(ngx_http_request_t *r,
    ngx_http_agent_trace_t *tc, ngx_uint_t ratio);
ngx_uint_t ngx_http_agent_trace_json(yajl_gen g, ngx_http_agent_trace_t *tc);
ngx_uint_t ngx_http_agent_trace_resolver_json(ngx_http_request_t *r,
    yajl_gen g);
ngx_int_t ngx_http_agent_trace_from(yajl_val ev, ngx_http_agent_trace_t *tc);
ngx_int_t ngx_http_agent_trace_hex(ngx_str_t *s, u_char *out, size_t n);


#endif /* _NGX_HTTP_AGENT_TRACE_H_INCLUDED_ */
