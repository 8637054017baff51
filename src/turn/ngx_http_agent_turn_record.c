
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The reply, as it arrives (live deltas) and once it is whole or cut (the
 * assistant message, its calls, the provider's hosted tools).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_spans.h"
#include "ngx_http_agent_turn_metrics.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_output.h"
#include "ngx_http_agent_tools.h"


static ngx_msec_t ngx_http_agent_turn_delta_busy(
    ngx_http_agent_main_conf_t *amcf);
static void ngx_http_agent_turn_delta_handler(ngx_event_t *ev);
static void ngx_http_agent_turn_read_pause(ngx_event_t *ev);
static void ngx_http_agent_turn_read_resume(ngx_http_agent_turn_t *t);
static u_char *ngx_http_agent_turn_delta_call(ngx_http_agent_turn_t *t,
    u_char *p);
static ngx_int_t ngx_http_agent_turn_record_call(ngx_http_agent_turn_t *t,
    ngx_array_t *events, ngx_http_agent_reply_call_t *call,
    ngx_uint_t status);
static ngx_int_t ngx_http_agent_turn_record_hosted(ngx_http_agent_turn_t *t,
    ngx_array_t *events);

#define NGX_HTTP_AGENT_DELTA_NAME_MAX  256


/* the pieces of replies this worker took in, this window and the last */
static ngx_msec_t  ngx_http_agent_delta_window;
static ngx_uint_t  ngx_http_agent_delta_pieces;
static ngx_uint_t  ngx_http_agent_delta_pieces_last;


static ngx_str_t  ngx_http_agent_status_names[] = {
    ngx_string("complete"),
    ngx_string("interrupted"),
    ngx_string("cancelled")
};


/*
 * Text and thinking deltas, and tool call arguments, as live events.
 * The deltas of one pass of the event loop are joined, kind by kind, and
 * emitted by a posted event once the upstream has been read: a provider
 * that puts many events in one read, or a burst after a pause, makes a
 * few live events, not one per token, and a subscriber that keeps up
 * (its pull is posted after them) misses none of them.  With
 * agent_delta_interval, a delta that comes sooner than that after the
 * last live event waits for the rest of the interval, joined with those
 * after it: the first delta goes at once, the rest at most once an
 * interval.  Without the directive, the same with a short interval, but
 * only while the worker is busy.
 */

void
ngx_http_agent_turn_delta(ngx_http_agent_reply_t *reply, ngx_uint_t kind,
    ngx_uint_t index, ngx_str_t *s)
{
    ngx_http_agent_turn_t *t = reply->data;

    ngx_msec_t                   interval, elapsed;
    ngx_http_agent_main_conf_t  *amcf;

    ngx_http_agent_turn_first_chunk(t);

    amcf = ngx_http_get_module_main_conf(t->request, ngx_http_agent_module);

    interval = ngx_http_agent_turn_delta_busy(amcf);

    if (t->delta.len
        && (kind != t->delta_kind || index != t->delta_index
            || t->delta.len + s->len > NGX_HTTP_AGENT_DELTA_JOIN))
    {
        ngx_http_agent_turn_delta_flush(t);
    }

    if (ngx_http_agent_bytes_append(t->request->connection->pool,
                                    &t->delta, s->data, s->len)
        != NGX_OK)
    {
        /* a live event that finds no room is dropped: the log has it all */
        t->delta.len = 0;
        return;
    }

    t->delta_kind = kind;
    t->delta_index = index;

    if (t->delta_event.posted || t->delta_event.timer_set) {
        return;
    }

    t->delta_event.handler = ngx_http_agent_turn_delta_handler;
    t->delta_event.data = t;
    t->delta_event.log = &t->log;
    t->delta_event.cancelable = 1;

    elapsed = ngx_current_msec - t->delta_sent;

    if (interval && t->delta_once && elapsed < interval) {
        ngx_add_timer(&t->delta_event, interval - elapsed);

        /* once the upstream's handler is done with what it could read */
        t->read_pause.handler = ngx_http_agent_turn_read_pause;
        t->read_pause.data = t;
        t->read_pause.log = &t->log;
        ngx_post_event(&t->read_pause, &ngx_posted_events);

        return;
    }

    ngx_post_event(&t->delta_event, &ngx_posted_events);
}


/*
 * The interval of a delta: agent_delta_interval's if set; unset, the
 * short default one while this worker takes in more pieces of replies
 * (tokens, argument chunks) than NGX_HTTP_AGENT_DELTA_BUSY in as long,
 * this window or the last, and none otherwise: a worker that streams a
 * few replies sends each piece at once, one that streams many reads
 * each provider once an interval.  The pieces are counted, not the live
 * events, so that holding them does not make the worker look idle.
 */

static ngx_msec_t
ngx_http_agent_turn_delta_busy(ngx_http_agent_main_conf_t *amcf)
{
    ngx_msec_t  elapsed;

    if (!amcf->delta_auto) {
        return amcf->delta_interval;
    }

    elapsed = ngx_current_msec - ngx_http_agent_delta_window;

    if (elapsed >= amcf->delta_interval) {
        ngx_http_agent_delta_pieces_last = (elapsed < 2 * amcf->delta_interval)
                                           ? ngx_http_agent_delta_pieces : 0;
        ngx_http_agent_delta_pieces = 0;
        ngx_http_agent_delta_window = ngx_current_msec;
    }

    ngx_http_agent_delta_pieces++;

    if (ngx_http_agent_delta_pieces > NGX_HTTP_AGENT_DELTA_BUSY
        || ngx_http_agent_delta_pieces_last > NGX_HTTP_AGENT_DELTA_BUSY)
    {
        return amcf->delta_interval;
    }

    return 0;
}


static void
ngx_http_agent_turn_delta_handler(ngx_event_t *ev)
{
    ngx_http_agent_turn_delta_flush(ev->data);
}


/* the deltas joined so far, as one live event; before any logged event */

void
ngx_http_agent_turn_delta_flush(ngx_http_agent_turn_t *t)
{
    u_char                 *p;
    size_t                  len;
    ngx_str_t               fields, s;
    ngx_uint_t              type;
    ngx_http_agent_delta_t  delta;

    static ngx_uint_t       types[] = {
        NGX_HTTP_AGENT_EV_TEXT_DELTA,
        NGX_HTTP_AGENT_EV_THINKING_DELTA,
        NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA
    };

    if (t->delta_event.posted) {
        ngx_delete_posted_event(&t->delta_event);
    }

    if (t->delta_event.timer_set) {
        ngx_del_timer(&t->delta_event);
    }

    ngx_http_agent_turn_read_resume(t);

    if (t->delta.len == 0) {
        return;
    }

    t->delta_sent = ngx_current_msec;
    t->delta_once = 1;

    s.data = t->delta.data;
    s.len = t->delta.len;
    type = types[t->delta_kind];

    len = sizeof("{\"message_id\":\"\",\"delta_seq\":,\"index\":,"
                 "\"tool_call_id\":\"\",\"name\":\"\",\"delta\":\"\"}")
          + t->message_id_len + 2 * NGX_INT_T_LEN + 6 * s.len
          + NGX_HTTP_AGENT_CALL_ID_MAX + 6 * NGX_HTTP_AGENT_DELTA_NAME_MAX;

    /* one buffer for every delta of the turn: it grows, never piles up */

    if (t->scratch.size < len) {
        if (t->scratch.data) {
            ngx_pfree(t->request->connection->pool, t->scratch.data);
        }

        t->scratch.len = 0;
        t->scratch.size = ngx_max(len, 4096);
        t->scratch.data = ngx_pnalloc(t->request->connection->pool,
                                      t->scratch.size);

        if (t->scratch.data == NULL) {
            t->scratch.size = 0;
            t->delta.len = 0;
            return;
        }
    }

    p = ngx_sprintf(t->scratch.data,
                    "{\"message_id\":\"%*s\",\"delta_seq\":%ui",
                    t->message_id_len, t->message_id, ++t->delta_seq);

    if (t->delta_kind == NGX_HTTP_AGENT_DELTA_TOOL_ARGS) {
        p = ngx_sprintf(p, ",\"index\":%ui", t->delta_index);
        p = ngx_http_agent_turn_delta_call(t, p);
    }

    p = ngx_cpymem(p, ",\"delta\":\"", sizeof(",\"delta\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, s.data, s.len);
    *p++ = '"';
    *p++ = '}';

    fields.data = t->scratch.data;
    fields.len = p - t->scratch.data;

    delta.message_id.data = t->message_id;
    delta.message_id.len = t->message_id_len;
    delta.delta_seq = t->delta_seq;
    delta.type = type;
    delta.index = t->delta_index;
    delta.data = s;

    t->delta.len = 0;

    /* a live event that finds no room is dropped: the log has it all */
    (void) ngx_http_agent_emit_delta(t->zone, &t->id, type, &fields, &delta);
}


/*
 * While a delta is held for agent_delta_interval, the provider's
 * connection is taken out of the event loop: what the provider sends
 * meanwhile waits in the socket, and is read in one go when the delta
 * goes, instead of a wake-up and a read per token.  Only a stream read
 * as it comes (proxy_buffering off) whose request is sent, with epoll,
 * and never past the upstream's read timeout.
 */

static void
ngx_http_agent_turn_read_pause(ngx_event_t *ev)
{
    ngx_http_agent_turn_t *t = ev->data;

    ngx_event_t           *rev;
    ngx_connection_t      *c;
    ngx_http_upstream_t   *u;

    if (!t->delta_event.timer_set || t->read_paused || t->sr_done
        || t->sub.sr == NULL || !(ngx_event_flags & NGX_USE_EPOLL_EVENT))
    {
        return;
    }

    u = t->sub.sr->upstream;

    if (u == NULL || u->buffering || !u->request_body_sent
        || u->peer.connection == NULL)
    {
        return;
    }

    c = u->peer.connection;
    rev = c->read;

    if (!rev->active || rev->ready || rev->eof || c->error) {
        return;
    }

    if (rev->timer_set
        && (ngx_msec_int_t) (rev->timer.key - t->delta_event.timer.key) <= 0)
    {
        return;
    }

    if (ngx_del_conn(c, 0) != NGX_OK) {
        return;
    }

    t->read_paused = 1;
}


static void
ngx_http_agent_turn_read_resume(ngx_http_agent_turn_t *t)
{
    ngx_connection_t     *c;
    ngx_http_upstream_t  *u;

    if (t->read_pause.posted) {
        ngx_delete_posted_event(&t->read_pause);
    }

    if (!t->read_paused) {
        return;
    }

    t->read_paused = 0;

    if (t->sr_done || t->sub.sr == NULL) {
        return;
    }

    u = t->sub.sr->upstream;

    if (u == NULL || u->peer.connection == NULL) {
        return;
    }

    c = u->peer.connection;

    /*
     * epoll tells at once of what came meanwhile; if the event cannot be
     * added, the upstream's read timer, left set, ends the call
     */

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent turn: the provider's connection could not "
                      "be read again");
    }
}


/*
 * A call's arguments as they stream name the call, once the provider
 * has given its id and name, so that a client can show the call before
 * it is whole; an id the module would replace is not named.
 */

static u_char *
ngx_http_agent_turn_delta_call(ngx_http_agent_turn_t *t, u_char *p)
{
    ngx_uint_t                    i;
    ngx_http_agent_reply_t       *reply;
    ngx_http_agent_reply_call_t  *call;

    reply = t->reply;

    if (reply == NULL || reply->calls.nelts == 0) {
        return p;
    }

    call = reply->calls.elts;

    for (i = 0; i < reply->calls.nelts; i++) {
        if (call[i].index == t->delta_index) {
            break;
        }
    }

    if (i == reply->calls.nelts
        || call[i].name.len == 0
        || call[i].name.len > NGX_HTTP_AGENT_DELTA_NAME_MAX
        || !ngx_http_agent_provider_call_id_ok(reply, i))
    {
        return p;
    }

    p = ngx_sprintf(p, ",\"tool_call_id\":\"%*s\",\"name\":\"",
                    call[i].id.len, call[i].id.data);
    p = (u_char *) ngx_escape_json(p, call[i].name.data, call[i].name.len);

    *p++ = '"';

    return p;
}


/* the reply has something to keep: text, thinking or a call begun */

ngx_uint_t
ngx_http_agent_turn_said(ngx_http_agent_reply_t *reply)
{
    return reply->text.len || reply->thinking.len || reply->calls.nelts;
}


/*
 * The assistant message, and a tool_call event for each call it makes.
 * A partial message (interrupted or cancelled) keeps all the model said
 * (text, thinking, the calls it began); its calls are marked with its
 * status and get an error result at once, since they never run, so that
 * the log stays paired.  The message and its calls go into the log in
 * one hold of the zone's lock: a worker that dies meanwhile leaves all of
 * them or none, never a message whose calls a take-over would not find.
 */

ngx_int_t
ngx_http_agent_turn_record(ngx_http_agent_turn_t *t, ngx_uint_t status)
{
    ngx_str_t                     fields, s, name;
    ngx_uint_t                    i;
    ngx_array_t                   events;
    ngx_http_agent_reply_t       *reply;
    ngx_http_agent_emit_event_t  *ev;
    ngx_http_agent_reply_call_t  *call;

    static char  *unrun[] = {
        NULL,
        "[failed] the reply was cut off before the call was complete; "
        "it was not run",
        "[cancelled] the reply was cancelled before the call was "
        "complete; it was not run"
    };

    reply = t->reply;

    ngx_http_agent_turn_delta_flush(t);

    t->recorded = 1;

    if (ngx_http_agent_provider_call_ids(reply) != NGX_OK) {
        return NGX_ERROR;
    }

    s.data = t->message_id;
    s.len = t->message_id_len;

    if (ngx_http_agent_provider_reply_json(reply, t->pool, &s,
                                    &ngx_http_agent_status_names[status],
                                    &fields)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_agent_spans_reply(t, &fields) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&events, t->pool, 1 + reply->calls.nelts,
                       sizeof(ngx_http_agent_emit_event_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ev = ngx_array_push(&events);
    if (ev == NULL) {
        return NGX_ERROR;
    }

    ev->type = NGX_HTTP_AGENT_EV_ASSISTANT_MSG;
    ev->fields = fields;

    if (status == NGX_HTTP_AGENT_MSG_COMPLETE
        && ngx_http_agent_turn_record_hosted(t, &events) != NGX_OK)
    {
        return NGX_ERROR;
    }

    call = reply->calls.elts;

    for (i = 0; i < reply->calls.nelts; i++) {
        if (ngx_http_agent_turn_record_call(t, &events, &call[i], status)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (ngx_http_agent_emit_all(t->zone, &t->id, events.elts, events.nelts)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (status == NGX_HTTP_AGENT_MSG_COMPLETE) {
        return NGX_OK;
    }

    for (i = 0; i < reply->calls.nelts; i++) {
        s.data = call[i].id.data;
        s.len = call[i].id.len;
        name.data = call[i].name.data;
        name.len = call[i].name.len;

        if (ngx_http_agent_turn_error_result(t, &s, &name, unrun[status])
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * A call's tool_call event, with its executor, added to the events to
 * record; marked if it is partial.
 * A tool of an MCP server is counted by its name, as a declared one is,
 * from its first call on.
 */

static ngx_int_t
ngx_http_agent_turn_record_call(ngx_http_agent_turn_t *t,
    ngx_array_t *events, ngx_http_agent_reply_call_t *call,
    ngx_uint_t status)
{
    yajl_gen                      g;
    ngx_str_t                     s, executor;
    ngx_uint_t                    failed;
    ngx_http_agent_tool_t        *tool;
    ngx_http_agent_emit_event_t  *ev;

    ngx_str_set(&executor, "unknown");

    s.data = call->name.data;
    s.len = call->name.len;

    /* a declared tool, an MCP server's, or a frontend tool of the turn */

    tool = ngx_http_agent_tools_lookup(t, &s);

    if (tool) {
        executor = ngx_http_agent_executors[tool->executor].name;
    }

    if (tool && tool->mcp) {
        ngx_http_agent_zone_lock(t->zone);
        (void) ngx_http_agent_metrics_tool_locked(t->zone, &tool->name,
                                                  tool->executor);
        ngx_http_agent_zone_unlock(t->zone);
    }

    g = ngx_http_agent_json_gen(t->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "tool_call_id");
    failed |= yajl_gen_string(g, call->id.data, call->id.len);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &s);
    failed |= ngx_http_agent_json_key(g, "arguments");
    failed |= yajl_gen_string(g, call->arguments.data, call->arguments.len);
    failed |= ngx_http_agent_json_key(g, "executor");
    failed |= ngx_http_agent_json_str(g, &executor);

    if (call->provider_id.len) {
        failed |= ngx_http_agent_json_key(g, "provider_id");
        failed |= yajl_gen_string(g, call->provider_id.data,
                                  call->provider_id.len);
    }

    if (status != NGX_HTTP_AGENT_MSG_COMPLETE) {
        failed |= ngx_http_agent_json_key(g, "status");
        failed |= ngx_http_agent_json_str(g,
                                      &ngx_http_agent_status_names[status]);
    }

    failed |= yajl_gen_map_close(g);

    ev = ngx_array_push(events);
    if (ev == NULL) {
        return NGX_ERROR;
    }

    ev->type = NGX_HTTP_AGENT_EV_TOOL_CALL;

    return ngx_http_agent_json_result(g, failed, &ev->fields);
}


/*
 * Each tool the provider ran itself, logged as a tool_call and its
 * tool_result, both marked provider_executed: paired like any other, and
 * never dispatched.
 */

static ngx_int_t
ngx_http_agent_turn_record_hosted(ngx_http_agent_turn_t *t,
    ngx_array_t *events)
{
    yajl_gen                        g;
    ngx_str_t                       s;
    ngx_uint_t                      i, k, failed;
    ngx_http_agent_emit_event_t    *ev;
    ngx_http_agent_reply_hosted_t  *h;

    static ngx_uint_t  types[] = {
        NGX_HTTP_AGENT_EV_TOOL_CALL,
        NGX_HTTP_AGENT_EV_TOOL_RESULT
    };

    if (t->reply->hosted.elts == NULL) {
        return NGX_OK;
    }

    h = t->reply->hosted.elts;

    for (i = 0; i < t->reply->hosted.nelts; i++) {

        for (k = 0; k < 2; k++) {
            g = ngx_http_agent_json_gen(t->pool);
            if (g == NULL) {
                return NGX_ERROR;
            }

            failed = yajl_gen_map_open(g);
            failed |= ngx_http_agent_json_key(g, "tool_call_id");
            failed |= yajl_gen_string(g, h[i].id.data, h[i].id.len);
            failed |= ngx_http_agent_json_key(g, "name");
            failed |= yajl_gen_string(g, h[i].name.data, h[i].name.len);

            if (k == 0) {
                failed |= ngx_http_agent_json_key(g, "arguments");
                failed |= yajl_gen_string(g, h[i].input.data,
                                          h[i].input.len);
                failed |= ngx_http_agent_json_key(g, "executor");
                failed |= yajl_gen_string(g, (u_char *) "provider", 8);

            } else {
                failed |= ngx_http_agent_json_key(g, "ok");
                failed |= yajl_gen_bool(g, 1);
                failed |= ngx_http_agent_json_key(g, "result");

                s.data = h[i].result.data;
                s.len = h[i].result.len;

                if (s.len) {
                    failed |= ngx_http_agent_json_verbatim(g, &s);

                } else {
                    failed |= yajl_gen_null(g);
                }
            }

            failed |= ngx_http_agent_json_key(g, "provider_executed");
            failed |= yajl_gen_bool(g, 1);
            failed |= yajl_gen_map_close(g);

            ev = ngx_array_push(events);
            if (ev == NULL) {
                return NGX_ERROR;
            }

            ev->type = types[k];

            if (ngx_http_agent_json_result(g, failed, &ev->fields)
                != NGX_OK)
            {
                return NGX_ERROR;
            }
        }
    }

    return NGX_OK;
}


/*
 * The reply of a turn whose message asked for structured output: its
 * JSON object is recorded with the assistant message, and the turn ends
 * there, no tool run.  A reply that is not such an object is recorded as
 * it came, and the turn fails saying why.
 */

void
ngx_http_agent_turn_structured(ngx_http_agent_turn_t *t)
{
    char       *err;
    u_char     *p;
    size_t      len;
    ngx_int_t   rc;
    ngx_str_t   reason;

    err = NULL;

    rc = ngx_http_agent_output_reply(t->reply, &t->output, &err);

    if (rc == NGX_ERROR
        || ngx_http_agent_turn_record(t, NGX_HTTP_AGENT_MSG_COMPLETE)
           != NGX_OK)
    {
        ngx_str_set(&reason, "{\"reason\":\"the reply could not be "
                             "recorded\"}");
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
        return;
    }

    if (rc == NGX_OK) {
        ngx_str_set(&reason, "{}");
        ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_COMPLETE, &reason);
        return;
    }

    ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                  "agent turn failed: output \"%V\": %s", &t->output, err);

    /* {"reason":ERR,"output":NAME}; the name is letters, digits, _ and - */

    len = ngx_strlen(err);

    p = ngx_pnalloc(t->pool, sizeof("{\"reason\":\"\",\"output\":\"\"}")
                             + 6 * len + t->output.len);
    if (p == NULL) {
        ngx_str_set(&reason, "{\"reason\":\"internal error\"}");

    } else {
        reason.data = p;

        p = ngx_cpymem(p, "{\"reason\":\"", sizeof("{\"reason\":\"") - 1);
        p = (u_char *) ngx_escape_json(p, (u_char *) err, len);
        p = ngx_sprintf(p, "\",\"output\":\"%V\"}", &t->output);

        reason.len = p - reason.data;
    }

    ngx_http_agent_turn_end(t, NGX_HTTP_AGENT_FSM_FAIL, &reason);
}
