/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_api.h"
#include "ngx_http_agent_conf.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_describe.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_message.h"
#include "ngx_http_agent_inspect.h"
#include "ngx_http_agent_zone_status.h"
#include "ngx_http_agent_prometheus.h"
#include "ngx_http_agent_variables.h"
#include "ngx_http_agent_events.h"
#include "ngx_http_agent_aisdk.h"
#include "ngx_http_agent_agui.h"
#include "ngx_http_agent_turn.h"
#include "ngx_http_agent_wake.h"
#include "ngx_http_agent_resolve.h"
#include "ngx_http_agent_expire.h"
#include "ngx_http_agent_cancel.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_fsm.h"
#include "ngx_http_agent_budget.h"
#include "ngx_http_agent_notify.h"
#include "ngx_http_agent_trace.h"
#include "ngx_http_agent_otlp.h"
#include "ngx_http_agent_summary.h"
#include "ngx_http_agent_list.h"
#include "ngx_http_agent_create.h"


static void *ngx_http_agent_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_agent_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_agent_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_agent_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_agent_select(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_describe(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_api(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_agui(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_merge_api(ngx_conf_t *cf,
    ngx_http_agent_loc_conf_t *conf);
static char *ngx_http_agent_identity(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_events_buffer_check(ngx_conf_t *cf, void *post,
    void *data);
static ngx_int_t ngx_http_agent_error_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_agent_postconfiguration(ngx_conf_t *cf);
static char *ngx_http_agent_trace(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_agent_trace_sample(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_agent_init_module(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_agent_init_process(ngx_cycle_t *cycle);
static void ngx_http_agent_exit_process(ngx_cycle_t *cycle);


/*
 * "agent" is both the http-level block that declares an agent and the
 * location-level directive that selects one: ngx_conf_handler() skips a
 * command whose context does not match, as it does for "server".
 */

/* nginx's own errors in an API location, as the module's JSON */

typedef struct {
    ngx_uint_t                    status;
    char                         *code;
    char                         *message;
} ngx_http_agent_http_error_t;


static ngx_http_agent_http_error_t  ngx_http_agent_http_errors[] = {
    { NGX_HTTP_BAD_REQUEST, "bad_request", "the request is malformed" },
    { NGX_HTTP_UNAUTHORIZED, "unauthorized", "authorization is required" },
    { NGX_HTTP_FORBIDDEN, "forbidden", "access is forbidden" },
    { NGX_HTTP_NOT_FOUND, "not_found", "not found" },
    { NGX_HTTP_NOT_ALLOWED, "method_not_allowed",
      "the method is not allowed" },
    { NGX_HTTP_REQUEST_TIME_OUT, "timeout",
      "the request was not received in time" },
    { NGX_HTTP_LENGTH_REQUIRED, "length_required",
      "the request body needs a length" },
    { NGX_HTTP_REQUEST_ENTITY_TOO_LARGE, "too_large",
      "the request body is larger than client_max_body_size" },
    { NGX_HTTP_INTERNAL_SERVER_ERROR, "internal_error", "internal error" },
    { NGX_HTTP_SERVICE_UNAVAILABLE, "unavailable",
      "the service is unavailable" },
    { 0, "http_error", "the request failed" }
};


static ngx_http_output_header_filter_pt  ngx_http_agent_next_header_filter;


static ngx_conf_post_t  ngx_http_agent_events_buffer_post =
    { ngx_http_agent_events_buffer_check };


static ngx_conf_enum_t  ngx_http_agent_busy[] = {
    { ngx_string("reject"), NGX_HTTP_AGENT_BUSY_REJECT },
    { ngx_string("queue"), NGX_HTTP_AGENT_BUSY_QUEUE },
    { ngx_string("interrupt"), NGX_HTTP_AGENT_BUSY_INTERRUPT },
    { ngx_null_string, 0 }
};


static ngx_command_t  ngx_http_agent_commands[] = {

    { ngx_string("agent_tool"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_BLOCK|NGX_CONF_TAKE1,
      ngx_http_agent_conf_tool_block,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_mcp"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_agent_conf_mcp,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_BLOCK|NGX_CONF_TAKE1,
      ngx_http_agent_conf_agent_block,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_agent_select,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_describe"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_describe,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE12,
      ngx_http_agent_zone_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_store"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_agent_store_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_node"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_agent_node_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_heartbeat"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, heartbeat),
      NULL },

    { ngx_string("agent_delta_interval"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, delta_interval),
      NULL },

    { ngx_string("agent_client_grace"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, client_grace),
      NULL },

    { ngx_string("agent_evict_idle"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, evict_idle),
      NULL },

    { ngx_string("agent_evict_awaiting"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, evict_awaiting),
      NULL },

    { ngx_string("agent_evict_unused"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, evict_unused),
      NULL },

    { ngx_string("agent_conversation"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, conversation),
      NULL },

    { ngx_string("agent_tool_call"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, tool_call),
      NULL },

    { ngx_string("agent_owner"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_agent_identity,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, owner),
      NULL },

    { ngx_string("agent_approver"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_agent_identity,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, approver),
      NULL },

    { ngx_string("agent_resolve"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_resolve_handler },

    { ngx_string("agent_busy"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, busy),
      &ngx_http_agent_busy },

    { ngx_string("agent_events_buffer"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, events_buffer),
      &ngx_http_agent_events_buffer_post },

    { ngx_string("agent_cancel"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_cancel_handler },

    { ngx_string("agent_message"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_message_handler },

    { ngx_string("agent_events"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_events_handler },

    { ngx_string("agent_aisdk"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_aisdk_handler },

    { ngx_string("agent_agui"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_agent_agui,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_agui_handler },

    { ngx_string("agent_inspect"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_api,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      ngx_http_agent_inspect_handler },

    { ngx_string("agent_budget_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_agent_budget_zone_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_budget"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_agent_budget_directive,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_agent_loc_conf_t, budgets),
      NULL },

    { ngx_string("agent_notify"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, notify),
      NULL },

    { ngx_string("agent_trace"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE12,
      ngx_http_agent_trace,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_trace_sample"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_agent_trace_sample,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, trace_sample),
      NULL },

    { ngx_string("agent_trace_content"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, trace_content),
      NULL },

    { ngx_string("agent_trace_buffer"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_agent_main_conf_t, trace_buffer),
      NULL },

    { ngx_string("agent_list"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_list,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_create"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_create,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_zone_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_zone_status,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("agent_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_agent_prometheus,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_agent_module_ctx = {
    ngx_http_agent_variables_add,          /* preconfiguration */
    ngx_http_agent_postconfiguration,      /* postconfiguration */

    ngx_http_agent_create_main_conf,       /* create main configuration */
    ngx_http_agent_init_main_conf,         /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_agent_create_loc_conf,        /* create location configuration */
    ngx_http_agent_merge_loc_conf          /* merge location configuration */
};


ngx_module_t  ngx_http_agent_module = {
    NGX_MODULE_V1,
    &ngx_http_agent_module_ctx,            /* module context */
    ngx_http_agent_commands,               /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    ngx_http_agent_init_module,            /* init module */
    ngx_http_agent_init_process,           /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_agent_exit_process,           /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static void *
ngx_http_agent_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_main_conf_t));
    if (amcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&amcf->tools, cf->pool, 8,
                       sizeof(ngx_http_agent_tool_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_array_init(&amcf->agents, cf->pool, 4, sizeof(ngx_http_agent_t *))
        != NGX_OK)
    {
        return NULL;
    }

    amcf->heartbeat = NGX_CONF_UNSET_MSEC;
    amcf->delta_interval = NGX_CONF_UNSET_MSEC;
    amcf->client_grace = NGX_CONF_UNSET_MSEC;
    amcf->evict_idle = NGX_CONF_UNSET_MSEC;
    amcf->evict_awaiting = NGX_CONF_UNSET_MSEC;
    amcf->evict_unused = NGX_CONF_UNSET_MSEC;
    amcf->trace_sample = NGX_CONF_UNSET_UINT;
    amcf->trace_content = NGX_CONF_UNSET;
    amcf->trace_buffer = NGX_CONF_UNSET_SIZE;

    return amcf;
}


/* the http block is parsed: agents may now name tools declared after them */

static char *
ngx_http_agent_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_agent_main_conf_t  *amcf = conf;

    ngx_conf_init_msec_value(amcf->heartbeat, 15000);
    if (amcf->delta_interval == NGX_CONF_UNSET_MSEC) {
        amcf->delta_interval = NGX_HTTP_AGENT_DELTA_AUTO;
        amcf->delta_auto = 1;
    }

    if (amcf->store && amcf->zone == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"agent_store\" needs an \"agent_zone\"");
        return NGX_CONF_ERROR;
    }

    if (amcf->store) {
        amcf->zone->store = 1;
    }
    ngx_conf_init_msec_value(amcf->client_grace, 5000);
    ngx_conf_init_msec_value(amcf->evict_idle, 600000);
    ngx_conf_init_msec_value(amcf->evict_awaiting, 3600000);
    ngx_conf_init_msec_value(amcf->evict_unused, 600000);
    ngx_conf_init_uint_value(amcf->trace_sample, NGX_HTTP_AGENT_TRACE_ONE);
    ngx_conf_init_value(amcf->trace_content, 0);
    ngx_conf_init_size_value(amcf->trace_buffer, 1024 * 1024);

    return ngx_http_agent_conf_resolve(cf, amcf);
}


static void *
ngx_http_agent_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_agent_loc_conf_t  *alcf;

    alcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_agent_loc_conf_t));
    if (alcf == NULL) {
        return NULL;
    }

    alcf->busy = NGX_CONF_UNSET_UINT;
    alcf->events_buffer = NGX_CONF_UNSET_SIZE;

    /*
     * set by ngx_pcalloc():
     *
     *     alcf->agent_name = { 0, NULL };
     *     alcf->agent = NULL;
     *     alcf->describe = 0;
     *     alcf->status = 0;
     *     alcf->api = NULL;
     *     alcf->conversation = NULL;
     *     alcf->owner = NULL;
     *     alcf->approver = NULL;
     */

    return alcf;
}


/*
 * Locations are merged after init_main_conf, so every agent is known here
 * wherever its block stands in the file.
 */

static char *
ngx_http_agent_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_agent_loc_conf_t *prev = parent;
    ngx_http_agent_loc_conf_t *conf = child;

    ngx_http_agent_main_conf_t  *amcf;

    if (conf->agent_name.data == NULL) {
        conf->agent_name = prev->agent_name;
        conf->agent = prev->agent;

    } else if (conf->agent == NULL) {
        amcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_agent_module);

        conf->agent = ngx_http_agent_conf_find(amcf, &conf->agent_name);

        if (conf->agent == NULL) {
            ngx_http_agent_conf_error(cf, conf->agent_file, conf->agent_line,
                                      "unknown agent \"%V\"",
                                      &conf->agent_name);
            return NGX_CONF_ERROR;
        }

        /* cf->ctx is the location's while it merges: a copy is kept */

        if (conf->agent->conf_ctx == NULL) {
            conf->agent->conf_ctx = ngx_palloc(cf->pool,
                                               sizeof(ngx_http_conf_ctx_t));
            if (conf->agent->conf_ctx == NULL) {
                return NGX_CONF_ERROR;
            }

            *conf->agent->conf_ctx = *(ngx_http_conf_ctx_t *) cf->ctx;
        }
    }

    if (conf->conversation == NULL) {
        conf->conversation = prev->conversation;
    }

    if (conf->tool_call == NULL) {
        conf->tool_call = prev->tool_call;
    }

    if (conf->owner == NULL) {
        conf->owner = prev->owner;
    }

    if (conf->approver == NULL) {
        conf->approver = prev->approver;
    }

    ngx_conf_merge_uint_value(conf->busy, prev->busy,
                              NGX_HTTP_AGENT_BUSY_REJECT);

    ngx_conf_merge_size_value(conf->events_buffer, prev->events_buffer,
                              1024 * 1024);

    if (ngx_http_agent_budget_merge(cf, &prev->budgets, &conf->budgets)
        != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (conf->api && ngx_http_agent_merge_api(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (conf->describe && conf->agent == NULL) {
        ngx_http_agent_conf_error(cf, conf->describe_file,
                                  conf->describe_line,
                                  "\"agent_describe\" needs an \"agent\" "
                                  "in the location");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * agent_owner, agent_approver: a complex value, or "off", which a
 * location uses to drop what it would inherit (an operator's location
 * that serves every owner)
 */

static char *
ngx_http_agent_identity(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    char  *p = conf;

    ngx_str_t                  *value;
    ngx_http_complex_value_t  **cv;

    cv = (ngx_http_complex_value_t **) (p + cmd->offset);

    if (*cv != NULL) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        *cv = &ngx_http_agent_api_off;
        return NGX_CONF_OK;
    }

    return ngx_http_set_complex_value_slot(cf, cmd, conf);
}


/* below a few frames, a stream could not make progress */

static char *
ngx_http_agent_events_buffer_check(ngx_conf_t *cf, void *post, void *data)
{
    size_t  *size = data;

    if (*size < 16 * 1024) {
        return "must be at least 16k";
    }

    return NGX_CONF_OK;
}


/* agent NAME; in a location */

static char *
ngx_http_agent_select(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_str_t  *value;

    if (alcf->agent_name.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    alcf->agent_name = value[1];
    alcf->agent_file = cf->conf_file->file.name.data;
    alcf->agent_line = cf->conf_file->line;

    return NGX_CONF_OK;
}


static char *
ngx_http_agent_describe(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    if (alcf->describe) {
        return "is duplicate";
    }

    alcf->describe = 1;
    alcf->describe_file = cf->conf_file->file.name.data;
    alcf->describe_line = cf->conf_file->line;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_agent_describe_handler;

    return NGX_CONF_OK;
}


/* agent_message; agent_events; agent_inspect; */

static char *
ngx_http_agent_api(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    ngx_http_core_loc_conf_t  *clcf;

    if (alcf->api || alcf->describe) {
        return "is duplicate";
    }

    alcf->api = (ngx_http_handler_pt) cmd->post;
    alcf->api_name = cmd->name;
    alcf->api_file = cf->conf_file->file.name.data;
    alcf->api_line = cf->conf_file->line;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = alcf->api;

    return NGX_CONF_OK;
}


/* agent_agui [client_tools=on|off]; */

static char *
ngx_http_agent_agui(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_loc_conf_t *alcf = conf;

    char       *rv;
    ngx_str_t  *value;

    rv = ngx_http_agent_api(cf, cmd, conf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    value = cf->args->elts;
    alcf->client_tools = 1;

    if (cf->args->nelts == 1
        || ngx_strcmp(value[1].data, "client_tools=on") == 0)
    {
        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value[1].data, "client_tools=off") == 0) {
        alcf->client_tools = 0;
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\", it must be "
                       "\"client_tools=on\" or \"client_tools=off\"",
                       &value[1]);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_agent_merge_api(ngx_conf_t *cf, ngx_http_agent_loc_conf_t *conf)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_agent_module);

    if (amcf->zone == NULL) {
        ngx_http_agent_conf_error(cf, conf->api_file, conf->api_line,
                                  "\"%V\" needs an \"agent_zone\"",
                                  &conf->api_name);
        return NGX_CONF_ERROR;
    }

    if (conf->agent == NULL) {
        ngx_http_agent_conf_error(cf, conf->api_file, conf->api_line,
                                  "\"%V\" needs an \"agent\" in the location",
                                  &conf->api_name);
        return NGX_CONF_ERROR;
    }

    /*
     * agent_aisdk and agent_agui take the chat's or thread's id when
     * there is no agent_conversation
     */

    if (conf->conversation == NULL
        && conf->api != ngx_http_agent_aisdk_handler
        && conf->api != ngx_http_agent_agui_handler
        && conf->api != ngx_http_agent_list_handler
        && conf->api != ngx_http_agent_create_handler)
    {
        ngx_http_agent_conf_error(cf, conf->api_file, conf->api_line,
                                  "\"%V\" needs an \"agent_conversation\"",
                                  &conf->api_name);
        return NGX_CONF_ERROR;
    }

    if (conf->api == ngx_http_agent_resolve_handler
        && conf->tool_call == NULL)
    {
        ngx_http_agent_conf_error(cf, conf->api_file, conf->api_line,
                                  "\"%V\" needs an \"agent_tool_call\"",
                                  &conf->api_name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_agent_postconfiguration(ngx_conf_t *cf)
{
    ngx_http_agent_main_conf_t  *amcf;

    if (ngx_http_agent_turn_init_filters(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_agent_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_agent_error_filter;

    if (ngx_http_agent_notify_init_filters(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_summary_init_filters(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    /* the lower layers' hooks into the ones above */

    ngx_http_agent_zone_kick = ngx_http_agent_store_kick;
    ngx_http_agent_wake_handlers.deliver = ngx_http_agent_events_deliver;
    ngx_http_agent_wake_handlers.cancel = ngx_http_agent_turn_cancel;
    ngx_http_agent_wake_handlers.shutdown = ngx_http_agent_events_shutdown;
    ngx_http_agent_wake_handlers.written = ngx_http_agent_store_ack_wake;
    ngx_http_agent_fsm_next = ngx_http_agent_turn_next;
    ngx_http_agent_store_revive = ngx_http_agent_revive;
    ngx_http_agent_store_lost = ngx_http_agent_revive_lost;
    ngx_http_agent_store_lease = ngx_http_agent_revive_lease;

    amcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_agent_module);

    ngx_http_agent_trace_ended_locked = amcf->trace.len
                                        ? ngx_http_agent_otlp_ended_locked
                                        : NULL;

    return NGX_OK;
}


/*
 * Errors nginx answers itself in an API location (a body over
 * client_max_body_size, found from Content-Length before any handler
 * runs or in a chunked body as it is read; a malformed body; a timeout;
 * access rules) would be its HTML page: the API answers JSON, errors
 * included.  The page's header is made the JSON's, the JSON goes out
 * here, and header_only keeps the HTML page from following it.
 */

static ngx_int_t
ngx_http_agent_error_filter(ngx_http_request_t *r)
{
    u_char                       *p;
    size_t                        len;
    ngx_int_t                     rc;
    ngx_buf_t                    *b;
    ngx_chain_t                   out;
    ngx_http_agent_loc_conf_t    *alcf;
    ngx_http_agent_http_error_t  *e;

    if (r != r->main
        || r->err_status < NGX_HTTP_BAD_REQUEST
        || r->headers_out.content_type.len != sizeof("text/html") - 1
        || ngx_strncmp(r->headers_out.content_type.data, "text/html",
                       sizeof("text/html") - 1)
           != 0)
    {
        return ngx_http_agent_next_header_filter(r);
    }

    alcf = ngx_http_get_module_loc_conf(r, ngx_http_agent_module);

    if (alcf == NULL
        || (alcf->api == NULL && !alcf->describe && !alcf->status))
    {
        return ngx_http_agent_next_header_filter(r);
    }

    for (e = ngx_http_agent_http_errors; e->status; e++) {
        if (e->status == r->err_status) {
            break;
        }
    }

    len = sizeof("{\"error\":{\"code\":\"\",\"message\":\"\"}}\n") - 1
          + ngx_strlen(e->code) + ngx_strlen(e->message);

    p = ngx_pnalloc(r->pool, len);
    b = ngx_calloc_buf(r->pool);

    if (p == NULL || b == NULL) {
        return NGX_ERROR;
    }

    b->pos = p;
    b->last = ngx_sprintf(p, "{\"error\":{\"code\":\"%s\","
                          "\"message\":\"%s\"}}\n", e->code, e->message);
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    r->headers_out.content_type_len = sizeof("application/json") - 1;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = b->last - b->pos;

    rc = ngx_http_agent_next_header_filter(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    if (ngx_http_output_filter(r, &out) == NGX_ERROR) {
        return NGX_ERROR;
    }

    r->header_only = 1;

    return rc;
}


/* agent_trace uri [service=name] */

static char *
ngx_http_agent_trace(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t  *amcf = conf;

    ngx_str_t  *value;

    if (amcf->trace.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0) {
        return "has an empty uri";
    }

    amcf->trace = value[1];
    ngx_str_set(&amcf->trace_service, "nginx");

    if (cf->args->nelts == 2) {
        return NGX_CONF_OK;
    }

    if (value[2].len <= sizeof("service=") - 1
        || ngx_strncmp(value[2].data, "service=", sizeof("service=") - 1)
           != 0
        || ngx_http_agent_json_utf8(&value[2]) != NGX_OK)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" of \"agent_trace\": "
                           "service=name expected", &value[2]);
        return NGX_CONF_ERROR;
    }

    amcf->trace_service.data = value[2].data + sizeof("service=") - 1;
    amcf->trace_service.len = value[2].len - (sizeof("service=") - 1);

    return NGX_CONF_OK;
}


/* agent_trace_sample ratio: from 0 to 1, kept in millionths */

static char *
ngx_http_agent_trace_sample(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_agent_main_conf_t  *amcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;

    if (amcf->trace_sample != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    n = ngx_atofp(value[1].data, value[1].len, 6);

    if (n == NGX_ERROR || n > NGX_HTTP_AGENT_TRACE_ONE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"agent_trace_sample\" must be a number from "
                           "0 to 1, not \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    amcf->trace_sample = n;

    return NGX_CONF_OK;
}


/* in the master, as the configuration is loaded: which build runs */

static ngx_int_t
ngx_http_agent_init_module(ngx_cycle_t *cycle)
{
    ngx_log_error(NGX_LOG_NOTICE, cycle->log, 0,
                  "agent module " NGX_HTTP_AGENT_VERSION);

    return ngx_http_agent_store_init_module(cycle);
}


static ngx_int_t
ngx_http_agent_init_process(ngx_cycle_t *cycle)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);

    if (amcf == NULL || amcf->zone == NULL) {
        return NGX_OK;
    }

    if (ngx_http_agent_expire_init_process(cycle) != NGX_OK
        || ngx_http_agent_prometheus_init_process(cycle) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (amcf->store && ngx_http_agent_store_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_notify_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_agent_wake_init_process(cycle);
}


static void
ngx_http_agent_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_agent_main_conf_t  *amcf;

    amcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_agent_module);

    if (amcf == NULL || amcf->zone == NULL) {
        return;
    }

    ngx_http_agent_wake_exit_process(cycle);

    if (amcf->trace.len) {
        ngx_http_agent_otlp_exit(cycle->log);
    }

    if (amcf->store) {
        ngx_http_agent_store_exit_process(cycle);
    }
}


