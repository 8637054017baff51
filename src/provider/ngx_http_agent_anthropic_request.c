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
#include "ngx_http_agent_request.h"
#include "ngx_http_agent_anthropic.h"


/*
 * The Anthropic Messages request rendered from the canonical log: the
 * system prompt as a field, messages alternating between the user and
 * the assistant, tool results as tool_result blocks of a user message,
 * and an assistant message's provider_content sent back as it came.
 */


#define NGX_HTTP_AGENT_ANTHROPIC_MAX_TOKENS  4096


static ngx_uint_t ngx_http_agent_anthropic_head(ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_open(ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_close(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_alone(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_cached(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_user(ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_assistant(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_tool_use(
    ngx_http_agent_request_t *r, yajl_val call);
static ngx_uint_t ngx_http_agent_anthropic_tool_result(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_tool_list(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_anthropic_structured(
    ngx_http_agent_request_t *r);


/*
 * The API wants the roles to alternate: the events of one side in a row
 * (the tool results of a batch, and the user message after them) make
 * one message.  A user message alone keeps its content a string.
 */
static ngx_http_agent_request_format_t  ngx_http_agent_anthropic_format = {
    ngx_string("anthropic_messages"),
    ngx_http_agent_anthropic_head,
    NULL,
    ngx_http_agent_anthropic_user,
    ngx_http_agent_anthropic_assistant,
    ngx_http_agent_anthropic_tool_result,
    ngx_http_agent_anthropic_tool_use,
    ngx_http_agent_anthropic_open,
    ngx_http_agent_anthropic_close,
    ngx_http_agent_anthropic_tool_list,
    ngx_http_agent_anthropic_structured,
    0,
    0
};


ngx_int_t
ngx_http_agent_anthropic_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body)
{
    return ngx_http_agent_request_build(&ngx_http_agent_anthropic_format,
                                        pool, agent, events, nevents, body);
}


/*
 * {"model","max_tokens","stream":true,"system","messages":[...],
 *  "tools":[...]}
 */

static ngx_uint_t
ngx_http_agent_anthropic_head(ngx_http_agent_request_t *r)
{
    yajl_gen           g;
    ngx_uint_t         failed;
    ngx_http_agent_t  *agent;

    g = r->g;
    agent = r->agent;

    failed = 0;

    if (!ngx_http_agent_provider_option(agent, "max_tokens")) {
        failed |= ngx_http_agent_json_key(g, "max_tokens");
        failed |= yajl_gen_integer(g, NGX_HTTP_AGENT_ANTHROPIC_MAX_TOKENS);
    }

    failed |= ngx_http_agent_json_key(g, "stream");
    failed |= yajl_gen_bool(g, 1);

    if (agent->system.len && (agent->cache & NGX_HTTP_AGENT_CACHE_SYSTEM)) {
        /* a breakpoint: the prompt up to its end is cached */
        failed |= ngx_http_agent_json_key(g, "system");
        failed |= yajl_gen_array_open(g);
        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "type");
        failed |= ngx_http_agent_json_key(g, "text");
        failed |= ngx_http_agent_json_key(g, "text");
        failed |= ngx_http_agent_json_str(g, &agent->system);
        failed |= ngx_http_agent_anthropic_cache_control(g);
        failed |= yajl_gen_map_close(g);
        failed |= yajl_gen_array_close(g);

    } else if (agent->system.len) {
        failed |= ngx_http_agent_json_key(g, "system");
        failed |= ngx_http_agent_json_str(g, &agent->system);
    }

    failed |= ngx_http_agent_json_key(g, "messages");
    failed |= yajl_gen_array_open(g);

    return failed;
}


/* {"role":R,"content":[ , or {"role":"user","content": for one alone */

static ngx_uint_t
ngx_http_agent_anthropic_open(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "role");

    if (r->ev.kind == NGX_HTTP_AGENT_REQUEST_ASSISTANT) {
        failed |= ngx_http_agent_json_key(r->g, "assistant");

    } else {
        failed |= ngx_http_agent_json_key(r->g, "user");
    }

    failed |= ngx_http_agent_json_key(r->g, "content");

    if (!ngx_http_agent_anthropic_alone(r)) {
        failed |= yajl_gen_array_open(r->g);
    }

    return failed;
}


static ngx_uint_t
ngx_http_agent_anthropic_close(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed;

    failed = 0;

    if (!ngx_http_agent_anthropic_alone(r)) {
        failed |= yajl_gen_array_close(r->g);
    }

    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/*
 * a user message with neither a tool result nor a message beside it, and
 * no cache breakpoint (the summary's is on its block)
 */

static ngx_uint_t
ngx_http_agent_anthropic_alone(ngx_http_agent_request_t *r)
{
    return r->first && r->last
           && r->ev.kind == NGX_HTTP_AGENT_REQUEST_USER
           && !ngx_http_agent_anthropic_cached(r);
}


/* the summary, with "cache summary": a breakpoint after it */

static ngx_uint_t
ngx_http_agent_anthropic_cached(ngx_http_agent_request_t *r)
{
    return r->ev.summary && (r->agent->cache & NGX_HTTP_AGENT_CACHE_SUMMARY);
}


/* a user_msg's content, a string: as it is alone, else as a text block */

static ngx_uint_t
ngx_http_agent_anthropic_user(ngx_http_agent_request_t *r)
{
    yajl_val    content;
    ngx_uint_t  failed;

    content = ngx_http_agent_provider_get(r->ev.event, "content");

    if (ngx_http_agent_anthropic_alone(r)) {
        return ngx_http_agent_provider_value(r->g, content);
    }

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "type");
    failed |= ngx_http_agent_json_key(r->g, "text");
    failed |= ngx_http_agent_json_key(r->g, "text");
    failed |= ngx_http_agent_provider_value(r->g, content);

    if (ngx_http_agent_anthropic_cached(r)) {
        failed |= ngx_http_agent_anthropic_cache_control(r->g);
    }

    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/*
 * The blocks of an assistant message: its provider_content as the API
 * returned it, or else its text and its tool calls as tool_use blocks.
 */

static ngx_uint_t
ngx_http_agent_anthropic_assistant(ngx_http_agent_request_t *r)
{
    size_t      i;
    yajl_val    raw;
    ngx_uint_t  failed;

    failed = 0;

    raw = r->ev.raw;

    if (raw) {
        for (i = 0; i < raw->u.array.len; i++) {
            failed |= ngx_http_agent_provider_value(r->g,
                                                    raw->u.array.values[i]);
        }

        return failed;
    }

    if (r->ev.text.len) {
        failed |= yajl_gen_map_open(r->g);
        failed |= ngx_http_agent_json_key(r->g, "type");
        failed |= ngx_http_agent_json_key(r->g, "text");
        failed |= ngx_http_agent_json_key(r->g, "text");
        failed |= ngx_http_agent_json_str(r->g, &r->ev.text);
        failed |= yajl_gen_map_close(r->g);
    }

    return failed | ngx_http_agent_request_calls(r);
}


/* {"type":"tool_use","id","name","input":{...}} */

static ngx_uint_t
ngx_http_agent_anthropic_tool_use(ngx_http_agent_request_t *r, yajl_val call)
{
    yajl_gen    g;
    yajl_val    args;
    ngx_uint_t  failed;

    g = r->g;
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
ngx_http_agent_anthropic_tool_result(ngx_http_agent_request_t *r)
{
    yajl_val    event;
    ngx_uint_t  failed;

    event = r->ev.event;

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "type");
    failed |= ngx_http_agent_json_key(r->g, "tool_result");
    failed |= ngx_http_agent_json_key(r->g, "tool_use_id");
    failed |= ngx_http_agent_provider_value(r->g,
                          ngx_http_agent_provider_get(event, "tool_call_id"));
    failed |= ngx_http_agent_json_key(r->g, "content");
    failed |= ngx_http_agent_json_str(r->g, &r->ev.text);
    failed |= ngx_http_agent_json_key(r->g, "is_error");
    failed |= yajl_gen_bool(r->g,
                  !YAJL_IS_TRUE(ngx_http_agent_provider_get(event, "ok")));
    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/*
 * The agent's tools, as rendered once; a turn that asks for structured
 * output adds a tool named after the output, with its schema as the
 * input schema, after them (a cache breakpoint on the agent's last tool
 * still covers them).
 */

static ngx_uint_t
ngx_http_agent_anthropic_tool_list(ngx_http_agent_request_t *r)
{
    yajl_gen    g;
    ngx_str_t   tools;
    ngx_uint_t  failed;

    g = r->g;
    tools = r->agent->provider_tools;

    if (r->output.name.len == 0) {
        if (r->agent->tools.nelts == 0) {
            return 0;
        }

        failed = ngx_http_agent_json_key(g, "tools");
        return failed | ngx_http_agent_json_verbatim(g, &tools);
    }

    failed = ngx_http_agent_json_key(g, "tools");
    failed |= yajl_gen_array_open(g);

    if (r->agent->tools.nelts && tools.len > 2) {
        /* the elements of the rendered array, spliced in as they are */
        tools.data++;
        tools.len -= 2;
        failed |= ngx_http_agent_json_verbatim(g, &tools);
    }

    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &r->output.name);
    failed |= ngx_http_agent_json_key(g, "input_schema");
    failed |= ngx_http_agent_json_verbatim(g, &r->output.schema);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_array_close(g);

    return failed;
}


/* the output's tool is forced: its input is the reply */

static ngx_uint_t
ngx_http_agent_anthropic_structured(ngx_http_agent_request_t *r)
{
    yajl_gen    g;
    ngx_uint_t  failed;

    g = r->g;

    if (ngx_http_agent_provider_option(r->agent, "tool_choice")) {
        return 0;
    }

    failed = ngx_http_agent_json_key(g, "tool_choice");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "tool");
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &r->output.name);
    failed |= yajl_gen_map_close(g);

    return failed;
}


/* "cache_control":{"type":"ephemeral"}, a member of the block it ends */

ngx_uint_t
ngx_http_agent_anthropic_cache_control(yajl_gen g)
{
    ngx_uint_t  failed;

    failed = ngx_http_agent_json_key(g, "cache_control");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "ephemeral");
    failed |= yajl_gen_map_close(g);

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
            ngx_http_agent_json_free(v);
        }

        failed = yajl_gen_map_open(g);
        return failed | yajl_gen_map_close(g);
    }

    failed = ngx_http_agent_provider_value(g, v);

    ngx_http_agent_json_free(v);

    return failed;
}
