
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The metrics' counters in the zone.  Slots are added under the zone's
 * lock when the configuration declares their names and never move or
 * go, so a counter is found without the lock and bumped with an atomic
 * add: counting adds no lock to any path.  What the log records (turns
 * ended, calls suspended, resolved and finished) is counted where it is
 * recorded, once, whichever worker records it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_metrics.h"


static ngx_int_t ngx_http_agent_metrics_name(ngx_http_agent_metrics_name_t *n,
    ngx_str_t *s);
static ngx_uint_t ngx_http_agent_metrics_is(ngx_http_agent_metrics_name_t *n,
    u_char *data, size_t len);
static void ngx_http_agent_metrics_result(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *fields);
static void ngx_http_agent_metrics_resolution(ngx_http_agent_zone_t *z,
    ngx_str_t *fields);
static uint64_t ngx_http_agent_metrics_called(ngx_http_agent_conv_t *conv,
    ngx_str_t *id);
static ngx_int_t ngx_http_agent_metrics_call(ngx_http_agent_event_t *e,
    ngx_str_t *id, uint64_t *ts);
static ngx_int_t ngx_http_agent_metrics_member(u_char **pos, u_char *last,
    ngx_str_t *key, ngx_str_t *value);
static u_char *ngx_http_agent_metrics_string(u_char *p, u_char *last);


/*
 * Bounds in ms or in units, as the OpenTelemetry GenAI conventions
 * advise for the model's histograms
 */

ngx_uint_t  ngx_http_agent_metrics_bounds[NGX_HTTP_AGENT_HISTS]
                                         [NGX_HTTP_AGENT_METRICS_BOUNDS + 1] =
{
    /* gen_ai.client.operation.duration */
    { 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 20480,
      40960, 81920, 0 },

    /* gen_ai.client.operation.time_to_first_chunk */
    { 1, 5, 10, 20, 40, 60, 80, 100, 250, 500, 750, 1000, 2500, 5000,
      7500, 10000, 0 },

    /* gen_ai.client.token.usage */
    { 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576,
      4194304, 16777216, 67108864, 0 },

    /* a tool call: a location's answer, or a person's */
    { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
      60000, 300000, 1800000, 0 },

    /* events in a store batch, at most 256 */
    { 1, 2, 4, 8, 16, 32, 64, 128, 256, 0 },

    /* a store's batch written, an input's wait for it: microseconds */
    { 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000,
      500000, 1000000, 2500000, 5000000, 10000000, 0 }
};


ngx_str_t  ngx_http_agent_metrics_executors[] = {
    ngx_string("server"),
    ngx_string("human"),
    ngx_string("client"),
    ngx_string("provider"),
    ngx_string("unknown")
};


static ngx_str_t  ngx_http_agent_metrics_kinds[] = {
    ngx_null_string,
    ngx_string("approval"),
    ngx_string("elicitation"),
    ngx_string("client_exec")
};


/*
 * The smallest zones keep their few pages for the conversations: a
 * zone under NGX_HTTP_AGENT_METRICS_PAGES pages keeps no metrics
 */

ngx_http_agent_metrics_sh_t *
ngx_http_agent_metrics_create(ngx_slab_pool_t *shpool)
{
    if ((ngx_uint_t) (shpool->end - shpool->start) / ngx_pagesize
        < NGX_HTTP_AGENT_METRICS_PAGES)
    {
        return NULL;
    }

    return ngx_slab_calloc(shpool, sizeof(ngx_http_agent_metrics_sh_t));
}


ngx_int_t
ngx_http_agent_metrics_agent_locked(ngx_http_agent_zone_t *z,
    ngx_str_t *name, ngx_str_t *model, ngx_str_t *provider)
{
    ngx_uint_t                       i;
    ngx_http_agent_metrics_sh_t     *m;
    ngx_http_agent_metrics_agent_t  *a;

    m = z->sh->metrics;

    if (m == NULL) {
        return NGX_DECLINED;
    }

    for (i = 0; i < m->nagents; i++) {
        a = m->agents[i];

        if (ngx_http_agent_metrics_is(&a->name, name->data, name->len)
            && ngx_http_agent_metrics_is(&a->model, model->data, model->len)
            && ngx_http_agent_metrics_is(&a->provider, provider->data,
                                         provider->len))
        {
            return NGX_OK;
        }
    }

    if (m->nagents == NGX_HTTP_AGENT_METRICS_AGENTS) {
        return NGX_DECLINED;
    }

    a = ngx_slab_calloc_locked(z->shpool,
                               sizeof(ngx_http_agent_metrics_agent_t));
    if (a == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_metrics_name(&a->name, name) != NGX_OK
        || ngx_http_agent_metrics_name(&a->model, model) != NGX_OK
        || ngx_http_agent_metrics_name(&a->provider, provider) != NGX_OK)
    {
        ngx_slab_free_locked(z->shpool, a);
        return NGX_DECLINED;
    }

    m->agents[m->nagents] = a;

    /* readers take the count without the lock: the slot is ready first */
    ngx_memory_barrier();

    m->nagents++;

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_metrics_tool_locked(ngx_http_agent_zone_t *z,
    ngx_str_t *name, ngx_uint_t executor)
{
    ngx_uint_t                      i;
    ngx_http_agent_metrics_sh_t    *m;
    ngx_http_agent_metrics_tool_t  *tl;

    m = z->sh->metrics;

    if (m == NULL) {
        return NGX_DECLINED;
    }

    for (i = 0; i < m->ntools; i++) {
        tl = m->tools[i];

        if (tl->executor == executor
            && ngx_http_agent_metrics_is(&tl->name, name->data, name->len))
        {
            return NGX_OK;
        }
    }

    if (m->ntools == NGX_HTTP_AGENT_METRICS_TOOLS) {
        return NGX_DECLINED;
    }

    tl = ngx_slab_calloc_locked(z->shpool,
                                sizeof(ngx_http_agent_metrics_tool_t));
    if (tl == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_metrics_name(&tl->name, name) != NGX_OK) {
        ngx_slab_free_locked(z->shpool, tl);
        return NGX_DECLINED;
    }

    tl->executor = executor;

    m->tools[m->ntools] = tl;

    ngx_memory_barrier();

    m->ntools++;

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_metrics_name(ngx_http_agent_metrics_name_t *n, ngx_str_t *s)
{
    if (s->len > NGX_HTTP_AGENT_METRICS_NAME) {
        return NGX_DECLINED;
    }

    n->len = s->len;
    ngx_memcpy(n->data, s->data, s->len);

    return NGX_OK;
}


static ngx_uint_t
ngx_http_agent_metrics_is(ngx_http_agent_metrics_name_t *n, u_char *data,
    size_t len)
{
    return n->len == len && ngx_memcmp(n->data, data, len) == 0;
}


/*
 * The newest slot of the agent: after a reload that changed its model,
 * the model it runs now
 */

ngx_http_agent_metrics_agent_t *
ngx_http_agent_metrics_agent(ngx_http_agent_zone_t *z, u_char *name,
    size_t len)
{
    ngx_uint_t                    n;
    ngx_http_agent_metrics_sh_t  *m;

    m = z->sh->metrics;

    if (m == NULL) {
        return NULL;
    }

    for (n = m->nagents; n > 0; n--) {
        if (ngx_http_agent_metrics_is(&m->agents[n - 1]->name, name, len)) {
            return m->agents[n - 1];
        }
    }

    return NULL;
}


void
ngx_http_agent_metrics_observe(ngx_http_agent_hist_t *h, ngx_uint_t hist,
    ngx_uint_t value)
{
    ngx_uint_t  i, *bound;

    bound = ngx_http_agent_metrics_bounds[hist];

    for (i = 0; bound[i] && value > bound[i]; i++) {
        /* void */
    }

    (void) ngx_atomic_fetch_add(&h->bucket[i], 1);
    (void) ngx_atomic_fetch_add(&h->sum, value);
}


void
ngx_http_agent_metrics_event_locked(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_uint_t type, ngx_str_t *fields)
{
    u_char                          *pos;
    ngx_str_t                        key, value;
    ngx_uint_t                       i;
    ngx_http_agent_metrics_sh_t     *m;
    ngx_http_agent_metrics_agent_t  *a;

    m = z->sh->metrics;

    if (m == NULL) {
        return;
    }

    switch (type) {

    case NGX_HTTP_AGENT_EV_TURN_COMPLETED:
    case NGX_HTTP_AGENT_EV_TURN_FAILED:
    case NGX_HTTP_AGENT_EV_CANCELLED:
    case NGX_HTTP_AGENT_EV_TURN_HALTED:

        /* in the order of the outcomes, from TURN_COMPLETED */

        a = ngx_http_agent_metrics_agent(z, conv->agent, conv->agent_len);

        if (a) {
            (void) ngx_atomic_fetch_add(
                     &a->turns[type - NGX_HTTP_AGENT_EV_TURN_COMPLETED], 1);
        }

        return;

    case NGX_HTTP_AGENT_EV_SUSPENSION:

        pos = fields->data;

        while (ngx_http_agent_metrics_member(&pos, fields->data + fields->len,
                                             &key, &value)
               == NGX_OK)
        {
            if (key.len != 4 || ngx_strncmp(key.data, "kind", 4) != 0) {
                continue;
            }

            for (i = 1; i <= NGX_HTTP_AGENT_PENDING_CLIENT_EXEC; i++) {
                if (value.len == ngx_http_agent_metrics_kinds[i].len
                    && ngx_strncmp(value.data,
                                   ngx_http_agent_metrics_kinds[i].data,
                                   value.len)
                       == 0)
                {
                    (void) ngx_atomic_fetch_add(&m->suspensions[i], 1);
                }
            }

            return;
        }

        return;

    case NGX_HTTP_AGENT_EV_RESOLUTION:
        ngx_http_agent_metrics_resolution(z, fields);
        return;

    case NGX_HTTP_AGENT_EV_TOOL_RESULT:
        ngx_http_agent_metrics_result(z, conv, fields);
        return;

    default:
        return;
    }
}


/*
 * How a resolution decided, by its first member after the call's id,
 * name and kind: "decision" (an approval), "result" (an answer or a
 * browser's result), "expired" or "cancelled"
 */

static void
ngx_http_agent_metrics_resolution(ngx_http_agent_zone_t *z,
    ngx_str_t *fields)
{
    u_char                       *pos;
    ngx_str_t                     key, value;
    ngx_int_t                     d;
    ngx_http_agent_metrics_sh_t  *m;

    m = z->sh->metrics;
    pos = fields->data;

    while (ngx_http_agent_metrics_member(&pos, fields->data + fields->len,
                                         &key, &value)
           == NGX_OK)
    {
        d = -1;

        if (key.len == 8 && ngx_strncmp(key.data, "decision", 8) == 0) {
            d = (value.len == 7 && ngx_strncmp(value.data, "approve", 7) == 0)
                ? NGX_HTTP_AGENT_DECISION_APPROVE
                : NGX_HTTP_AGENT_DECISION_REJECT;

        } else if (key.len == 6 && ngx_strncmp(key.data, "result", 6) == 0) {
            d = NGX_HTTP_AGENT_DECISION_ANSWERED;

        } else if (key.len == 7 && ngx_strncmp(key.data, "expired", 7) == 0) {
            d = NGX_HTTP_AGENT_DECISION_EXPIRED;

        } else if (key.len == 9
                   && ngx_strncmp(key.data, "cancelled", 9) == 0)
        {
            d = NGX_HTTP_AGENT_DECISION_CANCELLED;
        }

        if (d >= 0) {
            (void) ngx_atomic_fetch_add(&m->resolutions[d], 1);
            return;
        }
    }
}


/* a call's result: by its tool, ok or not, and the time since its call */

static void
ngx_http_agent_metrics_result(ngx_http_agent_zone_t *z,
    ngx_http_agent_conv_t *conv, ngx_str_t *fields)
{
    u_char                         *pos;
    uint64_t                        called, now;
    ngx_str_t                       key, value, id, name;
    ngx_int_t                       ok;
    ngx_uint_t                      i;
    ngx_time_t                     *tp;
    ngx_http_agent_metrics_sh_t    *m;
    ngx_http_agent_metrics_tool_t  *tl;

    m = z->sh->metrics;
    pos = fields->data;

    ngx_str_null(&id);
    ngx_str_null(&name);
    ok = -1;

    while (ok == -1
           && ngx_http_agent_metrics_member(&pos, fields->data + fields->len,
                                            &key, &value)
              == NGX_OK)
    {
        if (key.len == 12 && ngx_strncmp(key.data, "tool_call_id", 12) == 0) {
            id = value;

        } else if (key.len == 4 && ngx_strncmp(key.data, "name", 4) == 0) {
            name = value;

        } else if (key.len == 2 && ngx_strncmp(key.data, "ok", 2) == 0) {
            ok = (value.len == 4 && ngx_strncmp(value.data, "true", 4) == 0);
        }
    }

    /* the first slot is the tools nobody declared */

    tl = NULL;

    for (i = m->ntools; i > 1; i--) {
        if (ngx_http_agent_metrics_is(&m->tools[i - 1]->name, name.data,
                                      name.len))
        {
            tl = m->tools[i - 1];
            break;
        }
    }

    if (tl == NULL) {
        if (m->ntools == 0) {
            return;
        }

        tl = m->tools[0];
    }

    (void) ngx_atomic_fetch_add(ok == 1 ? &tl->ok : &tl->error, 1);

    called = ngx_http_agent_metrics_called(conv, &id);

    if (called) {
        tp = ngx_timeofday();
        now = (uint64_t) tp->sec * 1000 + tp->msec;

        ngx_http_agent_metrics_observe(&tl->duration, NGX_HTTP_AGENT_HIST_TOOL,
                                       now > called ? now - called : 0);
    }
}


/*
 * The time of the call's tool_call event, if the zone still holds it:
 * looked for back from the log's end, within the current turn.  Results
 * mostly come in the order of their calls: the tool_call after the one
 * last found in this worker is tried first.  It is only a hint, compared
 * as any other; a miss looks through the turn.
 */

static ngx_http_agent_conv_t  *ngx_http_agent_metrics_last_conv;
static uint64_t                ngx_http_agent_metrics_last_seq;


static uint64_t
ngx_http_agent_metrics_called(ngx_http_agent_conv_t *conv, ngx_str_t *id)
{
    uint64_t                 ts;
    ngx_queue_t             *q;
    ngx_http_agent_event_t  *e, *next;

    if (id->len == 0) {
        return 0;
    }

    if (conv == ngx_http_agent_metrics_last_conv
        && ngx_http_agent_metrics_last_seq >= conv->turn_seq)
    {
        next = NULL;

        for (q = ngx_queue_last(&conv->log);
             q != ngx_queue_sentinel(&conv->log);
             q = ngx_queue_prev(q))
        {
            e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

            if (e->seq <= ngx_http_agent_metrics_last_seq) {
                break;
            }

            if (e->type == NGX_HTTP_AGENT_EV_TOOL_CALL) {
                next = e;
            }
        }

        if (next && ngx_http_agent_metrics_call(next, id, &ts) == NGX_OK) {
            ngx_http_agent_metrics_last_seq = next->seq;
            return ts;
        }
    }

    for (q = ngx_queue_last(&conv->log);
         q != ngx_queue_sentinel(&conv->log);
         q = ngx_queue_prev(q))
    {
        e = ngx_queue_data(q, ngx_http_agent_event_t, queue);

        if (e->seq < conv->turn_seq) {
            return 0;
        }

        if (e->type == NGX_HTTP_AGENT_EV_TOOL_CALL
            && ngx_http_agent_metrics_call(e, id, &ts) == NGX_OK)
        {
            ngx_http_agent_metrics_last_conv = conv;
            ngx_http_agent_metrics_last_seq = e->seq;
            return ts;
        }
    }

    return 0;
}


/* NGX_OK and its time if the tool_call event is the call's */

static ngx_int_t
ngx_http_agent_metrics_call(ngx_http_agent_event_t *e, ngx_str_t *id,
    uint64_t *ts)
{
    u_char     *pos;
    ngx_str_t   key, value;

    pos = e->data;
    *ts = 0;

    while (ngx_http_agent_metrics_member(&pos, e->data + e->len, &key,
                                         &value)
           == NGX_OK)
    {
        if (key.len == 2 && ngx_strncmp(key.data, "ts", 2) == 0) {
            *ts = ngx_atoof(value.data, value.len);

            if (*ts == (uint64_t) NGX_ERROR) {
                *ts = 0;
            }

            continue;
        }

        if (key.len == 12 && ngx_strncmp(key.data, "tool_call_id", 12) == 0) {
            return (value.len == id->len
                    && ngx_strncmp(value.data, id->data, id->len) == 0)
                   ? NGX_OK : NGX_DECLINED;
        }
    }

    return NGX_DECLINED;
}


void
ngx_http_agent_metrics_takeover(ngx_http_agent_zone_t *z)
{
    if (z->sh->metrics) {
        (void) ngx_atomic_fetch_add(&z->sh->metrics->takeovers, 1);
    }
}


void
ngx_http_agent_metrics_step_later(ngx_http_agent_zone_t *z)
{
    if (z->sh->metrics) {
        (void) ngx_atomic_fetch_add(&z->sh->metrics->steps_later, 1);
    }
}


/* spans the collector took (exported), or that were dropped */

void
ngx_http_agent_metrics_spans(ngx_http_agent_zone_t *z, ngx_uint_t exported,
    ngx_uint_t n)
{
    if (z->sh->metrics && n) {
        (void) ngx_atomic_fetch_add(&z->sh->metrics->spans[exported ? 0 : 1],
                                    n);
    }
}


void
ngx_http_agent_metrics_store(ngx_http_agent_zone_t *z, ngx_uint_t events,
    ngx_uint_t cut, ngx_int_t rc, ngx_uint_t usec)
{
    ngx_http_agent_metrics_sh_t  *m;

    m = z->sh->metrics;

    if (m == NULL) {
        return;
    }

    if (rc != NGX_OK) {
        (void) ngx_atomic_fetch_add(&m->store_errors, 1);
        return;
    }

    ngx_http_agent_metrics_observe(&m->store_batch, NGX_HTTP_AGENT_HIST_BATCH,
                                   events);
    ngx_http_agent_metrics_observe(&m->store_write, NGX_HTTP_AGENT_HIST_STORE,
                                   usec);

    if (cut) {
        (void) ngx_atomic_fetch_add(&m->store_cut, 1);
    }
}


/*
 * A monotonic clock in microseconds, read now: on a pool's thread the
 * cached time is not updated, and a pass of the event loop is timed
 * from the cached time's last update
 */

uint64_t
ngx_http_agent_metrics_usec(void)
{
#if (NGX_HAVE_CLOCK_MONOTONIC)
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
#else
    struct timeval  tv;

    ngx_gettimeofday(&tv);

    return (uint64_t) tv.tv_sec * 1000000 + tv.tv_usec;
#endif
}


void
ngx_http_agent_metrics_ack(ngx_http_agent_zone_t *z, ngx_uint_t usec)
{
    if (z->sh->metrics) {
        ngx_http_agent_metrics_observe(&z->sh->metrics->store_ack,
                                       NGX_HTTP_AGENT_HIST_STORE, usec);
    }
}


void
ngx_http_agent_metrics_history(ngx_http_agent_zone_t *z, ngx_uint_t kept)
{
    if (z->sh->metrics) {
        (void) ngx_atomic_fetch_add(&z->sh->metrics->history[kept ? 1 : 0],
                                    1);
    }
}


/*
 * The next member of a JSON object the module wrote: its key, and its
 * value (a string's without the quotes, still escaped).  NGX_DONE at
 * the end, or at anything else.
 */

static ngx_int_t
ngx_http_agent_metrics_member(u_char **pos, u_char *last, ngx_str_t *key,
    ngx_str_t *value)
{
    u_char      *p;
    ngx_uint_t   depth;

    p = *pos;

    while (p < last && (*p == '{' || *p == ',' || *p == ' ')) {
        p++;
    }

    if (p == last || *p != '"') {
        return NGX_DONE;
    }

    key->data = p + 1;
    p = ngx_http_agent_metrics_string(p + 1, last);

    if (p == NULL || p + 1 >= last || p[1] != ':') {
        return NGX_DONE;
    }

    key->len = p - key->data;
    p += 2;

    if (p == last) {
        return NGX_DONE;
    }

    value->data = p;

    if (*p == '"') {
        value->data = p + 1;
        p = ngx_http_agent_metrics_string(p + 1, last);

        if (p == NULL) {
            return NGX_DONE;
        }

        value->len = p - value->data;
        *pos = p + 1;

        return NGX_OK;
    }

    if (*p == '{' || *p == '[') {
        depth = 0;

        for ( /* void */ ; p < last; p++) {

            if (*p == '"') {
                p = ngx_http_agent_metrics_string(p + 1, last);

                if (p == NULL) {
                    return NGX_DONE;
                }

                continue;
            }

            if (*p == '{' || *p == '[') {
                depth++;

            } else if ((*p == '}' || *p == ']') && --depth == 0) {
                p++;
                break;
            }
        }

    } else {
        while (p < last && *p != ',' && *p != '}') {
            p++;
        }
    }

    value->len = p - value->data;
    *pos = p;

    return NGX_OK;
}


/* the closing quote of a string whose first character is p */

static u_char *
ngx_http_agent_metrics_string(u_char *p, u_char *last)
{
    while (p < last) {

        if (*p == '\\') {
            p += 2;
            continue;
        }

        if (*p == '"') {
            return p;
        }

        p++;
    }

    return NULL;
}
