/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_describe.h"


static void *ngx_http_agent_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_agent_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_agent_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_agent_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_agent_select(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_describe(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);


/*
 * "agent" is both the http-level block that declares an agent and the
 * location-level directive that selects one: ngx_conf_handler() skips a
 * command whose context does not match, as it does for "server".
 */

static ngx_command_t  ngx_http_agent_commands[] = {

    { ngx_string("agent_tool"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_BLOCK|NGX_CONF_TAKE1,
      ngx_http_agent_tool_block,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_BLOCK|NGX_CONF_TAKE1,
      ngx_http_agent_block,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_agent_select,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_describe"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_describe,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_agent_module_ctx = {
    NULL,                                  /* preconfiguration */
    NULL,                                  /* postconfiguration */

    ngx_http_agent_create_main_conf,       /* create main configuration */
    ngx_http_agent_init_main_conf,         /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_agent_create_loc_conf,        /* create location configuration */
    ngx_http_agent_merge_loc_conf          /* merge location configuration */
};


ngx_module_t  ngx_http_agent_module = {
    NGX_MODULE_V1,
    &ngx_http_agent_module_ctx,            /* module context */
    ngx_http_agent_commands,               /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static void *
ngx_http_agent_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_main_conf_t));
    if (amcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&amcf->tools, cf->pool, 8,
                       sizeof(ngx_http_agent_tool_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_array_init(&amcf->agents, cf->pool, 4, sizeof(ngx_http_agent_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return amcf;
}


/* the http block is parsed: agents may now name tools declared after them */

static char *
ngx_http_agent_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_agent_main_conf_t  *amcf = conf;

    return ngx_http_agent_conf_resolve(cf, amcf);
}


static void *
ngx_http_agent_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_loc_conf_t));
    if (alcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     alcf->agent_name = { 0, NULL };
     *     alcf->agent = NULL;
     *     alcf->describe = 0;
     */

    return alcf;
}


/*
 * Locations are merged after init_main_conf, so every agent is known here
 * wherever its block stands in the file.
 */

static char *
ngx_http_agent_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_agent_loc_conf_t *prev = parent;
    ngx_http_agent_loc_conf_t *conf = child;

    ngx_http_agent_main_conf_t  *amcf;

    if (conf->agent_name.data == NULL) {
        conf->agent_name = prev->agent_name;
        conf->agent = prev->agent;

    } else if (conf->agent == NULL) {
        amcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_agent_module);

        conf->agent = ngx_http_agent_find(amcf, &conf->agent_name);

        if (conf->agent == NULL) {
            ngx_http_agent_conf_error(cf, conf->agent_file, conf->agent_line,
                                      "unknown agent \"%V\"",
                                      &conf->agent_name);
            return NGX_CONF_ERROR;
        }
    }

    if (conf->describe && conf->agent == NULL) {
        ngx_http_agent_conf_error(cf, conf->describe_file,
                                  conf->describe_line,
                                  "\"agent_describe\" needs an \"agent\" "
                                  "in the location");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* agent NAME; in a location */

static char *
ngx_http_agent_select(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_str_t  *value;

    if (alcf->agent_name.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    alcf->agent_name = value[1];
    alcf->agent_file = cf->conf_file->file.name.data;
    alcf->agent_line = cf->conf_file->line;

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_describe(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    if (alcf->describe) {
        return "is duplicate";
    }

    alcf->describe = 1;
    alcf->describe_file = cf->conf_file->file.name.data;
    alcf->describe_line = cf->conf_file->line;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_agent_describe_handler;

    return NGX_CONF_OK;
}


/*
 * ngx_conf_log_error() at a line read earlier: for what is checked once
 * a block, or the whole http block, has been read.
 */

void
ngx_http_agent_conf_error(ngx_conf_t *cf, u_char *file, ngx_uint_t line,
    const char *fmt, ...)
{
    u_char   errstr[NGX_MAX_CONF_ERRSTR], *p;
    va_list  args;

    va_start(args, fmt);
    p = ngx_vslprintf(errstr, errstr + NGX_MAX_CONF_ERRSTR, fmt, args);
    va_end(args);

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0, "%*s in %s:%ui",
                  p - errstr, errstr, file, line);
}
