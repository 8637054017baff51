
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * A model call as the metrics count it (the zone's counters, by agent and
 * model) and as the audit records it (a row of model_calls, with a
 * store): its start, its first chunk, and how it ended.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"
#include "ngx_http_agent_store_audit.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_turn_metrics.h"


static void ngx_http_agent_turn_call_retry(ngx_http_agent_turn_t *t);
static void ngx_http_agent_turn_call_count(ngx_http_agent_turn_t *t,
    ngx_uint_t status, ngx_msec_t duration, ngx_int_t first);
static void ngx_http_agent_turn_call_row(ngx_http_agent_turn_t *t,
    ngx_http_agent_audit_row_t *row);
static void ngx_http_agent_turn_mark_handler(void *data);


static ngx_str_t  ngx_http_agent_call_statuses[] = {
    ngx_string("ok"),
    ngx_string("retry"),
    ngx_string("error"),
    ngx_string("cancelled")
};


/*
 * A call's start is later than the conversation's last one's, if only by
 * a millisecond: the audit finds a call's row by its start and worker,
 * and numbers the calls in that order.  nginx's time is the event loop's
 * (to timer_resolution): a tool answered at once, or a turn that ends
 * and another that starts in the same millisecond, start calls at the
 * same time.
 */

void
ngx_http_agent_turn_call_start(ngx_http_agent_turn_t *t)
{
    uint64_t                     started;
    ngx_time_t                  *tp;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_audit_row_t   row;

    tp = ngx_timeofday();
    started = (uint64_t) tp->sec * 1000 + tp->msec;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv) {
        if (started <= conv->call_started) {
            started = conv->call_started + 1;
        }

        conv->call_started = started;
        t->call_epoch = conv->epoch;
    }

    ngx_http_agent_zone_unlock(t->zone);

    t->call_start = ngx_current_msec;
    t->call_started = started;
    t->first_chunk = 0;

    ngx_http_agent_turn_call_row(t, &row);

    (void) ngx_http_agent_store_audit(&row);
}


void
ngx_http_agent_turn_first_chunk(ngx_http_agent_turn_t *t)
{
    if (t->first_chunk == 0 && t->call_started) {
        t->first_chunk = ngx_current_msec;

        /* 0 means none yet */
        if (t->first_chunk == 0) {
            t->first_chunk = 1;
        }
    }
}


void
ngx_http_agent_turn_call_end(ngx_http_agent_turn_t *t,
    ngx_http_agent_call_e outcome, ngx_str_t *reason)
{
    ngx_int_t                    first;
    ngx_uint_t                   status;
    ngx_msec_t                   duration;
    ngx_http_agent_reply_t      *reply;
    ngx_http_agent_audit_row_t   row;

    if (t->call_started == 0) {
        return;
    }

    switch (outcome) {

    case NGX_HTTP_AGENT_CALL_OK:
        status = NGX_HTTP_AGENT_MODEL_OK;
        break;

    case NGX_HTTP_AGENT_CALL_RETRY:
        status = (t->attempt < t->agent->retry_attempts)
                 ? NGX_HTTP_AGENT_MODEL_RETRY : NGX_HTTP_AGENT_MODEL_ERROR;
        break;

    case NGX_HTTP_AGENT_CALL_FAILED:
        status = NGX_HTTP_AGENT_MODEL_ERROR;
        break;

    default:
        status = NGX_HTTP_AGENT_MODEL_CANCELLED;
    }

    duration = ngx_current_msec - t->call_start;
    first = t->first_chunk ? (ngx_int_t) (t->first_chunk - t->call_start)
                           : -1;

    ngx_http_agent_turn_call_count(t, status, duration, first);

    if (status == NGX_HTTP_AGENT_MODEL_RETRY) {
        ngx_http_agent_turn_call_retry(t);
    }

    ngx_http_agent_turn_call_row(t, &row);

    reply = t->reply;

    row.end = 1;
    row.status = ngx_http_agent_call_statuses[status];
    row.duration = duration;
    row.first = first;

    if (reply) {
        row.input = reply->input_tokens;
        row.output = reply->output_tokens;
        row.cached = reply->cached_tokens;
    }

    if (status != NGX_HTTP_AGENT_MODEL_OK && reason) {
        row.error = *reason;
    }

    (void) ngx_http_agent_store_audit(&row);

    t->call_started = 0;
}


/*
 * An attempt to be made again, as its call's chat span shows it: when it
 * started and ended, the provider's status and error type
 */

static void
ngx_http_agent_turn_call_retry(ngx_http_agent_turn_t *t)
{
    u_char                  c;
    size_t                  i;
    ngx_time_t             *tp;
    ngx_http_agent_retry_t *a;

    if (t->nretries >= NGX_HTTP_AGENT_RETRIES_KEPT) {
        return;
    }

    a = &t->retries[t->nretries++];

    tp = ngx_timeofday();

    a->started = t->call_started;
    a->ended = (uint64_t) tp->sec * 1000 + tp->msec;
    a->status = t->status ? t->status
                          : (t->rc >= NGX_HTTP_SPECIAL_RESPONSE
                             ? (ngx_uint_t) t->rc : 0);
    a->type_len = 0;

    if (t->reply == NULL) {
        return;
    }

    /* a type is a word: one with anything else is not kept */

    for (i = 0; i < t->reply->error_type.len; i++) {
        c = t->reply->error_type.data[i];

        if (i == NGX_HTTP_AGENT_ERROR_TYPE_MAX
            || !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                 || (c >= '0' && c <= '9') || c == '_' || c == '-'
                 || c == '.'))
        {
            return;
        }

        a->type[i] = c;
    }

    a->type_len = t->reply->error_type.len;
}


void
ngx_http_agent_turn_call_abort(ngx_http_agent_turn_t *t)
{
    ngx_http_agent_turn_call_end(t, (ngx_http_agent_call_e) -1, NULL);
}


static void
ngx_http_agent_turn_call_count(ngx_http_agent_turn_t *t, ngx_uint_t status,
    ngx_msec_t duration, ngx_int_t first)
{
    ngx_http_agent_reply_t          *reply;
    ngx_http_agent_metrics_agent_t  *a;

    a = ngx_http_agent_metrics_agent(t->zone, t->agent->name.data,
                                     t->agent->name.len);
    if (a == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(&a->calls[status], 1);

    if (status == NGX_HTTP_AGENT_MODEL_RETRY) {
        (void) ngx_atomic_fetch_add(&a->retries, 1);
    }

    ngx_http_agent_metrics_observe(&a->duration, NGX_HTTP_AGENT_HIST_MODEL,
                                   duration);

    if (first >= 0) {
        ngx_http_agent_metrics_observe(&a->first, NGX_HTTP_AGENT_HIST_FIRST,
                                       first);
    }

    reply = t->reply;

    /* a call the provider reported no usage for is not a call of none */

    if (reply == NULL
        || (reply->input_tokens == 0 && reply->output_tokens == 0))
    {
        return;
    }

    ngx_http_agent_metrics_observe(&a->tokens[NGX_HTTP_AGENT_TOKENS_INPUT],
                                   NGX_HTTP_AGENT_HIST_TOKENS,
                                   reply->input_tokens);
    ngx_http_agent_metrics_observe(&a->tokens[NGX_HTTP_AGENT_TOKENS_OUTPUT],
                                   NGX_HTTP_AGENT_HIST_TOKENS,
                                   reply->output_tokens);
    ngx_http_agent_metrics_observe(&a->tokens[NGX_HTTP_AGENT_TOKENS_CACHED],
                                   NGX_HTTP_AGENT_HIST_TOKENS,
                                   reply->cached_tokens);
}


static void
ngx_http_agent_turn_call_row(ngx_http_agent_turn_t *t,
    ngx_http_agent_audit_row_t *row)
{
    ngx_memzero(row, sizeof(ngx_http_agent_audit_row_t));

    row->conv = t->id;
    row->adapter = t->agent->provider->name;
    row->model = t->agent->model;
    row->turn = t->turn;
    row->attempt = t->attempt;
    row->started = t->call_started;
    row->worker = ngx_pid;
    row->epoch = t->call_epoch;
    row->first = -1;
}


/*
 * Which turn a request started is kept with its pool, as a cleanup that
 * does nothing: found again by its handler, as nginx finds a file's
 */

ngx_int_t
ngx_http_agent_turn_mark(ngx_http_request_t *r, ngx_str_t *id,
    ngx_uint_t turn)
{
    ngx_pool_cleanup_t          *cln;
    ngx_http_agent_turn_mark_t  *mark;

    cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_http_agent_turn_mark_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    mark = cln->data;
    mark->turn = turn;
    mark->id.len = id->len;
    mark->id.data = ngx_pstrdup(r->pool, id);

    cln->handler = ngx_http_agent_turn_mark_handler;

    return (mark->id.data == NULL) ? NGX_ERROR : NGX_OK;
}


ngx_http_agent_turn_mark_t *
ngx_http_agent_turn_started(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t  *c;

    for (c = r->pool->cleanup; c; c = c->next) {
        if (c->handler == ngx_http_agent_turn_mark_handler) {
            return c->data;
        }
    }

    return NULL;
}


static void
ngx_http_agent_turn_mark_handler(void *data)
{
    ngx_http_agent_turn_mark_t *mark = data;

    mark->turn = 0;
}
