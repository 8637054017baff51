
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * Variables for log_format and the like: $agent_conversation and
 * $agent_owner as the request's location evaluates them, $agent_turn and
 * $agent_state as the zone holds the conversation when the variable is
 * read (in the access log: once the request is done).  A request outside
 * an agent's location, or for a conversation the zone does not hold,
 * has them not found (an empty value, "-" in a log).  $agent_tokens is
 * the tokens (input and output) the provider reported for the turn the
 * request started, so far, while the zone holds that turn.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_variables.h"
#include "ngx_http_agent_turn_metrics.h"


#define NGX_HTTP_AGENT_VAR_TURN   0
#define NGX_HTTP_AGENT_VAR_STATE  1


static ngx_int_t ngx_http_agent_variable_conversation(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_agent_variable_owner(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_http_agent_zone_t *ngx_http_agent_variable_zone(
    ngx_http_request_t *r, ngx_str_t *id);
static ngx_int_t ngx_http_agent_variable_conv(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_agent_variable_tokens(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_agent_variable_turn_tokens(
    ngx_http_agent_conv_t *conv, ngx_uint_t turn, uint64_t *tokens);
static uint64_t ngx_http_agent_variable_number(u_char *p, u_char *last);
static u_char *ngx_http_agent_variable_usage(ngx_http_agent_event_t *e);
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

    { ngx_string("agent_tokens"), NULL,
      ngx_http_agent_variable_tokens, 0,
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


/* the zone and the request's conversation id, or NULL: none */

static ngx_http_agent_zone_t *
ngx_http_agent_variable_zone(ngx_http_request_t *r, ngx_str_t *id)
{
    ngx_http_agent_loc_conf_t   *alcf;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (amcf->zone == NULL || alcf->conversation == NULL
        || ngx_http_agent_api_conversation_id(r, id) != NGX_OK)
    {
        return NULL;
    }

    return amcf->zone;
}


static ngx_int_t
ngx_http_agent_variable_conv(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                  *p;
    ngx_str_t                id, *state;
    ngx_uint_t               turn, found;
    ngx_http_agent_zone_t   *z;
    ngx_http_agent_conv_t   *conv;

    z = ngx_http_agent_variable_zone(r, &id);

    if (z == NULL) {
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


static ngx_int_t
ngx_http_agent_variable_tokens(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                      *p;
    uint64_t                     tokens;
    ngx_int_t                    rc;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_turn_mark_t  *mark;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;
    mark = ngx_http_agent_turn_started(r);

    if (z == NULL || mark == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    rc = NGX_DECLINED;
    tokens = 0;

    ngx_http_agent_zone_lock(z);

    conv = ngx_http_agent_conv_find_locked(z, &mark->id);

    if (conv) {
        rc = ngx_http_agent_variable_turn_tokens(conv, mark->turn, &tokens);
    }

    ngx_http_agent_zone_unlock(z);

    if (rc != NGX_OK) {
        v->not_found = 1;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_INT64_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    ngx_http_agent_variable_set(v, p, ngx_sprintf(p, "%uL", tokens) - p);

    return NGX_OK;
}


/*
 * The usage of the turn's assistant messages, read back from the log's
 * end to the turn's start; NGX_DECLINED: the zone holds the turn no more
 */

static ngx_int_t
ngx_http_agent_variable_turn_tokens(ngx_http_agent_conv_t *conv,
    ngx_uint_t turn, uint64_t *tokens)
{
    u_char                  *p;
    uint64_t                 n;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *e;

    if (turn > conv->turn) {
        return NGX_DECLINED;
    }

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        /* {"type":"...","seq":N,"turn":T,...: T in its first bytes */

        p = (u_char *) ngx_strnstr(e->data, ",\"turn\":", ngx_min(e->len, 64));

        if (p == NULL) {
            continue;
        }

        n = ngx_http_agent_variable_number(p + 8, e->data + e->len);

        if (n < turn) {
            return NGX_OK;
        }

        if (n > turn) {
            continue;
        }

        if (e->type == NGX_HTTP_AGENT_EV_USER_MSG) {
            return NGX_OK;
        }

        if (e->type != NGX_HTTP_AGENT_EV_ASSISTANT_MSG) {
            continue;
        }

        p = ngx_http_agent_variable_usage(e);

        if (p == NULL) {
            continue;
        }

        *tokens += ngx_http_agent_variable_number(p, e->data + e->len);

        p = (u_char *) ngx_strnstr(p, ",\"output_tokens\":",
                                   e->data + e->len - p);

        if (p) {
            *tokens += ngx_http_agent_variable_number(p + 17,
                                                      e->data + e->len);
        }
    }

    /* the log holds the turn from its start, or the store has the rest */
    return (conv->base == 0) ? NGX_OK : NGX_DECLINED;
}


static uint64_t
ngx_http_agent_variable_number(u_char *p, u_char *last)
{
    uint64_t  n;

    for (n = 0; p < last && *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (*p - '0');
    }

    return n;
}


/*
 * The input_tokens of an assistant_msg: its usage is the last object of
 * the event, after anything a provider sent
 */

static u_char *
ngx_http_agent_variable_usage(ngx_http_agent_event_t *e)
{
    u_char  *p;
    size_t   len;

    static u_char  usage[] = "\"usage\":{\"input_tokens\":";

    len = sizeof(usage) - 1;

    if (e->len < len) {
        return NULL;
    }

    for (p = e->data + e->len - len; p >= e->data; p--) {
        if (ngx_strncmp(p, usage, len) == 0) {
            return p + len;
        }
    }

    return NULL;
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
