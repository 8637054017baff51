
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

#define NGX_HTTP_AGENT_STORE_TASK_READ      0
#define NGX_HTTP_AGENT_STORE_TASK_TAKEOVER  1
#define NGX_HTTP_AGENT_STORE_TASK_RELEASE   2
#define NGX_HTTP_AGENT_STORE_TASK_CREATE    3
#define NGX_HTTP_AGENT_STORE_TASK_ENQUEUE   4
#define NGX_HTTP_AGENT_STORE_TASK_NOTIFIED  5
#define NGX_HTTP_AGENT_STORE_TASK_FOLLOW    6


struct ngx_http_agent_store_reader_s {
    ngx_http_agent_store_conf_t  *conf;
    ngx_pool_t                   *pool;
    ngx_pool_cleanup_t           *cln;
    ngx_http_agent_store_read_t   rd;
    ngx_int_t                     rc;
    ngx_http_agent_store_read_pt  handler;
    void                         *data;
    ngx_uint_t                    gone;       /* the owner is */
    ngx_uint_t                    kind;       /* a read, or another task */

    /* a worker that is exiting waits for the task while this is set */
    ngx_event_t                   hold;
};


static ngx_int_t ngx_http_agent_store_task(ngx_pool_t *owner,
    ngx_http_agent_store_read_t *in, ngx_uint_t kind,
    ngx_http_agent_store_read_pt handler, void *data);
static ngx_int_t ngx_http_agent_store_dup(ngx_pool_t *pool, ngx_str_t *s);
static ngx_http_agent_store_conf_t *ngx_http_agent_store_conf(void);
static void ngx_http_agent_store_done_nothing(
    ngx_http_agent_store_read_t *rd, ngx_int_t rc, void *data);
static void ngx_http_agent_store_read_thread(void *data, ngx_log_t *log);
static void ngx_http_agent_store_read_done(ngx_event_t *ev);
static void ngx_http_agent_store_read_cleanup(void *data);
static void ngx_http_agent_store_read_hold(ngx_event_t *ev);


ngx_int_t
ngx_http_agent_store_enqueue(ngx_pool_t *owner, ngx_str_t *id,
    ngx_http_agent_store_queued_t *q, ngx_http_agent_store_read_pt handler,
    void *data)
{
    ngx_http_agent_store_read_t  in;

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.queue = *q;

    return ngx_http_agent_store_task(owner, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_ENQUEUE,
                                     handler, data);
}


ngx_int_t
ngx_http_agent_store_takeover(ngx_pool_t *owner, ngx_str_t *id, uint64_t seq,
    ngx_http_agent_store_read_pt handler, void *data)
{
    ngx_http_agent_store_read_t  in;

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.after = seq;

    return ngx_http_agent_store_task(owner, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_TAKEOVER,
                                     handler, data);
}


/*
 * A conversation left the zone at rest: the store lets other nodes have
 * it (seq 0: a created id never used, whose row goes).  Nobody waits
 * for the answer; a release that fails leaves the conversation this
 * node's, claimed again once its node is taken for dead, as before.
 */

void
ngx_http_agent_store_let_go(ngx_str_t *id, uint64_t epoch, uint64_t seq)
{
    ngx_http_agent_store_conf_t  *scf;
    ngx_http_agent_store_read_t   in;

    scf = ngx_http_agent_store_conf();

    if (scf == NULL || scf->store->release == NULL) {
        return;
    }

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.epoch = epoch;
    in.last_seq = seq;

    (void) ngx_http_agent_store_task(NULL, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_RELEASE,
                                     ngx_http_agent_store_done_nothing, NULL);
}


void
ngx_http_agent_store_notified(ngx_str_t *id, ngx_str_t *call,
    ngx_str_t *kind)
{
    ngx_http_agent_store_conf_t  *scf;
    ngx_http_agent_store_read_t   in;

    scf = ngx_http_agent_store_conf();

    if (scf == NULL || scf->store->notified == NULL) {
        return;
    }

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.call = *call;
    in.call_kind = *kind;

    (void) ngx_http_agent_store_task(NULL, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_NOTIFIED,
                                     ngx_http_agent_store_done_nothing, NULL);
}


/*
 * The row of a conversation agent_create made, bound to its agent and
 * owner; NGX_DECLINED: the store has none to write
 */

ngx_int_t
ngx_http_agent_store_create(ngx_pool_t *owner, ngx_str_t *id,
    ngx_str_t *agent, ngx_str_t *conv_owner,
    ngx_http_agent_store_read_pt handler, void *data)
{
    ngx_http_agent_store_conf_t  *scf;
    ngx_http_agent_store_read_t   in;

    scf = ngx_http_agent_store_conf();

    if (scf == NULL || scf->store->create == NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.agent = *agent;

    if (conv_owner) {
        in.owner = *conv_owner;
    }

    return ngx_http_agent_store_task(owner, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_CREATE,
                                     handler, data);
}


/* the store's configuration, NULL without agent_store */

static ngx_http_agent_store_conf_t *
ngx_http_agent_store_conf(void)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    return amcf->store;
}


static void
ngx_http_agent_store_done_nothing(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data)
{
    /* logged by the store if it failed */
}


ngx_int_t
ngx_http_agent_store_follow(ngx_pool_t *owner, ngx_str_t *id, uint64_t after,
    ngx_uint_t limit, ngx_http_agent_store_read_pt handler, void *data)
{
    ngx_http_agent_store_read_t   in;
    ngx_http_agent_store_conf_t  *scf;

    scf = ngx_http_agent_store_conf();

    if (scf == NULL || scf->store->follow == NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.after = after;
    in.limit = limit;

    return ngx_http_agent_store_task(owner, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_FOLLOW,
                                     handler, data);
}


ngx_int_t
ngx_http_agent_store_read(ngx_pool_t *owner, ngx_str_t *id, uint64_t after,
    uint64_t upto, ngx_http_agent_store_read_pt handler, void *data)
{
    ngx_http_agent_store_read_t  in;

    ngx_memzero(&in, sizeof(ngx_http_agent_store_read_t));
    in.id = *id;
    in.after = after;
    in.upto = upto;

    return ngx_http_agent_store_task(owner, &in,
                                     NGX_HTTP_AGENT_STORE_TASK_READ, handler,
                                     data);
}


static ngx_int_t
ngx_http_agent_store_task(ngx_pool_t *owner, ngx_http_agent_store_read_t *in,
    ngx_uint_t kind, ngx_http_agent_store_read_pt handler, void *data)
{
    ngx_pool_t                     *pool;
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
    rd->kind = kind;
    rd->rd = *in;

    /* the inputs: the id, a message to queue, an agent and owner, a call */

    if (ngx_http_agent_store_dup(pool, &rd->rd.id) != NGX_OK
        || ngx_http_agent_store_dup(pool, &rd->rd.queue.data) != NGX_OK
        || ngx_http_agent_store_dup(pool, &rd->rd.agent) != NGX_OK
        || ngx_http_agent_store_dup(pool, &rd->rd.owner) != NGX_OK
        || ngx_http_agent_store_dup(pool, &rd->rd.call) != NGX_OK
        || ngx_http_agent_store_dup(pool, &rd->rd.call_kind) != NGX_OK)
    {
        goto failed;
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
 * A request's task of the store, as it was posted: NGX_OK, the request
 * waits for it (NGX_DONE); else its answer, busy or an error
 */

ngx_int_t
ngx_http_agent_store_posted(ngx_http_request_t *r, ngx_int_t rc)
{
    if (rc == NGX_BUSY) {
        return ngx_http_agent_store_busy_answer(r);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->main->count++;

    return NGX_DONE;
}


ngx_int_t
ngx_http_agent_store_unread_answer(ngx_http_request_t *r)
{
    return ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                     "unavailable",
                                     "the conversation could not be read "
                                     "from the store");
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

    if (rd->kind == NGX_HTTP_AGENT_STORE_TASK_TAKEOVER) {
        rd->rc = rd->conf->store->takeover(&rd->conf->path, &rd->rd, log);
        return;
    }

    if (rd->kind == NGX_HTTP_AGENT_STORE_TASK_FOLLOW) {
        rd->rc = rd->conf->store->follow(&rd->conf->path, &rd->rd, rd->pool,
                                         log);
        return;
    }

    if (rd->kind == NGX_HTTP_AGENT_STORE_TASK_RELEASE) {
        rd->rc = rd->conf->store->release(&rd->conf->path, &rd->rd, log);
        return;
    }

    if (rd->kind == NGX_HTTP_AGENT_STORE_TASK_CREATE) {
        rd->rc = rd->conf->store->create(&rd->conf->path, &rd->rd, log);
        return;
    }

    if (rd->kind == NGX_HTTP_AGENT_STORE_TASK_NOTIFIED) {
        rd->rc = rd->conf->store->notified(&rd->conf->path, &rd->rd, log);
        return;
    }

    if (rd->kind == NGX_HTTP_AGENT_STORE_TASK_ENQUEUE) {
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


static ngx_int_t
ngx_http_agent_store_dup(ngx_pool_t *pool, ngx_str_t *s)
{
    u_char  *p;

    if (s->len == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(pool, s->len + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p, s->data, s->len);
    p[s->len] = '\0';
    s->data = p;

    return NGX_OK;
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
