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


/*
 * A provider request rendered from the log: one walk over the canonical
 * events for every wire format.  The walk decides which events are sent
 * and reads what every format needs of them (an assistant message's text
 * with the mark of a partial one, its calls, its kept content; a tool
 * result's outcome); the format's functions write them.
 */


static ngx_int_t ngx_http_agent_request_walk(ngx_http_agent_request_t *r,
    ngx_uint_t *failed);
static ngx_int_t ngx_http_agent_request_read(ngx_http_agent_request_t *r,
    ngx_http_agent_request_event_t *ev);
static ngx_uint_t ngx_http_agent_request_kind(ngx_http_agent_request_t *r,
    ngx_http_agent_request_event_t *ev);
static ngx_int_t ngx_http_agent_request_cut(ngx_http_agent_request_t *r,
    ngx_http_agent_request_event_t *ev);
static ngx_uint_t ngx_http_agent_request_unsent(ngx_http_agent_request_t *r,
    yajl_val event);
static yajl_val ngx_http_agent_request_array(yajl_val event, char *key);
static ngx_uint_t ngx_http_agent_request_side(
    ngx_http_agent_request_event_t *ev);
static ngx_uint_t ngx_http_agent_request_render(ngx_http_agent_request_t *r);
static ngx_int_t ngx_http_agent_request_retention(ngx_http_agent_request_t *r);
static ngx_int_t ngx_http_agent_request_tool(ngx_http_agent_request_t *r,
    yajl_val event);
static ngx_uint_t ngx_http_agent_request_expired(ngx_http_agent_request_t *r,
    yajl_val event);
static ngx_uint_t ngx_http_agent_request_uint(yajl_val v);
static ngx_int_t ngx_http_agent_request_summary(ngx_http_agent_request_t *r);
static ngx_uint_t ngx_http_agent_request_summarized(
    ngx_http_agent_request_t *r, yajl_val event);
static ngx_int_t ngx_http_agent_request_branch(ngx_http_agent_request_t *r);
static uint64_t ngx_http_agent_request_head(ngx_str_t *event, char *name);
static ngx_uint_t ngx_http_agent_request_ordinal(ngx_http_agent_request_t *r,
    ngx_uint_t turn);


ngx_int_t
ngx_http_agent_request_build(ngx_http_agent_request_format_t *format,
    ngx_pool_t *pool, ngx_http_agent_t *agent, ngx_str_t *events,
    ngx_uint_t nevents, ngx_str_t *body)
{
    yajl_gen                  g;
    ngx_uint_t                failed;
    ngx_http_agent_request_t  r;

    ngx_memzero(&r, sizeof(ngx_http_agent_request_t));

    r.pool = pool;
    r.agent = agent;
    r.format = format;
    r.events = events;
    r.nevents = nevents;

    r.g = ngx_http_agent_json_gen(pool);
    r.sub = ngx_http_agent_json_gen(pool);

    if (r.g == NULL || r.sub == NULL
        || ngx_http_agent_request_branch(&r) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_agent_output_find(pool, r.events, r.nevents, &r.output)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    g = r.g;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "model");
    failed |= ngx_http_agent_json_str(g, &agent->model);
    failed |= format->head(&r);

    if (ngx_http_agent_request_summary(&r) != NGX_OK
        || ngx_http_agent_request_retention(&r) != NGX_OK
        || ngx_http_agent_request_walk(&r, &failed) != NGX_OK)
    {
        if (r.summary) {
            ngx_http_agent_json_free(r.summary);
        }

        return NGX_ERROR;
    }

    failed |= yajl_gen_array_close(g);

    if (format->tools) {
        failed |= format->tools(&r);

    } else if (agent->tools.nelts) {
        failed |= ngx_http_agent_json_key(g, "tools");
        failed |= ngx_http_agent_json_verbatim(g, &agent->provider_tools);
    }

    if (format->tail) {
        failed |= format->tail(&r);
    }

    if (r.output.name.len) {
        failed |= format->structured(&r);
    }

    failed |= ngx_http_agent_provider_options(g, agent);
    failed |= yajl_gen_map_close(g);

    if (r.scratch.data) {
        ngx_pfree(pool, r.scratch.data);
    }

    if (ngx_http_agent_json_result(g, failed, body) != NGX_OK) {
        /* out of memory, or a value nested deeper than yajl allows */
        ngx_log_error(NGX_LOG_ERR, pool->log, 0,
                      "%V request could not be rendered", &format->name);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The events that are sent, in order.  The walk reads one event ahead,
 * so that the format knows whether an event is the last of its side's
 * run.
 */

static ngx_int_t
ngx_http_agent_request_walk(ngx_http_agent_request_t *r, ngx_uint_t *failed)
{
    ngx_uint_t                      side;
    ngx_http_agent_request_event_t  next;

    if (ngx_http_agent_request_read(r, &r->ev) != NGX_OK) {
        return NGX_ERROR;
    }

    side = NGX_HTTP_AGENT_REQUEST_NONE;

    while (r->ev.event) {

        if (ngx_http_agent_request_read(r, &next) != NGX_OK) {
            ngx_http_agent_json_free(r->ev.event);
            return NGX_ERROR;
        }

        r->first = (ngx_http_agent_request_side(&r->ev) != side);
        side = ngx_http_agent_request_side(&r->ev);
        r->last = (next.event == NULL
                   || ngx_http_agent_request_side(&next) != side);

        *failed |= ngx_http_agent_request_render(r);

        ngx_http_agent_json_free(r->ev.event);
        r->ev = next;
    }

    return NGX_OK;
}


/* the next event that is sent; ev->event is NULL at the end of the log */

static ngx_int_t
ngx_http_agent_request_read(ngx_http_agent_request_t *r,
    ngx_http_agent_request_event_t *ev)
{
    if (r->summary) {
        ngx_memzero(ev, sizeof(ngx_http_agent_request_event_t));

        ev->event = r->summary;
        ev->kind = NGX_HTTP_AGENT_REQUEST_USER;
        ev->summary = 1;
        r->summary = NULL;

        return NGX_OK;
    }

    while (r->next < r->nevents) {
        ngx_memzero(ev, sizeof(ngx_http_agent_request_event_t));

        ev->event = ngx_http_agent_provider_event(r->pool, &r->scratch,
                                                  &r->events[r->next++]);
        if (ev->event == NULL) {
            return NGX_ERROR;
        }

        ev->kind = ngx_http_agent_request_summarized(r, ev->event)
                   ? NGX_HTTP_AGENT_REQUEST_NONE
                   : ngx_http_agent_request_kind(r, ev);

        if (ev->partial && ngx_http_agent_request_cut(r, ev) != NGX_OK) {
            ngx_http_agent_json_free(ev->event);
            return NGX_ERROR;
        }

        if (ev->kind != NGX_HTTP_AGENT_REQUEST_NONE) {
            return NGX_OK;
        }

        ngx_http_agent_json_free(ev->event);
    }

    ngx_memzero(ev, sizeof(ngx_http_agent_request_event_t));

    return NGX_OK;
}


/*
 * What an event is to the request, or none: tool calls are in their
 * assistant message, a hosted tool's result in the kept content of its,
 * and an assistant message with nothing to say is left out, since an
 * API may refuse an empty one.  Other events are the engine's own.
 */

static ngx_uint_t
ngx_http_agent_request_kind(ngx_http_agent_request_t *r,
    ngx_http_agent_request_event_t *ev)
{
    yajl_val  type;

    type = ngx_http_agent_provider_get(ev->event, "type");

    /* a hook's injection is the user's side too, where it stands */

    if (ngx_http_agent_provider_is(type, "user_msg")
        || ngx_http_agent_provider_is(type, "injection"))
    {
        return NGX_HTTP_AGENT_REQUEST_USER;
    }

    if (ngx_http_agent_provider_is(type, "tool_result")) {
        if ((!r->format->hosted
             && YAJL_IS_TRUE(ngx_http_agent_provider_get(ev->event,
                                                       "provider_executed")))
            || ngx_http_agent_request_unsent(r, ev->event))
        {
            return NGX_HTTP_AGENT_REQUEST_NONE;
        }

        return NGX_HTTP_AGENT_REQUEST_RESULT;
    }

    if (!ngx_http_agent_provider_is(type, "assistant_msg")) {
        return NGX_HTTP_AGENT_REQUEST_NONE;
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(ev->event, "content"), &ev->text)
        != NGX_OK)
    {
        ngx_str_set(&ev->text, "");
    }

    ev->partial = (ngx_http_agent_provider_partial(ev->event) != NULL);

    /*
     * a partial message's calls never ran, and its kept content may be
     * cut short: it is its text alone, marked
     */

    if (!ev->partial) {
        ev->calls = ngx_http_agent_request_array(ev->event, "tool_calls");
        ev->raw = ngx_http_agent_request_array(ev->event,
                                               "provider_content");
    }

    if (ev->partial || ev->text.len || ev->calls || ev->raw
        || r->format->silent)
    {
        return NGX_HTTP_AGENT_REQUEST_ASSISTANT;
    }

    return NGX_HTTP_AGENT_REQUEST_NONE;
}


/*
 * The calls a partial message began were never run, and are not sent:
 * their ids are kept, so that their error results are left out too.
 */

static ngx_int_t
ngx_http_agent_request_cut(ngx_http_agent_request_t *r,
    ngx_http_agent_request_event_t *ev)
{
    size_t      i;
    yajl_val    calls;
    ngx_str_t   id, *cut;

    calls = ngx_http_agent_request_array(ev->event, "tool_calls");

    if (calls == NULL) {
        return NGX_OK;
    }

    if (r->cut.elts == NULL
        && ngx_array_init(&r->cut, r->pool, 4, sizeof(ngx_str_t)) != NGX_OK)
    {
        return NGX_ERROR;
    }

    for (i = 0; i < calls->u.array.len; i++) {
        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(calls->u.array.values[i], "id"),
                &id)
            != NGX_OK)
        {
            continue;
        }

        cut = ngx_array_push(&r->cut);
        if (cut == NULL) {
            return NGX_ERROR;
        }

        cut->len = id.len;
        cut->data = ngx_pstrdup(r->pool, &id);

        if (cut->data == NULL) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the result of a call a partial message began */

static ngx_uint_t
ngx_http_agent_request_unsent(ngx_http_agent_request_t *r, yajl_val event)
{
    ngx_str_t   id, *cut;
    ngx_uint_t  i;

    if (r->cut.nelts == 0
        || ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(event, "tool_call_id"), &id)
           != NGX_OK)
    {
        return 0;
    }

    cut = r->cut.elts;

    for (i = 0; i < r->cut.nelts; i++) {
        if (cut[i].len == id.len
            && ngx_strncmp(cut[i].data, id.data, id.len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* a member that is a non-empty array, or NULL */

static yajl_val
ngx_http_agent_request_array(yajl_val event, char *key)
{
    yajl_val  v;

    v = ngx_http_agent_provider_get(event, key);

    if (!YAJL_IS_ARRAY(v) || v->u.array.len == 0) {
        return NULL;
    }

    return v;
}


/* the side an event is on: the assistant's, or the user's */

static ngx_uint_t
ngx_http_agent_request_side(ngx_http_agent_request_event_t *ev)
{
    if (ev->kind == NGX_HTTP_AGENT_REQUEST_RESULT) {
        return NGX_HTTP_AGENT_REQUEST_USER;
    }

    return ev->kind;
}


static ngx_uint_t
ngx_http_agent_request_render(ngx_http_agent_request_t *r)
{
    ngx_uint_t                        failed;
    ngx_http_agent_request_format_t  *format;

    format = r->format;

    failed = (r->first && format->open) ? format->open(r) : 0;

    switch (r->ev.kind) {

    case NGX_HTTP_AGENT_REQUEST_USER:
        failed |= format->user(r);
        break;

    case NGX_HTTP_AGENT_REQUEST_RESULT:
        if (ngx_http_agent_provider_result(r->sub, r->ev.event, &r->ev.text)
            != NGX_OK)
        {
            failed = 1;
            break;
        }

        if (r->retain && ngx_http_agent_request_expired(r, r->ev.event)) {
            if (YAJL_IS_TRUE(ngx_http_agent_provider_get(r->ev.event, "ok")))
            {
                ngx_str_set(&r->ev.text,
                            "{\"ok\":true,\"result\":\"[result expired]\"}");

            } else {
                ngx_str_set(&r->ev.text,
                            "{\"ok\":false,\"error\":\"[result expired]\"}");
            }
        }

        failed |= format->result(r);
        break;

    default: /* NGX_HTTP_AGENT_REQUEST_ASSISTANT */

        /* a partial message says so at its end */
        if (ngx_http_agent_provider_mark(r->pool, r->ev.event, &r->ev.text)
            == NGX_ERROR)
        {
            failed = 1;
            break;
        }

        failed |= format->assistant(r);
    }

    if (r->last && format->close) {
        failed |= format->close(r);
    }

    return failed;
}


/* the calls of the assistant message, each as the format writes one */

ngx_uint_t
ngx_http_agent_request_calls(ngx_http_agent_request_t *r)
{
    size_t      i;
    yajl_val    calls;
    ngx_uint_t  failed;

    calls = r->ev.calls;

    if (calls == NULL) {
        return 0;
    }

    failed = 0;

    for (i = 0; i < calls->u.array.len; i++) {
        failed |= r->format->call(r, calls->u.array.values[i]);
    }

    return failed;
}


/*
 * "name" and "arguments" of a call as the OpenAI APIs take them: the
 * arguments as a JSON text in a string, which the log keeps them as, as
 * the model sent them
 */

ngx_uint_t
ngx_http_agent_request_function(ngx_http_agent_request_t *r, yajl_val call)
{
    yajl_val    args;
    ngx_str_t   text;
    ngx_uint_t  failed;

    args = ngx_http_agent_provider_get(call, "arguments");

    failed = ngx_http_agent_json_key(r->g, "name");
    failed |= ngx_http_agent_provider_value(r->g,
                                   ngx_http_agent_provider_get(call, "name"));
    failed |= ngx_http_agent_json_key(r->g, "arguments");

    if (YAJL_IS_STRING(args)) {
        return failed | ngx_http_agent_provider_value(r->g, args);
    }

    if (ngx_http_agent_provider_text(r->sub, args, &text) != NGX_OK) {
        return 1;
    }

    return failed | ngx_http_agent_json_str(r->g, &text);
}


/*
 * A turn that asks for structured output runs no tool: the OpenAI APIs
 * are told so with "tool_choice":"none" when the agent has tools, unless
 * its options choose.
 */

ngx_uint_t
ngx_http_agent_request_no_tools(ngx_http_agent_request_t *r)
{
    ngx_uint_t  failed;

    if (r->agent->tools.nelts == 0
        || ngx_http_agent_provider_option(r->agent, "tool_choice"))
    {
        return 0;
    }

    failed = ngx_http_agent_json_key(r->g, "tool_choice");
    failed |= ngx_http_agent_json_key(r->g, "none");

    return failed;
}


/* "name","schema","strict":true of the OpenAI APIs' json_schema format */

ngx_uint_t
ngx_http_agent_request_schema(ngx_http_agent_request_t *r)
{
    yajl_gen    g;
    ngx_uint_t  failed;

    g = r->g;

    failed = ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &r->output.name);
    failed |= ngx_http_agent_json_key(g, "schema");
    failed |= ngx_http_agent_json_verbatim(g, &r->output.schema);
    failed |= ngx_http_agent_json_key(g, "strict");
    failed |= yajl_gen_bool(g, 1);

    return failed;
}


/*
 * Retention, per tool: a result older than its tool's "turns" bound, or
 * with "count" newer results of that tool, is sent as a stub; its call
 * stays, so a call is never sent without its result, and the log keeps
 * everything.  The walk needs the newest turn, and, for "count", how
 * many results of each tool the log holds: one pass before it, only for
 * an agent with such a tool.
 */

static ngx_int_t
ngx_http_agent_request_retention(ngx_http_agent_request_t *r)
{
    yajl_val                    ev;
    ngx_uint_t                  i, count, turns;
    ngx_int_t                   n;
    ngx_http_agent_tool_ref_t  *refs;

    refs = r->agent->tools.elts;
    turns = 0;
    count = 0;

    for (i = 0; i < r->agent->tools.nelts; i++) {
        turns |= refs[i].tool->retention.turns;
        count |= refs[i].tool->retention.count;
    }

    if ((turns == 0 && count == 0) || r->nevents == 0) {
        return NGX_OK;
    }

    r->retain = 1;

    if (count) {
        r->left = ngx_pcalloc(r->pool,
                              r->agent->tools.nelts * sizeof(ngx_uint_t));
        if (r->left == NULL) {
            return NGX_ERROR;
        }
    }

    for (i = r->left ? 0 : r->nevents - 1; i < r->nevents; i++) {
        ev = ngx_http_agent_provider_event(r->pool, &r->scratch,
                                           &r->events[i]);
        if (ev == NULL) {
            return NGX_ERROR;
        }

        if (i == r->nevents - 1) {
            r->turn = ngx_http_agent_request_ordinal(r,
                          ngx_http_agent_request_uint(
                              ngx_http_agent_provider_get(ev, "turn")));
        }

        if (r->left
            && ngx_http_agent_provider_is(
                   ngx_http_agent_provider_get(ev, "type"), "tool_result")
            && !ngx_http_agent_request_summarized(r, ev))
        {
            n = ngx_http_agent_request_tool(r, ev);

            if (n != NGX_DECLINED) {
                r->left[n]++;
            }
        }

        ngx_http_agent_json_free(ev);
    }

    return NGX_OK;
}


/* the index of the agent's tool a result is of, or NGX_DECLINED */

static ngx_int_t
ngx_http_agent_request_tool(ngx_http_agent_request_t *r, yajl_val event)
{
    ngx_str_t                   name;
    ngx_uint_t                  i;
    ngx_http_agent_tool_ref_t  *refs;

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(event, "name"), &name)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    refs = r->agent->tools.elts;

    for (i = 0; i < r->agent->tools.nelts; i++) {
        if (refs[i].name.len == name.len
            && ngx_strncmp(refs[i].name.data, name.data, name.len) == 0)
        {
            return i;
        }
    }

    return NGX_DECLINED;
}


static ngx_uint_t
ngx_http_agent_request_expired(ngx_http_agent_request_t *r, yajl_val event)
{
    ngx_int_t                    n;
    ngx_uint_t                   turn, expired;
    ngx_http_agent_retention_t  *retention;
    ngx_http_agent_tool_ref_t   *refs;

    n = ngx_http_agent_request_tool(r, event);

    if (n == NGX_DECLINED) {
        return 0;
    }

    refs = r->agent->tools.elts;
    retention = &refs[n].tool->retention;
    expired = 0;

    if (retention->turns) {
        turn = ngx_http_agent_request_ordinal(r,
                   ngx_http_agent_request_uint(
                       ngx_http_agent_provider_get(event, "turn")));
        expired = (turn + retention->turns <= r->turn);
    }

    if (r->left) {
        /* the results of this tool after this one */
        r->left[n]--;

        if (retention->count && r->left[n] >= retention->count) {
            expired = 1;
        }
    }

    return expired;
}


/* a positive integer member, or 0 */

static ngx_uint_t
ngx_http_agent_request_uint(yajl_val v)
{
    if (v == NULL || !YAJL_IS_INTEGER(v) || YAJL_GET_INTEGER(v) <= 0) {
        return 0;
    }

    return (ngx_uint_t) YAJL_GET_INTEGER(v);
}


/*
 * The newest summary, found from the end of the log: the events of its
 * range are left out, and its text is sent first, after the system
 * prompt, as a user message (a user message follows: the range ends at
 * a turn's end, so no call is sent without its result).
 */

static ngx_int_t
ngx_http_agent_request_summary(ngx_http_agent_request_t *r)
{
    u_char      *p;
    yajl_gen     g;
    yajl_val     ev;
    ngx_str_t    text, content, json;
    ngx_uint_t   i, failed;

    static u_char  type[] = "{\"type\":\"summary\"";

    for (i = r->nevents; i > 0; i--) {
        if (r->events[i - 1].len >= sizeof(type) - 1
            && ngx_strncmp(r->events[i - 1].data, type, sizeof(type) - 1)
               == 0)
        {
            break;
        }
    }

    if (i == 0) {
        return NGX_OK;
    }

    ev = ngx_http_agent_provider_event(r->pool, &r->scratch,
                                       &r->events[i - 1]);
    if (ev == NULL) {
        return NGX_ERROR;
    }

    r->summary_to = ngx_http_agent_request_uint(
                        ngx_http_agent_provider_get(ev, "to_seq"));

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(ev, "text"),
                                       &text)
        != NGX_OK)
    {
        ngx_str_set(&text, "");
    }

    content.len = sizeof(NGX_HTTP_AGENT_SUMMARY_PREFIX) - 1 + text.len;
    content.data = ngx_pnalloc(r->pool, content.len);

    g = ngx_http_agent_json_gen(r->pool);

    if (content.data == NULL || g == NULL) {
        ngx_http_agent_json_free(ev);
        return NGX_ERROR;
    }

    p = ngx_cpymem(content.data, NGX_HTTP_AGENT_SUMMARY_PREFIX,
                   sizeof(NGX_HTTP_AGENT_SUMMARY_PREFIX) - 1);
    ngx_memcpy(p, text.data, text.len);

    ngx_http_agent_json_free(ev);

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "user_msg");
    failed |= ngx_http_agent_json_key(g, "content");
    failed |= ngx_http_agent_json_str(g, &content);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &json) != NGX_OK) {
        return NGX_ERROR;
    }

    r->summary = ngx_http_agent_provider_event(r->pool, &r->scratch, &json);

    return r->summary ? NGX_OK : NGX_ERROR;
}


/* an event of the newest summary's range */

static ngx_uint_t
ngx_http_agent_request_summarized(ngx_http_agent_request_t *r,
    yajl_val event)
{
    ngx_uint_t  seq;

    if (r->summary_to == 0) {
        return 0;
    }

    seq = ngx_http_agent_request_uint(ngx_http_agent_provider_get(event,
                                                                  "seq"));

    return seq && seq <= r->summary_to;
}


/*
 * The current branch of the log: a rewind (to_seq N, at seq R) leaves
 * out the events between N and R, a superseded branch.  A rewind goes
 * only to a seq of the branch then current, so an event is superseded
 * exactly when a later rewind goes to before it: the walk from the end
 * keeps the lowest to_seq seen.  Without a rewind the log is the branch.
 */

static ngx_int_t
ngx_http_agent_request_branch(ngx_http_agent_request_t *r)
{
    uint64_t     seq, to;
    yajl_val     ev;
    ngx_str_t   *out;
    ngx_uint_t   i, n, rewinds, users;

    static u_char  type[] = "{\"type\":\"rewind\"";
    static u_char  user[] = "{\"type\":\"user_msg\"";

    rewinds = 0;

    for (i = 0; i < r->nevents; i++) {
        if (r->events[i].len >= sizeof(type) - 1
            && ngx_strncmp(r->events[i].data, type, sizeof(type) - 1) == 0)
        {
            rewinds++;
        }
    }

    if (rewinds == 0) {
        return NGX_OK;
    }

    out = ngx_palloc(r->pool, r->nevents * sizeof(ngx_str_t));
    r->turns = ngx_palloc(r->pool, r->nevents * sizeof(ngx_uint_t));

    if (out == NULL || r->turns == NULL) {
        return NGX_ERROR;
    }

    n = r->nevents;
    users = r->nevents;
    to = (uint64_t) -1;

    for (i = r->nevents; i > 0; i--) {
        seq = ngx_http_agent_request_head(&r->events[i - 1], ",\"seq\":");

        if (seq > to) {
            continue;
        }

        out[--n] = r->events[i - 1];

        /* the branch's turns, in order, each by its user message */

        if (r->events[i - 1].len >= sizeof(user) - 1
            && ngx_strncmp(r->events[i - 1].data, user, sizeof(user) - 1)
               == 0)
        {
            r->turns[--users] = (ngx_uint_t) ngx_http_agent_request_head(
                                    &r->events[i - 1], ",\"turn\":");
        }

        if (r->events[i - 1].len < sizeof(type) - 1
            || ngx_strncmp(r->events[i - 1].data, type, sizeof(type) - 1)
               != 0)
        {
            continue;
        }

        ev = ngx_http_agent_provider_event(r->pool, &r->scratch,
                                           &r->events[i - 1]);
        if (ev == NULL) {
            return NGX_ERROR;
        }

        to = ngx_min(to, (uint64_t) ngx_http_agent_request_uint(
                             ngx_http_agent_provider_get(ev, "to_seq")));

        ngx_http_agent_json_free(ev);
    }

    r->turns += users;
    r->nturns = r->nevents - users;

    r->events = out + n;
    r->nevents -= n;

    return NGX_OK;
}


/*
 * A member of a canonical event's head, {"type":"...","seq":N,"turn":N:
 * name is ",\"seq\":" or ",\"turn\":"; 0 if it is not there
 */

static uint64_t
ngx_http_agent_request_head(ngx_str_t *event, char *name)
{
    u_char    *p, *last;
    size_t     len;
    uint64_t   n;

    len = ngx_strlen(name);
    last = event->data + ngx_min(event->len, 96);

    p = ngx_strlcasestrn(event->data, last, (u_char *) name, len - 1);
    if (p == NULL) {
        return 0;
    }

    n = 0;

    for (p += len; p < last && *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (*p - '0');
    }

    return n;
}


/*
 * A turn's place in the branch, for retention's "turns": the turns a
 * rewind superseded do not count (without a rewind, the turn itself).
 */

static ngx_uint_t
ngx_http_agent_request_ordinal(ngx_http_agent_request_t *r, ngx_uint_t turn)
{
    ngx_uint_t  i;

    if (r->turns == NULL) {
        return turn;
    }

    for (i = 0; i < r->nturns && r->turns[i] <= turn; i++) {
        /* void */
    }

    return i;
}
