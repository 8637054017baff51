
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <ngx_md5.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_trace.h"


/*
 * W3C Trace Context: the traceparent a message came with, the ids of a
 * turn's spans, and the traceparent its subrequests carry.
 */


void  (*ngx_http_agent_trace_ended_locked)(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_event_t *ev);


static void ngx_http_agent_trace_random(u_char *p, size_t n);
static ngx_uint_t ngx_http_agent_trace_zero(u_char *p, size_t n);
static ngx_str_t ngx_http_agent_trace_in(ngx_http_request_t *r, char *name);


/* "00-<32 hex>-<16 hex>-<2 hex>"; a later version may add "-..." */

ngx_int_t
ngx_http_agent_trace_parse(ngx_str_t *traceparent,
    ngx_http_agent_trace_t *tc)
{
    u_char     *p, flags;
    ngx_str_t   s;

    p = traceparent->data;

    if (traceparent->len < NGX_HTTP_AGENT_TRACEPARENT_LEN
        || p[2] != '-' || p[35] != '-' || p[52] != '-')
    {
        return NGX_DECLINED;
    }

    if ((p[0] == 'f' && p[1] == 'f')
        || (p[0] == '0' && p[1] == '0'
            && traceparent->len != NGX_HTTP_AGENT_TRACEPARENT_LEN)
        || (traceparent->len > NGX_HTTP_AGENT_TRACEPARENT_LEN
            && p[NGX_HTTP_AGENT_TRACEPARENT_LEN] != '-'))
    {
        return NGX_DECLINED;
    }

    s.data = p;
    s.len = 2;

    if (ngx_http_agent_trace_hex(&s, &flags, 1) != NGX_OK) {
        return NGX_DECLINED;
    }

    s.data = p + 3;
    s.len = 2 * NGX_HTTP_AGENT_TRACE_ID_LEN;

    if (ngx_http_agent_trace_hex(&s, tc->trace_id,
                                 NGX_HTTP_AGENT_TRACE_ID_LEN)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    s.data = p + 36;
    s.len = 2 * NGX_HTTP_AGENT_SPAN_ID_LEN;

    if (ngx_http_agent_trace_hex(&s, tc->parent_id,
                                 NGX_HTTP_AGENT_SPAN_ID_LEN)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    s.data = p + 53;
    s.len = 2;

    if (ngx_http_agent_trace_hex(&s, &flags, 1) != NGX_OK
        || ngx_http_agent_trace_zero(tc->trace_id,
                                     NGX_HTTP_AGENT_TRACE_ID_LEN)
        || ngx_http_agent_trace_zero(tc->parent_id,
                                     NGX_HTTP_AGENT_SPAN_ID_LEN))
    {
        return NGX_DECLINED;
    }

    tc->parent = 1;
    tc->sampled = flags & 1;

    return NGX_OK;
}


/*
 * A turn's context: the caller's trace and its decision if it sent one,
 * else a trace of its own sampled by ratio (in millionths); a span of
 * its own either way
 */

void
ngx_http_agent_trace_start(ngx_http_agent_trace_t *tc, ngx_uint_t ratio)
{
    if (!tc->parent) {
        ngx_http_agent_trace_random(tc->trace_id,
                                    NGX_HTTP_AGENT_TRACE_ID_LEN);
        tc->sampled = ratio >= NGX_HTTP_AGENT_TRACE_ONE
                      || (ngx_uint_t) ngx_random() % NGX_HTTP_AGENT_TRACE_ONE
                         < ratio;
    }

    ngx_http_agent_trace_random(tc->span_id, NGX_HTTP_AGENT_SPAN_ID_LEN);

    tc->valid = 1;
}


/*
 * The id of one of the turn's spans: what it is ("chat", "tool") and its
 * key (the model call's number, the tool call's id), hashed with the
 * turn's ids
 */

void
ngx_http_agent_trace_span(ngx_http_agent_trace_t *tc, char *what,
    ngx_str_t *key, u_char *span)
{
    u_char     digest[16];
    ngx_md5_t  md5;

    ngx_md5_init(&md5);
    ngx_md5_update(&md5, tc->trace_id, NGX_HTTP_AGENT_TRACE_ID_LEN);
    ngx_md5_update(&md5, tc->span_id, NGX_HTTP_AGENT_SPAN_ID_LEN);
    ngx_md5_update(&md5, what, ngx_strlen(what) + 1);
    ngx_md5_update(&md5, key->data, key->len);
    ngx_md5_final(digest, &md5);

    ngx_memcpy(span, digest, NGX_HTTP_AGENT_SPAN_ID_LEN);

    if (ngx_http_agent_trace_zero(span, NGX_HTTP_AGENT_SPAN_ID_LEN)) {
        span[NGX_HTTP_AGENT_SPAN_ID_LEN - 1] = 1;
    }
}


/* a traceparent naming span (NGX_HTTP_AGENT_TRACEPARENT_LEN bytes) */

u_char *
ngx_http_agent_trace_header(u_char *p, ngx_http_agent_trace_t *tc,
    u_char *span)
{
    p = ngx_cpymem(p, "00-", 3);
    p = ngx_hex_dump(p, tc->trace_id, NGX_HTTP_AGENT_TRACE_ID_LEN);
    *p++ = '-';
    p = ngx_hex_dump(p, span, NGX_HTTP_AGENT_SPAN_ID_LEN);

    return ngx_cpymem(p, tc->sampled ? "-01" : "-00", 3);
}


/* n bytes of 2n lowercase hex digits, as W3C and OTLP write ids */

ngx_int_t
ngx_http_agent_trace_hex(ngx_str_t *s, u_char *out, size_t n)
{
    u_char      c;
    ngx_uint_t  i, v;

    if (s->len != 2 * n) {
        return NGX_ERROR;
    }

    for (i = 0; i < 2 * n; i++) {
        c = s->data[i];

        if (c >= '0' && c <= '9') {
            v = c - '0';

        } else if (c >= 'a' && c <= 'f') {
            v = c - 'a' + 10;

        } else {
            return NGX_ERROR;
        }

        if (i % 2 == 0) {
            out[i / 2] = (u_char) (v << 4);

        } else {
            out[i / 2] |= (u_char) v;
        }
    }

    return NGX_OK;
}


static void
ngx_http_agent_trace_random(u_char *p, size_t n)
{
    size_t  i;

    do {
        for (i = 0; i < n; i++) {
            p[i] = (u_char) (ngx_random() >> 11);
        }

    } while (ngx_http_agent_trace_zero(p, n));
}


static ngx_uint_t
ngx_http_agent_trace_zero(u_char *p, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        if (p[i]) {
            return 0;
        }
    }

    return 1;
}


/* a request header's value, or an empty one */

static ngx_str_t
ngx_http_agent_trace_in(ngx_http_request_t *r, char *name)
{
    size_t            len;
    ngx_str_t         none = ngx_null_string;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = ngx_strlen(name);

    for (part = &r->headers_in.headers.part; part; part = part->next) {
        h = part->elts;

        for (i = 0; i < part->nelts; i++) {
            if (h[i].key.len == len
                && ngx_strncasecmp(h[i].key.data, (u_char *) name, len) == 0)
            {
                return h[i].value;
            }
        }
    }

    return none;
}


/*
 * The context of a turn a request starts: its traceparent and tracestate
 * if it has a valid one (one that is not is ignored, as W3C says)
 */

void
ngx_http_agent_trace_request(ngx_http_request_t *r,
    ngx_http_agent_trace_t *tc, ngx_uint_t ratio)
{
    ngx_str_t  s;

    ngx_memzero(tc, sizeof(ngx_http_agent_trace_t));

    s = ngx_http_agent_trace_in(r, "traceparent");

    if (s.len && ngx_http_agent_trace_parse(&s, tc) == NGX_OK) {
        s = ngx_http_agent_trace_in(r, "tracestate");

        if (s.len <= NGX_HTTP_AGENT_TRACESTATE_MAX) {
            tc->state = s;
        }

    } else {
        ngx_memzero(tc, sizeof(ngx_http_agent_trace_t));
    }

    ngx_http_agent_trace_start(tc, ratio);
}


/*
 * The context as the user_msg keeps it: {"traceparent": the turn's own
 * span, "parent": the caller's span, "tracestate"}
 */

ngx_uint_t
ngx_http_agent_trace_json(yajl_gen g, ngx_http_agent_trace_t *tc)
{
    u_char      buf[NGX_HTTP_AGENT_TRACEPARENT_LEN];
    ngx_uint_t  failed;

    failed = yajl_gen_map_open(g);

    failed |= ngx_http_agent_json_key(g, "traceparent");
    failed |= yajl_gen_string(g, buf,
                              ngx_http_agent_trace_header(buf, tc,
                                                          tc->span_id)
                              - buf);

    if (tc->parent) {
        failed |= ngx_http_agent_json_key(g, "parent");
        failed |= yajl_gen_string(g, buf,
                                  ngx_hex_dump(buf, tc->parent_id,
                                               NGX_HTTP_AGENT_SPAN_ID_LEN)
                                  - buf);
    }

    if (tc->state.len) {
        failed |= ngx_http_agent_json_key(g, "tracestate");
        failed |= ngx_http_agent_json_str(g, &tc->state);
    }

    failed |= yajl_gen_map_close(g);

    return failed;
}


/*
 * "traceparent": that of a request resolving a call (its own trace's,
 * which does not move the turn), as a resolution records it for a link
 */

ngx_uint_t
ngx_http_agent_trace_resolver_json(ngx_http_request_t *r, yajl_gen g)
{
    u_char                       buf[NGX_HTTP_AGENT_TRACEPARENT_LEN];
    ngx_str_t                    s;
    ngx_uint_t                   failed;
    ngx_http_agent_trace_t       tc;
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);

    if (amcf->trace.len == 0) {
        return 0;
    }

    ngx_memzero(&tc, sizeof(ngx_http_agent_trace_t));

    s = ngx_http_agent_trace_in(r, "traceparent");

    if (s.len == 0 || ngx_http_agent_trace_parse(&s, &tc) != NGX_OK) {
        return 0;
    }

    failed = ngx_http_agent_json_key(g, "traceparent");
    failed |= yajl_gen_string(g, buf,
                              ngx_http_agent_trace_header(buf, &tc,
                                                          tc.parent_id)
                              - buf);

    return failed;
}


/* the context back from a user_msg's "trace"; NGX_DECLINED: it has none */

ngx_int_t
ngx_http_agent_trace_from(yajl_val ev, ngx_http_agent_trace_t *tc)
{
    ngx_str_t      s;
    yajl_val       v;
    const char    *traceparent[] = { "trace", "traceparent", NULL };
    const char    *parent[] = { "trace", "parent", NULL };
    const char    *state[] = { "trace", "tracestate", NULL };

    ngx_memzero(tc, sizeof(ngx_http_agent_trace_t));

    v = yajl_tree_get(ev, traceparent, yajl_t_string);
    if (v == NULL) {
        return NGX_DECLINED;
    }

    s.data = (u_char *) v->u.string;
    s.len = ngx_strlen(v->u.string);

    if (ngx_http_agent_trace_parse(&s, tc) != NGX_OK) {
        return NGX_DECLINED;
    }

    /* the span a user_msg's traceparent names is the turn's own */

    ngx_memcpy(tc->span_id, tc->parent_id, NGX_HTTP_AGENT_SPAN_ID_LEN);
    tc->parent = 0;
    tc->valid = 1;

    v = yajl_tree_get(ev, parent, yajl_t_string);

    if (v) {
        s.data = (u_char *) v->u.string;
        s.len = ngx_strlen(v->u.string);

        tc->parent = ngx_http_agent_trace_hex(&s, tc->parent_id,
                                              NGX_HTTP_AGENT_SPAN_ID_LEN)
                     == NGX_OK;
    }

    v = yajl_tree_get(ev, state, yajl_t_string);

    if (v) {
        /* valid as long as the tree */
        tc->state.data = (u_char *) v->u.string;
        tc->state.len = ngx_strlen(v->u.string);
    }

    return NGX_OK;
}
