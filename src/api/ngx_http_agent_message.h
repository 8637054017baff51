
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_MESSAGE_H_INCLUDED_
#define _NGX_HTTP_AGENT_MESSAGE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


#include "ngx_http_agent_zone.h"


/* a conversation takes at most this many messages waiting for a turn */
#define NGX_HTTP_AGENT_QUEUE_MAX  16


ngx_int_t ngx_http_agent_message_handler(ngx_http_request_t *r);



#endif /* _NGX_HTTP_AGENT_MESSAGE_H_INCLUDED_ */
