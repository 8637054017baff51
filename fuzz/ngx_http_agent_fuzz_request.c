
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_fuzz.h"


/*
 * The log read back into a provider request: each adapter's
 * build_request(), the walk of src/provider/ngx_http_agent_request.c with
 * the functions of its format (ngx_http_agent_openai_chat.c,
 * ngx_http_agent_anthropic_request.c,
 * ngx_http_agent_openai_responses_request.c),
 * over canonical events, each parsed by ngx_http_agent_provider_event().
 * The events are what the log holds, and the log holds what came from
 * outside: message contents, tool results, provider_content verbatim.
 *
 * Byte 0: bits 0-1 choose the adapter (3 is openai_chat again), bit 2
 * gives the agent a system prompt.  The rest is the events, one a line,
 * as the log has them.  A request that is rendered must be JSON.
 */


#define NGX_HTTP_AGENT_FUZZ_EVENTS  64


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char                     *p, *last, *lf;
    ngx_str_t                   events[NGX_HTTP_AGENT_FUZZ_EVENTS], body;
    ngx_uint_t                  n;
    ngx_pool_t                 *pool;
    ngx_http_agent_t            agent;
    ngx_http_agent_provider_t  *provider;

    if (size == 0) {
        return 0;
    }

    provider = ngx_http_agent_providers[(data[0] & 0x03) % 3];

    pool = ngx_http_agent_fuzz_pool();

    ngx_memzero(&agent, sizeof(ngx_http_agent_t));

    ngx_str_set(&agent.name, "fuzz");
    ngx_str_set(&agent.model, "model-fuzz");
    agent.provider = provider;

    if (data[0] & 0x04) {
        ngx_str_set(&agent.system, "You are fuzzed.");
    }

    if (ngx_array_init(&agent.tools, pool, 1,
                       sizeof(ngx_http_agent_tool_ref_t))
        != NGX_OK)
    {
        abort();
    }

    p = ngx_http_agent_fuzz_copy(pool, data + 1, size - 1);
    last = p + size - 1;

    for (n = 0; p < last && n < NGX_HTTP_AGENT_FUZZ_EVENTS; n++) {
        lf = ngx_strlchr(p, last, LF);
        if (lf == NULL) {
            lf = last;
        }

        /* not NUL-terminated, as in the zone: a read past it is caught */

        events[n].len = lf - p;
        events[n].data = ngx_pnalloc(pool, ngx_max(events[n].len, 1));
        if (events[n].data == NULL) {
            abort();
        }

        ngx_memcpy(events[n].data, p, events[n].len);

        p = lf + 1;
    }

    if (provider->build_request(pool, &agent, events, n, &body) == NGX_OK) {
        ngx_http_agent_fuzz_json(body.data, body.len,
                                 "a provider request is not JSON");
    }

    ngx_destroy_pool(pool);

    return 0;
}
