
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_LIST_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_LIST_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* a conversation as a list shows it */
typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     state;
    uint64_t                      updated;    /* ms since the epoch */
    ngx_uint_t                    pending;
} ngx_http_agent_store_conv_t;


typedef struct ngx_http_agent_store_list_s  ngx_http_agent_store_list_t;

typedef void (*ngx_http_agent_store_list_pt)(ngx_http_request_t *r,
    ngx_http_agent_store_list_t *ls, ngx_int_t rc);

/*
 * The conversations of an agent (and an owner, unless owner is NULL)
 * whose id sorts after "after", in id order, at most limit + 1 (one more
 * tells that a page follows): read from the store on its thread pool into
 * convs (store_conv_t, in pool)
 */
struct ngx_http_agent_store_list_s {
    ngx_str_t                     agent;
    ngx_str_t                     owner;
    ngx_uint_t                    any_owner;
    ngx_str_t                     after;
    ngx_uint_t                    limit;
    ngx_array_t                  *convs;
    ngx_pool_t                   *pool;
    /* the store's configuration (ngx_http_agent_store_conf_t) */
    struct ngx_http_agent_store_conf_s  *conf;
    ngx_int_t                     rc;
    ngx_http_request_t           *request;
    ngx_http_agent_store_list_pt  handler;
};


/* NGX_OK: the handler runs once the list is read (the request held) */
ngx_int_t ngx_http_agent_store_list(ngx_http_request_t *r,
    ngx_http_agent_store_list_t *ls);


#endif /* _NGX_HTTP_AGENT_STORE_LIST_H_INCLUDED_ */
