
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_output.h"


/*
 * Structured output.  A user message may carry "output": {"name",
 * "schema"}; the turn it starts asks the API for a reply of that schema
 * (each adapter its own way) and the reply's JSON object is recorded as
 * the assistant message's "object".  The turn's message is the log's
 * last user_msg, so a revived or taken-over turn finds it there too.
 */


static ngx_int_t ngx_http_agent_output_take(ngx_http_agent_reply_t *reply,
    ngx_str_t *name, ngx_str_t *json);


#define NGX_HTTP_AGENT_USER_MSG  "{\"type\":\"user_msg\""


/* the output the log's last user message asks for; out->name empty: none */

ngx_int_t
ngx_http_agent_output_find(ngx_pool_t *pool, ngx_str_t *events,
    ngx_uint_t nevents, ngx_http_agent_output_t *out)
{
    yajl_gen                 g;
    yajl_val                 ev, output, name, schema;
    ngx_int_t                rc;
    ngx_uint_t               i;
    ngx_http_agent_bytes_t   scratch;

    ngx_memzero(out, sizeof(ngx_http_agent_output_t));

    for (i = nevents; i > 0; i--) {
        if (events[i - 1].len > sizeof(NGX_HTTP_AGENT_USER_MSG) - 1
            && ngx_strncmp(events[i - 1].data, NGX_HTTP_AGENT_USER_MSG,
                           sizeof(NGX_HTTP_AGENT_USER_MSG) - 1)
               == 0)
        {
            break;
        }
    }

    if (i == 0) {
        return NGX_OK;
    }

    ngx_memzero(&scratch, sizeof(ngx_http_agent_bytes_t));

    ev = ngx_http_agent_provider_event(pool, &scratch, &events[i - 1]);
    if (ev == NULL) {
        return NGX_ERROR;
    }

    output = ngx_http_agent_provider_get(ev, "output");
    name = ngx_http_agent_provider_get(output, "name");
    schema = ngx_http_agent_provider_get(output, "schema");

    rc = NGX_OK;

    if (YAJL_IS_STRING(name) && YAJL_IS_OBJECT(schema)) {
        g = ngx_http_agent_json_gen(pool);

        if (g == NULL
            || ngx_http_agent_json_result(g,
                   ngx_http_agent_provider_value(g, schema), &out->schema)
               != NGX_OK)
        {
            rc = NGX_ERROR;

        } else {
            out->name.data = (u_char *) name->u.string;
            out->name.len = ngx_strlen(name->u.string);
            out->name.data = ngx_pstrdup(pool, &out->name);

            /* the generator's buffer goes with the pool */
            if (out->name.data == NULL) {
                rc = NGX_ERROR;
            }
        }
    }

    ngx_http_agent_json_free(ev);

    if (scratch.data) {
        ngx_pfree(pool, scratch.data);
    }

    return rc;
}


/*
 * The reply of a turn that asked for output "name": its text (or the
 * input of the tool call the output was asked as, Anthropic's) must be a
 * JSON object, which becomes reply->object.  No tool runs in such a
 * turn: a call of another tool is a failure.  NGX_DECLINED: *err says
 * what is wrong.
 */

ngx_int_t
ngx_http_agent_output_reply(ngx_http_agent_reply_t *reply, ngx_str_t *name,
    char **err)
{
    char       msg[NGX_HTTP_AGENT_JSON_ERR];
    yajl_gen   g;
    yajl_val   v;
    ngx_int_t  rc;
    ngx_str_t  json;

    json.data = reply->text.data;
    json.len = reply->text.len;

    if (ngx_http_agent_output_take(reply, name, &json) != NGX_OK) {
        return NGX_ERROR;
    }

    if (reply->calls.nelts) {
        *err = "the model called a tool instead of answering with the "
               "output asked for";
        return NGX_DECLINED;
    }

    if (json.len == 0) {
        *err = "the reply is empty, not the JSON object the output asks for";
        return NGX_DECLINED;
    }

    v = ngx_http_agent_json_parse(json.data, json.len,
                                  NGX_HTTP_AGENT_JSON_DEPTH, msg,
                                  sizeof(msg));
    if (v == NULL) {
        *err = ngx_http_agent_json_reason(reply->pool, "the reply ", msg);
        return *err ? NGX_DECLINED : NGX_ERROR;
    }

    if (!YAJL_IS_OBJECT(v)) {
        ngx_http_agent_json_free(v);
        *err = "the reply is JSON but not the object the output asks for";
        return NGX_DECLINED;
    }

    g = ngx_http_agent_json_gen(reply->pool);

    rc = (g == NULL) ? NGX_ERROR
         : ngx_http_agent_json_result(g, ngx_http_agent_provider_value(g, v),
                                      &reply->object);

    ngx_http_agent_json_free(v);

    return rc;
}


/*
 * A call of the tool the output was asked as is not a call: its input is
 * the object (*json), and the reply's text unless the model wrote text
 * too.  Its block must not go back to the API as a call without a
 * result, so the content kept as the API returned it is rebuilt from the
 * text instead.
 */

static ngx_int_t
ngx_http_agent_output_take(ngx_http_agent_reply_t *reply, ngx_str_t *name,
    ngx_str_t *json)
{
    ngx_uint_t                    i;
    ngx_http_agent_reply_call_t  *call;

    call = reply->calls.elts;

    for (i = 0; i < reply->calls.nelts; i++) {
        if (call[i].name.len == name->len
            && ngx_strncmp(call[i].name.data, name->data, name->len) == 0)
        {
            break;
        }
    }

    if (i == reply->calls.nelts) {
        return NGX_OK;
    }

    json->data = call[i].arguments.data;
    json->len = call[i].arguments.len;

    if (reply->text.len == 0
        && ngx_http_agent_bytes_set(reply->pool, &reply->text, json->data,
                                    json->len)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_memmove(&call[i], &call[i + 1],
                (reply->calls.nelts - i - 1)
                * sizeof(ngx_http_agent_reply_call_t));

    reply->calls.nelts--;
    reply->raw_content.len = 0;

    return NGX_OK;
}
