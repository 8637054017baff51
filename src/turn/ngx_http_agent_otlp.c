
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_notify.h"
#include "ngx_http_agent_spans.h"
#include "ngx_http_agent_otlp.h"


/*
 * The exporter: OTLP/HTTP with JSON, posted to the agent_trace location
 * on a request of its own (the notifications' machinery), so that TLS,
 * credentials and upstreams are nginx's.
 *
 * The worker that records a turn's end copies the turn's events out of
 * the zone (a memcpy under the lock it holds anyway) into a queue of its
 * own, bounded by agent_trace_buffer; the spans are built after the lock,
 * in a posted event.  One export is in flight per worker: the turns that
 * end meanwhile wait, and go together in the next one.  A full queue, a
 * collector that answers other than 2xx or not in time, drop spans and
 * count them; nothing waits for the collector.
 */

#define NGX_HTTP_AGENT_OTLP_TIMEOUT  10000


typedef struct {
    ngx_queue_t                   queue;
    ngx_pool_t                   *pool;
    size_t                        size;
    ngx_uint_t                    spans;      /* as counted in the log */
    ngx_http_agent_spans_turn_t   turn;
} ngx_http_agent_otlp_job_t;


static ngx_http_agent_otlp_job_t *ngx_http_agent_otlp_job_locked(
    ngx_http_agent_conv_t *conv, ngx_queue_t *first, size_t size,
    ngx_uint_t spans);
static ngx_uint_t ngx_http_agent_otlp_sampled(ngx_http_agent_event_t *ev);
static void ngx_http_agent_otlp_flush(ngx_event_t *ev);
static ngx_int_t ngx_http_agent_otlp_body(ngx_pool_t *pool, ngx_str_t *body,
    ngx_str_t *agent, ngx_uint_t *nspans);
static void ngx_http_agent_otlp_done(void *data, ngx_uint_t status);
static void ngx_http_agent_otlp_drop(ngx_http_agent_otlp_job_t *job);


static ngx_queue_t   ngx_http_agent_otlp_jobs;
static size_t        ngx_http_agent_otlp_held;
static ngx_uint_t    ngx_http_agent_otlp_sending;  /* spans in flight */
static ngx_uint_t    ngx_http_agent_otlp_inflight;
static ngx_event_t   ngx_http_agent_otlp_event;


void
ngx_http_agent_otlp_ended_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_event_t *ev)
{
    size_t                       size;
    ngx_uint_t                   spans;
    ngx_queue_t                 *q;
    ngx_http_agent_event_t      *e;
    ngx_http_agent_otlp_job_t   *job;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    /* the turn's user_msg, back from its end; the spans it will make */

    size = 0;
    spans = 1;
    e = NULL;

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);
        size += e->len;

        if (e->type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG
            || e->type == NGX_HTTP_AGENT_EV_TOOL_CALL)
        {
            spans++;
        }

        if (e->type == NGX_HTTP_AGENT_EV_USER_MSG) {
            break;
        }
    }

    if (e == NULL || e->type != NGX_HTTP_AGENT_EV_USER_MSG
        || e->seq != conv->turn_seq)
    {
        /* the turn's start is no longer in the zone: no trace of it */
        return;
    }

    switch (ngx_http_agent_otlp_sampled(e)) {

    case 0:
        /* a failed turn is exported, sampled or not */
        if (ev->type != NGX_HTTP_AGENT_EV_TURN_FAILED) {
            return;
        }

        break;

    case 1:
        break;

    default:
        /* the turn began without a trace */
        return;
    }

    if (ngx_http_agent_otlp_held + size > amcf->trace_buffer) {
        ngx_http_agent_metrics_spans(z, 0, spans);
        return;
    }

    job = ngx_http_agent_otlp_job_locked(conv, q, size, spans);

    if (job == NULL) {
        ngx_http_agent_metrics_spans(z, 0, spans);
        return;
    }

    if (ngx_http_agent_otlp_jobs.next == NULL) {
        ngx_queue_init(&ngx_http_agent_otlp_jobs);
    }

    ngx_queue_insert_tail(&ngx_http_agent_otlp_jobs, &job->queue);
    ngx_http_agent_otlp_held += size;

    if (!ngx_http_agent_otlp_inflight && !ngx_http_agent_otlp_event.posted) {
        ngx_http_agent_otlp_event.handler = ngx_http_agent_otlp_flush;
        ngx_http_agent_otlp_event.log = ngx_cycle->log;
        ngx_post_event(&ngx_http_agent_otlp_event, &ngx_posted_events);
    }
}


/* the events from first to the log's end, copied out of the zone */

static ngx_http_agent_otlp_job_t *
ngx_http_agent_otlp_job_locked(ngx_http_agent_conv_t *conv,
    ngx_queue_t *first, size_t size, ngx_uint_t spans)
{
    u_char                     *p;
    ngx_uint_t                  n;
    ngx_pool_t                 *pool;
    ngx_queue_t                *q;
    ngx_http_agent_event_t     *e;
    ngx_http_agent_otlp_job_t  *job;

    n = 0;

    for (q = first; q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        n++;
    }

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NULL;
    }

    job = ngx_pcalloc(pool, sizeof(ngx_http_agent_otlp_job_t));
    p = ngx_pnalloc(pool, size + conv->id_len + conv->agent_len);

    if (job == NULL || p == NULL) {
        goto failed;
    }

    job->turn.events = ngx_palloc(pool, n * sizeof(ngx_str_t));
    if (job->turn.events == NULL) {
        goto failed;
    }

    job->pool = pool;
    job->size = size;
    job->spans = spans;

    for (q = first; q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        job->turn.events[job->turn.nevents].data = p;
        job->turn.events[job->turn.nevents].len = e->len;
        job->turn.nevents++;

        p = ngx_cpymem(p, e->data, e->len);
    }

    job->turn.id.data = p;
    job->turn.id.len = conv->id_len;
    p = ngx_cpymem(p, conv->id, conv->id_len);

    job->turn.agent.data = p;
    job->turn.agent.len = conv->agent_len;
    ngx_memcpy(p, conv->agent, conv->agent_len);

    return job;

failed:

    ngx_destroy_pool(pool);

    return NULL;
}


/* the user_msg's sampled flag: 1, 0, or 2 when it has no trace */

static ngx_uint_t
ngx_http_agent_otlp_sampled(ngx_http_agent_event_t *ev)
{
    u_char  *p, *last;

    static u_char  key[] = "\"traceparent\":\"";

    last = ev->data + ev->len;

    p = ngx_strlcasestrn(ev->data, last, key, sizeof(key) - 2);

    if (p == NULL || last - p < (ssize_t) (sizeof(key) - 1
                                           + NGX_HTTP_AGENT_TRACEPARENT_LEN))
    {
        return 2;
    }

    p += sizeof(key) - 1;

    return ngx_hextoi(p + NGX_HTTP_AGENT_TRACEPARENT_LEN - 2, 2) & 1;
}


/* the turns waiting, as one export, unless one is in flight */

static void
ngx_http_agent_otlp_flush(ngx_event_t *ev)
{
    ngx_int_t                    rc;
    ngx_str_t                    body, agent_name;
    ngx_uint_t                   nspans;
    ngx_pool_t                  *pool;
    ngx_http_agent_t            *agent;
    ngx_http_agent_otlp_job_t   *job;
    ngx_http_agent_main_conf_t  *amcf;

    if (ngx_http_agent_otlp_inflight
        || ngx_http_agent_otlp_jobs.next == NULL
        || ngx_queue_empty(&ngx_http_agent_otlp_jobs))
    {
        return;
    }

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    job = ngx_queue_data(ngx_queue_head(&ngx_http_agent_otlp_jobs),
                         ngx_http_agent_otlp_job_t, queue);

    /* it goes through a location of the first turn's agent's server */

    agent_name = job->turn.agent;
    agent = ngx_http_agent_conf_find(amcf, &agent_name);

    if (agent == NULL || agent->conf_ctx == NULL) {
        ngx_queue_remove(&job->queue);
        ngx_http_agent_otlp_drop(job);
        ngx_post_event(ev, &ngx_posted_events);
        return;
    }

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return;
    }

    nspans = 0;

    rc = ngx_http_agent_otlp_body(pool, &body, &agent_name, &nspans);

    if (rc == NGX_OK && nspans) {
        ngx_http_agent_otlp_inflight = 1;
        ngx_http_agent_otlp_sending = nspans;

        if (ngx_http_agent_notify_post_handler(agent, &amcf->trace, &body,
                                               NULL, 0,
                                               NGX_HTTP_AGENT_OTLP_TIMEOUT,
                                               ngx_http_agent_otlp_done, NULL)
            != NGX_OK)
        {
            ngx_http_agent_otlp_inflight = 0;
            ngx_http_agent_metrics_spans(amcf->zone, 0, nspans);
        }
    }

    ngx_destroy_pool(pool);
}


/*
 * {"resourceSpans":[{"resource":{...},"scopeSpans":[{"scope":{...},
 * "spans":[...]}]}]}: the turns of the agent's, of those waiting
 */

static ngx_int_t
ngx_http_agent_otlp_body(ngx_pool_t *pool, ngx_str_t *body,
    ngx_str_t *agent, ngx_uint_t *nspans)
{
    yajl_gen                     g;
    ngx_str_t                    s;
    ngx_uint_t                   failed, n;
    ngx_queue_t                 *q, *next;
    ngx_http_agent_otlp_job_t   *job;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "resourceSpans");
    failed |= yajl_gen_array_open(g);
    failed |= yajl_gen_map_open(g);

    failed |= ngx_http_agent_json_key(g, "resource");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "attributes");
    failed |= yajl_gen_array_open(g);
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "key");
    failed |= ngx_http_agent_json_key(g, "service.name");
    failed |= ngx_http_agent_json_key(g, "value");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "stringValue");
    failed |= ngx_http_agent_json_str(g, &amcf->trace_service);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_array_close(g);
    failed |= yajl_gen_map_close(g);

    failed |= ngx_http_agent_json_key(g, "scopeSpans");
    failed |= yajl_gen_array_open(g);
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "scope");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_key(g, "ngx_http_agent_module");
    failed |= ngx_http_agent_json_key(g, "version");
    failed |= ngx_http_agent_json_key(g, NGX_HTTP_AGENT_VERSION);
    failed |= yajl_gen_map_close(g);

    failed |= ngx_http_agent_json_key(g, "spans");
    failed |= yajl_gen_array_open(g);

    for (q = ngx_queue_head(&ngx_http_agent_otlp_jobs);
         q != ngx_queue_sentinel(&ngx_http_agent_otlp_jobs);
         q = next)
    {
        next = ngx_queue_next(q);
        job = ngx_queue_data(q, ngx_http_agent_otlp_job_t, queue);

        s = job->turn.agent;

        if (s.len != agent->len
            || ngx_strncmp(s.data, agent->data, s.len) != 0)
        {
            continue;
        }

        ngx_queue_remove(q);

        job->turn.content = amcf->trace_content;
        n = 0;

        if (failed
            || ngx_http_agent_spans_build(job->pool, g, &job->turn, &n)
               != NGX_OK)
        {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "agent trace: the spans of a turn of \"%V\" "
                          "could not be built", &job->turn.id);
            failed = 1;
            ngx_http_agent_otlp_drop(job);
            continue;
        }

        *nspans += n;
        ngx_http_agent_otlp_held -= job->size;
        ngx_destroy_pool(job->pool);
    }

    failed |= yajl_gen_array_close(g);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_array_close(g);
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_array_close(g);
    failed |= yajl_gen_map_close(g);

    if (failed) {
        ngx_http_agent_metrics_spans(amcf->zone, 0, *nspans);
        *nspans = 0;
        return NGX_ERROR;
    }

    return ngx_http_agent_json_result(g, failed, body);
}


static void
ngx_http_agent_otlp_done(void *data, ngx_uint_t status)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    ngx_http_agent_metrics_spans(amcf->zone,
                                 status >= NGX_HTTP_OK
                                 && status < NGX_HTTP_SPECIAL_RESPONSE,
                                 ngx_http_agent_otlp_sending);

    ngx_http_agent_otlp_inflight = 0;
    ngx_http_agent_otlp_sending = 0;

    if (!ngx_queue_empty(&ngx_http_agent_otlp_jobs)
        && !ngx_http_agent_otlp_event.posted)
    {
        ngx_post_event(&ngx_http_agent_otlp_event, &ngx_posted_events);
    }
}


/*
 * A worker that exits (a fast stop, worker_shutdown_timeout) with turns
 * still queued, or an export in flight: their spans are dropped, counted
 * and said; a graceful exit sends them first, as it waits for the
 * export's request.
 */

void
ngx_http_agent_otlp_exit(ngx_log_t *log)
{
    ngx_uint_t                   turns, spans;
    ngx_queue_t                 *q;
    ngx_http_agent_otlp_job_t   *job;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    turns = 0;
    spans = 0;

    if (ngx_http_agent_otlp_inflight) {
        spans = ngx_http_agent_otlp_sending;
        ngx_http_agent_metrics_spans(amcf->zone, 0, spans);

        ngx_http_agent_otlp_inflight = 0;
        ngx_http_agent_otlp_sending = 0;
    }

    while (ngx_http_agent_otlp_jobs.next
           && !ngx_queue_empty(&ngx_http_agent_otlp_jobs))
    {
        q = ngx_queue_head(&ngx_http_agent_otlp_jobs);
        ngx_queue_remove(q);

        job = ngx_queue_data(q, ngx_http_agent_otlp_job_t, queue);

        turns++;
        spans += job->spans;

        ngx_http_agent_otlp_drop(job);
    }

    if (spans) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "agent trace: %ui spans dropped as the worker exits "
                      "(%ui turns not sent)", spans, turns);
    }
}


static void
ngx_http_agent_otlp_drop(ngx_http_agent_otlp_job_t *job)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    ngx_http_agent_metrics_spans(amcf->zone, 0, job->spans);

    ngx_http_agent_otlp_held -= job->size;
    ngx_destroy_pool(job->pool);
}
