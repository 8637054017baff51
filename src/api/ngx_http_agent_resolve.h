
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_RESOLVE_H_INCLUDED_
#define _NGX_HTTP_AGENT_RESOLVE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* what a resolution says, as JSON texts of its own */

typedef struct {
    ngx_str_t                 conv;
    ngx_str_t                 call;

    ngx_str_t                 result;     /* any JSON value */
    ngx_str_t                 decision;
    ngx_str_t                 reason;
    ngx_str_t                 args;       /* a JSON object */
    ngx_str_t                *approver;   /* agent_approver, or NULL */
    ngx_str_t                 source_id;  /* the client's message, or "" */

    unsigned                  has_result:1;
    unsigned                  approve:1;
} ngx_http_agent_resolution_t;


ngx_int_t ngx_http_agent_resolve_handler(ngx_http_request_t *r);

/* a waiting call resolved, the turn gone on: *seq is the resolution's */
ngx_int_t ngx_http_agent_resolve_apply(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res, uint64_t *seq, char **err,
    ngx_int_t *rc);


#endif /* _NGX_HTTP_AGENT_RESOLVE_H_INCLUDED_ */
