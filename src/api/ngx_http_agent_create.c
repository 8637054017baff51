
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
#include "ngx_http_agent_store.h"


#define NGX_HTTP_AGENT_CREATE_BYTES   16


typedef struct {
    ngx_http_request_t          *request;
    ngx_str_t                   *owner;
    ngx_str_t                    id;
    ngx_uint_t                   tries;
} ngx_http_agent_create_t;


static ngx_int_t ngx_http_agent_create_mint(ngx_http_agent_create_t *cr);
static ngx_int_t ngx_http_agent_create_answer(ngx_http_agent_create_t *cr);
static void ngx_http_agent_create_written(ngx_http_agent_store_read_t *rd,
    ngx_int_t rc, void *data);
static void ngx_http_agent_create_forget(ngx_http_agent_create_t *cr);
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
    ngx_int_t                  rc;
    ngx_http_agent_create_t   *cr;

    if (r->method != NGX_HTTP_POST) {
        return ngx_http_agent_json_method(r, "POST");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    cr = ngx_pcalloc(r->pool, sizeof(ngx_http_agent_create_t));
    if (cr == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cr->request = r;

    if (ngx_http_agent_api_owner_check(r, &cr->owner, &rc) != NGX_OK) {
        return rc;
    }

    return ngx_http_agent_create_mint(cr);
}


/*
 * An id drawn, its record made in the zone; with a store that keeps
 * created ids (PostgreSQL), answered once its row is written there
 */

static ngx_int_t
ngx_http_agent_create_mint(ngx_http_agent_create_t *cr)
{
    ngx_int_t                    rc;
    ngx_http_request_t          *r;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_main_conf_t  *amcf;

    r = cr->request;
    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    conv = NULL;

    /* a clash of 128 random bits does not happen; a bad source might */

    while (cr->tries < 4 && conv == NULL) {
        cr->tries++;

        if (ngx_http_agent_create_id(r, &cr->id) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_agent_zone_lock(z);

        if (ngx_http_agent_conv_find_locked(z, &cr->id) != NULL) {
            ngx_http_agent_zone_unlock(z);
            continue;
        }

        conv = ngx_http_agent_api_conv_create_locked(r, z, &cr->id, &rc);

        if (conv == NULL) {
            return rc;
        }

        ngx_http_agent_conv_bind_locked(conv, ngx_http_agent_api_agent(r),
                                        cr->owner);
        ngx_http_agent_conv_mint_locked(z, conv);

        ngx_http_agent_zone_unlock(z);
    }

    if (conv == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "agent create: the random source repeats itself");
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_agent_store_create(r->pool, &cr->id,
                                     ngx_http_agent_api_agent(r), cr->owner,
                                     ngx_http_agent_create_written, cr);

    if (rc == NGX_OK) {
        r->main->count++;
        return NGX_DONE;
    }

    if (rc != NGX_DECLINED) {
        ngx_http_agent_create_forget(cr);

        return (rc == NGX_BUSY) ? ngx_http_agent_store_busy_answer(r)
                                : NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_create_answer(cr);
}


static ngx_int_t
ngx_http_agent_create_answer(ngx_http_agent_create_t *cr)
{
    u_char              *p;
    ngx_str_t            json;
    ngx_http_request_t  *r;

    r = cr->request;

    p = ngx_pnalloc(r->pool, sizeof("{\"conversation\":\"\"}") - 1
                             + cr->id.len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    json.data = p;
    json.len = ngx_sprintf(p, "{\"conversation\":\"%V\"}", &cr->id) - p;

    return ngx_http_agent_json_send(r, NGX_HTTP_CREATED, &json);
}


/*
 * The row written: the id is the store's, bound to its agent and owner,
 * and a request for it on another node finds it so.  Taken (another
 * node drew the same id: the store's key refused it), another is drawn.
 */

static void
ngx_http_agent_create_written(ngx_http_agent_store_read_t *rd, ngx_int_t rc,
    void *data)
{
    ngx_http_agent_create_t *cr = data;

    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = cr->request;
    c = r->connection;

    switch (rc) {

    case NGX_OK:
        rc = ngx_http_agent_create_answer(cr);
        break;

    case NGX_DECLINED:
        ngx_log_error(NGX_LOG_ALERT, c->log, 0,
                      "agent create: id \"%V\" is the store's already",
                      &cr->id);

        ngx_http_agent_create_forget(cr);
        rc = ngx_http_agent_create_mint(cr);
        break;

    default:
        ngx_http_agent_create_forget(cr);
        rc = ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                       "not_durable",
                                       "the conversation could not be "
                                       "written to the store");
    }

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


/* the record of an id the store did not take, as if never made */

static void
ngx_http_agent_create_forget(ngx_http_agent_create_t *cr)
{
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(cr->request, ngx_http_agent_module);
    z = amcf->zone;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &cr->id);

    /* nobody else knows the id: nothing can have used it meanwhile */

    if (conv && conv->seq == 0 && conv->lease == 0) {
        ngx_http_agent_conv_delete_locked(z, conv);
    }

    ngx_http_agent_zone_unlock(z);
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
