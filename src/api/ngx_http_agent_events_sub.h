
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_EVENTS_SUB_H_INCLUDED_
#define _NGX_HTTP_AGENT_EVENTS_SUB_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_format.h"


/*
 * A subscriber of agent_events, shared by ngx_http_agent_events.c (its
 * life: registration, wake-ups, heartbeats, output) and
 * ngx_http_agent_events_pull.c (what it is sent).
 */


#define NGX_HTTP_AGENT_EVENTS_BATCH      64
#define NGX_HTTP_AGENT_EVENTS_BATCHES    8

/*
 * Output buffers are at least a page: larger than anything a pool hands
 * out from its blocks, so ngx_pfree() really releases them.
 */
#define NGX_HTTP_AGENT_EVENTS_BUF        4096

/*
 * Output queued for a client that does not keep up is bounded by
 * agent_events_buffer: from SLOW on (or half the limit), live events are
 * skipped; a canonical event is queued only if it fits under the limit,
 * else the cursor waits before it until the client has taken enough (no
 * canonical event is lost); one larger than the limit goes in slices.
 * send_timeout closes a client that takes nothing.
 */
#define NGX_HTTP_AGENT_EVENTS_SLOW       (64 * 1024)

/* a follower's heartbeat, which polls the store, at least so often */
#define NGX_HTTP_AGENT_EVENTS_POLL       3000


/* a follower's: served from the store (ngx_http_agent_events_follow.c) */
typedef struct ngx_http_agent_events_follow_s  ngx_http_agent_events_follow_t;


typedef struct {
    ngx_str_node_t                   sn;        /* key: crc32 of the id */
    ngx_queue_t                      subs;
    u_char                           id[NGX_HTTP_AGENT_ID_LEN];
} ngx_http_agent_events_topic_t;


struct ngx_http_agent_events_sub_s {
    ngx_queue_t                      queue;     /* in the topic */
    ngx_http_agent_events_topic_t   *topic;

    ngx_http_request_t              *request;
    ngx_http_agent_zone_t           *zone;

    ngx_http_agent_events_format_t  *format;
    void                            *format_ctx;

    ngx_str_t                        id;
    u_char                           id_data[NGX_HTTP_AGENT_ID_LEN];

    uint64_t                         seq;       /* last canonical seq sent */
    uint64_t                         pos;       /* last position read */

    /* live events up to this position came before the subscriber */
    uint64_t                         live;

    /* bytes of the frame of event seq + 1 queued so far (a slice) */
    size_t                           offset;

    size_t                           limit;     /* agent_events_buffer */
    size_t                           queued;    /* waiting for the client */

    ngx_msec_t                       interval;  /* heartbeat */
    ngx_msec_t                       sent;      /* last output */

    ngx_chain_t                     *free;
    ngx_chain_t                     *busy;

    ngx_event_t                      wake;
    ngx_event_t                      heartbeat;

    /* another node owns the conversation: its events come from the store */
    ngx_http_agent_events_follow_t  *follow;

    unsigned                         registered:1;  /* pid in the zone */
    unsigned                         stalled:1;
    unsigned                         done:1;

    /* the format ended the stream: what is queued goes, then the end */
    unsigned                         last:1;

    /* the reply so far is yet to be sent: until then it holds the deltas */
    unsigned                         partial:1;

    /*
     * on a node (agent_node): canonical events are sent once written, and
     * what follows one not written yet waits with it
     */
    unsigned                         written:1;
};


ngx_int_t ngx_http_agent_events_history_locked(
    ngx_http_agent_events_sub_t *sub, ngx_http_agent_revive_ctx_t *ctx,
    ngx_chain_t ***ll);
ngx_int_t ngx_http_agent_events_snapshot_locked(
    ngx_http_agent_events_sub_t *sub, ngx_http_agent_conv_t *conv,
    ngx_chain_t ***ll);
ngx_int_t ngx_http_agent_events_partial_locked(
    ngx_http_agent_events_sub_t *sub, ngx_http_agent_conv_t *conv,
    ngx_chain_t ***ll);
ngx_int_t ngx_http_agent_events_caught_up_locked(
    ngx_http_agent_events_sub_t *sub, ngx_http_agent_conv_t *conv,
    ngx_chain_t ***ll);

/*
 * What follows the cursor, canonical and live, in order.  NGX_DECLINED:
 * the stream cannot go on; the client reconnects with Last-Event-ID.
 */
ngx_int_t ngx_http_agent_events_pull(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t **out);

/*
 * Events read from the store (a follower's), as far as the limit takes
 * them; *used: how many were dealt with
 */
ngx_int_t ngx_http_agent_events_stored(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t **evs, ngx_uint_t n, ngx_chain_t ***ll,
    ngx_uint_t *used);

/*
 * Reads and sends what is new.  NGX_DONE: the request was finalized and
 * the subscriber is gone.
 */
ngx_int_t ngx_http_agent_events_update(ngx_http_agent_events_sub_t *sub);

/* the start of the stream, once what it begins with is in out */
ngx_int_t ngx_http_agent_events_begin(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t *out);

/*
 * A follower (ngx_http_agent_events_follow.c): a subscriber of agent_events
 * on a node that does not own the conversation, served from the store,
 * canonical events only: its start, what follows its cursor (as
 * ngx_http_agent_events_pull() says), its end
 */
ngx_int_t ngx_http_agent_events_follow(ngx_http_agent_events_sub_t *sub);
ngx_int_t ngx_http_agent_events_follow_pull(ngx_http_agent_events_sub_t *sub,
    ngx_chain_t ***ll);
void ngx_http_agent_events_follow_end(ngx_http_agent_events_sub_t *sub);

/* an output buffer of at least size bytes, from the subscriber's free */
ngx_chain_t *ngx_http_agent_events_buf(ngx_http_agent_events_sub_t *sub,
    size_t size);

/* memory of the buffers not yet sent */
size_t ngx_http_agent_events_busy(ngx_http_agent_events_sub_t *sub);


#endif /* _NGX_HTTP_AGENT_EVENTS_SUB_H_INCLUDED_ */
