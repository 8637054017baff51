
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_history.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_hook.h"
#include "ngx_http_agent_mcp_rpc.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_provider.h"


/*
 * A turn going on from the log: after each batch of tool calls, when a
 * resolver or an expiry lets it go on, and when a worker takes over the
 * turn of one that died.
 */


static ngx_int_t ngx_http_agent_turn_batch(ngx_http_agent_turn_t *t,
    ngx_str_t *events, ngx_uint_t n);
static ngx_int_t ngx_http_agent_turn_suspend_again(ngx_http_agent_turn_t *t,
    ngx_http_agent_tool_t *tool, ngx_str_t *id, ngx_str_t *args);
static ngx_int_t ngx_http_agent_turn_lost(ngx_http_agent_turn_t *t,
    ngx_str_t *id, ngx_str_t *name);
static ngx_uint_t ngx_http_agent_turn_replied_final(
    ngx_http_agent_turn_t *t, ngx_str_t *reply);
static void ngx_http_agent_turn_questions_locked(ngx_http_agent_turn_t *t,
    ngx_http_agent_conv_t *conv);
static ngx_int_t ngx_http_agent_turn_count(ngx_http_agent_turn_t *t);
static void ngx_http_agent_turn_counted(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);


/*
 * The batch of the last assistant message, read back from the log: its
 * approved calls without a result run, and when nothing runs the turn
 * waits or goes on.  A turn comes here after each batch, and a resolver
 * starts one here, so an approval made at any moment is acted on.
 */

void
ngx_http_agent_turn_resume(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    u_char                  *p;
    ngx_str_t               *events, reason, last;
    ngx_uint_t               n, batch;
    ngx_queue_t             *q;
    ngx_http_agent_fsm_t     fsm;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *e;

    if (ngx_http_agent_revive_turn_held(t) != NGX_OK) {
        /* the node's lease lapsed: approved calls do not start here */
        ngx_http_agent_turn_close(t);
        return;
    }

    if (t->takeover && !t->counted
        && ngx_http_agent_turn_count(t) == NGX_AGAIN)
    {
        return;
    }

    if (t->unrecorded) {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0, "agent turn could not record "
                      "a tool's result, it ends");

        ngx_str_set(&reason, "{\"reason\":\"a tool result could not be "
                             "recorded\"}");
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
        return;
    }

    if (t->pool) {
        ngx_destroy_pool(t->pool);
    }

    t->model_calls = 0;
    t->running = 0;
    t->elicitations = 0;
    t->calls = NULL;
    t->reply = NULL;

    t->pool = ngx_create_pool(4096, &t->log);
    if (t->pool == NULL) {
        goto failed;
    }

    /*
     * the tool lists of MCP servers that are due, first: an MCP call
     * approved after a restart of nginx finds its tool
     */

    if (ngx_http_agent_mcp_list_discover(t, ngx_http_agent_turn_resume)
        == NGX_AGAIN)
    {
        ngx_http_run_posted_requests(t->request->connection);
        return;
    }

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(t->zone);
        goto failed;
    }

    if (t->takeover) {
        ngx_http_agent_turn_questions_locked(t, conv);
    }

    t->batch_seq = conv->seq;

    /*
     * a take-over whose log ends in an assistant message: the dead worker
     * recorded a reply and had not gone on from it
     */

    last.len = 0;
    q = ngx_queue_last(&conv->log);

    if (t->takeover && q != ngx_queue_sentinel(&conv->log)) {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG) {
            last.data = ngx_pnalloc(t->pool, e->len + 1);
            if (last.data == NULL) {
                ngx_http_agent_zone_unlock(t->zone);
                goto failed;
            }

            ngx_memcpy(last.data, e->data, e->len);
            last.data[e->len] = '\0';
            last.len = e->len;
        }
    }

    /* back to the turn's user_msg: its model calls, and the last batch */

    n = 0;
    batch = 1;

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type == NGX_HTTP_AGENT_EV_USER_MSG) {
            break;
        }

        if (e->type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG) {
            t->model_calls++;
            batch = 0;

        } else if (batch) {
            n++;
        }
    }

    events = ngx_palloc(t->pool, (n + 1) * sizeof(ngx_str_t));
    if (events == NULL) {
        ngx_http_agent_zone_unlock(t->zone);
        goto failed;
    }

    n = 0;

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG
            || e->type == NGX_HTTP_AGENT_EV_USER_MSG)
        {
            break;
        }

        /* out of the zone, to be read once it is unlocked */
        p = ngx_pnalloc(t->pool, e->len + 1);
        if (p == NULL) {
            ngx_http_agent_zone_unlock(t->zone);
            goto failed;
        }

        ngx_memcpy(p, e->data, e->len);
        p[e->len] = '\0';

        events[n].data = p;
        events[n].len = e->len;
        n++;
    }

    ngx_http_agent_zone_unlock(t->zone);

    /*
     * it was the turn's final reply (no calls, not paused): the turn
     * completes, the model is not asked again for what it answered
     */

    if (last.len && ngx_http_agent_turn_replied_final(t, &last)) {
        ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                      "agent turn's final reply was recorded before its "
                      "worker died, the turn completes");

        t->takeover = 0;

        /* a turn revived from the store is executing_tools */

        ngx_http_agent_zone_lock(t->zone);

        conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

        if (conv) {
            fsm.fields = NULL;
            (void) ngx_http_agent_fsm_locked(t->zone, conv,
                                             NGX_HTTP_AGENT_FSM_MODEL, &fsm);
        }

        ngx_http_agent_zone_unlock(t->zone);

        ngx_str_set(&reason, "{}");
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_COMPLETE, &reason);
        return;
    }

    if (ngx_http_agent_turn_batch(t, events, n) != NGX_OK) {
        goto failed;
    }

    if (t->running) {
        ngx_http_agent_tools_state(t, NGX_HTTP_AGENT_FSM_CALLS);
        ngx_http_agent_turn_run_posted(t);
        return;
    }

    ngx_http_agent_turn_batch_done(&t->event);

    return;

failed:

    ngx_str_set(&reason, "{\"reason\":\"the turn could not be resumed\"}");
    ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
}


/*
 * Questions of MCP servers to calls of a worker that died: the calls are
 * sent again, and their servers ask again if they need to
 */

static void
ngx_http_agent_turn_questions_locked(ngx_http_agent_turn_t *t,
    ngx_http_agent_conv_t *conv)
{
    ngx_uint_t  i;

    for (i = 0; conv->pending && i < conv->pending_slots; i++) {
        if (conv->pending[i].kind
            && ngx_http_agent_pending_in_call(&conv->pending[i]))
        {
            (void) ngx_http_agent_fsm_settle_locked(t->zone, conv,
                                                &conv->pending[i],
                                                NGX_HTTP_AGENT_SETTLE_LOST,
                                                "the call's worker died");
        }
    }
}


/*
 * A take-over is counted in the store before the turn goes on, so that
 * a turn that kills its workers is given up after as many take-overs
 * across restarts of nginx as within one: the zone's count starts again
 * with it.  NGX_AGAIN: the count is on the pool, the turn resumes after.
 */

static ngx_int_t
ngx_http_agent_turn_count(ngx_http_agent_turn_t *t)
{
    uint64_t                     seq;
    ngx_int_t                    rc;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    t->counted = 1;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    if (amcf->store == NULL) {
        return NGX_OK;
    }

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);
    seq = conv ? conv->seq : 0;

    ngx_http_agent_zone_unlock(t->zone);

    if (conv == NULL) {
        return NGX_OK;
    }

    rc = ngx_http_agent_store_takeover(t->request->pool, &t->id, seq,
                                       ngx_http_agent_turn_counted, t);
    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, &t->log, 0, "agent turn's take-over "
                      "could not be counted in the store");
        return NGX_OK;
    }

    return NGX_AGAIN;
}


static void
ngx_http_agent_turn_counted(ngx_http_agent_store_read_t *rd, ngx_int_t rc,
    void *data)
{
    ngx_http_agent_turn_t  *t = data;

    ngx_http_agent_turn_post(t,
                             (rc == NGX_OK
                              && rd->takeovers > NGX_HTTP_AGENT_TAKEOVERS)
                             ? ngx_http_agent_turn_give_up
                             : ngx_http_agent_turn_resume);
}


/*
 * A turn whose workers died NGX_HTTP_AGENT_TAKEOVERS times in a row is
 * not taken over again: whatever killed them (a reply, a tool's answer)
 * would kill this one too.  Its calls get error results, and it fails.
 */

void
ngx_http_agent_turn_give_up(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    ngx_str_t  reason;

    ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                  "agent turn lost its worker %d times, it is not taken "
                  "over again", NGX_HTTP_AGENT_TAKEOVERS + 1);

    ngx_str_set(&reason, "{\"reason\":\"the turn's worker died "
                         "repeatedly while running it\"}");

    ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
}


/*
 * The batch's events, newest first: each approved call that has no
 * result yet runs, with the arguments the approver gave if any.
 */

static ngx_int_t
ngx_http_agent_turn_batch(ngx_http_agent_turn_t *t, ngx_str_t *events,
    ngx_uint_t n)
{
    yajl_gen                g;
    ngx_int_t               rc;
    ngx_str_t               type, id, cid, name, args, decision, approver;
    ngx_uint_t              i, j, done, waited;
    yajl_val                v, w, *parsed;
    ngx_http_agent_tool_t  *tool;

    parsed = ngx_pcalloc(t->pool, (n + 1) * sizeof(yajl_val));
    g = ngx_http_agent_json_gen(t->pool);

    if (parsed == NULL || g == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n; i++) {
        parsed[i] = ngx_http_agent_provider_parse_log(&t->log,
                                                      events[i].data,
                                                      events[i].len);
        if (parsed[i] == NULL) {
            rc = NGX_ERROR;
            goto done;
        }
    }

    rc = NGX_OK;

    for (i = 0; i < n; i++) {
        v = parsed[i];

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(v, "type"), &type) != NGX_OK
            || type.len != sizeof("tool_call") - 1
            || ngx_strncmp(type.data, "tool_call", type.len) != 0
            || ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(v, "tool_call_id"), &id)
               != NGX_OK
            || ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(v, "name"), &name)
               != NGX_OK
            || ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(v, "arguments"), &args)
               != NGX_OK)
        {
            continue;
        }

        /* a result, or an approval, of this call: newer events come first */

        done = 0;
        waited = 0;
        decision.len = 0;
        approver.len = 0;

        for (j = 0; j < i; j++) {
            w = parsed[j];

            if (ngx_http_agent_provider_get(w, "during_call") != NULL) {
                /* a question of its server while it ran, not a wait */
                continue;
            }

            if (ngx_http_agent_provider_string(
                    ngx_http_agent_provider_get(w, "tool_call_id"), &cid)
                != NGX_OK
                || cid.len != id.len
                || ngx_strncmp(cid.data, id.data, id.len) != 0
                || ngx_http_agent_provider_string(
                       ngx_http_agent_provider_get(w, "type"), &type)
                   != NGX_OK)
            {
                continue;
            }

            if (type.len == sizeof("tool_result") - 1
                && ngx_strncmp(type.data, "tool_result", type.len) == 0)
            {
                done = 1;
                break;
            }

            if (type.len == sizeof("suspension") - 1
                && ngx_strncmp(type.data, "suspension", type.len) == 0)
            {
                waited = 1;
                continue;
            }

            if (type.len == sizeof("resolution") - 1
                && ngx_strncmp(type.data, "resolution", type.len) == 0
                && decision.len == 0
                && ngx_http_agent_provider_string(
                       ngx_http_agent_provider_get(w, "decision"), &decision)
                   == NGX_OK)
            {
                if (ngx_http_agent_provider_string(
                        ngx_http_agent_provider_get(w, "approver"), &approver)
                    != NGX_OK)
                {
                    approver.len = 0;
                }

                if (ngx_http_agent_provider_get(w, "args") != NULL
                    && ngx_http_agent_provider_text(g,
                           ngx_http_agent_provider_get(w, "args"), &args)
                       != NGX_OK)
                {
                    rc = NGX_ERROR;
                    goto done;
                }
            }
        }

        if (done) {
            continue;
        }

        /*
         * a call of a partial reply never runs: its error result is
         * recorded with it, and only a worker that died in between
         * finds it without one
         */

        if (ngx_http_agent_provider_get(v, "status") != NULL) {
            if (ngx_http_agent_turn_lost(t, &id, &name) != NGX_OK) {
                rc = NGX_ERROR;
                goto done;
            }

            continue;
        }

        /*
         * a call that neither waited nor has a result was running when
         * its worker died: a server call is sent again, with the same
         * tool_call_id, and any other is suspended as it would have been
         */

        if (!waited) {
            if (!t->takeover) {
                /*
                 * it ran in this worker, which is alive: its result
                 * was lost, and a call is never sent again for that
                 */

                if (ngx_http_agent_turn_lost(t, &id, &name) != NGX_OK) {
                    rc = NGX_ERROR;
                    goto done;
                }

                continue;
            }

            tool = ngx_http_agent_tools_lookup(t, &name);

            if (tool != NULL
                && !(tool->executor == NGX_HTTP_AGENT_EXECUTOR_SERVER
                     && tool->approval == NGX_HTTP_AGENT_APPROVAL_AUTO))
            {
                if (ngx_http_agent_turn_suspend_again(t, tool, &id, &args)
                    != NGX_OK)
                {
                    rc = NGX_ERROR;
                    goto done;
                }

                continue;
            }

            ngx_str_set(&decision, "approve");
        }

        if (decision.len != sizeof("approve") - 1
            || ngx_strncmp(decision.data, "approve", decision.len) != 0)
        {
            continue;
        }

        /* the strings go with the trees: the call keeps copies */

        id.data = ngx_pstrdup(t->pool, &id);
        name.data = ngx_pstrdup(t->pool, &name);
        args.data = ngx_pstrdup(t->pool, &args);
        approver.data = ngx_pstrdup(t->pool, &approver);

        if (id.data == NULL || name.data == NULL || args.data == NULL
            || (approver.len && approver.data == NULL)
            || ngx_http_agent_tools_run_call(t, &id, &name, &args, &approver)
               != NGX_OK)
        {
            rc = NGX_ERROR;
            goto done;
        }
    }

done:

    for (i = 0; i < n; i++) {
        if (parsed[i]) {
            ngx_http_agent_json_free(parsed[i]);
        }
    }

    t->takeover = 0;

    return rc;
}


/*
 * An assistant message from the log is a final reply: complete, with no
 * tool calls, and not paused by the provider (a paused reply goes on)
 */

static ngx_uint_t
ngx_http_agent_turn_replied_final(ngx_http_agent_turn_t *t, ngx_str_t *reply)
{
    ngx_str_t   s;
    yajl_val    v, calls;
    ngx_uint_t  final;

    v = ngx_http_agent_provider_parse_log(&t->log, reply->data, reply->len);
    if (v == NULL) {
        return 0;
    }

    final = 1;

    calls = ngx_http_agent_provider_get(v, "tool_calls");

    if (calls && !(YAJL_IS_ARRAY(calls) && calls->u.array.len == 0)) {
        final = 0;
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(v, "status"), &s) == NGX_OK
        && !(s.len == sizeof("complete") - 1
             && ngx_strncmp(s.data, "complete", s.len) == 0))
    {
        final = 0;
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(v, "finish_reason"), &s) == NGX_OK
        && s.len == sizeof("pause_turn") - 1
        && ngx_strncmp(s.data, "pause_turn", s.len) == 0)
    {
        final = 0;
    }

    ngx_http_agent_json_free(v);

    return final;
}


static ngx_int_t
ngx_http_agent_turn_lost(ngx_http_agent_turn_t *t, ngx_str_t *id,
    ngx_str_t *name)
{
    ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                  "agent call \"%V\" of tool \"%V\" has no result, it is "
                  "not run again", id, name);

    return ngx_http_agent_turn_error_result(t, id, name,
                                            "[failed] the call's result was "
                                            "lost; it was not run again");
}


/* a call that is not run gets an error result; error is JSON-safe */

ngx_int_t
ngx_http_agent_turn_error_result(ngx_http_agent_turn_t *t, ngx_str_t *id,
    ngx_str_t *name, char *error)
{
    ngx_int_t               rc;
    ngx_http_agent_conv_t  *conv;

    rc = NGX_ERROR;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv) {
        rc = ngx_http_agent_fsm_error_result_locked(t->zone, conv, id, name,
                                                    error);
    }

    ngx_http_agent_zone_unlock(t->zone);

    return rc;
}


/* a call whose suspension was lost with its worker waits after all */

static ngx_int_t
ngx_http_agent_turn_suspend_again(ngx_http_agent_turn_t *t,
    ngx_http_agent_tool_t *tool, ngx_str_t *id, ngx_str_t *args)
{
    uint64_t                deadline;
    ngx_int_t               rc;
    ngx_str_t               fields;
    ngx_uint_t              kind;
    ngx_http_agent_conv_t  *conv;

    kind = ngx_http_agent_conf_pending_kind(tool,
                      tool->approval == NGX_HTTP_AGENT_APPROVAL_REQUIRED
                      ? NGX_HTTP_AGENT_PHASE_APPROVAL
                      : NGX_HTTP_AGENT_PHASE_EXEC);

    if (ngx_http_agent_tools_suspension(t->pool, t->agent, tool, id, args,
                                        kind, &deadline, &fields)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    rc = (conv == NULL) ? NGX_ERROR
         : ngx_http_agent_tools_suspend_locked(t->zone, conv, tool, id, kind,
                                               deadline, &fields);

    if (rc == NGX_DECLINED) {
        rc = ngx_http_agent_fsm_error_result_locked(t->zone, conv, id,
                                                &tool->name,
                                                "[failed] too many calls "
                                                "wait for input at once");
    }

    ngx_http_agent_zone_unlock(t->zone);

    return rc;
}


/*
 * The end of the turn in this worker: its terminal event (none when it
 * stops to wait), the state it leaves the conversation in, the lease
 * given back, and turn_ended for the live plane.  A turn stops to wait
 * only if a call still waits: NGX_DECLINED, and the turn goes on, when
 * every one was resolved while the lease was held (the resolver left
 * the turn to this worker).
 */

ngx_int_t
ngx_http_agent_turn_end(ngx_http_agent_turn_t *t,
    ngx_http_agent_fsm_input_e input, ngx_str_t *fields)
{
    ngx_int_t                  rc;
    ngx_http_agent_fsm_t       fsm;
    ngx_http_agent_conv_t     *conv;
    ngx_http_agent_history_t  *kept;

    fsm.fields = fields;
    fsm.npids = 0;
    fsm.next = 0;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    rc = conv ? ngx_http_agent_fsm_locked(t->zone, conv, input, &fsm)
              : NGX_DECLINED;

    if (rc == NGX_OK && input == NGX_HTTP_AGENT_FSM_WAIT
        && conv->lease == ngx_pid)
    {
        /* no call waits (all resolved while this worker held the turn) */
        ngx_http_agent_zone_unlock(t->zone);
        ngx_http_agent_wake(&t->id, fsm.pids, fsm.npids);
        return NGX_DECLINED;
    }

    /* the next turn here takes the history from this one */

    kept = NULL;

    if (rc == NGX_OK && t->zone->store
        && t->history_upto != (uint64_t) -1)
    {
        kept = ngx_http_agent_store_history_keep_locked(conv, t->history,
                                                        t->nhistory,
                                                        t->history_upto);
    }

    if (rc == NGX_DECLINED && conv) {
        /* no row: the turn is down here all the same */
        fsm.fields = NULL;
        (void) ngx_http_agent_fsm_locked(t->zone, conv,
                                         NGX_HTTP_AGENT_FSM_ABANDON, &fsm);
    }

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_store_history_keep(kept);

    ngx_http_agent_fsm_after(t->agent, t->zone, &t->id, &fsm);

    ngx_http_agent_turn_close(t);

    return NGX_OK;
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
    ngx_str_t               reason;
    ngx_uint_t              cancel;
    ngx_http_agent_fsm_t    fsm;
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
        ngx_http_agent_tools_abort(t->sub.sr);
        t->sub.sr = NULL;
    }

    ngx_http_agent_hook_abort(t);

    if (t->pool && t->reply && !t->recorded
        && ngx_http_agent_turn_said(t->reply)
        && ngx_http_agent_turn_record(t, NGX_HTTP_AGENT_MSG_CANCELLED)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent turn could not record the cancelled reply");
    }

    ngx_http_agent_tools_cancel(t);

    ngx_str_set(&reason, "{\"reason\":\"the cancel could not be recorded\"}");

    fsm.fields = NULL;
    fsm.npids = 0;
    fsm.next = 0;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    /* an interrupting message runs now */

    if (conv
        && ngx_http_agent_fsm_locked(t->zone, conv, NGX_HTTP_AGENT_FSM_CANCEL,
                                     &fsm)
           == NGX_ERROR)
    {
        /* no room for the cancel: the turn ends all the same */
        fsm.fields = &reason;
        (void) ngx_http_agent_fsm_locked(t->zone, conv,
                                         NGX_HTTP_AGENT_FSM_ABANDON, &fsm);
    }

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_fsm_after(t->agent, t->zone, &t->id, &fsm);

    ngx_http_agent_turn_close(t);
}


/* a turn for the message that waited, on a request of the module's own */

void
ngx_http_agent_turn_next(ngx_http_agent_t *agent, ngx_http_agent_zone_t *zone,
    ngx_str_t *id, ngx_uint_t turn)
{
    ngx_str_t               reason;
    ngx_http_agent_fsm_t    fsm;
    ngx_http_agent_conv_t  *conv;

    if (agent != NULL && agent->conf_ctx != NULL
        && ngx_http_agent_turn_start(NULL, agent, zone, id, turn, 0) == NGX_OK)
    {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "agent could not start the next turn of \"%V\"", id);

    /* the turn ends here; the messages after it get theirs later */

    ngx_str_set(&reason, "{\"reason\":\"the turn could not start\"}");

    fsm.fields = &reason;
    fsm.npids = 0;

    ngx_http_agent_zone_lock(zone);

    conv = ngx_http_agent_conv_find_locked(zone, id);

    if (conv && conv->lease == ngx_pid && conv->turn == turn) {
        (void) ngx_http_agent_fsm_locked(zone, conv,
                                         NGX_HTTP_AGENT_FSM_ABANDON, &fsm);
    }

    ngx_http_agent_zone_unlock(zone);

    ngx_http_agent_wake(id, fsm.pids, fsm.npids);
}
