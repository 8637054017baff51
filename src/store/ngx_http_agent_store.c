
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
#include "ngx_http_agent_store_audit.h"
#include "ngx_http_agent_store_history.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_store_ack.h"

#if (NGX_LINUX && defined __GLIBC__)
#include <malloc.h>
#endif


/*
 * The canonical log is written behind, in batches, on a thread of the
 * pool: each worker flushes the conversations marked dirty in the zone,
 * one batch at a time, and marks what it wrote as flushed.  A worker that
 * exits writes what is left in itself, for at most EXIT_WAIT ms.
 */

#define NGX_HTTP_AGENT_STORE_BATCH      256
#define NGX_HTTP_AGENT_STORE_EXIT_WAIT  5000

/* the events of inputs a batch cut for them takes on, at most */
#define NGX_HTTP_AGENT_STORE_MORE       64

/* a batch the thread pool refused is tried again after so long, ms */
#define NGX_HTTP_AGENT_STORE_REFUSED_WAIT  50

/* and one the store failed to write */
#define NGX_HTTP_AGENT_STORE_FAILED_WAIT   1000

/* the audit's rows wait for another worker's batch so long, ms */
#define NGX_HTTP_AGENT_STORE_ROWS_WAIT  10

/* glibc's thresholds once a block of this size was freed, see below */
#define NGX_HTTP_AGENT_STORE_MMAP       (1024 * 1024)


typedef struct {
    ngx_http_agent_store_conf_t  *conf;
    ngx_thread_task_t            *task;
    ngx_http_agent_zone_t        *zone;
    ngx_pool_t                   *pool;
    ngx_http_agent_store_event_t *events;
    ngx_uint_t                    nevents;

    /* of the events, those written: the batch may end early */
    ngx_uint_t                    written;

    /* the inputs' events it then took on, after events[nevents - 1] */
    ngx_uint_t                    more;

    /* how long the write took, us */
    ngx_uint_t                    usec;

    /* the WAL wants its checkpoint */
    ngx_uint_t                    checkpoint;

    /*
     * NGX_ABORT: the conversation another node took, in the pool; or,
     * with lost_seq, one whose log holds another event at that seq
     */
    ngx_str_t                     lost;
    uint64_t                      lost_seq;

    /* the zone's count of inputs when the batch was claimed, see waits */
    ngx_atomic_uint_t             inputs;

    /* the zone's count of lapses then, see stale */
    ngx_uint_t                    drops;
    ngx_uint_t                    input;      /* the batch is an input's */

    /* the audit's rows that go with the batch, in a pool of their own */
    ngx_array_t                  *rows;
    ngx_pool_t                   *rows_pool;

    ngx_int_t                     rc;
    ngx_log_t                    *log;
} ngx_http_agent_flush_t;


static void ngx_http_agent_store_exit_flush(ngx_cycle_t *cycle);
static ngx_uint_t ngx_http_agent_store_dirty(ngx_http_agent_zone_t *z);
static void ngx_http_agent_store_flush(ngx_event_t *ev);
static ngx_http_agent_flush_t *ngx_http_agent_store_claim(
    ngx_cycle_t *cycle, ngx_uint_t behind, ngx_uint_t rows_alone,
    ngx_uint_t due);
static ngx_uint_t ngx_http_agent_store_collect_locked(
    ngx_http_agent_flush_t *f, ngx_http_agent_conv_t *conv, uint64_t from,
    uint64_t upto, ngx_uint_t *n, ngx_uint_t max);
static void ngx_http_agent_store_thread(void *data, ngx_log_t *log);
static void ngx_http_agent_store_write(ngx_http_agent_flush_t *f,
    ngx_uint_t (*waits)(void *data), ngx_log_t *log);
static ngx_uint_t ngx_http_agent_store_waits(void *data);
static ngx_uint_t ngx_http_agent_store_stale(void *data);
static ngx_uint_t ngx_http_agent_store_more(void *data, ngx_uint_t written,
    ngx_http_agent_store_event_t **events);
static uint64_t ngx_http_agent_store_last(ngx_http_agent_store_event_t *ev,
    ngx_uint_t n, ngx_http_agent_conv_t *conv, uint64_t seq);
static ngx_uint_t ngx_http_agent_store_flushed_locked(
    ngx_http_agent_flush_t *f, ngx_http_agent_store_event_t *ev,
    ngx_uint_t n, ngx_uint_t written);
static void ngx_http_agent_store_release(ngx_http_agent_flush_t *f);
static void ngx_http_agent_store_done(ngx_event_t *ev);
static ngx_int_t ngx_http_agent_store_next(ngx_http_agent_zone_t *z);
static void ngx_http_agent_store_lose(ngx_http_agent_flush_t *f);
static void ngx_http_agent_store_wake_subscribers(ngx_http_agent_flush_t *f);
static ngx_uint_t ngx_http_agent_store_written_locked(
    ngx_http_agent_flush_t *f);


static ngx_event_t    ngx_http_agent_store_event;
static ngx_uint_t     ngx_http_agent_store_busy;

/* with flush=, when the events that wait for it are due; 0: none wait */
static ngx_msec_t     ngx_http_agent_store_due;

/*
 * the thread pool refused this worker's last batch (refused 1), or the
 * store failed to write it (2), and when
 */
static ngx_uint_t     ngx_http_agent_store_refused;
static ngx_msec_t     ngx_http_agent_store_refused_at;

/* revives a conversation the sweep found cut off (set at configuration) */
ngx_int_t  (*ngx_http_agent_store_revive)(ngx_http_request_t *r,
    ngx_str_t *id);

/* drops a conversation another node took (set at configuration) */
void  (*ngx_http_agent_store_lost)(ngx_str_t *id);
ngx_int_t  (*ngx_http_agent_store_lease)(void);


ngx_int_t
ngx_http_agent_store_init_process(ngx_cycle_t *cycle)
{
    ngx_event_t                  *ev;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);
    scf = amcf->store;

    scf->store->init_process(scf->sync);

    ev = &ngx_http_agent_store_event;

    ngx_memzero(ev, sizeof(ngx_event_t));

    ev->handler = ngx_http_agent_store_flush;
    ev->log = cycle->log;
    ev->data = cycle;

    /* a worker that exits writes what is left itself */
    ev->cancelable = 1;

    ngx_http_agent_store_busy = 0;
    ngx_http_agent_store_due = 0;
    ngx_http_agent_store_ack_init_process();

    if (ngx_http_agent_pg_listen_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

#if (NGX_LINUX && defined __GLIBC__ && defined M_TRIM_THRESHOLD)

    /*
     * A batch runs on whichever thread of the pool is free, and each
     * thread allocates from an arena of its own.  glibc gives an arena's
     * free top back to the kernel once it exceeds 128 KB, a threshold it
     * raises only after a block it mapped is freed: every batch gave its
     * SQLite memory back and faulted it in again (about 60 madvise() a
     * batch).  The thresholds are set where glibc's own policy would put
     * them after a block of 1 MB: such blocks come from the arenas, and
     * an arena keeps up to twice that free.
     */

    if (mallopt(M_MMAP_THRESHOLD, NGX_HTTP_AGENT_STORE_MMAP) == 0
        || mallopt(M_TRIM_THRESHOLD, 2 * NGX_HTTP_AGENT_STORE_MMAP) == 0)
    {
        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "agent store could not set malloc's thresholds");
    }

#endif

    return NGX_OK;
}


/*
 * The thread pool module exits first: its threads are gone, no write
 * uses the store's connection any more, and a batch that was in flight
 * is written, but its completion never runs here.  What this worker can
 * claim of the dirty conversations, that batch's included (written
 * again, which changes nothing), is written now, in the worker itself.
 */

void
ngx_http_agent_store_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);
    scf = amcf->store;

    ngx_http_agent_store_exit_flush(cycle);

    /* rows queued after the flush took its own, by the turns it ended */
    ngx_http_agent_store_audit_exit(cycle->log);

    ngx_http_agent_pg_listen_exit_process();

    scf->store->close();

    ngx_http_agent_store_history_exit();
}


/*
 * Batch after batch until none is left, a write fails (the events stay
 * dirty: a live worker writes them after a reload) or EXIT_WAIT has
 * passed: an exit never waits for a store that does not answer.  The
 * audit's rows queued go with the first.
 */

static void
ngx_http_agent_store_exit_flush(ngx_cycle_t *cycle)
{
    ngx_int_t                rc;
    ngx_msec_t               start;
    ngx_uint_t               n, total;
    ngx_http_agent_flush_t  *f;

    ngx_time_update();
    start = ngx_current_msec;
    total = 0;

    for ( ;; ) {
        f = ngx_http_agent_store_claim(cycle, 0, 1, 0);
        if (f == NULL) {
            break;
        }

        ngx_time_update();

        if (ngx_current_msec - start < NGX_HTTP_AGENT_STORE_EXIT_WAIT) {
            ngx_http_agent_store_write(f, NULL, f->log);

            ngx_http_agent_metrics_store(f->zone, f->written, 0, f->rc,
                                         f->usec);

        } else {
            /* not tried: the claims go as after a failure */
            f->rc = NGX_DECLINED;
        }

        ngx_http_agent_store_release(f);

        rc = f->rc;
        n = f->written;

        if (rc == NGX_ABORT) {
            /* before the rows go: the conversation may be named there */
            ngx_http_agent_store_lose(f);
        }

        if (f->rows_pool) {
            if (rc != NGX_OK) {
                ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                              "agent store could not write %ui model call "
                              "rows as the worker exits", f->rows->nelts);
            }

            ngx_destroy_pool(f->rows_pool);
        }

        if (rc == NGX_ABORT) {
            ngx_destroy_pool(f->pool);
            continue;
        }

        ngx_destroy_pool(f->pool);

        if (rc != NGX_OK) {
            ngx_log_error(NGX_LOG_ERR, cycle->log, 0,
                          "agent store could not write %ui events as the "
                          "worker exits%s", n,
                          rc == NGX_DECLINED ? ", out of time" : "");
            break;
        }

        total += n;
    }

    if (total) {
        ngx_log_error(NGX_LOG_INFO, cycle->log, 0,
                      "agent store wrote %ui events as the worker exits",
                      total);
    }
}


/*
 * An event was added to the zone: a batch is posted, or with flush= it
 * waits that long for the events after it (until the due time the first
 * of them set: an input's batch in between does not put it off).  While
 * a batch is written, what comes meanwhile goes in the next.
 */

void
ngx_http_agent_store_kick(void)
{
    ngx_event_t                  *ev;
    ngx_msec_int_t                wait;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    ev = &ngx_http_agent_store_event;

    if (ev->handler == NULL || ev->posted || ngx_http_agent_store_busy) {
        return;
    }

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    scf = amcf->store;

    if (scf->flush) {
        if (ngx_http_agent_store_due == 0) {
            ngx_http_agent_store_due = ngx_current_msec + scf->flush;
        }

        wait = ngx_http_agent_store_due - ngx_current_msec;

        if (wait > 0) {
            if (!ev->timer_set) {
                ngx_add_timer(ev, wait);
            }

            return;
        }
    }

    ngx_post_event(ev, &ngx_posted_events);
}


/* an input waits for its write, or a batch was written: no waiting */

void
ngx_http_agent_store_kick_now(void)
{
    ngx_event_t  *ev;

    ev = &ngx_http_agent_store_event;

    if (ev->handler == NULL || ev->posted || ngx_http_agent_store_busy) {
        return;
    }

    if (ev->timer_set) {
        ngx_del_timer(ev);
    }

    ngx_post_event(ev, &ngx_posted_events);
}


/*
 * An input came, with commit_delay=: its batch waits up to delay for the
 * inputs that follow, which then share its commit and its fdatasync.  A
 * timer due sooner is kept.
 */

void
ngx_http_agent_store_kick_within(ngx_msec_t delay)
{
    ngx_event_t  *ev;

    if (delay == 0) {
        ngx_http_agent_store_kick_now();
        return;
    }

    ev = &ngx_http_agent_store_event;

    if (ev->handler == NULL || ev->posted || ngx_http_agent_store_busy) {
        return;
    }

    if (ev->timer_set) {
        if ((ngx_msec_int_t) (ev->timer.key - ngx_current_msec)
            <= (ngx_msec_int_t) delay)
        {
            return;
        }

        ngx_del_timer(ev);
    }

    ngx_add_timer(ev, delay);
}


/* events wait for a write in the zone */

static ngx_uint_t
ngx_http_agent_store_dirty(ngx_http_agent_zone_t *z)
{
    ngx_uint_t  dirty;

    ngx_http_agent_zone_lock(z);
    dirty = !ngx_queue_empty(&z->sh->dirty);
    ngx_http_agent_zone_unlock(z);

    return dirty;
}


/* a batch on the thread pool, one at a time */

static void
ngx_http_agent_store_flush(ngx_event_t *ev)
{
    ngx_uint_t                    alone, due;
    ngx_msec_int_t                wait;
    ngx_thread_task_t            *task;
    ngx_http_agent_flush_t       *f;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    if (ngx_http_agent_store_busy) {
        return;
    }

    /*
     * the pool's queue was full: tried again a little later, not at each
     * event appended or each poll of an input that waits (each refusal
     * is an error in the log)
     */

    if (ngx_http_agent_store_refused) {
        wait = ngx_http_agent_store_refused_at
               + (ngx_http_agent_store_refused == 1
                  ? NGX_HTTP_AGENT_STORE_REFUSED_WAIT
                  : NGX_HTTP_AGENT_STORE_FAILED_WAIT)
               - ngx_current_msec;

        if (wait > 0) {
            if (!ev->timer_set) {
                ngx_add_timer(ev, wait);
            }

            return;
        }
    }

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    scf = amcf->store;

    /*
     * a node whose lease lapsed (agent_node) drops its zone before a
     * batch takes any of it: the fence would refuse it anyway
     */

    if (amcf->node && ngx_http_agent_store_lease) {
        (void) ngx_http_agent_store_lease();
    }

    /* with flush=, the audit's rows alone wait for its timer */

    alone = (scf->flush == 0 || ev->timedout);
    ev->timedout = 0;

    /*
     * the events that waited for flush= are due: they go now, with the
     * inputs that wait if any, and so do the audit's rows
     */

    due = (ngx_http_agent_store_due
           && (ngx_msec_int_t) (ngx_current_msec - ngx_http_agent_store_due)
              >= 0);

    f = ngx_http_agent_store_claim(ev->data, 1, alone || due, due);

    if (f == NULL || !f->input || due) {
        ngx_http_agent_store_due = 0;
    }

    if (f == NULL) {
        if (ngx_http_agent_store_refused == 2
            && ngx_http_agent_store_dirty(amcf->zone))
        {
            /*
             * after a failure the claims went: another worker writing now
             * takes them, or a second from now this one tries again
             */
            ngx_http_agent_store_refused_at = ngx_current_msec;

            if (!ev->timer_set) {
                ngx_add_timer(ev, NGX_HTTP_AGENT_STORE_FAILED_WAIT);
            }

        } else {
            ngx_http_agent_store_refused = 0;
        }

        if (ngx_http_agent_store_audit_queued() && !ev->timer_set) {
            /* they wait for flush=, or for another worker's batch */
            ngx_add_timer(ev, scf->flush ? scf->flush
                                         : NGX_HTTP_AGENT_STORE_ROWS_WAIT);
        }

        return;
    }

    task = f->task;
    task->handler = ngx_http_agent_store_thread;
    task->event.handler = ngx_http_agent_store_done;
    task->event.data = f;

    if (ngx_thread_task_post(f->conf->thread_pool, task) != NGX_OK) {
        /* nothing was written: the claims go, the events stay dirty */
        f->rc = NGX_ERROR;
        ngx_http_agent_store_release(f);

        ngx_http_agent_store_refused = 1;
        ngx_http_agent_store_refused_at = ngx_current_msec;

        ngx_http_agent_store_done(&task->event);
        return;
    }

    ngx_http_agent_store_refused = 0;
    ngx_http_agent_store_busy = 1;
}


/*
 * One batch: the dirty conversations' events past what was flushed, at
 * most NGX_HTTP_AGENT_STORE_BATCH, claimed for this worker under the lock
 * (a dead claimant's claim is taken over); NULL: nothing to write.  The
 * conversations an input waits for are at the head of the queue: a batch
 * that starts with them holds them only, up to the inputs, so that it is
 * short; what they recorded after comes in the batches that follow.
 * Unless due: the events that waited for flush= past their time go with
 * the inputs, lest inputs that keep coming hold them back.
 *
 * Behind, on the thread pool: none while another worker has a batch
 * there.  SQLite takes one writer at a time, and two workers' batches
 * waiting for each other's lock made the loser wait again and again;
 * the writer's next batch takes every worker's events.  The audit's rows
 * queued in this worker go with its batch, in the same commit, unless
 * it is an input's and not due, or alone if rows_alone.
 */

static ngx_http_agent_flush_t *
ngx_http_agent_store_claim(ngx_cycle_t *cycle, ngx_uint_t behind,
    ngx_uint_t rows_alone, ngx_uint_t due)
{
    uint64_t                      upto;
    ngx_uint_t                    acked;
    ngx_pool_t                   *pool;
    ngx_queue_t                  *q, *next;
    ngx_thread_task_t            *task;
    ngx_http_agent_zone_t        *z;
    ngx_http_agent_conv_t        *conv;
    ngx_http_agent_flush_t       *f;
    ngx_http_agent_main_conf_t   *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);
    z = amcf->zone;

    pool = ngx_create_pool(4096, cycle->log);
    if (pool == NULL) {
        return NULL;
    }

    task = ngx_thread_task_alloc(pool, sizeof(ngx_http_agent_flush_t));
    if (task == NULL) {
        ngx_destroy_pool(pool);
        return NULL;
    }

    f = task->ctx;
    f->conf = amcf->store;
    f->task = task;
    f->zone = z;
    f->pool = pool;
    f->log = cycle->log;

    f->events = ngx_palloc(pool, (NGX_HTTP_AGENT_STORE_BATCH
                                  + NGX_HTTP_AGENT_STORE_MORE)
                                 * sizeof(ngx_http_agent_store_event_t));
    if (f->events == NULL) {
        ngx_destroy_pool(pool);
        return NULL;
    }

    acked = 0;

    ngx_http_agent_zone_lock(z);

    if (behind && z->sh->writer && z->sh->writer != ngx_pid
        && ngx_http_agent_pid_alive(z->sh->writer))
    {
        ngx_http_agent_zone_unlock(z);
        ngx_destroy_pool(pool);
        return NULL;
    }

    if (!behind && z->sh->writer == ngx_pid) {
        /* an exit: the batch on the pool ended with it, others may write */
        z->sh->writer = 0;
    }

    for (q = ngx_queue_head(&z->sh->dirty);
         q != ngx_queue_sentinel(&z->sh->dirty)
         && f->nevents < NGX_HTTP_AGENT_STORE_BATCH;
         q = next)
    {
        next = ngx_queue_next(q);
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, dirty);

        if (conv->flushing && conv->flushing != ngx_pid
            && ngx_http_agent_pid_alive(conv->flushing))
        {
            continue;
        }

        if (conv->acked > conv->flushed) {
            acked = (f->nevents == 0) ? 1 : acked;

        } else if (acked && !due) {
            break;
        }

        upto = (acked && !due) ? conv->acked : 0;

        if (ngx_http_agent_store_collect_locked(f, conv, conv->flushed, upto,
                                                &f->nevents,
                                                NGX_HTTP_AGENT_STORE_BATCH)
            != NGX_OK)
        {
            break;
        }

        conv->flushing = ngx_pid;
    }

    if (behind && f->nevents) {
        z->sh->writer = ngx_pid;
    }

    f->inputs = z->sh->inputs;
    f->drops = ngx_http_agent_zone_drops(z);
    f->input = acked;

    ngx_http_agent_zone_unlock(z);

    /*
     * the audit's rows queued in this worker go with the batch, but not
     * with an input's, which they would make longer to write: with the
     * next batch, or alone (a worker that exits takes them with any)
     */

    if (ngx_http_agent_store_audit_queued() && (f->nevents || rows_alone)
        && (!(acked && behind) || due))
    {
        f->rows_pool = ngx_http_agent_store_audit_take(&f->rows);
    }

    if (f->nevents == 0 && f->rows == NULL) {
        ngx_destroy_pool(pool);
        return NULL;
    }

    return f;
}


/*
 * The events past from, up to upto unless 0, into f->events[*n] on, at
 * most max in all
 */

static ngx_uint_t
ngx_http_agent_store_collect_locked(ngx_http_agent_flush_t *f,
    ngx_http_agent_conv_t *conv, uint64_t from, uint64_t upto, ngx_uint_t *n,
    ngx_uint_t max)
{
    u_char                        *p;
    ngx_queue_t                   *q;
    ngx_http_agent_event_t        *e;
    ngx_http_agent_store_event_t  *se;

    /* back from the tail to from, then forward */

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->seq <= from) {
            break;
        }
    }

    for (q = ngx_queue_next(q);
         q != ngx_queue_sentinel(&conv->log) && *n < max;
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (upto && e->seq > upto) {
            break;
        }

        p = ngx_pnalloc(f->pool, conv->id_len + conv->agent_len
                                 + conv->owner_len + e->len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        se = &f->events[(*n)++];

        se->conv.data = p;
        se->conv.len = conv->id_len;
        p = ngx_cpymem(p, conv->id, conv->id_len);

        se->agent.data = p;
        se->agent.len = conv->agent_len;
        p = ngx_cpymem(p, conv->agent, conv->agent_len);

        se->owner.data = p;
        se->owner.len = conv->owner_len;
        p = ngx_cpymem(p, conv->owner, conv->owner_len);

        se->data.data = p;
        se->data.len = e->len;
        ngx_memcpy(p, e->data, e->len);

        se->seq = e->seq;
        se->type = e->type;
        se->epoch = conv->epoch;
    }

    return NGX_OK;
}


/*
 * On the pool's thread: the batch, then, under the zone's lock, what was
 * written is flushed and the writer's turn goes.  Another worker's next
 * batch, and the inputs it waits to answer, need not wait until this
 * worker's event loop comes to the batch's end, which under load can be
 * a loop's whole pass later.
 */

static void
ngx_http_agent_store_thread(void *data, ngx_log_t *log)
{
    ngx_http_agent_flush_t *f = data;

    ngx_http_agent_store_write(f, ngx_http_agent_store_waits, log);

    ngx_http_agent_store_release(f);
}


static void
ngx_http_agent_store_write(ngx_http_agent_flush_t *f,
    ngx_uint_t (*waits)(void *data), ngx_log_t *log)
{
    uint64_t                      start;
    ngx_http_agent_store_batch_t  b;

    start = ngx_http_agent_metrics_usec();

    b.events = f->events;
    b.nevents = f->nevents;
    b.rows = f->rows ? f->rows->elts : NULL;
    b.nrows = f->rows ? f->rows->nelts : 0;
    b.waits = waits;
    b.more = waits ? ngx_http_agent_store_more : NULL;
    b.stale = ngx_http_agent_store_stale;
    b.nmore = 0;
    b.data = f;
    b.input = f->input;
    b.checkpoint = 0;

    f->more = 0;

    ngx_str_null(&b.lost);
    b.lost_seq = 0;

    f->rc = f->conf->store->write(&f->conf->path, &b, log);
    f->written = (f->rc == NGX_ABORT) ? 0 : b.nevents;
    f->lost = b.lost;
    f->lost_seq = b.lost_seq;

    if (f->rc == NGX_ABORT) {
        f->more = 0;
    }
    f->checkpoint = b.checkpoint;
    f->usec = ngx_http_agent_metrics_usec() - start;
}


/*
 * An input came to wait for a write while the batch is being written: a
 * batch of the backlog ends with the event it has written (on the
 * thread, before the next) and takes the input's events on (see below),
 * so that the input need not wait for all of it: such a batch holds up
 * to 256 events, some 4 ms under load.  What was not written stays
 * dirty, in its place.  An input's own batch is short and goes whole.
 */

static ngx_uint_t
ngx_http_agent_store_waits(void *data)
{
    ngx_http_agent_flush_t *f = data;

    return f->zone->sh->inputs != f->inputs;
}


/*
 * The node's lease lapsed since the batch was claimed (agent_node): every
 * record of the zone was dropped with what it had not written, this
 * batch's too.  A conversation claimed again since keeps its epoch, so
 * the fence would let the batch in after the revival read the log
 * without it, and the revived copy would write its own events at the
 * batch's seqs: the writer checks this before its commit, while the
 * server holds the rows the batch locked, so that a revival's claim
 * either waits for the commit (and reads the batch) or finds it rolled
 * back.
 */

static ngx_uint_t
ngx_http_agent_store_stale(void *data)
{
    ngx_http_agent_flush_t *f = data;

    return ngx_http_agent_zone_drops(f->zone) != f->drops;
}


/*
 * On the thread, once a batch of the backlog ended early: the events of
 * the conversations whose inputs wait, up to the inputs, claimed for the
 * batch as its claim would (ngx_http_agent_store_claim), each from the
 * last of its events the batch wrote.  They go in the batch's commit:
 * an input waits for this commit alone, not for it and then one of its
 * own, and the event loop's next batch goes on with the backlog.
 */

static ngx_uint_t
ngx_http_agent_store_more(void *data, ngx_uint_t written,
    ngx_http_agent_store_event_t **events)
{
    ngx_http_agent_flush_t *f = data;

    uint64_t                from;
    ngx_uint_t              n, max;
    ngx_queue_t            *q;
    ngx_http_agent_zone_t  *z;
    ngx_http_agent_conv_t  *conv;

    z = f->zone;
    n = f->nevents;
    max = f->nevents + NGX_HTTP_AGENT_STORE_MORE;

    ngx_http_agent_zone_lock(z);

    /* the inputs taken now: one that comes later makes waits() true */
    f->inputs = z->sh->inputs;

    for (q = ngx_queue_head(&z->sh->dirty);
         q != ngx_queue_sentinel(&z->sh->dirty) && n < max;
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, dirty);

        /* the conversations inputs wait for are at the head */

        if (conv->acked <= conv->flushed) {
            break;
        }

        if (conv->flushing && conv->flushing != ngx_pid
            && ngx_http_agent_pid_alive(conv->flushing))
        {
            continue;
        }

        from = ngx_http_agent_store_last(f->events, written, conv,
                                         conv->flushed);

        if (from >= conv->acked) {
            continue;
        }

        if (ngx_http_agent_store_collect_locked(f, conv, from, conv->acked,
                                                &n, max)
            != NGX_OK)
        {
            break;
        }

        conv->flushing = ngx_pid;
    }

    f->more = n - f->nevents;

    ngx_http_agent_zone_unlock(z);

    *events = f->events + f->nevents;

    return f->more;
}


/* the last seq of conv among n events, or seq if none is past it */

static uint64_t
ngx_http_agent_store_last(ngx_http_agent_store_event_t *ev, ngx_uint_t n,
    ngx_http_agent_conv_t *conv, uint64_t seq)
{
    while (n--) {
        if (ev[n].conv.len == conv->id_len
            && ngx_memcmp(ev[n].conv.data, conv->id, conv->id_len) == 0)
        {
            return ngx_max(ev[n].seq, seq);
        }
    }

    return seq;
}


/*
 * The batch's claims go, and the workers whose inputs it wrote are told:
 * on the pool's thread, as soon as it is written, not once this worker's
 * event loop comes to its end.
 */

static void
ngx_http_agent_store_release(ngx_http_agent_flush_t *f)
{
    ngx_uint_t  n;
    ngx_pid_t   pids[NGX_HTTP_AGENT_SUB_WORKERS];

    n = 0;

    ngx_http_agent_zone_lock(f->zone);

    if (ngx_http_agent_store_written_locked(f) && f->zone->sh->acking) {
        n = ngx_http_agent_workers_pids_locked(f->zone->sh->acking, pids);
    }

    if (f->zone->sh->writer == ngx_pid) {
        f->zone->sh->writer = 0;
    }

    ngx_http_agent_zone_unlock(f->zone);

    if (n) {
        ngx_http_agent_wake_written(pids, n);
    }
}


/*
 * Back in the event loop: the inputs the batch made durable are
 * answered, and the next batch follows.
 */

static void
ngx_http_agent_store_done(ngx_event_t *ev)
{
    ngx_http_agent_flush_t *f = ev->data;

    ngx_int_t               rc, next;
    ngx_uint_t              rest;
    ngx_http_agent_zone_t  *z;

    ngx_http_agent_store_busy = 0;
    ngx_http_agent_metrics_store(f->zone, f->written + f->more,
                                 f->written < f->nevents, f->rc, f->usec);

    if (f->rc == NGX_ABORT) {
        /* the rows go with the next batch, those of the lost one too */
        ngx_http_agent_store_lose(f);

    } else if (f->rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, f->log, 0,
                      "agent store could not write %ui events, "
                      "they are tried again", f->nevents);

        if (f->rows) {
            ngx_log_error(NGX_LOG_ERR, f->log, 0,
                          "agent store could not write %ui model call "
                          "rows, they are tried again", f->rows->nelts);
        }
    }

    if (f->rc != NGX_OK && f->rows) {

        /*
         * the lost conversation's rows are refused as its events are;
         * those of one whose log differs from its copy are this node's
         * calls all the same, and go with the next batch
         */

        if (f->lost_seq == 0) {
            ngx_http_agent_store_audit_drop(f->rows, &f->lost);
        }

        ngx_http_agent_store_audit_back(f->rows_pool, f->rows);
        f->rows_pool = NULL;
    }

    if (f->rows_pool) {
        ngx_destroy_pool(f->rows_pool);
    }

    rc = f->rc;
    z = f->zone;

    if (rc == NGX_OK) {
        ngx_http_agent_store_wake_subscribers(f);
    }

    /* the batch left a backlog: it was cut, or full */
    rest = (f->written < f->nevents
            || f->nevents >= NGX_HTTP_AGENT_STORE_BATCH);

    if (rc == NGX_OK && f->checkpoint) {
        ngx_http_agent_store_checkpoint(f->conf);
    }

    /* the task and f go with the pool */
    ngx_destroy_pool(f->pool);

    if (rc == NGX_ABORT) {
        /* the batch's other conversations, at once */
        ngx_http_agent_store_kick_now();

    } else if (rc == NGX_OK) {
        ngx_http_agent_store_ack_wake();

        /*
         * A backlog's rest, or an input that waits (in any worker), is
         * written at once; what else came meanwhile waits for flush=,
         * as the first events did, and goes with what follows it or
         * with an input's batch.  Under a steady load a batch followed
         * at once by another made two commits an input where one did.
         */

        next = rest ? NGX_AGAIN : ngx_http_agent_store_next(z);

        /* kick() posts it at once too once the flush time is due */

        if (next == NGX_AGAIN) {
            ngx_http_agent_store_kick_now();

        } else if (next == NGX_OK || ngx_http_agent_store_audit_queued()) {
            ngx_http_agent_store_kick();
        }

    } else {
        /*
         * not in a loop, whatever waits (an input polls its write every
         * 2 ms): a second later
         */
        ngx_http_agent_store_refused = 2;
        ngx_http_agent_store_refused_at = ngx_current_msec;

        if (!ngx_http_agent_store_event.timer_set) {
            ngx_add_timer(&ngx_http_agent_store_event,
                          NGX_HTTP_AGENT_STORE_FAILED_WAIT);
        }
    }
}


/*
 * The fence refused the batch: another node took one of its
 * conversations (its heartbeat was late for longer than its ttl, and a
 * node claimed the conversation meanwhile), or the log holds another
 * event at a seq of the batch (the zone's copy is not the log's).
 * Nothing of the batch was written; the conversation leaves this node,
 * its turn and subscribers end, and the rest of the batch is written
 * again without it.  The log is the truth: a request or the sweep
 * revives the conversation from it.
 */

static void
ngx_http_agent_store_lose(ngx_http_agent_flush_t *f)
{
    if (f->lost.len == 0) {
        return;
    }

    if (f->lost_seq) {
        ngx_log_error(NGX_LOG_ERR, f->log, 0,
                      "agent conversation \"%V\": the log at seq %uL holds "
                      "another event than this node's; its events not "
                      "written here are dropped, and it is revived from the "
                      "log when asked for", &f->lost, f->lost_seq);

    } else {
        ngx_log_error(NGX_LOG_ERR, f->log, 0,
                      "agent conversation \"%V\": ownership lost, another "
                      "node took it over; its events not written here are "
                      "dropped", &f->lost);
    }

    if (ngx_http_agent_store_lost) {
        ngx_http_agent_store_lost(&f->lost);
    }
}


/*
 * On a node (agent_node) subscribers are sent canonical events once they
 * are written: the conversations of the batch wake theirs, in every
 * worker, as an event added to the log does.
 */

static void
ngx_http_agent_store_wake_subscribers(ngx_http_agent_flush_t *f)
{
    ngx_str_t                     id;
    ngx_uint_t                    i, n, total;
    ngx_pid_t                     pids[NGX_HTTP_AGENT_SUB_WORKERS + 1];
    ngx_http_agent_conv_t        *conv;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_event_t *ev;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    if (amcf->node == NULL) {
        return;
    }

    ev = f->events;
    total = f->nevents + f->more;

    for (i = 0; i < total; i++) {

        /* a conversation's events come together: its first wakes */

        if (i > 0 && ev[i].conv.len == ev[i - 1].conv.len
            && ngx_memcmp(ev[i].conv.data, ev[i - 1].conv.data,
                          ev[i].conv.len)
               == 0)
        {
            continue;
        }

        id = ev[i].conv;

        ngx_http_agent_zone_lock(f->zone);

        conv = ngx_http_agent_conv_find_locked(f->zone, &id);
        n = conv ? ngx_http_agent_conv_sub_pids_locked(conv, pids) : 0;

        ngx_http_agent_zone_unlock(f->zone);

        if (n) {
            ngx_http_agent_wake(&id, pids, n);
        }
    }
}


/*
 * What the next batch has to write: NGX_AGAIN, an input waits (its
 * conversation heads the dirty queue); NGX_OK, other events; NGX_DONE,
 * none
 */

static ngx_int_t
ngx_http_agent_store_next(ngx_http_agent_zone_t *z)
{
    ngx_int_t               rc;
    ngx_queue_t            *q;
    ngx_http_agent_conv_t  *conv;

    rc = NGX_DONE;

    ngx_http_agent_zone_lock(z);

    if (!ngx_queue_empty(&z->sh->dirty)) {
        q = ngx_queue_head(&z->sh->dirty);
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, dirty);
        rc = (conv->acked > conv->flushed) ? NGX_AGAIN : NGX_OK;
    }

    ngx_http_agent_zone_unlock(z);

    return rc;
}


/*
 * What was written is flushed; a conversation with more stays dirty, in
 * its place: the next batch goes on with its events, next to those just
 * written in the tables' pages.  Its claim goes either way: after a
 * failure it is tried again.  The inputs' events a cut batch took on go
 * first: a conversation of both is flushed to the last of them.  Not 0:
 * inputs waiting were written.
 */

static ngx_uint_t
ngx_http_agent_store_written_locked(ngx_http_agent_flush_t *f)
{
    ngx_uint_t  inputs;

    inputs = ngx_http_agent_store_flushed_locked(f, f->events + f->nevents,
                                                 f->more, f->more);
    inputs |= ngx_http_agent_store_flushed_locked(f, f->events, f->nevents,
                                                  f->written);
    return inputs;
}


/* n events of the batch, of which the first written were written */

static ngx_uint_t
ngx_http_agent_store_flushed_locked(ngx_http_agent_flush_t *f,
    ngx_http_agent_store_event_t *ev, ngx_uint_t n, ngx_uint_t written)
{
    uint64_t                last;
    ngx_str_t               id;
    ngx_uint_t              i, next, inputs;
    ngx_http_agent_conv_t  *conv;

    inputs = 0;

    for (i = 0; i < n; i = next) {
        id = ev[i].conv;

        /* a conversation's events come together, in seq order */

        for (next = i + 1;
             next < n
             && ev[next].conv.len == id.len
             && ngx_memcmp(ev[next].conv.data, id.data, id.len) == 0;
             next++)
        {
            /* void */
        }

        conv = ngx_http_agent_conv_find_locked(f->zone, &id);
        if (conv == NULL || conv->flushing != ngx_pid) {
            continue;
        }

        /* a batch cut for an input may have written a part of them */

        if (f->rc == NGX_OK && i < written) {
            last = ev[ngx_min(next, written) - 1].seq;

            if (last > conv->flushed) {
                inputs |= (conv->acked > conv->flushed);
                conv->flushed = last;
            }
        }

        conv->flushing = 0;

        ngx_http_agent_log_trim_locked(f->zone, conv);

        if (conv->flushed >= conv->seq && conv->dirty_linked) {
            ngx_queue_remove(&conv->dirty);
            conv->dirty_linked = 0;
        }
    }

    return inputs;
}
