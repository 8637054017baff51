
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_list.h"


/*
 * The conversations the store holds, for agent_list: one more than the
 * limit (so that the caller knows whether a page follows), read by the
 * store's list on its thread pool, results in a pool of the list's (the
 * event loop does not touch it meanwhile).
 */

static void ngx_http_agent_store_list_thread(void *data, ngx_log_t *log);
static void ngx_http_agent_store_list_done(ngx_event_t *ev);
static void ngx_http_agent_store_list_cleanup(void *data);


ngx_int_t
ngx_http_agent_store_list(ngx_http_request_t *r,
    ngx_http_agent_store_list_t *ls)
{
    ngx_thread_task_t            *task;
    ngx_pool_cleanup_t           *cln;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    scf = amcf->store;

    ls->pool = ngx_create_pool(4096, r->connection->log);
    if (ls->pool == NULL) {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        ngx_destroy_pool(ls->pool);
        return NGX_ERROR;
    }

    cln->handler = ngx_http_agent_store_list_cleanup;
    cln->data = ls;

    ls->convs = ngx_array_create(ls->pool, ls->limit + 1,
                                 sizeof(ngx_http_agent_store_conv_t));
    ls->conf = scf;

    task = ngx_thread_task_alloc(r->pool, 0);

    if (ls->convs == NULL || task == NULL) {
        return NGX_ERROR;
    }

    ls->request = r;

    task->ctx = ls;
    task->handler = ngx_http_agent_store_list_thread;
    task->event.handler = ngx_http_agent_store_list_done;
    task->event.data = ls;

    if (ngx_thread_task_post(scf->thread_pool, task) != NGX_OK) {
        return NGX_ERROR;
    }

    r->main->count++;

    return NGX_OK;
}


static void
ngx_http_agent_store_list_thread(void *data, ngx_log_t *log)
{
    ngx_http_agent_store_list_t  *ls = data;

    ls->rc = ls->conf->store->list(&ls->conf->path, ls, log);
}


static void
ngx_http_agent_store_list_done(ngx_event_t *ev)
{
    ngx_http_agent_store_list_t  *ls = ev->data;

    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ls->request;
    c = r->connection;

    ls->handler(r, ls, ls->rc);

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_agent_store_list_cleanup(void *data)
{
    ngx_http_agent_store_list_t  *ls = data;

    ngx_destroy_pool(ls->pool);
}
