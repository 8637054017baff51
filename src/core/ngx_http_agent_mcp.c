
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * MCP servers in the zone: one record per server, found by its name, with
 * the session any worker continues and the tool list every worker uses.
 * Records are few (one per agent_mcp) and stay for the zone's life.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_mcp.h"


ngx_http_agent_mcp_sh_t *
ngx_http_agent_mcp_find_locked(ngx_http_agent_zone_t *z, ngx_str_t *name,
    ngx_uint_t create)
{
    ngx_http_agent_mcp_sh_t  *m;

    for (m = z->sh->mcp; m; m = m->next) {
        if (m->name_len == name->len
            && ngx_strncmp(m->name, name->data, name->len) == 0)
        {
            return m;
        }
    }

    if (!create || name->len > NGX_HTTP_AGENT_TOOL_NAME_LEN) {
        return NULL;
    }

    m = ngx_http_agent_zone_alloc_locked(z, NULL,
                                         sizeof(ngx_http_agent_mcp_sh_t));
    if (m == NULL) {
        return NULL;
    }

    ngx_memzero(m, sizeof(ngx_http_agent_mcp_sh_t));

    ngx_memcpy(m->name, name->data, name->len);
    m->name_len = name->len;

    m->next = z->sh->mcp;
    z->sh->mcp = m;

    return m;
}


/* a new session (empty: none, the next request initializes one) */

void
ngx_http_agent_mcp_session_locked(ngx_http_agent_mcp_sh_t *m,
    ngx_str_t *session, ngx_str_t *version)
{
    m->session_len = ngx_min(session->len, NGX_HTTP_AGENT_MCP_SESSION_MAX);
    ngx_memcpy(m->session, session->data, m->session_len);

    if (version) {
        m->version_len = ngx_min(version->len,
                                 NGX_HTTP_AGENT_MCP_VERSION_MAX);
        ngx_memcpy(m->version, version->data, m->version_len);
    }
}


ngx_int_t
ngx_http_agent_mcp_tools_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_mcp_sh_t *m, ngx_str_t *tools, uint64_t now)
{
    u_char  *p;

    p = ngx_http_agent_zone_try_alloc_locked(z, NULL, tools->len);
    if (p == NULL) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "agent_zone \"%V\" is full: the tool list of MCP "
                      "server \"%*s\" is not kept",
                      &z->shm_zone->shm.name, m->name_len, m->name);
        return NGX_ERROR;
    }

    if (m->tools) {
        ngx_slab_free_locked(z->shpool, m->tools);
    }

    ngx_memcpy(p, tools->data, tools->len);

    m->tools = p;
    m->tools_len = tools->len;
    m->gen++;
    m->fetched = now;
    m->retry = 0;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_mcp_session_valid(ngx_str_t *session)
{
    size_t  i;

    if (session->len == 0 || session->len > NGX_HTTP_AGENT_MCP_SESSION_MAX) {
        return NGX_DECLINED;
    }

    for (i = 0; i < session->len; i++) {
        if (session->data[i] < 0x21 || session->data[i] > 0x7e) {
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


/* the value of a response header of the server (the session id) */

ngx_str_t *
ngx_http_agent_mcp_header(ngx_list_t *headers, ngx_str_t *name)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &headers->part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash != 0 && h[i].key.len == name->len
            && ngx_strncasecmp(h[i].key.data, name->data, name->len) == 0)
        {
            return &h[i].value;
        }
    }
}


uint64_t
ngx_http_agent_mcp_now(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec;
}
