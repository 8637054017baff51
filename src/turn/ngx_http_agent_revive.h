
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_REVIVE_H_INCLUDED_
#define _NGX_HTTP_AGENT_REVIVE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_store.h"


typedef struct ngx_http_agent_revival_s  ngx_http_agent_revival_t;


/* what the store gave a request: a revival, and a page of history */
typedef struct {
    ngx_http_request_t           *request;
    ngx_http_agent_revival_t     *revival;    /* in progress */
    ngx_uint_t                    revived;

    uint64_t                      after;
    uint64_t                      upto;
    ngx_http_agent_event_t      **history;
    ngx_uint_t                    nhistory;
    /* the page came from what the worker kept, not the store */
    ngx_uint_t                    kept;

    /*
     * follow: a subscriber that may be served from the store when
     * another node owns the conversation, which elsewhere then says
     */
    ngx_uint_t                    follow;
    ngx_uint_t                    elsewhere;

    /* what runs again instead of the handler, which took the input */
    ngx_http_agent_store_answer_pt  answer;
    ngx_str_t                     answer_id;
    uint64_t                      answer_from;
} ngx_http_agent_revive_ctx_t;


/*
 * The one door back into the zone: a conversation that is not there is
 * read from the store and put back as it was, then the request's handler
 * runs again (r == NULL: nobody waits).  NGX_DECLINED: no store, or this
 * request had its revival; NGX_DONE: it is under way; NGX_BUSY: the
 * store's thread pool refused the read (ngx_http_agent_store_busy_answer).
 */
ngx_int_t ngx_http_agent_revive(ngx_http_request_t *r, ngx_str_t *id);

/* another node took the conversation: it leaves the zone (store hook) */
void ngx_http_agent_revive_lost(ngx_str_t *id);

/*
 * the node's lease (agent_node): NGX_OK while it is fresh, or without a
 * node; NGX_DECLINED once it lapsed, the zone's conversations dropped
 */
ngx_int_t ngx_http_agent_revive_lease(void);

/* a turn may make its next call: NGX_DECLINED, its record was dropped */
ngx_int_t ngx_http_agent_revive_turn_held(ngx_http_agent_turn_t *t);

/* revived, or answered 404; the zone is not locked */
ngx_int_t ngx_http_agent_revive_not_found(ngx_http_request_t *r, ngx_str_t *id);

ngx_http_agent_revive_ctx_t *ngx_http_agent_revive_ctx(ngx_http_request_t *r);

/*
 * the request's ctx, made if need be, marked as a subscriber's that
 * another node's ownership does not refuse (ctx->elsewhere, not 421)
 */
ngx_http_agent_revive_ctx_t *ngx_http_agent_revive_follower(
    ngx_http_request_t *r);

/* the events read from the store (store_event_t) as the zone's, in pool */
ngx_http_agent_event_t **ngx_http_agent_revive_events(ngx_pool_t *pool,
    ngx_array_t *events);

/*
 * The answer of an input already taken (a stream that begins once the
 * message or the resolutions are written): when the stream needs what
 * the zone gave up, it is the answer that runs again once that is read,
 * not the handler, which would take the input a second time.
 */
ngx_int_t ngx_http_agent_revive_answer(ngx_http_request_t *r,
    ngx_http_agent_store_answer_pt answer, ngx_str_t *id, uint64_t from);

/* the events after..upto for the request, then its handler runs again */
ngx_int_t ngx_http_agent_revive_history(ngx_http_request_t *r, ngx_str_t *id,
    uint64_t after, uint64_t upto);

/* NGX_AGAIN: the turn's history is being read, the model call follows */
ngx_int_t ngx_http_agent_revive_turn_history(ngx_http_agent_turn_t *t);


#endif /* _NGX_HTTP_AGENT_REVIVE_H_INCLUDED_ */
