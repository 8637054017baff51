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
#include "ngx_http_agent_request.h"


/*
 * OpenAI Chat Completions, and every server that speaks it.  The API has
 * no hosted tools: a provider tool on this adapter is a configuration
 * error.
 *
 * The reply streams as SSE events without names, each "data: {chunk}",
 * and ends with "data: [DONE]".  A stream is complete only with [DONE]
 * and no error event before it: a finish_reason alone is not enough,
 * since every server of the API sends [DONE] and a stream cut between
 * the two has lost its usage.
 */


typedef enum {
    sw_stream = 0,
    sw_done,
    sw_error
} ngx_http_agent_openai_chat_state_e;


typedef struct {
    ngx_http_agent_reply_t     *reply;
    ngx_http_agent_sse_t       *sse;
    ngx_uint_t                  state;
} ngx_http_agent_openai_chat_ctx_t;


static ngx_int_t ngx_http_agent_openai_chat_render_tools(yajl_gen g,
    ngx_http_agent_t *agent);

static ngx_int_t ngx_http_agent_openai_chat_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body);
static ngx_uint_t ngx_http_agent_openai_chat_head(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_chat_structured(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_chat_user(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_chat_assistant(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_chat_function(
    ngx_http_agent_request_t *r, yajl_val call);
static ngx_uint_t ngx_http_agent_openai_chat_tool(
    ngx_http_agent_request_t *r);

static ngx_int_t ngx_http_agent_openai_chat_init(
    ngx_http_agent_reply_t *reply);
static ngx_int_t ngx_http_agent_openai_chat_feed(
    ngx_http_agent_reply_t *reply, u_char *p, u_char *last);
static ngx_int_t ngx_http_agent_openai_chat_finish(
    ngx_http_agent_reply_t *reply);
static ngx_int_t ngx_http_agent_openai_chat_event(void *data,
    ngx_str_t *event, ngx_str_t *json);
static ngx_int_t ngx_http_agent_openai_chat_chunk(
    ngx_http_agent_openai_chat_ctx_t *ctx, yajl_val chunk);
static ngx_int_t ngx_http_agent_openai_chat_choice(
    ngx_http_agent_reply_t *reply, yajl_val choice);
static ngx_int_t ngx_http_agent_openai_chat_tool_call(
    ngx_http_agent_reply_t *reply, yajl_val tc);
static ngx_http_agent_reply_call_t *ngx_http_agent_openai_chat_call(
    ngx_http_agent_reply_t *reply, yajl_val index, ngx_uint_t has_id);
static ngx_int_t ngx_http_agent_openai_chat_piece(
    ngx_http_agent_reply_t *reply, ngx_http_agent_bytes_t *b,
    ngx_uint_t kind, ngx_uint_t index, yajl_val v);
static ngx_int_t ngx_http_agent_openai_chat_error(
    ngx_http_agent_openai_chat_ctx_t *ctx, yajl_val err);


static ngx_str_t  ngx_http_agent_parameters_key = ngx_string("parameters");


/*
 * The API has no hosted tools and takes an assistant message with nothing
 * to say: every tool result and every assistant message is sent.
 */
static ngx_http_agent_request_format_t  ngx_http_agent_openai_chat_format = {
    ngx_string("openai_chat"),
    ngx_http_agent_openai_chat_head,
    NULL,
    ngx_http_agent_openai_chat_user,
    ngx_http_agent_openai_chat_assistant,
    ngx_http_agent_openai_chat_tool,
    ngx_http_agent_openai_chat_function,
    NULL,
    NULL,
    NULL,
    ngx_http_agent_openai_chat_structured,
    1,
    1
};


ngx_http_agent_provider_t  ngx_http_agent_openai_chat = {
    ngx_string("openai_chat"),
    0,
    ngx_http_agent_openai_chat_render_tools,
    ngx_http_agent_openai_chat_build_request,
    ngx_http_agent_openai_chat_init,
    ngx_http_agent_openai_chat_feed,
    ngx_http_agent_openai_chat_finish,
    ngx_http_agent_openai_errors
};


/* [{"type":"function","function":{"name","description","parameters"}}] */

static ngx_int_t
ngx_http_agent_openai_chat_render_tools(yajl_gen g, ngx_http_agent_t *agent)
{
    ngx_uint_t                  i, failed;
    ngx_http_agent_tool_t      *tool;
    ngx_http_agent_tool_ref_t  *ref;

    failed = yajl_gen_array_open(g);

    ref = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        tool = ref[i].tool;

        if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {
            return NGX_ERROR;
        }

        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "type");
        failed |= ngx_http_agent_json_key(g, "function");
        failed |= ngx_http_agent_json_key(g, "function");
        failed |= yajl_gen_map_open(g);

        failed |= ngx_http_agent_provider_function(g, tool,
                                               &ngx_http_agent_parameters_key);

        failed |= yajl_gen_map_close(g);
        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);

    return failed ? NGX_ERROR : NGX_OK;
}


static ngx_int_t
ngx_http_agent_openai_chat_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body)
{
    return ngx_http_agent_request_build(&ngx_http_agent_openai_chat_format,
                                        pool, agent, events, nevents, body);
}


/*
 * {"model","stream":true,"stream_options":{"include_usage":true},
 *  "messages":[...],"tools":[...]}: the system prompt is the first message
 */

static ngx_uint_t
ngx_http_agent_openai_chat_head(ngx_http_agent_request_t *r)
{
    yajl_gen           g;
    ngx_uint_t         failed;
    ngx_http_agent_t  *agent;

    g = r->g;
    agent = r->agent;

    failed = ngx_http_agent_json_key(g, "stream");
    failed |= yajl_gen_bool(g, 1);

    /* the usage arrives in a last chunk only when asked for */
    failed |= ngx_http_agent_json_key(g, "stream_options");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "include_usage");
    failed |= yajl_gen_bool(g, 1);
    failed |= yajl_gen_map_close(g);

    failed |= ngx_http_agent_json_key(g, "messages");
    failed |= yajl_gen_array_open(g);

    if (agent->system.len) {
        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "role");
        failed |= ngx_http_agent_json_key(g, "system");
        failed |= ngx_http_agent_json_key(g, "content");
        failed |= ngx_http_agent_json_str(g, &agent->system);
        failed |= yajl_gen_map_close(g);
    }

    return failed;
}


/*
 * "response_format":{"type":"json_schema","json_schema":{"name","schema",
 * "strict":true}}, unless the agent's options set one
 */

static ngx_uint_t
ngx_http_agent_openai_chat_structured(ngx_http_agent_request_t *r)
{
    yajl_gen    g;
    ngx_uint_t  failed;

    g = r->g;

    failed = ngx_http_agent_request_no_tools(r);

    if (ngx_http_agent_provider_option(r->agent, "response_format")) {
        return failed;
    }

    failed |= ngx_http_agent_json_key(g, "response_format");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "json_schema");
    failed |= ngx_http_agent_json_key(g, "json_schema");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_request_schema(r);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    return failed;
}


/* {"role":"user","content":...} */

static ngx_uint_t
ngx_http_agent_openai_chat_user(ngx_http_agent_request_t *r)
{
    yajl_val    content;
    ngx_uint_t  failed;

    content = ngx_http_agent_provider_get(r->ev.event, "content");

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "role");
    failed |= ngx_http_agent_json_key(r->g, "user");
    failed |= ngx_http_agent_json_key(r->g, "content");

    /* a string, or an array of content parts, passed on as it is */
    if (content == NULL || YAJL_IS_NULL(content)) {
        failed |= ngx_http_agent_json_key(r->g, "");

    } else {
        failed |= ngx_http_agent_provider_value(r->g, content);
    }

    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/* {"role":"assistant","content":"..." or null,"tool_calls":[...]} */

static ngx_uint_t
ngx_http_agent_openai_chat_assistant(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "role");
    failed |= ngx_http_agent_json_key(r->g, "assistant");
    failed |= ngx_http_agent_json_key(r->g, "content");

    if (r->ev.text.len == 0 && r->ev.calls) {
        failed |= yajl_gen_null(r->g);

    } else {
        failed |= ngx_http_agent_json_str(r->g, &r->ev.text);
    }

    if (r->ev.calls) {
        failed |= ngx_http_agent_json_key(r->g, "tool_calls");
        failed |= yajl_gen_array_open(r->g);
        failed |= ngx_http_agent_request_calls(r);
        failed |= yajl_gen_array_close(r->g);
    }

    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/* {"id","type":"function","function":{"name","arguments"}} */

static ngx_uint_t
ngx_http_agent_openai_chat_function(ngx_http_agent_request_t *r,
    yajl_val call)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "id");
    failed |= ngx_http_agent_provider_value(r->g,
                                     ngx_http_agent_provider_get(call, "id"));
    failed |= ngx_http_agent_json_key(r->g, "type");
    failed |= ngx_http_agent_json_key(r->g, "function");
    failed |= ngx_http_agent_json_key(r->g, "function");
    failed |= yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_request_function(r, call);
    failed |= yajl_gen_map_close(r->g);
    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/* {"role":"tool","tool_call_id","content":"{\"ok\":true,...}"} */

static ngx_uint_t
ngx_http_agent_openai_chat_tool(ngx_http_agent_request_t *r)
{
    yajl_val    id;
    ngx_uint_t  failed;

    id = ngx_http_agent_provider_get(r->ev.event, "tool_call_id");

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "role");
    failed |= ngx_http_agent_json_key(r->g, "tool");
    failed |= ngx_http_agent_json_key(r->g, "tool_call_id");
    failed |= ngx_http_agent_provider_value(r->g, id);
    failed |= ngx_http_agent_json_key(r->g, "content");
    failed |= ngx_http_agent_json_str(r->g, &r->ev.text);
    failed |= yajl_gen_map_close(r->g);

    return failed;
}


static ngx_int_t
ngx_http_agent_openai_chat_init(ngx_http_agent_reply_t *reply)
{
    ngx_http_agent_openai_chat_ctx_t  *ctx;

    ctx = ngx_pcalloc(reply->pool, sizeof(ngx_http_agent_openai_chat_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->sse = ngx_http_agent_sse_create(reply->pool, reply->log,
                                         ngx_http_agent_openai_chat_event,
                                         ctx);
    if (ctx->sse == NULL) {
        return NGX_ERROR;
    }

    if (reply->calls.size == 0
        && ngx_array_init(&reply->calls, reply->pool, 2,
                          sizeof(ngx_http_agent_reply_call_t))
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
ngx_http_agent_openai_chat_feed(ngx_http_agent_reply_t *reply, u_char *p,
    u_char *last)
{
    ngx_http_agent_openai_chat_ctx_t  *ctx;

    ctx = reply->state;

    return ngx_http_agent_sse_feed(ctx->sse, p, last);
}


static ngx_int_t
ngx_http_agent_openai_chat_finish(ngx_http_agent_reply_t *reply)
{
    ngx_http_agent_openai_chat_ctx_t  *ctx;

    ctx = reply->state;

    if (ctx->state == sw_stream) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, reply->log, 0,
                       "openai_chat stream ended before [DONE]");
    }

    return NGX_OK;
}


/* one SSE event: a chunk, an error, or [DONE] */

static ngx_int_t
ngx_http_agent_openai_chat_event(void *data, ngx_str_t *event,
    ngx_str_t *json)
{
    ngx_int_t                          rc;
    yajl_val                           chunk;
    ngx_http_agent_openai_chat_ctx_t  *ctx;

    ctx = data;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ctx->reply->log, 0,
                   "openai_chat event: %uz bytes, state %ui",
                   json->len, ctx->state);

    switch (ctx->state) {

    case sw_stream:

        if (json->len == sizeof("[DONE]") - 1
            && ngx_strncmp(json->data, "[DONE]", json->len) == 0)
        {
            ctx->state = sw_done;
            ctx->reply->complete = 1;
            return NGX_OK;
        }

        if (json->len == 0) {
            return NGX_OK;
        }

        chunk = ngx_http_agent_provider_parse(ctx->reply->log, json->data,
                                              json->len,
                                              "openai_chat stream event");
        if (chunk == NULL) {
            return NGX_ERROR;
        }

        rc = ngx_http_agent_openai_chat_chunk(ctx, chunk);

        ngx_http_agent_json_free(chunk);

        return rc;

    default: /* sw_done, sw_error */

        /* nothing after the end or an error counts */
        return NGX_OK;
    }
}


/*
 * {"id","choices":[{"index":0,"delta":{...},"finish_reason"}],"usage"}
 * or {"error":{"message","type","code"}}
 */

static ngx_int_t
ngx_http_agent_openai_chat_chunk(ngx_http_agent_openai_chat_ctx_t *ctx,
    yajl_val chunk)
{
    size_t                   i;
    yajl_val                 v, choices;
    ngx_str_t                id;
    ngx_http_agent_reply_t  *reply;

    reply = ctx->reply;

    v = ngx_http_agent_provider_get(chunk, "error");

    if (v != NULL && !YAJL_IS_NULL(v)) {
        return ngx_http_agent_openai_chat_error(ctx, v);
    }

    if (reply->response_model.len == 0
        && ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(chunk, "model"), &id)
           == NGX_OK
        && ngx_http_agent_bytes_set(reply->pool, &reply->response_model,
                                    id.data, id.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (reply->response_id.len == 0
        && ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(chunk, "id"), &id)
           == NGX_OK)
    {
        if (ngx_http_agent_bytes_set(reply->pool, &reply->response_id,
                                     id.data, id.len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    choices = ngx_http_agent_provider_get(chunk, "choices");

    if (YAJL_IS_ARRAY(choices)) {
        for (i = 0; i < choices->u.array.len; i++) {
            if (ngx_http_agent_openai_chat_choice(reply,
                                                  choices->u.array.values[i])
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    /* null in every chunk but the last, which has "choices":[] */
    v = ngx_http_agent_provider_get(chunk, "usage");

    ngx_http_agent_provider_usage(reply, v, "prompt_tokens",
                                  "completion_tokens",
                                  "prompt_tokens_details");

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_openai_chat_choice(ngx_http_agent_reply_t *reply,
    yajl_val choice)
{
    size_t     i;
    yajl_val   v, delta, calls;
    ngx_str_t  finish;

    /* the request never asks for n > 1: other choices are not the reply */
    v = ngx_http_agent_provider_get(choice, "index");

    if (YAJL_IS_INTEGER(v) && YAJL_GET_INTEGER(v) != 0) {
        return NGX_OK;
    }

    delta = ngx_http_agent_provider_get(choice, "delta");

    /* "reasoning_content" (DeepSeek, vLLM) or "reasoning" (OpenRouter) */
    v = ngx_http_agent_provider_get(delta, "reasoning_content");

    if (!YAJL_IS_STRING(v)) {
        v = ngx_http_agent_provider_get(delta, "reasoning");
    }

    if (ngx_http_agent_openai_chat_piece(reply, &reply->thinking,
                                         NGX_HTTP_AGENT_DELTA_THINKING, 0, v)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* a refusal is what the model says in place of content */
    if (ngx_http_agent_openai_chat_piece(reply, &reply->text,
                                         NGX_HTTP_AGENT_DELTA_TEXT, 0,
                            ngx_http_agent_provider_get(delta, "content"))
        != NGX_OK
        || ngx_http_agent_openai_chat_piece(reply, &reply->text,
                                            NGX_HTTP_AGENT_DELTA_TEXT, 0,
                            ngx_http_agent_provider_get(delta, "refusal"))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    calls = ngx_http_agent_provider_get(delta, "tool_calls");

    if (YAJL_IS_ARRAY(calls)) {
        for (i = 0; i < calls->u.array.len; i++) {
            if (ngx_http_agent_openai_chat_tool_call(reply,
                                                     calls->u.array.values[i])
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(choice, "finish_reason"), &finish)
        == NGX_OK)
    {
        return ngx_http_agent_bytes_set(reply->pool, &reply->finish_reason,
                                        finish.data, finish.len);
    }

    return NGX_OK;
}


/*
 * {"index":0,"id","type":"function","function":{"name","arguments":""}}
 * first, then {"index":0,"function":{"arguments":"..."}} pieces
 */

static ngx_int_t
ngx_http_agent_openai_chat_tool_call(ngx_http_agent_reply_t *reply,
    yajl_val tc)
{
    yajl_val                      fn;
    ngx_str_t                     id, name;
    ngx_http_agent_reply_call_t  *call;

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(tc, "id"), &id)
        != NGX_OK)
    {
        id.len = 0;
    }

    call = ngx_http_agent_openai_chat_call(reply,
                                      ngx_http_agent_provider_get(tc, "index"),
                                      id.len != 0);
    if (call == NULL) {
        return NGX_ERROR;
    }

    /* servers that repeat the id and name in every piece are not wrong */

    if (id.len && call->id.len == 0) {
        if (ngx_http_agent_bytes_set(reply->pool, &call->id, id.data, id.len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    fn = ngx_http_agent_provider_get(tc, "function");

    if (call->name.len == 0
        && ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(fn, "name"), &name)
           == NGX_OK)
    {
        if (ngx_http_agent_bytes_set(reply->pool, &call->name, name.data,
                                     name.len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return ngx_http_agent_openai_chat_piece(reply, &call->arguments,
                                      NGX_HTTP_AGENT_DELTA_TOOL_ARGS,
                                      call->index,
                                      ngx_http_agent_provider_get(fn,
                                                                "arguments"));
}


/*
 * The call a piece belongs to, by its "index"; a new index adds a call,
 * in index order.  Without an index (some servers), a piece with an id
 * starts the next call and one without continues the last.
 */

static ngx_http_agent_reply_call_t *
ngx_http_agent_openai_chat_call(ngx_http_agent_reply_t *reply,
    yajl_val index, ngx_uint_t has_id)
{
    ngx_uint_t                    i, k, n;
    ngx_http_agent_reply_call_t  *calls;

    calls = reply->calls.elts;
    n = reply->calls.nelts;

    if (YAJL_IS_INTEGER(index) && YAJL_GET_INTEGER(index) >= 0) {
        i = (ngx_uint_t) YAJL_GET_INTEGER(index);

    } else if (n == 0) {
        i = 0;

    } else {
        i = calls[n - 1].index + (has_id ? 1 : 0);
    }

    for (k = 0; k < n; k++) {
        if (calls[k].index == i) {
            return &calls[k];
        }

        if (calls[k].index > i) {
            break;
        }
    }

    if (ngx_array_push(&reply->calls) == NULL) {
        return NULL;
    }

    calls = reply->calls.elts;

    ngx_memmove(&calls[k + 1], &calls[k],
                (n - k) * sizeof(ngx_http_agent_reply_call_t));
    ngx_memzero(&calls[k], sizeof(ngx_http_agent_reply_call_t));

    calls[k].index = i;

    reply->started = 1;

    return &calls[k];
}


/* a piece of text, thinking or arguments: kept, and passed on live */

static ngx_int_t
ngx_http_agent_openai_chat_piece(ngx_http_agent_reply_t *reply,
    ngx_http_agent_bytes_t *b, ngx_uint_t kind, ngx_uint_t index, yajl_val v)
{
    ngx_str_t  s;

    if (ngx_http_agent_provider_string(v, &s) != NGX_OK || s.len == 0) {
        return NGX_OK;
    }

    if (ngx_http_agent_bytes_append(reply->pool, b, s.data, s.len) != NGX_OK) {
        return NGX_ERROR;
    }

    reply->started = 1;

    if (reply->delta) {
        reply->delta(reply, kind, index, &s);
    }

    return NGX_OK;
}


/*
 * An error after the stream started, in place of a chunk:
 * {"error":{"message","type","param","code"}}, with Groq's
 * "failed_generation" too, or a string.
 */

static ngx_int_t
ngx_http_agent_openai_chat_error(ngx_http_agent_openai_chat_ctx_t *ctx,
    yajl_val err)
{
    ctx->state = sw_error;

    return ngx_http_agent_provider_error(ctx->reply,
                                         ngx_http_agent_openai_errors, err,
                                         ngx_http_agent_provider_get(err,
                                                                     "type"));
}
