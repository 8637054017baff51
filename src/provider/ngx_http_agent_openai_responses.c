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
#include "ngx_http_agent_openai_responses.h"


/*
 * OpenAI Responses.  Requests are stateless ("store":false, never a
 * previous_response_id): each carries the whole context, rendered from
 * the log, which is the truth.
 *
 * The reply streams as named SSE events, "data: {"type",
 * "sequence_number",...}": output items opened by output_item.added,
 * filled by deltas, closed by output_item.done with the item whole; the
 * stream ends with response.completed (or .incomplete), or with
 * response.failed or error.
 *
 * When the output has items that the log cannot rebuild from the text
 * and the calls (reasoning, hosted tool calls, and the citations beside
 * them), the items are the reply's raw content, logged and sent back as
 * they came.  Without "store", a reasoning item is taken back only with
 * its "encrypted_content": one without is left out, and so are the ids
 * of the message and function_call items, which would name it.
 */


typedef enum {
    sw_stream = 0,
    sw_done,
    sw_error
} ngx_http_agent_openai_responses_state_e;


typedef struct {
    ngx_http_agent_reply_t     *reply;
    ngx_http_agent_sse_t       *sse;
    ngx_uint_t                  state;

    /* the output_index of each call, in reply->calls order */
    ngx_array_t                 outs;       /* ngx_int_t */

    /* the output items done, "[item,item" without its "]" */
    ngx_http_agent_bytes_t      items;
    yajl_gen                    gen;

    /* the reasoning summary part the thinking text last grew in */
    ngx_int_t                   part_output;
    ngx_int_t                   part_index;

    /* an item the log cannot rebuild: the items are the raw content */
    unsigned                    opaque:1;
} ngx_http_agent_openai_responses_ctx_t;


typedef ngx_int_t (*ngx_http_agent_openai_responses_event_pt)(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);

typedef struct {
    ngx_str_t                                  type;
    ngx_http_agent_openai_responses_event_pt   handler;
} ngx_http_agent_openai_responses_event_t;


static ngx_int_t ngx_http_agent_openai_responses_render_tools(yajl_gen g,
    ngx_http_agent_t *agent);

static ngx_int_t ngx_http_agent_openai_responses_init(
    ngx_http_agent_reply_t *reply);
static ngx_int_t ngx_http_agent_openai_responses_feed(
    ngx_http_agent_reply_t *reply, u_char *p, u_char *last);
static ngx_int_t ngx_http_agent_openai_responses_finish(
    ngx_http_agent_reply_t *reply);
static ngx_int_t ngx_http_agent_openai_responses_event(void *data,
    ngx_str_t *event, ngx_str_t *json);

static ngx_int_t ngx_http_agent_openai_responses_created(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_added(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_text(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_args(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_thinking(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_done(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_completed(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_error(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);

static ngx_http_agent_reply_call_t *ngx_http_agent_openai_responses_call(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev);
static ngx_int_t ngx_http_agent_openai_responses_hosted_item(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val item,
    ngx_str_t *type, ngx_str_t *json);
static ngx_int_t ngx_http_agent_openai_responses_set(
    ngx_http_agent_reply_t *reply, ngx_http_agent_bytes_t *b, yajl_val v);
static ngx_int_t ngx_http_agent_openai_responses_piece(
    ngx_http_agent_reply_t *reply, ngx_http_agent_bytes_t *b,
    ngx_uint_t kind, ngx_uint_t index, yajl_val v);
static ngx_int_t ngx_http_agent_openai_responses_index(yajl_val v);


static ngx_str_t  ngx_http_agent_params = ngx_string("parameters");
static ngx_str_t  ngx_http_agent_paragraph = ngx_string("\n\n");


/*
 * The stream events that matter; every other one (content_part.*,
 * output_text.done, web_search_call.searching, ...) only repeats what
 * these say.  The reasoning text of open-weight models served with this
 * API is thinking as a summary is.
 */
static ngx_http_agent_openai_responses_event_t
    ngx_http_agent_openai_responses_events[] =
{
    { ngx_string("response.created"),
      ngx_http_agent_openai_responses_created },
    { ngx_string("response.in_progress"),
      ngx_http_agent_openai_responses_created },
    { ngx_string("response.output_item.added"),
      ngx_http_agent_openai_responses_added },
    { ngx_string("response.output_text.delta"),
      ngx_http_agent_openai_responses_text },
    { ngx_string("response.refusal.delta"),
      ngx_http_agent_openai_responses_text },
    { ngx_string("response.function_call_arguments.delta"),
      ngx_http_agent_openai_responses_args },
    { ngx_string("response.reasoning_summary_text.delta"),
      ngx_http_agent_openai_responses_thinking },
    { ngx_string("response.reasoning_text.delta"),
      ngx_http_agent_openai_responses_thinking },
    { ngx_string("response.output_item.done"),
      ngx_http_agent_openai_responses_done },
    { ngx_string("response.completed"),
      ngx_http_agent_openai_responses_completed },
    { ngx_string("response.incomplete"),
      ngx_http_agent_openai_responses_completed },
    { ngx_string("response.failed"),
      ngx_http_agent_openai_responses_error },
    { ngx_string("error"), ngx_http_agent_openai_responses_error },
    { ngx_null_string, NULL }
};


/* the call items of tools the provider runs, logged as hosted */
static ngx_str_t  ngx_http_agent_openai_responses_hosted[] = {
    ngx_string("web_search_call"),
    ngx_string("file_search_call"),
    ngx_string("code_interpreter_call"),
    ngx_string("image_generation_call"),
    ngx_null_string
};


ngx_http_agent_provider_t  ngx_http_agent_openai_responses = {
    ngx_string("openai_responses"),
    1,
    ngx_http_agent_openai_responses_render_tools,
    ngx_http_agent_openai_responses_build_request,
    ngx_http_agent_openai_responses_init,
    ngx_http_agent_openai_responses_feed,
    ngx_http_agent_openai_responses_finish,
    ngx_http_agent_openai_errors
};


/*
 * [{"type":"function","name","description","parameters"},
 *  <hosted tool definition>]: a hosted tool ({"type":"web_search"}, ...)
 * is its definition as declared
 */

static ngx_int_t
ngx_http_agent_openai_responses_render_tools(yajl_gen g,
    ngx_http_agent_t *agent)
{
    ngx_str_t                  *def;
    ngx_uint_t                  i, failed;
    ngx_http_agent_tool_t      *tool;
    ngx_http_agent_tool_ref_t  *ref;

    failed = yajl_gen_array_open(g);

    ref = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        tool = ref[i].tool;

        if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {
            def = ngx_http_agent_provider_definition(tool,
                                            &ngx_http_agent_openai_responses);
            if (def == NULL) {
                return NGX_ERROR;
            }

            failed |= ngx_http_agent_json_verbatim(g, def);
            continue;
        }

        failed |= yajl_gen_map_open(g);

        failed |= ngx_http_agent_json_key(g, "type");
        failed |= ngx_http_agent_json_key(g, "function");

        failed |= ngx_http_agent_provider_function(g, tool,
                                                   &ngx_http_agent_params);

        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);

    return failed ? NGX_ERROR : NGX_OK;
}


static ngx_int_t
ngx_http_agent_openai_responses_init(ngx_http_agent_reply_t *reply)
{
    ngx_http_agent_openai_responses_ctx_t  *ctx;

    ctx = ngx_pcalloc(reply->pool,
                      sizeof(ngx_http_agent_openai_responses_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->sse = ngx_http_agent_sse_create(reply->pool, reply->log,
                                         ngx_http_agent_openai_responses_event,
                                         ctx);
    if (ctx->sse == NULL) {
        return NGX_ERROR;
    }

    ctx->gen = ngx_http_agent_json_gen(reply->pool);
    if (ctx->gen == NULL) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&ctx->outs, reply->pool, 2, sizeof(ngx_int_t))
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
    ctx->part_output = -1;
    ctx->part_index = -1;

    reply->state = ctx;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_openai_responses_feed(ngx_http_agent_reply_t *reply,
    u_char *p, u_char *last)
{
    ngx_http_agent_openai_responses_ctx_t  *ctx;

    ctx = reply->state;

    return ngx_http_agent_sse_feed(ctx->sse, p, last);
}


/* the raw content is the items done, whether the stream ended or not */

static ngx_int_t
ngx_http_agent_openai_responses_finish(ngx_http_agent_reply_t *reply)
{
    ngx_http_agent_openai_responses_ctx_t  *ctx;

    ctx = reply->state;

    if (ctx->state == sw_stream) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, reply->log, 0,
                       "openai_responses stream ended before "
                       "response.completed");
    }

    if (!ctx->opaque || ctx->items.len == 0) {
        return NGX_OK;
    }

    if (ngx_http_agent_bytes_set(reply->pool, &reply->raw_content,
                                 ctx->items.data, ctx->items.len)
        != NGX_OK
        || ngx_http_agent_bytes_append(reply->pool, &reply->raw_content,
                                       (u_char *) "]", 1)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* one SSE event: its JSON object names its type, as the event name does */

static ngx_int_t
ngx_http_agent_openai_responses_event(void *data, ngx_str_t *event,
    ngx_str_t *json)
{
    ngx_int_t                                 rc;
    yajl_val                                  ev;
    ngx_str_t                                 type;
    ngx_http_agent_openai_responses_ctx_t    *ctx;
    ngx_http_agent_openai_responses_event_t  *e;

    ctx = data;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, ctx->reply->log, 0,
                   "openai_responses event \"%V\": %uz bytes, state %ui",
                   event, json->len, ctx->state);

    /* nothing after the end or an error counts */
    if (ctx->state != sw_stream) {
        return NGX_OK;
    }

    /* servers of the API that end as Chat Completions do */
    if (json->len == 0
        || (json->len == sizeof("[DONE]") - 1
            && ngx_strncmp(json->data, "[DONE]", json->len) == 0))
    {
        return NGX_OK;
    }

    ev = ngx_http_agent_provider_parse(ctx->reply->log, json->data,
                                       json->len,
                                       "openai_responses stream event");
    if (ev == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(ev, "type"), &type)
        != NGX_OK)
    {
        type = *event;
    }

    rc = NGX_OK;

    for (e = ngx_http_agent_openai_responses_events; e->handler; e++) {
        if (e->type.len == type.len
            && ngx_strncmp(e->type.data, type.data, type.len) == 0)
        {
            rc = e->handler(ctx, ev);
            break;
        }
    }

    ngx_http_agent_json_free(ev);

    return rc;
}


/* response.created, response.in_progress: {"response":{"id",...}} */

static ngx_int_t
ngx_http_agent_openai_responses_created(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    yajl_val  id;

    if (ctx->reply->response_id.len) {
        return NGX_OK;
    }

    id = ngx_http_agent_provider_get(
             ngx_http_agent_provider_get(ev, "response"), "id");

    return ngx_http_agent_openai_responses_set(ctx->reply,
                                               &ctx->reply->response_id, id);
}


/*
 * {"output_index","item":{"type":"function_call","id","call_id","name",
 * "arguments":""}}: a call starts; other items start with their deltas
 */

static ngx_int_t
ngx_http_agent_openai_responses_added(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    yajl_val                      item;
    ngx_http_agent_reply_call_t  *call;

    item = ngx_http_agent_provider_get(ev, "item");

    if (!ngx_http_agent_provider_is(
            ngx_http_agent_provider_get(item, "type"), "function_call"))
    {
        return NGX_OK;
    }

    call = ngx_http_agent_openai_responses_call(ctx, ev);
    if (call == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_openai_responses_set(ctx->reply, &call->id,
                             ngx_http_agent_provider_get(item, "call_id"))
        != NGX_OK
        || ngx_http_agent_openai_responses_set(ctx->reply, &call->name,
                                ngx_http_agent_provider_get(item, "name"))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* servers that send the arguments whole, with the item */
    return ngx_http_agent_openai_responses_piece(ctx->reply,
                                 &call->arguments,
                                 NGX_HTTP_AGENT_DELTA_TOOL_ARGS, call->index,
                                 ngx_http_agent_provider_get(item,
                                                             "arguments"));
}


/* {"item_id","output_index","content_index","delta"} */

static ngx_int_t
ngx_http_agent_openai_responses_text(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    return ngx_http_agent_openai_responses_piece(ctx->reply,
                                       &ctx->reply->text,
                                       NGX_HTTP_AGENT_DELTA_TEXT, 0,
                                       ngx_http_agent_provider_get(ev,
                                                                   "delta"));
}


/* {"item_id","output_index","delta"} */

static ngx_int_t
ngx_http_agent_openai_responses_args(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    ngx_http_agent_reply_call_t  *call;

    call = ngx_http_agent_openai_responses_call(ctx, ev);
    if (call == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_agent_openai_responses_piece(ctx->reply,
                                       &call->arguments,
                                       NGX_HTTP_AGENT_DELTA_TOOL_ARGS,
                                       call->index,
                                       ngx_http_agent_provider_get(ev,
                                                                   "delta"));
}


/*
 * {"item_id","output_index","summary_index","delta"}: the parts of a
 * summary, and the summaries of several reasoning items, are paragraphs
 * of one thinking text
 */

static ngx_int_t
ngx_http_agent_openai_responses_thinking(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    ngx_int_t                output, index;
    ngx_http_agent_reply_t  *reply;

    reply = ctx->reply;

    output = ngx_http_agent_openai_responses_index(
                 ngx_http_agent_provider_get(ev, "output_index"));
    index = ngx_http_agent_openai_responses_index(
                ngx_http_agent_provider_get(ev, "summary_index"));

    if (index == -1) {
        index = ngx_http_agent_openai_responses_index(
                    ngx_http_agent_provider_get(ev, "content_index"));
    }

    if (reply->thinking.len
        && (output != ctx->part_output || index != ctx->part_index))
    {
        /* live too: the deltas add up to the thinking logged */

        if (ngx_http_agent_bytes_append(reply->pool, &reply->thinking,
                                        ngx_http_agent_paragraph.data,
                                        ngx_http_agent_paragraph.len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (reply->delta) {
            reply->delta(reply, NGX_HTTP_AGENT_DELTA_THINKING, 0,
                         &ngx_http_agent_paragraph);
        }
    }

    ctx->part_output = output;
    ctx->part_index = index;

    return ngx_http_agent_openai_responses_piece(reply, &reply->thinking,
                                       NGX_HTTP_AGENT_DELTA_THINKING, 0,
                                       ngx_http_agent_provider_get(ev,
                                                                   "delta"));
}


/*
 * {"output_index","item":{...}}: the item whole.  It is kept for the raw
 * content; a call is completed from it, a hosted tool call is logged.
 */

static ngx_int_t
ngx_http_agent_openai_responses_done(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    yajl_val                      item, type;
    ngx_str_t                     json, t;
    ngx_http_agent_reply_t       *reply;
    ngx_http_agent_reply_call_t  *call;

    reply = ctx->reply;

    item = ngx_http_agent_provider_get(ev, "item");
    type = ngx_http_agent_provider_get(item, "type");

    if (!YAJL_IS_OBJECT(item)
        || ngx_http_agent_provider_string(type, &t) != NGX_OK)
    {
        return NGX_OK;
    }

    if (ngx_http_agent_provider_text(ctx->gen, item, &json) != NGX_OK
        || ngx_http_agent_bytes_append(reply->pool, &ctx->items,
                                       (u_char *) (ctx->items.len ? ","
                                                                  : "["),
                                       1)
           != NGX_OK
        || ngx_http_agent_bytes_append(reply->pool, &ctx->items, json.data,
                                       json.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_agent_provider_is(type, "message")) {
        return NGX_OK;
    }

    if (!ngx_http_agent_provider_is(type, "function_call")) {
        ctx->opaque = 1;

        return ngx_http_agent_openai_responses_hosted_item(ctx, item, &t,
                                                           &json);
    }

    call = ngx_http_agent_openai_responses_call(ctx, ev);
    if (call == NULL) {
        return NGX_ERROR;
    }

    if ((call->id.len == 0
         && ngx_http_agent_openai_responses_set(reply, &call->id,
                             ngx_http_agent_provider_get(item, "call_id"))
            != NGX_OK)
        || (call->name.len == 0
            && ngx_http_agent_openai_responses_set(reply, &call->name,
                                ngx_http_agent_provider_get(item, "name"))
               != NGX_OK))
    {
        return NGX_ERROR;
    }

    return ngx_http_agent_openai_responses_set(reply, &call->arguments,
                             ngx_http_agent_provider_get(item, "arguments"));
}


/*
 * A hosted tool's call item: its input is the item's action ({} if it
 * has none), its result the item whole.
 */

static ngx_int_t
ngx_http_agent_openai_responses_hosted_item(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val item,
    ngx_str_t *type, ngx_str_t *json)
{
    yajl_val                        action;
    ngx_str_t                       input, *k;
    ngx_http_agent_reply_t         *reply;
    ngx_http_agent_reply_hosted_t  *h;

    reply = ctx->reply;

    for (k = ngx_http_agent_openai_responses_hosted; k->len; k++) {
        if (k->len == type->len
            && ngx_strncmp(k->data, type->data, type->len) == 0)
        {
            break;
        }
    }

    if (k->len == 0) {
        /* reasoning, and items of no tool the module declares */
        return NGX_OK;
    }

    h = ngx_array_push(&reply->hosted);
    if (h == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(h, sizeof(ngx_http_agent_reply_hosted_t));

    /* the tool's name is the item's type without "_call" */

    if (ngx_http_agent_bytes_set(reply->pool, &h->result, json->data,
                                 json->len)
        != NGX_OK
        || ngx_http_agent_openai_responses_set(reply, &h->id,
                                    ngx_http_agent_provider_get(item, "id"))
           != NGX_OK
        || ngx_http_agent_bytes_set(reply->pool, &h->name, type->data,
                                    type->len - (sizeof("_call") - 1))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    action = ngx_http_agent_provider_get(item, "action");

    if (YAJL_IS_OBJECT(action)) {
        if (ngx_http_agent_provider_text(ctx->gen, action, &input)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

    } else {
        ngx_str_set(&input, "{}");
    }

    return ngx_http_agent_bytes_set(reply->pool, &h->input, input.data,
                                    input.len);
}


/*
 * response.completed, or response.incomplete (max_output_tokens, ...):
 * {"response":{"id","status","incomplete_details","usage":
 * {"input_tokens","output_tokens",...}}}
 */

static ngx_int_t
ngx_http_agent_openai_responses_completed(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    yajl_val                 resp, usage, reason;
    ngx_http_agent_reply_t  *reply;

    reply = ctx->reply;

    resp = ngx_http_agent_provider_get(ev, "response");
    usage = ngx_http_agent_provider_get(resp, "usage");

    ngx_http_agent_provider_usage(reply, usage, "input_tokens",
                                  "output_tokens", "input_tokens_details");

    reason = ngx_http_agent_provider_get(
                 ngx_http_agent_provider_get(resp, "incomplete_details"),
                 "reason");

    if (!YAJL_IS_STRING(reason)) {
        reason = ngx_http_agent_provider_get(resp, "status");
    }

    if (ngx_http_agent_openai_responses_set(reply, &reply->finish_reason,
                                            reason)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (reply->response_id.len == 0
        && ngx_http_agent_openai_responses_set(reply, &reply->response_id,
                                     ngx_http_agent_provider_get(resp, "id"))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (reply->response_model.len == 0
        && ngx_http_agent_openai_responses_set(reply, &reply->response_model,
                                  ngx_http_agent_provider_get(resp, "model"))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->state = sw_done;
    reply->complete = 1;

    return NGX_OK;
}


/*
 * error: {"type":"error","code","message","param"} as documented, or
 * with the fields in an "error" object as sent; response.failed:
 * {"response":{"status":"failed","error":{"code","message"},...}}
 */

static ngx_int_t
ngx_http_agent_openai_responses_error(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    yajl_val  err;

    err = ngx_http_agent_provider_get(ev, "response");

    if (err) {
        err = ngx_http_agent_provider_get(err, "error");

    } else {
        err = ngx_http_agent_provider_get(ev, "error");
    }

    ctx->state = sw_error;

    /* the type of the event itself says nothing */

    if (!YAJL_IS_OBJECT(err)) {
        return ngx_http_agent_provider_error(ctx->reply,
                                             ngx_http_agent_openai_errors,
                                             ev, NULL);
    }

    return ngx_http_agent_provider_error(ctx->reply,
                                         ngx_http_agent_openai_errors, err,
                                         ngx_http_agent_provider_get(err,
                                                                     "type"));
}


/* the call of an output item, by its output_index; a new one is added */

static ngx_http_agent_reply_call_t *
ngx_http_agent_openai_responses_call(
    ngx_http_agent_openai_responses_ctx_t *ctx, yajl_val ev)
{
    ngx_int_t                     output, *out;
    ngx_uint_t                    i;
    ngx_http_agent_reply_call_t  *call;

    output = ngx_http_agent_openai_responses_index(
                 ngx_http_agent_provider_get(ev, "output_index"));

    out = ctx->outs.elts;

    for (i = 0; i < ctx->outs.nelts; i++) {
        if (out[i] == output) {
            call = ctx->reply->calls.elts;
            return &call[i];
        }
    }

    out = ngx_array_push(&ctx->outs);
    if (out == NULL) {
        return NULL;
    }

    *out = output;

    call = ngx_array_push(&ctx->reply->calls);
    if (call == NULL) {
        return NULL;
    }

    ngx_memzero(call, sizeof(ngx_http_agent_reply_call_t));

    call->index = ctx->reply->calls.nelts - 1;

    ctx->reply->started = 1;

    return call;
}


/* a string of an event, kept; a missing one leaves b as it is */

static ngx_int_t
ngx_http_agent_openai_responses_set(ngx_http_agent_reply_t *reply,
    ngx_http_agent_bytes_t *b, yajl_val v)
{
    ngx_str_t  s;

    if (ngx_http_agent_provider_string(v, &s) != NGX_OK) {
        return NGX_OK;
    }

    return ngx_http_agent_bytes_set(reply->pool, b, s.data, s.len);
}


/* a piece of text, thinking or arguments: kept, and passed on live */

static ngx_int_t
ngx_http_agent_openai_responses_piece(ngx_http_agent_reply_t *reply,
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


/* a count or an index: -1 if it is none */

static ngx_int_t
ngx_http_agent_openai_responses_index(yajl_val v)
{
    if (YAJL_IS_INTEGER(v) && YAJL_GET_INTEGER(v) >= 0
        && YAJL_GET_INTEGER(v) <= NGX_MAX_INT_T_VALUE)
    {
        return (ngx_int_t) YAJL_GET_INTEGER(v);
    }

    return -1;
}


