
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_CLIENT_TOOLS_H_INCLUDED_
#define _NGX_HTTP_AGENT_CLIENT_TOOLS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_turn.h"


/*
 * The frontend tools the turn's user_msg offers ("client_tools", from
 * AG-UI's RunAgentInput): tools like "executor client" ones, read from
 * the log once per turn, so a turn taken over or revived has them too.
 */

/* agent with the turn's frontend tools after its own, or agent; NULL */
ngx_http_agent_t *ngx_http_agent_client_tools_agent(ngx_http_agent_turn_t *t,
    ngx_http_agent_t *agent);

/* the turn's frontend tool of that name, or NULL */
ngx_http_agent_tool_t *ngx_http_agent_client_tools_find(
    ngx_http_agent_turn_t *t, ngx_str_t *name);


#endif /* _NGX_HTTP_AGENT_CLIENT_TOOLS_H_INCLUDED_ */
