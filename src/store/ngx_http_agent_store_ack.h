
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_ACK_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_ACK_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_zone.h"


/* between the write-behind and the inputs that wait for their write */

void ngx_http_agent_store_ack_init_process(void);

/* a batch now, unless one is on the pool (ngx_http_agent_store.c) */
void ngx_http_agent_store_kick_now(void);

/* the same, within delay ms: for inputs that may join it */
void ngx_http_agent_store_kick_within(ngx_msec_t delay);


#endif /* _NGX_HTTP_AGENT_STORE_ACK_H_INCLUDED_ */
