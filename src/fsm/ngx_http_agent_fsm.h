
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_FSM_H_INCLUDED_
#define _NGX_HTTP_AGENT_FSM_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"


/* what happens to a conversation: the inputs of its state machine */
typedef enum {
    NGX_HTTP_AGENT_FSM_MESSAGE = 0,   /* a user_msg starts a turn here */
    NGX_HTTP_AGENT_FSM_NEXT,          /* a message that waited may start */
    NGX_HTTP_AGENT_FSM_MODEL,         /* a model call starts */
    NGX_HTTP_AGENT_FSM_CALLS,         /* calls of a batch run */
    NGX_HTTP_AGENT_FSM_SUSPEND,       /* a call waits for outside input */
    NGX_HTTP_AGENT_FSM_SETTLED,       /* a waiting call was resolved or
                                         expired */
    NGX_HTTP_AGENT_FSM_RUN,           /* an approved server call runs now */
    NGX_HTTP_AGENT_FSM_WAIT,          /* the turn stops here until input */
    NGX_HTTP_AGENT_FSM_COMPLETE,      /* the final reply */
    NGX_HTTP_AGENT_FSM_FAIL,
    NGX_HTTP_AGENT_FSM_HALT,          /* a hook stopped the turn */
    NGX_HTTP_AGENT_FSM_ABANDON,       /* a turn that could not run here */
    NGX_HTTP_AGENT_FSM_CANCEL,
    NGX_HTTP_AGENT_FSM_TAKEOVER,      /* the turn's worker died */
    NGX_HTTP_AGENT_FSM_RESTORE_IDLE,  /* revived from the store: at rest */
    NGX_HTTP_AGENT_FSM_RESTORE_WAITING, /* ... calls wait, none runs */
    NGX_HTTP_AGENT_FSM_RESTORE_RUNNING, /* ... the turn goes on here */
    NGX_HTTP_AGENT_FSM_NINPUTS
} ngx_http_agent_fsm_input_e;


/* a transition: what it takes, and what the caller acts on after it */
typedef struct {
    /* in: the user_msg's fields (MESSAGE), the terminal event's */
    ngx_str_t                    *fields;
    uint32_t                      hash;       /* MESSAGE: of source_id */

    /* out */
    ngx_http_agent_state_e        state;      /* the state after */
    uint64_t                      seq;        /* of the event recorded */
    ngx_uint_t                    turn;       /* the conversation's turn */

    unsigned                      run:1;      /* this worker took the
                                                 lease: it runs the turn */
    unsigned                      give_up:1;  /* taken over too often */
    unsigned                      next:1;     /* a message that waited
                                                 started next_turn here */
    ngx_uint_t                    next_turn;
    uint64_t                      next_seq;   /* of its user_msg */

    ngx_uint_t                    npids;      /* subscribers to wake */
    ngx_pid_t                     pids[NGX_HTTP_AGENT_SUB_WORKERS];
} ngx_http_agent_fsm_t;


/*
 * A turn is taken over from dead workers at most this many times in a
 * row, with no reply or result recorded in between: a reply or a tool
 * that crashes workers cannot crash them forever.
 */
#define NGX_HTTP_AGENT_TAKEOVERS          5

#define NGX_HTTP_AGENT_SETTLE_EXPIRED     0
#define NGX_HTTP_AGENT_SETTLE_CANCELLED   1
#define NGX_HTTP_AGENT_SETTLE_LOST        2   /* its call's worker died */
#define NGX_HTTP_AGENT_SETTLE_SERVER      3   /* its MCP server gave up */

/*
 * a message's fields that begin so (then the seq, then a comma) rewind
 * the context to that seq before its user_msg
 */
#define NGX_HTTP_AGENT_REWIND_PREFIX      "{\"rewind_to\":"

#define NGX_HTTP_AGENT_UNPAIRED                                              \
    "[failed] the turn ended before the call had a result"


/*
 * Under the zone lock.  NGX_DECLINED: the input has no row for the
 * conversation's state (logged as an alert), nothing changed; NGX_ERROR:
 * the event it records found no room, nothing changed.
 */
ngx_int_t ngx_http_agent_fsm_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_input_e input,
    ngx_http_agent_fsm_t *fsm);

/* after the lock: the subscribers woken, the message that waited run */
void ngx_http_agent_fsm_after(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *z, ngx_str_t *id, ngx_http_agent_fsm_t *fsm);

/* under the lock: a waiting call ends with an error the model sees */
ngx_int_t ngx_http_agent_fsm_settle_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_pending_t *p,
    ngx_uint_t how, char *reason);
ngx_int_t ngx_http_agent_fsm_error_result_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *id, ngx_str_t *name,
    char *error);

/* under the lock: the calls that wait, the messages that wait */
ngx_http_agent_queued_t *ngx_http_agent_fsm_queue_add_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv, ngx_str_t *fields,
    uint32_t hash, ngx_uint_t front);
void ngx_http_agent_fsm_queue_free_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_queued_t *m);
ngx_http_agent_pending_t *ngx_http_agent_fsm_pending_add_locked(
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv, ngx_str_t *id,
    ngx_str_t *name, ngx_uint_t executor, ngx_uint_t kind, uint64_t deadline);
void ngx_http_agent_fsm_pending_remove_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_pending_t *p);


extern ngx_str_t  ngx_http_agent_fsm_inputs[];

/* starts the turn of a message that waited: the turn's, set at init */
extern void  (*ngx_http_agent_fsm_next)(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *z, ngx_str_t *id, ngx_uint_t turn);


#endif /* _NGX_HTTP_AGENT_FSM_H_INCLUDED_ */
