
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_TOOLS_H_INCLUDED_
#define _NGX_HTTP_AGENT_TOOLS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_turn.h"


/*
 * The tool calls of the reply just logged: server calls go to their
 * locations, the others are suspended.  NGX_OK: calls are running and
 * ngx_http_agent_turn_tools_done() follows when the last ends; NGX_DONE:
 * nothing is running; NGX_ERROR.
 */
ngx_int_t ngx_http_agent_tools_dispatch(ngx_http_agent_turn_t *t);

/* the output of a tool subrequest, from the turn's filters */
ngx_int_t ngx_http_agent_tools_header(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub);
ngx_int_t ngx_http_agent_tools_body(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub, ngx_chain_t *in);


#endif /* _NGX_HTTP_AGENT_TOOLS_H_INCLUDED_ */
