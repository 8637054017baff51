
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_SUMMARY_H_INCLUDED_
#define _NGX_HTTP_AGENT_SUMMARY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_turn.h"


/* what a token is taken for, in bytes of a request, until one is counted */
#define NGX_HTTP_AGENT_TOKEN_BYTES  4


ngx_int_t ngx_http_agent_summary_init_filters(ngx_conf_t *cf);

/*
 * Whether the context of the turn's last model call, with its reply, is
 * past the agent's context_budget: the provider's count of its input
 * tokens, or else an estimate from the request's size.
 */
ngx_uint_t ngx_http_agent_summary_due(ngx_http_agent_turn_t *t);

/*
 * The turns before the conversation's last one are summed up by a model
 * call on a request of its own, after the turn: the summary event is
 * recorded when it ends, and a failed one changes nothing (the next turn
 * past the budget tries again).
 */
void ngx_http_agent_summary_start(ngx_http_agent_t *agent,
    ngx_http_agent_zone_t *zone, ngx_str_t *id);


#endif /* _NGX_HTTP_AGENT_SUMMARY_H_INCLUDED_ */
