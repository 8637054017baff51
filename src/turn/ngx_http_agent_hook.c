
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * Hooks as locations.  hook_before is asked before each model call with
 * the turn's user_msg: its answer may inject text at the tail of the
 * context (a canonical injection event, which every later request
 * renders in its place) or halt the turn (turn_halted, no provider call).
 * hook_after is asked with each reply once it is logged, before its
 * calls run or the turn completes, and may halt it.  A hook that fails
 * (not 2xx, not JSON, too slow) fails the turn, or with on_error=continue
 * is logged and passed.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>
#include <yajl/yajl_gen.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_emit.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_hook.h"


/* any canonical event, for ngx_http_agent_hook_last_locked() */
#define NGX_HTTP_AGENT_HOOK_CANONICAL  ((ngx_uint_t) -1)


typedef struct {
    ngx_http_agent_sub_t          sub;        /* first: the filters' view */

    ngx_http_agent_turn_t        *turn;
    ngx_http_agent_hook_t        *hook;
    char                         *name;
    ngx_uint_t                    after;

    ngx_uint_t                    status;
    ngx_http_agent_bytes_t        answer;
    ngx_event_t                   timer;

    unsigned                      done:1;
    unsigned                      timed_out:1;
    unsigned                      too_large:1;
} ngx_http_agent_hook_ctx_t;


static ngx_int_t ngx_http_agent_hook_run(ngx_http_agent_turn_t *t,
    ngx_http_agent_hook_t *hook, ngx_uint_t after);
static ngx_int_t ngx_http_agent_hook_message(ngx_http_agent_turn_t *t,
    ngx_uint_t type, ngx_str_t *message);
static ngx_http_agent_event_t *ngx_http_agent_hook_last_locked(
    ngx_http_agent_turn_t *t, ngx_uint_t type);
static ngx_int_t ngx_http_agent_hook_ended(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_agent_hook_timeout(ngx_event_t *ev);
static void ngx_http_agent_hook_done(ngx_event_t *ev);
static char *ngx_http_agent_hook_answer(ngx_http_agent_hook_ctx_t *ctx,
    char *err, size_t size);
static ngx_int_t ngx_http_agent_hook_inject(ngx_http_agent_hook_ctx_t *ctx,
    yajl_val v);
static void ngx_http_agent_hook_go_on(ngx_http_agent_turn_t *t,
    ngx_uint_t after);
static void ngx_http_agent_hook_end(ngx_http_agent_turn_t *t,
    ngx_http_agent_hook_t *hook, ngx_http_agent_fsm_input_e input,
    ngx_str_t *reason);


ngx_int_t
ngx_http_agent_hook_before(ngx_http_agent_turn_t *t)
{
    return ngx_http_agent_hook_run(t, t->agent->hook_before, 0);
}


ngx_int_t
ngx_http_agent_hook_after(ngx_http_agent_turn_t *t)
{
    return ngx_http_agent_hook_run(t, t->agent->hook_after, 1);
}


/*
 * The log ends in an injection when hook_before was asked for the model
 * call to come and its answer logged: a worker that died after it, in
 * that call or before, leaves it to the take-over (or a revival), which
 * makes the call without asking again.  Asked again, the hook would
 * inject its text a second time.
 */

ngx_uint_t
ngx_http_agent_hook_injected(ngx_http_agent_turn_t *t)
{
    ngx_uint_t               injected;
    ngx_http_agent_event_t  *ev;

    ngx_http_agent_zone_lock(t->zone);

    ev = ngx_http_agent_hook_last_locked(t, NGX_HTTP_AGENT_HOOK_CANONICAL);
    injected = (ev && ev->type == NGX_HTTP_AGENT_EV_INJECTION);

    ngx_http_agent_zone_unlock(t->zone);

    return injected;
}


/*
 * The last event of a type in the conversation's log in the zone, or
 * with NGX_HTTP_AGENT_HOOK_CANONICAL the last canonical one; NULL if none
 */

static ngx_http_agent_event_t *
ngx_http_agent_hook_last_locked(ngx_http_agent_turn_t *t, ngx_uint_t type)
{
    ngx_queue_t             *q;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *ev;

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    for (q = conv ? ngx_queue_last(&conv->log) : NULL;
         q && q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->type == type
            || (type == NGX_HTTP_AGENT_HOOK_CANONICAL
                && ngx_http_agent_event_canonical(ev->type)))
        {
            return ev;
        }
    }

    return NULL;
}


/*
 * POST {"conversation":ID,"turn":N,"model_call":N,"message":EVENT}, the
 * event the turn's user_msg (before) or the reply's assistant_msg with
 * its tool_calls (after), with the conversation and the hook in headers
 */

static ngx_int_t
ngx_http_agent_hook_run(ngx_http_agent_turn_t *t, ngx_http_agent_hook_t *hook,
    ngx_uint_t after)
{
    yajl_gen                    g;
    ngx_str_t                   message, body;
    ngx_uint_t                  failed;
    ngx_keyval_t                headers[2];
    ngx_http_agent_hook_ctx_t  *ctx;

    ctx = ngx_pcalloc(t->pool, sizeof(ngx_http_agent_hook_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->sub.kind = NGX_HTTP_AGENT_SUB_HOOK;
    ctx->turn = t;
    ctx->hook = hook;
    ctx->after = after;
    ctx->name = after ? "hook_after" : "hook_before";

    if (ngx_http_agent_hook_message(t, after ? NGX_HTTP_AGENT_EV_ASSISTANT_MSG
                                             : NGX_HTTP_AGENT_EV_USER_MSG,
                                    &message)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "conversation");
    failed |= ngx_http_agent_json_str(g, &t->id);
    failed |= ngx_http_agent_json_key(g, "turn");
    failed |= yajl_gen_integer(g, t->turn);
    failed |= ngx_http_agent_json_key(g, "model_call");
    failed |= yajl_gen_integer(g, t->model_calls + (after ? 0 : 1));
    failed |= ngx_http_agent_json_key(g, "message");

    if (message.len) {
        failed |= ngx_http_agent_json_verbatim(g, &message);

    } else {
        failed |= yajl_gen_null(g);
    }

    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &body) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_str_set(&headers[0].key, "X-Agent-Conversation");
    headers[0].value = t->id;
    ngx_str_set(&headers[1].key, "X-Agent-Hook");

    if (after) {
        ngx_str_set(&headers[1].value, "after");

    } else {
        ngx_str_set(&headers[1].value, "before");
    }

    if (ngx_http_agent_turn_subrequest(t, &ctx->sub, &hook->location, &body,
                                       headers, 2, ngx_http_agent_hook_ended,
                                       ctx)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->timer.handler = ngx_http_agent_hook_timeout;
    ctx->timer.data = ctx;
    ctx->timer.log = &t->log;

    ngx_add_timer(&ctx->timer, hook->timeout);

    t->hook = ctx;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent turn \"%V\": %s \"%V\"",
                   &t->id, ctx->name, &hook->location);

    return NGX_AGAIN;
}


/*
 * The last event of a type in the conversation: in the zone, or for a
 * user_msg that has left it, in the history the turn read; empty if none
 */

static ngx_int_t
ngx_http_agent_hook_message(ngx_http_agent_turn_t *t, ngx_uint_t type,
    ngx_str_t *message)
{
    ngx_uint_t               i;
    ngx_http_agent_event_t  *ev;

    ngx_str_null(message);

    ngx_http_agent_zone_lock(t->zone);

    ev = ngx_http_agent_hook_last_locked(t, type);

    if (ev) {
        message->data = ngx_pnalloc(t->pool, ev->len);

        if (message->data == NULL) {
            ngx_http_agent_zone_unlock(t->zone);
            return NGX_ERROR;
        }

        ngx_memcpy(message->data, ev->data, ev->len);
        message->len = ev->len;
    }

    ngx_http_agent_zone_unlock(t->zone);

    if (message->len || type != NGX_HTTP_AGENT_EV_USER_MSG) {
        return NGX_OK;
    }

    for (i = t->nhistory; i > 0; i--) {
        if (t->history[i - 1].len > sizeof("{\"type\":\"user_msg\"") - 1
            && ngx_strncmp(t->history[i - 1].data, "{\"type\":\"user_msg\"",
                           sizeof("{\"type\":\"user_msg\"") - 1)
               == 0)
        {
            *message = t->history[i - 1];
            break;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_hook_ended(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_agent_hook_ctx_t *ctx = data;

    ngx_http_agent_turn_t  *t;

    if (ctx->done) {
        return rc;
    }

    ctx->done = 1;
    t = ctx->turn;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "agent turn \"%V\": %s done: %i", &t->id, ctx->name, rc);

    return ngx_http_agent_turn_sub_ended(t, ngx_http_agent_hook_done, rc);
}


/* the hook took longer than its timeout: its connection is closed */

static void
ngx_http_agent_hook_timeout(ngx_event_t *ev)
{
    ngx_http_agent_hook_ctx_t *ctx = ev->data;

    ngx_http_agent_turn_t  *t;

    if (ctx->done) {
        return;
    }

    t = ctx->turn;

    ctx->done = 1;
    ctx->timed_out = 1;

    if (ctx->sub.sr) {
        ngx_http_agent_tools_abort(ctx->sub.sr);
    }

    ngx_http_agent_turn_post(t, ngx_http_agent_hook_done);
}


void
ngx_http_agent_hook_abort(ngx_http_agent_turn_t *t)
{
    ngx_http_agent_hook_ctx_t  *ctx;

    ctx = t->hook;

    if (ctx == NULL) {
        return;
    }

    t->hook = NULL;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    if (!ctx->done) {
        ctx->done = 1;

        if (ctx->sub.sr) {
            ngx_http_agent_tools_abort(ctx->sub.sr);
        }
    }
}


ngx_int_t
ngx_http_agent_hook_header(ngx_http_request_t *r, ngx_http_agent_sub_t *sub)
{
    ngx_http_agent_hook_ctx_t  *ctx = (ngx_http_agent_hook_ctx_t *) sub;

    ctx->status = r->headers_out.status;

    return NGX_OK;
}


/* the answer, up to NGX_HTTP_AGENT_HOOK_MAX; more marks it too large */

ngx_int_t
ngx_http_agent_hook_body(ngx_http_request_t *r, ngx_http_agent_sub_t *sub,
    ngx_chain_t *in)
{
    ngx_http_agent_hook_ctx_t  *ctx = (ngx_http_agent_hook_ctx_t *) sub;

    size_t        n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (!ngx_buf_in_memory(b)) {
            if (ngx_buf_size(b)) {
                ctx->too_large = 1;
                b->file_pos = b->file_last;
            }

            continue;
        }

        n = b->last - b->pos;

        if (n && !ctx->too_large) {
            if (ctx->answer.len + n > NGX_HTTP_AGENT_HOOK_MAX) {
                ctx->too_large = 1;

            } else if (ngx_http_agent_bytes_append(ctx->turn->pool,
                                                   &ctx->answer, b->pos, n)
                       != NGX_OK)
            {
                return NGX_ERROR;
            }
        }

        b->pos = b->last;
    }

    return NGX_OK;
}


/* what the answer says: the turn goes on, is halted, or the hook failed */

static void
ngx_http_agent_hook_done(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t = ev->data;

    char                       *failure, err[NGX_HTTP_AGENT_JSON_ERR];
    ngx_str_t                   reason;
    ngx_uint_t                  after;
    ngx_http_agent_hook_t      *hook;
    ngx_http_agent_hook_ctx_t  *ctx;

    ctx = t->hook;
    t->hook = NULL;

    hook = ctx->hook;
    after = ctx->after;

    failure = ngx_http_agent_hook_answer(ctx, err, sizeof(err));

    if (failure == NULL) {
        /* the answer went on, halted or failed the turn */
        return;
    }

    if (hook->on_error == NGX_HTTP_AGENT_HOOK_CONTINUE) {
        ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                      "agent %s \"%V\" %s, the turn goes on",
                      ctx->name, &hook->location, failure);

        ngx_http_agent_hook_go_on(t, after);
        return;
    }

    ngx_log_error(NGX_LOG_ERR, &t->log, 0, "agent %s \"%V\" %s",
                  ctx->name, &hook->location, failure);

    reason.data = ngx_pnalloc(t->pool, ngx_strlen(ctx->name)
                                       + hook->location.len
                                       + ngx_strlen(failure) + 8);
    if (reason.data == NULL) {
        ngx_str_set(&reason, "a hook failed");

    } else {
        reason.len = ngx_sprintf(reason.data, "%s \"%V\" %s", ctx->name,
                                 &hook->location, failure)
                     - reason.data;
    }

    ngx_http_agent_hook_end(t, hook, NGX_HTTP_AGENT_FSM_FAIL, &reason);
}


/*
 * NULL: the answer was acted on; or what was wrong with the hook, as a
 * predicate ("timed out after 5000 ms")
 */

static char *
ngx_http_agent_hook_answer(ngx_http_agent_hook_ctx_t *ctx, char *err,
    size_t size)
{
    u_char                 *p;
    yajl_val                v, halt;
    ngx_str_t               json, reason;
    ngx_http_agent_turn_t  *t;

    t = ctx->turn;

    if (ctx->timed_out) {
        p = ngx_snprintf((u_char *) err, size - 1, "timed out after %M ms",
                         ctx->hook->timeout);
        *p = '\0';
        return err;
    }

    if (ctx->status < NGX_HTTP_OK || ctx->status >= NGX_HTTP_SPECIAL_RESPONSE)
    {
        if (ctx->status == 0) {
            return "did not answer";
        }

        p = ngx_snprintf((u_char *) err, size - 1, "answered %ui",
                         ctx->status);
        *p = '\0';
        return err;
    }

    if (ctx->too_large) {
        return "answered more than 64 KB";
    }

    json.data = ctx->answer.data;
    json.len = ctx->answer.len;

    ngx_http_agent_json_trim(&json);

    if (json.len == 0) {
        ngx_http_agent_hook_go_on(t, ctx->after);
        return NULL;
    }

    ngx_memcpy(err, "answered JSON that ", sizeof("answered JSON that ") - 1);

    v = ngx_http_agent_json_parse(json.data, json.len,
                                  NGX_HTTP_AGENT_JSON_DEPTH,
                                  err + sizeof("answered JSON that ") - 1,
                                  size - sizeof("answered JSON that ") + 1);
    if (v == NULL) {
        return err;
    }

    if (!YAJL_IS_OBJECT(v)) {
        ngx_http_agent_json_free(v);
        return "answered JSON that is not an object";
    }

    halt = ngx_http_agent_provider_get(v, "halt");

    if (halt && !YAJL_IS_STRING(halt)) {
        ngx_http_agent_json_free(v);
        return "answered a \"halt\" that is not a string";
    }

    if (halt) {
        reason.data = (u_char *) YAJL_GET_STRING(halt);
        reason.len = ngx_strlen(reason.data);

        ngx_log_error(NGX_LOG_INFO, &t->log, 0,
                      "agent %s \"%V\" halted the turn",
                      ctx->name, &ctx->hook->location);

        ngx_http_agent_hook_end(t, ctx->hook, NGX_HTTP_AGENT_FSM_HALT,
                                &reason);
        ngx_http_agent_json_free(v);
        return NULL;
    }

    if (!ctx->after) {
        switch (ngx_http_agent_hook_inject(ctx, v)) {

        case NGX_OK:
            break;

        case NGX_DECLINED:
            ngx_http_agent_json_free(v);
            return "answered an \"inject\" that is not a string";

        default:
            ngx_http_agent_json_free(v);
            ngx_str_set(&reason, "the injection could not be recorded");
            ngx_http_agent_hook_end(t, ctx->hook, NGX_HTTP_AGENT_FSM_FAIL,
                                    &reason);
            return NULL;
        }
    }

    ngx_http_agent_json_free(v);

    ngx_http_agent_hook_go_on(t, ctx->after);

    return NULL;
}


/*
 * The text a before hook injects is logged as a canonical injection
 * event: each request from now on renders it where it stands, at the
 * tail of this model call's context, so a replay builds the same one.
 * NGX_DECLINED: "inject" is not a string.
 */

static ngx_int_t
ngx_http_agent_hook_inject(ngx_http_agent_hook_ctx_t *ctx, yajl_val v)
{
    yajl_gen                g;
    yajl_val                inject;
    ngx_str_t               text, fields;
    ngx_uint_t              failed;
    ngx_http_agent_turn_t  *t;

    t = ctx->turn;

    inject = ngx_http_agent_provider_get(v, "inject");

    if (inject == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_STRING(inject)) {
        return NGX_DECLINED;
    }

    text.data = (u_char *) YAJL_GET_STRING(inject);
    text.len = ngx_strlen(text.data);

    if (text.len == 0) {
        return NGX_OK;
    }

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "content");
    failed |= ngx_http_agent_json_str(g, &text);
    failed |= ngx_http_agent_json_key(g, "hook");
    failed |= ngx_http_agent_json_str(g, &ctx->hook->location);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_agent_emit(t->zone, &t->id, NGX_HTTP_AGENT_EV_INJECTION,
                               &fields);
}


static void
ngx_http_agent_hook_go_on(ngx_http_agent_turn_t *t, ngx_uint_t after)
{
    if (after) {
        ngx_http_agent_turn_replied(t);
        return;
    }

    /* the model call the hook was asked before, made now */

    t->hooked = 1;
    ngx_http_agent_turn_model_call(&t->event);
}


/* turn_halted or turn_failed: {"reason":..., "hook":"/uri"} */

static void
ngx_http_agent_hook_end(ngx_http_agent_turn_t *t, ngx_http_agent_hook_t *hook,
    ngx_http_agent_fsm_input_e input, ngx_str_t *reason)
{
    yajl_gen    g;
    ngx_str_t   fields;
    ngx_uint_t  failed;

    g = ngx_http_agent_json_gen(t->pool);

    if (g == NULL) {
        failed = 1;

    } else {
        failed = yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "reason");
        failed |= ngx_http_agent_json_str(g, reason);
        failed |= ngx_http_agent_json_key(g, "hook");
        failed |= ngx_http_agent_json_str(g, &hook->location);
        failed |= yajl_gen_map_close(g);
    }

    if (failed || ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        ngx_str_set(&fields, "{\"reason\":\"internal error\"}");
    }

    (void) ngx_http_agent_turn_end(t, input, &fields);
}
