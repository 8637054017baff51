
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * hook_before and hook_after: "hook_before /uri [timeout=TIME]
 * [on_error=fail|continue];" in an agent block.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"


char *
ngx_http_agent_conf_hook(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_int_t                n;
    ngx_str_t               *value, s;
    ngx_uint_t               i;
    ngx_http_agent_hook_t  **hp, *hook;

    hp = (ngx_http_agent_hook_t **) (p + cmd->offset);

    if (*hp != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid location \"%V\" in \"%V\" directive, "
                           "it must be a URI that starts with \"/\"",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    hook = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_hook_t));
    if (hook == NULL) {
        return NGX_CONF_ERROR;
    }

    hook->location = value[1];
    hook->timeout = NGX_HTTP_AGENT_HOOK_TIMEOUT;
    hook->on_error = NGX_HTTP_AGENT_HOOK_FAIL;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "timeout=", 8) == 0) {
            s.data = value[i].data + 8;
            s.len = value[i].len - 8;

            n = ngx_parse_time(&s, 0);
            if (n == NGX_ERROR || n == 0) {
                goto invalid;
            }

            hook->timeout = n;
            continue;
        }

        if (value[i].len == sizeof("on_error=fail") - 1
            && ngx_strncmp(value[i].data, "on_error=fail", value[i].len) == 0)
        {
            hook->on_error = NGX_HTTP_AGENT_HOOK_FAIL;
            continue;
        }

        if (value[i].len == sizeof("on_error=continue") - 1
            && ngx_strncmp(value[i].data, "on_error=continue", value[i].len)
               == 0)
        {
            hook->on_error = NGX_HTTP_AGENT_HOOK_CONTINUE;
            continue;
        }

        goto invalid;
    }

    *hp = hook;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" in \"%V\" directive, "
                       "it must be \"timeout=TIME\" (more than 0), "
                       "\"on_error=fail\" or \"on_error=continue\"",
                       &value[i], &cmd->name);

    return NGX_CONF_ERROR;
}
