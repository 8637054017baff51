
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_provider.h"


/*
 * The token counts of a reply's usage, as each adapter finds them in its
 * API's events.  They are charged to budgets, summed into metrics and
 * logged, so a count is taken only as a number of tokens one model call
 * can have: a non-negative number, its fraction dropped, at most
 * NGX_HTTP_AGENT_TOKENS_MAX.  A larger one (a 64-bit maximum, a number
 * no integer holds) counts as that maximum: a provider that claims more
 * than it can have spent is charged the most, never wrapped into
 * credit.  A negative count or a non-number counts as none reported.
 */

#define NGX_HTTP_AGENT_USAGE_TEXT  32


void
ngx_http_agent_provider_tokens(ngx_http_agent_reply_t *reply, yajl_val usage,
    char *name, ngx_uint_t *n)
{
    size_t       len;
    double       d;
    yajl_val     v;
    ngx_uint_t   count;

    v = ngx_http_agent_provider_get(usage, name);

    if (v == NULL || YAJL_IS_NULL(v)) {
        return;
    }

    if (YAJL_IS_INTEGER(v)
        && YAJL_GET_INTEGER(v) >= 0
        && YAJL_GET_INTEGER(v) <= NGX_HTTP_AGENT_TOKENS_MAX)
    {
        *n = (ngx_uint_t) YAJL_GET_INTEGER(v);
        return;
    }

    /* strtod() reads what no integer holds: HUGE_VAL past a double's */
    d = YAJL_IS_NUMBER(v) ? strtod(v->u.number.r, NULL) : -1;

    if (!(d >= 0)) {
        ngx_log_error(NGX_LOG_WARN, reply->log, 0,
                      "agent provider reported \"%s\" that is not a count "
                      "of tokens, ignored", name);
        return;
    }

    count = (d < NGX_HTTP_AGENT_TOKENS_MAX) ? (ngx_uint_t) d
                                            : NGX_HTTP_AGENT_TOKENS_MAX;

    len = ngx_min(ngx_strlen(v->u.number.r), NGX_HTTP_AGENT_USAGE_TEXT);

    ngx_log_error(NGX_LOG_WARN, reply->log, 0,
                  "agent provider reported \"%s\" of %*s tokens, "
                  "counted as %ui", name, len, v->u.number.r, count);

    *n = count;
}


void
ngx_http_agent_provider_usage(ngx_http_agent_reply_t *reply, yajl_val usage,
    char *input, char *output, char *details)
{
    ngx_http_agent_provider_tokens(reply, usage, input, &reply->input_tokens);
    ngx_http_agent_provider_tokens(reply, usage, output,
                                   &reply->output_tokens);
    ngx_http_agent_provider_tokens(reply,
                                   ngx_http_agent_provider_get(usage, details),
                                   "cached_tokens", &reply->cached_tokens);
}
