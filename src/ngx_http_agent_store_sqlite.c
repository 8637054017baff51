
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


/*
 * SQLite in WAL mode: the events table is the canonical log, keyed by
 * conversation and seq, so a batch written twice changes nothing.
 */

#define NGX_HTTP_AGENT_SQLITE_VERSION  "1"


static ngx_int_t ngx_http_agent_sqlite_open(ngx_str_t *path, ngx_log_t *log);
static ngx_int_t ngx_http_agent_sqlite_write(ngx_str_t *path,
    ngx_http_agent_store_event_t *ev, ngx_uint_t n, ngx_log_t *log);
static void ngx_http_agent_sqlite_close(void);
static sqlite3 *ngx_http_agent_sqlite_connect(ngx_str_t *path,
    ngx_log_t *log);


ngx_http_agent_store_t  ngx_http_agent_store_sqlite = {
    ngx_string("sqlite"),
    ngx_http_agent_sqlite_open,
    ngx_http_agent_sqlite_write,
    ngx_http_agent_sqlite_close
};


/* a worker's connection, used by one flush at a time, on pool threads */
static sqlite3  *ngx_http_agent_sqlite_db;


static char  ngx_http_agent_sqlite_schema[] =
    "PRAGMA journal_mode=WAL;"
    "CREATE TABLE IF NOT EXISTS meta ("
    "  key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT OR IGNORE INTO meta VALUES ('schema_version', "
    "  '" NGX_HTTP_AGENT_SQLITE_VERSION "');"
    "CREATE TABLE IF NOT EXISTS conversations ("
    "  id TEXT PRIMARY KEY, agent TEXT NOT NULL,"
    "  last_seq INTEGER NOT NULL, updated INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS events ("
    "  conversation TEXT NOT NULL, seq INTEGER NOT NULL,"
    "  type TEXT NOT NULL, data TEXT NOT NULL,"
    "  PRIMARY KEY (conversation, seq)) WITHOUT ROWID;";


static ngx_int_t
ngx_http_agent_sqlite_open(ngx_str_t *path, ngx_log_t *log)
{
    int       rc;
    char     *err;
    sqlite3  *db;

    db = ngx_http_agent_sqlite_connect(path, log);
    if (db == NULL) {
        return NGX_ERROR;
    }

    err = NULL;
    rc = sqlite3_exec(db, ngx_http_agent_sqlite_schema, NULL, NULL, &err);

    if (rc != SQLITE_OK) {
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "agent store \"%V\": %s", path,
                      err ? err : sqlite3_errstr(rc));
        sqlite3_free(err);
        sqlite3_close(db);
        return NGX_ERROR;
    }

    sqlite3_close(db);

    return NGX_OK;
}


static sqlite3 *
ngx_http_agent_sqlite_connect(ngx_str_t *path, ngx_log_t *log)
{
    int       rc;
    sqlite3  *db;

    rc = sqlite3_open_v2((char *) path->data, &db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
                         | SQLITE_OPEN_NOMUTEX, NULL);

    if (rc != SQLITE_OK) {
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "agent store \"%V\" cannot be opened: %s", path,
                      db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return NULL;
    }

    /* workers write side by side: a short wait instead of SQLITE_BUSY */
    sqlite3_busy_timeout(db, 5000);

    return db;
}


/* on a pool thread: one transaction for the batch */

static ngx_int_t
ngx_http_agent_sqlite_write(ngx_str_t *path, ngx_http_agent_store_event_t *ev,
    ngx_uint_t n, ngx_log_t *log)
{
    int            rc;
    ngx_uint_t     i;
    sqlite3_stmt  *event, *conv;

    if (ngx_http_agent_sqlite_db == NULL) {
        ngx_http_agent_sqlite_db = ngx_http_agent_sqlite_connect(path, log);

        if (ngx_http_agent_sqlite_db == NULL) {
            return NGX_ERROR;
        }
    }

    event = NULL;
    conv = NULL;

    rc = sqlite3_exec(ngx_http_agent_sqlite_db, "BEGIN IMMEDIATE", NULL, NULL,
                      NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    rc = sqlite3_prepare_v2(ngx_http_agent_sqlite_db,
                            "INSERT OR IGNORE INTO events"
                            " (conversation, seq, type, data)"
                            " VALUES (?, ?, ?, ?)", -1, &event, NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    rc = sqlite3_prepare_v2(ngx_http_agent_sqlite_db,
                            "INSERT INTO conversations"
                            " (id, agent, last_seq, updated)"
                            " VALUES (?, ?, ?, strftime('%s','now'))"
                            " ON CONFLICT (id) DO UPDATE SET"
                            " last_seq = max(last_seq, excluded.last_seq),"
                            " updated = excluded.updated", -1, &conv, NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    for (i = 0; i < n; i++) {
        sqlite3_bind_text(event, 1, (char *) ev[i].conv.data, ev[i].conv.len,
                          SQLITE_STATIC);
        sqlite3_bind_int64(event, 2, ev[i].seq);
        sqlite3_bind_text(event, 3,
                          (char *) ngx_http_agent_event_names[ev[i].type].data,
                          ngx_http_agent_event_names[ev[i].type].len,
                          SQLITE_STATIC);
        sqlite3_bind_text(event, 4, (char *) ev[i].data.data, ev[i].data.len,
                          SQLITE_STATIC);

        rc = sqlite3_step(event);
        sqlite3_reset(event);

        if (rc != SQLITE_DONE) {
            goto failed;
        }

        sqlite3_bind_text(conv, 1, (char *) ev[i].conv.data, ev[i].conv.len,
                          SQLITE_STATIC);
        sqlite3_bind_text(conv, 2, (char *) ev[i].agent.data,
                          ev[i].agent.len, SQLITE_STATIC);
        sqlite3_bind_int64(conv, 3, ev[i].seq);

        rc = sqlite3_step(conv);
        sqlite3_reset(conv);

        if (rc != SQLITE_DONE) {
            goto failed;
        }
    }

    sqlite3_finalize(event);
    sqlite3_finalize(conv);

    rc = sqlite3_exec(ngx_http_agent_sqlite_db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        (void) sqlite3_exec(ngx_http_agent_sqlite_db, "ROLLBACK", NULL, NULL,
                            NULL);
        return NGX_ERROR;
    }

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": %s", path,
                  sqlite3_errmsg(ngx_http_agent_sqlite_db));

    sqlite3_finalize(event);
    sqlite3_finalize(conv);
    (void) sqlite3_exec(ngx_http_agent_sqlite_db, "ROLLBACK", NULL, NULL,
                        NULL);

    return NGX_ERROR;
}


static void
ngx_http_agent_sqlite_close(void)
{
    if (ngx_http_agent_sqlite_db) {
        sqlite3_close(ngx_http_agent_sqlite_db);
        ngx_http_agent_sqlite_db = NULL;
    }
}
