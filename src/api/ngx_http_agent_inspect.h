
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_INSPECT_H_INCLUDED_
#define _NGX_HTTP_AGENT_INSPECT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


ngx_int_t ngx_http_agent_inspect_handler(ngx_http_request_t *r);

/* ?view=model_calls: the conversation's model calls, from the store */
ngx_int_t ngx_http_agent_inspect_view(ngx_http_request_t *r, ngx_str_t *id,
    ngx_str_t *view, ngx_int_t after, ngx_int_t limit);


#endif /* _NGX_HTTP_AGENT_INSPECT_H_INCLUDED_ */
