
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_FORMAT_AGUI_H_INCLUDED_
#define _NGX_HTTP_AGENT_FORMAT_AGUI_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_agui.h"
#include "ngx_http_agent_agui_messages.h"


/*
 * A subscriber's AG-UI run (ngx_http_agent_format_agui.c), and the
 * writers of its events (ngx_http_agent_format_agui_write.c)
 */

#define NGX_HTTP_AGENT_AGUI_WAITS     16


/* a call of the run that waits, or that the browser has answered */

typedef struct {
    u_char                       id[NGX_HTTP_AGENT_AGUI_ID_LEN];
    size_t                       len;
    ngx_uint_t                   kind;
    uint64_t                     deadline;
    unsigned                     waiting:1;
} ngx_http_agent_agui_call_t;


typedef struct {
    yajl_gen                     g;            /* the event written */
    ngx_uint_t                   failed;

    yajl_gen                     text_gen;     /* a result as text */

    ngx_http_agent_agui_msgs_t   msgs;         /* the messages so far */

    ngx_http_agent_agui_run_t   *run;

    /* the model call of the open step */
    u_char                       step[NGX_HTTP_AGENT_AGUI_ID_LEN];
    size_t                       step_len;

    size_t                       text;         /* bytes of it sent */
    size_t                       thinking;

    ngx_uint_t                   ncalls;
    ngx_http_agent_agui_call_t   calls[NGX_HTTP_AGENT_AGUI_WAITS];

    unsigned                     started:1;
    unsigned                     step_open:1;
    unsigned                     text_open:1;
    unsigned                     reasoning_open:1;
} ngx_http_agent_agui_t;


ngx_int_t ngx_http_agent_agui_start(ngx_http_agent_agui_t *a,
    ngx_buf_t *b);
ngx_int_t ngx_http_agent_agui_step(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, ngx_str_t *message_id);
ngx_int_t ngx_http_agent_agui_step_end(ngx_http_agent_agui_t *a,
    ngx_buf_t *b);
ngx_int_t ngx_http_agent_agui_blocks_end(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, ngx_uint_t text, ngx_uint_t reasoning);
ngx_int_t ngx_http_agent_agui_message(ngx_http_agent_agui_t *a,
    ngx_buf_t *b, char *type, ngx_uint_t reasoning, ngx_str_t *delta);

ngx_int_t ngx_http_agent_agui_result_text(ngx_http_agent_agui_t *a,
    yajl_val root, ngx_str_t *id, ngx_str_t *content, ngx_uint_t *ok);

void ngx_http_agent_agui_open(ngx_http_agent_agui_t *a, char *type);
void ngx_http_agent_agui_field(ngx_http_agent_agui_t *a, char *key,
    ngx_str_t *value);
ngx_int_t ngx_http_agent_agui_close(ngx_http_agent_agui_t *a,
    ngx_buf_t *b);


#endif /* _NGX_HTTP_AGENT_FORMAT_AGUI_H_INCLUDED_ */
