
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * Variables for log_format and the like: $agent_conversation and
 * $agent_owner as the request's location evaluates them, $agent_turn and
 * $agent_state as the zone holds the conversation when the variable is
 * read (in the access log: once the request is done).  A request outside
 * an agent's location, or for a conversation the zone does not hold,
 * has them not found (an empty value, "-" in a log).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_variables.h"


#define NGX_HTTP_AGENT_VAR_TURN   0
#define NGX_HTTP_AGENT_VAR_STATE  1


static ngx_int_t ngx_http_agent_variable_conversation(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_agent_variable_owner(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_agent_variable_conv(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static void ngx_http_agent_variable_set(ngx_http_variable_value_t *v,
    u_char *data, size_t len);


static ngx_http_variable_t  ngx_http_agent_variables[] = {

    { ngx_string("agent_conversation"), NULL,
      ngx_http_agent_variable_conversation, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("agent_owner"), NULL,
      ngx_http_agent_variable_owner, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("agent_turn"), NULL,
      ngx_http_agent_variable_conv, NGX_HTTP_AGENT_VAR_TURN,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("agent_state"), NULL,
      ngx_http_agent_variable_conv, NGX_HTTP_AGENT_VAR_STATE,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    ngx_http_null_variable
};


ngx_int_t
ngx_http_agent_variables_add(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_agent_variables; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_variable_conversation(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t                   id;
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (alcf->conversation == NULL
        || ngx_http_agent_api_conversation_id(r, &id) != NGX_OK)
    {
        v->not_found = 1;
        return NGX_OK;
    }

    ngx_http_agent_variable_set(v, id.data, id.len);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_variable_owner(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_str_t  *owner;

    if (ngx_http_agent_api_owner(r, &owner) != NGX_OK || owner == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    ngx_http_agent_variable_set(v, owner->data, owner->len);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_variable_conv(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                      *p;
    ngx_str_t                    id, *state;
    ngx_uint_t                   turn, found;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    if (z == NULL || alcf->conversation == NULL
        || ngx_http_agent_api_conversation_id(r, &id) != NGX_OK)
    {
        v->not_found = 1;
        return NGX_OK;
    }

    turn = 0;
    state = NULL;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &id);
    found = (conv != NULL);

    if (found) {
        turn = conv->turn;
        state = &ngx_http_agent_state_names[conv->state];
    }

    ngx_http_agent_zone_unlock(z);

    if (!found) {
        v->not_found = 1;
        return NGX_OK;
    }

    if (data == NGX_HTTP_AGENT_VAR_STATE) {
        ngx_http_agent_variable_set(v, state->data, state->len);
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_http_agent_variable_set(v, p, ngx_sprintf(p, "%ui", turn) - p);

    return NGX_OK;
}


static void
ngx_http_agent_variable_set(ngx_http_variable_value_t *v, u_char *data,
    size_t len)
{
    v->data = data;
    v->len = len;
    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;
}
