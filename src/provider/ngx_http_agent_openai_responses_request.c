/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_request.h"
#include "ngx_http_agent_openai_responses.h"


/*
 * The OpenAI Responses request rendered from the canonical log: the
 * system prompt as "instructions", each event an item of "input", and
 * an assistant message's provider_content, output items, sent back as
 * they came, but for what "store":false cannot take back.
 */


static ngx_uint_t ngx_http_agent_openai_responses_head(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_responses_tail(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_responses_user(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_responses_assistant(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_responses_message(
    ngx_http_agent_request_t *r, ngx_str_t *role, ngx_str_t *content);
static ngx_uint_t ngx_http_agent_openai_responses_ours(yajl_val items);
static ngx_uint_t ngx_http_agent_openai_responses_items(
    ngx_http_agent_request_t *r, yajl_val items, ngx_uint_t strip);
static ngx_uint_t ngx_http_agent_openai_responses_function(
    ngx_http_agent_request_t *r, yajl_val call);
static ngx_uint_t ngx_http_agent_openai_responses_output(
    ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_openai_responses_structured(
    ngx_http_agent_request_t *r);


static ngx_str_t  ngx_http_agent_user = ngx_string("user");
static ngx_str_t  ngx_http_agent_assistant = ngx_string("assistant");


/* a message or an item of "input" for each event the walk sends */
static ngx_http_agent_request_format_t
    ngx_http_agent_openai_responses_format =
{
    ngx_string("openai_responses"),
    ngx_http_agent_openai_responses_head,
    ngx_http_agent_openai_responses_tail,
    ngx_http_agent_openai_responses_user,
    ngx_http_agent_openai_responses_assistant,
    ngx_http_agent_openai_responses_output,
    ngx_http_agent_openai_responses_function,
    NULL,
    NULL,
    NULL,
    ngx_http_agent_openai_responses_structured,
    0,
    0
};


ngx_int_t
ngx_http_agent_openai_responses_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body)
{
    return ngx_http_agent_request_build(
                                     &ngx_http_agent_openai_responses_format,
                                     pool, agent, events, nevents, body);
}


/*
 * {"model","instructions","input":[...],"tools":[...],"store":false,
 *  "stream":true,"include":["reasoning.encrypted_content"]}
 */

static ngx_uint_t
ngx_http_agent_openai_responses_head(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed;

    failed = 0;

    if (r->agent->system.len) {
        failed |= ngx_http_agent_json_key(r->g, "instructions");
        failed |= ngx_http_agent_json_str(r->g, &r->agent->system);
    }

    failed |= ngx_http_agent_json_key(r->g, "input");
    failed |= yajl_gen_array_open(r->g);

    return failed;
}


/*
 * Without "store", a reasoning item goes back in later requests only with
 * its encrypted content, which the API sends only when "include" asks for
 * it.  It is asked for when the agent's options ask for reasoning (a
 * model that does not reason refuses both), unless they set "include"
 * themselves.
 */

static ngx_uint_t
ngx_http_agent_openai_responses_tail(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed;

    static ngx_str_t  encrypted = ngx_string("reasoning.encrypted_content");

    failed = ngx_http_agent_json_key(r->g, "store");
    failed |= yajl_gen_bool(r->g, 0);
    failed |= ngx_http_agent_json_key(r->g, "stream");
    failed |= yajl_gen_bool(r->g, 1);

    if (ngx_http_agent_provider_option(r->agent, "reasoning")
        && !ngx_http_agent_provider_option(r->agent, "include"))
    {
        failed |= ngx_http_agent_json_key(r->g, "include");
        failed |= yajl_gen_array_open(r->g);
        failed |= ngx_http_agent_json_str(r->g, &encrypted);
        failed |= yajl_gen_array_close(r->g);
    }

    return failed;
}


/*
 * "text":{"format":{"type":"json_schema","name","schema","strict":true}},
 * unless the agent's options set "text"
 */

static ngx_uint_t
ngx_http_agent_openai_responses_structured(ngx_http_agent_request_t *r)
{
    yajl_gen    g;
    ngx_uint_t  failed;

    g = r->g;

    failed = ngx_http_agent_request_no_tools(r);

    if (ngx_http_agent_provider_option(r->agent, "text")) {
        return failed;
    }

    failed |= ngx_http_agent_json_key(g, "text");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "format");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "json_schema");
    failed |= ngx_http_agent_request_schema(r);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    return failed;
}


static ngx_uint_t
ngx_http_agent_openai_responses_user(ngx_http_agent_request_t *r)
{
    ngx_str_t  content;

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(r->ev.event, "content"), &content)
        != NGX_OK)
    {
        ngx_str_set(&content, "");
    }

    return ngx_http_agent_openai_responses_message(r, &ngx_http_agent_user,
                                                   &content);
}


/*
 * The output items as the API returned them, when they were kept; else
 * a message with the text and a function_call item for each call.  A
 * partial reply is only its text, marked: its items are incomplete and
 * its calls were never run.
 */

static ngx_uint_t
ngx_http_agent_openai_responses_assistant(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed, ours;

    ours = ngx_http_agent_openai_responses_ours(r->ev.raw);

    if (ours) {
        return ngx_http_agent_openai_responses_items(r, r->ev.raw, ours == 2);
    }

    failed = 0;

    if (r->ev.text.len) {
        failed = ngx_http_agent_openai_responses_message(r,
                                                 &ngx_http_agent_assistant,
                                                 &r->ev.text);
    }

    return failed | ngx_http_agent_request_calls(r);
}


/* {"role":"user" or "assistant","content":"..."} */

static ngx_uint_t
ngx_http_agent_openai_responses_message(ngx_http_agent_request_t *r,
    ngx_str_t *role, ngx_str_t *content)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "role");
    failed |= ngx_http_agent_json_str(r->g, role);
    failed |= ngx_http_agent_json_key(r->g, "content");
    failed |= ngx_http_agent_json_str(r->g, content);
    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/*
 * Raw content this API can take back: output items, each a message,
 * a reasoning item or some call; 2 if a reasoning item has no encrypted
 * content.  Another adapter's content blocks (the agent changed
 * providers) are not: 0, and the reply is rebuilt from the log.
 */

static ngx_uint_t
ngx_http_agent_openai_responses_ours(yajl_val items)
{
    size_t      i;
    yajl_val    item, v;
    ngx_str_t   type;
    ngx_uint_t  rc;

    if (items == NULL) {
        return 0;
    }

    rc = 1;

    for (i = 0; i < items->u.array.len; i++) {
        item = items->u.array.values[i];
        v = ngx_http_agent_provider_get(item, "type");

        if (ngx_http_agent_provider_string(v, &type) != NGX_OK) {
            return 0;
        }

        if (ngx_http_agent_provider_is(v, "reasoning")) {
            if (!YAJL_IS_STRING(ngx_http_agent_provider_get(item,
                                                      "encrypted_content")))
            {
                rc = 2;
            }

        } else if (!ngx_http_agent_provider_is(v, "message")
                   && (type.len <= sizeof("_call") - 1
                       || ngx_strcmp(type.data + type.len
                                     - (sizeof("_call") - 1), "_call")
                          != 0))
        {
            return 0;
        }
    }

    return rc;
}


/*
 * The items as they came, but, with strip, a reasoning item without its
 * encrypted content, which the API cannot find without "store", and the
 * ids of the message and function_call items, which would name it.
 */

static ngx_uint_t
ngx_http_agent_openai_responses_items(ngx_http_agent_request_t *r,
    yajl_val items, ngx_uint_t strip)
{
    size_t      i, k;
    yajl_val    item, type;
    ngx_uint_t  failed;

    failed = 0;

    for (i = 0; i < items->u.array.len; i++) {
        item = items->u.array.values[i];
        type = ngx_http_agent_provider_get(item, "type");

        if (!strip
            || !(ngx_http_agent_provider_is(type, "reasoning")
                 || ngx_http_agent_provider_is(type, "message")
                 || ngx_http_agent_provider_is(type,
                                                       "function_call")))
        {
            failed |= ngx_http_agent_provider_value(r->g, item);
            continue;
        }

        if (ngx_http_agent_provider_is(type, "reasoning")) {
            if (YAJL_IS_STRING(ngx_http_agent_provider_get(item,
                                                      "encrypted_content")))
            {
                failed |= ngx_http_agent_provider_value(r->g, item);
            }

            continue;
        }

        failed |= yajl_gen_map_open(r->g);

        for (k = 0; !failed && k < item->u.object.len; k++) {
            if (ngx_strcmp(item->u.object.keys[k], "id") != 0) {
                failed = yajl_gen_string(r->g,
                                      (u_char *) item->u.object.keys[k],
                                      ngx_strlen(item->u.object.keys[k]));
                failed |= ngx_http_agent_provider_value(r->g,
                                                  item->u.object.values[k]);
            }
        }

        failed |= yajl_gen_map_close(r->g);
    }

    return failed;
}


/* {"type":"function_call","call_id","name","arguments":"{...}"} */

static ngx_uint_t
ngx_http_agent_openai_responses_function(ngx_http_agent_request_t *r,
    yajl_val call)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "type");
    failed |= ngx_http_agent_json_key(r->g, "function_call");
    failed |= ngx_http_agent_json_key(r->g, "call_id");
    failed |= ngx_http_agent_provider_value(r->g,
                                     ngx_http_agent_provider_get(call, "id"));
    failed |= ngx_http_agent_request_function(r, call);
    failed |= yajl_gen_map_close(r->g);

    return failed;
}


/* {"type":"function_call_output","call_id","output":"{\"ok\":true,...}"} */

static ngx_uint_t
ngx_http_agent_openai_responses_output(ngx_http_agent_request_t *r)
{
    yajl_val    id;
    ngx_uint_t  failed;

    id = ngx_http_agent_provider_get(r->ev.event, "tool_call_id");

    failed = yajl_gen_map_open(r->g);
    failed |= ngx_http_agent_json_key(r->g, "type");
    failed |= ngx_http_agent_json_key(r->g, "function_call_output");
    failed |= ngx_http_agent_json_key(r->g, "call_id");
    failed |= ngx_http_agent_provider_value(r->g, id);
    failed |= ngx_http_agent_json_key(r->g, "output");
    failed |= ngx_http_agent_json_str(r->g, &r->ev.text);
    failed |= yajl_gen_map_close(r->g);

    return failed;
}
