
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_metrics.h"


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
    ngx_string("turn_halted"),
    ngx_string("injection"),
    ngx_string("summary"),
    ngx_string("rewind"),
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


/* agent_zone zone=name:size [keep_idle]; */

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

    if (cf->args->nelts == 3
        && ngx_strcmp(value[2].data, "keep_idle") != 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[2]);
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
    z->keep_idle = (cf->args->nelts == 3);
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
    z->sh->mcp = NULL;
    z->sh->acking = NULL;
    z->sh->node = NULL;

    ngx_rbtree_init(&z->sh->rbtree, &z->sh->sentinel,
                    ngx_http_agent_rbtree_insert_value);
    ngx_queue_init(&z->sh->lru);
    ngx_queue_init(&z->sh->waiting);
    ngx_queue_init(&z->sh->leased);
    ngx_queue_init(&z->sh->dirty);
    ngx_queue_init(&z->sh->unused);

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
    z->sh->metrics = ngx_http_agent_metrics_create(z->shpool);

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


/* the reserve back, once the zone has the room */

void
ngx_http_agent_zone_reserve_locked(ngx_http_agent_zone_t *z)
{
    if (z->sh->reserve == NULL) {
        z->sh->reserve = ngx_slab_alloc_locked(z->shpool,
                                               z->sh->reserve_size);
    }
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
    ngx_uint_t              freed;
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

        freed += ngx_http_agent_log_live_free_locked(z, conv,
                                                     (uint64_t) -1);
    }

    if (freed) {
        return freed;
    }

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru) && z->store;
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        if (conv == pinned || conv->state != NGX_HTTP_AGENT_IDLE
            || conv->npending)
        {
            continue;
        }

        ngx_http_agent_conv_subs_reap_locked(z, conv);

        if (ngx_http_agent_conv_evictable_locked(conv)) {
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

        freed += ngx_http_agent_log_live_free_locked(z, conv,
                                                     (uint64_t) -1);

        if (conv->partial && conv != pinned) {
            ngx_http_agent_partial_drop_locked(z, conv, "the zone is full");
            freed++;
        }
    }

    if (freed || z->store || z->keep_idle) {
        return freed;
    }

    /*
     * without a store, the zone is all there is of a conversation: the
     * least recently used idle one, with nothing waiting for a person,
     * goes with its history, so that finished conversations never keep
     * new ones out
     */

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru);
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        if (conv == pinned || conv->state != NGX_HTTP_AGENT_IDLE
            || conv->npending)
        {
            continue;
        }

        ngx_http_agent_conv_subs_reap_locked(z, conv);

        if (ngx_http_agent_conv_at_rest_locked(conv)) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "agent zone \"%V\" is full: conversation \"%*s\" "
                          "at rest dropped", &z->shm_zone->shm.name,
                          conv->id_len, conv->id);

            z->sh->dropped++;
            ngx_http_agent_conv_evict_locked(z, conv);
            return 1;
        }
    }

    return 0;
}


static void
ngx_http_agent_zone_kick_none(void)
{
}


/*
 * The monotonic clock in ms, the same in every process of the machine: a
 * node's lease is counted on it (a pause or a change of the wall clock
 * does not stop it), read afresh rather than the event loop's cached time
 */

ngx_msec_t
ngx_http_agent_zone_clock(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (ngx_msec_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/*
 * What a node (agent_node) keeps in the zone, made by its first use: its
 * lease starts fresh then.  NULL if the zone has no room.
 */

ngx_http_agent_node_sh_t *
ngx_http_agent_zone_node_locked(ngx_http_agent_zone_t *z)
{
    ngx_http_agent_node_sh_t  *node;

    if (z->sh->node) {
        return z->sh->node;
    }

    node = ngx_slab_calloc_locked(z->shpool, sizeof(ngx_http_agent_node_sh_t));
    if (node == NULL) {
        return NULL;
    }

    node->beat = ngx_http_agent_zone_clock();
    z->sh->node = node;

    return node;
}


/* lapses of the node's lease that dropped the zone, ever (0 off a node) */

ngx_uint_t
ngx_http_agent_zone_drops(ngx_http_agent_zone_t *z)
{
    ngx_http_agent_node_sh_t  *node;

    node = z->sh->node;

    return node ? node->drops : 0;
}
