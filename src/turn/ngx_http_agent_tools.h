
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

/*
 * a call approved over HTTP, or resumed: it runs now; approver: who
 * approved it, as its resolution records (empty: no one named)
 */
ngx_int_t ngx_http_agent_tools_run_call(ngx_http_agent_turn_t *t,
    ngx_str_t *id, ngx_str_t *name, ngx_str_t *args, ngx_str_t *approver);

uint64_t ngx_http_agent_tools_deadline(ngx_http_agent_t *agent,
    ngx_http_agent_tool_t *tool);
ngx_uint_t ngx_http_agent_tools_json_call(yajl_gen g, ngx_str_t *id,
    ngx_str_t *name);
ngx_int_t ngx_http_agent_tools_suspension(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_http_agent_tool_t *tool, ngx_str_t *id,
    ngx_str_t *args, ngx_uint_t kind, uint64_t *deadline, ngx_str_t *fields);
ngx_int_t ngx_http_agent_tools_suspend_locked(ngx_http_agent_zone_t *zone,
    ngx_http_agent_conv_t *conv, ngx_http_agent_tool_t *tool, ngx_str_t *id,
    ngx_uint_t kind, uint64_t deadline, ngx_str_t *fields);
ngx_http_agent_tool_t *ngx_http_agent_tools_find(ngx_http_agent_t *agent,
    ngx_str_t *name);

/*
 * agent->provider_tools rendered from agent->tools by its adapter, in
 * pool (temp: the generator's), for an agent a turn made with more tools
 */
ngx_int_t ngx_http_agent_tools_render(ngx_pool_t *temp, ngx_pool_t *pool,
    ngx_http_agent_t *agent);

/* the tool a call of the turn names: the agent's, an MCP server's, the
   client's (its frontend tools); NULL: none */
ngx_http_agent_tool_t *ngx_http_agent_tools_lookup(ngx_http_agent_turn_t *t,
    ngx_str_t *name);

/* the batch's calls run, or some wait: the conversation's state says so */
void ngx_http_agent_tools_state(ngx_http_agent_turn_t *t,
    ngx_http_agent_fsm_input_e input);

/* a cancel: the running calls are aborted, each with a [cancelled] result */
void ngx_http_agent_tools_cancel(ngx_http_agent_turn_t *t);

/* a subrequest's upstream torn down, as when its request is terminated */
void ngx_http_agent_tools_abort(ngx_http_request_t *sr);

/* the output of a tool subrequest, from the turn's filters */
ngx_int_t ngx_http_agent_tools_header(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub);
ngx_int_t ngx_http_agent_tools_body(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub, ngx_chain_t *in);


#endif /* _NGX_HTTP_AGENT_TOOLS_H_INCLUDED_ */
