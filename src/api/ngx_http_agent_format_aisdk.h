
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_FORMAT_AISDK_H_INCLUDED_
#define _NGX_HTTP_AGENT_FORMAT_AISDK_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>


/*
 * A subscriber's state in the AI SDK's format: ngx_http_agent_format_aisdk.c
 * (the message, its steps, text and reasoning), _format_aisdk_tools.c
 * (tool calls, waits and results).
 */

#define NGX_HTTP_AGENT_AISDK_ID_LEN  64


/* a tool call the client was shown in this stream */
typedef struct {
    u_char                       id[NGX_HTTP_AGENT_AISDK_ID_LEN];
    size_t                       len;
    unsigned                     streamed:1;   /* tool-input-start sent */
    unsigned                     offered:1;    /* tool-input-available */
} ngx_http_agent_aisdk_call_t;


typedef struct {
    yajl_gen                     g;
    ngx_uint_t                   failed;

    ngx_uint_t                   turn;       /* the turn streamed */

    /* the model call of the open step */
    u_char                       message_id[NGX_HTTP_AGENT_AISDK_ID_LEN];
    size_t                       message_id_len;
    ngx_uint_t                   delta_seq;  /* its last delta seen */

    size_t                       text;       /* bytes of it sent */
    size_t                       thinking;
    uint32_t                     text_crc;   /* of them, not finished */
    uint32_t                     thinking_crc;

    /*
     * The model call made again (its worker died): what the new call
     * says is held back as far as the client was shown the old one, and
     * checked against it.
     */
    size_t                       again_text;
    size_t                       again_thinking;
    uint32_t                     again_text_crc;
    uint32_t                     again_thinking_crc;

    ngx_array_t                  calls;      /* ngx_http_agent_aisdk_call_t */

    /* a denied call: its error result is the denial, already sent */
    u_char                       denied[NGX_HTTP_AGENT_AISDK_ID_LEN];
    size_t                       denied_len;

    unsigned                     started:1;
    unsigned                     step:1;
    unsigned                     text_open:1;
    unsigned                     reasoning_open:1;
    unsigned                     again:1;
} ngx_http_agent_aisdk_t;


/* the tool chunks: ngx_http_agent_format_aisdk_tools.c */
ngx_int_t ngx_http_agent_aisdk_input_delta(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
ngx_int_t ngx_http_agent_aisdk_tool_call(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
ngx_int_t ngx_http_agent_aisdk_suspension(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
ngx_int_t ngx_http_agent_aisdk_resolution(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
ngx_int_t ngx_http_agent_aisdk_tool_result(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);
ngx_int_t ngx_http_agent_aisdk_progress(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, yajl_val root);

/* "start" once, then the step of a model call (NULL: the open one) */
ngx_int_t ngx_http_agent_aisdk_start(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b);
ngx_int_t ngx_http_agent_aisdk_step(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b, ngx_str_t *message_id);

/* a chunk: opened with its type, members added, closed into b */
void ngx_http_agent_aisdk_open(ngx_http_agent_aisdk_t *a, char *type);
ngx_int_t ngx_http_agent_aisdk_close(ngx_http_agent_aisdk_t *a,
    ngx_buf_t *b);
void ngx_http_agent_aisdk_value(ngx_http_agent_aisdk_t *a, yajl_val v);

/* an event's string member, and whether a member is true */
ngx_int_t ngx_http_agent_aisdk_get(yajl_val root, char *key, ngx_str_t *s);
ngx_uint_t ngx_http_agent_aisdk_true(yajl_val root, char *key);


#endif /* _NGX_HTTP_AGENT_FORMAT_AISDK_H_INCLUDED_ */
