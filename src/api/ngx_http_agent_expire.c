
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_expire.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_revive.h"


/*
 * Every worker looks for waiting calls past their deadline, so that the
 * deadline holds whichever worker suspended the call, even a dead one.
 * The zone's lock makes each expiry happen once.
 */

#define NGX_HTTP_AGENT_EXPIRE_INTERVAL  250

/* conversations whose turn an expiry lets go on, per round */
#define NGX_HTTP_AGENT_EXPIRE_RESUME    16


typedef struct {
    u_char                        id[NGX_HTTP_AGENT_ID_LEN];
    size_t                        id_len;
    u_char                        agent[NGX_HTTP_AGENT_TOOL_NAME_LEN];
    size_t                        agent_len;
    ngx_uint_t                    turn;
    ngx_pid_t                     pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_uint_t                    npids;
    unsigned                      resume:1;
    unsigned                      next:1;     /* a queued message starts */
    unsigned                      takeover:1;
    unsigned                      give_up:1;
} ngx_http_agent_expired_t;


/* conversations that leave the zone at rest, per round */
#define NGX_HTTP_AGENT_EVICT_ROUND  64


static void ngx_http_agent_expire_handler(ngx_event_t *ev);
static ngx_uint_t ngx_http_agent_expire_conv_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, uint64_t now);
static void ngx_http_agent_expire_resume(ngx_http_agent_main_conf_t *amcf,
    ngx_http_agent_expired_t *e);
static ngx_uint_t ngx_http_agent_expire_evict_locked(
    ngx_http_agent_main_conf_t *amcf, ngx_http_agent_zone_t *z,
    ngx_http_agent_gone_t *gone);
static ngx_uint_t ngx_http_agent_expire_stalled_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_expired_t *expired,
    ngx_uint_t n);


static ngx_event_t  ngx_http_agent_expire_event;


ngx_int_t
ngx_http_agent_expire_init_process(ngx_cycle_t *cycle)
{
    ngx_event_t  *ev;

    ev = &ngx_http_agent_expire_event;

    ngx_memzero(ev, sizeof(ngx_event_t));

    ev->handler = ngx_http_agent_expire_handler;
    ev->log = cycle->log;
    ev->data = cycle;
    ev->cancelable = 1;

    ngx_add_timer(ev, NGX_HTTP_AGENT_EXPIRE_INTERVAL);

    return NGX_OK;
}


static void
ngx_http_agent_expire_handler(ngx_event_t *ev)
{
    ngx_cycle_t *cycle = ev->data;

    uint64_t                     now;
    ngx_str_t                    id;
    ngx_uint_t                   n, i, k, ngone;
    ngx_http_agent_fsm_t         fsm;
    ngx_time_t                  *tp;
    ngx_queue_t                 *q, *next;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_expired_t     expired[NGX_HTTP_AGENT_EXPIRE_RESUME];
    ngx_http_agent_gone_t        gone[NGX_HTTP_AGENT_EVICT_ROUND
                                      + NGX_HTTP_AGENT_UNUSED_ROUND];
    ngx_http_agent_main_conf_t  *amcf;

    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    /* a cancel whose wake-up was lost is seen here */
    ngx_http_agent_turn_cancel_check();

    /*
     * a node whose lease lapsed (agent_node) drops its zone before it
     * expires or takes over anything of it
     */
    (void) ngx_http_agent_revive_lease();

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);
    z = amcf->zone;

    tp = ngx_timeofday();
    now = (uint64_t) tp->sec * 1000 + tp->msec;

    n = 0;

    ngx_http_agent_zone_lock(z);

    ngx_http_agent_zone_reserve_locked(z);

    for (q = ngx_queue_head(&z->sh->waiting);
         q != ngx_queue_sentinel(&z->sh->waiting)
         && n < NGX_HTTP_AGENT_EXPIRE_RESUME;
         q = next)
    {
        next = ngx_queue_next(q);
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, waiting);

        k = ngx_http_agent_expire_conv_locked(z, conv, now);

        if (k == 0) {
            continue;
        }

        ngx_memcpy(expired[n].id, conv->id, conv->id_len);
        expired[n].id_len = conv->id_len;
        ngx_memcpy(expired[n].agent, conv->agent, conv->agent_len);
        expired[n].agent_len = conv->agent_len;
        expired[n].turn = conv->turn;
        expired[n].resume = 0;
        expired[n].next = 0;
        expired[n].takeover = 0;
        expired[n].give_up = 0;

        /* the last waiting call is gone and no turn runs: this one goes on */

        fsm.fields = NULL;

        (void) ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_SETTLED,
                                         &fsm);

        expired[n].resume = fsm.run;
        expired[n].npids = ngx_http_agent_conv_sub_pids_locked(conv,
                                                          expired[n].pids);
        n++;
    }

    /*
     * a turn whose worker died (SIGKILL, a crash) is taken over: it goes
     * on from the log in this worker
     */

    for (q = ngx_queue_head(&z->sh->leased);
         q != ngx_queue_sentinel(&z->sh->leased)
         && n < NGX_HTTP_AGENT_EXPIRE_RESUME;
         q = next)
    {
        next = ngx_queue_next(q);
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, leased);

        if (conv->lease == ngx_pid || ngx_http_agent_pid_alive(conv->lease)) {
            continue;
        }

        ngx_log_error(NGX_LOG_WARN, cycle->log, 0,
                      "agent turn of \"%*s\" lost its worker %P, "
                      "recovered from the log",
                      conv->id_len, conv->id, conv->lease);

        fsm.fields = NULL;

        if (ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_TAKEOVER,
                                      &fsm)
            != NGX_OK)
        {
            continue;
        }

        ngx_http_agent_conv_subs_reap_locked(z, conv);

        ngx_memcpy(expired[n].id, conv->id, conv->id_len);
        expired[n].id_len = conv->id_len;
        ngx_memcpy(expired[n].agent, conv->agent, conv->agent_len);
        expired[n].agent_len = conv->agent_len;
        expired[n].turn = conv->turn;
        expired[n].resume = 1;
        expired[n].next = 0;
        expired[n].takeover = 1;
        expired[n].give_up = fsm.give_up;
        expired[n].npids = ngx_http_agent_conv_sub_pids_locked(conv,
                                                          expired[n].pids);
        n++;
    }

    if (z->sh->stalled) {
        n = ngx_http_agent_expire_stalled_locked(z, expired, n);
    }

    ngone = 0;

    if (amcf->store) {
        ngone = ngx_http_agent_expire_evict_locked(amcf, z, gone);
    }

    ngone += ngx_http_agent_conv_unused_locked(z, amcf->evict_unused,
                                               &gone[ngone]);

    ngx_http_agent_zone_unlock(z);

    /* on a node, the store lets them go: any node may claim them */

    for (i = 0; i < ngone; i++) {
        id.data = gone[i].id;
        id.len = gone[i].id_len;

        ngx_http_agent_store_let_go(&id, gone[i].epoch, gone[i].seq);
    }

    for (i = 0; i < n; i++) {
        ngx_http_agent_expire_resume(amcf, &expired[i]);
    }

    if (amcf->store) {
        ngx_http_agent_store_sweep(z, now);
    }

    ngx_add_timer(ev, NGX_HTTP_AGENT_EXPIRE_INTERVAL);
}


static ngx_uint_t
ngx_http_agent_expire_conv_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, uint64_t now)
{
    ngx_uint_t                 i, j, subs, n;
    ngx_http_agent_pending_t  *p;

    n = 0;

    /* the last one settled frees the slots */
    for (i = 0; conv->pending && i < conv->pending_slots; i++) {
        p = &conv->pending[i];

        if (p->kind == 0) {
            continue;
        }

        if (p->grace && now >= p->grace) {
            subs = 0;

            for (j = 0; j < NGX_HTTP_AGENT_SUB_WORKERS; j++) {
                subs += conv->subs[j].count;
            }

            if (subs) {
                /* a browser came: the call waits until its deadline */
                p->grace = 0;
                continue;
            }

            if (ngx_http_agent_fsm_settle_locked(z, conv, p,
                                   NGX_HTTP_AGENT_SETTLE_EXPIRED,
                                   "no client was connected to run the call")
                == NGX_OK)
            {
                n++;
            }

            continue;
        }

        if (now < p->deadline) {
            continue;
        }

        if (ngx_http_agent_fsm_settle_locked(z, conv, p,
                                   NGX_HTTP_AGENT_SETTLE_EXPIRED,
                                   p->kind == NGX_HTTP_AGENT_PENDING_APPROVAL
                                   ? "the approver did not respond before "
                                     "the deadline"
                                   : "the user did not respond before the "
                                     "deadline")
            == NGX_OK)
        {
            n++;
        }
    }

    return n;
}


static void
ngx_http_agent_expire_resume(ngx_http_agent_main_conf_t *amcf,
    ngx_http_agent_expired_t *e)
{
    ngx_str_t          id, name;
    ngx_http_agent_t  *agent;

    id.data = e->id;
    id.len = e->id_len;

    ngx_http_agent_wake(&id, e->pids, e->npids);

    if (!e->resume && !e->next) {
        return;
    }

    name.data = e->agent;
    name.len = e->agent_len;

    agent = ngx_http_agent_conf_find(amcf, &name);

    if (e->next) {
        ngx_http_agent_turn_next(agent, amcf->zone, &id, e->turn);
        return;
    }

    if (agent == NULL || agent->conf_ctx == NULL
        || ngx_http_agent_turn_start(NULL, agent, amcf->zone, &id, e->turn,
                                     e->give_up ? NGX_HTTP_AGENT_TURN_GIVE_UP
                                     : e->takeover
                                       ? NGX_HTTP_AGENT_TURN_TAKEOVER
                                       : NGX_HTTP_AGENT_TURN_RESUME)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent could not resume the turn of \"%V\" after "
                      "an expiry", &id);
    }
}


/*
 * Queued messages that found no room to start when their turn came
 * (a full zone): tried again, and the flag stays up while some wait.
 */

static ngx_uint_t
ngx_http_agent_expire_stalled_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_expired_t *expired, ngx_uint_t n)
{
    ngx_queue_t            *q;
    ngx_http_agent_fsm_t    fsm;
    ngx_http_agent_conv_t  *conv;

    z->sh->stalled = 0;

    for (q = ngx_queue_head(&z->sh->lru);
         q != ngx_queue_sentinel(&z->sh->lru);
         q = ngx_queue_next(q))
    {
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        if (conv->state != NGX_HTTP_AGENT_IDLE || conv->lease
            || conv->nqueued == 0)
        {
            continue;
        }

        if (n == NGX_HTTP_AGENT_EXPIRE_RESUME) {
            z->sh->stalled = 1;
            break;
        }

        fsm.fields = NULL;

        if (ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_NEXT, &fsm)
            != NGX_OK
            || !fsm.next)
        {
            /* no room yet: the flag is up again */
            break;
        }

        ngx_memcpy(expired[n].id, conv->id, conv->id_len);
        expired[n].id_len = conv->id_len;
        ngx_memcpy(expired[n].agent, conv->agent, conv->agent_len);
        expired[n].agent_len = conv->agent_len;
        expired[n].turn = fsm.next_turn;
        expired[n].resume = 0;
        expired[n].next = 1;
        expired[n].takeover = 0;
        expired[n].give_up = 0;
        expired[n].npids = ngx_http_agent_conv_sub_pids_locked(conv,
                                                          expired[n].pids);
        n++;
    }

    return n;
}


/*
 * Conversations at rest longer than agent_evict_idle (or, waiting for
 * input, agent_evict_awaiting) leave the zone, least recently used first;
 * the store has all of them, and a request or the sweep brings them back
 * (on a node, any node: the store lets them go).
 */

static ngx_uint_t
ngx_http_agent_expire_evict_locked(ngx_http_agent_main_conf_t *amcf,
    ngx_http_agent_zone_t *z, ngx_http_agent_gone_t *gone)
{
    ngx_msec_t              limit, oldest;
    ngx_uint_t              n, ngone;
    ngx_queue_t            *q, *next;
    ngx_http_agent_conv_t  *conv;

    oldest = ngx_min(amcf->evict_idle, amcf->evict_awaiting);
    ngone = 0;

    for (q = ngx_queue_head(&z->sh->lru), n = 0;
         q != ngx_queue_sentinel(&z->sh->lru)
         && n < NGX_HTTP_AGENT_EVICT_ROUND;
         q = next, n++)
    {
        next = ngx_queue_next(q);
        conv = ngx_queue_data(q, ngx_http_agent_conv_t, lru);

        /* the queue is in the order of use: the rest are more recent */

        if ((ngx_msec_int_t) (ngx_current_msec - conv->accessed)
            < (ngx_msec_int_t) oldest)
        {
            break;
        }

        limit = (conv->state == NGX_HTTP_AGENT_AWAITING_INPUT)
                ? amcf->evict_awaiting : amcf->evict_idle;

        if ((ngx_msec_int_t) (ngx_current_msec - conv->accessed)
            < (ngx_msec_int_t) limit
            || (ngx_msec_int_t) (ngx_current_msec - conv->updated)
               < (ngx_msec_int_t) limit)
        {
            continue;
        }

        ngx_http_agent_conv_subs_reap_locked(z, conv);

        if (!ngx_http_agent_conv_evictable_locked(conv)) {
            continue;
        }

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "agent conversation \"%*s\" leaves the zone",
                       conv->id_len, conv->id);

        ngx_http_agent_conv_gone_locked(conv, &gone[ngone++]);
        ngx_http_agent_conv_evict_locked(z, conv);
    }

    return ngone;
}
