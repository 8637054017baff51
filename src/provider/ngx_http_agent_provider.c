/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"


ngx_http_agent_provider_t  *ngx_http_agent_providers[] = {
    &ngx_http_agent_openai_chat,
    &ngx_http_agent_anthropic_messages,
    &ngx_http_agent_openai_responses,
    NULL
};


/* what a tool declared without parameters takes: nothing */
static ngx_str_t  ngx_http_agent_no_parameters =
    ngx_string("{\"type\":\"object\",\"properties\":{}}");


ngx_http_agent_provider_t *
ngx_http_agent_provider_find(ngx_str_t *name)
{
    ngx_http_agent_provider_t  **p;

    for (p = ngx_http_agent_providers; *p; p++) {
        if ((*p)->name.len == name->len
            && ngx_strncmp((*p)->name.data, name->data, name->len) == 0)
        {
            return *p;
        }
    }

    return NULL;
}


/*
 * The tool list is the same for every request of an agent, so it is
 * rendered once, at configuration time, into the configuration's pool.
 */

ngx_int_t
ngx_http_agent_provider_render_tools(ngx_conf_t *cf, ngx_http_agent_t *agent)
{
    yajl_gen   g;
    ngx_str_t  json;

    g = ngx_http_agent_json_gen(cf->temp_pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    if (agent->provider->render_tools(g, agent) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_json_result(g, 0, &json) != NGX_OK) {
        return NGX_ERROR;
    }

    agent->provider_tools.data = ngx_pstrdup(cf->pool, &json);
    if (agent->provider_tools.data == NULL) {
        return NGX_ERROR;
    }

    agent->provider_tools.len = json.len;

    return NGX_OK;
}


ngx_str_t *
ngx_http_agent_provider_parameters(ngx_http_agent_tool_t *tool)
{
    if (tool->parameters.len == 0) {
        return &ngx_http_agent_no_parameters;
    }

    return &tool->parameters;
}


ngx_str_t *
ngx_http_agent_provider_definition(ngx_http_agent_tool_t *tool,
    ngx_http_agent_provider_t *provider)
{
    ngx_uint_t                  i;
    ngx_http_agent_tool_def_t  *def;

    if (tool->definitions == NULL) {
        return NULL;
    }

    def = tool->definitions->elts;

    for (i = 0; i < tool->definitions->nelts; i++) {
        if (def[i].provider == provider) {
            return &def[i].json;
        }
    }

    return NULL;
}


/*
 * "name", "description" and the schema under the adapter's key, into a
 * map the caller has opened: the part of a function tool every adapter
 * shares.
 */

ngx_uint_t
ngx_http_agent_provider_function(yajl_gen g, ngx_http_agent_tool_t *tool,
    ngx_str_t *schema_key)
{
    ngx_uint_t  failed;

    failed = ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &tool->name);

    if (tool->description.data) {
        failed |= ngx_http_agent_json_key(g, "description");
        failed |= ngx_http_agent_json_str(g, &tool->description);
    }

    failed |= ngx_http_agent_json_str(g, schema_key);
    failed |= ngx_http_agent_json_verbatim(g,
                                      ngx_http_agent_provider_parameters(tool));

    return failed;
}
