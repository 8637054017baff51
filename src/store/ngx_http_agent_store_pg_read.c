
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_zone.h"
#include "ngx_http_agent_bytes.h"
#include "ngx_http_agent_store.h"
#include "ngx_http_agent_store_pg.h"


/*
 * PostgreSQL's reads, on the pool's threads, each on a connection kept
 * for the next (ngx_http_agent_pg_get): a conversation and its events,
 * the sweep, a queued message written, a page of agent_list, a page of
 * the audit.  Parameters and results go as text: numbers are few, and
 * an event's data comes back as the bytes written.
 */


static ngx_int_t ngx_http_agent_pg_read_conn(PGconn *conn, void *data,
    ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_sweep_conn(PGconn *conn, void *data,
    ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_claim(PGconn *conn,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_read_tx(PGconn *conn,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_events(PGresult *res,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_tail(PGconn *conn,
    ngx_http_agent_store_read_t *rd, ngx_pool_t *pool, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_command(ngx_str_t *conninfo,
    const char *sql, int n, const Oid *types, const char **values,
    const int *lengths, const int *formats, const char *what,
    ngx_log_t *log);
static PGresult *ngx_http_agent_pg_by_id(PGconn *conn, const char *sql,
    const char **values, int *lengths, ngx_log_t *log);
static ngx_int_t ngx_http_agent_pg_copy(ngx_pool_t *pool, PGresult *res,
    int row, int col, ngx_str_t *s);
static int64_t ngx_http_agent_pg_int(PGresult *res, int row, int col);
static ngx_int_t ngx_http_agent_pg_audit_json(ngx_pool_t *pool,
    ngx_http_agent_bytes_t *b, PGresult *res, int row);


/*
 * Parameters: a string goes as text's binary form, its bytes with their
 * length (text parameters would be read up to a NUL); a number as text
 */

#define NGX_HTTP_AGENT_PG_STR  25

static const Oid  ngx_http_agent_pg_s[] = { NGX_HTTP_AGENT_PG_STR };
static const int  ngx_http_agent_pg_b[] = { 1 };

static const Oid  ngx_http_agent_pg_snn[] = { NGX_HTTP_AGENT_PG_STR, 0, 0 };
static const int  ngx_http_agent_pg_bnn[] = { 1, 0, 0 };

static const Oid  ngx_http_agent_pg_snnn[] = { NGX_HTTP_AGENT_PG_STR,
                                               0, 0, 0 };
static const int  ngx_http_agent_pg_bnnn[] = { 1, 0, 0, 0 };

static const Oid  ngx_http_agent_pg_ss[] = { NGX_HTTP_AGENT_PG_STR,
                                             NGX_HTTP_AGENT_PG_STR };
static const int  ngx_http_agent_pg_bb[] = { 1, 1 };


#define NGX_HTTP_AGENT_PG_R_CONV                                             \
    "SELECT agent, last_seq, owner, queue_id FROM conversations"             \
    " WHERE id = $1"

#define NGX_HTTP_AGENT_PG_R_TAIL                                             \
    "SELECT seq, type, data FROM events WHERE conversation = $1"             \
    " AND seq >= coalesce((SELECT max(seq) FROM events"                      \
    " WHERE conversation = $1 AND type = 'user_msg'), 1)"                    \
    " ORDER BY seq"

#define NGX_HTTP_AGENT_PG_R_RANGE                                            \
    "SELECT seq, type, data FROM events WHERE conversation = $1"             \
    " AND seq > $2::bigint AND ($3::bigint = 0 OR seq <= $3::bigint)"        \
    " ORDER BY seq LIMIT nullif($4::bigint, 0)"

#define NGX_HTTP_AGENT_PG_R_SUMMARY                                          \
    "SELECT (data::json->>'to_seq')::bigint FROM events"                     \
    " WHERE conversation = $1 AND type = 'summary'"                          \
    " ORDER BY seq DESC LIMIT 1"

/* a source id that is not a string is none, as in SQLite's read */
#define NGX_HTTP_AGENT_PG_R_SOURCES                                          \
    "SELECT seq, (j->>'turn')::bigint, CASE WHEN"                            \
    " json_typeof(j->'source_id') = 'string' THEN j->>'source_id' END"       \
    " FROM (SELECT seq, data::json AS j FROM events"                         \
    " WHERE conversation = $1 AND type = 'user_msg'"                         \
    " ORDER BY seq DESC LIMIT 16) s ORDER BY seq DESC"

#define NGX_HTTP_AGENT_PG_R_QUEUED                                           \
    "SELECT id, data FROM queued WHERE conversation = $1"                    \
    " ORDER BY front DESC, CASE front WHEN 1 THEN -id ELSE id END"

/* the waiting calls already announced (see agent_notify) */
#define NGX_HTTP_AGENT_PG_R_NOTIFIED                                         \
    "SELECT n.call, n.kind FROM notified n JOIN tool_calls t"                \
    " ON t.conversation = n.conversation AND t.id = n.call"                  \
    " WHERE n.conversation = $1 AND t.status = 'suspended'"

#define NGX_HTTP_AGENT_PG_NOTIFY_DONE                                        \
    "INSERT INTO notified (conversation, call, kind) VALUES ($1, $2, $3)"    \
    " ON CONFLICT DO NOTHING"

#define NGX_HTTP_AGENT_PG_SWEEP_N  64

/*
 * On a node ($3), those that no other node that lives owns: this
 * node's, and those of nodes whose heartbeat is older than the ttl
 * ($4, ms) or of none, claimed here (the epoch up, as a revival's
 * claim), rows another sweeper holds skipped; the revival that follows
 * finds them this node's
 */
#define NGX_HTTP_AGENT_PG_SWEEP                                              \
    "WITH s AS (SELECT conversation AS id FROM (SELECT DISTINCT conversation"\
    " FROM tool_calls WHERE status = 'suspended' AND deadline <= $1::bigint" \
    " LIMIT $2::bigint) a"                                                   \
    " UNION SELECT id FROM (SELECT id FROM conversations"                    \
    " WHERE state = 'running' LIMIT $2::bigint) b"                           \
    " UNION SELECT conversation FROM (SELECT DISTINCT conversation"          \
    " FROM queued LIMIT $2::bigint) c),"                                     \
    " d AS (SELECT v.id FROM conversations v"                                \
    " LEFT JOIN nodes n ON n.id = v.node"                                    \
    " WHERE $3 <> '' AND v.id IN (SELECT id FROM s)"                         \
    " AND v.node IS DISTINCT FROM $3 AND (v.node IS NULL"                    \
    " OR n.heartbeat IS NULL"                                                \
    " OR n.heartbeat <= now() - $4::bigint * interval '1 millisecond')"      \
    " FOR UPDATE OF v SKIP LOCKED),"                                         \
    " u AS (UPDATE conversations v SET node = $3, epoch = v.epoch + 1"       \
    " FROM d WHERE v.id = d.id RETURNING v.id)"                              \
    " SELECT id FROM u UNION SELECT s.id FROM s"                             \
    " LEFT JOIN conversations v ON v.id = s.id"                              \
    " WHERE $3 = '' OR v.node = $3"

#define NGX_HTTP_AGENT_PG_HEARTBEAT                                          \
    "INSERT INTO nodes (id, addr) VALUES ($1, nullif($2, ''))"               \
    " ON CONFLICT (id) DO UPDATE SET heartbeat = now()"

/*
 * A revival's claim, on a node: the conversation becomes this node's,
 * unless a node that lives owns it; the epoch goes up when it changes
 * hands, so that the writes of the node it was taken from are refused
 * (agent_write's fence)
 */
#define NGX_HTTP_AGENT_PG_CLAIM                                              \
    "UPDATE conversations v SET node = $2,"                                  \
    " epoch = CASE WHEN v.node = $2 THEN v.epoch ELSE v.epoch + 1 END"       \
    " WHERE id = $1 AND (v.node IS NULL OR v.node = $2 OR NOT EXISTS"        \
    " (SELECT 1 FROM nodes n WHERE n.id = v.node"                            \
    " AND n.heartbeat > now() - $3::bigint * interval '1 millisecond'))"     \
    " RETURNING epoch"

#define NGX_HTTP_AGENT_PG_OWNER                                              \
    "SELECT coalesce(n.addr, '') FROM conversations v"                       \
    " LEFT JOIN nodes n ON n.id = v.node WHERE v.id = $1"

/*
 * A message that waits for its turn: agent_enqueue() (schema).  A row
 * already queued with its queue id and this very message is
 * acknowledged first (queue ids are never given twice in a
 * conversation): it is a first run's, whose answer was lost with its
 * connection, and a second run answers as that one did.
 */
#define NGX_HTTP_AGENT_PG_ENQUEUE                                            \
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM queued WHERE conversation = $1"  \
    " AND id = $2::bigint AND data = $4) THEN 1"                             \
    " ELSE agent_enqueue($1, $2::bigint, $3::integer, $4, $5, $6::bigint)"   \
    " END"

/*
 * A take-over of the turn at seq $2 counted: a count taken at an earlier
 * seq is of a turn that got on since, and starts again
 */
#define NGX_HTTP_AGENT_PG_TAKEOVER                                           \
    "UPDATE conversations SET takeovers = CASE"                              \
    " WHEN takeover_seq >= $2::bigint THEN takeovers + 1 ELSE 1 END,"        \
    " takeover_seq = greatest(takeover_seq, $2::bigint)"                     \
    " WHERE id = $1 RETURNING takeovers"

/*
 * A conversation that left the zone at rest, all of it written, is no
 * node's: any node may claim it (a request, or the sweep for its
 * deadlines) without waiting for a ttl.  Only if it is still this
 * node's at the epoch the record had: one claimed meanwhile, by another
 * node or by this one again, stays claimed.
 */
#define NGX_HTTP_AGENT_PG_RELEASE                                            \
    "UPDATE conversations SET node = NULL"                                   \
    " WHERE id = $1 AND node = $2 AND epoch = $3::bigint AND last_seq > 0"

/*
 * a created id never used, left the zone: as if it had not been made
 * (on a node, only if still this node's; without one, the node is none)
 */
#define NGX_HTTP_AGENT_PG_FORGET                                             \
    "DELETE FROM conversations WHERE id = $1"                                \
    " AND node IS NOT DISTINCT FROM nullif($2, '')"                          \
    " AND epoch = $3::bigint AND last_seq = 0"

/*
 * A created id's row, bound to its agent and owner, this node's (the
 * first write then finds it so): the key makes the id the store's once,
 * whichever node drew it
 */
#define NGX_HTTP_AGENT_PG_CREATE                                             \
    "INSERT INTO conversations (id, agent, owner, last_seq, updated, node)"  \
    " VALUES ($1, $2, $3, 0, extract(epoch FROM now())::bigint,"             \
    " nullif($4, '')) ON CONFLICT (id) DO NOTHING RETURNING 1"

#define NGX_HTTP_AGENT_PG_LIST                                               \
    "SELECT id, state, updated, (SELECT count(*) FROM tool_calls t"          \
    "  WHERE t.conversation = c.id AND t.status = 'suspended')"              \
    " FROM conversations c"                                                  \
    " WHERE agent = $1 AND ($2::boolean OR owner = $3) AND id > $4"          \
    " AND last_seq > 0"                                                      \
    " ORDER BY id LIMIT $5::bigint"

#define NGX_HTTP_AGENT_PG_AUDIT_PAGE                                         \
    "SELECT call, turn, attempt, adapter, model, status, error,"             \
    " input_tokens, output_tokens, cached_tokens,"                           \
    " time_to_first_token_ms, duration_ms, started, worker"                  \
    " FROM model_calls WHERE conversation = $1 AND call > $2::bigint"        \
    " ORDER BY call LIMIT $3::bigint"


typedef struct {
    ngx_http_agent_store_read_t   *rd;
    ngx_pool_t                    *pool;
} ngx_http_agent_pg_read_ctx_t;


typedef struct {
    uint64_t                       now;
    ngx_array_t                   *ids;
    ngx_pool_t                    *pool;
} ngx_http_agent_pg_sweep_ctx_t;


/*
 * The conversation's row and its events, in one transaction that sees
 * one snapshot: the row and the events agree.  A revival's read
 * (NGX_HTTP_AGENT_STORE_TAIL) takes the source ids of the last messages
 * and the queued messages too.  On a connection found broken it is read
 * again from the start on a new one: the transaction is read-only, and
 * the claim before it (one statement, committed or not) leaves a
 * conversation this node's at the epoch the first run gave it.
 */

ngx_int_t
ngx_http_agent_pg_read(ngx_str_t *conninfo, ngx_http_agent_store_read_t *rd,
    ngx_pool_t *pool, ngx_log_t *log)
{
    ngx_int_t                      rc;
    ngx_http_agent_pg_read_ctx_t   ctx;

    ctx.rd = rd;
    ctx.pool = pool;

    rc = ngx_http_agent_pg_retry(conninfo, ngx_http_agent_pg_read_conn, &ctx,
                                 "read", log);

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\" cannot read "
                      "\"%V\"", ngx_http_agent_pg_name, &rd->id);
    }

    return rc;
}


static ngx_int_t
ngx_http_agent_pg_read_conn(PGconn *conn, void *data, ngx_log_t *log)
{
    ngx_http_agent_pg_read_ctx_t  *ctx = data;

    ngx_int_t                     rc;
    PGresult                     *res;
    ngx_pool_t                   *pool;
    ngx_http_agent_store_read_t  *rd;

    rd = ctx->rd;
    pool = ctx->pool;

    ngx_str_null(&rd->elsewhere);

    rd->events = ngx_array_create(pool, 16,
                                  sizeof(ngx_http_agent_store_event_t));
    rd->sources = ngx_array_create(pool, 4,
                                   sizeof(ngx_http_agent_store_source_t));
    rd->queued = ngx_array_create(pool, 1,
                                  sizeof(ngx_http_agent_store_queued_t));
    rd->notified = ngx_array_create(pool, 1,
                                  sizeof(ngx_http_agent_store_notified_t));
    if (rd->events == NULL || rd->sources == NULL || rd->queued == NULL
        || rd->notified == NULL)
    {
        return NGX_ERROR;
    }

    if (rd->after == NGX_HTTP_AGENT_STORE_TAIL
        && ngx_http_agent_pg_node.id.len)
    {
        if (ngx_http_agent_pg_claim(conn, rd, pool, log) != NGX_OK) {
            return NGX_ERROR;
        }

        if (rd->elsewhere.data) {
            return NGX_OK;
        }
    }

    res = ngx_http_agent_pg_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ"
                                 " READ ONLY", 0, NULL, NULL, NULL, NULL,
                                 "read", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    PQclear(res);

    rc = ngx_http_agent_pg_read_tx(conn, rd, pool, log);

    if (PQstatus(conn) == CONNECTION_BAD) {
        /* nothing to end: the connection broke under the read */
        return NGX_ERROR;
    }

    res = ngx_http_agent_pg_exec(conn, "COMMIT", 0, NULL, NULL, NULL, NULL,
                                 "read", log);

    if (res == NULL) {
        rc = NGX_ERROR;
    }

    PQclear(res);

    return rc;
}


/*
 * A revival claims the conversation first: rd->epoch, the epoch this
 * node holds it with; or rd->elsewhere, the address of the node that
 * owns it and lives.  A conversation the store does not have is claimed
 * by its first write.
 */

static ngx_int_t
ngx_http_agent_pg_claim(PGconn *conn, ngx_http_agent_store_read_t *rd,
    ngx_pool_t *pool, ngx_log_t *log)
{
    int          lengths[3];
    u_char       ttl[NGX_INT64_LEN + 1];
    PGresult    *res;
    const char  *values[3];

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR, 0 };
    static const int  formats[] = { 1, 1, 0 };

    *ngx_sprintf(ttl, "%M", ngx_http_agent_pg_node.ttl) = '\0';

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;
    values[1] = (char *) ngx_http_agent_pg_node.id.data;
    lengths[1] = ngx_http_agent_pg_node.id.len;
    values[2] = (char *) ttl;
    lengths[2] = 0;

    res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_CLAIM, 3, types,
                                 values, lengths, formats, "claim", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    if (PQntuples(res) == 1) {
        rd->epoch = ngx_http_agent_pg_int(res, 0, 0);
        PQclear(res);
        return NGX_OK;
    }

    PQclear(res);

    res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_OWNER, 1,
                                 ngx_http_agent_pg_s, values, lengths,
                                 ngx_http_agent_pg_b, "claim", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    if (PQntuples(res) == 1
        && ngx_http_agent_pg_copy(pool, res, 0, 0, &rd->elsewhere) != NGX_OK)
    {
        PQclear(res);
        return NGX_ERROR;
    }

    PQclear(res);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_pg_read_tx(PGconn *conn, ngx_http_agent_store_read_t *rd,
    ngx_pool_t *pool, ngx_log_t *log)
{
    int          lengths[4];
    u_char       after[NGX_INT64_LEN + 1], upto[NGX_INT64_LEN + 1];
    u_char       limit[NGX_INT64_LEN + 1];
    int64_t      to;
    ngx_int_t    rc;
    PGresult    *res;
    const char  *values[4];

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;

    res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_R_CONV, 1,
                                 ngx_http_agent_pg_s, values, lengths,
                                 ngx_http_agent_pg_b, "read", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    if (PQntuples(res) == 0) {
        PQclear(res);
        rd->last_seq = 0;
        return NGX_OK;
    }

    if (ngx_http_agent_pg_copy(pool, res, 0, 0, &rd->agent) != NGX_OK
        || ngx_http_agent_pg_copy(pool, res, 0, 2, &rd->owner) != NGX_OK)
    {
        PQclear(res);
        return NGX_ERROR;
    }

    rd->last_seq = ngx_http_agent_pg_int(res, 0, 1);
    rd->queue_id = ngx_http_agent_pg_int(res, 0, 3);
    PQclear(res);

    if (rd->after == NGX_HTTP_AGENT_STORE_TAIL) {
        return ngx_http_agent_pg_tail(conn, rd, pool, log);
    }

    if (rd->after == NGX_HTTP_AGENT_STORE_SUMMARY) {

        /*
         * the context starts after the range of the newest summary;
         * nothing is read if the zone holds the events after it
         */

        res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_R_SUMMARY, 1,
                                     ngx_http_agent_pg_s, values, lengths,
                                     ngx_http_agent_pg_b, "read", log);
        if (res == NULL) {
            return NGX_ERROR;
        }

        to = PQntuples(res) ? ngx_http_agent_pg_int(res, 0, 0) : 0;
        PQclear(res);

        if (to < 0 || (rd->upto && (uint64_t) to > rd->upto)) {
            to = rd->upto;
        }

        rd->after = to;
    }

    values[1] = (char *) after;
    *ngx_sprintf(after, "%uL", rd->after) = '\0';
    values[2] = (char *) upto;
    *ngx_sprintf(upto, "%uL", rd->upto) = '\0';
    values[3] = (char *) limit;
    *ngx_sprintf(limit, "%ui", rd->limit) = '\0';

    res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_R_RANGE, 4,
                                 ngx_http_agent_pg_snnn, values, lengths,
                                 ngx_http_agent_pg_bnnn, "read", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    rc = ngx_http_agent_pg_events(res, rd, pool, log);
    PQclear(res);

    return rc;
}


/* a revival's: the tail of the log, the last source ids, the queue */

static ngx_int_t
ngx_http_agent_pg_tail(PGconn *conn, ngx_http_agent_store_read_t *rd,
    ngx_pool_t *pool, ngx_log_t *log)
{
    int                               i, n, lengths[1];
    ngx_int_t                         rc;
    PGresult                         *res;
    const char                       *values[1];
    ngx_http_agent_store_queued_t    *q;
    ngx_http_agent_store_source_t    *src;
    ngx_http_agent_store_notified_t  *nt;

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;

    res = ngx_http_agent_pg_by_id(conn, NGX_HTTP_AGENT_PG_R_TAIL,
                                  values, lengths, log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    rc = ngx_http_agent_pg_events(res, rd, pool, log);
    PQclear(res);

    if (rc != NGX_OK) {
        return NGX_ERROR;
    }

    res = ngx_http_agent_pg_by_id(conn, NGX_HTTP_AGENT_PG_R_SOURCES,
                                  values, lengths, log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    n = PQntuples(res);

    for (i = 0; i < n; i++) {
        if (PQgetisnull(res, i, 2)) {
            continue;
        }

        src = ngx_array_push(rd->sources);
        if (src == NULL
            || ngx_http_agent_pg_copy(pool, res, i, 2, &src->source_id)
               != NGX_OK)
        {
            PQclear(res);
            return NGX_ERROR;
        }

        src->seq = ngx_http_agent_pg_int(res, i, 0);
        src->turn = ngx_http_agent_pg_int(res, i, 1);
    }

    PQclear(res);

    /* messages waiting for their turn, in the order they will run */

    res = ngx_http_agent_pg_by_id(conn, NGX_HTTP_AGENT_PG_R_QUEUED,
                                  values, lengths, log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    n = PQntuples(res);

    for (i = 0; i < n; i++) {
        q = ngx_array_push(rd->queued);
        if (q == NULL
            || ngx_http_agent_pg_copy(pool, res, i, 1, &q->data) != NGX_OK)
        {
            PQclear(res);
            return NGX_ERROR;
        }

        q->id = ngx_http_agent_pg_int(res, i, 0);
        q->front = 0;
    }

    PQclear(res);

    /* waiting calls whose notification was delivered */

    res = ngx_http_agent_pg_by_id(conn, NGX_HTTP_AGENT_PG_R_NOTIFIED,
                                  values, lengths, log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    n = PQntuples(res);

    for (i = 0; i < n; i++) {
        nt = ngx_array_push(rd->notified);
        if (nt == NULL
            || ngx_http_agent_pg_copy(pool, res, i, 0, &nt->call) != NGX_OK
            || ngx_http_agent_pg_copy(pool, res, i, 1, &nt->kind) != NGX_OK)
        {
            PQclear(res);
            return NGX_ERROR;
        }
    }

    PQclear(res);

    return NGX_OK;
}


static ngx_int_t
ngx_http_agent_pg_events(PGresult *res, ngx_http_agent_store_read_t *rd,
    ngx_pool_t *pool, ngx_log_t *log)
{
    int                            i, n;
    ngx_int_t                      type;
    ngx_http_agent_store_event_t  *ev;

    n = PQntuples(res);

    for (i = 0; i < n; i++) {
        ev = ngx_array_push(rd->events);
        if (ev == NULL) {
            return NGX_ERROR;
        }

        ngx_memzero(ev, sizeof(ngx_http_agent_store_event_t));

        ev->seq = ngx_http_agent_pg_int(res, i, 0);
        ev->conv = rd->id;
        ev->agent = rd->agent;

        type = ngx_http_agent_log_type((u_char *) PQgetvalue(res, i, 1),
                                       PQgetlength(res, i, 1));

        if (type == NGX_ERROR
            || ngx_http_agent_pg_copy(pool, res, i, 2, &ev->data) != NGX_OK)
        {
            ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\": event "
                          "%uL of \"%V\" cannot be read",
                          ngx_http_agent_pg_name, ev->seq, &rd->id);
            return NGX_ERROR;
        }

        ev->type = type;
    }

    return NGX_OK;
}


/*
 * The heartbeat and the sweep, once more on a new connection if the
 * kept one was found broken: a heartbeat set twice is set, and a
 * second sweep finds the conversations the first claimed already this
 * node's (their epoch up once) and answers them again
 */

ngx_int_t
ngx_http_agent_pg_sweep(ngx_str_t *conninfo, uint64_t now, ngx_array_t *ids,
    ngx_pool_t *pool, ngx_log_t *log)
{
    ngx_http_agent_pg_sweep_ctx_t  ctx;

    ctx.now = now;
    ctx.ids = ids;
    ctx.pool = pool;

    return ngx_http_agent_pg_retry(conninfo, ngx_http_agent_pg_sweep_conn,
                                   &ctx, "sweep", log);
}


static ngx_int_t
ngx_http_agent_pg_sweep_conn(PGconn *conn, void *data, ngx_log_t *log)
{
    ngx_http_agent_pg_sweep_ctx_t  *ctx = data;

    int                           i, n, lengths[4];
    u_char                        when[NGX_INT64_LEN + 1];
    u_char                        ttl[NGX_INT64_LEN + 1];
    ngx_str_t                    *id;
    PGresult                     *res;
    const char                   *values[4];
    ngx_http_agent_store_node_t  *node;

    static const Oid  types[] = { 0, 0, NGX_HTTP_AGENT_PG_STR, 0 };
    static const int  formats[] = { 0, 0, 1, 0 };

    node = &ngx_http_agent_pg_node;

    if (node->id.len) {

        /* the node's heartbeat goes with the sweep */

        values[0] = (char *) node->id.data;
        lengths[0] = node->id.len;
        values[1] = node->addr.data ? (char *) node->addr.data : "";
        lengths[1] = node->addr.len;

        res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_HEARTBEAT, 2,
                                     ngx_http_agent_pg_ss,
                                     values, lengths, ngx_http_agent_pg_bb,
                                     "heartbeat", log);
        if (res == NULL) {
            return NGX_ERROR;
        }

        PQclear(res);
    }

    *ngx_sprintf(when, "%uL", ctx->now) = '\0';
    *ngx_sprintf(ttl, "%M", node->ttl) = '\0';

    values[0] = (char *) when;
    values[1] = ngx_value(NGX_HTTP_AGENT_PG_SWEEP_N);
    values[2] = node->id.len ? (char *) node->id.data : "";
    values[3] = (char *) ttl;
    lengths[0] = 0;
    lengths[1] = 0;
    lengths[2] = node->id.len;
    lengths[3] = 0;

    res = ngx_http_agent_pg_exec(conn, NGX_HTTP_AGENT_PG_SWEEP, 4, types,
                                 values, lengths, formats, "sweep", log);
    if (res == NULL) {
        /* the heartbeat was written, though: the node's lease runs on */
        return node->id.len ? NGX_DECLINED : NGX_ERROR;
    }

    n = PQntuples(res);

    for (i = 0; i < n; i++) {
        id = ngx_array_push(ctx->ids);
        if (id == NULL
            || ngx_http_agent_pg_copy(ctx->pool, res, i, 0, id) != NGX_OK)
        {
            break;
        }
    }

    PQclear(res);

    return (i == n) ? NGX_OK : NGX_ERROR;
}


ngx_int_t
ngx_http_agent_pg_enqueue(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log)
{
    int          lengths[6];
    u_char       id[NGX_INT64_LEN + 2], epoch[NGX_INT64_LEN + 2];
    ngx_int_t    taken;

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR, 0, 0,
                                  NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR, 0 };
    static const int  formats[] = { 1, 0, 0, 1, 1, 0 };

    PGconn      *conn;
    PGresult    *res;
    const char  *values[6];

    *ngx_sprintf(id, "%L", rd->queue.id) = '\0';
    *ngx_sprintf(epoch, "%uL", rd->queue.epoch) = '\0';

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;
    values[1] = (char *) id;
    lengths[1] = 0;
    values[2] = rd->queue.front ? "1" : "0";
    lengths[2] = 0;
    values[3] = (char *) rd->queue.data.data;
    lengths[3] = rd->queue.data.len;
    values[4] = ngx_http_agent_pg_node.id.len
                ? (char *) ngx_http_agent_pg_node.id.data : "";
    lengths[4] = ngx_http_agent_pg_node.id.len;
    values[5] = (char *) epoch;
    lengths[5] = 0;

    res = ngx_http_agent_pg_query_again(conninfo, &conn,
                                        NGX_HTTP_AGENT_PG_ENQUEUE, 6, types,
                                        values, lengths, formats, "queue",
                                        log);
    if (res == NULL) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\" cannot queue "
                      "a message of \"%V\"", ngx_http_agent_pg_name, &rd->id);
        return NGX_ERROR;
    }

    taken = (PQntuples(res) == 1) ? ngx_http_agent_pg_int(res, 0, 0) : 0;

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    if (taken == 2) {
        /* the fence: another node owns the conversation now */
        return NGX_ABORT;
    }

    if (taken != 1) {
        ngx_log_error(NGX_LOG_ERR, log, 0, "agent store \"%s\" cannot queue "
                      "a message: queue id %L of \"%V\" is taken by another "
                      "message", ngx_http_agent_pg_name, rd->queue.id,
                      &rd->id);
        return NGX_ERROR;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_pg_takeover(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log)
{
    int          lengths[2];
    u_char       seq[NGX_INT64_LEN + 2];
    PGconn      *conn;
    PGresult    *res;
    const char  *values[2];

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR, 0 };
    static const int  formats[] = { 1, 0 };

    rd->takeovers = 0;

    *ngx_sprintf(seq, "%uL", rd->after) = '\0';

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;
    values[1] = (char *) seq;
    lengths[1] = 0;

    /*
     * not tried again on a broken connection: a count that went in
     * before the connection broke would be counted twice
     */

    res = ngx_http_agent_pg_query(conninfo, &conn, NGX_HTTP_AGENT_PG_TAKEOVER,
                                  2, types, values, lengths, formats,
                                  "count a take-over", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    if (PQntuples(res) == 1) {
        rd->takeovers = (ngx_uint_t) ngx_http_agent_pg_int(res, 0, 0);
    }

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    return NGX_OK;
}


ngx_int_t
ngx_http_agent_pg_release(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log)
{
    int          lengths[3];
    u_char       epoch[NGX_INT64_LEN + 2];
    const char  *values[3];

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR, 0 };
    static const int  formats[] = { 1, 1, 0 };

    if (ngx_http_agent_pg_node.id.len == 0 && rd->last_seq) {
        /* without agent_node nothing is claimed, nothing to let go */
        return NGX_OK;
    }

    *ngx_sprintf(epoch, "%uL", rd->epoch) = '\0';

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;
    values[1] = ngx_http_agent_pg_node.id.len
                ? (char *) ngx_http_agent_pg_node.id.data : "";
    lengths[1] = ngx_http_agent_pg_node.id.len;
    values[2] = (char *) epoch;
    lengths[2] = 0;

    return ngx_http_agent_pg_command(conninfo,
                                     rd->last_seq ? NGX_HTTP_AGENT_PG_RELEASE
                                                  : NGX_HTTP_AGENT_PG_FORGET,
                                     3, types, values, lengths, formats,
                                     "release", log);
}


ngx_int_t
ngx_http_agent_pg_create(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log)
{
    int          lengths[4];
    PGconn      *conn;
    PGresult    *res;
    ngx_int_t    made;
    const char  *values[4];

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR };
    static const int  formats[] = { 1, 1, 1, 1 };

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;
    values[1] = (char *) rd->agent.data;
    lengths[1] = rd->agent.len;
    values[2] = rd->owner.len ? (char *) rd->owner.data : "";
    lengths[2] = rd->owner.len;
    values[3] = ngx_http_agent_pg_node.id.len
                ? (char *) ngx_http_agent_pg_node.id.data : "";
    lengths[3] = ngx_http_agent_pg_node.id.len;

    /*
     * not tried again on a broken connection: a row made before the
     * connection broke would answer that the id is taken
     */

    res = ngx_http_agent_pg_query(conninfo, &conn, NGX_HTTP_AGENT_PG_CREATE,
                                  4, types, values, lengths, formats,
                                  "create", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    made = (PQntuples(res) == 1);

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    return made ? NGX_OK : NGX_DECLINED;
}


ngx_int_t
ngx_http_agent_pg_notified(ngx_str_t *conninfo,
    ngx_http_agent_store_read_t *rd, ngx_log_t *log)
{
    int          lengths[3];
    const char  *values[3];

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR };
    static const int  formats[] = { 1, 1, 1 };

    values[0] = (char *) rd->id.data;
    lengths[0] = rd->id.len;
    values[1] = (char *) rd->call.data;
    lengths[1] = rd->call.len;
    values[2] = (char *) rd->call_kind.data;
    lengths[2] = rd->call_kind.len;

    return ngx_http_agent_pg_command(conninfo, NGX_HTTP_AGENT_PG_NOTIFY_DONE,
                                     3, types, values, lengths, formats,
                                     "notified", log);
}


ngx_int_t
ngx_http_agent_pg_list(ngx_str_t *conninfo, ngx_http_agent_store_list_t *ls,
    ngx_log_t *log)
{
    int                           i, n, lengths[5];
    u_char                        limit[NGX_INT64_LEN + 1];
    PGconn                       *conn;
    PGresult                     *res;
    const char                   *values[5];
    ngx_http_agent_store_conv_t  *c;

    static const Oid  types[] = { NGX_HTTP_AGENT_PG_STR, 0,
                                  NGX_HTTP_AGENT_PG_STR,
                                  NGX_HTTP_AGENT_PG_STR, 0 };
    static const int  formats[] = { 1, 0, 1, 1, 0 };

    *ngx_sprintf(limit, "%ui", ls->limit + 1) = '\0';

    values[0] = (char *) ls->agent.data;
    lengths[0] = ls->agent.len;
    values[1] = ls->any_owner ? "t" : "f";
    lengths[1] = 1;
    values[2] = ls->owner.data ? (char *) ls->owner.data : "";
    lengths[2] = ls->owner.len;
    values[3] = ls->after.data ? (char *) ls->after.data : "";
    lengths[3] = ls->after.len;
    values[4] = (char *) limit;
    lengths[4] = 0;

    res = ngx_http_agent_pg_query_again(conninfo, &conn,
                                        NGX_HTTP_AGENT_PG_LIST, 5, types,
                                        values, lengths, formats, "list",
                                        log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    n = PQntuples(res);

    for (i = 0; i < n; i++) {
        c = ngx_array_push(ls->convs);
        if (c == NULL
            || ngx_http_agent_pg_copy(ls->pool, res, i, 0, &c->id) != NGX_OK
            || ngx_http_agent_pg_copy(ls->pool, res, i, 1, &c->state)
               != NGX_OK)
        {
            break;
        }

        c->updated = (uint64_t) ngx_http_agent_pg_int(res, i, 2) * 1000;
        c->pending = (ngx_uint_t) ngx_http_agent_pg_int(res, i, 3);
    }

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    return (i == n) ? NGX_OK : NGX_ERROR;
}


ngx_int_t
ngx_http_agent_pg_audit_page(ngx_str_t *conninfo,
    ngx_http_agent_audit_page_t *page, ngx_pool_t *pool, ngx_log_t *log)
{
    int                     i, n, lengths[3];
    u_char                  after[NGX_INT64_LEN + 1];
    u_char                  limit[NGX_INT64_LEN + 1];
    PGconn                 *conn;
    PGresult               *res;
    const char             *values[3];
    ngx_http_agent_bytes_t  b;

    ngx_memzero(&b, sizeof(ngx_http_agent_bytes_t));

    *ngx_sprintf(after, "%uL", page->after) = '\0';
    *ngx_sprintf(limit, "%ui", page->limit + 1) = '\0';

    values[0] = (char *) page->conv.data;
    lengths[0] = page->conv.len;
    values[1] = (char *) after;
    lengths[1] = 0;
    values[2] = (char *) limit;
    lengths[2] = 0;

    res = ngx_http_agent_pg_query_again(conninfo, &conn,
                                        NGX_HTTP_AGENT_PG_AUDIT_PAGE, 3,
                                        ngx_http_agent_pg_snn, values,
                                        lengths, ngx_http_agent_pg_bnn,
                                        "audit", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    n = PQntuples(res);

    if (ngx_http_agent_bytes_append(pool, &b, (u_char *) "[", 1) != NGX_OK) {
        goto failed;
    }

    for (i = 0; i < n; i++) {

        if ((ngx_uint_t) i == page->limit) {
            page->more = 1;
            break;
        }

        if ((i && ngx_http_agent_bytes_append(pool, &b, (u_char *) ",", 1)
                  != NGX_OK)
            || ngx_http_agent_pg_audit_json(pool, &b, res, i) != NGX_OK)
        {
            goto failed;
        }

        page->last = ngx_http_agent_pg_int(res, i, 0);
    }

    if (ngx_http_agent_bytes_append(pool, &b, (u_char *) "]", 1) != NGX_OK) {
        goto failed;
    }

    page->json.data = b.data;
    page->json.len = b.len;

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    return NGX_OK;

failed:

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    return NGX_ERROR;
}


/*
 * A row as JSON: numbers as they are, the texts escaped, the error (a
 * turn_failed reason the module wrote) as the JSON object it is
 */

static ngx_int_t
ngx_http_agent_pg_audit_json(ngx_pool_t *pool, ngx_http_agent_bytes_t *b,
    PGresult *res, int row)
{
    int      i, len;
    u_char  *p, *last, *v;
    size_t   size;

    static char  *keys[] = {
        "call", "turn", "attempt", "adapter", "model", "status", "error",
        "input_tokens", "output_tokens", "cached_tokens",
        "time_to_first_token_ms", "duration_ms", "started", "worker"
    };

    size = 2;

    for (i = 0; i < 14; i++) {
        size += ngx_strlen(keys[i]) + 8 + 6 * PQgetlength(res, row, i);
    }

    p = ngx_pnalloc(pool, size);
    if (p == NULL) {
        return NGX_ERROR;
    }

    last = p;
    *last++ = '{';

    for (i = 0; i < 14; i++) {
        last = ngx_sprintf(last, "%s\"%s\":", i ? "," : "", keys[i]);

        if (PQgetisnull(res, row, i)) {
            last = ngx_cpymem(last, "null", 4);
            continue;
        }

        v = (u_char *) PQgetvalue(res, row, i);
        len = PQgetlength(res, row, i);

        /* the texts: adapter, model, status; the error is JSON */

        if (i >= 3 && i <= 5) {
            *last++ = '"';
            last = (u_char *) ngx_escape_json(last, v, len);
            *last++ = '"';
            continue;
        }

        last = ngx_cpymem(last, v, len);
    }

    *last++ = '}';

    return ngx_http_agent_bytes_append(pool, b, p, last - p);
}


/*
 * A statement whose answer is only that it ran: a release, a forget, a
 * notification recorded, each of which a second run leaves as the
 * first left it (the release and the forget match the epoch the first
 * run saw, the record is keyed), so done again on a connection found
 * broken
 */

static ngx_int_t
ngx_http_agent_pg_command(ngx_str_t *conninfo, const char *sql, int n,
    const Oid *types, const char **values, const int *lengths,
    const int *formats, const char *what, ngx_log_t *log)
{
    PGconn    *conn;
    PGresult  *res;

    res = ngx_http_agent_pg_query_again(conninfo, &conn, sql, n, types,
                                        values, lengths, formats, what, log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    PQclear(res);
    ngx_http_agent_pg_put(conn, 1);

    return NGX_OK;
}


/* a statement of the read's transaction whose one parameter is the id */

static PGresult *
ngx_http_agent_pg_by_id(PGconn *conn, const char *sql, const char **values,
    int *lengths, ngx_log_t *log)
{
    return ngx_http_agent_pg_exec(conn, sql, 1, ngx_http_agent_pg_s, values,
                                  lengths, ngx_http_agent_pg_b, "read", log);
}


static ngx_int_t
ngx_http_agent_pg_copy(ngx_pool_t *pool, PGresult *res, int row, int col,
    ngx_str_t *s)
{
    s->len = PQgetlength(res, row, col);
    s->data = ngx_pnalloc(pool, s->len + 1);

    if (s->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(s->data, PQgetvalue(res, row, col), s->len);
    s->data[s->len] = '\0';

    return NGX_OK;
}


/* a bigint column in text, 0 if NULL */

static int64_t
ngx_http_agent_pg_int(PGresult *res, int row, int col)
{
    if (PQgetisnull(res, row, col)) {
        return 0;
    }

    return (int64_t) strtoll(PQgetvalue(res, row, col), NULL, 10);
}
