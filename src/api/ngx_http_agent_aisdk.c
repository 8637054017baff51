
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * agent_aisdk: the endpoint of the AI SDK's useChat (DefaultChatTransport).
 * POST takes its body ({"id", "messages", "trigger", "messageId"}): the
 * last message, the user's, is the conversation's new message, taken as
 * agent_message takes one, and the answer is the turn as a UI message
 * stream; or, the assistant's, its tool parts that answer waiting calls
 * (an approval response, a client tool's output) resolve them as
 * agent_resolve does, and the answer is the rest of the turn.  GET
 * (".../ID/stream", useChat's resume) answers the running turn's stream
 * from its start, or 204 when no turn runs.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_resolve.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_branch.h"
#include "ngx_http_agent_aisdk.h"



static void ngx_http_agent_aisdk_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_aisdk_message(ngx_http_request_t *r,
    yajl_val root, ngx_http_agent_message_t *msg, char **err);
static ngx_int_t ngx_http_agent_aisdk_results(ngx_http_request_t *r,
    ngx_str_t *id, yajl_val m);
static ngx_int_t ngx_http_agent_aisdk_part(ngx_http_request_t *r,
    yajl_val part, ngx_http_agent_resolution_t *res);
static ngx_int_t ngx_http_agent_aisdk_text(ngx_http_request_t *r,
    yajl_val parts, ngx_str_t *text);
static const char *ngx_http_agent_aisdk_part_text(yajl_val part);
static ngx_int_t ngx_http_agent_aisdk_id(ngx_http_request_t *r,
    ngx_str_t *fallback, ngx_str_t *id, ngx_int_t *rc);
static ngx_int_t ngx_http_agent_aisdk_answer(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t from);
static ngx_int_t ngx_http_agent_aisdk_history(ngx_http_request_t *r,
    yajl_val root, ngx_str_t *id, ngx_http_agent_message_t *msg);


ngx_int_t
ngx_http_agent_aisdk_handler(ngx_http_request_t *r)
{
    u_char     *last, *start;
    ngx_int_t   rc;
    ngx_str_t   id, tail, *owner;

    /* a node whose lease lapsed drops its zone first (agent_node) */
    (void) ngx_http_agent_revive_lease();

    if (r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD)) {

        rc = ngx_http_discard_request_body(r);

        if (rc != NGX_OK) {
            return rc;
        }

        /* the resume URL is the location's with "/ID/stream" added */

        ngx_str_null(&tail);

        last = r->uri.data + r->uri.len;

        if (r->uri.len > sizeof("/stream") - 1
            && ngx_strncmp(last - (sizeof("/stream") - 1), "/stream",
                           sizeof("/stream") - 1)
               == 0)
        {
            last -= sizeof("/stream") - 1;

            for (start = last; start > r->uri.data; start--) {
                if (start[-1] == '/') {
                    break;
                }
            }

            tail.data = start;
            tail.len = last - start;
        }

        if (ngx_http_agent_aisdk_id(r, &tail, &id, &rc) != NGX_OK) {
            return rc;
        }

        return ngx_http_agent_events_stream(r, &id, 0,
                                            &ngx_http_agent_format_aisdk,
                                            NGX_HTTP_AGENT_EVENTS_TURN);
    }

    if (!(r->method & NGX_HTTP_POST)) {
        return ngx_http_agent_json_method(r, "GET, HEAD, POST");
    }

    /* where agent_owner is set, a request without an owner is refused */

    rc = ngx_http_agent_api_owner(r, &owner);

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_api_anonymous(r);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_agent_aisdk_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_agent_aisdk_body(ngx_http_request_t *r)
{
    char                      errbuf[NGX_HTTP_AGENT_JSON_ERR], *err;
    ngx_int_t                 rc;
    ngx_str_t                 body, id, chat;
    yajl_val                  root, v, m;
    ngx_http_agent_message_t  msg;
    const char               *id_path[] = { "id", NULL };
    const char               *messages_path[] = { "messages", NULL };
    const char               *role_path[] = { "role", NULL };

    if (ngx_http_agent_message_body_read(r, &body, &rc) != NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    root = ngx_http_agent_json_parse(body.data, body.len,
                                     NGX_HTTP_AGENT_JSON_DEPTH, errbuf,
                                     sizeof(errbuf));

    if (root == NULL) {
        err = ngx_http_agent_json_reason(r->pool, "the body ", errbuf);

        ngx_http_finalize_request(r, err == NULL
            ? NGX_HTTP_INTERNAL_SERVER_ERROR
            : ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                        "invalid_message", err));
        return;
    }

    if (!YAJL_IS_OBJECT(root)) {
        ngx_http_agent_json_free(root);
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                      "invalid_message",
                                      "the body is not a JSON object"));
        return;
    }

    ngx_str_null(&chat);

    v = yajl_tree_get(root, id_path, yajl_t_string);

    if (v) {
        chat.data = (u_char *) v->u.string;
        chat.len = ngx_strlen(chat.data);
    }

    if (ngx_http_agent_aisdk_id(r, &chat, &id, &rc) != NGX_OK) {
        ngx_http_agent_json_free(root);
        ngx_http_finalize_request(r, rc);
        return;
    }

    ngx_memzero(&msg, sizeof(ngx_http_agent_message_t));
    err = NULL;

    v = yajl_tree_get(root, messages_path, yajl_t_array);
    m = (v && v->u.array.len) ? v->u.array.values[v->u.array.len - 1]
                              : NULL;
    v = m ? yajl_tree_get(m, role_path, yajl_t_string) : NULL;

    if (v && ngx_strcmp(v->u.string, "assistant") == 0) {
        rc = ngx_http_agent_aisdk_results(r, &id, m);
        ngx_http_agent_json_free(root);
        ngx_http_finalize_request(r, rc);
        return;
    }

    rc = ngx_http_agent_aisdk_message(r, root, &msg, &err);

    if (rc == NGX_OK) {
        msg.answer = ngx_http_agent_aisdk_answer;
        rc = ngx_http_agent_aisdk_history(r, root, &id, &msg);

    } else if (rc == NGX_DECLINED) {
        rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                       "invalid_message", err);

    } else if (rc == NGX_ERROR) {
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_agent_json_free(root);

    ngx_http_finalize_request(r, rc);
}


/*
 * useChat sends the whole chat; the conversation holds it already, so
 * only the last message counts: the user's text, its id the source id
 * (a request sent again is not taken twice).
 */

static ngx_int_t
ngx_http_agent_aisdk_message(ngx_http_request_t *r, yajl_val root,
    ngx_http_agent_message_t *msg, char **err)
{
    ngx_int_t    rc;
    ngx_str_t    role;
    yajl_val     v, m;
    const char  *id_path[] = { "id", NULL };
    const char  *messages_path[] = { "messages", NULL };
    const char  *role_path[] = { "role", NULL };
    const char  *parts_path[] = { "parts", NULL };

    v = yajl_tree_get(root, messages_path, yajl_t_array);

    if (v == NULL || v->u.array.len == 0) {
        *err = "\"messages\" must be a non-empty array";
        return NGX_DECLINED;
    }

    m = v->u.array.values[v->u.array.len - 1];

    v = yajl_tree_get(m, role_path, yajl_t_string);

    role.data = v ? (u_char *) v->u.string : (u_char *) "";
    role.len = ngx_strlen(role.data);

    if (role.len != sizeof("user") - 1
        || ngx_strncmp(role.data, "user", role.len) != 0)
    {
        *err = "the last message is not the user's";
        return NGX_DECLINED;
    }

    rc = ngx_http_agent_aisdk_text(r, yajl_tree_get(m, parts_path,
                                                    yajl_t_array),
                                   &msg->content);
    if (rc != NGX_OK) {
        if (rc == NGX_DECLINED) {
            *err = "the last message has no text part";
        }

        return rc;
    }

    v = yajl_tree_get(m, id_path, yajl_t_string);

    if (v && v->u.string[0] != '\0' && ngx_strlen(v->u.string) <= 128) {
        msg->source_id.data = (u_char *) v->u.string;
        msg->source_id.len = ngx_strlen(msg->source_id.data);
    }

    if (ngx_http_agent_message_fields(r, msg) != NGX_OK) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The assistant's message, sent back after the client answered some of
 * its calls (addToolApprovalResponse, addToolOutput): each tool part
 * that answers a waiting call of the conversation resolves it, as
 * agent_resolve would; the others (calls that ran, or resolved before)
 * change nothing.  The answer is the turn from the first resolution on,
 * begun once the last is written.
 */

static ngx_int_t
ngx_http_agent_aisdk_results(ngx_http_request_t *r, ngx_str_t *id,
    yajl_val m)
{
    char                         *err;
    uint64_t                      last, first;
    ngx_int_t                     rc, answer;
    ngx_str_t                    *approver;
    ngx_uint_t                    i, n;
    yajl_val                      parts;
    const char                   *parts_path[] = { "parts", NULL };
    ngx_http_agent_resolution_t  *res;

    parts = yajl_tree_get(m, parts_path, yajl_t_array);

    if (parts == NULL) {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_message",
                                         "the last message has no parts");
    }

    rc = ngx_http_agent_api_approver(r, &approver);

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_api_anonymous(r);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    res = ngx_pcalloc(r->pool, (parts->u.array.len + 1)
                               * sizeof(ngx_http_agent_resolution_t));
    if (res == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    n = 0;

    for (i = 0; i < parts->u.array.len; i++) {

        rc = ngx_http_agent_aisdk_part(r, parts->u.array.values[i], &res[n]);

        if (rc == NGX_DECLINED) {
            ngx_memzero(&res[n], sizeof(ngx_http_agent_resolution_t));
            continue;
        }

        if (rc != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /*
         * the parts answer as history does: those of calls that ran or
         * that wait for something else change nothing
         */

        res[n].conv = *id;
        res[n].approver = approver;
        res[n].history = 1;
        res[n].loose = 1;
        n++;
    }

    rc = NGX_DECLINED;

    if (n) {
        rc = ngx_http_agent_resolve_apply(r, res, n, &first, &last, &err,
                                          &answer);
        if (rc == NGX_DONE) {
            return answer;
        }
    }

    if (rc != NGX_OK) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT, "stale",
                                         "no call of the message is "
                                         "waiting for what it says");
    }

    return ngx_http_agent_store_ack_stream(r, id, last, first - 1,
                                           ngx_http_agent_aisdk_answer);
}


/*
 * A tool part as a resolution: "approval-responded" (its approval's
 * "approved" and "reason"), "output-available" (its "output" is the
 * result), "output-error" (the result {"error": errorText}).
 * NGX_DECLINED: a part that answers nothing.
 */

static ngx_int_t
ngx_http_agent_aisdk_part(ngx_http_request_t *r, yajl_val part,
    ngx_http_agent_resolution_t *res)
{
    yajl_gen    g;
    ngx_str_t   type, state, s;
    ngx_uint_t  failed;
    yajl_val    v, approval;

    v = ngx_http_agent_provider_get(part, "type");

    if (ngx_http_agent_provider_string(v, &type) != NGX_OK
        || !((type.len > 5 && ngx_strncmp(type.data, "tool-", 5) == 0)
             || (type.len == 12
                 && ngx_strncmp(type.data, "dynamic-tool", 12) == 0)))
    {
        return NGX_DECLINED;
    }

    v = ngx_http_agent_provider_get(part, "toolCallId");

    if (ngx_http_agent_provider_string(v, &res->call) != NGX_OK
        || ngx_http_agent_api_id_check(&res->call) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    v = ngx_http_agent_provider_get(part, "state");

    if (ngx_http_agent_provider_string(v, &state) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (state.len == 18
        && ngx_strncmp(state.data, "approval-responded", 18) == 0)
    {
        approval = ngx_http_agent_provider_get(part, "approval");
        v = approval ? ngx_http_agent_provider_get(approval, "approved")
                     : NULL;

        if (v == NULL || !(YAJL_IS_TRUE(v) || YAJL_IS_FALSE(v))) {
            return NGX_DECLINED;
        }

        res->approve = YAJL_IS_TRUE(v);
        ngx_str_set(&res->decision, "reject");

        if (res->approve) {
            ngx_str_set(&res->decision, "approve");
        }

        v = ngx_http_agent_provider_get(approval, "reason");

        if (v && ngx_http_agent_provider_string(v, &s) == NGX_OK) {
            res->reason = s;
        }

        return NGX_OK;
    }

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    if (state.len == 16
        && ngx_strncmp(state.data, "output-available", 16) == 0)
    {
        v = ngx_http_agent_provider_get(part, "output");

        if (v == NULL) {
            return NGX_DECLINED;
        }

        if (ngx_http_agent_provider_text(g, v, &s) != NGX_OK) {
            return NGX_ERROR;
        }

    } else if (state.len == 12
               && ngx_strncmp(state.data, "output-error", 12) == 0)
    {
        v = ngx_http_agent_provider_get(part, "errorText");

        if (ngx_http_agent_provider_string(v, &s) != NGX_OK) {
            ngx_str_set(&s, "the tool failed");
        }

        failed = yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "error");
        failed |= ngx_http_agent_json_str(g, &s);
        failed |= yajl_gen_map_close(g);

        if (ngx_http_agent_json_result(g, failed, &s) != NGX_OK) {
            return NGX_ERROR;
        }

    } else {
        return NGX_DECLINED;
    }

    res->result.data = ngx_pstrdup(r->pool, &s);
    if (res->result.data == NULL) {
        return NGX_ERROR;
    }

    res->result.len = s.len;
    res->has_result = 1;

    return NGX_OK;
}


/* the message's text parts, one after the other, a blank line between */

static ngx_int_t
ngx_http_agent_aisdk_text(ngx_http_request_t *r, yajl_val parts,
    ngx_str_t *text)
{
    u_char      *p;
    size_t       len;
    ngx_uint_t   i;
    const char  *t;

    if (parts == NULL) {
        return NGX_DECLINED;
    }

    len = 0;

    for (i = 0; i < parts->u.array.len; i++) {
        t = ngx_http_agent_aisdk_part_text(parts->u.array.values[i]);
        len += t ? ngx_strlen(t) + 2 : 0;
    }

    if (len == 0) {
        return NGX_DECLINED;
    }

    text->data = ngx_pnalloc(r->pool, len);
    if (text->data == NULL) {
        return NGX_ERROR;
    }

    p = text->data;

    for (i = 0; i < parts->u.array.len; i++) {
        t = ngx_http_agent_aisdk_part_text(parts->u.array.values[i]);

        if (t == NULL) {
            continue;
        }

        if (p != text->data) {
            *p++ = LF;
            *p++ = LF;
        }

        p = ngx_cpymem(p, t, ngx_strlen(t));
    }

    text->len = p - text->data;

    return NGX_OK;
}


/* the text of a {"type": "text", "text": "..."} part, NULL for others */

static const char *
ngx_http_agent_aisdk_part_text(yajl_val part)
{
    yajl_val     type, text;
    const char  *type_path[] = { "type", NULL };
    const char  *text_path[] = { "text", NULL };

    type = yajl_tree_get(part, type_path, yajl_t_string);
    text = yajl_tree_get(part, text_path, yajl_t_string);

    if (type == NULL || text == NULL
        || ngx_strcmp(type->u.string, "text") != 0
        || text->u.string[0] == '\0')
    {
        return NULL;
    }

    return text->u.string;
}


/*
 * The conversation: agent_conversation if the location sets one and it
 * is not empty, else the chat's id (from the body, or the resume URL).
 * NGX_DONE: the request answered or refused, *rc what to finalize it
 * with (an answer sent is NGX_OK there, not "go on").
 */

static ngx_int_t
ngx_http_agent_aisdk_id(ngx_http_request_t *r, ngx_str_t *fallback,
    ngx_str_t *id, ngx_int_t *rc)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    ngx_str_null(id);

    if (alcf->conversation
        && ngx_http_complex_value(r, alcf->conversation, id) != NGX_OK)
    {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }

    if (id->len == 0) {
        *id = *fallback;
    }

    if (ngx_http_agent_api_id_check(id) != NGX_OK) {
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                        "invalid_conversation",
                                        "the conversation id is missing "
                                        "or invalid");
        return NGX_DONE;
    }

    id->data = ngx_pstrdup(r->pool, id);
    if (id->data == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }

    return NGX_OK;
}


/* the input is taken: its turn, streamed from after from, is the answer */

static ngx_int_t
ngx_http_agent_aisdk_answer(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t from)
{
    if (ngx_http_agent_revive_answer(r, ngx_http_agent_aisdk_answer, id, from)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_events_stream(r, id, from,
                                        &ngx_http_agent_format_aisdk, 0);
}


/*
 * useChat's regenerate() and edits: "trigger" "regenerate-message" (the
 * chat ends with the user message whose reply is made again), a
 * "messageId" with "submit-message" (sendMessage({ text, messageId }):
 * that user message's new text), or a chat whose messages leave out
 * turns of the conversation (setMessages, then sendMessage).  The
 * message before the new one says where the chat is in the current
 * branch: an assistant message is its turn's ("msg_T"), a user message
 * its source id.  A new message after the last turn is taken as ever;
 * the others need the branch, read first, and go after a rewind.
 */

static ngx_int_t
ngx_http_agent_aisdk_history(ngx_http_request_t *r, yajl_val root,
    ngx_str_t *id, ngx_http_agent_message_t *msg)
{
    yajl_val                  v;
    ngx_str_t                 s;
    ngx_http_agent_chat_t     chat;

    ngx_memzero(&chat, sizeof(ngx_http_agent_chat_t));

    v = ngx_http_agent_provider_get(root, "trigger");

    if (ngx_http_agent_provider_string(v, &s) == NGX_OK
        && s.len == sizeof("regenerate-message") - 1
        && ngx_strncmp(s.data, "regenerate-message", s.len) == 0)
    {
        chat.regenerate = 1;
    }

    v = ngx_http_agent_provider_get(root, "messageId");

    if (!chat.regenerate && v && YAJL_IS_STRING(v)) {
        chat.edit = 1;
    }

    v = ngx_http_agent_provider_get(root, "messages");

    if (v->u.array.len > 1) {
        chat.anchor = v->u.array.values[v->u.array.len - 2];
    }

    return ngx_http_agent_branch_message(r, id, msg, &chat);
}
