
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_TURN_H_INCLUDED_
#define _NGX_HTTP_AGENT_TURN_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_fsm.h"
#include "ngx_http_agent_emit.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_trace.h"


/* the kinds of subrequest the turn's filters tell apart, each its own */
#define NGX_HTTP_AGENT_SUB_PROVIDER  0
#define NGX_HTTP_AGENT_SUB_TOOL      1
#define NGX_HTTP_AGENT_SUB_NOTIFY    2
#define NGX_HTTP_AGENT_SUB_MCP       3
#define NGX_HTTP_AGENT_SUB_HOOK      4
#define NGX_HTTP_AGENT_SUB_SUMMARY   5


/* the ctx of a turn's subrequest, first in what it belongs to */
typedef struct {
    ngx_uint_t                    kind;
    ngx_http_request_t           *sr;
} ngx_http_agent_sub_t;


typedef struct ngx_http_agent_turn_s  ngx_http_agent_turn_t;


/* a model call's attempt that failed and was tried again (its chat span) */

#define NGX_HTTP_AGENT_RETRIES_KEPT   8
#define NGX_HTTP_AGENT_ERROR_TYPE_MAX 32

typedef struct {
    uint64_t                      started;
    uint64_t                      ended;
    ngx_uint_t                    status;
    size_t                        type_len;
    u_char                        type[NGX_HTTP_AGENT_ERROR_TYPE_MAX];
} ngx_http_agent_retry_t;

/*
 * A turn in this worker.  It lives in the pool of its detached request's
 * connection; each model call has a pool of its own, destroyed when the
 * call ends, so a long turn does not grow.
 */

struct ngx_http_agent_turn_s {
    /* first: what the filters see of a subrequest's ctx */
    ngx_http_agent_sub_t          sub;

    ngx_http_request_t           *request;
    ngx_http_agent_t             *agent;
    ngx_http_agent_zone_t        *zone;

    u_char                        id_data[NGX_HTTP_AGENT_ID_LEN];
    ngx_str_t                     id;
    ngx_uint_t                    turn;

    /* the zone's drops when it started: a later one took its record */
    ngx_uint_t                    drops;

    ngx_uint_t                    model_calls;
    ngx_uint_t                    attempt;
    ngx_uint_t                    attempts;   /* the last call ended took */

    /* the tries of a history read the store's pool refused */
    ngx_uint_t                    store_busy;

    /*
     * the log before the zone's, read from the store, for the turn, and
     * with a store what the turn's model calls copied from the zone
     * after it (ngx_http_agent_turn_request_body); the room in history
     * if the turn's calls made it, else 0
     */
    ngx_str_t                    *history;
    ngx_uint_t                    nhistory;
    ngx_uint_t                    history_size;
    uint64_t                      history_upto;

    /*
     * or what this worker kept at the conversation's last turn here:
     * events kept_first and after, the history is the first of them
     */
    ngx_str_t                    *kept;
    ngx_uint_t                    nkept;
    uint64_t                      kept_first;
    unsigned                      kept_taken:1;

    /* the model call in progress, and its request's size */
    ngx_pool_t                   *pool;
    size_t                        context_len;
    ngx_http_agent_reply_t       *reply;
    ngx_int_t                     rc;
    ngx_uint_t                    status;
    time_t                        retry_after;
    ngx_http_agent_bytes_t        error_body;
    ngx_uint_t                    delta_seq;
    u_char                        message_id[32];
    size_t                        message_id_len;

    /* the trace context of the turn's user_msg, read once */
    ngx_http_agent_trace_t        trace;

    /* the model call's attempts tried again, the first ones kept */
    ngx_http_agent_retry_t        retries[NGX_HTTP_AGENT_RETRIES_KEPT];
    ngx_uint_t                    nretries;

    /* the structured output the turn's message asks for, or empty */
    ngx_str_t                     output;
    unsigned                      parse_error:1;
    unsigned                      sr_done:1;

    /* the call's start, first chunk (ngx_current_msec) and start, wall */
    ngx_msec_t                    call_start;
    ngx_msec_t                    first_chunk;
    uint64_t                      call_started;
    /* the conversation's epoch then: its audit rows are fenced by it */
    uint64_t                      call_epoch;

    /* the call's model_timeout: keep-alive comments do not extend it */
    ngx_event_t                   deadline;
    unsigned                      timed_out:1;

    /* the JSON of a live delta, reused for every one */
    ngx_http_agent_bytes_t        scratch;

    /*
     * deltas of one kind joined until the event loop's pass ends, or
     * until agent_delta_interval has passed since the last live event
     */
    ngx_http_agent_bytes_t        delta;
    ngx_uint_t                    delta_kind;
    ngx_uint_t                    delta_index;
    ngx_event_t                   delta_event;
    ngx_msec_t                    delta_sent;
    unsigned                      delta_once:1;

    /* the provider's connection left unread while a delta is held */
    ngx_event_t                   read_pause;
    unsigned                      read_paused:1;

    ngx_event_t                   event;
    ngx_log_t                     log;

    /* the turn's subrequests left to later passes (_turn_run_posted()) */
    ngx_event_t                   runner;

    /* the conversation's last seq when the batch was read from the log */
    uint64_t                      batch_seq;

    /* tool calls of the batch still running, and suspended */
    ngx_uint_t                    running;
    ngx_uint_t                    suspended;

    /* the calls dispatched in this batch (ngx_http_agent_call_t *) */
    ngx_array_t                  *calls;

    /* running MCP calls whose server waits for an answer (elicitation) */
    ngx_uint_t                    elicitations;

    /* in the worker's list of turns */
    ngx_queue_t                   queue;
    unsigned                      cancelling:1;
    unsigned                      recorded:1;

    /* a tool's result found no room in the zone: the turn cannot go on */
    unsigned                      unrecorded:1;

    /* taken over from a worker that died: its running calls run again */
    unsigned                      takeover:1;

    /* the take-over was counted in the store */
    unsigned                      counted:1;

    /* the tools of the agent's MCP servers, as this turn knows them */
    void                         *mcp;

    /* the hook that runs (ngx_http_agent_hook.c), or NULL */
    void                         *hook;

    /* hook_before was asked for the model call to come */
    unsigned                      hooked:1;

    /* the frontend tools its user_msg offers (ngx_http_agent_client_tools) */
    void                         *client;

    /* nginx takes a request's log data for an ngx_http_log_ctx_t */
    ngx_http_log_ctx_t            log_ctx;
};




/* how ngx_http_agent_turn_start() starts a turn */
#define NGX_HTTP_AGENT_TURN_NEW         0   /* a model call */
#define NGX_HTTP_AGENT_TURN_RESUME      1   /* on from the log */
#define NGX_HTTP_AGENT_TURN_TAKEOVER    2   /* its worker died */
#define NGX_HTTP_AGENT_TURN_GIVE_UP     3   /* it died too often: it fails */


ngx_int_t ngx_http_agent_turn_init_filters(ngx_conf_t *cf);

/*
 * Runs the turn of a conversation whose lease this worker holds, on a
 * request of its own: r is only where the turn takes its server
 * configuration from, and may go away at once.
 */
ngx_int_t ngx_http_agent_turn_start(ngx_http_request_t *r,
    ngx_http_agent_t *agent, ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t turn, ngx_uint_t resume);

ngx_int_t ngx_http_agent_turn_subrequest(ngx_http_agent_turn_t *t,
    ngx_http_agent_sub_t *sub, ngx_str_t *uri, ngx_str_t *body,
    ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_http_post_subrequest_pt handler, void *data);

/* the turn goes on in handler, in this pass of the event loop or later */
void ngx_http_agent_turn_post(ngx_http_agent_turn_t *t,
    ngx_event_handler_pt handler);

/* the turn's subrequests run, in this pass and, past its time, later */
void ngx_http_agent_turn_run_posted(ngx_http_agent_turn_t *t);

/* a subrequest of the turn ended: the turn goes on in handler */
ngx_int_t ngx_http_agent_turn_sub_ended(ngx_http_agent_turn_t *t,
    ngx_event_handler_pt handler, ngx_int_t rc);

/* the status of a logged assistant message */
/* how much of a provider's error body is kept for the turn_failed event */
#define NGX_HTTP_AGENT_ERROR_BODY  512

/* what turn_failed keeps of an error: message, type, code, generation */
#define NGX_HTTP_AGENT_DETAILS     4


/* what the end of a model call means for the turn */
typedef enum {
    NGX_HTTP_AGENT_CALL_OK = 0,
    NGX_HTTP_AGENT_CALL_RETRY,
    NGX_HTTP_AGENT_CALL_FAILED
} ngx_http_agent_call_e;


#define NGX_HTTP_AGENT_MSG_COMPLETE      0
#define NGX_HTTP_AGENT_MSG_INTERRUPTED   1
#define NGX_HTTP_AGENT_MSG_CANCELLED     2

/* the most a live delta joins of the pieces that arrived together */
#define NGX_HTTP_AGENT_DELTA_JOIN        (16 * 1024)


/* the steps of a turn, across ngx_http_agent_turn.c and _turn_resume.c */
void ngx_http_agent_turn_model_call(ngx_event_t *ev);
void ngx_http_agent_turn_resume(ngx_event_t *ev);
void ngx_http_agent_turn_give_up(ngx_event_t *ev);
void ngx_http_agent_turn_batch_done(ngx_event_t *ev);
ngx_int_t ngx_http_agent_turn_record(ngx_http_agent_turn_t *t,
    ngx_uint_t status);
void ngx_http_agent_turn_structured(ngx_http_agent_turn_t *t);
ngx_uint_t ngx_http_agent_turn_said(ngx_http_agent_reply_t *reply);
ngx_int_t ngx_http_agent_turn_error_result(ngx_http_agent_turn_t *t,
    ngx_str_t *id, ngx_str_t *name, char *error);
ngx_int_t ngx_http_agent_turn_end(ngx_http_agent_turn_t *t,
    ngx_http_agent_fsm_input_e input, ngx_str_t *fields);
void ngx_http_agent_turn_abort(ngx_http_agent_turn_t *t);
void ngx_http_agent_turn_close(ngx_http_agent_turn_t *t);

/* a turn for a message that waited, started by the module itself */
void ngx_http_agent_turn_next(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *zone, ngx_str_t *id, ngx_uint_t turn);

/* the reply is logged and passed hook_after: its calls, or the end */
void ngx_http_agent_turn_replied(ngx_http_agent_turn_t *t);

/* the batch of tool calls is done: the next model call, or a stop */
void ngx_http_agent_turn_tools_done(ngx_http_agent_turn_t *t);

/*
 * A cancel of the conversation was asked for: its turn, if this worker
 * runs it, is taken down; or a question of an MCP server during one of
 * its calls was answered: the answer goes to the server.  The check
 * looks at every turn of the worker.
 */
void ngx_http_agent_turn_cancel(ngx_str_t *id);
void ngx_http_agent_turn_cancel_check(void);

/* a reply's piece, as a live event (the provider's delta handler) */
void ngx_http_agent_turn_delta_flush(ngx_http_agent_turn_t *t);
void ngx_http_agent_turn_delta(ngx_http_agent_reply_t *reply,
    ngx_uint_t kind, ngx_uint_t index, ngx_str_t *s);

/* what a model call's end means: ngx_http_agent_turn_outcome.c */
ngx_http_agent_call_e ngx_http_agent_turn_outcome(
    ngx_http_agent_turn_t *t, ngx_str_t *reason);
ngx_msec_t ngx_http_agent_turn_backoff(ngx_http_agent_turn_t *t);


#endif /* _NGX_HTTP_AGENT_TURN_H_INCLUDED_ */
