
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_pg.h"


/*
 * PostgreSQL's writer, on the pool's threads, with blocking calls made
 * on a non-blocking connection of the worker's own (see
 * ngx_http_agent_store_pg_conn.c for the deadlines).  A batch is sent in
 * pipeline mode as a few calls of agent_write() (ngx_http_agent_pg_schema.c)
 * with the events in arrays, binary, so that their bytes go as they are:
 * BEGIN and the events in one round trip, then the inputs' events that
 * came meanwhile, the audit's rows and COMMIT in a second.  A batch of
 * the backlog that an input may cut goes SLICE events a round trip, and
 * ends between two once an input waits, as SQLite's writer ends between
 * two events.
 */


#define NGX_HTTP_AGENT_PG_SLICE   64

/* the arrays' element types, and theirs (pg_type.h) */
#define NGX_HTTP_AGENT_PG_INT8    20
#define NGX_HTTP_AGENT_PG_TEXT    25
#define NGX_HTTP_AGENT_PG_INT8S   1016
#define NGX_HTTP_AGENT_PG_TEXTS   1009

#define NGX_HTTP_AGENT_PG_PARAMS  18


/* a call's parameters, arrays built in one buffer */
typedef struct {
    u_char                       *buf;
    u_char                       *p;
    ngx_uint_t                    nelts;
    ngx_uint_t                    n;
    const char                   *values[NGX_HTTP_AGENT_PG_PARAMS];
    int                           lengths[NGX_HTTP_AGENT_PG_PARAMS];
    int                           formats[NGX_HTTP_AGENT_PG_PARAMS];
    Oid                           types[NGX_HTTP_AGENT_PG_PARAMS];
} ngx_http_agent_pg_params_t;


static ngx_int_t ngx_http_agent_pg_write(ngx_str_t *conninfo,
    ngx_http_agent_store_batch_t *b, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_send_events(PGconn *conn,
    ngx_http_agent_store_event_t *ev, ngx_uint_t n, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_send_rows(PGconn *conn,
    ngx_http_agent_audit_row_t *rows, ngx_uint_t n, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_send_notify(PGconn *conn,
    ngx_http_agent_store_event_t *ev, ngx_uint_t n,
    ngx_http_agent_store_event_t *more, ngx_uint_t nmore, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_sync(PGconn *conn, ngx_uint_t nrows,
    ngx_http_agent_store_batch_t *b, ngx_log_t *log);
static void ngx_http_agent_pg_lost(ngx_http_agent_store_batch_t *b,
    PGresult *res);
static ngx_int_t ngx_http_agent_pg_send(PGconn *conn, const char *sql,
    ngx_http_agent_pg_params_t *pp);
static void ngx_http_agent_pg_array(ngx_http_agent_pg_params_t *pp, Oid type);
static void ngx_http_agent_pg_text(ngx_http_agent_pg_params_t *pp,
    u_char *data, size_t len);
static void ngx_http_agent_pg_int8(ngx_http_agent_pg_params_t *pp,
    int64_t v);
static void ngx_http_agent_pg_end(ngx_http_agent_pg_params_t *pp);
static void ngx_http_agent_pg_node_param(ngx_http_agent_pg_params_t *pp);
static u_char *ngx_http_agent_pg_put32(u_char *p, uint32_t v);
static void ngx_http_agent_pg_close(void);


ngx_http_agent_store_t  ngx_http_agent_store_pg = {
    ngx_string("postgres"),
    ngx_http_agent_pg_open,
    ngx_http_agent_pg_write,
    ngx_http_agent_pg_read,
    ngx_http_agent_pg_sweep,
    ngx_http_agent_pg_enqueue,
    NULL,
    ngx_http_agent_pg_takeover,
    ngx_http_agent_pg_list,
    ngx_http_agent_pg_audit_page,
    ngx_http_agent_pg_close,
    ngx_http_agent_pg_init_process,
    ngx_http_agent_pg_read,
    ngx_http_agent_pg_release,
    ngx_http_agent_pg_create,
    ngx_http_agent_pg_notified
};


ngx_http_agent_store_node_t  ngx_http_agent_pg_node;


/* the worker's writer, used by one batch at a time, in pipeline mode */
static PGconn  *ngx_http_agent_pg_writer;


static ngx_int_t
ngx_http_agent_pg_write(ngx_str_t *conninfo, ngx_http_agent_store_batch_t *b,
    ngx_log_t *log)
{
    PGconn                        *conn;
    ngx_uint_t                     n, i, m, cut, synced, stale;
    ngx_http_agent_store_event_t  *more;

    conn = ngx_http_agent_pg_writer;

    if (conn == NULL) {
        conn = ngx_http_agent_pg_connect(conninfo, NGX_HTTP_AGENT_PG_TIMEOUT,
                                         NGX_LOG_ERR, log);
        if (conn == NULL) {
            return NGX_ERROR;
        }

        if (!PQenterPipelineMode(conn)) {
            ngx_http_agent_pg_log(NGX_LOG_ERR, log, conn, NULL, "pipeline");
            PQfinish(conn);
            return NGX_ERROR;
        }

        ngx_http_agent_pg_writer = conn;
    }

    n = b->nevents;
    more = NULL;
    b->nmore = 0;
    ngx_str_null(&b->lost);
    b->lost_seq = 0;

    cut = (!b->input && b->waits);
    synced = 0;
    stale = 0;

    if (!PQsendQueryParams(conn, "BEGIN", 0, NULL, NULL, NULL, NULL, 0)) {
        goto failed;
    }

    for (i = 0; i < n; i += m) {

        if (i && cut && b->waits(b->data)) {
            n = i;
            break;
        }

        m = ngx_min(NGX_HTTP_AGENT_PG_SLICE, n - i);

        if (ngx_http_agent_pg_send_events(conn, &b->events[i], m, log)
            != NGX_OK)
        {
            goto failed;
        }

        /* a slice a round trip, so that an input can end the batch */

        if (cut || i + m == n) {
            if (ngx_http_agent_pg_sync(conn, 0, b, log) != NGX_OK) {
                goto failed;
            }

            synced = 1;
        }
    }

    if (!synced && ngx_http_agent_pg_sync(conn, 0, b, log) != NGX_OK) {
        goto failed;
    }

    if (b->more && (n < b->nevents || b->waits(b->data))) {
        b->nmore = b->more(b->data, n, &more);

        if (b->nmore) {
            b->input = 1;

            if (ngx_http_agent_pg_send_events(conn, more, b->nmore, log)
                != NGX_OK)
            {
                goto failed;
            }
        }
    }

    if (b->nrows
        && ngx_http_agent_pg_send_rows(conn, b->rows, b->nrows, log)
           != NGX_OK)
    {
        goto failed;
    }

    /* on a node, the subscribers of other nodes learn of the commit */

    if (ngx_http_agent_pg_node.id.len
        && ngx_http_agent_pg_send_notify(conn, b->events, n,
                                         more, b->nmore, log)
           != NGX_OK)
    {
        goto failed;
    }

    /* the node's lease lapsed meanwhile: the batch goes with the zone */

    if (b->stale && b->stale(b->data)) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "agent store \"%s\": the node's lease lapsed while "
                      "a batch was written, it is rolled back",
                      ngx_http_agent_pg_name);
        stale = 1;
        goto failed;
    }

    if (!PQsendQueryParams(conn, "COMMIT", 0, NULL, NULL, NULL, NULL, 0)
        || ngx_http_agent_pg_sync(conn, b->nrows, b, log) != NGX_OK)
    {
        goto failed;
    }

    b->nevents = n;

    return NGX_OK;

failed:

    /*
     * whatever failed, the connection goes: the server rolls back what
     * it had of the batch, and the next batch connects again
     */

    if (b->lost.len == 0 && !stale) {
        ngx_http_agent_pg_log(NGX_LOG_ERR, log, conn, NULL, "write");
    }

    PQfinish(conn);
    ngx_http_agent_pg_writer = NULL;

    return b->lost.len ? NGX_ABORT : NGX_ERROR;
}


/* agent_write() of n events, sent */

static ngx_int_t
ngx_http_agent_pg_send_events(PGconn *conn, ngx_http_agent_store_event_t *ev,
    ngx_uint_t n, ngx_log_t *log)
{
    size_t                       size;
    ngx_int_t                    rc;
    ngx_uint_t                   i;
    ngx_str_t                   *type;
    ngx_http_agent_pg_params_t   pp;

    size = 8 * 20;

    for (i = 0; i < n; i++) {
        size += 8 * 4 + 3 * 8 + ev[i].conv.len + ev[i].agent.len
                + ev[i].owner.len + ngx_http_agent_event_names[ev[i].type].len
                + ev[i].data.len;
    }

    ngx_memzero(&pp, sizeof(ngx_http_agent_pg_params_t));

    pp.buf = ngx_alloc(size, log);
    if (pp.buf == NULL) {
        return NGX_ERROR;
    }

    pp.p = pp.buf;
    pp.nelts = n;

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_text(&pp, ev[i].conv.data, ev[i].conv.len);
    }
    ngx_http_agent_pg_end(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_text(&pp, ev[i].agent.data, ev[i].agent.len);
    }
    ngx_http_agent_pg_end(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_text(&pp, ev[i].owner.data, ev[i].owner.len);
    }
    ngx_http_agent_pg_end(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_INT8);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_int8(&pp, ev[i].seq);
    }
    ngx_http_agent_pg_end(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);
    for (i = 0; i < n; i++) {
        type = &ngx_http_agent_event_names[ev[i].type];
        ngx_http_agent_pg_text(&pp, type->data, type->len);
    }
    ngx_http_agent_pg_end(&pp);

    /* what the event does to the conversation's state: see agent_write */

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_INT8);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_int8(&pp,
                        ngx_http_agent_event_outside(ev[i].type) ? 0
                        : ngx_http_agent_event_terminal(ev[i].type) ? 2 : 1);
    }
    ngx_http_agent_pg_end(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_text(&pp, ev[i].data.data, ev[i].data.len);
    }
    ngx_http_agent_pg_end(&pp);

    /* the node, and the epoch each event is written under: the fence */

    ngx_http_agent_pg_node_param(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_INT8);
    for (i = 0; i < n; i++) {
        ngx_http_agent_pg_int8(&pp, ev[i].epoch);
    }
    ngx_http_agent_pg_end(&pp);

    rc = ngx_http_agent_pg_send(conn,
                            "SELECT agent_write($1, $2, $3, $4, $5, $6, $7,"
                            " $8, $9)",
                            &pp);

    ngx_free(pp.buf);

    return rc;
}


/*
 * One notification per conversation of the batch, of its last seq
 * ("<id>:<seq>", at most 64 + 21 bytes), sent with the commit: not one
 * per event, since every notifying commit takes the server's one lock
 * of the notification queue.  The server sends them only if the batch
 * commits, and to every listener (ngx_http_agent_store_pg_listen.c).
 */

static ngx_int_t
ngx_http_agent_pg_send_notify(PGconn *conn, ngx_http_agent_store_event_t *ev,
    ngx_uint_t n, ngx_http_agent_store_event_t *more, ngx_uint_t nmore,
    ngx_log_t *log)
{
    size_t                         size;
    ngx_int_t                      rc;
    ngx_uint_t                     i, k;
    ngx_http_agent_pg_params_t     pp;
    ngx_http_agent_store_event_t  *e, *all[2];
    ngx_uint_t                     count[2];

    all[0] = ev;
    count[0] = n;
    all[1] = more;
    count[1] = nmore;

    size = 2 * 20;

    for (k = 0; k < 2; k++) {
        for (i = 0; i < count[k]; i++) {
            size += 4 + 12 + all[k][i].conv.len;
        }
    }

    ngx_memzero(&pp, sizeof(ngx_http_agent_pg_params_t));

    pp.buf = ngx_alloc(size, log);
    if (pp.buf == NULL) {
        return NGX_ERROR;
    }

    pp.p = pp.buf;
    pp.nelts = n + nmore;

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);
    for (k = 0; k < 2; k++) {
        for (i = 0; i < count[k]; i++) {
            e = &all[k][i];
            ngx_http_agent_pg_text(&pp, e->conv.data, e->conv.len);
        }
    }
    ngx_http_agent_pg_end(&pp);

    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_INT8);
    for (k = 0; k < 2; k++) {
        for (i = 0; i < count[k]; i++) {
            ngx_http_agent_pg_int8(&pp, all[k][i].seq);
        }
    }
    ngx_http_agent_pg_end(&pp);

    rc = ngx_http_agent_pg_send(conn,
                            "SELECT pg_notify('" NGX_HTTP_AGENT_PG_CHANNEL
                            "', c || ':' || max(s)) FROM unnest($1::text[],"
                            " $2::bigint[]) AS u(c, s) GROUP BY c",
                            &pp);

    ngx_free(pp.buf);

    return rc;
}


/* agent_audit() of the batch's rows, sent */

static ngx_int_t
ngx_http_agent_pg_send_rows(PGconn *conn, ngx_http_agent_audit_row_t *rows,
    ngx_uint_t n, ngx_log_t *log)
{
    size_t                       size;
    ngx_int_t                    rc;
    ngx_uint_t                   i;
    ngx_http_agent_audit_row_t  *r;
    ngx_http_agent_pg_params_t   pp;

    size = 16 * 20;

    for (i = 0; i < n; i++) {
        r = &rows[i];
        size += 16 * 4 + 11 * 8 + r->conv.len + r->adapter.len
                + r->model.len + r->status.len + r->error.len;
    }

    ngx_memzero(&pp, sizeof(ngx_http_agent_pg_params_t));

    pp.buf = ngx_alloc(size, log);
    if (pp.buf == NULL) {
        return NGX_ERROR;
    }

    pp.p = pp.buf;
    pp.nelts = n;

#define ngx_http_agent_pg_texts(field)                                       \
    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_TEXT);                    \
    for (i = 0; i < n; i++) {                                                \
        ngx_http_agent_pg_text(&pp, rows[i].field.data, rows[i].field.len);  \
    }                                                                        \
    ngx_http_agent_pg_end(&pp)

#define ngx_http_agent_pg_int8s(field)                                       \
    ngx_http_agent_pg_array(&pp, NGX_HTTP_AGENT_PG_INT8);                    \
    for (i = 0; i < n; i++) {                                                \
        ngx_http_agent_pg_int8(&pp, (int64_t) rows[i].field);                \
    }                                                                        \
    ngx_http_agent_pg_end(&pp)

    ngx_http_agent_pg_texts(conv);
    ngx_http_agent_pg_int8s(started);
    ngx_http_agent_pg_int8s(worker);
    ngx_http_agent_pg_int8s(end);
    ngx_http_agent_pg_int8s(turn);
    ngx_http_agent_pg_int8s(attempt);
    ngx_http_agent_pg_texts(adapter);
    ngx_http_agent_pg_texts(model);
    ngx_http_agent_pg_texts(status);
    ngx_http_agent_pg_texts(error);
    ngx_http_agent_pg_int8s(input);
    ngx_http_agent_pg_int8s(output);
    ngx_http_agent_pg_int8s(cached);
    ngx_http_agent_pg_int8s(first);
    ngx_http_agent_pg_int8s(duration);

    /* the node, and the epoch of each row's call: the fence */

    ngx_http_agent_pg_node_param(&pp);
    ngx_http_agent_pg_int8s(epoch);

#undef ngx_http_agent_pg_texts
#undef ngx_http_agent_pg_int8s

    rc = ngx_http_agent_pg_send(conn,
                            "SELECT agent_audit($1, $2, $3, $4, $5, $6, $7,"
                            " $8, $9, $10, $11, $12, $13, $14, $15, $16,"
                            " $17)",
                            &pp);

    ngx_free(pp.buf);

    return rc;
}


static ngx_int_t
ngx_http_agent_pg_send(PGconn *conn, const char *sql,
    ngx_http_agent_pg_params_t *pp)
{
    return PQsendQueryParams(conn, sql, pp->n, pp->types, pp->values,
                             pp->lengths, pp->formats, 0)
           ? NGX_OK : NGX_ERROR;
}


/*
 * The pipeline's sync sent, and the results up to it read: NGX_ERROR if
 * one is an error.  The audit's call returns its error, which costs the
 * rows only.
 */

static ngx_int_t
ngx_http_agent_pg_sync(PGconn *conn, ngx_uint_t nrows,
    ngx_http_agent_store_batch_t *b, ngx_log_t *log)
{
    char            *state;
    ngx_int_t        rc, ok;
    PGresult        *res;
    ngx_msec_t       deadline;
    ExecStatusType   st;

    if (!PQpipelineSync(conn)) {
        return NGX_ERROR;
    }

    deadline = ngx_http_agent_pg_msec() + NGX_HTTP_AGENT_PG_TIMEOUT + 1000;
    ok = NGX_OK;

    for ( ;; ) {
        res = ngx_http_agent_pg_result(conn, deadline, &rc, log);

        if (rc != NGX_OK) {
            return NGX_ERROR;
        }

        if (res == NULL) {
            /* the end of a statement's results */
            continue;
        }

        st = PQresultStatus(res);

        if (st == PGRES_PIPELINE_SYNC) {
            PQclear(res);
            return ok;
        }

        if (st == PGRES_TUPLES_OK && PQnfields(res) == 1
            && ngx_strcmp(PQfname(res, 0), "agent_audit") == 0
            && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "agent store \"%s\" could not write %ui model "
                          "call rows: %s", ngx_http_agent_pg_name, nrows,
                          PQgetvalue(res, 0, 0));

        } else if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK
                   && ok == NGX_OK)
        {
            /* the first error; those after it say "aborted" */

            state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

            if (state
                && (ngx_strcmp(state, "AG001") == 0
                    || ngx_strcmp(state, "AG002") == 0))
            {
                ngx_http_agent_pg_lost(b, res);
            }

            if (b->lost.len == 0) {
                ngx_http_agent_pg_log(NGX_LOG_ERR, log, conn, res, "write");
            }

            ok = NGX_ERROR;
        }

        PQclear(res);
    }
}


/*
 * The fence refused the batch (AG001): the conversation another node
 * took (the error's detail), as the batch's events or audit rows name
 * it; or the log holds another event at one of the batch's seqs (AG002,
 * the seq in the error's hint), and the conversation goes as if lost
 */

static void
ngx_http_agent_pg_lost(ngx_http_agent_store_batch_t *b, PGresult *res)
{
    char        *id, *seq;
    size_t       len;
    ngx_uint_t   i;

    id = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
    if (id == NULL) {
        return;
    }

    seq = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
    b->lost_seq = seq ? (uint64_t) strtoull(seq, NULL, 10) : 0;

    len = ngx_strlen(id);

    for (i = 0; i < b->nevents + b->nmore; i++) {
        if (b->events[i].conv.len == len
            && ngx_memcmp(b->events[i].conv.data, id, len) == 0)
        {
            b->lost = b->events[i].conv;
            return;
        }
    }

    for (i = 0; i < b->nrows; i++) {
        if (b->rows[i].conv.len == len
            && ngx_memcmp(b->rows[i].conv.data, id, len) == 0)
        {
            b->lost = b->rows[i].conv;
            return;
        }
    }
}


/* a one-dimensional array of nelts elements of type, binary */

static void
ngx_http_agent_pg_array(ngx_http_agent_pg_params_t *pp, Oid type)
{
    pp->values[pp->n] = (char *) pp->p;
    pp->formats[pp->n] = 1;
    pp->types[pp->n] = (type == NGX_HTTP_AGENT_PG_TEXT)
                       ? NGX_HTTP_AGENT_PG_TEXTS : NGX_HTTP_AGENT_PG_INT8S;

    pp->p = ngx_http_agent_pg_put32(pp->p, 1);
    pp->p = ngx_http_agent_pg_put32(pp->p, 0);
    pp->p = ngx_http_agent_pg_put32(pp->p, type);
    pp->p = ngx_http_agent_pg_put32(pp->p, pp->nelts);
    pp->p = ngx_http_agent_pg_put32(pp->p, 1);
}


static void
ngx_http_agent_pg_text(ngx_http_agent_pg_params_t *pp, u_char *data,
    size_t len)
{
    pp->p = ngx_http_agent_pg_put32(pp->p, len);

    /* an empty owner's data may be NULL, which memcpy() may not take */

    if (len) {
        pp->p = ngx_cpymem(pp->p, data, len);
    }
}


static void
ngx_http_agent_pg_int8(ngx_http_agent_pg_params_t *pp, int64_t v)
{
    pp->p = ngx_http_agent_pg_put32(pp->p, 8);
    pp->p = ngx_http_agent_pg_put32(pp->p, (uint64_t) v >> 32);
    pp->p = ngx_http_agent_pg_put32(pp->p, (uint64_t) v & 0xffffffff);
}


static void
ngx_http_agent_pg_end(ngx_http_agent_pg_params_t *pp)
{
    pp->lengths[pp->n] = (u_char *) pp->p - (u_char *) pp->values[pp->n];
    pp->n++;
}


/* the node's id, "" without agent_node: nothing is fenced */

static void
ngx_http_agent_pg_node_param(ngx_http_agent_pg_params_t *pp)
{
    pp->values[pp->n] = ngx_http_agent_pg_node.id.len
                        ? (char *) ngx_http_agent_pg_node.id.data : "";
    pp->lengths[pp->n] = ngx_http_agent_pg_node.id.len;
    pp->formats[pp->n] = 1;
    pp->types[pp->n] = NGX_HTTP_AGENT_PG_TEXT;
    pp->n++;
}


static u_char *
ngx_http_agent_pg_put32(u_char *p, uint32_t v)
{
    *p++ = (u_char) (v >> 24);
    *p++ = (u_char) (v >> 16);
    *p++ = (u_char) (v >> 8);
    *p++ = (u_char) v;

    return p;
}


static void
ngx_http_agent_pg_close(void)
{
    if (ngx_http_agent_pg_writer) {
        PQfinish(ngx_http_agent_pg_writer);
        ngx_http_agent_pg_writer = NULL;
    }

    ngx_http_agent_pg_readers_close();
}
