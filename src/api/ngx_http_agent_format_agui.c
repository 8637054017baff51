
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * AG-UI events (protocol 1.0, @ag-ui/core): one run of agent_agui.  The
 * stream reads the whole log; what comes before the run (the run's
 * "from") only makes up the messages snapshot, what comes after is the
 * run: RUN_STARTED and STATE_SNAPSHOT, a step per model call with its
 * REASONING_* and TEXT_MESSAGE_* events, TOOL_CALL_START/ARGS/END for
 * each call and TOOL_CALL_RESULT for each result, a streaming tool's
 * progress as CUSTOM events; then, when the turn ends or waits, the
 * MESSAGES_SNAPSHOT of the whole conversation and RUN_FINISHED (a call
 * that waits for a person is an interrupt, one that waits for the
 * browser a pending tool call) or RUN_ERROR.  The engine's order,
 * resume and fan-out hold as for every format.
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
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_events_sub.h"
#include "ngx_http_agent_agui.h"
#include "ngx_http_agent_agui_messages.h"
#include "ngx_http_agent_format_agui.h"


static ngx_int_t ngx_http_agent_agui_header(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_agui_init(ngx_http_agent_events_sub_t *sub);
static size_t ngx_http_agent_agui_size(ngx_http_agent_event_t *ev);
static size_t ngx_http_agent_agui_more(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t *ev);
static ngx_int_t ngx_http_agent_agui_frame(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_event_t *ev, size_t off, size_t len,
    ngx_uint_t last);
static size_t ngx_http_agent_agui_partial_size(size_t len);
static ngx_int_t ngx_http_agent_agui_partial(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv);
static ngx_int_t ngx_http_agent_agui_caught_up(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv);
static size_t ngx_http_agent_agui_caught_up_size(
    ngx_http_agent_events_sub_t *sub);

static ngx_int_t ngx_http_agent_agui_event(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_event_t *ev, yajl_val root);
static ngx_int_t ngx_http_agent_agui_history(ngx_http_agent_agui_t *a,
    ngx_http_agent_event_t *ev, yajl_val root);
static ngx_int_t ngx_http_agent_agui_delta(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, ngx_uint_t reasoning, ngx_str_t *delta);
static ngx_int_t ngx_http_agent_agui_assistant(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_agui_tool_call(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_agui_tool_result(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_agui_progress(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, yajl_val root);
static void ngx_http_agent_agui_wait(ngx_http_agent_agui_t *a, yajl_val root,
    ngx_uint_t resolved);
static ngx_http_agent_agui_call_t *ngx_http_agent_agui_call(
    ngx_http_agent_agui_t *a, ngx_str_t *id);
static void ngx_http_agent_agui_settled(ngx_http_agent_agui_t *a,
    ngx_str_t *id);
static ngx_int_t ngx_http_agent_agui_end(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_uint_t type, yajl_val root);
static void ngx_http_agent_agui_outcome(ngx_http_agent_agui_t *a);

ngx_http_agent_events_format_t  ngx_http_agent_format_agui = {
    ngx_string("agui"),
    ngx_http_agent_agui_header,
    ngx_http_agent_agui_init,
    ngx_http_agent_agui_size,
    ngx_http_agent_agui_frame,
    ngx_http_agent_agui_partial_size,
    ngx_http_agent_agui_partial,
    0,
    ngx_http_agent_agui_caught_up,
    ngx_http_agent_agui_more,
    ngx_http_agent_agui_caught_up_size
};


static ngx_int_t
ngx_http_agent_agui_header(ngx_http_request_t *r)
{
    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_agui_init(ngx_http_agent_events_sub_t *sub)
{
    ngx_http_agent_agui_t  *a;

    a = ngx_pcalloc(sub->request->pool, sizeof(ngx_http_agent_agui_t));
    if (a == NULL) {
        return NGX_ERROR;
    }

    a->run = ngx_http_agent_agui_run(sub->request);
    if (a->run == NULL) {
        return NGX_ERROR;
    }

    a->g = ngx_http_agent_json_gen(sub->request->pool);
    a->text_gen = ngx_http_agent_json_gen(sub->request->pool);

    if (a->g == NULL || a->text_gen == NULL
        || ngx_http_agent_agui_msgs_init(&a->msgs, sub->request->pool)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    sub->format_ctx = a;

    return NGX_OK;
}


/*
 * An event's strings go at most twice into its events (a call's id in
 * its start, arguments and end; text whole for a subscriber that missed
 * its deltas) and once more into the messages snapshot.
 */

static size_t
ngx_http_agent_agui_size(ngx_http_agent_event_t *ev)
{
    return 4 * ev->len + 1024;
}


/*
 * The subscriber has every event there is: a run whose turn waits for
 * input with no worker running it ends here, with its calls pending, as
 * the live state_changed that took the turn there would end it.  That
 * event may have gone by before the stream subscribed (with a store the
 * stream begins once its message is written; a run that only looks
 * begins when it comes), and live events are not replayed.
 */

static ngx_int_t
ngx_http_agent_agui_caught_up(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_conv_t *conv)
{
    ngx_http_agent_agui_t  *a;

    a = sub->format_ctx;

    if (conv->state != NGX_HTTP_AGENT_AWAITING_INPUT || conv->lease != 0
        || conv->seq <= a->run->from)
    {
        return NGX_OK;
    }

    return ngx_http_agent_agui_end(sub, b, NGX_HTTP_AGENT_EV_STATE_CHANGED,
                                   NULL);
}


static size_t
ngx_http_agent_agui_caught_up_size(ngx_http_agent_events_sub_t *sub)
{
    ngx_http_agent_event_t  ev;

    ngx_memzero(&ev, sizeof(ngx_http_agent_event_t));
    ev.type = NGX_HTTP_AGENT_EV_STATE_CHANGED;

    return ngx_http_agent_agui_more(sub, &ev);
}


/* an event that may end the run carries the messages snapshot */

static size_t
ngx_http_agent_agui_more(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t *ev)
{
    size_t                  start;
    ngx_http_agent_agui_t  *a;

    a = sub->format_ctx;

    /* the first event of the run brings RUN_STARTED and the state */

    start = a->started ? 0 : a->run->state.len + a->run->thread.len
                             + a->run->run.len + 512;

    switch (ev->type) {

    case NGX_HTTP_AGENT_EV_TURN_COMPLETED:
    case NGX_HTTP_AGENT_EV_TURN_FAILED:
    case NGX_HTTP_AGENT_EV_CANCELLED:
    case NGX_HTTP_AGENT_EV_TURN_HALTED:
    case NGX_HTTP_AGENT_EV_STATE_CHANGED:
        break;

    default:
        if (ev->seq == 0
            || (ev->seq != a->run->end && ev->seq != a->run->from))
        {
            return start;
        }
    }

    return start + ngx_http_agent_agui_msgs_size(&a->msgs)
           + a->run->thread.len + a->run->run.len
           + NGX_HTTP_AGENT_AGUI_WAITS * 2 * NGX_HTTP_AGENT_AGUI_ID_LEN
           + 2048;
}


static ngx_int_t
ngx_http_agent_agui_frame(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_event_t *ev, size_t off, size_t len, ngx_uint_t last)
{
    ngx_int_t  rc;
    yajl_val   root;

    if (sub->last) {
        return NGX_OK;
    }

    root = ngx_http_agent_format_parse(sub, ev);
    if (root == NULL) {
        return NGX_ERROR;
    }

    rc = ngx_http_agent_agui_event(sub, b, ev, root);

    ngx_http_agent_json_free(root);

    return rc;
}


static ngx_int_t
ngx_http_agent_agui_event(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_event_t *ev, yajl_val root)
{
    ngx_str_t               s;
    ngx_int_t               rc;
    ngx_http_agent_agui_t  *a;

    a = sub->format_ctx;

    if (ev->seq && ev->seq <= a->run->from) {
        rc = ngx_http_agent_agui_history(a, ev, root);

        if (rc == NGX_OK && ev->seq == a->run->end) {
            return ngx_http_agent_agui_end(sub, b, ev->type, root);
        }

        /*
         * the run starts with the last event before it, before the reply
         * so far (whose buffer has no room for the state), and, for a
         * client that brought nothing new, with the messages before it
         */

        if (rc == NGX_OK && ev->seq == a->run->from) {
            return ngx_http_agent_agui_start(a, b);
        }

        return rc;
    }

    switch (ev->type) {

    case NGX_HTTP_AGENT_EV_REWIND:
        /* the superseded branch leaves the messages snapshot */
        return ngx_http_agent_agui_history(a, ev, root);

    case NGX_HTTP_AGENT_EV_TEXT_DELTA:
    case NGX_HTTP_AGENT_EV_THINKING_DELTA:

        if (ngx_http_agent_agui_get(root, "message_id", &s) != NGX_OK
            || ngx_http_agent_agui_step(a, b, &s) != NGX_OK
            || ngx_http_agent_agui_get(root, "delta", &s) != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_agent_agui_delta(a, b,
                   ev->type == NGX_HTTP_AGENT_EV_THINKING_DELTA, &s);

    case NGX_HTTP_AGENT_EV_ASSISTANT_MSG:
        rc = ngx_http_agent_agui_assistant(a, b, root);
        break;

    case NGX_HTTP_AGENT_EV_TOOL_CALL:
        rc = ngx_http_agent_agui_tool_call(a, b, root);
        break;

    case NGX_HTTP_AGENT_EV_TOOL_RESULT:
        rc = ngx_http_agent_agui_tool_result(a, b, root);
        break;

    case NGX_HTTP_AGENT_EV_TOOL_PROGRESS:
        return ngx_http_agent_agui_progress(a, b, root);

    case NGX_HTTP_AGENT_EV_SUSPENSION:
    case NGX_HTTP_AGENT_EV_RESOLUTION:
        ngx_http_agent_agui_wait(a, root,
                                 ev->type == NGX_HTTP_AGENT_EV_RESOLUTION);
        rc = NGX_OK;
        break;

    case NGX_HTTP_AGENT_EV_USER_MSG:
        /* a message after the run's own: the next run's */
        ngx_http_agent_agui_msgs_user(&a->msgs, ev->seq, root);
        rc = NGX_OK;
        break;

    case NGX_HTTP_AGENT_EV_STATE_CHANGED:

        /* calls wait for the browser or a person: this run ends here */

        if (ngx_http_agent_agui_get(root, "to", &s) == NGX_OK
            && s.len == sizeof("awaiting_input") - 1
            && ngx_strncmp(s.data, "awaiting_input", s.len) == 0)
        {
            return ngx_http_agent_agui_end(sub, b, ev->type, root);
        }

        return NGX_OK;

    case NGX_HTTP_AGENT_EV_TURN_COMPLETED:
    case NGX_HTTP_AGENT_EV_TURN_FAILED:
    case NGX_HTTP_AGENT_EV_CANCELLED:
    case NGX_HTTP_AGENT_EV_TURN_HALTED:
        return ngx_http_agent_agui_end(sub, b, ev->type, root);

    default:
        /* tool_call_delta names its call by index only: it comes whole */
        return NGX_OK;
    }

    if (rc == NGX_OK && ev->seq && ev->seq == a->run->end) {
        return ngx_http_agent_agui_end(sub, b, ev->type, root);
    }

    return rc;
}


/* an event from before the run: what the messages snapshot holds of it */

static ngx_int_t
ngx_http_agent_agui_history(ngx_http_agent_agui_t *a,
    ngx_http_agent_event_t *ev, yajl_val root)
{
    yajl_val    v;
    ngx_str_t   id, name, args, content;
    ngx_uint_t  ok;

    switch (ev->type) {

    case NGX_HTTP_AGENT_EV_USER_MSG:
        ngx_http_agent_agui_msgs_user(&a->msgs, ev->seq, root);
        break;

    case NGX_HTTP_AGENT_EV_REWIND:
        v = ngx_http_agent_provider_get(root, "to_seq");

        if (v && YAJL_IS_INTEGER(v) && YAJL_GET_INTEGER(v) >= 0) {
            ngx_http_agent_agui_msgs_rewind(&a->msgs, YAJL_GET_INTEGER(v));
        }

        break;

    case NGX_HTTP_AGENT_EV_ASSISTANT_MSG:
        ngx_http_agent_agui_msgs_assistant(&a->msgs, root);
        break;

    case NGX_HTTP_AGENT_EV_TOOL_CALL:
        if (ngx_http_agent_agui_get(root, "tool_call_id", &id) != NGX_OK
            || ngx_http_agent_agui_get(root, "name", &name) != NGX_OK
            || ngx_http_agent_agui_get(root, "arguments", &args) != NGX_OK)
        {
            return NGX_ERROR;
        }

        ngx_http_agent_agui_msgs_call(&a->msgs, &id, &name, &args);
        break;

    case NGX_HTTP_AGENT_EV_TOOL_RESULT:
        if (ngx_http_agent_agui_result_text(a, root, &id, &content, &ok)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ngx_http_agent_agui_msgs_result(&a->msgs, &id, &content, ok);
        ngx_http_agent_agui_settled(a, &id);
        break;

    case NGX_HTTP_AGENT_EV_SUSPENSION:
    case NGX_HTTP_AGENT_EV_RESOLUTION:

        /* what waits when the run starts: a run that only looks ends so */

        ngx_http_agent_agui_wait(a, root,
                                 ev->type == NGX_HTTP_AGENT_EV_RESOLUTION);
        break;

    default:
        break;
    }

    return NGX_OK;
}


/* text and reasoning as they stream; a message opens with its first delta */

static ngx_int_t
ngx_http_agent_agui_delta(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    ngx_uint_t reasoning, ngx_str_t *delta)
{
    if (delta->len == 0) {
        return NGX_OK;
    }

    /* reasoning comes before the text: one ends where the other begins */

    if (ngx_http_agent_agui_blocks_end(a, b, reasoning, !reasoning)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (reasoning) {
        if (!a->reasoning_open) {
            if (ngx_http_agent_agui_message(a, b, "REASONING_START", 1, NULL)
                != NGX_OK
                || ngx_http_agent_agui_message(a, b,
                                               "REASONING_MESSAGE_START", 1,
                                               NULL)
                   != NGX_OK)
            {
                return NGX_ERROR;
            }

            a->reasoning_open = 1;
        }

        a->thinking += delta->len;

        return ngx_http_agent_agui_message(a, b, "REASONING_MESSAGE_CONTENT",
                                           1, delta);
    }

    if (!a->text_open) {
        if (ngx_http_agent_agui_message(a, b, "TEXT_MESSAGE_START", 0, NULL)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        a->text_open = 1;
    }

    a->text += delta->len;

    return ngx_http_agent_agui_message(a, b, "TEXT_MESSAGE_CONTENT", 0,
                                       delta);
}


/*
 * The model call's reply, logged: it closes its messages, or, for a
 * subscriber that got none of its deltas, brings them whole.
 */

static ngx_int_t
ngx_http_agent_agui_assistant(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t  s;

    if (ngx_http_agent_agui_get(root, "message_id", &s) != NGX_OK
        || ngx_http_agent_agui_step(a, b, &s) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (a->thinking == 0
        && ngx_http_agent_agui_get(root, "thinking", &s) == NGX_OK
        && ngx_http_agent_agui_delta(a, b, 1, &s) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (a->text == 0
        && ngx_http_agent_agui_get(root, "content", &s) == NGX_OK
        && ngx_http_agent_agui_delta(a, b, 0, &s) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_agent_agui_msgs_assistant(&a->msgs, root);

    return ngx_http_agent_agui_blocks_end(a, b, 1, 1);
}


static ngx_int_t
ngx_http_agent_agui_tool_call(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t  id, name, args, parent;

    if (ngx_http_agent_agui_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_agui_get(root, "name", &name) != NGX_OK
        || ngx_http_agent_agui_get(root, "arguments", &args) != NGX_OK
        || ngx_http_agent_agui_start(a, b) != NGX_OK
        || ngx_http_agent_agui_blocks_end(a, b, 1, 1) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_agent_agui_open(a, "TOOL_CALL_START");
    ngx_http_agent_agui_field(a, "toolCallId", &id);
    ngx_http_agent_agui_field(a, "toolCallName", &name);

    if (a->msgs.parent_len) {
        parent.data = a->msgs.parent;
        parent.len = a->msgs.parent_len;
        ngx_http_agent_agui_field(a, "parentMessageId", &parent);
    }

    if (ngx_http_agent_agui_close(a, b) != NGX_OK) {
        return NGX_ERROR;
    }

    if (args.len) {
        ngx_http_agent_agui_open(a, "TOOL_CALL_ARGS");
        ngx_http_agent_agui_field(a, "toolCallId", &id);
        ngx_http_agent_agui_field(a, "delta", &args);

        if (ngx_http_agent_agui_close(a, b) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    ngx_http_agent_agui_open(a, "TOOL_CALL_END");
    ngx_http_agent_agui_field(a, "toolCallId", &id);

    ngx_http_agent_agui_msgs_call(&a->msgs, &id, &name, &args);

    return ngx_http_agent_agui_close(a, b);
}


/*
 * A result, as the tool message the model sees it as; one the browser
 * sent in this run's input is the client's already.
 */

static ngx_int_t
ngx_http_agent_agui_tool_result(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    yajl_val root)
{
    u_char      buf[NGX_HTTP_AGENT_AGUI_ID_LEN + 16];
    ngx_str_t   id, content, mid;
    ngx_uint_t  ok;

    if (ngx_http_agent_agui_result_text(a, root, &id, &content, &ok)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_agent_agui_msgs_result(&a->msgs, &id, &content, ok);
    ngx_http_agent_agui_settled(a, &id);

    if (ngx_http_agent_agui_msgs_client(&a->msgs, &id)) {
        return NGX_OK;
    }

    if (ngx_http_agent_agui_start(a, b) != NGX_OK
        || ngx_http_agent_agui_blocks_end(a, b, 1, 1) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_agent_agui_open(a, "TOOL_CALL_RESULT");
    ngx_http_agent_agui_field(a, "messageId",
                              ngx_http_agent_agui_id(buf, "result_", &id, "",
                                                     &mid));
    ngx_http_agent_agui_field(a, "toolCallId", &id);
    ngx_http_agent_agui_field(a, "content", &content);
    a->failed |= ngx_http_agent_json_key(a->g, "role");
    a->failed |= yajl_gen_string(a->g, (u_char *) "tool", 4);

    return ngx_http_agent_agui_close(a, b);
}


/* a streaming tool's progress: a CUSTOM event, never a message */

static ngx_int_t
ngx_http_agent_agui_progress(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    yajl_val root)
{
    ngx_str_t  id, name;
    yajl_val   progress;

    if (ngx_http_agent_agui_get(root, "tool_call_id", &id) != NGX_OK
        || ngx_http_agent_agui_start(a, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_str_set(&name, "tool_progress");

    progress = ngx_http_agent_provider_get(root, "progress");

    ngx_http_agent_agui_open(a, "CUSTOM");
    ngx_http_agent_agui_field(a, "name", &name);
    a->failed |= ngx_http_agent_json_key(a->g, "value");
    a->failed |= yajl_gen_map_open(a->g);
    ngx_http_agent_agui_field(a, "toolCallId", &id);
    a->failed |= ngx_http_agent_json_key(a->g, "progress");

    if (progress) {
        a->failed |= ngx_http_agent_provider_value(a->g, progress);

    } else {
        a->failed |= yajl_gen_null(a->g);
    }

    a->failed |= yajl_gen_map_close(a->g);

    return ngx_http_agent_agui_close(a, b);
}


/*
 * A suspension adds a waiting call, a resolution takes it away (and
 * names the client's tool message it came in, if it did).
 */

static void
ngx_http_agent_agui_wait(ngx_http_agent_agui_t *a, yajl_val root,
    ngx_uint_t resolved)
{
    ngx_str_t                    id, s;
    ngx_uint_t                   kind;
    yajl_val                     v;
    ngx_http_agent_agui_call_t  *c;

    if (ngx_http_agent_agui_get(root, "tool_call_id", &id) != NGX_OK
        || id.len >= NGX_HTTP_AGENT_AGUI_ID_LEN)
    {
        return;
    }

    if (resolved) {
        ngx_http_agent_agui_msgs_answered(&a->msgs, root, &id);
        ngx_http_agent_agui_settled(a, &id);
        return;
    }

    c = ngx_http_agent_agui_call(a, &id);
    if (c == NULL) {
        return;
    }

    kind = NGX_HTTP_AGENT_PENDING_CLIENT_EXEC;

    if (ngx_http_agent_agui_get(root, "kind", &s) == NGX_OK) {
        if (s.len == 8 && ngx_strncmp(s.data, "approval", 8) == 0) {
            kind = NGX_HTTP_AGENT_PENDING_APPROVAL;

        } else if (s.len == 11 && ngx_strncmp(s.data, "elicitation", 11) == 0)
        {
            kind = NGX_HTTP_AGENT_PENDING_ELICITATION;
        }
    }

    v = ngx_http_agent_provider_get(root, "deadline");

    c->kind = kind;
    c->deadline = (v && YAJL_IS_INTEGER(v)) ? (uint64_t) YAJL_GET_INTEGER(v)
                                            : 0;
    c->waiting = 1;
}


/* the slot of a call that waits: its own, a settled one's, or a new one */

static ngx_http_agent_agui_call_t *
ngx_http_agent_agui_call(ngx_http_agent_agui_t *a, ngx_str_t *id)
{
    ngx_uint_t                   i;
    ngx_http_agent_agui_call_t  *c, *free;

    free = NULL;

    for (i = 0; i < a->ncalls; i++) {
        c = &a->calls[i];

        if (c->len == id->len && ngx_strncmp(c->id, id->data, id->len) == 0) {
            return c;
        }

        if (!c->waiting && free == NULL) {
            free = c;
        }
    }

    if (free == NULL) {
        if (a->ncalls == NGX_HTTP_AGENT_AGUI_WAITS) {
            return NULL;
        }

        free = &a->calls[a->ncalls++];
    }

    ngx_memcpy(free->id, id->data, id->len);
    free->len = id->len;

    return free;
}


/* a call resolved, or its result recorded: it no longer waits */

static void
ngx_http_agent_agui_settled(ngx_http_agent_agui_t *a, ngx_str_t *id)
{
    ngx_uint_t  i;

    for (i = 0; i < a->ncalls; i++) {
        if (a->calls[i].len == id->len
            && ngx_strncmp(a->calls[i].id, id->data, id->len) == 0)
        {
            a->calls[i].waiting = 0;
        }
    }
}






/*
 * The run ends: its open messages and step, the messages snapshot, then
 * RUN_FINISHED with its outcome, or RUN_ERROR for a failed turn.
 */

static ngx_int_t
ngx_http_agent_agui_end(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_uint_t type, yajl_val root)
{
    u_char                 *p, *q;
    ngx_str_t               reason, error, text, code;
    ngx_http_agent_agui_t  *a;

    a = sub->format_ctx;

    if (ngx_http_agent_agui_start(a, b) != NGX_OK
        || ngx_http_agent_agui_blocks_end(a, b, 1, 1) != NGX_OK
        || ngx_http_agent_agui_step_end(a, b) != NGX_OK
        || ngx_http_agent_agui_msgs_snapshot(&a->msgs, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    sub->last = 1;

    if (type == NGX_HTTP_AGENT_EV_TURN_FAILED) {

        if (ngx_http_agent_agui_get(root, "reason", &reason) != NGX_OK) {
            ngx_str_set(&reason, "the turn failed");
        }

        text = reason;

        if (ngx_http_agent_agui_get(root, "error", &error) == NGX_OK
            && error.len)
        {
            p = ngx_pnalloc(sub->request->pool, reason.len + 2 + error.len);
            if (p == NULL) {
                return NGX_ERROR;
            }

            q = ngx_cpymem(p, reason.data, reason.len);
            q = ngx_cpymem(q, ": ", 2);
            q = ngx_cpymem(q, error.data, error.len);

            text.data = p;
            text.len = q - p;
        }

        ngx_str_set(&code, "turn_failed");

        ngx_http_agent_agui_open(a, "RUN_ERROR");
        ngx_http_agent_agui_field(a, "message", &text);
        ngx_http_agent_agui_field(a, "code", &code);

        return ngx_http_agent_agui_close(a, b);
    }

    ngx_http_agent_agui_open(a, "RUN_FINISHED");
    ngx_http_agent_agui_field(a, "threadId", &a->run->thread);
    ngx_http_agent_agui_field(a, "runId", &a->run->run);
    a->failed |= ngx_http_agent_json_key(a->g, "outcome");
    a->failed |= yajl_gen_map_open(a->g);
    a->failed |= ngx_http_agent_json_key(a->g, "type");

    if (type == NGX_HTTP_AGENT_EV_CANCELLED) {
        a->failed |= yajl_gen_string(a->g, (u_char *) "cancelled",
                                     sizeof("cancelled") - 1);

    } else {
        ngx_http_agent_agui_outcome(a);
    }

    a->failed |= yajl_gen_map_close(a->g);

    return ngx_http_agent_agui_close(a, b);
}


/*
 * A call that waits for a person (an approval, a question) makes the
 * run an interrupt, its id the call's; calls that wait only for the
 * browser leave a completed run with its pending tool calls.
 */

static void
ngx_http_agent_agui_outcome(ngx_http_agent_agui_t *a)
{
    u_char                       buf[sizeof("1970-01-01T00:00:00.000Z")];
    ngx_tm_t                     tm;
    ngx_str_t                    id, s;
    ngx_uint_t                   i, interrupts;
    ngx_http_agent_agui_call_t  *c;

    interrupts = 0;

    for (i = 0; i < a->ncalls; i++) {
        if (a->calls[i].waiting
            && a->calls[i].kind != NGX_HTTP_AGENT_PENDING_CLIENT_EXEC)
        {
            interrupts = 1;
        }
    }

    ngx_str_set(&s, "success");

    if (interrupts) {
        ngx_str_set(&s, "interrupt");
    }

    a->failed |= ngx_http_agent_json_str(a->g, &s);

    if (interrupts) {
        a->failed |= ngx_http_agent_json_key(a->g, "interrupts");

    } else {
        a->failed |= ngx_http_agent_json_key(a->g, "pendingToolCallIds");
    }

    a->failed |= yajl_gen_array_open(a->g);

    for (i = 0; i < a->ncalls; i++) {
        c = &a->calls[i];

        if (!c->waiting
            || (c->kind == NGX_HTTP_AGENT_PENDING_CLIENT_EXEC) != !interrupts)
        {
            continue;
        }

        id.data = c->id;
        id.len = c->len;

        if (!interrupts) {
            a->failed |= ngx_http_agent_json_str(a->g, &id);
            continue;
        }

        a->failed |= yajl_gen_map_open(a->g);
        ngx_http_agent_agui_field(a, "id", &id);

        if (c->kind == NGX_HTTP_AGENT_PENDING_APPROVAL) {
            ngx_str_set(&s, "tool_approval");

        } else {
            ngx_str_set(&s, "input_required");
        }

        ngx_http_agent_agui_field(a, "reason", &s);
        ngx_http_agent_agui_field(a, "toolCallId", &id);

        if (c->deadline) {
            ngx_gmtime((time_t) (c->deadline / 1000), &tm);

            s.data = buf;
            s.len = ngx_sprintf(buf, "%4d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                                tm.ngx_tm_year, tm.ngx_tm_mon,
                                tm.ngx_tm_mday, tm.ngx_tm_hour,
                                tm.ngx_tm_min, tm.ngx_tm_sec,
                                (int) (c->deadline % 1000))
                    - buf;

            ngx_http_agent_agui_field(a, "expiresAt", &s);
        }

        a->failed |= yajl_gen_map_close(a->g);
    }

    a->failed |= yajl_gen_array_close(a->g);
}




/*
 * 2 bytes of JSON at most for each byte of the reply so far, as for an
 * event, and the events around it
 */

static size_t
ngx_http_agent_agui_partial_size(size_t len)
{
    return 2 * len + 2048;
}


/*
 * The reply so far, for a subscriber that came in while it streamed or
 * missed deltas: what it has not been sent of the reasoning and the
 * text, as content of the messages the deltas after it go on.
 */

static ngx_int_t
ngx_http_agent_agui_partial(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv)
{
    ngx_int_t               rc;
    ngx_str_t               id, s;
    yajl_val                root;
    ngx_http_agent_agui_t  *a;

    a = sub->format_ctx;

    if (sub->last) {
        return NGX_OK;
    }

    root = ngx_http_agent_partial_parse_locked(conv,
                                               sub->request->connection->log);
    if (root == NULL) {
        return NGX_ERROR;
    }

    rc = NGX_OK;

    if (ngx_http_agent_agui_get(root, "message_id", &id) != NGX_OK
        || ngx_http_agent_agui_step(a, b, &id) != NGX_OK)
    {
        rc = NGX_ERROR;
        goto done;
    }

    if (!a->text_open && a->text == 0
        && ngx_http_agent_agui_get(root, "thinking", &s) == NGX_OK
        && s.len > a->thinking)
    {
        s.data += a->thinking;
        s.len -= a->thinking;

        rc = ngx_http_agent_agui_delta(a, b, 1, &s);
    }

    if (rc == NGX_OK
        && ngx_http_agent_agui_get(root, "text", &s) == NGX_OK
        && s.len > a->text)
    {
        s.data += a->text;
        s.len -= a->text;

        rc = ngx_http_agent_agui_delta(a, b, 0, &s);
    }

done:

    ngx_http_agent_json_free(root);

    return rc;
}
