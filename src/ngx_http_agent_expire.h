
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_EXPIRE_H_INCLUDED_
#define _NGX_HTTP_AGENT_EXPIRE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>


#include "ngx_http_agent_zone.h"


#define NGX_HTTP_AGENT_SETTLE_EXPIRED    0
#define NGX_HTTP_AGENT_SETTLE_CANCELLED  1


ngx_int_t ngx_http_agent_expire_init_process(ngx_cycle_t *cycle);
ngx_int_t ngx_http_agent_pending_settle_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_pending_t *p,
    ngx_uint_t how, char *reason);
ngx_int_t ngx_http_agent_error_result_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *id, ngx_str_t *name,
    char *error);


#endif /* _NGX_HTTP_AGENT_EXPIRE_H_INCLUDED_ */
