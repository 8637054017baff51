
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_turn.h"


/*
 * A turn's steps in the worker's event loop: each is a posted event, and
 * a pass of the loop that has run its time leaves the rest to the passes
 * after it.
 */


static void ngx_http_agent_turn_post_event(ngx_event_t *ev);
static void ngx_http_agent_turn_runner(ngx_event_t *ev);
static void ngx_http_agent_turn_later(ngx_event_t *ev);
static ngx_uint_t ngx_http_agent_turn_pass_spent(void);


/* a pass of the event loop that has run so long leaves steps to the next */
#define NGX_HTTP_AGENT_TURN_PASS        1000    /* us */

/* the timer that holds a worker shutting down while steps wait, ms */
#define NGX_HTTP_AGENT_TURN_STEPS_HOLD  1000


/*
 * The steps left to the event loop's next passes, in the order they were
 * posted, and the event that runs them (ngx_http_agent_turn_post()).
 */
static ngx_queue_t  ngx_http_agent_turn_steps;
static ngx_event_t  ngx_http_agent_turn_stepper;


/*
 * A turn goes on in handler from a posted event.  The event loop runs
 * every posted event in the pass that posted it, and a pass that comes
 * to many turns at once (their model calls answered together, each with
 * its tool calls) would keep a request that came meanwhile, or a batch
 * the store has written, waiting for all of them.  So once the pass has
 * run NGX_HTTP_AGENT_TURN_PASS us, a step is left to the passes after
 * it: a queue in the order the steps were posted, run by one event on
 * ngx_posted_next_events, which also stops once the pass has run that
 * long (after one step at least, so that every pass makes progress).  A
 * step posted while others wait goes behind them.
 *
 * The step is still a posted event, on the queue of its own:
 * ngx_delete_posted_event() takes it off as it would any other.  While
 * steps wait, the event that runs them has a timer too: a worker shutting
 * down gracefully exits once no timer is left, and posted events are
 * not timers.
 */

void
ngx_http_agent_turn_post(ngx_http_agent_turn_t *t,
    ngx_event_handler_pt handler)
{
    t->event.handler = handler;

    ngx_http_agent_turn_post_event(&t->event);
}


static void
ngx_http_agent_turn_post_event(ngx_event_t *ev)
{
    ngx_http_agent_turn_t  *t;

    t = ev->data;

    if (ngx_http_agent_turn_steps.next == NULL) {
        ngx_queue_init(&ngx_http_agent_turn_steps);
        ngx_http_agent_turn_stepper.handler = ngx_http_agent_turn_later;
        ngx_http_agent_turn_stepper.log = ngx_cycle->log;

        /*
         * not NULL: a timer's debug line reads its event's data as a
         * connection (ngx_event_ident), and a worker that logs at debug
         * level would crash on it
         */
        ngx_http_agent_turn_stepper.data = (void *) ngx_cycle;
    }

    if (ngx_queue_empty(&ngx_http_agent_turn_steps)
        && !ngx_http_agent_turn_pass_spent())
    {
        ngx_post_event(ev, &ngx_posted_events);
        return;
    }

    if (!ev->posted) {
        ngx_http_agent_metrics_step_later(t->zone);
    }

    ngx_post_event(ev, &ngx_http_agent_turn_steps);
    ngx_post_event(&ngx_http_agent_turn_stepper, &ngx_posted_next_events);

    if (!ngx_http_agent_turn_stepper.timer_set) {
        ngx_add_timer(&ngx_http_agent_turn_stepper,
                      NGX_HTTP_AGENT_TURN_STEPS_HOLD);
    }
}


/*
 * The turn's subrequests, as ngx_http_run_posted_requests() runs them,
 * each to where it waits for a backend.  A batch of tool calls whose
 * locations answer at once (64 of them, each with its result logged)
 * would run to its end in this pass; once the pass has run its time
 * (after one subrequest at least), the rest are left to the passes after
 * it, as a step.  A subrequest that ended the turn has freed the
 * connection, which may then be another's: its number tells.
 */

void
ngx_http_agent_turn_run_posted(ngx_http_agent_turn_t *t)
{
    ngx_uint_t                  n;
    ngx_atomic_uint_t           number;
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_posted_request_t  *pr;

    c = t->request->connection;
    number = c->number;

    for (n = 0; /* void */; n++) {

        if (c->destroyed || c->number != number) {
            return;
        }

        r = c->data;
        pr = r->main->posted_requests;

        if (pr == NULL) {
            return;
        }

        if (n && ngx_http_agent_turn_pass_spent()) {
            if (!t->runner.posted) {
                t->runner.handler = ngx_http_agent_turn_runner;
                t->runner.data = t;
                t->runner.log = &t->log;

                ngx_http_agent_turn_post_event(&t->runner);
            }

            return;
        }

        r->main->posted_requests = pr->next;

        r = pr->request;

        ngx_http_set_log_request(c->log, r);

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                       "agent turn posted request: \"%V?%V\"",
                       &r->uri, &r->args);

        r->write_event_handler(r);
    }
}


static void
ngx_http_agent_turn_runner(ngx_event_t *ev)
{
    ngx_http_agent_turn_run_posted(ev->data);
}


static void
ngx_http_agent_turn_later(ngx_event_t *ev)
{
    ngx_uint_t    n;
    ngx_queue_t  *q;
    ngx_event_t  *step;

    for (n = 0; !ngx_queue_empty(&ngx_http_agent_turn_steps); n++) {

        if (n && ngx_http_agent_turn_pass_spent()) {
            ngx_post_event(ev, &ngx_posted_next_events);

            if (!ev->timer_set) {
                ngx_add_timer(ev, NGX_HTTP_AGENT_TURN_STEPS_HOLD);
            }

            return;
        }

        q = ngx_queue_head(&ngx_http_agent_turn_steps);
        step = ngx_queue_data(q, ngx_event_t, queue);

        ngx_delete_posted_event(step);
        step->handler(step);
    }

    if (ev->timer_set) {
        ngx_del_timer(ev);
    }
}


/*
 * The pass began when epoll_wait() returned, which is when nginx took
 * ngx_current_msec (with timer_resolution, it takes it only on its
 * timer: no step is left then).
 */

static ngx_uint_t
ngx_http_agent_turn_pass_spent(void)
{
#if (NGX_HAVE_CLOCK_MONOTONIC)
    uint64_t          now;
    ngx_msec_int_t    ms;
    ngx_core_conf_t  *ccf;

    ccf = (ngx_core_conf_t *) ngx_get_conf(ngx_cycle->conf_ctx,
                                           ngx_core_module);

    if (ccf->timer_resolution) {
        return 0;
    }

    /* from the start of the millisecond the pass began in */

    now = ngx_http_agent_metrics_usec();
    ms = (ngx_msec_int_t) ((ngx_msec_t) (now / 1000) - ngx_current_msec);

    if (ms < 0) {
        return 0;
    }

    return (uint64_t) ms * 1000 + now % 1000 >= NGX_HTTP_AGENT_TURN_PASS;
#else
    return 0;
#endif
}
