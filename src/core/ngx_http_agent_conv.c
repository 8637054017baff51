
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * A conversation's record in the zone: found by its id in the rbtree,
 * created, bound to its agent, evicted; its waiting calls and the workers
 * with its subscribers.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_partial.h"


static ngx_uint_t ngx_http_agent_conv_watched(ngx_http_agent_conv_t *conv);


ngx_http_agent_conv_t *
ngx_http_agent_conv_find_locked(ngx_http_agent_zone_t *z, ngx_str_t *id)
{
    uint32_t                hash;
    ngx_int_t               rc;
    ngx_rbtree_node_t      *node, *sentinel;
    ngx_http_agent_conv_t  *conv;

    hash = ngx_crc32_short(id->data, id->len);

    node = z->sh->rbtree.root;
    sentinel = z->sh->rbtree.sentinel;

    while (node != sentinel) {

        if (hash < node->key) {
            node = node->left;
            continue;
        }

        if (hash > node->key) {
            node = node->right;
            continue;
        }

        conv = (ngx_http_agent_conv_t *) node;

        rc = ngx_memn2cmp(id->data, conv->id, id->len, conv->id_len);

        if (rc == 0) {
            ngx_queue_remove(&conv->lru);
            ngx_queue_insert_tail(&z->sh->lru, &conv->lru);
            conv->accessed = ngx_current_msec;
            return conv;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


ngx_http_agent_conv_t *
ngx_http_agent_conv_create_locked(ngx_http_agent_zone_t *z, ngx_str_t *id)
{
    ngx_http_agent_conv_t  *conv;

    if (id->len > NGX_HTTP_AGENT_ID_LEN) {
        return NULL;
    }

    conv = ngx_http_agent_zone_alloc_locked(z, NULL,
                                       sizeof(ngx_http_agent_conv_t));
    if (conv == NULL) {
        return NULL;
    }

    /* idle, no lease: the state machine's start */
    ngx_memzero(conv, sizeof(ngx_http_agent_conv_t));

    conv->node.key = ngx_crc32_short(id->data, id->len);
    ngx_memcpy(conv->id, id->data, id->len);
    conv->id_len = id->len;
    conv->updated = ngx_current_msec;
    conv->accessed = ngx_current_msec;

    ngx_queue_init(&conv->log);
    ngx_queue_init(&conv->live);
    ngx_queue_init(&conv->queued);

    ngx_rbtree_insert(&z->sh->rbtree, &conv->node);
    ngx_queue_insert_tail(&z->sh->lru, &conv->lru);
    z->sh->count++;

    return conv;
}


/*
 * A conversation agent_create made: until its first event it is in the
 * zone's queue of those unused, oldest first, whose record is freed once
 * no request has named it for agent_evict_unused.  Nothing of it is in
 * the store: the id, which only its creator knows, is free again.
 */

void
ngx_http_agent_conv_mint_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    ngx_queue_insert_tail(&z->sh->unused, &conv->unused);
    conv->unused_linked = 1;
}


ngx_uint_t
ngx_http_agent_conv_unused_locked(ngx_http_agent_zone_t *z, ngx_msec_t limit,
    ngx_http_agent_gone_t *gone)
{
    ngx_uint_t              i, n;
    ngx_queue_t            *q, *next;
    ngx_http_agent_conv_t  *conv;

    n = 0;

    for (q = ngx_queue_head(&z->sh->unused), i = 0;
         q != ngx_queue_sentinel(&z->sh->unused)
         && i < NGX_HTTP_AGENT_UNUSED_ROUND;
         q = next, i++)
    {
        next = ngx_queue_next(q);
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, unused);

        if (conv->seq) {
            /* a message came: it is a conversation like any other */
            ngx_queue_remove(q);
            conv->unused_linked = 0;
            continue;
        }

        /* in the order they were made: the rest are younger */

        if ((ngx_msec_int_t) (ngx_current_msec - conv->updated)
            < (ngx_msec_int_t) limit)
        {
            break;
        }

        if ((ngx_msec_int_t) (ngx_current_msec - conv->accessed)
            < (ngx_msec_int_t) limit)
        {
            continue;
        }

        ngx_http_agent_conv_subs_reap_locked(z, conv);

        if (conv->lease || ngx_http_agent_conv_watched(conv)) {
            /* a subscriber waits for its first message */
            continue;
        }

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "agent conversation \"%*s\" was never used, freed",
                       conv->id_len, conv->id);

        ngx_http_agent_conv_gone_locked(conv, &gone[n]);
        ngx_http_agent_conv_delete_locked(z, conv);
        n++;
    }

    return n;
}


void
ngx_http_agent_conv_gone_locked(ngx_http_agent_conv_t *conv,
    ngx_http_agent_gone_t *gone)
{
    ngx_memcpy(gone->id, conv->id, conv->id_len);
    gone->id_len = conv->id_len;
    gone->epoch = conv->epoch;
    gone->seq = conv->seq;
}


/* a conversation that never took an event, as if it had not been made */

void
ngx_http_agent_conv_delete_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    (void) ngx_http_agent_log_live_free_locked(z, conv, (uint64_t) -1);

    ngx_http_agent_partial_free_locked(z, conv);

    if (conv->pending) {
        ngx_slab_free_locked(z->shpool, conv->pending);
    }

    if (conv->unused_linked) {
        ngx_queue_remove(&conv->unused);
    }

    ngx_queue_remove(&conv->lru);
    ngx_rbtree_delete(&z->sh->rbtree, &conv->node);
    z->sh->count--;

    ngx_slab_free_locked(z->shpool, conv);
}


/*
 * A conversation leaves the zone only when the store holds all of it and
 * nothing in the zone waits on it: at rest, no turn, nothing queued, no
 * subscriber.  Its waiting calls' deadlines are the store's sweep's.
 */

ngx_int_t
ngx_http_agent_conv_evictable_locked(ngx_http_agent_conv_t *conv)
{
    if ((conv->state != NGX_HTTP_AGENT_IDLE
         && conv->state != NGX_HTTP_AGENT_AWAITING_INPUT)
        || conv->flushing || conv->flushed < conv->seq)
    {
        return 0;
    }

    return ngx_http_agent_conv_at_rest_locked(conv);
}


/* a worker is gone when no process has its pid any more */

ngx_uint_t
ngx_http_agent_pid_alive(ngx_pid_t pid)
{
    return !(kill(pid, 0) == -1 && ngx_errno == NGX_ESRCH);
}


/*
 * A worker that is gone (SIGKILL, a crash) took its subscribers with it:
 * their slots are cleared, so that they neither keep the conversation
 * from rest (and in the zone) nor its live events.  Asked for the few
 * conversations that are candidates to leave the zone, and for one whose
 * turn is taken over.  A wake-up sent to the worker
 * tells as well, but only when the conversation has a new event.
 */

void
ngx_http_agent_conv_subs_reap_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    if (ngx_http_agent_workers_reap_locked(conv->subs)) {
        ngx_http_agent_log_rest_locked(z, conv);
    }
}


/*
 * Nothing runs, is queued or watches: no worker, message, cancel or
 * subscriber would miss the conversation if it left the zone.
 */

ngx_int_t
ngx_http_agent_conv_at_rest_locked(ngx_http_agent_conv_t *conv)
{
    if (conv->lease || conv->nqueued || conv->cancel || conv->seq == 0) {
        return 0;
    }

    /* a summary being made is recorded into the record */

    if (conv->summarizing
        && ngx_time() - conv->summary_started < NGX_HTTP_AGENT_SUMMARY_HOLD)
    {
        return 0;
    }

    return !ngx_http_agent_conv_watched(conv);
}


static ngx_uint_t
ngx_http_agent_conv_watched(ngx_http_agent_conv_t *conv)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        if (conv->subs[i].count) {
            return 1;
        }
    }

    return 0;
}


/*
 * A conversation belongs to the agent whose location created it, and to
 * the owner it was created for: to another agent or owner it does not
 * exist.  One with no agent recorded (a record not yet used) is anyone's;
 * owner NULL: the location does not ask who the request is for.
 */

ngx_int_t
ngx_http_agent_conv_bound_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *agent, ngx_str_t *owner)
{
    if (conv->agent_len == 0) {
        return NGX_OK;
    }

    if (conv->agent_len != agent->len
        || ngx_memcmp(conv->agent, agent->data, agent->len) != 0)
    {
        return NGX_DECLINED;
    }

    if (owner != NULL
        && (conv->owner_len != owner->len
            || ngx_memcmp(conv->owner, owner->data, owner->len) != 0))
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* the agent and the owner are recorded once, when the record is first used */

void
ngx_http_agent_conv_bind_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *agent, ngx_str_t *owner)
{
    conv->agent_len = ngx_min(agent->len, NGX_HTTP_AGENT_TOOL_NAME_LEN);
    ngx_memcpy(conv->agent, agent->data, conv->agent_len);

    conv->owner_len = 0;

    if (owner != NULL) {
        conv->owner_len = ngx_min(owner->len, NGX_HTTP_AGENT_OWNER_LEN);
        ngx_memcpy(conv->owner, owner->data, conv->owner_len);
    }
}


void
ngx_http_agent_conv_evict_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev;

    while (!ngx_queue_empty(&conv->log)) {
        q = ngx_queue_head(&conv->log);
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        ngx_queue_remove(q);
        ngx_slab_free_locked(z->shpool, ev);
    }

    if (conv->npending) {
        ngx_queue_remove(&conv->waiting);
    }

    if (conv->dirty_linked) {
        ngx_queue_remove(&conv->dirty);
    }

    z->sh->evicted++;

    ngx_http_agent_conv_delete_locked(z, conv);
}


ngx_http_agent_pending_t *
ngx_http_agent_conv_pending_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *id)
{
    ngx_uint_t                 i;
    ngx_http_agent_pending_t  *p;

    for (i = 0; conv->pending && i < conv->pending_slots; i++) {
        p = &conv->pending[i];

        if (p->kind && p->id_len == id->len
            && ngx_memcmp(p->id, id->data, id->len) == 0)
        {
            return p;
        }
    }

    return NULL;
}


/*
 * A list of workers (NGX_HTTP_AGENT_SUB_WORKERS slots), each with a count
 * of what it has there: a conversation's subscribers, the inputs waiting
 * for a write.  NGX_DECLINED: the list is full.
 */

ngx_int_t
ngx_http_agent_workers_add_locked(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t pid)
{
    ngx_uint_t  i, free;

    free = NGX_HTTP_AGENT_SUB_WORKERS;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {

        if (w[i].pid == pid) {
            w[i].count++;
            return NGX_OK;
        }

        if (w[i].count == 0 && free == NGX_HTTP_AGENT_SUB_WORKERS) {
            free = i;
        }
    }

    if (free == NGX_HTTP_AGENT_SUB_WORKERS) {
        return NGX_DECLINED;
    }

    w[free].pid = pid;
    w[free].count = 1;

    return NGX_OK;
}


void
ngx_http_agent_workers_remove_locked(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t pid)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {

        if (w[i].pid == pid && w[i].count) {
            if (--w[i].count == 0) {
                w[i].pid = 0;
            }

            return;
        }
    }
}


ngx_uint_t
ngx_http_agent_workers_pids_locked(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t *pids)
{
    ngx_uint_t  i, n;

    n = 0;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        if (w[i].count) {
            pids[n++] = w[i].pid;
        }
    }

    return n;
}


/* the slots of workers gone are cleared; how many */

ngx_uint_t
ngx_http_agent_workers_reap_locked(ngx_http_agent_sub_worker_t *w)
{
    ngx_uint_t  i, n;

    n = 0;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        if (w[i].count && w[i].pid != ngx_pid
            && !ngx_http_agent_pid_alive(w[i].pid))
        {
            w[i].count = 0;
            w[i].pid = 0;
            n++;
        }
    }

    return n;
}
