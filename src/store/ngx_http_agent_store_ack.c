
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_ack.h"
#include "ngx_http_agent_json.h"


/*
 * An input from outside is acknowledged once it is written: the answer
 * waits until the conversation's flushed seq reaches the input's.  With
 * no store, or once written, it goes at once.  Its conversation goes
 * first in the next batch, whatever the backlog.  The end of a batch
 * that wrote it answers it at once: this worker's, or another's, which
 * wakes this one (the workers with inputs waiting are listed in the
 * zone); a poll covers a wake-up lost and a writer gone.
 */

typedef struct {
    ngx_http_request_t           *request;
    ngx_http_agent_zone_t        *zone;
    ngx_uint_t                    listed;     /* in the zone's acking */
    ngx_str_t                     id;
    uint64_t                      seq;
    uint64_t                      from;       /* the stream's */
    ngx_uint_t                    status;
    ngx_str_t                     json;
    ngx_msec_t                    deadline;
    /* commit_delay=: its batch waits until then for other inputs */
    ngx_msec_t                    kick_at;
    uint64_t                      start;      /* us, for the metrics */
    ngx_event_t                   timer;
    ngx_queue_t                   queue;

    /* a stream to begin, not the JSON to send */
    ngx_http_agent_store_answer_pt  answer;
} ngx_http_agent_ack_t;


static ngx_int_t ngx_http_agent_store_ack_wait(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t seq, uint64_t from, ngx_uint_t status,
    ngx_str_t *json, ngx_http_agent_store_answer_pt answer);
static void ngx_http_agent_store_ack_first(ngx_http_agent_ack_t *ack);
static void ngx_http_agent_store_ack_poll(ngx_event_t *ev);
static ngx_int_t ngx_http_agent_store_ack_check(ngx_http_agent_ack_t *ack);
static void ngx_http_agent_store_ack_cleanup(void *data);


#define NGX_HTTP_AGENT_ACK_POLL     2
#define NGX_HTTP_AGENT_ACK_WAIT     10000


/* this worker's inputs that wait for their write */
static ngx_queue_t  ngx_http_agent_store_acks;
static ngx_uint_t   ngx_http_agent_store_ack_ready;


void
ngx_http_agent_store_ack_init_process(void)
{
    ngx_queue_init(&ngx_http_agent_store_acks);
    ngx_http_agent_store_ack_ready = 1;
}


ngx_int_t
ngx_http_agent_store_ack(ngx_http_request_t *r, ngx_str_t *id, uint64_t seq,
    ngx_uint_t status, ngx_str_t *json)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    if (amcf->store == NULL || seq == 0) {
        return ngx_http_agent_json_send(r, status, json);
    }

    return ngx_http_agent_store_ack_wait(r, id, seq, 0, status, json, NULL);
}


/*
 * A message, or resolutions, whose answer is the stream of the turn
 * (agent_aisdk, agent_agui): the response begins once the input is
 * written, as a 202 or agent_resolve's 200 would; the turn runs
 * meanwhile, and the stream takes its events from the log.
 */

ngx_int_t
ngx_http_agent_store_ack_stream(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t seq, uint64_t from, ngx_http_agent_store_answer_pt answer)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    if (amcf->store == NULL || seq == 0) {
        return answer(r, id, from);
    }

    return ngx_http_agent_store_ack_wait(r, id, seq, from, 0, NULL, answer);
}


static ngx_int_t
ngx_http_agent_store_ack_wait(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t seq, uint64_t from, ngx_uint_t status, ngx_str_t *json,
    ngx_http_agent_store_answer_pt answer)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_agent_ack_t         *ack;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    ack = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_ack_t));
    cln = ngx_pool_cleanup_add(r->pool, 0);

    if (ack == NULL || cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    ack->request = r;
    ack->zone = amcf->zone;
    ack->id = *id;
    ack->seq = seq;
    ack->from = from;
    ack->status = status;
    ack->answer = answer;

    if (json) {
        ack->json = *json;
    }

    ack->deadline = ngx_current_msec + NGX_HTTP_AGENT_ACK_WAIT;
    ack->start = ngx_http_agent_metrics_usec();

    /* commit_delay=: its batch waits that long for the inputs that follow */

    scf = amcf->store;
    ack->kick_at = ngx_current_msec + scf->commit_delay;

    ack->timer.handler = ngx_http_agent_store_ack_poll;
    ack->timer.data = ack;
    ack->timer.log = r->connection->log;

    cln->handler = ngx_http_agent_store_ack_cleanup;
    cln->data = ack;

    r->main->count++;

    ngx_queue_insert_tail(&ngx_http_agent_store_acks, &ack->queue);

    ngx_http_agent_store_ack_first(ack);
    ngx_http_agent_store_kick_within(scf->commit_delay);
    ngx_http_agent_store_ack_poll(&ack->timer);

    return NGX_DONE;
}


/*
 * The conversation goes to the head of the dirty queue: a batch of the
 * backlog being written takes its events on, or else the next claim, in
 * any worker, takes them before the backlog's, in a batch of their own.
 * This worker is listed as one with inputs waiting (unless the list is
 * full: its poll sees them then).
 */

static void
ngx_http_agent_store_ack_first(ngx_http_agent_ack_t *ack)
{
    ngx_int_t                     rc;
    ngx_http_agent_zone_t        *z;
    ngx_http_agent_conv_t        *conv;
    ngx_http_agent_sub_worker_t  *w;

    z = ack->zone;

    ngx_http_agent_zone_lock(z);

    if (z->sh->acking == NULL) {
        z->sh->acking = ngx_slab_calloc_locked(z->shpool,
                            NGX_HTTP_AGENT_SUB_WORKERS
                            * sizeof(ngx_http_agent_sub_worker_t));
    }

    w = z->sh->acking;

    if (w) {
        rc = ngx_http_agent_workers_add_locked(w, ngx_pid);

        /* a full list: the slots of workers gone are taken */

        if (rc == NGX_DECLINED && ngx_http_agent_workers_reap_locked(w)) {
            rc = ngx_http_agent_workers_add_locked(w, ngx_pid);
        }

        ack->listed = (rc == NGX_OK);
    }

    conv = ngx_http_agent_conv_find_locked(z, &ack->id);

    if (conv && conv->dirty_linked && conv->flushed < ack->seq) {
        conv->acked = ngx_max(conv->acked, ack->seq);

        ngx_queue_remove(&conv->dirty);
        ngx_queue_insert_head(&z->sh->dirty, &conv->dirty);

        /* a batch being written ends early (ngx_http_agent_store_waits) */
        z->sh->inputs++;
    }

    ngx_http_agent_zone_unlock(z);
}


/*
 * A batch was written, this worker's or another's: the inputs it made
 * durable are answered
 */

void
ngx_http_agent_store_ack_wake(void)
{
    ngx_queue_t           *q, *next;
    ngx_http_agent_ack_t  *ack;

    if (!ngx_http_agent_store_ack_ready) {
        /* no store here: nothing waits */
        return;
    }

    for (q = ngx_queue_head(&ngx_http_agent_store_acks);
         q != ngx_queue_sentinel(&ngx_http_agent_store_acks);
         q = next)
    {
        next = ngx_queue_next(q);
        ack = ngx_queue_data(q, ngx_http_agent_ack_t, queue);

        (void) ngx_http_agent_store_ack_check(ack);
    }
}


static void
ngx_http_agent_store_ack_poll(ngx_event_t *ev)
{
    ngx_http_agent_ack_t *ack = ev->data;

    ngx_http_request_t  *r;

    if (ngx_http_agent_store_ack_check(ack) == NGX_OK) {
        return;
    }

    r = ack->request;

    if ((ngx_msec_int_t) (ack->deadline - ngx_current_msec) <= 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "agent store did not write seq %uL of \"%V\" in time",
                      ack->seq, &ack->id);
        ngx_http_agent_store_ack_cleanup(ack);
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "not_durable",
                                      "the input was taken but is not "
                                      "written yet"));
        return;
    }

    /* the writer may have gone: this worker writes then */

    if ((ngx_msec_int_t) (ngx_current_msec - ack->kick_at) >= 0) {
        ngx_http_agent_store_kick_now();
    }

    ngx_add_timer(&ack->timer, NGX_HTTP_AGENT_ACK_POLL);
}


/* NGX_OK: written, and answered */

static ngx_int_t
ngx_http_agent_store_ack_check(ngx_http_agent_ack_t *ack)
{
    uint64_t                     flushed;
    ngx_str_t                    none;
    ngx_http_request_t          *r;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    r = ack->request;
    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    ngx_http_agent_zone_lock(amcf->zone);

    conv = ngx_http_agent_conv_find_locked(amcf->zone, &ack->id);
    flushed = conv ? conv->flushed : 0;

    ngx_http_agent_zone_unlock(amcf->zone);

    if (conv == NULL) {

        /*
         * it left the zone unwritten: another node took it (the store's
         * fence), whose log does not have the input
         */

        ngx_http_agent_store_ack_cleanup(ack);
        ngx_str_null(&none);

        ngx_http_finalize_request(r,
            ngx_http_agent_store_elsewhere_answer(r, &none));

        return NGX_OK;
    }

    if (flushed < ack->seq) {
        return NGX_AGAIN;
    }

    ngx_http_agent_metrics_ack(amcf->zone,
                               ngx_http_agent_metrics_usec() - ack->start);

    ngx_http_agent_store_ack_cleanup(ack);

    /* a stream's request lives on: its ack is done with */

    ngx_http_finalize_request(r, ack->answer
                              ? ack->answer(r, &ack->id, ack->from)
                              : ngx_http_agent_json_send(r, ack->status,
                                                         &ack->json));

    return NGX_OK;
}


static void
ngx_http_agent_store_ack_cleanup(void *data)
{
    ngx_http_agent_ack_t *ack = data;

    if (ack->timer.timer_set) {
        ngx_del_timer(&ack->timer);
    }

    if (ack->listed) {
        ack->listed = 0;

        ngx_http_agent_zone_lock(ack->zone);
        ngx_http_agent_workers_remove_locked(ack->zone->sh->acking, ngx_pid);
        ngx_http_agent_zone_unlock(ack->zone);
    }

    if (ack->queue.prev) {
        ngx_queue_remove(&ack->queue);
        ack->queue.prev = NULL;
    }
}
