
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


/*
 * SQLite in WAL mode: the events table is the canonical log, keyed by
 * conversation and seq, so a batch written twice changes nothing.  The
 * writer keeps the tables derived from it in the same transaction: the
 * tool calls (executor, status, deadline, result), the queued messages
 * taken, and each conversation's persisted state, which the sweep reads
 * after a restart.
 */

static ngx_int_t ngx_http_agent_sqlite_events(sqlite3_stmt **stmts,
    ngx_http_agent_store_event_t *ev, ngx_uint_t *n,
    ngx_http_agent_store_batch_t *cut);
static ngx_int_t ngx_http_agent_sqlite_derive(sqlite3_stmt **stmts,
    ngx_http_agent_store_event_t *ev);
static ngx_int_t ngx_http_agent_sqlite_state(sqlite3_stmt **stmts,
    ngx_http_agent_store_event_t *ev, ngx_uint_t ends);
static ngx_int_t ngx_http_agent_sqlite_write(ngx_str_t *path,
    ngx_http_agent_store_batch_t *b, ngx_log_t *log);
static int ngx_http_agent_sqlite_wal(void *data, sqlite3 *db,
    const char *name, int pages);
static void ngx_http_agent_sqlite_wal_full(sqlite3 *db,
    ngx_http_agent_store_batch_t *b, ngx_str_t *path, ngx_log_t *log);
static ngx_int_t ngx_http_agent_sqlite_checkpoint(ngx_str_t *path,
    ngx_log_t *log);
static ngx_int_t ngx_http_agent_sqlite_passive(sqlite3 *db, int *copied,
    ngx_str_t *path, ngx_log_t *log);
static ngx_int_t ngx_http_agent_sqlite_read(ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
static ngx_int_t ngx_http_agent_sqlite_sweep(ngx_str_t *path, uint64_t now,
    ngx_array_t *ids, ngx_pool_t *pool, ngx_log_t *log);
static ngx_int_t ngx_http_agent_sqlite_enqueue(ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
static void ngx_http_agent_sqlite_close(void);
static ngx_int_t ngx_http_agent_sqlite_text(ngx_pool_t *pool,
    sqlite3_stmt *stmt, int col, ngx_str_t *s);
static ngx_int_t ngx_http_agent_sqlite_summary(sqlite3_stmt *stmt,
    ngx_http_agent_store_read_t *rd);


ngx_http_agent_store_t  ngx_http_agent_store_sqlite = {
    ngx_string("sqlite"),
    ngx_http_agent_sqlite_open,
    ngx_http_agent_sqlite_write,
    ngx_http_agent_sqlite_read,
    ngx_http_agent_sqlite_sweep,
    ngx_http_agent_sqlite_enqueue,
    ngx_http_agent_sqlite_checkpoint,
    ngx_http_agent_sqlite_close,
    ngx_http_agent_sqlite_init_process
};


/* a worker's connection, used by one flush at a time, on pool threads */
static sqlite3  *ngx_http_agent_sqlite_db;

/* and the one of its checkpoint, one at a time, beside the flush */
static sqlite3  *ngx_http_agent_sqlite_checkpoint_db;


/*
 * Its statements, prepared with it, the transaction's own too: none is
 * parsed for every batch
 */

#define NGX_HTTP_AGENT_SQLITE_EVENT     0
#define NGX_HTTP_AGENT_SQLITE_CONV      1
#define NGX_HTTP_AGENT_SQLITE_BEGIN     2
#define NGX_HTTP_AGENT_SQLITE_COMMIT    3
#define NGX_HTTP_AGENT_SQLITE_ROLLBACK  4
#define NGX_HTTP_AGENT_SQLITE_CUT       5
#define NGX_HTTP_AGENT_SQLITE_CALL      6
#define NGX_HTTP_AGENT_SQLITE_SUSPEND   7
#define NGX_HTTP_AGENT_SQLITE_RESOLVE   8
#define NGX_HTTP_AGENT_SQLITE_DONE      9
#define NGX_HTTP_AGENT_SQLITE_DEQUEUE   10
#define NGX_HTTP_AGENT_SQLITE_STATE     11
#define NGX_HTTP_AGENT_SQLITE_W_N       12

static sqlite3_stmt  *ngx_http_agent_sqlite_stmts[NGX_HTTP_AGENT_SQLITE_W_N];

/* and the audit's, for the rows that go with a batch */
static sqlite3_stmt  *ngx_http_agent_sqlite_audit_stmts[
                                                  NGX_HTTP_AGENT_AUDIT_STMTS];

static char  *ngx_http_agent_sqlite_stmts_sql[] = {

    "INSERT OR IGNORE INTO events (conversation, seq, type, data, derived)"
    " VALUES (?, ?, ?, ?, 1)",

    "INSERT INTO conversations (id, agent, owner, last_seq, updated)"
    " VALUES (?, ?, ?, ?, strftime('%s','now'))"
    " ON CONFLICT (id) DO UPDATE SET"
    " last_seq = max(last_seq, excluded.last_seq),"
    " updated = excluded.updated",

    "BEGIN IMMEDIATE",
    "COMMIT",
    "ROLLBACK",

    "UPDATE conversations SET last_seq ="
    " (SELECT max(seq) FROM events WHERE conversation = ?1) WHERE id = ?1",

    /*
     * what an event derives (see ngx_http_agent_sqlite_derive), ?1 its
     * conversation, ?2 its data (a tool_call's seq, its data ?3)
     */

    NGX_HTTP_AGENT_SQLITE_CALLED("?1", "?2", "?3"),
    NGX_HTTP_AGENT_SQLITE_SUSPENDED("?1", "?2"),
    NGX_HTTP_AGENT_SQLITE_RESOLVED("?1", "?2"),
    NGX_HTTP_AGENT_SQLITE_FINISHED("?1", "?2"),
    NGX_HTTP_AGENT_SQLITE_DEQUEUED("?1", "?2"),

    /* ?2: its last event but a summary ended a turn */

    NGX_HTTP_AGENT_SQLITE_STATED("?1", "?2")
};


/*
 * On a pool thread: one transaction for the batch.  A conversation's
 * events come together in a batch, in seq order: its row is written
 * once, before them, with the last of them.  A batch of the backlog ends
 * before any event once an input waits (b->waits), the row of the
 * conversation it ends in set back to the last of its events in the
 * table (one a taken-over batch had written may be past the cut).  The
 * events of the inputs that wait then, or that came while a batch was
 * written whole (an input's own among them), are written last (b->more),
 * in the same commit, which answers them: an input need not wait for
 * the commit under way and then one of its own.  The audit's rows queued
 * meanwhile go last, in the same commit.
 */

static ngx_int_t
ngx_http_agent_sqlite_write(ngx_str_t *path, ngx_http_agent_store_batch_t *b,
    ngx_log_t *log)
{
    sqlite3                       *db;
    ngx_uint_t                     n, cut;
    sqlite3_stmt                 **stmts;
    ngx_http_agent_store_event_t  *more;

    db = ngx_http_agent_sqlite_db;
    stmts = ngx_http_agent_sqlite_stmts;

    if (db == NULL) {
        db = ngx_http_agent_sqlite_open_prepared(path,
                                        ngx_http_agent_vfs_name(), log,
                                        ngx_http_agent_sqlite_stmts_sql,
                                        stmts, NGX_HTTP_AGENT_SQLITE_W_N);
        if (db == NULL) {
            return NGX_ERROR;
        }

        ngx_http_agent_sqlite_db = db;

        /* the writer asks for the checkpoint, see below */
        sqlite3_wal_hook(db, ngx_http_agent_sqlite_wal, NULL);
    }

    n = b->nevents;
    b->nmore = 0;

    cut = (!b->input && b->waits);

    if (ngx_http_agent_sqlite_step(stmts[NGX_HTTP_AGENT_SQLITE_BEGIN])
        != NGX_OK)
    {
        goto failed;
    }

    if (ngx_http_agent_sqlite_events(stmts, b->events, &n, cut ? b : NULL)
        != NGX_OK)
    {
        goto failed;
    }

    if (b->more && (n < b->nevents || b->waits(b->data))) {
        b->nmore = b->more(b->data, n, &more);

        if (b->nmore) {
            b->input = 1;

            if (ngx_http_agent_sqlite_events(stmts, more, &b->nmore, NULL)
                != NGX_OK)
            {
                goto failed;
            }
        }
    }

    /*
     * the audit's statements are made when rows come: a table they cannot
     * be made for costs the rows, never the log
     */

    if (b->nrows) {
        if (ngx_http_agent_sqlite_audit_stmts[0] == NULL
            && ngx_http_agent_sqlite_audit_prepare(db,
                                            ngx_http_agent_sqlite_audit_stmts,
                                            path, log)
               != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "agent store \"%V\" could not write %ui model "
                          "call rows: %s", path, b->nrows,
                          sqlite3_errmsg(db));

        } else {
            ngx_http_agent_sqlite_audit_rows(db,
                                             ngx_http_agent_sqlite_audit_stmts,
                                             b->rows, b->nrows, path, log);
        }
    }

    if (ngx_http_agent_sqlite_step(stmts[NGX_HTTP_AGENT_SQLITE_COMMIT])
        != NGX_OK)
    {
        goto failed;
    }

    b->nevents = n;

    ngx_http_agent_sqlite_wal_full(db, b, path, log);

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": %s", path,
                  sqlite3_errmsg(db));

    (void) ngx_http_agent_sqlite_step(stmts[NGX_HTTP_AGENT_SQLITE_ROLLBACK]);

    return NGX_ERROR;
}


/*
 * The events of a batch, each conversation's row first, its state after
 * its last event; with cut, ends before an event once an input waits,
 * *n then the events written.  An event the table had already (a batch
 * written again after a worker died) derives nothing.
 */

static ngx_int_t
ngx_http_agent_sqlite_events(sqlite3_stmt **stmts,
    ngx_http_agent_store_event_t *ev, ngx_uint_t *n,
    ngx_http_agent_store_batch_t *cut)
{
    sqlite3       *db;
    ngx_uint_t     i, last, ends;
    sqlite3_stmt  *event, *conv;

    event = stmts[NGX_HTTP_AGENT_SQLITE_EVENT];
    conv = stmts[NGX_HTTP_AGENT_SQLITE_CONV];
    db = sqlite3_db_handle(event);

    last = 0;

    /* the state the conversation's events so far leave: none, idle, not */
    ends = 0;

    for (i = 0; i < *n; i++) {

        if (i && cut && cut->waits(cut->data)) {
            *n = i;

            if (i <= last) {
                /* in the middle of a conversation's events */

                if (ends
                    && ngx_http_agent_sqlite_state(stmts, &ev[i - 1], ends)
                       != NGX_OK)
                {
                    return NGX_ERROR;
                }

                conv = stmts[NGX_HTTP_AGENT_SQLITE_CUT];

                sqlite3_bind_text(conv, 1, (char *) ev[i].conv.data,
                                  ev[i].conv.len, SQLITE_STATIC);

                if (ngx_http_agent_sqlite_step(conv) != NGX_OK) {
                    return NGX_ERROR;
                }
            }

            break;
        }

        /* the conversation's row first, its state after its events */

        if (i == 0 || i > last) {

            for (last = i;
                 last + 1 < *n && ev[last + 1].conv.len == ev[i].conv.len
                 && ngx_memcmp(ev[last + 1].conv.data, ev[i].conv.data,
                               ev[i].conv.len) == 0;
                 last++)
            {
                /* void */
            }

            sqlite3_bind_text(conv, 1, (char *) ev[i].conv.data,
                              ev[i].conv.len, SQLITE_STATIC);
            sqlite3_bind_text(conv, 2, (char *) ev[i].agent.data,
                              ev[i].agent.len, SQLITE_STATIC);
            sqlite3_bind_text(conv, 3, (char *) ev[i].owner.data,
                              ev[i].owner.len, SQLITE_STATIC);
            sqlite3_bind_int64(conv, 4, ev[last].seq);

            if (ngx_http_agent_sqlite_step(conv) != NGX_OK) {
                return NGX_ERROR;
            }
        }

        sqlite3_bind_text(event, 1, (char *) ev[i].conv.data, ev[i].conv.len,
                          SQLITE_STATIC);
        sqlite3_bind_int64(event, 2, ev[i].seq);
        sqlite3_bind_text(event, 3,
                          (char *) ngx_http_agent_event_names[ev[i].type].data,
                          ngx_http_agent_event_names[ev[i].type].len,
                          SQLITE_STATIC);
        sqlite3_bind_text(event, 4, (char *) ev[i].data.data, ev[i].data.len,
                          SQLITE_STATIC);

        if (ngx_http_agent_sqlite_step(event) != NGX_OK) {
            return NGX_ERROR;
        }

        if (sqlite3_changes(db)) {
            if (ngx_http_agent_sqlite_derive(stmts, &ev[i]) != NGX_OK) {
                return NGX_ERROR;
            }

            if (ev[i].type != NGX_HTTP_AGENT_EV_SUMMARY) {
                ends = ngx_http_agent_event_terminal(ev[i].type) ? 2 : 1;
            }
        }

        if (i == last && ends) {
            if (ngx_http_agent_sqlite_state(stmts, &ev[i], ends) != NGX_OK) {
                return NGX_ERROR;
            }

            ends = 0;
        }
    }

    return NGX_OK;
}


/* the tool call, or the queued message, an event changes */

static ngx_int_t
ngx_http_agent_sqlite_derive(sqlite3_stmt **stmts,
    ngx_http_agent_store_event_t *ev)
{
    int            data;
    sqlite3_stmt  *stmt;

    data = 2;

    switch (ev->type) {

    case NGX_HTTP_AGENT_EV_TOOL_CALL:
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_CALL];
        sqlite3_bind_int64(stmt, 2, ev->seq);
        data = 3;
        break;

    case NGX_HTTP_AGENT_EV_SUSPENSION:
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_SUSPEND];
        break;

    case NGX_HTTP_AGENT_EV_RESOLUTION:
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_RESOLVE];
        break;

    case NGX_HTTP_AGENT_EV_TOOL_RESULT:
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_DONE];
        break;

    case NGX_HTTP_AGENT_EV_USER_MSG:
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_DEQUEUE];
        break;

    default:
        return NGX_OK;
    }

    sqlite3_bind_text(stmt, 1, (char *) ev->conv.data, ev->conv.len,
                      SQLITE_STATIC);
    sqlite3_bind_text(stmt, data, (char *) ev->data.data, ev->data.len,
                      SQLITE_STATIC);

    return ngx_http_agent_sqlite_step(stmt);
}


/* ends: 2 when the last event but a summary ended a turn, else 1 */

static ngx_int_t
ngx_http_agent_sqlite_state(sqlite3_stmt **stmts,
    ngx_http_agent_store_event_t *ev, ngx_uint_t ends)
{
    sqlite3_stmt  *stmt;

    stmt = stmts[NGX_HTTP_AGENT_SQLITE_STATE];

    sqlite3_bind_text(stmt, 1, (char *) ev->conv.data, ev->conv.len,
                      SQLITE_STATIC);
    sqlite3_bind_int(stmt, 2, ends == 2);

    return ngx_http_agent_sqlite_step(stmt);
}


/*
 * The WAL's checkpoint (its pages copied back into the database, so that
 * the WAL starts again from its beginning) is asked for by the writer
 * once a commit leaves 1,000 pages in the WAL, as SQLite's own would be
 * made.  Made by the writer, it held the next batch and every input that
 * waited for it, some 8 ms under load; it is made in two parts instead.
 * Most of the pages are copied on another thread of the pool, on a
 * connection of its own (ngx_http_agent_store_checkpoint.c), beside the
 * batches.  The WAL starts again only at a write that finds it all
 * copied, which never comes while the writer commits as that copy runs:
 * once the copy is within CHECKPOINT_REST pages of the WAL's end, the
 * writer copies the rest itself after a commit, as before not after an
 * input's batch nor while an input waits, and the next batch starts the
 * WAL again.  Past CHECKPOINT_MAX pages (the pool cannot run the copy,
 * or it cannot keep up) the writer makes it whatever waits.  PASSIVE:
 * it copies what no reader still needs and waits for no one; another
 * connection's checkpoint under way makes it SQLITE_BUSY, and it is
 * asked for again.
 */

#define NGX_HTTP_AGENT_SQLITE_CHECKPOINT       1000
#define NGX_HTTP_AGENT_SQLITE_CHECKPOINT_REST  250
#define NGX_HTTP_AGENT_SQLITE_CHECKPOINT_MAX   8000

/* the pages in the WAL after the writer's last commit */
static int  ngx_http_agent_sqlite_wal_pages;

/*
 * The pages of the WAL the copy beside the writer has copied, and the
 * times this worker saw the WAL start again: a copy counts for the WAL
 * it was made in only.  A worker sees the WAL start again by its own
 * checkpoint, or by a commit that leaves fewer pages than its last did
 * (another worker's).  One that commits nothing while another worker
 * starts the WAL again and fills it past where its own last commit left
 * it misses that: it may take an old copy for a new one, and then
 * copies the whole WAL after a commit, as the writer once always did.
 */
static ngx_atomic_t  ngx_http_agent_sqlite_wal_copied;
static ngx_atomic_t  ngx_http_agent_sqlite_wal_restarts;


static int
ngx_http_agent_sqlite_wal(void *data, sqlite3 *db, const char *name,
    int pages)
{
    if (pages < ngx_http_agent_sqlite_wal_pages) {
        ngx_http_agent_sqlite_wal_copied = 0;
        ngx_http_agent_sqlite_wal_restarts++;
    }

    ngx_http_agent_sqlite_wal_pages = pages;

    return SQLITE_OK;
}


static void
ngx_http_agent_sqlite_wal_full(sqlite3 *db, ngx_http_agent_store_batch_t *b,
    ngx_str_t *path, ngx_log_t *log)
{
    ngx_atomic_uint_t  pages, copied;

    pages = ngx_http_agent_sqlite_wal_pages;
    copied = ngx_http_agent_sqlite_wal_copied;

    if (pages < NGX_HTTP_AGENT_SQLITE_CHECKPOINT) {
        return;
    }

    if (pages < NGX_HTTP_AGENT_SQLITE_CHECKPOINT_MAX
        && (copied > pages
            || pages - copied > NGX_HTTP_AGENT_SQLITE_CHECKPOINT_REST
            || b->input || (b->waits && b->waits(b->data))))
    {
        b->checkpoint = 1;
        return;
    }

    (void) ngx_http_agent_sqlite_passive(db, NULL, path, log);

    ngx_http_agent_sqlite_wal_pages = 0;
    ngx_http_agent_sqlite_wal_copied = 0;
    ngx_http_agent_sqlite_wal_restarts++;
}


static ngx_int_t
ngx_http_agent_sqlite_checkpoint(ngx_str_t *path, ngx_log_t *log)
{
    int                rc, copied;
    sqlite3           *db;
    ngx_atomic_uint_t  restarts;

    db = ngx_http_agent_sqlite_checkpoint_db;

    if (db == NULL) {
        db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_ERR);
        if (db == NULL) {
            return NGX_ERROR;
        }

        /*
         * a connection learns that the file is in WAL mode, and opens
         * the WAL, with its first read: until then it has no WAL to
         * checkpoint, and a checkpoint does nothing
         */

        if (sqlite3_exec(db, "PRAGMA schema_version", NULL, NULL, NULL)
            != SQLITE_OK)
        {
            ngx_log_error(NGX_LOG_WARN, log, 0,
                          "agent store \"%V\": checkpoint: %s", path,
                          sqlite3_errmsg(db));
            sqlite3_close(db);
            return NGX_ERROR;
        }

        ngx_http_agent_sqlite_checkpoint_db = db;
    }

    restarts = ngx_http_agent_sqlite_wal_restarts;
    copied = 0;

    rc = ngx_http_agent_sqlite_passive(db, &copied, path, log);

    if (rc == NGX_OK && copied > 0
        && restarts == ngx_http_agent_sqlite_wal_restarts)
    {
        ngx_http_agent_sqlite_wal_copied = copied;
    }

    return (rc == NGX_ERROR) ? NGX_ERROR : NGX_OK;
}


/*
 * A PASSIVE checkpoint, the pages it copied in *copied unless NULL:
 * NGX_BUSY if another connection's was under way, NGX_ERROR logged
 */

static ngx_int_t
ngx_http_agent_sqlite_passive(sqlite3 *db, int *copied, ngx_str_t *path,
    ngx_log_t *log)
{
    int  rc;

    rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE,
                                   NULL, copied);

    if (rc == SQLITE_OK) {
        return NGX_OK;
    }

    if (rc == SQLITE_BUSY) {
        return NGX_BUSY;
    }

    ngx_log_error(NGX_LOG_WARN, log, 0, "agent store \"%V\": checkpoint: %s",
                  path, sqlite3_errmsg(db));

    return NGX_ERROR;
}


/* a statement that returns no rows run, and made ready again */

ngx_int_t
ngx_http_agent_sqlite_step(sqlite3_stmt *stmt)
{
    int  rc;

    rc = sqlite3_step(stmt);
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);

    return (rc == SQLITE_DONE) ? NGX_OK : NGX_ERROR;
}


/*
 * A connection of a pool thread's with its statements prepared, kept for
 * the worker's life; NULL: an error, logged
 */

sqlite3 *
ngx_http_agent_sqlite_open_prepared(ngx_str_t *path, const char *vfs,
    ngx_log_t *log, char **sql, sqlite3_stmt **stmts, ngx_uint_t n)
{
    sqlite3  *db;

    db = ngx_http_agent_sqlite_connect_vfs(path, vfs, log, NGX_LOG_ERR);
    if (db == NULL) {
        return NULL;
    }

    if (ngx_http_agent_sqlite_prepare(db, sql, stmts, n, path, log)
        != NGX_OK)
    {
        sqlite3_close(db);
        return NULL;
    }

    return db;
}


/* statements kept for a connection's life; none on an error, logged */

ngx_int_t
ngx_http_agent_sqlite_prepare(sqlite3 *db, char **sql, sqlite3_stmt **stmts,
    ngx_uint_t n, ngx_str_t *path, ngx_log_t *log)
{
    ngx_uint_t  i;

    for (i = 0; i < n; i++) {
        if (sqlite3_prepare_v3(db, sql[i], -1, SQLITE_PREPARE_PERSISTENT,
                               &stmts[i], NULL)
            != SQLITE_OK)
        {
            ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%V\": %s",
                          path, sqlite3_errmsg(db));

            while (i--) {
                sqlite3_finalize(stmts[i]);
                stmts[i] = NULL;
            }

            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


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
    "SELECT agent, last_seq, owner FROM conversations WHERE id = ?",
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

static ngx_int_t
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

static ngx_int_t
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
 * A message that waits for its turn, unless its turn has already been
 * written (the user_msg names the queue id): the writer takes it out
 * when its user_msg is written.
 */

static ngx_int_t
ngx_http_agent_sqlite_enqueue(ngx_str_t *path, ngx_http_agent_store_read_t *rd,
    ngx_log_t *log)
{
    int            rc;
    sqlite3       *db;
    sqlite3_stmt  *stmt;

    db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_ERR);
    if (db == NULL) {
        return NGX_ERROR;
    }

    rc = sqlite3_prepare_v2(db,
             "INSERT OR REPLACE INTO queued (conversation, id, front, data)"
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

    sqlite3_finalize(stmt);
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


static void
ngx_http_agent_sqlite_close(void)
{
    ngx_uint_t                       i;
    ngx_http_agent_sqlite_reader_t  *rdr;

    for (i = 0; i < NGX_HTTP_AGENT_AUDIT_STMTS; i++) {
        sqlite3_finalize(ngx_http_agent_sqlite_audit_stmts[i]);
        ngx_http_agent_sqlite_audit_stmts[i] = NULL;
    }

    ngx_http_agent_sqlite_close_prepared(&ngx_http_agent_sqlite_db,
                                         ngx_http_agent_sqlite_stmts,
                                         NGX_HTTP_AGENT_SQLITE_W_N);
    ngx_http_agent_sqlite_close_prepared(&ngx_http_agent_sqlite_checkpoint_db,
                                         NULL, 0);

    while (ngx_http_agent_sqlite_nreaders) {
        rdr = &ngx_http_agent_sqlite_readers[--ngx_http_agent_sqlite_nreaders];
        ngx_http_agent_sqlite_close_prepared(&rdr->db, rdr->stmts,
                                             NGX_HTTP_AGENT_SQLITE_R_N);
    }
}


/* a connection of ngx_http_agent_sqlite_open_prepared(), closed */

void
ngx_http_agent_sqlite_close_prepared(sqlite3 **db, sqlite3_stmt **stmts,
    ngx_uint_t n)
{
    ngx_uint_t  i;

    if (*db == NULL) {
        return;
    }

    for (i = 0; i < n; i++) {
        sqlite3_finalize(stmts[i]);
        stmts[i] = NULL;
    }

    sqlite3_close(*db);
    *db = NULL;
}
