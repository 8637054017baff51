
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_MESSAGE_H_INCLUDED_
#define _NGX_HTTP_AGENT_MESSAGE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


#include "ngx_http_agent_zone.h"


/* a conversation takes at most this many messages waiting for a turn */
#define NGX_HTTP_AGENT_QUEUE_MAX  16


/* the answer to a message taken: seq is its user_msg's */
typedef ngx_int_t (*ngx_http_agent_message_answer_pt)(ngx_http_request_t *r,
    ngx_str_t *id, uint64_t seq);


typedef struct {
    ngx_str_t                          content;
    ngx_str_t                          source_id;
    ngx_str_t                          fields;
    /* {"name","schema"}: the structured output asked for, or empty */
    ngx_str_t                          output;

    /* frontend tools offered for its turn, a JSON array, or empty */
    ngx_str_t                          client_tools;

    ngx_http_agent_message_answer_pt   answer;   /* NULL: JSON */

    /*
     * a rewind first: the context goes on from rewind_to, decided on the
     * branch whose newest user_msg was turn_seq (a message taken since
     * makes it stale)
     */
    uint64_t                           rewind_to;
    uint64_t                           turn_seq;

    /* asked of the message location: the user_msg's seq, 0 the last */
    uint64_t                           target;

    unsigned                           rewind:1;
    unsigned                           regenerate:1;
    unsigned                           edit:1;
    /* a new message whatever its source_id: not looked for as a resend */
    unsigned                           fresh:1;
} ngx_http_agent_message_t;


ngx_int_t ngx_http_agent_message_handler(ngx_http_request_t *r);

/* the request's body; NGX_DONE: answered, *rc to finalize with */
ngx_int_t ngx_http_agent_message_body_read(ngx_http_request_t *r,
    ngx_str_t *body, ngx_int_t *rc);

/*
 * msg->fields from its content, source_id and client_tools, and with
 * agent_trace the turn's trace context, the request's traceparent's child
 */
ngx_int_t ngx_http_agent_message_fields(ngx_http_request_t *r,
    ngx_http_agent_message_t *msg);

/* the message taken for conversation id, its turn started, answered */
ngx_int_t ngx_http_agent_message_accept(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_agent_message_t *msg);



#endif /* _NGX_HTTP_AGENT_MESSAGE_H_INCLUDED_ */
