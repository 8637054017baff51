
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_anthropic.h"


/*
 * The Anthropic Messages request rendered from the canonical log: the
 * system prompt as a field, messages alternating between the user and
 * the assistant, tool results as tool_result blocks of a user message,
 * and an assistant message's provider_content sent back as it came.
 */


#define NGX_HTTP_AGENT_ANTHROPIC_MAX_TOKENS  4096


/* the role of the message a canonical event belongs to */
typedef enum {
    NGX_HTTP_AGENT_ANTHROPIC_NONE = 0,
    NGX_HTTP_AGENT_ANTHROPIC_USER,
    NGX_HTTP_AGENT_ANTHROPIC_ASSISTANT
} ngx_http_agent_anthropic_role_e;


typedef struct {
    ngx_pool_t                 *pool;
    yajl_gen                    g;
    /* for JSON that goes inside a string: tool results */
    yajl_gen                    sub;
    /* the message open in g */
    ngx_uint_t                  role;
    /* a user message held back: a string alone, or a block of the next */
    yajl_val                    held;
} ngx_http_agent_anthropic_build_t;


static ngx_uint_t ngx_http_agent_anthropic_message(
    ngx_http_agent_anthropic_build_t *b, yajl_val event, ngx_uint_t role);
static ngx_uint_t ngx_http_agent_anthropic_open(
    ngx_http_agent_anthropic_build_t *b, ngx_uint_t role);
static ngx_uint_t ngx_http_agent_anthropic_close(
    ngx_http_agent_anthropic_build_t *b);
static ngx_uint_t ngx_http_agent_anthropic_held(
    ngx_http_agent_anthropic_build_t *b);
static ngx_uint_t ngx_http_agent_anthropic_role(yajl_val event);
static ngx_uint_t ngx_http_agent_anthropic_user(
    ngx_http_agent_anthropic_build_t *b, yajl_val event);
static ngx_uint_t ngx_http_agent_anthropic_assistant(
    ngx_http_agent_anthropic_build_t *b, yajl_val event);
static yajl_val ngx_http_agent_anthropic_provider_content(yajl_val event);
static ngx_uint_t ngx_http_agent_anthropic_tool_use(yajl_gen g,
    yajl_val call);
static ngx_uint_t ngx_http_agent_anthropic_tool_result(
    ngx_http_agent_anthropic_build_t *b, yajl_val event);


/*
 * {"model","max_tokens","stream":true,"system","messages":[...],
 *  "tools":[...]}
 *
 * The API wants the roles to alternate: events of one role in a row
 * (the tool results of a batch, and the user message after them) make
 * one message.  A user message alone keeps its content a string.
 */

ngx_int_t
ngx_http_agent_anthropic_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body)
{
    yajl_gen                           g;
    yajl_val                           event;
    ngx_uint_t                         i, role, failed;
    ngx_http_agent_bytes_t             scratch;
    ngx_http_agent_anthropic_build_t   b;

    ngx_memzero(&b, sizeof(ngx_http_agent_anthropic_build_t));

    b.pool = pool;
    b.g = ngx_http_agent_json_gen(pool);
    b.sub = ngx_http_agent_json_gen(pool);

    if (b.g == NULL || b.sub == NULL) {
        return NGX_ERROR;
    }

    g = b.g;

    ngx_memzero(&scratch, sizeof(ngx_http_agent_bytes_t));

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "model");
    failed |= ngx_http_agent_json_str(g, &agent->model);
    if (!ngx_http_agent_provider_option(agent, "max_tokens")) {
        failed |= ngx_http_agent_json_key(g, "max_tokens");
        failed |= yajl_gen_integer(g, NGX_HTTP_AGENT_ANTHROPIC_MAX_TOKENS);
    }
    failed |= ngx_http_agent_json_key(g, "stream");
    failed |= yajl_gen_bool(g, 1);

    if (agent->system.len) {
        failed |= ngx_http_agent_json_key(g, "system");
        failed |= ngx_http_agent_json_str(g, &agent->system);
    }

    failed |= ngx_http_agent_json_key(g, "messages");
    failed |= yajl_gen_array_open(g);

    for (i = 0; i < nevents; i++) {
        event = ngx_http_agent_provider_event(pool, &scratch, &events[i]);
        if (event == NULL) {
            if (b.held) {
                yajl_tree_free(b.held);
            }

            return NGX_ERROR;
        }

        role = ngx_http_agent_anthropic_role(event);

        if (role == NGX_HTTP_AGENT_ANTHROPIC_NONE) {
            yajl_tree_free(event);
            continue;
        }

        failed |= ngx_http_agent_anthropic_message(&b, event, role);

        if (event != b.held) {
            yajl_tree_free(event);
        }
    }

    failed |= ngx_http_agent_anthropic_held(&b);
    failed |= ngx_http_agent_anthropic_close(&b);

    failed |= yajl_gen_array_close(g);

    if (agent->tools.nelts) {
        failed |= ngx_http_agent_json_key(g, "tools");
        failed |= ngx_http_agent_json_verbatim(g, &agent->provider_tools);
    }

    failed |= ngx_http_agent_provider_options(g, agent);
    failed |= yajl_gen_map_close(g);

    if (scratch.data) {
        ngx_pfree(pool, scratch.data);
    }

    if (ngx_http_agent_json_result(g, failed, body) != NGX_OK) {
        /* out of memory, or a value nested deeper than yajl allows */
        ngx_log_error(NGX_LOG_ERR, pool->log, 0,
                      "anthropic_messages request could not be rendered");
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * An event into the message of its role.  A user message that starts a
 * message is held back until the next event says whether it is alone:
 * then b->held is the event, and the caller does not free it.
 */

static ngx_uint_t
ngx_http_agent_anthropic_message(ngx_http_agent_anthropic_build_t *b,
    yajl_val event, ngx_uint_t role)
{
    ngx_uint_t  failed;

    failed = 0;

    if (b->held) {
        if (role == NGX_HTTP_AGENT_ANTHROPIC_USER) {
            failed |= ngx_http_agent_anthropic_open(b, role);
            failed |= ngx_http_agent_anthropic_user(b, b->held);

            yajl_tree_free(b->held);
            b->held = NULL;

        } else {
            failed |= ngx_http_agent_anthropic_held(b);
        }
    }

    if (role != b->role) {
        failed |= ngx_http_agent_anthropic_close(b);

        if (ngx_http_agent_provider_is(
                ngx_http_agent_provider_get(event, "type"), "user_msg"))
        {
            b->held = event;
            return failed;
        }

        failed |= ngx_http_agent_anthropic_open(b, role);
    }

    if (role == NGX_HTTP_AGENT_ANTHROPIC_ASSISTANT) {
        return failed | ngx_http_agent_anthropic_assistant(b, event);
    }

    if (ngx_http_agent_provider_is(ngx_http_agent_provider_get(event,
                                                                "type"),
                                    "tool_result"))
    {
        return failed | ngx_http_agent_anthropic_tool_result(b, event);
    }

    return failed | ngx_http_agent_anthropic_user(b, event);
}


/* {"role":R,"content":[ */

static ngx_uint_t
ngx_http_agent_anthropic_open(ngx_http_agent_anthropic_build_t *b,
    ngx_uint_t role)
{
    ngx_uint_t  failed;

    b->role = role;

    failed = yajl_gen_map_open(b->g);
    failed |= ngx_http_agent_json_key(b->g, "role");

    if (role == NGX_HTTP_AGENT_ANTHROPIC_USER) {
        failed |= ngx_http_agent_json_key(b->g, "user");

    } else {
        failed |= ngx_http_agent_json_key(b->g, "assistant");
    }

    failed |= ngx_http_agent_json_key(b->g, "content");
    failed |= yajl_gen_array_open(b->g);

    return failed;
}


static ngx_uint_t
ngx_http_agent_anthropic_close(ngx_http_agent_anthropic_build_t *b)
{
    ngx_uint_t  failed;

    if (b->role == NGX_HTTP_AGENT_ANTHROPIC_NONE) {
        return 0;
    }

    b->role = NGX_HTTP_AGENT_ANTHROPIC_NONE;

    failed = yajl_gen_array_close(b->g);
    failed |= yajl_gen_map_close(b->g);

    return failed;
}


/* the user message held back, alone: {"role":"user","content":"..."} */

static ngx_uint_t
ngx_http_agent_anthropic_held(ngx_http_agent_anthropic_build_t *b)
{
    ngx_uint_t  failed;

    if (b->held == NULL) {
        return 0;
    }

    failed = yajl_gen_map_open(b->g);
    failed |= ngx_http_agent_json_key(b->g, "role");
    failed |= ngx_http_agent_json_key(b->g, "user");
    failed |= ngx_http_agent_json_key(b->g, "content");
    failed |= ngx_http_agent_provider_value(b->g,
                           ngx_http_agent_provider_get(b->held, "content"));
    failed |= yajl_gen_map_close(b->g);

    yajl_tree_free(b->held);
    b->held = NULL;

    return failed;
}


/*
 * The role of the message a canonical event goes into, or none: tool
 * calls are in their assistant message, a hosted tool's result in the
 * provider_content of its, and an assistant message with nothing to say
 * is not sent, since the API refuses an empty one.
 */

static ngx_uint_t
ngx_http_agent_anthropic_role(yajl_val event)
{
    yajl_val   type, v;
    ngx_str_t  content;

    type = ngx_http_agent_provider_get(event, "type");

    if (ngx_http_agent_provider_is(type, "user_msg")) {
        return NGX_HTTP_AGENT_ANTHROPIC_USER;
    }

    if (ngx_http_agent_provider_is(type, "tool_result")) {
        if (YAJL_IS_TRUE(ngx_http_agent_provider_get(event,
                                                     "provider_executed")))
        {
            return NGX_HTTP_AGENT_ANTHROPIC_NONE;
        }

        return NGX_HTTP_AGENT_ANTHROPIC_USER;
    }

    if (!ngx_http_agent_provider_is(type, "assistant_msg")) {
        return NGX_HTTP_AGENT_ANTHROPIC_NONE;
    }

    /* its kept blocks, or its text: a partial message always says so */
    if (ngx_http_agent_anthropic_provider_content(event)
        || ngx_http_agent_provider_partial(event))
    {
        return NGX_HTTP_AGENT_ANTHROPIC_ASSISTANT;
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(event, "content"), &content)
        == NGX_OK
        && content.len)
    {
        return NGX_HTTP_AGENT_ANTHROPIC_ASSISTANT;
    }

    v = ngx_http_agent_provider_get(event, "tool_calls");

    if (YAJL_IS_ARRAY(v) && v->u.array.len) {
        return NGX_HTTP_AGENT_ANTHROPIC_ASSISTANT;
    }

    return NGX_HTTP_AGENT_ANTHROPIC_NONE;
}


/* a user_msg in a message of blocks: its content, a string, as text */

static ngx_uint_t
ngx_http_agent_anthropic_user(ngx_http_agent_anthropic_build_t *b,
    yajl_val event)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(b->g);
    failed |= ngx_http_agent_json_key(b->g, "type");
    failed |= ngx_http_agent_json_key(b->g, "text");
    failed |= ngx_http_agent_json_key(b->g, "text");
    failed |= ngx_http_agent_provider_value(b->g,
                              ngx_http_agent_provider_get(event, "content"));
    failed |= yajl_gen_map_close(b->g);

    return failed;
}


/*
 * The blocks of an assistant message: its provider_content as the API
 * returned it, or else its text and its tool calls as tool_use blocks.
 */

static ngx_uint_t
ngx_http_agent_anthropic_assistant(ngx_http_agent_anthropic_build_t *b,
    yajl_val event)
{
    size_t      i;
    yajl_val    raw, calls;
    ngx_int_t   partial;
    ngx_str_t   content;
    ngx_uint_t  failed;

    failed = 0;

    raw = ngx_http_agent_anthropic_provider_content(event);

    if (raw) {
        for (i = 0; i < raw->u.array.len; i++) {
            failed |= ngx_http_agent_provider_value(b->g,
                                                    raw->u.array.values[i]);
        }

        return failed;
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(event, "content"), &content)
        != NGX_OK)
    {
        ngx_str_set(&content, "");
    }

    partial = ngx_http_agent_provider_mark(b->pool, event, &content);

    if (partial == NGX_ERROR) {
        return 1;
    }

    if (content.len) {
        failed |= yajl_gen_map_open(b->g);
        failed |= ngx_http_agent_json_key(b->g, "type");
        failed |= ngx_http_agent_json_key(b->g, "text");
        failed |= ngx_http_agent_json_key(b->g, "text");
        failed |= ngx_http_agent_json_str(b->g, &content);
        failed |= yajl_gen_map_close(b->g);
    }

    /* a partial message has no calls; never send calls unanswered */
    if (partial == NGX_OK) {
        return failed;
    }

    calls = ngx_http_agent_provider_get(event, "tool_calls");

    if (YAJL_IS_ARRAY(calls)) {
        for (i = 0; i < calls->u.array.len; i++) {
            failed |= ngx_http_agent_anthropic_tool_use(b->g,
                                                  calls->u.array.values[i]);
        }
    }

    return failed;
}


/*
 * The provider_content of a complete assistant message, a non-empty
 * array; NULL for a partial message, whose blocks may be cut short.
 */

static yajl_val
ngx_http_agent_anthropic_provider_content(yajl_val event)
{
    yajl_val  v, status;

    status = ngx_http_agent_provider_get(event, "status");

    if (status && !ngx_http_agent_provider_is(status, "complete")) {
        return NULL;
    }

    v = ngx_http_agent_provider_get(event, "provider_content");

    if (!YAJL_IS_ARRAY(v) || v->u.array.len == 0) {
        return NULL;
    }

    return v;
}


/* {"type":"tool_use","id","name","input":{...}} */

static ngx_uint_t
ngx_http_agent_anthropic_tool_use(yajl_gen g, yajl_val call)
{
    yajl_val    args;
    ngx_uint_t  failed;

    args = ngx_http_agent_provider_get(call, "arguments");

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "tool_use");
    failed |= ngx_http_agent_json_key(g, "id");
    failed |= ngx_http_agent_provider_value(g,
                                     ngx_http_agent_provider_get(call, "id"));
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_provider_value(g,
                                   ngx_http_agent_provider_get(call, "name"));
    failed |= ngx_http_agent_json_key(g, "input");

    /* the log keeps the arguments as the model sent them, a JSON text */
    if (YAJL_IS_STRING(args)) {
        failed |= ngx_http_agent_anthropic_input(g, (u_char *) args->u.string);

    } else if (YAJL_IS_OBJECT(args)) {
        failed |= ngx_http_agent_provider_value(g, args);

    } else {
        failed |= ngx_http_agent_anthropic_input(g, (u_char *) "");
    }

    failed |= yajl_gen_map_close(g);

    return failed;
}


/*
 * {"type":"tool_result","tool_use_id","content":"{\"ok\":true,...}",
 *  "is_error":false}
 */

static ngx_uint_t
ngx_http_agent_anthropic_tool_result(ngx_http_agent_anthropic_build_t *b,
    yajl_val event)
{
    ngx_str_t   text;
    ngx_uint_t  failed;

    if (ngx_http_agent_provider_result(b->sub, event, &text) != NGX_OK) {
        return 1;
    }

    failed = yajl_gen_map_open(b->g);
    failed |= ngx_http_agent_json_key(b->g, "type");
    failed |= ngx_http_agent_json_key(b->g, "tool_result");
    failed |= ngx_http_agent_json_key(b->g, "tool_use_id");
    failed |= ngx_http_agent_provider_value(b->g,
                          ngx_http_agent_provider_get(event, "tool_call_id"));
    failed |= ngx_http_agent_json_key(b->g, "content");
    failed |= ngx_http_agent_json_str(b->g, &text);
    failed |= ngx_http_agent_json_key(b->g, "is_error");
    failed |= yajl_gen_bool(b->g,
                  !YAJL_IS_TRUE(ngx_http_agent_provider_get(event, "ok")));
    failed |= yajl_gen_map_close(b->g);

    return failed;
}


/*
 * A tool's input, a NUL-terminated JSON text, as the object the API
 * wants: {} for arguments that are not one (the call's result says why)
 */

ngx_uint_t
ngx_http_agent_anthropic_input(yajl_gen g, u_char *json)
{
    char        err[NGX_HTTP_AGENT_JSON_ERR];
    yajl_val    v;
    ngx_uint_t  failed;

    v = (*json == '\0') ? NULL
        : ngx_http_agent_json_parse(json, ngx_strlen(json),
                                    NGX_HTTP_AGENT_JSON_DEPTH, err,
                                    sizeof(err));

    if (!YAJL_IS_OBJECT(v)) {
        if (v) {
            yajl_tree_free(v);
        }

        failed = yajl_gen_map_open(g);
        return failed | yajl_gen_map_close(g);
    }

    failed = ngx_http_agent_provider_value(g, v);

    yajl_tree_free(v);

    return failed;
}


