
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_API_H_INCLUDED_
#define _NGX_HTTP_AGENT_API_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_zone.h"


/*
 * The method and the conversation id.  NGX_OK: go on with id; NGX_DONE:
 * an error answer is sent and *rc is what the handler returns.
 */
ngx_int_t ngx_http_agent_api_request(ngx_http_request_t *r,
    ngx_uint_t methods, char *allow, ngx_str_t *id, ngx_int_t *rc);

ngx_int_t ngx_http_agent_api_conversation_id(ngx_http_request_t *r,
    ngx_str_t *id);
ngx_int_t ngx_http_agent_api_tool_call_id(ngx_http_request_t *r,
    ngx_str_t *id);

/* NGX_OK: id is a valid id (of a conversation or a call) */
ngx_int_t ngx_http_agent_api_id_check(ngx_str_t *id);

/* the name of the agent the location serves */
ngx_str_t *ngx_http_agent_api_agent(ngx_http_request_t *r);

/*
 * who the request acts for, who approves: NGX_OK, *value NULL where
 * agent_owner, agent_approver is not set; NGX_DECLINED: set but empty,
 * answered by ngx_http_agent_api_anonymous()
 */
ngx_int_t ngx_http_agent_api_owner(ngx_http_request_t *r, ngx_str_t **owner);

/* agent_owner off, agent_approver off */
extern ngx_http_complex_value_t  ngx_http_agent_api_off;

ngx_int_t ngx_http_agent_api_approver(ngx_http_request_t *r,
    ngx_str_t **approver);
ngx_int_t ngx_http_agent_api_anonymous(ngx_http_request_t *r);

/* the owner; NGX_DONE: *rc is what the handler returns (401 answered) */
ngx_int_t ngx_http_agent_api_owner_check(ngx_http_request_t *r,
    ngx_str_t **owner, ngx_int_t *rc);

/* the answer for a conversation of another agent: as an unknown one */
ngx_int_t ngx_http_agent_api_foreign(ngx_http_request_t *r);

/* the conversation, zone locked; NULL: answered, unlocked, *rc set */
ngx_http_agent_conv_t *ngx_http_agent_api_conv_lock(ngx_http_request_t *r,
    ngx_http_agent_zone_t *z, ngx_str_t *id, ngx_int_t *rc);


/* a new conversation, zone locked; NULL: no room, unlocked, *rc set */
ngx_http_agent_conv_t *ngx_http_agent_api_conv_create_locked(
    ngx_http_request_t *r, ngx_http_agent_zone_t *z, ngx_str_t *id,
    ngx_int_t *rc);

/* agent_list, agent_create...: the location's handler */
char *ngx_http_agent_api_set(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_agent_loc_conf_t *alcf, ngx_http_handler_pt handler);


#endif /* _NGX_HTTP_AGENT_API_H_INCLUDED_ */
