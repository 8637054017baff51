
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_fuzz.h"


/*
 * The JSON helpers every parser of the module stands on, the input
 * taken as a JSON text (a request body, a provider event, a tool's
 * result, an event of the log):
 *
 *   src/core/ngx_http_agent_json_tree.c
 *     ngx_http_agent_json_parse()     the guarded door to yajl's tree, at
 *                                     the input's and the log's depth:
 *                                     the module's reader, else yajl's
 *   src/core/ngx_http_agent_json.c
 *     ngx_http_agent_json_object()    the syntax check of tool schemas
 *     ngx_http_agent_json_trim()
 *     ngx_http_agent_json_utf8(), ngx_http_agent_json_utf8_fix()
 *   src/provider/ngx_http_agent_provider.c
 *     ngx_http_agent_provider_parse(), _parse_log()
 *     ngx_http_agent_provider_value(), _text()   a tree written back
 *     ngx_http_agent_provider_result(), _mark(), _partial(), _get()
 *
 * Checks: a tree that parsed, by either reader, is the tree yajl's own
 * yajl_tree_parse() builds from the text; it is written back without
 * failing, and what is written parses again to the very same text; an
 * error message is a NUL-terminated string; the bytes utf8_fix()
 * returns are UTF-8 for ngx_http_agent_json_utf8() and for yajl's
 * generator alike, and text that is UTF-8 is left as it is.
 */


static void ngx_http_agent_fuzz_json_tree(ngx_pool_t *pool, u_char *p,
    size_t len, ngx_uint_t depth);
static ngx_uint_t ngx_http_agent_fuzz_json_same(yajl_val a, yajl_val b);
static void ngx_http_agent_fuzz_json_event(ngx_pool_t *pool, u_char *p,
    size_t len);
static void ngx_http_agent_fuzz_json_utf8(ngx_pool_t *pool, u_char *p,
    size_t len);


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char      *p;
    ngx_str_t    s, err;
    ngx_pool_t  *pool;

    pool = ngx_http_agent_fuzz_pool();

    p = ngx_http_agent_fuzz_copy(pool, data, size);

    s.data = p;
    s.len = size;

    ngx_http_agent_json_trim(&s);

    if (s.len > size || s.data < p || s.data + s.len > p + size) {
        ngx_http_agent_fuzz_fail("json_trim left the text", NULL, 0);
    }

    ngx_str_null(&err);

    if (ngx_http_agent_json_object(pool, &s, &err) == NGX_DECLINED) {
        (void) ngx_http_agent_fuzz_hash(0, err.data, err.len);
    }

    ngx_http_agent_fuzz_json_tree(pool, p, size, NGX_HTTP_AGENT_JSON_DEPTH);
    ngx_http_agent_fuzz_json_tree(pool, p, size,
                                  NGX_HTTP_AGENT_JSON_LOG_DEPTH);
    ngx_http_agent_fuzz_json_event(pool, p, size);
    ngx_http_agent_fuzz_json_utf8(pool, p, size);

    ngx_destroy_pool(pool);

    return 0;
}


static void
ngx_http_agent_fuzz_json_tree(ngx_pool_t *pool, u_char *p, size_t len,
    ngx_uint_t depth)
{
    char        err[NGX_HTTP_AGENT_JSON_ERR];
    u_char     *again;
    yajl_gen    g, g2;
    yajl_val    v, v2, yv;
    ngx_str_t   text, text2;

    ngx_memset(err, 'x', sizeof(err));

    v = ngx_http_agent_json_parse(p, len, depth, err, sizeof(err));

    if (v == NULL) {
        if (ngx_strlchr((u_char *) err, (u_char *) err + sizeof(err), '\0')
            == NULL)
        {
            ngx_http_agent_fuzz_fail("a parse error is not a string",
                                     NULL, 0);
        }

        return;
    }

    /* the arena's tree is yajl's tree, node for node */

    again = ngx_http_agent_fuzz_copy(pool, p, len);
    yv = yajl_tree_parse((char *) again, NULL, 0);

    if (yv == NULL || !ngx_http_agent_fuzz_json_same(v, yv)) {
        ngx_http_agent_fuzz_fail("the tree is not yajl's tree", p, len);
    }

    yajl_tree_free(yv);

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        abort();
    }

    if (ngx_http_agent_provider_text(g, v, &text) != NGX_OK) {
        ngx_http_agent_fuzz_fail("a parsed tree cannot be written back",
                                 p, len);
    }

    ngx_http_agent_json_free(v);

    again = ngx_http_agent_fuzz_copy(pool, text.data, text.len);

    v2 = ngx_http_agent_json_parse(again, text.len, depth, err,
                                   sizeof(err));
    if (v2 == NULL) {
        ngx_http_agent_fuzz_fail("a tree written back does not parse",
                                 text.data, text.len);
    }

    g2 = ngx_http_agent_json_gen(pool);
    if (g2 == NULL) {
        abort();
    }

    if (ngx_http_agent_provider_text(g2, v2, &text2) != NGX_OK
        || text2.len != text.len
        || ngx_memcmp(text2.data, text.data, text.len) != 0)
    {
        ngx_http_agent_fuzz_fail("a tree written back reads as another",
                                 text.data, text.len);
    }

    ngx_http_agent_json_free(v2);
}


static ngx_uint_t
ngx_http_agent_fuzz_json_same(yajl_val a, yajl_val b)
{
    size_t  i;

    if (a->type != b->type) {
        return 0;
    }

    switch (a->type) {

    case yajl_t_string:
        return ngx_strcmp(a->u.string, b->u.string) == 0;

    case yajl_t_number:
        return ngx_strcmp(a->u.number.r, b->u.number.r) == 0
               && a->u.number.flags == b->u.number.flags
               && (!(a->u.number.flags & YAJL_NUMBER_INT_VALID)
                   || a->u.number.i == b->u.number.i)
               && (!(a->u.number.flags & YAJL_NUMBER_DOUBLE_VALID)
                   || ngx_memcmp(&a->u.number.d, &b->u.number.d,
                                 sizeof(double)) == 0);

    case yajl_t_object:
        if (a->u.object.len != b->u.object.len) {
            return 0;
        }

        for (i = 0; i < a->u.object.len; i++) {
            if (ngx_strcmp(a->u.object.keys[i], b->u.object.keys[i]) != 0
                || !ngx_http_agent_fuzz_json_same(a->u.object.values[i],
                                                  b->u.object.values[i]))
            {
                return 0;
            }
        }

        return 1;

    case yajl_t_array:
        if (a->u.array.len != b->u.array.len) {
            return 0;
        }

        for (i = 0; i < a->u.array.len; i++) {
            if (!ngx_http_agent_fuzz_json_same(a->u.array.values[i],
                                               b->u.array.values[i]))
            {
                return 0;
            }
        }

        return 1;

    default:
        return 1;
    }
}


/* the input as an event: a provider's, or one of the log */

static void
ngx_http_agent_fuzz_json_event(ngx_pool_t *pool, u_char *p, size_t len)
{
    yajl_gen   g;
    yajl_val   v;
    ngx_str_t  text, content;

    v = ngx_http_agent_provider_parse(ngx_http_agent_fuzz_log, p, len,
                                      "fuzz event");
    if (v == NULL) {
        v = ngx_http_agent_provider_parse_log(ngx_http_agent_fuzz_log, p,
                                              len);
    }

    if (v == NULL) {
        return;
    }

    if (!YAJL_IS_OBJECT(v)) {
        ngx_http_agent_fuzz_fail("an event that is not an object", p, len);
    }

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        abort();
    }

    /* a tool_result event as the model sees it */

    if (ngx_http_agent_provider_result(g, v, &text) == NGX_OK) {
        ngx_http_agent_fuzz_json(text.data, text.len,
                                 "provider_result is not JSON");
    }

    ngx_str_set(&content, "partial");

    (void) ngx_http_agent_provider_mark(pool, v, &content);
    (void) ngx_http_agent_fuzz_hash(0, content.data, content.len);

    ngx_str_null(&content);

    (void) ngx_http_agent_provider_mark(pool, v, &content);
    (void) ngx_http_agent_fuzz_hash(0, content.data, content.len);

    ngx_http_agent_json_free(v);
}


static void
ngx_http_agent_fuzz_json_utf8(ngx_pool_t *pool, u_char *p, size_t len)
{
    yajl_gen   g;
    ngx_str_t  s, fixed;

    s.data = p;
    s.len = len;

    fixed = s;

    if (ngx_http_agent_json_utf8_fix(pool, &fixed) != NGX_OK) {
        abort();
    }

    if (ngx_http_agent_json_utf8(&s) == NGX_OK
        && (fixed.data != s.data || fixed.len != s.len))
    {
        ngx_http_agent_fuzz_fail("utf8_fix changed UTF-8 text", p, len);
    }

    if (ngx_http_agent_json_utf8(&fixed) != NGX_OK) {
        ngx_http_agent_fuzz_fail("utf8_fix left text that is not UTF-8",
                                 fixed.data, fixed.len);
    }

    /* what the module takes for UTF-8, yajl must take too */

    g = ngx_http_agent_json_gen(pool);
    if (g == NULL) {
        abort();
    }

    if (ngx_http_agent_json_str(g, &fixed) != yajl_gen_status_ok) {
        ngx_http_agent_fuzz_fail("yajl refuses what utf8_fix made",
                                 fixed.data, fixed.len);
    }
}
