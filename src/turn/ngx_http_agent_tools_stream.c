
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * A streaming tool: its location answers NDJSON lines, progress then a
 * result or an error, read as they come.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_tools_call.h"
#include "ngx_http_agent_wake.h"


static ngx_int_t ngx_http_agent_tools_line(ngx_http_agent_call_t *call);
static ngx_int_t ngx_http_agent_tools_outcome(ngx_http_agent_call_t *call,
    yajl_val result, yajl_val error);
static yajl_gen ngx_http_agent_tools_gen(ngx_http_agent_call_t *call);


/*
 * A streaming tool's location answers NDJSON: one JSON object per line,
 * each line ended by LF (CR LF is taken too), parsed as the lines
 * arrive:
 *
 *     {"progress": ANY}    a tool_progress live event, not logged
 *     {"result": ANY}      the result: the call ends with it
 *     {"error": "text"}    an error result: the call ends with it
 *
 * "error" wins over "result", and either over "progress".  Empty lines
 * and objects with none of these members are skipped (keep-alives);
 * what follows the result line is ignored.  A line that is not a JSON
 * object, or is longer than 1 MiB, ends the call with an error result,
 * and so does the end of the stream before a result line.  A status
 * other than 2xx is an error result carrying the body, whatever it is,
 * as for any tool: that body is not read as lines.
 * Progress reaches subscribers only if the location passes the body on
 * as it comes (proxy_buffering off).
 */

ngx_int_t
ngx_http_agent_tools_stream(ngx_http_agent_call_t *call, ngx_chain_t *in)
{
    u_char       *p, *lf, *last;
    size_t        n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;

        if (!ngx_buf_in_memory(b)) {
            if (ngx_buf_size(b)) {
                if (!call->ended) {
                    call->ended = 1;
                    call->error = "the tool's output was buffered to a "
                                  "file: its location needs "
                                  "\"proxy_buffering off\"";
                }

                b->file_pos = b->file_last;
            }

            continue;
        }

        p = b->pos;
        last = b->last;

        b->pos = b->last;

        if (call->done || call->ended) {
            continue;
        }

        while (p < last) {
            lf = ngx_strlchr(p, last, LF);
            n = (lf ? lf : last) - p;

            /* a line is at most as large as a whole result may be */

            if (n > NGX_HTTP_AGENT_RESULT_MAX - call->line.len) {
                call->too_large = 1;
                call->ended = 1;
                break;
            }

            if (ngx_http_agent_bytes_append(call->turn->pool, &call->line,
                                            p, n)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            if (lf == NULL) {
                /* the rest of the line comes in a later buffer */
                break;
            }

            p = lf + 1;

            if (ngx_http_agent_tools_line(call) != NGX_OK) {
                return NGX_ERROR;
            }

            if (call->ended) {
                break;
            }
        }
    }

    return NGX_OK;
}


/* the line in call->line, without its LF; the buffer is then reused */

static ngx_int_t
ngx_http_agent_tools_line(ngx_http_agent_call_t *call)
{
    char        err[NGX_HTTP_AGENT_JSON_ERR];
    u_char     *data, c;
    size_t      len;
    yajl_val    v, result, error, progress;
    ngx_int_t   rc;

    len = call->line.len;

    while (len) {
        c = call->line.data[len - 1];

        if (c != CR && c != LF && c != ' ' && c != '\t') {
            break;
        }

        len--;
    }

    call->line.len = len;

    if (len == 0) {
        return NGX_OK;
    }

    data = call->line.data;
    call->line.len = 0;

    v = ngx_http_agent_json_parse(data, len, NGX_HTTP_AGENT_JSON_DEPTH, err,
                                  sizeof(err));

    if (!YAJL_IS_OBJECT(v)) {
        if (v) {
            ngx_http_agent_json_free(v);
            ngx_cpystrn((u_char *) err, (u_char *) "is not a JSON object",
                        sizeof(err));
        }

        ngx_log_error(NGX_LOG_ERR, &call->turn->log, 0,
                      "agent tool \"%V\" of call \"%V\" sent a line that "
                      "%s", &call->name, &call->id, err);

        call->ended = 1;
        call->error = "the tool's output line is not a JSON object";

        return NGX_OK;
    }

    result = ngx_http_agent_provider_get(v, "result");
    error = ngx_http_agent_provider_get(v, "error");
    progress = ngx_http_agent_provider_get(v, "progress");

    if (YAJL_IS_NULL(error)) {
        /* {"result": R, "error": null} is a result */
        error = NULL;
    }

    rc = NGX_OK;

    if (result || error) {
        rc = ngx_http_agent_tools_outcome(call, result, error);

    } else if (progress) {
        rc = ngx_http_agent_tools_progress(call, progress);
    }

    ngx_http_agent_json_free(v);

    return rc;
}


/* {"tool_call_id":ID,"name":NAME,"progress":ANY}, a live event */

ngx_int_t
ngx_http_agent_tools_progress(ngx_http_agent_call_t *call, yajl_val progress)
{
    yajl_gen                g;
    ngx_str_t               fields;
    ngx_uint_t              failed;
    ngx_http_agent_turn_t  *t;

    t = call->turn;

    g = ngx_http_agent_tools_gen(call);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "tool_call_id");
    failed |= ngx_http_agent_json_str(g, &call->id);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &call->name);
    failed |= ngx_http_agent_json_key(g, "progress");
    failed |= ngx_http_agent_provider_value(g, progress);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &fields) != NGX_OK) {
        /* too deep to write: progress is not worth failing the call */
        return NGX_OK;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, &t->log, 0,
                   "agent tool call \"%V\" progress: %V", &call->id, &fields);

    /* a live event that finds no room is dropped, as deltas are */
    (void) ngx_http_agent_emit(t->zone, &t->id,
                               NGX_HTTP_AGENT_EV_TOOL_PROGRESS, &fields);

    return NGX_OK;
}


/*
 * The result or error line: the result is kept as JSON text, written
 * anew, NUL-terminated, in call->body; an error not given as a string
 * is kept as its JSON text.
 */

static ngx_int_t
ngx_http_agent_tools_outcome(ngx_http_agent_call_t *call, yajl_val result,
    yajl_val error)
{
    u_char      *p;
    yajl_gen     g;
    ngx_str_t    json;
    ngx_uint_t   failed;

    call->ended = 1;

    if (YAJL_IS_STRING(error)) {
        json.data = (u_char *) error->u.string;
        json.len = ngx_strlen(json.data);

    } else {
        g = ngx_http_agent_tools_gen(call);
        if (g == NULL) {
            return NGX_ERROR;
        }

        failed = ngx_http_agent_provider_value(g, error ? error : result);

        if (ngx_http_agent_json_result(g, failed, &json) != NGX_OK) {
            call->error = "the tool's result is nested too deeply";
            return NGX_OK;
        }
    }

    if (error == NULL) {
        if (ngx_http_agent_bytes_set(call->turn->pool, &call->body,
                                     json.data, json.len)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_agent_bytes_append(call->turn->pool, &call->body,
                                           (u_char *) "", 1);
    }

    p = ngx_pnalloc(call->turn->pool, json.len + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p, json.data, json.len);
    p[json.len] = '\0';

    call->error = (char *) p;

    return NGX_OK;
}


/* one generator per call, for every line */

static yajl_gen
ngx_http_agent_tools_gen(ngx_http_agent_call_t *call)
{
    if (call->gen == NULL) {
        call->gen = ngx_http_agent_json_gen(call->turn->pool);
        return call->gen;
    }

    yajl_gen_clear(call->gen);
    yajl_gen_reset(call->gen, NULL);

    return call->gen;
}


/* a streaming tool's call ends with its result or error line, if any */

void
ngx_http_agent_tools_stream_end(ngx_http_agent_call_t *call)
{
    ngx_str_t  result;

    if (!call->ended && call->line.len) {
        /* the last line, without its LF */
        if (ngx_http_agent_tools_line(call) != NGX_OK) {
            call->ended = 1;
            call->error = "the tool failed";
        }
    }

    if (call->too_large) {
        (void) ngx_http_agent_tools_result(call, NULL,
                                           "the tool's output line is too "
                                           "large");

    } else if (call->error) {
        (void) ngx_http_agent_tools_result(call, NULL, call->error);

    } else if (call->ended) {
        result.data = call->body.data;
        result.len = call->body.len - 1;
        (void) ngx_http_agent_tools_result(call, &result, NULL);

    } else {
        (void) ngx_http_agent_tools_result(call, NULL,
                                           "the tool ended without a result "
                                           "line");
    }
}
