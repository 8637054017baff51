
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_METRICS_H_INCLUDED_
#define _NGX_HTTP_AGENT_METRICS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"


/*
 * The counters live in the agent zone, next to the conversations: every
 * worker adds to them with atomic increments, and a reload that keeps
 * the zone keeps them.  Label sets are bounded: agents (with their
 * model and adapter) and tools come from the configuration, at most
 * these many of each; more are not counted (the error log says so).
 * A slot is allocated when its name is first declared, so a small zone
 * gives the counters only what its configuration needs.
 */

#define NGX_HTTP_AGENT_METRICS_AGENTS    32
#define NGX_HTTP_AGENT_METRICS_TOOLS     64
#define NGX_HTTP_AGENT_METRICS_NAME      64

/* a zone of fewer pages (64 KB of 4 KB pages) keeps no metrics */
#define NGX_HTTP_AGENT_METRICS_PAGES     16

/* the most bounds a histogram has; one more bucket counts the rest */
#define NGX_HTTP_AGENT_METRICS_BOUNDS    16


/* what a turn came to */
#define NGX_HTTP_AGENT_TURN_COMPLETED    0
#define NGX_HTTP_AGENT_TURN_FAILED       1
#define NGX_HTTP_AGENT_TURN_CANCELLED    2
#define NGX_HTTP_AGENT_TURN_HALTED       3
#define NGX_HTTP_AGENT_TURN_OUTCOMES     4

/* what a model call came to */
#define NGX_HTTP_AGENT_MODEL_OK          0
#define NGX_HTTP_AGENT_MODEL_RETRY       1
#define NGX_HTTP_AGENT_MODEL_ERROR       2
#define NGX_HTTP_AGENT_MODEL_CANCELLED   3
#define NGX_HTTP_AGENT_MODEL_STATUSES    4

#define NGX_HTTP_AGENT_TOKENS_INPUT      0
#define NGX_HTTP_AGENT_TOKENS_OUTPUT     1
#define NGX_HTTP_AGENT_TOKENS_CACHED     2
#define NGX_HTTP_AGENT_TOKEN_TYPES       3

/* how a waiting call was resolved */
#define NGX_HTTP_AGENT_DECISION_APPROVE    0
#define NGX_HTTP_AGENT_DECISION_REJECT     1
#define NGX_HTTP_AGENT_DECISION_ANSWERED   2
#define NGX_HTTP_AGENT_DECISION_EXPIRED    3
#define NGX_HTTP_AGENT_DECISION_CANCELLED  4
#define NGX_HTTP_AGENT_DECISIONS           5

/* the histograms, by their bounds */
#define NGX_HTTP_AGENT_HIST_MODEL        0   /* a model call, ms */
#define NGX_HTTP_AGENT_HIST_FIRST        1   /* to its first chunk, ms */
#define NGX_HTTP_AGENT_HIST_TOKENS       2   /* tokens of a call */
#define NGX_HTTP_AGENT_HIST_TOOL         3   /* a tool call, ms */
#define NGX_HTTP_AGENT_HIST_BATCH        4   /* events of a store batch */
#define NGX_HTTP_AGENT_HIST_STORE        5   /* a store's write or ack, us */
#define NGX_HTTP_AGENT_HISTS             6


typedef struct {
    ngx_atomic_t                  bucket[NGX_HTTP_AGENT_METRICS_BOUNDS + 1];
    ngx_atomic_t                  sum;
} ngx_http_agent_hist_t;


typedef struct {
    ngx_uint_t                    len;
    u_char                        data[NGX_HTTP_AGENT_METRICS_NAME];
} ngx_http_agent_metrics_name_t;


/* an agent with its model and adapter, as configured */
typedef struct {
    ngx_http_agent_metrics_name_t name;
    ngx_http_agent_metrics_name_t model;
    ngx_http_agent_metrics_name_t provider;

    ngx_atomic_t                  turns[NGX_HTTP_AGENT_TURN_OUTCOMES];
    ngx_atomic_t                  calls[NGX_HTTP_AGENT_MODEL_STATUSES];
    ngx_atomic_t                  retries;

    ngx_http_agent_hist_t         tokens[NGX_HTTP_AGENT_TOKEN_TYPES];
    ngx_http_agent_hist_t         duration;
    ngx_http_agent_hist_t         first;
} ngx_http_agent_metrics_agent_t;


/* a tool and its executor; the first is for tools nobody declared */
typedef struct {
    ngx_http_agent_metrics_name_t name;
    ngx_uint_t                    executor;

    ngx_atomic_t                  ok;
    ngx_atomic_t                  error;
    ngx_http_agent_hist_t         duration;
} ngx_http_agent_metrics_tool_t;


struct ngx_http_agent_metrics_sh_s {
    ngx_uint_t                    nagents;
    ngx_uint_t                    ntools;

    ngx_atomic_t                  suspensions[NGX_HTTP_AGENT_PENDING_CLIENT_EXEC
                                              + 1];
    ngx_atomic_t                  resolutions[NGX_HTTP_AGENT_DECISIONS];
    ngx_atomic_t                  takeovers;

    /* turn steps left to a later pass of the event loop */
    ngx_atomic_t                  steps_later;

    ngx_atomic_t                  store_errors;
    ngx_http_agent_hist_t         store_batch;

    /* a batch's write on the pool's thread, to its commit; an input's wait */
    ngx_http_agent_hist_t         store_write;
    ngx_http_agent_hist_t         store_ack;

    /* batches that ended early for an input */
    ngx_atomic_t                  store_cut;

    /*
     * reads of the history the zone gave up (a turn's, a request's page):
     * from the store, or from what the worker kept
     */
    ngx_atomic_t                  history[2];

    /* spans of turns exported to the collector, and dropped */
    ngx_atomic_t                  spans[2];

    /* slots are allocated as names are declared, and never freed */
    ngx_http_agent_metrics_agent_t *agents[NGX_HTTP_AGENT_METRICS_AGENTS];
    ngx_http_agent_metrics_tool_t  *tools[NGX_HTTP_AGENT_METRICS_TOOLS];
};


/* the bounds of each histogram, 0-terminated */
extern ngx_uint_t  ngx_http_agent_metrics_bounds[NGX_HTTP_AGENT_HISTS]
                                          [NGX_HTTP_AGENT_METRICS_BOUNDS + 1];

extern ngx_str_t  ngx_http_agent_metrics_executors[];


/* with the zone: its counters, zeroed */
ngx_http_agent_metrics_sh_t *ngx_http_agent_metrics_create(
    ngx_slab_pool_t *shpool);

/* declared names get their slots (once: a reload finds them) */
ngx_int_t ngx_http_agent_metrics_agent_locked(ngx_http_agent_zone_t *z,
    ngx_str_t *name, ngx_str_t *model, ngx_str_t *provider);
ngx_int_t ngx_http_agent_metrics_tool_locked(ngx_http_agent_zone_t *z,
    ngx_str_t *name, ngx_uint_t executor);

ngx_http_agent_metrics_agent_t *ngx_http_agent_metrics_agent(
    ngx_http_agent_zone_t *z, u_char *name, size_t len);

void ngx_http_agent_metrics_observe(ngx_http_agent_hist_t *h,
    ngx_uint_t hist, ngx_uint_t value);

/* a canonical event was logged: what it counts (zone locked) */
void ngx_http_agent_metrics_event_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_uint_t type, ngx_str_t *fields);

void ngx_http_agent_metrics_takeover(ngx_http_agent_zone_t *z);
void ngx_http_agent_metrics_step_later(ngx_http_agent_zone_t *z);
void ngx_http_agent_metrics_spans(ngx_http_agent_zone_t *z,
    ngx_uint_t exported, ngx_uint_t n);
/* a batch written in usec (cut: ended early for an input), or not (rc) */
void ngx_http_agent_metrics_store(ngx_http_agent_zone_t *z,
    ngx_uint_t events, ngx_uint_t cut, ngx_int_t rc, ngx_uint_t usec);
/* a monotonic clock, us, read now */
uint64_t ngx_http_agent_metrics_usec(void);
/* an input answered once written, usec after it was logged */
void ngx_http_agent_metrics_ack(ngx_http_agent_zone_t *z, ngx_uint_t usec);
void ngx_http_agent_metrics_history(ngx_http_agent_zone_t *z,
    ngx_uint_t kept);


#endif /* _NGX_HTTP_AGENT_METRICS_H_INCLUDED_ */
