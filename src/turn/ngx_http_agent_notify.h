
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_
#define _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"


ngx_int_t ngx_http_agent_notify_init_filters(ngx_conf_t *cf);
ngx_int_t ngx_http_agent_notify_init_process(ngx_cycle_t *cycle);
ngx_int_t ngx_http_agent_notify_post(ngx_http_agent_t *agent, ngx_str_t *uri,
    ngx_str_t *body, ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_msec_t timeout);


#endif /* _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_ */
