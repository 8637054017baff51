
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * JSON-RPC to an MCP server over Streamable HTTP, from a turn: every
 * message is a POST subrequest to the server's location, with Accept
 * for both JSON and SSE answers, the session and the protocol revision
 * in headers.  The session lives in the zone, so that any worker goes
 * on with it; none there, the request initializes one first
 * (initialize, then notifications/initialized); a 404 to a request that
 * carried a session means the server forgot it: a new one is made, once.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_mcp_rpc.h"
#include "ngx_http_agent_notify.h"
#include "ngx_http_agent_detached.h"
#include "ngx_http_agent_tools.h"


#define NGX_HTTP_AGENT_MCP_INIT         0
#define NGX_HTTP_AGENT_MCP_INITIALIZED  1
#define NGX_HTTP_AGENT_MCP_REQUEST      2


static ngx_int_t ngx_http_agent_mcp_rpc_send(ngx_http_agent_mcp_rpc_t *rpc);
static ngx_int_t ngx_http_agent_mcp_rpc_ended(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static void ngx_http_agent_mcp_rpc_next(ngx_event_t *ev);
static void ngx_http_agent_mcp_rpc_expire(ngx_event_t *ev);
static void ngx_http_agent_mcp_rpc_step(ngx_http_agent_mcp_rpc_t *rpc);
static void ngx_http_agent_mcp_rpc_initialized(ngx_http_agent_mcp_rpc_t *rpc);
static void ngx_http_agent_mcp_rpc_finish(ngx_http_agent_mcp_rpc_t *rpc,
    char *failure);
static ngx_int_t ngx_http_agent_mcp_rpc_event(void *ctx, ngx_str_t *event,
    ngx_str_t *data);
static ngx_uint_t ngx_http_agent_mcp_rpc_message(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val v);
static void ngx_http_agent_mcp_rpc_json(ngx_http_agent_mcp_rpc_t *rpc);
static void ngx_http_agent_mcp_rpc_cleanup(void *data);
static void ngx_http_agent_mcp_rpc_replied(ngx_http_agent_mcp_rpc_t *rpc);
static ngx_uint_t ngx_http_agent_mcp_rpc_headers(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_keyval_t *headers);


static ngx_str_t  ngx_http_agent_mcp_initialize = ngx_string(
    "{\"jsonrpc\":\"2.0\",\"id\":\"initialize\",\"method\":\"initialize\","
    "\"params\":{\"protocolVersion\":\"" NGX_HTTP_AGENT_MCP_VERSION "\","
    "\"capabilities\":{\"elicitation\":{}},\"clientInfo\":"
    "{\"name\":\"ngx_http_agent_module\",\"version\":\"1\"}}}");

static ngx_str_t  ngx_http_agent_mcp_session_header =
    ngx_string("Mcp-Session-Id");

static ngx_str_t  ngx_http_agent_mcp_initialize_id =
    ngx_string("initialize");

static ngx_str_t  ngx_http_agent_mcp_notify_initialized = ngx_string(
    "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");


ngx_int_t
ngx_http_agent_mcp_rpc_init(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_http_agent_turn_t *t, ngx_http_agent_mcp_t *server, ngx_pool_t *pool)
{
    ngx_pool_cleanup_t  *cln;

    ngx_memzero(rpc, sizeof(ngx_http_agent_mcp_rpc_t));

    rpc->sub.kind = NGX_HTTP_AGENT_SUB_MCP;
    rpc->turn = t;
    rpc->server = server;
    rpc->pool = pool;

    rpc->event.handler = ngx_http_agent_mcp_rpc_next;
    rpc->event.data = rpc;
    rpc->event.log = &t->log;

    rpc->deadline.handler = ngx_http_agent_mcp_rpc_expire;
    rpc->deadline.data = rpc;
    rpc->deadline.log = &t->log;
    rpc->left = server->rpc_timeout;

    /* the pool goes with the turn: nothing of the request may outlive it */

    cln = ngx_pool_cleanup_add(pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_agent_mcp_rpc_cleanup;
    cln->data = rpc;

    return NGX_OK;
}


static void
ngx_http_agent_mcp_rpc_cleanup(void *data)
{
    ngx_http_agent_mcp_rpc_t  *rpc = data;

    if (rpc->event.posted) {
        ngx_delete_posted_event(&rpc->event);
    }

    if (rpc->deadline.timer_set) {
        ngx_del_timer(&rpc->deadline);
    }

    ngx_http_agent_mcp_rpc_free(rpc);
}


void
ngx_http_agent_mcp_rpc_free(ngx_http_agent_mcp_rpc_t *rpc)
{
    if (rpc->answer_tree) {
        ngx_http_agent_json_free(rpc->answer_tree);
        rpc->answer_tree = NULL;
        rpc->answer = NULL;
    }
}


/* the request, after a session is made if the zone holds none */

ngx_int_t
ngx_http_agent_mcp_rpc_start(ngx_http_agent_mcp_rpc_t *rpc)
{
    u_char                   *p;
    ngx_uint_t                known;
    ngx_http_agent_zone_t    *z;
    ngx_http_agent_mcp_sh_t  *m;

    z = rpc->turn->zone;

    rpc->session.len = 0;
    rpc->version.len = 0;
    known = 0;

    p = ngx_pnalloc(rpc->pool, NGX_HTTP_AGENT_MCP_SESSION_MAX
                               + NGX_HTTP_AGENT_MCP_VERSION_MAX);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_http_agent_zone_lock(z);

    m = ngx_http_agent_mcp_find_locked(z, &rpc->server->name, 0);

    if (m && m->version_len) {
        known = 1;

        rpc->session.data = p;
        rpc->session.len = m->session_len;
        ngx_memcpy(p, m->session, m->session_len);

        rpc->version.data = p + NGX_HTTP_AGENT_MCP_SESSION_MAX;
        rpc->version.len = m->version_len;
        ngx_memcpy(rpc->version.data, m->version, m->version_len);
    }

    ngx_http_agent_zone_unlock(z);

    rpc->step = known ? NGX_HTTP_AGENT_MCP_REQUEST : NGX_HTTP_AGENT_MCP_INIT;

    /* a list's next page goes on with the time its first pages left */
    ngx_http_agent_mcp_rpc_clock(rpc, 1);

    if (ngx_http_agent_mcp_rpc_send(rpc) != NGX_OK) {
        ngx_http_agent_mcp_rpc_clock(rpc, 0);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The time of an exchange runs while it waits for the server, and stops
 * while the server waits for a person (its question)
 */

void
ngx_http_agent_mcp_rpc_clock(ngx_http_agent_mcp_rpc_t *rpc, ngx_uint_t run)
{
    ngx_msec_t  spent;

    if (run) {
        if (!rpc->deadline.timer_set && !rpc->expired) {
            rpc->since = ngx_current_msec;
            ngx_add_timer(&rpc->deadline, rpc->left ? rpc->left : 1);
        }

        return;
    }

    if (rpc->deadline.timer_set) {
        spent = ngx_current_msec - rpc->since;
        rpc->left = (spent < rpc->left) ? rpc->left - spent : 1;
        ngx_del_timer(&rpc->deadline);
    }
}


/*
 * Past rpc_timeout: a stream kept open by keep-alive comments, or one
 * that never ends, is aborted (its connection closes) and the request
 * ends as one the server did not answer, from the posted event
 */

static void
ngx_http_agent_mcp_rpc_expire(ngx_event_t *ev)
{
    ngx_http_agent_mcp_rpc_t  *rpc = ev->data;

    ngx_str_t  what;

    if (rpc->call && rpc->call->done) {
        return;
    }

    what = rpc->method;

    if (what.len == 0) {
        ngx_str_set(&what, "an answer");
    }

    ngx_log_error(NGX_LOG_ERR, &rpc->turn->log, 0,
                  "agent mcp \"%V\": %V took longer than rpc_timeout "
                  "(%M ms)", &rpc->server->name, &what,
                  rpc->server->rpc_timeout);

    rpc->expired = 1;
    rpc->left = 0;

    if (rpc->sub.sr == NULL) {
        /* it ended meanwhile: its end, posted, finds it expired */
        return;
    }

    ngx_http_agent_tools_abort(rpc->sub.sr);

    rpc->sub.sr = NULL;

    if (rpc->call) {
        rpc->call->sub.sr = NULL;
    }

    ngx_post_event(&rpc->event, &ngx_posted_events);
}


static ngx_int_t
ngx_http_agent_mcp_rpc_send(ngx_http_agent_mcp_rpc_t *rpc)
{
    u_char        *p;
    ngx_str_t      body;
    ngx_int_t      rc;
    ngx_uint_t     n, i;
    ngx_keyval_t   headers[8];

    n = ngx_http_agent_mcp_rpc_headers(rpc, headers);

    switch (rpc->step) {

    case NGX_HTTP_AGENT_MCP_INIT:
        body = ngx_http_agent_mcp_initialize;
        break;

    case NGX_HTTP_AGENT_MCP_INITIALIZED:
        body = ngx_http_agent_mcp_notify_initialized;
        break;

    default:
        for (i = 0; i < rpc->nheaders && n < 8; i++) {
            headers[n++] = rpc->headers[i];
        }

        if (rpc->raw.len) {
            body = rpc->raw;
            break;
        }

        p = ngx_pnalloc(rpc->pool, sizeof("{\"jsonrpc\":\"2.0\",\"id\":,"
                                          "\"method\":\"\",\"params\":}")
                                   + rpc->id.len + rpc->method.len
                                   + rpc->params.len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        body.data = p;

        p = ngx_sprintf(p, "{\"jsonrpc\":\"2.0\",\"id\":%V,\"method\":\"%V\"",
                        &rpc->id, &rpc->method);

        if (rpc->params.len) {
            p = ngx_sprintf(p, ",\"params\":%V", &rpc->params);
        }

        *p++ = '}';

        body.len = p - body.data;
    }

    rpc->status = 0;
    rpc->new_session.len = 0;
    rpc->body.len = 0;
    rpc->sse = NULL;
    rpc->is_sse = 0;
    rpc->too_large = 0;
    rpc->finished = 0;
    rpc->complete = 0;

    ngx_http_agent_mcp_rpc_free(rpc);

    rc = ngx_http_agent_turn_subrequest(rpc->turn, &rpc->sub,
                                        &rpc->server->location, &body,
                                        headers, n,
                                        ngx_http_agent_mcp_rpc_ended, rpc);

    if (rpc->call) {
        rpc->call->sub.sr = rpc->sub.sr;
    }

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, &rpc->turn->log, 0,
                   "agent mcp \"%V\": step %ui, \"%V\": %i",
                   &rpc->server->name, rpc->step, &rpc->method, rc);

    return rc;
}


ngx_int_t
ngx_http_agent_mcp_rpc_header(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub)
{
    ngx_http_agent_mcp_rpc_t *rpc = (ngx_http_agent_mcp_rpc_t *) sub;

    ngx_str_t  *session;

    rpc->status = r->headers_out.status;

    if (r->headers_out.content_type.len >= sizeof("text/event-stream") - 1
        && ngx_strncasecmp(r->headers_out.content_type.data,
                           (u_char *) "text/event-stream",
                           sizeof("text/event-stream") - 1)
           == 0)
    {
        rpc->is_sse = 1;

        rpc->sse = ngx_http_agent_sse_create(rpc->pool, &rpc->turn->log,
                                             ngx_http_agent_mcp_rpc_event,
                                             rpc);
        if (rpc->sse == NULL) {
            return NGX_ERROR;
        }
    }

    session = ngx_http_agent_mcp_header(&r->headers_out.headers,
                                        &ngx_http_agent_mcp_session_header);

    if (session) {
        rpc->new_session.data = ngx_pstrdup(rpc->pool, session);
        if (rpc->new_session.data == NULL) {
            return NGX_ERROR;
        }

        rpc->new_session.len = session->len;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_mcp_rpc_body(ngx_http_request_t *r, ngx_http_agent_sub_t *sub,
    ngx_chain_t *in)
{
    ngx_http_agent_mcp_rpc_t *rpc = (ngx_http_agent_mcp_rpc_t *) sub;

    size_t        n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (b->last_buf || b->last_in_chain) {
            rpc->complete = 1;
        }

        if (!ngx_buf_in_memory(b)) {
            if (ngx_buf_size(b)) {
                rpc->too_large = 1;
                b->file_pos = b->file_last;
            }

            continue;
        }

        n = b->last - b->pos;

        if (n == 0 || rpc->too_large || rpc->finished) {
            b->pos = b->last;
            continue;
        }

        if (rpc->is_sse
            && rpc->status >= NGX_HTTP_OK
            && rpc->status < NGX_HTTP_SPECIAL_RESPONSE)
        {
            if (ngx_http_agent_sse_feed(rpc->sse, b->pos, b->last)
                != NGX_OK)
            {
                rpc->too_large = 1;
            }

            b->pos = b->last;
            continue;
        }

        if (n > NGX_HTTP_AGENT_MCP_LIST_MAX - rpc->body.len) {
            rpc->too_large = 1;
            b->pos = b->last;
            continue;
        }

        if (ngx_http_agent_bytes_append(rpc->pool, &rpc->body, b->pos, n)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        b->pos = b->last;
    }

    return NGX_OK;
}


/* one SSE event: a JSON-RPC message */

static ngx_int_t
ngx_http_agent_mcp_rpc_event(void *ctx, ngx_str_t *event, ngx_str_t *data)
{
    ngx_http_agent_mcp_rpc_t *rpc = ctx;

    char      err[NGX_HTTP_AGENT_JSON_ERR];
    yajl_val  v;

    if (data->len == 0) {
        return NGX_OK;
    }

    v = ngx_http_agent_json_parse(data->data, data->len,
                                  NGX_HTTP_AGENT_JSON_DEPTH, err,
                                  sizeof(err));
    if (v == NULL) {
        ngx_log_error(NGX_LOG_ERR, &rpc->turn->log, 0,
                      "agent mcp \"%V\" sent an event that %s",
                      &rpc->server->name, err);
        return NGX_OK;
    }

    if (ngx_http_agent_mcp_rpc_message(rpc, v)) {
        rpc->answer_tree = v;

    } else {
        ngx_http_agent_json_free(v);
    }

    return NGX_OK;
}


/*
 * The answer to our request is kept (1: the caller keeps its tree); a
 * notification is passed on.
 */

static ngx_uint_t
ngx_http_agent_mcp_rpc_message(ngx_http_agent_mcp_rpc_t *rpc, yajl_val v)
{
    yajl_val     id, method;
    ngx_str_t    want;

    if (!YAJL_IS_OBJECT(v)) {
        return 0;
    }

    id = ngx_http_agent_provider_get(v, "id");
    method = ngx_http_agent_provider_get(v, "method");

    if (method == NULL && YAJL_IS_STRING(id) && rpc->answer == NULL) {

        want = (rpc->step == NGX_HTTP_AGENT_MCP_REQUEST)
               ? rpc->key : ngx_http_agent_mcp_initialize_id;

        if (want.len == ngx_strlen(id->u.string)
            && ngx_strncmp(want.data, id->u.string, want.len) == 0)
        {
            rpc->answer = v;
            return 1;
        }
    }

    if (YAJL_IS_STRING(method) && id == NULL && rpc->notify) {
        rpc->notify(rpc, v);

    } else if (YAJL_IS_STRING(method) && id && rpc->request) {
        rpc->request(rpc, v);

    } else if (YAJL_IS_STRING(method)) {
        ngx_log_error(NGX_LOG_WARN, &rpc->turn->log, 0,
                      "agent mcp \"%V\" sent a request \"%s\" that is not "
                      "supported", &rpc->server->name, method->u.string);
    }

    return 0;
}


/* a JSON answer: one message, or a batch of them */

static void
ngx_http_agent_mcp_rpc_json(ngx_http_agent_mcp_rpc_t *rpc)
{
    char        err[NGX_HTTP_AGENT_JSON_ERR];
    size_t      i;
    yajl_val    v;
    ngx_uint_t  kept;

    if (rpc->body.len == 0
        || ngx_http_agent_bytes_append(rpc->pool, &rpc->body,
                                       (u_char *) "", 1)
           != NGX_OK)
    {
        return;
    }

    v = ngx_http_agent_json_parse(rpc->body.data, rpc->body.len - 1,
                                  NGX_HTTP_AGENT_JSON_DEPTH, err,
                                  sizeof(err));
    if (v == NULL) {
        ngx_log_error(NGX_LOG_ERR, &rpc->turn->log, 0,
                      "agent mcp \"%V\" answered JSON that %s",
                      &rpc->server->name, err);
        return;
    }

    kept = 0;

    if (!YAJL_IS_ARRAY(v)) {
        kept = ngx_http_agent_mcp_rpc_message(rpc, v);

    } else {
        for (i = 0; i < v->u.array.len; i++) {
            kept |= ngx_http_agent_mcp_rpc_message(rpc,
                                                   v->u.array.values[i]);
        }
    }

    if (kept) {
        rpc->answer_tree = v;

    } else {
        ngx_http_agent_json_free(v);
    }
}


/* what every message of ours carries: at most 3 headers */

static ngx_uint_t
ngx_http_agent_mcp_rpc_headers(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_keyval_t *headers)
{
    ngx_uint_t  n;

    ngx_str_set(&headers[0].key, "Accept");
    ngx_str_set(&headers[0].value, "application/json, text/event-stream");
    n = 1;

    if (rpc->session.len) {
        ngx_str_set(&headers[n].key, "Mcp-Session-Id");
        headers[n++].value = rpc->session;
    }

    if (rpc->version.len) {
        ngx_str_set(&headers[n].key, "MCP-Protocol-Version");
        headers[n++].value = rpc->version;
    }

    return n;
}


/* the subrequest ended: go on from a posted event */

static ngx_int_t
ngx_http_agent_mcp_rpc_ended(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_agent_mcp_rpc_t  *rpc = data;

    if (rpc->expired) {
        /* aborted, or it ended after all: its end is posted already */
        return ngx_http_agent_detached_rc(rc);
    }

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE && rpc->status == 0) {
        rpc->status = rc;
    }

    if (rc == NGX_ERROR) {
        rpc->status = 0;
    }

    rpc->sub.sr = NULL;

    if (rpc->call) {
        rpc->call->sub.sr = NULL;
    }

    ngx_post_event(&rpc->event, &ngx_posted_events);

    return ngx_http_agent_detached_rc(rc);
}


static void
ngx_http_agent_mcp_rpc_next(ngx_event_t *ev)
{
    ngx_http_agent_mcp_rpc_t  *rpc = ev->data;

    ngx_connection_t  *c;

    if (rpc->call && rpc->call->done) {
        /* cancelled meanwhile */
        return;
    }

    c = rpc->turn->request->connection;

    ngx_http_agent_mcp_rpc_step(rpc);

    /* the subrequest of the next step, if any, starts now */
    ngx_http_run_posted_requests(c);
}


static void
ngx_http_agent_mcp_rpc_step(ngx_http_agent_mcp_rpc_t *rpc)
{
    u_char                    *p;
    ngx_http_agent_zone_t     *z;
    ngx_http_agent_mcp_sh_t   *m;

    if (rpc->expired) {
        /* it may still be working on it: it is told to stop */
        ngx_http_agent_mcp_rpc_cancelled(rpc, "the request timed out");
        ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server took longer "
                                           "than rpc_timeout");
        return;
    }

    if (!rpc->is_sse) {
        ngx_http_agent_mcp_rpc_json(rpc);
    }

    if (rpc->status == NGX_HTTP_NOT_FOUND && rpc->session.len
        && !rpc->reinit)
    {
        /* the server forgot the session: a new one, once */

        ngx_log_error(NGX_LOG_INFO, &rpc->turn->log, 0,
                      "agent mcp \"%V\": session \"%V\" is gone, "
                      "initializing a new one",
                      &rpc->server->name, &rpc->session);

        z = rpc->turn->zone;

        ngx_http_agent_zone_lock(z);

        m = ngx_http_agent_mcp_find_locked(z, &rpc->server->name, 0);

        if (m && m->session_len == rpc->session.len
            && ngx_strncmp(m->session, rpc->session.data, m->session_len)
               == 0)
        {
            m->session_len = 0;
            m->version_len = 0;
        }

        ngx_http_agent_zone_unlock(z);

        rpc->reinit = 1;
        rpc->session.len = 0;
        rpc->version.len = 0;
        rpc->step = NGX_HTTP_AGENT_MCP_INIT;

        if (ngx_http_agent_mcp_rpc_send(rpc) != NGX_OK) {
            ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server cannot be "
                                               "reached");
        }

        return;
    }

    if (rpc->status < NGX_HTTP_OK
        || rpc->status >= NGX_HTTP_SPECIAL_RESPONSE)
    {
        p = ngx_pnalloc(rpc->pool, 64);
        if (p == NULL) {
            ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server failed");
            return;
        }

        if (rpc->status == 0 || rpc->status == NGX_HTTP_GATEWAY_TIME_OUT) {
            /* it may still be working on it: it is told to stop */
            ngx_http_agent_mcp_rpc_cancelled(rpc, "the request timed out");
        }

        if (rpc->status == 0) {
            ngx_sprintf(p, "the MCP server did not answer%Z");

        } else {
            ngx_sprintf(p, "the MCP server answered %ui%Z", rpc->status);
        }

        ngx_http_agent_mcp_rpc_finish(rpc, (char *) p);
        return;
    }

    if (!rpc->complete && rpc->answer == NULL) {
        /*
         * a stream cut before the answer (proxy_read_timeout): the
         * upstream ends it as if it were whole
         */
        ngx_http_agent_mcp_rpc_cancelled(rpc, "the answer was cut off");
        ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server's answer was "
                                           "cut off");
        return;
    }

    switch (rpc->step) {

    case NGX_HTTP_AGENT_MCP_INIT:
        ngx_http_agent_mcp_rpc_initialized(rpc);
        return;

    case NGX_HTTP_AGENT_MCP_INITIALIZED:
        rpc->step = NGX_HTTP_AGENT_MCP_REQUEST;

        if (ngx_http_agent_mcp_rpc_send(rpc) != NGX_OK) {
            ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server cannot be "
                                               "reached");
        }

        return;

    default:
        if (rpc->too_large) {
            ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server's answer is "
                                               "too large or not readable");

        } else if (rpc->answer == NULL) {
            ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server ended its "
                                               "answer without a result");

        } else {
            ngx_http_agent_mcp_rpc_finish(rpc, NULL);
        }
    }
}


/* initialize answered: its session and revision go to the zone */

static void
ngx_http_agent_mcp_rpc_initialized(ngx_http_agent_mcp_rpc_t *rpc)
{
    yajl_val                  result, version;
    ngx_str_t                 v;
    ngx_http_agent_zone_t    *z;
    ngx_http_agent_mcp_sh_t  *m;

    result = rpc->answer ? ngx_http_agent_provider_get(rpc->answer, "result")
                         : NULL;
    version = result ? ngx_http_agent_provider_get(result, "protocolVersion")
                     : NULL;

    if (!YAJL_IS_STRING(version)) {
        ngx_log_error(NGX_LOG_ERR, &rpc->turn->log, 0,
                      "agent mcp \"%V\" did not answer initialize",
                      &rpc->server->name);
        ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server cannot be "
                                           "initialized");
        return;
    }

    v.data = (u_char *) version->u.string;
    v.len = ngx_strlen(v.data);

    if (ngx_http_agent_mcp_session_valid(&v) != NGX_OK
        || v.len > NGX_HTTP_AGENT_MCP_VERSION_MAX
        || (rpc->new_session.len
            && ngx_http_agent_mcp_session_valid(&rpc->new_session) != NGX_OK))
    {
        ngx_log_error(NGX_LOG_ERR, &rpc->turn->log, 0,
                      "agent mcp \"%V\" answered initialize with an "
                      "invalid session id or protocol version",
                      &rpc->server->name);
        ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server cannot be "
                                           "initialized");
        return;
    }

    rpc->version.data = ngx_pstrdup(rpc->pool, &v);
    if (rpc->version.data == NULL) {
        ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server failed");
        return;
    }

    rpc->version.len = v.len;
    rpc->session = rpc->new_session;

    z = rpc->turn->zone;

    ngx_http_agent_zone_lock(z);

    m = ngx_http_agent_mcp_find_locked(z, &rpc->server->name, 1);

    if (m) {
        ngx_http_agent_mcp_session_locked(m, &rpc->session, &rpc->version);
    }

    ngx_http_agent_zone_unlock(z);

    ngx_log_error(NGX_LOG_INFO, &rpc->turn->log, 0,
                  "agent mcp \"%V\": session \"%V\", protocol %V",
                  &rpc->server->name, &rpc->session, &rpc->version);

    rpc->step = NGX_HTTP_AGENT_MCP_INITIALIZED;

    if (ngx_http_agent_mcp_rpc_send(rpc) != NGX_OK) {
        ngx_http_agent_mcp_rpc_finish(rpc, "the MCP server cannot be "
                                           "reached");
    }
}


static void
ngx_http_agent_mcp_rpc_finish(ngx_http_agent_mcp_rpc_t *rpc, char *failure)
{
    rpc->failure = failure;
    rpc->finished = 1;

    ngx_http_agent_mcp_rpc_clock(rpc, 0);

    rpc->done(rpc);

    ngx_http_agent_mcp_rpc_free(rpc);
}


/*
 * A message of ours in the request's session, while the request runs:
 * the answer to a request of the server.  It counts as a running call
 * of the turn, so that the batch does not end under it.
 */

ngx_int_t
ngx_http_agent_mcp_rpc_reply(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_str_t *message)
{
    ngx_http_agent_mcp_rpc_t  *reply;

    reply = ngx_palloc(rpc->pool, sizeof(ngx_http_agent_mcp_rpc_t));
    if (reply == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_mcp_rpc_init(reply, rpc->turn, rpc->server, rpc->pool)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    reply->raw = *message;
    reply->session = rpc->session;
    reply->version = rpc->version;
    reply->step = NGX_HTTP_AGENT_MCP_REQUEST;
    reply->done = ngx_http_agent_mcp_rpc_replied;
    reply->data = rpc;

    /* a message of this session only: never a new one for it */
    reply->reinit = 1;

    ngx_http_agent_mcp_rpc_clock(reply, 1);

    if (ngx_http_agent_mcp_rpc_send(reply) != NGX_OK) {
        ngx_http_agent_mcp_rpc_clock(reply, 0);
        return NGX_ERROR;
    }

    rpc->reply = reply;
    rpc->turn->running++;

    return NGX_OK;
}


static void
ngx_http_agent_mcp_rpc_replied(ngx_http_agent_mcp_rpc_t *reply)
{
    ngx_http_agent_mcp_rpc_t  *rpc = reply->data;

    ngx_http_agent_turn_t  *t;

    t = reply->turn;

    if (rpc->reply == reply) {
        rpc->reply = NULL;
    }

    if (reply->status < NGX_HTTP_OK
        || reply->status >= NGX_HTTP_SPECIAL_RESPONSE)
    {
        ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                      "agent mcp \"%V\" did not take an answer: %s",
                      &reply->server->name, reply->failure);
    }

    if (--t->running == 0) {
        ngx_http_agent_turn_tools_done(t);
    }
}


/*
 * notifications/cancelled for a request that was sent, on a request of
 * its own: the turn may be gone before it is delivered
 */

void
ngx_http_agent_mcp_rpc_cancelled(ngx_http_agent_mcp_rpc_t *rpc,
    char *reason)
{
    u_char     *p;
    size_t      len;
    ngx_str_t   body;

    if (rpc->step != NGX_HTTP_AGENT_MCP_REQUEST || rpc->id.len == 0) {
        return;
    }

    len = sizeof("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/"
                 "cancelled\",\"params\":{\"requestId\":,\"reason\":\"\"}}")
          + rpc->id.len + ngx_strlen(reason);

    p = ngx_pnalloc(rpc->pool, len);
    if (p == NULL) {
        return;
    }

    body.data = p;
    body.len = ngx_sprintf(p, "{\"jsonrpc\":\"2.0\",\"method\":"
                           "\"notifications/cancelled\",\"params\":"
                           "{\"requestId\":%V,\"reason\":\"%s\"}}",
                           &rpc->id, reason)
               - p;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &rpc->turn->log, 0,
                   "agent mcp \"%V\": request %V cancelled",
                   &rpc->server->name, &rpc->id);

    if (ngx_http_agent_mcp_rpc_post(rpc, &body) != NGX_OK) {
        ngx_log_error(NGX_LOG_WARN, &rpc->turn->log, 0,
                      "agent mcp \"%V\": notifications/cancelled could not "
                      "be sent", &rpc->server->name);
    }
}


/*
 * A message in the request's session on a detached request of its own,
 * bounded by rpc_timeout as any exchange is; its answer goes nowhere
 */

ngx_int_t
ngx_http_agent_mcp_rpc_post(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_str_t *message)
{
    ngx_uint_t    n;
    ngx_keyval_t  headers[3];

    n = ngx_http_agent_mcp_rpc_headers(rpc, headers);

    return ngx_http_agent_notify_post(rpc->turn->agent,
                                      &rpc->server->location, message,
                                      headers, n, rpc->server->rpc_timeout);
}
