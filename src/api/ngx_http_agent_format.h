
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_FORMAT_H_INCLUDED_
#define _NGX_HTTP_AGENT_FORMAT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_zone.h"


/*
 * What a subscriber's events look like on the wire.  The engine
 * (ngx_http_agent_events.c, _events_pull.c) decides which events a
 * subscriber gets and in what order, within its buffer; a format only
 * renders each one.  A new format is a new file with one of these.
 */

typedef struct ngx_http_agent_events_sub_s  ngx_http_agent_events_sub_t;

typedef struct {
    ngx_str_t    name;

    /* headers of its own, before the answer's head is sent */
    ngx_int_t  (*header)(ngx_http_request_t *r);

    /* the subscriber's state, once, before anything is rendered */
    ngx_int_t  (*init)(ngx_http_agent_events_sub_t *sub);

    /* at most how many bytes the frame of ev takes */
    size_t     (*size)(ngx_http_agent_event_t *ev);

    /*
     * The frame of ev at b->last, never past b->end, or, for a format
     * that slices, len bytes of it from off (last: the end of it).
     * Sets sub->last when the stream ends with it.
     */
    ngx_int_t  (*frame)(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
                        ngx_http_agent_event_t *ev, size_t off, size_t len,
                        ngx_uint_t last);

    /* the reply so far (len: its size in ngx_http_agent_partial.c) */
    size_t     (*partial_size)(size_t len);
    ngx_int_t  (*partial)(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
                          ngx_http_agent_conv_t *conv);

    /* an event larger than the buffer may go in slices */
    ngx_uint_t   slices;

    /*
     * Optional: the subscriber has every event there is (under the
     * lock): a format may end the stream there, seeing the state.
     */
    ngx_int_t  (*caught_up)(ngx_http_agent_events_sub_t *sub, ngx_buf_t *b,
                            ngx_http_agent_conv_t *conv);

    /* bytes the frame of ev adds from the subscriber's state (or NULL) */
    size_t     (*more)(ngx_http_agent_events_sub_t *sub,
                       ngx_http_agent_event_t *ev);

    /* at most how many bytes caught_up writes (NULL: a buffer's) */
    size_t     (*caught_up_size)(ngx_http_agent_events_sub_t *sub);
} ngx_http_agent_events_format_t;


/*
 * For formats of JSON events (ngx_http_agent_format.c): an event of the
 * log parsed, and a generated document written as "data: JSON" and a
 * blank line if it fits (the generator is reset either way).
 */
yajl_val ngx_http_agent_format_parse(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t *ev);
ngx_int_t ngx_http_agent_format_data(yajl_gen g, ngx_uint_t failed,
    ngx_buf_t *b);


/* the module's own Server-Sent Events: ngx_http_agent_format_sse.c */
extern ngx_http_agent_events_format_t  ngx_http_agent_format_sse;

/* the AI SDK's UI message stream: ngx_http_agent_format_aisdk.c */
extern ngx_http_agent_events_format_t  ngx_http_agent_format_aisdk;

/* AG-UI events: ngx_http_agent_format_agui.c */
extern ngx_http_agent_events_format_t  ngx_http_agent_format_agui;


#endif /* _NGX_HTTP_AGENT_FORMAT_H_INCLUDED_ */
