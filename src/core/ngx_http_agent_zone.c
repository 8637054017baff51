
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_partial.h"


static void ngx_http_agent_zone_kick_none(void);
static ngx_int_t ngx_http_agent_zone_init(ngx_shm_zone_t *shm_zone,
    void *data);
static void ngx_http_agent_rbtree_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel);
static ngx_uint_t ngx_http_agent_expire_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *pinned);


ngx_str_t  ngx_http_agent_event_names[] = {
    ngx_string("user_msg"),
    ngx_string("assistant_msg"),
    ngx_string("tool_call"),
    ngx_string("tool_result"),
    ngx_string("suspension"),
    ngx_string("resolution"),
    ngx_string("turn_completed"),
    ngx_string("turn_failed"),
    ngx_string("cancelled"),
    ngx_string("turn_started"),
    ngx_string("state_changed"),
    ngx_string("text_delta"),
    ngx_string("thinking_delta"),
    ngx_string("tool_call_delta"),
    ngx_string("tool_progress"),
    ngx_string("turn_ended"),
    ngx_null_string
};


ngx_str_t  ngx_http_agent_state_names[] = {
    ngx_string("idle"),
    ngx_string("preparing"),
    ngx_string("streaming"),
    ngx_string("executing_tools"),
    ngx_string("awaiting_input"),
    ngx_null_string
};


/* new events to write: the store is told (set by ngx_http_agent_module.c) */
void  (*ngx_http_agent_zone_kick)(void) = ngx_http_agent_zone_kick_none;


/* agent_zone zone=name:size; */

char *
ngx_http_agent_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    u_char                 *p;
    ssize_t                 size;
    ngx_str_t              *value, name, s;
    ngx_shm_zone_t         *shm_zone;
    ngx_http_agent_zone_t  *z;

    if (amcf->zone != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strncmp(value[1].data, "zone=", 5) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\", it must be "
                           "\"zone=name:size\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data + 5;

    p = (u_char *) ngx_strchr(name.data, ':');
    if (p == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid zone size \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    name.len = p - name.data;

    s.data = p + 1;
    s.len = value[1].data + value[1].len - s.data;

    size = ngx_parse_size(&s);

    if (name.len == 0 || size == NGX_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid zone \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    if (size < (ssize_t) (8 * ngx_pagesize)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "zone \"%V\" is too small", &value[1]);
        return NGX_CONF_ERROR;
    }

    z = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_zone_t));
    if (z == NULL) {
        return NGX_CONF_ERROR;
    }

    shm_zone = ngx_shared_memory_add(cf, &name, size, &ngx_http_agent_module);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "zone \"%V\" is already used", &name);
        return NGX_CONF_ERROR;
    }

    shm_zone->init = ngx_http_agent_zone_init;
    shm_zone->data = z;

    z->shm_zone = shm_zone;
    amcf->zone = z;

    return NGX_CONF_OK;
}


/* on reload the old zone is taken over as it is: conversations survive */

static ngx_int_t
ngx_http_agent_zone_init(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_agent_zone_t  *oz = data;

    size_t                  len;
    ngx_uint_t              pages;
    ngx_http_agent_zone_t  *z;

    z = shm_zone->data;

    if (oz) {
        z->sh = oz->sh;
        z->shpool = oz->shpool;
        return NGX_OK;
    }

    z->shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        z->sh = z->shpool->data;
        return NGX_OK;
    }

    z->sh = ngx_slab_alloc(z->shpool, sizeof(ngx_http_agent_sh_t));
    if (z->sh == NULL) {
        return NGX_ERROR;
    }

    z->shpool->data = z->sh;

    ngx_rbtree_init(&z->sh->rbtree, &z->sh->sentinel,
                    ngx_http_agent_rbtree_insert_value);
    ngx_queue_init(&z->sh->lru);
    ngx_queue_init(&z->sh->waiting);
    ngx_queue_init(&z->sh->leased);
    ngx_queue_init(&z->sh->dirty);

    len = sizeof(" in agent zone \"\"") + shm_zone->shm.name.len;

    z->shpool->log_ctx = ngx_slab_alloc(z->shpool, len);
    if (z->shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(z->shpool->log_ctx, " in agent zone \"%V\"%Z",
                &shm_zone->shm.name);

    /* a full zone is answered with 503 and logged once per request */
    z->shpool->log_nomem = 0;

    pages = (z->shpool->end - z->shpool->start) / ngx_pagesize
            / NGX_HTTP_AGENT_RESERVE_SHARE;
    pages = ngx_max(1, ngx_min(pages, NGX_HTTP_AGENT_RESERVE_MAX));

    z->sh->reserve_size = pages * ngx_pagesize;
    z->sh->reserve = ngx_slab_alloc(z->shpool, z->sh->reserve_size);

    return NGX_OK;
}


static void
ngx_http_agent_rbtree_insert_value(ngx_rbtree_node_t *temp,
    ngx_rbtree_node_t *node, ngx_rbtree_node_t *sentinel)
{
    ngx_rbtree_node_t      **p;
    ngx_http_agent_conv_t   *c, *ct;

    for ( ;; ) {

        if (node->key < temp->key) {
            p = &temp->left;

        } else if (node->key > temp->key) {
            p = &temp->right;

        } else { /* node->key == temp->key */

            c = (ngx_http_agent_conv_t *) node;
            ct = (ngx_http_agent_conv_t *) temp;

            p = (ngx_memn2cmp(c->id, ct->id, c->id_len, ct->id_len) < 0)
                ? &temp->left : &temp->right;
        }

        if (*p == sentinel) {
            break;
        }

        temp = *p;
    }

    *p = node;
    node->parent = temp;
    node->left = sentinel;
    node->right = sentinel;
    ngx_rbt_red(node);
}


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
    ngx_queue_init(&conv->queued);

    ngx_rbtree_insert(&z->sh->rbtree, &conv->node);
    ngx_queue_insert_tail(&z->sh->lru, &conv->lru);
    z->sh->count++;

    return conv;
}


/* a conversation that never took an event, as if it had not been made */

void
ngx_http_agent_conv_delete_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_AGENT_LIVE_RING; i++) {
        if (conv->live[i]) {
            ngx_slab_free_locked(z->shpool, conv->live[i]);
        }
    }

    ngx_http_agent_partial_free_locked(z, conv);

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
    ngx_uint_t  i;

    if ((conv->state != NGX_HTTP_AGENT_IDLE
         && conv->state != NGX_HTTP_AGENT_AWAITING_INPUT)
        || conv->lease || conv->nqueued || conv->cancel
        || conv->flushing || conv->flushed < conv->seq || conv->seq == 0)
    {
        return 0;
    }

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        if (conv->subs[i].count) {
            return 0;
        }
    }

    return 1;
}


/*
 * A conversation belongs to the agent whose location created it: to
 * another agent it does not exist.  One with no agent recorded (a record
 * not yet used) is anyone's.
 */

ngx_int_t
ngx_http_agent_conv_agent_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *agent)
{
    if (conv->agent_len == 0
        || (conv->agent_len == agent->len
            && ngx_memcmp(conv->agent, agent->data, agent->len) == 0))
    {
        return NGX_OK;
    }

    return NGX_DECLINED;
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


/*
 * The history before the current turn, once written, is read from the
 * store when it is needed: the zone keeps the turn that may still change
 * (a flat footprint however long the conversation).
 */

void
ngx_http_agent_log_trim_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    ngx_uint_t               i, trimmed;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev;

    if (!z->store) {
        return;
    }

    trimmed = 0;

    while (!ngx_queue_empty(&conv->log)) {
        q = ngx_queue_head(&conv->log);
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->seq > conv->flushed || ev->seq >= conv->turn_seq) {
            break;
        }

        conv->base = ev->seq;

        ngx_queue_remove(q);
        conv->nlog--;
        ngx_slab_free_locked(z->shpool, ev);
        trimmed++;
    }

    /* most flushes, those within a turn, trim nothing */

    if (trimmed == 0 || ngx_queue_empty(&conv->log)) {
        return;
    }

    /* and the deltas of the turns before: their messages replace them */

    q = ngx_queue_head(&conv->log);
    ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

    for (i = 0; i < NGX_HTTP_AGENT_LIVE_RING; i++) {
        if (conv->live[i] && conv->live[i]->pos < ev->pos) {
            ngx_slab_free_locked(z->shpool, conv->live[i]);
            conv->live[i] = NULL;
        }
    }
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


/* the reserve back, once the zone has the room */

void
ngx_http_agent_zone_reserve_locked(ngx_http_agent_zone_t *z)
{
    if (z->sh->reserve == NULL) {
        z->sh->reserve = ngx_slab_alloc_locked(z->shpool,
                                               z->sh->reserve_size);
    }
}


/*
 * An event is stored as the JSON its subscribers get:
 * {"type":T,"seq":N,"turn":N,"ts":N, <fields>}, where fields is a JSON
 * object whose members are appended (the caller builds it without the
 * lock held).  Live events carry no seq and go to the ring.
 */

ngx_http_agent_event_t *
ngx_http_agent_event_add_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_uint_t type, ngx_str_t *fields)
{
    u_char                  *p;
    size_t                   len;
    uint64_t                 seq;
    ngx_uint_t               canonical, slot;
    ngx_time_t              *tp;
    ngx_http_agent_event_t  *ev;

    canonical = ngx_http_agent_event_canonical(type);
    seq = canonical ? conv->seq + 1 : 0;

    /*
     * the reply so far is no longer needed once the message is logged,
     * or the turn has ended: its room goes to them
     */

    if (type == NGX_HTTP_AGENT_EV_ASSISTANT_MSG
        || type == NGX_HTTP_AGENT_EV_TURN_COMPLETED
        || type == NGX_HTTP_AGENT_EV_TURN_FAILED
        || type == NGX_HTTP_AGENT_EV_CANCELLED)
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

        return ev;
    }

    slot = conv->nlive++ % NGX_HTTP_AGENT_LIVE_RING;

    if (conv->live[slot]) {
        ngx_slab_free_locked(z->shpool, conv->live[slot]);
    }

    conv->live[slot] = ev;

    return ev;
}


ngx_uint_t
ngx_http_agent_events_after_locked(ngx_http_agent_conv_t *conv, uint64_t pos,
    ngx_http_agent_event_t **out, ngx_uint_t max)
{
    ngx_uint_t               n, i, first, nlive, j;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *ev, *lev;

    /* the log events after pos: walk back from the tail, then forward */

    q = ngx_queue_last(&conv->log);

    while (q != ngx_queue_sentinel(&conv->log)) {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->pos <= pos) {
            break;
        }

        q = ngx_queue_prev(q);
    }

    q = ngx_queue_next(q);

    /* the ring, oldest first */

    nlive = ngx_min(conv->nlive, NGX_HTTP_AGENT_LIVE_RING);
    first = conv->nlive - nlive;
    j = 0;

    /* merge both by pos */

    n = 0;

    while (n < max) {
        ev = NULL;

        if (q != ngx_queue_sentinel(&conv->log)) {
            ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);
        }

        lev = NULL;

        while (j < nlive) {
            i = (first + j) % NGX_HTTP_AGENT_LIVE_RING;

            if (conv->live[i] && conv->live[i]->pos > pos) {
                lev = conv->live[i];
                break;
            }

            j++;
        }

        if (ev == NULL && lev == NULL) {
            break;
        }

        if (lev == NULL || (ev && ev->pos < lev->pos)) {
            out[n++] = ev;
            q = ngx_queue_next(q);

        } else {
            out[n++] = lev;
            j++;
        }
    }

    return n;
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


ngx_http_agent_pending_t *
ngx_http_agent_pending_find_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *id)
{
    ngx_uint_t                 i;
    ngx_http_agent_pending_t  *p;

    for (i = 0; i < NGX_HTTP_AGENT_PENDING; i++) {
        p = &conv->pending[i];

        if (p->kind && p->id_len == id->len
            && ngx_memcmp(p->id, id->data, id->len) == 0)
        {
            return p;
        }
    }

    return NULL;
}


ngx_int_t
ngx_http_agent_sub_add_locked(ngx_http_agent_conv_t *conv, ngx_pid_t pid)
{
    ngx_uint_t  i, free;

    free = NGX_HTTP_AGENT_SUB_WORKERS;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {

        if (conv->subs[i].pid == pid) {
            conv->subs[i].count++;
            return NGX_OK;
        }

        if (conv->subs[i].count == 0 && free == NGX_HTTP_AGENT_SUB_WORKERS) {
            free = i;
        }
    }

    if (free == NGX_HTTP_AGENT_SUB_WORKERS) {
        return NGX_DECLINED;
    }

    conv->subs[free].pid = pid;
    conv->subs[free].count = 1;

    return NGX_OK;
}


void
ngx_http_agent_sub_remove_locked(ngx_http_agent_conv_t *conv, ngx_pid_t pid)
{
    ngx_uint_t  i;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {

        if (conv->subs[i].pid == pid && conv->subs[i].count) {
            if (--conv->subs[i].count == 0) {
                conv->subs[i].pid = 0;
            }

            return;
        }
    }
}


ngx_uint_t
ngx_http_agent_sub_pids_locked(ngx_http_agent_conv_t *conv, ngx_pid_t *pids)
{
    ngx_uint_t  i, n;

    n = 0;

    for (i = 0; i < NGX_HTTP_AGENT_SUB_WORKERS; i++) {
        if (conv->subs[i].count) {
            pids[n++] = conv->subs[i].pid;
        }
    }

    return n;
}


void *
ngx_http_agent_zone_alloc_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *pinned, size_t size)
{
    void  *p;

    p = ngx_http_agent_zone_try_alloc_locked(z, pinned, size);

    if (p == NULL) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent zone \"%V\" is full", &z->shm_zone->shm.name);
    }

    return p;
}


/*
 * Allocation failure frees what can go without loss, least recently used
 * conversation first, and tries again: the live events of conversations
 * at rest (deltas nobody can be waiting for), then, with a store, whole
 * conversations at rest that it holds (they come back when asked for),
 * then the deltas of running turns and their replies so far.
 * Only idle ones leave this way: they are in none of the zone's queues
 * that a caller may be walking.  pinned is the one the caller works on.
 */

void *
ngx_http_agent_zone_try_alloc_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *pinned, size_t size)
{
    void  *p;

    for ( ;; ) {
        p = ngx_slab_alloc_locked(z->shpool, size);

        if (p != NULL || ngx_http_agent_expire_locked(z, pinned) == 0) {
            return p;
        }
    }
}


static ngx_uint_t
ngx_http_agent_expire_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *pinned)
{
    ngx_uint_t              i, freed;
    ngx_queue_t            *q;
    ngx_http_agent_conv_t  *conv;

    freed = 0;

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru) && freed == 0;
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        if (conv->state != NGX_HTTP_AGENT_IDLE || conv->lease) {
            continue;
        }

        for (i = 0; i < NGX_HTTP_AGENT_LIVE_RING; i++) {
            if (conv->live[i]) {
                ngx_slab_free_locked(z->shpool, conv->live[i]);
                conv->live[i] = NULL;
                freed++;
            }
        }
    }

    if (freed) {
        return freed;
    }

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru) && z->store;
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        if (conv != pinned && conv->state == NGX_HTTP_AGENT_IDLE
            && conv->npending == 0
            && ngx_http_agent_conv_evictable_locked(conv))
        {
            ngx_http_agent_conv_evict_locked(z, conv);
            return 1;
        }
    }

    /*
     * last, the deltas of turns running and their replies so far (not
     * the one pinned: it may be growing): subscribers still get the log
     */

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru) && freed == 0;
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        for (i = 0; i < NGX_HTTP_AGENT_LIVE_RING; i++) {
            if (conv->live[i]) {
                ngx_slab_free_locked(z->shpool, conv->live[i]);
                conv->live[i] = NULL;
                freed++;
            }
        }

        if (conv->partial && conv != pinned) {
            ngx_http_agent_partial_drop_locked(z, conv, "the zone is full");
            freed++;
        }
    }

    return freed;
}


static void
ngx_http_agent_zone_kick_none(void)
{
}
