
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_BRANCH_H_INCLUDED_
#define _NGX_HTTP_AGENT_BRANCH_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_message.h"


/* a turn of the current branch: its user message */
typedef struct {
    uint64_t                   seq;
    ngx_uint_t                 turn;
    ngx_str_t                  source_id;
    ngx_str_t                  content;
} ngx_http_agent_branch_turn_t;


/*
 * A conversation's current branch, as a regenerate or an edit needs it:
 * its turns in order, the range of its newest summary, and the seq of
 * the newest user_msg of the log when it was read (a message taken
 * since makes the branch stale).
 */
typedef struct {
    ngx_array_t                turns;     /* ngx_http_agent_branch_turn_t */
    uint64_t                   summary_to;
    uint64_t                   turn_seq;
    uint64_t                   last;      /* the newest seq read */
    ngx_array_t                events;    /* ngx_http_agent_store_event_t */
    ngx_http_request_t        *request;
    ngx_int_t                (*decide)(ngx_http_request_t *r, void *data);
    void                      *data;
    unsigned                   ready:1;
    /* another agent's or owner's: answered as not found */
    unsigned                   foreign:1;
} ngx_http_agent_branch_t;


/*
 * Reads the branch of conversation id into b (the store's log and the
 * zone's), then decide(r, data) answers: at once, or when a read of the
 * store ends (then NGX_DONE, and the request is finalized with what
 * decide returns).  decide sees b->ready unset after a failed read.
 */
ngx_int_t ngx_http_agent_branch_read(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_branch_t *b, ngx_int_t (*decide)(ngx_http_request_t *r,
    void *data), void *data);

/* the index of the turn whose user_msg is seq, or NGX_ERROR */
ngx_int_t ngx_http_agent_branch_find(ngx_http_agent_branch_t *b,
    uint64_t seq);

/*
 * msg taken after a rewind to before the user message of turn i (it
 * replaces that turn and those after it); 409 summarized when the
 * conversation's summary covers that message.  The answer.
 */
ngx_int_t ngx_http_agent_branch_rewind(ngx_http_request_t *r,
    ngx_http_agent_branch_t *b, ngx_uint_t i, ngx_str_t *id,
    ngx_http_agent_message_t *msg);


/*
 * A chat client's new message (agent_aisdk, AG-UI), placed by the chat's
 * message before it (anchor: an assistant message "msg_T..." of turn T,
 * or a user message by its id; NULL: the chat has no other), with
 * regenerate (make the reply to the new message again: it is a user
 * message of the branch) or edit (it is a user message of the branch,
 * with new text) asked for.
 */
typedef struct {
    yajl_val                   anchor;
    unsigned                   regenerate:1;
    unsigned                   edit:1;
} ngx_http_agent_chat_t;


/*
 * The message taken where the chat places it: after the last turn as
 * ever, the last one sent again answered with its turn, or after a
 * rewind; 409 not_on_branch when the chat is not the conversation's.
 */
ngx_int_t ngx_http_agent_branch_message(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_agent_message_t *msg, ngx_http_agent_chat_t *chat);


#endif /* _NGX_HTTP_AGENT_BRANCH_H_INCLUDED_ */
