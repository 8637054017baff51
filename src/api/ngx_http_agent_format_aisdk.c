
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The AI SDK's UI message stream (protocol v1, the "ai" package 5 to 7):
 * one turn as one assistant message.  "start", then per model call a
 * step ("start-step" ... "finish-step") with its text and reasoning
 * blocks and its tool calls' input (as it streams) and output, then
 * "finish" and "data: [DONE]" when the turn ends or waits for input; a
 * failed turn ends with an "error" chunk, a cancelled one with "abort".
 * A call that waits for approval is a "tool-approval-request"; one that
 * waits for the browser or a person is offered as its input, without
 * output, for the client to run or answer.  Events of the log and live
 * ones are read as they are, so the engine's order, resume and fan-out
 * hold.
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
#include "ngx_http_agent_format_aisdk.h"


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

static ngx_int_t ngx_http_agent_aisdk_caught_up(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv);

static ngx_int_t ngx_http_agent_aisdk_event(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_uint_t type, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_streamed(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b, ngx_uint_t type,
    yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_again(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_uint_t reasoning, ngx_str_t *delta);
static ngx_int_t ngx_http_agent_aisdk_delta(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_uint_t reasoning, ngx_str_t *delta);
static ngx_int_t ngx_http_agent_aisdk_assistant(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_rest(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_uint_t reasoning, ngx_str_t *all);
static ngx_int_t ngx_http_agent_aisdk_failed(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, yajl_val root);
static ngx_int_t ngx_http_agent_aisdk_end(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, char *finish, ngx_str_t *error);

static ngx_int_t ngx_http_agent_aisdk_close_blocks(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_uint_t text, ngx_uint_t reasoning);
static ngx_int_t ngx_http_agent_aisdk_block(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, char *type, ngx_uint_t reasoning, ngx_str_t *delta);
static ngx_int_t ngx_http_agent_aisdk_simple(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, char *type);


ngx_http_agent_events_format_t  ngx_http_agent_format_aisdk = {
    ngx_string("aisdk"),
    ngx_http_agent_aisdk_header,
    ngx_http_agent_aisdk_init,
    ngx_http_agent_aisdk_size,
    ngx_http_agent_aisdk_frame,
    ngx_http_agent_aisdk_partial_size,
    ngx_http_agent_aisdk_partial,
    0,
    ngx_http_agent_aisdk_caught_up,
    NULL,
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

    if (ngx_array_init(&a->calls, sub->request->pool, 4,
                       sizeof(ngx_http_agent_aisdk_call_t))
        != NGX_OK)
    {
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
    ngx_int_t  rc;
    yajl_val   root;

    if (sub->last) {
        return NGX_OK;
    }

    root = ngx_http_agent_format_parse(sub, ev);
    if (root == NULL) {
        return NGX_ERROR;
    }

    rc = ngx_http_agent_aisdk_event(sub, b, ev->type, root);

    ngx_http_agent_json_free(root);

    return rc;
}


/*
 * The subscriber has every event there is: a turn that waits for input
 * with no worker running it ends its reply here ("tool-calls"), for the
 * client to approve, run or answer and send again.  Checked only when
 * caught up, so a replay of the turn goes past the waits it went past.
 */

static ngx_int_t
ngx_http_agent_aisdk_caught_up(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_conv_t *conv)
{
    ngx_http_agent_aisdk_t  *a;

    a = sub->format_ctx;

    if (conv->state != NGX_HTTP_AGENT_AWAITING_INPUT || conv->lease != 0
        || (a->turn && a->turn != conv->turn))
    {
        return NGX_OK;
    }

    if (a->turn == 0) {
        a->turn = conv->turn;
    }

    return ngx_http_agent_aisdk_end(sub, b, "tool-calls", NULL);
}


static ngx_int_t
ngx_http_agent_aisdk_event(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_uint_t type, yajl_val root)
{
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
    case NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA:
        return ngx_http_agent_aisdk_streamed(sub, b, type, root);

    case NGX_HTTP_AGENT_EV_ASSISTANT_MSG:
        return ngx_http_agent_aisdk_assistant(sub, b, root);

    case NGX_HTTP_AGENT_EV_TOOL_CALL:
        return ngx_http_agent_aisdk_tool_call(a, b, root);

    case NGX_HTTP_AGENT_EV_SUSPENSION:
        return ngx_http_agent_aisdk_suspension(a, b, root);

    case NGX_HTTP_AGENT_EV_RESOLUTION:
        return ngx_http_agent_aisdk_resolution(a, b, root);

    case NGX_HTTP_AGENT_EV_TOOL_RESULT:
        return ngx_http_agent_aisdk_tool_result(a, b, root);

    case NGX_HTTP_AGENT_EV_TOOL_PROGRESS:
        return ngx_http_agent_aisdk_progress(a, b, root);

    case NGX_HTTP_AGENT_EV_TURN_COMPLETED:
        return ngx_http_agent_aisdk_end(sub, b, "stop", NULL);

    case NGX_HTTP_AGENT_EV_TURN_HALTED:
        /* a hook stopped the turn: neither the model's stop nor an error */
        return ngx_http_agent_aisdk_end(sub, b, "other", NULL);

    case NGX_HTTP_AGENT_EV_TURN_FAILED:
        return ngx_http_agent_aisdk_failed(sub, b, root);

    case NGX_HTTP_AGENT_EV_CANCELLED:
        return ngx_http_agent_aisdk_end(sub, b, NULL, NULL);

    default:
        /* the user's message is the client's own */
        return NGX_OK;
    }
}


/*
 * A delta of the model call that streams.  A delta_seq that does not
 * go up is the first of the same call made again, after its worker
 * died: the client keeps what it was shown, and the new call's deltas
 * go on from there if they say the same (see _again()).
 */

static ngx_int_t
ngx_http_agent_aisdk_streamed(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_uint_t type, yajl_val root)
{
    ngx_str_t                s, delta;
    ngx_uint_t               seq, i;
    ngx_http_agent_aisdk_t  *a;
    ngx_http_agent_aisdk_call_t  *call;
    const char              *seq_path[] = { "delta_seq", NULL };
    yajl_val                 v;

    a = sub->format_ctx;

    if (ngx_http_agent_aisdk_get(root, "message_id", &s) != NGX_OK
        || ngx_http_agent_aisdk_step(a, b, &s) != NGX_OK
        || ngx_http_agent_aisdk_get(root, "delta", &delta) != NGX_OK)
    {
        return NGX_ERROR;
    }

    v = yajl_tree_get(root, seq_path, yajl_t_number);
    seq = (v && YAJL_IS_INTEGER(v)) ? (ngx_uint_t) YAJL_GET_INTEGER(v) : 0;

    if (seq && seq <= a->delta_seq) {

        /* a call's input the client was shown cannot be taken back */

        call = a->calls.elts;

        for (i = 0; i < a->calls.nelts; i++) {
            if (call[i].streamed && !call[i].offered) {
                return ngx_http_agent_aisdk_again(sub, b, 2, NULL);
            }
        }

        a->again = 1;
        a->again_text = 0;
        a->again_thinking = 0;
        ngx_crc32_init(a->again_text_crc);
        ngx_crc32_init(a->again_thinking_crc);
    }

    if (seq) {
        a->delta_seq = seq;
    }

    if (type == NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA) {
        return ngx_http_agent_aisdk_input_delta(a, b, root);
    }

    if (a->again) {
        return ngx_http_agent_aisdk_again(sub, b,
                   type == NGX_HTTP_AGENT_EV_THINKING_DELTA, &delta);
    }

    return ngx_http_agent_aisdk_delta(a, b,
               type == NGX_HTTP_AGENT_EV_THINKING_DELTA, &delta);
}


/*
 * A delta of a model call made again: as far as the client was shown
 * the first call's reasoning or text, it is held back; if it said the
 * same, the rest goes on in the same blocks and the client sees the
 * reply once.  If not (reasoning 2: it cannot be checked), the client's
 * message cannot be mended in this stream: it ends with an error, and a
 * resume (GET) replays the turn as the log has it.
 */

static ngx_int_t
ngx_http_agent_aisdk_again(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_uint_t reasoning, ngx_str_t *delta)
{
    size_t                   n, *done, shown;
    uint32_t                *crc, sent;
    ngx_str_t                error;
    ngx_http_agent_aisdk_t  *a;

    a = sub->format_ctx;

    if (reasoning == 2) {
        goto differs;
    }

    if (reasoning) {
        done = &a->again_thinking;
        crc = &a->again_thinking_crc;
        shown = a->thinking;
        sent = a->thinking_crc;

    } else {
        if (a->again_thinking < a->thinking) {
            /* its reasoning was shorter than the one shown */
            goto differs;
        }

        done = &a->again_text;
        crc = &a->again_text_crc;
        shown = a->text;
        sent = a->text_crc;
    }

    if (*done < shown) {
        n = ngx_min(delta->len, shown - *done);

        ngx_crc32_update(crc, delta->data, n);
        *done += n;

        if (*done < shown) {
            return NGX_OK;
        }

        if (*crc != sent) {
            goto differs;
        }

        delta->data += n;
        delta->len -= n;

        if (delta->len == 0) {
            return NGX_OK;
        }
    }

    *done += delta->len;

    return ngx_http_agent_aisdk_delta(a, b, reasoning, delta);

differs:

    ngx_str_set(&error, "the reply was made again after a failure and "
                        "differs from what was shown: resume the stream "
                        "to see it");

    if (ngx_http_agent_aisdk_close_blocks(a, b, 1, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_agent_aisdk_end(sub, b, "error", &error);
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
        ngx_crc32_update(&a->thinking_crc, delta->data, delta->len);

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
    ngx_crc32_update(&a->text_crc, delta->data, delta->len);

    return ngx_http_agent_aisdk_block(a, b, "text-delta", 0, delta);
}


/*
 * The model call's reply, logged: it closes its blocks.  What the client
 * was not sent of its reasoning and text (all of it for a subscriber
 * that came later, the end of it for one that missed deltas) goes first;
 * a client shown something else ends with an error (see _again()).
 */

static ngx_int_t
ngx_http_agent_aisdk_assistant(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, yajl_val root)
{
    ngx_int_t                rc;
    ngx_str_t                s;
    ngx_http_agent_aisdk_t  *a;

    a = sub->format_ctx;

    if (ngx_http_agent_aisdk_get(root, "message_id", &s) != NGX_OK
        || ngx_http_agent_aisdk_step(a, b, &s) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_agent_aisdk_get(root, "thinking", &s) != NGX_OK) {
        ngx_str_null(&s);
    }

    rc = ngx_http_agent_aisdk_rest(a, b, 1, &s);

    if (rc == NGX_OK) {
        if (ngx_http_agent_aisdk_get(root, "content", &s) != NGX_OK) {
            ngx_str_null(&s);
        }

        rc = ngx_http_agent_aisdk_rest(a, b, 0, &s);
    }

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_aisdk_again(sub, b, 2, NULL);
    }

    if (rc != NGX_OK) {
        return NGX_ERROR;
    }

    a->again = 0;

    return ngx_http_agent_aisdk_close_blocks(a, b, 1, 1);
}


/* NGX_DECLINED: what was sent is not the start of all */

static ngx_int_t
ngx_http_agent_aisdk_rest(ngx_http_agent_aisdk_t *a, ngx_buf_t *b,
    ngx_uint_t reasoning, ngx_str_t *all)
{
    size_t     sent;
    uint32_t   crc;
    ngx_str_t  rest;

    sent = reasoning ? a->thinking : a->text;

    if (all->len < sent) {
        return NGX_DECLINED;
    }

    ngx_crc32_init(crc);
    ngx_crc32_update(&crc, all->data, sent);

    if (crc != (reasoning ? a->thinking_crc : a->text_crc)) {
        return NGX_DECLINED;
    }

    if (all->len == sent) {
        return NGX_OK;
    }

    rest.data = all->data + sent;
    rest.len = all->len - sent;

    return ngx_http_agent_aisdk_delta(a, b, reasoning, &rest);
}


/* a failed turn: its reason and what the provider said */

static ngx_int_t
ngx_http_agent_aisdk_failed(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    yajl_val root)
{
    u_char     *p;
    ngx_int_t   rc;
    ngx_str_t   reason, error, text;

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

    rc = ngx_http_agent_aisdk_end(sub, b, "error", &text);

    if (text.data != reason.data) {
        ngx_free(text.data);
    }

    return rc;
}


/*
 * The turn ended or waits: the open step ends, then the message, with
 * an error chunk first if there is one, "finish" with its reason, or
 * "abort" (finish NULL) for a cancelled turn, and the stream with
 * [DONE].
 */

static ngx_int_t
ngx_http_agent_aisdk_end(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    char *finish, ngx_str_t *error)
{
    ngx_http_agent_aisdk_t  *a;

    a = sub->format_ctx;

    if (ngx_http_agent_aisdk_start(a, b) != NGX_OK
        || ngx_http_agent_aisdk_close_blocks(a, b, 1, 1) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (error) {
        ngx_http_agent_aisdk_open(a, "error");
        a->failed |= ngx_http_agent_json_key(a->g, "errorText");
        a->failed |= ngx_http_agent_json_str(a->g, error);

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

    if (finish == NULL) {
        if (ngx_http_agent_aisdk_simple(a, b, "abort") != NGX_OK) {
            return NGX_ERROR;
        }

    } else {
        ngx_http_agent_aisdk_open(a, "finish");
        a->failed |= ngx_http_agent_json_key(a->g, "finishReason");
        a->failed |= yajl_gen_string(a->g, (const unsigned char *) finish,
                                     ngx_strlen(finish));

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
    yajl_val                 root, v;
    ngx_http_agent_aisdk_t  *a;
    const char              *seq_path[] = { "delta_seq", NULL };

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

    v = yajl_tree_get(root, seq_path, yajl_t_number);

    if (v && YAJL_IS_INTEGER(v)) {
        a->delta_seq = (ngx_uint_t) YAJL_GET_INTEGER(v);
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

    ngx_http_agent_json_free(root);

    return rc;
}


/* "start" before anything else: the message is the turn's */

ngx_int_t
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

ngx_int_t
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
    a->delta_seq = 0;
    a->again = 0;
    ngx_crc32_init(a->text_crc);
    ngx_crc32_init(a->thinking_crc);

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


void
ngx_http_agent_aisdk_open(ngx_http_agent_aisdk_t *a, char *type)
{
    a->failed |= yajl_gen_map_open(a->g);
    a->failed |= ngx_http_agent_json_key(a->g, "type");
    a->failed |= yajl_gen_string(a->g, (const unsigned char *) type,
                                 ngx_strlen(type));
}


/* the chunk generated, as "data: JSON" and a blank line, if it fits */

ngx_int_t
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

void
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


ngx_int_t
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


ngx_uint_t
ngx_http_agent_aisdk_true(yajl_val root, char *key)
{
    yajl_val     v;
    const char  *path[] = { key, NULL };

    v = yajl_tree_get(root, path, yajl_t_true);

    return v != NULL;
}
