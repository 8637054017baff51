
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_AUDIT_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_AUDIT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/*
 * A model call in the model_calls table: a row written when the call
 * starts ("running"), and its end, which finds the row by conversation,
 * start time and worker.  The row's number in its conversation is given
 * by the store as it is written, so it holds across workers and
 * restarts.
 */

typedef struct {
    ngx_str_t                     conv;
    ngx_str_t                     adapter;
    ngx_str_t                     model;
    ngx_str_t                     status;
    ngx_str_t                     error;      /* a JSON object, or empty */
    ngx_uint_t                    turn;
    ngx_uint_t                    attempt;
    ngx_uint_t                    input;
    ngx_uint_t                    output;
    ngx_uint_t                    cached;
    ngx_int_t                     first;      /* ms, -1: no chunk came */
    ngx_msec_t                    duration;
    uint64_t                      started;    /* ms since the epoch */
    ngx_pid_t                     worker;
    ngx_uint_t                    end;
    /* the conversation's epoch on this node as the call started */
    uint64_t                      epoch;
} ngx_http_agent_audit_row_t;


/* a page of a conversation's model calls, after a call's number */
typedef struct {
    ngx_str_t                     conv;
    uint64_t                      after;
    ngx_uint_t                    limit;

    ngx_str_t                     json;       /* [row, ...] */
    uint64_t                      last;       /* the last call in it */
    ngx_uint_t                    more;
} ngx_http_agent_audit_page_t;


/*
 * The rows are written with the log's batches, the pages read by the
 * store's audit_page (ngx_http_agent_store.h)
 */

/* queued in the worker and written behind; NGX_DECLINED: no store */
ngx_int_t ngx_http_agent_store_audit(ngx_http_agent_audit_row_t *row);
/* the rows queued, for the log writer's batch, and the pool they are in */
ngx_pool_t *ngx_http_agent_store_audit_take(ngx_array_t **rows);
void ngx_http_agent_store_audit_back(ngx_pool_t *pool, ngx_array_t *rows);
ngx_uint_t ngx_http_agent_store_audit_queued(void);
void ngx_http_agent_store_audit_exit(ngx_log_t *log);
/* the rows of a conversation this node lost (conv may be empty) taken out */
void ngx_http_agent_store_audit_drop(ngx_array_t *rows, ngx_str_t *conv);

typedef void (*ngx_http_agent_audit_page_pt)(ngx_http_request_t *r,
    ngx_http_agent_audit_page_t *page, ngx_int_t rc);

/* reads a page on the pool for r, which is held until the handler ran */
ngx_int_t ngx_http_agent_store_audit_page(ngx_http_request_t *r,
    ngx_str_t *conv, uint64_t after, ngx_uint_t limit,
    ngx_http_agent_audit_page_pt handler);


#endif /* _NGX_HTTP_AGENT_STORE_AUDIT_H_INCLUDED_ */
