
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The history a worker keeps, so that the next turn of a conversation
 * here reads nothing from the store: at a turn's end, the context the
 * turn read (the events after the newest summary's range) and the zone's
 * log after it, in one block of the worker's memory; the least recently
 * kept go first past agent_store's history= size.  A turn takes its
 * conversation's block (it is the turn's request's from then on) if the
 * block holds every event the zone gave up (up to the conversation's
 * base): events never change once written, so those are what the store
 * would give.  The model request is made from them and the zone's as it
 * is from a read of the store: events of a newer summary's range, if
 * any, are left out there.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_history.h"


struct ngx_http_agent_history_s {
    ngx_str_node_t                sn;         /* the conversation's id */
    ngx_queue_t                   queue;      /* least recently kept
                                                 first */
    size_t                        size;

    /* events[i] is event first + i */
    uint64_t                      first;
    ngx_uint_t                    n;
    ngx_str_t                    *events;

    /* the history still to copy in, as the block is made */
    ngx_str_t                    *from;
    ngx_uint_t                    nfrom;
};


static void ngx_http_agent_store_history_drop(ngx_http_agent_history_t *h);
static void ngx_http_agent_store_history_free(void *data);


static ngx_rbtree_t       ngx_http_agent_histories;
static ngx_rbtree_node_t  ngx_http_agent_histories_sentinel;
static ngx_queue_t        ngx_http_agent_histories_lru;
static size_t             ngx_http_agent_histories_size;


size_t
ngx_http_agent_store_history_max(void)
{
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    scf = amcf->store;

    return scf ? scf->history : 0;
}


static ngx_http_agent_history_t *
ngx_http_agent_store_history_find(ngx_str_t *id)
{
    if (ngx_http_agent_histories.root == NULL) {
        ngx_rbtree_init(&ngx_http_agent_histories,
                        &ngx_http_agent_histories_sentinel,
                        ngx_str_rbtree_insert_value);
        ngx_queue_init(&ngx_http_agent_histories_lru);
    }

    return (ngx_http_agent_history_t *) ngx_str_rbtree_lookup(
                                    &ngx_http_agent_histories, id,
                                    ngx_crc32_short(id->data, id->len));
}


ngx_int_t
ngx_http_agent_store_history_take(ngx_pool_t *pool, ngx_str_t *id,
    ngx_str_t **events, uint64_t *first, ngx_uint_t *n)
{
    ngx_pool_cleanup_t        *cln;
    ngx_http_agent_history_t  *h;

    h = ngx_http_agent_store_history_find(id);

    if (h == NULL) {
        return NGX_DECLINED;
    }

    ngx_rbtree_delete(&ngx_http_agent_histories, &h->sn.node);
    ngx_queue_remove(&h->queue);
    ngx_http_agent_histories_size -= h->size;

    cln = ngx_pool_cleanup_add(pool, 0);
    if (cln == NULL) {
        ngx_free(h);
        return NGX_ERROR;
    }

    cln->handler = ngx_http_agent_store_history_free;
    cln->data = h;

    *events = h->events;
    *first = h->first;
    *n = h->n;

    return NGX_OK;
}


/*
 * Under the zone lock, at a turn's end: a block for the history (events
 * upto - n + 1 .. upto) and the conversation's log in the zone after it,
 * less the newest summary's range; the log's events are copied now, the
 * history's by ngx_http_agent_store_history_keep() once the lock is
 * given back (it may be large)
 */

ngx_http_agent_history_t *
ngx_http_agent_store_history_keep_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *history, ngx_uint_t n, uint64_t upto)
{
    u_char                    *p;
    size_t                     size, hsize, max;
    uint64_t                   first;
    ngx_uint_t                 i, skip, nlog;
    ngx_queue_t               *q, *start;
    ngx_http_agent_event_t    *ev;
    ngx_http_agent_history_t  *h;

    max = ngx_http_agent_store_history_max();

    /* the zone's log goes on from the history, with no gap */

    if (max == 0 || conv->base > upto || upto < n) {
        return NULL;
    }

    first = upto - n + 1;
    skip = (conv->summary_to >= first) ? conv->summary_to - first + 1 : 0;

    hsize = 0;

    for (i = skip; i < n; i++) {
        hsize += history[i].len;
    }

    size = sizeof(ngx_http_agent_history_t) + conv->id_len + hsize;
    nlog = 0;
    start = NULL;

    for (q = ngx_queue_head(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->seq <= upto) {
            continue;
        }

        if (ev->seq != upto + 1 + nlog) {
            return NULL;
        }

        if (ev->seq > conv->summary_to) {
            size += ev->len;
        }

        if (nlog++ == 0) {
            start = q;
        }
    }

    skip = ngx_min(skip, n + nlog);
    size += (n + nlog - skip) * sizeof(ngx_str_t);

    /* a conversation may take a quarter: others are kept beside it */

    if (size > max / 4) {
        return NULL;
    }

    h = ngx_alloc(size, ngx_cycle->log);
    if (h == NULL) {
        return NULL;
    }

    h->size = size;
    h->first = first + skip;
    h->n = n + nlog - skip;
    h->events = (ngx_str_t *) (h + 1);

    h->from = history + skip;
    h->nfrom = (n > skip) ? n - skip : 0;

    /* the history's place first, then the zone's events, then the id */

    p = (u_char *) (h->events + h->n) + hsize;

    for (q = start, i = n; i < n + nlog; q = ngx_queue_next(q), i++) {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (i >= skip) {
            h->events[i - skip].data = p;
            h->events[i - skip].len = ev->len;
            p = ngx_cpymem(p, ev->data, ev->len);
        }
    }

    h->sn.str.data = p;
    h->sn.str.len = conv->id_len;
    ngx_memcpy(p, conv->id, conv->id_len);

    h->sn.node.key = ngx_crc32_short(conv->id, conv->id_len);

    return h;
}


/*
 * Without the lock: the history copied in, and the block kept in place
 * of the one kept before (which may have held the history)
 */

void
ngx_http_agent_store_history_keep(ngx_http_agent_history_t *h)
{
    u_char                    *p;
    size_t                     max;
    ngx_uint_t                 i;
    ngx_queue_t               *q;
    ngx_http_agent_history_t  *old;

    if (h == NULL) {
        return;
    }

    p = (u_char *) (h->events + h->n);

    for (i = 0; i < h->nfrom; i++) {
        h->events[i].data = p;
        h->events[i].len = h->from[i].len;
        p = ngx_cpymem(p, h->from[i].data, h->from[i].len);
    }

    old = ngx_http_agent_store_history_find(&h->sn.str);

    if (old) {
        ngx_http_agent_store_history_drop(old);
    }

    max = ngx_http_agent_store_history_max();

    while (ngx_http_agent_histories_size + h->size > max) {
        q = ngx_queue_head(&ngx_http_agent_histories_lru);
        ngx_http_agent_store_history_drop(
                       ngx_queue_data(q, ngx_http_agent_history_t, queue));
    }

    ngx_rbtree_insert(&ngx_http_agent_histories, &h->sn.node);
    ngx_queue_insert_tail(&ngx_http_agent_histories_lru, &h->queue);
    ngx_http_agent_histories_size += h->size;
}


/*
 * Under the zone lock: an event after a turn (a summary) goes on what
 * was kept of it; ngx_http_agent_store_history_keep() without the lock
 */

ngx_http_agent_history_t *
ngx_http_agent_store_history_add_locked(ngx_http_agent_conv_t *conv)
{
    ngx_str_t                  id;
    ngx_http_agent_history_t  *h;

    if (ngx_http_agent_store_history_max() == 0) {
        return NULL;
    }

    id.data = conv->id;
    id.len = conv->id_len;

    h = ngx_http_agent_store_history_find(&id);

    if (h == NULL) {
        return NULL;
    }

    return ngx_http_agent_store_history_keep_locked(conv, h->events, h->n,
                                                    h->first + h->n - 1);
}


/*
 * A request's page of the history the zone gave up, events after..upto,
 * copied from what this worker kept if it holds them all; each event's
 * type is its JSON's first member, as the log writes every event
 */

ngx_int_t
ngx_http_agent_store_history_copy(ngx_pool_t *pool, ngx_str_t *id,
    uint64_t after, uint64_t upto, ngx_http_agent_event_t ***events,
    ngx_uint_t *n)
{
    u_char                    *name, *end;
    ngx_int_t                  type;
    ngx_str_t                 *data;
    ngx_uint_t                 i;
    ngx_http_agent_event_t    *e, **evs;
    ngx_http_agent_history_t  *h;

    static u_char  prefix[] = "{\"type\":\"";

    if (ngx_http_agent_store_history_max() == 0) {
        return NGX_DECLINED;
    }

    h = ngx_http_agent_store_history_find(id);

    if (h == NULL || after + 1 < h->first || upto < after + 1
        || upto >= h->first + h->n)
    {
        return NGX_DECLINED;
    }

    evs = ngx_palloc(pool, (upto - after) * sizeof(ngx_http_agent_event_t *));
    if (evs == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < upto - after; i++) {
        data = &h->events[after + 1 + i - h->first];

        if (data->len <= sizeof(prefix) - 1
            || ngx_strncmp(data->data, prefix, sizeof(prefix) - 1) != 0)
        {
            return NGX_DECLINED;
        }

        name = data->data + sizeof(prefix) - 1;
        end = ngx_strlchr(name, data->data + data->len, '"');

        type = end ? ngx_http_agent_log_type(name, end - name) : NGX_ERROR;

        if (type == NGX_ERROR) {
            return NGX_DECLINED;
        }

        e = ngx_palloc(pool, offsetof(ngx_http_agent_event_t, data)
                             + data->len);
        if (e == NULL) {
            return NGX_ERROR;
        }

        e->seq = after + 1 + i;
        e->pos = 0;
        e->type = type;
        e->len = data->len;
        ngx_memcpy(e->data, data->data, data->len);

        evs[i] = e;
    }

    *events = evs;
    *n = upto - after;

    return NGX_OK;
}


/* as the worker exits: what it kept */

void
ngx_http_agent_store_history_exit(void)
{
    ngx_queue_t  *q;

    if (ngx_http_agent_histories.root == NULL) {
        return;
    }

    while (!ngx_queue_empty(&ngx_http_agent_histories_lru)) {
        q = ngx_queue_head(&ngx_http_agent_histories_lru);
        ngx_http_agent_store_history_drop(
                       ngx_queue_data(q, ngx_http_agent_history_t, queue));
    }
}


static void
ngx_http_agent_store_history_drop(ngx_http_agent_history_t *h)
{
    ngx_rbtree_delete(&ngx_http_agent_histories, &h->sn.node);
    ngx_queue_remove(&h->queue);
    ngx_http_agent_histories_size -= h->size;

    ngx_free(h);
}


static void
ngx_http_agent_store_history_free(void *data)
{
    ngx_free(data);
}
