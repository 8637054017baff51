
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sqlite3.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_list.h"
#include "ngx_http_agent_store_sqlite.h"


/*
 * agent_list's page of SQLite, on a pool thread: one query, on a
 * read-only connection of its own.
 */

static ngx_int_t ngx_http_agent_sqlite_list_query(sqlite3 *db,
    ngx_http_agent_store_list_t *ls);
static ngx_int_t ngx_http_agent_sqlite_list_text(sqlite3_stmt *st, int col,
    ngx_pool_t *pool, ngx_str_t *s);


#define NGX_HTTP_AGENT_SQLITE_LIST_SQL                                        \
    "SELECT id, state, updated, (SELECT count(*) FROM tool_calls t"          \
    "  WHERE t.conversation = c.id AND t.status = 'suspended')"              \
    " FROM conversations c"                                                  \
    " WHERE agent = ?1 AND (?2 OR owner = ?3) AND id > ?4"                   \
    " ORDER BY id LIMIT ?5"


ngx_int_t
ngx_http_agent_sqlite_list(ngx_str_t *path, ngx_http_agent_store_list_t *ls,
    ngx_log_t *log)
{
    int         rc;
    sqlite3    *db;
    ngx_int_t   ok;

    /* the path is NUL-terminated (the directive made it so) */

    rc = sqlite3_open_v2((char *) path->data, &db, SQLITE_OPEN_READONLY,
                         NULL);

    if (rc != SQLITE_OK) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": %s", path,
                      db ? sqlite3_errmsg(db) : "cannot open");
        sqlite3_close(db);
        return NGX_ERROR;
    }

    sqlite3_busy_timeout(db, 5000);

    ok = ngx_http_agent_sqlite_list_query(db, ls);

    if (ok != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": the list "
                      "failed: %s", path, sqlite3_errmsg(db));
    }

    sqlite3_close(db);

    return ok;
}


static ngx_int_t
ngx_http_agent_sqlite_list_query(sqlite3 *db, ngx_http_agent_store_list_t *ls)
{
    int                           rc;
    sqlite3_stmt                 *st;
    ngx_http_agent_store_conv_t  *c;

    if (sqlite3_prepare_v2(db, NGX_HTTP_AGENT_SQLITE_LIST_SQL, -1, &st, NULL)
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

        if (ngx_http_agent_sqlite_list_text(st, 0, ls->pool, &c->id)
            != NGX_OK
            || ngx_http_agent_sqlite_list_text(st, 1, ls->pool, &c->state)
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
ngx_http_agent_sqlite_list_text(sqlite3_stmt *st, int col, ngx_pool_t *pool,
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
