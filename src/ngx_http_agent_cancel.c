
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
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


/* a call of the turn, and whether the log has its result */
typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     name;
    ngx_uint_t                    paired;
} ngx_http_agent_pair_t;


static void ngx_http_agent_cancel_poll(ngx_event_t *ev);
static void ngx_http_agent_cancel_cleanup(void *data);
static ngx_int_t ngx_http_agent_cancel_answer(ngx_http_request_t *r,
    ngx_str_t *id, ngx_uint_t cancelled, uint64_t seq,
    ngx_http_agent_state_e state);
static ngx_int_t ngx_http_agent_pair_event(ngx_pool_t *pool,
    ngx_http_agent_event_t *e, ngx_array_t *calls);
static ngx_int_t ngx_http_agent_pair_copy(ngx_pool_t *pool, ngx_str_t *dst,
    char *src);


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
    ngx_pid_t                    lease, pids[NGX_HTTP_AGENT_SUB_WORKERS];
    uint64_t                     seq, nseq;
    ngx_uint_t                   n, next, turn;
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

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_not_found(r, &id);
    }

    if (ngx_http_agent_conv_agent_locked(conv, ngx_http_agent_api_agent(r))
        != NGX_OK)
    {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_api_foreign(r);
    }

    if (conv->state == NGX_HTTP_AGENT_IDLE) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_cancel_answer(r, &id, 0, 0,
                                            NGX_HTTP_AGENT_IDLE);
    }

    if (conv->lease == 0) {
        /* waiting for input, no turn running: cancelled here and now */

        rc = ngx_http_agent_cancel_locked(z, conv);
        seq = conv->cancelled;

        /* a message that waited runs now */
        next = (rc == NGX_OK
                && ngx_http_agent_message_next_locked(z, conv, &turn, &nseq)
                   == NGX_OK);

        n = ngx_http_agent_sub_pids_locked(conv, pids);

        ngx_http_agent_zone_unlock(z);

        ngx_http_agent_wake(&id, pids, n);

        if (next) {
            alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
            ngx_http_agent_turn_next(alcf->agent, z, &id, turn);
        }

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

    down = (conv == NULL || conv->lease == 0);
    seq = conv ? conv->cancelled : 0;
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


/*
 * A cancel of this turn was asked for, if the zone says so: the provider
 * call is aborted (its connection closes) and its partial reply kept,
 * marked cancelled; running tool calls are aborted with a [cancelled]
 * result each; waiting calls resolve as cancelled; then the terminal
 * cancelled event, idle, and the lease given back.
 */

void
ngx_http_agent_turn_abort(ngx_http_agent_turn_t *t)
{
    uint64_t                seq;
    ngx_str_t               ended;
    ngx_uint_t              n, cancel, next, turn;
    ngx_pid_t               pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_conv_t  *conv;

    if (t->cancelling) {
        return;
    }

    ngx_http_agent_zone_lock(t->zone);
    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);
    cancel = conv && conv->cancel;
    ngx_http_agent_zone_unlock(t->zone);

    if (!cancel) {
        return;
    }

    t->cancelling = 1;

    ngx_log_error(NGX_LOG_INFO, &t->log, 0, "agent turn cancelled");

    if (t->sub.sr && !t->sr_done) {
        t->sr_done = 1;
        ngx_http_agent_subrequest_abort(t->sub.sr);
        t->sub.sr = NULL;
    }

    if (t->pool && t->reply && !t->recorded && t->reply->text.len
        && ngx_http_agent_turn_record(t, NGX_HTTP_AGENT_MSG_CANCELLED)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent turn could not record the cancelled reply");
    }

    ngx_http_agent_tools_cancel(t);

    ngx_str_set(&ended, "{}");
    n = 0;
    next = 0;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv) {
        (void) ngx_http_agent_cancel_locked(t->zone, conv);
        (void) ngx_http_agent_event_add_locked(t->zone, conv,
                                               NGX_HTTP_AGENT_EV_TURN_ENDED,
                                               &ended);
        ngx_http_agent_lease_locked(t->zone, conv, 0);
        conv->cancel = 0;

        /* an interrupting message runs now */
        next = (ngx_http_agent_message_next_locked(t->zone, conv, &turn,
                                                   &seq)
                == NGX_OK);

        n = ngx_http_agent_sub_pids_locked(conv, pids);
    }

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_wake(&t->id, pids, n);

    if (next) {
        ngx_http_agent_turn_next(t->agent, t->zone, &t->id, turn);
    }

    ngx_http_agent_turn_close(t);
}


/* a turn for the message that waited, on a request of the module's own */

void
ngx_http_agent_turn_next(ngx_http_agent_t *agent, ngx_http_agent_zone_t *zone,
    ngx_str_t *id, ngx_uint_t turn)
{
    ngx_str_t               reason;
    ngx_uint_t              n;
    ngx_pid_t               pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_conv_t  *conv;

    if (agent != NULL && agent->conf_ctx != NULL
        && ngx_http_agent_turn_start(NULL, agent, zone, id, turn, 0) == NGX_OK)
    {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "agent could not start the next turn of \"%V\"", id);

    /* the turn ends here, and the messages after it get their turns */

    ngx_str_set(&reason, "{\"reason\":\"the turn could not start\"}");

    n = 0;

    ngx_http_agent_zone_lock(zone);

    conv = ngx_http_agent_conv_find_locked(zone, id);

    if (conv && conv->lease == ngx_pid && conv->turn == turn) {
        (void) ngx_http_agent_event_add_locked(zone, conv,
                                               NGX_HTTP_AGENT_EV_TURN_FAILED,
                                               &reason);
        (void) ngx_http_agent_state_set_locked(zone, conv,
                                               NGX_HTTP_AGENT_IDLE);
        ngx_http_agent_lease_locked(zone, conv, 0);

        if (conv->nqueued) {
            zone->sh->stalled = 1;
        }

        n = ngx_http_agent_sub_pids_locked(conv, pids);
    }

    ngx_http_agent_zone_unlock(zone);

    ngx_http_agent_wake(id, pids, n);
}


ngx_int_t
ngx_http_agent_cancel_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    ngx_str_t                 fields;
    ngx_uint_t                i;
    ngx_http_agent_event_t   *ev;

    for (i = 0; i < NGX_HTTP_AGENT_PENDING; i++) {
        if (conv->pending[i].kind) {
            (void) ngx_http_agent_pending_settle_locked(z, conv,
                                                &conv->pending[i],
                                                NGX_HTTP_AGENT_SETTLE_CANCELLED,
                                                "user cancelled");
        }
    }

    /* a call no result was recorded for, whatever the reason */
    (void) ngx_http_agent_turn_pair_locked(z, conv, "[cancelled]");

    ngx_str_set(&fields, "{\"reason\":\"cancelled by the user\"}");

    ev = ngx_http_agent_event_add_locked(z, conv,
                                         NGX_HTTP_AGENT_EV_CANCELLED,
                                         &fields);
    if (ev == NULL) {
        return NGX_ERROR;
    }

    conv->cancelled = ev->seq;

    (void) ngx_http_agent_state_set_locked(z, conv, NGX_HTTP_AGENT_IDLE);

    return NGX_OK;
}


/*
 * Under the lock: every call the turn's assistant messages made gets
 * exactly one result.  A call left without one (its result could not be
 * recorded, or the turn ended under it) is given an error result here,
 * before the turn's terminal event, so that the log stays paired and the
 * next model request is one a provider takes.  Its waiting entry, if any,
 * goes with it.
 */

ngx_int_t
ngx_http_agent_turn_pair_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, char *error)
{
    ngx_int_t                  rc;
    ngx_uint_t                 i;
    ngx_pool_t                *pool;
    ngx_array_t                calls;
    ngx_queue_t               *q;
    ngx_http_agent_pair_t     *c;
    ngx_http_agent_event_t    *e;
    ngx_http_agent_pending_t  *pd;

    if (ngx_queue_empty(&conv->log)) {
        return NGX_OK;
    }

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&calls, pool, 4, sizeof(ngx_http_agent_pair_t))
        != NGX_OK)
    {
        goto failed;
    }

    /* the turn's calls and results, in order */

    for (q = ngx_http_agent_log_turn_locked(conv);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type != NGX_HTTP_AGENT_EV_ASSISTANT_MSG
            && e->type != NGX_HTTP_AGENT_EV_TOOL_RESULT)
        {
            continue;
        }

        if (ngx_http_agent_pair_event(pool, e, &calls) != NGX_OK) {
            goto failed;
        }
    }

    c = calls.elts;
    rc = NGX_OK;

    for (i = 0; i < calls.nelts; i++) {
        if (c[i].paired) {
            continue;
        }

        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "agent call \"%V\" of \"%*s\" had no result: %s",
                      &c[i].id, conv->id_len, conv->id, error);

        if (ngx_http_agent_error_result_locked(z, conv, &c[i].id, &c[i].name,
                                               error)
            != NGX_OK)
        {
            rc = NGX_ERROR;
        }

        pd = ngx_http_agent_pending_find_locked(conv, &c[i].id);
        if (pd) {
            ngx_http_agent_pending_remove_locked(conv, pd);
        }
    }

    ngx_destroy_pool(pool);

    return rc;

failed:

    ngx_destroy_pool(pool);

    return NGX_ERROR;
}


/* the calls an assistant_msg made, or the call a tool_result pairs */

static ngx_int_t
ngx_http_agent_pair_event(ngx_pool_t *pool, ngx_http_agent_event_t *e,
    ngx_array_t *calls)
{
    char                    err[NGX_HTTP_AGENT_JSON_ERR];
    u_char                 *json;
    ngx_str_t               id;
    ngx_uint_t              i;
    yajl_val                root, list, v;
    ngx_http_agent_pair_t  *c;

    static const char  *calls_path[] = { "tool_calls", NULL };
    static const char  *id_path[] = { "id", NULL };
    static const char  *name_path[] = { "name", NULL };
    static const char  *result_path[] = { "tool_call_id", NULL };

    /* NUL-terminated for yajl_tree_parse() */
    json = ngx_pnalloc(pool, e->len + 1);
    if (json == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(json, e->data, e->len);
    json[e->len] = '\0';

    root = ngx_http_agent_json_parse(json, e->len,
                                     NGX_HTTP_AGENT_JSON_LOG_DEPTH, err,
                                     sizeof(err));
    if (root == NULL) {
        return NGX_OK;
    }

    if (e->type == NGX_HTTP_AGENT_EV_TOOL_RESULT) {
        v = yajl_tree_get(root, result_path, yajl_t_string);

        if (v) {
            id.data = (u_char *) YAJL_GET_STRING(v);
            id.len = ngx_strlen(id.data);

            c = calls->elts;

            for (i = 0; i < calls->nelts; i++) {
                if (c[i].id.len == id.len
                    && ngx_memcmp(c[i].id.data, id.data, id.len) == 0)
                {
                    c[i].paired = 1;
                }
            }
        }

        yajl_tree_free(root);
        return NGX_OK;
    }

    list = yajl_tree_get(root, calls_path, yajl_t_array);

    for (i = 0; list && i < YAJL_GET_ARRAY(list)->len; i++) {
        v = yajl_tree_get(YAJL_GET_ARRAY(list)->values[i], id_path,
                          yajl_t_string);
        if (v == NULL) {
            continue;
        }

        c = ngx_array_push(calls);
        if (c == NULL) {
            yajl_tree_free(root);
            return NGX_ERROR;
        }

        c->paired = 0;

        if (ngx_http_agent_pair_copy(pool, &c->id, YAJL_GET_STRING(v))
            != NGX_OK)
        {
            yajl_tree_free(root);
            return NGX_ERROR;
        }

        v = yajl_tree_get(YAJL_GET_ARRAY(list)->values[i], name_path,
                          yajl_t_string);

        if (ngx_http_agent_pair_copy(pool, &c->name,
                                     v ? YAJL_GET_STRING(v) : "")
            != NGX_OK)
        {
            yajl_tree_free(root);
            return NGX_ERROR;
        }
    }

    yajl_tree_free(root);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_pair_copy(ngx_pool_t *pool, ngx_str_t *dst, char *src)
{
    dst->len = ngx_strlen(src);

    dst->data = ngx_pnalloc(pool, dst->len + 1);
    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, src, dst->len + 1);

    return NGX_OK;
}
