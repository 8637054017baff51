
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
static void ngx_http_agent_sqlite_close(void);


ngx_http_agent_store_t  ngx_http_agent_store_sqlite = {
    ngx_string("sqlite"),
    ngx_http_agent_sqlite_open,
    ngx_http_agent_sqlite_write,
    ngx_http_agent_sqlite_read,
    ngx_http_agent_sqlite_sweep,
    ngx_http_agent_sqlite_enqueue,
    ngx_http_agent_sqlite_checkpoint,
    ngx_http_agent_sqlite_takeover,
    ngx_http_agent_sqlite_list,
    ngx_http_agent_sqlite_audit_page,
    ngx_http_agent_sqlite_close,
    ngx_http_agent_sqlite_init_process,
    NULL,
    NULL,
    NULL,
    NULL
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
#define NGX_HTTP_AGENT_SQLITE_TAKE      12
#define NGX_HTTP_AGENT_SQLITE_W_N       13

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

    NGX_HTTP_AGENT_SQLITE_STATED("?1", "?2"),

    NGX_HTTP_AGENT_SQLITE_TAKEN("?1", "?2")
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

            if (!ngx_http_agent_event_outside(ev[i].type)) {
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
        stmt = stmts[NGX_HTTP_AGENT_SQLITE_TAKE];

        sqlite3_bind_text(stmt, 1, (char *) ev->conv.data, ev->conv.len,
                          SQLITE_STATIC);
        sqlite3_bind_text(stmt, 2, (char *) ev->data.data, ev->data.len,
                          SQLITE_STATIC);

        if (ngx_http_agent_sqlite_step(stmt) != NGX_OK) {
            return NGX_ERROR;
        }

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


static void
ngx_http_agent_sqlite_close(void)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_AGENT_AUDIT_STMTS; i++) {
        sqlite3_finalize(ngx_http_agent_sqlite_audit_stmts[i]);
        ngx_http_agent_sqlite_audit_stmts[i] = NULL;
    }

    ngx_http_agent_sqlite_close_prepared(&ngx_http_agent_sqlite_db,
                                         ngx_http_agent_sqlite_stmts,
                                         NGX_HTTP_AGENT_SQLITE_W_N);
    ngx_http_agent_sqlite_close_prepared(&ngx_http_agent_sqlite_checkpoint_db,
                                         NULL, 0);

    ngx_http_agent_sqlite_readers_close();
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
