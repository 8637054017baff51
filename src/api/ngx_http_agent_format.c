
/*
 * Copyright (C) The nginx agent module authors
 */


/* what formats of JSON events share */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_format.h"
#include "ngx_http_agent_events_sub.h"


yajl_val
ngx_http_agent_format_parse(ngx_http_agent_events_sub_t *sub,
    ngx_http_agent_event_t *ev)
{
    char      errbuf[NGX_HTTP_AGENT_JSON_ERR];
    yajl_val  root;

    root = ngx_http_agent_json_parse(ev->data, ev->len,
                                     NGX_HTTP_AGENT_JSON_LOG_DEPTH, errbuf,
                                     sizeof(errbuf));
    if (root == NULL) {
        ngx_log_error(NGX_LOG_ALERT, sub->request->connection->log, 0,
                      "agent events: an event of \"%V\" does not parse: %s",
                      &sub->id, errbuf);
    }

    return root;
}


ngx_int_t
ngx_http_agent_format_data(yajl_gen g, ngx_uint_t failed, ngx_buf_t *b)
{
    size_t                len;
    ngx_int_t             rc;
    const unsigned char  *json;

    rc = NGX_ERROR;

    if (!failed
        && yajl_gen_get_buf(g, &json, &len) == yajl_gen_status_ok
        && (size_t) (b->end - b->last) >= len + sizeof("data: \n\n") - 1)
    {
        b->last = ngx_sprintf(b->last, "data: %*s\n\n", len, json);
        rc = NGX_OK;
    }

    yajl_gen_clear(g);
    yajl_gen_reset(g, NULL);

    return rc;
}
