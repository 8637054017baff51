
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The "agent_tool NAME { ... }" block: a tool's description, parameters,
 * executor, approval, streaming, retention, timeout and location, each
 * directive checked where it stands.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"


static char *ngx_http_agent_tool_check(ngx_conf_t *cf,
    ngx_http_agent_tool_t *tool);
static char *ngx_http_agent_tool_json(ngx_conf_t *cf,
    ngx_http_agent_tool_t *tool, ngx_str_t *json, ngx_str_t *what);
static char *ngx_http_agent_tool_parameters(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_agent_tool_parameters_file(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_agent_tool_approval(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_tool_retention(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_agent_tool_location(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_tool_definition(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);


static ngx_command_t  ngx_http_agent_tool_commands[] = {

    { ngx_string("description"),
      NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      0,
      offsetof(ngx_http_agent_tool_t, description),
      &ngx_http_agent_conf_utf8_post },

    { ngx_string("parameters"),
      NGX_CONF_TAKE1,
      ngx_http_agent_tool_parameters,
      0,
      0,
      NULL },

    { ngx_string("parameters_file"),
      NGX_CONF_TAKE1,
      ngx_http_agent_tool_parameters_file,
      0,
      0,
      NULL },

    { ngx_string("executor"),
      NGX_CONF_TAKE1,
      ngx_http_agent_conf_set_enum,
      0,
      offsetof(ngx_http_agent_tool_t, executor),
      &ngx_http_agent_executors },

    { ngx_string("approval"),
      NGX_CONF_TAKE1,
      ngx_http_agent_tool_approval,
      0,
      offsetof(ngx_http_agent_tool_t, approval),
      &ngx_http_agent_approvals },

    { ngx_string("streaming"),
      NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      0,
      offsetof(ngx_http_agent_tool_t, streaming),
      NULL },

    { ngx_string("retention"),
      NGX_CONF_1MORE,
      ngx_http_agent_tool_retention,
      0,
      0,
      NULL },

    { ngx_string("timeout"),
      NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      0,
      offsetof(ngx_http_agent_tool_t, timeout),
      NULL },

    { ngx_string("location"),
      NGX_CONF_TAKE1,
      ngx_http_agent_tool_location,
      0,
      0,
      NULL },

    { ngx_string("provider_definition"),
      NGX_CONF_TAKE2,
      ngx_http_agent_tool_definition,
      0,
      0,
      NULL },

      ngx_null_command
};


char *
ngx_http_agent_conf_tool_block(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    char                    *rv;
    ngx_str_t               *value;
    ngx_http_agent_tool_t   *tool, **tp;

    value = cf->args->elts;

    if (ngx_http_agent_conf_name(&value[1]) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid agent_tool name \"%V\", it must be "
                           "1 to %d letters, digits, \"_\" or \"-\"",
                           &value[1], NGX_HTTP_AGENT_NAME_MAX);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_agent_conf_tool_find(amcf, &value[1]) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate agent_tool \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    tool = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_tool_t));
    if (tool == NULL) {
        return NGX_CONF_ERROR;
    }

    tool->name = value[1];
    tool->executor = NGX_CONF_UNSET_UINT;
    tool->approval = NGX_CONF_UNSET_UINT;
    tool->streaming = NGX_CONF_UNSET;
    tool->timeout = NGX_CONF_UNSET_MSEC;
    tool->file = cf->conf_file->file.name.data;
    tool->line = cf->conf_file->line;

    tp = ngx_array_push(&amcf->tools);
    if (tp == NULL) {
        return NGX_CONF_ERROR;
    }

    *tp = tool;

    rv = ngx_http_agent_conf_parse_block(cf, "agent_tool",
                                         ngx_http_agent_tool_commands, tool);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    ngx_conf_init_uint_value(tool->executor, NGX_HTTP_AGENT_EXECUTOR_SERVER);
    ngx_conf_init_uint_value(tool->approval, NGX_HTTP_AGENT_APPROVAL_AUTO);
    ngx_conf_init_value(tool->streaming, 0);

    return ngx_http_agent_tool_check(cf, tool);
}


/*
 * The legal matrix: the approval gate suspends a call before it runs,
 * which is meaningless for a human (their answer is the decision) and
 * impossible for the provider (it runs the tool mid-stream).  Checked
 * once the whole block is read, so the order of directives is free;
 * errors point at the directive that does not fit.
 */

static char *
ngx_http_agent_tool_check(ngx_conf_t *cf, ngx_http_agent_tool_t *tool)
{
    ngx_str_t                  *executor;
    ngx_http_agent_tool_def_t  *def;

    executor = &ngx_http_agent_executors[tool->executor].name;

    if (tool->approval == NGX_HTTP_AGENT_APPROVAL_REQUIRED) {

        if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_HUMAN) {
            ngx_http_agent_conf_error(cf, tool->file, tool->approval_line,
                "agent_tool \"%V\": approval requires_approval is not "
                "allowed with executor human (a human tool's answer is "
                "already the human's decision)", &tool->name);
            return NGX_CONF_ERROR;
        }

        if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {
            ngx_http_agent_conf_error(cf, tool->file, tool->approval_line,
                "agent_tool \"%V\": approval requires_approval is not "
                "allowed with executor provider (the provider runs the "
                "tool mid-stream, there is no point to suspend before it "
                "runs)", &tool->name);
            return NGX_CONF_ERROR;
        }
    }

    if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_SERVER) {

        if (tool->location.data == NULL) {
            ngx_http_agent_conf_error(cf, tool->file, tool->line,
                "agent_tool \"%V\": executor server needs a \"location\" "
                "to route the call to", &tool->name);
            return NGX_CONF_ERROR;
        }

    } else if (tool->location.data) {
        ngx_http_agent_conf_error(cf, tool->file, tool->location_line,
            "agent_tool \"%V\": \"location\" is only for executor server, "
            "not %V", &tool->name, executor);
        return NGX_CONF_ERROR;
    }

    if (tool->executor == NGX_HTTP_AGENT_EXECUTOR_PROVIDER) {

        if (tool->definitions == NULL) {
            ngx_http_agent_conf_error(cf, tool->file, tool->line,
                "agent_tool \"%V\": executor provider needs a "
                "\"provider_definition\"", &tool->name);
            return NGX_CONF_ERROR;
        }

        if (tool->parameters.data) {
            ngx_http_agent_conf_error(cf, tool->file, tool->line,
                "agent_tool \"%V\": executor provider takes no "
                "\"parameters\", its provider_definition describes it",
                &tool->name);
            return NGX_CONF_ERROR;
        }

    } else if (tool->definitions) {
        def = tool->definitions->elts;

        ngx_http_agent_conf_error(cf, tool->file, def[0].line,
            "agent_tool \"%V\": \"provider_definition\" is only for "
            "executor provider, not %V", &tool->name, executor);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


ngx_http_agent_tool_t *
ngx_http_agent_conf_tool_find(ngx_http_agent_main_conf_t *amcf,
    ngx_str_t *name)
{
    ngx_uint_t               i;
    ngx_http_agent_tool_t  **tools;

    tools = amcf->tools.elts;

    for (i = 0; i < amcf->tools.nelts; i++) {
        if (tools[i]->name.len == name->len
            && ngx_strncmp(tools[i]->name.data, name->data, name->len) == 0)
        {
            return tools[i];
        }
    }

    return NULL;
}


static char *
ngx_http_agent_tool_json(ngx_conf_t *cf, ngx_http_agent_tool_t *tool,
    ngx_str_t *json, ngx_str_t *what)
{
    ngx_int_t  rc;
    ngx_str_t  err;

    ngx_http_agent_json_trim(json);

    rc = ngx_http_agent_json_object(cf->temp_pool, json, &err);

    if (rc == NGX_OK) {
        return NGX_CONF_OK;
    }

    if (rc == NGX_DECLINED) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "agent_tool \"%V\": %V %V",
                           &tool->name, what, &err);
    }

    return NGX_CONF_ERROR;
}


static char *
ngx_http_agent_tool_parameters(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_agent_tool_t  *tool = conf;

    ngx_str_t   json, *value;
    ngx_str_t   what = ngx_string("parameters");

    if (tool->parameters.data) {
        return "is duplicate";
    }

    value = cf->args->elts;
    json = value[1];

    if (ngx_http_agent_tool_json(cf, tool, &json, &what) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    tool->parameters = json;

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_tool_parameters_file(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_agent_tool_t  *tool = conf;

    ngx_str_t   name, json, what, *value;

    if (tool->parameters.data) {
        return "is duplicate";
    }

    value = cf->args->elts;
    name = value[1];

    if (ngx_http_agent_conf_read_file(cf, &name, &json) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    what.len = sizeof("parameters_file \"\"") - 1 + name.len;
    what.data = ngx_pnalloc(cf->temp_pool, what.len);
    if (what.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_sprintf(what.data, "parameters_file \"%V\"", &name);

    if (ngx_http_agent_tool_json(cf, tool, &json, &what) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    tool->parameters = json;

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_tool_approval(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_tool_t  *tool = conf;

    char  *rv;

    rv = ngx_http_agent_conf_set_enum(cf, cmd, conf);

    if (rv == NGX_CONF_OK) {
        tool->approval_line = cf->conf_file->line;
    }

    return rv;
}


/* retention [turns=N] [count=N] [never_evict] */

static char *
ngx_http_agent_tool_retention(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_tool_t  *tool = conf;

    ngx_int_t    n;
    ngx_str_t   *value;
    ngx_uint_t   i;

    if (tool->retention_line) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "turns=", 6) == 0) {
            n = ngx_atoi(value[i].data + 6, value[i].len - 6);
            if (n == NGX_ERROR || n == 0) {
                goto invalid;
            }

            tool->retention.turns = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "count=", 6) == 0) {
            n = ngx_atoi(value[i].data + 6, value[i].len - 6);
            if (n == NGX_ERROR || n == 0) {
                goto invalid;
            }

            tool->retention.count = n;
            continue;
        }

        if (ngx_strcmp(value[i].data, "never_evict") == 0) {
            tool->retention.never_evict = 1;
            continue;
        }

        goto invalid;
    }

    if (tool->retention.never_evict
        && (tool->retention.turns || tool->retention.count))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent_tool \"%V\": retention never_evict cannot "
                           "be combined with turns= or count=", &tool->name);
        return NGX_CONF_ERROR;
    }

    tool->retention_line = cf->conf_file->line;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" in \"retention\" directive, "
                       "it must be \"turns=N\", \"count=N\" or "
                       "\"never_evict\" (N > 0)", &value[i]);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_agent_tool_location(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_tool_t  *tool = conf;

    ngx_str_t  *value;

    if (tool->location.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent_tool \"%V\": location \"%V\" must be a URI "
                           "starting with \"/\"", &tool->name, &value[1]);
        return NGX_CONF_ERROR;
    }

    tool->location = value[1];
    tool->location_line = cf->conf_file->line;

    return NGX_CONF_OK;
}


/* provider_definition ADAPTER JSON: a hosted tool as one adapter sends it */

static char *
ngx_http_agent_tool_definition(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_agent_tool_t  *tool = conf;

    u_char                      *s, buf[NGX_MAX_CONF_ERRSTR];
    ngx_str_t                    json, what, *value;
    ngx_uint_t                   i;
    ngx_http_agent_tool_def_t   *def;
    ngx_http_agent_provider_t   *provider, **p;

    value = cf->args->elts;

    provider = ngx_http_agent_provider_find(&value[1]);

    if (provider == NULL || !provider->hosts_tools) {
        s = buf;
        i = 0;

        for (p = ngx_http_agent_providers; *p; p++) {
            if ((*p)->hosts_tools) {
                s = ngx_slprintf(s, buf + sizeof(buf), "%s\"%V\"",
                                 i++ ? " or " : "", &(*p)->name);
            }
        }

        if (provider) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "agent_tool \"%V\": adapter %V cannot host "
                               "provider tools, \"provider_definition\" is "
                               "for %*s", &tool->name, &provider->name,
                               s - buf, buf);

        } else {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "agent_tool \"%V\": unknown adapter \"%V\" in "
                               "\"provider_definition\", it must be %*s",
                               &tool->name, &value[1], s - buf, buf);
        }

        return NGX_CONF_ERROR;
    }

    if (ngx_http_agent_provider_definition(tool, provider) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent_tool \"%V\": duplicate provider_definition "
                           "for %V", &tool->name, &provider->name);
        return NGX_CONF_ERROR;
    }

    json = value[2];

    what.len = sizeof("provider_definition for ") - 1 + provider->name.len;
    what.data = ngx_pnalloc(cf->temp_pool, what.len);
    if (what.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_sprintf(what.data, "provider_definition for %V", &provider->name);

    if (ngx_http_agent_tool_json(cf, tool, &json, &what) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (tool->definitions == NULL) {
        tool->definitions = ngx_array_create(cf->pool, 2,
                                             sizeof(ngx_http_agent_tool_def_t));
        if (tool->definitions == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    def = ngx_array_push(tool->definitions);
    if (def == NULL) {
        return NGX_CONF_ERROR;
    }

    def->provider = provider;
    def->json = json;
    def->line = cf->conf_file->line;

    return NGX_CONF_OK;
}
