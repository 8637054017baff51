
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_trace.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools_call.h"
#include "ngx_http_agent_mcp_rpc.h"
#include "ngx_http_agent_spans.h"


/*
 * A turn's spans, in the OpenTelemetry GenAI conventions: invoke_agent
 * for the turn, chat for each model call, execute_tool for each tool
 * call, all built from the turn's events when it ends, with the log's
 * times.  Their ids come from the trace context of the turn's user_msg
 * (ngx_http_agent_trace.c), so that the traceparent a subrequest carried
 * names the span exported for it, whichever worker ran what.
 */

#define NGX_HTTP_AGENT_SPAN_INTERNAL  1
#define NGX_HTTP_AGENT_SPAN_CLIENT    3

#define NGX_HTTP_AGENT_STATUS_ERROR   2


typedef struct {
    u_char                        id[NGX_HTTP_AGENT_SPAN_ID_LEN];
    u_char                       *parent;
    ngx_str_t                     op;
    ngx_str_t                     what;
    ngx_uint_t                    kind;
    int64_t                       start;
    int64_t                       end;
} ngx_http_agent_span_t;


typedef struct {
    ngx_http_agent_spans_turn_t  *turn;
    ngx_http_agent_trace_t        tc;
    ngx_http_agent_t             *agent;
    ngx_str_t                     provider;
    yajl_val                     *ev;
    ngx_uint_t                    n;
    ngx_uint_t                    nspans;
    yajl_gen                      g;
    yajl_gen                      sub;
} ngx_http_agent_spans_ctx_t;


static ngx_int_t ngx_http_agent_spans_context(ngx_http_agent_turn_t *t,
    ngx_uint_t *call);
static size_t ngx_http_agent_spans_attempts_size(ngx_http_agent_turn_t *t,
    ngx_str_t *fields);
static u_char *ngx_http_agent_spans_attempts(ngx_http_agent_turn_t *t,
    u_char *p, ngx_str_t *fields, uint64_t started);
static ngx_uint_t ngx_http_agent_spans_cut(yajl_val ev);
static ngx_uint_t ngx_http_agent_spans_turn(ngx_http_agent_spans_ctx_t *ctx);
static ngx_uint_t ngx_http_agent_spans_chat(ngx_http_agent_spans_ctx_t *ctx,
    ngx_uint_t k, yajl_val ev, int64_t start);
static ngx_uint_t ngx_http_agent_spans_retry_events(
    ngx_http_agent_spans_ctx_t *ctx, yajl_val retries);
static ngx_uint_t ngx_http_agent_spans_chat_failed(
    ngx_http_agent_spans_ctx_t *ctx, ngx_uint_t k, int64_t start);
static ngx_uint_t ngx_http_agent_spans_tool(ngx_http_agent_spans_ctx_t *ctx,
    ngx_uint_t i);
static ngx_uint_t ngx_http_agent_spans_tool_links(
    ngx_http_agent_spans_ctx_t *ctx, ngx_uint_t i, yajl_val result,
    ngx_str_t *id);
static ngx_uint_t ngx_http_agent_spans_tool_event(
    ngx_http_agent_spans_ctx_t *ctx, yajl_val ev, ngx_str_t *type);
static ngx_uint_t ngx_http_agent_spans_open(ngx_http_agent_spans_ctx_t *ctx,
    ngx_http_agent_span_t *s);
static ngx_uint_t ngx_http_agent_spans_close(yajl_gen g, ngx_str_t *error,
    ngx_str_t *message);
static ngx_uint_t ngx_http_agent_spans_key(yajl_gen g, char *key);
static ngx_uint_t ngx_http_agent_spans_attr(yajl_gen g, char *key,
    ngx_str_t *value);
static ngx_uint_t ngx_http_agent_spans_attr_int(yajl_gen g, char *key,
    int64_t value);
static ngx_uint_t ngx_http_agent_spans_attr_member(yajl_gen g, char *key,
    yajl_val ev, char *member);
static ngx_uint_t ngx_http_agent_spans_attr_json(
    ngx_http_agent_spans_ctx_t *ctx, char *key, yajl_val v);
static ngx_uint_t ngx_http_agent_spans_attrs_end(yajl_gen g,
    ngx_str_t *error);
static ngx_uint_t ngx_http_agent_spans_time(yajl_gen g, int64_t ms);
static ngx_uint_t ngx_http_agent_spans_id(yajl_gen g, u_char *id, size_t n);
static ngx_str_t ngx_http_agent_spans_str(yajl_val ev, char *member);
static int64_t ngx_http_agent_spans_ts(yajl_val ev);
static ngx_uint_t ngx_http_agent_spans_is(yajl_val ev, char *type);


/*
 * A subrequest's traceparent: a model call's is its chat span, a tool
 * call's (a POST or an MCP tools/call) its execute_tool span, anything
 * else the turn's
 */

ngx_int_t
ngx_http_agent_spans_header(ngx_http_agent_turn_t *t,
    ngx_http_agent_sub_t *sub, ngx_http_request_t *sr)
{
    u_char                      *p, span[NGX_HTTP_AGENT_SPAN_ID_LEN];
    ngx_str_t                    key;
    ngx_uint_t                   call;
    ngx_table_elt_t             *h;
    ngx_http_agent_mcp_rpc_t    *rpc;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (amcf->trace.len == 0
        || ngx_http_agent_spans_context(t, &call) != NGX_OK)
    {
        return NGX_OK;
    }

    p = ngx_pnalloc(sr->pool, NGX_HTTP_AGENT_TRACEPARENT_LEN + NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(span, t->trace.span_id, NGX_HTTP_AGENT_SPAN_ID_LEN);

    if (sub->kind == NGX_HTTP_AGENT_SUB_PROVIDER) {
        key.data = p;
        key.len = ngx_sprintf(p, "%ui", call) - p;
        ngx_http_agent_trace_span(&t->trace, "chat", &key, span);

    } else if (sub->kind == NGX_HTTP_AGENT_SUB_TOOL) {
        ngx_http_agent_trace_span(&t->trace, "tool",
                                  &((ngx_http_agent_call_t *) sub)->id,
                                  span);

    } else if (sub->kind == NGX_HTTP_AGENT_SUB_MCP) {
        rpc = (ngx_http_agent_mcp_rpc_t *) sub;

        if (rpc->method.len == sizeof("tools/call") - 1
            && ngx_strncmp(rpc->method.data, "tools/call",
                           sizeof("tools/call") - 1)
               == 0)
        {
            ngx_http_agent_trace_span(&t->trace, "tool", &rpc->key, span);
        }
    }

    h = ngx_list_push(&sr->headers_in.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "traceparent");
    h->lowcase_key = (u_char *) "traceparent";
    h->value.data = p;
    h->value.len = ngx_http_agent_trace_header(p, &t->trace, span) - p;

    if (t->trace.state.len == 0) {
        return NGX_OK;
    }

    h = ngx_list_push(&sr->headers_in.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "tracestate");
    h->lowcase_key = (u_char *) "tracestate";
    h->value = t->trace.state;

    return NGX_OK;
}


/*
 * The turn's trace context, read once from its user_msg in the zone, and
 * the number in the turn of the model call that would start now
 */

static ngx_int_t
ngx_http_agent_spans_context(ngx_http_agent_turn_t *t, ngx_uint_t *call)
{
    u_char                  *p;
    char                     err[NGX_HTTP_AGENT_JSON_ERR];
    size_t                   len;
    yajl_val                 v;
    ngx_int_t                rc;
    ngx_str_t                state;
    ngx_queue_t             *q;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *ev;

    p = NULL;
    len = 0;
    *call = 1;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    for (q = conv ? ngx_queue_last(&conv->log) : NULL;
         q && q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG) {
            (*call)++;
        }

        if (ev->type != NGX_HTTP_AGENT_EV_USER_MSG) {
            continue;
        }

        if (!t->trace.valid) {
            p = ngx_pnalloc(t->request->pool, ev->len);

            if (p) {
                ngx_memcpy(p, ev->data, ev->len);
                len = ev->len;
            }
        }

        break;
    }

    ngx_http_agent_zone_unlock(t->zone);

    if (t->trace.valid) {
        return NGX_OK;
    }

    if (p == NULL) {
        return NGX_DECLINED;
    }

    v = ngx_http_agent_json_parse(p, len, NGX_HTTP_AGENT_JSON_LOG_DEPTH, err,
                                  sizeof(err));
    if (v == NULL) {
        return NGX_DECLINED;
    }

    rc = ngx_http_agent_trace_from(v, &t->trace);

    if (rc == NGX_OK && t->trace.state.len) {
        state.data = ngx_pstrdup(t->request->pool, &t->trace.state);
        state.len = state.data ? t->trace.state.len : 0;
        t->trace.state = state;
    }

    ngx_http_agent_json_free(v);

    return rc;
}


/*
 * With agent_trace, an assistant_msg also keeps when its call started,
 * its attempts, and the model and response id the provider gave
 */

ngx_int_t
ngx_http_agent_spans_reply(ngx_http_agent_turn_t *t, ngx_str_t *fields)
{
    u_char                      *p, *last;
    size_t                       len;
    ngx_http_agent_reply_t      *reply;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (amcf->trace.len == 0 || fields->len < 2) {
        return NGX_OK;
    }

    reply = t->reply;

    if (ngx_http_agent_json_utf8(&(ngx_str_t) { reply->response_id.len,
                                                reply->response_id.data })
        != NGX_OK
        || ngx_http_agent_json_utf8(&(ngx_str_t) { reply->response_model.len,
                                                reply->response_model.data })
           != NGX_OK)
    {
        return NGX_OK;
    }

    len = ngx_http_agent_spans_attempts_size(t, fields)
          + sizeof(",\"response_id\":\"\",\"response_model\":\"\"")
          + reply->response_id.len
          + ngx_escape_json(NULL, reply->response_id.data,
                            reply->response_id.len)
          + reply->response_model.len
          + ngx_escape_json(NULL, reply->response_model.data,
                            reply->response_model.len);

    p = ngx_pnalloc(t->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    /* the call started with its first attempt */

    last = ngx_http_agent_spans_attempts(t, p, fields,
                                         t->nretries ? t->retries[0].started
                                                 : (uint64_t) t->call_started);

    if (reply->response_id.len) {
        last = ngx_cpymem(last, ",\"response_id\":\"",
                          sizeof(",\"response_id\":\"") - 1);
        last = (u_char *) ngx_escape_json(last, reply->response_id.data,
                                          reply->response_id.len);
        *last++ = '"';
    }

    if (reply->response_model.len) {
        last = ngx_cpymem(last, ",\"response_model\":\"",
                          sizeof(",\"response_model\":\"") - 1);
        last = (u_char *) ngx_escape_json(last, reply->response_model.data,
                                          reply->response_model.len);
        *last++ = '"';
    }

    *last++ = '}';

    fields->data = p;
    fields->len = last - p;

    return NGX_OK;
}


/*
 * A model call that fails the turn after attempts made again: its
 * turn_failed keeps them as an assistant_msg would, for its chat span
 */

ngx_int_t
ngx_http_agent_spans_failed(ngx_http_agent_turn_t *t, ngx_str_t *reason)
{
    u_char                      *p;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (amcf->trace.len == 0 || t->nretries == 0 || reason->len < 2
        || reason->data[reason->len - 1] != '}')
    {
        return NGX_OK;
    }

    p = ngx_pnalloc(t->pool, ngx_http_agent_spans_attempts_size(t, reason));
    if (p == NULL) {
        return NGX_ERROR;
    }

    reason->len = ngx_http_agent_spans_attempts(t, p, reason,
                                                t->retries[0].started)
                  - p;
    p[reason->len++] = '}';
    reason->data = p;

    return NGX_OK;
}


static size_t
ngx_http_agent_spans_attempts_size(ngx_http_agent_turn_t *t,
    ngx_str_t *fields)
{
    return fields->len + sizeof(",\"started\":,\"attempts\":")
           + 2 * NGX_INT64_LEN + sizeof(",\"retries\":[]")
           + t->nretries * (sizeof("{\"started\":,\"ended\":,\"status\":,"
                                   "\"error_type\":\"\"},")
                            + 3 * NGX_INT64_LEN
                            + NGX_HTTP_AGENT_ERROR_TYPE_MAX);
}


/*
 * The fields of an object but its "}", then "started", "attempts" and
 * "retries": the attempts before the last, as the chat span's events
 */

static u_char *
ngx_http_agent_spans_attempts(ngx_http_agent_turn_t *t, u_char *p,
    ngx_str_t *fields, uint64_t started)
{
    ngx_uint_t               i;
    ngx_http_agent_retry_t  *a;

    p = ngx_sprintf(p, "%*s,\"started\":%uL,\"attempts\":%ui",
                    fields->len - 1, fields->data, started, t->attempts);

    if (t->nretries == 0) {
        return p;
    }

    p = ngx_cpymem(p, ",\"retries\":[", sizeof(",\"retries\":[") - 1);

    for (i = 0; i < t->nretries; i++) {
        a = &t->retries[i];

        p = ngx_sprintf(p, "%s{\"started\":%uL,\"ended\":%uL,"
                        "\"status\":%ui", i ? "," : "", a->started,
                        a->ended, a->status);

        if (a->type_len) {
            p = ngx_sprintf(p, ",\"error_type\":\"%*s\"", a->type_len,
                            a->type);
        }

        *p++ = '}';
    }

    *p++ = ']';

    return p;
}


ngx_int_t
ngx_http_agent_spans_build(ngx_pool_t *pool, yajl_gen g,
    ngx_http_agent_spans_turn_t *turn, ngx_uint_t *nspans)
{
    char                         err[NGX_HTTP_AGENT_JSON_ERR];
    int64_t                      prev;
    ngx_int_t                    rc;
    ngx_uint_t                   i, k, failed;
    ngx_http_agent_spans_ctx_t   ctx;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    ngx_memzero(&ctx, sizeof(ngx_http_agent_spans_ctx_t));

    ctx.turn = turn;
    ctx.g = g;
    ctx.agent = ngx_http_agent_conf_find(amcf, &turn->agent);

    if (ctx.agent) {
        if (ngx_strncmp(ctx.agent->provider->name.data, "anthropic",
                        sizeof("anthropic") - 1)
            == 0)
        {
            ngx_str_set(&ctx.provider, "anthropic");

        } else {
            ngx_str_set(&ctx.provider, "openai");
        }
    }

    ctx.ev = ngx_pcalloc(pool, turn->nevents * sizeof(yajl_val));
    ctx.sub = ngx_http_agent_json_gen(pool);

    if (ctx.ev == NULL || ctx.sub == NULL) {
        return NGX_ERROR;
    }

    rc = NGX_DECLINED;

    for (ctx.n = 0; ctx.n < turn->nevents; ctx.n++) {
        ctx.ev[ctx.n] = ngx_http_agent_json_parse(turn->events[ctx.n].data,
                                                 turn->events[ctx.n].len,
                                                 NGX_HTTP_AGENT_JSON_LOG_DEPTH,
                                                 err, sizeof(err));
        if (ctx.ev[ctx.n] == NULL) {
            goto done;
        }
    }

    if (ctx.n < 2
        || ngx_http_agent_trace_from(ctx.ev[0], &ctx.tc) != NGX_OK)
    {
        goto done;
    }

    failed = ngx_http_agent_spans_turn(&ctx);

    k = 0;
    prev = ngx_http_agent_spans_ts(ctx.ev[0]);

    for (i = 1; i < ctx.n; i++) {

        if (ngx_http_agent_spans_is(ctx.ev[i], "assistant_msg")) {
            failed |= ngx_http_agent_spans_chat(&ctx, ++k, ctx.ev[i], prev);

        } else if (ngx_http_agent_spans_is(ctx.ev[i], "tool_call")) {
            failed |= ngx_http_agent_spans_tool(&ctx, i);

        } else if (i == ctx.n - 1
                   && ngx_http_agent_spans_is(ctx.ev[i], "turn_failed")
                   && (ngx_http_agent_provider_get(ctx.ev[i], "status")
                       || ngx_http_agent_provider_get(ctx.ev[i], "error"))
                   && !ngx_http_agent_spans_cut(ctx.ev[i - 1]))
        {
            /*
             * a model call that failed leaves no assistant_msg, or one
             * cut short, which is its span
             */
            failed |= ngx_http_agent_spans_chat_failed(&ctx, ++k, prev);
        }

        prev = ngx_http_agent_spans_ts(ctx.ev[i]);
    }

    rc = failed ? NGX_ERROR : NGX_OK;
    *nspans = ctx.nspans;

done:

    for (i = 0; i < ctx.n; i++) {
        ngx_http_agent_json_free(ctx.ev[i]);
    }

    return rc;
}


/* an assistant_msg cut short: its model call failed */

static ngx_uint_t
ngx_http_agent_spans_cut(yajl_val ev)
{
    ngx_str_t  status;

    status = ngx_http_agent_spans_str(ev, "status");

    return ngx_http_agent_spans_is(ev, "assistant_msg")
           && status.len
           && ngx_strncmp(status.data, "complete", status.len) != 0;
}


/* invoke_agent: from the user_msg to the turn's terminal event */

static ngx_uint_t
ngx_http_agent_spans_turn(ngx_http_agent_spans_ctx_t *ctx)
{
    yajl_val                user, last;
    ngx_str_t               type, error, reason, *e;
    ngx_uint_t              failed;
    ngx_http_agent_span_t   s;

    user = ctx->ev[0];
    last = ctx->ev[ctx->n - 1];

    ngx_memzero(&s, sizeof(ngx_http_agent_span_t));

    ngx_memcpy(s.id, ctx->tc.span_id, NGX_HTTP_AGENT_SPAN_ID_LEN);
    s.parent = ctx->tc.parent ? ctx->tc.parent_id : NULL;
    ngx_str_set(&s.op, "invoke_agent");
    s.what = ctx->turn->agent;
    s.kind = NGX_HTTP_AGENT_SPAN_INTERNAL;
    s.start = ngx_http_agent_spans_ts(user);
    s.end = ngx_http_agent_spans_ts(last);

    failed = ngx_http_agent_spans_open(ctx, &s);

    failed |= ngx_http_agent_spans_attr(ctx->g, "gen_ai.agent.name",
                                        &ctx->turn->agent);
    failed |= ngx_http_agent_spans_attr(ctx->g, "gen_ai.conversation.id",
                                        &ctx->turn->id);

    if (ctx->agent) {
        failed |= ngx_http_agent_spans_attr(ctx->g, "gen_ai.request.model",
                                            &ctx->agent->model);
    }

    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.turn", user,
                                               "turn");

    if (ctx->turn->content) {
        failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                                   "gen_ai.input.messages",
                                                   user, "content");
    }

    type = ngx_http_agent_spans_str(last, "type");
    failed |= ngx_http_agent_spans_attr(ctx->g, "agent.turn.outcome", &type);

    e = NULL;
    reason = ngx_http_agent_spans_str(last, "reason");

    if (ngx_http_agent_spans_is(last, "turn_failed")) {
        error = ngx_http_agent_spans_str(
                    ngx_http_agent_provider_get(last, "error"), "type");

        if (error.len == 0) {
            ngx_str_set(&error, "turn_failed");
        }

        e = &error;

    } else if (ngx_http_agent_spans_is(last, "cancelled")) {
        ngx_str_set(&error, "cancelled");
        e = &error;
    }

    failed |= ngx_http_agent_spans_attrs_end(ctx->g, e);
    failed |= ngx_http_agent_spans_close(ctx->g, e, &reason);

    return failed;
}


/* chat: a model call, from its request to its reply's end */

static ngx_uint_t
ngx_http_agent_spans_chat(ngx_http_agent_spans_ctx_t *ctx, ngx_uint_t k,
    yajl_val ev, int64_t start)
{
    u_char                  buf[NGX_INT_T_LEN];
    yajl_val                v;
    ngx_str_t               key, error, *e;
    ngx_uint_t              failed;
    ngx_http_agent_span_t   s;

    ngx_memzero(&s, sizeof(ngx_http_agent_span_t));

    key.data = buf;
    key.len = ngx_sprintf(buf, "%ui", k) - buf;
    ngx_http_agent_trace_span(&ctx->tc, "chat", &key, s.id);

    v = ngx_http_agent_provider_get(ev, "started");

    s.parent = ctx->tc.span_id;
    ngx_str_set(&s.op, "chat");
    s.what = ctx->agent ? ctx->agent->model : ctx->turn->agent;
    s.kind = NGX_HTTP_AGENT_SPAN_CLIENT;
    s.start = YAJL_IS_INTEGER(v) ? YAJL_GET_INTEGER(v) : start;
    s.end = ngx_http_agent_spans_ts(ev);

    failed = ngx_http_agent_spans_open(ctx, &s);

    failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                               "gen_ai.response.model", ev,
                                               "response_model");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "gen_ai.response.id",
                                               ev, "response_id");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.message.id",
                                               ev, "message_id");

    v = ngx_http_agent_provider_get(ev, "usage");

    failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                               "gen_ai.usage.input_tokens",
                                               v, "input_tokens");
    failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                               "gen_ai.usage.output_tokens",
                                               v, "output_tokens");
    failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                 "gen_ai.usage.cache_read.input_tokens", v,
                                 "cached_tokens");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.model.attempts",
                                               ev, "attempts");

    v = ngx_http_agent_provider_get(ev, "finish_reason");

    if (YAJL_IS_STRING(v)) {
        failed |= ngx_http_agent_spans_attr_json(ctx,
                                          "gen_ai.response.finish_reasons", v);
    }

    if (ctx->turn->content) {
        failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                                   "gen_ai.output.messages",
                                                   ev, "content");
    }

    e = NULL;

    if (ngx_http_agent_spans_cut(ev)) {
        ngx_str_set(&error, "interrupted");
        e = &error;
    }

    failed |= ngx_http_agent_spans_attrs_end(ctx->g, e);
    failed |= ngx_http_agent_spans_retry_events(ctx,
                                  ngx_http_agent_provider_get(ev, "retries"));
    failed |= ngx_http_agent_spans_close(ctx->g, e, NULL);

    return failed;
}


/*
 * The attempts made again, as events at their ends: "agent.model.retry"
 * with the attempt's number, start, the provider's status and error type
 */

static ngx_uint_t
ngx_http_agent_spans_retry_events(ngx_http_agent_spans_ctx_t *ctx,
    yajl_val retries)
{
    u_char      buf[NGX_INT_T_LEN];
    yajl_val    a, v;
    ngx_str_t   error;
    ngx_uint_t  i, failed;

    if (!YAJL_IS_ARRAY(retries) || retries->u.array.len == 0) {
        return 0;
    }

    failed = ngx_http_agent_json_key(ctx->g, "events");
    failed |= yajl_gen_array_open(ctx->g);

    for (i = 0; i < retries->u.array.len; i++) {
        a = retries->u.array.values[i];
        v = ngx_http_agent_provider_get(a, "ended");

        failed |= yajl_gen_map_open(ctx->g);
        failed |= ngx_http_agent_json_key(ctx->g, "timeUnixNano");
        failed |= ngx_http_agent_spans_time(ctx->g, YAJL_IS_INTEGER(v)
                                                    ? YAJL_GET_INTEGER(v)
                                                    : 0);
        failed |= ngx_http_agent_json_key(ctx->g, "name");
        failed |= ngx_http_agent_json_key(ctx->g, "agent.model.retry");
        failed |= ngx_http_agent_json_key(ctx->g, "attributes");
        failed |= yajl_gen_array_open(ctx->g);

        failed |= ngx_http_agent_spans_attr_int(ctx->g, "agent.model.attempt",
                                                i + 1);
        failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                              "agent.model.attempt.started",
                                              a, "started");

        v = ngx_http_agent_provider_get(a, "status");
        error = ngx_http_agent_spans_str(a, "error_type");

        if (YAJL_IS_INTEGER(v) && YAJL_GET_INTEGER(v) > 0) {
            failed |= ngx_http_agent_spans_attr_int(ctx->g,
                                                "http.response.status_code",
                                                YAJL_GET_INTEGER(v));
            if (error.len == 0) {
                error.data = buf;
                error.len = ngx_sprintf(buf, "%L", YAJL_GET_INTEGER(v))
                            - buf;
            }
        }

        if (error.len == 0) {
            ngx_str_set(&error, "error");
        }

        failed |= ngx_http_agent_spans_attr(ctx->g, "error.type", &error);

        failed |= yajl_gen_array_close(ctx->g);
        failed |= yajl_gen_map_close(ctx->g);
    }

    return failed | yajl_gen_array_close(ctx->g);
}


/* a model call that failed the turn: it ends with the turn */

static ngx_uint_t
ngx_http_agent_spans_chat_failed(ngx_http_agent_spans_ctx_t *ctx,
    ngx_uint_t k, int64_t start)
{
    u_char                  buf[NGX_INT_T_LEN];
    yajl_val                last, v;
    ngx_str_t               key, error, reason;
    ngx_uint_t              failed;
    ngx_http_agent_span_t   s;

    last = ctx->ev[ctx->n - 1];

    ngx_memzero(&s, sizeof(ngx_http_agent_span_t));

    key.data = buf;
    key.len = ngx_sprintf(buf, "%ui", k) - buf;
    ngx_http_agent_trace_span(&ctx->tc, "chat", &key, s.id);

    s.parent = ctx->tc.span_id;
    ngx_str_set(&s.op, "chat");
    s.what = ctx->agent ? ctx->agent->model : ctx->turn->agent;
    s.kind = NGX_HTTP_AGENT_SPAN_CLIENT;
    s.end = ngx_http_agent_spans_ts(last);

    /* from its first attempt, if it was tried again */

    v = ngx_http_agent_provider_get(last, "started");
    s.start = YAJL_IS_INTEGER(v) ? YAJL_GET_INTEGER(v) : start;

    failed = ngx_http_agent_spans_open(ctx, &s);

    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.model.attempts",
                                               last, "attempts");

    v = ngx_http_agent_provider_get(last, "status");

    if (YAJL_IS_INTEGER(v)) {
        failed |= ngx_http_agent_spans_attr_int(ctx->g,
                                                "http.response.status_code",
                                                YAJL_GET_INTEGER(v));
    }

    error = ngx_http_agent_spans_str(ngx_http_agent_provider_get(last,
                                                                 "error"),
                                     "type");
    if (error.len == 0) {
        if (YAJL_IS_INTEGER(v)) {
            error.data = buf;
            error.len = ngx_sprintf(buf, "%L", YAJL_GET_INTEGER(v)) - buf;

        } else {
            ngx_str_set(&error, "error");
        }
    }

    reason = ngx_http_agent_spans_str(last, "reason");

    failed |= ngx_http_agent_spans_attrs_end(ctx->g, &error);
    failed |= ngx_http_agent_spans_retry_events(ctx,
                                ngx_http_agent_provider_get(last, "retries"));
    failed |= ngx_http_agent_spans_close(ctx->g, &error, &reason);

    return failed;
}


/*
 * execute_tool: from the tool_call to its tool_result (or the turn's end),
 * with the call's suspension and resolution as events
 */

static ngx_uint_t
ngx_http_agent_spans_tool(ngx_http_agent_spans_ctx_t *ctx, ngx_uint_t i)
{
    yajl_val                call, ev, result;
    ngx_str_t               id, other, error, message, *e;
    ngx_uint_t              j, failed, nevents;
    ngx_http_agent_span_t   s;

    call = ctx->ev[i];
    id = ngx_http_agent_spans_str(call, "tool_call_id");

    ngx_memzero(&s, sizeof(ngx_http_agent_span_t));

    ngx_http_agent_trace_span(&ctx->tc, "tool", &id, s.id);

    s.parent = ctx->tc.span_id;
    ngx_str_set(&s.op, "execute_tool");
    s.what = ngx_http_agent_spans_str(call, "name");
    s.kind = NGX_HTTP_AGENT_SPAN_INTERNAL;
    s.start = ngx_http_agent_spans_ts(call);
    s.end = ngx_http_agent_spans_ts(ctx->ev[ctx->n - 1]);

    result = NULL;

    for (j = i + 1; j < ctx->n; j++) {
        other = ngx_http_agent_spans_str(ctx->ev[j], "tool_call_id");

        if (ngx_http_agent_spans_is(ctx->ev[j], "tool_result")
            && other.len == id.len
            && ngx_strncmp(other.data, id.data, id.len) == 0)
        {
            result = ctx->ev[j];
            s.end = ngx_http_agent_spans_ts(result);
            break;
        }
    }

    failed = ngx_http_agent_spans_open(ctx, &s);

    failed |= ngx_http_agent_spans_attr(ctx->g, "gen_ai.tool.name", &s.what);
    failed |= ngx_http_agent_spans_attr(ctx->g, "gen_ai.tool.call.id", &id);
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.tool.executor",
                                               call, "executor");

    if (ctx->turn->content) {
        failed |= ngx_http_agent_spans_attr_member(ctx->g,
                                                "gen_ai.tool.call.arguments",
                                                call, "arguments");
        failed |= ngx_http_agent_spans_attr_json(ctx,
                                            "gen_ai.tool.call.result",
                                            ngx_http_agent_provider_get(result,
                                                                   "result"));
    }

    e = NULL;
    ngx_str_null(&message);

    if (result == NULL) {
        ngx_str_set(&error, "no_result");
        e = &error;

    } else if (ngx_http_agent_provider_get(result, "error")) {
        message = ngx_http_agent_spans_str(result, "error");

        if (message.len > 1 && message.data[0] == '[') {
            /* "[failed] ...", "[cancelled] ...": the bracket's word */
            error.data = message.data + 1;
            error.len = 0;

            while (error.len < message.len - 2
                   && error.data[error.len] != ']')
            {
                error.len++;
            }

        } else {
            ngx_str_set(&error, "tool_error");
        }

        e = &error;
    }

    failed |= ngx_http_agent_spans_attrs_end(ctx->g, e);

    /* what waited for a person, and how it was resolved */

    nevents = 0;

    for (j = i + 1; j < ctx->n && ctx->ev[j] != result; j++) {
        ev = ctx->ev[j];
        other = ngx_http_agent_spans_str(ev, "tool_call_id");

        if (other.len != id.len
            || ngx_strncmp(other.data, id.data, id.len) != 0)
        {
            continue;
        }

        other = ngx_http_agent_spans_str(ev, "type");

        if (!ngx_http_agent_spans_is(ev, "suspension")
            && !ngx_http_agent_spans_is(ev, "resolution"))
        {
            continue;
        }

        if (nevents++ == 0) {
            failed |= ngx_http_agent_json_key(ctx->g, "events");
            failed |= yajl_gen_array_open(ctx->g);
        }

        failed |= ngx_http_agent_spans_tool_event(ctx, ev, &other);
    }

    if (nevents) {
        failed |= yajl_gen_array_close(ctx->g);
    }

    failed |= ngx_http_agent_spans_tool_links(ctx, i, result, &id);
    failed |= ngx_http_agent_spans_close(ctx->g, e, &message);

    return failed;
}


/*
 * A link to the span of each request that resolved the call with a
 * traceparent (the resolver's trace: the call stays in the turn's)
 */

static ngx_uint_t
ngx_http_agent_spans_tool_links(ngx_http_agent_spans_ctx_t *ctx,
    ngx_uint_t i, yajl_val result, ngx_str_t *id)
{
    yajl_val                ev;
    ngx_str_t               other, tp;
    ngx_uint_t              j, failed, nlinks;
    ngx_http_agent_trace_t  tc;

    failed = 0;
    nlinks = 0;

    for (j = i + 1; j < ctx->n && ctx->ev[j] != result; j++) {
        ev = ctx->ev[j];
        other = ngx_http_agent_spans_str(ev, "tool_call_id");
        tp = ngx_http_agent_spans_str(ev, "traceparent");

        if (!ngx_http_agent_spans_is(ev, "resolution")
            || other.len != id->len
            || ngx_strncmp(other.data, id->data, id->len) != 0
            || tp.len == 0
            || ngx_http_agent_trace_parse(&tp, &tc) != NGX_OK)
        {
            continue;
        }

        if (nlinks++ == 0) {
            failed |= ngx_http_agent_json_key(ctx->g, "links");
            failed |= yajl_gen_array_open(ctx->g);
        }

        failed |= yajl_gen_map_open(ctx->g);
        failed |= ngx_http_agent_json_key(ctx->g, "traceId");
        failed |= ngx_http_agent_spans_id(ctx->g, tc.trace_id,
                                          NGX_HTTP_AGENT_TRACE_ID_LEN);
        failed |= ngx_http_agent_json_key(ctx->g, "spanId");
        failed |= ngx_http_agent_spans_id(ctx->g, tc.parent_id,
                                          NGX_HTTP_AGENT_SPAN_ID_LEN);
        failed |= ngx_http_agent_json_key(ctx->g, "attributes");
        failed |= yajl_gen_array_open(ctx->g);
        failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.decision",
                                                   ev, "decision");
        failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.approver",
                                                   ev, "approver");
        failed |= yajl_gen_array_close(ctx->g);
        failed |= yajl_gen_map_close(ctx->g);
    }

    if (nlinks) {
        failed |= yajl_gen_array_close(ctx->g);
    }

    return failed;
}


static ngx_uint_t
ngx_http_agent_spans_tool_event(ngx_http_agent_spans_ctx_t *ctx,
    yajl_val ev, ngx_str_t *type)
{
    u_char      name[64];
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(ctx->g);
    failed |= ngx_http_agent_json_key(ctx->g, "timeUnixNano");
    failed |= ngx_http_agent_spans_time(ctx->g, ngx_http_agent_spans_ts(ev));
    failed |= ngx_http_agent_json_key(ctx->g, "name");
    failed |= yajl_gen_string(ctx->g, name,
                              ngx_sprintf(name, "agent.%V", type) - name);

    failed |= ngx_http_agent_json_key(ctx->g, "attributes");
    failed |= yajl_gen_array_open(ctx->g);
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.pending.kind",
                                               ev, "kind");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.deadline", ev,
                                               "deadline");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.decision", ev,
                                               "decision");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.reason", ev,
                                               "reason");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.source", ev,
                                               "source");
    failed |= ngx_http_agent_spans_attr_member(ctx->g, "agent.approver", ev,
                                               "approver");
    failed |= yajl_gen_array_close(ctx->g);

    failed |= yajl_gen_map_close(ctx->g);

    return failed;
}


/* a span's ids, name, kind and times, and its attributes' array opened */

static ngx_uint_t
ngx_http_agent_spans_open(ngx_http_agent_spans_ctx_t *ctx,
    ngx_http_agent_span_t *s)
{
    u_char      name[128];
    size_t      len;
    ngx_uint_t  failed;
    yajl_gen    g;

    g = ctx->g;
    ctx->nspans++;

    failed = yajl_gen_map_open(g);

    failed |= ngx_http_agent_json_key(g, "traceId");
    failed |= ngx_http_agent_spans_id(g, ctx->tc.trace_id,
                                      NGX_HTTP_AGENT_TRACE_ID_LEN);
    failed |= ngx_http_agent_json_key(g, "spanId");
    failed |= ngx_http_agent_spans_id(g, s->id, NGX_HTTP_AGENT_SPAN_ID_LEN);

    if (s->parent) {
        failed |= ngx_http_agent_json_key(g, "parentSpanId");
        failed |= ngx_http_agent_spans_id(g, s->parent,
                                          NGX_HTTP_AGENT_SPAN_ID_LEN);
    }

    if (ctx->tc.state.len) {
        failed |= ngx_http_agent_json_key(g, "traceState");
        failed |= ngx_http_agent_json_str(g, &ctx->tc.state);
    }

    len = ngx_min(s->what.len, sizeof(name) - s->op.len - 1);

    failed |= ngx_http_agent_json_key(g, "name");
    failed |= yajl_gen_string(g, name,
                              ngx_sprintf(name, "%V %*s", &s->op, len,
                                          s->what.data)
                              - name);

    failed |= ngx_http_agent_json_key(g, "kind");
    failed |= yajl_gen_integer(g, s->kind);
    failed |= ngx_http_agent_json_key(g, "startTimeUnixNano");
    failed |= ngx_http_agent_spans_time(g, s->start);
    failed |= ngx_http_agent_json_key(g, "endTimeUnixNano");
    failed |= ngx_http_agent_spans_time(g, ngx_max(s->end, s->start));

    failed |= ngx_http_agent_json_key(g, "attributes");
    failed |= yajl_gen_array_open(g);
    failed |= ngx_http_agent_spans_attr(g, "gen_ai.operation.name", &s->op);

    if (ctx->provider.len) {
        failed |= ngx_http_agent_spans_attr(g, "gen_ai.provider.name",
                                            &ctx->provider);
    }

    if (s->kind == NGX_HTTP_AGENT_SPAN_CLIENT && ctx->agent) {
        failed |= ngx_http_agent_spans_attr(g, "gen_ai.request.model",
                                            &ctx->agent->model);
    }

    return failed;
}


/* the attributes end, with error.type if the span failed */

static ngx_uint_t
ngx_http_agent_spans_attrs_end(yajl_gen g, ngx_str_t *error)
{
    ngx_uint_t  failed;

    failed = 0;

    if (error) {
        failed |= ngx_http_agent_spans_attr(g, "error.type", error);
    }

    return failed | yajl_gen_array_close(g);
}


/* error: the error type (the span's status is then an error), or NULL */

static ngx_uint_t
ngx_http_agent_spans_close(yajl_gen g, ngx_str_t *error, ngx_str_t *message)
{
    ngx_uint_t  failed;

    failed = 0;

    if (error) {
        failed |= ngx_http_agent_json_key(g, "status");
        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "code");
        failed |= yajl_gen_integer(g, NGX_HTTP_AGENT_STATUS_ERROR);

        if (message && message->len) {
            failed |= ngx_http_agent_json_key(g, "message");
            failed |= ngx_http_agent_json_str(g, message);
        }

        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_map_close(g);

    return failed;
}


/* {"key": key, "value": {: the value's member follows */

static ngx_uint_t
ngx_http_agent_spans_key(yajl_gen g, char *key)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "key");
    failed |= yajl_gen_string(g, (u_char *) key, ngx_strlen(key));
    failed |= ngx_http_agent_json_key(g, "value");
    failed |= yajl_gen_map_open(g);

    return failed;
}


static ngx_uint_t
ngx_http_agent_spans_attr(yajl_gen g, char *key, ngx_str_t *value)
{
    ngx_uint_t  failed;

    failed = ngx_http_agent_spans_key(g, key);
    failed |= ngx_http_agent_json_key(g, "stringValue");
    failed |= ngx_http_agent_json_str(g, value);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    return failed;
}


static ngx_uint_t
ngx_http_agent_spans_attr_int(yajl_gen g, char *key, int64_t value)
{
    u_char      buf[NGX_INT64_LEN];
    ngx_uint_t  failed;

    failed = ngx_http_agent_spans_key(g, key);

    /* OTLP/JSON writes 64-bit integers as strings */
    failed |= ngx_http_agent_json_key(g, "intValue");
    failed |= yajl_gen_string(g, buf, ngx_sprintf(buf, "%L", value) - buf);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    return failed;
}


/* an event's member as an attribute, if it has it: a string or a number */

static ngx_uint_t
ngx_http_agent_spans_attr_member(yajl_gen g, char *key, yajl_val ev,
    char *member)
{
    ngx_str_t  s;
    yajl_val   v;

    v = ngx_http_agent_provider_get(ev, member);

    if (YAJL_IS_INTEGER(v)) {
        return ngx_http_agent_spans_attr_int(g, key, YAJL_GET_INTEGER(v));
    }

    if (ngx_http_agent_provider_string(v, &s) == NGX_OK) {
        return ngx_http_agent_spans_attr(g, key, &s);
    }

    return 0;
}


/* a value as an attribute: an array of strings, or any JSON as its text */

static ngx_uint_t
ngx_http_agent_spans_attr_json(ngx_http_agent_spans_ctx_t *ctx, char *key,
    yajl_val v)
{
    yajl_gen    g;
    ngx_str_t   s;
    ngx_uint_t  failed;

    if (v == NULL) {
        return 0;
    }

    g = ctx->g;

    failed = ngx_http_agent_spans_key(g, key);

    if (YAJL_IS_STRING(v)) {
        s.data = (u_char *) v->u.string;
        s.len = ngx_strlen(v->u.string);

        /* finish reasons: an array of one */

        if (ngx_strcmp(key, "gen_ai.response.finish_reasons") == 0) {
            failed |= ngx_http_agent_json_key(g, "arrayValue");
            failed |= yajl_gen_map_open(g);
            failed |= ngx_http_agent_json_key(g, "values");
            failed |= yajl_gen_array_open(g);
            failed |= yajl_gen_map_open(g);
            failed |= ngx_http_agent_json_key(g, "stringValue");
            failed |= ngx_http_agent_json_str(g, &s);
            failed |= yajl_gen_map_close(g);
            failed |= yajl_gen_array_close(g);
            failed |= yajl_gen_map_close(g);

        } else {
            failed |= ngx_http_agent_json_key(g, "stringValue");
            failed |= ngx_http_agent_json_str(g, &s);
        }

    } else {
        /* the value's JSON, as a string: a sub-generator's text */
        if (ngx_http_agent_provider_text(ctx->sub, v, &s) != NGX_OK) {
            return 1;
        }

        failed |= ngx_http_agent_json_key(g, "stringValue");
        failed |= ngx_http_agent_json_str(g, &s);
    }

    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    return failed;
}


static ngx_uint_t
ngx_http_agent_spans_time(yajl_gen g, int64_t ms)
{
    u_char  buf[NGX_INT64_LEN + 8];

    if (ms < 0) {
        ms = 0;
    }

    return yajl_gen_string(g, buf,
                           ngx_sprintf(buf, "%L000000", ms) - buf);
}


static ngx_uint_t
ngx_http_agent_spans_id(yajl_gen g, u_char *id, size_t n)
{
    u_char  buf[2 * NGX_HTTP_AGENT_TRACE_ID_LEN];

    return yajl_gen_string(g, buf, ngx_hex_dump(buf, id, n) - buf);
}


static ngx_str_t
ngx_http_agent_spans_str(yajl_val ev, char *member)
{
    ngx_str_t  s;

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(ev,
                                                                   member),
                                       &s)
        != NGX_OK)
    {
        ngx_str_null(&s);
    }

    return s;
}


static int64_t
ngx_http_agent_spans_ts(yajl_val ev)
{
    yajl_val  v;

    v = ngx_http_agent_provider_get(ev, "ts");

    return YAJL_IS_INTEGER(v) ? YAJL_GET_INTEGER(v) : 0;
}


static ngx_uint_t
ngx_http_agent_spans_is(yajl_val ev, char *type)
{
    ngx_str_t  s;

    s = ngx_http_agent_spans_str(ev, "type");

    return s.len == ngx_strlen(type)
           && ngx_strncmp(s.data, type, s.len) == 0;
}
