
/*
 * Copyright (C) The nginx agent module authors
 */


/* What an event stream's request says, and the head of its answer. */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_events.h"


ngx_int_t
ngx_http_agent_events_request_not_allowed(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_agent_events_header_add(r, "Allow", "GET, HEAD") != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_json_error(r, NGX_HTTP_NOT_ALLOWED,
                                     "method_not_allowed",
                                     "agent_events answers GET and HEAD");
}


/* the seq to resume after: Last-Event-ID, else ?after=, else 0 */

ngx_int_t
ngx_http_agent_events_request_after(ngx_http_request_t *r, uint64_t *after)
{
    off_t             n;
    ngx_str_t         value;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    ngx_str_null(&value);

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == sizeof("Last-Event-ID") - 1
            && ngx_strncasecmp(h[i].key.data, (u_char *) "Last-Event-ID",
                               sizeof("Last-Event-ID") - 1)
               == 0)
        {
            value = h[i].value;
            break;
        }
    }

    if (value.len == 0
        && (ngx_http_arg(r, (u_char *) "after", sizeof("after") - 1, &value)
            != NGX_OK
            || value.len == 0))
    {
        *after = 0;
        return NGX_OK;
    }

    n = ngx_atoof(value.data, value.len);

    if (n == NGX_ERROR) {
        return NGX_DECLINED;
    }

    *after = (uint64_t) n;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_events_request_header(ngx_http_request_t *r,
    ngx_http_agent_events_format_t *format)
{
    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = -1;

    ngx_str_set(&r->headers_out.content_type, "text/event-stream");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    if (ngx_http_agent_events_header_add(r, "Cache-Control", "no-cache")
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* for an nginx in front of this one, which would buffer the stream */

    if (ngx_http_agent_events_header_add(r, "X-Accel-Buffering", "no")
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (format->header(r) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_send_header(r);
}


ngx_int_t
ngx_http_agent_events_header_add(ngx_http_request_t *r, char *key,
    char *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    /* zeroed: newer nginx has more fields here (h->next) */
    ngx_memzero(h, sizeof(ngx_table_elt_t));

    h->hash = 1;
    h->key.data = (u_char *) key;
    h->key.len = ngx_strlen(key);
    h->value.data = (u_char *) value;
    h->value.len = ngx_strlen(value);

    return NGX_OK;
}
