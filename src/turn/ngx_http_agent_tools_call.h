
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_TOOLS_CALL_H_INCLUDED_
#define _NGX_HTTP_AGENT_TOOLS_CALL_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_turn.h"


/*
 * A tool call as ngx_http_agent_tools.c (dispatch, results, suspension)
 * and ngx_http_agent_tools_stream.c (a streaming tool's lines) see it.
 */


/* the largest result a tool location may answer */
#define NGX_HTTP_AGENT_RESULT_MAX  (1024 * 1024)

/*
 * how much of a failing location's body its error result carries; a
 * character more is read, so that the cut falls between characters
 */
#define NGX_HTTP_AGENT_FAILURE_MAX   4096
#define NGX_HTTP_AGENT_FAILURE_READ  (NGX_HTTP_AGENT_FAILURE_MAX + 4)


/* a tool call of the batch; lives in the model call's pool */

typedef struct {
    ngx_http_agent_sub_t          sub;        /* first: the filters' view */

    ngx_http_agent_turn_t        *turn;
    ngx_http_agent_tool_t        *tool;

    ngx_str_t                     id;
    ngx_str_t                     name;
    ngx_str_t                     arguments;
    ngx_str_t                     approver;

    ngx_uint_t                    status;
    ngx_http_agent_bytes_t        body;
    off_t                         received;

    /* a streaming tool: the line being read, and how the stream ended */
    ngx_http_agent_bytes_t        line;
    yajl_gen                      gen;
    char                         *error;

    /* an MCP call: its JSON-RPC request (ngx_http_agent_mcp_rpc_t) */
    void                         *mcp;

    unsigned                      too_large:1;
    unsigned                      ended:1;
    unsigned                      done:1;
} ngx_http_agent_call_t;


/* the call's result, or its error ("[failed] ..."); the batch goes on */
ngx_int_t ngx_http_agent_tools_result(ngx_http_agent_call_t *call,
    ngx_str_t *result, char *error);

ngx_int_t ngx_http_agent_tools_stream(ngx_http_agent_call_t *call,
    ngx_chain_t *in);

/* the call waits: its pending entry and suspension event (fields) */
ngx_int_t ngx_http_agent_tools_wait(ngx_http_agent_call_t *call,
    ngx_uint_t kind, uint64_t deadline, ngx_str_t *fields);

/* a tool_progress live event of the call */
ngx_int_t ngx_http_agent_tools_progress(ngx_http_agent_call_t *call,
    yajl_val progress);
void ngx_http_agent_tools_stream_end(ngx_http_agent_call_t *call);


#endif /* _NGX_HTTP_AGENT_TOOLS_CALL_H_INCLUDED_ */
