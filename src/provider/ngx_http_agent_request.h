/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_REQUEST_H_INCLUDED_
#define _NGX_HTTP_AGENT_REQUEST_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_output.h"


/* what a canonical event is to a request */
#define NGX_HTTP_AGENT_REQUEST_NONE       0
#define NGX_HTTP_AGENT_REQUEST_USER       1    /* a user_msg */
#define NGX_HTTP_AGENT_REQUEST_RESULT     2    /* a tool_result */
#define NGX_HTTP_AGENT_REQUEST_ASSISTANT  3    /* an assistant_msg */


typedef struct {
    yajl_val                          event;
    ngx_uint_t                        kind;

    /*
     * an assistant message's text, marked if the message is partial; a
     * tool result's outcome as a JSON text, valid until the next one
     */
    ngx_str_t                         text;

    /* a complete assistant message's calls and kept content, or NULL */
    yajl_val                          calls;
    yajl_val                          raw;

    unsigned                          partial:1;

    /* the newest summary, sent as the first user message */
    unsigned                          summary:1;
} ngx_http_agent_request_event_t;


typedef struct ngx_http_agent_request_s  ngx_http_agent_request_t;

/* each writes into r->g and returns yajl_gen's statuses or'ed, 0 if ok */
typedef ngx_uint_t (*ngx_http_agent_request_pt)(ngx_http_agent_request_t *r);
typedef ngx_uint_t (*ngx_http_agent_request_call_pt)(
    ngx_http_agent_request_t *r, yajl_val call);


/*
 * A wire format: what the members of the request and each kind of event
 * become.  The walk writes {"model", calls head, the events, closes the
 * array head opened, writes "tools", calls tail, and structured if the
 * turn's message asks for an output, writes the agent's options and
 * closes the object.
 */

typedef struct {
    ngx_str_t                         name;

    /* the members after "model", then the array of events, opened */
    ngx_http_agent_request_pt         head;
    /* the members after "tools", or NULL */
    ngx_http_agent_request_pt         tail;

    ngx_http_agent_request_pt         user;
    ngx_http_agent_request_pt         assistant;
    ngx_http_agent_request_pt         result;

    /* one call of an assistant message, for ngx_http_agent_request_calls */
    ngx_http_agent_request_call_pt    call;

    /*
     * Before the first and after the last event of a run of one side's
     * events (the user's: messages and tool results; the assistant's),
     * for an API that wants one message of a run; NULL for the others.
     */
    ngx_http_agent_request_pt         open;
    ngx_http_agent_request_pt         close;

    /* "tools" and what goes with them, or NULL: the agent's, verbatim */
    ngx_http_agent_request_pt         tools;

    /* the members that ask for the structured output r->output */
    ngx_http_agent_request_pt         structured;

    /* sent too: assistant messages with nothing to say, hosted results */
    unsigned                          silent:1;
    unsigned                          hosted:1;
} ngx_http_agent_request_format_t;


struct ngx_http_agent_request_s {
    ngx_pool_t                       *pool;
    ngx_http_agent_t                 *agent;
    ngx_http_agent_request_format_t  *format;

    yajl_gen                          g;
    /* for JSON that goes inside a string: tool results, arguments */
    yajl_gen                          sub;

    /* the event being rendered */
    ngx_http_agent_request_event_t    ev;

    /* the event starts, ends the run of its side */
    unsigned                          first:1;
    unsigned                          last:1;

    /* the log, read one event ahead */
    ngx_str_t                        *events;
    ngx_uint_t                        nevents;
    ngx_uint_t                        next;
    ngx_http_agent_bytes_t            scratch;

    /* the ids of calls partial messages began, not sent (ngx_str_t) */
    ngx_array_t                       cut;

    /*
     * retention: the turn of the newest event, and for each of the
     * agent's tools the results of it the walk has yet to reach
     */
    ngx_uint_t                        turn;
    ngx_uint_t                       *left;
    unsigned                          retain:1;

    /*
     * after a rewind, the turns of the branch in order (their user
     * messages'), by which retention counts turns; NULL without one
     */
    ngx_uint_t                       *turns;
    ngx_uint_t                        nturns;

    /* the structured output the turn's message asks for, if any */
    ngx_http_agent_output_t           output;

    /*
     * the newest summary: the events up to summary_to are left out, and
     * it is sent first, as a user message (NULL once it is)
     */
    uint64_t                          summary_to;
    yajl_val                          summary;
};


/* what a summary is sent as, before its text */
#define NGX_HTTP_AGENT_SUMMARY_PREFIX  "Summary of the conversation so far:\n\n"


ngx_int_t ngx_http_agent_request_build(
    ngx_http_agent_request_format_t *format, ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *events, ngx_uint_t nevents,
    ngx_str_t *body);
ngx_uint_t ngx_http_agent_request_calls(ngx_http_agent_request_t *r);
ngx_uint_t ngx_http_agent_request_function(ngx_http_agent_request_t *r,
    yajl_val call);
ngx_uint_t ngx_http_agent_request_no_tools(ngx_http_agent_request_t *r);
ngx_uint_t ngx_http_agent_request_schema(ngx_http_agent_request_t *r);


#endif /* _NGX_HTTP_AGENT_REQUEST_H_INCLUDED_ */
