/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_CONF_H_INCLUDED_
#define _NGX_HTTP_AGENT_CONF_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_mcp.h"


char *ngx_http_agent_conf_tool_block(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_agent_conf_agent_block(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_agent_conf_resolve(ngx_conf_t *cf,
    ngx_http_agent_main_conf_t *amcf);

/* the longest name of an agent or a tool */
#define NGX_HTTP_AGENT_NAME_MAX  64


/* reading the blocks: ngx_http_agent_conf_block.c */
char *ngx_http_agent_conf_parse_block(ngx_conf_t *cf, char *name,
    ngx_command_t *commands, void *conf);
ngx_int_t ngx_http_agent_conf_name(ngx_str_t *name);
ngx_int_t ngx_http_agent_conf_read_file(ngx_conf_t *cf, ngx_str_t *name,
    ngx_str_t *content);
char *ngx_http_agent_conf_set_enum(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* ngx_conf_log_error() at a line read earlier */
void ngx_http_agent_conf_error(ngx_conf_t *cf, u_char *file, ngx_uint_t line,
    const char *fmt, ...);

ngx_http_agent_tool_t *ngx_http_agent_conf_tool_find(
    ngx_http_agent_main_conf_t *amcf, ngx_str_t *name);
ngx_http_agent_t *ngx_http_agent_conf_find(ngx_http_agent_main_conf_t *amcf,
    ngx_str_t *name);
ngx_uint_t ngx_http_agent_conf_pending_kind(ngx_http_agent_tool_t *tool,
    ngx_uint_t phase);

/* hook_before and hook_after: ngx_http_agent_conf_hook.c */
char *ngx_http_agent_conf_hook(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* MCP servers: ngx_http_agent_conf_mcp.c */
char *ngx_http_agent_conf_mcp(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_agent_conf_mcp_bind(ngx_conf_t *cf,
    ngx_http_agent_main_conf_t *amcf, ngx_http_agent_t *agent);
ngx_http_agent_mcp_t *ngx_http_agent_conf_mcp_find(
    ngx_http_agent_main_conf_t *amcf, ngx_str_t *name);
ngx_int_t ngx_http_agent_conf_mcp_allowed(ngx_http_agent_mcp_t *mcp,
    ngx_str_t *name);
ngx_uint_t ngx_http_agent_conf_mcp_approval(ngx_http_agent_mcp_t *mcp,
    ngx_str_t *name);


extern ngx_conf_enum_t  ngx_http_agent_executors[];
extern ngx_conf_enum_t  ngx_http_agent_approvals[];
extern ngx_str_t        ngx_http_agent_pending_kinds[];
extern ngx_conf_post_t  ngx_http_agent_conf_utf8_post;


#endif /* _NGX_HTTP_AGENT_CONF_H_INCLUDED_ */
