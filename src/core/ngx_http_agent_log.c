
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * A conversation's events in the zone: the canonical log and the ring
 * of live events, in one order of positions.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_trace.h"
#include "ngx_http_agent_partial.h"


static ngx_queue_t *ngx_http_agent_log_after_pos(ngx_queue_t *queue,
    uint64_t pos);
static void ngx_http_agent_log_live_free_one_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_queue_t *q);


/*
 * The history before the current turn, once written, is read from the
 * store when it is needed: the zone keeps the turn that may still change
 * (a flat footprint however long the conversation).  A conversation at
 * rest, idle with nothing queued, no worker on it and no subscriber (who
 * may still be catching up from the zone), has no such turn: once all of
 * it is written, its record is all the zone keeps.
 */

void
ngx_http_agent_log_trim_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    ngx_uint_t               i, trimmed, rest;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev;

    if (!z->store) {
        return;
    }

    rest = conv->state == NGX_HTTP_AGENT_IDLE && conv->lease == 0
           && conv->nqueued == 0 && conv->cancel == 0;

    for (i = 0; rest && i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        rest = (conv->subs[i].count == 0);
    }

    trimmed = 0;

    while (!ngx_queue_empty(&conv->log)) {
        q = ngx_queue_head(&conv->log);
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->seq > conv->flushed || (ev->seq >= conv->turn_seq && !rest)) {
            break;
        }

        conv->base = ev->seq;

        ngx_queue_remove(q);
        conv->nlog--;
        ngx_slab_free_locked(z->shpool, ev);
        trimmed++;
    }

    /* most flushes, those within a turn, trim nothing */

    if (trimmed == 0) {
        return;
    }

    /* and the deltas of the turns before: their messages replace them */

    if (ngx_queue_empty(&conv->log)) {
        (void) ngx_http_agent_log_live_free_locked(z, conv, (uint64_t) -1);
        return;
    }

    q = ngx_queue_head(&conv->log);
    ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

    (void) ngx_http_agent_log_live_free_locked(z, conv, ev->pos);
}


/* an event read back from the store, as it was written */

ngx_http_agent_event_t *
ngx_http_agent_log_restore_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, uint64_t seq, ngx_uint_t type,
    ngx_str_t *data)
{
    ngx_http_agent_event_t  *ev;

    ev = ngx_http_agent_zone_alloc_locked(z, conv,
                                     offsetof(ngx_http_agent_event_t, data)
                                     + data->len);
    if (ev == NULL) {
        return NULL;
    }

    ngx_memcpy(ev->data, data->data, data->len);
    ev->len = data->len;
    ev->type = type;
    ev->seq = seq;
    ev->pos = ++conv->pos;

    ngx_queue_insert_tail(&conv->log, &ev->queue);
    conv->nlog++;

    conv->seq = seq;
    conv->flushed = seq;

    if (type == NGX_HTTP_AGENT_EV_USER_MSG) {
        conv->turn_seq = seq;
    }

    return ev;
}


/*
 * Without a store the zone holds the whole log: the context is found from
 * its end, so that a model call reads what the context holds; a turn
 * that has the events up to after already walks only the newer ones.
 */

ngx_queue_t *
ngx_http_agent_log_context_locked(ngx_http_agent_conv_t *conv,
    uint64_t after)
{
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *e;

    after = ngx_max(after, conv->summary_to);

    q = ngx_queue_last(&conv->log);

    while (q != ngx_queue_sentinel(&conv->log)) {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->seq <= after) {
            break;
        }

        q = ngx_queue_prev(q);
    }

    return ngx_queue_next(q);
}


/* the current turn's first event in the log: its user_msg */

ngx_queue_t *
ngx_http_agent_log_turn_locked(ngx_http_agent_conv_t *conv)
{
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *e;

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type == NGX_HTTP_AGENT_EV_USER_MSG) {
            return q;
        }
    }

    return ngx_queue_head(&conv->log);
}


/*
 * A canonical event's type by its name, as the store's type column and
 * the JSON's first member ({"type":"name", below) hold it; NGX_ERROR:
 * no canonical event has that name
 */

ngx_int_t
ngx_http_agent_log_type(u_char *name, size_t len)
{
    ngx_uint_t  type;

    for (type = 0; ngx_http_agent_event_canonical(type); type++) {
        if (ngx_http_agent_event_names[type].len == len
            && ngx_strncmp(ngx_http_agent_event_names[type].data, name, len)
               == 0)
        {
            return type;
        }
    }

    return NGX_ERROR;
}


/*
 * An event is stored as the JSON its subscribers get:
 * {"type":T,"seq":N,"turn":N,"ts":N, <fields>}, where fields is a JSON
 * object whose members are appended (the caller builds it without the
 * lock held).  Live events carry no seq and go to the ring.
 */

ngx_http_agent_event_t *
ngx_http_agent_log_add_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_uint_t type, ngx_str_t *fields)
{
    u_char                  *p;
    size_t                   len;
    uint64_t                 seq;
    ngx_uint_t               canonical;
    ngx_queue_t             *q;
    ngx_time_t              *tp;
    ngx_http_agent_event_t  *ev;

    canonical = ngx_http_agent_event_canonical(type);
    seq = canonical ? conv->seq + 1 : 0;

    /*
     * the reply so far is no longer needed once the message is logged,
     * or the turn has ended: its room goes to them
     */

    if (type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG
        || ngx_http_agent_event_terminal(type))
    {
        ngx_http_agent_partial_free_locked(z, conv);
    }

    /* fields is "{...}": its members follow ours after a comma */

    len = sizeof("{\"type\":\"\",\"seq\":,\"turn\":,\"ts\":,") - 1
          + ngx_http_agent_event_names[type].len
          + 2 * NGX_INT64_LEN + NGX_INT_T_LEN
          + fields->len;

    ev = ngx_http_agent_zone_alloc_locked(z, conv,
                                  offsetof(ngx_http_agent_event_t, data) + len);

    /*
     * An event that ends a call or a turn is small, and a full zone gives
     * up its reserve for it: a turn that cannot go on can still end, with
     * its calls paired.  The expiry timer takes the reserve back.
     */

    if (ev == NULL && z->sh->reserve && len <= NGX_HTTP_AGENT_CLOSING_MAX
        && (type == NGX_HTTP_AGENT_EV_TOOL_RESULT
            || type == NGX_HTTP_AGENT_EV_RESOLUTION
            || type == NGX_HTTP_AGENT_EV_TURN_FAILED
            || type == NGX_HTTP_AGENT_EV_TURN_HALTED
            || type == NGX_HTTP_AGENT_EV_CANCELLED))
    {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "agent zone \"%V\" gives up its reserve to end a turn",
                      &z->shm_zone->shm.name);

        ngx_slab_free_locked(z->shpool, z->sh->reserve);
        z->sh->reserve = NULL;

        ev = ngx_slab_alloc_locked(z->shpool,
                                  offsetof(ngx_http_agent_event_t, data) + len);
    }

    if (ev == NULL) {
        return NULL;
    }

    p = ngx_sprintf(ev->data, "{\"type\":\"%V\"",
                    &ngx_http_agent_event_names[type]);

    if (canonical) {
        p = ngx_sprintf(p, ",\"seq\":%uL", seq);
    }

    tp = ngx_timeofday();

    p = ngx_sprintf(p, ",\"turn\":%ui,\"ts\":%uL", conv->turn,
                    (uint64_t) tp->sec * 1000 + tp->msec);

    if (fields->len > 2) {
        *p++ = ',';
        p = ngx_cpymem(p, fields->data + 1, fields->len - 1);

    } else {
        *p++ = '}';
    }

    ev->len = p - ev->data;
    ev->type = type;
    ev->seq = seq;
    ev->pos = ++conv->pos;

    conv->updated = ngx_current_msec;

    if (canonical) {
        conv->seq = seq;

        /*
         * the turn got on: the worker deaths before this were not caused
         * by what it runs now, and do not count towards giving it up
         */

        if (type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG
            || type == NGX_HTTP_AGENT_EV_TOOL_RESULT)
        {
            conv->takeovers = 0;
        }

        if (type == NGX_HTTP_AGENT_EV_USER_MSG) {
            conv->turn_seq = seq;
        }

        ngx_queue_insert_tail(&conv->log, &ev->queue);
        conv->nlog++;

        if (z->store) {
            if (!conv->dirty_linked) {
                ngx_queue_insert_tail(&z->sh->dirty, &conv->dirty);
                conv->dirty_linked = 1;
            }

            ngx_http_agent_zone_kick();
        }

        ngx_http_agent_metrics_event_locked(z, conv, type, fields);

        if (ngx_http_agent_event_terminal(type)
            && ngx_http_agent_trace_ended_locked)
        {
            ngx_http_agent_trace_ended_locked(z, conv, ev);
        }

        return ev;
    }

    ngx_queue_insert_tail(&conv->live, &ev->queue);
    conv->nlive++;
    conv->live_size += ev->len;

    /* the oldest go, as far as the bounds want; never the one just added */

    while (conv->nlive > NGX_HTTP_AGENT_LIVE_MAX
           || conv->live_size > NGX_HTTP_AGENT_LIVE_SIZE)
    {
        q = ngx_queue_head(&conv->live);

        if (q == &ev->queue) {
            break;
        }

        ngx_http_agent_log_live_free_one_locked(z, conv, q);
    }

    return ev;
}


ngx_uint_t
ngx_http_agent_log_since_locked(ngx_http_agent_conv_t *conv, uint64_t pos,
    ngx_http_agent_event_t **out, ngx_uint_t max)
{
    ngx_uint_t               n;
    ngx_queue_t             *q, *lq;
    ngx_http_agent_event_t  *ev, *lev;

    /* the events of either queue after pos: back from the tail, then on */

    q = ngx_http_agent_log_after_pos(&conv->log, pos);
    lq = ngx_http_agent_log_after_pos(&conv->live, pos);

    /* merge both by pos */

    for (n = 0; n < max; n++) {
        ev = NULL;
        lev = NULL;

        if (q != ngx_queue_sentinel(&conv->log)) {
            ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);
        }

        if (lq != ngx_queue_sentinel(&conv->live)) {
            lev = ngx_queue_data(lq, ngx_http_agent_event_t, queue);
        }

        if (ev == NULL && lev == NULL) {
            break;
        }

        if (lev == NULL || (ev && ev->pos < lev->pos)) {
            out[n] = ev;
            q = ngx_queue_next(q);

        } else {
            out[n] = lev;
            lq = ngx_queue_next(lq);
        }
    }

    return n;
}


/* the first event of a queue in pos order that is after pos */

static ngx_queue_t *
ngx_http_agent_log_after_pos(ngx_queue_t *queue, uint64_t pos)
{
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev;

    for (q = ngx_queue_last(queue);
         q != ngx_queue_sentinel(queue);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->pos <= pos) {
            break;
        }
    }

    return ngx_queue_next(q);
}


/*
 * The live events serve the subscribers there are: a new one starts
 * from the log, and from the reply so far if a model call streams.  A
 * conversation at rest with none has no use for them: their canonical
 * events replace them (the assistant_msg its deltas, the record its
 * state).
 */

void
ngx_http_agent_log_rest_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    if (conv->nlive && ngx_http_agent_conv_at_rest_locked(conv)) {
        (void) ngx_http_agent_log_live_free_locked(z, conv, (uint64_t) -1);
    }
}


ngx_uint_t
ngx_http_agent_log_live_free_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, uint64_t pos)
{
    ngx_uint_t               n;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev;

    n = 0;

    while (!ngx_queue_empty(&conv->live)) {
        q = ngx_queue_head(&conv->live);
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->pos >= pos) {
            break;
        }

        ngx_http_agent_log_live_free_one_locked(z, conv, q);
        n++;
    }

    return n;
}


static void
ngx_http_agent_log_live_free_one_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_queue_t *q)
{
    ngx_http_agent_event_t  *ev;

    ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

    ngx_queue_remove(q);
    conv->nlive--;
    conv->live_size -= ev->len;
    conv->live_lost = ngx_max(conv->live_lost, ev->pos);

    ngx_slab_free_locked(z->shpool, ev);
}


ngx_uint_t
ngx_http_agent_log_after_locked(ngx_http_agent_conv_t *conv, uint64_t seq,
    ngx_http_agent_event_t **out, ngx_uint_t max)
{
    ngx_uint_t               n;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev;

    n = 0;

    for (q = ngx_queue_head(&conv->log);
         q != ngx_queue_sentinel(&conv->log) && n < max;
         q = ngx_queue_next(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->seq > seq) {
            out[n++] = ev;
        }
    }

    return n;
}
