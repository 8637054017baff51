
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * "agent_mcp NAME location=URI [tools=all|A,B] [approval=none|all|A,B]
 * [timeout=TIME] [refresh=TIME] [rpc_timeout=TIME];": an MCP server
 * reached through an nginx location.  An agent names the server in its
 * "tools" as it names a tool, and gets the server's tools.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_mcp.h"


static char *ngx_http_agent_mcp_param(ngx_conf_t *cf,
    ngx_http_agent_mcp_t *mcp, ngx_str_t *value);
static char *ngx_http_agent_mcp_push(ngx_conf_t *cf, ngx_array_t **list,
    ngx_http_agent_mcp_t *mcp);
static ngx_array_t *ngx_http_agent_mcp_names(ngx_conf_t *cf, ngx_str_t *list);
static ngx_int_t ngx_http_agent_mcp_listed(ngx_array_t *names,
    ngx_str_t *name);


char *
ngx_http_agent_conf_mcp(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    ngx_str_t              *value, *name;
    ngx_uint_t              i;
    ngx_http_agent_mcp_t   *mcp;

    value = cf->args->elts;

    if (ngx_http_agent_conf_name(&value[1]) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid agent_mcp name \"%V\", it must be "
                           "1 to %d letters, digits, \"_\" or \"-\"",
                           &value[1], NGX_HTTP_AGENT_NAME_MAX);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_agent_conf_mcp_find(amcf, &value[1]) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate agent_mcp \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    mcp = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_mcp_t));
    if (mcp == NULL) {
        return NGX_CONF_ERROR;
    }

    mcp->name = value[1];
    mcp->timeout = NGX_CONF_UNSET_MSEC;
    mcp->refresh = 300000;
    mcp->rpc_timeout = 300000;
    mcp->file = cf->conf_file->file.name.data;
    mcp->line = cf->conf_file->line;

    for (i = 2; i < cf->args->nelts; i++) {
        if (ngx_http_agent_mcp_param(cf, mcp, &value[i]) != NGX_CONF_OK) {
            return NGX_CONF_ERROR;
        }
    }

    if (mcp->location.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "agent_mcp \"%V\" has no \"location=\"",
                           &mcp->name);
        return NGX_CONF_ERROR;
    }

    if (mcp->tools && mcp->approval) {
        name = mcp->approval->elts;

        for (i = 0; i < mcp->approval->nelts; i++) {
            if (!ngx_http_agent_mcp_listed(mcp->tools, &name[i])) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "agent_mcp \"%V\": \"approval=\" names "
                                   "\"%V\", which \"tools=\" leaves out",
                                   &mcp->name, &name[i]);
                return NGX_CONF_ERROR;
            }
        }
    }

    return ngx_http_agent_mcp_push(cf, &amcf->mcp, mcp);
}


static char *
ngx_http_agent_mcp_push(ngx_conf_t *cf, ngx_array_t **list,
    ngx_http_agent_mcp_t *mcp)
{
    ngx_http_agent_mcp_t  **mp;

    if (*list == NULL) {
        *list = ngx_array_create(cf->pool, 2, sizeof(ngx_http_agent_mcp_t *));
        if (*list == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    mp = ngx_array_push(*list);
    if (mp == NULL) {
        return NGX_CONF_ERROR;
    }

    *mp = mcp;

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_mcp_param(ngx_conf_t *cf, ngx_http_agent_mcp_t *mcp,
    ngx_str_t *value)
{
    u_char     *eq;
    ngx_str_t   key, v;
    ngx_int_t   n;

    eq = ngx_strlchr(value->data, value->data + value->len, '=');

    if (eq == NULL) {
        goto invalid;
    }

    key.data = value->data;
    key.len = eq - value->data;
    v.data = eq + 1;
    v.len = value->data + value->len - v.data;

    if (key.len == 8 && ngx_strncmp(key.data, "location", 8) == 0) {

        if (v.len == 0 || v.data[0] != '/' || mcp->location.len) {
            goto invalid;
        }

        mcp->location = v;
        return NGX_CONF_OK;
    }

    if (key.len == 5 && ngx_strncmp(key.data, "tools", 5) == 0) {

        if (v.len == 3 && ngx_strncmp(v.data, "all", 3) == 0) {
            mcp->tools = NULL;
            return NGX_CONF_OK;
        }

        mcp->tools = ngx_http_agent_mcp_names(cf, &v);

        return mcp->tools ? NGX_CONF_OK : NGX_CONF_ERROR;
    }

    if (key.len == 8 && ngx_strncmp(key.data, "approval", 8) == 0) {

        mcp->approval = NULL;
        mcp->approval_all = 0;

        if (v.len == 3 && ngx_strncmp(v.data, "all", 3) == 0) {
            mcp->approval_all = 1;
            return NGX_CONF_OK;
        }

        if (v.len == 4 && ngx_strncmp(v.data, "none", 4) == 0) {
            return NGX_CONF_OK;
        }

        mcp->approval = ngx_http_agent_mcp_names(cf, &v);

        return mcp->approval ? NGX_CONF_OK : NGX_CONF_ERROR;
    }

    if ((key.len == 7 && ngx_strncmp(key.data, "timeout", 7) == 0)
        || (key.len == 7 && ngx_strncmp(key.data, "refresh", 7) == 0)
        || (key.len == 11 && ngx_strncmp(key.data, "rpc_timeout", 11) == 0))
    {
        n = ngx_parse_time(&v, 0);

        if (n == NGX_ERROR || n == 0) {
            goto invalid;
        }

        if (key.data[0] == 't') {
            mcp->timeout = (ngx_msec_t) n;

        } else if (key.data[0] == 'r' && key.len == 7) {
            mcp->refresh = (ngx_msec_t) n;

        } else {
            mcp->rpc_timeout = (ngx_msec_t) n;
        }

        return NGX_CONF_OK;
    }

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "agent_mcp \"%V\": invalid parameter \"%V\"",
                       &mcp->name, value);

    return NGX_CONF_ERROR;
}


/* "a,b,c": tool names as the server spells them */

static ngx_array_t *
ngx_http_agent_mcp_names(ngx_conf_t *cf, ngx_str_t *list)
{
    u_char       *p, *last, *comma;
    ngx_str_t    *name;
    ngx_array_t  *names;

    names = ngx_array_create(cf->pool, 4, sizeof(ngx_str_t));
    if (names == NULL) {
        return NULL;
    }

    p = list->data;
    last = list->data + list->len;

    while (p <= last) {
        comma = ngx_strlchr(p, last, ',');
        if (comma == NULL) {
            comma = last;
        }

        name = ngx_array_push(names);
        if (name == NULL) {
            return NULL;
        }

        name->data = p;
        name->len = comma - p;

        if (ngx_http_agent_conf_name(name) != NGX_OK) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "agent_mcp: invalid tool name \"%V\" in "
                               "\"%V\"", name, list);
            return NULL;
        }

        p = comma + 1;
    }

    return names;
}


static ngx_int_t
ngx_http_agent_mcp_listed(ngx_array_t *names, ngx_str_t *name)
{
    ngx_str_t   *n;
    ngx_uint_t   i;

    n = names->elts;

    for (i = 0; i < names->nelts; i++) {
        if (n[i].len == name->len
            && ngx_strncmp(n[i].data, name->data, name->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* whether the server lets the agent use a tool, and if it waits first */

ngx_int_t
ngx_http_agent_conf_mcp_allowed(ngx_http_agent_mcp_t *mcp, ngx_str_t *name)
{
    return mcp->tools == NULL || ngx_http_agent_mcp_listed(mcp->tools, name);
}


ngx_uint_t
ngx_http_agent_conf_mcp_approval(ngx_http_agent_mcp_t *mcp, ngx_str_t *name)
{
    if (mcp->approval_all
        || (mcp->approval && ngx_http_agent_mcp_listed(mcp->approval, name)))
    {
        return NGX_HTTP_AGENT_APPROVAL_REQUIRED;
    }

    return NGX_HTTP_AGENT_APPROVAL_AUTO;
}


ngx_http_agent_mcp_t *
ngx_http_agent_conf_mcp_find(ngx_http_agent_main_conf_t *amcf,
    ngx_str_t *name)
{
    ngx_uint_t              i;
    ngx_http_agent_mcp_t  **mcp;

    if (amcf->mcp == NULL) {
        return NULL;
    }

    mcp = amcf->mcp->elts;

    for (i = 0; i < amcf->mcp->nelts; i++) {
        if (mcp[i]->name.len == name->len
            && ngx_strncmp(mcp[i]->name.data, name->data, name->len) == 0)
        {
            return mcp[i];
        }
    }

    return NULL;
}


/*
 * The agent's "tools" that name an MCP server move to its list of
 * servers; a name that is both a tool and a server is refused.
 */

char *
ngx_http_agent_conf_mcp_bind(ngx_conf_t *cf, ngx_http_agent_main_conf_t *amcf,
    ngx_http_agent_t *agent)
{
    ngx_uint_t                  i, n;
    ngx_http_agent_mcp_t       *mcp;
    ngx_http_agent_tool_ref_t  *ref;

    ref = agent->tools.elts;
    n = 0;

    for (i = 0; i < agent->tools.nelts; i++) {

        mcp = ngx_http_agent_conf_mcp_find(amcf, &ref[i].name);

        if (mcp == NULL) {
            ref[n++] = ref[i];
            continue;
        }

        if (ngx_http_agent_conf_tool_find(amcf, &ref[i].name) != NULL) {
            ngx_http_agent_conf_error(cf, agent->file, ref[i].line,
                "agent \"%V\": \"%V\" is both an agent_tool and an "
                "agent_mcp", &agent->name, &ref[i].name);
            return NGX_CONF_ERROR;
        }

        if (ngx_http_agent_mcp_push(cf, &agent->mcp, mcp) != NGX_CONF_OK) {
            return NGX_CONF_ERROR;
        }
    }

    agent->tools.nelts = n;

    return NGX_CONF_OK;
}
