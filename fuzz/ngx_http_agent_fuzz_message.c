
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The body of POST .../messages: ngx_http_agent_message_parse(), static
 * in src/api/ngx_http_agent_message.c, so the file is compiled into the
 * target (the library's copy of it is then never linked).  The body is
 * given as ngx_http_agent_json_body() gives it: in the request's pool,
 * NUL-terminated.  The parser only uses r->pool.
 *
 * Checks: the body is taken (NGX_OK, and the fields of the user_msg
 * event are a JSON object) or refused with a reason (NGX_DECLINED); a
 * body is never an internal error.
 */


#include "ngx_http_agent_message.c"

#include "ngx_http_agent_fuzz.h"


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char                      *err;
    ngx_int_t                  rc;
    ngx_str_t                  body;
    ngx_pool_t                *pool;
    ngx_http_request_t         r;
    ngx_http_agent_message_t   msg;

    pool = ngx_http_agent_fuzz_pool();

    ngx_memzero(&r, sizeof(ngx_http_request_t));
    r.pool = pool;

    body.data = ngx_http_agent_fuzz_copy(pool, data, size);
    body.len = size;

    ngx_memzero(&msg, sizeof(ngx_http_agent_message_t));
    err = NULL;

    rc = ngx_http_agent_message_parse(&r, &body, &msg, &err);

    switch (rc) {

    case NGX_OK:
        if (msg.content.len == 0) {
            ngx_http_agent_fuzz_fail("a message without content taken",
                                     body.data, body.len);
        }

        ngx_http_agent_fuzz_json(msg.fields.data, msg.fields.len,
                                 "the fields of a user_msg are not JSON");
        break;

    case NGX_DECLINED:
        if (err == NULL) {
            ngx_http_agent_fuzz_fail("a body refused without a reason",
                                     body.data, body.len);
        }

        (void) ngx_http_agent_fuzz_hash(0, (u_char *) err, ngx_strlen(err));
        break;

    default:
        ngx_http_agent_fuzz_fail("a message body is an internal error",
                                 body.data, body.len);
    }

    ngx_destroy_pool(pool);

    return 0;
}
