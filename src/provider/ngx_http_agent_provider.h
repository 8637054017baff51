/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_PROVIDER_H_INCLUDED_
#define _NGX_HTTP_AGENT_PROVIDER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_bytes.h"


/* what a live delta carries */
#define NGX_HTTP_AGENT_DELTA_TEXT            0
#define NGX_HTTP_AGENT_DELTA_THINKING        1
#define NGX_HTTP_AGENT_DELTA_TOOL_ARGS       2


/*
 * What an error the provider reported says of another attempt: a rate
 * limit or an overload passes, a refused request or an exhausted quota
 * does not.
 */
#define NGX_HTTP_AGENT_ERROR_UNKNOWN         0
#define NGX_HTTP_AGENT_ERROR_RETRY           1
#define NGX_HTTP_AGENT_ERROR_FINAL           2


/* an error type or code a provider sends, and its class */
typedef struct {
    ngx_str_t                     name;
    ngx_uint_t                    class;
} ngx_http_agent_provider_error_t;


/* a tool call as the model streams it */
typedef struct {
    ngx_uint_t                    index;
    ngx_http_agent_bytes_t        id;
    ngx_http_agent_bytes_t        name;
    ngx_http_agent_bytes_t        arguments;  /* JSON text, verbatim */

    /* the provider's own id, when the module gave the call another */
    ngx_http_agent_bytes_t        provider_id;
} ngx_http_agent_reply_call_t;


/*
 * A tool the provider ran itself (a hosted web search): its call and its
 * result arrive in the stream.  input and result are JSON texts.
 */
typedef struct {
    ngx_http_agent_bytes_t        id;
    ngx_http_agent_bytes_t        name;
    ngx_http_agent_bytes_t        input;
    ngx_http_agent_bytes_t        result;
} ngx_http_agent_reply_hosted_t;


/*
 * One model call's reply, assembled by the adapter from the stream.  It
 * lives in a pool of its own that is destroyed when the model call ends,
 * so nothing of it outlives the call.
 */

typedef struct ngx_http_agent_reply_s  ngx_http_agent_reply_t;

struct ngx_http_agent_reply_s {
    ngx_pool_t                   *pool;
    ngx_log_t                    *log;

    ngx_http_agent_bytes_t        text;
    ngx_http_agent_bytes_t        thinking;
    ngx_http_agent_bytes_t        signature;

    ngx_array_t                   calls;      /* ngx_http_agent_reply_call_t */

    /* ngx_http_agent_reply_hosted_t, in stream order; may be uninit */
    ngx_array_t                   hosted;

    /*
     * the reply's content as the API must get it back in later requests
     * (thinking with its signature, hosted tool blocks, citations), a
     * JSON text written by the adapter with yajl_gen, logged verbatim
     * with the assistant message as "provider_content"; empty if none
     */
    ngx_http_agent_bytes_t        raw_content;

    ngx_http_agent_bytes_t        finish_reason;
    ngx_http_agent_bytes_t        response_id;
    ngx_http_agent_bytes_t        response_model;

    /* at most NGX_HTTP_AGENT_TOKENS_MAX each */
    ngx_uint_t                    input_tokens;
    ngx_uint_t                    output_tokens;
    ngx_uint_t                    cached_tokens;  /* read from a cache */
    ngx_uint_t                    cache_creation_tokens;

    /* the JSON object of a reply structured output asked for, or empty */
    ngx_str_t                     object;

    /*
     * an error reported in the stream (after HTTP 200): its type (never
     * empty, "error" if the provider sent none), code, message, the
     * generation the provider refused (Groq's "failed_generation"), and
     * what it says of another attempt, NGX_HTTP_AGENT_ERROR_*
     */
    ngx_http_agent_bytes_t        error_type;
    ngx_http_agent_bytes_t        error_code;
    ngx_http_agent_bytes_t        error_message;
    ngx_http_agent_bytes_t        error_generation;
    ngx_uint_t                    error_class;

    /* set once the stream produced content: no retry after this */
    unsigned                      started:1;
    /* the stream ended as the API says a complete stream ends */
    unsigned                      complete:1;
    /*
     * the API paused a long turn (Anthropic's pause_turn): the reply goes
     * back as it is, the last message, for the model to go on with it
     */
    unsigned                      paused:1;

    /* live deltas, as they are parsed; s is valid during the call only */
    void                        (*delta)(ngx_http_agent_reply_t *reply,
                                         ngx_uint_t kind, ngx_uint_t index,
                                         ngx_str_t *s);
    void                         *data;

    /* the adapter's parser state */
    void                         *state;
};


/*
 * A provider adapter: what differs between the providers' wire formats.
 *
 * build_request renders the conversation into the request body: the
 * agent's system prompt, model and tools, and the canonical events of
 * the log (each a JSON object as logged, see docs/architecture.md) in
 * seq order.
 *
 * init, feed and finish parse one streamed reply: feed takes the body
 * bytes as they arrive, in pieces of any size (an SSE event or a JSON
 * value may be split anywhere), and returns NGX_OK or NGX_ERROR for a
 * stream it cannot parse; finish is called at the end of the body.
 */

struct ngx_http_agent_provider_s {
    ngx_str_t                     name;

    /* the provider can run tools itself (hosted web search, ...) */
    ngx_uint_t                    hosts_tools;

    /* the agent's tools as the provider's "tools" array */
    ngx_int_t                   (*render_tools)(yajl_gen g,
                                                ngx_http_agent_t *agent);

    ngx_int_t                   (*build_request)(ngx_pool_t *pool,
                                                 ngx_http_agent_t *agent,
                                                 ngx_str_t *events,
                                                 ngx_uint_t nevents,
                                                 ngx_str_t *body);

    ngx_int_t                   (*init)(ngx_http_agent_reply_t *reply);
    ngx_int_t                   (*feed)(ngx_http_agent_reply_t *reply,
                                        u_char *p, u_char *last);
    ngx_int_t                   (*finish)(ngx_http_agent_reply_t *reply);

    /* the error types and codes of its API, and their classes */
    ngx_http_agent_provider_error_t  *errors;
};


ngx_http_agent_provider_t *ngx_http_agent_provider_find(ngx_str_t *name);
ngx_int_t ngx_http_agent_provider_render_tools(ngx_conf_t *cf,
    ngx_http_agent_t *agent);
ngx_str_t *ngx_http_agent_provider_parameters(ngx_http_agent_tool_t *tool);
ngx_str_t *ngx_http_agent_provider_definition(ngx_http_agent_tool_t *tool,
    ngx_http_agent_provider_t *provider);
ngx_uint_t ngx_http_agent_provider_function(yajl_gen g,
    ngx_http_agent_tool_t *tool, ngx_str_t *schema_key);



/* a call id the API can address: 1 to 64 letters, digits, "_" and "-" */
#define NGX_HTTP_AGENT_CALL_ID_MAX   64

ngx_int_t ngx_http_agent_provider_call_ids(ngx_http_agent_reply_t *reply);

/* whether call n keeps the provider's id (the others get one of ours) */
ngx_uint_t ngx_http_agent_provider_call_id_ok(ngx_http_agent_reply_t *reply,
    ngx_uint_t n);
ngx_int_t ngx_http_agent_provider_reply_json(ngx_http_agent_reply_t *reply,
    ngx_pool_t *pool, ngx_str_t *message_id, ngx_str_t *status,
    ngx_str_t *out);
ngx_int_t ngx_http_agent_provider_error(ngx_http_agent_reply_t *reply,
    ngx_http_agent_provider_error_t *known, yajl_val err, yajl_val type);
ngx_int_t ngx_http_agent_provider_body_error(ngx_http_agent_reply_t *reply,
    ngx_http_agent_provider_t *provider, u_char *body, size_t len);
yajl_val ngx_http_agent_provider_parse(ngx_log_t *log, u_char *json,
    size_t len, char *what);
yajl_val ngx_http_agent_provider_parse_log(ngx_log_t *log, u_char *json,
    size_t len);
yajl_val ngx_http_agent_provider_event(ngx_pool_t *pool,
    ngx_http_agent_bytes_t *scratch, ngx_str_t *event);
yajl_val ngx_http_agent_provider_get(yajl_val v, char *key);
ngx_int_t ngx_http_agent_provider_string(yajl_val v, ngx_str_t *s);
ngx_uint_t ngx_http_agent_provider_value(yajl_gen g, yajl_val v);
ngx_int_t ngx_http_agent_provider_text(yajl_gen sub, yajl_val v,
    ngx_str_t *text);
ngx_int_t ngx_http_agent_provider_result(yajl_gen sub, yajl_val event,
    ngx_str_t *text);
ngx_uint_t ngx_http_agent_provider_is(yajl_val v, char *s);
yajl_val ngx_http_agent_provider_partial(yajl_val event);
ngx_int_t ngx_http_agent_provider_mark(ngx_pool_t *pool, yajl_val event,
    ngx_str_t *content);
ngx_uint_t ngx_http_agent_provider_options(yajl_gen g,
    ngx_http_agent_t *agent);
ngx_uint_t ngx_http_agent_provider_option(ngx_http_agent_t *agent,
    char *key);

/* member name of usage, a token count, into *n if it is one */
void ngx_http_agent_provider_tokens(ngx_http_agent_reply_t *reply,
    yajl_val usage, char *name, ngx_uint_t *n);

/* OpenAI's usage: input, output, and details' cached_tokens */
void ngx_http_agent_provider_usage(ngx_http_agent_reply_t *reply,
    yajl_val usage, char *input, char *output, char *details);


extern ngx_http_agent_provider_t   ngx_http_agent_openai_chat;
extern ngx_http_agent_provider_t   ngx_http_agent_anthropic_messages;
extern ngx_http_agent_provider_t   ngx_http_agent_openai_responses;

extern ngx_http_agent_provider_t  *ngx_http_agent_providers[];

extern ngx_http_agent_provider_error_t  ngx_http_agent_openai_errors[];


#endif /* _NGX_HTTP_AGENT_PROVIDER_H_INCLUDED_ */
