
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_STORE_ACK_H_INCLUDED_
#define _NGX_HTTP_AGENT_STORE_ACK_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_zone.h"


/* the write-behind's side of the inputs that wait for their write */

void ngx_http_agent_store_ack_init_process(void);

/* the other workers with inputs waiting for a write, into pids */
ngx_uint_t ngx_http_agent_store_acking_locked(ngx_http_agent_zone_t *z,
    ngx_pid_t *pids);

/* a batch now, unless one is on the pool (ngx_http_agent_store.c) */
void ngx_http_agent_store_kick_now(void);


#endif /* _NGX_HTTP_AGENT_STORE_ACK_H_INCLUDED_ */
