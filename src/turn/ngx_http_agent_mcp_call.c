
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * A call of an MCP server's tool: tools/call through the server's
 * location, with the tool_call_id as the progress token and in _meta
 * (and as Idempotency-Key, as for any server tool), so that a server can
 * make a call sent again after a crash idempotent.  Progress
 * notifications become tool_progress events; the result's content is
 * the call's result; isError and JSON-RPC errors are error results.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_mcp_rpc.h"


static void ngx_http_agent_mcp_call_progress(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val msg);
static void ngx_http_agent_mcp_call_done(ngx_http_agent_mcp_rpc_t *rpc);
static char *ngx_http_agent_mcp_call_error(ngx_http_agent_call_t *call,
    yajl_val error);
static ngx_int_t ngx_http_agent_mcp_call_content(ngx_http_agent_call_t *call,
    yajl_val result, ngx_uint_t texts_only, ngx_str_t *out);


ngx_int_t
ngx_http_agent_mcp_call_run(ngx_http_agent_call_t *call,
    ngx_keyval_t *headers, ngx_uint_t nheaders)
{
    yajl_gen                   g;
    ngx_uint_t                 failed;
    ngx_http_agent_turn_t     *t;
    ngx_http_agent_mcp_rpc_t  *rpc;

    t = call->turn;

    rpc = ngx_palloc(t->pool, sizeof(ngx_http_agent_mcp_rpc_t));
    if (rpc == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_mcp_rpc_init(rpc, t, call->tool->mcp, t->pool)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &call->tool->mcp_name);
    failed |= ngx_http_agent_json_key(g, "arguments");
    failed |= ngx_http_agent_json_verbatim(g, &call->arguments);
    failed |= ngx_http_agent_json_key(g, "_meta");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "progressToken");
    failed |= ngx_http_agent_json_str(g, &call->id);
    failed |= ngx_http_agent_json_key(g, "agent/tool_call_id");
    failed |= ngx_http_agent_json_str(g, &call->id);
    failed |= ngx_http_agent_json_key(g, "agent/conversation");
    failed |= ngx_http_agent_json_str(g, &t->id);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &rpc->params) != NGX_OK) {
        return NGX_ERROR;
    }

    /* the JSON-RPC id: the tool_call_id, as a JSON string */

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_json_result(g, ngx_http_agent_json_str(g, &call->id),
                                   &rpc->id)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    rpc->key = call->id;
    ngx_str_set(&rpc->method, "tools/call");

    rpc->headers = ngx_palloc(t->pool, nheaders * sizeof(ngx_keyval_t));
    if (rpc->headers == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(rpc->headers, headers, nheaders * sizeof(ngx_keyval_t));
    rpc->nheaders = nheaders;

    rpc->call = call;
    rpc->notify = ngx_http_agent_mcp_call_progress;
    rpc->done = ngx_http_agent_mcp_call_done;

    return ngx_http_agent_mcp_rpc_start(rpc);
}


/* notifications/progress of this call: a tool_progress event */

static void
ngx_http_agent_mcp_call_progress(ngx_http_agent_mcp_rpc_t *rpc, yajl_val msg)
{
    yajl_val                method, params, token;
    ngx_http_agent_call_t  *call;

    call = rpc->call;

    method = ngx_http_agent_provider_get(msg, "method");
    params = ngx_http_agent_provider_get(msg, "params");
    token = params ? ngx_http_agent_provider_get(params, "progressToken")
                   : NULL;

    if (call->done
        || ngx_strcmp(method->u.string, "notifications/progress") != 0
        || !YAJL_IS_STRING(token)
        || ngx_strlen(token->u.string) != call->id.len
        || ngx_strncmp(token->u.string, call->id.data, call->id.len) != 0)
    {
        return;
    }

    (void) ngx_http_agent_tools_progress(call, params);
}


static void
ngx_http_agent_mcp_call_done(ngx_http_agent_mcp_rpc_t *rpc)
{
    char                   *error;
    yajl_val                result, err, is_error, structured;
    ngx_str_t               out;
    ngx_http_agent_call_t  *call;
    ngx_http_agent_turn_t  *t;

    call = rpc->call;
    t = call->turn;

    if (call->done) {
        return;
    }

    call->done = 1;

    result = NULL;
    err = NULL;

    if (rpc->answer) {
        result = ngx_http_agent_provider_get(rpc->answer, "result");
        err = ngx_http_agent_provider_get(rpc->answer, "error");
    }

    if (rpc->failure) {
        error = rpc->failure;

    } else if (err || !YAJL_IS_OBJECT(result)) {
        error = ngx_http_agent_mcp_call_error(call, err);

    } else {
        is_error = ngx_http_agent_provider_get(result, "isError");
        structured = ngx_http_agent_provider_get(result,
                                                 "structuredContent");
        error = NULL;

        if (YAJL_IS_TRUE(is_error)) {
            if (ngx_http_agent_mcp_call_content(call, result, 1, &out)
                != NGX_OK || out.len == 0)
            {
                error = "the tool failed";

            } else {
                error = (char *) out.data;
            }

        } else if (ngx_http_agent_mcp_call_content(call,
                                                   structured ? structured
                                                              : result,
                                                   structured == NULL, &out)
                   != NGX_OK)
        {
            error = "the tool's result cannot be read";
        }
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent mcp call \"%V\" of \"%V\" done: %s",
                   &call->id, &call->name, error ? error : "ok");

    if (error) {
        (void) ngx_http_agent_tools_result(call, NULL, error);

    } else {
        (void) ngx_http_agent_tools_result(call, &out, NULL);
    }

    if (--t->running == 0) {
        ngx_http_agent_turn_tools_done(t);
    }
}


/* a JSON-RPC error, for the model to read */

static char *
ngx_http_agent_mcp_call_error(ngx_http_agent_call_t *call, yajl_val error)
{
    u_char     *p;
    yajl_val    code, message;
    ngx_str_t   m;

    code = error ? ngx_http_agent_provider_get(error, "code") : NULL;
    message = error ? ngx_http_agent_provider_get(error, "message") : NULL;

    if (!YAJL_IS_STRING(message)) {
        return "the MCP server answered without a result";
    }

    m.data = (u_char *) message->u.string;
    m.len = ngx_min(ngx_strlen(m.data), 4096);

    p = ngx_pnalloc(call->turn->pool, m.len + 64 + NGX_INT64_LEN);
    if (p == NULL) {
        return "the MCP server answered an error";
    }

    ngx_sprintf(p, "the MCP server answered error %L: %V%Z",
                YAJL_IS_INTEGER(code) ? (int64_t) YAJL_GET_INTEGER(code) : 0,
                &m);

    return (char *) p;
}


/*
 * What the model gets of a result: structuredContent when the tool gives
 * it; else the text of its content when all of it is text (JSON text
 * stays JSON), else its content as the server sent it.  texts_only: the
 * text of the content, whatever else it holds.  NUL-terminated.
 */

static ngx_int_t
ngx_http_agent_mcp_call_content(ngx_http_agent_call_t *call,
    yajl_val result, ngx_uint_t texts_only, ngx_str_t *out)
{
    size_t                   i;
    yajl_gen                 g;
    yajl_val                 content, type, text;
    ngx_str_t                s;
    ngx_uint_t               texts;
    ngx_http_agent_bytes_t   b;

    ngx_memzero(&b, sizeof(ngx_http_agent_bytes_t));

    content = texts_only ? ngx_http_agent_provider_get(result, "content")
                         : NULL;
    texts = YAJL_IS_ARRAY(content);

    for (i = 0; texts && i < content->u.array.len; i++) {
        type = ngx_http_agent_provider_get(content->u.array.values[i],
                                           "type");
        text = ngx_http_agent_provider_get(content->u.array.values[i],
                                           "text");

        if (!YAJL_IS_STRING(type) || ngx_strcmp(type->u.string, "text") != 0
            || !YAJL_IS_STRING(text))
        {
            texts = 0;
            break;
        }

        s.data = (u_char *) text->u.string;
        s.len = ngx_strlen(s.data);

        if ((b.len && ngx_http_agent_bytes_append(call->turn->pool, &b,
                                                  (u_char *) "\n", 1)
                      != NGX_OK)
            || ngx_http_agent_bytes_append(call->turn->pool, &b, s.data,
                                           s.len)
               != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (!texts) {
        g = ngx_http_agent_json_gen(call->turn->pool);
        if (g == NULL) {
            return NGX_ERROR;
        }

        if (ngx_http_agent_json_result(g,
                                       ngx_http_agent_provider_value(g,
                                              content ? content : result),
                                       &s)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        b.len = 0;

        if (ngx_http_agent_bytes_append(call->turn->pool, &b, s.data, s.len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (ngx_http_agent_bytes_append(call->turn->pool, &b, (u_char *) "", 1)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    out->data = b.data;
    out->len = b.len - 1;

    return NGX_OK;
}
