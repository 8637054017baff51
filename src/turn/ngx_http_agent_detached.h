
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_DETACHED_H_INCLUDED_
#define _NGX_HTTP_AGENT_DETACHED_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/*
 * A request of the module's own, on a connection without a socket, whose
 * subrequests reach internal locations: a turn's, a notification's.  It
 * lives in pool, which ngx_http_agent_detached_close() destroys.
 */
ngx_http_request_t *ngx_http_agent_detached_create(ngx_pool_t *pool,
    ngx_log_t *log, ngx_http_log_ctx_t *log_ctx, ngx_http_conf_ctx_t *ctx);
void ngx_http_agent_detached_close(ngx_http_request_t *r);

/* a background POST subrequest with a JSON body and headers of its own */
ngx_int_t ngx_http_agent_detached_subrequest(ngx_http_request_t *r,
    ngx_str_t *uri, ngx_str_t *body, ngx_keyval_t *headers,
    ngx_uint_t nheaders, ngx_http_post_subrequest_t *ps,
    ngx_http_request_t **psr);


/* what a subrequest's post_subrequest handler returns for rc */
ngx_int_t ngx_http_agent_detached_rc(ngx_int_t rc);

typedef ngx_int_t (*ngx_http_agent_detached_take_pt)(void *data, u_char *p,
    u_char *last);

/* a captured subrequest's output, each buffer to handler, consumed */
ngx_int_t ngx_http_agent_detached_take(ngx_chain_t *in,
    ngx_http_agent_detached_take_pt handler, void *data);


#endif /* _NGX_HTTP_AGENT_DETACHED_H_INCLUDED_ */
