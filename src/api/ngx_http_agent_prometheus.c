
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * agent_metrics: the zone's counters in Prometheus' text exposition
 * format (0.0.4).  Names follow the OpenTelemetry GenAI semantic
 * conventions where they have one (gen_ai.client.token.usage becomes
 * gen_ai_client_token_usage, its attribute gen_ai.request.model the
 * label gen_ai_request_model), the module's own are agent_*.  Counters
 * are read without the lock; the gauges that walk the conversations
 * (subscribers, store lag) take it once per scrape.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_bytes.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_zone_status.h"
#include "ngx_http_agent_prometheus.h"


typedef struct {
    ngx_pool_t                   *pool;
    ngx_http_agent_bytes_t        out;
    ngx_int_t                     failed;
} ngx_http_agent_prom_t;


static ngx_int_t ngx_http_agent_prometheus_handler(ngx_http_request_t *r);
static void ngx_http_agent_prom_print(ngx_http_agent_prom_t *p,
    const char *fmt, ...);
static void ngx_http_agent_prom_head(ngx_http_agent_prom_t *p, char *name,
    char *type, char *help);
static void ngx_http_agent_prom_label(ngx_http_agent_prom_t *p, char *name,
    u_char *value, size_t len);
static void ngx_http_agent_prom_hist(ngx_http_agent_prom_t *p, char *name,
    ngx_str_t *labels, ngx_http_agent_hist_t *h, ngx_uint_t hist);
static void ngx_http_agent_prom_seconds(ngx_http_agent_prom_t *p,
    uint64_t value, ngx_uint_t usec);
static void ngx_http_agent_prom_model(ngx_http_agent_prom_t *p,
    ngx_http_agent_metrics_sh_t *m);
static void ngx_http_agent_prom_tools(ngx_http_agent_prom_t *p,
    ngx_http_agent_metrics_sh_t *m);
static void ngx_http_agent_prom_zone(ngx_http_agent_prom_t *p,
    ngx_http_agent_zone_t *z, ngx_uint_t store);


static char  *ngx_http_agent_prom_outcomes[] = {
    "completed", "failed", "cancelled", "halted"
};

static char  *ngx_http_agent_prom_statuses[] = {
    "ok", "retry", "error", "cancelled"
};

/* the store's times: a batch's write, an input's wait for it */
static char  *ngx_http_agent_prom_store_times[][2] = {
    { "agent_store_write_seconds",
      "Time a batch took on the pool's thread, from its transaction's "
      "start to its commit." },
    { "agent_store_ack_seconds",
      "Time an input (a message, a resolution, a cancel) waited, once "
      "logged, for its write before it was answered." }
};

static char  *ngx_http_agent_prom_tokens[] = {
    "input", "output", "cached_input"
};

static char  *ngx_http_agent_prom_kinds[] = {
    NULL, "approval", "elicitation", "client_exec"
};

static char  *ngx_http_agent_prom_decisions[] = {
    "approve", "reject", "answered", "expired", "cancelled"
};


char *
ngx_http_agent_prometheus(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler) {
        return "is duplicate";
    }

    clcf->handler = ngx_http_agent_prometheus_handler;

    /* nginx's own errors there are answered as JSON too */
    alcf->status = 1;

    return NGX_CONF_OK;
}


/*
 * The configuration's agents and tools get their slots in the zone; a
 * reload that keeps the zone finds those it had.  The first tool slot
 * counts the calls of tools nobody declared.
 */

ngx_int_t
ngx_http_agent_prometheus_init_process(ngx_cycle_t *cycle)
{
    ngx_int_t                    rc;
    ngx_str_t                    unknown;
    ngx_uint_t                   i;
    ngx_http_agent_t           **agent;
    ngx_http_agent_tool_t      **tool;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);
    z = amcf->zone;

    ngx_str_set(&unknown, "_unknown");

    ngx_http_agent_zone_lock(z);

    rc = ngx_http_agent_metrics_tool_locked(z, &unknown, 4);

    tool = amcf->tools.elts;

    for (i = 0; rc == NGX_OK && i < amcf->tools.nelts; i++) {
        rc = ngx_http_agent_metrics_tool_locked(z, &tool[i]->name,
                                                tool[i]->executor);
    }

    agent = amcf->agents.elts;

    for (i = 0; rc == NGX_OK && i < amcf->agents.nelts; i++) {
        rc = ngx_http_agent_metrics_agent_locked(z, &agent[i]->name,
                                                 &agent[i]->model,
                                         &agent[i]->provider->name);
    }

    ngx_http_agent_zone_unlock(z);

    if (rc != NGX_OK && z->sh->metrics) {
        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "agent zone \"%V\" counts the metrics of at most %d "
                      "agents and %d tools, with names of at most %d bytes; "
                      "some are not counted", &z->shm_zone->shm.name,
                      NGX_HTTP_AGENT_METRICS_AGENTS,
                      NGX_HTTP_AGENT_METRICS_TOOLS - 1,
                      NGX_HTTP_AGENT_METRICS_NAME);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_prometheus_handler(ngx_http_request_t *r)
{
    ngx_int_t                     rc;
    ngx_str_t                     body;
    ngx_uint_t                    i, k;
    ngx_http_agent_prom_t         p;
    ngx_http_agent_zone_t        *z;
    ngx_http_agent_metrics_sh_t  *m;
    ngx_http_agent_main_conf_t   *amcf;

    static ngx_str_t  type =
        ngx_string("text/plain; version=0.0.4; charset=utf-8");

    if (ngx_http_agent_zone_status_request(r, &z, &rc) != NGX_OK) {
        return rc;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    if (z->sh->metrics == NULL) {
        return ngx_http_agent_json_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                         "internal_error",
                                         "the agent zone keeps no metrics");
    }

    m = z->sh->metrics;

    ngx_memzero(&p, sizeof(ngx_http_agent_prom_t));
    p.pool = r->pool;

    ngx_http_agent_prom_head(&p, "agent_turns_total", "counter",
                             "Turns ended, by agent and outcome.");

    for (i = 0; i < m->nagents; i++) {
        for (k = 0; k < NGX_HTTP_AGENT_TURN_OUTCOMES; k++) {
            ngx_http_agent_prom_print(&p, "agent_turns_total{");
            ngx_http_agent_prom_label(&p, "gen_ai_agent_name",
                                      m->agents[i]->name.data,
                                      m->agents[i]->name.len);
            ngx_http_agent_prom_print(&p, ",outcome=\"%s\"} %uA\n",
                                      ngx_http_agent_prom_outcomes[k],
                                      m->agents[i]->turns[k]);
        }
    }

    ngx_http_agent_prom_model(&p, m);
    ngx_http_agent_prom_tools(&p, m);

    ngx_http_agent_prom_head(&p, "agent_suspensions_total", "counter",
                             "Tool calls that waited for input, by kind.");

    for (k = 1; k <= NGX_HTTP_AGENT_PENDING_CLIENT_EXEC; k++) {
        ngx_http_agent_prom_print(&p, "agent_suspensions_total{kind=\"%s\"}"
                                  " %uA\n", ngx_http_agent_prom_kinds[k],
                                  m->suspensions[k]);
    }

    ngx_http_agent_prom_head(&p, "agent_resolutions_total", "counter",
                             "Waiting calls resolved, by decision.");

    for (k = 0; k < NGX_HTTP_AGENT_DECISIONS; k++) {
        ngx_http_agent_prom_print(&p, "agent_resolutions_total"
                                  "{decision=\"%s\"} %uA\n",
                                  ngx_http_agent_prom_decisions[k],
                                  m->resolutions[k]);
    }

    ngx_http_agent_prom_head(&p, "agent_expiries_total", "counter",
                             "Waiting calls that passed their deadline.");
    ngx_http_agent_prom_print(&p, "agent_expiries_total %uA\n",
                        m->resolutions[NGX_HTTP_AGENT_DECISION_EXPIRED]);

    ngx_http_agent_prom_head(&p, "agent_takeovers_total", "counter",
                             "Turns taken over from a worker that died, "
                             "or revived cut off.");
    ngx_http_agent_prom_print(&p, "agent_takeovers_total %uA\n",
                              m->takeovers);

    ngx_http_agent_prom_head(&p, "agent_turn_steps_later_total", "counter",
                             "Steps of turns left to a later pass of a "
                             "worker's event loop, which had run 2 ms.");
    ngx_http_agent_prom_print(&p, "agent_turn_steps_later_total %uA\n",
                              m->steps_later);

    if (amcf->trace.len) {
        ngx_http_agent_prom_head(&p, "agent_trace_spans_total", "counter",
                                 "Spans of turns sent to the collector "
                                 "(exported) or given up (dropped).");
        ngx_http_agent_prom_print(&p, "agent_trace_spans_total"
                                  "{outcome=\"exported\"} %uA\n"
                                  "agent_trace_spans_total"
                                  "{outcome=\"dropped\"} %uA\n",
                                  m->spans[0], m->spans[1]);
    }

    ngx_http_agent_prom_zone(&p, z, amcf->store != NULL);

    if (p.failed) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    body.data = p.out.data;
    body.len = p.out.len;

    return ngx_http_agent_json_output(r, NGX_HTTP_OK, &type, &body);
}


/* per agent, with its model and adapter: the model calls */

static void
ngx_http_agent_prom_model(ngx_http_agent_prom_t *p,
    ngx_http_agent_metrics_sh_t *m)
{
    ngx_str_t                        s;
    ngx_str_t                        labels[NGX_HTTP_AGENT_METRICS_AGENTS];
    ngx_uint_t                       i, k;
    ngx_http_agent_prom_t            l;
    ngx_http_agent_metrics_agent_t  *a;

    /* gen_ai_provider_name as the conventions name it, by the adapter */

    for (i = 0; i < m->nagents; i++) {
        a = m->agents[i];

        ngx_memzero(&l, sizeof(ngx_http_agent_prom_t));
        l.pool = p->pool;

        ngx_http_agent_prom_print(&l, "gen_ai_operation_name=\"chat\","
                                  "gen_ai_provider_name=\"%s\",",
                                  a->provider.len > 9
                                  && ngx_strncmp(a->provider.data,
                                                 "anthropic", 9) == 0
                                  ? "anthropic" : "openai");
        ngx_http_agent_prom_label(&l, "gen_ai_request_model", a->model.data,
                                  a->model.len);
        ngx_http_agent_prom_print(&l, ",");
        ngx_http_agent_prom_label(&l, "gen_ai_agent_name", a->name.data,
                                  a->name.len);
        ngx_http_agent_prom_print(&l, ",");
        ngx_http_agent_prom_label(&l, "adapter", a->provider.data,
                                  a->provider.len);

        p->failed |= l.failed;
        labels[i].data = l.out.data;
        labels[i].len = l.out.len;
    }

    ngx_http_agent_prom_head(p, "agent_model_calls_total", "counter",
                             "Model calls, by agent, model and status.");

    for (i = 0; i < m->nagents; i++) {
        for (k = 0; k < NGX_HTTP_AGENT_MODEL_STATUSES; k++) {
            ngx_http_agent_prom_print(p, "agent_model_calls_total{%V,"
                                      "status=\"%s\"} %uA\n", &labels[i],
                                      ngx_http_agent_prom_statuses[k],
                                      m->agents[i]->calls[k]);
        }
    }

    ngx_http_agent_prom_head(p, "agent_model_call_retries_total", "counter",
                             "Model calls made again after a failure "
                             "before their first token.");

    for (i = 0; i < m->nagents; i++) {
        ngx_http_agent_prom_print(p, "agent_model_call_retries_total{%V} "
                                  "%uA\n", &labels[i],
                                  m->agents[i]->retries);
    }

    ngx_http_agent_prom_head(p, "gen_ai_client_token_usage", "histogram",
                             "Tokens of a model call, by type, as the "
                             "provider reported them.");

    for (i = 0; i < m->nagents; i++) {
        for (k = 0; k < NGX_HTTP_AGENT_TOKEN_TYPES; k++) {
            ngx_memzero(&l, sizeof(ngx_http_agent_prom_t));
            l.pool = p->pool;

            ngx_http_agent_prom_print(&l, "%V,gen_ai_token_type=\"%s\"",
                                      &labels[i],
                                      ngx_http_agent_prom_tokens[k]);
            p->failed |= l.failed;

            s.data = l.out.data;
            s.len = l.out.len;

            ngx_http_agent_prom_hist(p, "gen_ai_client_token_usage", &s,
                                     &m->agents[i]->tokens[k],
                                     NGX_HTTP_AGENT_HIST_TOKENS);
        }
    }

    ngx_http_agent_prom_head(p, "gen_ai_client_operation_duration_seconds",
                             "histogram", "Model calls, from the request "
                             "to the end of the reply.");

    for (i = 0; i < m->nagents; i++) {
        ngx_http_agent_prom_hist(p,
                                 "gen_ai_client_operation_duration_seconds",
                                 &labels[i], &m->agents[i]->duration,
                                 NGX_HTTP_AGENT_HIST_MODEL);
    }

    ngx_http_agent_prom_head(p,
                       "gen_ai_client_operation_time_to_first_chunk_seconds",
                       "histogram", "Model calls, from the request to the "
                       "first piece of the reply.");

    for (i = 0; i < m->nagents; i++) {
        ngx_http_agent_prom_hist(p,
                       "gen_ai_client_operation_time_to_first_chunk_seconds",
                       &labels[i], &m->agents[i]->first,
                       NGX_HTTP_AGENT_HIST_FIRST);
    }
}


static void
ngx_http_agent_prom_tools(ngx_http_agent_prom_t *p,
    ngx_http_agent_metrics_sh_t *m)
{
    ngx_str_t                       s;
    ngx_uint_t                      i, k;
    ngx_http_agent_prom_t           l;
    ngx_http_agent_metrics_tool_t  *tl;

    ngx_http_agent_prom_head(p, "agent_tool_calls_total", "counter",
                             "Tool calls ended, by tool, executor and "
                             "outcome.");

    for (i = 0; i < m->ntools; i++) {
        tl = m->tools[i];

        for (k = 0; k < 2; k++) {
            ngx_http_agent_prom_print(p, "agent_tool_calls_total{");
            ngx_http_agent_prom_label(p, "gen_ai_tool_name", tl->name.data,
                                      tl->name.len);
            ngx_http_agent_prom_print(p, ",executor=\"%V\",outcome=\"%s\"} "
                                      "%uA\n",
                                      &ngx_http_agent_metrics_executors[
                                                                tl->executor],
                                      k ? "error" : "ok",
                                      k ? tl->error : tl->ok);
        }
    }

    ngx_http_agent_prom_head(p, "gen_ai_execute_tool_duration_seconds",
                             "histogram", "Tool calls, from the tool_call "
                             "to its result.");

    for (i = 0; i < m->ntools; i++) {
        tl = m->tools[i];

        ngx_memzero(&l, sizeof(ngx_http_agent_prom_t));
        l.pool = p->pool;

        ngx_http_agent_prom_label(&l, "gen_ai_tool_name", tl->name.data,
                                  tl->name.len);
        ngx_http_agent_prom_print(&l, ",executor=\"%V\"",
                                  &ngx_http_agent_metrics_executors[
                                                                tl->executor]);
        p->failed |= l.failed;

        s.data = l.out.data;
        s.len = l.out.len;

        ngx_http_agent_prom_hist(p, "gen_ai_execute_tool_duration_seconds",
                                 &s, &tl->duration,
                                 NGX_HTTP_AGENT_HIST_TOOL);
    }
}


/* what the zone holds now: one lock for the walk */

static void
ngx_http_agent_prom_zone(ngx_http_agent_prom_t *p, ngx_http_agent_zone_t *z,
    ngx_uint_t store)
{
    ngx_str_t               *name;
    ngx_uint_t               i, pages, free, count, subs;
    ngx_queue_t             *q;
    ngx_slab_pool_t         *shpool;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_hist_t   *times[2];
    uint64_t                 lag;

    shpool = z->shpool;
    name = &z->shm_zone->shm.name;
    subs = 0;
    lag = 0;

    ngx_http_agent_zone_lock(z);

    pages = (shpool->end - shpool->start) / ngx_pagesize;
    free = shpool->pfree;
    count = z->sh->count;

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru);
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
            subs += conv->subs[i].count;
        }
    }

    for (q = ngx_queue_head(&z->sh->dirty);
         q != ngx_queue_sentinel(&z->sh->dirty);
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, dirty);
        lag += conv->seq - conv->flushed;
    }

    ngx_http_agent_zone_unlock(z);

    ngx_http_agent_prom_head(p, "agent_zone_size_bytes", "gauge",
                             "Size of the agent zone.");
    ngx_http_agent_prom_print(p, "agent_zone_size_bytes{zone=\"%V\"} %uz\n",
                              name, z->shm_zone->shm.size);

    ngx_http_agent_prom_head(p, "agent_zone_used_bytes", "gauge",
                             "Pages of the agent zone in use, in bytes.");
    ngx_http_agent_prom_print(p, "agent_zone_used_bytes{zone=\"%V\"} %ui\n",
                              name, (pages - free) * ngx_pagesize);

    ngx_http_agent_prom_head(p, "agent_zone_conversations", "gauge",
                             "Conversations the agent zone holds.");
    ngx_http_agent_prom_print(p, "agent_zone_conversations{zone=\"%V\"} "
                              "%ui\n", name, count);

    ngx_http_agent_prom_head(p, "agent_zone_dropped_total", "counter",
                             "Conversations at rest dropped from a full "
                             "zone with no store.");
    ngx_http_agent_prom_print(p, "agent_zone_dropped_total{zone=\"%V\"} "
                              "%ui\n", name, z->sh->dropped);

    ngx_http_agent_prom_head(p, "agent_subscribers", "gauge",
                             "Event streams open, in all workers.");
    ngx_http_agent_prom_print(p, "agent_subscribers %ui\n", subs);

    if (!store) {
        return;
    }

    ngx_http_agent_prom_head(p, "agent_store_lag_events", "gauge",
                             "Canonical events not yet written to the "
                             "store.");
    ngx_http_agent_prom_print(p, "agent_store_lag_events %uL\n", lag);

    ngx_http_agent_prom_head(p, "agent_store_errors_total", "counter",
                             "Store batches that could not be written.");
    ngx_http_agent_prom_print(p, "agent_store_errors_total %uA\n",
                              z->sh->metrics->store_errors);

    ngx_http_agent_prom_head(p, "agent_store_batch_events", "histogram",
                             "Events written to the store per batch.");
    ngx_http_agent_prom_hist(p, "agent_store_batch_events", NULL,
                             &z->sh->metrics->store_batch,
                             NGX_HTTP_AGENT_HIST_BATCH);

    times[0] = &z->sh->metrics->store_write;
    times[1] = &z->sh->metrics->store_ack;

    for (i = 0; i < 2; i++) {
        ngx_http_agent_prom_head(p, ngx_http_agent_prom_store_times[i][0],
                                 "histogram",
                                 ngx_http_agent_prom_store_times[i][1]);
        ngx_http_agent_prom_hist(p, ngx_http_agent_prom_store_times[i][0],
                                 NULL, times[i], NGX_HTTP_AGENT_HIST_STORE);
    }

    ngx_http_agent_prom_head(p, "agent_store_batches_cut_total", "counter",
                             "Store batches that ended early, between two "
                             "conversations, for an input waiting to be "
                             "written.");
    ngx_http_agent_prom_print(p, "agent_store_batches_cut_total %uA\n",
                              z->sh->metrics->store_cut);

    ngx_http_agent_prom_head(p, "agent_store_history_reads_total", "counter",
                             "Reads of the history the zone gave up (a "
                             "turn's, a request's page): from the store, "
                             "or kept by the worker that ran the last "
                             "turn.");
    ngx_http_agent_prom_print(p, "agent_store_history_reads_total"
                              "{from=\"store\"} %uA\n"
                              "agent_store_history_reads_total"
                              "{from=\"worker\"} %uA\n",
                              z->sh->metrics->history[0],
                              z->sh->metrics->history[1]);
}


/*
 * Buckets are cumulative, and the count is their total: a scrape that
 * comes between an observation's bucket and its sum is still a valid
 * histogram
 */

static void
ngx_http_agent_prom_hist(ngx_http_agent_prom_t *p, char *name,
    ngx_str_t *labels, ngx_http_agent_hist_t *h, ngx_uint_t hist)
{
    uint64_t     total;
    ngx_str_t    sep, none;
    ngx_uint_t   i, secs, usec, *bound;

    bound = ngx_http_agent_metrics_bounds[hist];
    secs = (hist != NGX_HTTP_AGENT_HIST_TOKENS
            && hist != NGX_HTTP_AGENT_HIST_BATCH);
    usec = (hist == NGX_HTTP_AGENT_HIST_STORE);

    ngx_str_null(&none);

    if (labels == NULL) {
        labels = &none;
    }

    if (labels->len) {
        ngx_str_set(&sep, ",");

    } else {
        ngx_str_null(&sep);
    }

    total = 0;

    for (i = 0; bound[i]; i++) {
        total += h->bucket[i];

        ngx_http_agent_prom_print(p, "%s_bucket{%V%Vle=\"", name, labels,
                                  &sep);

        if (secs) {
            ngx_http_agent_prom_seconds(p, bound[i], usec);

        } else {
            ngx_http_agent_prom_print(p, "%ui", bound[i]);
        }

        ngx_http_agent_prom_print(p, "\"} %uL\n", total);
    }

    total += h->bucket[i];

    ngx_http_agent_prom_print(p, "%s_bucket{%V%Vle=\"+Inf\"} %uL\n", name,
                              labels, &sep, total);

    ngx_http_agent_prom_print(p, "%s_sum", name);

    if (labels->len) {
        ngx_http_agent_prom_print(p, "{%V}", labels);
    }

    ngx_http_agent_prom_print(p, " ");

    if (secs) {
        ngx_http_agent_prom_seconds(p, h->sum, usec);

    } else {
        ngx_http_agent_prom_print(p, "%uA", h->sum);
    }

    ngx_http_agent_prom_print(p, "\n%s_count", name);

    if (labels->len) {
        ngx_http_agent_prom_print(p, "{%V}", labels);
    }

    ngx_http_agent_prom_print(p, " %uL\n", total);
}


/*
 * ms (or us) as seconds, without trailing zeros: 10 ms is 0.01, 1000 ms
 * is 1, 250 us is 0.00025
 */

static void
ngx_http_agent_prom_seconds(ngx_http_agent_prom_t *p, uint64_t value,
    ngx_uint_t usec)
{
    u_char      *d, digit[6];
    uint64_t     unit, frac;
    ngx_uint_t   n;

    unit = usec ? 1000000 : 1000;
    frac = value % unit;

    ngx_http_agent_prom_print(p, "%uL", value / unit);

    if (frac == 0) {
        return;
    }

    /* the fraction's digits, its trailing zeros left out */

    n = usec ? 6 : 3;

    while (frac % 10 == 0) {
        frac /= 10;
        n--;
    }

    for (d = digit + n; d > digit; frac /= 10) {
        *--d = (u_char) ('0' + frac % 10);
    }

    ngx_http_agent_prom_print(p, ".%*s", (size_t) n, digit);
}


static void
ngx_http_agent_prom_head(ngx_http_agent_prom_t *p, char *name, char *type,
    char *help)
{
    ngx_http_agent_prom_print(p, "# HELP %s %s\n# TYPE %s %s\n", name, help,
                              name, type);
}


/* name="value", the value escaped as the format wants: \\, \" and \n */

static void
ngx_http_agent_prom_label(ngx_http_agent_prom_t *p, char *name,
    u_char *value, size_t len)
{
    u_char  *s, *last;

    ngx_http_agent_prom_print(p, "%s=\"", name);

    last = value + len;

    for (s = value; s < last; s++) {
        if (*s == '\\' || *s == '"') {
            ngx_http_agent_prom_print(p, "\\%c", *s);

        } else if (*s == '\n') {
            ngx_http_agent_prom_print(p, "\\n");

        } else {
            ngx_http_agent_prom_print(p, "%c", *s);
        }
    }

    ngx_http_agent_prom_print(p, "\"");
}


static void
ngx_http_agent_prom_print(ngx_http_agent_prom_t *p, const char *fmt, ...)
{
    u_char   buf[1024], *last;
    va_list  args;

    va_start(args, fmt);
    last = ngx_vslprintf(buf, buf + sizeof(buf), fmt, args);
    va_end(args);

    if (ngx_http_agent_bytes_append(p->pool, &p->out, buf, last - buf)
        != NGX_OK)
    {
        p->failed = 1;
    }
}
