
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_spans.h"
#include "ngx_http_agent_turn_metrics.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_store_history.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_output.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_budget.h"
#include "ngx_http_agent_detached.h"
#include "ngx_http_agent_mcp_rpc.h"
#include "ngx_http_agent_hook.h"
#include "ngx_http_agent_client_tools.h"
#include "ngx_http_agent_summary.h"

#include <yajl/yajl_tree.h>


static ngx_int_t ngx_http_agent_turn_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_turn_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_agent_turn_take(void *data, u_char *p,
    u_char *last);
static ngx_int_t ngx_http_agent_turn_request_body(ngx_http_agent_turn_t *t,
    ngx_str_t *body);
static ngx_int_t ngx_http_agent_turn_post_subrequest(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_agent_turn_call_done(ngx_event_t *ev);
static void ngx_http_agent_turn_deadline(ngx_event_t *ev);
static ngx_uint_t ngx_http_agent_turn_log_grew(ngx_http_agent_turn_t *t);
static ngx_int_t ngx_http_agent_turn_store_busy(ngx_http_agent_turn_t *t);
static u_char *ngx_http_agent_turn_log_error(ngx_log_t *log, u_char *buf,
    size_t len);


/* a history read the store's pool refused: tried again so often, ms */
#define NGX_HTTP_AGENT_TURN_BUSY_WAIT   50
#define NGX_HTTP_AGENT_TURN_BUSY_TRIES  100

/*
 * A provider's Retry-After, seconds, is taken up to a day: the retry's
 * cap bounds the wait anyway, and the delay in ms must not wrap
 */
#define NGX_HTTP_AGENT_RETRY_AFTER_MAX  86400


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;




/* the turns this worker runs, for a cancel to find */
static ngx_queue_t  ngx_http_agent_turns;


ngx_int_t
ngx_http_agent_turn_init_filters(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_agent_turn_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_agent_turn_body_filter;

    return NGX_OK;
}


/*
 * The provider subrequest's response is the turn's input: its header and
 * body stop here and never reach the rest of the chain, let alone the
 * write filter of a connection that has no socket.
 */

static ngx_int_t
ngx_http_agent_turn_header_filter(ngx_http_request_t *r)
{
    time_t                  ra;
    ngx_uint_t              i;
    ngx_list_part_t        *part;
    ngx_table_elt_t        *h;
    ngx_http_agent_sub_t   *sub;
    ngx_http_agent_turn_t  *t;

    sub = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (sub == NULL || r != sub->sr) {
        return ngx_http_next_header_filter(r);
    }

    r->header_sent = 1;

    if (sub->kind == NGX_HTTP_AGENT_SUB_TOOL) {
        return ngx_http_agent_tools_header(r, sub);
    }

    if (sub->kind == NGX_HTTP_AGENT_SUB_MCP) {
        return ngx_http_agent_mcp_rpc_header(r, sub);
    }

    if (sub->kind == NGX_HTTP_AGENT_SUB_HOOK) {
        return ngx_http_agent_hook_header(r, sub);
    }

    t = (ngx_http_agent_turn_t *) sub;
    t->status = r->headers_out.status;

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash == 0
            || h[i].key.len != sizeof("Retry-After") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "Retry-After",
                               sizeof("Retry-After") - 1)
               != 0)
        {
            continue;
        }

        ra = ngx_atotm(h[i].value.data, h[i].value.len);

        if (ra != NGX_ERROR) {
            t->retry_after = ngx_min(ra, NGX_HTTP_AGENT_RETRY_AFTER_MAX);
        }
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "agent turn \"%V\": provider status %ui",
                   &t->id, t->status);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_turn_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t               rc;
    ngx_http_agent_sub_t   *sub;
    ngx_http_agent_turn_t  *t;

    sub = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (sub == NULL || r != sub->sr) {
        return ngx_http_next_body_filter(r, in);
    }

    if (sub->kind == NGX_HTTP_AGENT_SUB_TOOL) {
        return ngx_http_agent_tools_body(r, sub, in);
    }

    if (sub->kind == NGX_HTTP_AGENT_SUB_MCP) {
        return ngx_http_agent_mcp_rpc_body(r, sub, in);
    }

    if (sub->kind == NGX_HTTP_AGENT_SUB_HOOK) {
        return ngx_http_agent_hook_body(r, sub, in);
    }

    t = (ngx_http_agent_turn_t *) sub;

    rc = ngx_http_agent_detached_take(in, ngx_http_agent_turn_take, t);

    if (rc == NGX_DECLINED) {
        /* proxy_buffering put the stream in a file */
        t->parse_error = 1;
        return NGX_OK;
    }

    return rc;
}


/* the reply's bytes to the adapter's parser, or an error's kept */

static ngx_int_t
ngx_http_agent_turn_take(void *data, u_char *p, u_char *last)
{
    ngx_http_agent_turn_t  *t = data;

    size_t  n;

    if (t->parse_error) {
        return NGX_OK;
    }

    if (t->status >= NGX_HTTP_OK && t->status < NGX_HTTP_SPECIAL_RESPONSE) {

        if (t->agent->provider->feed(t->reply, p, last) != NGX_OK) {
            t->parse_error = 1;
        }

        return NGX_OK;
    }

    if (t->error_body.len >= NGX_HTTP_AGENT_ERROR_BODY) {
        return NGX_OK;
    }

    n = ngx_min((size_t) (last - p),
                NGX_HTTP_AGENT_ERROR_BODY - t->error_body.len);

    return ngx_http_agent_bytes_append(t->pool, &t->error_body, p, n);
}


/*
 * A turn runs on a detached request (ngx_http_agent_detached.c) with the
 * configuration of the request that started it, or of the agent's
 * location when the module starts it (r == NULL).
 */

ngx_int_t
ngx_http_agent_turn_start(ngx_http_request_t *r, ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *zone, ngx_str_t *id, ngx_uint_t turn,
    ngx_uint_t resume)
{
    ngx_pool_t              *pool;
    ngx_http_conf_ctx_t     *ctx;
    ngx_http_agent_turn_t   *t;

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    t = ngx_pcalloc(pool, sizeof(ngx_http_agent_turn_t));
    ctx = ngx_pcalloc(pool, sizeof(ngx_http_conf_ctx_t));

    if (t == NULL || ctx == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    ngx_memcpy(t->id_data, id->data, id->len);
    t->id.data = t->id_data;
    t->id.len = id->len;
    t->agent = agent;
    t->zone = zone;
    t->turn = turn;
    t->drops = ngx_http_agent_zone_drops(zone);

    t->log = *ngx_cycle->log;
    t->log.handler = ngx_http_agent_turn_log_error;
    t->log.data = &t->log_ctx;
    t->log.action = NULL;
    pool->log = &t->log;

    if (r) {
        ctx->main_conf = r->main_conf;
        ctx->srv_conf = r->srv_conf;
        ctx->loc_conf = r->loc_conf;

    } else {
        *ctx = *agent->conf_ctx;
    }

    t->request = ngx_http_agent_detached_create(pool, &t->log, &t->log_ctx,
                                                ctx);
    if (t->request == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    if (r && ngx_http_agent_turn_mark(r, id, turn) != NGX_OK) {
        ngx_http_agent_turn_close(t);
        return NGX_ERROR;
    }

    if (ngx_http_agent_turns.next == NULL) {
        ngx_queue_init(&ngx_http_agent_turns);
    }

    ngx_queue_insert_tail(&ngx_http_agent_turns, &t->queue);

    switch (resume) {

    case NGX_HTTP_AGENT_TURN_NEW:
        t->event.handler = ngx_http_agent_turn_model_call;
        break;

    case NGX_HTTP_AGENT_TURN_GIVE_UP:
        t->event.handler = ngx_http_agent_turn_give_up;
        break;

    default:
        t->takeover = (resume == NGX_HTTP_AGENT_TURN_TAKEOVER);
        t->event.handler = ngx_http_agent_turn_resume;
    }

    t->event.data = t;
    t->event.log = &t->log;

    ngx_http_agent_turn_post(t, t->event.handler);

    return NGX_OK;
}


/*
 * The store's thread pool refused the history's read (its queue full):
 * the model call is tried again a little later, for at most 5 s, rather
 * than the turn failing on a moment's load
 */

static ngx_int_t
ngx_http_agent_turn_store_busy(ngx_http_agent_turn_t *t)
{
    if (t->store_busy++ == NGX_HTTP_AGENT_TURN_BUSY_TRIES) {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent turn \"%V\": the store's thread pool did not "
                      "take the history's read for %d ms", &t->id,
                      NGX_HTTP_AGENT_TURN_BUSY_WAIT
                      * NGX_HTTP_AGENT_TURN_BUSY_TRIES);
        return NGX_ERROR;
    }

    if (t->store_busy == 1) {
        ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                      "agent turn \"%V\" waits for the store's thread pool "
                      "to read the history", &t->id);
    }

    t->event.handler = ngx_http_agent_turn_model_call;
    ngx_add_timer(&t->event, NGX_HTTP_AGENT_TURN_BUSY_WAIT);

    return NGX_OK;
}


/* a model call: the log so far, rendered by the adapter, to the provider */

void
ngx_http_agent_turn_model_call(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    ngx_str_t               body;
    ngx_int_t               rc;
    ngx_http_agent_reply_t *reply;

    /* the node's lease lapsed: the conversation is not this turn's */

    if (ngx_http_agent_revive_turn_held(t) != NGX_OK) {
        ngx_http_agent_turn_close(t);
        return;
    }

    /* the history in the store only is read once per turn, first */

    rc = ngx_http_agent_revive_turn_history(t);

    if (rc == NGX_AGAIN) {
        return;
    }

    if (rc == NGX_BUSY && ngx_http_agent_turn_store_busy(t) == NGX_OK) {
        return;
    }

    t->store_busy = 0;

    /* the previous call's pool: its reply and tool calls are logged */
    if (t->pool) {
        ngx_destroy_pool(t->pool);
    }

    t->running = 0;
    t->suspended = 0;
    t->calls = NULL;
    t->elicitations = 0;
    t->recorded = 0;

    t->pool = ngx_create_pool(4096, &t->log);
    if (t->pool == NULL || rc != NGX_OK) {
        goto failed;
    }

    /* the tool lists of MCP servers that are due, first */

    rc = ngx_http_agent_mcp_list_discover(t, ngx_http_agent_turn_model_call);

    if (rc == NGX_AGAIN) {
        ngx_http_run_posted_requests(t->request->connection);
        return;
    }

    /*
     * hook_before, once for a model call (not for its retries, nor for a
     * call taken over after its injection): it makes the call, halts or
     * fails the turn
     */

    if (t->agent->hook_before && t->attempt == 0 && !t->hooked
        && !ngx_http_agent_hook_injected(t))
    {
        if (ngx_http_agent_hook_before(t) != NGX_AGAIN) {
            goto failed;
        }

        ngx_http_run_posted_requests(t->request->connection);
        return;
    }

    reply = ngx_pcalloc(t->pool, sizeof(ngx_http_agent_reply_t));
    if (reply == NULL) {
        goto failed;
    }

    if (ngx_array_init(&reply->calls, t->pool, 2,
                       sizeof(ngx_http_agent_reply_call_t))
        != NGX_OK)
    {
        goto failed;
    }

    reply->pool = t->pool;
    reply->log = &t->log;
    reply->delta = ngx_http_agent_turn_delta;
    reply->data = t;

    t->reply = reply;
    t->rc = 0;
    t->status = 0;
    t->retry_after = 0;
    t->delta_seq = 0;
    t->delta_once = 0;
    t->parse_error = 0;
    t->sr_done = 0;
    t->timed_out = 0;
    ngx_memzero(&t->error_body, sizeof(ngx_http_agent_bytes_t));

    if (t->attempt == 0) {
        t->model_calls++;
        t->nretries = 0;
    }

    t->attempt++;

    t->message_id_len = ngx_sprintf(t->message_id, "msg_%ui_%ui", t->turn,
                                    t->model_calls)
                        - t->message_id;

    rc = ngx_http_agent_turn_request_body(t, &body);

    if (rc == NGX_AGAIN) {
        /* more history left the zone meanwhile: this call starts again */

        if (--t->attempt == 0) {
            t->model_calls--;
        }

        rc = ngx_http_agent_revive_turn_history(t);

        if (rc == NGX_AGAIN) {
            return;
        }

        if (rc == NGX_OK) {
            /* the history this worker kept has it: started again at once */
            ngx_http_agent_turn_post(t, ngx_http_agent_turn_model_call);
            return;
        }

        if (rc == NGX_BUSY && ngx_http_agent_turn_store_busy(t) == NGX_OK) {
            return;
        }

        goto failed;
    }

    if (rc != NGX_OK) {
        goto failed;
    }

    if (t->agent->provider->init(reply) != NGX_OK) {
        goto failed;
    }

    t->context_len = body.len;

    if (ngx_http_agent_budget_spend(&t->id, t->pool, &body) != NGX_OK) {
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &body);
        return;
    }

    t->sub.kind = NGX_HTTP_AGENT_SUB_PROVIDER;

    if (ngx_http_agent_turn_subrequest(t, &t->sub,
                                       &t->agent->provider_location, &body,
                                       NULL, 0,
                                       ngx_http_agent_turn_post_subrequest, t)
        != NGX_OK)
    {
        goto failed;
    }

    ngx_log_debug5(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent turn \"%V\": model call %ui, attempt %ui, to "
                   "\"%V\", %uz bytes", &t->id, t->model_calls, t->attempt,
                   &t->agent->provider_location, body.len);

    ngx_http_agent_turn_call_start(t);

    t->hooked = 0;

    t->deadline.handler = ngx_http_agent_turn_deadline;
    t->deadline.data = t;
    t->deadline.log = &t->log;

    ngx_add_timer(&t->deadline, t->agent->model_timeout);

    ngx_http_run_posted_requests(t->request->connection);

    return;

failed:

    ngx_log_error(NGX_LOG_ERR, &t->log, 0, "agent turn could not call "
                  "the provider");

    ngx_str_set(&body, "{\"reason\":\"internal error\"}");
    ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &body);
}


/*
 * The canonical events are copied out of the zone under its lock and
 * rendered by the adapter outside it.  With a store, the turn's history
 * goes on with them (in the request's pool): the events before the turn
 * leave the zone once written, and neither the turn's next model call
 * nor, once the turn has kept its history, the conversation's next turn
 * in this worker reads them back from the store.  A call copies only
 * what came since the last.  With agent_store history=0 every event
 * that left the zone is read from the store.
 */

static ngx_int_t
ngx_http_agent_turn_request_body(ngx_http_agent_turn_t *t, ngx_str_t *body)
{
    u_char                   *p;
    ngx_str_t                *events;
    ngx_uint_t                i, n, size, goes_on;
    ngx_http_agent_fsm_t      fsm;
    ngx_queue_t              *q, *first;
    ngx_pool_t               *pool;
    ngx_http_agent_t         *agent;
    ngx_http_agent_conv_t    *conv;
    ngx_http_agent_event_t   *ev;
    ngx_http_agent_output_t   output;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(t->zone);
        return NGX_ERROR;
    }

    if (conv->base > t->history_upto) {
        ngx_http_agent_zone_unlock(t->zone);
        return NGX_AGAIN;
    }

    /* the context in the zone, less what the history has of it */

    first = ngx_http_agent_log_context_locked(conv, t->history_upto);

    n = 0;

    for (q = first; q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        n++;
    }

    ev = ngx_queue_data(first, ngx_http_agent_event_t, queue);

    goes_on = n && t->zone->store && ngx_http_agent_store_history_max()
              && ev->seq == t->history_upto + 1;

    if (goes_on && t->nhistory + n <= t->history_size) {
        /* the history's array has room: the events go on in it */
        pool = t->request->pool;
        events = t->history;
        i = t->nhistory;

    } else {
        pool = goes_on ? t->request->pool : t->pool;
        size = t->nhistory + n;

        if (goes_on) {
            /* room for as many again: a turn's calls do not copy it all */
            size = ngx_max(size, 2 * t->nhistory);
        }

        events = ngx_palloc(pool, size * sizeof(ngx_str_t));
        if (events == NULL) {
            ngx_http_agent_zone_unlock(t->zone);
            return NGX_ERROR;
        }

        for (i = 0; i < t->nhistory; i++) {
            events[i] = t->history[i];
        }

        if (goes_on) {
            t->history_size = size;
        }
    }

    for (q = first; q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        p = ngx_pnalloc(pool, ev->len);
        if (p == NULL) {
            ngx_http_agent_zone_unlock(t->zone);
            return NGX_ERROR;
        }

        events[i].data = p;
        events[i].len = ev->len;
        ngx_memcpy(p, ev->data, ev->len);
        i++;
    }

    if (goes_on) {
        t->history = events;
        t->nhistory = i;
        t->history_upto = ev->seq;
    }

    fsm.fields = NULL;

    (void) ngx_http_agent_fsm_locked(t->zone, conv, NGX_HTTP_AGENT_FSM_MODEL,
                                     &fsm);

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_wake(&t->id, fsm.pids, fsm.npids);

    agent = ngx_http_agent_client_tools_agent(t,
                                              ngx_http_agent_mcp_list_agent(t));
    if (agent == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_output_find(t->pool, events, i, &output) != NGX_OK) {
        return NGX_ERROR;
    }

    t->output = output.name;

    return t->agent->provider->build_request(t->pool, agent, events, i, body);
}


/*
 * A POST subrequest of the turn's request with a JSON body and headers
 * of its own (not its parent's), whose output the filters take: sub is
 * its ctx.
 */

ngx_int_t
ngx_http_agent_turn_subrequest(ngx_http_agent_turn_t *t,
    ngx_http_agent_sub_t *sub, ngx_str_t *uri, ngx_str_t *body,
    ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_http_post_subrequest_pt handler, void *data)
{
    ngx_http_request_t           *sr;
    ngx_http_post_subrequest_t   *ps;

    ps = ngx_palloc(t->request->pool, sizeof(ngx_http_post_subrequest_t));
    if (ps == NULL) {
        return NGX_ERROR;
    }

    ps->handler = handler;
    ps->data = data;

    if (ngx_http_agent_detached_subrequest(t->request, uri, body, headers,
                                           nheaders, ps, &sr)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (sub->kind == NGX_HTTP_AGENT_SUB_PROVIDER) {
        /*
         * the body is the conversation, which grows past any client's
         * limit: the provider location's client_max_body_size is not
         * for it (a subrequest never reads a body, so nothing else
         * changes)
         */
        sr->discard_body = 1;
    }

    sub->sr = sr;
    ngx_http_set_ctx(sr, sub, ngx_http_agent_module);

    return ngx_http_agent_spans_header(t, sub, sr);
}


static ngx_int_t
ngx_http_agent_turn_post_subrequest(ngx_http_request_t *r, void *data,
    ngx_int_t rc)
{
    ngx_http_agent_turn_t  *t = data;

    if (t->sr_done) {
        return rc;
    }

    t->sr_done = 1;
    t->rc = rc;

    if (t->deadline.timer_set) {
        ngx_del_timer(&t->deadline);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "agent turn \"%V\": provider call done: %i", &t->id, rc);

    return ngx_http_agent_turn_sub_ended(t, ngx_http_agent_turn_call_done,
                                         rc);
}


/*
 * The turn goes on in handler once nginx has finished with the
 * subrequest; what the post_subrequest handler returns for rc.
 */

ngx_int_t
ngx_http_agent_turn_sub_ended(ngx_http_agent_turn_t *t,
    ngx_event_handler_pt handler, ngx_int_t rc)
{
    ngx_http_agent_turn_post(t, handler);

    return ngx_http_agent_detached_rc(rc);
}


/*
 * The model call has run for model_timeout: a stream kept open by
 * keep-alive comments, or one that never ends, is aborted (its
 * connection closes) and the call ends as a provider failure does, not
 * retried.
 */

static void
ngx_http_agent_turn_deadline(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    if (t->sr_done || t->sub.sr == NULL) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                  "agent turn: the model call took longer than "
                  "model_timeout (%M ms)", t->agent->model_timeout);

    t->timed_out = 1;
    t->sr_done = 1;

    ngx_http_agent_tools_abort(t->sub.sr);
    t->sub.sr = NULL;

    ngx_http_agent_turn_post(t, ngx_http_agent_turn_call_done);
}


static void
ngx_http_agent_turn_call_done(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    ngx_str_t               reason;
    ngx_msec_t              delay;
    ngx_http_agent_call_e   outcome;

    t->sub.sr = NULL;
    t->attempts = t->attempt;

    if (t->status >= NGX_HTTP_OK && t->status < NGX_HTTP_SPECIAL_RESPONSE
        && !t->parse_error
        && t->agent->provider->finish(t->reply) != NGX_OK)
    {
        t->parse_error = 1;
    }

    /* the reply's last pieces go out before anything is logged */
    ngx_http_agent_turn_delta_flush(t);

    ngx_http_agent_budget_charge(&t->id,
                                 (uint64_t) t->reply->input_tokens
                                 + t->reply->output_tokens);

    outcome = ngx_http_agent_turn_outcome(t, &reason);
    ngx_http_agent_turn_call_end(t, outcome, &reason);

    if (outcome == NGX_HTTP_AGENT_CALL_RETRY
        && t->attempt < t->agent->retry_attempts)
    {
        delay = ngx_http_agent_turn_backoff(t);

        ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                      "agent turn retries the provider in %M ms: %V",
                      delay, &reason);

        ngx_destroy_pool(t->pool);
        t->pool = NULL;
        t->reply = NULL;

        t->event.handler = ngx_http_agent_turn_model_call;
        ngx_add_timer(&t->event, delay);
        return;
    }

    if (outcome != NGX_HTTP_AGENT_CALL_OK) {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0, "agent turn failed: %V",
                      &reason);

        if (ngx_http_agent_turn_said(t->reply)
            && ngx_http_agent_turn_record(t, NGX_HTTP_AGENT_MSG_INTERRUPTED)
               != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                          "agent turn could not record the partial reply");
        }

        /* without memory for them, the reason goes without its retries */
        (void) ngx_http_agent_spans_failed(t, &reason);

        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
        return;
    }

    t->attempt = 0;

    if (t->output.len) {
        ngx_http_agent_turn_structured(t);
        return;
    }

    if (ngx_http_agent_turn_record(t, NGX_HTTP_AGENT_MSG_COMPLETE)
        != NGX_OK)
    {
        ngx_str_set(&reason, "{\"reason\":\"the reply could not be "
                             "recorded\"}");
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
        return;
    }

    /* hook_after sees a reply with calls, or the final one */

    if (t->agent->hook_after
        && (t->reply->calls.nelts || !t->reply->paused))
    {
        if (ngx_http_agent_hook_after(t) != NGX_AGAIN) {
            ngx_str_set(&reason, "{\"reason\":\"internal error\"}");
            ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
            return;
        }

        ngx_http_run_posted_requests(t->request->connection);
        return;
    }

    ngx_http_agent_turn_replied(t);
}


void
ngx_http_agent_turn_replied(ngx_http_agent_turn_t *t)
{
    u_char                  id_data[NGX_HTTP_AGENT_ID_LEN];
    ngx_str_t               reason, id;
    ngx_uint_t              summary;
    ngx_http_agent_t       *agent;
    ngx_http_agent_zone_t  *zone;

    if (t->reply->calls.nelts
        && ngx_http_agent_revive_turn_held(t) != NGX_OK)
    {
        /* the node's lease lapsed: no call starts, nothing is written */
        ngx_http_agent_turn_close(t);
        return;
    }

    if (t->reply->calls.nelts) {
        switch (ngx_http_agent_tools_dispatch(t)) {

        case NGX_OK:
            /* the tool subrequests call ngx_http_agent_turn_tools_done() */
            ngx_http_agent_turn_run_posted(t);
            return;

        case NGX_DONE:
            ngx_http_agent_turn_resume(&t->event);
            return;

        default:
            ngx_str_set(&reason, "{\"reason\":\"the tool calls could not "
                                 "be dispatched\"}");
            ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
            return;
        }
    }

    if (t->reply->paused) {
        /*
         * the reply is not final: the turn goes on from the log, as after
         * tool results, and the paused reply is the request's last message
         */

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                       "agent turn \"%V\": the provider paused the turn",
                       &t->id);

        ngx_http_agent_turn_resume(&t->event);
        return;
    }

    /* the turn ends first: no one waits for its summary */

    agent = t->agent;
    zone = t->zone;
    summary = ngx_http_agent_summary_due(t);

    ngx_memcpy(id_data, t->id.data, t->id.len);
    id.data = id_data;
    id.len = t->id.len;

    ngx_str_set(&reason, "{}");
    ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_COMPLETE, &reason);

    if (summary) {
        ngx_http_agent_summary_start(agent, zone, &id);
    }
}


/*
 * Every call of the batch has its result, or is suspended.  Called from a
 * tool subrequest's end, so the turn goes on from a posted event, once
 * nginx is done with that subrequest.
 */

void
ngx_http_agent_turn_tools_done(ngx_http_agent_turn_t *t)
{
    ngx_http_agent_turn_post(t, ngx_http_agent_turn_resume);
}


/*
 * Nothing of the batch runs: the turn stops while a call waits for
 * outside input, and otherwise calls the model again, unless it has had
 * all the model calls it may make.
 */

void
ngx_http_agent_turn_batch_done(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    ngx_str_t  reason;

    if (ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_WAIT, NULL)
        != NGX_DECLINED)
    {
        return;
    }

    /*
     * A call approved after the batch was read from the log, before this
     * transition, is settled but has not run: the log is read again, and
     * it runs before the model is called.
     */

    if (ngx_http_agent_turn_log_grew(t)) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                       "agent turn \"%V\": resolved meanwhile, the batch "
                       "is read again", &t->id);

        ngx_http_agent_turn_post(t, ngx_http_agent_turn_resume);
        return;
    }

    if (t->model_calls >= (ngx_uint_t) t->agent->max_model_calls) {
        ngx_str_set(&reason, "{\"reason\":\"the turn reached "
                             "max_model_calls\"}");
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
        return;
    }

    t->attempt = 0;
    ngx_http_agent_turn_model_call(&t->event);
}


/* events were added to the conversation since the batch was read */

static ngx_uint_t
ngx_http_agent_turn_log_grew(ngx_http_agent_turn_t *t)
{
    ngx_uint_t              grew;
    ngx_http_agent_conv_t  *conv;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);
    grew = (conv && conv->seq > t->batch_seq);

    ngx_http_agent_zone_unlock(t->zone);

    return grew;
}


void
ngx_http_agent_turn_cancel(ngx_str_t *id)
{
    ngx_queue_t            *q, *next;
    ngx_http_agent_turn_t  *t;

    if (ngx_http_agent_turns.next == NULL) {
        return;
    }

    for (q = ngx_queue_head(&ngx_http_agent_turns);
         q != ngx_queue_sentinel(&ngx_http_agent_turns);
         q = next)
    {
        next = ngx_queue_next(q);
        t = ngx_queue_data(q, ngx_http_agent_turn_t, queue);

        if (t->drops != ngx_http_agent_zone_drops(t->zone)) {
            /* the node's lease lapsed since it started: its record went */

            ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                          "agent turn of \"%V\" stops: the node's lease "
                          "lapsed and the conversation left its zone",
                          &t->id);
            ngx_http_agent_turn_close(t);
            continue;
        }

        if (id == NULL
            || (t->id.len == id->len
                && ngx_memcmp(t->id.data, id->data, id->len) == 0))
        {
            if (t->elicitations) {
                ngx_http_agent_mcp_call_answers(t);
            }

            ngx_http_agent_turn_abort(t);
        }
    }
}


void
ngx_http_agent_turn_cancel_check(void)
{
    ngx_http_agent_turn_cancel(NULL);
}


void
ngx_http_agent_turn_close(ngx_http_agent_turn_t *t)
{
    ngx_http_agent_turn_call_abort(t);
    ngx_http_agent_hook_abort(t);

    if (t->event.timer_set) {
        ngx_del_timer(&t->event);
    }

    if (t->event.posted) {
        ngx_delete_posted_event(&t->event);
    }

    if (t->runner.posted) {
        ngx_delete_posted_event(&t->runner);
    }

    if (t->delta_event.posted) {
        ngx_delete_posted_event(&t->delta_event);
    }

    if (t->delta_event.timer_set) {
        ngx_del_timer(&t->delta_event);
    }

    if (t->read_pause.posted) {
        ngx_delete_posted_event(&t->read_pause);
    }

    if (t->deadline.timer_set) {
        ngx_del_timer(&t->deadline);
    }

    if (t->pool) {
        ngx_destroy_pool(t->pool);
        t->pool = NULL;
    }

    if (t->queue.next) {
        ngx_queue_remove(&t->queue);
        t->queue.next = NULL;
    }

    ngx_http_agent_detached_close(t->request);
}


static u_char *
ngx_http_agent_turn_log_error(ngx_log_t *log, u_char *buf, size_t len)
{
    u_char                 *p;
    ngx_http_agent_turn_t  *t;

    p = buf;

    if (log->action) {
        p = ngx_snprintf(buf, len, " while %s", log->action);
        len -= p - buf;
    }

    t = (ngx_http_agent_turn_t *)
            ((u_char *) log->data - offsetof(ngx_http_agent_turn_t, log_ctx));

    return ngx_snprintf(p, len, ", agent: \"%V\", conversation: \"%V\", "
                        "turn: %ui", &t->agent->name, &t->id, t->turn);
}
