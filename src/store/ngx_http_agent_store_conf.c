
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_pg.h"


/*
 * The store's directive, and its file made ready in the master: the
 * schema created or checked, the directory writable by the workers.
 */


static char *ngx_http_agent_store_where(ngx_conf_t *cf,
    ngx_http_agent_store_conf_t *scf, ngx_str_t *value);
static ngx_int_t ngx_http_agent_store_dir_check(ngx_cycle_t *cycle,
    ngx_core_conf_t *ccf, ngx_str_t *path);


/* the history a worker keeps by default, bytes */
#define NGX_HTTP_AGENT_STORE_HISTORY    (4 * 1024 * 1024)


/*
 * agent_store path | postgresql://... | postgres:conninfo
 *             [thread_pool=name] [flush=time] [commit_delay=time]
 *             [history=size] [sync=full|normal];
 */

char *
ngx_http_agent_store_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    char                         *rv;
    ngx_str_t                    *value, name, s;
    ssize_t                       size;
    ngx_uint_t                    i, flush, delay;
    ngx_http_agent_store_conf_t  *scf;

    if (amcf->store) {
        return "is duplicate";
    }

    value = cf->args->elts;

    scf = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_store_conf_t));
    if (scf == NULL) {
        return NGX_CONF_ERROR;
    }

    rv = ngx_http_agent_store_where(cf, scf, &value[1]);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    ngx_str_null(&name);
    flush = 0;
    delay = 0;
    scf->history = NGX_CONF_UNSET_SIZE;
    scf->sync = NGX_CONF_UNSET_UINT;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "thread_pool=", 12) == 0
            && name.data == NULL)
        {
            name.data = value[i].data + 12;
            name.len = value[i].len - 12;
            continue;
        }

        if (ngx_strncmp(value[i].data, "flush=", 6) == 0 && !flush) {
            s.data = value[i].data + 6;
            s.len = value[i].len - 6;

            scf->flush = ngx_parse_time(&s, 0);
            if (scf->flush == (ngx_msec_t) NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid flush time \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            flush = 1;
            continue;
        }

        if (ngx_strncmp(value[i].data, "commit_delay=", 13) == 0 && !delay) {
            s.data = value[i].data + 13;
            s.len = value[i].len - 13;

            scf->commit_delay = ngx_parse_time(&s, 0);
            if (scf->commit_delay == (ngx_msec_t) NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid commit delay \"%V\"",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }

            delay = 1;
            continue;
        }

        if (ngx_strncmp(value[i].data, "history=", 8) == 0
            && scf->history == NGX_CONF_UNSET_SIZE)
        {
            s.data = value[i].data + 8;
            s.len = value[i].len - 8;

            size = ngx_parse_size(&s);
            if (size == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid history size \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            scf->history = size;
            continue;
        }

        if (ngx_strncmp(value[i].data, "sync=", 5) == 0
            && scf->sync == NGX_CONF_UNSET_UINT)
        {
            if (ngx_strcmp(value[i].data + 5, "full") == 0) {
                scf->sync = 1;

            } else if (ngx_strcmp(value[i].data + 5, "normal") == 0) {
                scf->sync = 0;

            } else {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid sync \"%V\", it must be "
                                   "\"full\" or \"normal\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    /* without flush= the input's own event starts its batch at once */

    if (scf->commit_delay && scf->flush == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"commit_delay\" needs \"flush\"");
        return NGX_CONF_ERROR;
    }

    if (scf->history == NGX_CONF_UNSET_SIZE) {
        scf->history = NGX_HTTP_AGENT_STORE_HISTORY;
    }

    if (scf->sync == NGX_CONF_UNSET_UINT) {
        scf->sync = 1;
    }

    scf->thread_pool = ngx_thread_pool_add(cf, name.len ? &name : NULL);
    if (scf->thread_pool == NULL) {
        return NGX_CONF_ERROR;
    }

    amcf->store = scf;

    return NGX_CONF_OK;
}


/*
 * agent_node id=name [addr=host:port] [heartbeat=time] [ttl=time];
 *
 * the node's name in a PostgreSQL store that several nginx share
 */

char *
ngx_http_agent_node_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t *amcf = conf;

    u_char                       *p;
    ngx_str_t                    *value, s;
    ngx_uint_t                    i;
    ngx_msec_t                   *t;
    ngx_http_agent_store_node_t  *node;

    if (amcf->node) {
        return "is duplicate";
    }

    node = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_store_node_t));
    if (node == NULL) {
        return NGX_CONF_ERROR;
    }

    node->heartbeat = NGX_CONF_UNSET_MSEC;
    node->ttl = NGX_CONF_UNSET_MSEC;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "id=", 3) == 0
            && node->id.data == NULL)
        {
            node->id.data = value[i].data + 3;
            node->id.len = value[i].len - 3;

            for (p = node->id.data; p < node->id.data + node->id.len; p++) {
                if (!(isalnum(*p) || *p == '-' || *p == '_' || *p == '.')) {
                    node->id.len = 0;
                    break;
                }
            }

            if (node->id.len == 0 || node->id.len > 64) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid node id \"%V\", it must be "
                                   "1 to 64 letters, digits, \"-\", \"_\" "
                                   "or \".\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "addr=", 5) == 0
            && node->addr.data == NULL)
        {
            node->addr.data = value[i].data + 5;
            node->addr.len = value[i].len - 5;
            continue;
        }

        t = NULL;
        s.len = 0;

        if (ngx_strncmp(value[i].data, "heartbeat=", 10) == 0
            && node->heartbeat == NGX_CONF_UNSET_MSEC)
        {
            t = &node->heartbeat;
            s.data = value[i].data + 10;
            s.len = value[i].len - 10;

        } else if (ngx_strncmp(value[i].data, "ttl=", 4) == 0
                   && node->ttl == NGX_CONF_UNSET_MSEC)
        {
            t = &node->ttl;
            s.data = value[i].data + 4;
            s.len = value[i].len - 4;
        }

        if (t) {
            *t = ngx_parse_time(&s, 0);

            if (*t == (ngx_msec_t) NGX_ERROR || *t == 0) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid time \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }

            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\"", &value[i]);
        return NGX_CONF_ERROR;
    }

    if (node->id.data == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"agent_node\" needs \"id=\"");
        return NGX_CONF_ERROR;
    }

    if (node->heartbeat == NGX_CONF_UNSET_MSEC) {
        node->heartbeat = 2000;
    }

    if (node->ttl == NGX_CONF_UNSET_MSEC) {
        node->ttl = 10000;
    }

    if (node->ttl <= node->heartbeat) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "the node's ttl must be longer than its "
                           "heartbeat");
        return NGX_CONF_ERROR;
    }

    amcf->node = node;

    return NGX_CONF_OK;
}


/*
 * PostgreSQL's connection string, a URI (postgresql:// or postgres://)
 * or "postgres:" and a libpq conninfo (key=value ...); anything else is
 * SQLite's file, relative to the prefix.  Either NUL-terminated for the
 * store.
 */

static char *
ngx_http_agent_store_where(ngx_conf_t *cf, ngx_http_agent_store_conf_t *scf,
    ngx_str_t *value)
{
    u_char            *p;
    char              *err;
    PQconninfoOption  *opts;

    scf->store = &ngx_http_agent_store_sqlite;
    scf->path = *value;

    if (ngx_strncmp(value->data, "postgresql://", 13) == 0
        || ngx_strncmp(value->data, "postgres://", 11) == 0)
    {
        scf->store = &ngx_http_agent_store_pg;

    } else if (ngx_strncmp(value->data, "postgres:", 9) == 0) {
        scf->store = &ngx_http_agent_store_pg;
        scf->path.data += 9;
        scf->path.len -= 9;

        if (scf->path.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"postgres:\" needs a connection string, "
                               "e.g. \"postgres:host=/run/postgresql "
                               "dbname=agent\"");
            return NGX_CONF_ERROR;
        }

    } else if (ngx_conf_full_name(cf->cycle, &scf->path, 0) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    p = ngx_pnalloc(cf->pool, scf->path.len + 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(p, scf->path.data, scf->path.len);
    p[scf->path.len] = '\0';
    scf->path.data = p;

    if (scf->store != &ngx_http_agent_store_pg) {
        return NGX_CONF_OK;
    }

    /* a string libpq cannot read is said by nginx -t */

    err = NULL;
    opts = PQconninfoParse((char *) p, &err);

    if (opts == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid PostgreSQL connection string: %s",
                           err ? err : "out of memory");
        PQfreemem(err);
        return NGX_CONF_ERROR;
    }

    PQconninfoFree(opts);

    ngx_http_agent_pg_set_name(&scf->path);

    return NGX_CONF_OK;
}


/*
 * In the master, as the configuration is loaded: the schema is created
 * or checked here, where blocking is allowed, and the file given to the
 * workers' user.
 */

ngx_int_t
ngx_http_agent_store_init_module(ngx_cycle_t *cycle)
{
    ngx_core_conf_t              *ccf;
    ngx_http_agent_main_conf_t   *amcf;
    ngx_http_agent_store_conf_t  *scf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);

    ngx_memzero(&ngx_http_agent_pg_node, sizeof(ngx_http_agent_store_node_t));

    if (amcf == NULL) {
        return NGX_OK;
    }

    scf = amcf->store;

    if (amcf->node
        && (scf == NULL || scf->store != &ngx_http_agent_store_pg))
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "\"agent_node\" needs an \"agent_store\" on "
                      "PostgreSQL");
        return NGX_ERROR;
    }

    if (scf == NULL) {
        return NGX_OK;
    }

    if (amcf->node) {
        ngx_http_agent_pg_node = *(ngx_http_agent_store_node_t *) amcf->node;
    }

    if (scf->store->open(&scf->path, cycle->log) != NGX_OK) {
        return NGX_ERROR;
    }

    /* a server's database has no file here */

    if (scf->store != &ngx_http_agent_store_sqlite) {
        return NGX_OK;
    }

    ccf = (ngx_core_conf_t *) ngx_get_conf(cycle->conf_ctx, ngx_core_module);

    if (geteuid() != 0 || ccf->user == (ngx_uid_t) NGX_CONF_UNSET_UINT) {
        return NGX_OK;
    }

    if (chown((char *) scf->path.data, ccf->user, -1) == -1) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      "chown(\"%s\") failed", scf->path.data);
        return NGX_ERROR;
    }

    return ngx_http_agent_store_dir_check(cycle, ccf, &scf->path);
}


/*
 * SQLite makes the WAL and shared-memory files beside the database, as
 * the workers' user: its directory must let that user write, or every
 * read and write fails later.  Said now, once.
 */

static ngx_int_t
ngx_http_agent_store_dir_check(ngx_cycle_t *cycle, ngx_core_conf_t *ccf,
    ngx_str_t *path)
{
    u_char           *p, dir[NGX_MAX_PATH];
    size_t            len;
    ngx_file_info_t   fi;

    p = path->data + path->len;

    while (p > path->data && *(p - 1) != '/') {
        p--;
    }

    len = (p > path->data + 1) ? (size_t) (p - path->data - 1) : 1;

    if (len >= NGX_MAX_PATH) {
        return NGX_OK;
    }

    ngx_memcpy(dir, path->data, len);
    dir[len] = '\0';

    if (ngx_file_info(dir, &fi) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, ngx_errno,
                      ngx_file_info_n " \"%s\" failed", dir);
        return NGX_ERROR;
    }

    if ((fi.st_uid == ccf->user && (fi.st_mode & S_IWUSR))
        || (fi.st_gid == ccf->group && (fi.st_mode & S_IWGRP))
        || (fi.st_mode & S_IWOTH))
    {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                  "agent store \"%V\": the directory \"%s\" must be "
                  "writable by the workers' user \"%s\" (SQLite makes its "
                  "WAL files there)", path, dir, ccf->username);

    return NGX_ERROR;
}
