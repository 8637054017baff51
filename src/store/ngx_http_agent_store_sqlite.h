
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <sqlite3.h>


/* a connection to the store's file, with the workers' busy timeout */
sqlite3 *ngx_http_agent_sqlite_open_prepared(ngx_str_t *path,
    ngx_log_t *log, char **sql, sqlite3_stmt **stmts, ngx_uint_t n);
void ngx_http_agent_sqlite_close_prepared(sqlite3 **db, sqlite3_stmt **stmts,
    ngx_uint_t n);
sqlite3 *ngx_http_agent_sqlite_connect(ngx_str_t *path, ngx_log_t *log,
    ngx_uint_t level);


#endif /* _NGX_HTTP_AGENT_STORE_SQLITE_H_INCLUDED_ */
