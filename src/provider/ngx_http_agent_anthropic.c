/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"


static ngx_str_t  ngx_http_agent_schema = ngx_string("input_schema");


/* Anthropic Messages */


static ngx_int_t ngx_http_agent_anthropic_render_tools(yajl_gen g,
    ngx_http_agent_t *agent);


ngx_http_agent_provider_t  ngx_http_agent_anthropic_messages = {
    ngx_string("anthropic_messages"),
    1,
    ngx_http_agent_anthropic_render_tools,
    NULL,                                  /* build_request */
    NULL,                                  /* init */
    NULL,                                  /* feed */
    NULL                                   /* finish */
};


/*
 * [{"name","description","input_schema"}, <hosted tool definition>]:
 * a hosted tool (web_search_20250305, ...) is its definition as declared
 */

static ngx_int_t
ngx_http_agent_anthropic_render_tools(yajl_gen g, ngx_http_agent_t *agent)
{
    ngx_str_t                  *def;
    ngx_uint_t                  i, failed;
    ngx_http_agent_tool_t      *tool;
    ngx_http_agent_tool_ref_t  *ref;

    failed = yajl_gen_array_open(g);

    ref = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        tool = ref[i].tool;

        if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {
            def = ngx_http_agent_provider_definition(tool,
                                            &ngx_http_agent_anthropic_messages);
            if (def == NULL) {
                return NGX_ERROR;
            }

            failed |= ngx_http_agent_json_verbatim(g, def);
            continue;
        }

        failed |= yajl_gen_map_open(g);

        failed |= ngx_http_agent_provider_function(g, tool,
                                                   &ngx_http_agent_schema);

        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);

    return failed ? NGX_ERROR : NGX_OK;
}
