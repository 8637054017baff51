
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_PROMETHEUS_H_INCLUDED_
#define _NGX_HTTP_AGENT_PROMETHEUS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* agent_metrics: the zone's counters in Prometheus' text format */
char *ngx_http_agent_prometheus(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* the configuration's agents and tools get their counters in the zone */
ngx_int_t ngx_http_agent_prometheus_init_process(ngx_cycle_t *cycle);


#endif /* _NGX_HTTP_AGENT_PROMETHEUS_H_INCLUDED_ */
