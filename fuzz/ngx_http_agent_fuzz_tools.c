
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The output of a server tool's location, as the turn's body filter
 * hands it over: ngx_http_agent_tools_body() in the input's pieces, then
 * ngx_http_agent_tools_done() as when the subrequest ends.  That covers,
 * in src/turn/ngx_http_agent_tools.c:
 *
 *   a plain tool      the body gathered, then ngx_http_agent_tools_result()
 *                     (the body as JSON when it is, as text otherwise,
 *                     ngx_http_agent_json_utf8_fix())
 *   a streaming tool  the NDJSON lines: ngx_http_agent_tools_stream(),
 *                     _line(), _progress(), _outcome(), _stream_end()
 *
 * Most of these are static, so the file is compiled into the target (the
 * library's copy of it is then never linked).  ngx_http_agent_emit() is
 * replaced at link time (-Wl,--wrap, see the Makefile) by a check of
 * what would go into the log or to subscribers: one line of JSON that
 * reads back where the log is read (the log's depth limit).
 *
 * The target's flags (bits 4-7 of byte 0):
 *
 *     bit 0        the tool streams (NDJSON)
 *     bit 1        the location answered 502, not 200
 *     bit 2        the subrequest ended in an error (NGX_ERROR)
 */


#include "ngx_http_agent_tools.c"

#include "ngx_http_agent_fuzz.h"


ngx_int_t __wrap_ngx_http_agent_emit(ngx_http_agent_zone_t *zone,
    ngx_str_t *id, ngx_uint_t type, ngx_str_t *fields);


static ngx_uint_t  ngx_http_agent_fuzz_results;


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char                      *p, *last;
    ngx_int_t                    rc;
    ngx_buf_t                    b;
    ngx_pool_t                  *pool;
    ngx_chain_t                  cl;
    ngx_http_request_t           r;
    ngx_http_agent_call_t       *call;
    ngx_http_agent_tool_t        tool;
    ngx_http_agent_turn_t       *t;
    ngx_http_agent_fuzz_cuts_t   cuts;

    ngx_http_agent_fuzz_cuts_init(&cuts, data, size);

    pool = ngx_http_agent_fuzz_pool();

    t = ngx_pcalloc(pool, sizeof(ngx_http_agent_turn_t));
    call = ngx_pcalloc(pool, sizeof(ngx_http_agent_call_t));

    if (t == NULL || call == NULL) {
        abort();
    }

    t->pool = pool;
    t->log = *ngx_http_agent_fuzz_log;
    ngx_str_set(&t->id, "conv-fuzz");

    /* the turn goes on when its last call ends: not here */
    t->running = 2;

    ngx_memzero(&tool, sizeof(ngx_http_agent_tool_t));
    ngx_str_set(&tool.name, "fuzz_tool");
    tool.streaming = cuts.flags & 0x01;

    call->sub.kind = NGX_HTTP_AGENT_SUB_TOOL;
    call->turn = t;
    call->tool = &tool;
    ngx_str_set(&call->id, "call_fuzz");
    ngx_str_set(&call->name, "fuzz_tool");
    call->status = (cuts.flags & 0x02) ? NGX_HTTP_BAD_GATEWAY : NGX_HTTP_OK;

    ngx_memzero(&r, sizeof(ngx_http_request_t));
    r.pool = pool;

    ngx_http_agent_fuzz_results = 0;

    while (ngx_http_agent_fuzz_cuts_next(&cuts, &p, &last) == NGX_OK) {
        ngx_memzero(&b, sizeof(ngx_buf_t));
        b.pos = p;
        b.last = last;
        b.start = p;
        b.end = last;
        b.memory = 1;

        cl.buf = &b;
        cl.next = NULL;

        if (ngx_http_agent_tools_body(&r, &call->sub, &cl) != NGX_OK) {
            break;
        }

        if (b.pos != b.last) {
            ngx_http_agent_fuzz_fail("a tool's output left unread",
                                     NULL, 0);
        }
    }

    ngx_http_agent_fuzz_cuts_rewind(&cuts, 0);

    rc = (cuts.flags & 0x04) ? NGX_ERROR : NGX_OK;

    (void) ngx_http_agent_tools_done(&r, call, rc);

    if (ngx_http_agent_fuzz_results != 1) {
        ngx_http_agent_fuzz_fail("a tool call did not end with one result",
                                 NULL, 0);
    }

    ngx_destroy_pool(pool);

    return 0;
}


ngx_int_t
__wrap_ngx_http_agent_emit(ngx_http_agent_zone_t *zone, ngx_str_t *id,
    ngx_uint_t type, ngx_str_t *fields)
{
    u_char    *p;
    yajl_val   v;

    if (type == NGX_HTTP_AGENT_EV_TOOL_RESULT) {
        ngx_http_agent_fuzz_results++;
    }

    if (ngx_strlchr(fields->data, fields->data + fields->len, LF) != NULL
        || ngx_strlchr(fields->data, fields->data + fields->len, CR) != NULL)
    {
        ngx_http_agent_fuzz_fail("an event holds a raw line break",
                                 fields->data, fields->len);
    }

    ngx_http_agent_fuzz_json(fields->data, fields->len,
                             "an event is not JSON");

    p = ngx_alloc(fields->len + 1, ngx_http_agent_fuzz_log);
    if (p == NULL) {
        abort();
    }

    ngx_memcpy(p, fields->data, fields->len);
    p[fields->len] = '\0';

    v = ngx_http_agent_provider_parse_log(ngx_http_agent_fuzz_log, p,
                                          fields->len);
    ngx_free(p);

    if (v == NULL) {
        ngx_http_agent_fuzz_fail("an event cannot be read back from the log",
                                 fields->data, fields->len);
    }

    ngx_http_agent_json_free(v);

    return NGX_OK;
}
