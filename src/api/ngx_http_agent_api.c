
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * What every endpoint does first: the method, the ids of the request,
 * and the conversation it acts on, found in the zone, revived from the
 * store, or answered 404.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"


static ngx_int_t ngx_http_agent_api_id(ngx_http_request_t *r,
    ngx_http_complex_value_t *cv, ngx_str_t *id);
static ngx_int_t ngx_http_agent_api_identity(ngx_http_request_t *r,
    ngx_http_complex_value_t *cv, ngx_str_t **value);


ngx_http_complex_value_t  ngx_http_agent_api_off;


ngx_int_t
ngx_http_agent_api_conversation_id(ngx_http_request_t *r, ngx_str_t *id)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    return ngx_http_agent_api_id(r, alcf->conversation, id);
}


/*
 * What every endpoint checks first: the method, and the conversation id.
 * NGX_OK: go on with id; NGX_DONE: an error answer is sent and *rc is
 * what the handler returns.
 */

ngx_int_t
ngx_http_agent_api_request(ngx_http_request_t *r, ngx_uint_t methods,
    char *allow, ngx_str_t *id, ngx_int_t *rc)
{
    ngx_str_t  *owner;

    if (!(r->method & methods)) {
        *rc = ngx_http_agent_json_method(r, allow);
        return NGX_DONE;
    }

    switch (ngx_http_agent_api_owner(r, &owner)) {

    case NGX_OK:
        break;

    case NGX_DECLINED:
        *rc = ngx_http_agent_api_anonymous(r);
        return NGX_DONE;

    default:
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }

    switch (ngx_http_agent_api_conversation_id(r, id)) {

    case NGX_OK:
        /* a node whose lease lapsed drops its zone first (agent_node) */
        (void) ngx_http_agent_revive_lease();
        return NGX_OK;

    case NGX_DECLINED:
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                        "invalid_conversation",
                                        "the conversation id is missing or "
                                        "invalid");
        return NGX_DONE;

    default:
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }
}


/* the name of the agent the location serves */

ngx_str_t *
ngx_http_agent_api_agent(ngx_http_request_t *r)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    return &alcf->agent->name;
}


/* who the request acts for (agent_owner) */

ngx_int_t
ngx_http_agent_api_owner(ngx_http_request_t *r, ngx_str_t **owner)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    return ngx_http_agent_api_identity(r, alcf->owner, owner);
}


/* who approves, or answers, a waiting call (agent_approver) */

ngx_int_t
ngx_http_agent_api_approver(ngx_http_request_t *r, ngx_str_t **approver)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    return ngx_http_agent_api_identity(r, alcf->approver, approver);
}


/*
 * An identity the log records: NGX_OK, with *value NULL where the
 * location does not ask; NGX_DECLINED where it asks and the value is
 * empty, too long to be recorded whole, not UTF-8, or holds a control
 * character (an approver goes into a tool's request header).
 */

static ngx_int_t
ngx_http_agent_api_identity(ngx_http_request_t *r,
    ngx_http_complex_value_t *cv, ngx_str_t **value)
{
    ngx_str_t   *v;
    ngx_uint_t   i;

    *value = NULL;

    if (cv == NULL || cv == &ngx_http_agent_api_off) {
        return NGX_OK;
    }

    v = ngx_palloc(r->pool, sizeof(ngx_str_t));
    if (v == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_complex_value(r, cv, v) != NGX_OK) {
        return NGX_ERROR;
    }

    if (v->len == 0 || v->len > NGX_HTTP_AGENT_OWNER_LEN
        || ngx_http_agent_json_utf8(v) != NGX_OK)
    {
        return NGX_DECLINED;
    }

    for (i = 0; i < v->len; i++) {
        if (v->data[i] < 0x20 || v->data[i] == 0x7f) {
            return NGX_DECLINED;
        }
    }

    *value = v;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_api_anonymous(ngx_http_request_t *r)
{
    return ngx_http_agent_json_error(r, NGX_HTTP_UNAUTHORIZED,
                                     "unauthorized",
                                     "the request has no owner or "
                                     "approver");
}


/*
 * A conversation of another agent is answered as an unknown one: the
 * location says nothing of a conversation that belongs elsewhere, and
 * changes nothing.
 */

ngx_int_t
ngx_http_agent_api_foreign(ngx_http_request_t *r)
{
    return ngx_http_agent_json_error(r, NGX_HTTP_NOT_FOUND, "not_found",
                                     "no such conversation");
}


ngx_int_t
ngx_http_agent_api_tool_call_id(ngx_http_request_t *r, ngx_str_t *id)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    return ngx_http_agent_api_id(r, alcf->tool_call, id);
}


/*
 * An id is 1 to 64 bytes of letters, digits, "-", "_", "." and ":", not
 * only dots, so that it is safe in a path ("." and ".." name directories),
 * a header, a log line and a key.
 */

static ngx_int_t
ngx_http_agent_api_id(ngx_http_request_t *r, ngx_http_complex_value_t *cv,
    ngx_str_t *id)
{
    if (ngx_http_complex_value(r, cv, id) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_agent_api_id_check(id);
}


ngx_int_t
ngx_http_agent_api_id_check(ngx_str_t *id)
{
    u_char      c;
    ngx_uint_t  i, dots;

    if (id->len == 0 || id->len > 64) {
        return NGX_DECLINED;
    }

    dots = 0;

    for (i = 0; i < id->len; i++) {
        c = id->data[i];

        if (c == '.') {
            dots++;
            continue;
        }

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9')
            || c == '-' || c == '_' || c == ':')
        {
            continue;
        }

        return NGX_DECLINED;
    }

    if (dots == id->len) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/*
 * The conversation an endpoint acts on, with the zone locked.  One that
 * the zone does not hold is revived from the store, or answered 404; one
 * of another agent or owner is answered as an unknown one.  Then NULL is
 * returned, the zone unlocked, and *rc is what the handler returns.
 */

ngx_http_agent_conv_t *
ngx_http_agent_api_conv_lock(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_str_t *id, ngx_int_t *rc)
{
    ngx_str_t              *owner;
    ngx_http_agent_conv_t  *conv;

    if (ngx_http_agent_api_owner(r, &owner) != NGX_OK) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NULL;
    }

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(z);
        *rc = ngx_http_agent_revive_not_found(r, id);
        return NULL;
    }

    if (ngx_http_agent_conv_bound_locked(conv, ngx_http_agent_api_agent(r),
                                         owner)
        != NGX_OK)
    {
        ngx_http_agent_zone_unlock(z);
        *rc = ngx_http_agent_api_foreign(r);
        return NULL;
    }

    return conv;
}


/*
 * A new conversation's record, under the lock.  NULL: the zone has no
 * room; it is unlocked and the 503 answered, *rc set.
 */

ngx_http_agent_conv_t *
ngx_http_agent_api_conv_create_locked(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_str_t *id, ngx_int_t *rc)
{
    ngx_http_agent_conv_t  *conv;

    conv = ngx_http_agent_conv_create_locked(z, id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(z);
        *rc = ngx_http_agent_json_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                        "zone_full",
                                        "no room for the conversation");
    }

    return conv;
}


/* the directive that makes a location an API endpoint with handler */

char *
ngx_http_agent_api_set(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_agent_loc_conf_t *alcf, ngx_http_handler_pt handler)
{
    ngx_http_core_loc_conf_t  *clcf;

    if (alcf->api || alcf->describe) {
        return "is duplicate";
    }

    alcf->api = handler;
    alcf->api_name = cmd->name;
    alcf->api_file = cf->conf_file->file.name.data;
    alcf->api_line = cf->conf_file->line;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = handler;

    return NGX_CONF_OK;
}


/*
 * The owner of a request to an endpoint that needs one where agent_owner
 * is set.  NGX_OK: go on; NGX_DONE: *rc is what the handler returns (the
 * 401 is answered).
 */

ngx_int_t
ngx_http_agent_api_owner_check(ngx_http_request_t *r, ngx_str_t **owner,
    ngx_int_t *rc)
{
    switch (ngx_http_agent_api_owner(r, owner)) {

    case NGX_OK:
        return NGX_OK;

    case NGX_DECLINED:
        *rc = ngx_http_agent_api_anonymous(r);
        return NGX_DONE;

    default:
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }
}
