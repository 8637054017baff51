
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_wake.h"


/*
 * Wake-ups across workers.  Each worker binds a datagram socket to the
 * Linux abstract name "ngx_http_agent_wake:<pid>"; a conversation's record
 * in the zone lists the pids of the workers with subscribers of it, and
 * whoever adds an event sends that conversation's id to each of them.
 * Named by pid, the sockets need no setup before fork and no slots to
 * keep in step with the master: a worker started by a reload, or in place
 * of a crashed one, is reachable as soon as it has bound its name, and a
 * worker that is gone simply refuses the datagram.
 *
 * A wake-up carries no event, only "look again": the receiver reads the
 * zone.  Wake-ups to the same worker for the same conversation within one
 * pass of the event loop go out as one datagram.  A receiver's queue is
 * short (net.unix.max_dgram_qlen, 10 by default), so one that is full is
 * tried again shortly; the subscribers' heartbeat poll covers the rest.
 *
 * An empty datagram says that inputs waiting for a write were written:
 * the worker whose batch wrote them sends it, from the pool's thread, to
 * each worker with inputs waiting (listed in the zone), which answers
 * those now written at once rather than at their next poll.
 *
 * The socket is also how a graceful shutdown reaches the event streams:
 * its connection is "idle", so ngx_close_idle_connections() calls its
 * handler, which ends every stream the worker serves.
 */


#define NGX_HTTP_AGENT_WAKE_PENDING     256
#define NGX_HTTP_AGENT_WAKE_RETRY       10
#define NGX_HTTP_AGENT_WAKE_TRIES       50
#define NGX_HTTP_AGENT_WAKE_RECV        256


typedef struct {
    ngx_pid_t                        pid;
    ngx_uint_t                       tries;
    size_t                           len;
    u_char                           id[NGX_HTTP_AGENT_ID_LEN];
} ngx_http_agent_wake_msg_t;


typedef struct {
    ngx_connection_t                *connection;
    ngx_event_t                      flush;
    ngx_uint_t                       npending;
    ngx_http_agent_wake_msg_t        pending[NGX_HTTP_AGENT_WAKE_PENDING];
} ngx_http_agent_wake_ctx_t;


#if (NGX_LINUX)

static socklen_t ngx_http_agent_wake_addr(struct sockaddr_un *sun,
    ngx_pid_t pid);
static void ngx_http_agent_wake_read_handler(ngx_event_t *rev);
static void ngx_http_agent_wake_flush_handler(ngx_event_t *ev);
static void ngx_http_agent_wake_gone(ngx_http_agent_wake_msg_t *msg);
static void ngx_http_agent_wake_clear(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t pid);
static ngx_int_t ngx_http_agent_wake_send(ngx_http_agent_wake_ctx_t *ctx,
    ngx_http_agent_wake_msg_t *msg);

#endif


/* this process's; NULL in processes that serve no agent_events */
static ngx_http_agent_wake_ctx_t  *ngx_http_agent_wake_ctx;

ngx_http_agent_wake_handlers_t     ngx_http_agent_wake_handlers;


ngx_int_t
ngx_http_agent_wake_init_process(ngx_cycle_t *cycle)
{
#if (NGX_LINUX)

    socklen_t                    len;
    ngx_event_t                 *rev;
    ngx_socket_t                 s;
    ngx_connection_t            *c;
    struct sockaddr_un           sun;
    ngx_http_agent_wake_ctx_t   *ctx;
    ngx_http_agent_main_conf_t  *amcf;

    ngx_http_agent_wake_ctx = NULL;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);

    if (amcf == NULL || amcf->zone == NULL) {
        return NGX_OK;
    }

    ctx = ngx_pcalloc(cycle->pool, sizeof(ngx_http_agent_wake_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    s = ngx_socket(AF_UNIX, SOCK_DGRAM, 0);

    if (s == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_socket_errno,
                      ngx_socket_n " for agent wake-ups failed");
        return NGX_ERROR;
    }

    if (ngx_nonblocking(s) == -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_socket_errno,
                      ngx_nonblocking_n " on agent wake-up socket failed");
        goto failed;
    }

    len = ngx_http_agent_wake_addr(&sun, ngx_pid);

    if (bind(s, (struct sockaddr *) &sun, len) == -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_socket_errno,
                      "bind() of agent wake-up socket "
                      "\"@ngx_http_agent_wake:%P\" failed", ngx_pid);
        goto failed;
    }

    c = ngx_get_connection(s, cycle->log);
    if (c == NULL) {
        goto failed;
    }

    c->data = ctx;
    c->pool = cycle->pool;
    c->idle = 1;

    rev = c->read;
    rev->handler = ngx_http_agent_wake_read_handler;
    rev->log = cycle->log;
    c->write->log = cycle->log;

    /* as nginx adds its channel to the master: level-triggered */

    if (ngx_add_conn && (ngx_event_flags & NGX_USE_EPOLL_EVENT) == 0) {
        if (ngx_add_conn(c) == NGX_ERROR) {
            ngx_free_connection(c);
            goto failed;
        }

    } else {
        if (ngx_add_event(rev, NGX_READ_EVENT, 0) == NGX_ERROR) {
            ngx_free_connection(c);
            goto failed;
        }
    }

    ctx->connection = c;

    ctx->flush.handler = ngx_http_agent_wake_flush_handler;
    ctx->flush.data = ctx;
    ctx->flush.log = cycle->log;
    ctx->flush.cancelable = 1;

    ngx_http_agent_wake_ctx = ctx;

    return NGX_OK;

failed:

    if (ngx_close_socket(s) == -1) {
        ngx_log_error(NGX_LOG_ALERT, cycle->log, ngx_socket_errno,
                      ngx_close_socket_n " failed");
    }

    return NGX_ERROR;

#else

    ngx_http_agent_wake_ctx = NULL;

    return NGX_OK;

#endif
}


void
ngx_http_agent_wake_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_agent_wake_ctx_t  *ctx;

    ctx = ngx_http_agent_wake_ctx;

    if (ctx == NULL) {
        return;
    }

    ngx_http_agent_wake_ctx = NULL;

    if (ctx->flush.timer_set) {
        ngx_del_timer(&ctx->flush);
    }

    if (ctx->flush.posted) {
        ngx_delete_posted_event(&ctx->flush);
    }

    ngx_close_connection(ctx->connection);
}


void
ngx_http_agent_wake(ngx_str_t *id, ngx_pid_t *pids, ngx_uint_t n)
{
    ngx_uint_t                  i, j, local;
    ngx_http_agent_wake_ctx_t  *ctx;
    ngx_http_agent_wake_msg_t  *msg;

    if (id->len == 0 || id->len > NGX_HTTP_AGENT_ID_LEN) {
        return;
    }

    ctx = ngx_http_agent_wake_ctx;
    local = 0;

    for (i = 0; i < n; i++) {

        if (pids[i] == ngx_pid) {
            local = 1;
            continue;
        }

        if (ctx == NULL) {
            continue;
        }

        for (j = 0; j < ctx->npending; j++) {
            msg = &ctx->pending[j];

            if (msg->pid == pids[i]
                && msg->len == id->len
                && ngx_memcmp(msg->id, id->data, id->len) == 0)
            {
                break;
            }
        }

        if (j < ctx->npending) {
            continue;
        }

        if (ctx->npending == NGX_HTTP_AGENT_WAKE_PENDING) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "agent wake-up of worker %P dropped: "
                          "too many pending", pids[i]);
            continue;
        }

        msg = &ctx->pending[ctx->npending++];

        msg->pid = pids[i];
        msg->tries = 0;
        msg->len = id->len;
        ngx_memcpy(msg->id, id->data, id->len);
    }

    if (ctx && ctx->npending && !ctx->flush.posted) {
        ngx_post_event(&ctx->flush, &ngx_posted_events);
    }

    if (local) {
        ngx_http_agent_wake_handlers.deliver(id);
    }
}


void
ngx_http_agent_wake_written(ngx_pid_t *pids, ngx_uint_t n)
{
#if (NGX_LINUX)

    socklen_t                   len;
    ngx_uint_t                  i;
    struct sockaddr_un          sun;
    ngx_http_agent_wake_ctx_t  *ctx;

    /* set before the pool's threads start, unset once they are gone */

    ctx = ngx_http_agent_wake_ctx;

    if (ctx == NULL) {
        return;
    }

    for (i = 0; i < n; i++) {

        if (pids[i] == ngx_pid) {
            /* this worker's inputs: the batch's end answers them */
            continue;
        }

        len = ngx_http_agent_wake_addr(&sun, pids[i]);

        /* a full queue has a wake-up in it already, a gone worker none */

        (void) sendto(ctx->connection->fd, "", 0, MSG_DONTWAIT,
                      (struct sockaddr *) &sun, len);
    }

#endif
}


#if (NGX_LINUX)

static socklen_t
ngx_http_agent_wake_addr(struct sockaddr_un *sun, ngx_pid_t pid)
{
    u_char  *p;

    ngx_memzero(sun, sizeof(struct sockaddr_un));

    sun->sun_family = AF_UNIX;

    /* abstract: a leading NUL, no file, and gone with the socket */

    p = ngx_sprintf((u_char *) sun->sun_path + 1, "ngx_http_agent_wake:%P",
                    pid);

    return (socklen_t) (p - (u_char *) sun);
}


static void
ngx_http_agent_wake_read_handler(ngx_event_t *rev)
{
    ssize_t            n;
    ngx_str_t          id;
    ngx_err_t          err;
    ngx_uint_t         i, written;
    ngx_connection_t  *c;
    u_char             buf[NGX_HTTP_AGENT_ID_LEN + 1];

    c = rev->data;

    if (c->close) {
        /* a graceful shutdown: end the streams, keep the socket */

        c->close = 0;
        c->idle = 0;

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "agent wake: shutting down, ending event streams");

        ngx_http_agent_wake_handlers.shutdown();
        return;
    }

    written = 0;

    /* level-triggered: what is left is read on the next pass */

    for (i = 0; i < NGX_HTTP_AGENT_WAKE_RECV; i++) {

        n = recv(c->fd, buf, sizeof(buf), 0);

        if (n == -1) {
            err = ngx_socket_errno;

            if (err == NGX_EAGAIN) {
                break;
            }

            if (err == NGX_EINTR) {
                continue;
            }

            ngx_log_error(NGX_LOG_ALERT, c->log, err,
                          "recv() on agent wake-up socket failed");
            break;
        }

        if (n == 0) {
            written = 1;
            continue;
        }

        if (n > NGX_HTTP_AGENT_ID_LEN) {
            continue;
        }

        id.data = buf;
        id.len = n;

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "agent wake: \"%V\"", &id);

        ngx_http_agent_wake_handlers.deliver(&id);

        /* a cancel of a turn this worker runs comes as a wake-up too */
        ngx_http_agent_wake_handlers.cancel(&id);
    }

    if (written) {
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "agent wake: inputs written");

        ngx_http_agent_wake_handlers.written();
    }
}


static void
ngx_http_agent_wake_flush_handler(ngx_event_t *ev)
{
    ngx_uint_t                  i, j;
    ngx_http_agent_wake_ctx_t  *ctx;
    ngx_http_agent_wake_msg_t  *msg;

    ctx = ev->data;

    if (ev->timedout) {
        ev->timedout = 0;
    }

    j = 0;

    for (i = 0; i < ctx->npending; i++) {
        msg = &ctx->pending[i];

        if (ngx_http_agent_wake_send(ctx, msg) != NGX_AGAIN) {
            continue;
        }

        if (++msg->tries == NGX_HTTP_AGENT_WAKE_TRIES) {
            ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                          "agent wake-up of worker %P dropped: "
                          "its queue stays full", msg->pid);
            continue;
        }

        if (i != j) {
            ctx->pending[j] = *msg;
        }

        j++;
    }

    ctx->npending = j;

    if (j && !ev->timer_set) {
        ngx_add_timer(ev, NGX_HTTP_AGENT_WAKE_RETRY);
    }
}


/*
 * a dead worker's subscribers of the conversation are gone with it, and
 * those it served from the store
 */

static void
ngx_http_agent_wake_gone(ngx_http_agent_wake_msg_t *msg)
{
    ngx_str_t                    id;
    ngx_http_agent_sh_t         *sh;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    if (amcf == NULL || amcf->zone == NULL) {
        return;
    }

    id.data = msg->id;
    id.len = msg->len;

    sh = amcf->zone->sh;

    ngx_http_agent_zone_lock(amcf->zone);

    conv = ngx_http_agent_conv_find_locked(amcf->zone, &id);

    if (conv) {
        ngx_http_agent_wake_clear(conv->subs, msg->pid);
        ngx_http_agent_log_rest_locked(amcf->zone, conv);
    }

    if (sh->node && sh->node->followers) {
        ngx_http_agent_wake_clear(sh->node->followers, msg->pid);
    }

    ngx_http_agent_zone_unlock(amcf->zone);
}


static void
ngx_http_agent_wake_clear(ngx_http_agent_sub_worker_t *w, ngx_pid_t pid)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        if (w[i].pid == pid) {
            w[i].count = 0;
            w[i].pid = 0;
        }
    }
}


static ngx_int_t
ngx_http_agent_wake_send(ngx_http_agent_wake_ctx_t *ctx,
    ngx_http_agent_wake_msg_t *msg)
{
    ssize_t             n;
    socklen_t           len;
    ngx_err_t           err;
    struct sockaddr_un  sun;

    len = ngx_http_agent_wake_addr(&sun, msg->pid);

    n = sendto(ctx->connection->fd, msg->id, msg->len, MSG_DONTWAIT,
               (struct sockaddr *) &sun, len);

    if (n != -1) {
        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, ctx->flush.log, 0,
                       "agent wake: sent \"%*s\" to worker %P",
                       msg->len, msg->id, msg->pid);
        return NGX_OK;
    }

    err = ngx_socket_errno;

    if (err == NGX_EAGAIN || err == ENOBUFS || err == NGX_EINTR) {
        return NGX_AGAIN;
    }

    if (err == NGX_ECONNREFUSED || err == NGX_ENOENT) {
        /* the worker is gone; its record in the zone is stale */
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ctx->flush.log, err,
                       "agent wake: worker %P is gone", msg->pid);
        ngx_http_agent_wake_gone(msg);
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_ERR, ctx->flush.log, err,
                  "sendto() of agent wake-up to worker %P failed", msg->pid);

    return NGX_ERROR;
}

#endif
