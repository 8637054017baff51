
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The frontend tools of a turn.  The user_msg that starts the turn may
 * carry "client_tools" ([{"name", "description", "parameters"}], as the
 * AG-UI handler checked them): the turn reads them back from the log the
 * first time it needs them and makes tools like declared "executor
 * client" ones, whose calls wait for the browser.  The provider sees the
 * agent's tools, then these, in the client's order; one whose name
 * another of the agent's tools has (an MCP server's, listed after the
 * message was taken) is left out, the agent's own winning.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_client_tools.h"


typedef struct {
    ngx_array_t                   tools;      /* ngx_http_agent_tool_t */

    /* the agent with them, made from base when its tools were these */
    ngx_http_agent_t              agent;
    ngx_http_agent_t             *base;
    u_char                       *base_tools;
} ngx_http_agent_client_turn_t;


static ngx_http_agent_client_turn_t *ngx_http_agent_client_tools_load(
    ngx_http_agent_turn_t *t);
static ngx_int_t ngx_http_agent_client_tools_read(ngx_http_agent_turn_t *t,
    ngx_str_t *event);
static ngx_int_t ngx_http_agent_client_tools_make(ngx_http_agent_turn_t *t,
    ngx_http_agent_client_turn_t *ct, yajl_val list);
static ngx_int_t ngx_http_agent_client_tools_render(ngx_http_agent_turn_t *t,
    ngx_http_agent_client_turn_t *ct, ngx_http_agent_t *base);


ngx_http_agent_t *
ngx_http_agent_client_tools_agent(ngx_http_agent_turn_t *t,
    ngx_http_agent_t *agent)
{
    ngx_http_agent_client_turn_t  *ct;

    if (agent == NULL) {
        return NULL;
    }

    ct = ngx_http_agent_client_tools_load(t);
    if (ct == NULL) {
        return NULL;
    }

    if (ct->tools.nelts == 0) {
        return agent;
    }

    if (ct->base != agent || ct->base_tools != agent->provider_tools.data) {
        if (ngx_http_agent_client_tools_render(t, ct, agent) != NGX_OK) {
            return NULL;
        }
    }

    return &ct->agent;
}


ngx_http_agent_tool_t *
ngx_http_agent_client_tools_find(ngx_http_agent_turn_t *t, ngx_str_t *name)
{
    ngx_uint_t                     i;
    ngx_http_agent_tool_t         *tools;
    ngx_http_agent_client_turn_t  *ct;

    ct = ngx_http_agent_client_tools_load(t);
    if (ct == NULL) {
        return NULL;
    }

    tools = ct->tools.elts;

    for (i = 0; i < ct->tools.nelts; i++) {
        if (tools[i].name.len == name->len
            && ngx_strncmp(tools[i].name.data, name->data, name->len) == 0)
        {
            return &tools[i];
        }
    }

    return NULL;
}


/*
 * The tools of the turn's user_msg, the last one in the zone: the zone
 * keeps the turn from its user_msg on while the turn runs.  In the
 * turn's own pool, once.
 */

static ngx_http_agent_client_turn_t *
ngx_http_agent_client_tools_load(ngx_http_agent_turn_t *t)
{
    yajl_val                       root;
    ngx_int_t                      rc;
    ngx_str_t                      event;
    ngx_http_agent_client_turn_t  *ct;

    if (t->client) {
        return t->client;
    }

    ct = ngx_pcalloc(t->request->pool, sizeof(ngx_http_agent_client_turn_t));
    if (ct == NULL) {
        return NULL;
    }

    if (ngx_array_init(&ct->tools, t->request->pool, 4,
                       sizeof(ngx_http_agent_tool_t))
        != NGX_OK)
    {
        return NULL;
    }

    rc = ngx_http_agent_client_tools_read(t, &event);

    if (rc == NGX_ERROR) {
        return NULL;
    }

    /* most messages have none: only a message that may is parsed */

    if (rc == NGX_OK
        && ngx_strnstr(event.data, "\"client_tools\":", event.len) != NULL)
    {
        root = ngx_http_agent_provider_parse_log(&t->log, event.data,
                                                 event.len);
        if (root == NULL) {
            return NULL;
        }

        rc = ngx_http_agent_client_tools_make(t, ct,
                      ngx_http_agent_provider_get(root, "client_tools"));

        ngx_http_agent_json_free(root);

        if (rc != NGX_OK) {
            return NULL;
        }
    }

    t->client = ct;

    return ct;
}


/* the turn's user_msg, NUL-terminated; NGX_DECLINED: the zone has none */

static ngx_int_t
ngx_http_agent_client_tools_read(ngx_http_agent_turn_t *t, ngx_str_t *event)
{
    ngx_queue_t             *q;
    ngx_http_agent_conv_t   *conv;
    ngx_http_agent_event_t  *ev;

    ngx_http_agent_zone_lock(t->zone);

    conv = ngx_http_agent_conv_find_locked(t->zone, &t->id);

    if (conv == NULL) {
        ngx_http_agent_zone_unlock(t->zone);
        return NGX_DECLINED;
    }

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (ev->type != NGX_HTTP_AGENT_EV_USER_MSG) {
            continue;
        }

        event->data = ngx_pnalloc(t->request->pool, ev->len + 1);
        if (event->data == NULL) {
            ngx_http_agent_zone_unlock(t->zone);
            return NGX_ERROR;
        }

        ngx_memcpy(event->data, ev->data, ev->len);
        event->data[ev->len] = '\0';
        event->len = ev->len;

        ngx_http_agent_zone_unlock(t->zone);

        return NGX_OK;
    }

    ngx_http_agent_zone_unlock(t->zone);

    return NGX_DECLINED;
}


static ngx_int_t
ngx_http_agent_client_tools_make(ngx_http_agent_turn_t *t,
    ngx_http_agent_client_turn_t *ct, yajl_val list)
{
    yajl_gen                g;
    yajl_val                v, params;
    ngx_str_t               s;
    ngx_uint_t              i;
    ngx_pool_t             *pool;
    ngx_http_agent_tool_t  *tool;

    if (!YAJL_IS_ARRAY(list)) {
        return NGX_OK;
    }

    pool = t->request->pool;

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < list->u.array.len; i++) {
        v = list->u.array.values[i];

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(v, "name"), &s)
            != NGX_OK)
        {
            continue;
        }

        tool = ngx_array_push(&ct->tools);
        if (tool == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(tool, sizeof(ngx_http_agent_tool_t));

        tool->executor = NGX_HTTP_AGENT_EXECUTOR_CLIENT;
        tool->approval = NGX_HTTP_AGENT_APPROVAL_AUTO;
        tool->timeout = NGX_CONF_UNSET_MSEC;

        tool->name.data = ngx_pstrdup(pool, &s);
        tool->name.len = s.len;

        if (tool->name.data == NULL) {
            return NGX_ERROR;
        }

        if (ngx_http_agent_provider_string(
                ngx_http_agent_provider_get(v, "description"), &s)
            == NGX_OK)
        {
            tool->description.data = ngx_pstrdup(pool, &s);
            tool->description.len = s.len;

            if (tool->description.data == NULL) {
                return NGX_ERROR;
            }
        }

        /* the schema as the client gave it; none: the empty object's */

        params = ngx_http_agent_provider_get(v, "parameters");

        if (YAJL_IS_OBJECT(params)) {
            if (ngx_http_agent_provider_text(g, params, &s) != NGX_OK) {
                return NGX_ERROR;
            }

            tool->parameters.data = ngx_pstrdup(pool, &s);
            tool->parameters.len = s.len;

            if (tool->parameters.data == NULL) {
                return NGX_ERROR;
            }
        }
    }

    return NGX_OK;
}


/*
 * The agent as the provider is to see it with the frontend tools: its
 * tools, then those of the client no tool of it shadows.
 */

static ngx_int_t
ngx_http_agent_client_tools_render(ngx_http_agent_turn_t *t,
    ngx_http_agent_client_turn_t *ct, ngx_http_agent_t *base)
{
    ngx_uint_t                  i;
    ngx_pool_t                 *pool;
    ngx_http_agent_tool_t      *tools;
    ngx_http_agent_tool_ref_t  *ref;

    pool = t->request->pool;

    ct->agent = *base;

    if (ngx_array_init(&ct->agent.tools, pool,
                       base->tools.nelts + ct->tools.nelts,
                       sizeof(ngx_http_agent_tool_ref_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ref = ngx_array_push_n(&ct->agent.tools, base->tools.nelts);
    if (ref == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ref, base->tools.elts,
               base->tools.nelts * sizeof(ngx_http_agent_tool_ref_t));

    tools = ct->tools.elts;

    for (i = 0; i < ct->tools.nelts; i++) {

        if (ngx_http_agent_tools_find(base, &tools[i].name) != NULL) {
            ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                          "agent frontend tool \"%V\" is not offered: the "
                          "agent has a tool of that name", &tools[i].name);
            continue;
        }

        ref = ngx_array_push(&ct->agent.tools);
        if (ref == NULL) {
            return NGX_ERROR;
        }

        ref->name = tools[i].name;
        ref->tool = &tools[i];
        ref->line = 0;
    }

    if (ngx_http_agent_tools_render(t->pool, pool, &ct->agent) != NGX_OK) {
        return NGX_ERROR;
    }

    ct->base = base;
    ct->base_tools = base->provider_tools.data;

    return NGX_OK;
}
