
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The audit of model calls, written behind as the log is: rows queue in
 * the worker and go with the log writer's next batch, in its transaction
 * (ngx_http_agent_store.c).  A row that cannot be written is logged and
 * dropped: the audit never holds a turn back, nor the log's events.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_audit.h"


typedef struct {
    ngx_http_agent_store_conf_t  *conf;
    ngx_pool_t                   *pool;
    ngx_http_request_t           *request;
    ngx_http_agent_audit_page_pt  handler;
    ngx_http_agent_audit_page_t   page;
    ngx_int_t                     rc;
} ngx_http_agent_audit_read_t;


static ngx_int_t ngx_http_agent_store_audit_copy(ngx_pool_t *pool,
    ngx_str_t *s);
static void ngx_http_agent_store_audit_read_thread(void *data,
    ngx_log_t *log);
static void ngx_http_agent_store_audit_read_done(ngx_event_t *ev);


/* the rows queued, in a pool that goes with the batch that writes them */
static ngx_pool_t    *ngx_http_agent_audit_pool;
static ngx_array_t   *ngx_http_agent_audit_rows;


ngx_int_t
ngx_http_agent_store_audit(ngx_http_agent_audit_row_t *row)
{
    ngx_pool_t                   *pool;
    ngx_http_agent_audit_row_t   *r;
    ngx_http_agent_main_conf_t   *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (amcf == NULL || amcf->store == NULL) {
        return NGX_DECLINED;
    }

    if (ngx_http_agent_audit_rows == NULL) {
        pool = ngx_create_pool(4096, ngx_cycle->log);
        if (pool == NULL) {
            return NGX_ERROR;
        }

        ngx_http_agent_audit_rows = ngx_array_create(pool, 8,
                                          sizeof(ngx_http_agent_audit_row_t));
        if (ngx_http_agent_audit_rows == NULL) {
            ngx_destroy_pool(pool);
            return NGX_ERROR;
        }

        ngx_http_agent_audit_pool = pool;
    }

    pool = ngx_http_agent_audit_pool;

    r = ngx_array_push(ngx_http_agent_audit_rows);
    if (r == NULL) {
        return NGX_ERROR;
    }

    *r = *row;

    if (ngx_http_agent_store_audit_copy(pool, &r->conv) != NGX_OK
        || ngx_http_agent_store_audit_copy(pool, &r->adapter) != NGX_OK
        || ngx_http_agent_store_audit_copy(pool, &r->model) != NGX_OK
        || ngx_http_agent_store_audit_copy(pool, &r->error) != NGX_OK)
    {
        ngx_http_agent_audit_rows->nelts--;
        return NGX_ERROR;
    }

    /* with agent_store flush=, rows wait as the log's events do */

    ngx_http_agent_store_kick();

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_store_audit_copy(ngx_pool_t *pool, ngx_str_t *s)
{
    u_char  *p;

    if (s->len == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(pool, s->len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p, s->data, s->len);
    s->data = p;

    return NGX_OK;
}


/*
 * The rows queued so far, for a batch: the pool that holds them is the
 * batch's from now on, and what queues next goes with the next batch
 */

ngx_pool_t *
ngx_http_agent_store_audit_take(ngx_array_t **rows)
{
    ngx_pool_t  *pool;

    *rows = ngx_http_agent_audit_rows;
    pool = ngx_http_agent_audit_pool;

    ngx_http_agent_audit_rows = NULL;
    ngx_http_agent_audit_pool = NULL;

    return pool;
}


/* a worker that exits: the rows still queued are not written */

void
ngx_http_agent_store_audit_exit(ngx_log_t *log)
{
    if (ngx_http_agent_audit_pool == NULL) {
        return;
    }

    if (ngx_http_agent_audit_rows && ngx_http_agent_audit_rows->nelts) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "agent store could not write %ui model call rows as "
                      "the worker exits", ngx_http_agent_audit_rows->nelts);
    }

    ngx_destroy_pool(ngx_http_agent_audit_pool);

    ngx_http_agent_audit_pool = NULL;
    ngx_http_agent_audit_rows = NULL;
}


/*
 * The rows of a batch that was not written come back, ahead of those
 * queued meanwhile (a call's start before its end), for the next batch
 */

void
ngx_http_agent_store_audit_back(ngx_pool_t *pool, ngx_array_t *rows)
{
    ngx_uint_t                   i;
    ngx_pool_t                  *newer_pool;
    ngx_array_t                 *newer;
    ngx_http_agent_audit_row_t  *r;

    newer = ngx_http_agent_audit_rows;
    newer_pool = ngx_http_agent_audit_pool;

    ngx_http_agent_audit_rows = rows;
    ngx_http_agent_audit_pool = pool;

    if (newer == NULL) {
        return;
    }

    r = newer->elts;

    for (i = 0; i < newer->nelts; i++) {
        if (ngx_http_agent_store_audit(&r[i]) != NGX_OK) {
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                          "agent store could not keep %ui model call rows",
                          newer->nelts - i);
            break;
        }
    }

    ngx_destroy_pool(newer_pool);
}


void
ngx_http_agent_store_audit_drop(ngx_array_t *rows, ngx_str_t *conv)
{
    ngx_uint_t                   i, n;
    ngx_http_agent_audit_row_t  *r;

    if (conv->len == 0) {
        return;
    }

    r = rows->elts;

    for (i = 0, n = 0; i < rows->nelts; i++) {
        if (r[i].conv.len == conv->len
            && ngx_memcmp(r[i].conv.data, conv->data, conv->len) == 0)
        {
            continue;
        }

        r[n++] = r[i];
    }

    if (n < rows->nelts) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent conversation \"%V\": %ui model call rows "
                      "dropped, another node owns it", conv,
                      rows->nelts - n);
    }

    rows->nelts = n;
}


ngx_uint_t
ngx_http_agent_store_audit_queued(void)
{
    return ngx_http_agent_audit_rows && ngx_http_agent_audit_rows->nelts;
}


ngx_int_t
ngx_http_agent_store_audit_page(ngx_http_request_t *r, ngx_str_t *conv,
    uint64_t after, ngx_uint_t limit, ngx_http_agent_audit_page_pt handler)
{
    ngx_pool_t                   *pool;
    ngx_thread_task_t            *task;
    ngx_http_agent_audit_read_t  *rd;
    ngx_http_agent_main_conf_t   *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    if (amcf->store == NULL) {
        return NGX_DECLINED;
    }

    /* the cycle's log: the pool may outlive the request's connection */

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    task = ngx_thread_task_alloc(pool, sizeof(ngx_http_agent_audit_read_t));
    if (task == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    rd = task->ctx;
    rd->conf = amcf->store;
    rd->pool = pool;
    rd->request = r;
    rd->handler = handler;
    rd->page.conv = *conv;
    rd->page.after = after;
    rd->page.limit = limit;

    if (ngx_http_agent_store_audit_copy(pool, &rd->page.conv) != NGX_OK) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    task->handler = ngx_http_agent_store_audit_read_thread;
    task->event.handler = ngx_http_agent_store_audit_read_done;
    task->event.data = rd;

    if (ngx_thread_task_post(rd->conf->thread_pool, task) != NGX_OK) {
        ngx_destroy_pool(pool);
        return NGX_BUSY;
    }

    /* the request stays until the page is answered */
    r->main->count++;

    return NGX_OK;
}


static void
ngx_http_agent_store_audit_read_thread(void *data, ngx_log_t *log)
{
    ngx_http_agent_audit_read_t *rd = data;

    rd->rc = rd->conf->store->audit_page(&rd->conf->path, &rd->page,
                                         rd->pool, log);
}


static void
ngx_http_agent_store_audit_read_done(ngx_event_t *ev)
{
    ngx_http_agent_audit_read_t *rd = ev->data;

    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = rd->request;
    c = r->connection;

    /* the handler copies what it sends: the page goes with the pool */
    rd->handler(r, &rd->page, rd->rc);

    ngx_destroy_pool(rd->pool);

    ngx_http_run_posted_requests(c);
}
