
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The frontend tools of RunAgentInput ("tools": [{"name", "description",
 * "parameters"}]), checked and written as the user_msg keeps them: the
 * turn that message starts offers them to the model after the agent's
 * own, and a call of one waits for the browser as a call of an
 * "executor client" tool does.  A name must be one every provider takes
 * and no other tool of the agent has; the list is bounded, since the
 * turn's user_msg stays in the zone while the turn runs.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_agui.h"


static char *ngx_http_agent_agui_tool(ngx_http_agent_t *agent, yajl_val list,
    ngx_uint_t n, yajl_gen g);
static ngx_uint_t ngx_http_agent_agui_tool_name(ngx_str_t *name);


/*
 * NGX_OK: *json is the tools as the user_msg keeps them, or empty for
 * none; NGX_DECLINED: *err says what is wrong with them.
 */

ngx_int_t
ngx_http_agent_agui_tools(ngx_http_request_t *r, yajl_val list,
    ngx_str_t *json, char **err)
{
    yajl_gen                    g;
    ngx_str_t                   s;
    ngx_uint_t                  i, failed;
    ngx_http_agent_loc_conf_t  *alcf;

    ngx_str_null(json);

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (!alcf->client_tools || list == NULL || YAJL_IS_NULL(list)) {
        return NGX_OK;
    }

    if (!YAJL_IS_ARRAY(list)) {
        *err = "\"tools\" must be an array";
        return NGX_DECLINED;
    }

    if (list->u.array.len == 0) {
        return NGX_OK;
    }

    if (list->u.array.len > NGX_HTTP_AGENT_AGUI_TOOLS) {
        *err = "\"tools\" has more than "
               NGX_HTTP_AGENT_AGUI_TOOLS_STR " tools";
        return NGX_DECLINED;
    }

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_array_open(g);

    for (i = 0; i < list->u.array.len; i++) {
        *err = ngx_http_agent_agui_tool(alcf->agent, list, i, g);

        if (*err) {
            return NGX_DECLINED;
        }
    }

    failed |= yajl_gen_array_close(g);

    if (ngx_http_agent_json_result(g, failed, &s) != NGX_OK) {
        return NGX_ERROR;
    }

    if (s.len > NGX_HTTP_AGENT_AGUI_TOOLS_SIZE) {
        *err = "\"tools\" take more than "
               NGX_HTTP_AGENT_AGUI_TOOLS_SIZE_STR " bytes";
        return NGX_DECLINED;
    }

    json->data = ngx_pstrdup(r->pool, &s);
    json->len = s.len;

    return json->data ? NGX_OK : NGX_ERROR;
}


/* tool n of the list, written into g; or what is wrong with it */

static char *
ngx_http_agent_agui_tool(ngx_http_agent_t *agent, yajl_val list,
    ngx_uint_t n, yajl_gen g)
{
    ngx_str_t                   name, other, description;
    ngx_uint_t                  i, failed;
    yajl_val                    tool, params;
    ngx_http_agent_tool_ref_t  *refs;

    tool = list->u.array.values[n];

    if (!YAJL_IS_OBJECT(tool)
        || ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(tool, "name"), &name)
           != NGX_OK)
    {
        return "a tool needs a \"name\", a string";
    }

    if (!ngx_http_agent_agui_tool_name(&name)) {
        return "a tool's name must be 1 to 64 letters, digits, "
               "\"_\" and \"-\"";
    }

    for (i = 0; i < n; i++) {
        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(list->u.array.values[i], "name"),
                &other)
            == NGX_OK
            && other.len == name.len
            && ngx_strncmp(other.data, name.data, name.len) == 0)
        {
            return "two tools have the same name";
        }
    }

    refs = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        if (refs[i].tool->name.len == name.len
            && ngx_strncmp(refs[i].tool->name.data, name.data, name.len)
               == 0)
        {
            return "a tool has the name of one of the agent's own";
        }
    }

    ngx_str_null(&description);

    if (ngx_http_agent_provider_get(tool, "description") != NULL
        && ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(tool, "description"),
               &description)
           != NGX_OK)
    {
        return "a tool's \"description\" must be a string";
    }

    params = ngx_http_agent_provider_get(tool, "parameters");

    if (params != NULL && !YAJL_IS_OBJECT(params)) {
        return "a tool's \"parameters\" must be an object (a JSON Schema)";
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &name);

    if (description.len) {
        failed |= ngx_http_agent_json_key(g, "description");
        failed |= ngx_http_agent_json_str(g, &description);
    }

    if (params) {
        failed |= ngx_http_agent_json_key(g, "parameters");
        failed |= ngx_http_agent_provider_value(g, params);
    }

    failed |= yajl_gen_map_close(g);

    /* out of memory only: the tree was parsed within the depth bound */

    return failed ? "a tool could not be read" : NULL;
}


/* ^[a-zA-Z0-9_-]{1,64}$, the names every provider takes */

static ngx_uint_t
ngx_http_agent_agui_tool_name(ngx_str_t *name)
{
    u_char      c;
    ngx_uint_t  i;

    if (name->len == 0 || name->len > 64) {
        return 0;
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '_' || c == '-'))
        {
            return 0;
        }
    }

    return 1;
}
