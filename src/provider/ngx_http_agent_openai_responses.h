/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_OPENAI_RESPONSES_H_INCLUDED_
#define _NGX_HTTP_AGENT_OPENAI_RESPONSES_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_module.h"


/* the Responses request, from the log: the _request.c half */
ngx_int_t ngx_http_agent_openai_responses_build_request(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body);


#endif /* _NGX_HTTP_AGENT_OPENAI_RESPONSES_H_INCLUDED_ */
