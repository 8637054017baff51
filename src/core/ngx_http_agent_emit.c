
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_emit.h"


ngx_int_t
ngx_http_agent_emit(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t type, ngx_str_t *fields)
{
    return ngx_http_agent_emit_delta(zone, id, type, fields, NULL);
}


ngx_int_t
ngx_http_agent_emit_delta(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t type, ngx_str_t *fields, ngx_http_agent_delta_t *delta)
{
    ngx_uint_t               n;
    ngx_pid_t                pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *ev;

    ngx_http_agent_zone_lock(zone);

    conv = ngx_http_agent_conv_find_locked(zone, id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(zone);
        return NGX_ERROR;
    }

    if (delta) {
        ngx_http_agent_partial_add_locked(zone, conv, delta);
    }

    ev = ngx_http_agent_log_add_locked(zone, conv, type, fields);

    n = ngx_http_agent_conv_sub_pids_locked(conv, pids);

    ngx_http_agent_zone_unlock(zone);

    if (ev == NULL) {
        return NGX_ERROR;
    }

    ngx_http_agent_wake(id, pids, n);

    return NGX_OK;
}
