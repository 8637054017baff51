
/*
 * Copyright (C) The nginx agent module authors
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
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_trace.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_budget.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_branch.h"


#define NGX_HTTP_AGENT_SOURCE_ID_LEN  128


/* a regenerate or an edit, while the branch is read */
typedef struct {
    ngx_str_t                  id;
    ngx_http_agent_message_t   msg;
    ngx_http_agent_branch_t    branch;
} ngx_http_agent_message_ctx_t;


static void ngx_http_agent_message_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_message_parse(ngx_http_request_t *r,
    ngx_str_t *body, ngx_http_agent_message_t *msg, char **err);
static ngx_int_t ngx_http_agent_message_rewind(yajl_val root,
    ngx_http_agent_message_t *msg, char **err);
static ngx_int_t ngx_http_agent_message_output(ngx_http_request_t *r,
    yajl_val output, ngx_http_agent_message_t *msg, char **err);
static ngx_int_t ngx_http_agent_message_answer(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *id, ngx_uint_t turn, uint64_t seq,
    ngx_uint_t duplicate);
static ngx_int_t ngx_http_agent_message_busy(ngx_http_request_t *r,
    ngx_http_agent_state_e state);
static ngx_int_t ngx_http_agent_message_queued(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_agent_store_queued_t *queued, ngx_str_t *json);
static void ngx_http_agent_message_queued_done(
    ngx_http_agent_store_read_t *rd, ngx_int_t rc, void *data);
static ngx_int_t ngx_http_agent_message_rewound(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_agent_message_t *msg);
static ngx_int_t ngx_http_agent_message_branch(ngx_http_request_t *r,
    void *data);
static ngx_int_t ngx_http_agent_message_stale_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_http_agent_message_t *msg);
static ngx_int_t ngx_http_agent_message_busy_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_message_t *msg, uint32_t hash);


/* POST {"content": "...", "source_id": "...", "output": {...}} */

ngx_int_t
ngx_http_agent_message_handler(ngx_http_request_t *r)
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

    rc = ngx_http_read_client_request_body(r, ngx_http_agent_message_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_agent_message_body(ngx_http_request_t *r)
{
    char                      *err;
    ngx_int_t                  rc;
    ngx_str_t                  body, id;
    ngx_http_agent_message_t   msg;

    if (ngx_http_agent_message_body_read(r, &body, &rc) != NGX_OK) {
        ngx_http_finalize_request(r, rc);
        return;
    }

    ngx_memzero(&msg, sizeof(ngx_http_agent_message_t));
    err = NULL;

    rc = ngx_http_agent_message_parse(r, &body, &msg, &err);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (rc == NGX_DECLINED) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                      "invalid_message", err));
        return;
    }

    if (ngx_http_agent_api_conversation_id(r, &id) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (msg.regenerate || msg.edit) {
        ngx_http_finalize_request(r,
                                  ngx_http_agent_message_rewound(r, &id, &msg));
        return;
    }

    ngx_http_finalize_request(r, ngx_http_agent_message_accept(r, &id, &msg));
}


/*
 * "regenerate" (true: the last reply, or the seq of a user message whose
 * reply is made again) or "edit" (the seq of a user message, "content"
 * its new text): the branch is read first, and the message taken after
 * a rewind to before that user message.
 */

static ngx_int_t
ngx_http_agent_message_rewound(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_message_t *msg)
{
    ngx_http_agent_message_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_message_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->id = *id;
    ctx->msg = *msg;

    return ngx_http_agent_branch_read(r, &ctx->id, &ctx->branch,
                                      ngx_http_agent_message_branch, ctx);
}


static ngx_int_t
ngx_http_agent_message_branch(ngx_http_request_t *r, void *data)
{
    ngx_http_agent_message_ctx_t *ctx = data;

    ngx_int_t                      i;
    ngx_http_agent_message_t      *msg;
    ngx_http_agent_branch_turn_t  *t;

    msg = &ctx->msg;

    if (!ctx->branch.ready) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    t = ctx->branch.turns.elts;

    if (ctx->branch.turns.nelts == 0) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT, "no_message",
                                         "the conversation has no message "
                                         "to regenerate or edit");
    }

    i = ctx->branch.turns.nelts - 1;

    if (msg->target) {
        i = ngx_http_agent_branch_find(&ctx->branch, msg->target);

        if (i == NGX_ERROR) {
            return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT,
                                             "not_on_branch",
                                             "the seq is not a user message "
                                             "of the conversation's current "
                                             "branch");
        }
    }

    if (msg->regenerate) {
        msg->content = t[i].content;

        if (msg->source_id.len == 0) {
            msg->source_id = t[i].source_id;
        }
    }

    return ngx_http_agent_branch_rewind(r, &ctx->branch, i, &ctx->id, msg);
}


/*
 * The body of a message.  NGX_DONE: an error answer is sent and *rc is
 * what the handler finalizes the request with.
 */

ngx_int_t
ngx_http_agent_message_body_read(ngx_http_request_t *r, ngx_str_t *body,
    ngx_int_t *rc)
{
    switch (ngx_http_agent_json_body(r, body)) {

    case NGX_OK:
        return NGX_OK;

    case NGX_DECLINED:
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                        "invalid_message",
                                        "the request has no body");
        return NGX_DONE;

    case NGX_ABORT:
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                        "too_large",
                                        "the message is larger than "
                                        "client_body_buffer_size");
        return NGX_DONE;

    default:
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }
}


static ngx_int_t
ngx_http_agent_message_parse(ngx_http_request_t *r, ngx_str_t *body,
    ngx_http_agent_message_t *msg, char **err)
{
    char          errbuf[NGX_HTTP_AGENT_JSON_ERR];
    ngx_int_t     rc;
    yajl_val      root, v;
    const char   *content_path[] = { "content", NULL };
    const char   *source_path[] = { "source_id", NULL };
    const char   *output_path[] = { "output", NULL };

    root = ngx_http_agent_json_parse(body->data, body->len,
                                     NGX_HTTP_AGENT_JSON_DEPTH, errbuf,
                                     sizeof(errbuf));

    if (root == NULL) {
        *err = ngx_http_agent_json_reason(r->pool, "the body ", errbuf);
        return *err ? NGX_DECLINED : NGX_ERROR;
    }

    if (!YAJL_IS_OBJECT(root)) {
        *err = "the body is not a JSON object";
        goto declined;
    }

    rc = ngx_http_agent_message_rewind(root, msg, err);

    if (rc != NGX_OK) {
        goto declined;
    }

    v = yajl_tree_get(root, content_path, yajl_t_any);

    if (msg->regenerate) {
        if (v != NULL) {
            *err = "\"regenerate\" takes the message's own content: "
                   "\"content\" is for \"edit\"";
            goto declined;
        }

    } else if (v == NULL || !YAJL_IS_STRING(v) || v->u.string[0] == '\0') {
        *err = "\"content\" must be a non-empty string";
        goto declined;

    } else {
        msg->content.data = (u_char *) v->u.string;
        msg->content.len = ngx_strlen(msg->content.data);
    }

    v = yajl_tree_get(root, source_path, yajl_t_any);

    if (v != NULL) {
        if (!YAJL_IS_STRING(v)
            || ngx_strlen(v->u.string) > NGX_HTTP_AGENT_SOURCE_ID_LEN)
        {
            *err = "\"source_id\" must be a string of at most 128 bytes";
            goto declined;
        }

        msg->source_id.data = (u_char *) v->u.string;
        msg->source_id.len = ngx_strlen(msg->source_id.data);
    }

    v = yajl_tree_get(root, output_path, yajl_t_any);

    if (v != NULL) {
        rc = ngx_http_agent_message_output(r, v, msg, err);

        if (rc != NGX_OK) {
            ngx_http_agent_json_free(root);
            return rc;
        }
    }

    rc = ngx_http_agent_message_fields(r, msg);

    /*
     * the parsed strings go with the tree: keep only what was generated,
     * and an edit's content (its fields are made again after a rewind)
     */

    msg->source_id.data = msg->source_id.len
        ? ngx_pstrdup(r->pool, &msg->source_id) : NULL;

    msg->content.data = msg->content.len
        ? ngx_pstrdup(r->pool, &msg->content) : NULL;

    ngx_http_agent_json_free(root);

    if ((msg->source_id.len && msg->source_id.data == NULL)
        || (msg->content.len && msg->content.data == NULL))
    {
        return NGX_ERROR;
    }

    return rc;

declined:

    if (root) {
        ngx_http_agent_json_free(root);
    }

    return NGX_DECLINED;
}


/*
 * "regenerate": true (the last reply) or the seq of a user message;
 * "edit": the seq of a user message
 */

static ngx_int_t
ngx_http_agent_message_rewind(yajl_val root, ngx_http_agent_message_t *msg,
    char **err)
{
    yajl_val  regenerate, edit;

    regenerate = ngx_http_agent_provider_get(root, "regenerate");
    edit = ngx_http_agent_provider_get(root, "edit");

    if (regenerate && edit) {
        *err = "\"regenerate\" and \"edit\" cannot go together";
        return NGX_DECLINED;
    }

    if (regenerate) {
        if (YAJL_IS_TRUE(regenerate)) {
            msg->regenerate = 1;
            return NGX_OK;
        }

        if (!YAJL_IS_INTEGER(regenerate) || YAJL_GET_INTEGER(regenerate) <= 0)
        {
            *err = "\"regenerate\" must be true or the seq of a user "
                   "message";
            return NGX_DECLINED;
        }

        msg->regenerate = 1;
        msg->target = YAJL_GET_INTEGER(regenerate);
    }

    if (edit) {
        if (!YAJL_IS_INTEGER(edit) || YAJL_GET_INTEGER(edit) <= 0) {
            *err = "\"edit\" must be the seq of a user message";
            return NGX_DECLINED;
        }

        msg->edit = 1;
        msg->target = YAJL_GET_INTEGER(edit);
    }

    return NGX_OK;
}


/*
 * "output": {"name": NAME, "schema": {"type": "object", ...}}, the JSON
 * object the reply must be.  Every API takes the name as a tool's or a
 * format's (letters, digits, "_" and "-") and wants an object at the
 * schema's root; a name of one of the agent's tools would be ambiguous.
 */

static ngx_int_t
ngx_http_agent_message_output(ngx_http_request_t *r, yajl_val output,
    ngx_http_agent_message_t *msg, char **err)
{
    yajl_gen                    g;
    yajl_val                    name, schema;
    ngx_str_t                   s;
    ngx_uint_t                  i, failed;
    ngx_http_agent_tool_ref_t  *refs;
    ngx_http_agent_loc_conf_t  *alcf;

    name = ngx_http_agent_provider_get(output, "name");
    schema = ngx_http_agent_provider_get(output, "schema");

    if (!YAJL_IS_OBJECT(output) || output->u.object.len != 2
        || name == NULL || schema == NULL)
    {
        *err = "\"output\" must be an object of \"name\" and \"schema\"";
        return NGX_DECLINED;
    }

    if (ngx_http_agent_provider_string(name, &s) != NGX_OK
        || ngx_http_agent_conf_name(&s) != NGX_OK)
    {
        *err = "\"output\" \"name\" must be 1 to 64 letters, digits, "
               "\"_\" or \"-\"";
        return NGX_DECLINED;
    }

    if (!ngx_http_agent_provider_is(ngx_http_agent_provider_get(schema,
                                                                "type"),
                                    "object"))
    {
        *err = "\"output\" \"schema\" must be a JSON Schema of an object "
               "(\"type\": \"object\")";
        return NGX_DECLINED;
    }

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
    refs = alcf->agent->tools.elts;

    for (i = 0; i < alcf->agent->tools.nelts; i++) {
        if (refs[i].name.len == s.len
            && ngx_strncmp(refs[i].name.data, s.data, s.len) == 0)
        {
            *err = "\"output\" \"name\" is the name of one of the "
                   "agent's tools";
            return NGX_DECLINED;
        }
    }

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &s);
    failed |= ngx_http_agent_json_key(g, "schema");
    failed |= ngx_http_agent_provider_value(g, schema);
    failed |= yajl_gen_map_close(g);

    return ngx_http_agent_json_result(g, failed, &msg->output);
}


/*
 * the user_msg's fields: {"content": ..., "source_id": ..., "output": ...,
 * "client_tools": [...], "trace": {...}}, the tools as they were checked;
 * the trace is kept with the turn, so that the turn resumed, taken over
 * or revived stays in it
 */

ngx_int_t
ngx_http_agent_message_fields(ngx_http_request_t *r,
    ngx_http_agent_message_t *msg)
{
    yajl_gen                     g;
    ngx_uint_t                   failed;
    ngx_http_agent_trace_t       tc;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);

    /* first: the turn's start finds it there (NGX_HTTP_AGENT_REWIND_PREFIX) */

    if (msg->rewind) {
        failed |= ngx_http_agent_json_key(g, "rewind_to");
        failed |= yajl_gen_integer(g, (long long) msg->rewind_to);
    }

    failed |= ngx_http_agent_json_key(g, "content");
    failed |= ngx_http_agent_json_str(g, &msg->content);

    if (msg->source_id.data) {
        failed |= ngx_http_agent_json_key(g, "source_id");
        failed |= ngx_http_agent_json_str(g, &msg->source_id);
    }

    if (msg->output.len) {
        failed |= ngx_http_agent_json_key(g, "output");
        failed |= ngx_http_agent_json_verbatim(g, &msg->output);
    }

    if (msg->client_tools.len) {
        failed |= ngx_http_agent_json_key(g, "client_tools");
        failed |= ngx_http_agent_json_verbatim(g, &msg->client_tools);
    }

    if (amcf->trace.len) {
        ngx_http_agent_trace_request(r, &tc, amcf->trace_sample);

        failed |= ngx_http_agent_json_key(g, "trace");
        failed |= ngx_http_agent_trace_json(g, &tc);
    }

    failed |= yajl_gen_map_close(g);

    return ngx_http_agent_json_result(g, failed, &msg->fields);
}


/*
 * A message for a conversation that is not idle, by the location's
 * policy.  reject: 409 with the state.  queue: taken, to run after the
 * turn, in order.  interrupt: taken to run next, and the turn cancelled
 * (at once when no turn runs, as in awaiting_input).  The zone is locked
 * on entry and unlocked on return.
 */

static ngx_int_t
ngx_http_agent_message_busy_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_http_agent_conv_t *conv,
    ngx_http_agent_message_t *msg, uint32_t hash)
{
    u_char                         *p;
    ngx_str_t                       json, id;
    ngx_pid_t                       lease, pids[NGX_HTTP_AGENT_SUB_WORKERS];
    ngx_uint_t                      n, position;
    ngx_queue_t                    *q;
    ngx_http_agent_fsm_t            fsm;
    ngx_http_agent_queued_t        *m;
    ngx_http_agent_loc_conf_t      *alcf;
    ngx_http_agent_store_queued_t   queued;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (alcf->busy == NGX_HTTP_AGENT_BUSY_REJECT) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_message_busy(r, conv->state);
    }

    for (q = ngx_queue_head(&conv->queued);
         hash && q != ngx_queue_sentinel(&conv->queued);
         q = ngx_queue_next(q))
    {
        m = ngx_queue_data(q, ngx_http_agent_queued_t, queue);

        if (m->hash == hash) {
            ngx_http_agent_zone_unlock(z);
            ngx_str_set(&json, "{\"queued\":true,\"duplicate\":true}");
            return ngx_http_agent_json_send(r, NGX_HTTP_OK, &json);
        }
    }

    if (conv->nqueued >= NGX_HTTP_AGENT_QUEUE_MAX) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT, "queue_full",
                                         "too many messages wait for "
                                         "their turn");
    }

    /* its user_msg will name it: the store's copy goes when it is written */

    queued.id = ++conv->queue_id;
    queued.front = (alcf->busy == NGX_HTTP_AGENT_BUSY_INTERRUPT);
    queued.epoch = conv->epoch;
    queued.data.data = ngx_pnalloc(r->pool, msg->fields.len + 32);

    if (queued.data.data == NULL) {
        ngx_http_agent_zone_unlock(z);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_cpymem(queued.data.data, msg->fields.data, msg->fields.len - 1);
    p = ngx_sprintf(p, "%s\"queue_id\":%L}",
                    msg->fields.len > 2 ? "," : "", queued.id);
    queued.data.len = p - queued.data.data;

    m = ngx_http_agent_fsm_queue_add_locked(z, conv, &queued.data, hash,
                                        queued.front);
    if (m == NULL) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                         "zone_full",
                                         "no room for the message");
    }

    m->id = queued.id;

    position = conv->nqueued;
    lease = 0;

    fsm.fields = NULL;
    fsm.next = 0;

    if (alcf->busy == NGX_HTTP_AGENT_BUSY_INTERRUPT) {
        position = 1;

        if (conv->lease == 0) {
            /* waiting for input: cancelled here, and this message runs */
            (void) ngx_http_agent_fsm_locked(z, conv,
                                             NGX_HTTP_AGENT_FSM_CANCEL, &fsm);

        } else {
            conv->cancel = 1;
            lease = conv->lease;
        }
    }

    n = ngx_http_agent_conv_sub_pids_locked(conv, pids);

    ngx_http_agent_zone_unlock(z);

    if (ngx_http_agent_api_conversation_id(r, &id) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_agent_wake(&id, pids, n);

    if (fsm.next) {
        if (ngx_http_agent_turn_start(r, alcf->agent, z, &id, fsm.next_turn,
                                      0)
            != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        return ngx_http_agent_message_answer(r, NGX_HTTP_ACCEPTED, &id,
                                             fsm.next_turn, fsm.next_seq, 0);
    }

    if (lease == ngx_pid) {
        ngx_http_agent_turn_cancel(&id);

    } else if (lease) {
        ngx_http_agent_wake(&id, &lease, 1);
    }

    p = ngx_pnalloc(r->pool, id.len + 96);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.data = p;
    json.len = ngx_sprintf(p, "{\"conversation\":\"%V\",\"queued\":true,"
                           "\"position\":%ui%s}", &id, position,
                           lease ? ",\"interrupting\":true" : "")
               - p;

    return ngx_http_agent_message_queued(r, &id, &queued, &json);
}


/*
 * With a store, a queued message is acknowledged once it is written
 * there, so that it survives a restart before its turn.
 */

typedef struct {
    ngx_http_request_t        *request;
    ngx_str_t                  json;
} ngx_http_agent_queued_ack_t;


static ngx_int_t
ngx_http_agent_message_queued(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_store_queued_t *queued, ngx_str_t *json)
{
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_queued_ack_t  *ack;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    if (amcf->store == NULL) {
        return ngx_http_agent_json_send(r, NGX_HTTP_ACCEPTED, json);
    }

    ack = ngx_palloc(r->pool, sizeof(ngx_http_agent_queued_ack_t));
    if (ack == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ack->request = r;
    ack->json = *json;

    return ngx_http_agent_store_posted(r,
               ngx_http_agent_store_enqueue(r->pool, id, queued,
                                         ngx_http_agent_message_queued_done,
                                         ack));
}


static void
ngx_http_agent_message_queued_done(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data)
{
    ngx_http_agent_queued_ack_t *ack = data;

    ngx_str_t            none;
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ack->request;
    c = r->connection;

    if (rc == NGX_OK) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_send(r, NGX_HTTP_ACCEPTED, &ack->json));

    } else if (rc == NGX_ABORT) {

        /*
         * the store's fence: another node took the conversation, whose
         * log will not have the message; it leaves this node's zone
         */

        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "agent conversation \"%V\": ownership lost, another "
                      "node took it over; the queued message is not "
                      "written", &rd->id);

        if (ngx_http_agent_store_lost) {
            ngx_http_agent_store_lost(&rd->id);
        }

        ngx_str_null(&none);
        ngx_http_finalize_request(r,
            ngx_http_agent_store_elsewhere_answer(r, &none));

    } else {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "not_durable",
                                      "the message was queued but is not "
                                      "written yet"));
    }

    ngx_http_run_posted_requests(c);
}


/*
 * Under the zone lock: a message is taken only by an idle conversation;
 * its user_msg starts the turn, whose lease this worker takes.  The
 * answer is msg->answer's if set (a stream of the turn), else JSON.
 */

ngx_int_t
ngx_http_agent_message_accept(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_message_t *msg)
{
    uint32_t                     hash;
    uint64_t                     seq;
    ngx_int_t                    rc;
    ngx_str_t                   *owner;
    ngx_uint_t                   i, turn;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_fsm_t         fsm;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_source_t     *src;
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    hash = msg->source_id.len
           ? ngx_crc32_short(msg->source_id.data, msg->source_id.len) : 0;

    if (ngx_http_agent_api_owner(r, &owner) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_agent_budget_request(r);

    if (rc != NGX_DECLINED) {
        return rc;
    }

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, id);

    if (conv == NULL) {
        /* a conversation the store holds comes back first */

        ngx_http_agent_zone_unlock(z);

        switch (ngx_http_agent_revive(r, id)) {
        case NGX_DECLINED:
            break;
        case NGX_DONE:
            return NGX_DONE;
        case NGX_BUSY:
            return ngx_http_agent_store_busy_answer(r);
        default:
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_agent_zone_lock(z);

        conv = ngx_http_agent_conv_find_locked(z, id);
    }

    if (conv == NULL) {
        conv = ngx_http_agent_api_conv_create_locked(r, z, id, &rc);

        if (conv == NULL) {
            return rc;
        }
    }

    if (ngx_http_agent_conv_bound_locked(conv, &alcf->agent->name, owner)
        != NGX_OK)
    {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_api_foreign(r);
    }

    if (msg->rewind) {
        rc = ngx_http_agent_message_stale_locked(r, conv, msg);

        if (rc != NGX_OK) {
            ngx_http_agent_zone_unlock(z);
            return rc;
        }
    }

    /* the newest first: an edit may have given a source id a new turn */

    if (hash && !msg->fresh && !msg->rewind) {
        for (i = 0; i < ngx_min(conv->nsources, NGX_HTTP_AGENT_SOURCE_IDS);
             i++)
        {
            src = &conv->sources[(conv->nsources - 1 - i)
                                 % NGX_HTTP_AGENT_SOURCE_IDS];

            if (src->hash == hash) {
                turn = src->turn;
                seq = src->seq;
                ngx_http_agent_zone_unlock(z);

                if (msg->answer) {
                    return ngx_http_agent_store_ack_stream(r, id, seq, seq,
                                                           msg->answer);
                }

                return ngx_http_agent_message_answer(r, NGX_HTTP_OK, id,
                                                     turn, seq, 1);
            }
        }
    }

    if (conv->state != NGX_HTTP_AGENT_IDLE) {
        return ngx_http_agent_message_busy_locked(r, z, conv, msg, hash);
    }

    if (conv->agent_len == 0) {
        ngx_http_agent_conv_bind_locked(conv, &alcf->agent->name, owner);
    }

    fsm.fields = &msg->fields;
    fsm.hash = hash;

    if (ngx_http_agent_fsm_locked(z, conv, NGX_HTTP_AGENT_FSM_MESSAGE, &fsm)
        != NGX_OK)
    {
        if (conv->seq == 0) {
            ngx_http_agent_conv_delete_locked(z, conv);
        }

        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                         "zone_full",
                                         "no room for the message");
    }

    turn = fsm.turn;
    seq = fsm.seq;

    ngx_http_agent_zone_unlock(z);

    ngx_http_agent_budget_bind(r, id);

    /*
     * the model call is posted before the subscribers' wake-up: the
     * provider's connection is opened first, and the user_msg goes out
     * in one write with the events of the call's start
     */

    rc = ngx_http_agent_turn_start(r, alcf->agent, z, id, turn, 0);

    ngx_http_agent_wake(id, fsm.pids, fsm.npids);

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "agent could not start the turn of \"%V\"", id);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (msg->answer) {
        return ngx_http_agent_store_ack_stream(r, id, seq, seq,
                                               msg->answer);
    }

    return ngx_http_agent_message_answer(r, NGX_HTTP_ACCEPTED, id, turn, seq,
                                         msg->rewind ? 2 : 0);
}


/*
 * A rewind decided on a branch that is no longer the conversation's (a
 * message taken since), or while a summary of it is being made, is
 * refused; the client may send it again.
 */

static ngx_int_t
ngx_http_agent_message_stale_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_http_agent_message_t *msg)
{
    if (conv->turn_seq != msg->turn_seq) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT, "stale",
                                         "the conversation took a message "
                                         "while its history was read: send "
                                         "the request again");
    }

    if (conv->summarizing) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT,
                                         "summarizing",
                                         "a summary of the conversation is "
                                         "being made: send the request "
                                         "again once it is recorded");
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_message_answer(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *id, ngx_uint_t turn, uint64_t seq, ngx_uint_t duplicate)
{
    ngx_str_t  json;

    json.data = ngx_pnalloc(r->pool, id->len + 160);
    if (json.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /*
     * duplicate 2: a rewind went before the message (at seq - 1, to the
     * seq its fields said); the calls of the branch it superseded ran
     */

    json.len = ngx_sprintf(json.data,
                           "{\"conversation\":\"%V\",\"turn\":%ui,"
                           "\"seq\":%uL%s}",
                           id, turn, seq,
                           duplicate == 1 ? ",\"duplicate\":true"
                           : duplicate == 2
                           ? ",\"rewound\":true,\"tool_calls_undone\":false"
                           : "")
               - json.data;

    return ngx_http_agent_store_ack(r, id, seq, status, &json);
}


static ngx_int_t
ngx_http_agent_message_busy(ngx_http_request_t *r,
    ngx_http_agent_state_e state)
{
    ngx_str_t  json;

    json.data = ngx_pnalloc(r->pool, 160);
    if (json.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.len = ngx_sprintf(json.data,
                           "{\"error\":{\"code\":\"busy\",\"message\":"
                           "\"the conversation is not idle\","
                           "\"state\":\"%V\"}}",
                           &ngx_http_agent_state_names[state])
               - json.data;

    return ngx_http_agent_json_send(r, NGX_HTTP_CONFLICT, &json);
}
