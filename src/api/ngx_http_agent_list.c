
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_list.h"
#include "ngx_http_agent_list.h"


/*
 * agent_list: the conversations of the location's agent that belong to
 * the request's owner (every owner's where agent_owner is not set), in
 * id order, a page at a time: GET [?cursor=ID&limit=N].  Those in the
 * zone, and with a store those that left it, merged by id (the zone's
 * copy is the live one).
 */

#define NGX_HTTP_AGENT_LIST_LIMIT      50
#define NGX_HTTP_AGENT_LIST_MAX        200


typedef struct {
    ngx_http_agent_store_conv_t   c;
    u_char                        id[NGX_HTTP_AGENT_ID_LEN];
} ngx_http_agent_list_item_t;


typedef struct {
    ngx_http_agent_store_list_t   ls;
    ngx_str_t                    *owner;
    ngx_array_t                  *zone;       /* list_item_t, by id */
} ngx_http_agent_list_ctx_t;


static char *ngx_http_agent_list_args(ngx_http_request_t *r,
    ngx_http_agent_list_ctx_t *ctx);
static ngx_int_t ngx_http_agent_list_zone(ngx_http_request_t *r,
    ngx_http_agent_list_ctx_t *ctx);
static void ngx_http_agent_list_insert(ngx_array_t *a,
    ngx_http_agent_list_item_t *item, ngx_uint_t max);
static void ngx_http_agent_list_stored(ngx_http_request_t *r,
    ngx_http_agent_store_list_t *ls, ngx_int_t rc);
static ngx_int_t ngx_http_agent_list_answer(ngx_http_request_t *r,
    ngx_http_agent_list_ctx_t *ctx, ngx_array_t *stored);


/* agent_list; */

char *
ngx_http_agent_list(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    return ngx_http_agent_api_set(cf, cmd, conf, ngx_http_agent_list_handler);
}


ngx_int_t
ngx_http_agent_list_handler(ngx_http_request_t *r)
{
    char                        *err;
    ngx_int_t                    rc;
    ngx_http_agent_list_ctx_t   *ctx;
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_http_agent_main_conf_t  *amcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_agent_json_method(r, "GET");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_list_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_agent_api_owner_check(r, &ctx->owner, &rc) != NGX_OK) {
        return rc;
    }

    err = ngx_http_agent_list_args(r, ctx);

    if (err) {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_argument", err);
    }

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    ctx->ls.agent = alcf->agent->name;
    ctx->ls.any_owner = (ctx->owner == NULL);

    if (ctx->owner) {
        ctx->ls.owner = *ctx->owner;
    }

    if (ngx_http_agent_list_zone(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (amcf->store == NULL) {
        return ngx_http_agent_list_answer(r, ctx, NULL);
    }

    ctx->ls.handler = ngx_http_agent_list_stored;
    ngx_http_set_ctx(r, ctx, ngx_http_agent_module);

    if (ngx_http_agent_store_list(r, &ctx->ls) != NGX_OK) {
        return ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                         "unavailable",
                                         "the store cannot be read");
    }

    return NGX_DONE;
}


/* ?cursor=ID (the last id of the previous page) &limit=N; NULL: good */

static char *
ngx_http_agent_list_args(ngx_http_request_t *r,
    ngx_http_agent_list_ctx_t *ctx)
{
    ngx_int_t  n;
    ngx_str_t  value;

    ctx->ls.limit = NGX_HTTP_AGENT_LIST_LIMIT;
    ngx_str_set(&ctx->ls.after, "");

    if (ngx_http_arg(r, (u_char *) "cursor", 6, &value) == NGX_OK
        && value.len)
    {
        if (ngx_http_agent_api_id_check(&value) != NGX_OK) {
            return "the cursor is not a conversation id";
        }

        ctx->ls.after = value;
    }

    if (ngx_http_arg(r, (u_char *) "limit", 5, &value) == NGX_OK) {
        n = ngx_atoi(value.data, value.len);

        if (n < 1 || n > NGX_HTTP_AGENT_LIST_MAX) {
            return "the limit must be 1 to 200";
        }

        ctx->ls.limit = n;
    }

    return NULL;
}


/*
 * The zone's conversations of the agent and the owner after the cursor:
 * the first limit + 1 by id (one more tells that a page follows), their
 * ids copied under the lock
 */

static ngx_int_t
ngx_http_agent_list_zone(ngx_http_request_t *r,
    ngx_http_agent_list_ctx_t *ctx)
{
    ngx_uint_t                    i;
    ngx_queue_t                  *q;
    ngx_http_agent_zone_t        *z;
    ngx_http_agent_conv_t        *conv;
    ngx_http_agent_list_item_t    item, *it;
    ngx_http_agent_main_conf_t   *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    ctx->zone = ngx_array_create(r->pool, ctx->ls.limit + 1,
                                 sizeof(ngx_http_agent_list_item_t));
    if (ctx->zone == NULL) {
        return NGX_ERROR;
    }

    ngx_http_agent_zone_lock(z);

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru);
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        if (conv->seq == 0
            || ngx_memn2cmp(conv->agent, ctx->ls.agent.data,
                            conv->agent_len, ctx->ls.agent.len)
               != 0
            || (ctx->owner
                && (conv->owner_len == 0
                    || ngx_memn2cmp(conv->owner, ctx->owner->data,
                                    conv->owner_len, ctx->owner->len)
                       != 0))
            || ngx_memn2cmp(conv->id, ctx->ls.after.data, conv->id_len,
                            ctx->ls.after.len)
               <= 0)
        {
            continue;
        }

        ngx_memcpy(item.id, conv->id, conv->id_len);
        item.c.id.len = conv->id_len;
        item.c.state = ngx_http_agent_state_names[conv->state];

        /* ngx_current_msec is monotonic: activity is told since the epoch */

        item.c.updated = (uint64_t) ngx_time() * 1000
                         - (ngx_current_msec - conv->updated);
        item.c.pending = conv->npending;

        ngx_http_agent_list_insert(ctx->zone, &item, ctx->ls.limit + 1);
    }

    ngx_http_agent_zone_unlock(z);

    it = ctx->zone->elts;

    for (i = 0; i < ctx->zone->nelts; i++) {
        it[i].c.id.data = it[i].id;
    }

    return NGX_OK;
}


/* into a by id sorted array of at most max items */

static void
ngx_http_agent_list_insert(ngx_array_t *a, ngx_http_agent_list_item_t *item,
    ngx_uint_t max)
{
    ngx_uint_t                   i;
    ngx_http_agent_list_item_t  *it;

    it = a->elts;

    for (i = a->nelts; i > 0; i--) {
        if (ngx_memn2cmp(it[i - 1].id, item->id, it[i - 1].c.id.len,
                         item->c.id.len)
            < 0)
        {
            break;
        }
    }

    if (i == max) {
        return;
    }

    if (a->nelts < max) {
        a->nelts++;
    }

    ngx_memmove(&it[i + 1], &it[i],
                (a->nelts - 1 - i) * sizeof(ngx_http_agent_list_item_t));

    it[i] = *item;
}


static void
ngx_http_agent_list_stored(ngx_http_request_t *r,
    ngx_http_agent_store_list_t *ls, ngx_int_t rc)
{
    ngx_http_agent_list_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_agent_module);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "unavailable",
                                      "the store cannot be read"));
        return;
    }

    ngx_http_finalize_request(r,
                              ngx_http_agent_list_answer(r, ctx, ls->convs));
}


/*
 * {"conversations":[{"id","agent","state","last_activity","pending"}],
 *  "next_cursor":ID or null}: the zone's and the store's merged by id
 */

static ngx_int_t
ngx_http_agent_list_answer(ngx_http_request_t *r,
    ngx_http_agent_list_ctx_t *ctx, ngx_array_t *stored)
{
    yajl_gen                      g;
    ngx_int_t                     cmp;
    ngx_str_t                     json, *last;
    ngx_uint_t                    i, j, n, ns, failed;
    ngx_http_agent_list_item_t   *zone;
    ngx_http_agent_store_conv_t  *st, *c;

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    zone = ctx->zone->elts;
    st = stored ? stored->elts : NULL;
    ns = stored ? stored->nelts : 0;
    last = NULL;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "conversations");
    failed |= yajl_gen_array_open(g);

    for (i = 0, j = 0, n = 0; i < ctx->zone->nelts || j < ns; n++) {

        if (i == ctx->zone->nelts) {
            cmp = 1;

        } else if (j == ns) {
            cmp = -1;

        } else {
            cmp = ngx_memn2cmp(zone[i].c.id.data, st[j].id.data,
                               zone[i].c.id.len, st[j].id.len);
        }

        if (n == ctx->ls.limit) {
            break;
        }

        c = (cmp <= 0) ? &zone[i].c : &st[j];

        i += (cmp <= 0);
        j += (cmp >= 0);

        last = &c->id;

        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "id");
        failed |= ngx_http_agent_json_str(g, &c->id);
        failed |= ngx_http_agent_json_key(g, "agent");
        failed |= ngx_http_agent_json_str(g, &ctx->ls.agent);
        failed |= ngx_http_agent_json_key(g, "state");
        failed |= ngx_http_agent_json_str(g, &c->state);
        failed |= ngx_http_agent_json_key(g, "last_activity");
        failed |= yajl_gen_integer(g, (long long) c->updated);
        failed |= ngx_http_agent_json_key(g, "pending");
        failed |= yajl_gen_integer(g, (long long) c->pending);
        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);
    failed |= ngx_http_agent_json_key(g, "next_cursor");

    /* a page is full and more follow */

    if (n == ctx->ls.limit && (i < ctx->zone->nelts || j < ns)) {
        failed |= ngx_http_agent_json_str(g, last);

    } else {
        failed |= yajl_gen_null(g);
    }

    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &json) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_json_send(r, NGX_HTTP_OK, &json);
}
