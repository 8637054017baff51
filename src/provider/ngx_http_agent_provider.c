/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"


ngx_http_agent_provider_t  *ngx_http_agent_providers[] = {
    &ngx_http_agent_openai_chat,
    &ngx_http_agent_anthropic_messages,
    &ngx_http_agent_openai_responses,
    NULL
};


/* what a tool declared without parameters takes: nothing */
static yajl_val ngx_http_agent_provider_tree(ngx_log_t *log, u_char *json,
    size_t len, ngx_uint_t depth, char *what);


static ngx_uint_t ngx_http_agent_provider_error_class(
    ngx_http_agent_provider_error_t *known, yajl_val v, ngx_str_t *name);
static ngx_int_t ngx_http_agent_provider_replace(
    ngx_http_agent_reply_t *reply, ngx_str_t *from, ngx_str_t *to);


/*
 * The error types and codes of OpenAI's APIs (Chat Completions and
 * Responses, whose response.failed has codes of its own), and those of
 * the servers that speak them (Azure, Groq, vLLM, OpenRouter...).  A
 * code says more than a type ("requests" is a rate limit's type), so it
 * is looked up first.
 */

#define NGX_HTTP_AGENT_RETRY  NGX_HTTP_AGENT_ERROR_RETRY
#define NGX_HTTP_AGENT_FINAL  NGX_HTTP_AGENT_ERROR_FINAL

ngx_http_agent_provider_error_t  ngx_http_agent_openai_errors[] = {
    { ngx_string("rate_limit_exceeded"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("requests"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("tokens"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("rate_limit_error"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("server_error"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("internal_error"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("internal_server_error"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("api_error"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("service_unavailable"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("overloaded_error"), NGX_HTTP_AGENT_RETRY },
    { ngx_string("vector_store_timeout"), NGX_HTTP_AGENT_RETRY },

    { ngx_string("insufficient_quota"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_request_error"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("context_length_exceeded"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_prompt"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_api_key"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("authentication_error"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("permission_error"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("not_found_error"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("model_not_found"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("content_policy_violation"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("content_filter"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_image"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_image_format"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_base64_image"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_image_url"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("invalid_image_mode"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("image_too_large"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("image_too_small"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("image_parse_error"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("image_content_policy_violation"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("image_file_too_large"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("image_file_not_found"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("unsupported_image_media_type"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("empty_image_file"), NGX_HTTP_AGENT_FINAL },
    { ngx_string("failed_to_download_image"), NGX_HTTP_AGENT_FINAL },

    { ngx_null_string, 0 }
};


static ngx_str_t  ngx_http_agent_no_parameters =
    ngx_string("{\"type\":\"object\",\"properties\":{}}");


ngx_http_agent_provider_t *
ngx_http_agent_provider_find(ngx_str_t *name)
{
    ngx_http_agent_provider_t  **p;

    for (p = ngx_http_agent_providers; *p; p++) {
        if ((*p)->name.len == name->len
            && ngx_strncmp((*p)->name.data, name->data, name->len) == 0)
        {
            return *p;
        }
    }

    return NULL;
}


/*
 * The tool list is the same for every request of an agent, so it is
 * rendered once, at configuration time, into the configuration's pool.
 */

ngx_int_t
ngx_http_agent_provider_render_tools(ngx_conf_t *cf, ngx_http_agent_t *agent)
{
    yajl_gen   g;
    ngx_str_t  json;

    g = ngx_http_agent_json_gen(cf->temp_pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    if (agent->provider->render_tools(g, agent) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_json_result(g, 0, &json) != NGX_OK) {
        return NGX_ERROR;
    }

    agent->provider_tools.data = ngx_pstrdup(cf->pool, &json);
    if (agent->provider_tools.data == NULL) {
        return NGX_ERROR;
    }

    agent->provider_tools.len = json.len;

    return NGX_OK;
}


ngx_str_t *
ngx_http_agent_provider_parameters(ngx_http_agent_tool_t *tool)
{
    if (tool->parameters.len == 0) {
        return &ngx_http_agent_no_parameters;
    }

    return &tool->parameters;
}


ngx_str_t *
ngx_http_agent_provider_definition(ngx_http_agent_tool_t *tool,
    ngx_http_agent_provider_t *provider)
{
    ngx_uint_t                  i;
    ngx_http_agent_tool_def_t  *def;

    if (tool->definitions == NULL) {
        return NULL;
    }

    def = tool->definitions->elts;

    for (i = 0; i < tool->definitions->nelts; i++) {
        if (def[i].provider == provider) {
            return &def[i].json;
        }
    }

    return NULL;
}


/*
 * "name", "description" and the schema under the adapter's key, into a
 * map the caller has opened: the part of a function tool every adapter
 * shares.
 */

ngx_uint_t
ngx_http_agent_provider_function(yajl_gen g, ngx_http_agent_tool_t *tool,
    ngx_str_t *schema_key)
{
    ngx_uint_t  failed;

    failed = ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &tool->name);

    if (tool->description.data) {
        failed |= ngx_http_agent_json_key(g, "description");
        failed |= ngx_http_agent_json_str(g, &tool->description);
    }

    failed |= ngx_http_agent_json_str(g, schema_key);
    failed |= ngx_http_agent_json_verbatim(g,
                                      ngx_http_agent_provider_parameters(tool));

    return failed;
}


/*
 * A NUL-terminated JSON text whose value is an object, as a yajl tree
 * the caller frees with ngx_http_agent_json_free(); NULL, logged, if it is not.
 * A NUL inside the text would end it early, so it is refused.
 */

yajl_val
ngx_http_agent_provider_parse(ngx_log_t *log, u_char *json, size_t len,
    char *what)
{
    return ngx_http_agent_provider_tree(log, json, len,
                                        NGX_HTTP_AGENT_JSON_DEPTH, what);
}


/* the same for an event of the log, which wraps what came from outside */

yajl_val
ngx_http_agent_provider_parse_log(ngx_log_t *log, u_char *json, size_t len)
{
    return ngx_http_agent_provider_tree(log, json, len,
                                        NGX_HTTP_AGENT_JSON_LOG_DEPTH,
                                        "an event");
}


static yajl_val
ngx_http_agent_provider_tree(ngx_log_t *log, u_char *json, size_t len,
    ngx_uint_t depth, char *what)
{
    char      err[NGX_HTTP_AGENT_JSON_ERR];
    yajl_val  v;

    v = ngx_http_agent_json_parse(json, len, depth, err, sizeof(err));

    if (v == NULL) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "%s %s", what, err);
        return NULL;
    }

    if (!YAJL_IS_OBJECT(v)) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "%s is not a JSON object", what);
        ngx_http_agent_json_free(v);
        return NULL;
    }

    return v;
}


/* a canonical event of the log; scratch is reused from event to event */

yajl_val
ngx_http_agent_provider_event(ngx_pool_t *pool,
    ngx_http_agent_bytes_t *scratch, ngx_str_t *event)
{
    scratch->len = 0;

    if (ngx_http_agent_bytes_append(pool, scratch, event->data, event->len)
        != NGX_OK
        || ngx_http_agent_bytes_append(pool, scratch, (u_char *) "", 1)
           != NGX_OK)
    {
        return NULL;
    }

    return ngx_http_agent_provider_tree(pool->log, scratch->data,
                                        event->len,
                                        NGX_HTTP_AGENT_JSON_LOG_DEPTH,
                                        "conversation event");
}


ngx_int_t
ngx_http_agent_provider_string(yajl_val v, ngx_str_t *s)
{
    if (!YAJL_IS_STRING(v)) {
        return NGX_DECLINED;
    }

    s->data = (u_char *) v->u.string;
    s->len = ngx_strlen(s->data);

    return NGX_OK;
}


yajl_val
ngx_http_agent_provider_get(yajl_val v, char *key)
{
    size_t  i;

    if (!YAJL_IS_OBJECT(v)) {
        return NULL;
    }

    for (i = 0; i < v->u.object.len; i++) {
        if (v->u.object.keys[i][0] == key[0]
            && ngx_strcmp(v->u.object.keys[i], key) == 0)
        {
            return v->u.object.values[i];
        }
    }

    return NULL;
}


/*
 * A parsed value written back as JSON, a missing one as null.  Numbers
 * keep the digits they came with.  The recursion stops where the
 * generator's depth limit (128) fails it.
 */

ngx_uint_t
ngx_http_agent_provider_value(yajl_gen g, yajl_val v)
{
    size_t      i;
    ngx_uint_t  failed;

    if (v == NULL) {
        return yajl_gen_null(g);
    }

    switch (v->type) {

    case yajl_t_string:
        return yajl_gen_string(g, (u_char *) v->u.string,
                               ngx_strlen(v->u.string));

    case yajl_t_number:
        return yajl_gen_number(g, v->u.number.r, ngx_strlen(v->u.number.r));

    case yajl_t_true:
        return yajl_gen_bool(g, 1);

    case yajl_t_false:
        return yajl_gen_bool(g, 0);

    case yajl_t_object:
        failed = yajl_gen_map_open(g);

        for (i = 0; !failed && i < v->u.object.len; i++) {
            failed = yajl_gen_string(g, (u_char *) v->u.object.keys[i],
                                     ngx_strlen(v->u.object.keys[i]));
            failed |= ngx_http_agent_provider_value(g,
                                                    v->u.object.values[i]);
        }

        return failed ? failed : yajl_gen_map_close(g);

    case yajl_t_array:
        failed = yajl_gen_array_open(g);

        for (i = 0; !failed && i < v->u.array.len; i++) {
            failed = ngx_http_agent_provider_value(g, v->u.array.values[i]);
        }

        return failed ? failed : yajl_gen_array_close(g);

    default: /* yajl_t_null */
        return yajl_gen_null(g);
    }
}


/*
 * A value as a JSON text, for an API that wants JSON inside a string.
 * sub is a generator of the caller's, reused: the text is valid until
 * its next use.
 */

ngx_int_t
ngx_http_agent_provider_text(yajl_gen sub, yajl_val v, ngx_str_t *text)
{
    yajl_gen_clear(sub);
    yajl_gen_reset(sub, NULL);

    return ngx_http_agent_json_result(sub,
                                      ngx_http_agent_provider_value(sub, v),
                                      text);
}


/*
 * What the model sees of a tool_result event, the seeds' convention:
 * {"ok":true,"result":...} or {"ok":false,"error":...}, as a JSON text.
 */

ngx_int_t
ngx_http_agent_provider_result(yajl_gen sub, yajl_val event, ngx_str_t *text)
{
    yajl_val    v;
    ngx_uint_t  ok, failed;

    ok = YAJL_IS_TRUE(ngx_http_agent_provider_get(event, "ok"));

    yajl_gen_clear(sub);
    yajl_gen_reset(sub, NULL);

    failed = yajl_gen_map_open(sub);
    failed |= ngx_http_agent_json_key(sub, "ok");
    failed |= yajl_gen_bool(sub, ok);

    if (ok) {
        v = ngx_http_agent_provider_get(event, "result");
        failed |= ngx_http_agent_json_key(sub, "result");

    } else {
        v = ngx_http_agent_provider_get(event, "error");
        failed |= ngx_http_agent_json_key(sub, "error");
    }

    failed |= ngx_http_agent_provider_value(sub, v);
    failed |= yajl_gen_map_close(sub);

    return ngx_http_agent_json_result(sub, failed, text);
}


/* the agent's options, as more members of the request body's object */

ngx_uint_t
ngx_http_agent_provider_options(yajl_gen g, ngx_http_agent_t *agent)
{
    size_t      i;
    yajl_val    v;
    ngx_uint_t  failed;

    v = agent->options;

    if (v == NULL) {
        return 0;
    }

    failed = 0;

    for (i = 0; i < v->u.object.len; i++) {
        failed |= yajl_gen_string(g,
                                  (u_char *) v->u.object.keys[i],
                                  ngx_strlen(v->u.object.keys[i]));
        failed |= ngx_http_agent_provider_value(g, v->u.object.values[i]);
    }

    return failed;
}


/* the agent's options set this member: the adapter leaves its default */

ngx_uint_t
ngx_http_agent_provider_option(ngx_http_agent_t *agent, char *key)
{
    return agent->options
           && ngx_http_agent_provider_get(agent->options, key) != NULL;
}


/* a JSON string equal to s */

ngx_uint_t
ngx_http_agent_provider_is(yajl_val v, char *s)
{
    return YAJL_IS_STRING(v) && ngx_strcmp(v->u.string, s) == 0;
}


/* the status of a partial (interrupted or cancelled) message, or NULL */

yajl_val
ngx_http_agent_provider_partial(yajl_val event)
{
    yajl_val  v;

    v = ngx_http_agent_provider_get(event, "status");

    if (ngx_http_agent_provider_is(v, "interrupted")
        || ngx_http_agent_provider_is(v, "cancelled"))
    {
        return v;
    }

    return NULL;
}


/*
 * A partial message says so at its end, so that the model knows it was
 * cut off: NGX_OK and the content rewritten, or NGX_DECLINED for a
 * complete message.
 */

ngx_int_t
ngx_http_agent_provider_mark(ngx_pool_t *pool, yajl_val event,
    ngx_str_t *content)
{
    u_char     *p, *last;
    yajl_val    status;
    ngx_str_t   s;

    status = ngx_http_agent_provider_partial(event);

    if (status == NULL) {
        return NGX_DECLINED;
    }

    (void) ngx_http_agent_provider_string(status, &s);

    p = ngx_pnalloc(pool, content->len + sizeof("\n\n[]") - 1 + s.len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    if (content->len) {
        last = ngx_cpymem(p, content->data, content->len);
        last = ngx_sprintf(last, "\n\n[%V]", &s);

    } else {
        /* nothing was said: the mark alone */
        last = ngx_sprintf(p, "[%V]", &s);
    }

    content->data = p;
    content->len = last - p;

    return NGX_OK;
}


/*
 * A call's id goes into a header (Idempotency-Key), a URL (resolve), the
 * zone's table of waiting calls and the log.  One that is not of the
 * API's grammar, or that an earlier call of the reply has, is replaced
 * by an id of the module's, in the reply's raw content too, so that the
 * history sent back pairs each call with its result.  The provider's own
 * id is kept as provider_id.
 */

ngx_int_t
ngx_http_agent_provider_call_ids(ngx_http_agent_reply_t *reply)
{
    u_char                        id[sizeof("call_") - 1 + 16];
    yajl_gen                      g;
    ngx_str_t                     from, to, quoted;
    ngx_uint_t                    i, failed;
    ngx_http_agent_reply_call_t  *call;

    call = reply->calls.elts;

    for (i = 0; i < reply->calls.nelts; i++) {

        if (ngx_http_agent_provider_call_id_ok(reply, i)) {
            continue;
        }

        ngx_sprintf(id, "call_%08xD%08xD", (uint32_t) ngx_random(),
                    (uint32_t) ngx_random());

        ngx_log_error(NGX_LOG_WARN, reply->log, 0,
                      "agent provider gave call %ui an id that cannot be "
                      "used, it is \"%*s\" here", i, sizeof(id), id);

        call[i].provider_id = call[i].id;
        call[i].id.data = NULL;
        call[i].id.len = 0;
        call[i].id.size = 0;

        if (ngx_http_agent_bytes_set(reply->pool, &call[i].id, id,
                                     sizeof(id))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (reply->raw_content.len == 0) {
            continue;
        }

        /* the ids as yajl_gen writes strings, quotes included */

        g = ngx_http_agent_json_gen(reply->pool);
        if (g == NULL) {
            return NGX_ERROR;
        }

        from.data = call[i].provider_id.data;
        from.len = call[i].provider_id.len;

        failed = ngx_http_agent_json_str(g, &from);

        if (ngx_http_agent_json_result(g, failed, &quoted) != NGX_OK) {
            return NGX_ERROR;
        }

        to.len = sizeof(id) + 2;
        to.data = ngx_pnalloc(reply->pool, to.len);
        if (to.data == NULL) {
            return NGX_ERROR;
        }

        ngx_sprintf(to.data, "\"%*s\"", sizeof(id), id);

        if (ngx_http_agent_provider_replace(reply, &quoted, &to) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * The fields of the assistant_msg event of a reply: its text, thinking,
 * the provider's own content blocks, its calls (those of a partial reply
 * too, as far as they came), the object of a structured reply, usage
 * and status.  The generator refuses a
 * string that is not UTF-8.
 */

ngx_int_t
ngx_http_agent_provider_reply_json(ngx_http_agent_reply_t *reply,
    ngx_pool_t *pool, ngx_str_t *message_id, ngx_str_t *status,
    ngx_str_t *out)
{
    yajl_gen                      g;
    ngx_str_t                     s;
    ngx_uint_t                    i, failed;
    ngx_http_agent_reply_call_t  *call;

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);

    failed |= ngx_http_agent_json_key(g, "message_id");
    failed |= ngx_http_agent_json_str(g, message_id);

    failed |= ngx_http_agent_json_key(g, "content");
    failed |= yajl_gen_string(g, reply->text.data, reply->text.len);

    if (reply->object.len) {
        failed |= ngx_http_agent_json_key(g, "object");
        failed |= ngx_http_agent_json_verbatim(g, &reply->object);
    }

    if (reply->thinking.len) {
        failed |= ngx_http_agent_json_key(g, "thinking");
        failed |= yajl_gen_string(g, reply->thinking.data,
                                  reply->thinking.len);
    }

    if (reply->signature.len) {
        failed |= ngx_http_agent_json_key(g, "thinking_signature");
        failed |= yajl_gen_string(g, reply->signature.data,
                                  reply->signature.len);
    }

    if (reply->raw_content.len) {
        s.data = reply->raw_content.data;
        s.len = reply->raw_content.len;
        failed |= ngx_http_agent_json_key(g, "provider_content");
        failed |= ngx_http_agent_json_verbatim(g, &s);
    }

    if (reply->calls.nelts) {
        call = reply->calls.elts;

        failed |= ngx_http_agent_json_key(g, "tool_calls");
        failed |= yajl_gen_array_open(g);

        for (i = 0; i < reply->calls.nelts; i++) {
            failed |= yajl_gen_map_open(g);
            failed |= ngx_http_agent_json_key(g, "id");
            failed |= yajl_gen_string(g, call[i].id.data, call[i].id.len);
            failed |= ngx_http_agent_json_key(g, "name");
            failed |= yajl_gen_string(g, call[i].name.data,
                                      call[i].name.len);
            failed |= ngx_http_agent_json_key(g, "arguments");
            failed |= yajl_gen_string(g, call[i].arguments.data,
                                      call[i].arguments.len);
            failed |= yajl_gen_map_close(g);
        }

        failed |= yajl_gen_array_close(g);
    }

    if (reply->finish_reason.len) {
        failed |= ngx_http_agent_json_key(g, "finish_reason");
        failed |= yajl_gen_string(g, reply->finish_reason.data,
                                  reply->finish_reason.len);
    }

    failed |= ngx_http_agent_json_key(g, "usage");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "input_tokens");
    failed |= yajl_gen_integer(g, reply->input_tokens);
    failed |= ngx_http_agent_json_key(g, "output_tokens");
    failed |= yajl_gen_integer(g, reply->output_tokens);

    /* what a prompt cache served, and (Anthropic) what it was written */

    if (reply->cached_tokens) {
        failed |= ngx_http_agent_json_key(g, "cached_tokens");
        failed |= yajl_gen_integer(g, reply->cached_tokens);
    }

    if (reply->cache_creation_tokens) {
        failed |= ngx_http_agent_json_key(g, "cache_creation_tokens");
        failed |= yajl_gen_integer(g, reply->cache_creation_tokens);
    }

    failed |= yajl_gen_map_close(g);

    failed |= ngx_http_agent_json_key(g, "status");
    failed |= ngx_http_agent_json_str(g, status);

    failed |= yajl_gen_map_close(g);

    return ngx_http_agent_json_result(g, failed, out);
}


/*
 * The body of an HTTP error, as the provider's API writes it
 * ({"error":{"type","code","message"}}, Anthropic's with "type":"error"
 * around it): what it says, into the reply as an error event's would go.
 * NGX_DECLINED: it is not such a body (or it was cut).
 */

ngx_int_t
ngx_http_agent_provider_body_error(ngx_http_agent_reply_t *reply,
    ngx_http_agent_provider_t *provider, u_char *body, size_t len)
{
    char        msg[NGX_HTTP_AGENT_JSON_ERR];
    u_char     *json;
    yajl_val    root, err;
    ngx_int_t   rc;

    if (len == 0 || provider->errors == NULL) {
        return NGX_DECLINED;
    }

    json = ngx_pnalloc(reply->pool, len + 1);
    if (json == NULL) {
        return NGX_ERROR;
    }

    *ngx_cpymem(json, body, len) = '\0';

    /* a proxy's HTML page, or a body cut at its bound, says nothing */

    root = ngx_http_agent_json_parse(json, len, NGX_HTTP_AGENT_JSON_DEPTH,
                                     msg, sizeof(msg));
    if (root == NULL) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, reply->log, 0,
                       "agent provider error body: %s", msg);
        return NGX_DECLINED;
    }

    err = ngx_http_agent_provider_get(root, "error");

    if (err == NULL || !YAJL_IS_OBJECT(err)) {
        ngx_http_agent_json_free(root);
        return NGX_DECLINED;
    }

    rc = ngx_http_agent_provider_error(reply, provider->errors, err,
                                       ngx_http_agent_provider_get(err,
                                                                   "type"));
    ngx_http_agent_json_free(root);

    return rc;
}


/*
 * An error event of the stream, err its error object (or a string, its
 * message) and type its type, or NULL: what the provider said, and what
 * it says of another attempt by known, the adapter's table.  A number as
 * the code (vLLM, OpenRouter) is the HTTP status it stands for.
 */

ngx_int_t
ngx_http_agent_provider_error(ngx_http_agent_reply_t *reply,
    ngx_http_agent_provider_error_t *known, yajl_val err, yajl_val type)
{
    yajl_val    code;
    ngx_str_t   t, c, message, generation;
    ngx_uint_t  class;

    if (ngx_http_agent_provider_string(err, &message) != NGX_OK
        && ngx_http_agent_provider_string(
               ngx_http_agent_provider_get(err, "message"), &message)
           != NGX_OK)
    {
        ngx_str_null(&message);
    }

    if (ngx_http_agent_provider_string(type, &t) != NGX_OK || t.len == 0) {
        /* never empty: it tells the engine there was an error */
        ngx_str_set(&t, "error");
    }

    code = ngx_http_agent_provider_get(err, "code");

    if (ngx_http_agent_provider_string(code, &c) != NGX_OK) {
        if (YAJL_IS_NUMBER(code)) {
            c.data = (u_char *) code->u.number.r;
            c.len = ngx_strlen(c.data);

        } else {
            ngx_str_null(&c);
        }
    }

    if (ngx_http_agent_provider_string(
            ngx_http_agent_provider_get(err, "failed_generation"),
            &generation)
        != NGX_OK)
    {
        ngx_str_null(&generation);
    }

    class = ngx_http_agent_provider_error_class(known, code, &c);

    if (class == NGX_HTTP_AGENT_ERROR_UNKNOWN) {
        class = ngx_http_agent_provider_error_class(known, NULL, &t);
    }

    reply->error_class = class;

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, reply->log, 0,
                   "agent provider stream error: %V %V (class %ui): %V",
                   &t, &c, class, &message);

    if (ngx_http_agent_bytes_set(reply->pool, &reply->error_type, t.data,
                                 t.len)
        != NGX_OK
        || ngx_http_agent_bytes_set(reply->pool, &reply->error_code, c.data,
                                    c.len)
           != NGX_OK
        || ngx_http_agent_bytes_set(reply->pool, &reply->error_message,
                                    message.data, message.len)
           != NGX_OK
        || ngx_http_agent_bytes_set(reply->pool, &reply->error_generation,
                                    generation.data, generation.len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* a name of the table, or a number that is an HTTP status */

static ngx_uint_t
ngx_http_agent_provider_error_class(ngx_http_agent_provider_error_t *known,
    yajl_val v, ngx_str_t *name)
{
    long long  n;

    if (YAJL_IS_INTEGER(v)) {
        n = YAJL_GET_INTEGER(v);

        if (n == 429 || (n >= 500 && n < 600)) {
            return NGX_HTTP_AGENT_ERROR_RETRY;
        }

        return (n >= 400 && n < 500) ? NGX_HTTP_AGENT_ERROR_FINAL
                                     : NGX_HTTP_AGENT_ERROR_UNKNOWN;
    }

    for ( /* void */ ; known->name.len; known++) {
        if (known->name.len == name->len
            && ngx_strncmp(known->name.data, name->data, name->len) == 0)
        {
            return known->class;
        }
    }

    return NGX_HTTP_AGENT_ERROR_UNKNOWN;
}


ngx_uint_t
ngx_http_agent_provider_call_id_ok(ngx_http_agent_reply_t *reply,
    ngx_uint_t n)
{
    u_char                       *p, *last;
    ngx_uint_t                    i;
    ngx_http_agent_reply_call_t  *call;

    call = reply->calls.elts;

    if (call[n].id.len == 0 || call[n].id.len > NGX_HTTP_AGENT_CALL_ID_MAX) {
        return 0;
    }

    last = call[n].id.data + call[n].id.len;

    for (p = call[n].id.data; p < last; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
              || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
        {
            return 0;
        }
    }

    for (i = 0; i < n; i++) {
        if (call[i].id.len == call[n].id.len
            && ngx_memcmp(call[i].id.data, call[n].id.data, call[n].id.len)
               == 0)
        {
            return 0;
        }
    }

    return 1;
}


/* every occurrence of from in the raw content becomes to */

static ngx_int_t
ngx_http_agent_provider_replace(ngx_http_agent_reply_t *reply,
    ngx_str_t *from, ngx_str_t *to)
{
    u_char                  *p, *start, *last;
    ngx_http_agent_bytes_t   out;

    ngx_memzero(&out, sizeof(ngx_http_agent_bytes_t));

    p = reply->raw_content.data;
    start = p;
    last = p + reply->raw_content.len;

    while ((size_t) (last - p) >= from->len) {

        if (ngx_memcmp(p, from->data, from->len) != 0) {
            p++;
            continue;
        }

        if (ngx_http_agent_bytes_append(reply->pool, &out, start, p - start)
            != NGX_OK
            || ngx_http_agent_bytes_append(reply->pool, &out, to->data,
                                           to->len)
               != NGX_OK)
        {
            return NGX_ERROR;
        }

        p += from->len;
        start = p;
    }

    if (ngx_http_agent_bytes_append(reply->pool, &out, start, last - start)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    reply->raw_content = out;

    return NGX_OK;
}
