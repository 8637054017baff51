
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_history.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_notify.h"
#include "ngx_http_agent_provider.h"


/*
 * A conversation comes back from the store with the current turn's
 * events (from its user_msg on): its waiting calls with their original
 * deadlines, and, if the log ends inside a turn, the turn taken over as
 * after a worker's death.  Older history stays in the store.
 */

struct ngx_http_agent_revival_s {
    ngx_http_request_t           *request;
    ngx_http_agent_revive_ctx_t  *ctx;
    ngx_http_agent_zone_t        *zone;
    ngx_uint_t                    evicted;
    ngx_uint_t                    reads;
    ngx_msec_t                    start;
};


#define NGX_HTTP_AGENT_REVIVE_READS  8


/* a call of the turn read back */
typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     name;
    ngx_uint_t                    executor;
    ngx_uint_t                    kind;
    uint64_t                      deadline;
    unsigned                      suspended:1;
    unsigned                      resolved:1;
    unsigned                      result:1;
} ngx_http_agent_revive_call_t;


static void ngx_http_agent_revive_read(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static ngx_int_t ngx_http_agent_revive_created(ngx_http_agent_zone_t *z,
    ngx_http_agent_store_read_t *rd);
static ngx_int_t ngx_http_agent_revive_calls(ngx_pool_t *pool,
    ngx_http_agent_store_read_t *rd, ngx_array_t *calls, ngx_uint_t *turn);
static ngx_int_t ngx_http_agent_revive_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_store_read_t *rd, ngx_array_t *calls, ngx_uint_t turn,
    ngx_uint_t *resume);
static void ngx_http_agent_revive_resume(ngx_http_agent_zone_t *z,
    ngx_str_t *id, ngx_str_t *agent, ngx_uint_t turn, ngx_uint_t resume);
static void ngx_http_agent_revive_again(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_revive_rerun(ngx_http_request_t *r);
static void ngx_http_agent_revive_ctx_cleanup(void *data);
static void ngx_http_agent_history_read(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static void ngx_http_agent_turn_history_read(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static void ngx_http_agent_revive_stop_turns(ngx_event_t *ev);


/* posted once a lapse dropped the zone: this worker's turns stop */
static ngx_event_t  ngx_http_agent_revive_stop;


ngx_http_agent_revive_ctx_t *
ngx_http_agent_revive_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t  *cln;

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_agent_revive_ctx_cleanup) {
            return cln->data;
        }
    }

    return NULL;
}


static ngx_http_agent_revive_ctx_t *
ngx_http_agent_revive_ctx_get(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t           *cln;
    ngx_http_agent_revive_ctx_t  *ctx;

    ctx = ngx_http_agent_revive_ctx(r);
    if (ctx) {
        return ctx;
    }

    cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_http_agent_revive_ctx_t));
    if (cln == NULL) {
        return NULL;
    }

    ctx = cln->data;
    ngx_memzero(ctx, sizeof(ngx_http_agent_revive_ctx_t));
    ctx->request = r;

    cln->handler = ngx_http_agent_revive_ctx_cleanup;

    return ctx;
}


ngx_http_agent_revive_ctx_t *
ngx_http_agent_revive_follower(ngx_http_request_t *r)
{
    ngx_http_agent_revive_ctx_t  *ctx;

    ctx = ngx_http_agent_revive_ctx_get(r);

    if (ctx) {
        ctx->follow = 1;
    }

    return ctx;
}


/* the request goes first: a revival under way finishes for nobody */

static void
ngx_http_agent_revive_ctx_cleanup(void *data)
{
    ngx_http_agent_revive_ctx_t *ctx = data;

    if (ctx->revival) {
        ctx->revival->request = NULL;
        ctx->revival->ctx = NULL;
    }
}


ngx_int_t
ngx_http_agent_revive(ngx_http_request_t *r, ngx_str_t *id)
{
    ngx_int_t                     rc;
    ngx_http_agent_revival_t     *rv;
    ngx_http_agent_revive_ctx_t  *ctx;
    ngx_http_agent_main_conf_t   *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    if (amcf->store == NULL || id->len == 0
        || id->len > NGX_HTTP_AGENT_ID_LEN)
    {
        return NGX_DECLINED;
    }

    ctx = NULL;

    if (r) {
        ctx = ngx_http_agent_revive_ctx_get(r);
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        if (ctx->revived) {
            return NGX_DECLINED;
        }

        ctx->revived = 1;
    }

    /* its own memory: it outlives a request that goes away */

    rv = ngx_alloc(sizeof(ngx_http_agent_revival_t), ngx_cycle->log);
    if (rv == NULL) {
        return NGX_ERROR;
    }

    rv->request = r;
    rv->ctx = ctx;
    rv->reads = 0;
    rv->zone = amcf->zone;
    rv->start = ngx_current_msec;

    ngx_http_agent_zone_lock(rv->zone);
    rv->evicted = rv->zone->sh->evicted;
    ngx_http_agent_zone_unlock(rv->zone);

    rc = ngx_http_agent_store_read(NULL, id, NGX_HTTP_AGENT_STORE_TAIL, 0,
                                   ngx_http_agent_revive_read, rv);

    if (rc != NGX_OK) {
        ngx_free(rv);
        return rc;
    }

    if (r) {
        ctx->revival = rv;
        r->main->count++;
    }

    return NGX_DONE;
}


static void
ngx_http_agent_revive_read(ngx_http_agent_store_read_t *rd, ngx_int_t rc,
    void *data)
{
    ngx_http_agent_revival_t *rv = data;

    ngx_uint_t              turn, resume;
    ngx_array_t             calls;
    ngx_pool_t             *pool;
    ngx_http_request_t     *r;
    ngx_http_agent_conv_t  *conv;

    r = rv->request;

    if (rv->ctx) {
        rv->ctx->revival = NULL;
    }

    pool = NULL;
    resume = 0;
    turn = 0;

    if (rc == NGX_OK && rd->elsewhere.data) {

        /*
         * another node owns it, and lives: the front tier asks that one;
         * a subscriber is served here from the store, as a follower
         */

        if (r && rv->ctx && rv->ctx->follow) {
            rv->ctx->elsewhere = 1;
            ngx_free(rv);
            ngx_http_agent_revive_again(r);
            return;
        }

        ngx_free(rv);

        if (r) {
            ngx_http_finalize_request(r,
                ngx_http_agent_store_elsewhere_answer(r, &rd->elsewhere));
        }

        return;
    }

    if (rc == NGX_OK && rd->last_seq == 0 && rd->agent.len) {
        rc = ngx_http_agent_revive_created(rv->zone, rd);
        goto done;
    }

    if (rc != NGX_OK || rd->last_seq == 0) {
        goto done;
    }

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL
        || ngx_array_init(&calls, pool, 4,
                          sizeof(ngx_http_agent_revive_call_t))
           != NGX_OK
        || ngx_http_agent_revive_calls(pool, rd, &calls, &turn) != NGX_OK)
    {
        rc = NGX_ERROR;
        goto done;
    }

    ngx_http_agent_zone_lock(rv->zone);

    conv = ngx_http_agent_conv_find_locked(rv->zone, &rd->id);

    if (conv == NULL && rv->zone->sh->evicted != rv->evicted
        && rv->reads++ < NGX_HTTP_AGENT_REVIVE_READS)
    {
        /*
         * it may have come back and left again while this was read:
         * what was read may be older than what left, read it again
         */
        rv->evicted = rv->zone->sh->evicted;

        ngx_http_agent_zone_unlock(rv->zone);
        ngx_destroy_pool(pool);

        if (rv->ctx) {
            rv->ctx->revival = rv;
        }

        if (ngx_http_agent_store_read(NULL, &rd->id,
                                      NGX_HTTP_AGENT_STORE_TAIL, 0,
                                      ngx_http_agent_revive_read, rv)
            == NGX_OK)
        {
            return;
        }

        if (rv->ctx) {
            rv->ctx->revival = NULL;
        }

        pool = NULL;
        rc = NGX_ERROR;
        goto done;
    }

    if (conv == NULL && rv->zone->sh->evicted != rv->evicted) {
        /* the zone is too busy evicting to tell */
        rc = NGX_ERROR;

    } else if (conv == NULL) {
        rc = ngx_http_agent_revive_locked(rv->zone, rd, &calls, turn,
                                          &resume);
    }

    ngx_http_agent_zone_unlock(rv->zone);

    if (conv == NULL && rc == NGX_OK) {
        ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                      "agent conversation \"%V\" revived from the store: "
                      "seq %uL, %ui events in the zone, in %M ms",
                      &rd->id, rd->last_seq, rd->events->nelts,
                      ngx_current_msec - rv->start);

        if (resume) {
            ngx_http_agent_revive_resume(rv->zone, &rd->id, &rd->agent,
                                         resume == 2 ? turn + 1 : turn,
                                         resume == 1);
        }
    }

done:

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent conversation \"%V\" could not be revived",
                      &rd->id);
    }

    if (pool) {
        ngx_destroy_pool(pool);
    }

    ngx_free(rv);

    if (r == NULL) {
        return;
    }

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, ngx_http_agent_store_unread_answer(r));
        return;
    }

    ngx_http_agent_revive_again(r);
}


/*
 * An id agent_create made, with no event yet (its row only, written by
 * another node, or before a restart): its record again, bound to its
 * agent and owner as it was made, unused until its first message
 */

static ngx_int_t
ngx_http_agent_revive_created(ngx_http_agent_zone_t *z,
    ngx_http_agent_store_read_t *rd)
{
    ngx_http_agent_conv_t  *conv;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &rd->id);

    if (conv == NULL) {
        conv = ngx_http_agent_conv_create_locked(z, &rd->id);

        if (conv == NULL) {
            ngx_http_agent_zone_unlock(z);
            return NGX_ERROR;
        }

        ngx_http_agent_conv_bind_locked(conv, &rd->agent, &rd->owner);
        ngx_http_agent_conv_mint_locked(z, conv);
        conv->epoch = rd->epoch;
    }

    ngx_http_agent_zone_unlock(z);

    return NGX_OK;
}


/*
 * Another node took the conversation (the store's fence refused this
 * node's write): it leaves the zone with whatever it had not written,
 * its subscribers find it gone and end, and a turn running it fails at
 * its next event.  Requests for it are then answered by its owner.
 */

void
ngx_http_agent_revive_lost(ngx_str_t *id)
{
    ngx_uint_t                   n;
    ngx_pid_t                    pids[NGX_HTTP_AGENT_SUB_WORKERS + 1];
    ngx_queue_t                 *q;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    z = amcf->zone;
    n = 0;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, id);

    if (conv) {
        n = ngx_http_agent_conv_sub_pids_locked(conv, pids);

        if (conv->lease) {
            pids[n++] = conv->lease;
            ngx_queue_remove(&conv->leased);
            conv->lease = 0;
        }

        while (!ngx_queue_empty(&conv->queued)) {
            q = ngx_queue_head(&conv->queued);
            ngx_queue_remove(q);
            ngx_slab_free_locked(z->shpool,
                                 ngx_queue_data(q, ngx_http_agent_queued_t,
                                                queue));
        }

        conv->nqueued = 0;

        ngx_http_agent_conv_evict_locked(z, conv);
    }

    ngx_http_agent_zone_unlock(z);

    if (n) {
        ngx_http_agent_wake(id, pids, n);
    }
}


/*
 * A node's lease (agent_node): it acts on the conversations of its zone
 * only while its last heartbeat that succeeded was sent less than its
 * ttl ago (less a tenth, for the clocks' rates and the checks' delay),
 * which no other node can have judged dead.  Once it lapsed (the node
 * paused, or cut from the store), another node may have taken any of
 * them: all leave the zone as a conversation whose ownership was lost
 * does, once per lapse, and a request for one is revived, whose claim
 * finds it another node's (421) or this node's still.  NGX_DECLINED: the
 * lease lapsed (the heartbeat that renews it is not back yet).
 */

ngx_int_t
ngx_http_agent_revive_lease(void)
{
    u_char                       *p;
    ngx_str_t                    *ids;
    ngx_msec_t                    now, limit, age;
    ngx_uint_t                    i, n, drop;
    ngx_queue_t                  *q;
    ngx_http_agent_zone_t        *z;
    ngx_http_agent_conv_t        *conv;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_node_sh_t     *nsh;
    ngx_http_agent_store_node_t  *node;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);
    z = amcf->zone;
    node = amcf->node;

    if (node == NULL || z == NULL || amcf->store == NULL) {
        return NGX_OK;
    }

    limit = node->ttl - node->ttl / 10;
    now = ngx_http_agent_zone_clock();

    ngx_http_agent_zone_lock(z);

    nsh = ngx_http_agent_zone_node_locked(z);

    if (nsh == NULL) {
        /* no room to keep the lease: the fence still holds every write */
        ngx_http_agent_zone_unlock(z);
        return NGX_OK;
    }

    age = now - nsh->beat;

    if ((ngx_msec_int_t) age < (ngx_msec_int_t) limit) {
        nsh->lapsed = 0;
        ngx_http_agent_zone_unlock(z);
        return NGX_OK;
    }

    drop = !nsh->lapsed;
    nsh->lapsed = 1;

    if (drop) {
        nsh->drops++;
    }

    ids = NULL;
    n = 0;

    if (drop && z->sh->count) {
        ids = ngx_alloc(z->sh->count * (sizeof(ngx_str_t)
                                        + NGX_HTTP_AGENT_ID_LEN),
                        ngx_cycle->log);
    }

    if (ids) {
        p = (u_char *) &ids[z->sh->count];

        for (q = ngx_queue_head(&z->sh->lru);
             q != ngx_queue_sentinel(&z->sh->lru) && n < z->sh->count;
             q = ngx_queue_next(q))
        {
            conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

            ids[n].data = p;
            ids[n].len = conv->id_len;
            p = ngx_cpymem(p, conv->id, conv->id_len);
            n++;
        }
    }

    ngx_http_agent_zone_unlock(z);

    if (drop) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent node's lease lapsed: its last heartbeat that "
                      "succeeded was sent %M ms ago (ttl %M ms); the %ui "
                      "conversations of its zone are dropped, each is "
                      "claimed again when asked for",
                      age, node->ttl, n);
    }

    for (i = 0; i < n; i++) {
        ngx_http_agent_revive_lost(&ids[i]);
    }

    if (ids) {
        ngx_free(ids);
    }

    /*
     * this worker's turns stop once the caller is done (a turn may be
     * it); the others' when woken (their records' wake-ups), or at their
     * next round of expiry
     */

    if (drop && !ngx_http_agent_revive_stop.posted) {
        ngx_http_agent_revive_stop.handler = ngx_http_agent_revive_stop_turns;
        ngx_http_agent_revive_stop.log = ngx_cycle->log;
        ngx_post_event(&ngx_http_agent_revive_stop, &ngx_posted_events);
    }

    return NGX_DECLINED;
}


static void
ngx_http_agent_revive_stop_turns(ngx_event_t *ev)
{
    ngx_http_agent_turn_cancel_check();
}


/*
 * A turn may go on to a model or tool call unless the node's lease
 * lapsed since it started: its record was dropped then (one there now
 * was revived since, and is another turn's).  NGX_DECLINED: the turn
 * ends writing nothing.
 */

ngx_int_t
ngx_http_agent_revive_turn_held(ngx_http_agent_turn_t *t)
{
    (void) ngx_http_agent_revive_lease();

    if (t->drops == ngx_http_agent_zone_drops(t->zone)) {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                  "agent turn of \"%V\" stops: the node's lease lapsed and "
                  "the conversation left its zone", &t->id);

    return NGX_DECLINED;
}


/*
 * A request for a conversation the zone does not hold: it is revived, or
 * answered 404 when the store does not have it either.
 */

ngx_int_t
ngx_http_agent_revive_not_found(ngx_http_request_t *r, ngx_str_t *id)
{
    switch (ngx_http_agent_revive(r, id)) {

    case NGX_DECLINED:
        return ngx_http_agent_json_error(r, NGX_HTTP_NOT_FOUND, "not_found",
                                         "no such conversation");
    case NGX_DONE:
        return NGX_DONE;

    case NGX_BUSY:
        return ngx_http_agent_store_busy_answer(r);

    default:
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
}


ngx_int_t
ngx_http_agent_revive_answer(ngx_http_request_t *r,
    ngx_http_agent_store_answer_pt answer, ngx_str_t *id, uint64_t from)
{
    ngx_http_agent_revive_ctx_t  *ctx;

    ctx = ngx_http_agent_revive_ctx_get(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->answer = answer;
    ctx->answer_id = *id;
    ctx->answer_from = from;

    return NGX_OK;
}


/* the handler, as the content phase ran it, or the answer it began */

static ngx_int_t
ngx_http_agent_revive_rerun(ngx_http_request_t *r)
{
    ngx_http_agent_revive_ctx_t  *ctx;

    ctx = ngx_http_agent_revive_ctx(r);

    if (ctx && ctx->answer) {
        return ctx->answer(r, &ctx->answer_id, ctx->answer_from);
    }

    return r->content_handler(r);
}


/* the handler runs again */

static void
ngx_http_agent_revive_again(ngx_http_request_t *r)
{
    ngx_connection_t  *c;

    c = r->connection;

    ngx_http_finalize_request(r, ngx_http_agent_revive_rerun(r));
    ngx_http_run_posted_requests(c);
}


/* the turn's calls, and where each stands */

static ngx_int_t
ngx_http_agent_revive_calls(ngx_pool_t *pool, ngx_http_agent_store_read_t *rd,
    ngx_array_t *calls, ngx_uint_t *turn)
{
    char                           err[NGX_HTTP_AGENT_JSON_ERR];
    ngx_str_t                      id, s;
    yajl_val                       root, v;
    ngx_uint_t                     i, j;
    ngx_http_agent_store_event_t  *ev;
    ngx_http_agent_revive_call_t  *call;

    ev = rd->events->elts;

    for (i = 0; i < rd->events->nelts; i++) {

        if (i + 1 < rd->events->nelts
            && (ev[i].type < NGX_HTTP_AGENT_EV_TOOL_CALL
                || ev[i].type > NGX_HTTP_AGENT_EV_RESOLUTION))
        {
            continue;
        }

        root = ngx_http_agent_json_parse(ev[i].data.data, ev[i].data.len,
                                         NGX_HTTP_AGENT_JSON_LOG_DEPTH, err,
                                         sizeof(err));
        if (root == NULL) {
            return NGX_ERROR;
        }

        v = ngx_http_agent_provider_get(root, "turn");
        if (YAJL_IS_INTEGER(v)) {
            *turn = YAJL_GET_INTEGER(v);
        }

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(root, "tool_call_id"), &id)
            != NGX_OK)
        {
            ngx_http_agent_json_free(root);
            continue;
        }

        call = calls->elts;

        for (j = 0; j < calls->nelts; j++) {
            if (call[j].id.len == id.len
                && ngx_strncmp(call[j].id.data, id.data, id.len) == 0)
            {
                break;
            }
        }

        if (j == calls->nelts) {
            if (ev[i].type != NGX_HTTP_AGENT_EV_TOOL_CALL) {
                ngx_http_agent_json_free(root);
                continue;
            }

            call = ngx_array_push(calls);
            if (call == NULL) {
                ngx_http_agent_json_free(root);
                return NGX_ERROR;
            }

            ngx_memzero(call, sizeof(ngx_http_agent_revive_call_t));

            call->id.data = ngx_pstrdup(pool, &id);
            call->id.len = id.len;

            if (call->id.data == NULL) {
                ngx_http_agent_json_free(root);
                return NGX_ERROR;
            }

        } else {
            call = &call[j];
        }

        if (ngx_http_agent_provider_get(root, "during_call") != NULL) {
            /*
             * a question of an MCP server to a running call: the call
             * is sent again, and the server asks again
             */
            ngx_http_agent_json_free(root);
            continue;
        }

        switch (ev[i].type) {

        case NGX_HTTP_AGENT_EV_SUSPENSION:
            call->suspended = 1;

            if (ngx_http_agent_provider_string(
                    ngx_http_agent_provider_get(root, "name"), &s)
                == NGX_OK)
            {
                call->name.data = ngx_pstrdup(pool, &s);
                call->name.len = s.len;
            }

            v = ngx_http_agent_provider_get(root, "deadline");
            call->deadline = YAJL_IS_INTEGER(v) ? YAJL_GET_INTEGER(v) : 0;

            if (ngx_http_agent_provider_string(
                    ngx_http_agent_provider_get(root, "executor"), &s)
                == NGX_OK)
            {
                for (j = 0; ngx_http_agent_executors[j].name.len; j++) {
                    if (ngx_http_agent_executors[j].name.len == s.len
                        && ngx_strncmp(ngx_http_agent_executors[j].name.data,
                                       s.data, s.len) == 0)
                    {
                        call->executor = ngx_http_agent_executors[j].value;
                    }
                }
            }

            if (ngx_http_agent_provider_string(
                    ngx_http_agent_provider_get(root, "kind"), &s)
                == NGX_OK)
            {
                for (j = 1; j <= NGX_HTTP_AGENT_PENDING_CLIENT_EXEC; j++) {
                    if (ngx_http_agent_pending_kinds[j].len == s.len
                        && ngx_strncmp(ngx_http_agent_pending_kinds[j].data,
                                       s.data, s.len) == 0)
                    {
                        call->kind = j;
                    }
                }
            }

            break;

        case NGX_HTTP_AGENT_EV_RESOLUTION:
            call->resolved = 1;
            break;

        case NGX_HTTP_AGENT_EV_TOOL_RESULT:
            call->result = 1;
            break;
        }

        ngx_http_agent_json_free(root);
    }

    return NGX_OK;
}


/*
 * Under the lock: the record, its events, its recent source ids, its
 * waiting calls; the state follows from the log.
 */

static ngx_int_t
ngx_http_agent_revive_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_store_read_t *rd, ngx_array_t *calls, ngx_uint_t turn,
    ngx_uint_t *resume)
{
    ngx_uint_t                      i, waiting, running;
    ngx_http_agent_fsm_t            fsm;
    ngx_http_agent_conv_t          *conv;
    ngx_http_agent_queued_t        *m;
    ngx_http_agent_store_queued_t  *sq;
    ngx_http_agent_source_t        *src;
    ngx_http_agent_store_event_t   *ev;
    ngx_http_agent_revive_call_t   *call;
    ngx_http_agent_store_source_t  *ss;

    if (rd->events->nelts == 0) {
        return NGX_ERROR;
    }

    conv = ngx_http_agent_conv_create_locked(z, &rd->id);
    if (conv == NULL) {
        return NGX_ERROR;
    }

    ngx_http_agent_conv_bind_locked(conv, &rd->agent, &rd->owner);
    conv->turn = turn;
    conv->epoch = rd->epoch;

    ev = rd->events->elts;
    conv->base = ev[0].seq - 1;

    for (i = 0; i < rd->events->nelts; i++) {
        if (ngx_http_agent_log_restore_locked(z, conv, ev[i].seq, ev[i].type,
                                              &ev[i].data)
            == NULL)
        {
            ngx_http_agent_conv_evict_locked(z, conv);
            return NGX_ERROR;
        }
    }

    /*
     * messages that wait for their turn, in their order; the next id is
     * past those and every one given before, which the log holds
     */

    conv->queue_id = rd->queue_id;
    sq = rd->queued->elts;

    for (i = 0; i < rd->queued->nelts; i++) {
        m = ngx_http_agent_fsm_queue_add_locked(z, conv, &sq[i].data, 0, 0);
        if (m == NULL) {
            ngx_http_agent_conv_evict_locked(z, conv);
            return NGX_ERROR;
        }

        m->id = sq[i].id;
        conv->queue_id = ngx_max(conv->queue_id, sq[i].id);
    }

    /* the oldest first, as they were taken */

    ss = rd->sources->elts;

    for (i = rd->sources->nelts; i > 0; i--) {
        src = &conv->sources[conv->nsources++ % NGX_HTTP_AGENT_SOURCE_IDS];
        src->hash = ngx_crc32_short(ss[i - 1].source_id.data,
                                    ss[i - 1].source_id.len);
        src->turn = ss[i - 1].turn;
        src->seq = ss[i - 1].seq;
    }

    /* a summary made after the turn ended is not part of it */

    for (i = rd->events->nelts - 1;
         i > 0 && ngx_http_agent_event_outside(ev[i].type);
         i--)
    {
        /* void */
    }

    if (ngx_http_agent_event_terminal(ev[i].type)) {
        /* a message that waited runs now */

        if (ngx_http_agent_fsm_locked(z, conv,
                                      NGX_HTTP_AGENT_FSM_RESTORE_IDLE, &fsm)
            != NGX_OK)
        {
            ngx_http_agent_conv_evict_locked(z, conv);
            return NGX_ERROR;
        }

        *resume = fsm.next ? 2 : 0;
        return NGX_OK;
    }

    waiting = 0;
    running = 0;
    call = calls->elts;

    for (i = 0; i < calls->nelts; i++) {
        if (call[i].result) {
            continue;
        }

        if (call[i].suspended && !call[i].resolved) {
            if (ngx_http_agent_fsm_pending_add_locked(z, conv, &call[i].id,
                                                  &call[i].name,
                                                  call[i].executor,
                                                  call[i].kind,
                                                  call[i].deadline)
                == NULL)
            {
                ngx_http_agent_conv_evict_locked(z, conv);
                return NGX_ERROR;
            }

            waiting++;
            continue;
        }

        running++;
    }

    /* those announced already, by whichever node, are not again */

    ngx_http_agent_notify_restored_locked(z, conv, rd->notified);

    /*
     * at rest while calls wait and none runs: the expiry timer watches the
     * deadlines; else the turn goes on here, a model call or calls to run
     * again
     */

    if (ngx_http_agent_fsm_locked(z, conv,
                                  (waiting && running == 0)
                                  ? NGX_HTTP_AGENT_FSM_RESTORE_WAITING
                                  : NGX_HTTP_AGENT_FSM_RESTORE_RUNNING,
                                  &fsm)
        != NGX_OK)
    {
        ngx_http_agent_conv_evict_locked(z, conv);
        return NGX_ERROR;
    }

    *resume = fsm.run;

    return NGX_OK;
}


/* resume: the turn goes on from the log, or else a queued message runs */

static void
ngx_http_agent_revive_resume(ngx_http_agent_zone_t *z, ngx_str_t *id,
    ngx_str_t *name, ngx_uint_t turn, ngx_uint_t resume)
{
    ngx_str_t                    fields;
    ngx_http_agent_t            *agent;
    ngx_http_agent_fsm_t         fsm;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    agent = ngx_http_agent_conf_find(amcf, name);

    if (resume) {
        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "agent turn of \"%V\" was cut off, recovered from the "
                      "store", id);
    }

    if (agent && agent->conf_ctx
        && ngx_http_agent_turn_start(NULL, agent, z, id, turn,
                                     resume ? NGX_HTTP_AGENT_TURN_TAKEOVER
                                            : NGX_HTTP_AGENT_TURN_NEW)
           == NGX_OK)
    {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "agent \"%V\" of conversation \"%V\" cannot run its turn",
                  name, id);

    /* the turn ends: the log says why */

    ngx_str_set(&fields, "{\"reason\":\"the agent is not configured\"}");

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, id);

    fsm.fields = &fields;
    fsm.npids = 0;

    if (conv && conv->lease == ngx_pid) {
        (void) ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_ABANDON,
                                         &fsm);
    }

    ngx_http_agent_zone_unlock(z);

    ngx_http_agent_wake(id, fsm.pids, fsm.npids);
}


/*
 * History for a request: the events after..upto, read from the store and
 * kept in the request's ctx as events, then the handler runs again.
 */

ngx_int_t
ngx_http_agent_revive_history(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t after, uint64_t upto)
{
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_revive_ctx_t  *ctx;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    ctx = ngx_http_agent_revive_ctx_get(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /*
     * the worker that ran the conversation's last turn kept it: the page
     * is copied, and the handler runs again at once (once: if it still
     * wants another page, that one is read)
     */

    if (!ctx->kept) {
        ctx->kept = 1;

        switch (ngx_http_agent_store_history_copy(r->pool, id, after, upto,
                                                  &ctx->history,
                                                  &ctx->nhistory))
        {
        case NGX_OK:
            ctx->after = after;
            ctx->upto = upto;
            ngx_http_agent_metrics_history(amcf->zone, 1);
            return ngx_http_agent_revive_rerun(r);

        case NGX_DECLINED:
            break;

        default:
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    ngx_http_agent_metrics_history(amcf->zone, 0);

    switch (ngx_http_agent_store_read(r->pool, id, after, upto,
                                      ngx_http_agent_history_read, ctx))
    {
    case NGX_OK:
        break;

    case NGX_BUSY:
        return ngx_http_agent_store_busy_answer(r);

    default:
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->after = after;
    ctx->upto = upto;
    ctx->nhistory = 0;

    r->main->count++;

    return NGX_DONE;
}


static void
ngx_http_agent_history_read(ngx_http_agent_store_read_t *rd, ngx_int_t rc,
    void *data)
{
    ngx_http_agent_revive_ctx_t *ctx = data;

    ngx_http_request_t            *r;
    ngx_http_agent_store_event_t  *ev;

    r = ctx->request;

    if (rc != NGX_OK) {
        goto failed;
    }

    ctx->history = ngx_http_agent_revive_events(r->pool, rd->events);
    if (ctx->history == NULL) {
        goto failed;
    }

    ev = rd->events->elts;
    ctx->nhistory = rd->events->nelts;

    /* an empty read: the store is behind what the zone gave up */

    if (ctx->nhistory == 0 || ev[ctx->nhistory - 1].seq != ctx->upto) {
        goto failed;
    }

    ngx_http_agent_revive_again(r);

    return;

failed:

    ctx->nhistory = 0;

    ngx_http_finalize_request(r,
        ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                  "unavailable",
                                  "the history could not be read from the "
                                  "store"));
}


ngx_http_agent_event_t **
ngx_http_agent_revive_events(ngx_pool_t *pool, ngx_array_t *events)
{
    ngx_uint_t                     i;
    ngx_http_agent_event_t        *e, **evs;
    ngx_http_agent_store_event_t  *ev;

    evs = ngx_palloc(pool, (events->nelts + 1)
                           * sizeof(ngx_http_agent_event_t *));
    if (evs == NULL) {
        return NULL;
    }

    ev = events->elts;

    for (i = 0; i < events->nelts; i++) {
        e = ngx_palloc(pool, offsetof(ngx_http_agent_event_t, data)
                             + ev[i].data.len);
        if (e == NULL) {
            return NULL;
        }

        e->seq = ev[i].seq;
        e->pos = 0;
        e->type = ev[i].type;
        e->len = ev[i].data.len;
        ngx_memcpy(e->data, ev[i].data.data, e->len);

        evs[i] = e;
    }

    return evs;
}


/*
 * A turn reads the history the zone gave up before a model call, when
 * more of it left the zone since the last read.  NGX_AGAIN: the read is
 * under way; NGX_BUSY: the store's thread pool refused it.
 */

ngx_int_t
ngx_http_agent_revive_turn_history(ngx_http_agent_turn_t *t)
{
    uint64_t                base;
    ngx_int_t               rc;
    ngx_http_agent_conv_t  *conv;

    if (t->history_upto == (uint64_t) -1) {
        return NGX_ERROR;
    }

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);
    base = conv ? conv->base : 0;

    ngx_http_agent_zone_unlock(t->zone);

    if (base <= t->history_upto) {
        return NGX_OK;
    }

    /*
     * this worker ran the conversation's last turn: it kept the history,
     * up to the end of that turn
     */

    if (!t->kept_taken) {
        t->kept_taken = 1;

        if (ngx_http_agent_store_history_take(t->request->pool, &t->id,
                                              &t->kept, &t->kept_first,
                                              &t->nkept)
            == NGX_ERROR)
        {
            return NGX_ERROR;
        }
    }

    if (t->kept && (t->nhistory == 0 || t->history == t->kept)
        && base + 1 >= t->kept_first && base < t->kept_first + t->nkept)
    {
        t->history = t->kept;
        t->history_size = 0;
        t->nhistory = base + 1 - t->kept_first;
        t->history_upto = base;

        ngx_http_agent_metrics_history(t->zone, 1);

        return NGX_OK;
    }

    ngx_http_agent_metrics_history(t->zone, 0);

    /*
     * what left since the last read is added to it; the first read starts
     * at the newest summary's range: the context, not the whole log
     */

    rc = ngx_http_agent_store_read(t->request->pool, &t->id,
                                   t->nhistory ? t->history_upto
                                               : NGX_HTTP_AGENT_STORE_SUMMARY,
                                   base, ngx_http_agent_turn_history_read, t);

    return (rc == NGX_OK) ? NGX_AGAIN : rc;
}


static void
ngx_http_agent_turn_history_read(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data)
{
    ngx_http_agent_turn_t *t = data;

    ngx_uint_t                     i;
    ngx_str_t                     *h;
    ngx_http_agent_store_event_t  *ev;

    ev = rd->events ? rd->events->elts : NULL;

    if (rc != NGX_OK || rd->upto < rd->after
        || rd->events->nelts != rd->upto - rd->after)
    {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0, "agent turn could not read "
                      "the history of \"%V\" from the store", &t->id);

        /* the model call fails the turn: nothing is sent without it */
        t->history_upto = (uint64_t) -1;
        goto next;
    }

    h = ngx_palloc(t->request->pool,
                   (t->nhistory + rd->events->nelts) * sizeof(ngx_str_t));
    if (h == NULL) {
        t->history_upto = (uint64_t) -1;
        goto next;
    }

    for (i = 0; i < t->nhistory; i++) {
        h[i] = t->history[i];
    }

    for (i = 0; i < rd->events->nelts; i++) {
        h[t->nhistory + i].data = ngx_pstrdup(t->request->pool, &ev[i].data);
        h[t->nhistory + i].len = ev[i].data.len;

        if (h[t->nhistory + i].data == NULL) {
            t->history_upto = (uint64_t) -1;
            goto next;
        }
    }

    t->history = h;
    t->history_size = 0;
    t->nhistory += rd->events->nelts;
    t->history_upto = rd->upto;

next:

    ngx_http_agent_turn_post(t, ngx_http_agent_turn_model_call);
}
