
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The body of POST .../tool_calls/{id} (a result, or a decision):
 * ngx_http_agent_resolve_parse(), static in src/api/ngx_http_agent_resolve.c,
 * so the file is compiled into the target (the library's copy of it is
 * then never linked).  The body is given as ngx_http_agent_json_body()
 * gives it: in the request's pool, NUL-terminated.  The parser only uses
 * r->pool.
 *
 * Checks: a body is never an internal error; when it is taken (no
 * reason to refuse it), the result is a JSON text and the args a JSON
 * object, as they go into the log.
 */


#include "ngx_http_agent_resolve.c"

#include "ngx_http_agent_fuzz.h"


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char                         *err;
    ngx_int_t                     rc;
    ngx_str_t                     body;
    ngx_pool_t                   *pool;
    ngx_http_request_t            r;
    ngx_http_agent_resolution_t   res;

    pool = ngx_http_agent_fuzz_pool();

    ngx_memzero(&r, sizeof(ngx_http_request_t));
    r.pool = pool;

    body.data = ngx_http_agent_fuzz_copy(pool, data, size);
    body.len = size;

    ngx_memzero(&res, sizeof(ngx_http_agent_resolution_t));
    err = NULL;

    rc = ngx_http_agent_resolve_parse(&r, &body, &res, &err);

    if (rc != NGX_OK) {
        ngx_http_agent_fuzz_fail("a resolution body is an internal error",
                                 body.data, body.len);
    }

    if (err) {
        (void) ngx_http_agent_fuzz_hash(0, (u_char *) err, ngx_strlen(err));

    } else {
        if (res.has_result) {
            ngx_http_agent_fuzz_json(res.result.data, res.result.len,
                                     "a resolution's result is not JSON");
        }

        if (res.args.data) {
            ngx_http_agent_fuzz_json(res.args.data, res.args.len,
                                     "a resolution's args are not JSON");
        }

        (void) ngx_http_agent_fuzz_hash(0, res.reason.data, res.reason.len);
        (void) ngx_http_agent_fuzz_hash(0, res.decision.data,
                                        res.decision.len);
    }

    ngx_destroy_pool(pool);

    return 0;
}
