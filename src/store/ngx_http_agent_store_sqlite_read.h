
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_SQLITE_READ_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_SQLITE_READ_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"


/* the store's reads of SQLite, each on a pool thread */
ngx_int_t ngx_http_agent_sqlite_read(ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
ngx_int_t ngx_http_agent_sqlite_sweep(ngx_str_t *path, uint64_t now,
    ngx_array_t *ids, ngx_pool_t *pool, ngx_log_t *log);
ngx_int_t ngx_http_agent_sqlite_takeover(ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
ngx_int_t ngx_http_agent_sqlite_enqueue(ngx_str_t *path,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);

/* the connections kept for reads, closed as the worker exits */
void ngx_http_agent_sqlite_readers_close(void);


#endif /* _NGX_HTTP_AGENT_STORE_SQLITE_READ_H_INCLUDED_ */
