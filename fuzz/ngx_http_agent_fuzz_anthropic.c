
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_fuzz.h"


/*
 * The Anthropic Messages adapter's stream parser
 * (src/provider/ngx_http_agent_anthropic.c: its init, feed and finish,
 * with the SSE parser under them), as ngx_http_agent_fuzz_provider.c
 * drives and checks it.
 */


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return ngx_http_agent_fuzz_provider(&ngx_http_agent_anthropic_messages,
                                        data, size);
}
