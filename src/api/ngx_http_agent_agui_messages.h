
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_AGUI_MESSAGES_H_INCLUDED_
#define _NGX_HTTP_AGENT_AGUI_MESSAGES_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>


#define NGX_HTTP_AGENT_AGUI_ID_LEN    80


/* the thread as AG-UI messages: ngx_http_agent_agui_messages.c */

typedef struct {
    yajl_gen       g;
    ngx_uint_t     failed;
    ngx_pool_t    *pool;

    /*
     * where each user message begins in the generator's buffer, for a
     * rewind: {seq, len}
     */
    ngx_array_t    users;

    /* the last assistant message, which the calls after it join */
    u_char         parent[NGX_HTTP_AGENT_AGUI_ID_LEN];
    size_t         parent_len;

    /*
     * the client's tool message that resolved a call, whose result is
     * the next event: the message keeps the client's id
     */
    u_char         answer_call[NGX_HTTP_AGENT_AGUI_ID_LEN];
    size_t         answer_call_len;
    u_char         answer_id[NGX_HTTP_AGENT_AGUI_ID_LEN + 64];
    size_t         answer_id_len;

    unsigned       assistant:1;     /* open in the array */
    unsigned       calls:1;         /* its toolCalls open */
} ngx_http_agent_agui_msgs_t;


ngx_int_t ngx_http_agent_agui_msgs_init(ngx_http_agent_agui_msgs_t *m,
    ngx_pool_t *pool);
void ngx_http_agent_agui_msgs_rewind(ngx_http_agent_agui_msgs_t *m,
    uint64_t to);
void ngx_http_agent_agui_msgs_user(ngx_http_agent_agui_msgs_t *m,
    uint64_t seq, yajl_val root);
void ngx_http_agent_agui_msgs_assistant(ngx_http_agent_agui_msgs_t *m,
    yajl_val root);
void ngx_http_agent_agui_msgs_call(ngx_http_agent_agui_msgs_t *m,
    ngx_str_t *id, ngx_str_t *name, ngx_str_t *args);
void ngx_http_agent_agui_msgs_result(ngx_http_agent_agui_msgs_t *m,
    ngx_str_t *id, ngx_str_t *content, ngx_uint_t ok);

/* a resolution: the client's message id its result is to keep */
void ngx_http_agent_agui_msgs_answered(ngx_http_agent_agui_msgs_t *m,
    yajl_val root, ngx_str_t *id);
ngx_str_t *ngx_http_agent_agui_msgs_result_id(ngx_http_agent_agui_msgs_t *m,
    u_char *buf, ngx_str_t *id, ngx_str_t *out);
ngx_uint_t ngx_http_agent_agui_msgs_client(ngx_http_agent_agui_msgs_t *m,
    ngx_str_t *id);

/* MESSAGES_SNAPSHOT of the messages so far, and the room it takes */
size_t ngx_http_agent_agui_msgs_size(ngx_http_agent_agui_msgs_t *m);
ngx_int_t ngx_http_agent_agui_msgs_snapshot(ngx_http_agent_agui_msgs_t *m,
    ngx_buf_t *b);

/* PREFIX ID SUFFIX in buf (NGX_HTTP_AGENT_AGUI_ID_LEN + 16 bytes) */
ngx_str_t *ngx_http_agent_agui_id(u_char *buf, char *prefix, ngx_str_t *id,
    char *suffix, ngx_str_t *out);
ngx_int_t ngx_http_agent_agui_get(yajl_val root, char *key, ngx_str_t *s);


#endif /* _NGX_HTTP_AGENT_AGUI_MESSAGES_H_INCLUDED_ */
