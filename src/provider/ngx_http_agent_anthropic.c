/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_sse.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_anthropic.h"
#include "ngx_http_agent_anthropic_ctx.h"


/*
 * Anthropic Messages.  The system prompt is a field of the request, and
 * the messages alternate between the user and the assistant, each a
 * list of content blocks: tool results are tool_result blocks of a user
 * message.  The API requires max_tokens, and no directive sets it yet.
 * The key, the version and the beta options are headers, set with
 * proxy_set_header in the provider's location (x-api-key,
 * anthropic-version, anthropic-beta).
 *
 * The reply streams as named SSE events: message_start; for each content
 * block content_block_start, its deltas and content_block_stop; then
 * message_delta (stop reason, usage) and message_stop.  ping may come
 * anywhere, and error ends the stream.  A stream is complete only with
 * message_stop.
 *
 * Blocks the canonical fields cannot rebuild (thinking with its
 * signature, hosted tool blocks, text with citations, a block with a
 * field the module does not know, such as a tool_use's caller) must go
 * back to the API as they came: the reply's blocks are then kept, as the
 * API returns them unstreamed, as the message's provider_content.  A
 * block is its content_block_start, every field as it came, with the
 * fields its deltas build (text, thinking, signature, input, citations)
 * filled in.
 */


static ngx_int_t ngx_http_agent_anthropic_render_tools(yajl_gen g,
    ngx_http_agent_t *agent);

static ngx_uint_t ngx_http_agent_anthropic_cached(yajl_gen g, ngx_str_t *def);

static ngx_int_t ngx_http_agent_anthropic_init(ngx_http_agent_reply_t *reply);
static ngx_int_t ngx_http_agent_anthropic_feed(ngx_http_agent_reply_t *reply,
    u_char *p, u_char *last);
static ngx_int_t ngx_http_agent_anthropic_finish(
    ngx_http_agent_reply_t *reply);
static ngx_int_t ngx_http_agent_anthropic_event(void *data,
    ngx_str_t *event, ngx_str_t *json);
static ngx_int_t ngx_http_agent_anthropic_message_start(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);
static ngx_int_t ngx_http_agent_anthropic_block_start(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);
static ngx_int_t ngx_http_agent_anthropic_tool_start(
    ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_anthropic_block_t *block, yajl_val cb);
static ngx_int_t ngx_http_agent_anthropic_block_delta(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);
static ngx_int_t ngx_http_agent_anthropic_message_delta(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);
static ngx_int_t ngx_http_agent_anthropic_message_stop(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);
static ngx_int_t ngx_http_agent_anthropic_tools(
    ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_anthropic_block_t *block);
static ngx_int_t ngx_http_agent_anthropic_error(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);
static ngx_int_t ngx_http_agent_anthropic_piece(
    ngx_http_agent_anthropic_ctx_t *ctx, ngx_http_agent_bytes_t *block,
    ngx_http_agent_bytes_t *all, ngx_uint_t kind, ngx_uint_t index,
    yajl_val v);
static void ngx_http_agent_anthropic_usage(ngx_http_agent_reply_t *reply,
    yajl_val usage);


static ngx_str_t  ngx_http_agent_anthropic_schema = ngx_string("input_schema");


static ngx_http_agent_anthropic_event_t  ngx_http_agent_anthropic_events[] = {
    { ngx_string("message_start"), ngx_http_agent_anthropic_message_start },
    { ngx_string("content_block_start"),
      ngx_http_agent_anthropic_block_start },
    { ngx_string("content_block_delta"),
      ngx_http_agent_anthropic_block_delta },
    { ngx_string("message_delta"), ngx_http_agent_anthropic_message_delta },
    { ngx_string("message_stop"), ngx_http_agent_anthropic_message_stop },
    { ngx_string("error"), ngx_http_agent_anthropic_error },

    /* content_block_stop, ping, and events the API may add, change nothing */
    { ngx_null_string, NULL }
};


/* the error types of the API, by the HTTP status each stands for */
static ngx_http_agent_provider_error_t  ngx_http_agent_anthropic_errors[] = {
    { ngx_string("invalid_request_error"), NGX_HTTP_AGENT_ERROR_FINAL },
    { ngx_string("authentication_error"), NGX_HTTP_AGENT_ERROR_FINAL },
    { ngx_string("billing_error"), NGX_HTTP_AGENT_ERROR_FINAL },
    { ngx_string("permission_error"), NGX_HTTP_AGENT_ERROR_FINAL },
    { ngx_string("not_found_error"), NGX_HTTP_AGENT_ERROR_FINAL },
    { ngx_string("request_too_large"), NGX_HTTP_AGENT_ERROR_FINAL },
    { ngx_string("rate_limit_error"), NGX_HTTP_AGENT_ERROR_RETRY },
    { ngx_string("api_error"), NGX_HTTP_AGENT_ERROR_RETRY },
    { ngx_string("timeout_error"), NGX_HTTP_AGENT_ERROR_RETRY },
    { ngx_string("overloaded_error"), NGX_HTTP_AGENT_ERROR_RETRY },
    { ngx_null_string, 0 }
};


ngx_http_agent_provider_t  ngx_http_agent_anthropic_messages = {
    ngx_string("anthropic_messages"),
    1,
    ngx_http_agent_anthropic_render_tools,
    ngx_http_agent_anthropic_build_request,
    ngx_http_agent_anthropic_init,
    ngx_http_agent_anthropic_feed,
    ngx_http_agent_anthropic_finish,
    ngx_http_agent_anthropic_errors
};


/*
 * [{"name","description","input_schema"}, <hosted tool definition>]:
 * a hosted tool (web_search_20250305, ...) is its definition as declared
 */

static ngx_int_t
ngx_http_agent_anthropic_render_tools(yajl_gen g, ngx_http_agent_t *agent)
{
    ngx_str_t                  *def;
    ngx_uint_t                  i, failed, cache;
    ngx_http_agent_tool_t      *tool;
    ngx_http_agent_tool_ref_t  *ref;

    failed = yajl_gen_array_open(g);

    ref = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        tool = ref[i].tool;

        /* a cache breakpoint on the last tool caches the whole list */
        cache = (i == agent->tools.nelts - 1
                 && (agent->cache & NGX_HTTP_AGENT_CACHE_TOOLS));

        if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {
            def = ngx_http_agent_provider_definition(tool,
                                            &ngx_http_agent_anthropic_messages);
            if (def == NULL) {
                return NGX_ERROR;
            }

            if (cache) {
                failed |= ngx_http_agent_anthropic_cached(g, def);

            } else {
                failed |= ngx_http_agent_json_verbatim(g, def);
            }

            continue;
        }

        failed |= yajl_gen_map_open(g);

        failed |= ngx_http_agent_provider_function(g, tool,
                                            &ngx_http_agent_anthropic_schema);

        if (cache) {
            failed |= ngx_http_agent_anthropic_cache_control(g);
        }

        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);

    return failed ? NGX_ERROR : NGX_OK;
}


/* a hosted tool's definition, with a cache breakpoint */

static ngx_uint_t
ngx_http_agent_anthropic_cached(yajl_gen g, ngx_str_t *def)
{
    char        err[NGX_HTTP_AGENT_JSON_ERR];
    size_t      i;
    yajl_val    v;
    ngx_uint_t  failed;

    v = ngx_http_agent_json_parse(def->data, def->len,
                                  NGX_HTTP_AGENT_JSON_DEPTH, err,
                                  sizeof(err));
    if (!YAJL_IS_OBJECT(v)) {
        if (v) {
            ngx_http_agent_json_free(v);
        }

        return 1;
    }

    failed = yajl_gen_map_open(g);

    for (i = 0; i < v->u.object.len; i++) {
        failed |= yajl_gen_string(g, (u_char *) v->u.object.keys[i],
                                  ngx_strlen(v->u.object.keys[i]));
        failed |= ngx_http_agent_provider_value(g, v->u.object.values[i]);
    }

    failed |= ngx_http_agent_anthropic_cache_control(g);
    failed |= yajl_gen_map_close(g);

    ngx_http_agent_json_free(v);

    return failed;
}


static ngx_int_t
ngx_http_agent_anthropic_init(ngx_http_agent_reply_t *reply)
{
    ngx_http_agent_anthropic_ctx_t  *ctx;

    ctx = ngx_pcalloc(reply->pool, sizeof(ngx_http_agent_anthropic_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->sse = ngx_http_agent_sse_create(reply->pool, reply->log,
                                         ngx_http_agent_anthropic_event, ctx);
    if (ctx->sse == NULL) {
        return NGX_ERROR;
    }

    ctx->sub = ngx_http_agent_json_gen(reply->pool);
    if (ctx->sub == NULL) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&ctx->blocks, reply->pool, 4,
                       sizeof(ngx_http_agent_anthropic_block_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (reply->calls.size == 0
        && ngx_array_init(&reply->calls, reply->pool, 2,
                          sizeof(ngx_http_agent_reply_call_t))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_array_init(&reply->hosted, reply->pool, 1,
                       sizeof(ngx_http_agent_reply_hosted_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->reply = reply;
    ctx->state = sw_stream;

    reply->state = ctx;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_anthropic_feed(ngx_http_agent_reply_t *reply, u_char *p,
    u_char *last)
{
    ngx_http_agent_anthropic_ctx_t  *ctx;

    ctx = reply->state;

    return ngx_http_agent_sse_feed(ctx->sse, p, last);
}


static ngx_int_t
ngx_http_agent_anthropic_finish(ngx_http_agent_reply_t *reply)
{
    ngx_uint_t                         i;
    ngx_http_agent_anthropic_ctx_t    *ctx;
    ngx_http_agent_anthropic_block_t  *block;

    ctx = reply->state;

    if (ctx->state == sw_done) {
        return NGX_OK;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, reply->log, 0,
                   "anthropic_messages stream ended before message_stop");

    /* the calls a stream cut short began: the turn keeps them, unrun */

    block = ctx->blocks.elts;

    for (i = 0; i < ctx->blocks.nelts; i++) {
        if (block[i].kind == NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE
            && ngx_http_agent_anthropic_tools(ctx, &block[i]) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* one SSE event, named by the "type" of its data as by its event line */

static ngx_int_t
ngx_http_agent_anthropic_event(void *data, ngx_str_t *event,
    ngx_str_t *json)
{
    yajl_val                           v;
    ngx_int_t                          rc;
    ngx_str_t                          type;
    ngx_http_agent_anthropic_ctx_t    *ctx;
    ngx_http_agent_anthropic_event_t  *e;

    ctx = data;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, ctx->reply->log, 0,
                   "anthropic_messages event \"%V\": %uz bytes, state %ui",
                   event, json->len, ctx->state);

    /* nothing after the end or an error counts */
    if (ctx->state != sw_stream || json->len == 0) {
        return NGX_OK;
    }

    v = ngx_http_agent_provider_parse(ctx->reply->log, json->data, json->len,
                                      "anthropic_messages stream event");
    if (v == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(v, "type"),
                                       &type)
        != NGX_OK)
    {
        type = *event;
    }

    rc = NGX_OK;

    for (e = ngx_http_agent_anthropic_events; e->handler; e++) {
        if (e->type.len == type.len
            && ngx_strncmp(e->type.data, type.data, type.len) == 0)
        {
            rc = e->handler(ctx, v);
            break;
        }
    }

    ngx_http_agent_json_free(v);

    return rc;
}


/* {"message":{"id","usage":{"input_tokens","output_tokens"},...}} */

static ngx_int_t
ngx_http_agent_anthropic_message_start(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_val v)
{
    yajl_val                 msg;
    ngx_str_t                id;
    ngx_http_agent_reply_t  *reply;

    reply = ctx->reply;

    msg = ngx_http_agent_provider_get(v, "message");

    ngx_http_agent_anthropic_usage(reply,
                                   ngx_http_agent_provider_get(msg, "usage"));

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(msg,
                                                                   "model"),
                                       &id)
        == NGX_OK
        && ngx_http_agent_bytes_set(reply->pool, &reply->response_model,
                                    id.data, id.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(msg, "id"),
                                       &id)
        != NGX_OK)
    {
        return NGX_OK;
    }

    return ngx_http_agent_bytes_set(reply->pool, &reply->response_id,
                                    id.data, id.len);
}


/*
 * {"index":N,"content_block":{"type",...}}: the blocks come in index
 * order, one at a time
 */

static ngx_int_t
ngx_http_agent_anthropic_block_start(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_val v)
{
    size_t                             i;
    yajl_val                           cb, index, type, cites;
    ngx_str_t                          id;
    ngx_http_agent_reply_t            *reply;
    ngx_http_agent_anthropic_block_t  *block;

    reply = ctx->reply;

    index = ngx_http_agent_provider_get(v, "index");
    cb = ngx_http_agent_provider_get(v, "content_block");
    type = ngx_http_agent_provider_get(cb, "type");

    if (!YAJL_IS_INTEGER(index)
        || YAJL_GET_INTEGER(index) != (long long) ctx->blocks.nelts
        || !YAJL_IS_STRING(type))
    {
        ngx_log_error(NGX_LOG_ERR, reply->log, 0,
                      "anthropic_messages content_block_start out of "
                      "order, or without a type");
        return NGX_ERROR;
    }

    block = ngx_array_push(&ctx->blocks);
    if (block == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(block, sizeof(ngx_http_agent_anthropic_block_t));

    /* NUL-terminated, to be parsed again when the reply is kept */

    if (ngx_http_agent_anthropic_json(ctx, &block->start, cb) != NGX_OK
        || ngx_http_agent_bytes_append(reply->pool, &block->start,
                                       (u_char *) "", 1)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    block->start.len--;

    if (ngx_http_agent_provider_is(type, "text")) {
        block->kind = NGX_HTTP_AGENT_ANTHROPIC_TEXT;
        block->own = ngx_http_agent_anthropic_own(block, cb);

        cites = ngx_http_agent_provider_get(cb, "citations");

        for (i = 0; YAJL_IS_ARRAY(cites) && i < cites->u.array.len; i++) {
            if (ngx_http_agent_anthropic_cite(ctx, block,
                                              cites->u.array.values[i])
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }

        return ngx_http_agent_anthropic_piece(ctx, &block->text, &reply->text,
                                             NGX_HTTP_AGENT_DELTA_TEXT, 0,
                                     ngx_http_agent_provider_get(cb, "text"));
    }

    if (ngx_http_agent_provider_is(type, "thinking")) {
        block->kind = NGX_HTTP_AGENT_ANTHROPIC_THINKING;

        if (ngx_http_agent_anthropic_piece(ctx, &block->extra, NULL,
                             NGX_HTTP_AGENT_ANTHROPIC_QUIET, 0,
                             ngx_http_agent_provider_get(cb, "signature"))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_agent_anthropic_piece(ctx, &block->text,
                                              &reply->thinking,
                                              NGX_HTTP_AGENT_DELTA_THINKING, 0,
                                 ngx_http_agent_provider_get(cb, "thinking"));
    }

    /* anything else is content that a retry would lose */
    reply->started = 1;

    if (ngx_http_agent_provider_is(type, "tool_use")) {
        block->kind = NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE;
        block->n = ctx->ncalls++;
        block->own = ngx_http_agent_anthropic_own(block, cb);

        return ngx_http_agent_anthropic_tool_start(ctx, block, cb);
    }

    if (ngx_http_agent_provider_is(type, "server_tool_use")) {
        block->kind = NGX_HTTP_AGENT_ANTHROPIC_SERVER_TOOL_USE;

        return ngx_http_agent_anthropic_tool_start(ctx, block, cb);
    }

    /*
     * web_search_tool_result, redacted_thinking, and blocks to come, kept
     * as they start; one with the tool_use_id of a server_tool_use is
     * that tool's result
     */

    block->kind = NGX_HTTP_AGENT_ANTHROPIC_VERBATIM;

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(cb, "tool_use_id"), &id)
        != NGX_OK)
    {
        return NGX_OK;
    }

    if (ngx_http_agent_bytes_set(reply->pool, &block->id, id.data, id.len)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_agent_anthropic_json(ctx, &block->text,
                                    ngx_http_agent_provider_get(cb, "content"));
}


/* {"type":"tool_use","id","name","input":{}}: the input comes in deltas */

static ngx_int_t
ngx_http_agent_anthropic_tool_start(ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_anthropic_block_t *block, yajl_val cb)
{
    yajl_val   input;
    ngx_str_t  id, name;

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(cb, "id"),
                                       &id)
        != NGX_OK)
    {
        ngx_str_set(&id, "");
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(cb, "name"), &name)
        != NGX_OK)
    {
        ngx_str_set(&name, "");
    }

    if (ngx_http_agent_bytes_set(ctx->reply->pool, &block->id, id.data,
                                 id.len)
        != NGX_OK
        || ngx_http_agent_bytes_set(ctx->reply->pool, &block->name,
                                    name.data, name.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    input = ngx_http_agent_provider_get(cb, "input");

    /* an input given whole, not in deltas */
    if (YAJL_IS_OBJECT(input) && input->u.object.len) {
        return ngx_http_agent_anthropic_json(ctx, &block->text, input);
    }

    return NGX_OK;
}


/* {"index":N,"delta":{"type":"text_delta","text":"..."}}, and others */

static ngx_int_t
ngx_http_agent_anthropic_block_delta(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_val v)
{
    yajl_val                           delta, type, index;
    ngx_uint_t                         kind;
    ngx_http_agent_reply_t            *reply;
    ngx_http_agent_anthropic_block_t  *block;

    reply = ctx->reply;

    index = ngx_http_agent_provider_get(v, "index");

    if (!YAJL_IS_INTEGER(index) || YAJL_GET_INTEGER(index) < 0
        || YAJL_GET_INTEGER(index) >= (long long) ctx->blocks.nelts)
    {
        ngx_log_error(NGX_LOG_ERR, reply->log, 0,
                      "anthropic_messages delta of a block never started");
        return NGX_ERROR;
    }

    block = ctx->blocks.elts;
    block = &block[YAJL_GET_INTEGER(index)];

    delta = ngx_http_agent_provider_get(v, "delta");
    type = ngx_http_agent_provider_get(delta, "type");

    /*
     * A delta goes only into a block of its kind: text into a hosted
     * tool's result, or a signature into a verbatim block, would corrupt
     * what goes back to the API.  Others are ignored, as unknown ones are.
     */

    if (ngx_http_agent_provider_is(type, "text_delta")) {
        if (block->kind != NGX_HTTP_AGENT_ANTHROPIC_TEXT) {
            return NGX_OK;
        }

        return ngx_http_agent_anthropic_piece(ctx, &block->text, &reply->text,
                                             NGX_HTTP_AGENT_DELTA_TEXT, 0,
                                  ngx_http_agent_provider_get(delta, "text"));
    }

    if (ngx_http_agent_provider_is(type, "thinking_delta")) {
        if (block->kind != NGX_HTTP_AGENT_ANTHROPIC_THINKING) {
            return NGX_OK;
        }

        return ngx_http_agent_anthropic_piece(ctx, &block->text,
                                              &reply->thinking,
                                              NGX_HTTP_AGENT_DELTA_THINKING, 0,
                              ngx_http_agent_provider_get(delta, "thinking"));
    }

    if (ngx_http_agent_provider_is(type, "signature_delta")) {
        if (block->kind != NGX_HTTP_AGENT_ANTHROPIC_THINKING) {
            return NGX_OK;
        }

        return ngx_http_agent_anthropic_piece(ctx, &block->extra, NULL,
                             NGX_HTTP_AGENT_ANTHROPIC_QUIET, 0,
                             ngx_http_agent_provider_get(delta, "signature"));
    }

    if (ngx_http_agent_provider_is(type, "citations_delta")) {
        if (block->kind != NGX_HTTP_AGENT_ANTHROPIC_TEXT) {
            return NGX_OK;
        }

        return ngx_http_agent_anthropic_cite(ctx, block,
                                ngx_http_agent_provider_get(delta, "citation"));
    }

    if (!ngx_http_agent_provider_is(type, "input_json_delta")
        || (block->kind != NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE
            && block->kind != NGX_HTTP_AGENT_ANTHROPIC_SERVER_TOOL_USE))
    {
        return NGX_OK;
    }

    /* the provider runs a hosted tool: no one waits for its input live */
    kind = (block->kind == NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE)
           ? NGX_HTTP_AGENT_DELTA_TOOL_ARGS : NGX_HTTP_AGENT_ANTHROPIC_QUIET;

    return ngx_http_agent_anthropic_piece(ctx, &block->text, NULL, kind,
                                          block->n,
                          ngx_http_agent_provider_get(delta, "partial_json"));
}


/*
 * {"delta":{"stop_reason","stop_sequence"},"usage":{"output_tokens"}}:
 * pause_turn is a turn of hosted tools the API paused, to be continued
 */

static ngx_int_t
ngx_http_agent_anthropic_message_delta(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_val v)
{
    ngx_str_t                reason;
    ngx_http_agent_reply_t  *reply;

    reply = ctx->reply;

    ngx_http_agent_anthropic_usage(reply,
                                   ngx_http_agent_provider_get(v, "usage"));

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(
                ngx_http_agent_provider_get(v, "delta"), "stop_reason"),
            &reason)
        != NGX_OK)
    {
        return NGX_OK;
    }

    reply->paused = (reason.len == sizeof("pause_turn") - 1
                     && ngx_strncmp(reason.data, "pause_turn", reason.len)
                        == 0);

    return ngx_http_agent_bytes_set(reply->pool, &reply->finish_reason,
                                    reason.data, reason.len);
}


/*
 * The end of a complete stream: the calls and the hosted tools are the
 * reply's, and the blocks are kept if the canonical fields cannot
 * rebuild them.
 */

static ngx_int_t
ngx_http_agent_anthropic_message_stop(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_val v)
{
    ngx_uint_t                         i, keep;
    ngx_http_agent_reply_t            *reply;
    ngx_http_agent_anthropic_block_t  *block;

    reply = ctx->reply;
    block = ctx->blocks.elts;

    keep = 0;

    for (i = 0; i < ctx->blocks.nelts; i++) {

        switch (block[i].kind) {

        case NGX_HTTP_AGENT_ANTHROPIC_TEXT:
            keep |= (block[i].extra.len != 0 || block[i].own);
            break;

        case NGX_HTTP_AGENT_ANTHROPIC_THINKING:

            /* the log has one signature: the last block's */
            if (block[i].extra.len) {
                reply->signature = block[i].extra;
            }

            keep = 1;
            break;

        case NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE:
            if (ngx_http_agent_anthropic_tools(ctx, &block[i]) != NGX_OK) {
                return NGX_ERROR;
            }

            keep |= block[i].own;
            break;

        default: /* NGX_HTTP_AGENT_ANTHROPIC_SERVER_TOOL_USE, _VERBATIM */
            if (ngx_http_agent_anthropic_tools(ctx, &block[i]) != NGX_OK) {
                return NGX_ERROR;
            }

            keep = 1;
            break;
        }
    }

    if (keep && ngx_http_agent_anthropic_raw(ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->state = sw_done;
    reply->complete = 1;

    return NGX_OK;
}


/*
 * A tool_use block is a call of the reply, a server_tool_use a hosted
 * tool, and the block with its tool_use_id the hosted tool's result.
 */

static ngx_int_t
ngx_http_agent_anthropic_tools(ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_anthropic_block_t *block)
{
    ngx_uint_t                      i;
    ngx_http_agent_reply_t         *reply;
    ngx_http_agent_reply_call_t    *call;
    ngx_http_agent_reply_hosted_t  *hosted;

    reply = ctx->reply;

    if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_VERBATIM) {
        hosted = reply->hosted.elts;

        for (i = 0; block->id.len && i < reply->hosted.nelts; i++) {
            if (hosted[i].id.len == block->id.len
                && ngx_strncmp(hosted[i].id.data, block->id.data,
                               block->id.len)
                   == 0)
            {
                hosted[i].result = block->text;
                break;
            }
        }

        return NGX_OK;
    }

    /* an input that came in no delta is empty */
    if (block->text.len == 0
        && ngx_http_agent_bytes_set(reply->pool, &block->text,
                                    (u_char *) "{}", 2)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE) {
        call = ngx_array_push(&reply->calls);
        if (call == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(call, sizeof(ngx_http_agent_reply_call_t));

        call->index = block->n;
        call->id = block->id;
        call->name = block->name;
        call->arguments = block->text;

        return NGX_OK;
    }

    hosted = ngx_array_push(&reply->hosted);
    if (hosted == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(hosted, sizeof(ngx_http_agent_reply_hosted_t));

    hosted->id = block->id;
    hosted->name = block->name;
    hosted->input = block->text;

    return NGX_OK;
}


/* {"type":"error","error":{"type":"overloaded_error","message"}} */

static ngx_int_t
ngx_http_agent_anthropic_error(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_val v)
{
    yajl_val  err;

    ctx->state = sw_error;

    err = ngx_http_agent_provider_get(v, "error");

    return ngx_http_agent_provider_error(ctx->reply,
                                         ngx_http_agent_anthropic_errors, err,
                                         ngx_http_agent_provider_get(err,
                                                                     "type"));
}


/*
 * A piece of a block: kept in the block, added to the reply's own field
 * (all) if there is one, and passed on live unless it is quiet.
 */

static ngx_int_t
ngx_http_agent_anthropic_piece(ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_bytes_t *block, ngx_http_agent_bytes_t *all,
    ngx_uint_t kind, ngx_uint_t index, yajl_val v)
{
    ngx_str_t                s;
    ngx_http_agent_reply_t  *reply;

    reply = ctx->reply;

    if (ngx_http_agent_provider_string(v, &s) != NGX_OK || s.len == 0) {
        return NGX_OK;
    }

    if (ngx_http_agent_bytes_append(reply->pool, block, s.data, s.len)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (all
        && ngx_http_agent_bytes_append(reply->pool, all, s.data, s.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (kind == NGX_HTTP_AGENT_ANTHROPIC_QUIET) {
        return NGX_OK;
    }

    reply->started = 1;

    if (reply->delta) {
        reply->delta(reply, kind, index, &s);
    }

    return NGX_OK;
}


/* the counts are totals so far; message_delta may repeat input_tokens */

static void
ngx_http_agent_anthropic_usage(ngx_http_agent_reply_t *reply, yajl_val usage)
{
    ngx_http_agent_provider_tokens(reply, usage, "input_tokens",
                                   &reply->input_tokens);
    ngx_http_agent_provider_tokens(reply, usage, "output_tokens",
                                   &reply->output_tokens);
    ngx_http_agent_provider_tokens(reply, usage, "cache_read_input_tokens",
                                   &reply->cached_tokens);
    ngx_http_agent_provider_tokens(reply, usage,
                                   "cache_creation_input_tokens",
                                   &reply->cache_creation_tokens);
}
