
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_AGUI_H_INCLUDED_
#define _NGX_HTTP_AGENT_AGUI_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


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

/* the run of the request, set by the handler */
ngx_http_agent_agui_run_t *ngx_http_agent_agui_run(ngx_http_request_t *r);


#endif /* _NGX_HTTP_AGENT_AGUI_H_INCLUDED_ */
