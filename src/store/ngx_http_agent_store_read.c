
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_json.h"


/*
 * A read of the store on the thread pool, for an owner (a request's or a
 * turn's pool): if the owner goes first, its cleanup tells the read, whose
 * result is then dropped.  The result lives until the handler returns.
 */

#define NGX_HTTP_AGENT_STORE_HOLD  60000


struct ngx_http_agent_store_reader_s {
    ngx_http_agent_store_conf_t  *conf;
    ngx_pool_t                   *pool;
    ngx_pool_cleanup_t           *cln;
    ngx_http_agent_store_read_t   rd;
    ngx_int_t                     rc;
    ngx_http_agent_store_read_pt  handler;
    void                         *data;
    ngx_uint_t                    gone;       /* the owner is */
    ngx_uint_t                    takeover;   /* a count, not a read */

    /* a worker that is exiting waits for the task while this is set */
    ngx_event_t                   hold;
};


static ngx_int_t ngx_http_agent_store_task(ngx_pool_t *owner, ngx_str_t *id,
    uint64_t after, uint64_t upto, ngx_http_agent_store_queued_t *q,
    ngx_uint_t takeover, ngx_http_agent_store_read_pt handler, void *data);
static void ngx_http_agent_store_read_thread(void *data, ngx_log_t *log);
static void ngx_http_agent_store_read_done(ngx_event_t *ev);
static void ngx_http_agent_store_read_cleanup(void *data);
static void ngx_http_agent_store_read_hold(ngx_event_t *ev);


ngx_int_t
ngx_http_agent_store_enqueue(ngx_pool_t *owner, ngx_str_t *id,
    ngx_http_agent_store_queued_t *q, ngx_http_agent_store_read_pt handler,
    void *data)
{
    return ngx_http_agent_store_task(owner, id, 0, 0, q, 0, handler, data);
}


ngx_int_t
ngx_http_agent_store_takeover(ngx_pool_t *owner, ngx_str_t *id, uint64_t seq,
    ngx_http_agent_store_read_pt handler, void *data)
{
    return ngx_http_agent_store_task(owner, id, seq, 0, NULL, 1, handler,
                                     data);
}


ngx_int_t
ngx_http_agent_store_read(ngx_pool_t *owner, ngx_str_t *id, uint64_t after,
    uint64_t upto, ngx_http_agent_store_read_pt handler, void *data)
{
    return ngx_http_agent_store_task(owner, id, after, upto, NULL, 0,
                                     handler, data);
}


static ngx_int_t
ngx_http_agent_store_task(ngx_pool_t *owner, ngx_str_t *id, uint64_t after,
    uint64_t upto, ngx_http_agent_store_queued_t *q, ngx_uint_t takeover,
    ngx_http_agent_store_read_pt handler, void *data)
{
    ngx_pool_t                   *pool;
    ngx_thread_task_t              *task;
    ngx_http_agent_main_conf_t     *amcf;
    ngx_http_agent_store_reader_t  *rd;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    task = ngx_thread_task_alloc(pool, sizeof(ngx_http_agent_store_reader_t));
    if (task == NULL) {
        goto failed;
    }

    rd = task->ctx;
    rd->conf = amcf->store;
    rd->pool = pool;
    rd->handler = handler;
    rd->data = data;
    rd->rd.after = after;
    rd->rd.upto = upto;
    rd->takeover = takeover;

    rd->rd.id.data = ngx_pstrdup(pool, id);
    rd->rd.id.len = id->len;

    if (rd->rd.id.data == NULL) {
        goto failed;
    }

    if (q) {
        rd->rd.queue = *q;
        rd->rd.queue.data.data = ngx_pstrdup(pool, &q->data);

        if (rd->rd.queue.data.data == NULL) {
            goto failed;
        }
    }

    if (owner) {
        rd->cln = ngx_pool_cleanup_add(owner, 0);
        if (rd->cln == NULL) {
            goto failed;
        }

        rd->cln->handler = ngx_http_agent_store_read_cleanup;
        rd->cln->data = rd;
    }

    task->handler = ngx_http_agent_store_read_thread;
    task->event.handler = ngx_http_agent_store_read_done;
    task->event.data = rd;

    if (ngx_thread_task_post(rd->conf->thread_pool, task) != NGX_OK) {
        if (rd->cln) {
            rd->cln->handler = NULL;
        }

        /* the pool's queue is full: the store is there, only busy */

        ngx_destroy_pool(pool);
        return NGX_BUSY;
    }

    /*
     * not cancelable: a worker shutting down gracefully waits for the
     * answer of a request that waits for the store
     */

    rd->hold.handler = ngx_http_agent_store_read_hold;
    rd->hold.data = rd;
    rd->hold.log = ngx_cycle->log;

    ngx_add_timer(&rd->hold, NGX_HTTP_AGENT_STORE_HOLD);

    return NGX_OK;

failed:

    ngx_destroy_pool(pool);

    return NGX_ERROR;
}


ngx_int_t
ngx_http_agent_store_busy_answer(ngx_http_request_t *r)
{
    return ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                     "unavailable",
                                     "the store is busy, try again");
}


/*
 * 421 owned_elsewhere: a node that lives owns the conversation, at the
 * address in X-Agent-Owner (when it gave one); a front tier that routes
 * by conversation retries on it (proxy_next_upstream, see README)
 */

ngx_int_t
ngx_http_agent_store_elsewhere_answer(ngx_http_request_t *r, ngx_str_t *addr)
{
    ngx_table_elt_t  *h;

    if (addr->len) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /* zeroed: newer nginx has more fields here (h->next) */
        ngx_memzero(h, sizeof(ngx_table_elt_t));

        h->hash = 1;
        ngx_str_set(&h->key, "X-Agent-Owner");

        h->value.data = ngx_pstrdup(r->pool, addr);
        if (h->value.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->value.len = addr->len;
    }

    return ngx_http_agent_json_error(r, NGX_HTTP_MISDIRECTED_REQUEST,
                                     "owned_elsewhere",
                                     "another node owns the conversation");
}


static void
ngx_http_agent_store_read_thread(void *data, ngx_log_t *log)
{
    ngx_http_agent_store_reader_t *rd = data;

    if (rd->takeover) {
        rd->rc = rd->conf->store->takeover(&rd->conf->path, &rd->rd, log);
        return;
    }

    if (rd->rd.queue.data.len) {
        rd->rc = rd->conf->store->enqueue(&rd->conf->path, &rd->rd, log);
        return;
    }

    rd->rc = rd->conf->store->read(&rd->conf->path, &rd->rd, rd->pool, log);
}


static void
ngx_http_agent_store_read_done(ngx_event_t *ev)
{
    ngx_http_agent_store_reader_t *rd = ev->data;

    if (rd->hold.timer_set) {
        ngx_del_timer(&rd->hold);
    }

    if (rd->gone) {
        ngx_destroy_pool(rd->pool);
        return;
    }

    if (rd->cln) {
        rd->cln->handler = NULL;
    }

    rd->handler(&rd->rd, rd->rc, rd->data);

    ngx_destroy_pool(rd->pool);
}


static void
ngx_http_agent_store_read_hold(ngx_event_t *ev)
{
    ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                  "agent store task is still running");

    ngx_add_timer(ev, NGX_HTTP_AGENT_STORE_HOLD);
}


static void
ngx_http_agent_store_read_cleanup(void *data)
{
    ngx_http_agent_store_reader_t *rd = data;

    /* the read's own pool outlives the owner's: the result is dropped */
    rd->gone = 1;
}
