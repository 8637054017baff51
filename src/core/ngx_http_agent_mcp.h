
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_MCP_H_INCLUDED_
#define _NGX_HTTP_AGENT_MCP_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"


/* the protocol revision asked for, and those taken from a server */
#define NGX_HTTP_AGENT_MCP_VERSION       "2025-06-18"
#define NGX_HTTP_AGENT_MCP_SESSION_MAX   255
#define NGX_HTTP_AGENT_MCP_VERSION_MAX   31

/* the largest tool list kept, and a server's answer read */
#define NGX_HTTP_AGENT_MCP_LIST_MAX      (1024 * 1024)

/* the tools taken of one server's list; more are left out */
#define NGX_HTTP_AGENT_MCP_TOOLS_MAX     128


/* an MCP server as "agent_mcp" declares it */

typedef struct {
    ngx_str_t                     name;
    ngx_str_t                     location;

    /* tools the agent may use (ngx_str_t); NULL: all the server lists */
    ngx_array_t                  *tools;

    /* tools whose calls wait for approval (ngx_str_t); or all of them */
    ngx_array_t                  *approval;
    ngx_flag_t                    approval_all;

    /* a suspended call's deadline; NGX_CONF_UNSET_MSEC: the agent's */
    ngx_msec_t                    timeout;

    /* how long a tool list is used before it is fetched again */
    ngx_msec_t                    refresh;

    /*
     * the whole time of one exchange with the server (a request, with
     * the session's initialization and every page of a list), keep-alive
     * comments or not; a person's answer to its question does not count
     */
    ngx_msec_t                    rpc_timeout;

    u_char                       *file;
    ngx_uint_t                    line;
} ngx_http_agent_mcp_t;


/*
 * What every worker shares of a server, in the zone: its session, the
 * revision it speaks and its tool list (a JSON array of the tools as it
 * listed them, each re-encoded value for value).  gen changes with
 * every new list.
 */

typedef struct ngx_http_agent_mcp_sh_s  ngx_http_agent_mcp_sh_t;

struct ngx_http_agent_mcp_sh_s {
    ngx_http_agent_mcp_sh_t      *next;

    u_char                        name[NGX_HTTP_AGENT_TOOL_NAME_LEN];
    size_t                        name_len;

    u_char                        session[NGX_HTTP_AGENT_MCP_SESSION_MAX];
    size_t                        session_len;
    u_char                        version[NGX_HTTP_AGENT_MCP_VERSION_MAX];
    size_t                        version_len;

    u_char                       *tools;
    size_t                        tools_len;
    ngx_uint_t                    gen;

    /* when the list was fetched, and when it may be tried again, ms */
    uint64_t                      fetched;
    uint64_t                      retry;
};


/* all of these run with the zone locked */

ngx_http_agent_mcp_sh_t *ngx_http_agent_mcp_find_locked(
    ngx_http_agent_zone_t *z, ngx_str_t *name, ngx_uint_t create);
void ngx_http_agent_mcp_session_locked(ngx_http_agent_mcp_sh_t *m,
    ngx_str_t *session, ngx_str_t *version);
ngx_int_t ngx_http_agent_mcp_tools_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_mcp_sh_t *m, ngx_str_t *tools, uint64_t now);

/* a session id may go into a header: visible ASCII only */
ngx_int_t ngx_http_agent_mcp_session_valid(ngx_str_t *session);

ngx_str_t *ngx_http_agent_mcp_header(ngx_list_t *headers, ngx_str_t *name);
uint64_t ngx_http_agent_mcp_now(void);


#endif /* _NGX_HTTP_AGENT_MCP_H_INCLUDED_ */
