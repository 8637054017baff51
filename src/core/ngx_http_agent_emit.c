
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


static ngx_int_t ngx_http_agent_emit_group(ngx_http_agent_zone_t *zone,
    ngx_str_t *id, ngx_http_agent_emit_event_t *events, ngx_uint_t n,
    ngx_http_agent_delta_t *delta);


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
    ngx_http_agent_emit_event_t  ev;

    ev.type = type;
    ev.fields = *fields;

    return ngx_http_agent_emit_group(zone, id, &ev, 1, delta);
}


ngx_int_t
ngx_http_agent_emit_all(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_http_agent_emit_event_t *events, ngx_uint_t n)
{
    return ngx_http_agent_emit_group(zone, id, events, n, NULL);
}


/*
 * The events (and the delta first, if any) in one hold of the zone's
 * lock; the conversation's subscribers are woken if any event went in
 */

static ngx_int_t
ngx_http_agent_emit_group(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_http_agent_emit_event_t *events, ngx_uint_t n,
    ngx_http_agent_delta_t *delta)
{
    ngx_int_t               rc;
    ngx_uint_t              i, npids;
    ngx_pid_t               pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_conv_t  *conv;

    ngx_http_agent_zone_lock(zone);

    conv = ngx_http_agent_conv_find_locked(zone, id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(zone);
        return NGX_ERROR;
    }

    if (delta) {
        ngx_http_agent_partial_add_locked(zone, conv, delta);
    }

    rc = NGX_OK;

    for (i = 0; i < n; i++) {
        if (ngx_http_agent_log_add_locked(zone, conv, events[i].type,
                                          &events[i].fields)
            == NULL)
        {
            rc = NGX_ERROR;
            break;
        }
    }

    npids = ngx_http_agent_conv_sub_pids_locked(conv, pids);

    ngx_http_agent_zone_unlock(zone);

    if (i) {
        ngx_http_agent_wake(id, pids, npids);
    }

    return rc;
}
