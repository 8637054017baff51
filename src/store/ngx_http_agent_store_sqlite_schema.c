
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <sqlite3.h>

#include "ngx_http_agent_store_sqlite.h"


/*
 * The store's file: its schema, made or migrated when the master loads
 * the configuration, and the workers' connections to it.
 */

#define NGX_HTTP_AGENT_SQLITE_VERSION  11

#define ngx_http_agent_sqlite_str(n)   ngx_http_agent_sqlite_str_(n)
#define ngx_http_agent_sqlite_str_(n)  #n


static ngx_int_t ngx_http_agent_sqlite_version(sqlite3 *db);
static int ngx_http_agent_sqlite_busy(void *data, int count);


#define NGX_HTTP_AGENT_SQLITE_TABLES                                         \
    "CREATE TABLE conversations ("                                           \
    "  id TEXT PRIMARY KEY, agent TEXT NOT NULL,"                            \
    "  last_seq INTEGER NOT NULL, updated INTEGER NOT NULL,"                 \
    "  state TEXT NOT NULL DEFAULT 'idle',"                                  \
    "  owner TEXT NOT NULL DEFAULT '',"                                      \
    "  queue_id INTEGER NOT NULL DEFAULT 0,"                                 \
    "  takeovers INTEGER NOT NULL DEFAULT 0,"                                \
    "  takeover_seq INTEGER NOT NULL DEFAULT 0);"                            \
    "CREATE TABLE events ("                                                  \
    "  conversation TEXT NOT NULL, seq INTEGER NOT NULL,"                    \
    "  type TEXT NOT NULL, data TEXT NOT NULL,"                              \
    "  derived INTEGER NOT NULL DEFAULT 0,"                                  \
    "  PRIMARY KEY (conversation, seq)) WITHOUT ROWID;"


/*
 * status: called (no result yet), suspended (waiting for outside input
 * until deadline, ms), resolved (input given, result to come), done
 */

#define NGX_HTTP_AGENT_SQLITE_DERIVED                                        \
    "CREATE TABLE tool_calls ("                                              \
    "  conversation TEXT NOT NULL, id TEXT NOT NULL,"                        \
    "  name TEXT NOT NULL, seq INTEGER NOT NULL, executor TEXT,"             \
    "  kind TEXT, status TEXT NOT NULL, deadline INTEGER,"                   \
    "  ok INTEGER, result TEXT,"                                             \
    "  PRIMARY KEY (conversation, id)) WITHOUT ROWID;"                       \
    "CREATE INDEX tool_calls_due ON tool_calls (deadline)"                   \
    "  WHERE status = 'suspended';"                                          \
    "CREATE TABLE queued ("                                                  \
    "  conversation TEXT NOT NULL, id INTEGER NOT NULL,"                     \
    "  front INTEGER NOT NULL, data TEXT NOT NULL,"                          \
    "  PRIMARY KEY (conversation, id)) WITHOUT ROWID;"                       \
    "CREATE INDEX conversations_state ON conversations (state)"              \
    "  WHERE state = 'running';"


/*
 * Up to version 7 a trigger on events derived those tables; since
 * version 8 the writer does, with statements of its own for the events
 * that change them (ngx_http_agent_store_sqlite.c): the trigger ran its
 * six statements for every event, most of them to do nothing, which
 * cost more than the event's own write.  Since version 9 the writer
 * marks its events derived, and the trigger derives the others only:
 * those of a writer that knows no such column, the workers of an older
 * module still running beside a binary upgrade's new ones (for one of
 * this module's events it costs SQLite a frame, not six statements).
 * Version 1's log is replayed through the trigger.  A turn's end is
 * tested type by type: "new.type IN (list)" builds a temporary b-tree
 * of the list each time the trigger runs.
 */

#define NGX_HTTP_AGENT_SQLITE_TRIGGER                                        \
    "CREATE TRIGGER events_derive AFTER INSERT ON events BEGIN "             \
    NGX_HTTP_AGENT_SQLITE_DERIVE "END;"

#define NGX_HTTP_AGENT_SQLITE_TRIGGER_OTHERS                                 \
    "CREATE TRIGGER events_derive AFTER INSERT ON events"                    \
    "  WHEN new.derived = 0 BEGIN "                                          \
    NGX_HTTP_AGENT_SQLITE_DERIVE                                             \
    NGX_HTTP_AGENT_SQLITE_TAKEN("new.conversation", "new.data")              \
    " AND new.type = 'user_msg'; END;"

#define NGX_HTTP_AGENT_SQLITE_DERIVE                                         \
    NGX_HTTP_AGENT_SQLITE_CALLED("new.conversation", "new.seq", "new.data")  \
    " WHERE new.type = 'tool_call';"                                         \
    NGX_HTTP_AGENT_SQLITE_SUSPENDED("new.conversation", "new.data")          \
    " AND new.type = 'suspension';"                                          \
    NGX_HTTP_AGENT_SQLITE_RESOLVED("new.conversation", "new.data")           \
    " AND new.type = 'resolution';"                                          \
    NGX_HTTP_AGENT_SQLITE_FINISHED("new.conversation", "new.data")           \
    " AND new.type = 'tool_result';"                                         \
    NGX_HTTP_AGENT_SQLITE_DEQUEUED("new.conversation", "new.data")           \
    " AND new.type = 'user_msg';"                                            \
    NGX_HTTP_AGENT_SQLITE_STATED("new.conversation",                         \
                                 NGX_HTTP_AGENT_SQLITE_ENDS)                 \
    " AND new.type <> 'summary'; "

/* a turn's end, type by type */

#define NGX_HTTP_AGENT_SQLITE_ENDS                                           \
    "(new.type = 'turn_completed' OR new.type = 'turn_failed'"               \
    " OR new.type = 'cancelled' OR new.type = 'turn_halted')"


/*
 * The audit of model calls: a row per call, numbered in its conversation
 * by the store (see ngx_http_agent_store_sqlite_audit.c)
 */

#define NGX_HTTP_AGENT_SQLITE_AUDIT                                          \
    "CREATE TABLE model_calls ("                                             \
    "  conversation TEXT NOT NULL, call INTEGER NOT NULL,"                   \
    "  turn INTEGER NOT NULL, attempt INTEGER NOT NULL,"                     \
    "  adapter TEXT NOT NULL, model TEXT NOT NULL,"                          \
    "  status TEXT NOT NULL, error TEXT,"                                    \
    "  input_tokens INTEGER, output_tokens INTEGER, cached_tokens INTEGER,"  \
    "  time_to_first_token_ms INTEGER, duration_ms INTEGER,"                 \
    "  started INTEGER NOT NULL, worker INTEGER NOT NULL,"                   \
    "  PRIMARY KEY (conversation, call)) WITHOUT ROWID;"                     \
    "CREATE INDEX model_calls_start ON model_calls"                          \
    "  (conversation, started, worker);"                                     \
    NGX_HTTP_AGENT_SQLITE_AUDIT_RUNNING


/* the calls still running: a start looks for them, never through all */

#define NGX_HTTP_AGENT_SQLITE_AUDIT_RUNNING                                  \
    "CREATE INDEX IF NOT EXISTS model_calls_running ON model_calls"          \
    "  (conversation, started, worker) WHERE status = 'running';"


static char  ngx_http_agent_sqlite_create[] =
    "BEGIN IMMEDIATE;"
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT INTO meta VALUES ('schema_version', '"
        ngx_http_agent_sqlite_str(NGX_HTTP_AGENT_SQLITE_VERSION) "');"
    NGX_HTTP_AGENT_SQLITE_TABLES
    NGX_HTTP_AGENT_SQLITE_DERIVED
    NGX_HTTP_AGENT_SQLITE_TRIGGER_OTHERS
    NGX_HTTP_AGENT_SQLITE_AUDIT
    "COMMIT;";


/* version 1 had no derived tables: the log is replayed through the trigger */

static char  ngx_http_agent_sqlite_migrate_1[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE conversations ADD COLUMN state TEXT NOT NULL"
    "  DEFAULT 'idle';"
    "ALTER TABLE events RENAME TO events_v1;"
    "CREATE TABLE events ("
    "  conversation TEXT NOT NULL, seq INTEGER NOT NULL,"
    "  type TEXT NOT NULL, data TEXT NOT NULL,"
    "  PRIMARY KEY (conversation, seq)) WITHOUT ROWID;"
    NGX_HTTP_AGENT_SQLITE_DERIVED
    NGX_HTTP_AGENT_SQLITE_TRIGGER
    "INSERT INTO events SELECT conversation, seq, type, data FROM events_v1"
    "  ORDER BY conversation, seq;"
    "DROP TABLE events_v1;"
    "UPDATE meta SET value = '2' WHERE key = 'schema_version';"
    "COMMIT;";


/* version 2 had no owners: conversations made before belong to no one */

static char  ngx_http_agent_sqlite_migrate_2[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE conversations ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
    "UPDATE meta SET value = '3' WHERE key = 'schema_version';"
    "COMMIT;";


/* version 3 had no audit of model calls: an empty one */

static char  ngx_http_agent_sqlite_migrate_3[] =
    "BEGIN IMMEDIATE;"
    NGX_HTTP_AGENT_SQLITE_AUDIT
    "UPDATE meta SET value = '4' WHERE key = 'schema_version';"
    "COMMIT;";


/*
 * version 4 did not know turn_halted ends a turn, and counted a summary
 * as a turn running: the trigger is new; and it had no index of the
 * model calls running
 */

static char  ngx_http_agent_sqlite_migrate_4[] =
    "BEGIN IMMEDIATE;"
    "DROP TRIGGER events_derive;"
    NGX_HTTP_AGENT_SQLITE_TRIGGER
    NGX_HTTP_AGENT_SQLITE_AUDIT_RUNNING
    "UPDATE meta SET value = '5' WHERE key = 'schema_version';"
    "COMMIT;";


/* version 5's trigger wrote its conversation's row for every event */

static char  ngx_http_agent_sqlite_migrate_5[] =
    "BEGIN IMMEDIATE;"
    "DROP TRIGGER events_derive;"
    NGX_HTTP_AGENT_SQLITE_TRIGGER
    "UPDATE meta SET value = '6' WHERE key = 'schema_version';"
    "COMMIT;";


/* version 6's trigger tested a turn's end against a list */

static char  ngx_http_agent_sqlite_migrate_6[] =
    "BEGIN IMMEDIATE;"
    "DROP TRIGGER events_derive;"
    NGX_HTTP_AGENT_SQLITE_TRIGGER
    "UPDATE meta SET value = '7' WHERE key = 'schema_version';"
    "COMMIT;";


/* version 7's trigger derived the tables: the writer does */

static char  ngx_http_agent_sqlite_migrate_7[] =
    "BEGIN IMMEDIATE;"
    "DROP TRIGGER events_derive;"
    "UPDATE meta SET value = '8' WHERE key = 'schema_version';"
    "COMMIT;";


/*
 * version 8 had no trigger: an older module's workers still writing
 * beside a binary upgrade's derived nothing
 */

static char  ngx_http_agent_sqlite_migrate_8[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE events ADD COLUMN derived INTEGER NOT NULL DEFAULT 0;"
    NGX_HTTP_AGENT_SQLITE_TRIGGER_OTHERS
    "UPDATE meta SET value = '9' WHERE key = 'schema_version';"
    "COMMIT;";


/*
 * version 9 kept no count of a conversation's queue ids: the highest its
 * user_msgs carry, and the trigger keeps it for an older module's writes
 */

static char  ngx_http_agent_sqlite_migrate_9[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE conversations ADD COLUMN queue_id INTEGER NOT NULL"
    "  DEFAULT 0;"
    "UPDATE conversations SET queue_id = coalesce((SELECT"
    "  max(json_extract(data, '$.queue_id')) FROM events"
    "  WHERE conversation = conversations.id AND type = 'user_msg'), 0);"
    "DROP TRIGGER events_derive;"
    NGX_HTTP_AGENT_SQLITE_TRIGGER_OTHERS
    "UPDATE meta SET value = '10' WHERE key = 'schema_version';"
    "COMMIT;";


/*
 * version 10 kept no count of the times a turn was taken over: a turn
 * that killed its workers was taken over without bound across restarts
 */

static char  ngx_http_agent_sqlite_migrate_10[] =
    "BEGIN IMMEDIATE;"
    "ALTER TABLE conversations ADD COLUMN takeovers INTEGER NOT NULL"
    "  DEFAULT 0;"
    "ALTER TABLE conversations ADD COLUMN takeover_seq INTEGER NOT NULL"
    "  DEFAULT 0;"
    "UPDATE meta SET value = '11' WHERE key = 'schema_version';"
    "COMMIT;";


static char  *ngx_http_agent_sqlite_migrate[] = {
    ngx_http_agent_sqlite_migrate_1,
    ngx_http_agent_sqlite_migrate_2,
    ngx_http_agent_sqlite_migrate_3,
    ngx_http_agent_sqlite_migrate_4,
    ngx_http_agent_sqlite_migrate_5,
    ngx_http_agent_sqlite_migrate_6,
    ngx_http_agent_sqlite_migrate_7,
    ngx_http_agent_sqlite_migrate_8,
    ngx_http_agent_sqlite_migrate_9,
    ngx_http_agent_sqlite_migrate_10
};


ngx_int_t
ngx_http_agent_sqlite_open(ngx_str_t *path, ngx_log_t *log)
{
    int         rc;
    char       *err, *sql[NGX_HTTP_AGENT_SQLITE_VERSION];
    sqlite3    *db;
    ngx_int_t   version;
    ngx_uint_t  i;

    /*
     * SQLite counts its memory under a global mutex at every allocation,
     * for sqlite3_memory_used(), which nothing here reads.  Set before
     * SQLite is initialized, when the configuration is first read: later
     * the call is refused, and what it set stays.
     */

    (void) sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);

    db = ngx_http_agent_sqlite_connect(path, log, NGX_LOG_EMERG);
    if (db == NULL) {
        return NGX_ERROR;
    }

    err = NULL;
    rc = sqlite3_exec(db, "PRAGMA journal_mode=WAL", NULL, NULL, &err);

    if (rc != SQLITE_OK) {
        goto failed;
    }

    version = ngx_http_agent_sqlite_version(db);

    ngx_memzero(sql, sizeof(sql));

    switch (version) {

    case 0:
        sql[0] = ngx_http_agent_sqlite_create;
        break;

    case NGX_HTTP_AGENT_SQLITE_VERSION:
        break;

    case NGX_ERROR:
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "agent store \"%V\": %s", path, sqlite3_errmsg(db));
        sqlite3_close(db);
        return NGX_ERROR;

    default:

        if (version < 0 || version > NGX_HTTP_AGENT_SQLITE_VERSION) {
            ngx_log_error(NGX_LOG_EMERG, log, 0,
                          "agent store \"%V\" has schema version %i, "
                          "newer than this module's %d", path, version,
                          NGX_HTTP_AGENT_SQLITE_VERSION);
            sqlite3_close(db);
            return NGX_ERROR;
        }

        ngx_log_error(NGX_LOG_NOTICE, log, 0,
                      "agent store \"%V\": migrating the schema from "
                      "version %i to %d", path, version,
                      NGX_HTTP_AGENT_SQLITE_VERSION);

        /* one step at a time, each in its own transaction */

        for (i = 0; version + i < NGX_HTTP_AGENT_SQLITE_VERSION; i++) {
            sql[i] = ngx_http_agent_sqlite_migrate[version + i - 1];
        }

        break;
    }

    for (i = 0; i < NGX_HTTP_AGENT_SQLITE_VERSION && sql[i]; i++) {
        rc = sqlite3_exec(db, sql[i], NULL, NULL, &err);

        if (rc != SQLITE_OK) {
            (void) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            goto failed;
        }
    }

    sqlite3_close(db);

    return NGX_OK;

failed:

    ngx_log_error(NGX_LOG_EMERG, log, 0, "agent store \"%V\": %s", path,
                  err ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    sqlite3_close(db);

    return NGX_ERROR;
}


/* 0 for a new file */

static ngx_int_t
ngx_http_agent_sqlite_version(sqlite3 *db)
{
    int            rc;
    ngx_int_t      version;
    sqlite3_stmt  *stmt;

    rc = sqlite3_prepare_v2(db, "SELECT value FROM meta"
                                " WHERE key = 'schema_version'",
                            -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        /* no meta table */
        return sqlite3_errcode(db) == SQLITE_ERROR ? 0 : NGX_ERROR;
    }

    version = 0;

    rc = sqlite3_step(stmt);

    if (rc == SQLITE_ROW) {
        version = sqlite3_column_int(stmt, 0);

        if (version <= 0) {
            version = NGX_ERROR;
        }

    } else if (rc != SQLITE_DONE) {
        version = NGX_ERROR;
    }

    sqlite3_finalize(stmt);

    return version;
}


/*
 * Whether a commit waits until the disk has it: SQLite's synchronous
 * FULL, its WAL synced at each commit; or NORMAL, at checkpoints only.
 * In WAL mode either keeps the database whole; with NORMAL a commit is
 * in the WAL file, which an exit of nginx, killed or not, leaves to the
 * next connection, but the last commits may be lost with the machine.
 * The master's connection, which makes the schema, keeps FULL.
 */

static ngx_uint_t  ngx_http_agent_sqlite_sync = 1;


void
ngx_http_agent_sqlite_init_process(ngx_uint_t sync)
{
    ngx_http_agent_sqlite_sync = sync;
}


/*
 * vfs: the VFS that writes a commit's WAL frames at once, for the log's
 * writer (ngx_http_agent_store_vfs.c), or NULL: SQLite's default.  It
 * buffers frames until their commit's, which is safe only if they are
 * all written by the commit: a connection through it does not spill its
 * page cache (frames written before the commit, and left in the buffer
 * by a transaction rolled back, could be written later over another
 * connection's).  Its cache grows by the transaction's pages meanwhile,
 * and shrinks back after it; the writer's batches are of 256 events at
 * most.
 */

sqlite3 *
ngx_http_agent_sqlite_connect_vfs(ngx_str_t *path, const char *vfs,
    ngx_log_t *log, ngx_uint_t level)
{
    int       rc;
    sqlite3  *db;

    rc = sqlite3_open_v2((char *) path->data, &db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
                         | SQLITE_OPEN_NOMUTEX, vfs);

    if (rc != SQLITE_OK) {
        ngx_log_error(level, log, 0,
                      "agent store \"%V\" cannot be opened: %s", path,
                      db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return NULL;
    }

    /* workers write side by side: a short wait instead of SQLITE_BUSY */
    sqlite3_busy_handler(db, ngx_http_agent_sqlite_busy, NULL);

    if (vfs && sqlite3_exec(db, "PRAGMA cache_spill=OFF", NULL, NULL, NULL)
               != SQLITE_OK)
    {
        ngx_log_error(level, log, 0, "agent store \"%V\": %s", path,
                      sqlite3_errmsg(db));
        sqlite3_close(db);
        return NULL;
    }

    if (sqlite3_exec(db, ngx_http_agent_sqlite_sync
                         ? "PRAGMA synchronous=FULL"
                         : "PRAGMA synchronous=NORMAL",
                     NULL, NULL, NULL)
        != SQLITE_OK)
    {
        ngx_log_error(level, log, 0, "agent store \"%V\": %s", path,
                      sqlite3_errmsg(db));
        sqlite3_close(db);
        return NULL;
    }

    return db;
}


/*
 * SQLite's own busy timeout sleeps longer each time, up to 100 ms a try:
 * a connection that waits for another process's write (an exiting
 * worker's, a reader's recovery, another program's) would wait that long
 * after the lock is free.  Tried every 100 us for the first 10 ms, then
 * every millisecond, for at most 5 s.
 */

static int
ngx_http_agent_sqlite_busy(void *data, int count)
{
    if (count < 100) {
        (void) usleep(100);
        return 1;
    }

    if (count < 100 + 4990) {
        (void) usleep(1000);
        return 1;
    }

    return 0;
}
