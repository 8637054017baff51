/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_MODULE_H_INCLUDED_
#define _NGX_HTTP_AGENT_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* as agent_describe and the error log at start give it (see CHANGES) */
#define NGX_HTTP_AGENT_VERSION               "0.9.0"

/* who produces a tool's result */
#define NGX_HTTP_AGENT_EXECUTOR_SERVER       0
#define NGX_HTTP_AGENT_EXECUTOR_HUMAN        1
#define NGX_HTTP_AGENT_EXECUTOR_CLIENT       2
#define NGX_HTTP_AGENT_EXECUTOR_PROVIDER     3

/* whether a call waits for a human's confirmation before it runs */
/* the prompt cache breakpoints of an agent ("cache"), a bitmask */
#define NGX_HTTP_AGENT_CACHE_SYSTEM          0x0002
#define NGX_HTTP_AGENT_CACHE_TOOLS           0x0004
#define NGX_HTTP_AGENT_CACHE_SUMMARY         0x0008

#define NGX_HTTP_AGENT_APPROVAL_AUTO         0
#define NGX_HTTP_AGENT_APPROVAL_REQUIRED     1

/* the phases of a call, in order, and what a suspension in each awaits */
#define NGX_HTTP_AGENT_PHASE_APPROVAL        0
#define NGX_HTTP_AGENT_PHASE_EXEC            1
#define NGX_HTTP_AGENT_NPHASES               2

#define NGX_HTTP_AGENT_PENDING_NONE          0
#define NGX_HTTP_AGENT_PENDING_APPROVAL      1
#define NGX_HTTP_AGENT_PENDING_ELICITATION   2
#define NGX_HTTP_AGENT_PENDING_CLIENT_EXEC   3

/* the most tokens one count of a model call's usage is taken as: 2^31 - 1 */
#define NGX_HTTP_AGENT_TOKENS_MAX            2147483647


typedef struct ngx_http_agent_provider_s  ngx_http_agent_provider_t;


/* a hosted tool's definition for one adapter, sent to it verbatim */
typedef struct {
    ngx_http_agent_provider_t    *provider;
    ngx_str_t                     json;
    ngx_uint_t                    line;
} ngx_http_agent_tool_def_t;


/* per-tool retention for context compaction; 0 means no bound */
typedef struct {
    ngx_uint_t                    turns;
    ngx_uint_t                    count;
    ngx_flag_t                    never_evict;
} ngx_http_agent_retention_t;


typedef struct {
    ngx_str_t                     name;
    ngx_str_t                     description;

    /* a JSON object, passed to the provider verbatim; empty if none */
    ngx_str_t                     parameters;

    ngx_uint_t                    executor;
    ngx_uint_t                    approval;
    ngx_flag_t                    streaming;

    /* a suspended call's deadline; NGX_CONF_UNSET_MSEC: the agent's */
    ngx_msec_t                    timeout;

    ngx_http_agent_retention_t    retention;

    /* server tools: the URI the call is routed to as a subrequest */
    ngx_str_t                     location;

    /* provider tools: ngx_http_agent_tool_def_t, one per adapter */
    ngx_array_t                  *definitions;

    /* a tool of an MCP server: the server, and the tool's name there */
    void                         *mcp;
    ngx_str_t                     mcp_name;

    u_char                       *file;
    ngx_uint_t                    line;
    ngx_uint_t                    approval_line;
    ngx_uint_t                    location_line;
    ngx_uint_t                    retention_line;
} ngx_http_agent_tool_t;


/* a tool as an agent names it; resolved once the http block is parsed */
typedef struct {
    ngx_str_t                     name;
    ngx_http_agent_tool_t        *tool;
    ngx_uint_t                    line;
} ngx_http_agent_tool_ref_t;


/*
 * A hook: a location the turn asks before each model call, or after each
 * reply, with a bounded time; on_error says whether its failure fails
 * the turn.
 */

#define NGX_HTTP_AGENT_HOOK_FAIL      0
#define NGX_HTTP_AGENT_HOOK_CONTINUE  1

/* a hook's time when hook_before or hook_after gives none */
#define NGX_HTTP_AGENT_HOOK_TIMEOUT   5000

typedef struct {
    ngx_str_t                     location;
    ngx_msec_t                    timeout;
    ngx_uint_t                    on_error;
} ngx_http_agent_hook_t;


typedef struct {
    ngx_str_t                     name;

    ngx_http_agent_provider_t    *provider;
    ngx_str_t                     provider_location;
    ngx_str_t                     model;
    ngx_str_t                     system;

    ngx_array_t                   tools;      /* ngx_http_agent_tool_ref_t */

    /* MCP servers whose tools it may use (ngx_http_agent_mcp_t *) */
    ngx_array_t                  *mcp;

    /* the tool list in the adapter's format, rendered once */
    ngx_str_t                     provider_tools;

    /* more members of every request body (a yajl_val object), or NULL */
    void                         *options;
    ngx_uint_t                    options_line;

    ngx_int_t                     max_model_calls;
    ngx_msec_t                    suspend_timeout;

    /* a model call's total time, however its stream keeps itself alive */
    ngx_msec_t                    model_timeout;

    ngx_uint_t                    retry_attempts;
    ngx_msec_t                    retry_base;
    ngx_msec_t                    retry_cap;

    /* prompt cache breakpoints, NGX_HTTP_AGENT_CACHE_* (Anthropic only) */
    ngx_uint_t                    cache;

    /* where a call waiting for a person is announced, or empty */
    ngx_str_t                     notify;

    /* asked before each model call and after each reply, or NULL */
    ngx_http_agent_hook_t        *hook_before;
    ngx_http_agent_hook_t        *hook_after;

    /*
     * the context's size, in tokens, past which older turns are summed
     * up (0: never), by summary_model (empty: model) told summary_prompt
     */
    ngx_int_t                     context_budget;
    ngx_str_t                     summary_model;
    ngx_str_t                     summary_prompt;

    /* the configuration of a location that serves the agent: where a
       turn started by the module itself (not by a request) runs */
    ngx_http_conf_ctx_t          *conf_ctx;

    u_char                       *file;
    ngx_uint_t                    line;
} ngx_http_agent_t;


typedef struct ngx_http_agent_zone_s  ngx_http_agent_zone_t;


/*
 * agent_delta_interval unset: live deltas held this long (ms), and the
 * provider's connection left unread meanwhile, only while the worker takes
 * in more than NGX_HTTP_AGENT_DELTA_BUSY pieces of replies in as long
 */
#define NGX_HTTP_AGENT_DELTA_AUTO  10
#define NGX_HTTP_AGENT_DELTA_BUSY  32


typedef struct {
    ngx_array_t                   tools;      /* ngx_http_agent_tool_t * */
    ngx_array_t                   agents;     /* ngx_http_agent_t * */
    ngx_array_t                  *mcp;        /* ngx_http_agent_mcp_t * */

    ngx_http_agent_zone_t        *zone;
    void                         *store;      /* store conf, or NULL */
    void                         *node;       /* agent_node, or NULL */
    ngx_msec_t                    heartbeat;
    ngx_msec_t                    client_grace;

    /*
     * live deltas of a turn: at most one live event per interval; unset,
     * a short one while the worker is busy (delta_auto)
     */
    ngx_msec_t                    delta_interval;
    ngx_flag_t                    delta_auto;

    /* at rest this long, a conversation leaves the zone (with a store) */
    ngx_msec_t                    evict_idle;
    ngx_msec_t                    evict_awaiting;

    /* unused this long, a conversation agent_create made is freed */
    ngx_msec_t                    evict_unused;

    /* agent_budget_zone: ngx_http_agent_budget_zone_t *, or NULL */
    ngx_array_t                  *budgets;

    /* agent_notify: for agents without a notify of their own */
    ngx_str_t                     notify;

    /*
     * agent_trace: the OTLP/HTTP location turns' spans are posted to, or
     * empty, and the service.name of its spans; the share of turns
     * sampled, in millionths; message content in the spans; the spans a
     * worker holds for the collector, at most
     */
    ngx_str_t                     trace;
    ngx_str_t                     trace_service;
    ngx_uint_t                    trace_sample;
    ngx_flag_t                    trace_content;
    size_t                        trace_buffer;
} ngx_http_agent_main_conf_t;


/* what a message does to a conversation that is not idle */
#define NGX_HTTP_AGENT_BUSY_REJECT           0
#define NGX_HTTP_AGENT_BUSY_QUEUE            1
#define NGX_HTTP_AGENT_BUSY_INTERRUPT        2


typedef struct {
    ngx_str_t                     agent_name;
    ngx_http_agent_t             *agent;

    ngx_flag_t                    describe;

    /* agent_zone_status or agent_metrics: a status page */
    ngx_flag_t                    status;

    /* the conversation API handler of the location, if any */
    ngx_http_handler_pt           api;
    ngx_str_t                     api_name;

    ngx_http_complex_value_t     *conversation;
    ngx_http_complex_value_t     *tool_call;

    /* who a request acts for, and who approves, as the log records them */
    ngx_http_complex_value_t     *owner;
    ngx_http_complex_value_t     *approver;

    ngx_uint_t                    busy;

    /* output an event stream may queue for a client that does not read */
    size_t                        events_buffer;

    /* agent_budget: ngx_http_agent_budget_ref_t, or NULL */
    ngx_array_t                  *budgets;

    /* agent_agui: the tools of RunAgentInput are offered to the model */
    ngx_flag_t                    client_tools;

    u_char                       *agent_file;
    ngx_uint_t                    agent_line;
    u_char                       *describe_file;
    ngx_uint_t                    describe_line;
    u_char                       *api_file;
    ngx_uint_t                    api_line;
} ngx_http_agent_loc_conf_t;


extern ngx_module_t  ngx_http_agent_module;


#endif /* _NGX_HTTP_AGENT_MODULE_H_INCLUDED_ */
