
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_tools_call.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_mcp_rpc.h"
#include "ngx_http_agent_client_tools.h"
#include "ngx_http_agent_detached.h"

#include <yajl/yajl_tree.h>


static ngx_int_t ngx_http_agent_tools_run(ngx_http_agent_call_t *call);
static ngx_int_t ngx_http_agent_tools_done(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static char *ngx_http_agent_tools_failure(ngx_http_agent_call_t *call,
    ngx_uint_t status);
static ngx_int_t ngx_http_agent_tools_suspend(ngx_http_agent_call_t *call);


ngx_int_t
ngx_http_agent_tools_dispatch(ngx_http_agent_turn_t *t)
{
    u_char                       *p;
    ngx_str_t                     err;
    ngx_uint_t                    i;
    ngx_http_agent_call_t        *call;
    ngx_http_agent_reply_call_t  *rc;

    rc = t->reply->calls.elts;

    t->running = 0;
    t->suspended = 0;

    for (i = 0; i < t->reply->calls.nelts; i++) {

        call = ngx_pcalloc(t->pool, sizeof(ngx_http_agent_call_t));
        if (call == NULL) {
            return NGX_ERROR;
        }

        call->sub.kind = NGX_HTTP_AGENT_SUB_TOOL;
        call->turn = t;
        call->id.data = rc[i].id.data;
        call->id.len = rc[i].id.len;
        call->name.data = rc[i].name.data;
        call->name.len = rc[i].name.len;
        call->arguments.data = rc[i].arguments.data;
        call->arguments.len = rc[i].arguments.len;

        call->tool = ngx_http_agent_tools_lookup(t, &call->name);

        if (call->tool == NULL) {
            p = ngx_pnalloc(t->pool, call->name.len + 32);
            if (p == NULL) {
                return NGX_ERROR;
            }

            ngx_sprintf(p, "unknown tool \"%V\"%Z", &call->name);

            if (ngx_http_agent_tools_result(call, NULL, (char *) p)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            continue;
        }

        if (call->arguments.len == 0) {
            ngx_str_set(&call->arguments, "{}");
        }

        switch (ngx_http_agent_json_object(t->pool, &call->arguments, &err)) {

        case NGX_OK:
            break;

        case NGX_DECLINED:
            p = ngx_pnalloc(t->pool, err.len + 32);
            if (p == NULL) {
                return NGX_ERROR;
            }

            ngx_sprintf(p, "the arguments %V%Z", &err);

            if (ngx_http_agent_tools_result(call, NULL, (char *) p)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            continue;

        default:
            return NGX_ERROR;
        }

        if (call->tool->executor == NGX_HTTP_AGENT_EXECUTOR_SERVER
            && call->tool->approval == NGX_HTTP_AGENT_APPROVAL_AUTO)
        {
            if (ngx_http_agent_tools_run(call) != NGX_OK) {
                return NGX_ERROR;
            }

            t->running++;
            continue;
        }

        if (call->tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {
            /* the provider runs it: a call of it to run here is an error */
            if (ngx_http_agent_tools_result(call, NULL,
                                            "the provider did not run "
                                            "its own tool")
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            continue;
        }

        switch (ngx_http_agent_tools_suspend(call)) {

        case NGX_OK:
            break;

        case NGX_DECLINED:
            if (ngx_http_agent_tools_result(call, NULL,
                                            "[failed] too many calls wait "
                                            "for input at once (at most "
                                            NGX_HTTP_AGENT_PENDING_STR ")")
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            continue;

        default:
            return NGX_ERROR;
        }

        t->suspended++;
    }

    /*
     * awaiting input while any call waits, even with others running;
     * executing tools while calls run and none waits
     */

    if (t->suspended) {
        ngx_http_agent_tools_state(t, NGX_HTTP_AGENT_FSM_SUSPEND);

    } else if (t->running) {
        ngx_http_agent_tools_state(t, NGX_HTTP_AGENT_FSM_CALLS);
    }

    return t->running ? NGX_OK : NGX_DONE;
}


void
ngx_http_agent_tools_state(ngx_http_agent_turn_t *t,
    ngx_http_agent_fsm_input_e input)
{
    ngx_http_agent_fsm_t    fsm;
    ngx_http_agent_conv_t  *conv;

    fsm.fields = NULL;
    fsm.npids = 0;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv) {
        (void) ngx_http_agent_fsm_locked(t->zone, conv, input, &fsm);
    }

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_wake(&t->id, fsm.pids, fsm.npids);
}


ngx_http_agent_tool_t *
ngx_http_agent_tools_find(ngx_http_agent_t *agent, ngx_str_t *name)
{
    ngx_uint_t                  i;
    ngx_http_agent_tool_ref_t  *ref;

    ref = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        if (ref[i].tool->name.len == name->len
            && ngx_strncmp(ref[i].tool->name.data, name->data, name->len)
               == 0)
        {
            return ref[i].tool;
        }
    }

    return NULL;
}


ngx_http_agent_tool_t *
ngx_http_agent_tools_lookup(ngx_http_agent_turn_t *t, ngx_str_t *name)
{
    ngx_http_agent_tool_t  *tool;

    tool = ngx_http_agent_tools_find(t->agent, name);

    if (tool == NULL) {
        tool = ngx_http_agent_mcp_list_tool(t, name);
    }

    if (tool == NULL) {
        tool = ngx_http_agent_client_tools_find(t, name);
    }

    return tool;
}


ngx_int_t
ngx_http_agent_tools_render(ngx_pool_t *temp, ngx_pool_t *pool,
    ngx_http_agent_t *agent)
{
    yajl_gen   g;
    ngx_str_t  json;

    g = ngx_http_agent_json_gen(temp);

    if (g == NULL
        || agent->provider->render_tools(g, agent) != NGX_OK
        || ngx_http_agent_json_result(g, 0, &json) != NGX_OK)
    {
        return NGX_ERROR;
    }

    agent->provider_tools.data = ngx_pstrdup(pool, &json);
    if (agent->provider_tools.data == NULL) {
        return NGX_ERROR;
    }

    agent->provider_tools.len = json.len;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_tools_run_call(ngx_http_agent_turn_t *t, ngx_str_t *id,
    ngx_str_t *name, ngx_str_t *args, ngx_str_t *approver)
{
    ngx_http_agent_call_t  *call;

    call = ngx_pcalloc(t->pool, sizeof(ngx_http_agent_call_t));
    if (call == NULL) {
        return NGX_ERROR;
    }

    call->sub.kind = NGX_HTTP_AGENT_SUB_TOOL;
    call->turn = t;
    call->id = *id;
    call->name = *name;
    call->arguments = *args;
    call->approver = *approver;

    call->tool = ngx_http_agent_tools_lookup(t, name);

    if (call->tool == NULL
        || call->tool->executor != NGX_HTTP_AGENT_EXECUTOR_SERVER)
    {
        /* the configuration changed under a waiting call */
        return ngx_http_agent_tools_result(call, NULL,
                                           "the tool is no longer a server "
                                           "tool of this agent");
    }

    if (ngx_http_agent_tools_run(call) != NGX_OK) {
        return NGX_ERROR;
    }

    t->running++;

    return NGX_OK;
}


/*
 * A server call: POST of the arguments to the tool's location, with the
 * conversation, the tool, the tool_call_id (the key a side-effecting
 * tool should make its work idempotent on) and, for an approved call,
 * its approver in headers.
 */

static ngx_int_t
ngx_http_agent_tools_run(ngx_http_agent_call_t *call)
{
    ngx_int_t                rc;
    ngx_uint_t               n;
    ngx_keyval_t             headers[4];
    ngx_http_agent_call_t  **cp;
    ngx_http_agent_turn_t   *t;

    t = call->turn;

    ngx_str_set(&headers[0].key, "X-Agent-Conversation");
    headers[0].value = t->id;
    ngx_str_set(&headers[1].key, "X-Agent-Tool");
    headers[1].value = call->name;
    ngx_str_set(&headers[2].key, "Idempotency-Key");
    headers[2].value = call->id;
    n = 3;

    if (call->approver.len) {
        ngx_str_set(&headers[n].key, "X-Agent-Approver");
        headers[n++].value = call->approver;
    }

    if (t->calls == NULL) {
        t->calls = ngx_array_create(t->pool, 4,
                                    sizeof(ngx_http_agent_call_t *));
        if (t->calls == NULL) {
            return NGX_ERROR;
        }
    }

    cp = ngx_array_push(t->calls);
    if (cp == NULL) {
        return NGX_ERROR;
    }

    *cp = call;

    if (call->tool->mcp) {
        return ngx_http_agent_mcp_call_run(call, headers, n);
    }

    rc = ngx_http_agent_turn_subrequest(t, &call->sub, &call->tool->location,
                                        &call->arguments, headers, n,
                                        ngx_http_agent_tools_done, call);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent tool call \"%V\" of \"%V\": subrequest \"%V\": %i",
                   &call->id, &call->name, &call->tool->location, rc);

    return rc;
}


void
ngx_http_agent_tools_cancel(ngx_http_agent_turn_t *t)
{
    ngx_uint_t               i;
    ngx_http_agent_call_t  **calls;

    if (t->calls == NULL) {
        return;
    }

    calls = t->calls->elts;

    for (i = 0; i < t->calls->nelts; i++) {

        if (calls[i]->done) {
            continue;
        }

        calls[i]->done = 1;

        if (calls[i]->mcp) {
            /* the server is told, on a request that outlives the turn */
            ngx_http_agent_mcp_call_cancel(calls[i], "cancelled by the user");
        }

        if (calls[i]->sub.sr) {
            ngx_log_debug1(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                           "agent tool call \"%V\": subrequest aborted",
                           &calls[i]->id);

            ngx_http_agent_tools_abort(calls[i]->sub.sr);
        }

        (void) ngx_http_agent_tools_result(calls[i], NULL, "[cancelled]");
    }

    t->running = 0;
}


/*
 * The upstream's own cleanup, which a request's termination would run:
 * it closes the connection to the backend and ends the subrequest
 * without its post_subrequest handler.
 */

void
ngx_http_agent_tools_abort(ngx_http_request_t *sr)
{
    if (sr->upstream && sr->upstream->cleanup && *sr->upstream->cleanup) {
        (*sr->upstream->cleanup)(sr);
    }
}


ngx_int_t
ngx_http_agent_tools_header(ngx_http_request_t *r, ngx_http_agent_sub_t *sub)
{
    ngx_http_agent_call_t  *call = (ngx_http_agent_call_t *) sub;

    call->status = r->headers_out.status;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &call->turn->log, 0,
                   "agent tool call \"%V\": status %ui",
                   &call->id, call->status);

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_tools_body(ngx_http_request_t *r, ngx_http_agent_sub_t *sub,
    ngx_chain_t *in)
{
    ngx_http_agent_call_t  *call = (ngx_http_agent_call_t *) sub;

    u_char       *p, *last;
    size_t        n, max;
    ngx_buf_t    *b;
    ngx_uint_t    failed;
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        call->received += ngx_buf_size(cl->buf);
    }

    failed = (call->status < NGX_HTTP_OK
              || call->status >= NGX_HTTP_SPECIAL_RESPONSE);

    if (call->tool->streaming && !failed) {
        return ngx_http_agent_tools_stream(call, in);
    }

    /*
     * The result, up to 1 MiB; or, for a status other than 2xx, the start
     * of the body for the error result, without leading whitespace and a
     * character longer than the error keeps.  What does not fit marks the
     * call too_large (an error's body: cut), but for whitespace after the
     * start of an error's body.
     */

    max = failed ? NGX_HTTP_AGENT_FAILURE_READ : NGX_HTTP_AGENT_RESULT_MAX;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (!ngx_buf_in_memory(b)) {
            /* a file-backed body: the location must answer from memory */
            if (ngx_buf_size(b)) {
                call->too_large = 1;
                b->file_pos = b->file_last;
            }

            continue;
        }

        p = b->pos;
        last = b->last;

        b->pos = b->last;

        if (call->done || call->too_large) {
            continue;
        }

        if (failed && call->body.len == 0) {
            while (p < last && ngx_http_agent_json_space(*p)) {
                p++;
            }
        }

        n = ngx_min((size_t) (last - p), max - call->body.len);

        if (n && ngx_http_agent_bytes_append(call->turn->pool, &call->body,
                                             p, n)
                 != NGX_OK)
        {
            return NGX_ERROR;
        }

        for (p += n; p < last; p++) {
            if (!failed || !ngx_http_agent_json_space(*p)) {
                call->too_large = 1;
                break;
            }
        }
    }

    return NGX_OK;
}


/*
 * The tool subrequest ended: a 2xx body is the result (a streaming
 * tool's: its result line), anything else an error the model can read,
 * with the body that came with it.  The last call of the batch moves the
 * turn on, from a posted event.
 */

static ngx_int_t
ngx_http_agent_tools_done(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_agent_call_t  *call = data;

    char                   *error;
    ngx_str_t               result;
    ngx_uint_t              status;
    ngx_http_agent_turn_t  *t;

    if (call->done) {
        return rc;
    }

    t = call->turn;

    status = call->status;

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE || status == 0) {
        status = (rc >= NGX_HTTP_SPECIAL_RESPONSE) ? (ngx_uint_t) rc : 0;
    }

    if (rc == NGX_ERROR) {
        status = 0;
    }

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent tool call \"%V\": subrequest done: %i, "
                   "status %ui, %O bytes", &call->id, rc, status,
                   call->received);

    call->done = 1;

    if (status >= NGX_HTTP_OK && status < NGX_HTTP_SPECIAL_RESPONSE) {

        if (call->tool->streaming) {
            ngx_http_agent_tools_stream_end(call);

        } else if (call->too_large) {
            (void) ngx_http_agent_tools_result(call, NULL,
                                               "the tool's result is too "
                                               "large");

        } else if (ngx_http_agent_bytes_append(t->pool, &call->body,
                                               (u_char *) "", 1)
                   == NGX_OK)
        {
            /* NUL-terminated, not counted */
            result.data = call->body.data;
            result.len = call->body.len - 1;
            (void) ngx_http_agent_tools_result(call, &result, NULL);
        }

    } else {
        error = ngx_http_agent_tools_failure(call, status);
        (void) ngx_http_agent_tools_result(call, NULL, error);
    }

    if (--t->running == 0) {
        ngx_http_agent_turn_tools_done(t);
    }

    return ngx_http_agent_detached_rc(rc);
}


/*
 * The error of a status other than 2xx, with the body that came with it
 * (a reason the model may act on): trimmed, made UTF-8, and cut between
 * two characters after NGX_HTTP_AGENT_FAILURE_MAX bytes, "..." saying so.
 * A status that is not the body's (the subrequest ended otherwise after
 * its header) goes alone.
 */

static char *
ngx_http_agent_tools_failure(ngx_http_agent_call_t *call, ngx_uint_t status)
{
    u_char      *p;
    ngx_str_t    body;
    ngx_uint_t   cut;

    if (status == 0) {
        return "the tool failed: its location did not answer "
               "(timed out or unreachable)";
    }

    body.data = call->body.data;
    body.len = (status == call->status) ? call->body.len : 0;
    cut = call->too_large;

    ngx_http_agent_json_trim(&body);

    if (ngx_http_agent_json_utf8_fix(call->turn->pool, &body) != NGX_OK) {
        return "the tool failed";
    }

    if (body.len > NGX_HTTP_AGENT_FAILURE_MAX) {
        body.len = NGX_HTTP_AGENT_FAILURE_MAX;
        cut = 1;

        /* valid UTF-8 now: a character starts at a byte not 10xxxxxx */

        while ((body.data[body.len] & 0xc0) == 0x80) {
            body.len--;
        }

        ngx_http_agent_json_trim(&body);
    }

    p = ngx_pnalloc(call->turn->pool,
                    sizeof("the tool failed: its location answered : ...")
                    + NGX_INT_T_LEN + body.len);
    if (p == NULL) {
        return "the tool failed";
    }

    if (body.len == 0) {
        ngx_sprintf(p, "the tool failed: its location answered %ui%Z",
                    status);

    } else {
        ngx_sprintf(p, "the tool failed: its location answered %ui: %V%s%Z",
                    status, &body, cut ? "..." : "");
    }

    return (char *) p;
}


/*
 * A call that waits for outside input: a person's answer (human), the
 * browser (client), or approval first (gated).  The suspension event and
 * the pending call are recorded under one lock.
 */

static ngx_int_t
ngx_http_agent_tools_suspend(ngx_http_agent_call_t *call)
{
    ngx_str_t                fields;
    ngx_uint_t               kind;
    uint64_t                 deadline;
    ngx_http_agent_turn_t   *t;

    t = call->turn;

    kind = ngx_http_agent_conf_pending_kind(call->tool,
                      call->tool->approval == NGX_HTTP_AGENT_APPROVAL_REQUIRED
                      ? NGX_HTTP_AGENT_PHASE_APPROVAL
                      : NGX_HTTP_AGENT_PHASE_EXEC);

    if (ngx_http_agent_tools_suspension(t->pool, t->agent, call->tool,
                                        &call->id, &call->arguments, kind,
                                        &deadline, &fields)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_agent_tools_wait(call, kind, deadline, &fields);
}


/*
 * The pending call and its suspension event, recorded under one lock,
 * and the subscribers woken.  NGX_DECLINED: every slot is taken.
 */

ngx_int_t
ngx_http_agent_tools_wait(ngx_http_agent_call_t *call, ngx_uint_t kind,
    uint64_t deadline, ngx_str_t *fields)
{
    ngx_int_t                rc;
    ngx_uint_t               n;
    ngx_pid_t                pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_turn_t   *t;
    ngx_http_agent_conv_t   *conv;

    t = call->turn;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    rc = (conv == NULL) ? NGX_ERROR
         : ngx_http_agent_tools_suspend_locked(t->zone, conv, call->tool,
                                               &call->id, kind, deadline,
                                               fields);
    if (rc != NGX_OK) {
        ngx_http_agent_zone_unlock(t->zone);
        return rc;
    }

    n = ngx_http_agent_conv_sub_pids_locked(conv, pids);

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_wake(&t->id, pids, n);

    return NGX_OK;
}


/* an event's fields opened with the call's id and name */

ngx_uint_t
ngx_http_agent_tools_json_call(yajl_gen g, ngx_str_t *id, ngx_str_t *name)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "tool_call_id");
    failed |= ngx_http_agent_json_str(g, id);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, name);

    return failed;
}


/* when a call of the tool that starts waiting now stops waiting, ms */

uint64_t
ngx_http_agent_tools_deadline(ngx_http_agent_t *agent,
    ngx_http_agent_tool_t *tool)
{
    ngx_msec_t   timeout;
    ngx_time_t  *tp;

    timeout = tool->timeout;

    if (timeout == NGX_CONF_UNSET_MSEC) {
        timeout = agent->suspend_timeout;
    }

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec + timeout;
}


/* the fields of a suspension event, and the call's deadline */

ngx_int_t
ngx_http_agent_tools_suspension(ngx_pool_t *pool, ngx_http_agent_t *agent,
    ngx_http_agent_tool_t *tool, ngx_str_t *id, ngx_str_t *args,
    ngx_uint_t kind, uint64_t *deadline, ngx_str_t *fields)
{
    yajl_gen     g;
    ngx_uint_t   failed;

    *deadline = ngx_http_agent_tools_deadline(agent, tool);

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = ngx_http_agent_tools_json_call(g, id, &tool->name);
    failed |= ngx_http_agent_json_key(g, "executor");
    failed |= ngx_http_agent_json_str(g,
                                &ngx_http_agent_executors[tool->executor].name);
    failed |= ngx_http_agent_json_key(g, "kind");
    failed |= ngx_http_agent_json_str(g, &ngx_http_agent_pending_kinds[kind]);
    failed |= ngx_http_agent_json_key(g, "arguments");
    failed |= ngx_http_agent_json_verbatim(g, args);
    failed |= ngx_http_agent_json_key(g, "deadline");
    failed |= yajl_gen_integer(g, (long long) *deadline);
    failed |= yajl_gen_map_close(g);

    return ngx_http_agent_json_result(g, failed, fields);
}


ngx_int_t
ngx_http_agent_tools_suspend_locked(ngx_http_agent_zone_t *zone,
    ngx_http_agent_conv_t *conv, ngx_http_agent_tool_t *tool, ngx_str_t *id,
    ngx_uint_t kind, uint64_t deadline, ngx_str_t *fields)
{
    ngx_uint_t                   i, subs;
    ngx_time_t                  *tp;
    ngx_http_agent_pending_t    *p;
    ngx_http_agent_main_conf_t  *amcf;

    p = ngx_http_agent_fsm_pending_add_locked(zone, conv, id, &tool->name,
                                          tool->executor, kind, deadline);
    if (p == NULL) {
        /* every slot is taken: the call cannot wait */
        return NGX_DECLINED;
    }

    if (kind == NGX_HTTP_AGENT_PENDING_CLIENT_EXEC) {
        subs = 0;

        for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
            subs += conv->subs[i].count;
        }

        if (subs == 0) {
            /* no browser to run it: it fails fast unless one comes */

            amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                                       ngx_http_agent_module);
            tp = ngx_timeofday();
            p->grace = (uint64_t) tp->sec * 1000 + tp->msec
                       + amcf->client_grace;
        }
    }

    if (ngx_http_agent_log_add_locked(zone, conv,
                                        NGX_HTTP_AGENT_EV_SUSPENSION, fields)
        == NULL)
    {
        ngx_http_agent_fsm_pending_remove_locked(zone, conv, p);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The tool_result event: {"ok":true,"result":R} with the location's body
 * as R when it is JSON (a string otherwise), or {"ok":false,"error":E}.
 * A JSON body is written anew, not spliced: the event must hold no raw
 * line break, and the body is not a schema the provider must see as is.
 */

ngx_int_t
ngx_http_agent_tools_result(ngx_http_agent_call_t *call, ngx_str_t *result,
    char *error)
{
    char                    err[NGX_HTTP_AGENT_JSON_ERR];
    yajl_gen                g;
    yajl_val                v;
    ngx_str_t               fields, e;
    ngx_uint_t              failed;
    ngx_http_agent_turn_t  *t;

    t = call->turn;

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        goto unrecorded;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "tool_call_id");
    failed |= ngx_http_agent_json_str(g, &call->id);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &call->name);
    failed |= ngx_http_agent_json_key(g, "ok");
    failed |= yajl_gen_bool(g, error == NULL);

    if (error == NULL) {
        failed |= ngx_http_agent_json_key(g, "result");

        v = NULL;

        if (result->len) {
            v = ngx_http_agent_json_parse(result->data, result->len,
                                          NGX_HTTP_AGENT_JSON_DEPTH, err,
                                          sizeof(err));
        }

        if (v != NULL) {
            failed |= ngx_http_agent_provider_value(g, v);
            ngx_http_agent_json_free(v);

        } else {
            /* not JSON, or JSON too deep to take apart: the text as is */

            if (ngx_http_agent_json_utf8_fix(t->pool, result) != NGX_OK) {
                goto unrecorded;
            }

            failed |= ngx_http_agent_json_str(g, result);
        }

    } else {
        e.data = (u_char *) error;
        e.len = ngx_strlen(error);

        failed |= ngx_http_agent_json_key(g, "error");
        failed |= ngx_http_agent_json_str(g, &e);
    }

    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent tool \"%V\" of call \"%V\": its result cannot "
                      "be written as JSON", &call->name, &call->id);
        goto unrecorded;
    }

    if (ngx_http_agent_emit(t->zone, &t->id, NGX_HTTP_AGENT_EV_TOOL_RESULT,
                            &fields)
        == NGX_OK)
    {
        return NGX_OK;
    }

unrecorded:

    /* never sent again: the turn ends when the batch does */
    t->unrecorded = 1;

    return NGX_ERROR;
}
