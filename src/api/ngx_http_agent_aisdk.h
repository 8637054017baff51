
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_AISDK_H_INCLUDED_
#define _NGX_HTTP_AGENT_AISDK_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* agent_aisdk: useChat's POST and resume GET, as UI message streams */
ngx_int_t ngx_http_agent_aisdk_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_AGENT_AISDK_H_INCLUDED_ */
