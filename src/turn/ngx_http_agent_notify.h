
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_
#define _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


ngx_int_t ngx_http_agent_notify_init_filters(ngx_conf_t *cf);
ngx_int_t ngx_http_agent_notify_init_process(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_ */
