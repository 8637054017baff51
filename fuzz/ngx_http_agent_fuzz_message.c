
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The body of POST .../messages: ngx_http_agent_message_parse(), static
 * in src/api/ngx_http_agent_message.c, so the file is compiled into the
 * target (the library's copy of it is then never linked).  The body is
 * given as ngx_http_agent_json_body() gives it: in the request's pool,
 * NUL-terminated.  The parser uses r->pool and the module's main
 * configuration (no agent_trace: the fields carry no trace).
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

    static void                        *main_conf[1];
    static ngx_http_agent_main_conf_t   amcf;

    pool = ngx_http_agent_fuzz_pool();

    /* the module's main configuration, the only one, and empty */
    ngx_http_agent_module.ctx_index = 0;
    main_conf[0] = &amcf;

    ngx_memzero(&r, sizeof(ngx_http_request_t));
    r.pool = pool;
    r.main_conf = main_conf;

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
