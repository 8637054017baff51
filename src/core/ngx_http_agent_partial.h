
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_PARTIAL_H_INCLUDED_
#define _NGX_HTTP_AGENT_PARTIAL_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_zone.h"


/*
 * The reply so far of the model call streaming, as one record in the
 * zone that grows by doubling: at most this many bytes, its bookkeeping
 * included.  A reply larger than that has none past it.
 */
#define NGX_HTTP_AGENT_PARTIAL_MAX       (256 * 1024)
#define NGX_HTTP_AGENT_PARTIAL_MIN       512
#define NGX_HTTP_AGENT_MESSAGE_ID_LEN    32


/* a live delta, as the snapshot takes it */
typedef struct {
    ngx_str_t                     message_id;
    ngx_uint_t                    delta_seq;
    ngx_uint_t                    type;       /* NGX_HTTP_AGENT_EV_*_DELTA */
    ngx_uint_t                    index;      /* of a tool call */
    ngx_str_t                     data;
} ngx_http_agent_delta_t;


/* all of these run with the zone locked */

/*
 * Appends a delta, emitted under the same lock: a delta_seq of 1 starts
 * the snapshot anew (a take-over makes the model call again).
 */
void ngx_http_agent_partial_add_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_delta_t *delta);
void ngx_http_agent_partial_free_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
void ngx_http_agent_partial_drop_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, char *why);

/*
 * The snapshot as JSON members, "message_id":...,"text":...,
 * ["thinking":...,]["tool_calls":[...],]"delta_seq":N: the room they
 * take at most (0: nothing streams), and written at p.
 */
size_t ngx_http_agent_partial_size_locked(ngx_http_agent_conv_t *conv);
u_char *ngx_http_agent_partial_json_locked(ngx_http_agent_conv_t *conv,
    u_char *p);

/* the reply so far as a parsed object, for a format to read */
yajl_val ngx_http_agent_partial_parse_locked(ngx_http_agent_conv_t *conv,
    ngx_log_t *log);


#endif /* _NGX_HTTP_AGENT_PARTIAL_H_INCLUDED_ */
