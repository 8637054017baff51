/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"


/*
 * The "agent_tool" and "agent" blocks.  Their directives are parsed by a
 * custom handler, as nginx parses "types {}", from a table of commands
 * of their own: each directive's errors name its file and line, and the
 * stock slot setters fill the tool and agent structures.
 */


#define NGX_HTTP_AGENT_MAX_MODEL_CALLS  10
#define NGX_HTTP_AGENT_SUSPEND_TIMEOUT  300000
#define NGX_HTTP_AGENT_MODEL_TIMEOUT    600000
#define NGX_HTTP_AGENT_RETRY_ATTEMPTS   3
#define NGX_HTTP_AGENT_RETRY_BASE       500
#define NGX_HTTP_AGENT_RETRY_CAP        8000

#define NGX_HTTP_AGENT_SUMMARY_PROMPT                                        \
    "Summarize the conversation above for your own later use: the user's "  \
    "goals, facts and decisions, tool results that still matter, and open " \
    "questions. Include the earlier summary, if any. Reply with the "       \
    "summary only."


static char *ngx_http_agent_conf_utf8(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_agent_conf_positive(ngx_conf_t *cf, void *post,
    void *data);

static char *ngx_http_agent_options(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static void ngx_http_agent_options_cleanup(void *data);

static char *ngx_http_agent_provider(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_system_file(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_tools(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_retry(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_resolve_tool(ngx_conf_t *cf,
    ngx_http_agent_main_conf_t *amcf, ngx_http_agent_t *agent,
    ngx_http_agent_tool_ref_t *ref);


/* the values are the indexes: describe prints the names back */

ngx_conf_enum_t  ngx_http_agent_executors[] = {
    { ngx_string("server"), NGX_HTTP_AGENT_EXECUTOR_SERVER },
    { ngx_string("human"), NGX_HTTP_AGENT_EXECUTOR_HUMAN },
    { ngx_string("client"), NGX_HTTP_AGENT_EXECUTOR_CLIENT },
    { ngx_string("provider"), NGX_HTTP_AGENT_EXECUTOR_PROVIDER },
    { ngx_null_string, 0 }
};


ngx_conf_enum_t  ngx_http_agent_approvals[] = {
    { ngx_string("auto"), NGX_HTTP_AGENT_APPROVAL_AUTO },
    { ngx_string("requires_approval"), NGX_HTTP_AGENT_APPROVAL_REQUIRED },
    { ngx_null_string, 0 }
};


ngx_str_t  ngx_http_agent_pending_kinds[] = {
    ngx_null_string,
    ngx_string("approval"),
    ngx_string("elicitation"),
    ngx_string("client_exec")
};


ngx_conf_post_t  ngx_http_agent_conf_utf8_post =
    { ngx_http_agent_conf_utf8 };

static ngx_conf_post_t  ngx_http_agent_conf_positive_post =
    { ngx_http_agent_conf_positive };

/* OpenAI's APIs cache prompt prefixes by themselves: Anthropic only */
static ngx_conf_bitmask_t  ngx_http_agent_cache_points[] = {
    { ngx_string("system"), NGX_HTTP_AGENT_CACHE_SYSTEM },
    { ngx_string("tools"), NGX_HTTP_AGENT_CACHE_TOOLS },
    { ngx_string("summary"), NGX_HTTP_AGENT_CACHE_SUMMARY },
    { ngx_null_string, 0 }
};


static ngx_conf_num_bounds_t  ngx_http_agent_max_model_calls_bounds = {
    ngx_conf_check_num_bounds, 1, -1
};

static ngx_conf_num_bounds_t  ngx_http_agent_context_budget_bounds = {
    ngx_conf_check_num_bounds, 1, -1
};


static ngx_command_t  ngx_http_agent_block_commands[] = {

    { ngx_string("provider"),
      NGX_CONF_TAKE2,
      ngx_http_agent_provider,
      0,
      0,
      NULL },

    { ngx_string("model"),
      NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_http_agent_t, model),
      &ngx_http_agent_conf_utf8_post },

    { ngx_string("system"),
      NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_http_agent_t, system),
      &ngx_http_agent_conf_utf8_post },

    { ngx_string("system_file"),
      NGX_CONF_TAKE1,
      ngx_http_agent_system_file,
      0,
      0,
      NULL },

    { ngx_string("tools"),
      NGX_CONF_1MORE,
      ngx_http_agent_tools,
      0,
      0,
      NULL },

    { ngx_string("max_model_calls"),
      NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      0,
      offsetof(ngx_http_agent_t, max_model_calls),
      &ngx_http_agent_max_model_calls_bounds },

    { ngx_string("suspend_timeout"),
      NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      0,
      offsetof(ngx_http_agent_t, suspend_timeout),
      NULL },

    { ngx_string("model_timeout"),
      NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      0,
      offsetof(ngx_http_agent_t, model_timeout),
      &ngx_http_agent_conf_positive_post },

    { ngx_string("retry"),
      NGX_CONF_1MORE,
      ngx_http_agent_retry,
      0,
      0,
      NULL },

    { ngx_string("options"),
      NGX_CONF_TAKE1,
      ngx_http_agent_options,
      0,
      0,
      NULL },

    { ngx_string("notify"),
      NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_http_agent_t, notify),
      NULL },

    { ngx_string("cache"),
      NGX_CONF_1MORE,
      ngx_conf_set_bitmask_slot,
      0,
      offsetof(ngx_http_agent_t, cache),
      &ngx_http_agent_cache_points },

    { ngx_string("hook_before"),
      NGX_CONF_1MORE,
      ngx_http_agent_conf_hook,
      0,
      offsetof(ngx_http_agent_t, hook_before),
      NULL },

    { ngx_string("hook_after"),
      NGX_CONF_1MORE,
      ngx_http_agent_conf_hook,
      0,
      offsetof(ngx_http_agent_t, hook_after),
      NULL },

    { ngx_string("context_budget"),
      NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      0,
      offsetof(ngx_http_agent_t, context_budget),
      &ngx_http_agent_context_budget_bounds },

    { ngx_string("summary_model"),
      NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_http_agent_t, summary_model),
      &ngx_http_agent_conf_utf8_post },

    { ngx_string("summary_prompt"),
      NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_http_agent_t, summary_prompt),
      &ngx_http_agent_conf_utf8_post },

      ngx_null_command
};


char *
ngx_http_agent_conf_agent_block(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    char              *rv;
    ngx_str_t         *value;
    ngx_http_agent_t  *agent, **ap;

    value = cf->args->elts;

    if (ngx_http_agent_conf_name(&value[1]) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid agent name \"%V\", it must be "
                           "1 to %d letters, digits, \"_\" or \"-\"",
                           &value[1], NGX_HTTP_AGENT_NAME_MAX);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_agent_conf_find(amcf, &value[1]) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate agent \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    agent = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_t));
    if (agent == NULL) {
        return NGX_CONF_ERROR;
    }

    if (ngx_array_init(&agent->tools, cf->pool, 4,
                       sizeof(ngx_http_agent_tool_ref_t))
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    agent->name = value[1];
    agent->max_model_calls = NGX_CONF_UNSET;
    agent->context_budget = NGX_CONF_UNSET;
    agent->suspend_timeout = NGX_CONF_UNSET_MSEC;
    agent->model_timeout = NGX_CONF_UNSET_MSEC;
    agent->retry_attempts = NGX_CONF_UNSET_UINT;
    agent->retry_base = NGX_CONF_UNSET_MSEC;
    agent->retry_cap = NGX_CONF_UNSET_MSEC;
    agent->file = cf->conf_file->file.name.data;
    agent->line = cf->conf_file->line;

    ap = ngx_array_push(&amcf->agents);
    if (ap == NULL) {
        return NGX_CONF_ERROR;
    }

    *ap = agent;

    rv = ngx_http_agent_conf_parse_block(cf, "agent",
                                         ngx_http_agent_block_commands, agent);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    if (agent->provider == NULL) {
        ngx_http_agent_conf_error(cf, agent->file, agent->line,
                                  "agent \"%V\" has no \"provider\"",
                                  &agent->name);
        return NGX_CONF_ERROR;
    }

    if (agent->model.data == NULL) {
        ngx_http_agent_conf_error(cf, agent->file, agent->line,
                                  "agent \"%V\" has no \"model\"",
                                  &agent->name);
        return NGX_CONF_ERROR;
    }

    ngx_conf_init_value(agent->max_model_calls,
                        NGX_HTTP_AGENT_MAX_MODEL_CALLS);
    ngx_conf_init_value(agent->context_budget, 0);

    if (agent->summary_model.data == NULL) {
        agent->summary_model = agent->model;
    }

    if (agent->summary_prompt.data == NULL) {
        ngx_str_set(&agent->summary_prompt, NGX_HTTP_AGENT_SUMMARY_PROMPT);
    }
    ngx_conf_init_msec_value(agent->suspend_timeout,
                             NGX_HTTP_AGENT_SUSPEND_TIMEOUT);
    ngx_conf_init_msec_value(agent->model_timeout,
                             NGX_HTTP_AGENT_MODEL_TIMEOUT);
    ngx_conf_init_uint_value(agent->retry_attempts,
                             NGX_HTTP_AGENT_RETRY_ATTEMPTS);
    ngx_conf_init_msec_value(agent->retry_base, NGX_HTTP_AGENT_RETRY_BASE);
    ngx_conf_init_msec_value(agent->retry_cap, NGX_HTTP_AGENT_RETRY_CAP);

    return NGX_CONF_OK;
}


/*
 * Called once the http block is parsed, when every agent_tool is known
 * whatever the order of the blocks: binds the agents' tools and renders
 * each agent's tool list for its provider.
 */

char *
ngx_http_agent_conf_resolve(ngx_conf_t *cf, ngx_http_agent_main_conf_t *amcf)
{
    ngx_uint_t                  i, j;
    ngx_http_agent_t          **agents;
    ngx_http_agent_tool_ref_t  *ref;

    agents = amcf->agents.elts;

    for (i = 0; i < amcf->agents.nelts; i++) {

        if (ngx_http_agent_conf_mcp_bind(cf, amcf, agents[i])
            != NGX_CONF_OK)
        {
            return NGX_CONF_ERROR;
        }

        ref = agents[i]->tools.elts;

        for (j = 0; j < agents[i]->tools.nelts; j++) {
            if (ngx_http_agent_resolve_tool(cf, amcf, agents[i], &ref[j])
                != NGX_CONF_OK)
            {
                return NGX_CONF_ERROR;
            }
        }

        if (ngx_http_agent_provider_render_tools(cf, agents[i]) != NGX_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "agent \"%V\": cannot render the tool list",
                               &agents[i]->name);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_resolve_tool(ngx_conf_t *cf, ngx_http_agent_main_conf_t *amcf,
    ngx_http_agent_t *agent, ngx_http_agent_tool_ref_t *ref)
{
    ngx_http_agent_tool_t  *tool;

    tool = ngx_http_agent_conf_tool_find(amcf, &ref->name);

    if (tool == NULL) {
        ngx_http_agent_conf_error(cf, agent->file, ref->line,
            "agent \"%V\": unknown tool \"%V\" (no agent_tool \"%V\" is "
            "declared)", &agent->name, &ref->name, &ref->name);
        return NGX_CONF_ERROR;
    }

    if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {

        if (!agent->provider->hosts_tools) {
            ngx_http_agent_conf_error(cf, agent->file, ref->line,
                "agent \"%V\": tool \"%V\" has executor provider, which "
                "adapter %V cannot host", &agent->name, &ref->name,
                &agent->provider->name);
            return NGX_CONF_ERROR;
        }

        if (ngx_http_agent_provider_definition(tool, agent->provider)
            == NULL)
        {
            ngx_http_agent_conf_error(cf, agent->file, ref->line,
                "agent \"%V\": tool \"%V\" has no provider_definition "
                "for %V", &agent->name, &ref->name, &agent->provider->name);
            return NGX_CONF_ERROR;
        }
    }

    ref->tool = tool;

    return NGX_CONF_OK;
}


ngx_http_agent_t *
ngx_http_agent_conf_find(ngx_http_agent_main_conf_t *amcf, ngx_str_t *name)
{
    ngx_uint_t          i;
    ngx_http_agent_t  **agents;

    agents = amcf->agents.elts;

    for (i = 0; i < amcf->agents.nelts; i++) {
        if (agents[i]->name.len == name->len
            && ngx_strncmp(agents[i]->name.data, name->data, name->len) == 0)
        {
            return agents[i];
        }
    }

    return NULL;
}


/*
 * What a call of the tool awaits when it suspends in a phase: a gated
 * call first awaits approval; then a human call awaits the human's
 * answer and a client call the browser's.  NONE: it does not suspend.
 */

ngx_uint_t
ngx_http_agent_conf_pending_kind(ngx_http_agent_tool_t *tool,
    ngx_uint_t phase)
{
    if (phase == NGX_HTTP_AGENT_PHASE_APPROVAL) {
        return tool->approval == NGX_HTTP_AGENT_APPROVAL_REQUIRED
               ? NGX_HTTP_AGENT_PENDING_APPROVAL : NGX_HTTP_AGENT_PENDING_NONE;
    }

    switch (tool->executor) {

    case NGX_HTTP_AGENT_EXECUTOR_HUMAN:
        return NGX_HTTP_AGENT_PENDING_ELICITATION;

    case NGX_HTTP_AGENT_EXECUTOR_CLIENT:
        return NGX_HTTP_AGENT_PENDING_CLIENT_EXEC;

    default:
        return NGX_HTTP_AGENT_PENDING_NONE;
    }
}


static char *
ngx_http_agent_conf_utf8(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *s = data;

    if (ngx_http_agent_json_utf8(s) != NGX_OK) {
        return "is not valid UTF-8";
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_conf_positive(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *ms = data;

    if (*ms == 0) {
        return "must be more than 0";
    }

    return NGX_CONF_OK;
}


/*
 * options JSON: members added to every request body the agent sends,
 * for what the API takes there and no directive sets (Anthropic's
 * thinking and max_tokens, Responses' reasoning and include, sampling
 * parameters).  Passed through, as the tool schemas are.
 */

static char *
ngx_http_agent_options(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_t  *agent = conf;

    u_char              *p;
    char                 buf[NGX_HTTP_AGENT_JSON_ERR];
    ngx_int_t            rc;
    ngx_str_t            json, err, *value;
    yajl_val             v;
    ngx_pool_cleanup_t  *cln;

    if (agent->options) {
        return "is duplicate";
    }

    value = cf->args->elts;
    json = value[1];

    ngx_http_agent_json_trim(&json);

    rc = ngx_http_agent_json_object(cf->temp_pool, &json, &err);

    if (rc == NGX_DECLINED) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "agent \"%V\": options %V",
                           &agent->name, &err);
        return NGX_CONF_ERROR;
    }

    if (rc != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    p = ngx_pnalloc(cf->temp_pool, json.len + 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(p, json.data, json.len);
    p[json.len] = '\0';

    cln = ngx_pool_cleanup_add(cf->pool, 0);
    if (cln == NULL) {
        return NGX_CONF_ERROR;
    }

    v = ngx_http_agent_json_parse(p, json.len, NGX_HTTP_AGENT_JSON_DEPTH,
                                  buf, sizeof(buf));
    if (v == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "agent \"%V\": options %s",
                           &agent->name, buf);
        return NGX_CONF_ERROR;
    }

    cln->handler = ngx_http_agent_options_cleanup;
    cln->data = v;

    agent->options = v;
    agent->options_line = cf->conf_file->line;

    return NGX_CONF_OK;
}


static void
ngx_http_agent_options_cleanup(void *data)
{
    ngx_http_agent_json_free(data);
}


/* provider ADAPTER LOCATION */

static char *
ngx_http_agent_provider(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_t  *agent = conf;

    u_char                      *s, buf[NGX_MAX_CONF_ERRSTR];
    ngx_str_t                   *value;
    ngx_http_agent_provider_t  **p;

    if (agent->provider) {
        return "is duplicate";
    }

    value = cf->args->elts;

    agent->provider = ngx_http_agent_provider_find(&value[1]);

    if (agent->provider == NULL) {
        s = buf;

        for (p = ngx_http_agent_providers; *p; p++) {
            s = ngx_slprintf(s, buf + sizeof(buf), "%s\"%V\"",
                             p == ngx_http_agent_providers
                             ? "" : (p[1] ? ", " : " or "),
                             &(*p)->name);
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"provider\" directive, "
                           "it must be %*s", &value[1], s - buf, buf);
        return NGX_CONF_ERROR;
    }

    if (value[2].len == 0 || value[2].data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent \"%V\": provider location \"%V\" must be "
                           "a URI starting with \"/\"",
                           &agent->name, &value[2]);
        return NGX_CONF_ERROR;
    }

    agent->provider_location = value[2];

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_system_file(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_t  *agent = conf;

    ngx_str_t   name, *value;

    if (agent->system.data) {
        return "is duplicate";
    }

    value = cf->args->elts;
    name = value[1];

    if (ngx_http_agent_conf_read_file(cf, &name, &agent->system) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_agent_json_utf8(&agent->system) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent \"%V\": system_file \"%V\" is not valid "
                           "UTF-8", &agent->name, &name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* tools NAME ...; the names are bound once the http block is parsed */

static char *
ngx_http_agent_tools(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_t  *agent = conf;

    ngx_str_t                  *value;
    ngx_uint_t                  i, j;
    ngx_http_agent_tool_ref_t  *ref;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        ref = agent->tools.elts;

        for (j = 0; j < agent->tools.nelts; j++) {
            if (ref[j].name.len == value[i].len
                && ngx_strcmp(ref[j].name.data, value[i].data) == 0)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "agent \"%V\": tool \"%V\" is listed "
                                   "twice", &agent->name, &value[i]);
                return NGX_CONF_ERROR;
            }
        }

        ref = ngx_array_push(&agent->tools);
        if (ref == NULL) {
            return NGX_CONF_ERROR;
        }

        ref->name = value[i];
        ref->tool = NULL;
        ref->line = cf->conf_file->line;
    }

    return NGX_CONF_OK;
}


/* retry [attempts=N] [base=TIME] [cap=TIME]: what is omitted is default */

static char *
ngx_http_agent_retry(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_t  *agent = conf;

    ngx_int_t    n;
    ngx_str_t   *value, s;
    ngx_uint_t   i;

    if (agent->retry_attempts != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    agent->retry_attempts = NGX_HTTP_AGENT_RETRY_ATTEMPTS;
    agent->retry_base = NGX_HTTP_AGENT_RETRY_BASE;
    agent->retry_cap = NGX_HTTP_AGENT_RETRY_CAP;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "attempts=", 9) == 0) {
            n = ngx_atoi(value[i].data + 9, value[i].len - 9);
            if (n == NGX_ERROR) {
                goto invalid;
            }

            agent->retry_attempts = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "base=", 5) == 0) {
            s.data = value[i].data + 5;
            s.len = value[i].len - 5;

            n = ngx_parse_time(&s, 0);
            if (n == NGX_ERROR) {
                goto invalid;
            }

            agent->retry_base = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "cap=", 4) == 0) {
            s.data = value[i].data + 4;
            s.len = value[i].len - 4;

            n = ngx_parse_time(&s, 0);
            if (n == NGX_ERROR) {
                goto invalid;
            }

            agent->retry_cap = n;
            continue;
        }

        goto invalid;
    }

    if (agent->retry_base > agent->retry_cap) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent \"%V\": retry base=%Mms is greater than "
                           "cap=%Mms", &agent->name, agent->retry_base,
                           agent->retry_cap);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" in \"retry\" directive, "
                       "it must be \"attempts=N\", \"base=TIME\" or "
                       "\"cap=TIME\"", &value[i]);

    return NGX_CONF_ERROR;
}


