
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <sqlite3.h>

#include "ngx_http_agent_store_audit.h"
#include "ngx_http_agent_store_list.h"


/*
 * What an event derives, as SQL of the event's conversation c, seq s and
 * data d: the writer binds them (ngx_http_agent_store_sqlite.c), the
 * trigger for other writers' events reads them from new.* and adds its
 * test of the type (ngx_http_agent_store_sqlite_schema.c).  A tool call
 * is called, suspended, resolved, done; a user_msg takes its message
 * out of the queue.
 */

#define NGX_HTTP_AGENT_SQLITE_CALLED(c, s, d)                                \
    "INSERT OR IGNORE INTO tool_calls"                                       \
    " (conversation, id, name, seq, executor, status)"                       \
    " SELECT " c ", json_extract(" d ", '$.tool_call_id'),"                  \
    " json_extract(" d ", '$.name'), " s ","                                 \
    " json_extract(" d ", '$.executor'), 'called'"

#define NGX_HTTP_AGENT_SQLITE_SUSPENDED(c, d)                                \
    "UPDATE tool_calls SET status = 'suspended',"                            \
    " kind = json_extract(" d ", '$.kind'),"                                 \
    " executor = json_extract(" d ", '$.executor'),"                         \
    " deadline = json_extract(" d ", '$.deadline')"                          \
    " WHERE conversation = " c                                               \
    " AND id = json_extract(" d ", '$.tool_call_id')"

#define NGX_HTTP_AGENT_SQLITE_RESOLVED(c, d)                                 \
    "UPDATE tool_calls SET status = 'resolved'"                              \
    " WHERE conversation = " c                                               \
    " AND id = json_extract(" d ", '$.tool_call_id')"                        \
    " AND status = 'suspended'"

#define NGX_HTTP_AGENT_SQLITE_FINISHED(c, d)                                 \
    "UPDATE tool_calls SET status = 'done', ok = json_extract(" d ", '$.ok'),"\
    " result = coalesce(json_extract(" d ", '$.result'),"                    \
    " json_extract(" d ", '$.error'))"                                       \
    " WHERE conversation = " c                                               \
    " AND id = json_extract(" d ", '$.tool_call_id')"

#define NGX_HTTP_AGENT_SQLITE_DEQUEUED(c, d)                                 \
    "DELETE FROM queued"                                                     \
    " WHERE conversation = " c " AND id = json_extract(" d ", '$.queue_id')"

/*
 * The highest queue id a user_msg of the conversation carried, so that a
 * conversation that comes back to a zone never gives one again: a queued
 * message named by an id its log already holds would not be written
 */

#define NGX_HTTP_AGENT_SQLITE_TAKEN(c, d)                                    \
    "UPDATE conversations SET queue_id = json_extract(" d ", '$.queue_id')"  \
    " WHERE id = " c " AND json_extract(" d ", '$.queue_id') > queue_id"

/*
 * A conversation's state after its last event but a summary (which is
 * part of no turn), ends true when that event ended a turn: at rest
 * then; else running while a call runs or has its answer, waiting for
 * input while one is suspended.  Written only when it changes: most
 * events leave it as it was.
 */

#define NGX_HTTP_AGENT_SQLITE_CONV_STATE(c, ends)                            \
    "CASE WHEN " ends " THEN 'idle'"                                         \
    " WHEN EXISTS (SELECT 1 FROM tool_calls WHERE conversation = " c         \
    "   AND (status = 'called' OR status = 'resolved')) THEN 'running'"      \
    " WHEN EXISTS (SELECT 1 FROM tool_calls WHERE conversation = " c         \
    "   AND status = 'suspended') THEN 'awaiting_input'"                     \
    " ELSE 'running' END"

#define NGX_HTTP_AGENT_SQLITE_STATED(c, ends)                                \
    "UPDATE conversations SET state = "                                      \
    NGX_HTTP_AGENT_SQLITE_CONV_STATE(c, ends)                                \
    " WHERE id = " c " AND state <> "                                        \
    NGX_HTTP_AGENT_SQLITE_CONV_STATE(c, ends)


/* the file made, or its schema migrated, at the configuration's load */
ngx_int_t ngx_http_agent_sqlite_open(ngx_str_t *path, ngx_log_t *log);

/* a connection to the store's file, with the workers' busy timeout */
sqlite3 *ngx_http_agent_sqlite_open_prepared(ngx_str_t *path,
    const char *vfs, ngx_log_t *log, char **sql, sqlite3_stmt **stmts,
    ngx_uint_t n);
void ngx_http_agent_sqlite_close_prepared(sqlite3 **db, sqlite3_stmt **stmts,
    ngx_uint_t n);
ngx_int_t ngx_http_agent_sqlite_prepare(sqlite3 *db, char **sql,
    sqlite3_stmt **stmts, ngx_uint_t n, ngx_str_t *path, ngx_log_t *log);
ngx_int_t ngx_http_agent_sqlite_step(sqlite3_stmt *stmt);
sqlite3 *ngx_http_agent_sqlite_connect_vfs(ngx_str_t *path,
    const char *vfs, ngx_log_t *log, ngx_uint_t level);
#define ngx_http_agent_sqlite_connect(path, log, level)                      \
    ngx_http_agent_sqlite_connect_vfs(path, NULL, log, level)
/* in a worker as it starts: whether a commit waits for the disk */
void ngx_http_agent_sqlite_init_process(ngx_uint_t sync);

/* a page of agent_list (ngx_http_agent_store_sqlite_list.c) */
ngx_int_t ngx_http_agent_sqlite_list(ngx_str_t *path,
    ngx_http_agent_store_list_t *ls, ngx_log_t *log);

/* the store's VFS (ngx_http_agent_store_vfs.c) */
#define NGX_HTTP_AGENT_VFS  "agent"

const char *ngx_http_agent_vfs_name(void);

/*
 * The audit's rows inside the log writer's transaction, with the audit's
 * statements prepared on the writer's connection
 */
#define NGX_HTTP_AGENT_AUDIT_STMTS  8

ngx_int_t ngx_http_agent_sqlite_audit_prepare(sqlite3 *db,
    sqlite3_stmt **stmts, ngx_str_t *path, ngx_log_t *log);
ngx_int_t ngx_http_agent_sqlite_audit_page(ngx_str_t *path,
    ngx_http_agent_audit_page_t *page, ngx_pool_t *pool, ngx_log_t *log);
void ngx_http_agent_sqlite_audit_rows(sqlite3 *db, sqlite3_stmt **stmts,
    ngx_http_agent_audit_row_t *rows, ngx_uint_t n, ngx_str_t *path,
    ngx_log_t *log);


#endif /* _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_ */
