
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <poll.h>

#include "ngx_http_agent_store_pg.h"


/*
 * The connections of PostgreSQL's store.  libpq blocks in every call it
 * makes of its own, and a server that stops answering (a cut network, a
 * server paused, a host gone) would hold the calling thread until TCP
 * gave up, if ever: on a unix socket never.  So the connections are
 * non-blocking, and every wait for the server is a poll() with the
 * call's deadline; a connection that missed one, or saw any error, is
 * closed, and the next task makes another.  TCP's keepalives and
 * tcp_user_timeout, statement_timeout and lock_timeout on the server
 * bound the rest: a statement the server runs too long, a lock it waits
 * for, a peer that went away.
 */


static ngx_int_t ngx_http_agent_pg_settings(PGconn *conn, ngx_msec_t timeout,
    ngx_uint_t level, ngx_log_t *log);
static PGresult *ngx_http_agent_pg_statement(ngx_str_t *conninfo,
    PGconn **conn, ngx_uint_t twice, const char *sql, int n,
    const Oid *types, const char *const *values, const int *lengths,
    const int *formats, const char *what, ngx_log_t *log);
static void ngx_http_agent_pg_readers_drop(void);
static void ngx_http_agent_pg_notice(void *arg, const char *message);


#define NGX_HTTP_AGENT_PG_NAME  256

u_char  ngx_http_agent_pg_name[NGX_HTTP_AGENT_PG_NAME];


/* synchronous_commit: on (sync=full), else off */
static ngx_uint_t  ngx_http_agent_pg_sync = 1;


/*
 * Connections kept for reads: opening one costs a server process's
 * start (some milliseconds), more than most reads
 */

#define NGX_HTTP_AGENT_PG_READERS  4

static PGconn          *ngx_http_agent_pg_readers[NGX_HTTP_AGENT_PG_READERS];
static ngx_uint_t       ngx_http_agent_pg_nreaders;
static pthread_mutex_t  ngx_http_agent_pg_readers_mutex =
    PTHREAD_MUTEX_INITIALIZER;


void
ngx_http_agent_pg_set_name(ngx_str_t *conninfo)
{
    u_char            *p, *last;
    PQconninfoOption  *opts, *o;

    p = ngx_http_agent_pg_name;
    last = p + NGX_HTTP_AGENT_PG_NAME - 1;

    opts = PQconninfoParse((char *) conninfo->data, NULL);

    if (opts == NULL) {
        p = ngx_cpymem(p, "postgres", sizeof("postgres") - 1);
        *p = '\0';
        return;
    }

    p = ngx_slprintf(p, last, "postgres:");

    for (o = opts; o->keyword; o++) {
        if (o->val == NULL || o->val[0] == '\0'
            || ngx_strcmp(o->keyword, "password") == 0)
        {
            continue;
        }

        p = ngx_slprintf(p, last, "%s%s=%s",
                         p[-1] == ':' ? "" : " ", o->keyword, o->val);
    }

    *p = '\0';

    PQconninfoFree(opts);
}


void
ngx_http_agent_pg_init_process(ngx_uint_t sync)
{
    ngx_http_agent_pg_sync = sync;
}


ngx_msec_t
ngx_http_agent_pg_msec(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (ngx_msec_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/*
 * A connection started, not waited for: the settings the module wants,
 * the conninfo the directive gave last (the dbname given as a connection
 * string), so that what it sets wins over the timeouts set here
 */

PGconn *
ngx_http_agent_pg_start(ngx_str_t *conninfo)
{
    PGconn      *conn;
    const char  *values[9];

    static const char  *keys[] = {
        "connect_timeout", "keepalives", "keepalives_idle",
        "keepalives_interval", "keepalives_count", "tcp_user_timeout",
        "application_name", "dbname", NULL
    };

    values[0] = "5";
    values[1] = "1";
    values[2] = "10";
    values[3] = "5";
    values[4] = "3";
    values[5] = "10000";
    values[6] = "nginx agent";
    values[7] = (char *) conninfo->data;
    values[8] = NULL;

    conn = PQconnectStartParams(keys, values, 1);

    if (conn != NULL) {
        (void) PQsetNoticeProcessor(conn, ngx_http_agent_pg_notice, NULL);
    }

    return conn;
}


/*
 * The server's notices are not printed on stderr, as libpq's own
 * processor would print them: what the schema's "IF NOT EXISTS" says
 * each time a master opens the store ("relation ... already exists,
 * skipping") is no news, and the module's statements report what
 * matters as errors
 */

static void
ngx_http_agent_pg_notice(void *arg, const char *message)
{
}


PGconn *
ngx_http_agent_pg_connect(ngx_str_t *conninfo, ngx_msec_t timeout,
    ngx_uint_t level, ngx_log_t *log)
{
    PGconn                        *conn;
    ngx_int_t                      rc;
    ngx_msec_t                     deadline;
    PostgresPollingStatusType      st;

    deadline = ngx_http_agent_pg_msec() + timeout;

    conn = ngx_http_agent_pg_start(conninfo);
    if (conn == NULL) {
        ngx_log_error(level, log, 0, "agent store \"%s\": no memory for a "
                      "connection", ngx_http_agent_pg_name);
        return NULL;
    }

    st = PGRES_POLLING_WRITING;

    while (PQstatus(conn) != CONNECTION_BAD && st != PGRES_POLLING_OK) {

        if (st == PGRES_POLLING_FAILED) {
            break;
        }

        rc = ngx_http_agent_pg_wait(conn, st == PGRES_POLLING_READING
                                          ? POLLIN : POLLOUT, deadline);
        if (rc == NGX_AGAIN) {
            ngx_log_error(level, log, 0, "agent store \"%s\": no connection "
                          "in %M ms", ngx_http_agent_pg_name, timeout);
            PQfinish(conn);
            return NULL;
        }

        if (rc != NGX_OK) {
            break;
        }

        st = PQconnectPoll(conn);
    }

    if (PQstatus(conn) != CONNECTION_OK) {
        ngx_http_agent_pg_log(level, log, conn, NULL, "cannot connect");
        PQfinish(conn);
        return NULL;
    }

    if (PQsetnonblocking(conn, 1) != 0
        || ngx_http_agent_pg_settings(conn, timeout, level, log) != NGX_OK)
    {
        PQfinish(conn);
        return NULL;
    }

    return conn;
}


/*
 * The session's settings: a statement, or a lock it waits for, never
 * runs past the client's deadline on the server; a transaction left
 * open by a client that went away ends; a commit waits for the disk
 * (sync=full) or not (sync=normal: a crash of the server's machine may
 * lose the last commits, never a part of one).
 */

static ngx_int_t
ngx_http_agent_pg_settings(PGconn *conn, ngx_msec_t timeout,
    ngx_uint_t level, ngx_log_t *log)
{
    u_char      sql[256], *p;
    ngx_int_t   rc, ok;
    PGresult   *res;
    ngx_msec_t  deadline;

    p = ngx_snprintf(sql, sizeof(sql) - 1,
                     "SET statement_timeout = %M; SET lock_timeout = %M;"
                     " SET idle_in_transaction_session_timeout = %M;"
                     " SET synchronous_commit = %s",
                     timeout, timeout / 2, timeout * 12,
                     ngx_http_agent_pg_sync ? "on" : "off");
    *p = '\0';

    if (!PQsendQuery(conn, (char *) sql)) {
        ngx_http_agent_pg_log(level, log, conn, NULL, "settings");
        return NGX_ERROR;
    }

    deadline = ngx_http_agent_pg_msec() + timeout + 1000;
    ok = NGX_OK;

    while ((res = ngx_http_agent_pg_result(conn, deadline, &rc, log))) {
        if (PQresultStatus(res) != PGRES_COMMAND_OK && ok == NGX_OK) {
            ngx_http_agent_pg_log(level, log, conn, res, "settings");
            ok = NGX_ERROR;
        }

        PQclear(res);
    }

    return (rc == NGX_OK) ? ok : NGX_ERROR;
}


ngx_int_t
ngx_http_agent_pg_wait(PGconn *conn, short events, ngx_msec_t deadline)
{
    int             n;
    ngx_msec_int_t  left;
    struct pollfd   pfd;

    pfd.fd = PQsocket(conn);
    pfd.events = events;
    pfd.revents = 0;

    if (pfd.fd == -1) {
        return NGX_ERROR;
    }

    for ( ;; ) {
        /* deadline 0: a look, no wait (the event loop's) */

        left = deadline ? (ngx_msec_int_t) (deadline - ngx_http_agent_pg_msec())
                        : 0;

        if (deadline && left <= 0) {
            return NGX_AGAIN;
        }

        n = poll(&pfd, 1, (int) left);

        if (n > 0) {
            return NGX_OK;
        }

        if (n == 0) {
            return NGX_AGAIN;
        }

        if (ngx_errno != NGX_EINTR) {
            return NGX_ERROR;
        }
    }
}


PGresult *
ngx_http_agent_pg_result(PGconn *conn, ngx_msec_t deadline, ngx_int_t *rc,
    ngx_log_t *log)
{
    int        n;
    ngx_int_t  w;

    *rc = NGX_OK;

    for ( ;; ) {
        n = PQflush(conn);

        if (n == -1) {
            *rc = NGX_ERROR;
            return NULL;
        }

        if (n == 0 && !PQisBusy(conn)) {
            return PQgetResult(conn);
        }

        w = ngx_http_agent_pg_wait(conn, n ? POLLIN | POLLOUT : POLLIN,
                                   deadline);

        if (w == NGX_AGAIN) {
            ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\": the "
                          "server did not answer in time, the connection "
                          "is closed", ngx_http_agent_pg_name);
            *rc = NGX_AGAIN;
            return NULL;
        }

        if (w != NGX_OK || !PQconsumeInput(conn)) {
            *rc = NGX_ERROR;
            return NULL;
        }
    }
}


PGresult *
ngx_http_agent_pg_exec(PGconn *conn, const char *sql, int n,
    const Oid *types, const char *const *values, const int *lengths,
    const int *formats, const char *what, ngx_log_t *log)
{
    ngx_int_t       rc;
    PGresult       *res, *next;
    ngx_msec_t      deadline;
    ExecStatusType  st;

    if (!PQsendQueryParams(conn, sql, n, types, values, lengths, formats,
                           0))
    {
        ngx_http_agent_pg_log(NGX_LOG_ERR, log, conn, NULL, what);
        return NULL;
    }

    deadline = ngx_http_agent_pg_msec() + NGX_HTTP_AGENT_PG_TIMEOUT + 1000;

    res = ngx_http_agent_pg_result(conn, deadline, &rc, log);

    /* the end of the statement's results */

    while (rc == NGX_OK
           && (next = ngx_http_agent_pg_result(conn, deadline, &rc, log)))
    {
        PQclear(next);
    }

    if (res == NULL || rc != NGX_OK) {
        if (rc == NGX_ERROR || res == NULL) {
            ngx_http_agent_pg_log(NGX_LOG_ERR, log, conn, NULL, what);
        }

        PQclear(res);
        return NULL;
    }

    st = PQresultStatus(res);

    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        ngx_http_agent_pg_log(NGX_LOG_ERR, log, conn, res, what);
        PQclear(res);
        return NULL;
    }

    return res;
}


void
ngx_http_agent_pg_log(ngx_uint_t level, ngx_log_t *log, PGconn *conn,
    PGresult *res, const char *what)
{
    size_t   len;
    u_char  *msg;

    msg = (u_char *) (res ? PQresultErrorMessage(res)
                          : PQerrorMessage(conn));

    if (msg == NULL) {
        msg = (u_char *) "";
    }

    len = ngx_strlen(msg);

    while (len && (msg[len - 1] == '\n' || msg[len - 1] == ' ')) {
        len--;
    }

    ngx_log_error(level, log, 0, "agent store \"%s\": %s: %*s",
                  ngx_http_agent_pg_name, what, len, msg);
}


/*
 * A kept connection can be found broken only when it is used: the
 * server restarted, its session was ended (pg_terminate_backend), or a
 * network cut healed under it.  A connection the server closed while it
 * was kept has something to read (the server's last error, its end):
 * ngx_http_agent_pg_get() closes it and takes the next.  One the server
 * forgot without a word (a cut) breaks under the statement sent on it.
 *
 * Then the work is done once more on a new connection, if it may run
 * twice: a read-only transaction (a read, a page of the list or the
 * audit), or a statement that a second run leaves as the first left it
 * and answers as it did (the sweep, a revival's claim, the enqueue).
 * Broken is CONNECTION_BAD: the send failed, or the end of the results
 * was the connection's end.  A server that ends a session (57P01
 * admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now, class
 * 08) sends its error and closes the connection, and the results are
 * read to their end, so it is that too.  An error the server answered
 * with, or a deadline missed, is not tried again: the second try would
 * get the same error, or wait as long again.  The second try waits as
 * the first does, a connection for at most 5 s and a statement for at
 * most 5 s + 1 s, and is not tried again itself.  The other kept
 * connections, of the same server, are closed with the broken one.
 */

ngx_int_t
ngx_http_agent_pg_retry(ngx_str_t *conninfo,
    ngx_http_agent_pg_handler_pt handler, void *data, const char *what,
    ngx_log_t *log)
{
    PGconn      *conn;
    ngx_int_t    rc;
    ngx_uint_t   tried;

    conn = ngx_http_agent_pg_get(conninfo, log);

    for (tried = 0; conn; tried = 1) {
        rc = handler(conn, data, log);

        if (rc == NGX_OK || tried
            || !ngx_http_agent_pg_broken(conn, what, log))
        {
            ngx_http_agent_pg_put(conn, rc == NGX_OK);
            return rc;
        }

        PQfinish(conn);

        conn = ngx_http_agent_pg_connect(conninfo, NGX_HTTP_AGENT_PG_TIMEOUT,
                                         NGX_LOG_ERR, log);
    }

    return NGX_ERROR;
}


/* whether a statement that failed on conn may be tried again on another */

ngx_uint_t
ngx_http_agent_pg_broken(PGconn *conn, const char *what, ngx_log_t *log)
{
    if (PQstatus(conn) != CONNECTION_BAD) {
        return 0;
    }

    ngx_log_error(NGX_LOG_WARN, log, 0, "agent store \"%s\": %s: the "
                  "connection was lost, tried again on a new one",
                  ngx_http_agent_pg_name, what);

    ngx_http_agent_pg_readers_drop();

    return 1;
}


PGresult *
ngx_http_agent_pg_query(ngx_str_t *conninfo, PGconn **conn, const char *sql,
    int n, const Oid *types, const char *const *values, const int *lengths,
    const int *formats, const char *what, ngx_log_t *log)
{
    return ngx_http_agent_pg_statement(conninfo, conn, 0, sql, n, types,
                                       values, lengths, formats, what, log);
}


PGresult *
ngx_http_agent_pg_query_again(ngx_str_t *conninfo, PGconn **conn,
    const char *sql, int n, const Oid *types, const char *const *values,
    const int *lengths, const int *formats, const char *what, ngx_log_t *log)
{
    return ngx_http_agent_pg_statement(conninfo, conn, 1, sql, n, types,
                                       values, lengths, formats, what, log);
}


static PGresult *
ngx_http_agent_pg_statement(ngx_str_t *conninfo, PGconn **conn,
    ngx_uint_t twice, const char *sql, int n, const Oid *types,
    const char *const *values, const int *lengths, const int *formats,
    const char *what, ngx_log_t *log)
{
    PGresult  *res;

    *conn = ngx_http_agent_pg_get(conninfo, log);

    while (*conn) {
        res = ngx_http_agent_pg_exec(*conn, sql, n, types, values, lengths,
                                     formats, what, log);
        if (res) {
            return res;
        }

        if (!twice || !ngx_http_agent_pg_broken(*conn, what, log)) {
            ngx_http_agent_pg_put(*conn, 0);
            break;
        }

        twice = 0;
        PQfinish(*conn);

        *conn = ngx_http_agent_pg_connect(conninfo, NGX_HTTP_AGENT_PG_TIMEOUT,
                                          NGX_LOG_ERR, log);
    }

    *conn = NULL;

    return NULL;
}


PGconn *
ngx_http_agent_pg_get(ngx_str_t *conninfo, ngx_log_t *log)
{
    PGconn  *conn;

    for ( ;; ) {
        conn = NULL;

        (void) pthread_mutex_lock(&ngx_http_agent_pg_readers_mutex);

        if (ngx_http_agent_pg_nreaders) {
            conn = ngx_http_agent_pg_readers[--ngx_http_agent_pg_nreaders];
        }

        (void) pthread_mutex_unlock(&ngx_http_agent_pg_readers_mutex);

        if (conn == NULL) {
            break;
        }

        /* nothing to read on a connection that waits: still open */

        if (ngx_http_agent_pg_wait(conn, POLLIN, 0) == NGX_AGAIN) {
            return conn;
        }

        ngx_log_error(NGX_LOG_INFO, log, 0, "agent store \"%s\": a kept "
                      "connection was closed by the server",
                      ngx_http_agent_pg_name);

        PQfinish(conn);
    }

    return ngx_http_agent_pg_connect(conninfo, NGX_HTTP_AGENT_PG_TIMEOUT,
                                     NGX_LOG_ERR, log);
}


void
ngx_http_agent_pg_put(PGconn *conn, ngx_uint_t ok)
{
    ngx_uint_t  kept;

    kept = 0;

    if (ok && PQstatus(conn) == CONNECTION_OK
        && PQtransactionStatus(conn) == PQTRANS_IDLE)
    {
        (void) pthread_mutex_lock(&ngx_http_agent_pg_readers_mutex);

        if (ngx_http_agent_pg_nreaders < NGX_HTTP_AGENT_PG_READERS) {
            ngx_http_agent_pg_readers[ngx_http_agent_pg_nreaders++] = conn;
            kept = 1;
        }

        (void) pthread_mutex_unlock(&ngx_http_agent_pg_readers_mutex);
    }

    if (!kept) {
        PQfinish(conn);
    }
}


/* the kept connections closed, outside the lock */

static void
ngx_http_agent_pg_readers_drop(void)
{
    ngx_uint_t   i, n;
    PGconn      *conns[NGX_HTTP_AGENT_PG_READERS];

    (void) pthread_mutex_lock(&ngx_http_agent_pg_readers_mutex);

    n = ngx_http_agent_pg_nreaders;

    for (i = 0; i < n; i++) {
        conns[i] = ngx_http_agent_pg_readers[i];
    }

    ngx_http_agent_pg_nreaders = 0;

    (void) pthread_mutex_unlock(&ngx_http_agent_pg_readers_mutex);

    for (i = 0; i < n; i++) {
        PQfinish(conns[i]);
    }
}


void
ngx_http_agent_pg_readers_close(void)
{
    while (ngx_http_agent_pg_nreaders) {
        PQfinish(ngx_http_agent_pg_readers[--ngx_http_agent_pg_nreaders]);
    }
}
