
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_zone_status.h"


/*
 * agent_zone_status: what the zone holds, for monitoring and sizing:
 * {"zone":NAME,"size":BYTES,"pages":N,"free_pages":N,"used":BYTES,
 *  "conversations":N,"reserve":BOOL}
 */

static ngx_int_t ngx_http_agent_zone_status_handler(ngx_http_request_t *r);


char *
ngx_http_agent_zone_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler) {
        return "is duplicate";
    }

    clcf->handler = ngx_http_agent_zone_status_handler;

    /* nginx's own errors there are answered as JSON too */
    alcf->status = 1;

    return NGX_CONF_OK;
}


/*
 * A GET of a status page: NGX_OK, the zone in *zp; or NGX_DONE, the
 * request answered or refused, *rc what the handler returns.  An
 * answer sent is not NGX_OK: that would read as "go on" and send a
 * second one.
 */

ngx_int_t
ngx_http_agent_zone_status_request(ngx_http_request_t *r,
    ngx_http_agent_zone_t **zp, ngx_int_t *rc)
{
    ngx_http_agent_main_conf_t  *amcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        *rc = ngx_http_agent_json_method(r, "GET, HEAD");
        return NGX_DONE;
    }

    *rc = ngx_http_discard_request_body(r);
    if (*rc != NGX_OK) {
        return NGX_DONE;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    *zp = amcf->zone;

    if (*zp == NULL) {
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                        "internal_error",
                                        "no agent_zone is configured");
        return NGX_DONE;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_zone_status_handler(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_str_t                    json;
    ngx_uint_t                   pages, free, count, reserve;
    ngx_slab_pool_t             *shpool;
    ngx_http_agent_zone_t       *z;

    if (ngx_http_agent_zone_status_request(r, &z, &rc) != NGX_OK) {
        return rc;
    }

    shpool = z->shpool;

    ngx_http_agent_zone_lock(z);

    pages = (shpool->end - shpool->start) / ngx_pagesize;
    free = shpool->pfree;
    count = z->sh->count;
    reserve = (z->sh->reserve != NULL);

    ngx_http_agent_zone_unlock(z);

    json.data = ngx_pnalloc(r->pool, 160 + z->shm_zone->shm.name.len);
    if (json.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.len = ngx_sprintf(json.data,
                           "{\"zone\":\"%V\",\"size\":%uz,\"pages\":%ui,"
                           "\"free_pages\":%ui,\"used\":%ui,"
                           "\"conversations\":%ui,\"reserve\":%s}",
                           &z->shm_zone->shm.name, z->shm_zone->shm.size,
                           pages, free, (pages - free) * ngx_pagesize, count,
                           reserve ? "true" : "false")
               - json.data;

    return ngx_http_agent_json_send(r, NGX_HTTP_OK, &json);
}
