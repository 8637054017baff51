/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_JSON_H_INCLUDED_
#define _NGX_HTTP_AGENT_JSON_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>


/* how deep JSON from outside may nest: yajl_gen stops at 128 */
#define NGX_HTTP_AGENT_JSON_DEPTH       64
#define NGX_HTTP_AGENT_JSON_DEPTH_STR   "64"
/* the log's events wrap what came from outside in a few levels more */
#define NGX_HTTP_AGENT_JSON_LOG_DEPTH   96
#define NGX_HTTP_AGENT_JSON_ERR         256


/*
 * The generators below return yajl_gen_status, whose "ok" is 0: callers
 * or the statuses of a whole document together and check them once, in
 * ngx_http_agent_json_result().
 */

#define ngx_http_agent_json_key(g, s)                                        \
    yajl_gen_string(g, (const unsigned char *) s, sizeof(s) - 1)

/* JSON's whitespace */
#define ngx_http_agent_json_space(c)                                         \
    ((c) == ' ' || (c) == '\t' || (c) == CR || (c) == LF)


void ngx_http_agent_json_trim(ngx_str_t *json);
ngx_int_t ngx_http_agent_json_object(ngx_pool_t *pool, ngx_str_t *json,
    ngx_str_t *err);
yajl_val ngx_http_agent_json_parse(u_char *json, size_t len,
    ngx_uint_t depth, char *err, size_t size);
void ngx_http_agent_json_free(yajl_val v);
char *ngx_http_agent_json_reason(ngx_pool_t *pool, char *what, char *reason);
ngx_int_t ngx_http_agent_json_utf8(ngx_str_t *s);
ngx_int_t ngx_http_agent_json_utf8_fix(ngx_pool_t *pool, ngx_str_t *s);

yajl_gen ngx_http_agent_json_gen(ngx_pool_t *pool);
ngx_uint_t ngx_http_agent_json_str(yajl_gen g, ngx_str_t *s);
ngx_uint_t ngx_http_agent_json_str_or_null(yajl_gen g, ngx_str_t *s);
ngx_uint_t ngx_http_agent_json_verbatim(yajl_gen g, ngx_str_t *json);
ngx_int_t ngx_http_agent_json_result(yajl_gen g, ngx_uint_t failed,
    ngx_str_t *out);

ngx_int_t ngx_http_agent_json_send(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *json);
ngx_int_t ngx_http_agent_json_output(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *type, ngx_str_t *json);
ngx_int_t ngx_http_agent_json_error(ngx_http_request_t *r, ngx_uint_t status,
    char *code, char *message);
ngx_int_t ngx_http_agent_json_method(ngx_http_request_t *r, char *allow);
ngx_int_t ngx_http_agent_json_body(ngx_http_request_t *r, ngx_str_t *body);


#endif /* _NGX_HTTP_AGENT_JSON_H_INCLUDED_ */
