
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_MCP_RPC_H_INCLUDED_
#define _NGX_HTTP_AGENT_MCP_RPC_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>
#include <yajl/yajl_gen.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_mcp.h"
#include "ngx_http_agent_sse.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools_call.h"


/*
 * One JSON-RPC request of a turn to an MCP server, over Streamable HTTP:
 * a POST subrequest to the server's location, answered by JSON or by an
 * SSE stream.  It initializes a session first when the zone holds none,
 * and again, once, when the server no longer knows the session (404).
 */

typedef struct ngx_http_agent_mcp_rpc_s  ngx_http_agent_mcp_rpc_t;

/* a notification of the server during the request (progress...) */
typedef void (*ngx_http_agent_mcp_notify_pt)(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val msg);

/* a request of the server during ours (elicitation...): msg->id set */
typedef void (*ngx_http_agent_mcp_request_pt)(ngx_http_agent_mcp_rpc_t *rpc,
    yajl_val msg);

/* the request ended: rpc->answer, or rpc->failure says why not */
typedef void (*ngx_http_agent_mcp_done_pt)(ngx_http_agent_mcp_rpc_t *rpc);


struct ngx_http_agent_mcp_rpc_s {
    ngx_http_agent_sub_t           sub;       /* first: the filters' view */

    ngx_http_agent_turn_t         *turn;
    ngx_http_agent_mcp_t          *server;
    ngx_pool_t                    *pool;

    ngx_str_t                      method;
    ngx_str_t                      params;    /* JSON object, or empty */
    ngx_str_t                      id;        /* a JSON string, quoted */
    ngx_str_t                      key;       /* the same, unquoted */
    ngx_str_t                      raw;       /* or a whole message */
    ngx_keyval_t                  *headers;   /* more headers to send */
    ngx_uint_t                     nheaders;

    ngx_uint_t                     step;
    ngx_str_t                      session;   /* as sent */
    ngx_str_t                      version;

    /* the response of the current step */
    ngx_uint_t                     status;
    ngx_str_t                      new_session;
    ngx_http_agent_bytes_t         body;
    ngx_http_agent_sse_t          *sse;
    yajl_val                       answer;    /* the message with our id */
    yajl_val                       answer_tree;    /* the tree it is in */

    char                          *failure;

    ngx_http_agent_mcp_notify_pt   notify;
    ngx_http_agent_mcp_request_pt  request;
    ngx_http_agent_mcp_done_pt     done;
    void                          *data;

    /* a question of the server waiting for its answer: its id, as JSON */
    ngx_str_t                      elicit_id;

    /* the message answering the server, being sent */
    ngx_http_agent_mcp_rpc_t      *reply;

    /* the call this request runs, if any: its sub.sr follows ours */
    ngx_http_agent_call_t         *call;

    ngx_event_t                    event;

    /* rpc_timeout: the time left of it, and since when it runs */
    ngx_event_t                    deadline;
    ngx_msec_t                     left;
    ngx_msec_t                     since;

    unsigned                       is_sse:1;
    unsigned                       too_large:1;
    unsigned                       reinit:1;
    unsigned                       finished:1;
    unsigned                       eliciting:1;

    /* the answer's last buffer came: not cut off by a timeout */
    unsigned                       complete:1;

    /* past rpc_timeout: its subrequest was aborted */
    unsigned                       expired:1;
};


ngx_int_t ngx_http_agent_mcp_rpc_start(ngx_http_agent_mcp_rpc_t *rpc);
ngx_int_t ngx_http_agent_mcp_rpc_init(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_http_agent_turn_t *t, ngx_http_agent_mcp_t *server,
    ngx_pool_t *pool);
void ngx_http_agent_mcp_rpc_free(ngx_http_agent_mcp_rpc_t *rpc);

/* a message to the server in the request's session: an answer to it */
ngx_int_t ngx_http_agent_mcp_rpc_reply(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_str_t *message);

/* notifications/cancelled for the request, if it was sent */
void ngx_http_agent_mcp_rpc_cancelled(ngx_http_agent_mcp_rpc_t *rpc,
    char *reason);

/* a message in the request's session, on a request that outlives it */
ngx_int_t ngx_http_agent_mcp_rpc_post(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_str_t *message);

/* rpc_timeout runs (1) or stops (0) for the request */
void ngx_http_agent_mcp_rpc_clock(ngx_http_agent_mcp_rpc_t *rpc,
    ngx_uint_t run);

/* the output of an MCP subrequest, from the turn's filters */
ngx_int_t ngx_http_agent_mcp_rpc_header(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub);
ngx_int_t ngx_http_agent_mcp_rpc_body(ngx_http_request_t *r,
    ngx_http_agent_sub_t *sub, ngx_chain_t *in);

/* discovery and the tools of a turn: ngx_http_agent_mcp_list.c */
ngx_int_t ngx_http_agent_mcp_list_discover(ngx_http_agent_turn_t *t,
    ngx_event_handler_pt then);
ngx_http_agent_t *ngx_http_agent_mcp_list_agent(ngx_http_agent_turn_t *t);
ngx_http_agent_tool_t *ngx_http_agent_mcp_list_tool(ngx_http_agent_turn_t *t,
    ngx_str_t *name);
ngx_uint_t ngx_http_agent_mcp_list_describe(yajl_gen g, ngx_pool_t *pool,
    ngx_http_agent_zone_t *z, ngx_http_agent_t *agent);

/* a tools/call: ngx_http_agent_mcp_call.c */
ngx_int_t ngx_http_agent_mcp_call_run(ngx_http_agent_call_t *call,
    ngx_keyval_t *headers, ngx_uint_t nheaders);

/* a cancel of a running call: the server is told */
void ngx_http_agent_mcp_call_cancel(ngx_http_agent_call_t *call,
    char *reason);

/* questions of the turn's servers answered (or expired): answers sent */
void ngx_http_agent_mcp_call_answers(ngx_http_agent_turn_t *t);


#endif /* _NGX_HTTP_AGENT_MCP_RPC_H_INCLUDED_ */
