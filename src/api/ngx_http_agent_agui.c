
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * agent_agui: an AG-UI agent endpoint.  POST takes RunAgentInput
 * ({"threadId", "runId", "messages", "tools", "context", "state",
 * "forwardedProps", "resume"}): answers to the calls that wait (resume
 * entries for interrupts, tool messages for frontend tools) resolve
 * them as agent_resolve does; else the last message, the user's, is the
 * conversation's new message, taken as agent_message takes one; else the
 * run shows the conversation as it is (the running turn from its start).
 * The "tools" are frontend tools, kept with the new message for its turn
 * (ngx_http_agent_agui_tools.c).  The answer is the run as AG-UI events
 * (ngx_http_agent_format_agui.c).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_branch.h"
#include "ngx_http_agent_resolve.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_agui.h"


#define NGX_HTTP_AGENT_AGUI_ANSWERS  16


typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     thread;
    ngx_str_t                     tools;      /* as the user_msg keeps them */
    yajl_val                      root;
    ngx_http_agent_agui_run_t    *run;
    ngx_int_t                     rc;         /* the answer sent */

    ngx_uint_t                    nanswers;
    ngx_http_agent_resolution_t   answers[NGX_HTTP_AGENT_AGUI_ANSWERS];
} ngx_http_agent_agui_input_t;


static void ngx_http_agent_agui_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_agui_input(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in);
static ngx_int_t ngx_http_agent_agui_answers(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in, char **err);
static ngx_int_t ngx_http_agent_agui_answer(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res, yajl_val payload, ngx_str_t *status);
static ngx_int_t ngx_http_agent_agui_go(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in);
static ngx_int_t ngx_http_agent_agui_resolve(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in, ngx_uint_t *state, uint64_t *last,
    uint64_t *written);
static ngx_int_t ngx_http_agent_agui_new(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in);
static ngx_int_t ngx_http_agent_agui_text(ngx_http_request_t *r, yajl_val v,
    ngx_str_t *text);
static ngx_int_t ngx_http_agent_agui_stream(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t seq);
static ngx_int_t ngx_http_agent_agui_resumed(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t from);
static ngx_int_t ngx_http_agent_agui_json(ngx_http_request_t *r, yajl_val v,
    ngx_str_t *json);
static void ngx_http_agent_agui_cleanup(void *data);


ngx_int_t
ngx_http_agent_agui_handler(ngx_http_request_t *r)
{
    ngx_int_t   rc;
    ngx_str_t  *owner;

    /* a node whose lease lapsed drops its zone first (agent_node) */
    (void) ngx_http_agent_revive_lease();

    if (!(r->method & NGX_HTTP_POST)) {
        return ngx_http_agent_json_method(r, "POST");
    }

    rc = ngx_http_agent_api_owner(r, &owner);

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_api_anonymous(r);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_agent_agui_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/* the run of a request: a pool cleanup holds it, as its tag */

ngx_http_agent_agui_run_t *
ngx_http_agent_agui_run(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t  *cln;

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_agent_agui_cleanup) {
            return cln->data;
        }
    }

    return NULL;
}


static void
ngx_http_agent_agui_cleanup(void *data)
{
    /* the run's memory is the pool's */
}


static void
ngx_http_agent_agui_body(ngx_http_request_t *r)
{
    char                         *err;
    ngx_int_t                     rc;
    ngx_http_agent_agui_input_t  *in;

    in = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_agui_input_t));
    if (in == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rc = ngx_http_agent_agui_input(r, in);

    if (rc == NGX_OK) {
        err = NULL;
        rc = ngx_http_agent_agui_answers(r, in, &err);

        if (rc == NGX_DECLINED) {
            rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                           "invalid_input", err);

        } else if (rc == NGX_OK) {
            rc = ngx_http_agent_agui_go(r, in);
        }
    }

    if (in->root) {
        ngx_http_agent_json_free(in->root);
    }

    if (rc == NGX_ABORT) {
        rc = in->rc;

    } else if (rc == NGX_ERROR) {
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_finalize_request(r, rc);
}


/*
 * The body, its threadId and runId, the conversation (agent_conversation
 * if set and not empty, else the threadId) and the run.  Not NGX_OK:
 * what the request is finalized with.
 */

static ngx_int_t
ngx_http_agent_agui_input(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in)
{
    char                        errbuf[NGX_HTTP_AGENT_JSON_ERR], *err;
    ngx_int_t                   rc;
    ngx_str_t                   body, s;
    yajl_val                    v;
    ngx_pool_cleanup_t         *cln;
    ngx_http_agent_agui_run_t  *run;
    ngx_http_agent_loc_conf_t  *alcf;

    if (ngx_http_agent_message_body_read(r, &body, &rc) != NGX_OK) {
        in->rc = rc;
        return NGX_ABORT;
    }

    in->root = ngx_http_agent_json_parse(body.data, body.len,
                                         NGX_HTTP_AGENT_JSON_DEPTH, errbuf,
                                         sizeof(errbuf));
    if (in->root == NULL) {
        err = ngx_http_agent_json_reason(r->pool, "the body ", errbuf);
        if (err == NULL) {
            return NGX_ERROR;
        }

        in->rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                           "invalid_input", err);
        return NGX_ABORT;
    }

    cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_http_agent_agui_run_t));
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_agent_agui_cleanup;
    run = cln->data;
    ngx_memzero(run, sizeof(ngx_http_agent_agui_run_t));
    in->run = run;

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(in->root, "threadId"), &in->thread)
        != NGX_OK
        || ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(in->root, "runId"), &s)
           != NGX_OK
        || s.len == 0 || s.len > 128 || in->thread.len > 128
        || ngx_http_agent_json_utf8(&s) != NGX_OK)
    {
        in->rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_input",
                                         "RunAgentInput needs a \"threadId\" "
                                         "and a \"runId\", strings of at "
                                         "most 128 bytes");
        return NGX_ABORT;
    }

    run->run.data = ngx_pstrdup(r->pool, &s);
    run->run.len = s.len;
    run->thread.data = ngx_pstrdup(r->pool, &in->thread);
    run->thread.len = in->thread.len;

    if (run->run.data == NULL || run->thread.data == NULL) {
        return NGX_ERROR;
    }

    /* the state is the application's: the run starts from it, unchanged */

    v = ngx_http_agent_provider_get(in->root, "state");

    if (v && !YAJL_IS_NULL(v)
        && ngx_http_agent_agui_json(r, v, &run->state) != NGX_OK)
    {
        return NGX_ERROR;
    }

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    ngx_str_null(&in->id);

    if (alcf->conversation
        && ngx_http_complex_value(r, alcf->conversation, &in->id) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (in->id.len == 0) {
        in->id = run->thread;
    }

    if (ngx_http_agent_api_id_check(&in->id) != NGX_OK) {
        in->rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_conversation",
                                         "the conversation id is missing "
                                         "or invalid");
        return NGX_ABORT;
    }

    in->id.data = ngx_pstrdup(r->pool, &in->id);
    if (in->id.data == NULL) {
        return NGX_ERROR;
    }

    /* the frontend tools, for the turn a new message starts */

    rc = ngx_http_agent_agui_tools(r,
                                   ngx_http_agent_provider_get(in->root,
                                                               "tools"),
                                   &in->tools, &err);

    if (rc == NGX_DECLINED) {
        in->rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                           "invalid_tools", err);
        return NGX_ABORT;
    }

    return rc;
}


/*
 * What the input answers: each resume entry (an interrupt's id is its
 * call's) and each tool message (a frontend tool's result, or for a
 * call that waits for a person, the decision or the answer).  Tool
 * messages of calls resolved long ago are history, and are passed over
 * when the call turns out not to wait.
 */

static ngx_int_t
ngx_http_agent_agui_answers(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in, char **err)
{
    ngx_int_t                     rc;
    ngx_str_t                     s, status;
    ngx_uint_t                    i;
    yajl_val                      list, m, payload;
    ngx_http_agent_resolution_t  *res;

    list = ngx_http_agent_provider_get(in->root, "resume");

    for (i = 0; YAJL_IS_ARRAY(list) && i < list->u.array.len; i++) {
        m = list->u.array.values[i];

        if (in->nanswers == NGX_HTTP_AGENT_AGUI_ANSWERS
            || ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(m, "interruptId"), &s)
               != NGX_OK
            || ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(m, "status"), &status)
               != NGX_OK)
        {
            *err = "a resume entry needs \"interruptId\" and \"status\"";
            return NGX_DECLINED;
        }

        res = &in->answers[in->nanswers++];
        res->call = s;

        payload = ngx_http_agent_provider_get(m, "payload");

        rc = ngx_http_agent_agui_answer(r, res, payload, &status);
        if (rc != NGX_OK) {
            *err = "a resume entry's payload does not fit its interrupt";
            return rc;
        }
    }

    list = ngx_http_agent_provider_get(in->root, "messages");

    for (i = 0; YAJL_IS_ARRAY(list) && i < list->u.array.len; i++) {
        m = list->u.array.values[i];

        if (!ngx_http_agent_provider_is(ngx_http_agent_provider_get(m, "role"),
                                        "tool")
            || ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(m, "toolCallId"), &s)
               != NGX_OK
            || in->nanswers == NGX_HTTP_AGENT_AGUI_ANSWERS)
        {
            continue;
        }

        res = &in->answers[in->nanswers++];
        res->call = s;
        res->history = 1;

        /* the tool message is the client's: the log keeps its id */

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(m, "id"), &s)
            == NGX_OK
            && s.len <= 128 && ngx_http_agent_api_id_check(&s) == NGX_OK)
        {
            res->source_id = s;
        }

        ngx_str_set(&status, "resolved");

        payload = ngx_http_agent_provider_get(m, "content");

        if (ngx_http_agent_agui_answer(r, res, payload, &status) != NGX_OK) {
            ngx_memzero(res, sizeof(ngx_http_agent_resolution_t));
            in->nanswers--;
        }
    }

    for (i = 0; i < in->nanswers; i++) {
        in->answers[i].conv = in->id;

        if (ngx_http_agent_api_id_check(&in->answers[i].call) != NGX_OK) {
            *err = "a tool call id is invalid";
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


/*
 * A resolution from an answer, for whichever kind the call turns out to
 * wait for: the decision of an approval ("approve"/"reject" as
 * agent_resolve takes it, or {"approved": BOOL}), the result of a
 * question or a frontend tool (a tool message's text is JSON if it
 * parses, else the string).  "cancelled" rejects.
 */

static ngx_int_t
ngx_http_agent_agui_answer(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res, yajl_val payload, ngx_str_t *status)
{
    char        errbuf[NGX_HTTP_AGENT_JSON_ERR];
    ngx_str_t   s;
    yajl_val    v, parsed;
    ngx_int_t   rc;

    parsed = NULL;

    if (YAJL_IS_STRING(payload)) {
        ngx_http_agent_provider_string(payload, &s);
        parsed = ngx_http_agent_json_parse(s.data, s.len,
                                           NGX_HTTP_AGENT_JSON_DEPTH,
                                           errbuf, sizeof(errbuf));
    }

    v = parsed ? parsed : payload;

    if (status->len == sizeof("cancelled") - 1
        && ngx_strncmp(status->data, "cancelled", status->len) == 0)
    {
        ngx_str_set(&res->decision, "reject");
        ngx_str_set(&res->reason, "cancelled by the user");
        ngx_str_set(&res->result, "null");
        res->has_result = 1;
        rc = NGX_OK;
        goto done;
    }

    rc = ngx_http_agent_agui_json(r, v ? v : payload, &res->result);
    if (rc != NGX_OK) {
        goto done;
    }

    if (payload == NULL) {
        ngx_str_set(&res->result, "null");
    }

    res->has_result = 1;

    s.len = 0;

    if (ngx_http_agent_provider_get(v, "approved")) {
        ngx_str_set(&s, "reject");

        if (YAJL_IS_TRUE(ngx_http_agent_provider_get(v, "approved"))) {
            ngx_str_set(&s, "approve");
        }

    } else {
        (void) ngx_http_agent_provider_string(
                   ngx_http_agent_provider_get(v, "decision"), &s);
    }

    /*
     * the decision is one of agent_resolve's own words: s may lie in the
     * tree of the tool message's text, which goes before the resolution
     * is recorded
     */

    if ((s.len == 7 && ngx_strncmp(s.data, "approve", 7) == 0)
        || (s.len == 6 && ngx_strncmp(s.data, "reject", 6) == 0))
    {
        res->approve = (s.len == 7);
        ngx_str_set(&res->decision, "reject");

        if (res->approve) {
            ngx_str_set(&res->decision, "approve");
        }

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(v, "reason"), &s)
            == NGX_OK)
        {
            res->reason.data = ngx_pstrdup(r->pool, &s);
            if (res->reason.data == NULL) {
                rc = NGX_ERROR;
                goto done;
            }

            res->reason.len = s.len;
        }

        v = ngx_http_agent_provider_get(v, "editedArgs") != NULL
            ? ngx_http_agent_provider_get(v, "editedArgs")
            : ngx_http_agent_provider_get(v, "args");

        if (YAJL_IS_OBJECT(v)) {
            rc = ngx_http_agent_agui_json(r, v, &res->args);
        }
    }

done:

    if (parsed) {
        ngx_http_agent_json_free(parsed);
    }

    return rc;
}


/*
 * Answers first; then a new message; else the conversation as it is.
 * The run shows what follows what its client holds already.
 */

static ngx_int_t
ngx_http_agent_agui_go(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in)
{
    uint64_t                    last, written;
    ngx_int_t                   rc;
    ngx_uint_t                  state;
    ngx_http_agent_agui_run_t  *run;

    run = in->run;
    state = NGX_HTTP_AGENT_IDLE;
    last = 0;
    written = 0;

    rc = ngx_http_agent_agui_resolve(r, in, &state, &last, &written);

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_agui_new(r, in);
    }

    if (rc == NGX_ABORT) {
        return in->rc;
    }

    if (rc != NGX_OK) {
        return rc;
    }

    /* the calls resolved: the turn goes on, or still waits for others */

    if (state == NGX_HTTP_AGENT_AWAITING_INPUT) {
        run->end = last;
    }

    /* begun once the last resolution is written, as agent_resolve's 200 */

    return ngx_http_agent_store_ack_stream(r, &in->id, written, 0,
                                           ngx_http_agent_agui_resumed);
}


/*
 * The answers to calls that wait, resolved in order, all or none: an
 * answer that does not fit its call, or an interrupt that does not
 * wait, refuses the whole input.  NGX_DECLINED: none of them answers a
 * waiting call; NGX_ABORT: an answer is sent, in->rc to finalize with.
 * *state and *last: the conversation's after them; *written: the last
 * resolution's seq.
 */

static ngx_int_t
ngx_http_agent_agui_resolve(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in, ngx_uint_t *state, uint64_t *last,
    uint64_t *written)
{
    char                        *err;
    uint64_t                     first;
    ngx_int_t                    rc;
    ngx_str_t                   *approver;
    ngx_uint_t                   i;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    if (in->nanswers == 0) {
        return NGX_DECLINED;
    }

    /* a new thread's messages answer nothing: a stored one comes back */

    ngx_http_agent_zone_lock(z);
    conv = ngx_http_agent_conv_find_locked(z, &in->id);
    ngx_http_agent_zone_unlock(z);

    if (conv == NULL) {
        switch (ngx_http_agent_revive(r, &in->id)) {
        case NGX_DECLINED:
            return NGX_DECLINED;
        case NGX_DONE:
            return NGX_DONE;
        case NGX_BUSY:
            in->rc = ngx_http_agent_store_busy_answer(r);
            return NGX_ABORT;
        default:
            return NGX_ERROR;
        }
    }

    /* who answers, as agent_resolve records it (agent_approver) */

    rc = ngx_http_agent_api_approver(r, &approver);

    if (rc == NGX_DECLINED) {
        in->rc = ngx_http_agent_api_anonymous(r);
        return NGX_ABORT;
    }

    if (rc != NGX_OK) {
        return NGX_ERROR;
    }

    for (i = 0; i < in->nanswers; i++) {
        in->answers[i].approver = approver;
    }

    rc = ngx_http_agent_resolve_apply(r, in->answers, in->nanswers, &first,
                                      written, &err, &in->rc);

    if (rc == NGX_DONE) {
        return NGX_ABORT;
    }

    if (rc == NGX_DECLINED && err) {
        in->rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                           "invalid_resolution", err);
        return NGX_ABORT;
    }

    if (rc == NGX_DECLINED) {
        for (i = 0; i < in->nanswers; i++) {
            if (in->answers[i].stale) {
                in->rc = ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT,
                                                   "stale",
                                                   "the interrupt does not "
                                                   "wait: unknown, resolved "
                                                   "or expired");
                return NGX_ABORT;
            }
        }

        return NGX_DECLINED;
    }

    if (rc != NGX_OK) {
        return rc;
    }

    in->run->from = first - 1;

    conv = ngx_http_agent_api_conv_lock(r, z, &in->id, &in->rc);
    if (conv == NULL) {
        return NGX_ABORT;
    }

    *state = conv->state;
    *last = conv->seq;

    ngx_http_agent_zone_unlock(z);

    return NGX_OK;
}


/*
 * The last message, the user's, is the new message (its id the source
 * id, so that a run sent again is not taken twice).  Without one, the
 * run shows the conversation: the running turn from its start, or, when
 * none runs, nothing but its messages and what waits.
 */

static ngx_int_t
ngx_http_agent_agui_new(ngx_http_request_t *r,
    ngx_http_agent_agui_input_t *in)
{
    ngx_int_t                   rc;
    ngx_str_t                   s;
    yajl_val                    list, m, v;
    ngx_uint_t                  i;
    ngx_http_agent_chat_t       chat;
    ngx_http_agent_zone_t      *z;
    ngx_http_agent_conv_t      *conv;
    ngx_http_agent_message_t    msg;
    ngx_http_agent_main_conf_t *amcf;

    list = ngx_http_agent_provider_get(in->root, "messages");
    m = (YAJL_IS_ARRAY(list) && list->u.array.len)
        ? list->u.array.values[list->u.array.len - 1] : NULL;

    if (m && ngx_http_agent_provider_is(ngx_http_agent_provider_get(m, "role"),
                                        "user"))
    {
        ngx_memzero(&msg, sizeof(ngx_http_agent_message_t));

        rc = ngx_http_agent_agui_text(r, ngx_http_agent_provider_get(m,
                                                                "content"),
                                      &msg.content);
        if (rc == NGX_DECLINED) {
            return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                             "invalid_message",
                                             "the last message has no text");
        }

        if (rc != NGX_OK) {
            return rc;
        }

        if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(m,
                                                                       "id"),
                                           &s)
            == NGX_OK
            && s.len && s.len <= 128)
        {
            msg.source_id = s;
        }

        msg.client_tools = in->tools;

        if (ngx_http_agent_message_fields(r, &msg) != NGX_OK) {
            return NGX_ERROR;
        }

        msg.answer = ngx_http_agent_agui_stream;

        /*
         * the thread's messages place the new one: after the turn of the
         * last user or assistant message before it (a tool's or a
         * reasoning message belongs to an assistant message's turn)
         */

        ngx_memzero(&chat, sizeof(ngx_http_agent_chat_t));

        for (i = list->u.array.len - 1; i > 0; i--) {
            v = ngx_http_agent_provider_get(list->u.array.values[i - 1],
                                            "role");

            if (ngx_http_agent_provider_is(v, "user")
                || ngx_http_agent_provider_is(v, "assistant"))
            {
                chat.anchor = list->u.array.values[i - 1];
                break;
            }
        }

        return ngx_http_agent_branch_message(r, &in->id, &msg, &chat);
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    conv = ngx_http_agent_api_conv_lock(r, z, &in->id, &rc);
    if (conv == NULL) {
        return rc;
    }

    /* a run that waits for input ends where the stream has caught up */

    if (conv->state == NGX_HTTP_AGENT_IDLE) {
        in->run->end = conv->seq;
    }

    in->run->from = (conv->state == NGX_HTTP_AGENT_IDLE) ? conv->seq
                                                          : conv->turn_seq;
    in->run->history = 1;

    ngx_http_agent_zone_unlock(z);

    return ngx_http_agent_events_stream(r, &in->id, 0,
                                        &ngx_http_agent_format_agui, 0);
}


/* a message's text: a string, or its text parts, a blank line between */

static ngx_int_t
ngx_http_agent_agui_text(ngx_http_request_t *r, yajl_val v, ngx_str_t *text)
{
    u_char      *p;
    size_t       len;
    ngx_str_t    s;
    ngx_uint_t   i, pass;
    yajl_val     part;

    if (ngx_http_agent_provider_string(v, text) == NGX_OK) {
        return text->len ? NGX_OK : NGX_DECLINED;
    }

    if (!YAJL_IS_ARRAY(v)) {
        return NGX_DECLINED;
    }

    len = 0;
    p = NULL;

    for (pass = 0; pass < 2; pass++) {

        for (i = 0; i < v->u.array.len; i++) {
            part = v->u.array.values[i];

            if (!ngx_http_agent_provider_is(
                     ngx_http_agent_provider_get(part, "type"), "text")
                || ngx_http_agent_provider_string(
                       ngx_http_agent_provider_get(part, "text"), &s)
                   != NGX_OK
                || s.len == 0)
            {
                continue;
            }

            if (pass == 0) {
                len += s.len + 2;
                continue;
            }

            if (p != text->data) {
                *p++ = LF;
                *p++ = LF;
            }

            p = ngx_cpymem(p, s.data, s.len);
        }

        if (pass == 0) {
            if (len == 0) {
                return NGX_DECLINED;
            }

            text->data = ngx_pnalloc(r->pool, len);
            if (text->data == NULL) {
                return NGX_ERROR;
            }

            p = text->data;
        }
    }

    text->len = p - text->data;

    return NGX_OK;
}


/* the message is taken: the run shows what follows it */

static ngx_int_t
ngx_http_agent_agui_stream(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t seq)
{
    ngx_http_agent_agui_run_t  *run;

    run = ngx_http_agent_agui_run(r);
    if (run == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    run->from = seq;

    /*
     * with a store the stream begins once the message is written: a turn
     * that waits for input by then ends the run where the stream has
     * caught up (ngx_http_agent_format_agui.c)
     */

    return ngx_http_agent_agui_resumed(r, id, 0);
}


/* the input written: the run, from run->from */

static ngx_int_t
ngx_http_agent_agui_resumed(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t from)
{
    if (ngx_http_agent_revive_answer(r, ngx_http_agent_agui_resumed, id, 0)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_events_stream(r, id, 0,
                                        &ngx_http_agent_format_agui, 0);
}


/* a value of the input as JSON text of the request's own */

static ngx_int_t
ngx_http_agent_agui_json(ngx_http_request_t *r, yajl_val v, ngx_str_t *json)
{
    ngx_str_t  s;
    yajl_gen   g;

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_provider_text(g, v, &s) != NGX_OK) {
        return NGX_ERROR;
    }

    json->data = ngx_pstrdup(r->pool, &s);
    json->len = s.len;

    return json->data ? NGX_OK : NGX_ERROR;
}
