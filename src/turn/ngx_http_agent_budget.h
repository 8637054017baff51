
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_BUDGET_H_INCLUDED_
#define _NGX_HTTP_AGENT_BUDGET_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"


#define NGX_HTTP_AGENT_BUDGET_TOKENS     0
#define NGX_HTTP_AGENT_BUDGET_REQUESTS   1
#define NGX_HTTP_AGENT_BUDGET_NLIMITS    2


/* a limit per period; limit 0: none */
typedef struct {
    uint64_t                      limit;
    time_t                        period;     /* seconds */
} ngx_http_agent_budget_limit_t;


/*
 * The zone: the counters of each key, and the key each conversation's
 * model calls count against
 */
typedef struct {
    ngx_rbtree_t                  keys;
    ngx_rbtree_node_t             keys_sentinel;
    ngx_rbtree_t                  convs;
    ngx_rbtree_node_t             convs_sentinel;
    ngx_queue_t                   lru;        /* most recently used first */
} ngx_http_agent_budget_sh_t;


/* agent_budget_zone: counters by key, in a shared zone of its own */
typedef struct {
    ngx_str_t                     name;
    ngx_http_agent_budget_sh_t   *sh;
    ngx_slab_pool_t              *shpool;
    ngx_shm_zone_t               *shm_zone;
    ngx_http_complex_value_t      key;
    ngx_http_agent_budget_limit_t limits[NGX_HTTP_AGENT_BUDGET_NLIMITS];
} ngx_http_agent_budget_zone_t;


/* agent_budget zone=name; as a location names it */
typedef struct {
    ngx_str_t                     name;
    ngx_http_agent_budget_zone_t *zone;
    u_char                       *file;
    ngx_uint_t                    line;
} ngx_http_agent_budget_ref_t;


/* "tokens", "requests" */
extern char  *ngx_http_agent_budget_names[];


char *ngx_http_agent_budget_zone_directive(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
char *ngx_http_agent_budget_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* the location's budgets inherited and their zones found */
char *ngx_http_agent_budget_merge(ngx_conf_t *cf, ngx_array_t **prev,
    ngx_array_t **conf);

/*
 * A message: NGX_DECLINED if no budget of the location is spent, else
 * the 429 answer sent (its status returned)
 */
ngx_int_t ngx_http_agent_budget_request(ngx_http_request_t *r);

/* the message was taken: its turns count against the request's keys */
void ngx_http_agent_budget_bind(ngx_http_request_t *r, ngx_str_t *id);

/*
 * Before a model call: NGX_OK and the call counted, or NGX_DECLINED with
 * the turn_failed fields in *fields
 */
ngx_int_t ngx_http_agent_budget_spend(ngx_str_t *id, ngx_pool_t *pool,
    ngx_str_t *fields);

/* after a model call: the tokens the provider reported */
void ngx_http_agent_budget_charge(ngx_str_t *id, uint64_t tokens);


#endif /* _NGX_HTTP_AGENT_BUDGET_H_INCLUDED_ */
