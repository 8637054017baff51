
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_BYTES_H_INCLUDED_
#define _NGX_HTTP_AGENT_BYTES_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


/* the first buffer of a growable string */
#define NGX_HTTP_AGENT_BYTES_MIN             128


/*
 * A growable byte string: it grows by doubling from a pool, and a buffer
 * left behind goes back to the pool when it can (a large allocation).
 */
typedef struct {
    u_char                       *data;
    size_t                        len;
    size_t                        size;
} ngx_http_agent_bytes_t;


ngx_int_t ngx_http_agent_bytes_append(ngx_pool_t *pool,
    ngx_http_agent_bytes_t *b, u_char *p, size_t len);
ngx_int_t ngx_http_agent_bytes_set(ngx_pool_t *pool,
    ngx_http_agent_bytes_t *b, u_char *p, size_t len);


#endif /* _NGX_HTTP_AGENT_BYTES_H_INCLUDED_ */
