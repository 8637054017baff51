
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
#include "ngx_http_agent_store_sqlite.h"
#include "ngx_http_agent_store_sqlite_read.h"


/*
 * The store's reads of SQLite: a conversation and its events, the sweep
 * of the conversations that need a worker, a queued message written.
 */

static ngx_int_t ngx_http_agent_sqlite_text(ngx_pool_t *pool,
    sqlite3_stmt *stmt, int col, ngx_str_t *s);
static ngx_int_t ngx_http_agent_sqlite_summary(sqlite3_stmt *stmt,
    ngx_http_agent_store_read_t *rd);
static ngx_int_t ngx_http_agent_sqlite_taken(sqlite3 *db,
    ngx_http_agent_store_read_t *rd);


/*
 * Reads run on pool threads beside a flush, each with a connection of
 * its own.  A connection and its statements are kept for the next read
 * (opening one parses the whole schema, triggers included, which cost
 * more than the read): up to NGX_HTTP_AGENT_SQLITE_READERS of them, taken
 * and given back under a mutex.
 */

#define NGX_HTTP_AGENT_SQLITE_READERS  4

#define NGX_HTTP_AGENT_SQLITE_R_BEGIN     0
#define NGX_HTTP_AGENT_SQLITE_R_CONV      1
#define NGX_HTTP_AGENT_SQLITE_R_TAIL      2
#define NGX_HTTP_AGENT_SQLITE_R_RANGE     3
#define NGX_HTTP_AGENT_SQLITE_R_SUMMARY   4
#define NGX_HTTP_AGENT_SQLITE_R_SOURCES   5
#define NGX_HTTP_AGENT_SQLITE_R_QUEUED    6
#define NGX_HTTP_AGENT_SQLITE_R_COMMIT    7
#define NGX_HTTP_AGENT_SQLITE_R_ROLLBACK  8
#define NGX_HTTP_AGENT_SQLITE_R_N         9


typedef struct {
    sqlite3                      *db;
    sqlite3_stmt                 *stmts[NGX_HTTP_AGENT_SQLITE_R_N];
} ngx_http_agent_sqlite_reader_t;


static char  *ngx_http_agent_sqlite_read_sql[] = {
    "BEGIN",
    "SELECT agent, last_seq, owner, queue_id FROM conversations"
    " WHERE id = ?",
    "SELECT seq, type, data FROM events WHERE conversation = ?1"
    " AND seq >= coalesce((SELECT max(seq) FROM events"
    " WHERE conversation = ?1 AND type = 'user_msg'), 1)"
    " ORDER BY seq",
    "SELECT seq, type, data FROM events WHERE conversation = ?1"
    " AND seq > ?2 AND (?3 = 0 OR seq <= ?3) ORDER BY seq",
    "SELECT json_extract(data, '$.to_seq') FROM events"
    " WHERE conversation = ?1 AND type = 'summary'"
    " ORDER BY seq DESC LIMIT 1",
    "SELECT seq, json_extract(data, '$.turn'),"
    " json_extract(data, '$.source_id') FROM events"
    " WHERE conversation = ? AND type = 'user_msg'"
    " ORDER BY seq DESC LIMIT 16",
    "SELECT id, data FROM queued WHERE conversation = ?"
    " ORDER BY front DESC, CASE front WHEN 1 THEN -id ELSE id END",
    "COMMIT",
    "ROLLBACK"
};


static ngx_http_agent_sqlite_reader_t
    ngx_http_agent_sqlite_readers[NGX_HTTP_AGENT_SQLITE_READERS];
static ngx_uint_t       ngx_http_agent_sqlite_nreaders;
static pthread_mutex_t  ngx_http_agent_sqlite_readers_mutex =
    PTHREAD_MUTEX_INITIALIZER;


static ngx_int_t ngx_http_agent_sqlite_reader_get(ngx_str_t *path,
    ngx_log_t *log, ngx_http_agent_sqlite_reader_t *rdr);
static void ngx_http_agent_sqlite_reader_put(
    ngx_http_agent_sqlite_reader_t *rdr);
static ngx_int_t ngx_http_agent_sqlite_read_events(sqlite3_stmt *stmt,
    ngx_str_t *path, ngx_http_agent_store_read_t *rd, ngx_pool_t *pool,
    ngx_log_t *log);


/*
 * The conversation's row and its events, in one read transaction: the
 * row and the events agree.  A revival's read (NGX_HTTP_AGENT_STORE_TAIL)
 * takes the source ids of the last messages and the queued messages too.
 */

ngx_int_t
ngx_http_agent_sqlite_read(ngx_str_t *path, ngx_http_agent_store_read_t *rd,
    ngx_pool_t *pool, ngx_log_t *log)
{
    int                              rc;
    sqlite3                         *db;
    ngx_uint_t                       i, end;
    sqlite3_stmt                    *stmt, **stmts;
    ngx_http_agent_store_queued_t   *q;
    ngx_http_agent_store_source_t   *src;
    ngx_http_agent_sqlite_reader_t   rdr;

    rd->events = ngx_array_create(pool, 16,
                                  sizeof(ngx_http_agent_store_event_t));
    rd->sources = ngx_array_create(pool, 4,
                                   sizeof(ngx_http_agent_store_source_t));
    rd->queued = ngx_array_create(pool, 1,
                                  sizeof(ngx_http_agent_store_queued_t));
    if (rd->events == NULL || rd->sources == NULL || rd->queued == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_sqlite_reader_get(path, log, &rdr) != NGX_OK) {
        return NGX_ERROR;
    }

    db = rdr.db;
    stmts = rdr.stmts;

    if (sqlite3_step(stmts[NGX_HTTP_AGENT_SQLITE_R_BEGIN]) != SQLITE_DONE) {
        goto failed;
    }

    stmt = stmts[NGX_HTTP_AGENT_SQLITE_R_CONV];

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);

    rc = sqlite3_step(stmt);

    if (rc == SQLITE_DONE) {
        rd->last_seq = 0;
        goto done;
    }

    if (rc != SQLITE_ROW
        || ngx_http_agent_sqlite_text(pool, stmt, 0, &rd->agent) != NGX_OK
        || ngx_http_agent_sqlite_text(pool, stmt, 2, &rd->owner) != NGX_OK)
    {
        goto failed;
    }

    rd->last_seq = sqlite3_column_int64(stmt, 1);
    rd->queue_id = sqlite3_column_int64(stmt, 3);

    if (rd->after == NGX_HTTP_AGENT_STORE_TAIL) {
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_R_TAIL];

    } else {
        if (rd->after == NGX_HTTP_AGENT_STORE_SUMMARY
            && ngx_http_agent_sqlite_summary(
                   stmts[NGX_HTTP_AGENT_SQLITE_R_SUMMARY], rd)
               != NGX_OK)
        {
            goto failed;
        }

        stmt = stmts[NGX_HTTP_AGENT_SQLITE_R_RANGE];

        sqlite3_bind_int64(stmt, 2, rd->after);
        sqlite3_bind_int64(stmt, 3, rd->upto);
    }

    if (ngx_http_agent_sqlite_read_events(stmt, path, rd, pool, log)
        != NGX_OK)
    {
        goto failed;
    }

    /* a range is a model call's context or a client's: the log alone */

    if (rd->after != NGX_HTTP_AGENT_STORE_TAIL) {
        goto done;
    }

    stmt = stmts[NGX_HTTP_AGENT_SQLITE_R_SOURCES];

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);

    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        if (sqlite3_column_type(stmt, 2) != SQLITE_TEXT) {
            continue;
        }

        src = ngx_array_push(rd->sources);
        if (src == NULL
            || ngx_http_agent_sqlite_text(pool, stmt, 2, &src->source_id)
               != NGX_OK)
        {
            goto failed;
        }

        src->seq = sqlite3_column_int64(stmt, 0);
        src->turn = sqlite3_column_int64(stmt, 1);
    }

    if (rc != SQLITE_DONE) {
        goto failed;
    }

    /* messages waiting for their turn, in the order they will run */

    stmt = stmts[NGX_HTTP_AGENT_SQLITE_R_QUEUED];

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);

    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        q = ngx_array_push(rd->queued);
        if (q == NULL
            || ngx_http_agent_sqlite_text(pool, stmt, 1, &q->data) != NGX_OK)
        {
            goto failed;
        }

        q->id = sqlite3_column_int64(stmt, 0);
    }

    if (rc != SQLITE_DONE) {
        goto failed;
    }

done:

    end = NGX_HTTP_AGENT_SQLITE_R_COMMIT;
    rc = NGX_OK;

    goto close;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\" cannot read "
                  "\"%V\": %s", path, &rd->id, sqlite3_errmsg(db));

    end = NGX_HTTP_AGENT_SQLITE_R_ROLLBACK;
    rc = NGX_ERROR;

close:

    /* the statements made ready for the connection's next read */

    for (i = 0; i < NGX_HTTP_AGENT_SQLITE_R_COMMIT; i++) {
        sqlite3_reset(stmts[i]);
        sqlite3_clear_bindings(stmts[i]);
    }

    (void) sqlite3_step(stmts[end]);
    sqlite3_reset(stmts[end]);

    ngx_http_agent_sqlite_reader_put(&rdr);

    return rc;
}


static ngx_int_t
ngx_http_agent_sqlite_read_events(sqlite3_stmt *stmt, ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log)
{
    int                            rc;
    ngx_int_t                      type;
    ngx_http_agent_store_event_t  *ev;

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);

    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        ev = ngx_array_push(rd->events);
        if (ev == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(ev, sizeof(ngx_http_agent_store_event_t));

        ev->seq = sqlite3_column_int64(stmt, 0);
        ev->conv = rd->id;
        ev->agent = rd->agent;

        type = ngx_http_agent_log_type((u_char *) sqlite3_column_text(stmt, 1),
                                       sqlite3_column_bytes(stmt, 1));

        if (type == NGX_ERROR
            || ngx_http_agent_sqlite_text(pool, stmt, 2, &ev->data) != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": event "
                          "%uL of \"%V\" cannot be read", path, ev->seq,
                          &rd->id);
            return NGX_ERROR;
        }

        ev->type = type;
    }

    return (rc == SQLITE_DONE) ? NGX_OK : NGX_ERROR;
}


static ngx_int_t
ngx_http_agent_sqlite_reader_get(ngx_str_t *path, ngx_log_t *log,
    ngx_http_agent_sqlite_reader_t *rdr)
{
    ngx_uint_t  found;

    found = 0;

    (void) pthread_mutex_lock(&ngx_http_agent_sqlite_readers_mutex);

    if (ngx_http_agent_sqlite_nreaders) {
        *rdr = ngx_http_agent_sqlite_readers[--ngx_http_agent_sqlite_nreaders];
        found = 1;
    }

    (void) pthread_mutex_unlock(&ngx_http_agent_sqlite_readers_mutex);

    if (found) {
        return NGX_OK;
    }

    rdr->db = ngx_http_agent_sqlite_open_prepared(path, NULL, log,
                                         ngx_http_agent_sqlite_read_sql,
                                         rdr->stmts,
                                         NGX_HTTP_AGENT_SQLITE_R_N);

    return (rdr->db == NULL) ? NGX_ERROR : NGX_OK;
}


static void
ngx_http_agent_sqlite_reader_put(ngx_http_agent_sqlite_reader_t *rdr)
{
    ngx_uint_t  kept;

    kept = 0;

    (void) pthread_mutex_lock(&ngx_http_agent_sqlite_readers_mutex);

    if (ngx_http_agent_sqlite_nreaders < NGX_HTTP_AGENT_SQLITE_READERS) {
        ngx_http_agent_sqlite_readers[ngx_http_agent_sqlite_nreaders++] =
            *rdr;
        kept = 1;
    }

    (void) pthread_mutex_unlock(&ngx_http_agent_sqlite_readers_mutex);

    if (!kept) {
        ngx_http_agent_sqlite_close_prepared(&rdr->db, rdr->stmts,
                                             NGX_HTTP_AGENT_SQLITE_R_N);
    }
}


#define NGX_HTTP_AGENT_SQLITE_SWEEP  64

ngx_int_t
ngx_http_agent_sqlite_sweep(ngx_str_t *path, uint64_t now, ngx_array_t *ids,
    ngx_pool_t *pool, ngx_log_t *log)
{
    int            rc;
    sqlite3       *db;
    ngx_str_t     *id;
    sqlite3_stmt  *stmt;

    db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_ERR);
    if (db == NULL) {
        return NGX_ERROR;
    }

    rc = sqlite3_prepare_v2(db,
             "SELECT conversation FROM (SELECT DISTINCT conversation"
             " FROM tool_calls WHERE status = 'suspended' AND deadline <= ?1"
             " LIMIT ?2)"
             " UNION SELECT id FROM (SELECT id FROM conversations"
             " WHERE state = 'running' LIMIT ?2)"
             " UNION SELECT conversation FROM (SELECT DISTINCT conversation"
             " FROM queued LIMIT ?2)", -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    sqlite3_bind_int64(stmt, 1, now);
    sqlite3_bind_int(stmt, 2, NGX_HTTP_AGENT_SQLITE_SWEEP);

    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        id = ngx_array_push(ids);
        if (id == NULL
            || ngx_http_agent_sqlite_text(pool, stmt, 0, id) != NGX_OK)
        {
            goto failed;
        }
    }

    if (rc != SQLITE_DONE) {
        goto failed;
    }

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\" cannot be "
                  "swept: %s", path, sqlite3_errmsg(db));

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_ERROR;
}


/*
 * A take-over of the turn at seq (rd->after), counted with the
 * conversation: a count taken at an earlier seq is of a turn that got
 * on since, and starts again.  A conversation the store does not hold
 * yet counts 0.
 */

ngx_int_t
ngx_http_agent_sqlite_takeover(ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log)
{
    int            rc;
    sqlite3       *db;
    sqlite3_stmt  *stmt;

    rd->takeovers = 0;

    db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_ERR);
    if (db == NULL) {
        return NGX_ERROR;
    }

    rc = sqlite3_prepare_v2(db,
             "UPDATE conversations SET takeovers = CASE"
             " WHEN takeover_seq >= ?2 THEN takeovers + 1 ELSE 1 END,"
             " takeover_seq = max(takeover_seq, ?2)"
             " WHERE id = ?1 RETURNING takeovers",
             -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, (sqlite3_int64) rd->after);

    rc = sqlite3_step(stmt);

    if (rc == SQLITE_ROW) {
        rd->takeovers = (ngx_uint_t) sqlite3_column_int64(stmt, 0);
        rc = sqlite3_step(stmt);
    }

    if (rc != SQLITE_DONE) {
        goto failed;
    }

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\" cannot count a "
                  "take-over of \"%V\": %s", path, &rd->id,
                  sqlite3_errmsg(db));

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_ERROR;
}


/*
 * A message that waits for its turn, unless its turn has already been
 * written (the user_msg names the queue id): the writer takes it out
 * when its user_msg is written.  A queue id is never given twice in a
 * conversation; should a user_msg with other fields carry it, nothing
 * was written and the message is not acknowledged.
 */

ngx_int_t
ngx_http_agent_sqlite_enqueue(ngx_str_t *path, ngx_http_agent_store_read_t *rd,
    ngx_log_t *log)
{
    int            rc, inserted;
    sqlite3       *db;
    ngx_int_t      taken;
    sqlite3_stmt  *stmt;

    db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_ERR);
    if (db == NULL) {
        return NGX_ERROR;
    }

    rc = sqlite3_prepare_v2(db,
             "INSERT INTO queued (conversation, id, front, data)"
             " SELECT ?1, ?2, ?3, ?4 WHERE NOT EXISTS (SELECT 1 FROM events"
             " WHERE conversation = ?1 AND type = 'user_msg'"
             " AND json_extract(data, '$.queue_id') = ?2)",
             -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        goto failed;
    }

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, rd->queue.id);
    sqlite3_bind_int(stmt, 3, rd->queue.front);
    sqlite3_bind_text(stmt, 4, (char *) rd->queue.data.data,
                      rd->queue.data.len, SQLITE_STATIC);

    rc = sqlite3_step(stmt);

    if (rc != SQLITE_DONE) {
        goto failed;
    }

    inserted = sqlite3_changes(db);

    sqlite3_finalize(stmt);
    stmt = NULL;

    taken = inserted ? NGX_OK : ngx_http_agent_sqlite_taken(db, rd);

    if (taken == NGX_ERROR) {
        goto failed;
    }

    if (taken == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\" cannot queue "
                      "a message: queue id %L of \"%V\" is taken by another "
                      "message", path, rd->queue.id, &rd->id);
        sqlite3_close(db);
        return NGX_ERROR;
    }

    sqlite3_close(db);

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\" cannot queue a "
                  "message of \"%V\": %s", path, &rd->id, sqlite3_errmsg(db));

    sqlite3_finalize(stmt);
    sqlite3_close(db);

    return NGX_ERROR;
}


/*
 * The queued message's own user_msg is in the log (its turn came before
 * the enqueue was written): NGX_OK; another's: NGX_DECLINED.  A user_msg
 * is its header ({"type","seq","turn","ts") and the message's fields,
 * which the queued copy holds as a JSON object: the event ends with its
 * members.
 */

static ngx_int_t
ngx_http_agent_sqlite_taken(sqlite3 *db, ngx_http_agent_store_read_t *rd)
{
    int            rc;
    sqlite3_stmt  *stmt;

    rc = sqlite3_prepare_v2(db,
             "SELECT 1 FROM events WHERE conversation = ?1"
             " AND type = 'user_msg' AND json_extract(data, '$.queue_id') = ?2"
             " AND substr(data, 1 - length(?3)) = substr(?3, 2)",
             -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        return NGX_ERROR;
    }

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, rd->queue.id);
    sqlite3_bind_text(stmt, 3, (char *) rd->queue.data.data,
                      rd->queue.data.len, SQLITE_STATIC);

    rc = sqlite3_step(stmt);

    sqlite3_finalize(stmt);

    switch (rc) {
    case SQLITE_ROW:
        return NGX_OK;
    case SQLITE_DONE:
        return NGX_DECLINED;
    default:
        return NGX_ERROR;
    }
}


/*
 * The start of the context: the events after the range of the newest
 * summary (the summary itself follows that range).  The newest is found
 * from the end of the log, so the read costs what the context holds.
 */

static ngx_int_t
ngx_http_agent_sqlite_summary(sqlite3_stmt *stmt,
    ngx_http_agent_store_read_t *rd)
{
    int            rc;
    sqlite3_int64  to;

    sqlite3_bind_text(stmt, 1, (char *) rd->id.data, rd->id.len,
                      SQLITE_STATIC);

    to = 0;
    rc = sqlite3_step(stmt);

    if (rc == SQLITE_ROW) {
        to = sqlite3_column_int64(stmt, 0);

    } else if (rc != SQLITE_DONE) {
        return NGX_ERROR;
    }

    /* nothing is read if the zone holds the events after the range */

    if (to < 0 || (rd->upto && (uint64_t) to > rd->upto)) {
        to = rd->upto;
    }

    rd->after = to;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_sqlite_text(ngx_pool_t *pool, sqlite3_stmt *stmt, int col,
    ngx_str_t *s)
{
    const u_char  *text;

    text = sqlite3_column_text(stmt, col);

    s->len = sqlite3_column_bytes(stmt, col);
    s->data = ngx_pnalloc(pool, s->len + 1);

    if (s->data == NULL || (text == NULL && s->len)) {
        return NGX_ERROR;
    }

    if (s->len) {
        ngx_memcpy(s->data, text, s->len);
    }

    s->data[s->len] = '\0';

    return NGX_OK;
}


void
ngx_http_agent_sqlite_readers_close(void)
{
    ngx_http_agent_sqlite_reader_t  *rdr;

    while (ngx_http_agent_sqlite_nreaders) {
        rdr = &ngx_http_agent_sqlite_readers[--ngx_http_agent_sqlite_nreaders];
        ngx_http_agent_sqlite_close_prepared(&rdr->db, rdr->stmts,
                                             NGX_HTTP_AGENT_SQLITE_R_N);
    }
}
