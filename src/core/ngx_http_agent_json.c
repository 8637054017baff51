/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_parse.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_json.h"


#define NGX_HTTP_AGENT_JSON_FIRST_NONE     0
#define NGX_HTTP_AGENT_JSON_FIRST_OBJECT   1
#define NGX_HTTP_AGENT_JSON_FIRST_OTHER    2


static ngx_int_t ngx_http_agent_json_scan(u_char *p, size_t len,
    ngx_uint_t max, char **reason);
static size_t ngx_http_agent_utf8_char(u_char *p, u_char *last);
static int ngx_http_agent_json_start_map(void *ctx);
static int ngx_http_agent_json_start_array(void *ctx);
static void ngx_http_agent_json_gen_cleanup(void *data);
static ngx_int_t ngx_http_agent_json_answer(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_str_t *json, ngx_uint_t newline);


static yajl_callbacks  ngx_http_agent_json_object_callbacks = {
    NULL,                                  /* null */
    NULL,                                  /* boolean */
    NULL,                                  /* integer */
    NULL,                                  /* double */
    NULL,                                  /* number */
    NULL,                                  /* string */
    ngx_http_agent_json_start_map,         /* start map */
    NULL,                                  /* map key */
    NULL,                                  /* end map */
    ngx_http_agent_json_start_array,       /* start array */
    NULL                                   /* end array */
};


/* whitespace around a JSON text is not part of its value */

void
ngx_http_agent_json_trim(ngx_str_t *json)
{
    while (json->len && ngx_http_agent_json_space(json->data[0])) {
        json->data++;
        json->len--;
    }

    while (json->len && ngx_http_agent_json_space(json->data[json->len - 1])) {
        json->len--;
    }
}


/*
 * Checks that the bytes are one JSON text whose value is an object.
 * NGX_DECLINED: they are not, and err says why ("is not valid JSON: ...
 * at byte N", N counted from 1 as yajl does, or "is not a JSON object").
 * Only the syntax is checked: what the object means is the provider's
 * business.
 */

ngx_int_t
ngx_http_agent_json_object(ngx_pool_t *pool, ngx_str_t *json, ngx_str_t *err)
{
    char           *reason;
    size_t          len, size, offset;
    u_char         *msg, *p;
    ngx_int_t       rc;
    ngx_uint_t      first;
    yajl_status     status;
    yajl_handle     h;

    if (ngx_http_agent_json_scan(json->data, json->len,
                                 NGX_HTTP_AGENT_JSON_DEPTH, &reason)
        != NGX_OK)
    {
        err->data = (u_char *) reason;
        err->len = ngx_strlen(reason);
        return NGX_DECLINED;
    }

    first = NGX_HTTP_AGENT_JSON_FIRST_NONE;

    h = yajl_alloc(&ngx_http_agent_json_object_callbacks, NULL, &first);
    if (h == NULL) {
        return NGX_ERROR;
    }

    offset = 0;

    status = yajl_parse(h, json->data, json->len);

    if (status == yajl_status_ok) {
        status = yajl_complete_parse(h);

    } else {
        offset = yajl_get_bytes_consumed(h);
    }

    if (status == yajl_status_ok
        && first == NGX_HTTP_AGENT_JSON_FIRST_OBJECT)
    {
        yajl_free(h);
        return NGX_OK;
    }

    if (status != yajl_status_error) {
        yajl_free(h);
        ngx_str_set(err, "is not a JSON object");
        return NGX_DECLINED;
    }

    rc = NGX_DECLINED;

    msg = yajl_get_error(h, 0, json->data, json->len);

    if (msg == NULL) {
        ngx_str_set(err, "is not valid JSON");

    } else {
        len = ngx_strlen(msg);

        while (len && (msg[len - 1] == LF || msg[len - 1] == '.')) {
            len--;
        }

        size = sizeof("is not valid JSON:  at byte ") - 1 + len
               + NGX_SIZE_T_LEN;

        err->data = ngx_pnalloc(pool, size);

        if (err->data == NULL) {
            rc = NGX_ERROR;

        } else {
            p = ngx_slprintf(err->data, err->data + size,
                             "is not valid JSON: %*s", len, msg);

            if (offset) {
                p = ngx_slprintf(p, err->data + size, " at byte %uz",
                                 offset);
            }

            err->len = p - err->data;
        }

        yajl_free_error(h, msg);
    }

    yajl_free(h);

    return rc;
}


static int
ngx_http_agent_json_start_map(void *ctx)
{
    ngx_uint_t  *first = ctx;

    if (*first == NGX_HTTP_AGENT_JSON_FIRST_NONE) {
        *first = NGX_HTTP_AGENT_JSON_FIRST_OBJECT;
    }

    return 1;
}


static int
ngx_http_agent_json_start_array(void *ctx)
{
    ngx_uint_t  *first = ctx;

    if (*first == NGX_HTTP_AGENT_JSON_FIRST_NONE) {
        *first = NGX_HTTP_AGENT_JSON_FIRST_OTHER;

        /* an array at the top: no need to read further */
        return 0;
    }

    return 1;
}


/* "the body " and "is nested deeper than 64 levels", joined */

char *
ngx_http_agent_json_reason(ngx_pool_t *pool, char *what, char *reason)
{
    u_char  *p;
    size_t   len;

    len = ngx_strlen(what) + ngx_strlen(reason) + 1;

    p = ngx_pnalloc(pool, len);
    if (p == NULL) {
        return NULL;
    }

    ngx_sprintf(p, "%s%s%Z", what, reason);

    return (char *) p;
}


static ngx_int_t
ngx_http_agent_json_scan(u_char *p, size_t len, ngx_uint_t max,
    char **reason)
{
    u_char      *last;
    ngx_uint_t   depth, string;

    last = p + len;
    depth = 0;
    string = 0;

    for ( /* void */ ; p < last; p++) {

        if (*p == '\0') {
            *reason = "holds a NUL byte";
            return NGX_DECLINED;
        }

        if (string) {
            if (*p == '"') {
                string = 0;

            } else if (*p == '\\' && p + 1 < last && p[1] != '\0') {
                p++;

                if (*p == 'u' && last - p > 4
                    && ngx_strncmp(p + 1, "0000", 4) == 0)
                {
                    *reason = "holds a NUL character (\\u0000)";
                    return NGX_DECLINED;
                }
            }

            continue;
        }

        switch (*p) {

        case '"':
            string = 1;
            break;

        case '[':
        case '{':
            if (++depth > max) {
                *reason = (max == NGX_HTTP_AGENT_JSON_DEPTH)
                          ? "is nested deeper than "
                            NGX_HTTP_AGENT_JSON_DEPTH_STR " levels"
                          : "is nested too deep";
                return NGX_DECLINED;
            }
            break;

        case ']':
        case '}':
            if (depth) {
                depth--;
            }
            break;
        }
    }

    return NGX_OK;
}


/*
 * Strings are copied into JSON as they are, so they must be UTF-8, and
 * strictly so (no overlong forms, no surrogates, no NUL): what is written
 * to the log must be what the guarded parser reads back.
 */

ngx_int_t
ngx_http_agent_json_utf8(ngx_str_t *s)
{
    u_char  *p, *last;
    size_t   n;

    if (s->len == 0) {
        /* an empty string may have no data at all */
        return NGX_OK;
    }

    p = s->data;
    last = p + s->len;

    while (p < last) {
        n = ngx_http_agent_utf8_char(p, last);

        if (n == 0) {
            return NGX_ERROR;
        }

        p += n;
    }

    return NGX_OK;
}


/*
 * Bytes from a tool or a provider that are not UTF-8: each byte that
 * does not start a valid sequence, and each NUL, becomes U+FFFD, as
 * browsers do.  The
 * text is copied only when something is replaced.
 */

ngx_int_t
ngx_http_agent_json_utf8_fix(ngx_pool_t *pool, ngx_str_t *s)
{
    u_char  *p, *last, *d, *dst;
    size_t   n;

    if (ngx_http_agent_json_utf8(s) == NGX_OK) {
        return NGX_OK;
    }

    /* U+FFFD is 3 bytes: at most 3 for each byte replaced */

    dst = ngx_pnalloc(pool, s->len * 3 + 1);
    if (dst == NULL) {
        return NGX_ERROR;
    }

    d = dst;
    p = s->data;
    last = p + s->len;

    while (p < last) {
        n = ngx_http_agent_utf8_char(p, last);

        if (n) {
            d = ngx_cpymem(d, p, n);
            p += n;
            continue;
        }

        *d++ = 0xef; *d++ = 0xbf; *d++ = 0xbd;
        p++;
    }

    *d = '\0';

    s->data = dst;
    s->len = d - dst;

    return NGX_OK;
}


/* the length of the valid UTF-8 sequence at p, 0 if there is none */

static size_t
ngx_http_agent_utf8_char(u_char *p, u_char *last)
{
    size_t    n, i;
    uint32_t  c, min;

    c = *p;

    if (c < 0x80) {
        /* NUL is refused where JSON is read: never written either */
        return (c != 0);
    }

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2; c &= 0x1f; min = 0x80;

    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3; c &= 0x0f; min = 0x800;

    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4; c &= 0x07; min = 0x10000;

    } else {
        return 0;
    }

    if ((size_t) (last - p) < n) {
        return 0;
    }

    for (i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }

        c = (c << 6) | (p[i] & 0x3f);
    }

    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) {
        return 0;
    }

    return n;
}


/*
 * A generator whose memory (yajl's malloc) is freed with the pool, so
 * that no return path can leak it; its buffer stays valid until then.
 */

yajl_gen
ngx_http_agent_json_gen(ngx_pool_t *pool)
{
    yajl_gen             g;
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NULL;
    }

    /*
     * a string that is not UTF-8 fails the document rather than reach
     * the log, which could not be read back
     */

    yajl_gen_config(g, yajl_gen_validate_utf8, 1);

    cln->handler = ngx_http_agent_json_gen_cleanup;
    cln->data = g;

    return g;
}


static void
ngx_http_agent_json_gen_cleanup(void *data)
{
    yajl_gen  g = data;

    yajl_gen_free(g);
}


ngx_uint_t
ngx_http_agent_json_str(yajl_gen g, ngx_str_t *s)
{
    return yajl_gen_string(g, s->data, s->len);
}


ngx_uint_t
ngx_http_agent_json_str_or_null(yajl_gen g, ngx_str_t *s)
{
    if (s->data == NULL) {
        return yajl_gen_null(g);
    }

    return yajl_gen_string(g, s->data, s->len);
}


ngx_uint_t
ngx_http_agent_json_verbatim(yajl_gen g, ngx_str_t *json)
{
    /*
     * yajl_gen_number() emits the bytes as they are, with the separator
     * their position needs: it splices already validated JSON in unchanged
     */

    return yajl_gen_number(g, (const char *) json->data, json->len);
}


/* the document generated so far, in the generator's own buffer */

ngx_int_t
ngx_http_agent_json_result(yajl_gen g, ngx_uint_t failed, ngx_str_t *out)
{
    size_t                len;
    const unsigned char  *buf;

    if (failed) {
        return NGX_ERROR;
    }

    if (yajl_gen_get_buf(g, &buf, &len) != yajl_gen_status_ok) {
        return NGX_ERROR;
    }

    out->data = (u_char *) buf;
    out->len = len;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_json_send(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *json)
{
    static ngx_str_t  type = ngx_string("application/json");

    return ngx_http_agent_json_answer(r, status, &type, json, 1);
}


/* a whole body of that type, from memory that outlives the request */

ngx_int_t
ngx_http_agent_json_output(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *type, ngx_str_t *json)
{
    return ngx_http_agent_json_answer(r, status, type, json, 0);
}


/*
 * A JSON answer ends with a newline, as a line of text does, so that a
 * terminal shows it apart from what comes next (curl's output, a shell's
 * prompt); JSON takes it as whitespace.
 */

static ngx_int_t
ngx_http_agent_json_answer(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *type, ngx_str_t *json, ngx_uint_t newline)
{
    ngx_int_t     rc;
    ngx_buf_t    *b, *nl;
    ngx_chain_t   out[2];

    static u_char  lf[] = "\n";

    r->headers_out.status = status;
    r->headers_out.content_length_n = json->len + (newline ? 1 : 0);

    r->headers_out.content_type = *type;
    r->headers_out.content_type_len = type->len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->pos = json->data;
    b->last = json->data + json->len;
    b->memory = 1;

    out[0].buf = b;
    out[0].next = NULL;

    if (newline) {
        nl = ngx_calloc_buf(r->pool);
        if (nl == NULL) {
            return NGX_ERROR;
        }

        nl->pos = lf;
        nl->last = lf + 1;
        nl->memory = 1;

        out[0].next = &out[1];
        out[1].buf = nl;
        out[1].next = NULL;

        b = nl;
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    return ngx_http_output_filter(r, &out[0]);
}


/* {"error":{"code":CODE,"message":MESSAGE}} */

ngx_int_t
ngx_http_agent_json_error(ngx_http_request_t *r, ngx_uint_t status,
    char *code, char *message)
{
    yajl_gen    g;
    ngx_str_t   json;
    ngx_uint_t  failed;

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    failed = yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "error");
    failed |= yajl_gen_map_open(g);
    failed |= ngx_http_agent_json_key(g, "code");
    failed |= yajl_gen_string(g, (u_char *) code, ngx_strlen(code));
    failed |= ngx_http_agent_json_key(g, "message");
    failed |= yajl_gen_string(g, (u_char *) message, ngx_strlen(message));
    failed |= yajl_gen_map_close(g);
    failed |= yajl_gen_map_close(g);

    if (ngx_http_agent_json_result(g, failed, &json) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_agent_json_send(r, status, &json);
}


/* 405 with the methods the location takes */

ngx_int_t
ngx_http_agent_json_method(ngx_http_request_t *r, char *allow)
{
    u_char            msg[64];
    ngx_int_t         rc;
    ngx_table_elt_t  *h;

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* zeroed: newer nginx has more fields here (h->next) */
    ngx_memzero(h, sizeof(ngx_table_elt_t));

    h->hash = 1;
    ngx_str_set(&h->key, "Allow");
    h->value.data = (u_char *) allow;
    h->value.len = ngx_strlen(allow);

    ngx_sprintf(msg, "the location takes %s%Z", allow);

    return ngx_http_agent_json_error(r, NGX_HTTP_NOT_ALLOWED,
                                     "method_not_allowed", (char *) msg);
}


/*
 * A request's JSON body, in one piece, NUL-terminated.  It must
 * fit in client_body_buffer_size: it is kept in memory, and one that
 * nginx had to write to a file is too large (NGX_ABORT).  NGX_DECLINED:
 * there is no body.
 */

ngx_int_t
ngx_http_agent_json_body(ngx_http_request_t *r, ngx_str_t *body)
{
    u_char       *p;
    size_t        len;
    ngx_chain_t  *cl;

    if (r->request_body == NULL || r->request_body->bufs == NULL) {
        return NGX_DECLINED;
    }

    if (r->request_body->temp_file) {
        return NGX_ABORT;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        len += cl->buf->last - cl->buf->pos;
    }

    if (len == 0) {
        return NGX_DECLINED;
    }

    /* one more byte: the NUL after it */

    body->data = ngx_pnalloc(r->pool, len + 1);
    if (body->data == NULL) {
        return NGX_ERROR;
    }

    p = body->data;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        if (cl->buf->last != cl->buf->pos) {
            p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
        }
    }

    *p = '\0';
    body->len = len;

    return NGX_OK;
}
