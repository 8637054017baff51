
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * A conversation's current branch, for the messages that rewind it (a
 * regenerate, an edit, a client's history that left some turns out):
 * the user messages of the turns the context holds now, read from the
 * whole log, the store's and the zone's.  The log keeps every branch; a
 * rewind (to_seq N, at seq R) supersedes the events between N and R.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_branch.h"


/*
 * A chat client's message that does not follow the conversation's last
 * turn: the chat as the client has it, matched with the current branch.
 */

typedef struct {
    ngx_str_t                  id;
    ngx_http_agent_message_t   msg;
    ngx_http_agent_branch_t    branch;
    /* the message before the new one: its role and id, or none */
    ngx_str_t                  anchor_role;
    ngx_str_t                  anchor_id;
    unsigned                   anchor:1;
    unsigned                   regenerate:1;
    unsigned                   edit:1;
} ngx_http_agent_branch_chat_t;


static void ngx_http_agent_branch_stored(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static ngx_int_t ngx_http_agent_branch_zone(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_agent_branch_t *b);
static ngx_int_t ngx_http_agent_branch_add(ngx_http_agent_branch_t *b,
    uint64_t seq, ngx_uint_t type, u_char *data, size_t len);
static ngx_int_t ngx_http_agent_branch_walk(ngx_http_request_t *r,
    ngx_http_agent_branch_t *b);
static ngx_int_t ngx_http_agent_branch_turn(ngx_http_request_t *r,
    yajl_val ev, ngx_http_agent_branch_turn_t *t);
static uint64_t ngx_http_agent_branch_uint(yajl_val v);
static ngx_int_t ngx_http_agent_branch_decide(ngx_http_request_t *r,
    ngx_http_agent_branch_t *b);
static ngx_uint_t ngx_http_agent_branch_foreign(ngx_http_request_t *r,
    ngx_str_t *agent, ngx_str_t *owner);
static ngx_int_t ngx_http_agent_branch_follows(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_agent_message_t *msg,
    ngx_http_agent_branch_chat_t *ctx);
static ngx_int_t ngx_http_agent_branch_chat(ngx_http_request_t *r,
    void *data);
static ngx_int_t ngx_http_agent_branch_anchor(
    ngx_http_agent_branch_chat_t *ctx);
static ngx_int_t ngx_http_agent_branch_alone(
    ngx_http_agent_branch_chat_t *ctx);
static ngx_int_t ngx_http_agent_branch_turn_of(
    ngx_http_agent_branch_chat_t *ctx);
static ngx_int_t ngx_http_agent_branch_copy(ngx_pool_t *pool, yajl_val v,
    ngx_str_t *s);


typedef struct {
    ngx_http_agent_branch_t   *branch;
    ngx_str_t                  id;
} ngx_http_agent_branch_read_t;


ngx_int_t
ngx_http_agent_branch_read(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_branch_t *b, ngx_int_t (*decide)(ngx_http_request_t *r,
    void *data), void *data)
{
    ngx_http_agent_main_conf_t    *amcf;
    ngx_http_agent_branch_read_t  *br;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    b->request = r;
    b->decide = decide;
    b->data = data;
    b->ready = 0;
    b->last = 0;

    if (ngx_array_init(&b->events, r->pool, 16,
                       sizeof(ngx_http_agent_store_event_t))
        != NGX_OK
        || ngx_array_init(&b->turns, r->pool, 8,
                          sizeof(ngx_http_agent_branch_turn_t))
           != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (amcf->store == NULL) {
        /* the zone holds the whole log */

        (void) ngx_http_agent_branch_zone(r, id, b);

        return ngx_http_agent_branch_decide(r, b);
    }

    br = ngx_palloc(r->pool, sizeof(ngx_http_agent_branch_read_t));
    if (br == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    br->branch = b;
    br->id.len = id->len;
    br->id.data = ngx_pstrdup(r->pool, id);

    if (br->id.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_store_posted(r,
               ngx_http_agent_store_read(r->pool, id, 0, 0,
                                         ngx_http_agent_branch_stored, br));
}


static void
ngx_http_agent_branch_stored(ngx_http_agent_store_read_t *rd, ngx_int_t rc,
    void *data)
{
    ngx_http_agent_branch_read_t *br = data;

    ngx_uint_t                     i;
    ngx_connection_t              *c;
    ngx_http_request_t            *r;
    ngx_http_agent_branch_t       *b;
    ngx_http_agent_store_event_t  *ev;

    b = br->branch;
    r = b->request;
    c = r->connection;

    if (rc == NGX_OK
        && ngx_http_agent_branch_foreign(r, &rd->agent, &rd->owner))
    {
        b->foreign = 1;
        rc = NGX_DECLINED;
    }

    if (rc == NGX_OK) {
        ev = rd->events ? rd->events->elts : NULL;

        for (i = 0; ev && i < rd->events->nelts; i++) {
            if (ngx_http_agent_branch_add(b, ev[i].seq, ev[i].type,
                                          ev[i].data.data, ev[i].data.len)
                != NGX_OK)
            {
                rc = NGX_ERROR;
                break;
            }

            b->last = ev[i].seq;
        }
    }

    if (rc == NGX_OK) {
        (void) ngx_http_agent_branch_zone(r, &br->id, b);
    }

    ngx_http_finalize_request(r, ngx_http_agent_branch_decide(r, b));

    ngx_http_run_posted_requests(c);
}


/* the zone's events after those read, then the branch from all of them */

static ngx_int_t
ngx_http_agent_branch_zone(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_branch_t *b)
{
    ngx_int_t                    rc;
    ngx_str_t                   *owner;
    ngx_queue_t                 *q;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_event_t      *ev;
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    if (ngx_http_agent_api_owner(r, &owner) != NGX_OK) {
        return NGX_ERROR;
    }

    rc = NGX_OK;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, id);

    if (conv
        && ngx_http_agent_conv_bound_locked(conv, &alcf->agent->name, owner)
           != NGX_OK)
    {
        b->foreign = 1;
        conv = NULL;
    }

    for (q = conv ? ngx_queue_head(&conv->log) : NULL;
         q && q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_next(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->seq <= b->last) {
            continue;
        }

        if (ngx_http_agent_branch_add(b, ev->seq, ev->type, ev->data,
                                      ev->len)
            != NGX_OK)
        {
            rc = NGX_ERROR;
            break;
        }
    }

    ngx_http_agent_zone_unlock(z);

    if (rc != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_agent_branch_walk(r, b);
}


/*
 * The branch read is answered by the caller's decision, unless the
 * conversation is another agent's or owner's: then, as for every verb,
 * it does not exist.
 */

static ngx_int_t
ngx_http_agent_branch_decide(ngx_http_request_t *r,
    ngx_http_agent_branch_t *b)
{
    if (b->foreign) {
        return ngx_http_agent_api_foreign(r);
    }

    return b->decide(r, b->data);
}


/* the store's row of the conversation is another agent's or owner's */

static ngx_uint_t
ngx_http_agent_branch_foreign(ngx_http_request_t *r, ngx_str_t *agent,
    ngx_str_t *owner)
{
    ngx_str_t                  *mine;
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (agent->len == 0) {
        return 0;
    }

    if (agent->len != alcf->agent->name.len
        || ngx_memcmp(agent->data, alcf->agent->name.data, agent->len) != 0
        || ngx_http_agent_api_owner(r, &mine) != NGX_OK)
    {
        return 1;
    }

    return mine != NULL
           && (owner->len != mine->len
               || ngx_memcmp(owner->data, mine->data, owner->len) != 0);
}


/* the events a branch is made of: user messages, summaries, rewinds */

static ngx_int_t
ngx_http_agent_branch_add(ngx_http_agent_branch_t *b, uint64_t seq,
    ngx_uint_t type, u_char *data, size_t len)
{
    ngx_http_agent_store_event_t  *e;

    if (type != NGX_HTTP_AGENT_EV_USER_MSG
        && type != NGX_HTTP_AGENT_EV_SUMMARY
        && type != NGX_HTTP_AGENT_EV_REWIND)
    {
        return NGX_OK;
    }

    e = ngx_array_push(&b->events);
    if (e == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(e, sizeof(ngx_http_agent_store_event_t));

    e->seq = seq;
    e->type = type;
    e->data.len = len;
    e->data.data = ngx_pnalloc(b->events.pool, len);

    if (e->data.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(e->data.data, data, len);

    return NGX_OK;
}


/*
 * From the end: an event is of the branch unless a later rewind went to
 * before it (a rewind goes only to a seq of the branch then current, so
 * the lowest to_seq seen says it).
 */

static ngx_int_t
ngx_http_agent_branch_walk(ngx_http_request_t *r, ngx_http_agent_branch_t *b)
{
    char                           errbuf[NGX_HTTP_AGENT_JSON_ERR];
    uint64_t                       to;
    yajl_val                       v;
    ngx_int_t                      rc;
    ngx_uint_t                     i, n;
    ngx_http_agent_branch_turn_t  *t, tmp;
    ngx_http_agent_store_event_t  *ev;

    ev = b->events.elts;
    to = (uint64_t) -1;
    b->summary_to = 0;
    b->turn_seq = 0;

    for (i = b->events.nelts; i > 0; i--) {
        if (ev[i - 1].seq > to) {
            continue;
        }

        if (ev[i - 1].type == NGX_HTTP_AGENT_EV_SUMMARY && b->summary_to) {
            continue;
        }

        v = ngx_http_agent_json_parse(ev[i - 1].data.data,
                                      ev[i - 1].data.len,
                                      NGX_HTTP_AGENT_JSON_DEPTH, errbuf,
                                      sizeof(errbuf));
        if (v == NULL) {
            return NGX_ERROR;
        }

        rc = NGX_OK;

        switch (ev[i - 1].type) {

        case NGX_HTTP_AGENT_EV_REWIND:
            to = ngx_min(to, ngx_http_agent_branch_uint(
                                 ngx_http_agent_provider_get(v, "to_seq")));
            break;

        case NGX_HTTP_AGENT_EV_SUMMARY:
            b->summary_to = ngx_http_agent_branch_uint(
                                ngx_http_agent_provider_get(v, "to_seq"));
            break;

        default:
            if (b->turn_seq == 0) {
                b->turn_seq = ev[i - 1].seq;
            }

            t = ngx_array_push(&b->turns);

            if (t == NULL) {
                rc = NGX_ERROR;
                break;
            }

            t->seq = ev[i - 1].seq;
            rc = ngx_http_agent_branch_turn(r, v, t);
        }

        ngx_http_agent_json_free(v);

        if (rc != NGX_OK) {
            return NGX_ERROR;
        }
    }

    /* found newest first: in order */

    t = b->turns.elts;
    n = b->turns.nelts;

    for (i = 0; i < n / 2; i++) {
        tmp = t[i];
        t[i] = t[n - 1 - i];
        t[n - 1 - i] = tmp;
    }

    b->ready = 1;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_branch_turn(ngx_http_request_t *r, yajl_val ev,
    ngx_http_agent_branch_turn_t *t)
{
    ngx_str_t  s;

    t->turn = (ngx_uint_t) ngx_http_agent_branch_uint(
                               ngx_http_agent_provider_get(ev, "turn"));

    ngx_str_null(&t->content);
    ngx_str_null(&t->source_id);

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(ev, "content"), &s)
        == NGX_OK)
    {
        t->content.len = s.len;
        t->content.data = ngx_pstrdup(r->pool, &s);

        if (t->content.data == NULL) {
            return NGX_ERROR;
        }
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(ev, "source_id"), &s)
        == NGX_OK && s.len)
    {
        t->source_id.len = s.len;
        t->source_id.data = ngx_pstrdup(r->pool, &s);

        if (t->source_id.data == NULL) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static uint64_t
ngx_http_agent_branch_uint(yajl_val v)
{
    if (v == NULL || !YAJL_IS_INTEGER(v) || YAJL_GET_INTEGER(v) < 0) {
        return 0;
    }

    return (uint64_t) YAJL_GET_INTEGER(v);
}


ngx_int_t
ngx_http_agent_branch_find(ngx_http_agent_branch_t *b, uint64_t seq)
{
    ngx_uint_t                     i;
    ngx_http_agent_branch_turn_t  *t;

    t = b->turns.elts;

    for (i = 0; i < b->turns.nelts; i++) {
        if (t[i].seq == seq) {
            return i;
        }
    }

    return NGX_ERROR;
}


ngx_int_t
ngx_http_agent_branch_rewind(ngx_http_request_t *r,
    ngx_http_agent_branch_t *b, ngx_uint_t i, ngx_str_t *id,
    ngx_http_agent_message_t *msg)
{
    ngx_http_agent_branch_turn_t  *t;

    t = b->turns.elts;

    if (t[i].seq - 1 < b->summary_to) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT, "summarized",
                                         "the message is in the range of "
                                         "the conversation's summary: the "
                                         "context cannot go back before it");
    }

    msg->rewind = 1;
    msg->rewind_to = t[i].seq - 1;
    msg->turn_seq = b->turn_seq;

    if (ngx_http_agent_message_fields(r, msg) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_message_accept(r, id, msg);
}

ngx_int_t
ngx_http_agent_branch_message(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_message_t *msg, ngx_http_agent_chat_t *chat)
{
    ngx_int_t                      rc;
    ngx_http_agent_branch_chat_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_branch_chat_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->regenerate = chat->regenerate;
    ctx->edit = chat->edit;

    if (chat->anchor) {
        if (ngx_http_agent_branch_copy(r->pool,
                ngx_http_agent_provider_get(chat->anchor, "role"),
                &ctx->anchor_role)
            != NGX_OK
            || ngx_http_agent_branch_copy(r->pool,
                   ngx_http_agent_provider_get(chat->anchor, "id"),
                   &ctx->anchor_id)
               != NGX_OK)
        {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ctx->anchor = 1;
    }

    if (!ctx->regenerate && !ctx->edit) {
        rc = ngx_http_agent_branch_follows(r, id, msg, ctx);

        if (rc == NGX_AGAIN) {

            /* a conversation the store holds comes back first */

            switch (ngx_http_agent_revive(r, id)) {
            case NGX_DECLINED:
                rc = !ctx->anchor;
                break;
            case NGX_DONE:
                return NGX_DONE;
            case NGX_BUSY:
                return ngx_http_agent_store_busy_answer(r);
            default:
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }
        }

        if (rc) {
            return ngx_http_agent_message_accept(r, id, msg);
        }
    }

    /* the parsed strings go with the tree: the branch is read first */

    ctx->id = *id;
    ctx->msg = *msg;

    if (msg->source_id.len) {
        ctx->msg.source_id.data = ngx_pstrdup(r->pool, &msg->source_id);

        if (ctx->msg.source_id.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    if (msg->content.len) {
        ctx->msg.content.data = ngx_pstrdup(r->pool, &msg->content);

        if (ctx->msg.content.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return ngx_http_agent_branch_read(r, &ctx->id, &ctx->branch,
                                      ngx_http_agent_branch_chat, ctx);
}


/*
 * The chat follows the conversation's last turn (the message before the
 * new one is its reply), or both are new, or the chat sends its new
 * message alone (as a client whose server keeps the history may) and it
 * is not the last turn's sent again: the message is taken as ever.
 * NGX_AGAIN: the zone does not hold the conversation, the store may.
 */

static ngx_int_t
ngx_http_agent_branch_follows(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_message_t *msg, ngx_http_agent_branch_chat_t *ctx)
{
    uint32_t                     hash;
    ngx_int_t                    follows;
    ngx_uint_t                   i;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_source_t     *src;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    hash = msg->source_id.len
           ? ngx_crc32_short(msg->source_id.data, msg->source_id.len) : 0;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, id);

    if (conv == NULL && amcf->store) {
        follows = NGX_AGAIN;

    } else if (conv == NULL || conv->turn == 0) {
        follows = !ctx->anchor;

    } else if (!ctx->anchor) {
        follows = 1;

        for (i = 0; i < ngx_min(conv->nsources, NGX_HTTP_AGENT_SOURCE_IDS);
             i++)
        {
            src = &conv->sources[i];

            if (hash && src->hash == hash && src->turn == conv->turn) {
                follows = 0;
            }
        }

    } else {
        follows = (ngx_http_agent_branch_turn_of(ctx)
                   == (ngx_int_t) conv->turn);
    }

    ngx_http_agent_zone_unlock(z);

    return follows;
}


/*
 * The chat against the branch: the new message goes after the turn of
 * the message before it.  A regenerate makes that turn's next user
 * message again (the chat's last); a message sent again, as it was, is
 * not taken twice; any other goes after a rewind to before the turns
 * the chat left out.
 */

static ngx_int_t
ngx_http_agent_branch_chat(ngx_http_request_t *r, void *data)
{
    ngx_http_agent_branch_chat_t *ctx = data;

    ngx_int_t                      p, n;
    ngx_http_agent_message_t      *msg;
    ngx_http_agent_branch_turn_t  *t;

    msg = &ctx->msg;

    if (!ctx->branch.ready) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    t = ctx->branch.turns.elts;
    n = ctx->branch.turns.nelts;

    /* a conversation that has no message (any more): it starts anew */

    p = (n == 0 && !ctx->regenerate && !ctx->edit)
        ? 0 : ngx_http_agent_branch_anchor(ctx);

    if (p == NGX_ERROR) {
        return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT,
                                         "not_on_branch",
                                         "the chat's messages are not the "
                                         "conversation's: the message "
                                         "before the last is not of its "
                                         "current branch");
    }

    if (ctx->regenerate) {
        if (p == n || t[p].source_id.len != msg->source_id.len
            || ngx_strncmp(t[p].source_id.data, msg->source_id.data,
                           msg->source_id.len)
               != 0)
        {
            return ngx_http_agent_json_error(r, NGX_HTTP_CONFLICT,
                                             "not_on_branch",
                                             "the message to regenerate "
                                             "the reply of is not the "
                                             "conversation's");
        }

    } else if (p == n) {
        /* after the last turn: a new message, whatever its id */
        msg->fresh = 1;
        return ngx_http_agent_message_accept(r, &ctx->id, msg);

    } else if (!ctx->edit && p == n - 1
               && t[p].source_id.len && t[p].source_id.len
                                        == msg->source_id.len
               && ngx_strncmp(t[p].source_id.data, msg->source_id.data,
                              msg->source_id.len)
                  == 0
               && t[p].content.len == msg->content.len
               && ngx_strncmp(t[p].content.data, msg->content.data,
                              msg->content.len)
                  == 0)
    {
        /* the last message sent again: its turn is the answer */
        return ngx_http_agent_message_accept(r, &ctx->id, msg);
    }

    return ngx_http_agent_branch_rewind(r, &ctx->branch, p, &ctx->id, msg);
}


/*
 * The index in the branch of the first turn the chat does not hold
 * before its new message: after the turn of the message before it, 0
 * with none; NGX_ERROR: that message is not of the branch.
 */

static ngx_int_t
ngx_http_agent_branch_anchor(ngx_http_agent_branch_chat_t *ctx)
{
    ngx_int_t                      turn;
    ngx_uint_t                     i;
    ngx_http_agent_branch_turn_t  *t;

    t = ctx->branch.turns.elts;

    if (!ctx->anchor) {
        return ngx_http_agent_branch_alone(ctx);
    }

    if (ctx->anchor_role.len == sizeof("assistant") - 1
        && ngx_strncmp(ctx->anchor_role.data, "assistant", 9) == 0)
    {
        turn = ngx_http_agent_branch_turn_of(ctx);

        for (i = 0; turn > 0 && i < ctx->branch.turns.nelts; i++) {
            if (t[i].turn == (ngx_uint_t) turn) {
                return i + 1;
            }
        }

        return NGX_ERROR;
    }

    if (ctx->anchor_role.len == sizeof("user") - 1
        && ngx_strncmp(ctx->anchor_role.data, "user", 4) == 0
        && ctx->anchor_id.len)
    {
        /* the newest: an edit may have given a source id a new turn */

        for (i = ctx->branch.turns.nelts; i > 0; i--) {
            if (t[i - 1].source_id.len == ctx->anchor_id.len
                && ngx_strncmp(t[i - 1].source_id.data,
                               ctx->anchor_id.data, ctx->anchor_id.len)
                   == 0)
            {
                return i;
            }
        }
    }

    return NGX_ERROR;
}


/*
 * The turn of the chat's assistant message before the new one: its id
 * is "msg_T" (agent_aisdk) or "msg_T_N", a model call's (AG-UI);
 * NGX_ERROR for another id or another role.
 */

static ngx_int_t
ngx_http_agent_branch_turn_of(ngx_http_agent_branch_chat_t *ctx)
{
    size_t  len;

    if (ctx->anchor_role.len != sizeof("assistant") - 1
        || ngx_strncmp(ctx->anchor_role.data, "assistant", 9) != 0
        || ctx->anchor_id.len <= sizeof("msg_") - 1
        || ngx_strncmp(ctx->anchor_id.data, "msg_", 4) != 0)
    {
        return NGX_ERROR;
    }

    for (len = 4; len < ctx->anchor_id.len; len++) {
        if (ctx->anchor_id.data[len] == '_') {
            break;
        }
    }

    return ngx_atoi(ctx->anchor_id.data + 4, len - 4);
}


/*
 * A chat that sent its new message alone: a regenerate or an edit is of
 * the user message of the branch with its id (the newest); another
 * message is the last one sent again if it has that one's id, else new.
 */

static ngx_int_t
ngx_http_agent_branch_alone(ngx_http_agent_branch_chat_t *ctx)
{
    ngx_str_t                     *id;
    ngx_uint_t                     i, n;
    ngx_http_agent_branch_turn_t  *t;

    t = ctx->branch.turns.elts;
    n = ctx->branch.turns.nelts;
    id = &ctx->msg.source_id;

    for (i = n; id->len && i > 0; i--) {
        if (t[i - 1].source_id.len == id->len
            && ngx_strncmp(t[i - 1].source_id.data, id->data, id->len) == 0)
        {
            if (ctx->regenerate || ctx->edit || i == n) {
                return i - 1;
            }

            break;
        }
    }

    return (ctx->regenerate || ctx->edit) ? NGX_ERROR : (ngx_int_t) n;
}


/* a string member, copied (empty if it is none) */

static ngx_int_t
ngx_http_agent_branch_copy(ngx_pool_t *pool, yajl_val v, ngx_str_t *s)
{
    ngx_str_t  src;

    ngx_str_null(s);

    if (ngx_http_agent_provider_string(v, &src) != NGX_OK || src.len == 0) {
        return NGX_OK;
    }

    s->len = src.len;
    s->data = ngx_pstrdup(pool, &src);

    return s->data ? NGX_OK : NGX_ERROR;
}
