
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_
#define _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"


typedef void (*ngx_http_agent_notify_pt)(void *data, ngx_uint_t status);


ngx_int_t ngx_http_agent_notify_init_filters(ngx_conf_t *cf);
ngx_int_t ngx_http_agent_notify_init_process(ngx_cycle_t *cycle);
ngx_int_t ngx_http_agent_notify_post(ngx_http_agent_t *agent, ngx_str_t *uri,
    ngx_str_t *body, ngx_keyval_t *headers, ngx_uint_t nheaders,
    ngx_msec_t timeout);
ngx_int_t ngx_http_agent_notify_post_handler(ngx_http_agent_t *agent,
    ngx_str_t *uri, ngx_str_t *body, ngx_keyval_t *headers,
    ngx_uint_t nheaders, ngx_msec_t timeout, ngx_http_agent_notify_pt handler,
    void *data);

/*
 * a revived conversation's waiting calls whose notification the store
 * says was delivered (store_notified_t, by any node): not sent again
 */
void ngx_http_agent_notify_restored_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_array_t *notified);


#endif /* _NGX_HTTP_AGENT_NOTIFY_H_INCLUDED_ */
