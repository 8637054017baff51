
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_format_agui.h"


/*
 * The AG-UI events of a run as the format writes them: each opened with
 * its type, given its fields, and closed into the subscriber's buffer as
 * one SSE frame.
 */


/* RUN_STARTED and the state before anything else of the run */

ngx_int_t
ngx_http_agent_agui_start(ngx_http_agent_agui_t *a, ngx_buf_t *b)
{
    ngx_http_agent_agui_run_t  *run;

    if (a->started) {
        return NGX_OK;
    }

    a->started = 1;
    run = a->run;

    ngx_http_agent_agui_open(a, "RUN_STARTED");
    ngx_http_agent_agui_field(a, "threadId", &run->thread);
    ngx_http_agent_agui_field(a, "runId", &run->run);

    if (ngx_http_agent_agui_close(a, b) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_agent_agui_open(a, "STATE_SNAPSHOT");
    a->failed |= ngx_http_agent_json_key(a->g, "snapshot");

    if (run->state.len) {
        a->failed |= ngx_http_agent_json_verbatim(a->g, &run->state);

    } else {
        a->failed |= yajl_gen_map_open(a->g);
        a->failed |= yajl_gen_map_close(a->g);
    }

    if (ngx_http_agent_agui_close(a, b) != NGX_OK) {
        return NGX_ERROR;
    }

    /* a client that brought nothing new gets the messages before the run */

    if (!run->history) {
        return NGX_OK;
    }

    return ngx_http_agent_agui_msgs_snapshot(&a->msgs, b);
}


/*
 * The step of a model call, named by its message id: a new one ends the
 * one before.  NULL: the open step, if any.
 */

ngx_int_t
ngx_http_agent_agui_step(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    ngx_str_t *message_id)
{
    ngx_str_t  name;

    if (ngx_http_agent_agui_start(a, b) != NGX_OK) {
        return NGX_ERROR;
    }

    if (a->step_open
        && message_id->len == a->step_len
        && ngx_strncmp(message_id->data, a->step, a->step_len) == 0)
    {
        return NGX_OK;
    }

    if (ngx_http_agent_agui_blocks_end(a, b, 1, 1) != NGX_OK
        || ngx_http_agent_agui_step_end(a, b) != NGX_OK)
    {
        return NGX_ERROR;
    }

    a->step_open = 1;
    a->text = 0;
    a->thinking = 0;
    a->step_len = ngx_min(message_id->len, NGX_HTTP_AGENT_AGUI_ID_LEN - 8);
    ngx_memcpy(a->step, message_id->data, a->step_len);

    name.data = a->step;
    name.len = a->step_len;

    ngx_http_agent_agui_open(a, "STEP_STARTED");
    ngx_http_agent_agui_field(a, "stepName", &name);

    return ngx_http_agent_agui_close(a, b);
}


ngx_int_t
ngx_http_agent_agui_step_end(ngx_http_agent_agui_t *a, ngx_buf_t *b)
{
    ngx_str_t  name;

    if (!a->step_open) {
        return NGX_OK;
    }

    a->step_open = 0;

    name.data = a->step;
    name.len = a->step_len;

    ngx_http_agent_agui_open(a, "STEP_FINISHED");
    ngx_http_agent_agui_field(a, "stepName", &name);

    return ngx_http_agent_agui_close(a, b);
}


ngx_int_t
ngx_http_agent_agui_blocks_end(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    ngx_uint_t text, ngx_uint_t reasoning)
{
    if (text && a->text_open) {
        a->text_open = 0;

        if (ngx_http_agent_agui_message(a, b, "TEXT_MESSAGE_END", 0, NULL)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (reasoning && a->reasoning_open) {
        a->reasoning_open = 0;

        if (ngx_http_agent_agui_message(a, b, "REASONING_MESSAGE_END", 1,
                                        NULL)
            != NGX_OK
            || ngx_http_agent_agui_message(a, b, "REASONING_END", 1, NULL)
               != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/*
 * An event of the step's text message (its id the model call's) or of
 * its reasoning message (the id and "_r").
 */

ngx_int_t
ngx_http_agent_agui_message(ngx_http_agent_agui_t *a, ngx_buf_t *b,
    char *type, ngx_uint_t reasoning, ngx_str_t *delta)
{
    u_char     buf[NGX_HTTP_AGENT_AGUI_ID_LEN + 16];
    ngx_str_t  step, id, role;

    step.data = a->step;
    step.len = a->step_len;

    ngx_http_agent_agui_open(a, type);
    ngx_http_agent_agui_field(a, "messageId",
                              ngx_http_agent_agui_id(buf, "", &step,
                                                     reasoning ? "_r" : "",
                                                     &id));

    if (ngx_strstr(type, "_START") && ngx_strcmp(type, "REASONING_START")) {
        if (reasoning) {
            ngx_str_set(&role, "reasoning");

        } else {
            ngx_str_set(&role, "assistant");
        }

        ngx_http_agent_agui_field(a, "role", &role);
    }

    if (delta) {
        ngx_http_agent_agui_field(a, "delta", delta);
    }

    return ngx_http_agent_agui_close(a, b);
}












/*
 * A result's content: a string result as it is, any other as its JSON
 * text, an error as its message.
 */

ngx_int_t
ngx_http_agent_agui_result_text(ngx_http_agent_agui_t *a, yajl_val root,
    ngx_str_t *id, ngx_str_t *content, ngx_uint_t *ok)
{
    yajl_val  v;

    if (ngx_http_agent_agui_get(root, "tool_call_id", id) != NGX_OK
        || id->len >= NGX_HTTP_AGENT_AGUI_ID_LEN)
    {
        return NGX_ERROR;
    }

    *ok = (ngx_http_agent_provider_get(root, "ok") != NULL
           && YAJL_IS_TRUE(ngx_http_agent_provider_get(root, "ok")));

    if (!*ok) {
        if (ngx_http_agent_agui_get(root, "error", content) != NGX_OK) {
            ngx_str_set(content, "the tool failed");
        }

        return NGX_OK;
    }

    v = ngx_http_agent_provider_get(root, "result");

    if (v == NULL) {
        ngx_str_set(content, "null");
        return NGX_OK;
    }

    if (YAJL_IS_STRING(v)) {
        return ngx_http_agent_provider_string(v, content);
    }

    return ngx_http_agent_provider_text(a->text_gen, v, content);
}


void
ngx_http_agent_agui_open(ngx_http_agent_agui_t *a, char *type)
{
    a->failed |= yajl_gen_map_open(a->g);
    a->failed |= ngx_http_agent_json_key(a->g, "type");
    a->failed |= yajl_gen_string(a->g, (u_char *) type,
                                 ngx_strlen(type));
}


void
ngx_http_agent_agui_field(ngx_http_agent_agui_t *a, char *key,
    ngx_str_t *value)
{
    a->failed |= yajl_gen_string(a->g, (u_char *) key, ngx_strlen(key));
    a->failed |= ngx_http_agent_json_str(a->g, value);
}


/* the event generated, as "data: JSON" and a blank line */

ngx_int_t
ngx_http_agent_agui_close(ngx_http_agent_agui_t *a, ngx_buf_t *b)
{
    ngx_uint_t  failed;

    failed = a->failed | yajl_gen_map_close(a->g);
    a->failed = 0;

    return ngx_http_agent_format_data(a->g, failed, b);
}
