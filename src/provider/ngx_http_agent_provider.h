/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_PROVIDER_H_INCLUDED_
#define _NGX_HTTP_AGENT_PROVIDER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>

#include "ngx_http_agent_module.h"


/*
 * A provider adapter: what differs between the providers' wire formats.
 * The turn engine adds building a request, feeding a chunk of the
 * response stream and finishing it.
 */

struct ngx_http_agent_provider_s {
    ngx_str_t                     name;

    /* the provider can run tools itself (hosted web search, ...) */
    ngx_uint_t                    hosts_tools;

    /* the agent's tools as the provider's "tools" array */
    ngx_int_t                   (*render_tools)(yajl_gen g,
                                                ngx_http_agent_t *agent);
};


ngx_http_agent_provider_t *ngx_http_agent_provider_find(ngx_str_t *name);
ngx_int_t ngx_http_agent_provider_render_tools(ngx_conf_t *cf,
    ngx_http_agent_t *agent);
ngx_str_t *ngx_http_agent_provider_parameters(ngx_http_agent_tool_t *tool);
ngx_str_t *ngx_http_agent_provider_definition(ngx_http_agent_tool_t *tool,
    ngx_http_agent_provider_t *provider);
ngx_uint_t ngx_http_agent_provider_function(yajl_gen g,
    ngx_http_agent_tool_t *tool, ngx_str_t *schema_key);


extern ngx_http_agent_provider_t   ngx_http_agent_openai_chat;
extern ngx_http_agent_provider_t   ngx_http_agent_anthropic_messages;
extern ngx_http_agent_provider_t   ngx_http_agent_openai_responses;

extern ngx_http_agent_provider_t  *ngx_http_agent_providers[];


#endif /* _NGX_HTTP_AGENT_PROVIDER_H_INCLUDED_ */
