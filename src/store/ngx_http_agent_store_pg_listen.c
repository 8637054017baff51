
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <poll.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_pg.h"


/*
 * The listener of a node (agent_node): one connection to PostgreSQL in
 * the event loop of one worker of the node, LISTEN on the channel that
 * every batch's commit notifies ("<conversation>:<last seq>", see
 * ngx_http_agent_store_pg.c), each notification relayed with a wake-up
 * datagram (ngx_http_agent_wake.c) to the workers of this node that
 * serve subscribers from the store (the zone's followers), which then
 * read what follows their cursors.  A notification is a hint, as a
 * wake-up is: the followers poll the store slowly too, which covers
 * those lost while the listener was away.
 *
 * The worker is the zone's listener (its pid there); every worker looks
 * each second whether the listener lives, and takes its place if not (a
 * worker killed, or one that exits).  The connection is made without
 * waiting: libpq is asked on a short timer until it is made (it may
 * change its socket as it tries addresses), then its socket is an
 * nginx connection whose read events consume the notifications.  A
 * connection that fails or is lost is made again after a pause that
 * doubles up to LISTEN_MAX.  A host name in the conninfo is looked up
 * by libpq, which blocks: hostaddr= or a unix socket does not.
 */


#define NGX_HTTP_AGENT_PG_LISTEN_CHECK  1000
#define NGX_HTTP_AGENT_PG_LISTEN_STEP   10
#define NGX_HTTP_AGENT_PG_LISTEN_MIN    250
#define NGX_HTTP_AGENT_PG_LISTEN_MAX    5000


typedef struct {
    PGconn                     *conn;
    ngx_connection_t           *connection;
    ngx_http_agent_zone_t      *zone;
    ngx_str_t                   conninfo;
    ngx_log_t                  *log;

    /* ownership's check, a connection's steps, the pause after a loss */
    ngx_event_t                 timer;

    PostgresPollingStatusType   polling;
    ngx_msec_t                  deadline;
    ngx_msec_t                  backoff;

    unsigned                    connecting:1;
    unsigned                    listening:1;
} ngx_http_agent_pg_listener_t;


static void ngx_http_agent_pg_listen_timer(ngx_event_t *ev);
static ngx_uint_t ngx_http_agent_pg_listen_own(
    ngx_http_agent_pg_listener_t *l);
static void ngx_http_agent_pg_listen_connect(ngx_http_agent_pg_listener_t *l);
static void ngx_http_agent_pg_listen_step(ngx_http_agent_pg_listener_t *l);
static ngx_int_t ngx_http_agent_pg_listen_start(
    ngx_http_agent_pg_listener_t *l);
static void ngx_http_agent_pg_listen_read(ngx_event_t *rev);
static void ngx_http_agent_pg_listen_write(ngx_event_t *wev);
static void ngx_http_agent_pg_listen_relay(ngx_http_agent_pg_listener_t *l,
    char *payload);
static void ngx_http_agent_pg_listen_lost(ngx_http_agent_pg_listener_t *l,
    const char *what);
static void ngx_http_agent_pg_listen_close(ngx_http_agent_pg_listener_t *l);
static void ngx_http_agent_pg_listen_release(ngx_http_agent_pg_listener_t *l);


/* this worker's; conn NULL when it is not the listener, or between two */
static ngx_http_agent_pg_listener_t  ngx_http_agent_pg_listener;


ngx_int_t
ngx_http_agent_pg_listen_init_process(ngx_cycle_t *cycle)
{
    ngx_event_t                   *ev;
    ngx_http_agent_main_conf_t    *amcf;
    ngx_http_agent_store_conf_t   *scf;
    ngx_http_agent_pg_listener_t  *l;

    l = &ngx_http_agent_pg_listener;

    ngx_memzero(l, sizeof(ngx_http_agent_pg_listener_t));

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);

    scf = amcf ? amcf->store : NULL;

    if (scf == NULL || amcf->zone == NULL
        || scf->store != &ngx_http_agent_store_pg
        || ngx_http_agent_pg_node.id.len == 0)
    {
        return NGX_OK;
    }

    l->zone = amcf->zone;
    l->conninfo = scf->path;
    l->log = cycle->log;
    l->backoff = NGX_HTTP_AGENT_PG_LISTEN_MIN;

    ev = &l->timer;
    ev->handler = ngx_http_agent_pg_listen_timer;
    ev->data = l;
    ev->log = cycle->log;
    ev->cancelable = 1;

    /* the first look soon: a node's first worker listens from its start */

    ngx_add_timer(ev, NGX_HTTP_AGENT_PG_LISTEN_STEP);

    return NGX_OK;
}


void
ngx_http_agent_pg_listen_exit_process(void)
{
    ngx_http_agent_pg_listener_t  *l;

    l = &ngx_http_agent_pg_listener;

    if (l->zone == NULL) {
        return;
    }

    if (l->timer.timer_set) {
        ngx_del_timer(&l->timer);
    }

    ngx_http_agent_pg_listen_close(l);
    ngx_http_agent_pg_listen_release(l);

    l->zone = NULL;
}


static void
ngx_http_agent_pg_listen_timer(ngx_event_t *ev)
{
    ngx_http_agent_pg_listener_t *l = ev->data;

    if (ngx_exiting || ngx_terminate) {
        return;
    }

    if (l->connecting) {
        ngx_http_agent_pg_listen_step(l);
        return;
    }

    if (l->conn) {
        return;
    }

    if (!ngx_http_agent_pg_listen_own(l)) {
        ngx_add_timer(ev, NGX_HTTP_AGENT_PG_LISTEN_CHECK);
        return;
    }

    ngx_http_agent_pg_listen_connect(l);
}


/* whether this worker is the listener, or becomes it: none lives */

static ngx_uint_t
ngx_http_agent_pg_listen_own(ngx_http_agent_pg_listener_t *l)
{
    ngx_pid_t                  pid;
    ngx_uint_t                 own;
    ngx_http_agent_node_sh_t  *node;

    ngx_http_agent_zone_lock(l->zone);

    node = ngx_http_agent_zone_node_locked(l->zone);

    pid = node ? node->listener : ngx_pid;
    own = (node && pid == ngx_pid);

    if (node && !own && (pid == 0 || !ngx_http_agent_pid_alive(pid))) {
        node->listener = ngx_pid;
        own = 1;
    }

    ngx_http_agent_zone_unlock(l->zone);

    if (own && pid != ngx_pid) {
        ngx_log_error(NGX_LOG_NOTICE, l->log, 0,
                      "agent store \"%s\": this worker listens for the "
                      "store's notifications%s", ngx_http_agent_pg_name,
                      pid ? ", in place of one gone" : "");
    }

    return own;
}


static void
ngx_http_agent_pg_listen_connect(ngx_http_agent_pg_listener_t *l)
{
    l->conn = ngx_http_agent_pg_start(&l->conninfo);

    if (l->conn == NULL) {
        ngx_http_agent_pg_listen_lost(l, "no memory for a connection");
        return;
    }

    l->connecting = 1;
    l->polling = PGRES_POLLING_WRITING;
    l->deadline = ngx_current_msec + NGX_HTTP_AGENT_PG_TIMEOUT;

    ngx_http_agent_pg_listen_step(l);
}


/*
 * A step of the connection, when the socket is ready for what libpq
 * waits for: polled, never waited for
 */

static void
ngx_http_agent_pg_listen_step(ngx_http_agent_pg_listener_t *l)
{
    ngx_int_t  rc;

    for ( ;; ) {
        if (PQstatus(l->conn) == CONNECTION_BAD
            || l->polling == PGRES_POLLING_FAILED)
        {
            ngx_http_agent_pg_listen_lost(l, "cannot connect");
            return;
        }

        if (l->polling == PGRES_POLLING_OK) {
            break;
        }

        rc = ngx_http_agent_pg_wait(l->conn,
                                    l->polling == PGRES_POLLING_READING
                                    ? POLLIN : POLLOUT, 0);

        if (rc == NGX_ERROR) {
            ngx_http_agent_pg_listen_lost(l, "cannot connect");
            return;
        }

        if (rc == NGX_AGAIN) {
            if ((ngx_msec_int_t) (ngx_current_msec - l->deadline) >= 0) {
                ngx_http_agent_pg_listen_lost(l, "no connection in time");
                return;
            }

            ngx_add_timer(&l->timer, NGX_HTTP_AGENT_PG_LISTEN_STEP);
            return;
        }

        l->polling = PQconnectPoll(l->conn);
    }

    l->connecting = 0;

    if (ngx_http_agent_pg_listen_start(l) != NGX_OK) {
        ngx_http_agent_pg_listen_lost(l, "listen");
    }
}


/*
 * Connected: the socket, which no longer changes, becomes an nginx
 * connection, level-triggered as the wake-up socket is, and LISTEN is
 * sent.  The connection is "idle": a graceful shutdown closes it.
 */

static ngx_int_t
ngx_http_agent_pg_listen_start(ngx_http_agent_pg_listener_t *l)
{
    ngx_event_t       *rev;
    ngx_connection_t  *c;

    if (PQsetnonblocking(l->conn, 1) != 0
        || !PQsendQuery(l->conn, "LISTEN " NGX_HTTP_AGENT_PG_CHANNEL))
    {
        return NGX_ERROR;
    }

    c = ngx_get_connection(PQsocket(l->conn), l->log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->data = l;
    c->idle = 1;

    rev = c->read;
    rev->handler = ngx_http_agent_pg_listen_read;
    rev->log = l->log;
    c->write->handler = ngx_http_agent_pg_listen_write;
    c->write->log = l->log;

    l->connection = c;

    if (ngx_add_event(rev, NGX_READ_EVENT, 0) != NGX_OK) {
        return NGX_ERROR;
    }

    /* what libpq could not send at once goes when the socket takes it */

    ngx_http_agent_pg_listen_write(c->write);

    return NGX_OK;
}


static void
ngx_http_agent_pg_listen_write(ngx_event_t *wev)
{
    int                            n;
    ngx_connection_t              *c;
    ngx_http_agent_pg_listener_t  *l;

    c = wev->data;
    l = c->data;

    n = PQflush(l->conn);

    if (n == -1) {
        ngx_http_agent_pg_listen_lost(l, "listen");
        return;
    }

    if (n == 1 && !wev->active) {
        if (ngx_add_event(wev, NGX_WRITE_EVENT, 0) != NGX_OK) {
            ngx_http_agent_pg_listen_lost(l, "listen");
        }

        return;
    }

    if (n == 0 && wev->active) {
        if (ngx_del_event(wev, NGX_WRITE_EVENT, 0) != NGX_OK) {
            ngx_http_agent_pg_listen_lost(l, "listen");
        }
    }
}


static void
ngx_http_agent_pg_listen_read(ngx_event_t *rev)
{
    PGnotify                      *n;
    PGresult                      *res;
    ngx_connection_t              *c;
    ngx_http_agent_pg_listener_t  *l;

    c = rev->data;
    l = c->data;

    if (c->close) {
        /* a graceful shutdown: another worker listens from now on */

        ngx_http_agent_pg_listen_close(l);
        ngx_http_agent_pg_listen_release(l);
        return;
    }

    if (!PQconsumeInput(l->conn)) {
        ngx_http_agent_pg_listen_lost(l, "the listener's connection");
        return;
    }

    while (!PQisBusy(l->conn)) {
        res = PQgetResult(l->conn);

        if (res == NULL) {
            break;
        }

        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            ngx_http_agent_pg_log(NGX_LOG_ERR, l->log, l->conn, res,
                                  "listen");
            PQclear(res);
            ngx_http_agent_pg_listen_lost(l, NULL);
            return;
        }

        PQclear(res);

        if (!l->listening) {
            l->listening = 1;
            l->backoff = NGX_HTTP_AGENT_PG_LISTEN_MIN;

            ngx_log_error(NGX_LOG_INFO, l->log, 0,
                          "agent store \"%s\": listening for the store's "
                          "notifications", ngx_http_agent_pg_name);
        }
    }

    while ((n = PQnotifies(l->conn)) != NULL) {
        ngx_http_agent_pg_listen_relay(l, n->extra);
        PQfreemem(n);
    }

    if (PQstatus(l->conn) == CONNECTION_BAD) {
        ngx_http_agent_pg_listen_lost(l, "the listener's connection");
    }
}


/*
 * "<conversation>:<seq>": the workers with subscribers served from the
 * store are woken for the conversation; each looks whether its own
 * have a cursor before it
 */

static void
ngx_http_agent_pg_listen_relay(ngx_http_agent_pg_listener_t *l,
    char *payload)
{
    u_char               *p;
    ngx_str_t             id;
    ngx_uint_t            n;
    ngx_pid_t             pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_http_agent_sh_t  *sh;

    id.data = (u_char *) payload;
    p = id.data + ngx_strlen(payload);

    while (p > id.data && p[-1] != ':') {
        p--;
    }

    id.len = (p > id.data) ? (size_t) (p - 1 - id.data) : 0;

    if (id.len == 0 || id.len > NGX_HTTP_AGENT_ID_LEN) {
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, l->log, 0,
                   "agent store: notified \"%s\"", payload);

    sh = l->zone->sh;
    n = 0;

    ngx_http_agent_zone_lock(l->zone);

    if (sh->node && sh->node->followers) {
        n = ngx_http_agent_workers_pids_locked(sh->node->followers, pids);
    }

    ngx_http_agent_zone_unlock(l->zone);

    if (n) {
        ngx_http_agent_wake(&id, pids, n);
    }
}


/* the connection failed or was lost: made again after a pause */

static void
ngx_http_agent_pg_listen_lost(ngx_http_agent_pg_listener_t *l,
    const char *what)
{
    if (what && l->conn) {
        ngx_http_agent_pg_log(NGX_LOG_ERR, l->log, l->conn, NULL, what);

    } else if (what) {
        ngx_log_error(NGX_LOG_ERR, l->log, 0, "agent store \"%s\": %s",
                      ngx_http_agent_pg_name, what);
    }

    ngx_http_agent_pg_listen_close(l);

    if (l->timer.timer_set) {
        ngx_del_timer(&l->timer);
    }

    ngx_log_error(NGX_LOG_WARN, l->log, 0,
                  "agent store \"%s\": the listener connects again in %M ms",
                  ngx_http_agent_pg_name, l->backoff);

    ngx_add_timer(&l->timer, l->backoff);

    l->backoff = ngx_min(l->backoff * 2, NGX_HTTP_AGENT_PG_LISTEN_MAX);
}


/*
 * The nginx connection goes first, its fd left open (libpq's to close):
 * its events need no removal, the fd's close drops them from epoll
 */

static void
ngx_http_agent_pg_listen_close(ngx_http_agent_pg_listener_t *l)
{
    ngx_connection_t  *c;

    c = l->connection;

    if (c) {
        if (c->read->active) {
            (void) ngx_del_event(c->read, NGX_READ_EVENT, NGX_CLOSE_EVENT);
        }

        if (c->write->active) {
            (void) ngx_del_event(c->write, NGX_WRITE_EVENT, NGX_CLOSE_EVENT);
        }

        if (c->read->posted) {
            ngx_delete_posted_event(c->read);
        }

        if (c->write->posted) {
            ngx_delete_posted_event(c->write);
        }

        ngx_free_connection(c);
        c->fd = (ngx_socket_t) -1;

        l->connection = NULL;
    }

    if (l->conn) {
        PQfinish(l->conn);
        l->conn = NULL;
    }

    l->connecting = 0;
    l->listening = 0;
}


/* another worker may listen now */

static void
ngx_http_agent_pg_listen_release(ngx_http_agent_pg_listener_t *l)
{
    ngx_http_agent_zone_lock(l->zone);

    if (l->zone->sh->node && l->zone->sh->node->listener == ngx_pid) {
        l->zone->sh->node->listener = 0;
    }

    ngx_http_agent_zone_unlock(l->zone);
}
