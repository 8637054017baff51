
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * What the end of a model call means: the reply goes on, the call is
 * made again after a backoff, or the turn fails with the provider's own
 * words.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_provider.h"


static void ngx_http_agent_turn_reason(ngx_http_agent_turn_t *t,
    ngx_str_t *what, ngx_uint_t status, ngx_str_t *detail, ngx_str_t *reason);


/*
 * What the model call came to.  Before the first token, 429, 5xx and
 * transport errors (and a cut, or an error event the adapter does not
 * call final, before any content) may be retried; after it nothing is.
 * An error event's type and code say whether another attempt can
 * succeed: a rate limit or an overload may pass, a refused request or
 * an exhausted quota will not.  One the adapter does not know is tried
 * again, as a cut would be.  reason is the JSON object of a turn_failed
 * event.
 */

ngx_http_agent_call_e
ngx_http_agent_turn_outcome(ngx_http_agent_turn_t *t, ngx_str_t *reason)
{
    ngx_str_t                what, detail[NGX_HTTP_AGENT_DETAILS];
    ngx_uint_t               status, retry;
    ngx_http_agent_reply_t  *reply;

    reply = t->reply;
    status = t->status;

    if (status == 0 && t->rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        status = t->rc;
    }

    ngx_memzero(detail, sizeof(detail));

    if (t->timed_out) {
        ngx_str_set(&what, "the model call took longer than model_timeout");
        retry = 0;

    } else if (status == 0 || (t->rc == NGX_ERROR && !reply->started
                        && !reply->complete))
    {
        ngx_str_set(&what, "the provider could not be reached");
        retry = 1;

    } else if (status < NGX_HTTP_OK || status >= NGX_HTTP_SPECIAL_RESPONSE) {
        ngx_str_set(&what, "the provider answered with an error");
        detail[0].data = t->error_body.data;
        detail[0].len = t->error_body.len;
        retry = (status == 429 || status >= NGX_HTTP_INTERNAL_SERVER_ERROR);

        /*
         * the body names the error as an error event would: a 429 for an
         * exhausted quota (OpenAI's insufficient_quota) is not retried
         */

        if (ngx_http_agent_provider_body_error(reply, t->agent->provider,
                                               t->error_body.data,
                                               t->error_body.len)
            == NGX_OK)
        {
            detail[1].data = reply->error_type.data;
            detail[1].len = reply->error_type.len;
            detail[2].data = reply->error_code.data;
            detail[2].len = reply->error_code.len;

            if (reply->error_class == NGX_HTTP_AGENT_ERROR_FINAL) {
                retry = 0;
            }
        }

    } else if (t->parse_error) {
        ngx_str_set(&what, "the provider's stream could not be parsed");
        retry = !reply->started;

    } else if (reply->error_type.len || reply->error_message.len) {
        ngx_str_set(&what, "the provider reported an error mid-stream");
        detail[0].data = reply->error_message.data;
        detail[0].len = reply->error_message.len;
        detail[1].data = reply->error_type.data;
        detail[1].len = reply->error_type.len;
        detail[2].data = reply->error_code.data;
        detail[2].len = reply->error_code.len;
        detail[3].data = reply->error_generation.data;
        detail[3].len = reply->error_generation.len;
        retry = !reply->started
                && reply->error_class != NGX_HTTP_AGENT_ERROR_FINAL;

    } else if (!reply->complete) {
        /* nginx reports a read timeout after the header as an error */
        ngx_str_set(&what, "the provider's stream ended early "
                           "(cut, or timed out)");

        retry = !reply->started;

    } else {
        return NGX_HTTP_AGENT_CALL_OK;
    }

    ngx_http_agent_turn_reason(t, &what, status, detail, reason);

    return retry ? NGX_HTTP_AGENT_CALL_RETRY : NGX_HTTP_AGENT_CALL_FAILED;
}


/*
 * {"reason","status","error","error_type","error_code",
 * "failed_generation"}: the provider's own words, each cut to its size,
 * go into the log UTF-8, NULs and bytes that are not (or a character the
 * cut split) replaced
 */

static void
ngx_http_agent_turn_reason(ngx_http_agent_turn_t *t, ngx_str_t *what,
    ngx_uint_t status, ngx_str_t *detail, ngx_str_t *reason)
{
    u_char      *p;
    size_t       len;
    ngx_uint_t   i;

    static char   *keys[] = { "error", "error_type", "error_code",
                              "failed_generation" };
    static size_t  max[] = { NGX_HTTP_AGENT_ERROR_BODY, 64, 64,
                             NGX_HTTP_AGENT_ERROR_BODY };

    len = sizeof("{\"reason\":\"\",\"status\":}") + what->len + NGX_INT_T_LEN;

    for (i = 0; i < NGX_HTTP_AGENT_DETAILS; i++) {
        detail[i].len = ngx_min(detail[i].len, max[i]);

        if (detail[i].len
            && ngx_http_agent_json_utf8_fix(t->pool, &detail[i]) != NGX_OK)
        {
            detail[i].len = 0;
        }

        len += sizeof(",\"\":\"\"") + ngx_strlen(keys[i]) + 6 * detail[i].len;
    }

    p = ngx_pnalloc(t->pool, len);
    if (p == NULL) {
        ngx_str_set(reason, "{\"reason\":\"internal error\"}");
        return;
    }

    reason->data = p;

    p = ngx_sprintf(p, "{\"reason\":\"%V\",\"status\":%ui", what, status);

    for (i = 0; i < NGX_HTTP_AGENT_DETAILS; i++) {
        if (detail[i].len) {
            p = ngx_sprintf(p, ",\"%s\":\"", keys[i]);
            p = (u_char *) ngx_escape_json(p, detail[i].data, detail[i].len);
            *p++ = '"';
        }
    }

    *p++ = '}';
    reason->len = p - reason->data;
}


/* exponential, with jitter, at least Retry-After, at most the cap */

ngx_msec_t
ngx_http_agent_turn_backoff(ngx_http_agent_turn_t *t)
{
    ngx_msec_t         delay;
    ngx_http_agent_t  *agent;

    agent = t->agent;

    delay = agent->retry_base << ngx_min(t->attempt - 1, 16);

    if (delay > agent->retry_cap) {
        delay = agent->retry_cap;
    }

    delay = delay / 2 + (ngx_msec_t) ngx_random() % (delay / 2 + 1);

    if (t->retry_after > 0
        && (ngx_msec_t) t->retry_after * 1000 > delay)
    {
        delay = ngx_min((ngx_msec_t) t->retry_after * 1000, agent->retry_cap);
    }

    return delay;
}
