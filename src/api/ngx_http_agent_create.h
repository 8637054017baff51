
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_CREATE_H_INCLUDED_
#define _NGX_HTTP_AGENT_CREATE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


char *ngx_http_agent_create(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_agent_create_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_AGENT_CREATE_H_INCLUDED_ */
