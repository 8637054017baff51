
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_detached.h"


static void ngx_http_agent_detached_free(ngx_connection_t *c);


static ngx_str_t  ngx_http_agent_post_method = ngx_string("POST");
static ngx_str_t  ngx_http_agent_content_type =
    ngx_string("application/json");


/*
 * A fake connection (no socket) and a request on it, as njs's
 * js_periodic builds them, with the configuration ctx.  fd -1 would make
 * nginx try socket calls, so the events are marked active (nothing to
 * register), and tcp_nodelay is marked as already handled.  NULL: the
 * caller still owns the pool.
 */

ngx_http_request_t *
ngx_http_agent_detached_create(ngx_pool_t *pool, ngx_log_t *log,
    ngx_http_log_ctx_t *log_ctx, ngx_http_conf_ctx_t *ctx)
{
    ngx_connection_t       *c;
    ngx_http_request_t     *r;
    ngx_http_connection_t  *hc;
    struct sockaddr_in     *sin;

    hc = ngx_pcalloc(pool, sizeof(ngx_http_connection_t));
    sin = ngx_pcalloc(pool, sizeof(struct sockaddr_in));

    if (hc == NULL || sin == NULL) {
        return NULL;
    }

    c = ngx_get_connection(0, log);
    if (c == NULL) {
        return NULL;
    }

    log_ctx->connection = c;

    c->fd = (ngx_socket_t) -1;
    c->pool = pool;
    c->log = log;
    c->log_error = NGX_ERROR_INFO;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);
    c->tcp_nodelay = NGX_TCP_NODELAY_DISABLED;

    /*
     * the request is the module's own, not a client's, whose connection
     * may be gone long before it ends: it comes from the loopback
     */

    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    c->sockaddr = (struct sockaddr *) sin;
    c->socklen = sizeof(struct sockaddr_in);
    c->local_sockaddr = (struct sockaddr *) sin;
    c->local_socklen = sizeof(struct sockaddr_in);
    ngx_str_set(&c->addr_text, "127.0.0.1");

    c->read->log = log;
    c->write->log = log;

    /*
     * nothing reads from the connection, but nginx times it: a provider
     * subrequest (its discard_body set) that goes on after its handler
     * returned arms lingering_timeout on the read event, which a model
     * call longer than that lets fire
     */
    c->read->handler = ngx_http_empty_handler;

    c->read->active = 1;
    c->write->active = 1;
    c->write->ready = 1;

    hc->conf_ctx = ctx;

    c->data = hc;

    r = ngx_http_create_request(c);
    if (r == NULL) {
        ngx_http_agent_detached_free(c);
        return NULL;
    }

    c->data = r;

    r->logged = 1;
    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_request_empty_handler;
    r->method = NGX_HTTP_POST;
    r->method_name = ngx_http_agent_post_method;
    ngx_str_set(&r->uri, "/");
    ngx_str_set(&r->unparsed_uri, "/");
    ngx_str_set(&r->http_protocol, "HTTP/1.1");
    r->http_version = NGX_HTTP_VERSION_11;
    r->headers_in.content_length_n = 0;

    if (ngx_list_init(&r->headers_in.headers, r->pool, 1,
                      sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        r->count++;
        ngx_http_free_request(r, 0);
        ngx_http_agent_detached_free(c);
        return NULL;
    }

    return r;
}


void
ngx_http_agent_detached_close(ngx_http_request_t *r)
{
    ngx_pool_t        *pool;
    ngx_connection_t  *c;

    c = r->connection;
    pool = c->pool;

    /*
     * a subrequest still running is torn down by its cleanup as the
     * request is freed; its end must not free the request again
     */
    r->count++;

    ngx_http_free_request(r, 0);

    ngx_http_agent_detached_free(c);

    ngx_destroy_pool(pool);
}


/*
 * As ngx_close_connection() would, without a socket: a timer nginx left
 * on the fake connection (a subrequest's lingering discard sets one on
 * its read event) must not outlive it in the timer tree
 */

static void
ngx_http_agent_detached_free(ngx_connection_t *c)
{
    if (c->read->timer_set) {
        ngx_del_timer(c->read);
    }

    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    c->destroyed = 1;
    c->fd = 0;
    ngx_free_connection(c);
    c->fd = (ngx_socket_t) -1;
}


ngx_int_t
ngx_http_agent_detached_subrequest(ngx_http_request_t *r, ngx_str_t *uri,
    ngx_str_t *body, ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_http_post_subrequest_t *ps, ngx_http_request_t **psr)
{
    ngx_buf_t                    *b;
    ngx_uint_t                    i;
    ngx_chain_t                  *cl;
    ngx_table_elt_t              *h;
    ngx_http_request_t           *sr;
    ngx_http_request_body_t      *rb;
    ngx_http_core_main_conf_t    *cmcf;

    if (ngx_http_subrequest(r, uri, NULL, &sr, ps,
                            NGX_HTTP_SUBREQUEST_BACKGROUND)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    b = ngx_calloc_buf(r->pool);
    cl = ngx_alloc_chain_link(r->pool);
    rb = ngx_pcalloc(r->pool, sizeof(ngx_http_request_body_t));

    if (b == NULL || cl == NULL || rb == NULL) {
        return NGX_ERROR;
    }

    b->pos = body->data;
    b->last = body->data + body->len;
    b->start = b->pos;
    b->end = b->last;
    b->memory = 1;
    b->last_buf = 1;

    cl->buf = b;
    cl->next = NULL;
    rb->bufs = cl;

    sr->request_body = rb;
    sr->method = NGX_HTTP_POST;
    sr->method_name = ngx_http_agent_post_method;
    sr->header_only = 0;

    if (ngx_list_init(&sr->headers_in.headers, r->pool, nheaders + 1,
                      sizeof(ngx_table_elt_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    h = ngx_list_push(&sr->headers_in.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    ngx_memzero(h, sizeof(ngx_table_elt_t));

    h->hash = 1;
    ngx_str_set(&h->key, "Content-Type");
    h->value = ngx_http_agent_content_type;
    h->lowcase_key = (u_char *) "content-type";

    sr->headers_in.content_type = h;
    sr->headers_in.content_length_n = body->len;
    sr->headers_in.content_length = NULL;

    for (i = 0; i < nheaders; i++) {
        h = ngx_list_push(&sr->headers_in.headers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(h, sizeof(ngx_table_elt_t));

        h->hash = 1;
        h->key = headers[i].key;
        h->value = headers[i].value;

        h->lowcase_key = ngx_pnalloc(r->pool, h->key.len);
        if (h->lowcase_key == NULL) {
            return NGX_ERROR;
        }

        ngx_strlow(h->lowcase_key, h->key.data, h->key.len);
    }

    /*
     * variables of its own: a subrequest shares its parent's cache, and
     * calls running side by side must not see each other's $http_... or
     * $request_body
     */

    cmcf = ngx_http_get_module_main_conf(sr, ngx_http_core_module);

    sr->variables = ngx_pcalloc(r->pool, cmcf->variables.nelts
                                         * sizeof(ngx_http_variable_value_t));
    if (sr->variables == NULL) {
        return NGX_ERROR;
    }

    *psr = sr;

    return NGX_OK;
}


/*
 * What a post_subrequest handler returns: an error of a subrequest ends
 * that subrequest, never the detached request, which terminating would
 * close as a connection without a socket.
 */

ngx_int_t
ngx_http_agent_detached_rc(ngx_int_t rc)
{
    if (rc == NGX_ERROR || rc == NGX_HTTP_CLIENT_CLOSED_REQUEST
        || rc == NGX_HTTP_REQUEST_TIME_OUT)
    {
        return NGX_OK;
    }

    return rc;
}


/*
 * A captured subrequest's output, consumed: each buffer in memory goes
 * to handler; NGX_DECLINED if some was in a file (proxy_buffering put a
 * stream there) and NGX_ERROR if handler failed.
 */

ngx_int_t
ngx_http_agent_detached_take(ngx_chain_t *in,
    ngx_http_agent_detached_take_pt handler, void *data)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    rc = NGX_OK;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (!ngx_buf_in_memory(b)) {
            if (ngx_buf_size(b)) {
                rc = NGX_DECLINED;
                b->file_pos = b->file_last;
            }

            continue;
        }

        if (b->last > b->pos && handler(data, b->pos, b->last) != NGX_OK) {
            return NGX_ERROR;
        }

        b->pos = b->last;
    }

    return rc;
}
