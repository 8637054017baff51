
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The AI SDK's UI message stream (protocol v1, the "ai" package 5.x): one
 * turn as one assistant message.  "start", then per model call a step
 * ("start-step" ... "finish-step") with its text and reasoning blocks
 * and its tool calls' input and output, then "finish" and "data: [DONE]"
 * when the turn ends or waits for input; a failed turn ends with an
 * "error" chunk, a cancelled one with "abort".  Events of the log and
 * live ones are read as they are, so the engine's order, resume and
 * fan-out hold.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_events_sub.h"


#define NGX_HTTP_AGENT_AISDK_ID_LEN  64


typedef struct {
    yajl_gen                     g;
    ngx_uint_t                   failed;

    ngx_uint_t                   turn;       /* the turn streamed */

    /* the model call of the open step */
    u_char                       message_id[NGX_HTTP_AGENT_AISDK_ID_LEN];
    size_t                       message_id_len;

    size_t                       text;       /* bytes of it sent */
    size_t                       thinking;

    unsigned                     started:1;
    unsigned                     step:1;
    unsigned                     text_open:1;
    unsigned                     reasoning_open:1;
} ngx_http_agent_aisdk_t;


static ngx_int_t ngx_http_agent_aisdk_header(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_aisdk_init(ngx_http_agent_events_sub_t *sub);
static size_t ngx_http_agent_aisdk_size(ngx_http_agent_event_t *ev);
static ngx_int_t ngx_http_agent_aisdk_frame(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_event_t *ev, size_t off, size_t len,
    ngx_uint_t last);
static size_t ngx_http_agent_aisdk_partial_size(size_t len);
static ngx_int_t ngx_http_agent_aisdk_partial(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv);

static ngx_int_t ngx_http_agent_aisdk_event(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_uint_t type, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_delta(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_uint_t reasoning, ngx_str_t *delta);
static ngx_int_t ngx_http_agent_aisdk_assistant(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_tool_call(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_tool_result(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_progress(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_end(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_uint_t type, yajl_val root);

static ngx_int_t ngx_http_agent_aisdk_start(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b);
static ngx_int_t ngx_http_agent_aisdk_step(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_str_t *message_id);
static ngx_int_t ngx_http_agent_aisdk_close_blocks(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_uint_t text, ngx_uint_t reasoning);
static ngx_int_t ngx_http_agent_aisdk_block(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, char *type, ngx_uint_t reasoning, ngx_str_t *delta);
static ngx_int_t ngx_http_agent_aisdk_simple(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, char *type);
static void ngx_http_agent_aisdk_open(ngx_http_agent_aisdk_t *a, char *type);
static ngx_int_t ngx_http_agent_aisdk_close(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b);
static void ngx_http_agent_aisdk_value(ngx_http_agent_aisdk_t *a,
    yajl_val v);
static ngx_int_t ngx_http_agent_aisdk_get(yajl_val root, char *key,
    ngx_str_t *s);
static ngx_uint_t ngx_http_agent_aisdk_true(yajl_val root, char *key);


ngx_http_agent_events_format_t  ngx_http_agent_format_aisdk = {
    ngx_string("aisdk"),
    ngx_http_agent_aisdk_header,
    ngx_http_agent_aisdk_init,
    ngx_http_agent_aisdk_size,
    ngx_http_agent_aisdk_frame,
    ngx_http_agent_aisdk_partial_size,
    ngx_http_agent_aisdk_partial,
    0,
    NULL
};


static u_char  ngx_http_agent_aisdk_done[] = "data: [DONE]\n\n";


static ngx_int_t
ngx_http_agent_aisdk_header(ngx_http_request_t *r)
{
    return ngx_http_agent_events_header_add(r,
                                            "x-vercel-ai-ui-message-stream",
                                            "v1");
}


static ngx_int_t
ngx_http_agent_aisdk_init(ngx_http_agent_events_sub_t *sub)
{
    ngx_http_agent_aisdk_t  *a;

    a = ngx_pcalloc(sub->request->pool, sizeof(ngx_http_agent_aisdk_t));
    if (a == NULL) {
        return NGX_ERROR;
    }

    a->g = ngx_http_agent_json_gen(sub->request->pool);
    if (a->g == NULL) {
        return NGX_ERROR;
    }

    sub->format_ctx = a;

    return NGX_OK;
}


/*
 * A chunk takes a string of the event at most twice (a call's id and
 * name, in its input's start and end), never escaped more than in the
 * event; then the chunks' own members and the end of a step and turn.
 */

static size_t
ngx_http_agent_aisdk_size(ngx_http_agent_event_t *ev)
{
    return 2 * ev->len + 1024;
}


static ngx_int_t
ngx_http_agent_aisdk_frame(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_event_t *ev, size_t off, size_t len, ngx_uint_t last)
{
    char       errbuf[NGX_HTTP_AGENT_JSON_ERR];
    ngx_int_t  rc;
    yajl_val   root;

    if (sub->last) {
        return NGX_OK;
    }

    root = ngx_http_agent_json_parse(ev->data, ev->len,
                                     NGX_HTTP_AGENT_JSON_LOG_DEPTH, errbuf,
                                     sizeof(errbuf));
    if (root == NULL) {
        ngx_log_error(NGX_LOG_ALERT, sub->request->connection->log, 0,
                      "agent events: an event of \"%V\" does not parse: %s",
                      &sub->id, errbuf);
        return NGX_ERROR;
    }

    rc = ngx_http_agent_aisdk_event(sub, b, ev->type, root);

    yajl_tree_free(root);

    return rc;
}


static ngx_int_t
ngx_http_agent_aisdk_event(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_uint_t type, yajl_val root)
{
    ngx_str_t                s;
    ngx_http_agent_aisdk_t  *a;
    const char              *turn_path[] = { "turn", NULL };
    yajl_val                 v;

    a = sub->format_ctx;

    v = yajl_tree_get(root, turn_path, yajl_t_number);

    if (v && YAJL_IS_INTEGER(v)) {
        if (a->turn == 0) {
            a->turn = (ngx_uint_t) YAJL_GET_INTEGER(v);

        } else if ((ngx_uint_t) YAJL_GET_INTEGER(v) != a->turn) {
            /* another turn's: this stream is one turn's reply */
            return NGX_OK;
        }
    }

    switch (type) {

    case NGX_HTTP_AGENT_EV_TEXT_DELTA:
    case NGX_HTTP_AGENT_EV_THINKING_DELTA:

        if (ngx_http_agent_aisdk_get(root, "message_id", &s) != NGX_OK
            || ngx_http_agent_aisdk_step(a, b, &s) != NGX_OK
            || ngx_http_agent_aisdk_get(root, "delta", &s) != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_agent_aisdk_delta(a, b,
                   type == NGX_HTTP_AGENT_EV_THINKING_DELTA, &s);

    case NGX_HTTP_AGENT_EV_ASSISTANT_MSG:
        return ngx_http_agent_aisdk_assistant(a, b, root);

    case NGX_HTTP_AGENT_EV_TOOL_CALL:
        return ngx_http_agent_aisdk_tool_call(a, b, root);

    case NGX_HTTP_AGENT_EV_TOOL_RESULT:
        return ngx_http_agent_aisdk_tool_result(a, b, root);

    case NGX_HTTP_AGENT_EV_TOOL_PROGRESS:
        return ngx_http_agent_aisdk_progress(a, b, root);

    case NGX_HTTP_AGENT_EV_STATE_CHANGED:

        /* calls wait for the browser or a person: this reply ends here */

        if (ngx_http_agent_aisdk_get(root, "to", &s) == NGX_OK
            && s.len == sizeof("awaiting_input") - 1
            && ngx_strncmp(s.data, "awaiting_input", s.len) == 0)
        {
            return ngx_http_agent_aisdk_end(sub, b, type, root);
        }

        return NGX_OK;

    case NGX_HTTP_AGENT_EV_TURN_COMPLETED:
    case NGX_HTTP_AGENT_EV_TURN_FAILED:
    case NGX_HTTP_AGENT_EV_CANCELLED:
        return ngx_http_agent_aisdk_end(sub, b, type, root);

    default:
        /*
         * the user's message is the client's own; tool_call_delta has no
         * call id yet (the call's input comes whole with its tool_call)
         */
        return NGX_OK;
    }
}


/* text and reasoning as they stream; a block opens with its first delta */

static ngx_int_t
ngx_http_agent_aisdk_delta(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    ngx_uint_t reasoning, ngx_str_t *delta)
{
    if (reasoning) {
        if (ngx_http_agent_aisdk_close_blocks(a, b, 1, 0) != NGX_OK) {
            return NGX_ERROR;
        }

        if (!a->reasoning_open) {
            if (ngx_http_agent_aisdk_block(a, b, "reasoning-start", 1, NULL)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            a->reasoning_open = 1;
        }

        a->thinking += delta->len;

        return ngx_http_agent_aisdk_block(a, b, "reasoning-delta", 1, delta);
    }

    if (ngx_http_agent_aisdk_close_blocks(a, b, 0, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!a->text_open) {
        if (ngx_http_agent_aisdk_block(a, b, "text-start", 0, NULL)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        a->text_open = 1;
    }

    a->text += delta->len;

    return ngx_http_agent_aisdk_block(a, b, "text-delta", 0, delta);
}


/*
 * The model call's reply, logged: it closes its blocks, or, for a
 * subscriber that got none of its deltas (one that came later), brings
 * its reasoning and text whole.
 */

static ngx_int_t
ngx_http_agent_aisdk_assistant(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t  s;

    if (ngx_http_agent_aisdk_get(root, "message_id", &s) != NGX_OK
        || ngx_http_agent_aisdk_step(a, b, &s) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (a->thinking == 0
        && ngx_http_agent_aisdk_get(root, "thinking", &s) == NGX_OK
        && s.len)
    {
        if (ngx_http_agent_aisdk_delta(a, b, 1, &s) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (a->text == 0
        && ngx_http_agent_aisdk_get(root, "content", &s) == NGX_OK
        && s.len)
    {
        if (ngx_http_agent_aisdk_delta(a, b, 0, &s) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return ngx_http_agent_aisdk_close_blocks(a, b, 1, 1);
}


static ngx_int_t
ngx_http_agent_aisdk_tool_call(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    char        errbuf[NGX_HTTP_AGENT_JSON_ERR];
    ngx_str_t   id, name, args;
    yajl_val    input;
    ngx_uint_t  provider;

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "name", &name) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "arguments", &args) != NGX_OK
        || ngx_http_agent_aisdk_step(a, b, NULL) != NGX_OK)
    {
        return NGX_ERROR;
    }

    provider = ngx_http_agent_aisdk_true(root, "provider_executed");

    ngx_http_agent_aisdk_open(a, "tool-input-start");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, &id);
    a->failed |= ngx_http_agent_json_key(a->g, "toolName");
    a->failed |= ngx_http_agent_json_str(a->g, &name);

    if (provider) {
        a->failed |= ngx_http_agent_json_key(a->g, "providerExecuted");
        a->failed |= yajl_gen_bool(a->g, 1);
    }

    if (ngx_http_agent_aisdk_close(a, b) != NGX_OK) {
        return NGX_ERROR;
    }

    /* arguments cut off by a failed reply go as the text they are */

    input = ngx_http_agent_json_parse(args.data, args.len,
                                      NGX_HTTP_AGENT_JSON_LOG_DEPTH, errbuf,
                                      sizeof(errbuf));

    ngx_http_agent_aisdk_open(a, "tool-input-available");
    a->failed |= ngx_http_agent_json_key(a->g, "toolCallId");
    a->failed |= ngx_http_agent_json_str(a->g, &id);
    a->failed |= ngx_http_agent_json_key(a->g, "toolName");
    a->failed |= ngx_http_agent_json_str(a->g, &name);
    a->failed |= ngx_http_agent_json_key(a->g, "input");

    if (input) {
        ngx_http_agent_aisdk_value(a, input);
        yajl_tree_free(input);

    } else {
        a->failed |= ngx_http_agent_json_str(a->g, &args);
    }

    if (provider) {
        a->failed |= ngx_http_agent_json_key(a->g, "providerExecuted");
        a->failed |= yajl_gen_bool(a->g, 1);
    }

    return ngx_http_agent_aisdk_close(a, b);
}


static ngx_int_t
ngx_http_agent_aisdk_tool_result(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t    id, error;
    yajl_val     result;
    const char  *result_path[] = { "result", NULL };

    if (ngx_http_agent_aisdk_get(root, "tool_call_id", &id) != NGX_OK) {
        return NGX_ERROR;
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

static ngx_int_t
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


/*
 * The turn ended or waits: the open step ends, then the message, with
 * an error chunk for a failed turn and "abort" for a cancelled one, and
 * the stream with [DONE].
 */

static ngx_int_t
ngx_http_agent_aisdk_end(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_uint_t type, yajl_val root)
{
    u_char                  *p;
    ngx_str_t                reason, error, text;
    ngx_http_agent_aisdk_t  *a;

    a = sub->format_ctx;

    if (ngx_http_agent_aisdk_start(a, b) != NGX_OK
        || ngx_http_agent_aisdk_close_blocks(a, b, 1, 1) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (type == NGX_HTTP_AGENT_EV_TURN_FAILED) {

        if (ngx_http_agent_aisdk_get(root, "reason", &reason) != NGX_OK) {
            ngx_str_set(&reason, "the turn failed");
        }

        text = reason;

        if (ngx_http_agent_aisdk_get(root, "error", &error) == NGX_OK
            && error.len)
        {
            text.data = ngx_alloc(reason.len + 2 + error.len,
                                  sub->request->connection->log);
            if (text.data == NULL) {
                return NGX_ERROR;
            }

            p = ngx_cpymem(text.data, reason.data, reason.len);
            p = ngx_cpymem(p, ": ", 2);
            p = ngx_cpymem(p, error.data, error.len);
            text.len = p - text.data;
        }

        ngx_http_agent_aisdk_open(a, "error");
        a->failed |= ngx_http_agent_json_key(a->g, "errorText");
        a->failed |= ngx_http_agent_json_str(a->g, &text);

        if (text.data != reason.data) {
            ngx_free(text.data);
        }

        if (ngx_http_agent_aisdk_close(a, b) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (a->step) {
        if (ngx_http_agent_aisdk_simple(a, b, "finish-step") != NGX_OK) {
            return NGX_ERROR;
        }

        a->step = 0;
    }

    if (type == NGX_HTTP_AGENT_EV_CANCELLED) {
        if (ngx_http_agent_aisdk_simple(a, b, "abort") != NGX_OK) {
            return NGX_ERROR;
        }

    } else {
        ngx_http_agent_aisdk_open(a, "finish");
        a->failed |= ngx_http_agent_json_key(a->g, "finishReason");

        if (type == NGX_HTTP_AGENT_EV_TURN_FAILED) {
            a->failed |= ngx_http_agent_json_key(a->g, "error");

        } else if (type == NGX_HTTP_AGENT_EV_STATE_CHANGED) {
            a->failed |= ngx_http_agent_json_key(a->g, "tool-calls");

        } else {
            a->failed |= ngx_http_agent_json_key(a->g, "stop");
        }

        if (ngx_http_agent_aisdk_close(a, b) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if ((size_t) (b->end - b->last) < sizeof(ngx_http_agent_aisdk_done) - 1) {
        return NGX_ERROR;
    }

    b->last = ngx_cpymem(b->last, ngx_http_agent_aisdk_done,
                         sizeof(ngx_http_agent_aisdk_done) - 1);

    sub->last = 1;

    return NGX_OK;
}


/*
 * 2 bytes of JSON at most for each byte of the reply so far, as for an
 * event, and the chunks around it
 */

static size_t
ngx_http_agent_aisdk_partial_size(size_t len)
{
    return 2 * len + 1024;
}


/*
 * The reply so far, for a subscriber that came in while it streamed or
 * missed deltas: what it has not been sent of the reasoning and the
 * text, as deltas of the blocks the deltas after it go on.
 */

static ngx_int_t
ngx_http_agent_aisdk_partial(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv)
{
    char                     errbuf[NGX_HTTP_AGENT_JSON_ERR];
    u_char                  *json, *p;
    ngx_int_t                rc;
    ngx_str_t                id, s;
    yajl_val                 root;
    ngx_http_agent_aisdk_t  *a;

    a = sub->format_ctx;

    json = ngx_alloc(ngx_http_agent_partial_size_locked(conv) + 3,
                     sub->request->connection->log);
    if (json == NULL) {
        return NGX_ERROR;
    }

    p = json;
    *p++ = '{';
    p = ngx_http_agent_partial_json_locked(conv, p);
    *p++ = '}';
    *p = '\0';

    root = ngx_http_agent_json_parse(json, p - json,
                                     NGX_HTTP_AGENT_JSON_LOG_DEPTH, errbuf,
                                     sizeof(errbuf));
    ngx_free(json);

    if (root == NULL) {
        return NGX_ERROR;
    }

    rc = NGX_OK;

    if (a->turn == 0) {
        a->turn = conv->turn;
    }

    if (ngx_http_agent_aisdk_get(root, "message_id", &id) != NGX_OK
        || ngx_http_agent_aisdk_step(a, b, &id) != NGX_OK)
    {
        rc = NGX_ERROR;
        goto done;
    }

    if (!a->text_open && a->text == 0
        && ngx_http_agent_aisdk_get(root, "thinking", &s) == NGX_OK
        && s.len > a->thinking)
    {
        s.data += a->thinking;
        s.len -= a->thinking;

        rc = ngx_http_agent_aisdk_delta(a, b, 1, &s);
    }

    if (rc == NGX_OK
        && ngx_http_agent_aisdk_get(root, "text", &s) == NGX_OK
        && s.len > a->text)
    {
        s.data += a->text;
        s.len -= a->text;

        rc = ngx_http_agent_aisdk_delta(a, b, 0, &s);
    }

done:

    yajl_tree_free(root);

    return rc;
}


/* "start" before anything else: the message is the turn's */

static ngx_int_t
ngx_http_agent_aisdk_start(ngx_http_agent_aisdk_t *a, ngx_buf_t *b)
{
    u_char     buf[NGX_INT_T_LEN + sizeof("msg_") - 1];
    ngx_str_t  id;

    if (a->started) {
        return NGX_OK;
    }

    a->started = 1;

    id.data = buf;
    id.len = ngx_sprintf(buf, "msg_%ui", a->turn) - buf;

    ngx_http_agent_aisdk_open(a, "start");
    a->failed |= ngx_http_agent_json_key(a->g, "messageId");
    a->failed |= ngx_http_agent_json_str(a->g, &id);

    return ngx_http_agent_aisdk_close(a, b);
}


/*
 * The step of a model call: a new one ends the one before.  NULL: the
 * open step, or one opened for it (a call recorded with no reply seen).
 */

static ngx_int_t
ngx_http_agent_aisdk_step(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    ngx_str_t *message_id)
{
    if (ngx_http_agent_aisdk_start(a, b) != NGX_OK) {
        return NGX_ERROR;
    }

    if (a->step
        && (message_id == NULL
            || (message_id->len == a->message_id_len
                && ngx_strncmp(message_id->data, a->message_id,
                               a->message_id_len)
                   == 0)))
    {
        return NGX_OK;
    }

    if (a->step) {
        if (ngx_http_agent_aisdk_close_blocks(a, b, 1, 1) != NGX_OK
            || ngx_http_agent_aisdk_simple(a, b, "finish-step") != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    a->step = 1;
    a->text = 0;
    a->thinking = 0;

    if (message_id) {
        a->message_id_len = ngx_min(message_id->len,
                                    NGX_HTTP_AGENT_AISDK_ID_LEN - 2);
        ngx_memcpy(a->message_id, message_id->data, a->message_id_len);

    } else {
        a->message_id_len = 0;
    }

    return ngx_http_agent_aisdk_simple(a, b, "start-step");
}


static ngx_int_t
ngx_http_agent_aisdk_close_blocks(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    ngx_uint_t text, ngx_uint_t reasoning)
{
    if (text && a->text_open) {
        a->text_open = 0;

        if (ngx_http_agent_aisdk_block(a, b, "text-end", 0, NULL) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (reasoning && a->reasoning_open) {
        a->reasoning_open = 0;

        if (ngx_http_agent_aisdk_block(a, b, "reasoning-end", 1, NULL)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* a text block's id is its model call's; a reasoning block's adds "r" */

static ngx_int_t
ngx_http_agent_aisdk_block(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    char *type, ngx_uint_t reasoning, ngx_str_t *delta)
{
    u_char     buf[NGX_HTTP_AGENT_AISDK_ID_LEN + 2];
    ngx_str_t  id;

    id.data = buf;
    id.len = ngx_sprintf(buf, "%*s%s", a->message_id_len, a->message_id,
                         reasoning ? "_r" : "")
             - buf;

    if (id.len == 0) {
        ngx_str_set(&id, "text");
    }

    ngx_http_agent_aisdk_open(a, type);
    a->failed |= ngx_http_agent_json_key(a->g, "id");
    a->failed |= ngx_http_agent_json_str(a->g, &id);

    if (delta) {
        a->failed |= ngx_http_agent_json_key(a->g, "delta");
        a->failed |= ngx_http_agent_json_str(a->g, delta);
    }

    return ngx_http_agent_aisdk_close(a, b);
}


static ngx_int_t
ngx_http_agent_aisdk_simple(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    char *type)
{
    ngx_http_agent_aisdk_open(a, type);

    return ngx_http_agent_aisdk_close(a, b);
}


static void
ngx_http_agent_aisdk_open(ngx_http_agent_aisdk_t *a, char *type)
{
    a->failed |= yajl_gen_map_open(a->g);
    a->failed |= ngx_http_agent_json_key(a->g, "type");
    a->failed |= yajl_gen_string(a->g, (const unsigned char *) type,
                                 ngx_strlen(type));
}


/* the chunk generated, as "data: JSON" and a blank line, if it fits */

static ngx_int_t
ngx_http_agent_aisdk_close(ngx_http_agent_aisdk_t *a, ngx_buf_t *b)
{
    size_t                len;
    ngx_int_t             rc;
    const unsigned char  *json;

    a->failed |= yajl_gen_map_close(a->g);

    rc = NGX_ERROR;

    if (!a->failed
        && yajl_gen_get_buf(a->g, &json, &len) == yajl_gen_status_ok
        && (size_t) (b->end - b->last) >= len + sizeof("data: \n\n") - 1)
    {
        b->last = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
        b->last = ngx_cpymem(b->last, json, len);
        *b->last++ = LF;
        *b->last++ = LF;
        rc = NGX_OK;
    }

    yajl_gen_clear(a->g);
    yajl_gen_reset(a->g, NULL);
    a->failed = 0;

    return rc;
}


/* a value of the log, written again as it is */

static void
ngx_http_agent_aisdk_value(ngx_http_agent_aisdk_t *a, yajl_val v)
{
    size_t      i;
    yajl_gen    g;

    g = a->g;

    switch (v->type) {

    case yajl_t_string:
        a->failed |= yajl_gen_string(g, (const unsigned char *) v->u.string,
                                     ngx_strlen(v->u.string));
        break;

    case yajl_t_number:
        a->failed |= yajl_gen_number(g, v->u.number.r,
                                     ngx_strlen(v->u.number.r));
        break;

    case yajl_t_object:
        a->failed |= yajl_gen_map_open(g);

        for (i = 0; i < v->u.object.len; i++) {
            a->failed |= yajl_gen_string(g,
                             (const unsigned char *) v->u.object.keys[i],
                             ngx_strlen(v->u.object.keys[i]));
            ngx_http_agent_aisdk_value(a, v->u.object.values[i]);
        }

        a->failed |= yajl_gen_map_close(g);
        break;

    case yajl_t_array:
        a->failed |= yajl_gen_array_open(g);

        for (i = 0; i < v->u.array.len; i++) {
            ngx_http_agent_aisdk_value(a, v->u.array.values[i]);
        }

        a->failed |= yajl_gen_array_close(g);
        break;

    case yajl_t_true:
        a->failed |= yajl_gen_bool(g, 1);
        break;

    case yajl_t_false:
        a->failed |= yajl_gen_bool(g, 0);
        break;

    default:
        a->failed |= yajl_gen_null(g);
        break;
    }
}


static ngx_int_t
ngx_http_agent_aisdk_get(yajl_val root, char *key, ngx_str_t *s)
{
    yajl_val     v;
    const char  *path[] = { key, NULL };

    v = yajl_tree_get(root, path, yajl_t_string);

    if (v == NULL) {
        return NGX_DECLINED;
    }

    s->data = (u_char *) v->u.string;
    s->len = ngx_strlen(s->data);

    return NGX_OK;
}


static ngx_uint_t
ngx_http_agent_aisdk_true(yajl_val root, char *key)
{
    yajl_val     v;
    const char  *path[] = { key, NULL };

    v = yajl_tree_get(root, path, yajl_t_true);

    return v != NULL;
}
