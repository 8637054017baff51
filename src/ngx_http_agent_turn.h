
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_TURN_H_INCLUDED_
#define _NGX_HTTP_AGENT_TURN_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"


ngx_int_t ngx_http_agent_turn_init_filters(ngx_conf_t *cf);

/*
 * Runs the turn of a conversation whose lease this worker holds, on a
 * request of its own: r is only where the turn takes its server
 * configuration from, and may go away at once.
 */
ngx_int_t ngx_http_agent_turn_start(ngx_http_request_t *r,
    ngx_http_agent_t *agent, ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t turn);

/* appends an event built from fields and wakes the subscribers */
ngx_int_t ngx_http_agent_emit(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t type, ngx_str_t *fields);


#endif /* _NGX_HTTP_AGENT_TURN_H_INCLUDED_ */
