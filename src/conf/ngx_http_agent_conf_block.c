
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * What the agent and agent_tool blocks are read with: a block of
 * directives of their own, names, files, enums, errors at a line.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_conf.h"


typedef struct {
    char                       *name;
    ngx_command_t              *commands;
    void                       *conf;
} ngx_http_agent_conf_block_t;


static char *ngx_http_agent_conf_directive(ngx_conf_t *cf,
    ngx_command_t *dummy, void *conf);
static ngx_uint_t ngx_http_agent_conf_nargs(ngx_conf_t *cf,
    ngx_command_t *cmd);

static ngx_uint_t  ngx_http_agent_argument_number[] = {
    NGX_CONF_NOARGS,
    NGX_CONF_TAKE1,
    NGX_CONF_TAKE2,
    NGX_CONF_TAKE3,
    NGX_CONF_TAKE4,
    NGX_CONF_TAKE5,
    NGX_CONF_TAKE6,
    NGX_CONF_TAKE7
};


char *
ngx_http_agent_conf_parse_block(ngx_conf_t *cf, char *name,
    ngx_command_t *commands, void *conf)
{
    char                         *rv;
    ngx_conf_t                    save;
    ngx_http_agent_conf_block_t   block;

    block.name = name;
    block.commands = commands;
    block.conf = conf;

    save = *cf;
    cf->handler = ngx_http_agent_conf_directive;
    cf->handler_conf = &block;

    rv = ngx_conf_parse(cf, NULL);

    *cf = save;

    return rv;
}


/* one directive inside a block, checked the way ngx_conf_handler() does */

static char *
ngx_http_agent_conf_directive(ngx_conf_t *cf, ngx_command_t *dummy,
    void *conf)
{
    ngx_http_agent_conf_block_t *block = conf;

    char           *rv;
    ngx_str_t      *name;
    ngx_command_t  *cmd;

    name = cf->args->elts;

    for (cmd = block->commands; cmd->name.len; cmd++) {

        if (cmd->name.len != name->len
            || ngx_strncmp(cmd->name.data, name->data, name->len) != 0)
        {
            continue;
        }

        if (!ngx_http_agent_conf_nargs(cf, cmd)) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid number of arguments in \"%V\" "
                               "directive", name);
            return NGX_CONF_ERROR;
        }

        rv = cmd->set(cf, cmd, block->conf);

        if (rv == NGX_CONF_OK || rv == NGX_CONF_ERROR) {
            return rv;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" directive %s", name, rv);
        return NGX_CONF_ERROR;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "unknown directive \"%V\" in %s block",
                       name, block->name);

    return NGX_CONF_ERROR;
}


static ngx_uint_t
ngx_http_agent_conf_nargs(ngx_conf_t *cf, ngx_command_t *cmd)
{
    ngx_uint_t  n;

    n = cf->args->nelts;

    if (cmd->type & NGX_CONF_FLAG) {
        return n == 2;
    }

    if (cmd->type & NGX_CONF_1MORE) {
        return n >= 2;
    }

    if (n > NGX_CONF_MAX_ARGS) {
        return 0;
    }

    return (cmd->type & ngx_http_agent_argument_number[n - 1]) != 0;
}


/* names reach providers as function names: keep to what they all accept */

ngx_int_t
ngx_http_agent_conf_name(ngx_str_t *name)
{
    u_char      c;
    ngx_uint_t  i;

    if (name->len == 0 || name->len > NGX_HTTP_AGENT_NAME_MAX) {
        return NGX_ERROR;
    }

    for (i = 0; i < name->len; i++) {
        c = name->data[i];

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9') || c == '_' || c == '-')
        {
            continue;
        }

        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * A whole file into the configuration's pool; a relative name is taken
 * from the directory of nginx.conf.
 */

ngx_int_t
ngx_http_agent_conf_read_file(ngx_conf_t *cf, ngx_str_t *name,
    ngx_str_t *content)
{
    off_t            size;
    ssize_t          n;
    ngx_int_t        rc;
    ngx_file_t       file;
    ngx_file_info_t  fi;

    if (ngx_conf_full_name(cf->cycle, name, 1) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_memzero(&file, sizeof(ngx_file_t));

    file.name = *name;
    file.log = cf->log;

    file.fd = ngx_open_file(name->data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);

    if (file.fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_open_file_n " \"%s\" failed", name->data);
        return NGX_ERROR;
    }

    rc = NGX_ERROR;

    if (ngx_fd_info(file.fd, &fi) == NGX_FILE_ERROR) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           ngx_fd_info_n " \"%s\" failed", name->data);
        goto done;
    }

    size = ngx_file_size(&fi);

    content->data = ngx_pnalloc(cf->pool, size ? size : 1);
    if (content->data == NULL) {
        goto done;
    }

    n = ngx_read_file(&file, content->data, size, 0);

    if (n == NGX_ERROR) {
        goto done;
    }

    if (n != size) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           ngx_read_file_n " \"%s\" returned only "
                           "%z bytes instead of %O", name->data, n, size);
        goto done;
    }

    content->len = size;
    rc = NGX_OK;

done:

    if (ngx_close_file(file.fd) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_ALERT, cf->log, ngx_errno,
                      ngx_close_file_n " \"%s\" failed", name->data);
    }

    return rc;
}


/* ngx_conf_set_enum_slot(), with an error that lists the values */

char *
ngx_http_agent_conf_set_enum(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    u_char           *s, buf[NGX_MAX_CONF_ERRSTR];
    ngx_str_t        *value;
    ngx_uint_t       *field, i;
    ngx_conf_enum_t  *e;

    field = (ngx_uint_t *) (p + cmd->offset);

    if (*field != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;
    e = cmd->post;

    for (i = 0; e[i].name.len; i++) {
        if (e[i].name.len == value[1].len
            && ngx_strcmp(e[i].name.data, value[1].data) == 0)
        {
            *field = e[i].value;
            return NGX_CONF_OK;
        }
    }

    s = buf;

    for (i = 0; e[i].name.len; i++) {
        s = ngx_slprintf(s, buf + sizeof(buf), "%s\"%V\"",
                         i == 0 ? "" : (e[i + 1].name.len ? ", " : " or "),
                         &e[i].name);
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid value \"%V\" in \"%V\" directive, "
                       "it must be %*s", &value[1], &cmd->name, s - buf, buf);

    return NGX_CONF_ERROR;
}


/*
 * ngx_conf_log_error() at a line read earlier: for what is checked once
 * a block, or the whole http block, has been read.
 */

void
ngx_http_agent_conf_error(ngx_conf_t *cf, u_char *file, ngx_uint_t line,
    const char *fmt, ...)
{
    u_char   errstr[NGX_MAX_CONF_ERRSTR], *p;
    va_list  args;

    va_start(args, fmt);
    p = ngx_vslprintf(errstr, errstr + NGX_MAX_CONF_ERRSTR, fmt, args);
    va_end(args);

    ngx_log_error(NGX_LOG_EMERG, cf->log, 0, "%*s in %s:%ui",
                  p - errstr, errstr, file, line);
}
