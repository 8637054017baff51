
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_budget.h"


/*
 * Budgets: token and model call limits per key, in the style of
 * limit_req.  A zone of its own holds two rbtrees: the counters of each
 * key (fixed windows of each limit's period, aligned to the epoch), and
 * which key each conversation counts against.  The key is a request's
 * (the sender of the message, say $remote_user), while model calls are
 * made by the turn, which has no such request: a message binds its
 * conversation to the key, and the turn finds it there, on any worker.
 */

#define NGX_HTTP_AGENT_BUDGET_KEY_MAX    256

/* the largest step of a counter, which is signed: a refund is negative */
#define NGX_HTTP_AGENT_BUDGET_STEP       0x7fffffffffffffffULL

#define NGX_HTTP_AGENT_BUDGET_KEY        0
#define NGX_HTTP_AGENT_BUDGET_BINDING    1


typedef struct {
    uint64_t                      window;     /* now / period */
    uint64_t                      used;
} ngx_http_agent_budget_count_t;


/*
 * A key's counters, or a conversation's key (sn.node.data tells which);
 * sn.str points to data: the key, or the id followed by its key
 */
typedef struct {
    ngx_str_node_t                sn;
    ngx_queue_t                   lru;
    ngx_http_agent_budget_count_t count[NGX_HTTP_AGENT_BUDGET_NLIMITS];
    size_t                        key_len;
    u_char                        data[1];
} ngx_http_agent_budget_node_t;


/* what is spent: the limit, and when it frees again */
typedef struct {
    ngx_uint_t                    which;
    time_t                        retry_after;
} ngx_http_agent_budget_spent_t;


static ngx_http_agent_budget_node_t *ngx_http_agent_budget_find_locked(
    ngx_rbtree_t *tree, ngx_str_t *name);
static ngx_http_agent_budget_node_t *ngx_http_agent_budget_add_locked(
    ngx_http_agent_budget_zone_t *bz, ngx_uint_t kind, ngx_str_t *name,
    ngx_str_t *key);
static void ngx_http_agent_budget_free_locked(ngx_http_agent_budget_zone_t *bz,
    ngx_http_agent_budget_node_t *bn);
static ngx_http_agent_budget_node_t *ngx_http_agent_budget_counters_locked(
    ngx_http_agent_budget_zone_t *bz, ngx_str_t *id);
static ngx_int_t ngx_http_agent_budget_spent(ngx_http_agent_budget_zone_t *bz,
    ngx_http_agent_budget_node_t *bn, time_t now,
    ngx_http_agent_budget_spent_t *spent);
static void ngx_http_agent_budget_add(ngx_http_agent_budget_zone_t *bz,
    ngx_http_agent_budget_node_t *bn, ngx_uint_t which, time_t now,
    int64_t n);
static ngx_int_t ngx_http_agent_budget_message(ngx_http_request_t *r,
    ngx_str_t *id);
static ngx_int_t ngx_http_agent_budget_check_locked(
    ngx_http_agent_budget_zone_t *bz, ngx_str_t *key,
    ngx_http_agent_budget_spent_t *spent);
static void ngx_http_agent_budget_bind_locked(
    ngx_http_agent_budget_zone_t *bz, ngx_str_t *id, ngx_str_t *key);
static ngx_int_t ngx_http_agent_budget_key(ngx_http_request_t *r,
    ngx_http_agent_budget_zone_t *bz, ngx_str_t *key);
static ngx_int_t ngx_http_agent_budget_refuse(ngx_http_request_t *r,
    ngx_http_agent_budget_zone_t *bz, ngx_http_agent_budget_spent_t *spent);


char  *ngx_http_agent_budget_names[] = { "tokens", "requests" };


static ngx_http_agent_budget_node_t *
ngx_http_agent_budget_find_locked(ngx_rbtree_t *tree, ngx_str_t *name)
{
    return (ngx_http_agent_budget_node_t *)
               ngx_str_rbtree_lookup(tree, name,
                                     ngx_crc32_short(name->data, name->len));
}


/* a new entry; a full zone gives up its least recently used ones */

static ngx_http_agent_budget_node_t *
ngx_http_agent_budget_add_locked(ngx_http_agent_budget_zone_t *bz,
    ngx_uint_t kind, ngx_str_t *name, ngx_str_t *key)
{
    size_t                         size;
    ngx_uint_t                     tries;
    ngx_queue_t                   *q;
    ngx_http_agent_budget_node_t  *bn;

    size = offsetof(ngx_http_agent_budget_node_t, data) + name->len
           + (key ? key->len : 0);

    for (tries = 0; /* void */ ; tries++) {

        bn = ngx_slab_alloc_locked(bz->shpool, size);

        if (bn != NULL) {
            break;
        }

        if (tries == 16 || ngx_queue_empty(&bz->sh->lru)) {
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                          "agent budget zone \"%V\" is full", &bz->name);
            return NULL;
        }

        q = ngx_queue_last(&bz->sh->lru);

        ngx_http_agent_budget_free_locked(bz,
            ngx_queue_data(q, ngx_http_agent_budget_node_t, lru));
    }

    ngx_memzero(bn, offsetof(ngx_http_agent_budget_node_t, data));

    bn->sn.node.key = ngx_crc32_short(name->data, name->len);
    bn->sn.node.data = (u_char) kind;
    bn->sn.str.data = bn->data;
    bn->sn.str.len = name->len;
    ngx_memcpy(bn->data, name->data, name->len);

    if (key) {
        bn->key_len = key->len;
        ngx_memcpy(bn->data + name->len, key->data, key->len);
    }

    ngx_rbtree_insert(kind == NGX_HTTP_AGENT_BUDGET_KEY ? &bz->sh->keys
                                                        : &bz->sh->convs,
                      &bn->sn.node);

    ngx_queue_insert_head(&bz->sh->lru, &bn->lru);

    return bn;
}


static void
ngx_http_agent_budget_free_locked(ngx_http_agent_budget_zone_t *bz,
    ngx_http_agent_budget_node_t *bn)
{
    ngx_rbtree_delete(bn->sn.node.data == NGX_HTTP_AGENT_BUDGET_KEY
                      ? &bz->sh->keys : &bz->sh->convs, &bn->sn.node);
    ngx_queue_remove(&bn->lru);
    ngx_slab_free_locked(bz->shpool, bn);
}


/* the counters a conversation's model calls go to, or NULL */

static ngx_http_agent_budget_node_t *
ngx_http_agent_budget_counters_locked(ngx_http_agent_budget_zone_t *bz,
    ngx_str_t *id)
{
    ngx_str_t                      key;
    ngx_http_agent_budget_node_t  *binding, *bn;

    binding = ngx_http_agent_budget_find_locked(&bz->sh->convs, id);

    if (binding == NULL) {
        return NULL;
    }

    ngx_queue_remove(&binding->lru);
    ngx_queue_insert_head(&bz->sh->lru, &binding->lru);

    key.data = binding->data + binding->sn.str.len;
    key.len = binding->key_len;

    bn = ngx_http_agent_budget_find_locked(&bz->sh->keys, &key);

    if (bn == NULL) {
        /* the binding may be what the allocation gives up: copy the key */

        key.data = ngx_alloc(key.len, ngx_cycle->log);
        if (key.data == NULL) {
            return NULL;
        }

        ngx_memcpy(key.data, binding->data + binding->sn.str.len, key.len);

        bn = ngx_http_agent_budget_add_locked(bz, NGX_HTTP_AGENT_BUDGET_KEY,
                                              &key, NULL);
        ngx_free(key.data);

        return bn;
    }

    ngx_queue_remove(&bn->lru);
    ngx_queue_insert_head(&bz->sh->lru, &bn->lru);

    return bn;
}


/* NGX_DECLINED: a limit of the key is spent in its current window */

static ngx_int_t
ngx_http_agent_budget_spent(ngx_http_agent_budget_zone_t *bz,
    ngx_http_agent_budget_node_t *bn, time_t now,
    ngx_http_agent_budget_spent_t *spent)
{
    time_t                          ra;
    uint64_t                        window;
    ngx_uint_t                      i;
    ngx_int_t                       rc;
    ngx_http_agent_budget_limit_t  *l;

    rc = NGX_OK;

    for (i = 0; i < NGX_HTTP_AGENT_BUDGET_NLIMITS; i++) {
        l = &bz->limits[i];

        if (l->limit == 0) {
            continue;
        }

        window = now / l->period;

        if (bn->count[i].window != window || bn->count[i].used < l->limit) {
            continue;
        }

        ra = (time_t) ((window + 1) * l->period - now);

        if (rc == NGX_OK || ra > spent->retry_after) {
            spent->which = i;
            spent->retry_after = ra;
        }

        rc = NGX_DECLINED;
    }

    return rc;
}


static void
ngx_http_agent_budget_add(ngx_http_agent_budget_zone_t *bz,
    ngx_http_agent_budget_node_t *bn, ngx_uint_t which, time_t now,
    int64_t n)
{
    uint64_t                        window;
    ngx_http_agent_budget_count_t  *c;

    if (bz->limits[which].limit == 0) {
        return;
    }

    window = now / bz->limits[which].period;
    c = &bn->count[which];

    if (c->window != window) {
        c->window = window;
        c->used = 0;
    }

    /* a count saturates: it never wraps into credit */

    if (n < 0) {
        c->used = (c->used > (uint64_t) -(n + 1)) ? c->used + n : 0;
        return;
    }

    c->used += n;

    if (c->used < (uint64_t) n) {
        c->used = (uint64_t) -1;
    }
}


/* NGX_DECLINED: the key is empty, and nothing is counted for it */

static ngx_int_t
ngx_http_agent_budget_key(ngx_http_request_t *r,
    ngx_http_agent_budget_zone_t *bz, ngx_str_t *key)
{
    if (ngx_http_complex_value(r, &bz->key, key) != NGX_OK) {
        return NGX_ERROR;
    }

    if (key->len == 0) {
        return NGX_DECLINED;
    }

    if (key->len > NGX_HTTP_AGENT_BUDGET_KEY_MAX) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "agent budget zone \"%V\": the key is longer than %d "
                      "bytes", &bz->name, NGX_HTTP_AGENT_BUDGET_KEY_MAX);
        return NGX_ERROR;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_budget_request(ngx_http_request_t *r)
{
    return ngx_http_agent_budget_message(r, NULL);
}


void
ngx_http_agent_budget_bind(ngx_http_request_t *r, ngx_str_t *id)
{
    (void) ngx_http_agent_budget_message(r, id);
}


/*
 * Each budget of the location, by the request's key: without id, is one
 * spent (the 429 sent)?  With id, the conversation's model calls count
 * against the key from now on (or against none, for an empty key).
 */

static ngx_int_t
ngx_http_agent_budget_message(ngx_http_request_t *r, ngx_str_t *id)
{
    ngx_int_t                       rc;
    ngx_str_t                       key;
    ngx_uint_t                      i;
    ngx_http_agent_budget_ref_t    *ref;
    ngx_http_agent_budget_zone_t   *bz;
    ngx_http_agent_loc_conf_t      *alcf;
    ngx_http_agent_budget_spent_t   spent;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (alcf->budgets == NULL) {
        return NGX_DECLINED;
    }

    ref = alcf->budgets->elts;

    for (i = 0; i < alcf->budgets->nelts; i++) {
        bz = ref[i].zone;

        rc = ngx_http_agent_budget_key(r, bz, &key);

        if (rc == NGX_ERROR) {
            if (id) {
                continue;
            }

            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (id == NULL && rc == NGX_DECLINED) {
            continue;
        }

        ngx_shmtx_lock(&bz->shpool->mutex);

        if (id) {
            ngx_http_agent_budget_bind_locked(bz, id,
                                              rc == NGX_OK ? &key : NULL);
            rc = NGX_OK;

        } else {
            rc = ngx_http_agent_budget_check_locked(bz, &key, &spent);
        }

        ngx_shmtx_unlock(&bz->shpool->mutex);

        if (rc == NGX_DECLINED) {
            return ngx_http_agent_budget_refuse(r, bz, &spent);
        }
    }

    return NGX_DECLINED;
}


static ngx_int_t
ngx_http_agent_budget_check_locked(ngx_http_agent_budget_zone_t *bz,
    ngx_str_t *key, ngx_http_agent_budget_spent_t *spent)
{
    ngx_http_agent_budget_node_t  *bn;

    bn = ngx_http_agent_budget_find_locked(&bz->sh->keys, key);

    if (bn == NULL) {
        return NGX_OK;
    }

    return ngx_http_agent_budget_spent(bz, bn, ngx_time(), spent);
}


static void
ngx_http_agent_budget_bind_locked(ngx_http_agent_budget_zone_t *bz,
    ngx_str_t *id, ngx_str_t *key)
{
    ngx_http_agent_budget_node_t  *binding;

    binding = ngx_http_agent_budget_find_locked(&bz->sh->convs, id);

    if (binding
        && (key == NULL
            || ngx_memn2cmp(binding->data + binding->sn.str.len, key->data,
                            binding->key_len, key->len)
               != 0))
    {
        ngx_http_agent_budget_free_locked(bz, binding);
        binding = NULL;
    }

    if (binding) {
        ngx_queue_remove(&binding->lru);
        ngx_queue_insert_head(&bz->sh->lru, &binding->lru);

    } else if (key) {
        (void) ngx_http_agent_budget_add_locked(bz,
                                                NGX_HTTP_AGENT_BUDGET_BINDING,
                                                id, key);
    }
}


/* 429 with Retry-After: when the spent limit's window ends */

static ngx_int_t
ngx_http_agent_budget_refuse(ngx_http_request_t *r,
    ngx_http_agent_budget_zone_t *bz, ngx_http_agent_budget_spent_t *spent)
{
    u_char           *p;
    ngx_table_elt_t  *h;

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "agent budget zone \"%V\": %s spent, %T s left in the "
                  "window", &bz->name,
                  ngx_http_agent_budget_names[spent->which],
                  spent->retry_after);

    h = ngx_list_push(&r->headers_out.headers);
    p = ngx_pnalloc(r->pool, NGX_TIME_T_LEN + 80 + bz->name.len);

    if (h == NULL || p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memzero(h, sizeof(ngx_table_elt_t));

    h->hash = 1;
    ngx_str_set(&h->key, "Retry-After");
    h->value.data = p;
    h->value.len = ngx_sprintf(p, "%T", spent->retry_after) - p;

    p += h->value.len;

    ngx_sprintf(p, "the %s budget is spent; it renews in %T s%Z",
                ngx_http_agent_budget_names[spent->which],
                spent->retry_after);

    return ngx_http_agent_json_error(r, NGX_HTTP_TOO_MANY_REQUESTS,
                                     "budget_exceeded", (char *) p);
}


ngx_int_t
ngx_http_agent_budget_spend(ngx_str_t *id, ngx_pool_t *pool,
    ngx_str_t *fields)
{
    u_char                          reason[128];
    time_t                          now;
    yajl_gen                        g;
    ngx_int_t                       rc;
    ngx_uint_t                      i, j, failed;
    ngx_http_agent_budget_node_t   *bn;
    ngx_http_agent_budget_zone_t  **bzp, *bz;
    ngx_http_agent_main_conf_t     *amcf;
    ngx_http_agent_budget_spent_t   spent;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (amcf == NULL || amcf->budgets == NULL) {
        return NGX_OK;
    }

    now = ngx_time();
    bzp = amcf->budgets->elts;
    bz = NULL;

    /* counted where it is allowed; given back if a later zone refuses */

    for (i = 0; i < amcf->budgets->nelts; i++) {
        bz = bzp[i];

        ngx_shmtx_lock(&bz->shpool->mutex);

        bn = ngx_http_agent_budget_counters_locked(bz, id);
        rc = bn ? ngx_http_agent_budget_spent(bz, bn, now, &spent) : NGX_OK;

        if (bn && rc == NGX_OK) {
            ngx_http_agent_budget_add(bz, bn,
                                      NGX_HTTP_AGENT_BUDGET_REQUESTS, now, 1);
        }

        ngx_shmtx_unlock(&bz->shpool->mutex);

        if (rc == NGX_DECLINED) {
            break;
        }
    }

    if (i == amcf->budgets->nelts) {
        return NGX_OK;
    }

    for (j = 0; j < i; j++) {
        ngx_shmtx_lock(&bzp[j]->shpool->mutex);

        bn = ngx_http_agent_budget_counters_locked(bzp[j], id);

        if (bn) {
            ngx_http_agent_budget_add(bzp[j], bn,
                                      NGX_HTTP_AGENT_BUDGET_REQUESTS, now, -1);
        }

        ngx_shmtx_unlock(&bzp[j]->shpool->mutex);
    }

    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "agent budget zone \"%V\": %s spent, the turn of \"%V\" "
                  "fails", &bz->name,
                  ngx_http_agent_budget_names[spent.which], id);

    ngx_sprintf(reason, "the %s budget is spent%Z",
                ngx_http_agent_budget_names[spent.which]);

    ngx_str_set(fields, "{\"reason\":\"the budget is spent\","
                        "\"error\":\"budget_exceeded\"}");

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        return NGX_DECLINED;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "reason");
    failed |= yajl_gen_string(g, reason, ngx_strlen(reason));
    failed |= ngx_http_agent_json_key(g, "error");
    failed |= ngx_http_agent_json_key(g, "budget_exceeded");
    failed |= ngx_http_agent_json_key(g, "budget");
    failed |= ngx_http_agent_json_str(g, &bz->name);
    failed |= ngx_http_agent_json_key(g, "limit");
    failed |= yajl_gen_string(g,
                  (u_char *) ngx_http_agent_budget_names[spent.which],
                  ngx_strlen(ngx_http_agent_budget_names[spent.which]));
    failed |= ngx_http_agent_json_key(g, "retry_after");
    failed |= yajl_gen_integer(g, spent.retry_after);
    failed |= yajl_gen_map_close(g);

    (void) ngx_http_agent_json_result(g, failed, fields);

    return NGX_DECLINED;
}


void
ngx_http_agent_budget_charge(ngx_str_t *id, uint64_t tokens)
{
    time_t                          now;
    uint64_t                        step;
    ngx_uint_t                      i;
    ngx_http_agent_budget_node_t   *bn;
    ngx_http_agent_budget_zone_t  **bzp;
    ngx_http_agent_main_conf_t     *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (tokens == 0 || amcf == NULL || amcf->budgets == NULL) {
        return;
    }

    now = ngx_time();
    bzp = amcf->budgets->elts;
    step = ngx_min(tokens, NGX_HTTP_AGENT_BUDGET_STEP);

    for (i = 0; i < amcf->budgets->nelts; i++) {
        ngx_shmtx_lock(&bzp[i]->shpool->mutex);

        bn = ngx_http_agent_budget_counters_locked(bzp[i], id);

        if (bn) {
            ngx_http_agent_budget_add(bzp[i], bn,
                                      NGX_HTTP_AGENT_BUDGET_TOKENS, now,
                                      (int64_t) step);
        }

        ngx_shmtx_unlock(&bzp[i]->shpool->mutex);
    }
}
