
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_events_sub.h"
#include "ngx_http_agent_partial.h"


/*
 * agent_events: a conversation's events as Server-Sent Events.  The
 * canonical events after the one the client names (Last-Event-ID or
 * ?after=), taken from the log, then everything new as it happens.
 *
 * A worker keeps its subscribers by conversation (a topic per id in a
 * process-local rbtree) and registers its pid with the conversation in
 * the zone.  Whoever adds events wakes the workers registered there
 * (ngx_http_agent_wake.c); each subscriber of the conversation then
 * copies what follows its own cursor out of the zone and sends it.
 * Subscribers pull: a lost or late wake-up costs latency, never an event,
 * and the heartbeat timer pulls too.
 *
 * A subscriber that comes in while a model call streams gets the reply
 * so far (ngx_http_agent_partial.c) as one streaming_message live event
 * where its cursor reaches the end of the log, and the deltas after it.
 *
 * The registry is per process, not per cycle: a worker serves one cycle
 * for its whole life, and a reload starts new workers with empty ones.
 */


/* free buffers kept after a burst */
#define NGX_HTTP_AGENT_EVENTS_KEEP       2


typedef struct {
    ngx_rbtree_t                     rbtree;
    ngx_rbtree_node_t                sentinel;
} ngx_http_agent_events_local_t;


static ngx_int_t ngx_http_agent_events_send(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t *out);
static void ngx_http_agent_events_more(ngx_http_agent_events_sub_t *sub);
static void ngx_http_agent_events_finish(ngx_http_agent_events_sub_t *sub);
static void ngx_http_agent_events_close(ngx_http_agent_events_sub_t *sub,
    ngx_int_t rc);
static ngx_int_t ngx_http_agent_events_subscribe(
    ngx_http_agent_events_sub_t *sub);
static void ngx_http_agent_events_unregister(
    ngx_http_agent_events_sub_t *sub);
static void ngx_http_agent_events_cleanup(void *data);
static ngx_http_agent_events_sub_t *ngx_http_agent_events_sub(
    ngx_http_request_t *r);
static void ngx_http_agent_events_wake_handler(ngx_event_t *ev);
static void ngx_http_agent_events_heartbeat_handler(ngx_event_t *ev);
static void ngx_http_agent_events_write_handler(ngx_http_request_t *r);


static ngx_http_agent_events_local_t  ngx_http_agent_events_local;

static u_char  ngx_http_agent_events_ping[] = ": heartbeat\n\n";



ngx_int_t
ngx_http_agent_events_handler(ngx_http_request_t *r)
{
    uint64_t   after;
    ngx_int_t  rc;
    ngx_str_t  id;

    /* a node whose lease lapsed drops its zone first (agent_node) */
    (void) ngx_http_agent_revive_lease();

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_agent_events_request_not_allowed(r);
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    rc = ngx_http_agent_api_conversation_id(r, &id);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED || id.len == 0 || id.len > NGX_HTTP_AGENT_ID_LEN) {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_conversation",
                                         "the conversation id is missing "
                                         "or invalid");
    }

    if (ngx_http_agent_events_request_after(r, &after) != NGX_OK) {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_argument",
                                         "Last-Event-ID and \"after\" "
                                         "must be event sequence numbers");
    }

    return ngx_http_agent_events_stream(r, &id, after,
                                        &ngx_http_agent_format_sse, 0);
}


/*
 * The stream of conversation id after the canonical event "after", in
 * a format.  With NGX_HTTP_AGENT_EVENTS_TURN, the running turn's stream
 * from its user_msg on, or 204 when no turn runs; "after" is not used.
 */

ngx_int_t
ngx_http_agent_events_stream(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t after, ngx_http_agent_events_format_t *format, ngx_uint_t flags)
{
    uint64_t                      base;
    ngx_int_t                     rc;
    ngx_str_t                    *owner;
    ngx_chain_t                  *out, **ll;
    ngx_pool_cleanup_t           *cln;
    ngx_http_agent_zone_t        *z;
    ngx_http_agent_conv_t        *conv;
    ngx_http_agent_loc_conf_t    *alcf;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_events_sub_t  *sub;
    ngx_http_agent_revive_ctx_t  *ctx;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    z = amcf->zone;

    if (z == NULL) {
        return ngx_http_agent_json_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                         "internal_error",
                                         "no agent_zone is configured");
    }

    rc = ngx_http_agent_api_owner(r, &owner);

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_api_anonymous(r);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    sub = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_events_sub_t));
    if (sub == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    sub->request = r;
    sub->zone = z;
    sub->format = format;
    sub->id.data = sub->id_data;
    sub->id.len = id->len;
    ngx_memcpy(sub->id_data, id->data, id->len);
    sub->seq = after;
    sub->interval = amcf->heartbeat;
    sub->limit = alcf->events_buffer;
    sub->written = (amcf->node != NULL && amcf->store != NULL);

    /* set before the pid is registered: every way out unregisters it */

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_agent_events_cleanup;
    cln->data = sub;

    if (format->init(sub) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    out = NULL;
    ll = &out;

    /*
     * The snapshot and the position the live tail starts after are taken
     * under one lock: nothing falls between them, nothing is in both.
     */

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &sub->id);

    /* the history the zone gave up is read from the store first */

    ctx = ngx_http_agent_revive_ctx(r);
    base = conv ? conv->base : 0;

    if (conv && (flags & NGX_HTTP_AGENT_EVENTS_TURN)) {
        after = conv->turn_seq;
        sub->seq = after;
    }

    /* a cursor past the log's end is its end: no later event is skipped */

    if (conv && after > conv->seq) {
        after = conv->seq;
        sub->seq = after;
    }

    if (conv == NULL) {
        rc = NGX_HTTP_NOT_FOUND;

    } else if (ngx_http_agent_conv_bound_locked(conv,
                                                ngx_http_agent_api_agent(r),
                                                owner)
               != NGX_OK)
    {
        rc = NGX_HTTP_FORBIDDEN;

    } else if ((flags & NGX_HTTP_AGENT_EVENTS_TURN)
               && (conv->state == NGX_HTTP_AGENT_IDLE
                   || conv->state == NGX_HTTP_AGENT_AWAITING_INPUT))
    {
        rc = NGX_HTTP_NO_CONTENT;

    } else if (r->header_only) {
        rc = NGX_OK;

    } else if (base > after
               && (ctx == NULL || ctx->nhistory == 0 || ctx->after != after
                   || ctx->upto != base))
    {
        rc = NGX_AGAIN;

    } else if (ngx_http_agent_conv_sub_add_locked(conv, ngx_pid) != NGX_OK) {
        rc = NGX_HTTP_SERVICE_UNAVAILABLE;

    } else {
        sub->registered = 1;
        sub->live = conv->pos;
        rc = NGX_OK;

        if (base > after) {
            rc = ngx_http_agent_events_history_locked(sub, ctx, &ll);
        }

        if (rc == NGX_OK && !sub->stalled) {
            rc = ngx_http_agent_events_snapshot_locked(sub, conv, &ll);
        }

        sub->partial = 1;

        /* (behind an event not written yet, both wait for the pull) */

        if (rc == NGX_OK && !sub->stalled && sub->pos == conv->pos) {
            rc = ngx_http_agent_events_partial_locked(sub, conv, &ll);
        }

        if (rc == NGX_OK && !sub->stalled) {
            rc = ngx_http_agent_events_caught_up_locked(sub, conv, &ll);
        }
    }

    ngx_http_agent_zone_unlock(z);

    if (rc == NGX_HTTP_NOT_FOUND) {

        /*
         * agent_events on a node: a conversation another node owns is
         * followed in the store (ngx_http_agent_events_follow.c)
         */

        if (format == &ngx_http_agent_format_sse
            && !(flags & NGX_HTTP_AGENT_EVENTS_TURN))
        {
            ctx = ngx_http_agent_revive_follower(r);
            if (ctx == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            if (ctx->elsewhere) {
                return ngx_http_agent_events_follow(sub);
            }
        }

        return ngx_http_agent_revive_not_found(r, &sub->id);
    }

    if (rc == NGX_HTTP_NO_CONTENT) {
        r->header_only = 1;
        r->headers_out.status = NGX_HTTP_NO_CONTENT;
        r->headers_out.content_length_n = 0;
        return ngx_http_send_header(r);
    }

    if (rc == NGX_HTTP_FORBIDDEN) {
        /* another agent's conversation: as if there were none */
        return ngx_http_agent_api_foreign(r);
    }

    if (rc == NGX_AGAIN) {
        return ngx_http_agent_revive_history(r, &sub->id, after, base);
    }

    if (rc == NGX_HTTP_SERVICE_UNAVAILABLE) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "agent zone \"%V\": too many workers subscribe to "
                      "conversation \"%V\"",
                      &z->shm_zone->shm.name, &sub->id);

        return ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                         "unavailable",
                                         "too many subscribers");
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_events_begin(sub, out);
}


/*
 * The stream's start: the header, the subscriber in the worker's topics,
 * what it has so far (out), and then its wake-ups and heartbeats
 */

ngx_int_t
ngx_http_agent_events_begin(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t *out)
{
    ngx_int_t                  rc;
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = sub->request;

    rc = ngx_http_agent_events_request_header(r, sub->format);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    if (ngx_http_agent_events_subscribe(sub) != NGX_OK) {
        return NGX_ERROR;
    }

    c = r->connection;

    /* frames are small and must not wait for the client's delayed ACK */

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (clcf->tcp_nodelay && ngx_tcp_nodelay(c) != NGX_OK) {
        return NGX_ERROR;
    }

    sub->wake.handler = ngx_http_agent_events_wake_handler;
    sub->wake.data = sub;
    sub->wake.log = c->log;

    sub->heartbeat.handler = ngx_http_agent_events_heartbeat_handler;
    sub->heartbeat.data = sub;
    sub->heartbeat.log = c->log;
    sub->heartbeat.cancelable = 1;

    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_agent_events_write_handler;

    sub->sent = ngx_current_msec;

    if (out == NULL) {
        /* the header goes out now, not with the first event */

        rc = ngx_http_send_special(r, NGX_HTTP_FLUSH);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    if (ngx_http_agent_events_send(sub, out) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_agent_events_more(sub);

    if (sub->last || ngx_exiting || ngx_terminate) {
        ngx_http_agent_events_unregister(sub);
        return ngx_http_send_special(r, NGX_HTTP_LAST);
    }

    /*
     * "idle" as nginx means it: a graceful shutdown closes the stream
     * rather than wait for it; ngx_http_agent_wake.c ends streams properly
     * first, this covers the case it cannot.
     */

    c->idle = 1;

    ngx_add_timer(&sub->heartbeat, sub->interval);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "agent events: subscribed to \"%V\" after %uL",
                   &sub->id, sub->seq);

    r->main->count++;

    return NGX_DONE;
}


/* out, or NULL: what was queued before, as far as the client takes it */

static ngx_int_t
ngx_http_agent_events_send(ngx_http_agent_events_sub_t *sub, ngx_chain_t *out)
{
    ngx_int_t                  rc;
    ngx_buf_t                 *b;
    ngx_uint_t                 i;
    ngx_event_t               *wev;
    ngx_chain_t               *cl;
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_core_loc_conf_t  *clcf;

    r = sub->request;
    c = r->connection;
    wev = c->write;

    if (out == NULL && sub->busy == NULL && !c->buffered) {
        return NGX_OK;
    }

    if (out) {
        sub->sent = ngx_current_msec;
    }

    rc = ngx_http_output_filter(r, out);

    ngx_chain_update_chains(r->pool, &sub->free, &sub->busy, &out,
                            (ngx_buf_tag_t) &ngx_http_agent_events_handler);

    /* after a burst, release all but a few free buffers */

    for (cl = sub->free, i = 0; cl; cl = cl->next, i++) {
        b = cl->buf;

        if (b->start
            && (i >= NGX_HTTP_AGENT_EVENTS_KEEP
                || (size_t) (b->end - b->start) > NGX_HTTP_AGENT_EVENTS_BUF))
        {
            ngx_pfree(r->pool, b->start);
            b->start = NULL;
            b->end = NULL;
            b->pos = NULL;
            b->last = NULL;
        }
    }

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (c->buffered) {

        /*
         * send_timeout runs from the first output the client did not
         * take; the write handler starts it again when the client reads.
         * More events do not extend it.
         */

        if (!wev->delayed && !wev->timer_set) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            return NGX_ERROR;
        }

    } else if (wev->timer_set && !wev->delayed) {
        ngx_del_timer(wev);
    }

    return NGX_OK;
}


/*
 * Reads and sends what is new.  NGX_DONE: the request was finalized and
 * the subscriber is gone.
 */

ngx_int_t
ngx_http_agent_events_update(ngx_http_agent_events_sub_t *sub)
{
    ngx_int_t     rc;
    ngx_chain_t  *out;

    out = NULL;

    rc = ngx_http_agent_events_pull(sub, &out);

    if (rc == NGX_DECLINED) {
        ngx_http_agent_events_finish(sub);
        return NGX_DONE;
    }

    /* what is already queued goes out on write events, not from here */

    if (rc == NGX_ERROR
        || (out && ngx_http_agent_events_send(sub, out) != NGX_OK))
    {
        ngx_http_agent_events_close(sub, NGX_ERROR);
        return NGX_DONE;
    }

    if (sub->last || ngx_exiting || ngx_terminate) {
        ngx_http_agent_events_finish(sub);
        return NGX_DONE;
    }

    if (out) {
        ngx_http_agent_events_more(sub);
    }

    return NGX_OK;
}


/*
 * A subscriber the limit stopped, whose client took at once what was
 * queued, reads on: no write event would come for it.  Posted for the
 * next cycle, so that other connections have their turn.
 */

static void
ngx_http_agent_events_more(ngx_http_agent_events_sub_t *sub)
{
    if (sub->stalled
        && ngx_http_agent_events_busy(sub) <= sub->limit / 2)
    {
        ngx_post_event(&sub->wake, &ngx_posted_next_events);
    }
}


/* the end of the stream, properly: the client reconnects to resume */

static void
ngx_http_agent_events_finish(ngx_http_agent_events_sub_t *sub)
{
    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = sub->request;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "agent events: end of stream \"%V\"", &sub->id);

    ngx_http_agent_events_unregister(sub);

    rc = ngx_http_send_special(r, NGX_HTTP_LAST);

    ngx_http_finalize_request(r, rc);
}


static void
ngx_http_agent_events_close(ngx_http_agent_events_sub_t *sub, ngx_int_t rc)
{
    ngx_http_agent_events_unregister(sub);

    ngx_http_finalize_request(sub->request, rc);
}


static ngx_int_t
ngx_http_agent_events_subscribe(ngx_http_agent_events_sub_t *sub)
{
    uint32_t                        hash;
    ngx_http_agent_events_topic_t  *topic;
    ngx_http_agent_events_local_t  *local;

    local = &ngx_http_agent_events_local;

    if (local->rbtree.root == NULL) {
        ngx_rbtree_init(&local->rbtree, &local->sentinel,
                        ngx_str_rbtree_insert_value);
    }

    hash = ngx_crc32_short(sub->id.data, sub->id.len);

    topic = (ngx_http_agent_events_topic_t *)
                ngx_str_rbtree_lookup(&local->rbtree, &sub->id, hash);

    if (topic == NULL) {
        topic = ngx_alloc(sizeof(ngx_http_agent_events_topic_t),
                          sub->request->connection->log);
        if (topic == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(topic->id, sub->id.data, sub->id.len);
        topic->sn.str.data = topic->id;
        topic->sn.str.len = sub->id.len;
        topic->sn.node.key = hash;

        ngx_queue_init(&topic->subs);

        ngx_rbtree_insert(&local->rbtree, &topic->sn.node);
    }

    ngx_queue_insert_tail(&topic->subs, &sub->queue);
    sub->topic = topic;

    return NGX_OK;
}


/* idempotent: from the end of the stream, and again from the cleanup */

static void
ngx_http_agent_events_unregister(ngx_http_agent_events_sub_t *sub)
{
    ngx_http_agent_zone_t          *z;
    ngx_http_agent_conv_t          *conv;
    ngx_http_agent_events_topic_t  *topic;

    if (sub->done) {
        return;
    }

    sub->done = 1;

    sub->request->connection->idle = 0;

    if (sub->heartbeat.timer_set) {
        ngx_del_timer(&sub->heartbeat);
    }

    if (sub->wake.posted) {
        ngx_delete_posted_event(&sub->wake);
    }

    if (sub->follow) {
        ngx_http_agent_events_follow_end(sub);
    }

    topic = sub->topic;

    if (topic) {
        ngx_queue_remove(&sub->queue);
        sub->topic = NULL;

        if (ngx_queue_empty(&topic->subs)) {
            ngx_rbtree_delete(&ngx_http_agent_events_local.rbtree,
                              &topic->sn.node);
            ngx_free(topic);
        }
    }

    if (sub->registered) {
        sub->registered = 0;

        z = sub->zone;

        ngx_http_agent_zone_lock(z);

        conv = ngx_http_agent_conv_find_locked(z, &sub->id);

        if (conv) {
            ngx_http_agent_conv_sub_remove_locked(conv, ngx_pid);
            ngx_http_agent_log_rest_locked(z, conv);
        }

        ngx_http_agent_zone_unlock(z);
    }
}


static void
ngx_http_agent_events_cleanup(void *data)
{
    ngx_http_agent_events_sub_t  *sub = data;

    ngx_http_agent_events_unregister(sub);
}


/*
 * The subscriber of a request, found by its cleanup: the module's ctx
 * slot is the turn filter's, which every response passes through.
 */

static ngx_http_agent_events_sub_t *
ngx_http_agent_events_sub(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t  *cln;

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_agent_events_cleanup) {
            return cln->data;
        }
    }

    return NULL;
}


/* posted by ngx_http_agent_events_deliver() */

static void
ngx_http_agent_events_wake_handler(ngx_event_t *ev)
{
    ngx_connection_t             *c;
    ngx_http_request_t           *r;
    ngx_http_agent_events_sub_t  *sub;

    sub = ev->data;
    r = sub->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "agent events: wake-up for \"%V\"", &sub->id);

    (void) ngx_http_agent_events_update(sub);

    ngx_http_run_posted_requests(c);
}


/*
 * A comment line after interval of silence, so that proxies and clients
 * keep the stream open; and a poll, in case a wake-up was lost.
 */

static void
ngx_http_agent_events_heartbeat_handler(ngx_event_t *ev)
{
    ngx_msec_t                    idle, next;
    ngx_chain_t                  *cl;
    ngx_connection_t             *c;
    ngx_http_request_t           *r;
    ngx_http_agent_events_sub_t  *sub;

    sub = ev->data;
    r = sub->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    if (ngx_http_agent_events_update(sub) == NGX_DONE) {
        goto done;
    }

    idle = ngx_current_msec - sub->sent;

    if (idle >= sub->interval && sub->busy == NULL) {

        cl = ngx_http_agent_events_buf(sub,
                                       sizeof(ngx_http_agent_events_ping) - 1);
        if (cl == NULL) {
            ngx_http_agent_events_close(sub, NGX_ERROR);
            goto done;
        }

        cl->buf->last = ngx_cpymem(cl->buf->last, ngx_http_agent_events_ping,
                                   sizeof(ngx_http_agent_events_ping) - 1);

        if (ngx_http_agent_events_send(sub, cl) != NGX_OK) {
            ngx_http_agent_events_close(sub, NGX_ERROR);
            goto done;
        }

        idle = 0;
    }

    next = (idle < sub->interval) ? sub->interval - idle : sub->interval;

    /* a follower's heartbeat polls the store (a notification lost) */

    if (sub->follow) {
        next = ngx_min(next, NGX_HTTP_AGENT_EVENTS_POLL);
    }

    ngx_add_timer(ev, next);

done:

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_agent_events_write_handler(ngx_http_request_t *r)
{
    ngx_event_t                  *wev;
    ngx_connection_t             *c;
    ngx_http_agent_events_sub_t  *sub;

    c = r->connection;
    wev = c->write;

    sub = ngx_http_agent_events_sub(r);

    if (sub == NULL || sub->done) {
        return;
    }

    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "client timed out");
        c->timedout = 1;

        ngx_http_agent_events_close(sub, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    if (wev->delayed) {
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_agent_events_close(sub, NGX_ERROR);
        }

        return;
    }

    /* the client took something: send_timeout starts again */

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    if (ngx_http_agent_events_send(sub, NULL) != NGX_OK) {
        ngx_http_agent_events_close(sub, NGX_ERROR);
        return;
    }

    if (sub->stalled
        && ngx_http_agent_events_busy(sub) <= sub->limit / 2)
    {
        /* caught up: read on from where the cursor stopped */
        sub->stalled = 0;
        (void) ngx_http_agent_events_update(sub);
    }
}


void
ngx_http_agent_events_deliver(ngx_str_t *id)
{
    uint32_t                        hash;
    ngx_queue_t                    *q;
    ngx_http_agent_events_sub_t    *sub;
    ngx_http_agent_events_topic_t  *topic;
    ngx_http_agent_events_local_t  *local;

    local = &ngx_http_agent_events_local;

    if (local->rbtree.root == NULL) {
        return;
    }

    hash = ngx_crc32_short(id->data, id->len);

    topic = (ngx_http_agent_events_topic_t *)
                ngx_str_rbtree_lookup(&local->rbtree, id, hash);

    if (topic == NULL) {
        return;
    }

    /* posted, not run here: a wake-up may finalize the request */

    for (q = ngx_queue_head(&topic->subs);
         q != ngx_queue_sentinel(&topic->subs);
         q = ngx_queue_next(q))
    {
        sub = ngx_queue_data(q, ngx_http_agent_events_sub_t, queue);
        ngx_post_event(&sub->wake, &ngx_posted_events);
    }
}


void
ngx_http_agent_events_shutdown(void)
{
    ngx_queue_t                    *q;
    ngx_connection_t               *c;
    ngx_rbtree_node_t              *node;
    ngx_http_agent_events_sub_t    *sub;
    ngx_http_agent_events_topic_t  *topic;
    ngx_http_agent_events_local_t  *local;

    local = &ngx_http_agent_events_local;

    if (local->rbtree.root == NULL) {
        return;
    }

    /* each finish removes its subscriber, and the last one its topic */

    while (local->rbtree.root != local->rbtree.sentinel) {
        node = ngx_rbtree_min(local->rbtree.root, local->rbtree.sentinel);
        topic = (ngx_http_agent_events_topic_t *) node;

        q = ngx_queue_head(&topic->subs);
        sub = ngx_queue_data(q, ngx_http_agent_events_sub_t, queue);
        c = sub->request->connection;

        ngx_http_agent_events_finish(sub);

        ngx_http_run_posted_requests(c);
    }
}
