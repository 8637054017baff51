
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_ZONE_H_INCLUDED_
#define _NGX_HTTP_AGENT_ZONE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"


#define NGX_HTTP_AGENT_ID_LEN            64
/*
 * A conversation keeps its newest live events up to these bounds: a
 * subscriber further behind has missed some
 */
#define NGX_HTTP_AGENT_LIVE_MAX          512
#define NGX_HTTP_AGENT_LIVE_SIZE         (64 * 1024)
#define NGX_HTTP_AGENT_SUB_WORKERS       16
#define NGX_HTTP_AGENT_SOURCE_IDS        16
#define NGX_HTTP_AGENT_PENDING           16
#define NGX_HTTP_AGENT_PENDING_STR       "16"
#define NGX_HTTP_AGENT_CALL_ID_LEN       64
#define NGX_HTTP_AGENT_TOOL_NAME_LEN     64
/* an owner kept whole: more would take the record past 1 KB */
#define NGX_HTTP_AGENT_OWNER_LEN         128

/*
 * Kept back in the zone for the events that end calls and turns: one
 * page in 32 of the zone, from 1 to 8 pages.
 */
#define NGX_HTTP_AGENT_RESERVE_SHARE     32
#define NGX_HTTP_AGENT_RESERVE_MAX       8
#define NGX_HTTP_AGENT_CLOSING_MAX       1024


/* conversation states; only idle and awaiting_input are at rest */
typedef enum {
    NGX_HTTP_AGENT_IDLE = 0,
    NGX_HTTP_AGENT_PREPARING,
    NGX_HTTP_AGENT_STREAMING,
    NGX_HTTP_AGENT_EXECUTING_TOOLS,
    NGX_HTTP_AGENT_AWAITING_INPUT
} ngx_http_agent_state_e;


/*
 * An event in the zone: canonical ones (seq > 0) are the log, live ones
 * (seq == 0) sit in a bounded ring.  pos orders both kinds together, so a
 * subscriber that has seen pos N needs exactly the events after N.
 * data is the event as JSON, as sent to subscribers.
 */

typedef struct {
    ngx_queue_t                   queue;      /* in the log */
    uint64_t                      pos;
    uint64_t                      seq;
    ngx_uint_t                    type;
    size_t                        len;
    u_char                        data[1];
} ngx_http_agent_event_t;


/* the reply so far of the model call streaming: ngx_http_agent_partial.c */
typedef struct ngx_http_agent_partial_s  ngx_http_agent_partial_t;

/* the counters of the metrics: ngx_http_agent_metrics.c */
typedef struct ngx_http_agent_metrics_sh_s  ngx_http_agent_metrics_sh_t;


/* a worker with subscribers of a conversation, or inputs waiting, to wake */
typedef struct {
    ngx_pid_t                     pid;
    uint32_t                      count;
} ngx_http_agent_sub_worker_t;


typedef struct {
    uint32_t                      hash;
    uint32_t                      turn;
    uint64_t                      seq;
} ngx_http_agent_source_t;


/*
 * A call that waits for outside input: the persisted "pending" of the
 * seeds, {tool_call_id => {executor, kind}}, with its deadline.  kind 0
 * marks a free slot.
 */

typedef struct {
    u_char                        id[NGX_HTTP_AGENT_CALL_ID_LEN];
    size_t                        id_len;
    u_char                        name[NGX_HTTP_AGENT_TOOL_NAME_LEN];
    size_t                        name_len;
    ngx_uint_t                    kind;
    ngx_uint_t                    executor;
    uint64_t                      deadline;

    /* a client call with no subscriber to run it fails at this time */
    uint64_t                      grace;
} ngx_http_agent_pending_t;


/*
 * A question an MCP server asks during a call that runs (elicitation):
 * its answer goes back to the server, and the call's result comes later
 */
#define ngx_http_agent_pending_in_call(p)                                    \
    ((p)->kind == NGX_HTTP_AGENT_PENDING_ELICITATION                         \
     && (p)->executor == NGX_HTTP_AGENT_EXECUTOR_SERVER)


typedef struct {
    ngx_rbtree_node_t             node;       /* key: crc32 of the id */
    ngx_queue_t                   lru;

    u_char                        id[NGX_HTTP_AGENT_ID_LEN];
    size_t                        id_len;

    ngx_http_agent_state_e        state;

    /* the worker running the turn, 0 when none */
    ngx_pid_t                     lease;

    uint64_t                      seq;        /* last canonical seq */
    uint64_t                      pos;        /* last event position */

    /*
     * the log in the zone is the events after base: those up to base
     * are in the store only (history before the current turn, written)
     */
    uint64_t                      base;
    uint64_t                      turn_seq;   /* the last user_msg's seq */
    ngx_uint_t                    turn;       /* turns started */

    /*
     * the context: the events up to summary_to are in the newest summary
     * (0: none); the worker making one, since when
     */
    uint64_t                      summary_to;
    time_t                        summary_started;
    ngx_pid_t                     summarizing;

    /* times the current turn was taken over from a worker that died */
    uint32_t                      takeovers;

    /* the last model call's start, ms since the epoch (the audit's key) */
    uint64_t                      call_started;

    /* in the zone's queue of conversations with a lease */
    ngx_queue_t                   leased;

    /*
     * the store: events up to flushed are written; a worker flushing;
     * an input waits for the events up to acked to be written
     */
    uint64_t                      flushed;
    uint64_t                      acked;
    ngx_queue_t                   dirty;
    ngx_pid_t                     flushing;
    unsigned                      dirty_linked:1;

    /* made by agent_create, in the zone's queue of those with no event */
    unsigned                      unused_linked:1;

    /* a cancel waits for that worker to take the turn down */
    unsigned                      cancel:1;

    /*
     * the epoch this node holds the conversation with in a store that
     * several nodes share (agent_node), which its writes carry; in the
     * bits left here, for the record's size (a conversation claimed
     * 2^29 times would be refused by the fence, never forked)
     */
    unsigned                      epoch:29;
    uint64_t                      cancelled;  /* seq of the last cancel */

    ngx_queue_t                   unused;

    /*
     * the record is 1024 bytes, a slab's size class: counts that cannot
     * pass 2^32 are 32 bits, and the small fields go in pairs
     */

    ngx_queue_t                   log;        /* ngx_http_agent_event_t */
    ngx_queue_t                   live;       /* ngx_http_agent_event_t */
    uint32_t                      nlog;
    uint32_t                      nlive;
    size_t                        live_size;
    uint64_t                      live_lost;  /* pos of the last one given
                                                 up for room */

    /* the reply so far of the model call streaming, or NULL */
    ngx_http_agent_partial_t     *partial;

    ngx_http_agent_sub_worker_t   subs[NGX_HTTP_AGENT_SUB_WORKERS];

    /*
     * pending_slots slots (2, doubled as calls wait, up to
     * NGX_HTTP_AGENT_PENDING), allocated with the first call that waits
     * and freed with the last: NULL at rest
     */
    ngx_http_agent_pending_t     *pending;
    uint32_t                      npending;
    uint32_t                      pending_slots;

    /* in the zone's queue of conversations with waiting calls */
    ngx_queue_t                   waiting;

    /* messages taken while a turn ran, to run after it, in order */
    ngx_queue_t                   queued;     /* ngx_http_agent_queued_t */
    int64_t                       queue_id;   /* the last one given */

    /* the agent that runs the conversation's turns */
    u_char                        agent[NGX_HTTP_AGENT_TOOL_NAME_LEN];
    size_t                        agent_len;

    /* who the conversation belongs to (agent_owner); empty: no one */
    u_char                        owner[NGX_HTTP_AGENT_OWNER_LEN];
    size_t                        owner_len;

    /* recent client source ids, so that a resent message is taken once */
    ngx_http_agent_source_t       sources[NGX_HTTP_AGENT_SOURCE_IDS];
    uint32_t                      nsources;
    uint32_t                      nqueued;

    ngx_msec_t                    updated;
    ngx_msec_t                    accessed;
} ngx_http_agent_conv_t;


/* a message waiting for its turn: its user_msg fields */
typedef struct {
    ngx_queue_t                   queue;
    int64_t                       id;         /* its queue_id */
    uint32_t                      hash;       /* of its source_id, or 0 */
    size_t                        len;
    u_char                        data[1];
} ngx_http_agent_queued_t;


typedef struct {
    /* the worker that listens for the store's notifications */
    ngx_pid_t                     listener;

    /*
     * the workers with subscribers the listener relays the notifications
     * to, those of conversations another node owns
     * (NGX_HTTP_AGENT_SUB_WORKERS slots, allocated with the first)
     */
    ngx_http_agent_sub_worker_t  *followers;

    /*
     * the node's lease: the monotonic clock's ms before the last
     * heartbeat that succeeded was sent; lapsed once the conversations it
     * held were dropped for a lease gone stale
     */
    ngx_msec_t                    beat;
    ngx_uint_t                    lapsed;

    /* lapses that dropped the zone, ever: a turn started before one ends */
    ngx_uint_t                    drops;
} ngx_http_agent_node_sh_t;


typedef struct {
    ngx_rbtree_t                  rbtree;
    ngx_rbtree_node_t             sentinel;
    ngx_queue_t                   lru;        /* least recently used first */
    ngx_queue_t                   waiting;    /* conversations with calls
                                                 waiting, for expiry */
    ngx_queue_t                   leased;     /* conversations with a turn
                                                 running, for recovery */
    ngx_queue_t                   dirty;      /* with events to write */
    ngx_queue_t                   unused;     /* made by agent_create, no
                                                 event yet, oldest first */
    ngx_uint_t                    count;

    /* the worker with a batch on its thread pool: one writes at a time */
    ngx_pid_t                     writer;

    /* inputs that came to wait for a write, ever: a batch ends early */
    ngx_atomic_t                  inputs;

    /*
     * the workers with inputs waiting for a write, woken when one is:
     * NGX_HTTP_AGENT_SUB_WORKERS slots, allocated with the first input
     */
    ngx_http_agent_sub_worker_t  *acking;

    /*
     * on a node (agent_node), what only a node needs, allocated with the
     * first use: the header stays within 256 bytes, a slab's size class,
     * so that the smallest zone keeps its pages
     */
    ngx_http_agent_node_sh_t     *node;

    /* conversations that left the zone, ever: a revival checks it */
    ngx_uint_t                    evicted;

    /* of those, dropped with no store to come back from */
    ngx_uint_t                    dropped;

    /* the last sweep of the store, ms */
    uint64_t                      swept;

    /* a queued message found no room to start: the expiry tries again */
    ngx_uint_t                    stalled;

    /* pages kept back so that a full zone can still end its turns */
    void                         *reserve;
    size_t                        reserve_size;

    ngx_http_agent_metrics_sh_t  *metrics;

    /* notifications owed for waiting calls (ngx_http_agent_notify.c) */
    void                         *notify;

    /* MCP servers' sessions and tool lists (ngx_http_agent_mcp_sh_t) */
    void                         *mcp;
} ngx_http_agent_sh_t;


struct ngx_http_agent_zone_s {
    ngx_http_agent_sh_t          *sh;
    ngx_slab_pool_t              *shpool;
    ngx_shm_zone_t               *shm_zone;

    /* canonical events are written to a store */
    ngx_uint_t                    store;

    /* without a store, a full zone does not drop conversations at rest */
    ngx_uint_t                    keep_idle;
};


/* a summary being made holds its conversation in the zone so long, s */
#define NGX_HTTP_AGENT_SUMMARY_HOLD         900


/* event types: canonical first, then live */
#define NGX_HTTP_AGENT_EV_USER_MSG          0
#define NGX_HTTP_AGENT_EV_ASSISTANT_MSG     1
#define NGX_HTTP_AGENT_EV_TOOL_CALL         2
#define NGX_HTTP_AGENT_EV_TOOL_RESULT       3
#define NGX_HTTP_AGENT_EV_SUSPENSION        4
#define NGX_HTTP_AGENT_EV_RESOLUTION        5
#define NGX_HTTP_AGENT_EV_TURN_COMPLETED    6
#define NGX_HTTP_AGENT_EV_TURN_FAILED       7
#define NGX_HTTP_AGENT_EV_CANCELLED         8
#define NGX_HTTP_AGENT_EV_TURN_HALTED       9
#define NGX_HTTP_AGENT_EV_INJECTION         10
#define NGX_HTTP_AGENT_EV_SUMMARY           11
#define NGX_HTTP_AGENT_EV_REWIND           12
#define NGX_HTTP_AGENT_EV_TURN_STARTED      13
#define NGX_HTTP_AGENT_EV_STATE_CHANGED     14
#define NGX_HTTP_AGENT_EV_TEXT_DELTA        15
#define NGX_HTTP_AGENT_EV_THINKING_DELTA    16
#define NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA   17
#define NGX_HTTP_AGENT_EV_TOOL_PROGRESS     18
#define NGX_HTTP_AGENT_EV_TURN_ENDED        19

#define ngx_http_agent_event_canonical(type)                                 \
    ((type) < NGX_HTTP_AGENT_EV_TURN_STARTED)

/* the events that end a turn */
#define ngx_http_agent_event_terminal(type)                                  \
    ((type) == NGX_HTTP_AGENT_EV_TURN_COMPLETED                              \
     || (type) == NGX_HTTP_AGENT_EV_TURN_FAILED                              \
     || (type) == NGX_HTTP_AGENT_EV_CANCELLED                                \
     || (type) == NGX_HTTP_AGENT_EV_TURN_HALTED)

/*
 * the events that are part of no turn: a summary, and a rewind (the
 * context goes on from its to_seq; the user_msg that follows it starts
 * the next turn)
 */
#define ngx_http_agent_event_outside(type)                                   \
    ((type) == NGX_HTTP_AGENT_EV_SUMMARY                                     \
     || (type) == NGX_HTTP_AGENT_EV_REWIND)

#define ngx_http_agent_event_delta(type)                                     \
    ((type) >= NGX_HTTP_AGENT_EV_TEXT_DELTA                                  \
     && (type) <= NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA)


extern ngx_str_t  ngx_http_agent_event_names[];
extern ngx_str_t  ngx_http_agent_state_names[];

/* new events to write: what the store does then, set at configuration */
extern void  (*ngx_http_agent_zone_kick)(void);


char *ngx_http_agent_zone_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

#define ngx_http_agent_zone_lock(z)    ngx_shmtx_lock(&(z)->shpool->mutex)
#define ngx_http_agent_zone_unlock(z)  ngx_shmtx_unlock(&(z)->shpool->mutex)

/* all of these run with the zone locked */

/* slab memory, room made by evicting what can go; pinned stays */
void *ngx_http_agent_zone_alloc_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *pinned, size_t size);

/*
 * The same, without "zone is full" in the log when nothing can go: for
 * what may simply be dropped (see the allocation in ngx_http_agent_zone.c)
 */
void *ngx_http_agent_zone_try_alloc_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *pinned, size_t size);

ngx_http_agent_conv_t *ngx_http_agent_conv_find_locked(
    ngx_http_agent_zone_t *z, ngx_str_t *id);
ngx_http_agent_conv_t *ngx_http_agent_conv_create_locked(
    ngx_http_agent_zone_t *z, ngx_str_t *id);
void ngx_http_agent_conv_mint_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
/*
 * a record that left the zone at rest, kept for the store to let it go
 * (ngx_http_agent_store_let_go) once the zone is unlocked
 */
typedef struct {
    u_char                        id[NGX_HTTP_AGENT_ID_LEN];
    size_t                        id_len;
    uint64_t                      epoch;
    uint64_t                      seq;
} ngx_http_agent_gone_t;

/* at most so many records a round: gone has room for as many */
#define NGX_HTTP_AGENT_UNUSED_ROUND  64

ngx_uint_t ngx_http_agent_conv_unused_locked(ngx_http_agent_zone_t *z,
    ngx_msec_t limit, ngx_http_agent_gone_t *gone);
void ngx_http_agent_conv_gone_locked(ngx_http_agent_conv_t *conv,
    ngx_http_agent_gone_t *gone);
void ngx_http_agent_conv_delete_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
ngx_int_t ngx_http_agent_conv_evictable_locked(ngx_http_agent_conv_t *conv);
ngx_int_t ngx_http_agent_conv_at_rest_locked(ngx_http_agent_conv_t *conv);
ngx_uint_t ngx_http_agent_pid_alive(ngx_pid_t pid);
void ngx_http_agent_conv_subs_reap_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
ngx_int_t ngx_http_agent_conv_bound_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *agent, ngx_str_t *owner);
void ngx_http_agent_conv_bind_locked(ngx_http_agent_conv_t *conv,
    ngx_str_t *agent, ngx_str_t *owner);
void ngx_http_agent_conv_evict_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
ngx_http_agent_event_t *ngx_http_agent_log_restore_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv, uint64_t seq,
    ngx_uint_t type, ngx_str_t *data);
void ngx_http_agent_zone_reserve_locked(ngx_http_agent_zone_t *z);
ngx_msec_t ngx_http_agent_zone_clock(void);
ngx_http_agent_node_sh_t *ngx_http_agent_zone_node_locked(
    ngx_http_agent_zone_t *z);
ngx_uint_t ngx_http_agent_zone_drops(ngx_http_agent_zone_t *z);
ngx_queue_t *ngx_http_agent_log_turn_locked(ngx_http_agent_conv_t *conv);

/*
 * The first event of the context in the zone's log, the first after the
 * newest summary's range and after seq after (the sentinel if none)
 */
ngx_queue_t *ngx_http_agent_log_context_locked(ngx_http_agent_conv_t *conv,
    uint64_t after);
ngx_int_t ngx_http_agent_log_type(u_char *name, size_t len);
void ngx_http_agent_log_trim_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
/* at rest with no subscriber: the live events go */
void ngx_http_agent_log_rest_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv);
/* frees the live events before pos (all: (uint64_t) -1); how many */
ngx_uint_t ngx_http_agent_log_live_free_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, uint64_t pos);
ngx_http_agent_event_t *ngx_http_agent_log_add_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv, ngx_uint_t type,
    ngx_str_t *fields);
ngx_int_t ngx_http_agent_workers_add_locked(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t pid);
void ngx_http_agent_workers_remove_locked(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t pid);
ngx_uint_t ngx_http_agent_workers_pids_locked(ngx_http_agent_sub_worker_t *w,
    ngx_pid_t *pids);
ngx_uint_t ngx_http_agent_workers_reap_locked(ngx_http_agent_sub_worker_t *w);

#define ngx_http_agent_conv_sub_add_locked(conv, pid)                        \
    ngx_http_agent_workers_add_locked((conv)->subs, pid)
#define ngx_http_agent_conv_sub_remove_locked(conv, pid)                     \
    ngx_http_agent_workers_remove_locked((conv)->subs, pid)
#define ngx_http_agent_conv_sub_pids_locked(conv, pids)                      \
    ngx_http_agent_workers_pids_locked((conv)->subs, pids)

ngx_http_agent_pending_t *ngx_http_agent_conv_pending_locked(
    ngx_http_agent_conv_t *conv, ngx_str_t *id);

/* the events after pos, canonical and live, in pos order */
ngx_uint_t ngx_http_agent_log_since_locked(ngx_http_agent_conv_t *conv,
    uint64_t pos, ngx_http_agent_event_t **out, ngx_uint_t max);
/* the canonical events after seq, in seq order */
ngx_uint_t ngx_http_agent_log_after_locked(ngx_http_agent_conv_t *conv,
    uint64_t seq, ngx_http_agent_event_t **out, ngx_uint_t max);


#endif /* _NGX_HTTP_AGENT_ZONE_H_INCLUDED_ */
