
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_HISTORY_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_HISTORY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_zone.h"


/*
 * The history a worker keeps (agent_store history=size): at the end of a
 * turn it ran, the conversation's context as the turn read it and the
 * zone's log after it; the next turn of the conversation in this worker
 * takes it instead of reading the store.  A conversation's events never
 * change once written, so what is kept of events 1..n is what the store
 * holds of them.
 */

/*
 * The events this worker kept of the conversation, events[i] is event
 * first + i: they are the pool's from then on (NGX_DECLINED: none kept)
 */
ngx_int_t ngx_http_agent_store_history_take(ngx_pool_t *pool, ngx_str_t *id,
    ngx_str_t **events, uint64_t *first, ngx_uint_t *n);

typedef struct ngx_http_agent_history_s  ngx_http_agent_history_t;

/*
 * Under the zone lock: a block for history, events upto - n + 1 .. upto,
 * and the conversation's log in the zone after them, for its next turn
 * (NULL: none); ngx_http_agent_store_history_keep() once the lock is
 * given back copies the history in (history stays valid until then) and
 * keeps the block
 */
ngx_http_agent_history_t *ngx_http_agent_store_history_keep_locked(
    ngx_http_agent_conv_t *conv, ngx_str_t *history, ngx_uint_t n,
    uint64_t upto);
void ngx_http_agent_store_history_keep(ngx_http_agent_history_t *h);

/* under the zone lock: an event added after the turn, kept with it */
ngx_http_agent_history_t *ngx_http_agent_store_history_add_locked(
    ngx_http_agent_conv_t *conv);

/*
 * Events after..upto for a request, copied into its pool, if this worker
 * kept them all (NGX_DECLINED: read the store)
 */
ngx_int_t ngx_http_agent_store_history_copy(ngx_pool_t *pool, ngx_str_t *id,
    uint64_t after, uint64_t upto, ngx_http_agent_event_t ***events,
    ngx_uint_t *n);

/* as the worker exits */
void ngx_http_agent_store_history_exit(void);

/* agent_store history=, bytes (0 with no store) */
size_t ngx_http_agent_store_history_max(void);


#endif /* _NGX_HTTP_AGENT_STORE_HISTORY_H_INCLUDED_ */
