
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_WAKE_H_INCLUDED_
#define _NGX_HTTP_AGENT_WAKE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/*
 * What a wake-up does in the worker it reaches, in the layers above:
 * set once, at configuration (ngx_http_agent_module.c).
 */
typedef struct {
    void                        (*deliver)(ngx_str_t *id);  /* subscribers */
    void                        (*cancel)(ngx_str_t *id);   /* its turn */
    void                        (*shutdown)(void);          /* streams end */
    void                        (*written)(void);           /* inputs */
} ngx_http_agent_wake_handlers_t;


ngx_int_t ngx_http_agent_wake_init_process(ngx_cycle_t *cycle);
void ngx_http_agent_wake_exit_process(ngx_cycle_t *cycle);

/*
 * The conversation has new events: the workers named (from
 * ngx_http_agent_conv_sub_pids_locked()) are told to let their subscribers
 * catch up.  Called with the zone unlocked.
 */
void ngx_http_agent_wake(ngx_str_t *id, ngx_pid_t *pids, ngx_uint_t n);

/*
 * Inputs that waited for a write were written: the workers named (this
 * one left out) are told to answer theirs.  Unlike ngx_http_agent_wake(),
 * called on a thread of the pool, as the write ends: a datagram is sent
 * or not, and nothing is kept; an input that misses it is seen by its
 * poll.
 */
void ngx_http_agent_wake_written(ngx_pid_t *pids, ngx_uint_t n);


extern ngx_http_agent_wake_handlers_t  ngx_http_agent_wake_handlers;


#endif /* _NGX_HTTP_AGENT_WAKE_H_INCLUDED_ */
