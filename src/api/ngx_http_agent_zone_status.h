
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_ZONE_STATUS_H_INCLUDED_
#define _NGX_HTTP_AGENT_ZONE_STATUS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_zone.h"


/* agent_zone_status: the zone's use, as JSON, for monitoring and sizing */
char *ngx_http_agent_zone_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* a GET of a status page: NGX_OK with the zone, or what to return */
ngx_int_t ngx_http_agent_zone_status_request(ngx_http_request_t *r,
    ngx_http_agent_zone_t **zp, ngx_int_t *rc);


#endif /* _NGX_HTTP_AGENT_ZONE_STATUS_H_INCLUDED_ */
