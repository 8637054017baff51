
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_ANTHROPIC_H_INCLUDED_
#define _NGX_HTTP_AGENT_ANTHROPIC_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"


/* the Anthropic request, from the log: ngx_http_agent_anthropic_request.c */
ngx_int_t ngx_http_agent_anthropic_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body);

/* shared by the request and the stream halves */
ngx_uint_t ngx_http_agent_anthropic_input(yajl_gen g, u_char *json);
ngx_uint_t ngx_http_agent_anthropic_cache_control(yajl_gen g);


#endif /* _NGX_HTTP_AGENT_ANTHROPIC_H_INCLUDED_ */
