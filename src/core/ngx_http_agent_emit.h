
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_EMIT_H_INCLUDED_
#define _NGX_HTTP_AGENT_EMIT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_partial.h"


/* appends an event built from fields and wakes the subscribers */
ngx_int_t ngx_http_agent_emit(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t type, ngx_str_t *fields);

/* an event of a group that emit_all() appends */
typedef struct {
    ngx_uint_t                    type;
    ngx_str_t                     fields;
} ngx_http_agent_emit_event_t;

/*
 * appends the events of a group in one hold of the zone's lock, so that a
 * worker's death never leaves part of them in the log
 */
ngx_int_t ngx_http_agent_emit_all(ngx_http_agent_zone_t *zone,
    ngx_str_t *id, ngx_http_agent_emit_event_t *events, ngx_uint_t n);

/* the same for a live delta, which joins the reply so far in that lock */
ngx_int_t ngx_http_agent_emit_delta(ngx_http_agent_zone_t *zone,
    ngx_str_t *id, ngx_uint_t type, ngx_str_t *fields,
    ngx_http_agent_delta_t *delta);


#endif /* _NGX_HTTP_AGENT_EMIT_H_INCLUDED_ */
