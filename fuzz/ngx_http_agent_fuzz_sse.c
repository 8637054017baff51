
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_sse.h"
#include "ngx_http_agent_fuzz.h"


/*
 * The SSE parser (src/provider/ngx_http_agent_sse.c): ngx_http_agent_sse_create()
 * and ngx_http_agent_sse_feed(), the stream fed in the pieces of the
 * input's header (see ngx_http_agent_fuzz.h), then fed again whole into
 * a new parser.  The two must see the same events, in the same order,
 * and end the same way: where a stream is cut must not matter.
 *
 * The target's flags (bits 4-7 of byte 0):
 *
 *     bit 0        the line and event limit is 4 KiB instead of 1 MiB,
 *                  so that inputs of fuzzing size reach it
 *     bits 1-3     the handler fails the Nth event (0: none); every
 *                  later feed must fail too
 */


typedef struct {
    uint64_t                  hash;
    ngx_uint_t                events;
    ngx_uint_t                fail;
    ngx_int_t                 rc;
} ngx_http_agent_fuzz_sse_t;


static void ngx_http_agent_fuzz_sse_run(ngx_http_agent_fuzz_cuts_t *cuts,
    ngx_uint_t whole, ngx_http_agent_fuzz_sse_t *run);
static ngx_int_t ngx_http_agent_fuzz_sse_event(void *ctx, ngx_str_t *event,
    ngx_str_t *data);


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ngx_http_agent_fuzz_sse_t   cut, whole;
    ngx_http_agent_fuzz_cuts_t  cuts;

    ngx_http_agent_fuzz_cuts_init(&cuts, data, size);

    ngx_http_agent_fuzz_sse_run(&cuts, 0, &cut);
    ngx_http_agent_fuzz_sse_run(&cuts, 1, &whole);

    if (cut.rc != whole.rc || cut.events != whole.events
        || cut.hash != whole.hash)
    {
        ngx_http_agent_fuzz_fail("the events depend on where the stream "
                                 "is cut", NULL, 0);
    }

    return 0;
}


static void
ngx_http_agent_fuzz_sse_run(ngx_http_agent_fuzz_cuts_t *cuts,
    ngx_uint_t whole, ngx_http_agent_fuzz_sse_t *run)
{
    u_char                *p, *last;
    ngx_pool_t            *pool;
    ngx_http_agent_sse_t  *sse;

    ngx_memzero(run, sizeof(ngx_http_agent_fuzz_sse_t));

    run->hash = NGX_HTTP_AGENT_FUZZ_HASH;
    run->fail = (cuts->flags >> 1) & 0x07;
    run->rc = NGX_OK;

    pool = ngx_http_agent_fuzz_pool();

    sse = ngx_http_agent_sse_create(pool, ngx_http_agent_fuzz_log,
                                    ngx_http_agent_fuzz_sse_event, run);
    if (sse == NULL) {
        abort();
    }

    if (cuts->flags & 0x01) {
        sse->max = 4096;
    }

    ngx_http_agent_fuzz_cuts_rewind(cuts, whole);

    while (ngx_http_agent_fuzz_cuts_next(cuts, &p, &last) == NGX_OK) {

        if (ngx_http_agent_sse_feed(sse, p, last) == NGX_OK) {
            if (run->rc != NGX_OK) {
                ngx_http_agent_fuzz_fail("a feed after a failed one "
                                         "succeeded", NULL, 0);
            }

            continue;
        }

        run->rc = NGX_ERROR;
    }

    ngx_destroy_pool(pool);
}


static ngx_int_t
ngx_http_agent_fuzz_sse_event(void *ctx, ngx_str_t *event, ngx_str_t *data)
{
    ngx_http_agent_fuzz_sse_t  *run = ctx;

    if (run->rc != NGX_OK) {
        ngx_http_agent_fuzz_fail("an event after the stream failed",
                                 NULL, 0);
    }

    if (data->data[data->len] != '\0') {
        ngx_http_agent_fuzz_fail("the data of an event is not "
                                 "NUL-terminated", data->data, data->len);
    }

    run->hash = ngx_http_agent_fuzz_hash(run->hash, event->data, event->len);
    run->hash = ngx_http_agent_fuzz_hash(run->hash, data->data, data->len);

    if (++run->events == run->fail) {
        return NGX_ERROR;
    }

    return NGX_OK;
}
