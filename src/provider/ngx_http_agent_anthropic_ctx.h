
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_ANTHROPIC_CTX_H_INCLUDED_
#define _NGX_HTTP_AGENT_ANTHROPIC_CTX_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_sse.h"


/*
 * A reply of Anthropic Messages as it is parsed: its blocks, as
 * ngx_http_agent_anthropic.c (the stream's events) and
 * ngx_http_agent_anthropic_blocks.c (the blocks sent back as they came)
 * see them.
 */


/* a piece of a block that is not passed on live */
#define NGX_HTTP_AGENT_ANTHROPIC_QUIET       ((ngx_uint_t) -1)


typedef enum {
    sw_stream = 0,
    sw_done,
    sw_error
} ngx_http_agent_anthropic_state_e;


/* what a streamed content block is to the adapter */
typedef enum {
    NGX_HTTP_AGENT_ANTHROPIC_TEXT = 0,
    NGX_HTTP_AGENT_ANTHROPIC_THINKING,
    NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE,
    NGX_HTTP_AGENT_ANTHROPIC_SERVER_TOOL_USE,
    /* kept as it came: hosted tool results, redacted thinking, others */
    NGX_HTTP_AGENT_ANTHROPIC_VERBATIM
} ngx_http_agent_anthropic_kind_e;


typedef struct {
    ngx_uint_t                  kind;

    /* a tool_use's position among the reply's calls */
    ngx_uint_t                  n;

    /* a tool's id and name; a hosted tool result's tool_use_id */
    ngx_http_agent_bytes_t      id;
    ngx_http_agent_bytes_t      name;

    /* text, thinking, a tool's input, a hosted tool result's content */
    ngx_http_agent_bytes_t      text;

    /*
     * a thinking block's signature; a text block's citations, JSON texts
     * joined with commas
     */
    ngx_http_agent_bytes_t      extra;

    /* the content_block of its start, a JSON text */
    ngx_http_agent_bytes_t      start;

    /* it has fields that the canonical ones cannot rebuild */
    unsigned                    own:1;
} ngx_http_agent_anthropic_block_t;


typedef struct {
    ngx_uint_t                  built;
    const char                 *names[5];
} ngx_http_agent_anthropic_members_t;


typedef struct {
    ngx_http_agent_reply_t     *reply;
    ngx_http_agent_sse_t       *sse;
    ngx_array_t                 blocks;  /* ngx_http_agent_anthropic_block_t */
    ngx_uint_t                  ncalls;
    /* values written back as JSON texts */
    yajl_gen                    sub;
    ngx_uint_t                  state;
} ngx_http_agent_anthropic_ctx_t;




typedef ngx_int_t (*ngx_http_agent_anthropic_event_pt)(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_val v);

typedef struct {
    ngx_str_t                            type;
    ngx_http_agent_anthropic_event_pt    handler;
} ngx_http_agent_anthropic_event_t;

ngx_int_t ngx_http_agent_anthropic_cite(
    ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_anthropic_block_t *block, yajl_val cite);
ngx_int_t ngx_http_agent_anthropic_json(
    ngx_http_agent_anthropic_ctx_t *ctx, ngx_http_agent_bytes_t *b,
    yajl_val v);
ngx_int_t ngx_http_agent_anthropic_raw(
    ngx_http_agent_anthropic_ctx_t *ctx);
ngx_uint_t ngx_http_agent_anthropic_own(
    ngx_http_agent_anthropic_block_t *block, yajl_val cb);


#endif /* _NGX_HTTP_AGENT_ANTHROPIC_CTX_H_INCLUDED_ */
