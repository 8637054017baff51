
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_EXPIRE_H_INCLUDED_
#define _NGX_HTTP_AGENT_EXPIRE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


#include "ngx_http_agent_zone.h"



ngx_int_t ngx_http_agent_expire_init_process(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_AGENT_EXPIRE_H_INCLUDED_ */
