
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * agent_create: POST makes a conversation with an id the module mints,
 * 128 bits from the kernel's random source, and answers it:
 * 201 {"conversation": ID}.  The conversation is bound to the
 * location's agent and the request's owner at once, so that its id,
 * which nobody can guess, is also nobody else's to take.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sys/random.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_create.h"


#define NGX_HTTP_AGENT_CREATE_BYTES   16


static ngx_int_t ngx_http_agent_create_id(ngx_http_request_t *r,
    ngx_str_t *id);


/* agent_create; */

char *
ngx_http_agent_create(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    return ngx_http_agent_api_set(cf, cmd, conf,
                                  ngx_http_agent_create_handler);
}


ngx_int_t
ngx_http_agent_create_handler(ngx_http_request_t *r)
{
    u_char                      *p;
    ngx_int_t                    rc;
    ngx_str_t                    id, json, *owner;
    ngx_uint_t                   i;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_main_conf_t  *amcf;

    if (r->method != NGX_HTTP_POST) {
        return ngx_http_agent_json_method(r, "POST");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_agent_api_owner_check(r, &owner, &rc) != NGX_OK) {
        return rc;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    conv = NULL;

    /* a clash of 128 random bits does not happen; a bad source might */

    for (i = 0; i < 4 && conv == NULL; i++) {

        if (ngx_http_agent_create_id(r, &id) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_agent_zone_lock(z);

        if (ngx_http_agent_conv_find_locked(z, &id) != NULL) {
            ngx_http_agent_zone_unlock(z);
            continue;
        }

        conv = ngx_http_agent_api_conv_create_locked(r, z, &id, &rc);

        if (conv == NULL) {
            return rc;
        }

        ngx_http_agent_conv_bind_locked(conv, ngx_http_agent_api_agent(r),
                                        owner);
        ngx_http_agent_conv_mint_locked(z, conv);

        ngx_http_agent_zone_unlock(z);
    }

    if (conv == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "agent create: the random source repeats itself");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_pnalloc(r->pool, sizeof("{\"conversation\":\"\"}") - 1 + id.len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.data = p;
    json.len = ngx_sprintf(p, "{\"conversation\":\"%V\"}", &id) - p;

    return ngx_http_agent_json_send(r, NGX_HTTP_CREATED, &json);
}


/* 32 hex digits */

static ngx_int_t
ngx_http_agent_create_id(ngx_http_request_t *r, ngx_str_t *id)
{
    u_char  bytes[NGX_HTTP_AGENT_CREATE_BYTES];

    if (getrandom(bytes, sizeof(bytes), 0) != (ssize_t) sizeof(bytes)) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, ngx_errno,
                      "agent create: getrandom() failed");
        return NGX_ERROR;
    }

    id->data = ngx_pnalloc(r->pool, 2 * sizeof(bytes));
    if (id->data == NULL) {
        return NGX_ERROR;
    }

    id->len = ngx_hex_dump(id->data, bytes, sizeof(bytes)) - id->data;

    return NGX_OK;
}
