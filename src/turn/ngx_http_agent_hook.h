
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_HOOK_H_INCLUDED_
#define _NGX_HTTP_AGENT_HOOK_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_turn.h"


/* the most of a hook's answer that is read */
#define NGX_HTTP_AGENT_HOOK_MAX  (64 * 1024)


/*
 * The agent's hook_before, before a model call, or hook_after, after a
 * reply was logged: a POST subrequest to its location.  NGX_AGAIN: it
 * runs, and the turn goes on from its answer (the model call made, the
 * reply's calls run) or ends (turn_halted, turn_failed); NGX_ERROR.
 */
ngx_int_t ngx_http_agent_hook_before(ngx_http_agent_turn_t *t);
ngx_int_t ngx_http_agent_hook_after(ngx_http_agent_turn_t *t);

/*
 * hook_before was asked for the model call to come: the log ends in its
 * injection
 */
ngx_uint_t ngx_http_agent_hook_injected(ngx_http_agent_turn_t *t);

/* the turn goes away: a hook that runs is aborted */
void ngx_http_agent_hook_abort(ngx_http_agent_turn_t *t);

/* the output of a hook's subrequest, from the turn's filters */
ngx_int_t ngx_http_agent_hook_header(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub);
ngx_int_t ngx_http_agent_hook_body(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub, ngx_chain_t *in);


#endif /* _NGX_HTTP_AGENT_HOOK_H_INCLUDED_ */
