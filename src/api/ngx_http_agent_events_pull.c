
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * What a subscriber is sent: the history read back from the store, the
 * log, the reply so far, and then what follows its cursor, canonical and
 * live, within agent_events_buffer, rendered by the subscriber's format
 * (ngx_http_agent_format.h).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_events_sub.h"


static ngx_uint_t ngx_http_agent_events_written_locked(
    ngx_http_agent_events_sub_t *sub, ngx_http_agent_conv_t *conv,
    ngx_http_agent_event_t **evs, ngx_uint_t n, ngx_uint_t *held);
static ngx_int_t ngx_http_agent_events_copy_locked(
    ngx_http_agent_events_sub_t *sub, ngx_http_agent_event_t **evs,
    ngx_uint_t n, ngx_uint_t strict, ngx_chain_t ***ll, ngx_uint_t *used);
static size_t ngx_http_agent_events_size(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t *ev);


/*
 * The history read from the store, as far as the limit takes it.  A
 * subscriber stalled in it is not in the zone's log yet: when it has
 * taken what is queued, the stream ends (the zone does not hold what
 * comes next) and the client resumes with Last-Event-ID.
 */

ngx_int_t
ngx_http_agent_events_history_locked(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_revive_ctx_t *ctx, ngx_chain_t ***ll)
{
    ngx_uint_t  i, n, used;

    for (i = 0; i < ctx->nhistory; i += used) {
        n = ngx_min(ctx->nhistory - i, NGX_HTTP_AGENT_EVENTS_BATCH);

        if (ngx_http_agent_events_copy_locked(sub, ctx->history + i, n, 0,
                                              ll, &used)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (used < n) {
            sub->stalled = 1;
            sub->pos = 0;
            break;
        }
    }

    return NGX_OK;
}


/*
 * On a node (agent_node) a canonical event goes to subscribers once it is
 * written (the conversation's flushed seq): one that is not may never be,
 * if the node dies or loses the conversation first, and the new owner
 * gives its seq to another event.  Of n events in order, those before the
 * first canonical one not written yet; *held: there is one (evs[n]).  The
 * batch's end wakes the subscribers (ngx_http_agent_store_done()).  Live
 * deltas before it go at once; those after it wait with it, in order.
 */

static ngx_uint_t
ngx_http_agent_events_written_locked(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_conv_t *conv, ngx_http_agent_event_t **evs, ngx_uint_t n,
    ngx_uint_t *held)
{
    ngx_uint_t  i;

    *held = 0;

    if (!sub->written) {
        return n;
    }

    for (i = 0; i < n; i++) {

        /* a live event's seq is 0 */

        if (evs[i]->seq > conv->flushed) {
            *held = 1;
            return i;
        }
    }

    return n;
}


ngx_int_t
ngx_http_agent_events_stored(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t **evs, ngx_uint_t n, ngx_chain_t ***ll,
    ngx_uint_t *used)
{
    return ngx_http_agent_events_copy_locked(sub, evs, n, 0, ll, used);
}


/*
 * The canonical events after sub->seq, as far as the limit takes them;
 * the live tail starts after them, or, if the limit stopped them, the
 * cursor waits before the first one left.
 */

ngx_int_t
ngx_http_agent_events_snapshot_locked(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_conv_t *conv, ngx_chain_t ***ll)
{
    ngx_uint_t               n, used, held;
    ngx_http_agent_event_t  *evs[NGX_HTTP_AGENT_EVENTS_BATCH];

    do {
        n = ngx_http_agent_log_after_locked(conv, sub->seq, evs,
                                            NGX_HTTP_AGENT_EVENTS_BATCH);
        n = ngx_http_agent_events_written_locked(sub, conv, evs, n, &held);

        if (n == 0 && !held) {
            break;
        }

        if (ngx_http_agent_events_copy_locked(sub, evs, n, 0, ll, &used)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (used < n) {
            sub->stalled = 1;
            sub->pos = evs[used]->pos - 1;
            return NGX_OK;
        }

        if (held) {
            /* the live tail starts before the first not written yet */
            sub->pos = evs[n]->pos - 1;
            return NGX_OK;
        }

    } while (n == NGX_HTTP_AGENT_EVENTS_BATCH);

    sub->pos = conv->pos;

    return NGX_OK;
}


/*
 * The reply so far, once the cursor is at the end of the log: it holds
 * the deltas the subscriber passed over until then, and those after it
 * follow.  It waits for room as a canonical event does; one larger than
 * the whole buffer is left out, and the deltas go on without it.
 */

ngx_int_t
ngx_http_agent_events_partial_locked(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_conv_t *conv, ngx_chain_t ***ll)
{
    size_t        len, size;
    ngx_chain_t  *cl;

    len = ngx_http_agent_partial_size_locked(conv);

    if (len == 0) {
        sub->partial = 0;
        return NGX_OK;
    }

    size = sub->format->partial_size(len);

    if (size > sub->limit) {
        ngx_log_error(NGX_LOG_INFO, sub->request->connection->log, 0,
                      "agent events: the reply so far of conversation "
                      "\"%V\" is larger than agent_events_buffer, "
                      "not sent", &sub->id);
        sub->partial = 0;
        return NGX_OK;
    }

    if (sub->queued + size > sub->limit) {
        sub->stalled = 1;
        return NGX_OK;
    }

    cl = ngx_http_agent_events_buf(sub, size);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    if (sub->format->partial(sub, cl->buf, conv) != NGX_OK) {
        return NGX_ERROR;
    }

    sub->partial = 0;

    if (cl->buf->last == cl->buf->pos) {
        cl->next = sub->free;
        sub->free = cl;
        return NGX_OK;
    }

    sub->queued += ngx_max(size, NGX_HTTP_AGENT_EVENTS_BUF);
    sub->partial = 0;

    **ll = cl;
    *ll = &cl->next;

    return NGX_OK;
}


/* the format's look at a subscriber that has every event there is */

ngx_int_t
ngx_http_agent_events_caught_up_locked(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_conv_t *conv, ngx_chain_t ***ll)
{
    size_t        size;
    ngx_chain_t  *cl;

    if (sub->format->caught_up == NULL || sub->last || sub->partial
        || sub->pos != conv->pos)
    {
        return NGX_OK;
    }

    size = NGX_HTTP_AGENT_EVENTS_BUF;

    if (sub->format->caught_up_size) {
        size = ngx_max(size, sub->format->caught_up_size(sub));
    }

    cl = ngx_http_agent_events_buf(sub, size);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    if (sub->format->caught_up(sub, cl->buf, conv) != NGX_OK) {
        return NGX_ERROR;
    }

    if (cl->buf->last == cl->buf->pos) {
        cl->next = sub->free;
        sub->free = cl;
        return NGX_OK;
    }

    sub->queued += NGX_HTTP_AGENT_EVENTS_BUF;

    **ll = cl;
    *ll = &cl->next;

    return NGX_OK;
}


/*
 * What follows the cursor, canonical and live, in order.  NGX_DECLINED:
 * the stream cannot go on (the conversation left the zone, or canonical
 * events this subscriber has not seen are no longer there); the client
 * reconnects with Last-Event-ID.
 */

ngx_int_t
ngx_http_agent_events_pull(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t **out)
{
    size_t                   busy;
    ngx_int_t                rc;
    ngx_uint_t               n, i, used, held;
    ngx_chain_t            **ll;
    ngx_http_agent_zone_t   *z;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *evs[NGX_HTTP_AGENT_EVENTS_BATCH];

    busy = ngx_http_agent_events_busy(sub);
    sub->queued = busy;

    if (sub->queued >= sub->limit) {
        sub->stalled = 1;
        return NGX_OK;
    }

    sub->stalled = 0;

    ll = out;

    if (sub->follow) {
        return ngx_http_agent_events_follow_pull(sub, &ll);
    }

    rc = NGX_OK;
    n = 0;

    z = sub->zone;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &sub->id);

    if (conv == NULL) {
        rc = NGX_DECLINED;
        goto done;
    }

    if (conv->pos < sub->pos) {
        /* a new record for the id: its positions started again */
        sub->pos = 0;
    }

    if (conv->live_lost > sub->pos) {
        /*
         * live events after the cursor were given up before this
         * subscriber took them: it is sent the reply so far in place of
         * the deltas it missed, and then the deltas after it
         */
        sub->partial = 1;
    }

    for (i = 0; i < NGX_HTTP_AGENT_EVENTS_BATCHES; i++) {

        n = ngx_http_agent_log_since_locked(conv, sub->pos, evs,
                                               NGX_HTTP_AGENT_EVENTS_BATCH);
        n = ngx_http_agent_events_written_locked(sub, conv, evs, n, &held);

        if (n == 0) {
            break;
        }

        rc = ngx_http_agent_events_copy_locked(sub, evs, n, 1, &ll, &used);

        if (rc != NGX_OK) {
            break;
        }

        if (used) {
            sub->pos = evs[used - 1]->pos;
        }

        if (used < n) {
            /* the cursor waits until the client has taken enough */
            sub->stalled = 1;
            break;
        }

        if (held || n < NGX_HTTP_AGENT_EVENTS_BATCH) {
            /* (the rest waits for its write, which wakes the subscriber) */
            break;
        }
    }

    /*
     * the reply so far, in place of deltas missed, once the client has
     * taken what it was sent before: a client that does not read is not
     * sent it again and again
     */

    if (rc == NGX_OK && sub->partial && !sub->stalled && busy == 0
        && sub->pos == conv->pos)
    {
        rc = ngx_http_agent_events_partial_locked(sub, conv, &ll);
    }

    if (rc == NGX_OK && !sub->stalled) {
        rc = ngx_http_agent_events_caught_up_locked(sub, conv, &ll);
    }

done:

    ngx_http_agent_zone_unlock(z);

    if (rc == NGX_OK && n == NGX_HTTP_AGENT_EVENTS_BATCH && !sub->stalled) {
        /* more to read: after this is sent, and others had their turn */
        ngx_post_event(&sub->wake, &ngx_posted_next_events);
    }

    return rc;
}


/*
 * Frames for the events wanted, in one buffer appended at *ll, as far as
 * the limit allows (sub->queued is what already waits for the client):
 * live events only while the client keeps up, and never those from
 * before it subscribed; canonical ones not sent yet, in seq order, each
 * whole if it fits, or, if it is larger than the limit itself, a slice
 * of it.  *used is how many of evs were dealt with (sent, skipped or
 * dropped): the cursor moves past those only.
 */

static ngx_int_t
ngx_http_agent_events_copy_locked(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t **evs, ngx_uint_t n, ngx_uint_t strict,
    ngx_chain_t ***ll, ngx_uint_t *used)
{
    u_char                   keep[NGX_HTTP_AGENT_EVENTS_BATCH];
    size_t                   size, head, need, room, off, part, slow, whole;
    uint64_t                 seq;
    ngx_buf_t               *b;
    ngx_uint_t               i, last;
    ngx_chain_t             *cl;
    ngx_http_agent_event_t  *ev;
    ngx_http_agent_events_format_t  *fmt;

    fmt = sub->format;
    size = 0;
    part = 0;
    seq = sub->seq;
    off = sub->offset;
    slow = ngx_min(NGX_HTTP_AGENT_EVENTS_SLOW, sub->limit / 2);

    for (i = 0; i < n; i++) {
        ev = evs[i];
        keep[i] = 0;

        if (ev->seq == 0) {
            if (ev->pos <= sub->live
                || (sub->partial && ngx_http_agent_event_delta(ev->type)))
            {
                continue;
            }

            if (sub->queued + size < slow) {
                keep[i] = 1;
                size += ngx_http_agent_events_size(sub, ev);

            } else if (ngx_http_agent_event_delta(ev->type)) {
                /* a client that does not keep up: the reply so far later */
                sub->partial = 1;
            }

            continue;
        }

        if (ev->seq <= seq) {
            continue;
        }

        if (ev->seq != seq + 1) {

            if (strict) {
                ngx_log_error(NGX_LOG_INFO, sub->request->connection->log, 0,
                              "agent events: events %uL-%uL of conversation "
                              "\"%V\" are no longer in the zone, "
                              "ending the stream", seq + 1, ev->seq - 1,
                              &sub->id);
                return NGX_DECLINED;
            }

            ngx_log_error(NGX_LOG_WARN, sub->request->connection->log, 0,
                          "agent events: events %uL-%uL of conversation "
                          "\"%V\" are no longer in the zone",
                          seq + 1, ev->seq - 1, &sub->id);

            off = 0;
            sub->offset = 0;
        }

        whole = ngx_http_agent_events_size(sub, ev);
        head = off ? 0 : whole - ev->len;
        need = off ? ev->len - off + 2 : whole;
        room = (sub->limit > sub->queued + size)
               ? sub->limit - sub->queued - size : 0;

        if (need <= room
            || (!fmt->slices && whole > sub->limit && sub->queued + size == 0))
        {
            /* one that never fits whole and cannot be sliced goes alone */
            keep[i] = 1;
            size += need;
            seq = ev->seq;
            off = 0;
            continue;
        }

        if (fmt->slices && whole > sub->limit
            && room >= NGX_HTTP_AGENT_EVENTS_BUF)
        {
            /* never fits whole: as much of it as fits now */
            part = ngx_min(room - head, ev->len - off - 1);
            keep[i] = 2;
            size += head + part;
        }

        break;
    }

    *used = i;

    if (size == 0) {
        return NGX_OK;
    }

    cl = ngx_http_agent_events_buf(sub, size);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;

    last = (i < n && keep[i] == 2) ? i + 1 : i;

    for (i = 0; i < last && !sub->last; i++) {
        ev = evs[i];

        if (keep[i] == 0) {
            continue;
        }

        if (ev->seq == 0) {
            if (fmt->frame(sub, b, ev, 0, ev->len, 1) != NGX_OK) {
                return NGX_ERROR;
            }

            continue;
        }

        if (keep[i] == 2) {
            if (fmt->frame(sub, b, ev, sub->offset, part, 0) != NGX_OK) {
                return NGX_ERROR;
            }

            sub->offset += part;
            break;
        }

        if (fmt->frame(sub, b, ev, sub->offset, ev->len - sub->offset, 1)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        sub->seq = ev->seq;
        sub->offset = 0;
    }

    if (b->last == b->pos) {
        /* a format may render an event as nothing */
        cl->next = sub->free;
        sub->free = cl;
        return NGX_OK;
    }

    sub->queued += ngx_max(size, NGX_HTTP_AGENT_EVENTS_BUF);

    **ll = cl;
    *ll = &cl->next;

    return NGX_OK;
}


/* at most how many bytes the frame of ev takes in the subscriber's format */

static size_t
ngx_http_agent_events_size(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t *ev)
{
    size_t  size;

    size = sub->format->size(ev);

    if (sub->format->more) {
        size += sub->format->more(sub, ev);
    }

    return size;
}


/*
 * A buffer of at least size bytes from the free list.  Memory of the
 * wrong size is released and replaced, so nothing accumulates in the
 * request's pool over a stream that may last for hours.
 */

ngx_chain_t *
ngx_http_agent_events_buf(ngx_http_agent_events_sub_t *sub, size_t size)
{
    size_t        cap;
    ngx_buf_t    *b;
    ngx_pool_t   *pool;
    ngx_chain_t  *cl;

    pool = sub->request->pool;

    cl = ngx_chain_get_free_buf(pool, &sub->free);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;

    cap = b->end - b->start;

    if (b->start && (cap < size || cap > NGX_HTTP_AGENT_EVENTS_BUF)) {
        ngx_pfree(pool, b->start);
        b->start = NULL;
    }

    if (b->start == NULL) {
        cap = ngx_max(size, NGX_HTTP_AGENT_EVENTS_BUF);

        b->start = ngx_pnalloc(pool, cap);
        if (b->start == NULL) {
            b->end = NULL;
            cl->next = sub->free;
            sub->free = cl;
            return NULL;
        }

        b->end = b->start + cap;
    }

    b->pos = b->start;
    b->last = b->start;
    b->temporary = 1;
    b->flush = 1;
    b->last_buf = 0;
    b->tag = (ngx_buf_tag_t) &ngx_http_agent_events_handler;

    return cl;
}


/* memory of the buffers not yet sent */

size_t
ngx_http_agent_events_busy(ngx_http_agent_events_sub_t *sub)
{
    size_t        size;
    ngx_chain_t  *cl;

    size = 0;

    for (cl = sub->busy; cl; cl = cl->next) {
        size += cl->buf->end - cl->buf->start;
    }

    return size;
}
