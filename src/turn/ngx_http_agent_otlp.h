
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_OTLP_H_INCLUDED_
#define _NGX_HTTP_AGENT_OTLP_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"


/* a turn ended: its spans are queued for the collector (zone locked) */
void ngx_http_agent_otlp_ended_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_event_t *ev);

/* a worker that exits: the spans not sent are dropped and counted */
void ngx_http_agent_otlp_exit(ngx_log_t *log);


#endif /* _NGX_HTTP_AGENT_OTLP_H_INCLUDED_ */
