
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_inspect.h"


#define NGX_HTTP_AGENT_PAGE      100
#define NGX_HTTP_AGENT_PAGE_MAX  1000


static ngx_int_t ngx_http_agent_inspect_arg(ngx_http_request_t *r,
    char *name, size_t len, ngx_int_t def, ngx_int_t *value);


/*
 * GET: the conversation's state and its messages, paged by seq:
 * ?after=SEQ&limit=N.  The events are the log's own JSON.
 */

ngx_int_t
ngx_http_agent_inspect_handler(ngx_http_request_t *r)
{
    u_char                      *p;
    size_t                       len;
    uint64_t                     last;
    ngx_int_t                    rc, after, limit;
    ngx_str_t                    id, json;
    ngx_uint_t                   n, i;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_event_t     **evs;
    ngx_http_agent_main_conf_t  *amcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_agent_json_method(r, "GET, HEAD");
    }

    rc = ngx_http_agent_conversation_id(r, &id);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_conversation",
                                         "the conversation id is missing or "
                                         "invalid");
    }

    if (ngx_http_agent_inspect_arg(r, "after", 5, 0, &after) != NGX_OK
        || ngx_http_agent_inspect_arg(r, "limit", 5, NGX_HTTP_AGENT_PAGE,
                                      &limit)
           != NGX_OK
        || limit == 0 || limit > NGX_HTTP_AGENT_PAGE_MAX)
    {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_argument",
                                         "after must be a seq and limit "
                                         "1 to 1000");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    evs = ngx_palloc(r->pool, limit * sizeof(ngx_http_agent_event_t *));
    if (evs == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(z);
        return ngx_http_agent_json_error(r, NGX_HTTP_NOT_FOUND, "not_found",
                                         "no such conversation");
    }

    n = ngx_http_agent_log_after_locked(conv, after, evs, limit);

    len = sizeof("{\"conversation\":\"\",\"state\":\"\",\"turn\":,"
                 "\"last_seq\":,\"lease\":,\"pending\":[],"
                 "\"in_flight_tools\":[],\"messages\":[],\"next_after\":}")
          + id.len + 16 + 3 * NGX_INT64_LEN + NGX_INT_T_LEN;

    for (i = 0; i < n; i++) {
        len += evs[i]->len + 1;
    }

    json.data = ngx_pnalloc(r->pool, len);
    if (json.data == NULL) {
        ngx_http_agent_zone_unlock(z);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_sprintf(json.data,
                    "{\"conversation\":\"%V\",\"state\":\"%V\","
                    "\"turn\":%ui,\"last_seq\":%uL,\"lease\":",
                    &id, &ngx_http_agent_state_names[conv->state],
                    conv->turn, conv->seq);

    p = conv->lease ? ngx_sprintf(p, "%P", conv->lease)
                    : ngx_cpymem(p, "null", 4);

    p = ngx_cpymem(p, ",\"pending\":[],\"in_flight_tools\":[],"
                      "\"messages\":[",
                   sizeof(",\"pending\":[],\"in_flight_tools\":[],"
                          "\"messages\":[") - 1);

    last = after;

    for (i = 0; i < n; i++) {
        if (i) {
            *p++ = ',';
        }

        p = ngx_cpymem(p, evs[i]->data, evs[i]->len);
        last = evs[i]->seq;
    }

    ngx_http_agent_zone_unlock(z);

    p = ngx_sprintf(p, "],\"next_after\":%uL}", last);

    json.len = p - json.data;

    return ngx_http_agent_json_send(r, NGX_HTTP_OK, &json);
}


static ngx_int_t
ngx_http_agent_inspect_arg(ngx_http_request_t *r, char *name, size_t len,
    ngx_int_t def, ngx_int_t *value)
{
    ngx_str_t  s;

    if (ngx_http_arg(r, (u_char *) name, len, &s) != NGX_OK) {
        *value = def;
        return NGX_OK;
    }

    *value = ngx_atoi(s.data, s.len);

    return (*value == NGX_ERROR) ? NGX_ERROR : NGX_OK;
}
