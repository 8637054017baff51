
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_OUTPUT_H_INCLUDED_
#define _NGX_HTTP_AGENT_OUTPUT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_provider.h"


/* the structured output a user message asks for: a name and a schema */
typedef struct {
    ngx_str_t                     name;
    ngx_str_t                     schema;     /* a JSON text */
} ngx_http_agent_output_t;


ngx_int_t ngx_http_agent_output_find(ngx_pool_t *pool, ngx_str_t *events,
    ngx_uint_t nevents, ngx_http_agent_output_t *out);
ngx_int_t ngx_http_agent_output_reply(ngx_http_agent_reply_t *reply,
    ngx_str_t *name, char **err);


#endif /* _NGX_HTTP_AGENT_OUTPUT_H_INCLUDED_ */
