
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The conversation's state machine: the one place that writes a
 * conversation's state and lease, ends its turns and starts the messages
 * that waited.  Data in the zone, logic here, as limit_req does it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_fsm.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_wake.h"


/* states as bits, for the table */
#define NGX_HTTP_AGENT_FSM_S(s)         (1 << NGX_HTTP_AGENT_##s)
#define NGX_HTTP_AGENT_FSM_IDLE         NGX_HTTP_AGENT_FSM_S(IDLE)
#define NGX_HTTP_AGENT_FSM_PREPARING    NGX_HTTP_AGENT_FSM_S(PREPARING)
#define NGX_HTTP_AGENT_FSM_STREAMING    NGX_HTTP_AGENT_FSM_S(STREAMING)
#define NGX_HTTP_AGENT_FSM_EXECUTING    NGX_HTTP_AGENT_FSM_S(EXECUTING_TOOLS)
#define NGX_HTTP_AGENT_FSM_AWAITING     NGX_HTTP_AGENT_FSM_S(AWAITING_INPUT)
#define NGX_HTTP_AGENT_FSM_BUSY                                              \
    (NGX_HTTP_AGENT_FSM_PREPARING|NGX_HTTP_AGENT_FSM_STREAMING               \
     |NGX_HTTP_AGENT_FSM_EXECUTING|NGX_HTTP_AGENT_FSM_AWAITING)

/* guards on the calls that wait for input */
#define NGX_HTTP_AGENT_FSM_ANY          0
#define NGX_HTTP_AGENT_FSM_WAITING      1     /* some call waits */
#define NGX_HTTP_AGENT_FSM_NONE_WAITS   2

/* the next state: one of the states, or the same */
#define NGX_HTTP_AGENT_FSM_SAME         -1

/* the lease */
#define NGX_HTTP_AGENT_FSM_KEEP         0
#define NGX_HTTP_AGENT_FSM_TAKE         1     /* this worker's, from anyone */
#define NGX_HTTP_AGENT_FSM_TAKE_FREE    2     /* this worker's, if no one's */
#define NGX_HTTP_AGENT_FSM_GIVE         3     /* no one's: the turn ended
                                                 in its worker */

/* what is done before the state changes */
#define NGX_HTTP_AGENT_FSM_NOTHING      0
#define NGX_HTTP_AGENT_FSM_START        1     /* the user_msg, turn + 1 */
#define NGX_HTTP_AGENT_FSM_PAIR         2     /* calls left get results */
#define NGX_HTTP_AGENT_FSM_CLEAR        3     /* waiting calls cancelled,
                                                 calls left get results */

/* the message that waited */
#define NGX_HTTP_AGENT_FSM_STAY         0
#define NGX_HTTP_AGENT_FSM_START_NEXT   1
#define NGX_HTTP_AGENT_FSM_LATER        2     /* by the expiry timer */


typedef struct {
    ngx_http_agent_fsm_input_e    input;
    ngx_uint_t                    from;       /* states, as bits */
    ngx_uint_t                    guard;
    ngx_int_t                     to;
    ngx_uint_t                    lease;
    ngx_uint_t                    action;
    ngx_int_t                     terminal;   /* event type, or -1 */
    ngx_uint_t                    next;
} ngx_http_agent_fsm_row_t;


/* a call of the turn, and whether the log has its result */
typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     name;
    ngx_uint_t                    paired;
} ngx_http_agent_fsm_pair_t;


static ngx_http_agent_fsm_row_t *ngx_http_agent_fsm_row(
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_input_e input);
static ngx_int_t ngx_http_agent_fsm_act_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_row_t *row,
    ngx_http_agent_fsm_t *fsm);
static ngx_int_t ngx_http_agent_fsm_start_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_t *fsm);
static ngx_int_t ngx_http_agent_fsm_rewind_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *fields);
static void ngx_http_agent_fsm_next_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_t *fsm);
static ngx_int_t ngx_http_agent_fsm_state_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_state_e state);
static void ngx_http_agent_fsm_lease_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_pid_t pid);
static ngx_int_t ngx_http_agent_fsm_pair_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, char *error);
static ngx_int_t ngx_http_agent_fsm_pair_event(ngx_pool_t *pool,
    ngx_http_agent_event_t *e, ngx_array_t *calls);
static ngx_int_t ngx_http_agent_fsm_pair_copy(ngx_pool_t *pool,
    ngx_str_t *dst, char *src);


/* a turn for the message that waited (set by ngx_http_agent_module.c) */
void  (*ngx_http_agent_fsm_next)(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *z, ngx_str_t *id, ngx_uint_t turn);


ngx_str_t  ngx_http_agent_fsm_inputs[] = {
    ngx_string("message"),
    ngx_string("next"),
    ngx_string("model"),
    ngx_string("calls"),
    ngx_string("suspend"),
    ngx_string("settled"),
    ngx_string("run"),
    ngx_string("wait"),
    ngx_string("complete"),
    ngx_string("fail"),
    ngx_string("halt"),
    ngx_string("abandon"),
    ngx_string("cancel"),
    ngx_string("takeover"),
    ngx_string("restore_idle"),
    ngx_string("restore_waiting"),
    ngx_string("restore_running"),
    ngx_null_string
};


/*
 * The table.  Rows are matched in order, on the input, the state and the
 * guard; an input in a state with no row is a bug.  docs/architecture.md
 * shows it as a table.
 */

#define IDLE       NGX_HTTP_AGENT_FSM_IDLE
#define PREPARING  NGX_HTTP_AGENT_FSM_PREPARING
#define STREAMING  NGX_HTTP_AGENT_FSM_STREAMING
#define EXECUTING  NGX_HTTP_AGENT_FSM_EXECUTING
#define AWAITING   NGX_HTTP_AGENT_FSM_AWAITING
#define BUSY       NGX_HTTP_AGENT_FSM_BUSY

static ngx_http_agent_fsm_row_t  ngx_http_agent_fsm_table[] = {

    /* input, from, guard,
       to, lease, action, terminal event, the message that waited */

    { NGX_HTTP_AGENT_FSM_MESSAGE, IDLE, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_PREPARING, NGX_HTTP_AGENT_FSM_TAKE,
      NGX_HTTP_AGENT_FSM_START, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_NEXT, IDLE, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_FSM_SAME, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_START_NEXT },

    { NGX_HTTP_AGENT_FSM_MODEL, PREPARING|STREAMING|EXECUTING,
      NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_STREAMING, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /* executing_tools while calls run and none waits, else awaiting */

    { NGX_HTTP_AGENT_FSM_CALLS, BUSY, NGX_HTTP_AGENT_FSM_NONE_WAITS,
      NGX_HTTP_AGENT_EXECUTING_TOOLS, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_CALLS, BUSY, NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_SUSPEND, BUSY, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /*
     * the last waiting call settled: the turn goes on, in the worker
     * that holds it, or else here
     */

    { NGX_HTTP_AGENT_FSM_SETTLED, AWAITING, NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_SETTLED, AWAITING, NGX_HTTP_AGENT_FSM_NONE_WAITS,
      NGX_HTTP_AGENT_EXECUTING_TOOLS, NGX_HTTP_AGENT_FSM_TAKE_FREE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /* an approved server call runs now, whatever else still waits */

    { NGX_HTTP_AGENT_FSM_RUN, AWAITING, NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_TAKE_FREE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_RUN, AWAITING, NGX_HTTP_AGENT_FSM_NONE_WAITS,
      NGX_HTTP_AGENT_EXECUTING_TOOLS, NGX_HTTP_AGENT_FSM_TAKE_FREE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /*
     * the batch is done in the turn's worker: it stops while a call
     * waits; if none does (all were resolved meanwhile), it goes on
     */

    { NGX_HTTP_AGENT_FSM_WAIT, AWAITING, NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_WAIT, AWAITING, NGX_HTTP_AGENT_FSM_NONE_WAITS,
      NGX_HTTP_AGENT_EXECUTING_TOOLS, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /* a turn taken over before its first model call has no batch */

    { NGX_HTTP_AGENT_FSM_WAIT, PREPARING|STREAMING|EXECUTING,
      NGX_HTTP_AGENT_FSM_NONE_WAITS,
      NGX_HTTP_AGENT_FSM_SAME, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /*
     * a turn taken over from a worker that died between a call's
     * suspension and the state it would have set: it waits
     */

    { NGX_HTTP_AGENT_FSM_WAIT, PREPARING|STREAMING|EXECUTING,
      NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /* the ends of a turn */

    { NGX_HTTP_AGENT_FSM_COMPLETE, STREAMING, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_IDLE, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_NOTHING, NGX_HTTP_AGENT_EV_TURN_COMPLETED,
      NGX_HTTP_AGENT_FSM_START_NEXT },

    { NGX_HTTP_AGENT_FSM_FAIL, BUSY, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_IDLE, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_PAIR, NGX_HTTP_AGENT_EV_TURN_FAILED,
      NGX_HTTP_AGENT_FSM_START_NEXT },

    /* a hook stopped it: calls it leaves get results, as for a failure */

    { NGX_HTTP_AGENT_FSM_HALT, BUSY, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_IDLE, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_PAIR, NGX_HTTP_AGENT_EV_TURN_HALTED,
      NGX_HTTP_AGENT_FSM_START_NEXT },

    { NGX_HTTP_AGENT_FSM_ABANDON, BUSY, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_IDLE, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_PAIR, NGX_HTTP_AGENT_EV_TURN_FAILED,
      NGX_HTTP_AGENT_FSM_LATER },

    { NGX_HTTP_AGENT_FSM_CANCEL, BUSY, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_IDLE, NGX_HTTP_AGENT_FSM_GIVE,
      NGX_HTTP_AGENT_FSM_CLEAR, NGX_HTTP_AGENT_EV_CANCELLED,
      NGX_HTTP_AGENT_FSM_START_NEXT },

    /* the turn's worker died: this one goes on from the log */

    { NGX_HTTP_AGENT_FSM_TAKEOVER, BUSY, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_FSM_SAME, NGX_HTTP_AGENT_FSM_TAKE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    /* a conversation revived from the store, its state from its log */

    { NGX_HTTP_AGENT_FSM_RESTORE_IDLE, IDLE, NGX_HTTP_AGENT_FSM_ANY,
      NGX_HTTP_AGENT_IDLE, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_START_NEXT },

    { NGX_HTTP_AGENT_FSM_RESTORE_WAITING, IDLE, NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_KEEP,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_RESTORE_RUNNING, IDLE,
      NGX_HTTP_AGENT_FSM_NONE_WAITS,
      NGX_HTTP_AGENT_EXECUTING_TOOLS, NGX_HTTP_AGENT_FSM_TAKE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY },

    { NGX_HTTP_AGENT_FSM_RESTORE_RUNNING, IDLE, NGX_HTTP_AGENT_FSM_WAITING,
      NGX_HTTP_AGENT_AWAITING_INPUT, NGX_HTTP_AGENT_FSM_TAKE,
      NGX_HTTP_AGENT_FSM_NOTHING, -1, NGX_HTTP_AGENT_FSM_STAY }
};

#undef IDLE
#undef PREPARING
#undef STREAMING
#undef EXECUTING
#undef AWAITING
#undef BUSY


ngx_int_t
ngx_http_agent_fsm_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_input_e input,
    ngx_http_agent_fsm_t *fsm)
{
    ngx_int_t                  rc;
    ngx_pid_t                  held;
    ngx_str_t                  ended;
    ngx_http_agent_state_e     from;
    ngx_http_agent_fsm_row_t  *row;

    fsm->run = 0;
    fsm->give_up = 0;
    fsm->next = 0;
    fsm->npids = 0;

    from = conv->state;

    row = ngx_http_agent_fsm_row(conv, input);

    if (row == NULL) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "agent conversation \"%*s\": input \"%V\" in state "
                      "\"%V\" with %ui calls waiting has no transition",
                      conv->id_len, conv->id,
                      &ngx_http_agent_fsm_inputs[input],
                      &ngx_http_agent_state_names[from],
                      (ngx_uint_t) conv->npending);
        fsm->state = from;
        return NGX_DECLINED;
    }

    rc = ngx_http_agent_fsm_act_locked(z, conv, row, fsm);

    if (rc != NGX_OK) {
        fsm->state = conv->state;
        return rc;
    }

    held = conv->lease;

    switch (row->lease) {

    case NGX_HTTP_AGENT_FSM_TAKE:
        if (input == NGX_HTTP_AGENT_FSM_TAKEOVER) {
            fsm->give_up = (++conv->takeovers > NGX_HTTP_AGENT_TAKEOVERS);
            conv->cancel = 0;
            ngx_http_agent_metrics_takeover(z);

        } else if (input == NGX_HTTP_AGENT_FSM_RESTORE_RUNNING) {
            conv->takeovers = 1;
            ngx_http_agent_metrics_takeover(z);
        }

        ngx_http_agent_fsm_lease_locked(z, conv, ngx_pid);
        fsm->run = 1;
        break;

    case NGX_HTTP_AGENT_FSM_TAKE_FREE:
        if (held == 0) {
            ngx_http_agent_fsm_lease_locked(z, conv, ngx_pid);
            fsm->run = 1;
        }

        break;

    default:
        break;
    }

    if (row->to != NGX_HTTP_AGENT_FSM_SAME) {
        (void) ngx_http_agent_fsm_state_locked(z, conv,
                                            (ngx_http_agent_state_e) row->to);
    }

    if (row->lease == NGX_HTTP_AGENT_FSM_GIVE) {
        conv->cancel = 0;

        if (held) {
            /* the turn is down in its worker: for the live plane */
            ngx_str_set(&ended, "{}");
            (void) ngx_http_agent_log_add_locked(z, conv,
                                                NGX_HTTP_AGENT_EV_TURN_ENDED,
                                                &ended);
            ngx_http_agent_fsm_lease_locked(z, conv, 0);
            ngx_http_agent_log_rest_locked(z, conv);
        }
    }

    ngx_log_debug5(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "agent fsm \"%*s\": %V: %V -> %V",
                   conv->id_len, conv->id,
                   &ngx_http_agent_fsm_inputs[input],
                   &ngx_http_agent_state_names[from],
                   &ngx_http_agent_state_names[conv->state]);

    switch (row->next) {

    case NGX_HTTP_AGENT_FSM_START_NEXT:
        ngx_http_agent_fsm_next_locked(z, conv, fsm);
        break;

    case NGX_HTTP_AGENT_FSM_LATER:
        if (conv->nqueued) {
            z->sh->stalled = 1;
        }

        break;

    default:
        break;
    }

    fsm->state = conv->state;
    fsm->turn = conv->turn;
    fsm->npids = ngx_http_agent_conv_sub_pids_locked(conv, fsm->pids);

    return NGX_OK;
}


static ngx_http_agent_fsm_row_t *
ngx_http_agent_fsm_row(ngx_http_agent_conv_t *conv,
    ngx_http_agent_fsm_input_e input)
{
    ngx_uint_t                 i;
    ngx_http_agent_fsm_row_t  *row;

    for (i = 0; i < sizeof(ngx_http_agent_fsm_table)
                    / sizeof(ngx_http_agent_fsm_row_t); i++)
    {
        row = &ngx_http_agent_fsm_table[i];

        if (row->input != input
            || !(row->from & (1 << conv->state))
            || (row->guard == NGX_HTTP_AGENT_FSM_WAITING
                && conv->npending == 0)
            || (row->guard == NGX_HTTP_AGENT_FSM_NONE_WAITS
                && conv->npending))
        {
            continue;
        }

        return row;
    }

    return NULL;
}


/*
 * What an input records before the state changes: the user_msg of a new
 * turn; results for the calls a failing turn leaves; for a cancel, the
 * waiting calls resolved as cancelled too; the terminal event.  Only a
 * new turn's user_msg and a cancel's event must find room: a turn that
 * fails or completes without room for its end still ends (the next
 * message closes it in the log, see fsm_start_locked()).
 */

static ngx_int_t
ngx_http_agent_fsm_act_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_row_t *row,
    ngx_http_agent_fsm_t *fsm)
{
    ngx_str_t                 fields;
    ngx_uint_t                i;
    ngx_http_agent_event_t   *ev;

    switch (row->action) {

    case NGX_HTTP_AGENT_FSM_START:
        return ngx_http_agent_fsm_start_locked(z, conv, fsm);

    case NGX_HTTP_AGENT_FSM_PAIR:
        (void) ngx_http_agent_fsm_pair_locked(z, conv,
                                              NGX_HTTP_AGENT_UNPAIRED);
        break;

    case NGX_HTTP_AGENT_FSM_CLEAR:
        /* the last one settled frees the slots */
        for (i = 0; conv->pending && i < conv->pending_slots; i++) {
            if (conv->pending[i].kind) {
                (void) ngx_http_agent_fsm_settle_locked(z, conv,
                                                &conv->pending[i],
                                                NGX_HTTP_AGENT_SETTLE_CANCELLED,
                                                "user cancelled");
            }
        }

        /* a call no result was recorded for, whatever the reason */
        (void) ngx_http_agent_fsm_pair_locked(z, conv, "[cancelled]");

        break;

    default:
        break;
    }

    if (row->terminal < 0) {
        return NGX_OK;
    }

    if (row->terminal == NGX_HTTP_AGENT_EV_CANCELLED) {
        ngx_str_set(&fields, "{\"reason\":\"cancelled by the user\"}");

    } else if (fsm->fields) {
        fields = *fsm->fields;

    } else {
        ngx_str_set(&fields, "{}");
    }

    ev = ngx_http_agent_log_add_locked(z, conv, row->terminal, &fields);

    if (ev == NULL) {
        if (row->terminal == NGX_HTTP_AGENT_EV_CANCELLED) {
            return NGX_ERROR;
        }

        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent turn of \"%*s\" could not record its end",
                      conv->id_len, conv->id);
        return NGX_OK;
    }

    fsm->seq = ev->seq;

    if (row->terminal == NGX_HTTP_AGENT_EV_CANCELLED) {
        conv->cancelled = ev->seq;
    }

    return NGX_OK;
}


void
ngx_http_agent_fsm_after(ngx_http_agent_t *agent, ngx_http_agent_zone_t *z,
    ngx_str_t *id, ngx_http_agent_fsm_t *fsm)
{
    ngx_http_agent_wake(id, fsm->pids, fsm->npids);

    if (fsm->next) {
        ngx_http_agent_fsm_next(agent, z, id, fsm->next_turn);
    }
}


/*
 * A new turn: the last one closed if its end is not in the log (a full
 * zone), its calls paired; the turn counter, the user_msg, turn_started
 * and the source_id remembered.
 */

static ngx_int_t
ngx_http_agent_fsm_start_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_t *fsm)
{
    ngx_str_t                 empty, closed;
    ngx_queue_t              *q;
    ngx_http_agent_event_t   *ev;
    ngx_http_agent_source_t  *src;

    ngx_str_set(&empty, "{}");

    /* a summary or a rewind made after the last turn ended is not in it */

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ngx_http_agent_event_outside(ev->type)) {
            continue;
        }

        if (!ngx_http_agent_event_terminal(ev->type)) {
            ngx_str_set(&closed, "{\"reason\":\"the turn's end could not "
                                 "be recorded\"}");

            if (ngx_http_agent_fsm_pair_locked(z, conv,
                                               NGX_HTTP_AGENT_UNPAIRED)
                != NGX_OK
                || ngx_http_agent_log_add_locked(z, conv,
                                                NGX_HTTP_AGENT_EV_TURN_FAILED,
                                                &closed)
                   == NULL)
            {
                return NGX_ERROR;
            }
        }

        break;
    }

    if (ngx_http_agent_fsm_rewind_locked(z, conv, fsm->fields) != NGX_OK) {
        return NGX_ERROR;
    }

    conv->turn++;
    conv->takeovers = 0;

    ev = ngx_http_agent_log_add_locked(z, conv, NGX_HTTP_AGENT_EV_USER_MSG,
                                         fsm->fields);
    if (ev == NULL) {
        conv->turn--;
        return NGX_ERROR;
    }

    fsm->seq = ev->seq;

    (void) ngx_http_agent_log_add_locked(z, conv,
                                           NGX_HTTP_AGENT_EV_TURN_STARTED,
                                           &empty);

    if (fsm->hash) {
        src = &conv->sources[conv->nsources++ % NGX_HTTP_AGENT_SOURCE_IDS];
        src->hash = fsm->hash;
        src->turn = conv->turn;
        src->seq = ev->seq;
    }

    return NGX_OK;
}


/*
 * A message whose fields begin {"rewind_to":N, (a regenerate or an edit,
 * NGX_HTTP_AGENT_REWIND_PREFIX) is preceded by a rewind {"to_seq":N}: the
 * context goes on from seq N, and the events between it and the rewind
 * are a superseded branch, kept in the log.  The user_msg keeps the
 * member, as the message's queued copy in the store has it.
 */

static ngx_int_t
ngx_http_agent_fsm_rewind_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *fields)
{
    u_char     *p, *last, buf[NGX_INT64_LEN + sizeof("{\"to_seq\":}")];
    ngx_str_t   rewind;

    if (fields->len <= sizeof(NGX_HTTP_AGENT_REWIND_PREFIX) - 1
        || ngx_strncmp(fields->data, NGX_HTTP_AGENT_REWIND_PREFIX,
                       sizeof(NGX_HTTP_AGENT_REWIND_PREFIX) - 1)
           != 0)
    {
        return NGX_OK;
    }

    p = fields->data + sizeof(NGX_HTTP_AGENT_REWIND_PREFIX) - 1;
    last = fields->data + fields->len;

    for (rewind.data = p; p < last && *p >= '0' && *p <= '9'; p++) {
        /* void */
    }

    if (p == rewind.data || (size_t) (p - rewind.data) > NGX_INT64_LEN
        || p == last || *p != ',')
    {
        return NGX_OK;
    }

    rewind.len = ngx_sprintf(buf, "{\"to_seq\":%*s}", p - rewind.data,
                             rewind.data)
                 - buf;
    rewind.data = buf;

    if (ngx_http_agent_log_add_locked(z, conv, NGX_HTTP_AGENT_EV_REWIND,
                                      &rewind)
        == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * At rest: the first message that waited for its turn starts it, in this
 * worker.  Without room for it, the expiry timer tries again.
 */

static void
ngx_http_agent_fsm_next_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_fsm_t *fsm)
{
    ngx_str_t                 fields;
    ngx_http_agent_fsm_t      start;
    ngx_http_agent_queued_t  *m;

    if (conv->state != NGX_HTTP_AGENT_IDLE || conv->lease
        || conv->nqueued == 0)
    {
        return;
    }

    m = ngx_queue_data(ngx_queue_head(&conv->queued),
                       ngx_http_agent_queued_t, queue);

    fields.data = m->data;
    fields.len = m->len;

    start.fields = &fields;
    start.hash = m->hash;

    if (ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_MESSAGE, &start)
        != NGX_OK)
    {
        z->sh->stalled = 1;
        return;
    }

    ngx_http_agent_fsm_queue_free_locked(z, conv, m);

    fsm->next = 1;
    fsm->next_turn = start.turn;
    fsm->next_seq = start.seq;
}


/*
 * The real transitions only: a state_changed live event is emitted when
 * the state changes, never for a transition to the same state.
 */

static ngx_int_t
ngx_http_agent_fsm_state_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_state_e state)
{
    u_char                   buf[128];
    ngx_str_t                fields;
    ngx_http_agent_state_e   from;

    if (conv->state == state) {
        return NGX_DECLINED;
    }

    from = conv->state;
    conv->state = state;

    fields.data = buf;
    fields.len = ngx_sprintf(buf, "{\"from\":\"%V\",\"to\":\"%V\"}",
                             &ngx_http_agent_state_names[from],
                             &ngx_http_agent_state_names[state])
                 - buf;

    /* the transition stands even if its live event finds no room */
    (void) ngx_http_agent_log_add_locked(z, conv,
                                           NGX_HTTP_AGENT_EV_STATE_CHANGED,
                                           &fields);
    return NGX_OK;
}


/*
 * The worker that runs the conversation's turn, 0 for none: conversations
 * with a lease are queued, so that a dead holder is found without a walk
 * of every conversation.
 */

static void
ngx_http_agent_fsm_lease_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_pid_t pid)
{
    /* the reply so far was the holder's model call: it ends with it */

    if (conv->lease != pid) {
        ngx_http_agent_partial_free_locked(z, conv);
    }

    if (conv->lease && pid == 0) {
        ngx_queue_remove(&conv->leased);

    } else if (conv->lease == 0 && pid) {
        ngx_queue_insert_tail(&z->sh->leased, &conv->leased);
    }

    conv->lease = pid;
}


/*
 * The call resolves to an error the model can recover from: a resolution
 * marked expired (or cancelled), and its tool_result.  A question of a
 * running call resolves alone: the call answers the server, and its
 * result comes from the server.  The fields are built on the stack: a
 * round that expires nothing allocates nothing.
 */

ngx_int_t
ngx_http_agent_fsm_settle_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_pending_t *p,
    ngx_uint_t how, char *reason)
{
    u_char      buf[1024], *b;
    char       *source;
    ngx_int_t   rc;
    ngx_str_t   fields, id, name;
    ngx_uint_t  in_call;

    b = ngx_cpymem(buf, "{\"tool_call_id\":\"",
                   sizeof("{\"tool_call_id\":\"") - 1);
    b = (u_char *) ngx_escape_json(b, p->id, p->id_len);
    b = ngx_cpymem(b, "\",\"name\":\"", sizeof("\",\"name\":\"") - 1);
    b = (u_char *) ngx_escape_json(b, p->name, p->name_len);

    in_call = ngx_http_agent_pending_in_call(p);

    switch (how) {

    case NGX_HTTP_AGENT_SETTLE_EXPIRED:
        source = "\"expired\":true,\"source\":\"deadline\"";
        break;

    case NGX_HTTP_AGENT_SETTLE_LOST:
        source = "\"cancelled\":true,\"source\":\"takeover\"";
        break;

    case NGX_HTTP_AGENT_SETTLE_SERVER:
        source = "\"cancelled\":true,\"source\":\"server\"";
        break;

    default:
        source = "\"cancelled\":true,\"source\":\"cancel\"";
    }

    b = ngx_sprintf(b, "\",\"kind\":\"%V\",%s%s}",
                    &ngx_http_agent_pending_kinds[p->kind], source,
                    in_call ? ",\"during_call\":true" : "");

    fields.data = buf;
    fields.len = b - buf;

    if (ngx_http_agent_log_add_locked(z, conv,
                                        NGX_HTTP_AGENT_EV_RESOLUTION,
                                        &fields)
        == NULL)
    {
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "agent call \"%*s\" of \"%*s\" settled: %s",
                  p->id_len, p->id, conv->id_len, conv->id, reason);

    if (in_call) {
        ngx_http_agent_fsm_pending_remove_locked(z, conv, p);
        return NGX_OK;
    }

    id.data = p->id;
    id.len = p->id_len;
    name.data = p->name;
    name.len = p->name_len;

    rc = ngx_http_agent_fsm_error_result_locked(z, conv, &id, &name, reason);

    ngx_http_agent_fsm_pending_remove_locked(z, conv, p);

    return rc;
}


/* the tool_result that ends a call with an error */

ngx_int_t
ngx_http_agent_fsm_error_result_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *id, ngx_str_t *name, char *error)
{
    u_char                  *b;
    size_t                   len;
    ngx_str_t                fields;
    ngx_http_agent_event_t  *ev;

    len = sizeof("{\"tool_call_id\":\"\",\"name\":\"\",\"ok\":false,"
                 "\"error\":\"\"}") - 1
          + id->len + ngx_escape_json(NULL, id->data, id->len)
          + name->len + ngx_escape_json(NULL, name->data, name->len)
          + ngx_strlen(error);

    fields.data = ngx_alloc(len, ngx_cycle->log);
    if (fields.data == NULL) {
        return NGX_ERROR;
    }

    b = ngx_cpymem(fields.data, "{\"tool_call_id\":\"",
                   sizeof("{\"tool_call_id\":\"") - 1);
    b = (u_char *) ngx_escape_json(b, id->data, id->len);
    b = ngx_cpymem(b, "\",\"name\":\"", sizeof("\",\"name\":\"") - 1);
    b = (u_char *) ngx_escape_json(b, name->data, name->len);
    b = ngx_sprintf(b, "\",\"ok\":false,\"error\":\"%s\"}", error);

    fields.len = b - fields.data;

    ev = ngx_http_agent_log_add_locked(z, conv,
                                         NGX_HTTP_AGENT_EV_TOOL_RESULT,
                                         &fields);

    ngx_free(fields.data);

    if (ev == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * Under the lock: every call the turn's assistant messages made gets
 * exactly one result.  A call left without one (its result could not be
 * recorded, or the turn ended under it) is given an error result here,
 * before the turn's terminal event, so that the log stays paired and the
 * next model request is one a provider takes.  Its waiting entry, if any,
 * goes with it.
 */

static ngx_int_t
ngx_http_agent_fsm_pair_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, char *error)
{
    ngx_int_t                  rc;
    ngx_uint_t                 i;
    ngx_pool_t                *pool;
    ngx_array_t                calls;
    ngx_queue_t               *q;
    ngx_http_agent_fsm_pair_t     *c;
    ngx_http_agent_event_t    *e;
    ngx_http_agent_pending_t  *pd;

    if (ngx_queue_empty(&conv->log)) {
        return NGX_OK;
    }

    pool = ngx_create_pool(4096, ngx_cycle->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    if (ngx_array_init(&calls, pool, 4, sizeof(ngx_http_agent_fsm_pair_t))
        != NGX_OK)
    {
        goto failed;
    }

    /* the turn's calls and results, in order */

    for (q = ngx_http_agent_log_turn_locked(conv);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type != NGX_HTTP_AGENT_EV_ASSISTANT_MSG
            && e->type != NGX_HTTP_AGENT_EV_TOOL_RESULT)
        {
            continue;
        }

        if (ngx_http_agent_fsm_pair_event(pool, e, &calls) != NGX_OK) {
            goto failed;
        }
    }

    c = calls.elts;
    rc = NGX_OK;

    for (i = 0; i < calls.nelts; i++) {
        if (c[i].paired) {
            continue;
        }

        ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                      "agent call \"%V\" of \"%*s\" had no result: %s",
                      &c[i].id, conv->id_len, conv->id, error);

        if (ngx_http_agent_fsm_error_result_locked(z, conv, &c[i].id,
                                                   &c[i].name, error)
            != NGX_OK)
        {
            rc = NGX_ERROR;
        }

        pd = ngx_http_agent_conv_pending_locked(conv, &c[i].id);
        if (pd) {
            ngx_http_agent_fsm_pending_remove_locked(z, conv, pd);
        }
    }

    ngx_destroy_pool(pool);

    return rc;

failed:

    ngx_destroy_pool(pool);

    return NGX_ERROR;
}


/* the calls an assistant_msg made, or the call a tool_result pairs */

static ngx_int_t
ngx_http_agent_fsm_pair_event(ngx_pool_t *pool, ngx_http_agent_event_t *e,
    ngx_array_t *calls)
{
    char                    err[NGX_HTTP_AGENT_JSON_ERR];
    ngx_str_t               id;
    ngx_uint_t              i;
    yajl_val                root, list, v;
    ngx_http_agent_fsm_pair_t  *c;

    static const char  *calls_path[] = { "tool_calls", NULL };
    static const char  *id_path[] = { "id", NULL };
    static const char  *name_path[] = { "name", NULL };
    static const char  *result_path[] = { "tool_call_id", NULL };

    root = ngx_http_agent_json_parse(e->data, e->len,
                                     NGX_HTTP_AGENT_JSON_LOG_DEPTH, err,
                                     sizeof(err));
    if (root == NULL) {
        return NGX_OK;
    }

    if (e->type == NGX_HTTP_AGENT_EV_TOOL_RESULT) {
        v = yajl_tree_get(root, result_path, yajl_t_string);

        if (v) {
            id.data = (u_char *) YAJL_GET_STRING(v);
            id.len = ngx_strlen(id.data);

            c = calls->elts;

            for (i = 0; i < calls->nelts; i++) {
                if (c[i].id.len == id.len
                    && ngx_memcmp(c[i].id.data, id.data, id.len) == 0)
                {
                    c[i].paired = 1;
                }
            }
        }

        ngx_http_agent_json_free(root);
        return NGX_OK;
    }

    list = yajl_tree_get(root, calls_path, yajl_t_array);

    for (i = 0; list && i < YAJL_GET_ARRAY(list)->len; i++) {
        v = yajl_tree_get(YAJL_GET_ARRAY(list)->values[i], id_path,
                          yajl_t_string);
        if (v == NULL) {
            continue;
        }

        c = ngx_array_push(calls);
        if (c == NULL) {
            ngx_http_agent_json_free(root);
            return NGX_ERROR;
        }

        c->paired = 0;

        if (ngx_http_agent_fsm_pair_copy(pool, &c->id, YAJL_GET_STRING(v))
            != NGX_OK)
        {
            ngx_http_agent_json_free(root);
            return NGX_ERROR;
        }

        v = yajl_tree_get(YAJL_GET_ARRAY(list)->values[i], name_path,
                          yajl_t_string);

        if (ngx_http_agent_fsm_pair_copy(pool, &c->name,
                                     v ? YAJL_GET_STRING(v) : "")
            != NGX_OK)
        {
            ngx_http_agent_json_free(root);
            return NGX_ERROR;
        }
    }

    ngx_http_agent_json_free(root);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_fsm_pair_copy(ngx_pool_t *pool, ngx_str_t *dst, char *src)
{
    dst->len = ngx_strlen(src);

    dst->data = ngx_pnalloc(pool, dst->len + 1);
    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, src, dst->len + 1);

    return NGX_OK;
}


ngx_http_agent_queued_t *
ngx_http_agent_fsm_queue_add_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *fields, uint32_t hash,
    ngx_uint_t front)
{
    ngx_http_agent_queued_t  *m;

    m = ngx_http_agent_zone_alloc_locked(z, conv,
                                    offsetof(ngx_http_agent_queued_t, data)
                                    + fields->len);
    if (m == NULL) {
        return NULL;
    }

    m->hash = hash;
    m->len = fields->len;
    ngx_memcpy(m->data, fields->data, fields->len);

    if (front) {
        ngx_queue_insert_head(&conv->queued, &m->queue);

    } else {
        ngx_queue_insert_tail(&conv->queued, &m->queue);
    }

    conv->nqueued++;

    return m;
}


void
ngx_http_agent_fsm_queue_free_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_queued_t *m)
{
    ngx_queue_remove(&m->queue);
    conv->nqueued--;
    ngx_slab_free_locked(z->shpool, m);
}


ngx_http_agent_pending_t *
ngx_http_agent_fsm_pending_add_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *id, ngx_str_t *name,
    ngx_uint_t executor, ngx_uint_t kind, uint64_t deadline)
{
    size_t                     size;
    ngx_uint_t                 i, slots;
    ngx_http_agent_pending_t  *p;

    if (id->len > NGX_HTTP_AGENT_CALL_ID_LEN
        || name->len > NGX_HTTP_AGENT_TOOL_NAME_LEN)
    {
        return NULL;
    }

    /* the slots double when full: a pointer to one lasts until an add */

    if (conv->npending == conv->pending_slots) {
        if (conv->pending_slots == NGX_HTTP_AGENT_PENDING) {
            return NULL;
        }

        slots = conv->pending_slots ? conv->pending_slots * 2 : 2;
        size = sizeof(ngx_http_agent_pending_t) * slots;

        p = ngx_http_agent_zone_try_alloc_locked(z, conv, size);
        if (p == NULL) {
            return NULL;
        }

        ngx_memzero(p, size);

        if (conv->pending) {
            ngx_memcpy(p, conv->pending,
                       sizeof(ngx_http_agent_pending_t) * conv->pending_slots);
            ngx_slab_free_locked(z->shpool, conv->pending);
        }

        conv->pending = p;
        conv->pending_slots = slots;
    }

    for (i = 0; i < conv->pending_slots; i++) {
        p = &conv->pending[i];

        if (p->kind) {
            continue;
        }

        ngx_memcpy(p->id, id->data, id->len);
        p->id_len = id->len;
        ngx_memcpy(p->name, name->data, name->len);
        p->name_len = name->len;
        p->executor = executor;
        p->kind = kind;
        p->deadline = deadline;
        p->grace = 0;

        if (conv->npending++ == 0) {
            ngx_queue_insert_tail(&z->sh->waiting, &conv->waiting);
        }

        return p;
    }

    return NULL;
}


/* the slots go with the last call that waits: p is not to be used after */

void
ngx_http_agent_fsm_pending_remove_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_pending_t *p)
{
    p->kind = 0;

    if (--conv->npending == 0) {
        ngx_queue_remove(&conv->waiting);
        ngx_slab_free_locked(z->shpool, conv->pending);
        conv->pending = NULL;
        conv->pending_slots = 0;
    }
}
