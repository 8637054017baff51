
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_partial.h"


/*
 * The reply so far of the model call that streams, so that a subscriber
 * or an inspect that comes in mid-reply, on any worker, sees it: one
 * record in the zone per conversation, appended in the lock in which
 * each delta is emitted, so that the snapshot and the deltas after it
 * neither overlap nor leave a gap.
 *
 * It holds runs, each of one kind (text, thinking, the arguments of one
 * tool call) in the order the deltas came: a header and the delta's
 * bytes, as they came (escaped when read).  A delta of the last run's
 * kind lengthens it.  The record goes with the assistant_msg that
 * replaces it and with the lease of the turn (ngx_http_agent_zone.c);
 * it is given up, never wrong: past its bound, when the zone has no
 * room, when a delta is missing.
 */

struct ngx_http_agent_partial_s {
    u_char                        message_id[NGX_HTTP_AGENT_MESSAGE_ID_LEN];
    size_t                        message_id_len;
    ngx_uint_t                    delta_seq;  /* the last one in it */
    size_t                        last;       /* where the last run is */
    size_t                        len;        /* of data, used */
    size_t                        size;       /* of data */
    u_char                        data[1];
};


typedef struct {
    ngx_uint_t                    type;
    ngx_uint_t                    index;
    size_t                        len;
} ngx_http_agent_partial_run_t;


#define NGX_HTTP_AGENT_PARTIAL_MAX_STR   "32768"

#define ngx_http_agent_partial_head                                          \
    offsetof(ngx_http_agent_partial_t, data)

#define ngx_http_agent_partial_run(p, off)                                   \
    ((ngx_http_agent_partial_run_t *) ((p)->data + (off)))

#define ngx_http_agent_partial_bytes(run)                                    \
    ((u_char *) (run) + sizeof(ngx_http_agent_partial_run_t))

/* runs start aligned, for their headers */
#define ngx_http_agent_partial_next(off, run)                                \
    ngx_align((off) + sizeof(ngx_http_agent_partial_run_t) + (run)->len,     \
              sizeof(ngx_uint_t))


static ngx_int_t ngx_http_agent_partial_grow_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, size_t need);
static void ngx_http_agent_partial_log(ngx_http_agent_conv_t *conv,
    u_char *message_id, size_t len, char *why);
static ngx_uint_t ngx_http_agent_partial_seen(ngx_http_agent_partial_t *p,
    size_t end, ngx_uint_t type, ngx_uint_t index);
static u_char *ngx_http_agent_partial_copy(ngx_http_agent_partial_t *p,
    size_t off, ngx_uint_t type, ngx_uint_t index, u_char *b);


void
ngx_http_agent_partial_add_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_http_agent_delta_t *d)
{
    size_t                         off, need;
    ngx_uint_t                     index, extend;
    ngx_http_agent_partial_t      *p;
    ngx_http_agent_partial_run_t  *run;

    if (d->delta_seq == 1) {
        ngx_http_agent_partial_free_locked(z, conv);

        if (d->message_id.len > NGX_HTTP_AGENT_MESSAGE_ID_LEN) {
            return;
        }

        p = ngx_http_agent_zone_try_alloc_locked(z, conv,
                                             NGX_HTTP_AGENT_PARTIAL_MIN);
        if (p == NULL) {
            ngx_http_agent_partial_log(conv, d->message_id.data,
                                       d->message_id.len,
                                       "the zone is full");
            return;
        }

        ngx_memcpy(p->message_id, d->message_id.data, d->message_id.len);
        p->message_id_len = d->message_id.len;
        p->delta_seq = 0;
        p->last = 0;
        p->len = 0;
        p->size = NGX_HTTP_AGENT_PARTIAL_MIN - ngx_http_agent_partial_head;

        conv->partial = p;
    }

    p = conv->partial;

    if (p == NULL) {
        /* given up for this message, or it began before the record */
        return;
    }

    if (d->delta_seq != p->delta_seq + 1
        || d->message_id.len != p->message_id_len
        || ngx_memcmp(d->message_id.data, p->message_id, p->message_id_len)
           != 0)
    {
        ngx_http_agent_partial_drop_locked(z, conv, "a delta is missing");
        return;
    }

    index = (d->type == NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA) ? d->index : 0;

    run = ngx_http_agent_partial_run(p, p->last);

    extend = (p->len && run->type == d->type && run->index == index);

    if (extend) {
        off = p->len;
        need = off + d->data.len;

    } else {
        off = ngx_align(p->len, sizeof(ngx_uint_t));
        need = off + sizeof(ngx_http_agent_partial_run_t) + d->data.len;
    }

    if (need > p->size) {
        if (ngx_http_agent_partial_grow_locked(z, conv, need) != NGX_OK) {
            return;
        }

        p = conv->partial;
    }

    if (extend) {
        run = ngx_http_agent_partial_run(p, p->last);

    } else {
        run = ngx_http_agent_partial_run(p, off);
        run->type = d->type;
        run->index = index;
        run->len = 0;

        p->last = off;
        off += sizeof(ngx_http_agent_partial_run_t);
    }

    ngx_memcpy(p->data + off, d->data.data, d->data.len);

    run->len += d->data.len;
    p->len = off + d->data.len;
    p->delta_seq = d->delta_seq;
}


/*
 * Doubled until it takes need, within the bound; the zone frees what
 * can go for it, as for any other record, except this conversation's.
 */

static ngx_int_t
ngx_http_agent_partial_grow_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, size_t need)
{
    size_t                     size;
    ngx_http_agent_partial_t  *p, *np;

    p = conv->partial;

    size = ngx_http_agent_partial_head + p->size;

    while (size - ngx_http_agent_partial_head < need) {
        size *= 2;
    }

    if (size > NGX_HTTP_AGENT_PARTIAL_MAX) {
        ngx_http_agent_partial_drop_locked(z, conv, "it is larger than "
                                           NGX_HTTP_AGENT_PARTIAL_MAX_STR
                                           " bytes");
        return NGX_DECLINED;
    }

    np = ngx_http_agent_zone_try_alloc_locked(z, conv, size);

    if (np == NULL) {
        ngx_http_agent_partial_drop_locked(z, conv, "the zone is full");
        return NGX_ERROR;
    }

    ngx_memcpy(np, p, ngx_http_agent_partial_head + p->len);
    np->size = size - ngx_http_agent_partial_head;

    ngx_slab_free_locked(z->shpool, p);
    conv->partial = np;

    return NGX_OK;
}


void
ngx_http_agent_partial_free_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv)
{
    if (conv->partial) {
        ngx_slab_free_locked(z->shpool, conv->partial);
        conv->partial = NULL;
    }
}


/*
 * No snapshot rather than a wrong one: the message has none from here
 * on (the deltas go on), and the log says why.
 */

void
ngx_http_agent_partial_drop_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, char *why)
{
    ngx_http_agent_partial_t  *p;

    p = conv->partial;

    if (p == NULL) {
        return;
    }

    ngx_http_agent_partial_log(conv, p->message_id, p->message_id_len, why);

    ngx_http_agent_partial_free_locked(z, conv);
}


static void
ngx_http_agent_partial_log(ngx_http_agent_conv_t *conv, u_char *message_id,
    size_t len, char *why)
{
    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "agent conversation \"%*s\": the reply so far of %*s is "
                  "not kept, %s", conv->id_len, conv->id, len, message_id,
                  why);
}


size_t
ngx_http_agent_partial_size_locked(ngx_http_agent_conv_t *conv)
{
    size_t                         len, off;
    ngx_http_agent_partial_t      *p;
    ngx_http_agent_partial_run_t  *run;

    p = conv->partial;

    if (p == NULL) {
        return 0;
    }

    len = sizeof("\"message_id\":\"\",\"text\":\"\",\"thinking\":\"\","
                 "\"tool_calls\":[],\"delta_seq\":") - 1
          + p->message_id_len + NGX_INT_T_LEN;

    for (off = 0; off < p->len; off = ngx_http_agent_partial_next(off, run))
    {
        run = ngx_http_agent_partial_run(p, off);

        len += run->len + ngx_escape_json(NULL,
                                          ngx_http_agent_partial_bytes(run),
                                          run->len);

        if (run->type == NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA) {
            len += sizeof("{\"index\":,\"arguments\":\"\"},") - 1
                   + NGX_INT_T_LEN;
        }
    }

    return len;
}


/* each tool call in the order it came, with the runs of its arguments */

u_char *
ngx_http_agent_partial_json_locked(ngx_http_agent_conv_t *conv, u_char *b)
{
    size_t                         off;
    ngx_uint_t                     n;
    ngx_http_agent_partial_t      *p;
    ngx_http_agent_partial_run_t  *run;

    p = conv->partial;

    b = ngx_sprintf(b, "\"message_id\":\"%*s\",\"text\":\"",
                    p->message_id_len, p->message_id);
    b = ngx_http_agent_partial_copy(p, 0, NGX_HTTP_AGENT_EV_TEXT_DELTA, 0,
                                    b);
    *b++ = '"';

    if (ngx_http_agent_partial_seen(p, p->len,
                                    NGX_HTTP_AGENT_EV_THINKING_DELTA, 0))
    {
        b = ngx_cpymem(b, ",\"thinking\":\"", sizeof(",\"thinking\":\"") - 1);
        b = ngx_http_agent_partial_copy(p, 0,
                                        NGX_HTTP_AGENT_EV_THINKING_DELTA, 0,
                                        b);
        *b++ = '"';
    }

    n = 0;

    for (off = 0; off < p->len; off = ngx_http_agent_partial_next(off, run))
    {
        run = ngx_http_agent_partial_run(p, off);

        if (run->type != NGX_HTTP_AGENT_EV_TOOL_CALL_DELTA
            || ngx_http_agent_partial_seen(p, off, run->type, run->index))
        {
            continue;
        }

        b = ngx_sprintf(b, "%s{\"index\":%ui,\"arguments\":\"",
                        n++ ? "," : ",\"tool_calls\":[", run->index);
        b = ngx_http_agent_partial_copy(p, off, run->type, run->index, b);
        *b++ = '"';
        *b++ = '}';
    }

    if (n) {
        *b++ = ']';
    }

    return ngx_sprintf(b, ",\"delta_seq\":%ui", p->delta_seq);
}


/* a run of the kind before end */

static ngx_uint_t
ngx_http_agent_partial_seen(ngx_http_agent_partial_t *p, size_t end,
    ngx_uint_t type, ngx_uint_t index)
{
    size_t                         off;
    ngx_http_agent_partial_run_t  *run;

    for (off = 0; off < end; off = ngx_http_agent_partial_next(off, run)) {
        run = ngx_http_agent_partial_run(p, off);

        if (run->type == type && run->index == index) {
            return 1;
        }
    }

    return 0;
}


/* the runs of the kind from off on, as a JSON string's content */

static u_char *
ngx_http_agent_partial_copy(ngx_http_agent_partial_t *p, size_t off,
    ngx_uint_t type, ngx_uint_t index, u_char *b)
{
    ngx_http_agent_partial_run_t  *run;

    for ( /* void */ ; off < p->len;
         off = ngx_http_agent_partial_next(off, run))
    {
        run = ngx_http_agent_partial_run(p, off);

        if (run->type == type && run->index == index) {
            b = (u_char *) ngx_escape_json(b,
                                           ngx_http_agent_partial_bytes(run),
                                           run->len);
        }
    }

    return b;
}


yajl_val
ngx_http_agent_partial_parse_locked(ngx_http_agent_conv_t *conv,
    ngx_log_t *log)
{
    char       errbuf[NGX_HTTP_AGENT_JSON_ERR];
    u_char    *json, *last;
    yajl_val   root;

    json = ngx_alloc(ngx_http_agent_partial_size_locked(conv) + 3, log);
    if (json == NULL) {
        return NULL;
    }

    json[0] = '{';
    last = ngx_http_agent_partial_json_locked(conv, json + 1);
    *last++ = '}';
    *last = '\0';

    root = ngx_http_agent_json_parse(json, last - json,
                                     NGX_HTTP_AGENT_JSON_LOG_DEPTH, errbuf,
                                     sizeof(errbuf));
    ngx_free(json);

    return root;
}
