/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_sse.h"


/*
 * Server-Sent Events framing, as the WHATWG HTML standard parses an
 * event stream ("9.2.6 Interpreting an event stream"), fed in pieces
 * of any size.  Lines end in CRLF, LF or CR; a CRLF split between two
 * pieces is one line end, which is why a CR leaves the parser in a
 * state of its own.  "retry:" is ignored: the stream is never
 * reconnected here, a failed model call is retried by the engine.
 */


/* what a buffer starts with: a chunk of a provider stream fits */
#define NGX_HTTP_AGENT_SSE_BUF  512


typedef enum {
    sw_line = 0,
    sw_after_cr
} ngx_http_agent_sse_state_e;


static ngx_int_t ngx_http_agent_sse_end_line(ngx_http_agent_sse_t *sse,
    u_char *p, u_char *last);
static ngx_int_t ngx_http_agent_sse_field(ngx_http_agent_sse_t *sse,
    u_char *p, size_t len);
static ngx_int_t ngx_http_agent_sse_dispatch(ngx_http_agent_sse_t *sse);
static ngx_int_t ngx_http_agent_sse_set(ngx_http_agent_sse_t *sse,
    ngx_http_agent_sse_buf_t *b, u_char *p, size_t len);
static ngx_int_t ngx_http_agent_sse_append(ngx_http_agent_sse_t *sse,
    ngx_http_agent_sse_buf_t *b, u_char *p, size_t len);


ngx_http_agent_sse_t *
ngx_http_agent_sse_create(ngx_pool_t *pool, ngx_log_t *log,
    ngx_http_agent_sse_handler_pt handler, void *ctx)
{
    ngx_http_agent_sse_t  *sse;

    sse = ngx_pcalloc(pool, sizeof(ngx_http_agent_sse_t));
    if (sse == NULL) {
        return NULL;
    }

    sse->pool = pool;
    sse->log = log;
    sse->handler = handler;
    sse->ctx = ctx;
    sse->max = NGX_HTTP_AGENT_SSE_MAX;
    sse->state = sw_line;
    sse->first_line = 1;

    return sse;
}


/*
 * A line that ends inside the piece is parsed where it lies; only the
 * tail of a piece, a line still open, is copied into the line buffer.
 */

ngx_int_t
ngx_http_agent_sse_feed(ngx_http_agent_sse_t *sse, u_char *p, u_char *last)
{
    u_char  *start, *lf, *cr;

    if (sse->failed) {
        return NGX_ERROR;
    }

    while (p < last) {

        switch (sse->state) {

        case sw_after_cr:
            sse->state = sw_line;

            /* the LF of a CRLF */
            if (*p == LF) {
                p++;
            }

            break;

        default: /* sw_line */
            start = p;

            /* the line's end: memchr() reads a word at a time */

            lf = memchr(p, LF, last - p);
            cr = memchr(p, CR, (lf ? lf : last) - p);

            p = cr ? cr : (lf ? lf : last);

            if (p == last) {
                if (ngx_http_agent_sse_append(sse, &sse->line, start,
                                              p - start)
                    != NGX_OK)
                {
                    goto failed;
                }

                break;
            }

            if (*p == CR) {
                sse->state = sw_after_cr;
            }

            if (ngx_http_agent_sse_end_line(sse, start, p) != NGX_OK) {
                goto failed;
            }

            p++;
            break;
        }
    }

    return NGX_OK;

failed:

    sse->failed = 1;

    return NGX_ERROR;
}


static ngx_int_t
ngx_http_agent_sse_end_line(ngx_http_agent_sse_t *sse, u_char *p,
    u_char *last)
{
    size_t  len;

    len = last - p;

    if (sse->line.len) {
        if (ngx_http_agent_sse_append(sse, &sse->line, p, len) != NGX_OK) {
            return NGX_ERROR;
        }

        /* the bytes stay in place until the next line is buffered */
        p = sse->line.data;
        len = sse->line.len;
        sse->line.len = 0;

    } else if (len > sse->max) {
        ngx_log_error(NGX_LOG_ERR, sse->log, 0,
                      "SSE line longer than %uz bytes", sse->max);
        return NGX_ERROR;
    }

    if (sse->first_line) {
        sse->first_line = 0;

        /* a byte order mark may start the stream */
        if (len >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) {
            p += 3;
            len -= 3;
        }
    }

    return ngx_http_agent_sse_field(sse, p, len);
}


static ngx_int_t
ngx_http_agent_sse_field(ngx_http_agent_sse_t *sse, u_char *p, size_t len)
{
    u_char  *colon, *value, *last;
    size_t   n;

    if (len == 0) {
        return ngx_http_agent_sse_dispatch(sse);
    }

    /* a comment: what servers send to keep the connection alive */
    if (p[0] == ':') {
        return NGX_OK;
    }

    last = p + len;

    colon = ngx_strlchr(p, last, ':');

    if (colon == NULL) {
        n = len;
        value = last;

    } else {
        n = colon - p;
        value = colon + 1;

        if (value < last && *value == ' ') {
            value++;
        }
    }

    if (n == 4 && ngx_strncmp(p, "data", 4) == 0) {
        if (ngx_http_agent_sse_append(sse, &sse->data, value, last - value)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_agent_sse_append(sse, &sse->data, (u_char *) "\n",
                                         1);
    }

    if (n == 5 && ngx_strncmp(p, "event", 5) == 0) {
        return ngx_http_agent_sse_set(sse, &sse->event, value, last - value);
    }

    if (n == 2 && ngx_strncmp(p, "id", 2) == 0
        && ngx_strlchr(value, last, '\0') == NULL)
    {
        return ngx_http_agent_sse_set(sse, &sse->id, value, last - value);
    }

    /* "retry" and unknown fields */

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_sse_dispatch(ngx_http_agent_sse_t *sse)
{
    ngx_int_t  rc;
    ngx_str_t  event, data;

    if (sse->data.len == 0) {
        /* no "data:" line: nothing is dispatched */
        sse->event.len = 0;
        return NGX_OK;
    }

    /* the last LF is not part of the data; a NUL takes its place */
    data.len = sse->data.len - 1;
    data.data = sse->data.data;
    data.data[data.len] = '\0';

    if (sse->event.len) {
        event.len = sse->event.len;
        event.data = sse->event.data;

    } else {
        ngx_str_set(&event, "");
    }

    rc = sse->handler(sse->ctx, &event, &data);

    sse->event.len = 0;
    sse->data.len = 0;

    return (rc == NGX_OK) ? NGX_OK : NGX_ERROR;
}


static ngx_int_t
ngx_http_agent_sse_set(ngx_http_agent_sse_t *sse, ngx_http_agent_sse_buf_t *b,
    u_char *p, size_t len)
{
    b->len = 0;

    return ngx_http_agent_sse_append(sse, b, p, len);
}


/*
 * The buffers grow by doubling to the largest line or event seen and are
 * reused after that; the old buffer goes back to the pool when it can
 * (a large allocation), so a stream costs at most twice its largest
 * event, however long it runs.
 */

static ngx_int_t
ngx_http_agent_sse_append(ngx_http_agent_sse_t *sse,
    ngx_http_agent_sse_buf_t *b, u_char *p, size_t len)
{
    size_t   size;
    u_char  *data;

    if (len == 0) {
        return NGX_OK;
    }

    if (b->len + len > sse->max) {
        ngx_log_error(NGX_LOG_ERR, sse->log, 0,
                      "SSE line or event longer than %uz bytes", sse->max);
        return NGX_ERROR;
    }

    if (b->len + len > b->size) {
        size = b->size ? b->size : NGX_HTTP_AGENT_SSE_BUF;

        while (size < b->len + len) {
            size *= 2;
        }

        data = ngx_pnalloc(sse->pool, size);
        if (data == NULL) {
            return NGX_ERROR;
        }

        if (b->len) {
            ngx_memcpy(data, b->data, b->len);
        }

        if (b->data) {
            ngx_pfree(sse->pool, b->data);
        }

        b->data = data;
        b->size = size;
    }

    ngx_memcpy(b->data + b->len, p, len);
    b->len += len;

    return NGX_OK;
}
