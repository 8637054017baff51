
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The thread as AG-UI messages, built from the log's events one by one
 * for MESSAGES_SNAPSHOT: a user message (its id the client's), a
 * reply's reasoning and assistant message (its id the reply's), which
 * the calls after it join, and a tool message per result (its id the
 * client's tool message's for a result the browser sent, else
 * "result_" and the call's).  The array is a generator's, written as
 * it is with what is open in it closed.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_agui_messages.h"


static void ngx_http_agent_agui_msgs_close(ngx_http_agent_agui_msgs_t *m);


ngx_int_t
ngx_http_agent_agui_msgs_init(ngx_http_agent_agui_msgs_t *m,
    ngx_pool_t *pool)
{
    m->g = ngx_http_agent_json_gen(pool);
    if (m->g == NULL) {
        return NGX_ERROR;
    }

    m->failed = yajl_gen_array_open(m->g);
    m->pool = pool;

    return ngx_array_init(&m->users, pool, 4, 2 * sizeof(uint64_t));
}


/*
 * A rewind to seq to: the messages from the first user message after it
 * on are a superseded branch.  The array is made again from what came
 * before them (a rewind goes to just before a user message, where
 * nothing is open).
 */

void
ngx_http_agent_agui_msgs_rewind(ngx_http_agent_agui_msgs_t *m, uint64_t to)
{
    size_t                len;
    uint64_t             *u;
    ngx_str_t             before;
    ngx_uint_t            i;
    const unsigned char  *json;

    u = m->users.elts;

    for (i = 0; i < m->users.nelts; i++) {
        if (u[2 * i] > to) {
            break;
        }
    }

    if (i == m->users.nelts || m->failed
        || yajl_gen_get_buf(m->g, &json, &len) != yajl_gen_status_ok)
    {
        return;
    }

    /* after the "[" */

    before.len = u[2 * i + 1] - 1;
    before.data = ngx_pnalloc(m->pool, before.len + 1);

    m->users.nelts = i;

    if (before.data == NULL) {
        m->failed = 1;
        return;
    }

    ngx_memcpy(before.data, json + 1, before.len);

    m->g = ngx_http_agent_json_gen(m->pool);

    if (m->g == NULL) {
        m->failed = 1;
        return;
    }

    m->failed |= yajl_gen_array_open(m->g);

    if (before.len) {
        m->failed |= ngx_http_agent_json_verbatim(m->g, &before);
    }

    m->assistant = 0;
    m->calls = 0;
    m->parent_len = 0;
    m->answer_call_len = 0;
}


/* the room the snapshot takes as it is */

size_t
ngx_http_agent_agui_msgs_size(ngx_http_agent_agui_msgs_t *m)
{
    size_t                len;
    const unsigned char  *json;

    if (yajl_gen_get_buf(m->g, &json, &len) != yajl_gen_status_ok) {
        return 0;
    }

    return len + sizeof("data: {\"type\":\"MESSAGES_SNAPSHOT\","
                        "\"messages\":]}]}\n\n");
}


void
ngx_http_agent_agui_msgs_answered(ngx_http_agent_agui_msgs_t *m, yajl_val root,
    ngx_str_t *id)
{
    ngx_str_t  s;

    m->answer_call_len = 0;

    if (ngx_http_agent_agui_get(root, "source_id", &s) != NGX_OK
        || s.len > sizeof(m->answer_id))
    {
        return;
    }

    ngx_memcpy(m->answer_call, id->data, id->len);
    m->answer_call_len = id->len;
    ngx_memcpy(m->answer_id, s.data, s.len);
    m->answer_id_len = s.len;
}


/* a result's message id: the client's tool message's, else the call's */

ngx_str_t *
ngx_http_agent_agui_msgs_result_id(ngx_http_agent_agui_msgs_t *m, u_char *buf,
    ngx_str_t *id, ngx_str_t *out)
{
    if (m->answer_call_len == id->len
        && ngx_strncmp(m->answer_call, id->data, id->len) == 0)
    {
        out->data = m->answer_id;
        out->len = m->answer_id_len;
        return out;
    }

    return ngx_http_agent_agui_id(buf, "result_", id, "", out);
}


/*
 * The conversation's messages so far, from the log, as the client is to
 * hold them: the generator's array with what is open in it closed.
 */

ngx_int_t
ngx_http_agent_agui_msgs_snapshot(ngx_http_agent_agui_msgs_t *m, ngx_buf_t *b)
{
    size_t                len;
    const unsigned char  *json;
    static u_char         head[] =
                              "data: {\"type\":\"MESSAGES_SNAPSHOT\","
                              "\"messages\":";

    if (m->failed
        || yajl_gen_get_buf(m->g, &json, &len) != yajl_gen_status_ok
        || (size_t) (b->end - b->last) < sizeof(head) - 1 + len + 6)
    {
        return NGX_ERROR;
    }

    b->last = ngx_cpymem(b->last, head, sizeof(head) - 1);
    b->last = ngx_cpymem(b->last, json, len);

    if (m->calls) {
        *b->last++ = ']';
    }

    if (m->assistant) {
        *b->last++ = '}';
    }

    *b->last++ = ']';
    *b->last++ = '}';
    *b->last++ = LF;
    *b->last++ = LF;

    return NGX_OK;
}


static void
ngx_http_agent_agui_msgs_close(ngx_http_agent_agui_msgs_t *m)
{
    if (m->calls) {
        m->failed |= yajl_gen_array_close(m->g);
        m->calls = 0;
    }

    if (m->assistant) {
        m->failed |= yajl_gen_map_close(m->g);
        m->assistant = 0;
    }
}


/* a user message's id is the client's (its source_id), else its seq's */

void
ngx_http_agent_agui_msgs_user(ngx_http_agent_agui_msgs_t *m, uint64_t seq,
    yajl_val root)
{
    u_char                buf[NGX_INT64_LEN + sizeof("user_")];
    size_t                len;
    uint64_t             *u;
    ngx_str_t             id, content;
    yajl_gen              g;
    const unsigned char  *json;

    ngx_http_agent_agui_msgs_close(m);

    u = ngx_array_push(&m->users);

    if (u == NULL
        || yajl_gen_get_buf(m->g, &json, &len) != yajl_gen_status_ok)
    {
        m->failed = 1;
        return;
    }

    u[0] = seq;
    u[1] = len;

    if (ngx_http_agent_agui_get(root, "source_id", &id) != NGX_OK) {
        id.data = buf;
        id.len = ngx_sprintf(buf, "user_%uL", seq) - buf;
    }

    if (ngx_http_agent_agui_get(root, "content", &content) != NGX_OK) {
        ngx_str_null(&content);
    }

    g = m->g;

    m->failed |= yajl_gen_map_open(g);
    m->failed |= ngx_http_agent_json_key(g, "id");
    m->failed |= ngx_http_agent_json_str(g, &id);
    m->failed |= ngx_http_agent_json_key(g, "role");
    m->failed |= yajl_gen_string(g, (u_char *) "user", 4);
    m->failed |= ngx_http_agent_json_key(g, "content");
    m->failed |= ngx_http_agent_json_str(g, &content);
    m->failed |= yajl_gen_map_close(g);
}


/* its reasoning, then the assistant message, open for its tool calls */

void
ngx_http_agent_agui_msgs_assistant(ngx_http_agent_agui_msgs_t *m, yajl_val root)
{
    u_char     buf[NGX_HTTP_AGENT_AGUI_ID_LEN + 16];
    ngx_str_t  mid, id, s;
    yajl_gen   g;

    ngx_http_agent_agui_msgs_close(m);

    if (ngx_http_agent_agui_get(root, "message_id", &mid) != NGX_OK) {
        ngx_str_set(&mid, "msg");
    }

    mid.len = ngx_min(mid.len, NGX_HTTP_AGENT_AGUI_ID_LEN - 8);

    m->parent_len = mid.len;
    ngx_memcpy(m->parent, mid.data, mid.len);

    g = m->g;

    if (ngx_http_agent_agui_get(root, "thinking", &s) == NGX_OK && s.len) {
        m->failed |= yajl_gen_map_open(g);
        m->failed |= ngx_http_agent_json_key(g, "id");
        m->failed |= ngx_http_agent_json_str(g,
                              ngx_http_agent_agui_id(buf, "", &mid, "_r",
                                                     &id));
        m->failed |= ngx_http_agent_json_key(g, "role");
        m->failed |= yajl_gen_string(g, (u_char *) "reasoning", 9);
        m->failed |= ngx_http_agent_json_key(g, "content");
        m->failed |= ngx_http_agent_json_str(g, &s);
        m->failed |= yajl_gen_map_close(g);
    }

    m->failed |= yajl_gen_map_open(g);
    m->failed |= ngx_http_agent_json_key(g, "id");
    m->failed |= ngx_http_agent_json_str(g, &mid);
    m->failed |= ngx_http_agent_json_key(g, "role");
    m->failed |= yajl_gen_string(g, (u_char *) "assistant", 9);

    if (ngx_http_agent_agui_get(root, "content", &s) == NGX_OK && s.len) {
        m->failed |= ngx_http_agent_json_key(g, "content");
        m->failed |= ngx_http_agent_json_str(g, &s);
    }

    m->assistant = 1;
}


/* a call joins the assistant message before it, or one of its own */

void
ngx_http_agent_agui_msgs_call(ngx_http_agent_agui_msgs_t *m, ngx_str_t *id,
    ngx_str_t *name, ngx_str_t *args)
{
    yajl_gen  g;

    g = m->g;

    if (!m->assistant) {
        m->failed |= yajl_gen_map_open(g);
        m->failed |= ngx_http_agent_json_key(g, "id");
        m->failed |= ngx_http_agent_json_str(g, id);
        m->failed |= ngx_http_agent_json_key(g, "role");
        m->failed |= yajl_gen_string(g, (u_char *) "assistant", 9);
        m->assistant = 1;
    }

    if (!m->calls) {
        m->failed |= ngx_http_agent_json_key(g, "toolCalls");
        m->failed |= yajl_gen_array_open(g);
        m->calls = 1;
    }

    m->failed |= yajl_gen_map_open(g);
    m->failed |= ngx_http_agent_json_key(g, "id");
    m->failed |= ngx_http_agent_json_str(g, id);
    m->failed |= ngx_http_agent_json_key(g, "type");
    m->failed |= yajl_gen_string(g, (u_char *) "function", 8);
    m->failed |= ngx_http_agent_json_key(g, "function");
    m->failed |= yajl_gen_map_open(g);
    m->failed |= ngx_http_agent_json_key(g, "name");
    m->failed |= ngx_http_agent_json_str(g, name);
    m->failed |= ngx_http_agent_json_key(g, "arguments");
    m->failed |= ngx_http_agent_json_str(g, args);
    m->failed |= yajl_gen_map_close(g);
    m->failed |= yajl_gen_map_close(g);
}


void
ngx_http_agent_agui_msgs_result(ngx_http_agent_agui_msgs_t *m, ngx_str_t *id,
    ngx_str_t *content, ngx_uint_t ok)
{
    u_char     buf[NGX_HTTP_AGENT_AGUI_ID_LEN + 16];
    ngx_str_t  mid;
    yajl_gen   g;

    ngx_http_agent_agui_msgs_close(m);

    g = m->g;

    m->failed |= yajl_gen_map_open(g);
    m->failed |= ngx_http_agent_json_key(g, "id");
    m->failed |= ngx_http_agent_json_str(g,
                          ngx_http_agent_agui_msgs_result_id(m, buf, id, &mid));
    m->failed |= ngx_http_agent_json_key(g, "role");
    m->failed |= yajl_gen_string(g, (u_char *) "tool", 4);
    m->failed |= ngx_http_agent_json_key(g, "toolCallId");
    m->failed |= ngx_http_agent_json_str(g, id);
    m->failed |= ngx_http_agent_json_key(g, "content");
    m->failed |= ngx_http_agent_json_str(g, content);

    if (!ok) {
        m->failed |= ngx_http_agent_json_key(g, "error");
        m->failed |= ngx_http_agent_json_str(g, content);
    }

    m->failed |= yajl_gen_map_close(g);
}


ngx_str_t *
ngx_http_agent_agui_id(u_char *buf, char *prefix, ngx_str_t *id,
    char *suffix, ngx_str_t *out)
{
    out->data = buf;
    out->len = ngx_sprintf(buf, "%s%*s%s", prefix,
                           ngx_min(id->len, NGX_HTTP_AGENT_AGUI_ID_LEN),
                           id->data, suffix)
               - buf;

    return out;
}


ngx_int_t
ngx_http_agent_agui_get(yajl_val root, char *key, ngx_str_t *s)
{
    return ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(root, key), s);
}


/* the result of the call is the client's tool message: it has it */

ngx_uint_t
ngx_http_agent_agui_msgs_client(ngx_http_agent_agui_msgs_t *m, ngx_str_t *id)
{
    return m->answer_call_len == id->len
           && ngx_strncmp(m->answer_call, id->data, id->len) == 0;
}
