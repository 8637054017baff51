
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_bytes.h"


ngx_int_t
ngx_http_agent_bytes_append(ngx_pool_t *pool, ngx_http_agent_bytes_t *b,
    u_char *p, size_t len)
{
    size_t   size;
    u_char  *data;

    if (len == 0) {
        return NGX_OK;
    }

    if (len > NGX_MAX_SIZE_T_VALUE / 4 - b->len) {
        return NGX_ERROR;
    }

    if (b->len + len > b->size) {
        size = b->size ? b->size : NGX_HTTP_AGENT_BYTES_MIN;

        while (size < b->len + len) {
            size *= 2;
        }

        data = ngx_pnalloc(pool, size);
        if (data == NULL) {
            return NGX_ERROR;
        }

        if (b->len) {
            ngx_memcpy(data, b->data, b->len);
        }

        if (b->data) {
            ngx_pfree(pool, b->data);
        }

        b->data = data;
        b->size = size;
    }

    ngx_memcpy(b->data + b->len, p, len);
    b->len += len;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_bytes_set(ngx_pool_t *pool, ngx_http_agent_bytes_t *b,
    u_char *p, size_t len)
{
    b->len = 0;

    return ngx_http_agent_bytes_append(pool, b, p, len);
}
