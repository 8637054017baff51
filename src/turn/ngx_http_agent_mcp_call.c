
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
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_fsm.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_mcp_rpc.h"


static void ngx_http_agent_mcp_call_progress(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val msg);
static void ngx_http_agent_mcp_call_done(ngx_http_agent_mcp_rpc_t *rpc);
static void ngx_http_agent_mcp_call_request(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val msg);
static ngx_int_t ngx_http_agent_mcp_call_elicit(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val params);
static ngx_int_t ngx_http_agent_mcp_call_answer(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_str_t *id, yajl_val resolution, char *error);
static ngx_int_t ngx_http_agent_mcp_call_message(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_str_t *id, yajl_val resolution, char *error, ngx_str_t *message);
static void ngx_http_agent_mcp_call_withdrawn(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val params);
static void ngx_http_agent_mcp_call_settle(ngx_http_agent_mcp_rpc_t *rpc,
    char *reason);
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
    rpc->request = ngx_http_agent_mcp_call_request;
    rpc->done = ngx_http_agent_mcp_call_done;

    call->mcp = rpc;

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

    if (!call->done && rpc->eliciting
        && ngx_strcmp(method->u.string, "notifications/cancelled") == 0)
    {
        ngx_http_agent_mcp_call_withdrawn(rpc, params);
        return;
    }

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

    if (rpc->eliciting) {
        /* the server ended the call without the answer */
        ngx_http_agent_mcp_call_settle(rpc, "the server ended the call");
    }

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


/*
 * A request of the server during the call.  elicitation/create (a form:
 * a message and a schema) makes the call wait for a person's answer as
 * a suspension of kind elicitation, which the resolve API answers; the
 * call's subrequest stays open meanwhile.  Anything else is refused.
 */

static void
ngx_http_agent_mcp_call_request(ngx_http_agent_mcp_rpc_t *rpc, yajl_val msg)
{
    char                   *error;
    yajl_gen                g;
    yajl_val                method, params, mode;
    ngx_str_t               id;
    ngx_http_agent_call_t  *call;

    call = rpc->call;

    if (call->done) {
        return;
    }

    g = ngx_http_agent_json_gen(rpc->pool);

    if (g == NULL
        || ngx_http_agent_json_result(g,
               ngx_http_agent_provider_value(g,
                   ngx_http_agent_provider_get(msg, "id")), &id)
           != NGX_OK)
    {
        return;
    }

    method = ngx_http_agent_provider_get(msg, "method");
    params = ngx_http_agent_provider_get(msg, "params");
    mode = params ? ngx_http_agent_provider_get(params, "mode") : NULL;

    error = "the method is not supported";

    if (ngx_strcmp(method->u.string, "elicitation/create") == 0) {

        if (rpc->eliciting) {
            error = "a question of the call waits for its answer";

        } else if (mode && !(YAJL_IS_STRING(mode)
                             && ngx_strcmp(mode->u.string, "form") == 0))
        {
            error = "only form elicitation is supported";

        } else {
            rpc->elicit_id = id;

            switch (ngx_http_agent_mcp_call_elicit(rpc, params)) {

            case NGX_OK:
                return;

            case NGX_DECLINED:
                /* too many calls wait: it cannot be asked */
                (void) ngx_http_agent_mcp_call_answer(rpc, &id, NULL, NULL);
                return;

            default:
                error = "the question cannot be asked";
            }
        }
    }

    ngx_log_error(NGX_LOG_WARN, &rpc->turn->log, 0,
                  "agent mcp \"%V\" sent a request \"%s\": %s",
                  &rpc->server->name, method->u.string, error);

    (void) ngx_http_agent_mcp_call_answer(rpc, &id, NULL, error);
}


/* the suspension: the call's, with the server's message and schema */

static ngx_int_t
ngx_http_agent_mcp_call_elicit(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val params)
{
    yajl_gen                 g;
    uint64_t                 deadline;
    yajl_val                 message, schema;
    ngx_int_t                rc;
    ngx_str_t                fields, text;
    ngx_uint_t               failed;
    ngx_http_agent_call_t   *call;
    ngx_http_agent_turn_t   *t;

    call = rpc->call;
    t = call->turn;

    message = params ? ngx_http_agent_provider_get(params, "message") : NULL;
    schema = params ? ngx_http_agent_provider_get(params, "requestedSchema")
                    : NULL;

    if (!YAJL_IS_STRING(message) || !YAJL_IS_OBJECT(schema)) {
        return NGX_ERROR;
    }

    text.data = (u_char *) message->u.string;
    text.len = ngx_strlen(text.data);

    deadline = ngx_http_agent_tools_deadline(t->agent, call->tool);

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = ngx_http_agent_tools_json_call(g, &call->id, &call->tool->name);
    failed |= ngx_http_agent_json_key(g, "executor");
    failed |= ngx_http_agent_json_str(g,
                &ngx_http_agent_executors[NGX_HTTP_AGENT_EXECUTOR_SERVER].name);
    failed |= ngx_http_agent_json_key(g, "kind");
    failed |= ngx_http_agent_json_str(g, &ngx_http_agent_pending_kinds[
                                        NGX_HTTP_AGENT_PENDING_ELICITATION]);
    failed |= ngx_http_agent_json_key(g, "arguments");
    failed |= ngx_http_agent_json_verbatim(g, &call->arguments);
    failed |= ngx_http_agent_json_key(g, "during_call");
    failed |= yajl_gen_bool(g, 1);
    failed |= ngx_http_agent_json_key(g, "message");
    failed |= ngx_http_agent_json_str(g, &text);
    failed |= ngx_http_agent_json_key(g, "schema");
    failed |= ngx_http_agent_provider_value(g, schema);
    failed |= ngx_http_agent_json_key(g, "deadline");
    failed |= yajl_gen_integer(g, (long long) deadline);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        return NGX_ERROR;
    }

    rc = ngx_http_agent_tools_wait(call, NGX_HTTP_AGENT_PENDING_ELICITATION,
                                   deadline, &fields);
    if (rc != NGX_OK) {
        return rc;
    }

    rpc->eliciting = 1;
    t->elicitations++;

    /* the server waits for a person, not the person for the server */
    ngx_http_agent_mcp_rpc_clock(rpc, 0);

    ngx_http_agent_tools_state(t, NGX_HTTP_AGENT_FSM_SUSPEND);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent mcp call \"%V\": the server asks %V",
                   &call->id, &rpc->elicit_id);

    return NGX_OK;
}


/*
 * The calls whose question is no longer waiting: its resolution, the
 * newest of the call in the log, is the answer (a result: accept with
 * it as content; a rejection: decline; an expiry or a cancel: cancel).
 */

void
ngx_http_agent_mcp_call_answers(ngx_http_agent_turn_t *t)
{
    u_char                    *p, key[NGX_HTTP_AGENT_CALL_ID_LEN + 32], *last;
    yajl_val                   v;
    ngx_str_t                  found;
    ngx_uint_t                 i;
    ngx_queue_t               *q;
    ngx_http_agent_conv_t     *conv;
    ngx_http_agent_event_t    *e;
    ngx_http_agent_call_t    **calls;
    ngx_http_agent_mcp_rpc_t  *rpc;

    calls = t->calls ? t->calls->elts : NULL;

    for (i = 0; calls && i < t->calls->nelts; i++) {
        rpc = calls[i]->mcp;

        if (rpc == NULL || !rpc->eliciting || calls[i]->done
            || calls[i]->id.len > NGX_HTTP_AGENT_CALL_ID_LEN)
        {
            continue;
        }

        last = ngx_sprintf(key, "\"tool_call_id\":\"%V\"", &calls[i]->id);
        found.len = 0;
        p = NULL;

        ngx_http_agent_zone_lock(t->zone);

        conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

        if (conv == NULL || conv->cancel
            || ngx_http_agent_conv_pending_locked(conv, &calls[i]->id))
        {
            /* still waiting, or the cancel ends the call */
            ngx_http_agent_zone_unlock(t->zone);
            continue;
        }

        for (q = ngx_queue_last(&conv->log);
             q != ngx_queue_sentinel(&conv->log);
             q = ngx_queue_prev(q))
        {
            e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

            if (e->type == NGX_HTTP_AGENT_EV_RESOLUTION
                && ngx_strlcasestrn(e->data, e->data + e->len, key,
                                    last - key - 1)
                   != NULL)
            {
                /* NUL-terminated for the parser */
                p = ngx_pnalloc(t->pool, e->len + 1);

                if (p) {
                    ngx_memcpy(p, e->data, e->len);
                    p[e->len] = '\0';
                    found.data = p;
                    found.len = e->len;
                }

                break;
            }
        }

        ngx_http_agent_zone_unlock(t->zone);

        rpc->eliciting = 0;
        t->elicitations--;

        ngx_http_agent_mcp_rpc_clock(rpc, 1);

        v = found.len ? ngx_http_agent_provider_parse_log(&t->log,
                                                          found.data,
                                                          found.len)
                      : NULL;

        if (ngx_http_agent_mcp_call_answer(rpc, &rpc->elicit_id, v, NULL)
            != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                          "agent mcp call \"%V\": the answer cannot be sent",
                          &calls[i]->id);
        }

        if (v) {
            ngx_http_agent_json_free(v);
        }
    }

    ngx_http_run_posted_requests(t->request->connection);
}


/*
 * The answer to a request of the server: an error, or the result of an
 * elicitation from its resolution (none: cancel)
 */

static ngx_int_t
ngx_http_agent_mcp_call_answer(ngx_http_agent_mcp_rpc_t *rpc, ngx_str_t *id,
    yajl_val resolution, char *error)
{
    ngx_str_t  message;

    if (ngx_http_agent_mcp_call_message(rpc, id, resolution, error, &message)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &rpc->turn->log, 0,
                   "agent mcp call \"%V\": answer %V",
                   &rpc->call->id, &message);

    return ngx_http_agent_mcp_rpc_reply(rpc, &message);
}


static ngx_int_t
ngx_http_agent_mcp_call_message(ngx_http_agent_mcp_rpc_t *rpc, ngx_str_t *id,
    yajl_val resolution, char *error, ngx_str_t *message)
{
    yajl_gen    g;
    yajl_val    result;
    ngx_str_t   s;
    ngx_uint_t  failed;

    result = resolution ? ngx_http_agent_provider_get(resolution, "result")
                        : NULL;

    g = ngx_http_agent_json_gen(rpc->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "jsonrpc");
    failed |= yajl_gen_string(g, (u_char *) "2.0", 3);
    failed |= ngx_http_agent_json_key(g, "id");
    failed |= ngx_http_agent_json_verbatim(g, id);

    if (error) {
        s.data = (u_char *) error;
        s.len = ngx_strlen(error);

        failed |= ngx_http_agent_json_key(g, "error");
        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "code");
        failed |= yajl_gen_integer(g, -32601);
        failed |= ngx_http_agent_json_key(g, "message");
        failed |= ngx_http_agent_json_str(g, &s);
        failed |= yajl_gen_map_close(g);

    } else {
        if (YAJL_IS_OBJECT(result)) {
            ngx_str_set(&s, "accept");

        } else if (resolution
                   && ngx_http_agent_provider_get(resolution, "decision"))
        {
            ngx_str_set(&s, "decline");

        } else {
            ngx_str_set(&s, "cancel");
        }

        failed |= ngx_http_agent_json_key(g, "result");
        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "action");
        failed |= ngx_http_agent_json_str(g, &s);

        if (YAJL_IS_OBJECT(result)) {
            failed |= ngx_http_agent_json_key(g, "content");
            failed |= ngx_http_agent_provider_value(g, result);
        }

        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_map_close(g);

    return ngx_http_agent_json_result(g, failed, message);
}


/*
 * notifications/cancelled of the server for its question: it gave up
 * waiting (its own request timeout), and takes no answer any more; the
 * question is settled as the server's, and the call goes on
 */

static void
ngx_http_agent_mcp_call_withdrawn(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val params)
{
    yajl_gen   g;
    ngx_str_t  id;

    g = ngx_http_agent_json_gen(rpc->pool);

    if (g == NULL
        || !YAJL_IS_OBJECT(params)
        || ngx_http_agent_json_result(g,
               ngx_http_agent_provider_value(g,
                   ngx_http_agent_provider_get(params, "requestId")), &id)
           != NGX_OK
        || id.len != rpc->elicit_id.len
        || ngx_strncmp(id.data, rpc->elicit_id.data, id.len) != 0)
    {
        return;
    }

    ngx_log_error(NGX_LOG_INFO, &rpc->turn->log, 0,
                  "agent mcp \"%V\" gave up its question %V of call "
                  "\"%V\"", &rpc->server->name, &id, &rpc->call->id);

    ngx_http_agent_mcp_call_settle(rpc, "the server gave up its question");

    ngx_http_agent_mcp_rpc_clock(rpc, 1);
}


/*
 * The question is no longer the server's: the call ended with it
 * waiting, or the server gave it up.  Settled as the server's doing.
 */

static void
ngx_http_agent_mcp_call_settle(ngx_http_agent_mcp_rpc_t *rpc, char *reason)
{
    ngx_http_agent_turn_t     *t;
    ngx_http_agent_conv_t     *conv;
    ngx_http_agent_pending_t  *p;

    t = rpc->turn;

    rpc->eliciting = 0;
    t->elicitations--;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);
    p = conv ? ngx_http_agent_conv_pending_locked(conv, &rpc->call->id)
             : NULL;

    if (p && ngx_http_agent_pending_in_call(p)) {
        (void) ngx_http_agent_fsm_settle_locked(t->zone, conv, p,
                                          NGX_HTTP_AGENT_SETTLE_SERVER,
                                          reason);
    }

    ngx_http_agent_zone_unlock(t->zone);

    ngx_http_agent_tools_state(t, NGX_HTTP_AGENT_FSM_CALLS);
}


/*
 * A cancel: a question of the server waiting is answered "cancel" (the
 * server waits for that answer, whatever becomes of the call), then
 * notifications/cancelled for the call, each on a request that outlives
 * the turn; the answer being sent, if any, goes with the call
 */

void
ngx_http_agent_mcp_call_cancel(ngx_http_agent_call_t *call, char *reason)
{
    ngx_str_t                  message;
    ngx_http_agent_mcp_rpc_t  *rpc = call->mcp;

    ngx_http_agent_mcp_rpc_clock(rpc, 0);

    if (rpc->eliciting) {
        rpc->eliciting = 0;
        rpc->turn->elicitations--;

        if (ngx_http_agent_mcp_call_message(rpc, &rpc->elicit_id, NULL, NULL,
                                            &message)
            != NGX_OK
            || ngx_http_agent_mcp_rpc_post(rpc, &message) != NGX_OK)
        {
            ngx_log_error(NGX_LOG_WARN, &rpc->turn->log, 0,
                          "agent mcp \"%V\": the answer \"cancel\" to its "
                          "question could not be sent", &rpc->server->name);
        }
    }

    if (rpc->sub.sr) {
        ngx_http_agent_mcp_rpc_cancelled(rpc, reason);
    }

    if (rpc->reply && rpc->reply->sub.sr) {
        ngx_http_agent_tools_abort(rpc->reply->sub.sr);
        rpc->reply = NULL;
    }
}
