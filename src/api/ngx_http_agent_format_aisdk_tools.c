
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The AI SDK's UI message stream: tool calls.  Input as it streams and
 * whole, approval requests, calls offered to the client to run or
 * answer, denials, results and a streaming tool's progress.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_format_aisdk.h"


static ngx_int_t ngx_http_agent_aisdk_input_start(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_str_t *id, ngx_str_t *name, ngx_uint_t provider);
static ngx_int_t ngx_http_agent_aisdk_input(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_str_t *id, ngx_str_t *name, ngx_str_t *args,
    ngx_uint_t provider);
static ngx_http_agent_aisdk_call_t *ngx_http_agent_aisdk_call(
    ngx_http_agent_aisdk_t *a, ngx_str_t *id, ngx_uint_t add);


/*
 * A call's arguments as the model writes them: the call is shown with
 * its first delta that names it (tool-input-start), then each delta.
 */

ngx_int_t
ngx_http_agent_aisdk_input_delta(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t                     id, name, delta;
    ngx_http_agent_aisdk_call_t  *call;

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "name", &name) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "delta", &delta) != NGX_OK
        || id.len >= NGX_HTTP_AGENT_AISDK_ID_LEN)
    {
        /* not named yet: its input comes whole with its tool_call */
        return NGX_OK;
    }

    call = ngx_http_agent_aisdk_call(a, &id, 1);
    if (call == NULL) {
        return NGX_ERROR;
    }

    if (call->offered) {
        return NGX_OK;
    }

    if (!call->streamed) {
        if (ngx_http_agent_aisdk_input_start(a, b, &id, &name, 0)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        call->streamed = 1;
    }

    ngx_http_agent_aisdk_open(a, "tool-input-delta");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, &id);
    a->failed |= ngx_http_agent_json_key(a->g, "inputTextDelta");
    a->failed |= ngx_http_agent_json_str(a->g, &delta);

    return ngx_http_agent_aisdk_close(a, b);
}


ngx_int_t
ngx_http_agent_aisdk_tool_call(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t                     id, name, args;
    ngx_uint_t                    provider;
    ngx_http_agent_aisdk_call_t  *call;

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "name", &name) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "arguments", &args) != NGX_OK
        || ngx_http_agent_aisdk_step(a, b, NULL) != NGX_OK)
    {
        return NGX_ERROR;
    }

    provider = ngx_http_agent_aisdk_true(root, "provider_executed");

    call = ngx_http_agent_aisdk_call(a, &id, 1);
    if (call == NULL) {
        return NGX_ERROR;
    }

    if (!call->streamed
        && ngx_http_agent_aisdk_input_start(a, b, &id, &name, provider)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    call->streamed = 1;
    call->offered = 1;

    return ngx_http_agent_aisdk_input(a, b, &id, &name, &args, provider);
}


static ngx_int_t
ngx_http_agent_aisdk_input_start(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    ngx_str_t *id, ngx_str_t *name, ngx_uint_t provider)
{
    ngx_http_agent_aisdk_open(a, "tool-input-start");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, id);
    a->failed |= ngx_http_agent_json_key(a->g, "toolName");
    a->failed |= ngx_http_agent_json_str(a->g, name);

    if (provider) {
        a->failed |= ngx_http_agent_json_key(a->g, "providerExecuted");
        a->failed |= yajl_gen_bool(a->g, 1);
    }

    return ngx_http_agent_aisdk_close(a, b);
}


/* a call's input, whole: the client's onToolCall runs with it */

static ngx_int_t
ngx_http_agent_aisdk_input(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    ngx_str_t *id, ngx_str_t *name, ngx_str_t *args, ngx_uint_t provider)
{
    char      errbuf[NGX_HTTP_AGENT_JSON_ERR];
    yajl_val  input;

    /* arguments cut off by a failed reply go as the text they are */

    input = ngx_http_agent_json_parse(args->data, args->len,
                                      NGX_HTTP_AGENT_JSON_LOG_DEPTH, errbuf,
                                      sizeof(errbuf));

    ngx_http_agent_aisdk_open(a, "tool-input-available");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, id);
    a->failed |= ngx_http_agent_json_key(a->g, "toolName");
    a->failed |= ngx_http_agent_json_str(a->g, name);
    a->failed |= ngx_http_agent_json_key(a->g, "input");

    if (input) {
        ngx_http_agent_aisdk_value(a, input);
        ngx_http_agent_json_free(input);

    } else {
        a->failed |= ngx_http_agent_json_str(a->g, args);
    }

    if (provider) {
        a->failed |= ngx_http_agent_json_key(a->g, "providerExecuted");
        a->failed |= yajl_gen_bool(a->g, 1);
    }

    return ngx_http_agent_aisdk_close(a, b);
}


/*
 * A call that waits: for approval, an approval request (its id is the
 * call's); for the browser or a person, its input, if this stream has
 * not offered it yet (a gated client call approved in the request that
 * this stream answers), for the client to run or answer.
 */

ngx_int_t
ngx_http_agent_aisdk_suspension(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t                     id, kind, name, args;
    yajl_val                      v;
    const char                   *args_path[] = { "arguments", NULL };
    ngx_http_agent_aisdk_call_t  *call;

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "kind", &kind) != NGX_OK
        || ngx_http_agent_aisdk_start(a, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (kind.len == sizeof("approval") - 1
        && ngx_strncmp(kind.data, "approval", kind.len) == 0)
    {
        ngx_http_agent_aisdk_open(a, "tool-approval-request");
        a->failed |= ngx_http_agent_json_key(a->g, "approvalId");
        a->failed |= ngx_http_agent_json_str(a->g, &id);
        a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
        a->failed |= ngx_http_agent_json_str(a->g, &id);

        return ngx_http_agent_aisdk_close(a, b);
    }

    call = ngx_http_agent_aisdk_call(a, &id, 0);

    if (call && call->offered) {
        return NGX_OK;
    }

    v = yajl_tree_get(root, args_path, yajl_t_any);

    if (ngx_http_agent_aisdk_get(root, "name", &name) != NGX_OK
        || v == NULL)
    {
        return NGX_ERROR;
    }

    if (YAJL_IS_STRING(v)) {
        args.data = (u_char *) YAJL_GET_STRING(v);
        args.len = ngx_strlen(args.data);
        return ngx_http_agent_aisdk_input(a, b, &id, &name, &args, 0);
    }

    /* the arguments are logged as an object: the input is that object */

    ngx_http_agent_aisdk_open(a, "tool-input-available");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, &id);
    a->failed |= ngx_http_agent_json_key(a->g, "toolName");
    a->failed |= ngx_http_agent_json_str(a->g, &name);
    a->failed |= ngx_http_agent_json_key(a->g, "input");
    ngx_http_agent_aisdk_value(a, v);

    return ngx_http_agent_aisdk_close(a, b);
}


/* a denial is the SDK's "tool-output-denied", in place of its result */

ngx_int_t
ngx_http_agent_aisdk_resolution(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t  id, decision;

    if (ngx_http_agent_aisdk_get(root, "decision", &decision) != NGX_OK
        || decision.len != sizeof("reject") - 1
        || ngx_strncmp(decision.data, "reject", decision.len) != 0)
    {
        return NGX_OK;
    }

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || id.len >= NGX_HTTP_AGENT_AISDK_ID_LEN
        || ngx_http_agent_aisdk_start(a, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_memcpy(a->denied, id.data, id.len);
    a->denied_len = id.len;

    ngx_http_agent_aisdk_open(a, "tool-output-denied");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, &id);

    return ngx_http_agent_aisdk_close(a, b);
}


ngx_int_t
ngx_http_agent_aisdk_tool_result(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t    id, error;
    yajl_val     result;
    const char  *result_path[] = { "result", NULL };

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_start(a, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (id.len == a->denied_len
        && ngx_strncmp(id.data, a->denied, id.len) == 0)
    {
        a->denied_len = 0;
        return NGX_OK;
    }

    if (ngx_http_agent_aisdk_true(root, "ok")) {
        ngx_http_agent_aisdk_open(a, "tool-output-available");
        a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
        a->failed |= ngx_http_agent_json_str(a->g, &id);
        a->failed |= ngx_http_agent_json_key(a->g, "output");

        result = yajl_tree_get(root, result_path, yajl_t_any);

        if (result) {
            ngx_http_agent_aisdk_value(a, result);

        } else {
            a->failed |= yajl_gen_null(a->g);
        }

    } else {
        if (ngx_http_agent_aisdk_get(root, "error", &error) != NGX_OK) {
            ngx_str_set(&error, "the tool failed");
        }

        ngx_http_agent_aisdk_open(a, "tool-output-error");
        a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
        a->failed |= ngx_http_agent_json_str(a->g, &id);
        a->failed |= ngx_http_agent_json_key(a->g, "errorText");
        a->failed |= ngx_http_agent_json_str(a->g, &error);
    }

    if (ngx_http_agent_aisdk_true(root, "provider_executed")) {
        a->failed |= ngx_http_agent_json_key(a->g, "providerExecuted");
        a->failed |= yajl_gen_bool(a->g, 1);
    }

    return ngx_http_agent_aisdk_close(a, b);
}


/* a streaming tool's progress: a transient data part, never kept */

ngx_int_t
ngx_http_agent_aisdk_progress(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t    id;
    yajl_val     progress;
    const char  *progress_path[] = { "progress", NULL };

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_start(a, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    progress = yajl_tree_get(root, progress_path, yajl_t_any);

    ngx_http_agent_aisdk_open(a, "data-tool-progress");
    a->failed |= ngx_http_agent_json_key(a->g, "id");
    a->failed |= ngx_http_agent_json_str(a->g, &id);
    a->failed |= ngx_http_agent_json_key(a->g, "data");

    if (progress) {
        ngx_http_agent_aisdk_value(a, progress);

    } else {
        a->failed |= yajl_gen_null(a->g);
    }

    a->failed |= ngx_http_agent_json_key(a->g, "transient");
    a->failed |= yajl_gen_bool(a->g, 1);

    return ngx_http_agent_aisdk_close(a, b);
}


/* a call of this stream by its id, added if asked; NULL if not found */

static ngx_http_agent_aisdk_call_t *
ngx_http_agent_aisdk_call(ngx_http_agent_aisdk_t *a, ngx_str_t *id,
    ngx_uint_t add)
{
    ngx_uint_t                    i;
    ngx_http_agent_aisdk_call_t  *call;

    if (id->len >= NGX_HTTP_AGENT_AISDK_ID_LEN) {
        return NULL;
    }

    call = a->calls.elts;

    for (i = 0; i < a->calls.nelts; i++) {
        if (call[i].len == id->len
            && ngx_strncmp(call[i].id, id->data, id->len) == 0)
        {
            return &call[i];
        }
    }

    if (!add) {
        return NULL;
    }

    call = ngx_array_push(&a->calls);
    if (call == NULL) {
        return NULL;
    }

    ngx_memzero(call, sizeof(ngx_http_agent_aisdk_call_t));
    ngx_memcpy(call->id, id->data, id->len);
    call->len = id->len;

    return call;
}
