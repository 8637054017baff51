
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_detached.h"
#include "ngx_http_agent_notify.h"
#include "ngx_http_agent_store.h"


/*
 * Notifications: when a call starts waiting for a person (approval,
 * elicitation), a POST of its suspension event to the agent's notify
 * location, so that a bot or a mail job can ask and then resolve.
 *
 * What is owed is derived from the zone, not from the turn: every
 * worker's timer walks the conversations with waiting calls and keeps,
 * in the zone, an entry per waiting call (conversation, call, kind).  A
 * worker claims an entry that is due, sends it on a detached request of
 * its own, and records the outcome: delivered (2xx), or due again after
 * a backoff, up to a number of attempts.  A claim of a worker that died
 * is taken over, so a notification is delivered at least once whatever
 * becomes of the worker that suspended the call or the one sending it;
 * it never holds up or fails the turn, which runs on without it.
 */

#define NGX_HTTP_AGENT_NOTIFY_INTERVAL   200
#define NGX_HTTP_AGENT_NOTIFY_ATTEMPTS   6
#define NGX_HTTP_AGENT_NOTIFY_BASE       250
#define NGX_HTTP_AGENT_NOTIFY_CAP        30000
#define NGX_HTTP_AGENT_NOTIFY_BATCH      8


/* a waiting call to notify of, in the zone */
typedef struct {
    ngx_queue_t                   queue;
    u_char                        id[NGX_HTTP_AGENT_ID_LEN];
    size_t                        id_len;
    u_char                        call[NGX_HTTP_AGENT_CALL_ID_LEN];
    size_t                        call_len;
    ngx_uint_t                    kind;
    uint64_t                      deadline;   /* the call's, ms */
    uint64_t                      next;       /* due then, ms */
    ngx_uint_t                    attempts;
    ngx_pid_t                     sending;    /* the worker sending it */
    ngx_uint_t                    done;       /* delivered or given up */
    ngx_uint_t                    seen;       /* the last walk that did */
} ngx_http_agent_notify_entry_t;


typedef struct {
    ngx_queue_t                   entries;
    ngx_uint_t                    walk;
} ngx_http_agent_notify_sh_t;


/* one notification being sent by this worker */
typedef struct {
    /* first: what the filters see of the subrequest's ctx */
    ngx_http_agent_sub_t          sub;

    ngx_pool_t                   *pool;
    ngx_http_request_t           *request;
    ngx_http_agent_zone_t        *zone;
    ngx_str_t                     uri;
    ngx_str_t                     body;
    ngx_uint_t                    status;
    ngx_uint_t                    finished;
    ngx_uint_t                    oneshot;    /* of no waiting call */

    /* a oneshot's end, with the status it was answered (0: none) */
    ngx_http_agent_notify_pt      handler;
    void                         *data;
    ngx_event_t                   event;
    ngx_event_t                   deadline;   /* a oneshot's, if any */
    ngx_log_t                     log;
    ngx_http_log_ctx_t            log_ctx;
    ngx_http_conf_ctx_t           conf_ctx;

    u_char                        id[NGX_HTTP_AGENT_ID_LEN];
    size_t                        id_len;
    u_char                        call[NGX_HTTP_AGENT_CALL_ID_LEN];
    size_t                        call_len;
    ngx_uint_t                    kind;
    ngx_str_t                     agent;
    u_char                        owner[NGX_HTTP_AGENT_OWNER_LEN];
    size_t                        owner_len;
} ngx_http_agent_notify_t;


static void ngx_http_agent_notify_timer(ngx_event_t *ev);
static void ngx_http_agent_notify_durable(ngx_http_agent_notify_t *n);
static uint64_t ngx_http_agent_notify_now(void);
static ngx_http_agent_notify_entry_t *ngx_http_agent_notify_find_locked(
    ngx_http_agent_notify_sh_t *nsh, u_char *id, size_t id_len, u_char *call,
    size_t call_len, ngx_uint_t kind);
static ngx_http_agent_notify_sh_t *ngx_http_agent_notify_sh_locked(
    ngx_http_agent_zone_t *z);
static ngx_uint_t ngx_http_agent_notify_walk_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_notify_sh_t *nsh, ngx_http_agent_notify_t **jobs);
static ngx_http_agent_notify_entry_t *ngx_http_agent_notify_entry_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_notify_sh_t *nsh,
    ngx_http_agent_conv_t *conv, ngx_http_agent_pending_t *p);
static void ngx_http_agent_notify_sweep_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_notify_sh_t *nsh);
static ngx_str_t *ngx_http_agent_notify_uri(ngx_http_agent_conv_t *conv,
    ngx_http_agent_t **agent);
static ngx_http_agent_notify_t *ngx_http_agent_notify_job_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_notify_entry_t *e, ngx_http_agent_t *agent,
    ngx_str_t *uri);
static void ngx_http_agent_notify_send(ngx_http_agent_notify_t *n);
static ngx_int_t ngx_http_agent_notify_start(ngx_http_agent_notify_t *n,
    ngx_keyval_t *h, ngx_uint_t nh);
static void ngx_http_agent_notify_log(ngx_http_agent_notify_t *n,
    ngx_pool_t *pool);
static ngx_int_t ngx_http_agent_notify_done(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_agent_notify_finish(ngx_event_t *ev);
static void ngx_http_agent_notify_expire(ngx_event_t *ev);
static void ngx_http_agent_notify_record(ngx_http_agent_notify_t *n,
    ngx_uint_t delivered);
static ngx_int_t ngx_http_agent_notify_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_notify_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static u_char *ngx_http_agent_notify_log_error(ngx_log_t *log, u_char *buf,
    size_t len);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;

static ngx_event_t  ngx_http_agent_notify_event;


/* above the turn's filters: a notification's answer goes nowhere */

ngx_int_t
ngx_http_agent_notify_init_filters(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_agent_notify_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_agent_notify_body_filter;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_notify_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                   i, any;
    ngx_http_agent_t           **agents;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);

    any = amcf->notify.len;
    agents = amcf->agents.elts;

    for (i = 0; i < amcf->agents.nelts; i++) {
        any += agents[i]->notify.len;
    }

    if (any == 0) {
        return NGX_OK;
    }

    ngx_memzero(&ngx_http_agent_notify_event, sizeof(ngx_event_t));

    ngx_http_agent_notify_event.handler = ngx_http_agent_notify_timer;
    ngx_http_agent_notify_event.log = cycle->log;
    ngx_http_agent_notify_event.data = amcf->zone;
    ngx_http_agent_notify_event.cancelable = 1;

    ngx_add_timer(&ngx_http_agent_notify_event,
                  NGX_HTTP_AGENT_NOTIFY_INTERVAL);

    return NGX_OK;
}


static void
ngx_http_agent_notify_timer(ngx_event_t *ev)
{
    ngx_http_agent_zone_t  *z = ev->data;

    ngx_uint_t                   i, n;
    ngx_http_agent_notify_t     *jobs[NGX_HTTP_AGENT_NOTIFY_BATCH];
    ngx_http_agent_notify_sh_t  *nsh;

    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    n = 0;

    ngx_http_agent_zone_lock(z);

    nsh = ngx_http_agent_notify_sh_locked(z);

    if (nsh) {
        n = ngx_http_agent_notify_walk_locked(z, nsh, jobs);
        ngx_http_agent_notify_sweep_locked(z, nsh);
    }

    ngx_http_agent_zone_unlock(z);

    for (i = 0; i < n; i++) {
        ngx_http_agent_notify_send(jobs[i]);
    }

    ngx_add_timer(ev, NGX_HTTP_AGENT_NOTIFY_INTERVAL);
}


/* the entries' list, made by the first worker that needs it */

static ngx_http_agent_notify_sh_t *
ngx_http_agent_notify_sh_locked(ngx_http_agent_zone_t *z)
{
    ngx_http_agent_notify_sh_t  *nsh;

    if (z->sh->notify) {
        return z->sh->notify;
    }

    nsh = ngx_http_agent_zone_try_alloc_locked(z, NULL,
                                         sizeof(ngx_http_agent_notify_sh_t));
    if (nsh == NULL) {
        return NULL;
    }

    ngx_queue_init(&nsh->entries);
    nsh->walk = 0;

    z->sh->notify = nsh;

    return nsh;
}


/*
 * Each call that waits for a person has its entry; those due, claimed
 * by this worker, become jobs (at most a batch a walk)
 */

static ngx_uint_t
ngx_http_agent_notify_walk_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_notify_sh_t *nsh, ngx_http_agent_notify_t **jobs)
{
    uint64_t                        now;
    ngx_str_t                      *uri;
    ngx_uint_t                      i, n;
    ngx_queue_t                    *q;
    ngx_http_agent_t               *agent;
    ngx_http_agent_conv_t          *conv;
    ngx_http_agent_pending_t       *p;
    ngx_http_agent_notify_entry_t  *e;

    now = ngx_http_agent_notify_now();

    nsh->walk++;
    n = 0;

    for (q = ngx_queue_head(&z->sh->waiting);
         q != ngx_queue_sentinel(&z->sh->waiting);
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, waiting);

        uri = ngx_http_agent_notify_uri(conv, &agent);
        if (uri == NULL) {
            continue;
        }

        for (i = 0; conv->pending && i < conv->pending_slots; i++) {
            p = &conv->pending[i];

            if (p->kind != NGX_HTTP_AGENT_PENDING_APPROVAL
                && p->kind != NGX_HTTP_AGENT_PENDING_ELICITATION)
            {
                continue;
            }

            e = ngx_http_agent_notify_entry_locked(z, nsh, conv, p);

            if (e == NULL || e->done || e->next > now
                || n == NGX_HTTP_AGENT_NOTIFY_BATCH)
            {
                continue;
            }

            if (e->sending && ngx_http_agent_pid_alive(e->sending)) {
                continue;
            }

            jobs[n] = ngx_http_agent_notify_job_locked(z, conv, e, agent,
                                                       uri);
            if (jobs[n]) {
                e->sending = ngx_pid;
                n++;
            }
        }
    }

    return n;
}


static ngx_http_agent_notify_entry_t *
ngx_http_agent_notify_entry_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_notify_sh_t *nsh, ngx_http_agent_conv_t *conv,
    ngx_http_agent_pending_t *p)
{
    ngx_http_agent_notify_entry_t  *e;

    e = ngx_http_agent_notify_find_locked(nsh, conv->id, conv->id_len, p->id,
                                          p->id_len, p->kind);
    if (e) {
        e->seen = nsh->walk;
        return e;
    }

    e = ngx_http_agent_zone_try_alloc_locked(z, conv,
                                      sizeof(ngx_http_agent_notify_entry_t));
    if (e == NULL) {
        return NULL;
    }

    ngx_memzero(e, sizeof(ngx_http_agent_notify_entry_t));

    ngx_memcpy(e->id, conv->id, conv->id_len);
    e->id_len = conv->id_len;
    ngx_memcpy(e->call, p->id, p->id_len);
    e->call_len = p->id_len;
    e->kind = p->kind;
    e->deadline = p->deadline;
    e->seen = nsh->walk;

    ngx_queue_insert_tail(&nsh->entries, &e->queue);

    return e;
}


/*
 * An entry whose call no longer waits goes, unless it is being sent; one
 * delivered stays until its deadline, so that its conversation, evicted
 * and revived meanwhile, is not notified again
 */

static void
ngx_http_agent_notify_sweep_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_notify_sh_t *nsh)
{
    uint64_t                        now;
    ngx_queue_t                    *q, *next;
    ngx_http_agent_notify_entry_t  *e;

    now = ngx_http_agent_notify_now();

    for (q = ngx_queue_head(&nsh->entries);
         q != ngx_queue_sentinel(&nsh->entries);
         q = next)
    {
        next = ngx_queue_next(q);
        e = ngx_queue_data(q, ngx_http_agent_notify_entry_t, queue);

        if (e->seen == nsh->walk
            || (e->sending && ngx_http_agent_pid_alive(e->sending))
            || (e->done && e->deadline > now))
        {
            continue;
        }

        ngx_queue_remove(q);
        ngx_slab_free_locked(z->shpool, e);
    }
}


/* the agent's notify location, or the http level's; NULL: none */

static ngx_str_t *
ngx_http_agent_notify_uri(ngx_http_agent_conv_t *conv,
    ngx_http_agent_t **agent)
{
    ngx_str_t                    name;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    name.data = conv->agent;
    name.len = conv->agent_len;

    *agent = ngx_http_agent_conf_find(amcf, &name);

    if (*agent == NULL || (*agent)->conf_ctx == NULL) {
        return NULL;
    }

    if ((*agent)->notify.len) {
        return &(*agent)->notify;
    }

    return amcf->notify.len ? &amcf->notify : NULL;
}


/* the suspension event's JSON and who it is for, copied out of the zone */

static ngx_http_agent_notify_t *
ngx_http_agent_notify_job_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_notify_entry_t *e,
    ngx_http_agent_t *agent, ngx_str_t *uri)
{
    u_char                   *p, *last, call[NGX_HTTP_AGENT_CALL_ID_LEN + 32],
                              kind[32];
    size_t                    len, kind_len;
    ngx_pool_t               *pool;
    ngx_queue_t              *q;
    ngx_http_agent_event_t   *ev;
    ngx_http_agent_notify_t  *n;

    last = ngx_sprintf(call, "\"tool_call_id\":\"%*s\"", e->call_len,
                       e->call);
    len = last - call;

    last = ngx_sprintf(kind, "\"kind\":\"%V\"",
                       &ngx_http_agent_pending_kinds[e->kind]);
    kind_len = last - kind;

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->type != NGX_HTTP_AGENT_EV_SUSPENSION
            || ngx_strlcasestrn(ev->data, ev->data + ev->len, call, len - 1)
               == NULL
            || ngx_strlcasestrn(ev->data, ev->data + ev->len, kind,
                                kind_len - 1)
               == NULL)
        {
            continue;
        }

        pool = ngx_create_pool(4096, ngx_cycle->log);
        if (pool == NULL) {
            return NULL;
        }

        n = ngx_pcalloc(pool, sizeof(ngx_http_agent_notify_t));
        p = ngx_pnalloc(pool, ev->len);

        if (n == NULL || p == NULL) {
            ngx_destroy_pool(pool);
            return NULL;
        }

        ngx_memcpy(p, ev->data, ev->len);
        n->body.data = p;
        n->body.len = ev->len;

        n->zone = z;
        n->uri = *uri;
        n->agent = agent->name;
        n->conf_ctx = *agent->conf_ctx;
        n->kind = e->kind;

        ngx_memcpy(n->id, e->id, e->id_len);
        n->id_len = e->id_len;
        ngx_memcpy(n->call, e->call, e->call_len);
        n->call_len = e->call_len;
        ngx_memcpy(n->owner, conv->owner, conv->owner_len);
        n->owner_len = conv->owner_len;

        ngx_http_agent_notify_log(n, pool);

        return n;
    }

    return NULL;
}


static void
ngx_http_agent_notify_send(ngx_http_agent_notify_t *n)
{
    u_char                      *p;
    ngx_str_t                    kind;
    ngx_uint_t                   nh;
    ngx_keyval_t                 h[5];

    n->request = ngx_http_agent_detached_create(n->pool, &n->log,
                                                &n->log_ctx, &n->conf_ctx);
    if (n->request == NULL) {
        ngx_http_agent_notify_record(n, 0);
        ngx_destroy_pool(n->pool);
        return;
    }

    kind = ngx_http_agent_pending_kinds[n->kind];

    p = ngx_pnalloc(n->request->pool,
                    n->id_len + n->call_len + kind.len + 2);

    if (p == NULL) {
        goto failed;
    }

    ngx_str_set(&h[0].key, "X-Agent-Conversation");
    h[0].value.data = n->id;
    h[0].value.len = n->id_len;

    ngx_str_set(&h[1].key, "X-Agent-Agent");
    h[1].value = n->agent;

    ngx_str_set(&h[2].key, "X-Agent-Tool-Call");
    h[2].value.data = n->call;
    h[2].value.len = n->call_len;

    /* the same for every attempt at the same notification */

    ngx_str_set(&h[3].key, "Idempotency-Key");
    h[3].value.data = p;
    h[3].value.len = ngx_sprintf(p, "%*s:%*s:%V", n->id_len, n->id,
                                 n->call_len, n->call, &kind)
                     - p;

    nh = 4;

    if (n->owner_len) {
        ngx_str_set(&h[4].key, "X-Agent-Owner");
        h[4].value.data = n->owner;
        h[4].value.len = n->owner_len;
        nh++;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &n->log, 0,
                   "agent notify \"%V\": to \"%V\"", &h[3].value, &n->uri);

    if (ngx_http_agent_notify_start(n, h, nh) == NGX_OK) {
        return;
    }

failed:

    ngx_log_error(NGX_LOG_ERR, &n->log, 0, "agent notify could not send");

    ngx_http_agent_notify_record(n, 0);
    ngx_http_agent_detached_close(n->request);
}


/* the POST, on the notification's request */

static ngx_int_t
ngx_http_agent_notify_start(ngx_http_agent_notify_t *n, ngx_keyval_t *h,
    ngx_uint_t nh)
{
    ngx_http_request_t          *sr;
    ngx_http_post_subrequest_t  *ps;

    ps = ngx_palloc(n->request->pool, sizeof(ngx_http_post_subrequest_t));
    if (ps == NULL) {
        return NGX_ERROR;
    }

    ps->handler = ngx_http_agent_notify_done;
    ps->data = n;

    if (ngx_http_agent_detached_subrequest(n->request, &n->uri, &n->body, h,
                                           nh, ps, &sr)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    n->sub.kind = NGX_HTTP_AGENT_SUB_NOTIFY;
    n->sub.sr = sr;
    ngx_http_set_ctx(sr, n, ngx_http_agent_module);

    ngx_http_run_posted_requests(n->request->connection);

    return NGX_OK;
}


/*
 * A POST on a request of its own, sent once, whose answer goes nowhere:
 * a message that must reach a server after the turn that sends it is
 * gone (an MCP server's notifications/cancelled).  timeout, if not 0,
 * bounds the whole exchange: an answer that never ends is cut there.
 */

ngx_int_t
ngx_http_agent_notify_post(ngx_http_agent_t *agent, ngx_str_t *uri,
    ngx_str_t *body, ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_msec_t timeout)
{
    return ngx_http_agent_notify_post_handler(agent, uri, body, headers,
                                              nheaders, timeout, NULL, NULL);
}


/*
 * The same, and handler is told how it ended, unless this fails: the
 * caller learns of the exchange once, either way
 */

ngx_int_t
ngx_http_agent_notify_post_handler(ngx_http_agent_t *agent, ngx_str_t *uri,
    ngx_str_t *body, ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_msec_t timeout, ngx_http_agent_notify_pt handler, void *data)
{
    ngx_uint_t                i;
    ngx_pool_t               *pool;
    ngx_keyval_t             *h;
    ngx_http_agent_notify_t  *n;

    if (agent->conf_ctx == NULL) {
        return NGX_ERROR;
    }

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    n = ngx_pcalloc(pool, sizeof(ngx_http_agent_notify_t));
    h = ngx_palloc(pool, (nheaders + 1) * sizeof(ngx_keyval_t));

    if (n == NULL || h == NULL) {
        goto failed;
    }

    n->body.data = ngx_pstrdup(pool, body);
    n->uri.data = ngx_pstrdup(pool, uri);

    if (n->body.data == NULL || n->uri.data == NULL) {
        goto failed;
    }

    n->body.len = body->len;
    n->uri.len = uri->len;

    for (i = 0; i < nheaders; i++) {
        h[i].key = headers[i].key;
        h[i].value.len = headers[i].value.len;
        h[i].value.data = ngx_pstrdup(pool, &headers[i].value);

        if (h[i].value.data == NULL) {
            goto failed;
        }
    }

    n->oneshot = 1;
    n->handler = handler;
    n->data = data;
    n->agent = agent->name;
    n->conf_ctx = *agent->conf_ctx;

    ngx_http_agent_notify_log(n, pool);

    n->request = ngx_http_agent_detached_create(pool, &n->log, &n->log_ctx,
                                                &n->conf_ctx);
    if (n->request == NULL) {
        goto failed;
    }

    if (ngx_http_agent_notify_start(n, h, nheaders) != NGX_OK) {
        n->handler = NULL;
        ngx_http_agent_detached_close(n->request);
        return NGX_ERROR;
    }

    if (timeout && !n->finished) {
        n->deadline.handler = ngx_http_agent_notify_expire;
        n->deadline.data = n;
        n->deadline.log = &n->log;

        ngx_add_timer(&n->deadline, timeout);
    }

    return NGX_OK;

failed:

    ngx_destroy_pool(pool);

    return NGX_ERROR;
}


static ngx_int_t
ngx_http_agent_notify_done(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_agent_notify_t  *n = data;

    if (n->finished) {
        return rc;
    }

    n->finished = 1;

    if (n->status == 0 && rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        n->status = rc;
    }

    /* the request is closed once nginx is done with the subrequest */

    n->event.handler = ngx_http_agent_notify_finish;
    n->event.data = n;
    n->event.log = &n->log;

    ngx_post_event(&n->event, &ngx_posted_events);

    return ngx_http_agent_detached_rc(rc);
}


static void
ngx_http_agent_notify_finish(ngx_event_t *ev)
{
    ngx_http_agent_notify_t  *n = ev->data;

    n->sub.sr = NULL;

    if (n->deadline.timer_set) {
        ngx_del_timer(&n->deadline);
    }

    if (n->oneshot) {
        if (n->status < NGX_HTTP_OK
            || n->status >= NGX_HTTP_SPECIAL_RESPONSE)
        {
            ngx_log_error(NGX_LOG_WARN, &n->log, 0,
                          "agent: \"%V\" answered %ui", &n->uri,
                          n->status);
        }

        if (n->handler) {
            n->handler(n->data, n->status);
        }

    } else {
        ngx_http_agent_notify_record(n, n->status >= NGX_HTTP_OK
                                     && n->status
                                        < NGX_HTTP_SPECIAL_RESPONSE);
    }

    ngx_http_agent_detached_close(n->request);
}


/* a oneshot past its timeout: its request, and the subrequest, closed */

static void
ngx_http_agent_notify_expire(ngx_event_t *ev)
{
    ngx_http_agent_notify_t  *n = ev->data;

    if (n->finished) {
        /* its end is posted */
        return;
    }

    n->finished = 1;
    n->sub.sr = NULL;

    ngx_log_error(NGX_LOG_WARN, &n->log, 0,
                  "agent: \"%V\" did not answer in time", &n->uri);

    if (n->handler) {
        n->handler(n->data, 0);
    }

    ngx_http_agent_detached_close(n->request);
}


static ngx_http_agent_notify_entry_t *
ngx_http_agent_notify_find_locked(ngx_http_agent_notify_sh_t *nsh,
    u_char *id, size_t id_len, u_char *call, size_t call_len,
    ngx_uint_t kind)
{
    ngx_queue_t                    *q;
    ngx_http_agent_notify_entry_t  *e;

    for (q = ngx_queue_head(&nsh->entries);
         q != ngx_queue_sentinel(&nsh->entries);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_notify_entry_t, queue);

        if (e->kind == kind
            && ngx_memn2cmp(e->call, call, e->call_len, call_len) == 0
            && ngx_memn2cmp(e->id, id, e->id_len, id_len) == 0)
        {
            return e;
        }
    }

    return NULL;
}


/* ms since the epoch, as deadlines are kept */

static uint64_t
ngx_http_agent_notify_now(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec;
}


/* delivered, or due again after a backoff, or given up */

static void
ngx_http_agent_notify_record(ngx_http_agent_notify_t *n,
    ngx_uint_t delivered)
{
    uint64_t                        now;
    ngx_uint_t                      given_up;
    ngx_msec_t                      delay;
    ngx_http_agent_notify_entry_t  *e;

    now = ngx_http_agent_notify_now();
    given_up = 0;

    ngx_http_agent_zone_lock(n->zone);

    e = ngx_http_agent_notify_find_locked(n->zone->sh->notify, n->id,
                                          n->id_len, n->call, n->call_len,
                                          n->kind);
    if (e) {
        e->sending = 0;
        e->attempts++;

        if (delivered || e->attempts >= NGX_HTTP_AGENT_NOTIFY_ATTEMPTS) {
            given_up = !delivered;
            e->done = 1;

        } else {
            delay = NGX_HTTP_AGENT_NOTIFY_BASE << (e->attempts - 1);
            e->next = now + ngx_min(delay, NGX_HTTP_AGENT_NOTIFY_CAP);
        }
    }

    ngx_http_agent_zone_unlock(n->zone);

    if (delivered) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, &n->log, 0,
                       "agent notify: delivered to \"%V\"", &n->uri);

        if (!n->oneshot) {
            ngx_http_agent_notify_durable(n);
        }

        return;
    }

    ngx_log_error(NGX_LOG_WARN, &n->log, 0,
                  "agent notify: \"%V\" answered %ui%s", &n->uri, n->status,
                  given_up ? ", given up" : "");
}


/* the store keeps it: a node that revives the conversation does not send it */

static void
ngx_http_agent_notify_durable(ngx_http_agent_notify_t *n)
{
    ngx_str_t  id, call;

    id.data = n->id;
    id.len = n->id_len;
    call.data = n->call;
    call.len = n->call_len;

    ngx_http_agent_store_notified(&id, &call,
                                  &ngx_http_agent_pending_kinds[n->kind]);
}


void
ngx_http_agent_notify_restored_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_array_t *notified)
{
    ngx_uint_t                        i, kind;
    ngx_http_agent_pending_t         *p;
    ngx_http_agent_notify_sh_t       *nsh;
    ngx_http_agent_notify_entry_t    *e;
    ngx_http_agent_store_notified_t  *nt;

    if (notified == NULL || notified->nelts == 0) {
        return;
    }

    nsh = ngx_http_agent_notify_sh_locked(z);
    if (nsh == NULL) {
        return;
    }

    nt = notified->elts;

    for (i = 0; i < notified->nelts; i++) {
        p = ngx_http_agent_conv_pending_locked(conv, &nt[i].call);

        if (p == NULL) {
            continue;
        }

        for (kind = 1; kind < 4; kind++) {
            if (ngx_http_agent_pending_kinds[kind].len == nt[i].kind.len
                && ngx_strncmp(ngx_http_agent_pending_kinds[kind].data,
                               nt[i].kind.data, nt[i].kind.len)
                   == 0)
            {
                break;
            }
        }

        if (kind != p->kind) {
            continue;
        }

        e = ngx_http_agent_notify_entry_locked(z, nsh, conv, p);

        if (e) {
            /* delivered: kept until the call's deadline, as here */
            e->done = 1;
        }
    }
}


static ngx_int_t
ngx_http_agent_notify_header_filter(ngx_http_request_t *r)
{
    ngx_http_agent_sub_t     *sub;
    ngx_http_agent_notify_t  *n;

    sub = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (sub == NULL || r != sub->sr || sub->kind != NGX_HTTP_AGENT_SUB_NOTIFY)
    {
        return ngx_http_next_header_filter(r);
    }

    n = (ngx_http_agent_notify_t *) sub;
    n->status = r->headers_out.status;

    r->header_sent = 1;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_notify_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_buf_t             *b;
    ngx_chain_t           *cl;
    ngx_http_agent_sub_t  *sub;

    sub = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (sub == NULL || r != sub->sr || sub->kind != NGX_HTTP_AGENT_SUB_NOTIFY)
    {
        return ngx_http_next_body_filter(r, in);
    }

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        b->pos = b->last;

        if (b->in_file) {
            b->file_pos = b->file_last;
        }
    }

    return NGX_OK;
}


/* the notification's log, and its pool's, say what it is for */

static void
ngx_http_agent_notify_log(ngx_http_agent_notify_t *n, ngx_pool_t *pool)
{
    n->log = *ngx_cycle->log;
    n->log.handler = ngx_http_agent_notify_log_error;
    n->log.data = &n->log_ctx;
    n->log.action = NULL;
    pool->log = &n->log;

    n->pool = pool;
}


static u_char *
ngx_http_agent_notify_log_error(ngx_log_t *log, u_char *buf, size_t len)
{
    ngx_http_agent_notify_t  *n;

    n = (ngx_http_agent_notify_t *)
            ((u_char *) log->data - offsetof(ngx_http_agent_notify_t,
                                             log_ctx));

    return ngx_snprintf(buf, len, ", agent notify: conversation: \"%*s\", "
                        "call: \"%*s\"", n->id_len, n->id, n->call_len,
                        n->call);
}
