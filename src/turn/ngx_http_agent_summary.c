
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_history.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_budget.h"
#include "ngx_http_agent_detached.h"
#include "ngx_http_agent_summary.h"


/*
 * Summaries: when a turn's context passed the agent's context_budget,
 * the turns before the last one are summed up by a model call, so that
 * later model calls send system + summary + the turns since.  The call
 * runs after the turn, on a detached request of its own, so no turn waits
 * for it; a claim in the conversation's record makes it one at a time.
 * Its input is the newest summary and the events after its range, up to
 * the end of a turn (a call and its result are always on one side), and
 * the summary prompt; its reply's text becomes a canonical summary event
 * {from_seq, to_seq, text}.  A failed call records nothing: the context
 * stays as it was, and the next turn past the budget tries again.
 */


typedef struct {
    /* first: what the filters see of the subrequest's ctx */
    ngx_http_agent_sub_t          sub;

    ngx_pool_t                   *pool;
    ngx_http_request_t           *request;
    ngx_http_agent_t             *agent;
    ngx_http_agent_zone_t        *zone;

    u_char                        id_data[NGX_HTTP_AGENT_ID_LEN];
    ngx_str_t                     id;

    /* the range summed up ends at to; the store's part of it, upto */
    uint64_t                      to;
    uint64_t                      upto;

    /* the events read from the store, then those of the zone */
    ngx_array_t                   events;     /* ngx_str_t */

    /* reads of the store: the zone may give it more meanwhile */
    ngx_uint_t                    reads;

    ngx_http_agent_reply_t       *reply;
    ngx_uint_t                    status;
    unsigned                      parse_error:1;
    unsigned                      done:1;

    ngx_event_t                   event;
    ngx_event_t                   deadline;
    ngx_log_t                     log;
    ngx_http_log_ctx_t            log_ctx;
    ngx_http_conf_ctx_t           conf_ctx;
} ngx_http_agent_summary_t;


static ngx_http_agent_summary_t *ngx_http_agent_summary_claim(
    ngx_http_agent_t *agent, ngx_http_agent_zone_t *zone, ngx_str_t *id);
static void ngx_http_agent_summary_read(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static ngx_int_t ngx_http_agent_summary_add(ngx_http_agent_summary_t *s,
    ngx_str_t *data, uint64_t seq, ngx_uint_t type);
static void ngx_http_agent_summary_send(ngx_http_agent_summary_t *s);
static void ngx_http_agent_summary_fetch(ngx_http_agent_summary_t *s);
static ngx_int_t ngx_http_agent_summary_collect(ngx_http_agent_summary_t *s);
static ngx_int_t ngx_http_agent_summary_body(ngx_http_agent_summary_t *s,
    ngx_str_t *body);
static ngx_int_t ngx_http_agent_summary_done(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_agent_summary_timeout(ngx_event_t *ev);
static void ngx_http_agent_summary_finish(ngx_event_t *ev);
static ngx_int_t ngx_http_agent_summary_record(ngx_http_agent_summary_t *s);
static void ngx_http_agent_summary_release(ngx_http_agent_summary_t *s,
    char *failed);
static ngx_int_t ngx_http_agent_summary_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_summary_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_agent_summary_take(void *data, u_char *p,
    u_char *last);
static u_char *ngx_http_agent_summary_log_error(ngx_log_t *log, u_char *buf,
    size_t len);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/* above the turn's filters, which take any other subrequest of theirs */

ngx_int_t
ngx_http_agent_summary_init_filters(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_agent_summary_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_agent_summary_body_filter;

    return NGX_OK;
}


ngx_uint_t
ngx_http_agent_summary_due(ngx_http_agent_turn_t *t)
{
    uint64_t                 tokens;
    ngx_http_agent_reply_t  *reply;

    if (t->agent->context_budget <= 0 || t->reply == NULL) {
        return 0;
    }

    reply = t->reply;

    if (reply->input_tokens) {
        tokens = (uint64_t) reply->input_tokens + reply->output_tokens;

    } else {
        tokens = (t->context_len + reply->text.len)
                 / NGX_HTTP_AGENT_TOKEN_BYTES;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent turn \"%V\": context of %uL tokens, budget %i",
                   &t->id, tokens, t->agent->context_budget);

    return tokens > (uint64_t) t->agent->context_budget;
}


void
ngx_http_agent_summary_start(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *zone, ngx_str_t *id)
{
    ngx_http_agent_summary_t  *s;

    s = ngx_http_agent_summary_claim(agent, zone, id);

    if (s == NULL) {
        return;
    }

    s->request = ngx_http_agent_detached_create(s->pool, &s->log,
                                                &s->log_ctx, &s->conf_ctx);
    if (s->request == NULL) {
        ngx_http_agent_summary_release(s, "no request");
        ngx_destroy_pool(s->pool);
        return;
    }

    /* the events that left the zone are read from the store first */

    if (s->upto) {
        ngx_http_agent_summary_fetch(s);
        return;
    }

    ngx_http_agent_summary_send(s);
}


static void
ngx_http_agent_summary_fetch(ngx_http_agent_summary_t *s)
{
    s->reads++;
    s->events.nelts = 0;

    if (ngx_http_agent_store_read(s->pool, &s->id,
                                  NGX_HTTP_AGENT_STORE_SUMMARY, s->upto,
                                  ngx_http_agent_summary_read, s)
        != NGX_OK)
    {
        ngx_http_agent_summary_release(s, "the store cannot be read");
        ngx_http_agent_detached_close(s->request);
    }
}


/*
 * The conversation is claimed for a summary, if none is being made and
 * a turn ended after the newest summary's range.
 */

static ngx_http_agent_summary_t *
ngx_http_agent_summary_claim(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *zone, ngx_str_t *id)
{
    uint64_t                   to, upto;
    ngx_pool_t                *pool;
    ngx_http_agent_conv_t     *conv;
    ngx_http_agent_summary_t  *s;

    ngx_http_agent_zone_lock(zone);

    conv = ngx_http_agent_conv_find_locked(zone, id);

    if (conv == NULL
        || (conv->summarizing
            && ngx_time() - conv->summary_started
               < NGX_HTTP_AGENT_SUMMARY_HOLD))
    {
        ngx_http_agent_zone_unlock(zone);
        return NULL;
    }

    /* the turns before the last one started */

    to = conv->turn_seq ? conv->turn_seq - 1 : 0;

    if (to <= conv->summary_to) {
        ngx_http_agent_zone_unlock(zone);
        return NULL;
    }

    conv->summarizing = ngx_pid;
    conv->summary_started = ngx_time();

    upto = zone->store ? conv->base : 0;

    ngx_http_agent_zone_unlock(zone);

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        goto failed;
    }

    s = ngx_pcalloc(pool, sizeof(ngx_http_agent_summary_t));
    if (s == NULL
        || ngx_array_init(&s->events, pool, 16, sizeof(ngx_str_t)) != NGX_OK)
    {
        ngx_destroy_pool(pool);
        goto failed;
    }

    s->pool = pool;
    s->agent = agent;
    s->zone = zone;
    s->to = to;
    s->upto = upto;
    s->conf_ctx = *agent->conf_ctx;

    ngx_memcpy(s->id_data, id->data, id->len);
    s->id.data = s->id_data;
    s->id.len = id->len;

    s->log = *ngx_cycle->log;
    s->log.handler = ngx_http_agent_summary_log_error;
    s->log.data = &s->log_ctx;
    s->log.action = NULL;
    pool->log = &s->log;

    return s;

failed:

    ngx_http_agent_zone_lock(zone);

    conv = ngx_http_agent_conv_find_locked(zone, id);

    if (conv && conv->summarizing == ngx_pid) {
        conv->summarizing = 0;
    }

    ngx_http_agent_zone_unlock(zone);

    return NULL;
}


static void
ngx_http_agent_summary_read(ngx_http_agent_store_read_t *rd, ngx_int_t rc,
    void *data)
{
    ngx_http_agent_summary_t  *s = data;

    ngx_uint_t                     i;
    ngx_http_agent_store_event_t  *ev;

    if (rc != NGX_OK || rd->upto < rd->after
        || rd->events->nelts != rd->upto - rd->after)
    {
        ngx_http_agent_summary_release(s, "the store could not be read");
        ngx_http_agent_detached_close(s->request);
        return;
    }

    ev = rd->events->elts;

    for (i = 0; i < rd->events->nelts; i++) {
        if (ngx_http_agent_summary_add(s, &ev[i].data, ev[i].seq, ev[i].type)
            != NGX_OK)
        {
            ngx_http_agent_summary_release(s, "no memory");
            ngx_http_agent_detached_close(s->request);
            return;
        }
    }

    ngx_http_agent_summary_send(s);
}


/* an event of the input: the range and the summaries (the newest counts) */

static ngx_int_t
ngx_http_agent_summary_add(ngx_http_agent_summary_t *s, ngx_str_t *data,
    uint64_t seq, ngx_uint_t type)
{
    ngx_str_t  *e;

    if (seq > s->to && type != NGX_HTTP_AGENT_EV_SUMMARY) {
        return NGX_OK;
    }

    e = ngx_array_push(&s->events);
    if (e == NULL) {
        return NGX_ERROR;
    }

    e->len = data->len;
    e->data = ngx_pnalloc(s->pool, data->len);

    if (e->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(e->data, data->data, data->len);

    return NGX_OK;
}


static void
ngx_http_agent_summary_send(ngx_http_agent_summary_t *s)
{
    ngx_int_t                    rc;
    ngx_str_t                    body;
    ngx_http_request_t          *sr;
    ngx_http_agent_reply_t      *reply;
    ngx_http_post_subrequest_t  *ps;

    rc = ngx_http_agent_summary_collect(s);

    if (rc == NGX_AGAIN && s->reads < 4) {
        ngx_http_agent_summary_fetch(s);
        return;
    }

    if (rc != NGX_OK || ngx_http_agent_summary_body(s, &body) != NGX_OK) {
        ngx_http_agent_summary_release(s, "its request could not be built");
        ngx_http_agent_detached_close(s->request);
        return;
    }

    reply = ngx_pcalloc(s->pool, sizeof(ngx_http_agent_reply_t));
    ps = ngx_palloc(s->pool, sizeof(ngx_http_post_subrequest_t));

    if (reply == NULL || ps == NULL
        || ngx_array_init(&reply->calls, s->pool, 2,
                          sizeof(ngx_http_agent_reply_call_t))
           != NGX_OK)
    {
        goto failed;
    }

    reply->pool = s->pool;
    reply->log = &s->log;
    s->reply = reply;

    if (s->agent->provider->init(reply) != NGX_OK) {
        goto failed;
    }

    ps->handler = ngx_http_agent_summary_done;
    ps->data = s;

    if (ngx_http_agent_detached_subrequest(s->request,
                                           &s->agent->provider_location,
                                           &body, NULL, 0, ps, &sr)
        != NGX_OK)
    {
        goto failed;
    }

    /* the body is a conversation: no client's limit is for it */
    sr->discard_body = 1;

    s->sub.kind = NGX_HTTP_AGENT_SUB_SUMMARY;
    s->sub.sr = sr;
    ngx_http_set_ctx(sr, s, ngx_http_agent_module);

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, &s->log, 0,
                   "agent summary \"%V\": up to seq %uL, %uz bytes",
                   &s->id, s->to, body.len);

    s->deadline.handler = ngx_http_agent_summary_timeout;
    s->deadline.data = s;
    s->deadline.log = &s->log;

    ngx_add_timer(&s->deadline, s->agent->model_timeout);

    ngx_http_run_posted_requests(s->request->connection);

    return;

failed:

    ngx_http_agent_summary_release(s, "its model call could not start");
    ngx_http_agent_detached_close(s->request);
}


/*
 * The zone's part: its log is what follows the store's part, unless more
 * left it since the read, which is then incomplete.
 */

static ngx_int_t
ngx_http_agent_summary_collect(ngx_http_agent_summary_t *s)
{
    ngx_str_t                data;
    ngx_queue_t             *q;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *ev;

    ngx_http_agent_zone_lock(s->zone);

    conv = ngx_http_agent_conv_find_locked(s->zone, &s->id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(s->zone);
        return NGX_ERROR;
    }

    if (s->zone->store && conv->base != s->upto) {
        /* the zone gave the store more of the log since it was read */
        s->upto = conv->base;
        ngx_http_agent_zone_unlock(s->zone);
        return NGX_AGAIN;
    }

    for (q = ngx_http_agent_log_context_locked(conv, 0);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        data.data = ev->data;
        data.len = ev->len;

        if (ngx_http_agent_summary_add(s, &data, ev->seq, ev->type)
            != NGX_OK)
        {
            ngx_http_agent_zone_unlock(s->zone);
            return NGX_ERROR;
        }
    }

    ngx_http_agent_zone_unlock(s->zone);

    return NGX_OK;
}


/*
 * The request: the summary model, the agent's system prompt and tools
 * (an API may refuse calls in the messages without them), the input and
 * the summary prompt as the last user message.
 */

static ngx_int_t
ngx_http_agent_summary_body(ngx_http_agent_summary_t *s, ngx_str_t *body)
{
    yajl_gen           g;
    ngx_str_t         *e;
    ngx_uint_t         failed;
    ngx_http_agent_t  *agent;

    agent = ngx_palloc(s->pool, sizeof(ngx_http_agent_t));
    g = ngx_http_agent_json_gen(s->pool);
    e = ngx_array_push(&s->events);

    if (agent == NULL || g == NULL || e == NULL) {
        return NGX_ERROR;
    }

    *agent = *s->agent;
    agent->model = s->agent->summary_model;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "type");
    failed |= ngx_http_agent_json_key(g, "user_msg");
    failed |= ngx_http_agent_json_key(g, "content");
    failed |= ngx_http_agent_json_str(g, &s->agent->summary_prompt);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, e) != NGX_OK) {
        return NGX_ERROR;
    }

    return agent->provider->build_request(s->pool, agent, s->events.elts,
                                          s->events.nelts, body);
}


static ngx_int_t
ngx_http_agent_summary_done(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_agent_summary_t  *s = data;

    if (s->done) {
        return rc;
    }

    s->done = 1;

    if (s->deadline.timer_set) {
        ngx_del_timer(&s->deadline);
    }

    if (s->status == 0 && rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        s->status = rc;
    }

    /* the summary is recorded once nginx is done with the subrequest */

    s->event.handler = ngx_http_agent_summary_finish;
    s->event.data = s;
    s->event.log = &s->log;

    ngx_post_event(&s->event, &ngx_posted_events);

    return ngx_http_agent_detached_rc(rc);
}


static void
ngx_http_agent_summary_timeout(ngx_event_t *ev)
{
    ngx_http_agent_summary_t  *s = ev->data;

    if (s->done || s->sub.sr == NULL) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, &s->log, 0, "agent summary: the model call "
                  "took longer than model_timeout (%M ms)",
                  s->agent->model_timeout);

    s->done = 1;
    s->status = 0;

    ngx_http_agent_tools_abort(s->sub.sr);
    s->sub.sr = NULL;

    s->event.handler = ngx_http_agent_summary_finish;
    s->event.data = s;
    s->event.log = &s->log;

    ngx_post_event(&s->event, &ngx_posted_events);
}


static void
ngx_http_agent_summary_finish(ngx_event_t *ev)
{
    ngx_http_agent_summary_t  *s = ev->data;

    char                    *failed;
    ngx_http_agent_reply_t  *reply;

    s->sub.sr = NULL;
    reply = s->reply;

    failed = NULL;

    if (s->status < NGX_HTTP_OK || s->status >= NGX_HTTP_SPECIAL_RESPONSE) {
        failed = "the provider failed";

    } else if (s->parse_error
               || s->agent->provider->finish(reply) != NGX_OK
               || !reply->complete || reply->error_type.len)
    {
        failed = "the reply was cut short or an error";

    } else if (reply->text.len == 0) {
        failed = "the reply has no text";
    }

    ngx_http_agent_budget_charge(&s->id, (uint64_t) reply->input_tokens
                                         + reply->output_tokens);

    if (failed == NULL && ngx_http_agent_summary_record(s) != NGX_OK) {
        failed = "it could not be recorded";
    }

    ngx_http_agent_summary_release(s, failed);
    ngx_http_agent_detached_close(s->request);
}


static ngx_int_t
ngx_http_agent_summary_record(ngx_http_agent_summary_t *s)
{
    uint64_t                   seq;
    yajl_gen                   g;
    ngx_str_t                  fields, text;
    ngx_uint_t                 n, failed;
    ngx_pid_t                  pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_conv_t     *conv;
    ngx_http_agent_event_t    *ev;
    ngx_http_agent_history_t  *kept;

    g = ngx_http_agent_json_gen(s->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    text.data = s->reply->text.data;
    text.len = s->reply->text.len;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "from_seq");
    failed |= yajl_gen_integer(g, 1);
    failed |= ngx_http_agent_json_key(g, "to_seq");
    failed |= yajl_gen_integer(g, s->to);
    failed |= ngx_http_agent_json_key(g, "model");
    failed |= ngx_http_agent_json_str(g, &s->agent->summary_model);
    failed |= ngx_http_agent_json_key(g, "text");
    failed |= ngx_http_agent_json_str(g, &text);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_agent_zone_lock(s->zone);

    conv = ngx_http_agent_conv_find_locked(s->zone, &s->id);

    if (conv == NULL || conv->summary_to >= s->to) {
        ngx_http_agent_zone_unlock(s->zone);
        return NGX_ERROR;
    }

    ev = ngx_http_agent_log_add_locked(s->zone, conv,
                                       NGX_HTTP_AGENT_EV_SUMMARY, &fields);
    if (ev == NULL) {
        ngx_http_agent_zone_unlock(s->zone);
        return NGX_ERROR;
    }

    conv->summary_to = s->to;
    seq = ev->seq;

    kept = ngx_http_agent_store_history_add_locked(conv);

    n = ngx_http_agent_conv_sub_pids_locked(conv, pids);

    ngx_http_agent_zone_unlock(s->zone);

    ngx_http_agent_store_history_keep(kept);

    ngx_http_agent_wake(&s->id, pids, n);

    ngx_log_error(NGX_LOG_INFO, &s->log, 0,
                  "agent summary of seq 1 to %uL recorded as seq %uL",
                  s->to, seq);

    return NGX_OK;
}


/* the claim is given back; a failure is logged, and changes nothing */

static void
ngx_http_agent_summary_release(ngx_http_agent_summary_t *s, char *failed)
{
    ngx_http_agent_conv_t  *conv;

    if (s->deadline.timer_set) {
        ngx_del_timer(&s->deadline);
    }

    ngx_http_agent_zone_lock(s->zone);

    conv = ngx_http_agent_conv_find_locked(s->zone, &s->id);

    if (conv && conv->summarizing == ngx_pid) {
        conv->summarizing = 0;
    }

    ngx_http_agent_zone_unlock(s->zone);

    if (failed) {
        ngx_log_error(NGX_LOG_WARN, &s->log, 0,
                      "agent summary failed: %s (status %ui), the context "
                      "stays as it is", failed, s->status);
    }
}


static ngx_int_t
ngx_http_agent_summary_header_filter(ngx_http_request_t *r)
{
    ngx_http_agent_sub_t      *sub;
    ngx_http_agent_summary_t  *s;

    sub = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (sub == NULL || r != sub->sr
        || sub->kind != NGX_HTTP_AGENT_SUB_SUMMARY)
    {
        return ngx_http_next_header_filter(r);
    }

    s = (ngx_http_agent_summary_t *) sub;
    s->status = r->headers_out.status;

    r->header_sent = 1;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_summary_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                  rc;
    ngx_http_agent_sub_t      *sub;
    ngx_http_agent_summary_t  *s;

    sub = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (sub == NULL || r != sub->sr
        || sub->kind != NGX_HTTP_AGENT_SUB_SUMMARY)
    {
        return ngx_http_next_body_filter(r, in);
    }

    s = (ngx_http_agent_summary_t *) sub;

    rc = ngx_http_agent_detached_take(in, ngx_http_agent_summary_take, s);

    if (rc != NGX_OK) {
        s->parse_error = 1;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_summary_take(void *data, u_char *p, u_char *last)
{
    ngx_http_agent_summary_t  *s = data;

    if (!s->parse_error
        && s->status >= NGX_HTTP_OK && s->status < NGX_HTTP_SPECIAL_RESPONSE
        && s->agent->provider->feed(s->reply, p, last) != NGX_OK)
    {
        s->parse_error = 1;
    }

    return NGX_OK;
}


static u_char *
ngx_http_agent_summary_log_error(ngx_log_t *log, u_char *buf, size_t len)
{
    ngx_http_agent_summary_t  *s;

    s = (ngx_http_agent_summary_t *)
            ((u_char *) log->data - offsetof(ngx_http_agent_summary_t,
                                             log_ctx));

    return ngx_snprintf(buf, len, ", agent summary: \"%V\", conversation: "
                        "\"%V\"", &s->agent->name, &s->id);
}
