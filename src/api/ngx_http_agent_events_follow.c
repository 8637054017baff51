
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_events_sub.h"


/*
 * A follower: a subscriber of agent_events on a node (agent_node) for a
 * conversation that another node, alive, owns.  Its revival's claim was
 * refused, so nothing of the conversation is in this node's zone and
 * nothing is claimed: its canonical events are read from the store
 * (the store's follow, on the pool's threads), a page after the cursor
 * at a time, and written out in seq order; the cursor is the last seq
 * written.  It reads again when woken (the node's listener relays the
 * notification of a batch's commit, ngx_http_agent_store_pg_listen.c),
 * and at its heartbeat, every POLL ms at least, in case a notification
 * was lost.
 * A read asked for while one runs is made after it: a commit between
 * the read's snapshot and its end is never missed.  Live events (the
 * deltas of a reply) exist only in the owner's zone: a follower has
 * none.  The stream ends when the conversation is gone from the store.
 *
 * The follower's state is not in the request's pool: a read may end
 * after the request, and a stream of hours must not grow the pool with
 * every read.
 */


#define NGX_HTTP_AGENT_EVENTS_PAGE  NGX_HTTP_AGENT_EVENTS_BATCH


struct ngx_http_agent_events_follow_s {
    ngx_http_agent_events_sub_t     *sub;       /* NULL: it went first */
    ngx_log_t                       *log;

    /* the page read, until its events are sent */
    ngx_pool_t                      *pool;
    ngx_http_agent_event_t         **evs;
    ngx_uint_t                       n;
    ngx_uint_t                       next;

    unsigned                         started:1;
    unsigned                         reading:1;
    unsigned                         again:1;   /* read again after it */
    unsigned                         fresh:1;   /* a read's own pull */
    unsigned                         full:1;    /* more after the page */
    unsigned                         gone:1;
    unsigned                         listed:1;  /* in the zone's followers */
};


static ngx_int_t ngx_http_agent_events_follow_read(
    ngx_http_agent_events_follow_t *f);
static void ngx_http_agent_events_follow_done(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static void ngx_http_agent_events_follow_first(
    ngx_http_agent_events_follow_t *f, ngx_http_agent_store_read_t *rd,
    ngx_int_t rc);
static ngx_uint_t ngx_http_agent_events_follow_bound(ngx_http_request_t *r,
    ngx_http_agent_store_read_t *rd);
static ngx_int_t ngx_http_agent_events_follow_keep(
    ngx_http_agent_events_follow_t *f, ngx_http_agent_store_read_t *rd);
static ngx_int_t ngx_http_agent_events_follow_copy(
    ngx_http_agent_events_sub_t *sub, ngx_chain_t ***ll);
static void ngx_http_agent_events_follow_list(
    ngx_http_agent_events_sub_t *sub);


ngx_int_t
ngx_http_agent_events_follow(ngx_http_agent_events_sub_t *sub)
{
    ngx_http_request_t              *r;
    ngx_http_agent_events_follow_t  *f;

    r = sub->request;

    f = ngx_calloc(sizeof(ngx_http_agent_events_follow_t),
                   r->connection->log);
    if (f == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    f->sub = sub;
    f->log = r->connection->log;
    sub->follow = f;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "agent events: \"%V\" is another node's, followed in "
                   "the store after %uL", &sub->id, sub->seq);

    return ngx_http_agent_store_posted(r,
                                       ngx_http_agent_events_follow_read(f));
}


/* the subscriber ends: a read under way frees what is left when it ends */

void
ngx_http_agent_events_follow_end(ngx_http_agent_events_sub_t *sub)
{
    ngx_http_agent_events_follow_t  *f;

    f = sub->follow;
    sub->follow = NULL;

    if (f->listed) {
        ngx_http_agent_zone_lock(sub->zone);
        ngx_http_agent_workers_remove_locked(sub->zone->sh->node->followers,
                                             ngx_pid);
        ngx_http_agent_zone_unlock(sub->zone);
    }

    if (f->pool) {
        ngx_destroy_pool(f->pool);
    }

    if (f->reading) {
        f->sub = NULL;
        return;
    }

    ngx_free(f);
}


/*
 * What follows the cursor: the page read, then, unless this pull is the
 * read's own and the page was the last, another read
 */

ngx_int_t
ngx_http_agent_events_follow_pull(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t ***ll)
{
    ngx_int_t                        rc;
    ngx_uint_t                       fresh;
    ngx_http_agent_events_follow_t  *f;

    f = sub->follow;

    fresh = f->fresh;
    f->fresh = 0;

    if (f->gone) {
        return NGX_DECLINED;
    }

    rc = ngx_http_agent_events_follow_copy(sub, ll);

    if (rc != NGX_OK || sub->stalled) {
        return rc;
    }

    if (f->reading) {
        f->again = 1;
        return NGX_OK;
    }

    if (!fresh || f->full || f->again) {
        (void) ngx_http_agent_events_follow_read(f);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_events_follow_read(ngx_http_agent_events_follow_t *f)
{
    ngx_int_t                     rc;
    ngx_http_agent_events_sub_t  *sub;

    sub = f->sub;

    rc = ngx_http_agent_store_follow(NULL, &sub->id, sub->seq,
                                     NGX_HTTP_AGENT_EVENTS_PAGE,
                                     ngx_http_agent_events_follow_done, f);

    if (rc == NGX_OK) {
        f->reading = 1;
        f->again = 0;
    }

    /* else the poll tries again */

    return rc;
}


static void
ngx_http_agent_events_follow_done(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data)
{
    ngx_http_agent_events_follow_t *f = data;

    ngx_connection_t             *c;
    ngx_http_request_t           *r;
    ngx_http_agent_events_sub_t  *sub;

    f->reading = 0;
    sub = f->sub;

    if (sub == NULL) {
        ngx_free(f);
        return;
    }

    r = sub->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    if (!f->started) {
        ngx_http_agent_events_follow_first(f, rd, rc);
        ngx_http_run_posted_requests(c);
        return;
    }

    if (rc != NGX_OK) {
        /* logged by the store: the next poll reads again */
        f->again = 0;
        return;
    }

    if (rd->last_seq == 0
        || ngx_http_agent_events_follow_keep(f, rd) != NGX_OK)
    {
        /* the conversation was deleted: the stream ends */
        f->gone = 1;
    }

    f->fresh = 1;

    (void) ngx_http_agent_events_update(sub);

    ngx_http_run_posted_requests(c);
}


/* the first page: the answer, and the stream's start */

static void
ngx_http_agent_events_follow_first(ngx_http_agent_events_follow_t *f,
    ngx_http_agent_store_read_t *rd, ngx_int_t rc)
{
    ngx_chain_t                  *out, **ll;
    ngx_http_request_t           *r;
    ngx_http_agent_events_sub_t  *sub;

    sub = f->sub;
    r = sub->request;

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, ngx_http_agent_store_unread_answer(r));
        return;
    }

    if (rd->last_seq == 0) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_NOT_FOUND, "not_found",
                                      "no such conversation"));
        return;
    }

    if (!ngx_http_agent_events_follow_bound(r, rd)) {
        ngx_http_finalize_request(r, ngx_http_agent_api_foreign(r));
        return;
    }

    f->started = 1;

    /* a cursor past the log's end is its end */

    if (sub->seq > rd->last_seq) {
        sub->seq = rd->last_seq;
    }

    out = NULL;
    ll = &out;

    if (ngx_http_agent_events_follow_keep(f, rd) != NGX_OK
        || ngx_http_agent_events_follow_copy(sub, &ll) != NGX_OK)
    {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rc = ngx_http_agent_events_begin(sub, out);

    if (rc == NGX_DONE && !sub->done) {
        ngx_http_agent_events_follow_list(sub);

        /* the heartbeat polls the store too, more often */
        ngx_add_timer(&sub->heartbeat, NGX_HTTP_AGENT_EVENTS_POLL);

        /* the page was full: the rest follows */

        if (f->full && !sub->stalled) {
            (void) ngx_http_agent_events_follow_read(f);
        }
    }

    ngx_http_finalize_request(r, rc);
}


/* the request's agent and owner are the conversation's, as in the zone */

static ngx_uint_t
ngx_http_agent_events_follow_bound(ngx_http_request_t *r,
    ngx_http_agent_store_read_t *rd)
{
    ngx_str_t  *agent, *owner;

    agent = ngx_http_agent_api_agent(r);

    if (rd->agent.len
        && (agent == NULL || agent->len != rd->agent.len
            || ngx_memcmp(agent->data, rd->agent.data, agent->len) != 0))
    {
        return 0;
    }

    if (ngx_http_agent_api_owner(r, &owner) != NGX_OK) {
        return 0;
    }

    if (owner != NULL
        && (owner->len != rd->owner.len
            || ngx_memcmp(owner->data, rd->owner.data, owner->len) != 0))
    {
        return 0;
    }

    return 1;
}


/* the page read, copied out of the read's pool, which goes */

static ngx_int_t
ngx_http_agent_events_follow_keep(ngx_http_agent_events_follow_t *f,
    ngx_http_agent_store_read_t *rd)
{
    f->full = (rd->events->nelts == NGX_HTTP_AGENT_EVENTS_PAGE);

    if (rd->events->nelts == 0) {
        return NGX_OK;
    }

    f->pool = ngx_create_pool(4096, f->log);
    if (f->pool == NULL) {
        return NGX_ERROR;
    }

    f->evs = ngx_http_agent_revive_events(f->pool, rd->events);
    if (f->evs == NULL) {
        return NGX_ERROR;
    }

    f->n = rd->events->nelts;
    f->next = 0;

    return NGX_OK;
}


/* the page's events, as far as the limit takes them */

static ngx_int_t
ngx_http_agent_events_follow_copy(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t ***ll)
{
    ngx_int_t                        rc;
    ngx_uint_t                       n, used;
    ngx_http_agent_events_follow_t  *f;

    f = sub->follow;

    while (f->next < f->n) {
        n = ngx_min(f->n - f->next, NGX_HTTP_AGENT_EVENTS_BATCH);

        rc = ngx_http_agent_events_stored(sub, f->evs + f->next, n, ll,
                                          &used);
        if (rc != NGX_OK) {
            return rc;
        }

        f->next += used;

        if (used < n) {
            sub->stalled = 1;
            return NGX_OK;
        }
    }

    if (f->pool) {
        ngx_destroy_pool(f->pool);
        f->pool = NULL;
        f->evs = NULL;
        f->n = 0;
        f->next = 0;
    }

    return NGX_OK;
}


/*
 * The worker among the zone's followers: the listener relays the
 * store's notifications to it.  Without a slot, the poll still reads.
 */

static void
ngx_http_agent_events_follow_list(ngx_http_agent_events_sub_t *sub)
{
    ngx_int_t                  rc;
    ngx_http_agent_zone_t     *z;
    ngx_http_agent_node_sh_t  *node;

    z = sub->zone;
    rc = NGX_ERROR;

    ngx_http_agent_zone_lock(z);

    node = ngx_http_agent_zone_node_locked(z);

    if (node && node->followers == NULL) {
        node->followers = ngx_slab_calloc_locked(z->shpool,
                              NGX_HTTP_AGENT_SUB_WORKERS
                              * sizeof(ngx_http_agent_sub_worker_t));
    }

    if (node && node->followers) {
        rc = ngx_http_agent_workers_add_locked(node->followers, ngx_pid);

        if (rc == NGX_DECLINED
            && ngx_http_agent_workers_reap_locked(node->followers))
        {
            rc = ngx_http_agent_workers_add_locked(node->followers, ngx_pid);
        }
    }

    ngx_http_agent_zone_unlock(z);

    sub->follow->listed = (rc == NGX_OK);
}
