
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_store_audit.h"
#include "ngx_http_agent_store_list.h"


/* an event to write: the conversation's id and the event's JSON */
typedef struct {
    ngx_str_t                     conv;
    ngx_str_t                     agent;
    ngx_str_t                     owner;
    uint64_t                      seq;
    ngx_uint_t                    type;
    ngx_str_t                     data;
    /* the conversation's epoch on this node (see agent_node) */
    uint64_t                      epoch;
} ngx_http_agent_store_event_t;


/* a source id of a recent user message, for resends after a revival */
typedef struct {
    ngx_str_t                     source_id;
    uint64_t                      seq;
    ngx_uint_t                    turn;
} ngx_http_agent_store_source_t;


/* a waiting call of a revived conversation already notified of */
typedef struct {
    ngx_str_t                     call;
    ngx_str_t                     kind;
} ngx_http_agent_store_notified_t;


/* a message waiting for its turn; front: it goes before the others */
typedef struct {
    int64_t                       id;
    ngx_uint_t                    front;
    ngx_str_t                     data;
    /* to queue: the conversation's epoch on this node, the fence */
    uint64_t                      epoch;
} ngx_http_agent_store_queued_t;


/*
 * Events read back: those after "after" up to "upto" (0: all), or, with
 * after NGX_HTTP_AGENT_STORE_TAIL, those from the last user_msg on.
 * last_seq 0: the store has no such conversation.
 */

#define NGX_HTTP_AGENT_STORE_TAIL  ((uint64_t) -1)

/*
 * after NGX_HTTP_AGENT_STORE_SUMMARY: the context, those after the range
 * of the newest summary (the store sets after to where it starts)
 */
#define NGX_HTTP_AGENT_STORE_SUMMARY  ((uint64_t) -2)

typedef struct {
    ngx_str_t                     id;
    uint64_t                      after;
    uint64_t                      upto;
    /* a follower's read (the table's follow): at most so many events */
    ngx_uint_t                    limit;

    ngx_str_t                     agent;
    ngx_str_t                     owner;
    uint64_t                      last_seq;
    /* the highest queue id the conversation's user_msgs carried */
    int64_t                       queue_id;
    /* for a take-over's count: the count with it, "after" the log's end */
    ngx_uint_t                    takeovers;
    /*
     * a revival's read on a node (agent_node): the epoch this node
     * claimed the conversation with; or, claimed by another node that
     * lives, elsewhere.data set, to that node's address (may be empty)
     */
    uint64_t                      epoch;
    ngx_str_t                     elsewhere;
    ngx_array_t                  *events;     /* store_event_t */
    /* with after NGX_HTTP_AGENT_STORE_TAIL only, empty otherwise */
    ngx_array_t                  *sources;    /* store_source_t */
    ngx_array_t                  *queued;     /* store_queued_t */
    /*
     * and, if the store keeps it, the waiting calls whose notification
     * was delivered, by any node: store_notified_t; NULL otherwise
     */
    ngx_array_t                  *notified;

    /* a notification delivered, to record instead of a read */
    ngx_str_t                     call;
    ngx_str_t                     call_kind;

    /* a message to queue instead of a read */
    ngx_http_agent_store_queued_t queue;
} ngx_http_agent_store_read_t;


/*
 * A durable store of the canonical log.  open runs in the master when
 * the configuration is loaded (it may block: it creates or migrates the
 * schema); write runs on a thread of the pool, never in a worker's event
 * loop.  A PostgreSQL store is another struct like this one.
 */

/*
 * A batch to write: the events, and the audit's rows queued meanwhile,
 * in one transaction.  waits(data): an input has come to wait for the
 * store since the batch was taken.  A batch that is not an input's then
 * ends early, where each conversation's row written so far is true of
 * the events written (nevents says how many); any batch, at its end or
 * so cut, takes the events of the inputs that wait before its commit:
 * more(data, written, &events) gives them, claimed for the batch (nmore
 * says how many were written).
 * checkpoint, set by write: the WAL wants its checkpoint, which the
 * batch's end posts beside the batches that follow.
 */

typedef struct {
    ngx_http_agent_store_event_t *events;
    ngx_uint_t                    nevents;
    ngx_http_agent_audit_row_t   *rows;
    ngx_uint_t                    nrows;

    ngx_uint_t                  (*waits)(void *data);
    ngx_uint_t                  (*more)(void *data, ngx_uint_t written,
                                        ngx_http_agent_store_event_t **events);
    ngx_uint_t                    nmore;
    /*
     * true once the node's lease lapsed since the batch was collected:
     * its conversations left the zone unwritten, and one claimed again
     * since (the epoch kept) read the log without the batch, which then
     * must not commit
     */
    ngx_uint_t                  (*stale)(void *data);
    void                         *data;
    ngx_uint_t                    input;
    ngx_uint_t                    checkpoint;
    /*
     * set by write, which then returns NGX_ABORT and wrote nothing:
     * the conversation (one of the batch's events' conv) that another
     * node has taken, whose events this node may no longer write; or,
     * with lost_seq, one whose log holds another event at lost_seq than
     * the batch's (the zone's copy is not the log's)
     */
    ngx_str_t                     lost;
    uint64_t                      lost_seq;
} ngx_http_agent_store_batch_t;


typedef struct {
    ngx_str_t                     name;
    ngx_int_t                   (*open)(ngx_str_t *path, ngx_log_t *log);
    ngx_int_t                   (*write)(ngx_str_t *path,
                                         ngx_http_agent_store_batch_t *b,
                                         ngx_log_t *log);
    /* on a thread of the pool, into pool */
    ngx_int_t                   (*read)(ngx_str_t *path,
                                        ngx_http_agent_store_read_t *rd,
                                        ngx_pool_t *pool, ngx_log_t *log);
    /*
     * on a thread of the pool: the conversations that need a worker,
     * those with a call past its deadline at now (ms) and those whose
     * log ends inside a turn; on a node its heartbeat first (NGX_ERROR if
     * that failed, NGX_DECLINED if only the sweep did)
     */
    ngx_int_t                   (*sweep)(ngx_str_t *path, uint64_t now,
                                         ngx_array_t *ids, ngx_pool_t *pool,
                                         ngx_log_t *log);
    /*
     * on a thread of the pool: rd->queue, for rd->id; NGX_ABORT: another
     * node owns the conversation, nothing was written
     */
    ngx_int_t                   (*enqueue)(ngx_str_t *path,
                                           ngx_http_agent_store_read_t *rd,
                                           ngx_log_t *log);
    /*
     * on a thread of the pool, beside a write: the WAL's pages copied
     * back into the database, waiting for no writer
     */
    ngx_int_t                   (*checkpoint)(ngx_str_t *path,
                                              ngx_log_t *log);
    /*
     * on a thread of the pool: a take-over of rd->id's turn at seq
     * rd->after counted, rd->takeovers the times it was taken over there
     */
    ngx_int_t                   (*takeover)(ngx_str_t *path,
                                            ngx_http_agent_store_read_t *rd,
                                            ngx_log_t *log);
    /* on a thread of the pool: a page of agent_list, into ls->pool */
    ngx_int_t                   (*list)(ngx_str_t *path,
                                        ngx_http_agent_store_list_t *ls,
                                        ngx_log_t *log);
    /* on a thread of the pool: a page of a conversation's model calls */
    ngx_int_t                   (*audit_page)(ngx_str_t *path,
                                        ngx_http_agent_audit_page_t *page,
                                        ngx_pool_t *pool, ngx_log_t *log);
    /* in a worker that exits, once the pool's threads are gone */
    void                        (*close)(void);
    /*
     * in a worker as it starts, before any connection: sync, whether a
     * commit waits until the disk has it (else an exit of nginx loses
     * nothing written, a crash of the machine may lose the last commits)
     */
    void                        (*init_process)(ngx_uint_t sync);
    /*
     * on a thread of the pool, for a subscriber on a node that does not
     * own the conversation: the row (last_seq 0: none) and at most
     * rd->limit events after rd->after, in one snapshot; never a claim.
     * NULL: a store of one node, whose subscribers are all in the zone.
     */
    ngx_int_t                   (*follow)(ngx_str_t *path,
                                          ngx_http_agent_store_read_t *rd,
                                          ngx_pool_t *pool, ngx_log_t *log);
    /*
     * on a thread of the pool, NULL if the store has no owners: rd->id,
     * at rest and all of it written, left this worker's zone; a node
     * that still holds it at rd->epoch lets it go, so that another may
     * claim it at once; rd->last_seq 0: a created id never used, whose
     * row goes
     */
    ngx_int_t                   (*release)(ngx_str_t *path,
                                           ngx_http_agent_store_read_t *rd,
                                           ngx_log_t *log);
    /*
     * on a thread of the pool, NULL if the store keeps no created ids:
     * the row of rd->id, which agent_create made, bound to rd->agent and
     * rd->owner; NGX_DECLINED: the id is taken
     */
    ngx_int_t                   (*create)(ngx_str_t *path,
                                          ngx_http_agent_store_read_t *rd,
                                          ngx_log_t *log);
    /*
     * on a thread of the pool, NULL if the store does not keep it: the
     * notification of rd->id's waiting call rd->call (rd->call_kind) was
     * delivered, and a revival (on any node) finds it so
     */
    ngx_int_t                   (*notified)(ngx_str_t *path,
                                            ngx_http_agent_store_read_t *rd,
                                            ngx_log_t *log);
} ngx_http_agent_store_t;


/*
 * agent_node: the node's name in a store that several nginx share, its
 * address for the requests it owns, how often its heartbeat is written,
 * and how old a heartbeat may be before the node is taken for dead
 */
typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     addr;
    ngx_msec_t                    heartbeat;
    ngx_msec_t                    ttl;
} ngx_http_agent_store_node_t;


typedef struct ngx_http_agent_store_conf_s {
    ngx_http_agent_store_t       *store;
    ngx_str_t                     path;
    ngx_thread_pool_t            *thread_pool;
    /* how long an event that no input waits for may wait for a batch */
    ngx_msec_t                    flush;
    /* how long an input that follows another may wait for more */
    ngx_msec_t                    commit_delay;
    /* the history a worker keeps of the conversations it ran, bytes */
    size_t                        history;
    /* a commit waits until the disk has it (sync=full) */
    ngx_uint_t                    sync;
} ngx_http_agent_store_conf_t;


char *ngx_http_agent_store_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_agent_node_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_agent_store_init_module(ngx_cycle_t *cycle);
ngx_int_t ngx_http_agent_store_init_process(ngx_cycle_t *cycle);
void ngx_http_agent_store_exit_process(ngx_cycle_t *cycle);

/* answers the input once seq of the conversation is written */
ngx_int_t ngx_http_agent_store_ack(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t seq, ngx_uint_t status, ngx_str_t *json);

/*
 * an answer that is a stream of the turn: begun once seq is written,
 * from the event after from
 */
typedef ngx_int_t (*ngx_http_agent_store_answer_pt)(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t from);

ngx_int_t ngx_http_agent_store_ack_stream(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t seq, uint64_t from,
    ngx_http_agent_store_answer_pt answer);

typedef struct ngx_http_agent_store_reader_s  ngx_http_agent_store_reader_t;

typedef void (*ngx_http_agent_store_read_pt)(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);

/*
 * reads on the pool: the handler runs unless the owner pool went first;
 * NGX_BUSY: the pool's queue was full, nothing was started
 */
ngx_int_t ngx_http_agent_store_read(ngx_pool_t *owner, ngx_str_t *id,
    uint64_t after, uint64_t upto, ngx_http_agent_store_read_pt handler,
    void *data);

/*
 * a follower's read (the table's follow): the row and at most limit
 * events after "after"; NGX_DECLINED: the store has no follow
 */
ngx_int_t ngx_http_agent_store_follow(ngx_pool_t *owner, ngx_str_t *id,
    uint64_t after, ngx_uint_t limit, ngx_http_agent_store_read_pt handler,
    void *data);

/* 503 unavailable: the pool's queue refused a read, nothing was done */
ngx_int_t ngx_http_agent_store_busy_answer(ngx_http_request_t *r);
ngx_int_t ngx_http_agent_store_posted(ngx_http_request_t *r, ngx_int_t rc);

/* 503 unavailable: the store's read of the conversation failed */
ngx_int_t ngx_http_agent_store_unread_answer(ngx_http_request_t *r);

/* writes a queued message on the pool, then the handler runs */
ngx_int_t ngx_http_agent_store_enqueue(ngx_pool_t *owner, ngx_str_t *id,
    ngx_http_agent_store_queued_t *q, ngx_http_agent_store_read_pt handler,
    void *data);

/*
 * counts a take-over of the turn at seq on the pool, then the handler
 * runs with rd->takeovers
 */
ngx_int_t ngx_http_agent_store_takeover(ngx_pool_t *owner, ngx_str_t *id,
    uint64_t seq, ngx_http_agent_store_read_pt handler, void *data);

/*
 * the store's release of a conversation that left the zone at rest, if
 * it has one (seq: the record's last, 0 if it had no event)
 */
void ngx_http_agent_store_let_go(ngx_str_t *id, uint64_t epoch, uint64_t seq);

/* records a notification delivered, if the store keeps that */
void ngx_http_agent_store_notified(ngx_str_t *id, ngx_str_t *call,
    ngx_str_t *kind);

/*
 * writes the row of a created id on the pool, then the handler runs;
 * NGX_DECLINED: the store keeps no created ids, nothing was started
 */
ngx_int_t ngx_http_agent_store_create(ngx_pool_t *owner, ngx_str_t *id,
    ngx_str_t *agent, ngx_str_t *conv_owner,
    ngx_http_agent_store_read_pt handler, void *data);

/* a round of the expiry timer: at most one sweep a second in the zone */
void ngx_http_agent_store_sweep(ngx_http_agent_zone_t *z, uint64_t now);

/* canonical events were added in this worker: flush them soon */
void ngx_http_agent_store_kick(void);

/* a batch was written: the inputs of this worker it made durable answer */
void ngx_http_agent_store_ack_wake(void);

/* the WAL's checkpoint on the pool, unless this worker's is there */
void ngx_http_agent_store_checkpoint(ngx_http_agent_store_conf_t *scf);


extern ngx_http_agent_store_t  ngx_http_agent_store_sqlite;
extern ngx_http_agent_store_t  ngx_http_agent_store_pg;

/*
 * PostgreSQL on a node: the listener of the store's notifications, in
 * one worker of the node (ngx_http_agent_store_pg_listen.c); nothing
 * with another store or without agent_node
 */
ngx_int_t ngx_http_agent_pg_listen_init_process(ngx_cycle_t *cycle);
void ngx_http_agent_pg_listen_exit_process(void);

/* the revival of a conversation from the store: the turn's, set at init */
extern ngx_int_t  (*ngx_http_agent_store_revive)(ngx_http_request_t *r,
    ngx_str_t *id);

/*
 * another node took the conversation: it leaves the zone, its turn and
 * its subscribers end (the turn's, set at init)
 */
extern void  (*ngx_http_agent_store_lost)(ngx_str_t *id);

/* the node's lease checked, its conversations dropped if it lapsed */
extern ngx_int_t  (*ngx_http_agent_store_lease)(void);

/* 421 owned_elsewhere: another node owns the conversation, at addr */
ngx_int_t ngx_http_agent_store_elsewhere_answer(ngx_http_request_t *r,
    ngx_str_t *addr);


#endif /* _NGX_HTTP_AGENT_STORE_H_INCLUDED_ */
