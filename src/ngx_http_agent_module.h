
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_MODULE_H_INCLUDED_
#define _NGX_HTTP_AGENT_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


extern ngx_module_t  ngx_http_agent_module;


#endif /* _NGX_HTTP_AGENT_MODULE_H_INCLUDED_ */
