
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_expire.h"
#include "ngx_http_agent_cancel.h"
#include "ngx_http_agent_store.h"


/* how often, and how long, a cancel looks for the turn to be down */
#define NGX_HTTP_AGENT_CANCEL_POLL     10
#define NGX_HTTP_AGENT_CANCEL_WAIT     10000


typedef struct {
    ngx_http_request_t           *request;
    ngx_str_t                     id;
    uint64_t                      before;     /* the last cancel's seq */
    ngx_msec_t                    deadline;
    ngx_event_t                   timer;
} ngx_http_agent_cancel_t;


static void ngx_http_agent_cancel_poll(ngx_event_t *ev);
static void ngx_http_agent_cancel_cleanup(void *data);
static ngx_int_t ngx_http_agent_cancel_answer(ngx_http_request_t *r,
    ngx_str_t *id, ngx_uint_t cancelled, uint64_t seq,
    ngx_http_agent_state_e state);


/*
 * POST: "stop generating", from every state.  The answer comes once the
 * turn is down: at once when no turn runs (the waiting calls resolve as
 * cancelled here), else when the worker running it has taken it down.
 */

ngx_int_t
ngx_http_agent_cancel_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_str_t                    id;
    ngx_pid_t                    lease;
    uint64_t                     seq;
    ngx_http_agent_fsm_t         fsm;
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_pool_cleanup_t          *cln;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_cancel_t     *ctx;
    ngx_http_agent_main_conf_t  *amcf;

    if (ngx_http_agent_api_request(r, NGX_HTTP_POST, "POST", &id,
                                   &rc)
        != NGX_OK)
    {
        return rc;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    conv = ngx_http_agent_api_conv_lock(r, z, &id, &rc);
    if (conv == NULL) {
        return rc;
    }

    if (conv->state == NGX_HTTP_AGENT_IDLE) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_cancel_answer(r, &id, 0, 0,
                                            NGX_HTTP_AGENT_IDLE);
    }

    if (conv->lease == 0) {
        /* waiting for input, no turn running: cancelled here and now */

        fsm.fields = NULL;

        /* and a message that waited runs now */
        rc = ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_CANCEL,
                                       &fsm);
        seq = conv->cancelled;

        ngx_http_agent_zone_unlock(z);

        alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
        ngx_http_agent_fsm_after(alcf->agent, z, &id, &fsm);

        if (rc != NGX_OK) {
            return ngx_http_agent_json_error(r,
                                             NGX_HTTP_SERVICE_UNAVAILABLE,
                                             "zone_full",
                                             "the cancel could not be "
                                             "recorded");
        }

        return ngx_http_agent_cancel_answer(r, &id, 1, seq,
                                            NGX_HTTP_AGENT_IDLE);
    }

    conv->cancel = 1;
    lease = conv->lease;
    seq = conv->cancelled;

    ngx_http_agent_zone_unlock(z);

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_cancel_t));
    cln = ngx_pool_cleanup_add(r->pool, 0);

    if (ctx == NULL || cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->request = r;
    ctx->id = id;
    ctx->before = seq;
    ctx->deadline = ngx_current_msec + NGX_HTTP_AGENT_CANCEL_WAIT;

    ctx->timer.handler = ngx_http_agent_cancel_poll;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;

    cln->handler = ngx_http_agent_cancel_cleanup;
    cln->data = ctx;

    if (lease == ngx_pid) {
        ngx_http_agent_turn_cancel(&id);

    } else {
        ngx_http_agent_wake(&id, &lease, 1);
    }

    r->main->count++;

    ngx_http_agent_cancel_poll(&ctx->timer);

    return NGX_DONE;
}


static void
ngx_http_agent_cancel_poll(ngx_event_t *ev)
{
    ngx_http_agent_cancel_t *ctx = ev->data;

    uint64_t                     seq;
    ngx_uint_t                   down;
    ngx_http_request_t          *r;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_state_e       state;
    ngx_http_agent_main_conf_t  *amcf;

    r = ctx->request;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &ctx->id);

    /*
     * down: no turn runs, or the turn's cancelled event is logged (a
     * queued message's turn may hold the lease already)
     */

    seq = conv ? conv->cancelled : 0;
    down = (conv == NULL || conv->lease == 0 || seq > ctx->before);
    state = conv ? conv->state : NGX_HTTP_AGENT_IDLE;

    ngx_http_agent_zone_unlock(z);

    if (!down) {
        if ((ngx_msec_int_t) (ctx->deadline - ngx_current_msec) <= 0) {
            ngx_http_finalize_request(r,
                ngx_http_agent_json_error(r, NGX_HTTP_GATEWAY_TIME_OUT,
                                          "timeout",
                                          "the turn did not stop in time"));
            return;
        }

        ngx_add_timer(&ctx->timer, NGX_HTTP_AGENT_CANCEL_POLL);
        return;
    }

    /* the turn may have ended by itself before it saw the cancel */

    ngx_http_finalize_request(r,
        ngx_http_agent_cancel_answer(r, &ctx->id, seq > ctx->before, seq,
                                     state));
}


static void
ngx_http_agent_cancel_cleanup(void *data)
{
    ngx_http_agent_cancel_t *ctx = data;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}


/*
 * {"conversation":ID,"cancelled":true,"seq":N} with the seq of the
 * cancelled event, or {"conversation":ID,"cancelled":false,"state":S}
 * when there was nothing to cancel.
 */

static ngx_int_t
ngx_http_agent_cancel_answer(ngx_http_request_t *r, ngx_str_t *id,
    ngx_uint_t cancelled, uint64_t seq, ngx_http_agent_state_e state)
{
    u_char     *p;
    ngx_str_t   json;

    p = ngx_pnalloc(r->pool, id->len + 96);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.data = p;

    if (cancelled) {
        p = ngx_sprintf(p, "{\"conversation\":\"%V\",\"cancelled\":true,"
                        "\"seq\":%uL}", id, seq);

    } else {
        p = ngx_sprintf(p, "{\"conversation\":\"%V\",\"cancelled\":false,"
                        "\"state\":\"%V\"}",
                        id, &ngx_http_agent_state_names[state]);
    }

    json.len = p - json.data;

    return ngx_http_agent_store_ack(r, id, cancelled ? seq : 0, NGX_HTTP_OK,
                                    &json);
}


