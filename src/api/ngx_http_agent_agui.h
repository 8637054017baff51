
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_AGUI_H_INCLUDED_
#define _NGX_HTTP_AGENT_AGUI_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>


/* RunAgentInput's frontend tools: at most so many, in so many bytes */
#define NGX_HTTP_AGENT_AGUI_TOOLS           64
#define NGX_HTTP_AGENT_AGUI_TOOLS_STR       "64"
#define NGX_HTTP_AGENT_AGUI_TOOLS_SIZE      (32 * 1024)
#define NGX_HTTP_AGENT_AGUI_TOOLS_SIZE_STR  "32768"


/* one AG-UI run: what agent_agui took from RunAgentInput, for its stream */

typedef struct {
    ngx_str_t    thread;     /* threadId */
    ngx_str_t    run;        /* runId */
    ngx_str_t    state;      /* the input's state, as JSON, or empty */

    uint64_t     from;       /* the run shows the events after this seq */
    uint64_t     end;        /* and ends after this one (0: with the turn) */

    /* the run starts with the messages before it (the client has none) */
    ngx_uint_t   history;
} ngx_http_agent_agui_run_t;


/* agent_agui: RunAgentInput's POST, answered with AG-UI events */
ngx_int_t ngx_http_agent_agui_handler(ngx_http_request_t *r);

/*
 * the tools of RunAgentInput as the user_msg keeps them (empty: none, or
 * the location takes none); NGX_DECLINED: *err says what is wrong
 */
ngx_int_t ngx_http_agent_agui_tools(ngx_http_request_t *r, yajl_val list,
    ngx_str_t *json, char **err);

/* the run of the request, set by the handler */
ngx_http_agent_agui_run_t *ngx_http_agent_agui_run(ngx_http_request_t *r);


#endif /* _NGX_HTTP_AGENT_AGUI_H_INCLUDED_ */
