
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_PG_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_PG_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <ngx_http.h>

#include <libpq-fe.h>

#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"


/*
 * PostgreSQL's store: the path of the store's table is a libpq conninfo
 * (key=value pairs or a postgresql:// URI), NUL-terminated.  Every call
 * waits for the server at most so long (a round trip, or a connection
 * made), on the pool's threads as in a worker that exits: a server that
 * does not answer costs a batch, never a thread for good.
 */

#define NGX_HTTP_AGENT_PG_TIMEOUT         5000

/*
 * the channel of the notifications a batch's commit sends on a node:
 * "<conversation>:<last seq written>", one per conversation a batch
 */
#define NGX_HTTP_AGENT_PG_CHANNEL         "agent"

/* the master's, which may wait for another node's migration */
#define NGX_HTTP_AGENT_PG_OPEN_TIMEOUT    60000


/*
 * this nginx's node (agent_node), set as the configuration is loaded;
 * id.len 0: no node, a store of one nginx that claims nothing
 */
extern ngx_http_agent_store_node_t  ngx_http_agent_pg_node;

/* the store's connection string, without a password, for the logs */
extern u_char  ngx_http_agent_pg_name[];


/* the schema made or migrated, in the master (ngx_http_agent_pg_schema.c) */
ngx_int_t ngx_http_agent_pg_open(ngx_str_t *conninfo, ngx_log_t *log);

/* the conninfo's name for the logs, a password left out */
void ngx_http_agent_pg_set_name(ngx_str_t *conninfo);

/* a connection started, with the module's settings, not waited for */
PGconn *ngx_http_agent_pg_start(ngx_str_t *conninfo);

/*
 * A connection with the session's settings (timeouts, sync), waited for
 * at most timeout ms; NULL: an error, logged at level
 */
PGconn *ngx_http_agent_pg_connect(ngx_str_t *conninfo, ngx_msec_t timeout,
    ngx_uint_t level, ngx_log_t *log);

/* whether a commit waits for the server's disk (init_process) */
void ngx_http_agent_pg_init_process(ngx_uint_t sync);

/*
 * the connection's socket ready for events (POLLIN, POLLOUT), waited for
 * until the deadline, or only looked at (deadline 0); NGX_AGAIN: not ready
 */
ngx_int_t ngx_http_agent_pg_wait(PGconn *conn, short events,
    ngx_msec_t deadline);

/* ms of a clock that only goes forward, for the deadlines of threads */
ngx_msec_t ngx_http_agent_pg_msec(void);

/*
 * What was sent, flushed, and the next result, waited for until the
 * deadline: NULL at the end of a query's results, or on an error (*rc
 * NGX_ERROR, or NGX_AGAIN past the deadline: the connection is no
 * longer usable)
 */
PGresult *ngx_http_agent_pg_result(PGconn *conn, ngx_msec_t deadline,
    ngx_int_t *rc, ngx_log_t *log);

/*
 * A statement with its parameters in text, its result waited for:
 * NULL on an error, logged with what
 */
PGresult *ngx_http_agent_pg_exec(PGconn *conn, const char *sql,
    int n, const Oid *types, const char *const *values, const int *lengths,
    const int *formats, const char *what, ngx_log_t *log);

void ngx_http_agent_pg_log(ngx_uint_t level, ngx_log_t *log, PGconn *conn,
    PGresult *res, const char *what);

/*
 * A statement on a kept connection: its result, *conn to be given back;
 * NULL on an error, logged with what, the connection given back
 */
PGresult *ngx_http_agent_pg_query(ngx_str_t *conninfo, PGconn **conn,
    const char *sql, int n, const Oid *types, const char *const *values,
    const int *lengths, const int *formats, const char *what,
    ngx_log_t *log);

/*
 * The same, for a statement that may run twice (read-only, or one whose
 * second run changes nothing and answers as the first): tried once more
 * on a new connection if the kept one was found broken
 */
PGresult *ngx_http_agent_pg_query_again(ngx_str_t *conninfo, PGconn **conn,
    const char *sql, int n, const Oid *types, const char *const *values,
    const int *lengths, const int *formats, const char *what,
    ngx_log_t *log);

/* work on a connection, which the caller gives back (NGX_OK or an error) */
typedef ngx_int_t (*ngx_http_agent_pg_handler_pt)(PGconn *conn, void *data,
    ngx_log_t *log);

/*
 * The handler on a kept connection, given back after; once more on a
 * new connection if the kept one was found broken: for work that may
 * run twice
 */
ngx_int_t ngx_http_agent_pg_retry(ngx_str_t *conninfo,
    ngx_http_agent_pg_handler_pt handler, void *data, const char *what,
    ngx_log_t *log);

/*
 * whether the connection broke under a statement that failed (logged
 * with what, the other kept connections closed)
 */
ngx_uint_t ngx_http_agent_pg_broken(PGconn *conn, const char *what,
    ngx_log_t *log);

/* the connections kept for reads, the sweep, the list and the audit */
PGconn *ngx_http_agent_pg_get(ngx_str_t *conninfo, ngx_log_t *log);
/* ok 0: an error came on it, it is closed */
void ngx_http_agent_pg_put(PGconn *conn, ngx_uint_t ok);
void ngx_http_agent_pg_readers_close(void);

/* reads (ngx_http_agent_store_pg_read.c) */
ngx_int_t ngx_http_agent_pg_read(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_sweep(ngx_str_t *conninfo, uint64_t now,
    ngx_array_t *ids, ngx_pool_t *pool, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_takeover(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_enqueue(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_release(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_create(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_notified(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_list(ngx_str_t *conninfo,
    ngx_http_agent_store_list_t *ls, ngx_log_t *log);
ngx_int_t ngx_http_agent_pg_audit_page(ngx_str_t *conninfo,
    ngx_http_agent_audit_page_t *page, ngx_pool_t *pool, ngx_log_t *log);


#endif /* _NGX_HTTP_AGENT_STORE_PG_H_INCLUDED_ */
