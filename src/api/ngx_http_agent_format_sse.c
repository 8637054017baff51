
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The module's own event stream: each event as a Server-Sent Event named
 * after its type, with its JSON as data, and its seq as id when it is
 * canonical.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_partial.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_events_sub.h"


static ngx_int_t ngx_http_agent_format_sse_header(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_format_sse_init(
    ngx_http_agent_events_sub_t *sub);
static size_t ngx_http_agent_format_sse_size(ngx_http_agent_event_t *ev);
static ngx_int_t ngx_http_agent_format_sse_frame(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_event_t *ev, size_t off, size_t len, ngx_uint_t last);
static size_t ngx_http_agent_format_sse_partial_size(size_t len);
static ngx_int_t ngx_http_agent_format_sse_partial(
    ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
    ngx_http_agent_conv_t *conv);


ngx_http_agent_events_format_t  ngx_http_agent_format_sse = {
    ngx_string("sse"),
    ngx_http_agent_format_sse_header,
    ngx_http_agent_format_sse_init,
    ngx_http_agent_format_sse_size,
    ngx_http_agent_format_sse_frame,
    ngx_http_agent_format_sse_partial_size,
    ngx_http_agent_format_sse_partial,
    1,
    NULL,
    NULL,
    NULL
};


static ngx_str_t  ngx_http_agent_format_sse_streaming =
    ngx_string("streaming_message");


static ngx_int_t
ngx_http_agent_format_sse_header(ngx_http_request_t *r)
{
    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_format_sse_init(ngx_http_agent_events_sub_t *sub)
{
    return NGX_OK;
}


/* "id: SEQ\nevent: TYPE\ndata: JSON\n\n", at most */

static size_t
ngx_http_agent_format_sse_size(ngx_http_agent_event_t *ev)
{
    size_t  size;

    size = sizeof("event: \ndata: \n\n") - 1
           + ngx_http_agent_event_names[ev->type].len + ev->len;

    if (ev->seq) {
        size += sizeof("id: \n") - 1 + NGX_INT64_LEN;
    }

    return size;
}


/*
 * id: SEQ (canonical events only, so that Last-Event-ID is always the
 * last canonical event the client got), event: TYPE, data: JSON.  A
 * slice is len bytes of the JSON from off: the head comes with the first
 * one, the blank line that ends the event with the last.  A client that
 * loses the connection inside an event drops it, as SSE says.
 */

static ngx_int_t
ngx_http_agent_format_sse_frame(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_event_t *ev, size_t off, size_t len,
    ngx_uint_t last)
{
    u_char  *p, *data, *end;

    p = b->last;

    if (off == 0) {
        if (ev->seq) {
            p = ngx_sprintf(p, "id: %uL\n", ev->seq);
        }

        p = ngx_sprintf(p, "event: %V\ndata: ",
                        &ngx_http_agent_event_names[ev->type]);
    }

    data = p;
    p = ngx_cpymem(p, ev->data + off, len);

    /*
     * A line break in JSON is whitespace outside strings and escaped
     * inside them: a space keeps the value and the frame to one line.
     */

    for (end = p; data < end; data++) {
        if (*data == LF || *data == CR) {
            *data = ' ';
        }
    }

    if (last) {
        *p++ = LF;
        *p++ = LF;
    }

    b->last = p;

    return NGX_OK;
}


static size_t
ngx_http_agent_format_sse_partial_size(size_t len)
{
    return sizeof("event: \ndata: {\"type\":\"\",\"turn\":,\"ts\":,}\n\n") - 1
           + 2 * ngx_http_agent_format_sse_streaming.len
           + NGX_INT_T_LEN + NGX_INT64_LEN + len;
}


/* the reply so far as one streaming_message live event */

static ngx_int_t
ngx_http_agent_format_sse_partial(ngx_http_agent_events_sub_t *sub,
    ngx_buf_t *b, ngx_http_agent_conv_t *conv)
{
    u_char      *p;
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    p = ngx_sprintf(b->last, "event: %V\ndata: {\"type\":\"%V\","
                    "\"turn\":%ui,\"ts\":%uL,",
                    &ngx_http_agent_format_sse_streaming,
                    &ngx_http_agent_format_sse_streaming, conv->turn,
                    (uint64_t) tp->sec * 1000 + tp->msec);

    p = ngx_http_agent_partial_json_locked(conv, p);

    *p++ = '}';
    *p++ = LF;
    *p++ = LF;

    b->last = p;

    return NGX_OK;
}
