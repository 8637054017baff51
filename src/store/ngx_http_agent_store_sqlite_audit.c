
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The model_calls table, on pool threads.  A call's number is its place
 * among the conversation's calls in the order they started (by start
 * time, then worker): each worker writes its rows when it can, so a row
 * can come after a later call's, and then the later ones move up by one.
 * Numbers are gapless and unique whichever worker (or nginx) made the
 * call.  At most one model call of a conversation runs at a time: a row
 * still "running" when a later call starts was cut off (its worker died,
 * or nginx stopped) and is marked "lost".  A call's end finds its row by
 * start time and worker, so an end written after the next start still
 * lands.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_bytes.h"
#include "ngx_http_agent_store_sqlite.h"
#include "ngx_http_agent_store_audit.h"


static ngx_int_t ngx_http_agent_sqlite_audit_row(sqlite3_stmt **stmt,
    ngx_http_agent_audit_row_t *row);
static void ngx_http_agent_sqlite_audit_end(sqlite3_stmt *s,
    ngx_http_agent_audit_row_t *row);
static ngx_int_t ngx_http_agent_sqlite_audit_json(ngx_pool_t *pool,
    ngx_http_agent_bytes_t *b, sqlite3_stmt *stmt);


/* row values: the index on (conversation, started, worker) finds them */

#define NGX_HTTP_AGENT_AUDIT_LATER                                           \
    " WHERE conversation = ?1 AND (started, worker) > (?2, ?3)"

#define NGX_HTTP_AGENT_AUDIT_EARLIER                                         \
    " WHERE conversation = ?1 AND (started, worker) < (?2, ?3)"

#define NGX_HTTP_AGENT_AUDIT_END        4
#define NGX_HTTP_AGENT_AUDIT_SAVEPOINT  5
#define NGX_HTTP_AGENT_AUDIT_RELEASE    6
#define NGX_HTTP_AGENT_AUDIT_UNDO       7


static char  *ngx_http_agent_sqlite_audit_sql[] = {

    "UPDATE model_calls SET status = 'lost'"
    NGX_HTTP_AGENT_AUDIT_EARLIER " AND status = 'running'",

    /* the later calls up by one, through negative numbers: no clash */
    "UPDATE model_calls SET call = -call - 1" NGX_HTTP_AGENT_AUDIT_LATER,

    "UPDATE model_calls SET call = -call"
    " WHERE conversation = ?1 AND call < 0",

    /* the number after the last earlier call's, found by the index */
    "INSERT INTO model_calls (conversation, call, started, worker, turn,"
    " attempt, adapter, model, status)"
    " VALUES (?1, coalesce((SELECT call FROM model_calls"
    NGX_HTTP_AGENT_AUDIT_EARLIER
    " ORDER BY started DESC, worker DESC LIMIT 1), 0) + 1,"
    " ?2, ?3, ?4, ?5, ?6, ?7, 'running')",

    "UPDATE model_calls SET status = ?4, error = ?5, input_tokens = ?6,"
    " output_tokens = ?7, cached_tokens = ?8, time_to_first_token_ms = ?9,"
    " duration_ms = ?10"
    " WHERE conversation = ?1 AND started = ?2 AND worker = ?3",

    /* inside the log writer's transaction */
    "SAVEPOINT audit",
    "RELEASE audit",
    "ROLLBACK TO audit"
};


/* the audit's statements on the log writer's connection */

ngx_int_t
ngx_http_agent_sqlite_audit_prepare(sqlite3 *db, sqlite3_stmt **stmts,
    ngx_str_t *path, ngx_log_t *log)
{
    return ngx_http_agent_sqlite_prepare(db, ngx_http_agent_sqlite_audit_sql,
                                         stmts, NGX_HTTP_AGENT_AUDIT_STMTS,
                                         path, log);
}


/*
 * The rows, in the log writer's transaction, under a savepoint: rows
 * that cannot be written are logged and undone, and the batch's events
 * are committed all the same
 */

void
ngx_http_agent_sqlite_audit_rows(sqlite3 *db, sqlite3_stmt **stmts,
    ngx_http_agent_audit_row_t *rows, ngx_uint_t n, ngx_str_t *path,
    ngx_log_t *log)
{
    ngx_uint_t  i;

    if (ngx_http_agent_sqlite_step(stmts[NGX_HTTP_AGENT_AUDIT_SAVEPOINT])
        != NGX_OK)
    {
        goto failed;
    }

    for (i = 0; i < n; i++) {
        if (ngx_http_agent_sqlite_audit_row(stmts, &rows[i]) != NGX_OK) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "agent store \"%V\" could not write %ui model "
                          "call rows: %s", path, n, sqlite3_errmsg(db));

            (void) ngx_http_agent_sqlite_step(
                                         stmts[NGX_HTTP_AGENT_AUDIT_UNDO]);
            break;
        }
    }

    if (ngx_http_agent_sqlite_step(stmts[NGX_HTTP_AGENT_AUDIT_RELEASE])
        == NGX_OK)
    {
        return;
    }

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": %s", path,
                  sqlite3_errmsg(db));
}


/*
 * A start marks what still runs of the conversation's earlier calls
 * lost, moves the later ones up and inserts; an end updates.  Each
 * statement is keyed by ?1, ?2, ?3: conversation, start and worker.
 */

static ngx_int_t
ngx_http_agent_sqlite_audit_row(sqlite3_stmt **stmt,
    ngx_http_agent_audit_row_t *row)
{
    ngx_uint_t     i, first, last;
    sqlite3_stmt  *s;

    first = row->end ? NGX_HTTP_AGENT_AUDIT_END : 0;
    last = row->end ? NGX_HTTP_AGENT_AUDIT_END
                    : NGX_HTTP_AGENT_AUDIT_END - 1;

    for (i = first; i <= last; i++) {
        s = stmt[i];

        /* no later call moved down: none to bring back */

        if (i == NGX_HTTP_AGENT_AUDIT_END - 2
            && sqlite3_changes(sqlite3_db_handle(s)) == 0)
        {
            continue;
        }

        sqlite3_bind_text(s, 1, (char *) row->conv.data, row->conv.len,
                          SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, row->started);
        sqlite3_bind_int64(s, 3, row->worker);

        if (i == NGX_HTTP_AGENT_AUDIT_END - 1) {
            sqlite3_bind_int64(s, 4, row->turn);
            sqlite3_bind_int64(s, 5, row->attempt);
            sqlite3_bind_text(s, 6, (char *) row->adapter.data,
                              row->adapter.len, SQLITE_STATIC);
            sqlite3_bind_text(s, 7, (char *) row->model.data, row->model.len,
                              SQLITE_STATIC);

        } else if (i == NGX_HTTP_AGENT_AUDIT_END) {
            ngx_http_agent_sqlite_audit_end(s, row);
        }

        if (ngx_http_agent_sqlite_step(s) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static void
ngx_http_agent_sqlite_audit_end(sqlite3_stmt *s,
    ngx_http_agent_audit_row_t *row)
{
    sqlite3_bind_text(s, 4, (char *) row->status.data, row->status.len,
                      SQLITE_STATIC);

    if (row->error.len) {
        sqlite3_bind_text(s, 5, (char *) row->error.data, row->error.len,
                          SQLITE_STATIC);
    }

    sqlite3_bind_int64(s, 6, row->input);
    sqlite3_bind_int64(s, 7, row->output);
    sqlite3_bind_int64(s, 8, row->cached);

    if (row->first >= 0) {
        sqlite3_bind_int64(s, 9, row->first);
    }

    sqlite3_bind_int64(s, 10, row->duration);
}


/* on a pool thread, with a connection of its own (a read beside a write) */

ngx_int_t
ngx_http_agent_sqlite_audit_page(ngx_str_t *path,
    ngx_http_agent_audit_page_t *page, ngx_pool_t *pool, ngx_log_t *log)
{
    int                     rc;
    sqlite3                *db;
    ngx_uint_t              n;
    sqlite3_stmt           *stmt;
    ngx_http_agent_bytes_t  b;

    stmt = NULL;
    ngx_memzero(&b, sizeof(ngx_http_agent_bytes_t));

    db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_ERR);
    if (db == NULL) {
        return NGX_ERROR;
    }

    rc = sqlite3_prepare_v2(db,
             "SELECT call, turn, attempt, adapter, model, status, error,"
             " input_tokens, output_tokens, cached_tokens,"
             " time_to_first_token_ms, duration_ms, started, worker"
             " FROM model_calls WHERE conversation = ?1 AND call > ?2"
             " ORDER BY call LIMIT ?3", -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    sqlite3_bind_text(stmt, 1, (char *) page->conv.data, page->conv.len,
                      SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, page->after);
    sqlite3_bind_int64(stmt, 3, page->limit + 1);

    if (ngx_http_agent_bytes_append(pool, &b, (u_char *) "[", 1) != NGX_OK) {
        goto failed;
    }

    for (n = 0; (rc = sqlite3_step(stmt)) == SQLITE_ROW; n++) {

        if (n == page->limit) {
            page->more = 1;
            break;
        }

        if ((n && ngx_http_agent_bytes_append(pool, &b, (u_char *) ",", 1)
                  != NGX_OK)
            || ngx_http_agent_sqlite_audit_json(pool, &b, stmt) != NGX_OK)
        {
            goto failed;
        }

        page->last = sqlite3_column_int64(stmt, 0);
    }

    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        goto failed;
    }

    if (ngx_http_agent_bytes_append(pool, &b, (u_char *) "]", 1) != NGX_OK) {
        goto failed;
    }

    page->json.data = b.data;
    page->json.len = b.len;

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\" cannot read the "
                  "model calls of \"%V\": %s", path, &page->conv,
                  sqlite3_errmsg(db));

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_ERROR;
}


/*
 * A row as JSON: numbers as they are, the texts escaped, the error (a
 * turn_failed reason the module wrote) as the JSON object it is
 */

static ngx_int_t
ngx_http_agent_sqlite_audit_json(ngx_pool_t *pool, ngx_http_agent_bytes_t *b,
    sqlite3_stmt *stmt)
{
    int           i, type;
    u_char       *p, *last;
    size_t        len;
    const u_char *text;

    static char  *keys[] = {
        "call", "turn", "attempt", "adapter", "model", "status", "error",
        "input_tokens", "output_tokens", "cached_tokens",
        "time_to_first_token_ms", "duration_ms", "started", "worker"
    };

    len = 2;

    for (i = 0; i < 14; i++) {
        len += ngx_strlen(keys[i]) + 4 + NGX_INT64_LEN
               + 6 * sqlite3_column_bytes(stmt, i);
    }

    p = ngx_pnalloc(pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    last = p;
    *last++ = '{';

    for (i = 0; i < 14; i++) {
        last = ngx_sprintf(last, "%s\"%s\":", i ? "," : "", keys[i]);

        type = sqlite3_column_type(stmt, i);

        if (type == SQLITE_NULL) {
            last = ngx_cpymem(last, "null", 4);
            continue;
        }

        if (type == SQLITE_INTEGER) {
            last = ngx_sprintf(last, "%L", sqlite3_column_int64(stmt, i));
            continue;
        }

        text = sqlite3_column_text(stmt, i);

        if (text == NULL) {
            return NGX_ERROR;
        }

        if (i == 6) {
            last = ngx_cpymem(last, text, sqlite3_column_bytes(stmt, i));
            continue;
        }

        *last++ = '"';
        last = (u_char *) ngx_escape_json(last, (u_char *) text,
                                          sqlite3_column_bytes(stmt, i));
        *last++ = '"';
    }

    *last++ = '}';

    return ngx_http_agent_bytes_append(pool, b, p, last - p);
}
