
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The tools of an agent's MCP servers.  Before a model call, a server
 * whose list in the zone is missing or older than its refresh time is
 * asked again (tools/list, page by page) and the zone keeps the new list
 * for every worker; a list that cannot be fetched is tried again 30
 * seconds later, and the old one, if any, serves meanwhile.  From the
 * lists, a turn makes tools like declared ones (executor server, the
 * server's location) and the agent's tool list for the provider; a name
 * that two of the agent's tools share is prefixed with its server's name.
 * A list keeps the first of the tools a server lists under one name, and
 * at most NGX_HTTP_AGENT_MCP_TOOLS_MAX tools: what it leaves out is
 * warned of once, as the list is fetched.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_tools.h"
#include "ngx_http_agent_mcp_rpc.h"


#define NGX_HTTP_AGENT_MCP_RETRY   30000
#define NGX_HTTP_AGENT_MCP_PAGES   100


typedef struct {
    ngx_uint_t                   *gens;
    ngx_array_t                   tools;      /* ngx_http_agent_tool_t * */
    ngx_http_agent_t              agent;
    unsigned                      loaded:1;

    /* discovery */
    ngx_uint_t                    server;
    ngx_uint_t                    pages;
    ngx_uint_t                    listed;
    yajl_gen                      list;
    ngx_http_agent_mcp_rpc_t     *rpc;

    /* the names listed so far (ngx_str_node_t, data: warned of) */
    ngx_rbtree_t                  names;
    ngx_rbtree_node_t             sentinel;
    unsigned                      capped:1;

    /* where the turn goes on once a list is in */
    ngx_event_handler_pt          then;
} ngx_http_agent_mcp_turn_t;


static ngx_int_t ngx_http_agent_mcp_list_fetch(ngx_http_agent_turn_t *t,
    ngx_uint_t i);
static void ngx_http_agent_mcp_list_page(ngx_http_agent_mcp_rpc_t *rpc);
static ngx_int_t ngx_http_agent_mcp_list_keep(ngx_http_agent_turn_t *t,
    ngx_http_agent_mcp_t *server, yajl_val v);
static ngx_int_t ngx_http_agent_mcp_list_name(ngx_http_agent_mcp_t *server,
    yajl_val v, ngx_str_t *name);
static void ngx_http_agent_mcp_list_unique(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_array_t *tools);
static ngx_int_t ngx_http_agent_mcp_list_load(ngx_http_agent_turn_t *t);
static ngx_int_t ngx_http_agent_mcp_list_make(ngx_pool_t *pool,
    ngx_http_agent_t *agent, ngx_str_t *lists, ngx_array_t *tools);
static ngx_int_t ngx_http_agent_mcp_list_add(ngx_pool_t *pool,
    ngx_http_agent_mcp_t *server, yajl_val v, ngx_array_t *tools);
static ngx_uint_t ngx_http_agent_mcp_list_describe_tool(yajl_gen g,
    ngx_http_agent_tool_t *tool);
static ngx_int_t ngx_http_agent_mcp_list_copy(ngx_pool_t *pool,
    ngx_http_agent_zone_t *z, ngx_http_agent_t *agent, ngx_str_t *lists,
    ngx_uint_t *gens);


static ngx_http_agent_mcp_turn_t *
ngx_http_agent_mcp_list_turn(ngx_http_agent_turn_t *t)
{
    ngx_http_agent_mcp_turn_t  *tm;

    if (t->mcp) {
        return t->mcp;
    }

    tm = ngx_pcalloc(t->request->pool, sizeof(ngx_http_agent_mcp_turn_t));
    if (tm == NULL) {
        return NULL;
    }

    tm->gens = ngx_pcalloc(t->request->pool,
                           t->agent->mcp->nelts * sizeof(ngx_uint_t));
    if (tm->gens == NULL) {
        return NULL;
    }

    t->mcp = tm;

    return tm;
}


/*
 * NGX_OK: every list is fresh, or being fetched elsewhere, or failed
 * lately; NGX_AGAIN: a list is fetched, and then (the model call, or a
 * resumed turn reading its batch) is posted again when it is in.
 */

ngx_int_t
ngx_http_agent_mcp_list_discover(ngx_http_agent_turn_t *t,
    ngx_event_handler_pt then)
{
    uint64_t                   now;
    ngx_uint_t                 i, fetch;
    ngx_http_agent_mcp_t     **servers;
    ngx_http_agent_mcp_sh_t   *m;

    if (t->agent->mcp == NULL) {
        return NGX_OK;
    }

    if (ngx_http_agent_mcp_list_turn(t) == NULL) {
        return NGX_ERROR;
    }

    ((ngx_http_agent_mcp_turn_t *) t->mcp)->then = then;

    servers = t->agent->mcp->elts;
    now = ngx_http_agent_mcp_now();

    for (i = 0; i < t->agent->mcp->nelts; i++) {

        ngx_http_agent_zone_lock(t->zone);

        m = ngx_http_agent_mcp_find_locked(t->zone, &servers[i]->name, 1);

        fetch = (m != NULL
                 && (m->tools == NULL
                     || now >= m->fetched + servers[i]->refresh)
                 && now >= m->retry);

        if (fetch) {
            /* one fetch at a time, in all workers */
            m->retry = now + NGX_HTTP_AGENT_MCP_RETRY;
        }

        ngx_http_agent_zone_unlock(t->zone);

        if (fetch && ngx_http_agent_mcp_list_fetch(t, i) == NGX_OK) {
            return NGX_AGAIN;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_mcp_list_fetch(ngx_http_agent_turn_t *t, ngx_uint_t i)
{
    ngx_http_agent_mcp_t       **servers;
    ngx_http_agent_mcp_rpc_t    *rpc;
    ngx_http_agent_mcp_turn_t   *tm;

    tm = t->mcp;
    servers = t->agent->mcp->elts;

    rpc = ngx_palloc(t->pool, sizeof(ngx_http_agent_mcp_rpc_t));
    if (rpc == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_mcp_rpc_init(rpc, t, servers[i], t->pool) != NGX_OK) {
        return NGX_ERROR;
    }

    tm->list = ngx_http_agent_json_gen(t->pool);
    if (tm->list == NULL || yajl_gen_array_open(tm->list) != yajl_gen_status_ok)
    {
        return NGX_ERROR;
    }

    tm->server = i;
    tm->pages = 0;
    tm->listed = 0;
    tm->rpc = rpc;
    tm->capped = 0;

    ngx_rbtree_init(&tm->names, &tm->sentinel, ngx_str_rbtree_insert_value);

    ngx_str_set(&rpc->method, "tools/list");
    ngx_str_set(&rpc->id, "\"tools-list\"");
    ngx_str_set(&rpc->key, "tools-list");
    rpc->done = ngx_http_agent_mcp_list_page;
    rpc->data = t;

    return ngx_http_agent_mcp_rpc_start(rpc);
}


/* a page of tools/list: its tools are kept, the next page asked for */

static void
ngx_http_agent_mcp_list_page(ngx_http_agent_mcp_rpc_t *rpc)
{
    size_t                      i;
    yajl_gen                    g;
    yajl_val                    result, tools, cursor;
    ngx_str_t                   list, c;
    ngx_uint_t                  failed;
    ngx_http_agent_turn_t      *t;
    ngx_http_agent_mcp_sh_t    *m;
    ngx_http_agent_mcp_turn_t  *tm;

    t = rpc->data;
    tm = t->mcp;

    result = rpc->answer ? ngx_http_agent_provider_get(rpc->answer, "result")
                         : NULL;
    tools = result ? ngx_http_agent_provider_get(result, "tools") : NULL;

    if (rpc->failure || !YAJL_IS_ARRAY(tools)) {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent mcp \"%V\": tools/list failed: %s",
                      &rpc->server->name,
                      rpc->failure ? rpc->failure : "no tools in its answer");
        goto next;
    }

    failed = 0;

    for (i = 0; i < tools->u.array.len; i++) {
        switch (ngx_http_agent_mcp_list_keep(t, rpc->server,
                                             tools->u.array.values[i]))
        {
        case NGX_OK:
            failed |= ngx_http_agent_provider_value(tm->list,
                                                    tools->u.array.values[i]);
            tm->listed++;
            break;

        case NGX_DECLINED:
            break;

        default:
            failed = 1;
        }
    }

    cursor = ngx_http_agent_provider_get(result, "nextCursor");

    if (failed == 0 && YAJL_IS_STRING(cursor)
        && ++tm->pages < NGX_HTTP_AGENT_MCP_PAGES)
    {
        g = ngx_http_agent_json_gen(t->pool);
        if (g == NULL) {
            goto next;
        }

        c.data = (u_char *) cursor->u.string;
        c.len = ngx_strlen(c.data);

        failed = yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "cursor");
        failed |= ngx_http_agent_json_str(g, &c);
        failed |= yajl_gen_map_close(g);

        if (ngx_http_agent_json_result(g, failed, &rpc->params) != NGX_OK
            || ngx_http_agent_mcp_rpc_start(rpc) != NGX_OK)
        {
            goto next;
        }

        return;
    }

    failed |= yajl_gen_array_close(tm->list);

    if (ngx_http_agent_json_result(tm->list, failed, &list) != NGX_OK
        || list.len > NGX_HTTP_AGENT_MCP_LIST_MAX)
    {
        ngx_log_error(NGX_LOG_ERR, &t->log, 0,
                      "agent mcp \"%V\": its tool list is too large",
                      &rpc->server->name);
        goto next;
    }

    ngx_http_agent_zone_lock(t->zone);

    m = ngx_http_agent_mcp_find_locked(t->zone, &rpc->server->name, 0);

    if (m) {
        (void) ngx_http_agent_mcp_tools_locked(t->zone, m, &list,
                                               ngx_http_agent_mcp_now());
    }

    ngx_http_agent_zone_unlock(t->zone);

    ngx_log_error(NGX_LOG_INFO, &t->log, 0,
                  "agent mcp \"%V\": %ui tools listed",
                  &rpc->server->name, tm->listed);

next:

    /* the step that asked, from its start: other lists may be due too */

    ngx_http_agent_turn_post(t, tm->then);
}


/*
 * Whether the list keeps a tool the server listed: one whose name a
 * model can be given, the first of its name, within the most a list
 * keeps.  What is left out is warned of once in the fetch.
 */

static ngx_int_t
ngx_http_agent_mcp_list_keep(ngx_http_agent_turn_t *t,
    ngx_http_agent_mcp_t *server, yajl_val v)
{
    uint32_t                    hash;
    ngx_str_t                   name;
    ngx_str_node_t             *node;
    ngx_http_agent_mcp_turn_t  *tm;

    tm = t->mcp;

    if (ngx_http_agent_mcp_list_name(server, v, &name) != NGX_OK) {
        if (name.len) {
            ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                          "agent mcp \"%V\": tool \"%V\" is left out: its "
                          "name is not 1 to %d letters, digits, \"_\" or "
                          "\"-\" with the server's name", &server->name,
                          &name, NGX_HTTP_AGENT_NAME_MAX);
        }

        return NGX_DECLINED;
    }

    hash = ngx_crc32_long(name.data, name.len);

    node = ngx_str_rbtree_lookup(&tm->names, &name, hash);

    if (node) {
        if (node->node.data == 0) {
            node->node.data = 1;

            ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                          "agent mcp \"%V\" lists tool \"%V\" more than "
                          "once: the first is kept", &server->name, &name);
        }

        return NGX_DECLINED;
    }

    if (tm->listed == NGX_HTTP_AGENT_MCP_TOOLS_MAX) {
        if (!tm->capped) {
            tm->capped = 1;

            ngx_log_error(NGX_LOG_WARN, &t->log, 0,
                          "agent mcp \"%V\" lists more than %d tools: "
                          "\"%V\" and those after it are left out",
                          &server->name, NGX_HTTP_AGENT_MCP_TOOLS_MAX,
                          &name);
        }

        return NGX_DECLINED;
    }

    node = ngx_palloc(t->pool, sizeof(ngx_str_node_t));
    if (node == NULL) {
        return NGX_ERROR;
    }

    node->str.data = ngx_pstrdup(t->pool, &name);
    if (node->str.data == NULL) {
        return NGX_ERROR;
    }

    node->str.len = name.len;
    node->node.key = hash;
    node->node.data = 0;

    ngx_rbtree_insert(&tm->names, &node->node);

    return NGX_OK;
}


/*
 * A tool's name, if a model can be given it with the server's name
 * before it; name->len is 0 for a tool without a string name
 */

static ngx_int_t
ngx_http_agent_mcp_list_name(ngx_http_agent_mcp_t *server, yajl_val v,
    ngx_str_t *name)
{
    yajl_val  n;

    n = ngx_http_agent_provider_get(v, "name");

    if (!YAJL_IS_STRING(n)) {
        name->len = 0;
        return NGX_DECLINED;
    }

    name->data = (u_char *) n->u.string;
    name->len = ngx_strlen(n->u.string);

    if (ngx_http_agent_conf_name(name) != NGX_OK
        || name->len + server->name.len + 1 > NGX_HTTP_AGENT_NAME_MAX)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* the agent with its MCP servers' tools, for the provider's request */

ngx_http_agent_t *
ngx_http_agent_mcp_list_agent(ngx_http_agent_turn_t *t)
{
    ngx_http_agent_mcp_turn_t  *tm;

    if (t->agent->mcp == NULL) {
        return t->agent;
    }

    if (ngx_http_agent_mcp_list_load(t) != NGX_OK) {
        return NULL;
    }

    tm = t->mcp;

    return tm->loaded ? &tm->agent : t->agent;
}


ngx_http_agent_tool_t *
ngx_http_agent_mcp_list_tool(ngx_http_agent_turn_t *t, ngx_str_t *name)
{
    ngx_uint_t                   i;
    ngx_http_agent_tool_t      **tools;
    ngx_http_agent_mcp_turn_t   *tm;

    if (t->agent->mcp == NULL || ngx_http_agent_mcp_list_load(t) != NGX_OK) {
        return NULL;
    }

    tm = t->mcp;
    tools = tm->tools.elts;

    for (i = 0; tm->loaded && i < tm->tools.nelts; i++) {
        if (tools[i]->name.len == name->len
            && ngx_strncmp(tools[i]->name.data, name->data, name->len) == 0)
        {
            return tools[i];
        }
    }

    return NULL;
}


/*
 * The lists in the zone, made into tools when one changed since the turn
 * last looked: in the turn's own pool, which a list that changes every
 * refresh grows by little over a turn's life.
 */

static ngx_int_t
ngx_http_agent_mcp_list_load(ngx_http_agent_turn_t *t)
{
    ngx_str_t                   *lists;
    ngx_uint_t                   i, n, *gens;
    ngx_pool_t                  *pool;
    ngx_http_agent_tool_t      **tools;
    ngx_http_agent_tool_ref_t   *ref;
    ngx_http_agent_mcp_turn_t   *tm;

    tm = ngx_http_agent_mcp_list_turn(t);
    if (tm == NULL) {
        return NGX_ERROR;
    }

    pool = t->request->pool;
    n = t->agent->mcp->nelts;

    lists = ngx_pcalloc(t->pool, n * (sizeof(ngx_str_t) + sizeof(ngx_uint_t)));
    if (lists == NULL) {
        return NGX_ERROR;
    }

    gens = (ngx_uint_t *) &lists[n];

    if (ngx_http_agent_mcp_list_copy(t->pool, t->zone, t->agent, lists, gens)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (tm->loaded && ngx_memcmp(gens, tm->gens, n * sizeof(ngx_uint_t)) == 0)
    {
        return NGX_OK;
    }

    if (ngx_array_init(&tm->tools, pool, 8, sizeof(ngx_http_agent_tool_t *))
        != NGX_OK
        || ngx_http_agent_mcp_list_make(pool, t->agent, lists, &tm->tools)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    tm->agent = *t->agent;

    if (ngx_array_init(&tm->agent.tools, pool,
                       t->agent->tools.nelts + tm->tools.nelts,
                       sizeof(ngx_http_agent_tool_ref_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ref = ngx_array_push_n(&tm->agent.tools,
                           t->agent->tools.nelts + tm->tools.nelts);
    if (ref == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ref, t->agent->tools.elts,
               t->agent->tools.nelts * sizeof(ngx_http_agent_tool_ref_t));

    ref += t->agent->tools.nelts;
    tools = tm->tools.elts;

    for (i = 0; i < tm->tools.nelts; i++) {
        ref[i].name = tools[i]->name;
        ref[i].tool = tools[i];
        ref[i].line = 0;
    }

    if (ngx_http_agent_tools_render(t->pool, pool, &tm->agent) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_memcpy(tm->gens, gens, n * sizeof(ngx_uint_t));
    tm->loaded = 1;

    return NGX_OK;
}


/* the agent's lists as the zone holds them, copied out under the lock */

static ngx_int_t
ngx_http_agent_mcp_list_copy(ngx_pool_t *pool, ngx_http_agent_zone_t *z,
    ngx_http_agent_t *agent, ngx_str_t *lists, ngx_uint_t *gens)
{
    u_char                    *p;
    ngx_uint_t                 i;
    ngx_http_agent_mcp_t     **servers;
    ngx_http_agent_mcp_sh_t   *m;

    servers = agent->mcp->elts;

    ngx_http_agent_zone_lock(z);

    for (i = 0; i < agent->mcp->nelts; i++) {

        m = ngx_http_agent_mcp_find_locked(z, &servers[i]->name, 0);

        if (m == NULL || m->tools == NULL) {
            continue;
        }

        p = ngx_pnalloc(pool, m->tools_len + 1);
        if (p == NULL) {
            ngx_http_agent_zone_unlock(z);
            return NGX_ERROR;
        }

        ngx_memcpy(p, m->tools, m->tools_len);
        p[m->tools_len] = '\0';

        lists[i].data = p;
        lists[i].len = m->tools_len;
        gens[i] = m->gen;
    }

    ngx_http_agent_zone_unlock(z);

    return NGX_OK;
}


/*
 * The tools of the lists, with the names the model knows them by: a
 * name that another of the agent's tools has is prefixed with the
 * server's name and "_".
 */

static ngx_int_t
ngx_http_agent_mcp_list_make(ngx_pool_t *pool, ngx_http_agent_t *agent,
    ngx_str_t *lists, ngx_array_t *tools)
{
    char                    err[NGX_HTTP_AGENT_JSON_ERR];
    u_char                 *p;
    size_t                  j;
    yajl_val                v;
    ngx_uint_t              i, k, n;
    ngx_http_agent_mcp_t   *server, **servers;
    ngx_http_agent_tool_t **all, *tool;

    servers = agent->mcp->elts;

    for (i = 0; i < agent->mcp->nelts; i++) {

        if (lists[i].data == NULL) {
            continue;
        }

        v = ngx_http_agent_json_parse(lists[i].data, lists[i].len,
                                      NGX_HTTP_AGENT_JSON_DEPTH, err,
                                      sizeof(err));
        if (v == NULL) {
            continue;
        }

        for (j = 0; YAJL_IS_ARRAY(v) && j < v->u.array.len; j++) {
            if (ngx_http_agent_mcp_list_add(pool, servers[i],
                                            v->u.array.values[j], tools)
                != NGX_OK)
            {
                ngx_http_agent_json_free(v);
                return NGX_ERROR;
            }
        }

        ngx_http_agent_json_free(v);
    }

    all = tools->elts;

    for (i = 0; i < tools->nelts; i++) {
        tool = all[i];
        n = (ngx_http_agent_tools_find(agent, &tool->mcp_name) != NULL);

        for (k = 0; k < tools->nelts; k++) {
            n += (all[k]->mcp_name.len == tool->mcp_name.len
                  && ngx_strncmp(all[k]->mcp_name.data, tool->mcp_name.data,
                                 tool->mcp_name.len)
                     == 0);
        }

        if (n < 2) {
            continue;
        }

        server = tool->mcp;

        p = ngx_pnalloc(pool, server->name.len + 1 + tool->name.len);
        if (p == NULL) {
            return NGX_ERROR;
        }

        tool->name.data = p;
        tool->name.len = ngx_sprintf(p, "%V_%V", &server->name,
                                     &tool->mcp_name)
                         - p;
    }

    ngx_http_agent_mcp_list_unique(pool, agent, tools);

    return NGX_OK;
}


/*
 * A name the model gets once: a tool whose name, prefixed or not, is a
 * declared tool's or an earlier MCP tool's is left out, so that it never
 * shadows one and the provider never gets two functions of one name
 */

static void
ngx_http_agent_mcp_list_unique(ngx_pool_t *pool, ngx_http_agent_t *agent,
    ngx_array_t *tools)
{
    ngx_uint_t               i, k, n;
    ngx_http_agent_tool_t  **all;

    all = tools->elts;
    n = 0;

    for (i = 0; i < tools->nelts; i++) {

        for (k = 0; k < n; k++) {
            if (all[k]->name.len == all[i]->name.len
                && ngx_strncmp(all[k]->name.data, all[i]->name.data,
                               all[i]->name.len)
                   == 0)
            {
                break;
            }
        }

        if (k < n || ngx_http_agent_tools_find(agent, &all[i]->name)) {
            ngx_log_error(NGX_LOG_WARN, pool->log, 0,
                          "agent mcp \"%V\": tool \"%V\" is left out: "
                          "the agent has another tool named \"%V\"",
                          &((ngx_http_agent_mcp_t *) all[i]->mcp)->name,
                          &all[i]->mcp_name,
                          &all[i]->name);
            continue;
        }

        all[n++] = all[i];
    }

    tools->nelts = n;
}


/* one tool of a list, if the agent may use it */

static ngx_int_t
ngx_http_agent_mcp_list_add(ngx_pool_t *pool, ngx_http_agent_mcp_t *server,
    yajl_val v, ngx_array_t *tools)
{
    yajl_gen                 g;
    yajl_val                 description, schema;
    ngx_str_t                s, json;
    ngx_http_agent_tool_t   *tool, **tp;

    description = ngx_http_agent_provider_get(v, "description");
    schema = ngx_http_agent_provider_get(v, "inputSchema");

    /* the list was made of names a model can be given, as it was fetched */

    if (ngx_http_agent_mcp_list_name(server, v, &s) != NGX_OK
        || !ngx_http_agent_conf_mcp_allowed(server, &s))
    {
        return NGX_OK;
    }

    tool = ngx_pcalloc(pool, sizeof(ngx_http_agent_tool_t));
    if (tool == NULL) {
        return NGX_ERROR;
    }

    tool->mcp_name.data = ngx_pstrdup(pool, &s);
    if (tool->mcp_name.data == NULL) {
        return NGX_ERROR;
    }

    tool->mcp_name.len = s.len;
    tool->name = tool->mcp_name;
    tool->mcp = server;
    tool->executor = NGX_HTTP_AGENT_EXECUTOR_SERVER;
    tool->approval = ngx_http_agent_conf_mcp_approval(server, &s);
    tool->timeout = server->timeout;
    tool->location = server->location;
    tool->file = server->file;
    tool->line = server->line;

    if (YAJL_IS_STRING(description)) {
        s.data = (u_char *) description->u.string;
        s.len = ngx_strlen(s.data);

        tool->description.data = ngx_pstrdup(pool, &s);
        if (tool->description.data == NULL) {
            return NGX_ERROR;
        }

        tool->description.len = s.len;
    }

    if (YAJL_IS_OBJECT(schema)) {
        g = ngx_http_agent_json_gen(pool);
        if (g == NULL) {
            return NGX_ERROR;
        }

        if (ngx_http_agent_json_result(g, ngx_http_agent_provider_value(g,
                                                                     schema),
                                       &json)
            == NGX_OK)
        {
            tool->parameters.data = ngx_pstrdup(pool, &json);
            if (tool->parameters.data == NULL) {
                return NGX_ERROR;
            }

            tool->parameters.len = json.len;
        }
    }

    tp = ngx_array_push(tools);
    if (tp == NULL) {
        return NGX_ERROR;
    }

    *tp = tool;

    return NGX_OK;
}


/* agent_describe: each server, and its tools as the zone has them */

ngx_uint_t
ngx_http_agent_mcp_list_describe(yajl_gen g, ngx_pool_t *pool,
    ngx_http_agent_zone_t *z, ngx_http_agent_t *agent)
{
    ngx_str_t                *lists;
    ngx_uint_t                i, k, failed, *gens;
    ngx_array_t               tools;
    ngx_http_agent_mcp_t    **servers;
    ngx_http_agent_tool_t   **all;

    failed = yajl_gen_array_open(g);

    if (agent->mcp == NULL) {
        return failed | yajl_gen_array_close(g);
    }

    servers = agent->mcp->elts;

    lists = ngx_pcalloc(pool, agent->mcp->nelts
                              * (sizeof(ngx_str_t) + sizeof(ngx_uint_t)));
    if (lists == NULL) {
        return 1;
    }

    gens = (ngx_uint_t *) &lists[agent->mcp->nelts];

    if (z == NULL
        || ngx_http_agent_mcp_list_copy(pool, z, agent, lists, gens) != NGX_OK
        || ngx_array_init(&tools, pool, 8, sizeof(ngx_http_agent_tool_t *))
           != NGX_OK
        || ngx_http_agent_mcp_list_make(pool, agent, lists, &tools) != NGX_OK)
    {
        return 1;
    }

    all = tools.elts;

    for (i = 0; i < agent->mcp->nelts; i++) {
        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "server");
        failed |= ngx_http_agent_json_str(g, &servers[i]->name);
        failed |= ngx_http_agent_json_key(g, "location");
        failed |= ngx_http_agent_json_str(g, &servers[i]->location);
        failed |= ngx_http_agent_json_key(g, "refresh_ms");
        failed |= yajl_gen_integer(g, servers[i]->refresh);
        failed |= ngx_http_agent_json_key(g, "tools");

        if (lists[i].data == NULL) {
            /* not listed yet: the first model call asks */
            failed |= yajl_gen_null(g);
            failed |= yajl_gen_map_close(g);
            continue;
        }

        failed |= yajl_gen_array_open(g);

        for (k = 0; k < tools.nelts; k++) {
            if (all[k]->mcp != servers[i]) {
                continue;
            }

            failed |= ngx_http_agent_mcp_list_describe_tool(g, all[k]);
        }

        failed |= yajl_gen_array_close(g);
        failed |= yajl_gen_map_close(g);
    }

    return failed | yajl_gen_array_close(g);
}


static ngx_uint_t
ngx_http_agent_mcp_list_describe_tool(yajl_gen g, ngx_http_agent_tool_t *tool)
{
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "name");
    failed |= ngx_http_agent_json_str(g, &tool->name);
    failed |= ngx_http_agent_json_key(g, "mcp_name");
    failed |= ngx_http_agent_json_str(g, &tool->mcp_name);
    failed |= ngx_http_agent_json_key(g, "description");
    failed |= ngx_http_agent_json_str_or_null(g, &tool->description);
    failed |= ngx_http_agent_json_key(g, "approval");
    failed |= ngx_http_agent_json_str(g,
                                &ngx_http_agent_approvals[tool->approval].name);
    failed |= ngx_http_agent_json_key(g, "parameters");
    failed |= ngx_http_agent_json_verbatim(g,
                                      ngx_http_agent_provider_parameters(tool));

    return failed | yajl_gen_map_close(g);
}
