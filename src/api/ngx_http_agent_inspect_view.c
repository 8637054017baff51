
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * agent_inspect's other views of a conversation: ?view=model_calls pages
 * through the audit of its model calls (?after=CALL&limit=N), read from
 * the store on its thread pool.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_audit.h"
#include "ngx_http_agent_inspect.h"


static void ngx_http_agent_inspect_calls(ngx_http_request_t *r,
    ngx_http_agent_audit_page_t *page, ngx_int_t rc);


ngx_int_t
ngx_http_agent_inspect_view(ngx_http_request_t *r, ngx_str_t *id,
    ngx_str_t *view, ngx_int_t after, ngx_int_t limit)
{
    ngx_int_t                    rc;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    if (view->len != sizeof("model_calls") - 1
        || ngx_strncmp(view->data, "model_calls", view->len) != 0)
    {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_argument",
                                         "view must be model_calls");
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    /* the conversation must be the request's to see: as for the log */

    conv = ngx_http_agent_api_conv_lock(r, z, id, &rc);
    if (conv == NULL) {
        return rc;
    }

    ngx_http_agent_zone_unlock(z);

    rc = ngx_http_agent_store_audit_page(r, id, after, limit,
                                         ngx_http_agent_inspect_calls);

    if (rc == NGX_DECLINED) {
        return ngx_http_agent_json_error(r, NGX_HTTP_NOT_FOUND, "no_store",
                                         "model calls are recorded with "
                                         "agent_store");
    }

    if (rc == NGX_BUSY) {
        return ngx_http_agent_store_busy_answer(r);
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return NGX_DONE;
}


/* {"conversation":ID,"model_calls":[...],"next_after":CALL} */

static void
ngx_http_agent_inspect_calls(ngx_http_request_t *r,
    ngx_http_agent_audit_page_t *page, ngx_int_t rc)
{
    u_char     *p;
    size_t      len;
    ngx_str_t   json;

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r,
            ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "unavailable",
                                      "the store cannot be read"));
        return;
    }

    len = sizeof("{\"conversation\":\"\",\"model_calls\":,"
                 "\"next_after\":}") + 6 * page->conv.len + page->json.len
          + NGX_INT64_LEN;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    json.data = p;

    p = ngx_cpymem(p, "{\"conversation\":\"", sizeof("{\"conversation\":\"")
                                                  - 1);
    p = (u_char *) ngx_escape_json(p, page->conv.data, page->conv.len);
    p = ngx_sprintf(p, "\",\"model_calls\":%V", &page->json);

    if (page->more) {
        p = ngx_sprintf(p, ",\"next_after\":%uL", page->last);
    }

    *p++ = '}';
    json.len = p - json.data;

    ngx_http_finalize_request(r,
                              ngx_http_agent_json_send(r, NGX_HTTP_OK, &json));
}
