
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <sqlite3.h>

#include "ngx_http_agent_store_audit.h"


/* the file made, or its schema migrated, at the configuration's load */
ngx_int_t ngx_http_agent_sqlite_open(ngx_str_t *path, ngx_log_t *log);

/* a connection to the store's file, with the workers' busy timeout */
sqlite3 *ngx_http_agent_sqlite_open_prepared(ngx_str_t *path,
    ngx_log_t *log, char **sql, sqlite3_stmt **stmts, ngx_uint_t n);
void ngx_http_agent_sqlite_close_prepared(sqlite3 **db, sqlite3_stmt **stmts,
    ngx_uint_t n);
ngx_int_t ngx_http_agent_sqlite_prepare(sqlite3 *db, char **sql,
    sqlite3_stmt **stmts, ngx_uint_t n, ngx_str_t *path, ngx_log_t *log);
ngx_int_t ngx_http_agent_sqlite_step(sqlite3_stmt *stmt);
sqlite3 *ngx_http_agent_sqlite_connect(ngx_str_t *path, ngx_log_t *log,
    ngx_uint_t level);

/*
 * The audit's rows inside the log writer's transaction, with the audit's
 * statements prepared on the writer's connection
 */
#define NGX_HTTP_AGENT_AUDIT_STMTS  8

ngx_int_t ngx_http_agent_sqlite_audit_prepare(sqlite3 *db,
    sqlite3_stmt **stmts, ngx_str_t *path, ngx_log_t *log);
void ngx_http_agent_sqlite_audit_rows(sqlite3 *db, sqlite3_stmt **stmts,
    ngx_http_agent_audit_row_t *rows, ngx_uint_t n, ngx_str_t *path,
    ngx_log_t *log);


#endif /* _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_ */
