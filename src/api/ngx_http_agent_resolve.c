
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_trace.h"
#include "ngx_http_agent_resolve.h"
#include "ngx_http_agent_store.h"


static void ngx_http_agent_resolve_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_resolve_parse(ngx_http_request_t *r,
    ngx_str_t *body, ngx_http_agent_resolution_t *res, char **err);
static ngx_int_t ngx_http_agent_resolve_accept(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res);
static ngx_int_t ngx_http_agent_resolve_stale(ngx_http_request_t *r,
    char *err);
static ngx_int_t ngx_http_agent_resolve_check_locked(
    ngx_http_agent_conv_t *conv, ngx_http_agent_resolution_t *res,
    ngx_uint_t n, char **err);
static char *ngx_http_agent_resolve_fits(ngx_http_agent_pending_t *pend,
    ngx_http_agent_resolution_t *res);
static ngx_int_t ngx_http_agent_resolve_record_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_pending_t *p, ngx_http_agent_resolution_t *res,
    uint64_t *seq);
static ngx_int_t ngx_http_agent_resolve_result_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_resolution_t *res, ngx_str_t *name, char *error);
static ngx_int_t ngx_http_agent_resolve_args_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_str_t *id, ngx_str_t *args);


/* POST a resolution of a waiting call */

ngx_int_t
ngx_http_agent_resolve_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;
    ngx_str_t  id;

    if (ngx_http_agent_api_request(r, NGX_HTTP_POST, "POST", &id,
                                   &rc)
        != NGX_OK)
    {
        return rc;
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_agent_resolve_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_agent_resolve_body(ngx_http_request_t *r)
{
    char                         *err;
    ngx_int_t                     rc;
    ngx_str_t                     body;
    ngx_http_agent_resolution_t   res;

    ngx_memzero(&res, sizeof(ngx_http_agent_resolution_t));
    err = NULL;

    if (ngx_http_agent_api_conversation_id(r, &res.conv) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rc = ngx_http_agent_api_tool_call_id(r, &res.call);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_tool_call",
                                         "the tool call id is missing or "
                                         "invalid"));
        return;
    }

    rc = ngx_http_agent_api_approver(r, &res.approver);

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r, ngx_http_agent_api_anonymous(r));
        return;
    }

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rc = ngx_http_agent_json_body(r, &body);

    if (rc == NGX_OK) {
        rc = ngx_http_agent_resolve_parse(r, &body, &res, &err);

    } else if (rc == NGX_DECLINED) {
        err = "the request has no body";

    } else if (rc == NGX_ABORT) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r,
                                         NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                         "too_large",
                                         "the resolution is larger than "
                                         "client_body_buffer_size"));
        return;
    }

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (err) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_resolution", err));
        return;
    }

    ngx_http_finalize_request(r, ngx_http_agent_resolve_accept(r, &res));
}


/*
 * {"result": ANY} or {"decision": "approve"|"reject", "reason": STRING,
 * "args": OBJECT}; which one the call takes is known under the lock.
 */

static ngx_int_t
ngx_http_agent_resolve_parse(ngx_http_request_t *r, ngx_str_t *body,
    ngx_http_agent_resolution_t *res, char **err)
{
    char         errbuf[NGX_HTTP_AGENT_JSON_ERR];
    yajl_gen     g;
    ngx_int_t    rc;
    ngx_str_t    s;
    yajl_val     root, v;

    root = ngx_http_agent_json_parse(body->data, body->len,
                                     NGX_HTTP_AGENT_JSON_DEPTH, errbuf,
                                     sizeof(errbuf));

    if (root == NULL) {
        *err = ngx_http_agent_json_reason(r->pool, "the body ", errbuf);
        return *err ? NGX_OK : NGX_ERROR;
    }

    if (!YAJL_IS_OBJECT(root)) {
        *err = "the body is not a JSON object";
        goto done;
    }

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        rc = NGX_ERROR;
        goto failed;
    }

    v = ngx_http_agent_provider_get(root, "result");

    if (v != NULL) {
        if (ngx_http_agent_provider_text(g, v, &s) != NGX_OK
            || (res->result.data = ngx_pstrdup(r->pool, &s)) == NULL)
        {
            rc = NGX_ERROR;
            goto failed;
        }

        res->result.len = s.len;
        res->has_result = 1;
    }

    v = ngx_http_agent_provider_get(root, "decision");

    if (v != NULL) {
        if (ngx_http_agent_provider_string(v, &s) != NGX_OK
            || !((s.len == 7 && ngx_strncmp(s.data, "approve", 7) == 0)
                 || (s.len == 6 && ngx_strncmp(s.data, "reject", 6) == 0)))
        {
            *err = "\"decision\" must be \"approve\" or \"reject\"";
            goto done;
        }

        res->approve = (s.len == 7);
        ngx_str_set(&res->decision, "reject");

        if (res->approve) {
            ngx_str_set(&res->decision, "approve");
        }
    }

    v = ngx_http_agent_provider_get(root, "reason");

    if (v != NULL) {
        if (ngx_http_agent_provider_string(v, &s) != NGX_OK
            || (res->reason.data = ngx_pstrdup(r->pool, &s)) == NULL)
        {
            *err = "\"reason\" must be a string";
            goto done;
        }

        res->reason.len = s.len;
    }

    v = ngx_http_agent_provider_get(root, "args");

    if (v != NULL) {
        if (!YAJL_IS_OBJECT(v)) {
            *err = "\"args\" must be a JSON object";
            goto done;
        }

        if (ngx_http_agent_provider_text(g, v, &s) != NGX_OK
            || (res->args.data = ngx_pstrdup(r->pool, &s)) == NULL)
        {
            rc = NGX_ERROR;
            goto failed;
        }

        res->args.len = s.len;
    }

done:

    rc = NGX_OK;

failed:

    if (root) {
        ngx_http_agent_json_free(root);
    }

    return rc;
}


/* the resolution applied and answered, once it is durable */

static ngx_int_t
ngx_http_agent_resolve_accept(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res)
{
    u_char     *p;
    char       *err;
    uint64_t    seq, first;
    ngx_int_t   rc;
    ngx_str_t   json;

    switch (ngx_http_agent_resolve_apply(r, res, 1, &first, &seq, &err,
                                         &rc))
    {

    case NGX_OK:
        break;

    case NGX_DECLINED:
        return ngx_http_agent_resolve_stale(r, err);

    default:
        return rc;
    }

    p = ngx_pnalloc(r->pool, res->conv.len + res->call.len + 96);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.data = p;
    json.len = ngx_sprintf(p, "{\"conversation\":\"%V\",\"tool_call_id\":"
                           "\"%V\",\"seq\":%uL}",
                           &res->conv, &res->call, seq)
               - p;

    return ngx_http_agent_store_ack(r, &res->conv, seq, NGX_HTTP_OK, &json);
}


/* NULL: the call does not wait; else what it waits for */

static ngx_int_t
ngx_http_agent_resolve_stale(ngx_http_request_t *r, char *err)
{
    if (err == NULL) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT, "stale",
                                         "the call is not waiting: "
                                         "unknown, resolved, expired or "
                                         "still running");
    }

    return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                     "invalid_resolution", err);
}


/*
 * Under the zone lock, for one hold of it: each call must be waiting, in
 * this conversation, for what its resolution gives; a batch is taken
 * whole or not at all, so that a bad answer in it changes nothing.  All
 * are recorded; when the last waiting call is settled and no turn holds
 * the lease, this worker takes it and the turn goes on, from a request
 * of its own.  NGX_DECLINED, nothing changed: no call waits for them, a
 * call that must wait does not (res[i].stale), or one waits for
 * something else (*err says what); NGX_DONE: *rc is the handler's
 * answer.
 */

ngx_int_t
ngx_http_agent_resolve_apply(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res, ngx_uint_t n, uint64_t *first,
    uint64_t *last, char **err, ngx_int_t *rc)
{
    uint64_t                     seq;
    ngx_pid_t                    lease;
    ngx_pid_t                    pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_uint_t                   i, turn, run, approved, in_call, failed;
    ngx_uint_t                   npids;
    ngx_http_agent_fsm_t         fsm;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_pending_t    *pend;
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    conv = ngx_http_agent_api_conv_lock(r, z, &res->conv, rc);
    if (conv == NULL) {
        return NGX_DONE;
    }

    *err = NULL;

    if (ngx_http_agent_resolve_check_locked(conv, res, n, err) != NGX_OK) {
        ngx_http_agent_zone_unlock(z);
        return NGX_DECLINED;
    }

    *first = 0;
    *last = 0;
    run = 0;
    failed = 0;
    npids = 0;

    for (i = 0; i < n; i++) {
        if (!res[i].taken) {
            continue;
        }

        /* looked up again: a suspension recorded may move the calls */

        pend = ngx_http_agent_conv_pending_locked(conv, &res[i].call);

        if (pend == NULL) {
            res[i].taken = 0;
            continue;
        }

        in_call = ngx_http_agent_pending_in_call(pend);

        /* an approved server call runs now, whatever else still waits */

        approved = (pend->kind == NGX_HTTP_AGENT_PENDING_APPROVAL
                    && res[i].approve
                    && pend->executor == NGX_HTTP_AGENT_EXECUTOR_SERVER);

        if (ngx_http_agent_resolve_record_locked(r, z, conv, pend, &res[i],
                                                 &seq)
            != NGX_OK)
        {
            /* the zone is full: those recorded before stand */
            res[i].taken = 0;
            failed = 1;
            break;
        }

        res[i].in_call = in_call;

        if (*first == 0) {
            *first = seq;
        }

        *last = seq;

        /*
         * the turn goes on in the worker that holds it, or here if none
         * does and it can: no call waits any more, or an approved one
         * runs
         */

        fsm.fields = NULL;

        (void) ngx_http_agent_fsm_locked(z, conv,
                                         approved ? NGX_HTTP_AGENT_FSM_RUN
                                                  : NGX_HTTP_AGENT_FSM_SETTLED,
                                         &fsm);

        run |= fsm.run;

        if (fsm.npids) {
            npids = fsm.npids;
            ngx_memcpy(pids, fsm.pids, npids * sizeof(ngx_pid_t));
        }
    }

    turn = conv->turn;
    lease = conv->lease;

    ngx_http_agent_zone_unlock(z);

    ngx_http_agent_wake(&res->conv, pids, npids);

    /* the worker running a call answers its server */

    for (i = 0; i < n; i++) {
        if (!res[i].taken || !res[i].in_call) {
            continue;
        }

        if (lease == ngx_pid) {
            ngx_http_agent_turn_cancel(&res->conv);

        } else if (lease) {
            ngx_http_agent_wake(&res->conv, &lease, 1);
        }
    }

    if (run
        && ngx_http_agent_turn_start(r, alcf->agent, z, &res->conv, turn,
                                     NGX_HTTP_AGENT_TURN_RESUME)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "agent could not resume the turn of \"%V\"",
                      &res->conv);
    }

    if (failed) {
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                        "zone_full",
                                        "the resolution could not be "
                                        "recorded");
        return NGX_DONE;
    }

    return *first ? NGX_OK : NGX_DECLINED;
}


/*
 * Which resolutions of the batch are taken (res[i].taken), all checked
 * before any is recorded.  NGX_DECLINED: none is, or the batch is
 * refused: a call that must wait does not (its res[i].stale set), or
 * one waits for something else (*err says what).
 */

static ngx_int_t
ngx_http_agent_resolve_check_locked(ngx_http_agent_conv_t *conv,
    ngx_http_agent_resolution_t *res, ngx_uint_t n, char **err)
{
    char                      *e;
    uint64_t                   now;
    ngx_uint_t                 i, j, taken;
    ngx_time_t                *tp;
    ngx_http_agent_pending_t  *pend;

    tp = ngx_timeofday();
    now = (uint64_t) tp->sec * 1000 + tp->msec;
    taken = 0;

    for (i = 0; i < n; i++) {
        res[i].taken = 0;
        res[i].stale = 0;

        pend = ngx_http_agent_conv_pending_locked(conv, &res[i].call);

        /*
         * past its deadline a call is expired, whether or not a timer has
         * settled it yet: the expiry, not this answer, ends it; a call
         * answered earlier in the batch is answered
         */

        if (pend && now >= pend->deadline) {
            pend = NULL;
        }

        for (j = 0; pend && j < i; j++) {
            if (res[j].taken && res[j].call.len == res[i].call.len
                && ngx_strncmp(res[j].call.data, res[i].call.data,
                               res[i].call.len)
                   == 0)
            {
                pend = NULL;
            }
        }

        if (pend == NULL) {
            if (res[i].history) {
                continue;
            }

            res[i].stale = 1;
            return NGX_DECLINED;
        }

        e = ngx_http_agent_resolve_fits(pend, &res[i]);

        if (e) {
            if (res[i].loose) {
                continue;
            }

            *err = e;
            return NGX_DECLINED;
        }

        res[i].taken = 1;
        taken++;
    }

    return taken ? NGX_OK : NGX_DECLINED;
}


/* NULL: the resolution gives what the call waits for, else what that is */

static char *
ngx_http_agent_resolve_fits(ngx_http_agent_pending_t *pend,
    ngx_http_agent_resolution_t *res)
{
    if (ngx_http_agent_pending_in_call(pend)) {

        /* a form's answer (accept) or a "reject" (decline) */

        if (res->has_result
            ? res->result.data[0] != '{'
            : (res->decision.len == 0 || res->approve))
        {
            return "the call waits for an answer to its server's question: "
                   "send \"result\" as a JSON object, or \"decision\": "
                   "\"reject\"";
        }

        return NULL;
    }

    if (pend->kind == NGX_HTTP_AGENT_PENDING_APPROVAL) {
        return res->decision.len ? NULL
                                 : "the call waits for approval: send "
                                   "\"decision\"";
    }

    return res->has_result ? NULL
                           : "the call waits for its result: send "
                             "\"result\"";
}


/*
 * The resolution event, then what it settles: a result (an answer, a
 * client's result, a denial), a second suspension (an approved client
 * call now waits for the browser), or nothing yet (an approved server
 * call runs when the turn goes on).
 */

static ngx_int_t
ngx_http_agent_resolve_record_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_pending_t *p, ngx_http_agent_resolution_t *res,
    uint64_t *seq)
{
    u_char                  *e;
    yajl_gen                 g;
    uint64_t                 deadline;
    ngx_str_t                fields, name, args, source;
    ngx_uint_t               failed, kind, executor, in_call;
    ngx_http_agent_tool_t   *tool;
    ngx_http_agent_event_t  *ev;
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    name.data = ngx_pnalloc(r->pool, p->name_len);
    if (name.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(name.data, p->name, p->name_len);
    name.len = p->name_len;

    kind = p->kind;
    executor = p->executor;
    in_call = ngx_http_agent_pending_in_call(p);

    if (kind == NGX_HTTP_AGENT_PENDING_CLIENT_EXEC) {
        ngx_str_set(&source, "client");

    } else {
        ngx_str_set(&source, "human");
    }

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "tool_call_id");
    failed |= ngx_http_agent_json_str(g, &res->call);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &name);
    failed |= ngx_http_agent_json_key(g, "kind");
    failed |= ngx_http_agent_json_str(g, &ngx_http_agent_pending_kinds[kind]);

    if (kind == NGX_HTTP_AGENT_PENDING_APPROVAL
        || (in_call && !res->has_result))
    {
        failed |= ngx_http_agent_json_key(g, "decision");
        failed |= ngx_http_agent_json_str(g, &res->decision);

        if (res->reason.data) {
            failed |= ngx_http_agent_json_key(g, "reason");
            failed |= ngx_http_agent_json_str(g, &res->reason);
        }

        if (res->approve && res->args.data) {
            failed |= ngx_http_agent_json_key(g, "args");
            failed |= ngx_http_agent_json_verbatim(g, &res->args);
        }

    } else {
        failed |= ngx_http_agent_json_key(g, "result");
        failed |= ngx_http_agent_json_verbatim(g, &res->result);
    }

    failed |= ngx_http_agent_json_key(g, "source");
    failed |= ngx_http_agent_json_str(g, &source);

    if (res->source_id.len) {
        failed |= ngx_http_agent_json_key(g, "source_id");
        failed |= ngx_http_agent_json_str(g, &res->source_id);
    }

    if (res->approver) {
        failed |= ngx_http_agent_json_key(g, "approver");
        failed |= ngx_http_agent_json_str(g, res->approver);
    }

    if (in_call) {
        failed |= ngx_http_agent_json_key(g, "during_call");
        failed |= yajl_gen_bool(g, 1);
    }

    failed |= ngx_http_agent_trace_resolver_json(r, g);

    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        return NGX_ERROR;
    }

    ev = ngx_http_agent_log_add_locked(z, conv,
                                         NGX_HTTP_AGENT_EV_RESOLUTION,
                                         &fields);
    if (ev == NULL) {
        return NGX_ERROR;
    }

    *seq = ev->seq;

    ngx_http_agent_fsm_pending_remove_locked(z, conv, p);

    if (in_call) {
        /* the call's worker answers the server; the call goes on */
        return NGX_OK;
    }

    if (kind != NGX_HTTP_AGENT_PENDING_APPROVAL) {
        return ngx_http_agent_resolve_result_locked(r, z, conv, res, &name,
                                                    NULL);
    }

    if (!res->approve) {
        e = ngx_pnalloc(r->pool, res->reason.len + 32);
        if (e == NULL) {
            return NGX_ERROR;
        }

        if (res->reason.len) {
            ngx_sprintf(e, "denied by approver: %V%Z", &res->reason);

        } else {
            ngx_sprintf(e, "denied by approver%Z");
        }

        return ngx_http_agent_resolve_result_locked(r, z, conv, res, &name,
                                                    (char *) e);
    }

    if (executor != NGX_HTTP_AGENT_EXECUTOR_CLIENT) {
        return NGX_OK;
    }

    /* approved: the client call now waits for the browser */

    tool = ngx_http_agent_tools_find(alcf->agent, &name);

    if (tool == NULL) {
        return ngx_http_agent_resolve_result_locked(r, z, conv, res, &name,
                                                    "the tool is no longer "
                                                    "declared");
    }

    args = res->args;

    if (args.data == NULL
        && ngx_http_agent_resolve_args_locked(r, conv, &res->call, &args)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ngx_http_agent_tools_suspension(r->pool, alcf->agent, tool,
                                        &res->call, &args,
                                        NGX_HTTP_AGENT_PENDING_CLIENT_EXEC,
                                        &deadline, &fields)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_agent_tools_suspend_locked(z, conv, tool, &res->call,
                                          NGX_HTTP_AGENT_PENDING_CLIENT_EXEC,
                                          deadline, &fields);
}


static ngx_int_t
ngx_http_agent_resolve_result_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_resolution_t *res, ngx_str_t *name, char *error)
{
    yajl_gen    g;
    ngx_str_t   fields, e;
    ngx_uint_t  failed;

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "tool_call_id");
    failed |= ngx_http_agent_json_str(g, &res->call);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, name);
    failed |= ngx_http_agent_json_key(g, "ok");
    failed |= yajl_gen_bool(g, error == NULL);

    if (error == NULL) {
        failed |= ngx_http_agent_json_key(g, "result");
        failed |= ngx_http_agent_json_verbatim(g, &res->result);

    } else {
        e.data = (u_char *) error;
        e.len = ngx_strlen(error);
        failed |= ngx_http_agent_json_key(g, "error");
        failed |= ngx_http_agent_json_str(g, &e);
    }

    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_log_add_locked(z, conv,
                                        NGX_HTTP_AGENT_EV_TOOL_RESULT,
                                        &fields)
        == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* the arguments of the call as the model gave them, from its tool_call */

static ngx_int_t
ngx_http_agent_resolve_args_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_str_t *id, ngx_str_t *args)
{
    char                     err[NGX_HTTP_AGENT_JSON_ERR];
    u_char                  *p;
    ngx_str_t                s;
    ngx_queue_t             *q;
    yajl_val                 v;
    ngx_http_agent_event_t  *e;

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->type != NGX_HTTP_AGENT_EV_TOOL_CALL) {
            continue;
        }

        p = ngx_pnalloc(r->pool, e->len + 1);
        if (p == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(p, e->data, e->len);
        p[e->len] = '\0';

        v = ngx_http_agent_json_parse(p, e->len,
                                      NGX_HTTP_AGENT_JSON_LOG_DEPTH, err,
                                      sizeof(err));
        if (v == NULL) {
            continue;
        }

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(v, "tool_call_id"), &s) == NGX_OK
            && s.len == id->len && ngx_strncmp(s.data, id->data, s.len) == 0
            && ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(v, "arguments"), &s) == NGX_OK)
        {
            args->data = ngx_pstrdup(r->pool, &s);
            args->len = s.len;
            ngx_http_agent_json_free(v);

            return args->data ? NGX_OK : NGX_ERROR;
        }

        ngx_http_agent_json_free(v);
    }

    ngx_str_set(args, "{}");

    return NGX_OK;
}
