
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
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_revive.h"
#include "ngx_http_agent_inspect.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_partial.h"


#define NGX_HTTP_AGENT_PAGE      100
#define NGX_HTTP_AGENT_PAGE_MAX  1000


/* a call of the last batch, as the log tells it */
typedef struct {
    ngx_str_t                     id;
    ngx_str_t                     name;
} ngx_http_agent_inspect_call_t;


static ngx_int_t ngx_http_agent_inspect_arg(ngx_http_request_t *r,
    char *name, size_t len, ngx_int_t def, ngx_int_t *value);
static ngx_int_t ngx_http_agent_inspect_pending_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_str_t *out);
static ngx_int_t ngx_http_agent_inspect_running_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_str_t *out);
static ngx_int_t ngx_http_agent_inspect_call(ngx_http_request_t *r,
    ngx_http_agent_bytes_t *scratch, ngx_http_agent_event_t *ev,
    ngx_array_t *calls);
static ngx_uint_t ngx_http_agent_inspect_has(ngx_array_t *calls,
    ngx_str_t *id);


/*
 * GET: the conversation's state, the calls that wait (pending) and the
 * server calls that run (in_flight_tools), the reply so far of a model
 * call that streams (streaming_message), and its messages, paged by
 * seq: ?after=SEQ&limit=N, with next_after while more follow.  The
 * events are the log's own JSON.
 */

ngx_int_t
ngx_http_agent_inspect_handler(ngx_http_request_t *r)
{
    u_char                      *p;
    size_t                       len, partial;
    uint64_t                     last, upto, seq;
    ngx_int_t                    rc, after, limit;
    ngx_str_t                    id, json, pending, running;
    ngx_uint_t                   n, i;
    ngx_http_agent_zone_t       *z;
    ngx_http_agent_conv_t       *conv;
    ngx_http_agent_event_t     **evs;
    ngx_http_agent_main_conf_t  *amcf;
    ngx_http_agent_revive_ctx_t *ctx;

    if (ngx_http_agent_api_request(r, NGX_HTTP_GET|NGX_HTTP_HEAD,
                                   "GET, HEAD", &id, &rc)
        != NGX_OK)
    {
        return rc;
    }

    if (ngx_http_agent_inspect_arg(r, "after", 5, 0, &after) != NGX_OK
        || ngx_http_agent_inspect_arg(r, "limit", 5, NGX_HTTP_AGENT_PAGE,
                                      &limit)
           != NGX_OK
        || limit == 0 || limit > NGX_HTTP_AGENT_PAGE_MAX)
    {
        return ngx_http_agent_json_error(r, NGX_HTTP_BAD_REQUEST,
                                         "invalid_argument",
                                         "after must be a seq and limit "
                                         "1 to 1000");
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_arg(r, (u_char *) "view", 4, &json) == NGX_OK) {
        return ngx_http_agent_inspect_view(r, &id, &json, after, limit);
    }

    evs = ngx_palloc(r->pool, limit * sizeof(ngx_http_agent_event_t *));
    if (evs == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    amcf = ngx_http_get_module_main_conf(r, ngx_http_agent_module);
    z = amcf->zone;

    conv = ngx_http_agent_api_conv_lock(r, z, &id, &rc);
    if (conv == NULL) {
        return rc;
    }

    /* a cursor past the log's end is its end: no later event is skipped */

    if ((uint64_t) after > conv->seq) {
        after = conv->seq;
    }

    if (ngx_http_agent_inspect_pending_locked(r, conv, &pending) != NGX_OK
        || ngx_http_agent_inspect_running_locked(r, conv, &running)
           != NGX_OK)
    {
        ngx_http_agent_zone_unlock(z);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    /* a page older than the zone's log comes from the store */

    n = 0;

    if ((uint64_t) after < conv->base) {
        upto = ngx_min(conv->base, (uint64_t) (after + limit));
        ctx = ngx_http_agent_revive_ctx(r);

        if (ctx == NULL || ctx->nhistory == 0
            || ctx->after != (uint64_t) after || ctx->upto != upto)
        {
            ngx_http_agent_zone_unlock(z);
            return ngx_http_agent_revive_history(r, &id, after, upto);
        }

        for (n = 0; n < ctx->nhistory && n < (ngx_uint_t) limit; n++) {
            evs[n] = ctx->history[n];
        }

        after = upto;
    }

    n += ngx_http_agent_log_after_locked(conv, after, evs + n, limit - n);

    partial = ngx_http_agent_partial_size_locked(conv);

    len = sizeof("{\"conversation\":\"\",\"state\":\"\",\"turn\":,"
                 "\"last_seq\":,\"lease\":,\"pending\":,"
                 "\"in_flight_tools\":,\"streaming_message\":{},"
                 "\"messages\":[],\"next_after\":}")
          + id.len + 16 + 3 * NGX_INT64_LEN + NGX_INT_T_LEN
          + pending.len + running.len + partial;

    for (i = 0; i < n; i++) {
        len += evs[i]->len + 1;
    }

    json.data = ngx_pnalloc(r->pool, len);
    if (json.data == NULL) {
        ngx_http_agent_zone_unlock(z);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_sprintf(json.data,
                    "{\"conversation\":\"%V\",\"state\":\"%V\","
                    "\"turn\":%ui,\"last_seq\":%uL,\"lease\":",
                    &id, &ngx_http_agent_state_names[conv->state],
                    conv->turn, conv->seq);

    p = conv->lease ? ngx_sprintf(p, "%P", conv->lease)
                    : ngx_cpymem(p, "null", 4);

    p = ngx_sprintf(p, ",\"pending\":%V,\"in_flight_tools\":%V",
                    &pending, &running);

    if (partial) {
        p = ngx_cpymem(p, ",\"streaming_message\":{",
                       sizeof(",\"streaming_message\":{") - 1);
        p = ngx_http_agent_partial_json_locked(conv, p);
        *p++ = '}';
    }

    p = ngx_cpymem(p, ",\"messages\":[", sizeof(",\"messages\":[") - 1);

    last = after;

    for (i = 0; i < n; i++) {
        if (i) {
            *p++ = ',';
        }

        p = ngx_cpymem(p, evs[i]->data, evs[i]->len);
        last = evs[i]->seq;
    }

    seq = conv->seq;

    ngx_http_agent_zone_unlock(z);

    *p++ = ']';

    /* as the model_calls view: no next page, no next_after */

    if (last < seq) {
        p = ngx_sprintf(p, ",\"next_after\":%uL", last);
    }

    *p++ = '}';

    json.len = p - json.data;

    return ngx_http_agent_json_send(r, NGX_HTTP_OK, &json);
}


static ngx_int_t
ngx_http_agent_inspect_arg(ngx_http_request_t *r, char *name, size_t len,
    ngx_int_t def, ngx_int_t *value)
{
    ngx_str_t  s;

    if (ngx_http_arg(r, (u_char *) name, len, &s) != NGX_OK) {
        *value = def;
        return NGX_OK;
    }

    *value = ngx_atoi(s.data, s.len);

    return (*value == NGX_ERROR) ? NGX_ERROR : NGX_OK;
}


/*
 * [{"tool_call_id":ID,"name":NAME,"kind":KIND,"executor":EXECUTOR,
 * "deadline":MS}, ...]: the calls that wait for outside input.
 */

static ngx_int_t
ngx_http_agent_inspect_pending_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_str_t *out)
{
    yajl_gen                   g;
    ngx_uint_t                 i, failed;
    ngx_http_agent_pending_t  *p;

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_array_open(g);

    for (i = 0; conv->pending && i < conv->pending_slots; i++) {
        p = &conv->pending[i];

        if (p->kind == NGX_HTTP_AGENT_PENDING_NONE) {
            continue;
        }

        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "tool_call_id");
        failed |= yajl_gen_string(g, p->id, p->id_len);
        failed |= ngx_http_agent_json_key(g, "name");
        failed |= yajl_gen_string(g, p->name, p->name_len);
        failed |= ngx_http_agent_json_key(g, "kind");
        failed |= ngx_http_agent_json_str(g,
                                      &ngx_http_agent_pending_kinds[p->kind]);
        failed |= ngx_http_agent_json_key(g, "executor");
        failed |= ngx_http_agent_json_str(g,
                                   &ngx_http_agent_executors[p->executor].name);
        failed |= ngx_http_agent_json_key(g, "deadline");
        failed |= yajl_gen_integer(g, (long long) p->deadline);
        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);

    return ngx_http_agent_json_result(g, failed, out);
}


/*
 * [{"tool_call_id":ID,"name":NAME}, ...]: the server calls still
 * running, those of the last batch with a tool_call event but neither a
 * tool_result nor a pending entry.  The log is read back from its tail
 * to the batch's assistant_msg; nothing runs without a turn holding the
 * lease, nor after the turn's end or a new message.
 */

static ngx_int_t
ngx_http_agent_inspect_running_locked(ngx_http_request_t *r,
    ngx_http_agent_conv_t *conv, ngx_str_t *out)
{
    yajl_gen                        g;
    ngx_uint_t                      i, failed;
    ngx_array_t                     calls, results;
    ngx_queue_t                    *q;
    ngx_http_agent_bytes_t          scratch;
    ngx_http_agent_event_t         *ev;
    ngx_http_agent_inspect_call_t  *call;

    if (ngx_array_init(&calls, r->pool, 4,
                       sizeof(ngx_http_agent_inspect_call_t))
        != NGX_OK
        || ngx_array_init(&results, r->pool, 4,
                          sizeof(ngx_http_agent_inspect_call_t))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_memzero(&scratch, sizeof(ngx_http_agent_bytes_t));

    /* nothing runs without a turn holding the lease */

    q = conv->lease ? ngx_queue_last(&conv->log)
                    : ngx_queue_sentinel(&conv->log);

    for ( /* void */ ; q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        ev = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        switch (ev->type) {

        case NGX_HTTP_AGENT_EV_TOOL_CALL:
            if (ngx_http_agent_inspect_call(r, &scratch, ev, &calls)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            continue;

        case NGX_HTTP_AGENT_EV_TOOL_RESULT:
            if (ngx_http_agent_inspect_call(r, &scratch, ev, &results)
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            continue;

        case NGX_HTTP_AGENT_EV_ASSISTANT_MSG:
            break;

        case NGX_HTTP_AGENT_EV_USER_MSG:
        case NGX_HTTP_AGENT_EV_TURN_COMPLETED:
        case NGX_HTTP_AGENT_EV_TURN_FAILED:
        case NGX_HTTP_AGENT_EV_CANCELLED:
        case NGX_HTTP_AGENT_EV_TURN_HALTED:
            /* the batch is over */
            calls.nelts = 0;
            break;

        default:
            /* suspensions and resolutions */
            continue;
        }

        break;
    }

    g = ngx_http_agent_json_gen(r->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    failed = yajl_gen_array_open(g);

    /* read back from the tail: the calls are in reverse order */

    call = calls.elts;

    for (i = calls.nelts; i > 0; i--) {

        if (ngx_http_agent_inspect_has(&results, &call[i - 1].id)
            || ngx_http_agent_conv_pending_locked(conv, &call[i - 1].id))
        {
            continue;
        }

        failed |= yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "tool_call_id");
        failed |= ngx_http_agent_json_str(g, &call[i - 1].id);
        failed |= ngx_http_agent_json_key(g, "name");
        failed |= ngx_http_agent_json_str_or_null(g, &call[i - 1].name);
        failed |= yajl_gen_map_close(g);
    }

    failed |= yajl_gen_array_close(g);

    return ngx_http_agent_json_result(g, failed, out);
}


/*
 * The tool_call_id and name of a tool_call or tool_result event, parsed
 * from a NUL-terminated copy in scratch, reused from event to event.
 */

static ngx_int_t
ngx_http_agent_inspect_call(ngx_http_request_t *r,
    ngx_http_agent_bytes_t *scratch, ngx_http_agent_event_t *ev,
    ngx_array_t *calls)
{
    char                            err[NGX_HTTP_AGENT_JSON_ERR];
    yajl_val                        v;
    ngx_str_t                       id, name;
    ngx_http_agent_inspect_call_t  *call;

    if (ngx_http_agent_bytes_set(r->pool, scratch, ev->data, ev->len)
        != NGX_OK
        || ngx_http_agent_bytes_append(r->pool, scratch, (u_char *) "", 1)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    v = ngx_http_agent_json_parse(scratch->data, ev->len,
                                  NGX_HTTP_AGENT_JSON_LOG_DEPTH, err,
                                  sizeof(err));

    if (v == NULL) {
        /* cannot happen: the module writes every event */
        return NGX_OK;
    }

    if (ngx_http_agent_provider_string(
                        ngx_http_agent_provider_get(v, "tool_call_id"), &id)
        != NGX_OK)
    {
        ngx_http_agent_json_free(v);
        return NGX_OK;
    }

    if (ngx_http_agent_provider_string(ngx_http_agent_provider_get(v, "name"),
                                       &name)
        != NGX_OK)
    {
        ngx_str_null(&name);
    }

    call = ngx_array_push(calls);
    if (call == NULL) {
        ngx_http_agent_json_free(v);
        return NGX_ERROR;
    }

    call->id.len = id.len;
    call->id.data = ngx_pstrdup(r->pool, &id);

    call->name.len = name.len;
    call->name.data = name.len ? ngx_pstrdup(r->pool, &name) : NULL;

    ngx_http_agent_json_free(v);

    if (call->id.data == NULL || (name.len && call->name.data == NULL)) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_uint_t
ngx_http_agent_inspect_has(ngx_array_t *calls, ngx_str_t *id)
{
    ngx_uint_t                      i;
    ngx_http_agent_inspect_call_t  *call;

    call = calls->elts;

    for (i = 0; i < calls->nelts; i++) {
        if (call[i].id.len == id->len
            && ngx_strncmp(call[i].id.data, id->data, id->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}
