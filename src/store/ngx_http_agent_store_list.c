
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sqlite3.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_list.h"


/*
 * The conversations the store holds, for agent_list: one more than the
 * limit (so that the caller knows whether a page follows) in one query on the
 * store's thread pool, on a read-only connection of its own, results in
 * a pool of the list's (the event loop does not touch it meanwhile).
 */

static void ngx_http_agent_store_list_thread(void *data, ngx_log_t *log);
static ngx_int_t ngx_http_agent_store_list_query(sqlite3 *db,
    ngx_http_agent_store_list_t *ls);
static ngx_int_t ngx_http_agent_store_list_text(sqlite3_stmt *st, int col,
    ngx_pool_t *pool, ngx_str_t *s);
static void ngx_http_agent_store_list_done(ngx_event_t *ev);
static void ngx_http_agent_store_list_cleanup(void *data);


#define NGX_HTTP_AGENT_STORE_LIST_SQL                                        \
    "SELECT id, state, updated, (SELECT count(*) FROM tool_calls t"          \
    "  WHERE t.conversation = c.id AND t.status = 'suspended')"              \
    " FROM conversations c"                                                  \
    " WHERE agent = ?1 AND (?2 OR owner = ?3) AND id > ?4"                   \
    " ORDER BY id LIMIT ?5"


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
    ls->path.data = ngx_pstrdup(ls->pool, &scf->path);
    ls->path.len = scf->path.len;

    task = ngx_thread_task_alloc(r->pool, 0);

    if (ls->convs == NULL || ls->path.data == NULL || task == NULL) {
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

    int       rc;
    u_char   *path;
    sqlite3  *db;

    ls->rc = NGX_ERROR;

    path = ngx_pnalloc(ls->pool, ls->path.len + 1);
    if (path == NULL) {
        return;
    }

    (void) ngx_cpystrn(path, ls->path.data, ls->path.len + 1);

    rc = sqlite3_open_v2((char *) path, &db, SQLITE_OPEN_READONLY, NULL);

    if (rc != SQLITE_OK) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\": %s", path,
                      db ? sqlite3_errmsg(db) : "cannot open");
        sqlite3_close(db);
        return;
    }

    sqlite3_busy_timeout(db, 5000);

    if (ngx_http_agent_store_list_query(db, ls) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\": the list "
                      "failed: %s", path, sqlite3_errmsg(db));

    } else {
        ls->rc = NGX_OK;
    }

    sqlite3_close(db);
}


static ngx_int_t
ngx_http_agent_store_list_query(sqlite3 *db, ngx_http_agent_store_list_t *ls)
{
    int                           rc;
    sqlite3_stmt                 *st;
    ngx_http_agent_store_conv_t  *c;

    if (sqlite3_prepare_v2(db, NGX_HTTP_AGENT_STORE_LIST_SQL, -1, &st, NULL)
        != SQLITE_OK)
    {
        return NGX_ERROR;
    }

    sqlite3_bind_text(st, 1, (char *) ls->agent.data, ls->agent.len,
                      SQLITE_STATIC);
    sqlite3_bind_int(st, 2, ls->any_owner ? 1 : 0);
    sqlite3_bind_text(st, 3, (char *) ls->owner.data, ls->owner.len,
                      SQLITE_STATIC);
    sqlite3_bind_text(st, 4, (char *) ls->after.data, ls->after.len,
                      SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, ls->limit + 1);

    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        c = ngx_array_push(ls->convs);
        if (c == NULL) {
            break;
        }

        if (ngx_http_agent_store_list_text(st, 0, ls->pool, &c->id)
            != NGX_OK
            || ngx_http_agent_store_list_text(st, 1, ls->pool, &c->state)
               != NGX_OK)
        {
            break;
        }

        c->updated = (uint64_t) sqlite3_column_int64(st, 2) * 1000;
        c->pending = (ngx_uint_t) sqlite3_column_int64(st, 3);
    }

    sqlite3_finalize(st);

    return (rc == SQLITE_DONE) ? NGX_OK : NGX_ERROR;
}


static ngx_int_t
ngx_http_agent_store_list_text(sqlite3_stmt *st, int col, ngx_pool_t *pool,
    ngx_str_t *s)
{
    const u_char  *p;

    p = sqlite3_column_text(st, col);
    s->len = sqlite3_column_bytes(st, col);

    s->data = ngx_pnalloc(pool, s->len);
    if (s->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(s->data, p, s->len);

    return NGX_OK;
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
