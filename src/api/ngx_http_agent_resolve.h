
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

    /* in a batch: a call that does not wait passes it over (history) */
    unsigned                  history:1;
    /* ... and so does one that waits for something else */
    unsigned                  loose:1;

    /* out: its call does not wait; it answers a call and is recorded */
    unsigned                  stale:1;
    unsigned                  taken:1;
    unsigned                  in_call:1;  /* out: a running call's */
} ngx_http_agent_resolution_t;


ngx_int_t ngx_http_agent_resolve_handler(ngx_http_request_t *r);

/*
 * Waiting calls of one conversation resolved, all or none, and the turn
 * gone on: *first and *last are the seqs of the first and last
 * resolutions recorded.
 */
ngx_int_t ngx_http_agent_resolve_apply(ngx_http_request_t *r,
    ngx_http_agent_resolution_t *res, ngx_uint_t n, uint64_t *first,
    uint64_t *last, char **err, ngx_int_t *rc);


#endif /* _NGX_HTTP_AGENT_RESOLVE_H_INCLUDED_ */
