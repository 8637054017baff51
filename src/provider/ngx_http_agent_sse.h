/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_SSE_H_INCLUDED_
#define _NGX_HTTP_AGENT_SSE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


/* the longest line, and the largest event, a stream may send */
#define NGX_HTTP_AGENT_SSE_MAX  (1024 * 1024)


/*
 * Called for each event, at the blank line that ends it.  event is the
 * value of its last "event:" field, the empty string if it had none;
 * data is its "data:" lines joined with LF, followed by a NUL byte that
 * is not part of it.  Both are valid during the call only.  A return
 * other than NGX_OK stops the stream: feed returns NGX_ERROR, now and
 * on every later call.
 */

typedef ngx_int_t (*ngx_http_agent_sse_handler_pt)(void *ctx,
    ngx_str_t *event, ngx_str_t *data);


typedef struct {
    u_char                         *data;
    size_t                          len;
    size_t                          size;
} ngx_http_agent_sse_buf_t;


typedef struct {
    ngx_pool_t                     *pool;
    ngx_log_t                      *log;

    ngx_http_agent_sse_handler_pt   handler;
    void                           *ctx;

    /* NGX_HTTP_AGENT_SSE_MAX unless the caller sets it after create */
    size_t                          max;

    ngx_uint_t                      state;

    /* a line split across pieces; reused, grows to the longest line */
    ngx_http_agent_sse_buf_t        line;
    ngx_http_agent_sse_buf_t        event;
    ngx_http_agent_sse_buf_t        data;

    /* the last event ID buffer of the spec, kept across events */
    ngx_http_agent_sse_buf_t        id;

    unsigned                        first_line:1;
    unsigned                        failed:1;
} ngx_http_agent_sse_t;


ngx_http_agent_sse_t *ngx_http_agent_sse_create(ngx_pool_t *pool,
    ngx_log_t *log, ngx_http_agent_sse_handler_pt handler, void *ctx);
ngx_int_t ngx_http_agent_sse_feed(ngx_http_agent_sse_t *sse, u_char *p,
    u_char *last);


#endif /* _NGX_HTTP_AGENT_SSE_H_INCLUDED_ */
