/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_describe.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_mcp_rpc.h"


/*
 * agent_describe: the location's agent as the module understands it,
 * including the exact tool list it sends to the provider.
 */


static ngx_uint_t ngx_http_agent_describe_agent(yajl_gen g,
    ngx_http_request_t *r, ngx_http_agent_t *agent);
static ngx_uint_t ngx_http_agent_describe_tool(yajl_gen g,
    ngx_http_agent_t *agent, ngx_http_agent_tool_t *tool);
static ngx_uint_t ngx_http_agent_describe_bound(yajl_gen g,
    ngx_uint_t bound);


ngx_int_t
ngx_http_agent_describe_handler(ngx_http_request_t *r)
{
    yajl_gen                    g;
    ngx_int_t                   rc;
    ngx_str_t                   json;
    ngx_uint_t                  failed;
    ngx_http_agent_loc_conf_t  *alcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_agent_json_method(r, "GET, HEAD");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    failed = ngx_http_agent_describe_agent(g, r, alcf->agent);

    if (ngx_http_agent_json_result(g, failed, &json) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_json_send(r, NGX_HTTP_OK, &json);
}


static ngx_uint_t
ngx_http_agent_describe_agent(yajl_gen g, ngx_http_request_t *r,
    ngx_http_agent_t *agent)
{
    ngx_uint_t                   i, failed;
    ngx_http_agent_tool_ref_t   *ref;
    ngx_http_agent_main_conf_t  *amcf;

    failed = yajl_gen_map_open(g);

    failed |= ngx_http_agent_json_key(g, "agent");
    failed |= ngx_http_agent_json_str(g, &agent->name);
    failed |= ngx_http_agent_json_key(g, "version");
    failed |= yajl_gen_string(g, (u_char *) NGX_HTTP_AGENT_VERSION,
                              sizeof(NGX_HTTP_AGENT_VERSION) - 1);
    failed |= ngx_http_agent_json_key(g, "provider");
    failed |= ngx_http_agent_json_str(g, &agent->provider->name);
    failed |= ngx_http_agent_json_key(g, "provider_location");
    failed |= ngx_http_agent_json_str(g, &agent->provider_location);
    failed |= ngx_http_agent_json_key(g, "model");
    failed |= ngx_http_agent_json_str(g, &agent->model);
    failed |= ngx_http_agent_json_key(g, "max_model_calls");
    failed |= yajl_gen_integer(g, agent->max_model_calls);
    failed |= ngx_http_agent_json_key(g, "suspend_timeout_ms");
    failed |= yajl_gen_integer(g, agent->suspend_timeout);
    failed |= ngx_http_agent_json_key(g, "model_timeout_ms");
    failed |= yajl_gen_integer(g, agent->model_timeout);

    failed |= ngx_http_agent_json_key(g, "context");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "budget");

    if (agent->context_budget) {
        failed |= yajl_gen_integer(g, agent->context_budget);

    } else {
        failed |= yajl_gen_null(g);
    }

    failed |= ngx_http_agent_json_key(g, "summary_model");
    failed |= ngx_http_agent_json_str(g, &agent->summary_model);
    failed |= ngx_http_agent_json_key(g, "summary_prompt");
    failed |= ngx_http_agent_json_str(g, &agent->summary_prompt);
    failed |= yajl_gen_map_close(g);

    failed |= ngx_http_agent_json_key(g, "retry");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "attempts");
    failed |= yajl_gen_integer(g, agent->retry_attempts);
    failed |= ngx_http_agent_json_key(g, "base_ms");
    failed |= yajl_gen_integer(g, agent->retry_base);
    failed |= ngx_http_agent_json_key(g, "cap_ms");
    failed |= yajl_gen_integer(g, agent->retry_cap);
    failed |= yajl_gen_map_close(g);

    failed |= ngx_http_agent_json_key(g, "system");
    failed |= ngx_http_agent_json_str_or_null(g, &agent->system);

    failed |= ngx_http_agent_json_key(g, "tools");
    failed |= yajl_gen_array_open(g);

    ref = agent->tools.elts;

    for (i = 0; i < agent->tools.nelts; i++) {
        failed |= ngx_http_agent_describe_tool(g, agent, ref[i].tool);
    }

    failed |= yajl_gen_array_close(g);

    /* MCP servers, with the tools the zone has listed */

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    failed |= ngx_http_agent_json_key(g, "mcp");
    failed |= ngx_http_agent_mcp_list_describe(g, r->pool, amcf->zone, agent);

    failed |= ngx_http_agent_json_key(g, "provider_tools");
    failed |= ngx_http_agent_json_verbatim(g, &agent->provider_tools);

    failed |= yajl_gen_map_close(g);

    return failed;
}


static ngx_uint_t
ngx_http_agent_describe_tool(yajl_gen g, ngx_http_agent_t *agent,
    ngx_http_agent_tool_t *tool)
{
    ngx_msec_t  timeout;
    ngx_uint_t  phase, kind, failed;

    timeout = (tool->timeout != NGX_CONF_UNSET_MSEC) ? tool->timeout
                                                     : agent->suspend_timeout;

    failed = yajl_gen_map_open(g);

    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &tool->name);
    failed |= ngx_http_agent_json_key(g, "description");
    failed |= ngx_http_agent_json_str_or_null(g, &tool->description);
    failed |= ngx_http_agent_json_key(g, "executor");
    failed |= ngx_http_agent_json_str(g,
                                &ngx_http_agent_executors[tool->executor].name);
    failed |= ngx_http_agent_json_key(g, "approval");
    failed |= ngx_http_agent_json_str(g,
                                &ngx_http_agent_approvals[tool->approval].name);
    failed |= ngx_http_agent_json_key(g, "streaming");
    failed |= yajl_gen_bool(g, tool->streaming ? 1 : 0);
    failed |= ngx_http_agent_json_key(g, "timeout_ms");
    failed |= yajl_gen_integer(g, timeout);

    if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_SERVER) {
        failed |= ngx_http_agent_json_key(g, "location");
        failed |= ngx_http_agent_json_str(g, &tool->location);
    }

    /* the suspensions a call goes through, in order */

    failed |= ngx_http_agent_json_key(g, "pending");
    failed |= yajl_gen_array_open(g);

    for (phase = 0; phase < NGX_HTTP_AGENT_NPHASES; phase++) {
        kind = ngx_http_agent_conf_pending_kind(tool, phase);

        if (kind != NGX_HTTP_AGENT_PENDING_NONE) {
            failed |= ngx_http_agent_json_str(g,
                                          &ngx_http_agent_pending_kinds[kind]);
        }
    }

    failed |= yajl_gen_array_close(g);

    failed |= ngx_http_agent_json_key(g, "retention");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "turns");
    failed |= ngx_http_agent_describe_bound(g, tool->retention.turns);
    failed |= ngx_http_agent_json_key(g, "count");
    failed |= ngx_http_agent_describe_bound(g, tool->retention.count);
    failed |= ngx_http_agent_json_key(g, "never_evict");
    failed |= yajl_gen_bool(g, tool->retention.never_evict ? 1 : 0);
    failed |= yajl_gen_map_close(g);

    failed |= yajl_gen_map_close(g);

    return failed;
}


/* a retention bound, null when there is none */

static ngx_uint_t
ngx_http_agent_describe_bound(yajl_gen g, ngx_uint_t bound)
{
    if (bound == 0) {
        return yajl_gen_null(g);
    }

    return yajl_gen_integer(g, bound);
}
