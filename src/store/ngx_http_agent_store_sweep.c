
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"


/*
 * The conversations that need a worker and are not in the zone: after a
 * restart those whose log ends inside a turn, and at any time those left
 * the zone with a call past its deadline.  They are revived here, and go
 * on as if they had never left.
 */

#define NGX_HTTP_AGENT_SWEEP_INTERVAL  1000


typedef struct {
    ngx_http_agent_store_conf_t  *conf;
    ngx_http_agent_zone_t        *zone;
    ngx_pool_t                   *pool;
    ngx_array_t                  *ids;
    uint64_t                      now;
    /* on a node: the monotonic clock before the heartbeat was sent */
    ngx_msec_t                    sent;
    ngx_uint_t                    node;
    ngx_int_t                     rc;
} ngx_http_agent_sweep_t;


static void ngx_http_agent_store_sweep_thread(void *data, ngx_log_t *log);
static void ngx_http_agent_store_sweep_done(ngx_event_t *ev);
static void ngx_http_agent_store_renew(ngx_http_agent_sweep_t *sw);


static ngx_uint_t  ngx_http_agent_store_sweeping;


void
ngx_http_agent_store_sweep(ngx_http_agent_zone_t *z, uint64_t now)
{
    ngx_msec_t                    interval;
    ngx_pool_t                   *pool;
    ngx_thread_task_t            *task;
    ngx_http_agent_sweep_t       *sw;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_node_t  *node;

    if (ngx_http_agent_store_sweeping) {
        return;
    }

    amcf = ngx_http_cycle_get_module_main_conf(ngx_cycle,
                                               ngx_http_agent_module);

    /* on a node the sweep writes its heartbeat too (agent_node) */

    node = amcf->node;
    interval = NGX_HTTP_AGENT_SWEEP_INTERVAL;

    if (node && node->heartbeat < interval) {
        interval = node->heartbeat;
    }

    ngx_http_agent_zone_lock(z);

    if (now < z->sh->swept + interval) {
        ngx_http_agent_zone_unlock(z);
        return;
    }

    z->sh->swept = now;

    ngx_http_agent_zone_unlock(z);

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return;
    }

    task = ngx_thread_task_alloc(pool, sizeof(ngx_http_agent_sweep_t));
    if (task == NULL) {
        ngx_destroy_pool(pool);
        return;
    }

    sw = task->ctx;
    sw->conf = amcf->store;
    sw->zone = z;
    sw->pool = pool;
    sw->now = now;
    sw->node = (node != NULL);

    sw->ids = ngx_array_create(pool, 8, sizeof(ngx_str_t));
    if (sw->ids == NULL) {
        ngx_destroy_pool(pool);
        return;
    }

    task->handler = ngx_http_agent_store_sweep_thread;
    task->event.handler = ngx_http_agent_store_sweep_done;
    task->event.data = sw;

    /* the lease runs from before the heartbeat is sent: conservative */
    sw->sent = ngx_http_agent_zone_clock();

    if (ngx_thread_task_post(sw->conf->thread_pool, task) != NGX_OK) {
        ngx_destroy_pool(pool);
        return;
    }

    ngx_http_agent_store_sweeping = 1;
}


static void
ngx_http_agent_store_sweep_thread(void *data, ngx_log_t *log)
{
    ngx_http_agent_sweep_t *sw = data;

    sw->rc = sw->conf->store->sweep(&sw->conf->path, sw->now, sw->ids,
                                    sw->pool, log);
}


static void
ngx_http_agent_store_sweep_done(ngx_event_t *ev)
{
    ngx_http_agent_sweep_t *sw = ev->data;

    ngx_str_t              *ids;
    ngx_uint_t              i;
    ngx_http_agent_conv_t  *conv;

    ngx_http_agent_store_sweeping = 0;

    /* NGX_DECLINED: the heartbeat was written, the sweep was not */

    if (sw->node && (sw->rc == NGX_OK || sw->rc == NGX_DECLINED)) {
        ngx_http_agent_store_renew(sw);
    }

    ids = sw->ids->elts;

    for (i = 0; sw->rc == NGX_OK && i < sw->ids->nelts; i++) {

        ngx_http_agent_zone_lock(sw->zone);
        conv = ngx_http_agent_conv_find_locked(sw->zone, &ids[i]);
        ngx_http_agent_zone_unlock(sw->zone);

        if (conv == NULL && !ngx_exiting) {
            (void) ngx_http_agent_store_revive(NULL, &ids[i]);
        }
    }

    ngx_destroy_pool(sw->pool);
}


/*
 * The node's heartbeat was written: its lease runs from when it was
 * sent.  A lapse no request or timer saw yet (the sweep's worker was
 * paused with the heartbeat on its way) drops the zone's conversations
 * first: another node may have taken them meanwhile.
 */

static void
ngx_http_agent_store_renew(ngx_http_agent_sweep_t *sw)
{
    ngx_http_agent_node_sh_t  *node;

    if (ngx_http_agent_store_lease) {
        (void) ngx_http_agent_store_lease();
    }

    ngx_http_agent_zone_lock(sw->zone);

    node = ngx_http_agent_zone_node_locked(sw->zone);

    if (node && (ngx_msec_int_t) (sw->sent - node->beat) > 0) {
        node->beat = sw->sent;
    }

    ngx_http_agent_zone_unlock(sw->zone);
}
