
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_agent_store_pg.h"


/*
 * PostgreSQL's schema, made or migrated when the master loads the
 * configuration.  Several nginx may share one database, each master
 * migrating as it starts: the masters take an advisory lock first, so
 * one migrates and the others find it done.  Each version is a
 * migration of its own, in its own transaction, recorded in
 * schema_version.
 *
 * The tables are SQLite's (ngx_http_agent_store_sqlite_schema.c), with
 * what ownership by a node will need: the nodes, each conversation's
 * node and epoch (the fence a node's writes will check), the take-overs
 * a conversation had (a turn that kills its nodes ends), and the queue's
 * counter.  Ids sort as bytes ("C"), as SQLite sorts them: a list's
 * pages follow the same order whatever the database's locale.  Event
 * data is text, never jsonb: subscribers and the model's prompt cache
 * need the bytes that were written.
 */


#define NGX_HTTP_AGENT_PG_VERSION  4

/* the advisory lock of the migrations: "ngin", "xage" */
#define NGX_HTTP_AGENT_PG_LOCK  "1852270446, 2019649381"


static ngx_int_t ngx_http_agent_pg_simple(PGconn *conn, const char *sql,
    const char *what, ngx_log_t *log, PGresult **out);
static ngx_int_t ngx_http_agent_pg_register(PGconn *conn, ngx_log_t *log);


#define NGX_HTTP_AGENT_PG_TABLES                                             \
    "CREATE TABLE nodes ("                                                   \
    "  id text COLLATE \"C\" PRIMARY KEY, addr text,"                        \
    "  started timestamptz NOT NULL DEFAULT now(),"                          \
    "  heartbeat timestamptz NOT NULL DEFAULT now());"                       \
    "CREATE TABLE conversations ("                                           \
    "  id text COLLATE \"C\" PRIMARY KEY, agent text NOT NULL,"              \
    "  last_seq bigint NOT NULL, updated bigint NOT NULL,"                   \
    "  state text NOT NULL DEFAULT 'idle',"                                  \
    "  owner text NOT NULL DEFAULT '',"                                      \
    "  node text COLLATE \"C\", epoch bigint NOT NULL DEFAULT 0,"            \
    "  takeovers integer NOT NULL DEFAULT 0,"                                \
    "  takeover_seq bigint NOT NULL DEFAULT 0,"                              \
    "  queue_id bigint NOT NULL DEFAULT 0);"                                 \
    "CREATE INDEX conversations_state ON conversations (state)"              \
    "  WHERE state = 'running';"                                             \
    "CREATE INDEX conversations_node ON conversations (node)"                \
    "  WHERE node IS NOT NULL;"                                              \
    "CREATE TABLE events ("                                                  \
    "  conversation text COLLATE \"C\" NOT NULL, seq bigint NOT NULL,"       \
    "  type text NOT NULL, data text NOT NULL,"                              \
    "  epoch bigint NOT NULL DEFAULT 0,"                                     \
    "  PRIMARY KEY (conversation, seq));"                                    \
    "CREATE TABLE tool_calls ("                                              \
    "  conversation text COLLATE \"C\" NOT NULL, id text NOT NULL,"          \
    "  name text NOT NULL, seq bigint NOT NULL, executor text,"              \
    "  kind text, status text NOT NULL, deadline bigint,"                    \
    "  ok integer, result text,"                                             \
    "  PRIMARY KEY (conversation, id));"                                     \
    "CREATE INDEX tool_calls_due ON tool_calls (deadline)"                   \
    "  WHERE status = 'suspended';"                                          \
    "CREATE TABLE queued ("                                                  \
    "  conversation text COLLATE \"C\" NOT NULL, id bigint NOT NULL,"        \
    "  front integer NOT NULL, data text NOT NULL,"                          \
    "  PRIMARY KEY (conversation, id));"                                     \
    "CREATE TABLE model_calls ("                                             \
    "  conversation text COLLATE \"C\" NOT NULL, call bigint NOT NULL,"      \
    "  turn bigint NOT NULL, attempt bigint NOT NULL,"                       \
    "  adapter text NOT NULL, model text NOT NULL,"                          \
    "  status text NOT NULL, error text,"                                    \
    "  input_tokens bigint, output_tokens bigint, cached_tokens bigint,"     \
    "  time_to_first_token_ms bigint, duration_ms bigint,"                   \
    "  started bigint NOT NULL, worker bigint NOT NULL,"                     \
    "  node text NOT NULL DEFAULT '',"                                       \
    "  PRIMARY KEY (conversation, call));"                                   \
    "CREATE INDEX model_calls_start ON model_calls"                          \
    "  (conversation, started, worker);"                                     \
    "CREATE INDEX model_calls_running ON model_calls"                        \
    "  (conversation, started, worker) WHERE status = 'running';"


/*
 * A batch's events, in one call (ngx_http_agent_store_pg.c), in order:
 * on a node (p_n not empty), each conversation's run first checks the
 * fence: the row, locked, must be this node's, at the epoch the node
 * holds it with, or the call raises AG001 "ownership lost" with the
 * conversation in its detail, and the whole batch is rolled back
 * (another node took it: nothing of this node's may go in its log).
 * each conversation's run of events is followed by its row (its last
 * seq, kept if a batch written before went further) and, if an event
 * of the run was new and not a summary, its state.  p_e: 0 a summary,
 * 1 an event inside a turn, 2 one that ends a turn.  An event the table
 * had already (a batch written again) derives nothing, as in SQLite;
 * since version 4 it must be the same event (below).  Version 2's
 * function, made of the parts that version 4's shares.
 */

/* the function's parameters, and its variables but those given */

#define NGX_HTTP_AGENT_PG_WRITE_FN(vars)                                     \
    "agent_write(p_c text[], p_a text[],"                                    \
    "  p_o text[], p_s bigint[], p_t text[], p_e bigint[], p_d text[],"      \
    "  p_n text, p_ep bigint[])"                                             \
    " RETURNS integer LANGUAGE plpgsql AS $f$"                               \
    " DECLARE"                                                               \
    "  n integer := coalesce(array_length(p_s, 1), 0);"                      \
    "  ends bigint := 0; q bigint := 0; j json; st text;"                    \
    "  own text; ep bigint;" vars

/* the fence, and the event's insert */

#define NGX_HTTP_AGENT_PG_WRITE_INSERT                                       \
    " BEGIN"                                                                 \
    "  FOR i IN 1 .. n LOOP"                                                 \
    "   IF p_n <> '' AND (i = 1 OR p_c[i - 1] <> p_c[i]) THEN"              \
    "    SELECT node, epoch INTO own, ep FROM conversations"                 \
    "     WHERE id = p_c[i] FOR UPDATE;"                                     \
    "    IF FOUND AND (own <> p_n OR ep <> p_ep[i]) THEN"                    \
    "     RAISE EXCEPTION 'ownership lost' USING ERRCODE = 'AG001',"         \
    "      DETAIL = p_c[i];"                                                 \
    "    END IF;"                                                            \
    "   END IF;"                                                             \
    "   INSERT INTO events (conversation, seq, type, data, epoch)"           \
    "    VALUES (p_c[i], p_s[i], p_t[i], p_d[i], p_ep[i])"                   \
    "    ON CONFLICT DO NOTHING;"

/* a new event's derivation */

#define NGX_HTTP_AGENT_PG_WRITE_NEW                                          \
    "    IF p_t[i] IN ('tool_call', 'suspension', 'resolution',"             \
    "                  'tool_result', 'user_msg') THEN"                      \
    "     j := p_d[i]::json;"                                                \
    "    END IF;"                                                            \
    "    CASE p_t[i]"                                                        \
    "    WHEN 'tool_call' THEN"                                              \
    "     INSERT INTO tool_calls"                                            \
    "      (conversation, id, name, seq, executor, status)"                  \
    "      VALUES (p_c[i], j->>'tool_call_id', coalesce(j->>'name', ''),"    \
    "              p_s[i], j->>'executor', 'called')"                        \
    "      ON CONFLICT DO NOTHING;"                                          \
    "    WHEN 'suspension' THEN"                                             \
    "     UPDATE tool_calls SET status = 'suspended', kind = j->>'kind',"    \
    "      executor = j->>'executor',"                                       \
    "      deadline = (j->>'deadline')::bigint"                              \
    "      WHERE conversation = p_c[i] AND id = j->>'tool_call_id';"         \
    "    WHEN 'resolution' THEN"                                             \
    "     UPDATE tool_calls SET status = 'resolved'"                         \
    "      WHERE conversation = p_c[i] AND id = j->>'tool_call_id'"          \
    "      AND status = 'suspended';"                                        \
    "    WHEN 'tool_result' THEN"                                            \
    "     UPDATE tool_calls SET status = 'done',"                            \
    "      ok = (j->>'ok')::boolean::integer,"                               \
    "      result = coalesce(j->>'result', j->>'error')"                     \
    "      WHERE conversation = p_c[i] AND id = j->>'tool_call_id';"         \
    "    WHEN 'user_msg' THEN"                                               \
    "     DELETE FROM queued WHERE conversation = p_c[i]"                    \
    "      AND id = (j->>'queue_id')::bigint;"                               \
    "     q := greatest(q, coalesce((j->>'queue_id')::bigint, 0));"          \
    "    ELSE NULL;"                                                         \
    "    END CASE;"                                                          \
    "    IF p_e[i] > 0 THEN ends := p_e[i]; END IF;"

/* the conversations' rows and states, at each run's end */

#define NGX_HTTP_AGENT_PG_WRITE_ROWS                                         \
    "   END IF;"                                                             \
    "   IF i = n OR p_c[i + 1] <> p_c[i] THEN"                               \
    "    INSERT INTO conversations AS v (id, agent, owner, last_seq,"        \
    "     updated, queue_id, node, epoch) VALUES (p_c[i], p_a[i], p_o[i],"   \
    "     p_s[i], extract(epoch FROM now())::bigint, q, nullif(p_n, ''),"    \
    "     p_ep[i])"                                                          \
    "     ON CONFLICT (id) DO UPDATE SET"                                    \
    "     node = coalesce(v.node, excluded.node),"                           \
    "     last_seq = greatest(v.last_seq, excluded.last_seq),"               \
    "     updated = excluded.updated,"                                       \
    "     queue_id = greatest(v.queue_id, excluded.queue_id);"               \
    "    IF ends > 0 THEN"                                                   \
    "     st := CASE WHEN ends = 2 THEN 'idle'"                              \
    "      WHEN EXISTS (SELECT 1 FROM tool_calls WHERE conversation = p_c[i]"\
    "       AND (status = 'called' OR status = 'resolved')) THEN 'running'"  \
    "      WHEN EXISTS (SELECT 1 FROM tool_calls WHERE conversation = p_c[i]"\
    "       AND status = 'suspended') THEN 'awaiting_input'"                 \
    "      ELSE 'running' END;"                                              \
    "     UPDATE conversations SET state = st"                               \
    "      WHERE id = p_c[i] AND state <> st;"                               \
    "    END IF;"                                                            \
    "    ends := 0; q := 0;"                                                 \
    "   END IF;"                                                             \
    "  END LOOP;"                                                            \
    "  RETURN n;"                                                            \
    " END $f$;"


#define NGX_HTTP_AGENT_PG_WRITE                                              \
    "DROP FUNCTION IF EXISTS agent_write(text[], text[], text[], bigint[],"  \
    "  text[], bigint[], text[]);"                                           \
    "CREATE FUNCTION " NGX_HTTP_AGENT_PG_WRITE_FN("")                        \
    NGX_HTTP_AGENT_PG_WRITE_INSERT                                           \
    "   IF FOUND THEN"                                                       \
    NGX_HTTP_AGENT_PG_WRITE_NEW                                              \
    NGX_HTTP_AGENT_PG_WRITE_ROWS


/* a call's end, on its row */
#define NGX_HTTP_AGENT_PG_AUDIT_END                                          \
    "    UPDATE model_calls SET status = p_stat[i],"                         \
    "     error = nullif(p_err[i], ''), input_tokens = p_in[i],"             \
    "     output_tokens = p_out[i], cached_tokens = p_ca[i],"                \
    "     time_to_first_token_ms = CASE WHEN p_first[i] < 0 THEN NULL"       \
    "      ELSE p_first[i] END, duration_ms = p_dur[i]"


/*
 * The audit's rows of a batch (see ngx_http_agent_store_sqlite_audit.c
 * for the numbering): p_e 0 a call's start, 1 its end.  Rows that
 * cannot be written are undone and the error returned: the batch's
 * events are committed all the same.
 */

#define NGX_HTTP_AGENT_PG_AUDIT                                              \
    "CREATE OR REPLACE FUNCTION agent_audit(p_c text[], p_st bigint[],"      \
    "  p_w bigint[], p_e bigint[], p_turn bigint[], p_att bigint[],"         \
    "  p_ad text[], p_mo text[], p_stat text[], p_err text[],"               \
    "  p_in bigint[], p_out bigint[], p_ca bigint[], p_first bigint[],"      \
    "  p_dur bigint[])"                                                      \
    " RETURNS text LANGUAGE plpgsql AS $f$"                                  \
    " DECLARE moved integer;"                                                \
    " BEGIN"                                                                 \
    "  FOR i IN 1 .. coalesce(array_length(p_c, 1), 0) LOOP"                 \
    "   IF p_e[i] = 0 THEN"                                                  \
    "    UPDATE model_calls SET status = 'lost' WHERE conversation = p_c[i]" \
    "     AND (started, worker) < (p_st[i], p_w[i])"                         \
    "     AND status = 'running';"                                           \
    "    UPDATE model_calls SET call = -call - 1"                            \
    "     WHERE conversation = p_c[i]"                                       \
    "     AND (started, worker) > (p_st[i], p_w[i]);"                        \
    "    GET DIAGNOSTICS moved = ROW_COUNT;"                                 \
    "    IF moved > 0 THEN"                                                  \
    "     UPDATE model_calls SET call = -call"                               \
    "      WHERE conversation = p_c[i] AND call < 0;"                        \
    "    END IF;"                                                            \
    "    INSERT INTO model_calls (conversation, call, started, worker,"      \
    "     turn, attempt, adapter, model, status)"                            \
    "     VALUES (p_c[i], coalesce((SELECT m.call FROM model_calls m"        \
    "      WHERE m.conversation = p_c[i]"                                    \
    "      AND (m.started, m.worker) < (p_st[i], p_w[i])"                    \
    "      ORDER BY m.started DESC, m.worker DESC LIMIT 1), 0) + 1,"         \
    "      p_st[i], p_w[i], p_turn[i], p_att[i], p_ad[i], p_mo[i],"          \
    "      'running');"                                                      \
    "   ELSE"                                                                \
    NGX_HTTP_AGENT_PG_AUDIT_END                                              \
    "     WHERE conversation = p_c[i] AND started = p_st[i]"                 \
    "     AND worker = p_w[i];"                                              \
    "   END IF;"                                                             \
    "  END LOOP;"                                                            \
    "  RETURN NULL;"                                                         \
    " EXCEPTION WHEN OTHERS THEN"                                            \
    "  RETURN SQLERRM;"                                                      \
    " END $f$;"


/*
 * A queued message (agent_busy queue), fenced as a batch is: 2 when the
 * conversation's row is another node's, or of another epoch (the node
 * lost it), and nothing written.  The queue id is the zone's, and
 * conversations.queue_id the last one given, advanced here: an id given
 * before (by a node that lost the conversation, or a count set back) is
 * written only if it is this very message's, whose turn came first and
 * wrote its user_msg (1: the event ends with the message's fields, as
 * SQLite's check reads it); else 0.  A conversation with no row yet (its
 * first batch not written) has its row's count from its user_msgs, and
 * a revival takes the queued rows' ids into its count too.
 */

#define NGX_HTTP_AGENT_PG_ENQUEUE_FN                                         \
    "CREATE FUNCTION agent_enqueue(p_c text, p_id bigint, p_f integer,"      \
    "  p_d text, p_n text, p_ep bigint)"                                     \
    " RETURNS integer LANGUAGE plpgsql AS $f$"                               \
    " DECLARE own text; ep bigint; given bigint; d text;"                    \
    " BEGIN"                                                                 \
    "  SELECT node, epoch, queue_id INTO own, ep, given FROM conversations"  \
    "   WHERE id = p_c FOR UPDATE;"                                          \
    "  IF FOUND THEN"                                                        \
    "   IF p_n <> '' AND (own <> p_n OR ep <> p_ep) THEN RETURN 2; END IF;"  \
    "   IF given < p_id THEN"                                                \
    "    UPDATE conversations SET queue_id = p_id WHERE id = p_c;"           \
    "   END IF;"                                                             \
    "  END IF;"                                                              \
    "  SELECT data INTO d FROM events WHERE conversation = p_c"              \
    "   AND type = 'user_msg' AND (data::json->>'queue_id')::bigint = p_id"  \
    "   LIMIT 1;"                                                            \
    "  IF FOUND THEN"                                                        \
    "   RETURN (right(d, char_length(p_d) - 1) = substr(p_d, 2))::integer;"  \
    "  END IF;"                                                              \
    "  IF given >= p_id THEN RETURN 0; END IF;"                              \
    "  INSERT INTO queued (conversation, id, front, data)"                   \
    "   VALUES (p_c, p_id, p_f, p_d) ON CONFLICT DO NOTHING;"                \
    "  RETURN FOUND::integer;"                                               \
    " END $f$;"


/*
 * The audit's rows fenced as the events are: a row of a conversation
 * another node owns raises AG001 (the batch rolled back, the node has
 * lost it); one of this node's, or of none, made at another epoch than
 * the row's (a row written late, after the conversation was let go and
 * claimed again) is left out, and the batch goes on.  Keyed by node
 * too: a call's end finds its start by conversation, start, node and
 * worker, which two nodes' workers of one pid do not share.  The rows'
 * own errors are returned, as before.
 */

#define NGX_HTTP_AGENT_PG_AUDIT_FENCED                                       \
    "DROP FUNCTION agent_audit(text[], bigint[], bigint[], bigint[],"        \
    "  bigint[], bigint[], text[], text[], text[], text[], bigint[],"        \
    "  bigint[], bigint[], bigint[], bigint[]);"                             \
    "DROP INDEX model_calls_start;"                                          \
    "DROP INDEX model_calls_running;"                                        \
    "CREATE INDEX model_calls_start ON model_calls"                          \
    "  (conversation, started, node, worker);"                               \
    "CREATE INDEX model_calls_running ON model_calls"                        \
    "  (conversation, started, node, worker) WHERE status = 'running';"      \
    "CREATE FUNCTION agent_audit(p_c text[], p_st bigint[],"                 \
    "  p_w bigint[], p_e bigint[], p_turn bigint[], p_att bigint[],"         \
    "  p_ad text[], p_mo text[], p_stat text[], p_err text[],"               \
    "  p_in bigint[], p_out bigint[], p_ca bigint[], p_first bigint[],"      \
    "  p_dur bigint[], p_n text, p_ep bigint[])"                             \
    " RETURNS text LANGUAGE plpgsql AS $f$"                                  \
    " DECLARE moved integer; own text; ep bigint;"                           \
    "  n integer := coalesce(array_length(p_c, 1), 0);"                      \
    "  skip boolean[] := array_fill(false, ARRAY[n]);"                       \
    " BEGIN"                                                                 \
    "  FOR i IN 1 .. n LOOP"                                                 \
    "   IF p_n <> '' THEN"                                                   \
    "    SELECT node, epoch INTO own, ep FROM conversations"                 \
    "     WHERE id = p_c[i] FOR UPDATE;"                                     \
    "    IF FOUND AND own <> p_n THEN"                                       \
    "     RAISE EXCEPTION 'ownership lost' USING ERRCODE = 'AG001',"         \
    "      DETAIL = p_c[i];"                                                 \
    "    END IF;"                                                            \
    "    skip[i] := FOUND AND ep <> p_ep[i];"                                \
    "   END IF;"                                                             \
    "  END LOOP;"                                                            \
    "  BEGIN"                                                                \
    "  FOR i IN 1 .. n LOOP"                                                 \
    "   CONTINUE WHEN skip[i];"                                              \
    "   IF p_e[i] = 0 THEN"                                                  \
    "    UPDATE model_calls SET status = 'lost' WHERE conversation = p_c[i]" \
    "     AND (started, node, worker) < (p_st[i], p_n, p_w[i])"              \
    "     AND status = 'running';"                                           \
    "    UPDATE model_calls SET call = -call - 1"                            \
    "     WHERE conversation = p_c[i]"                                       \
    "     AND (started, node, worker) > (p_st[i], p_n, p_w[i]);"             \
    "    GET DIAGNOSTICS moved = ROW_COUNT;"                                 \
    "    IF moved > 0 THEN"                                                  \
    "     UPDATE model_calls SET call = -call"                               \
    "      WHERE conversation = p_c[i] AND call < 0;"                        \
    "    END IF;"                                                            \
    "    INSERT INTO model_calls (conversation, call, started, node, worker,"\
    "     turn, attempt, adapter, model, status)"                            \
    "     VALUES (p_c[i], coalesce((SELECT m.call FROM model_calls m"        \
    "      WHERE m.conversation = p_c[i]"                                    \
    "      AND (m.started, m.node, m.worker) < (p_st[i], p_n, p_w[i])"       \
    "      ORDER BY m.started DESC, m.node DESC, m.worker DESC LIMIT 1), 0)" \
    "      + 1, p_st[i], p_n, p_w[i], p_turn[i], p_att[i], p_ad[i],"         \
    "      p_mo[i], 'running');"                                             \
    "   ELSE"                                                                \
    NGX_HTTP_AGENT_PG_AUDIT_END                                              \
    "     WHERE conversation = p_c[i] AND started = p_st[i]"                 \
    "     AND node = p_n AND worker = p_w[i];"                               \
    "   END IF;"                                                             \
    "  END LOOP;"                                                            \
    "  RETURN NULL;"                                                         \
    "  EXCEPTION WHEN OTHERS THEN"                                           \
    "   RETURN SQLERRM;"                                                     \
    "  END;"                                                                 \
    " END $f$;"


/*
 * The notifications delivered of waiting calls, by conversation, call and
 * kind: a node that revives a conversation (a take-over, a restart) does
 * not announce its waiting calls again.  A row per notification, kept
 * with the conversation as its events are.
 */

#define NGX_HTTP_AGENT_PG_NOTIFIED                                           \
    "CREATE TABLE notified ("                                                \
    "  conversation text COLLATE \"C\" NOT NULL, call text NOT NULL,"        \
    "  kind text NOT NULL, PRIMARY KEY (conversation, call, kind));"


/*
 * 4: an event whose seq the log holds already is the same event only if
 * it has the same epoch, type and bytes: a batch written twice (a
 * COMMIT's answer lost, a batch tried again) sends the zone's events,
 * which never change, and changes nothing, as before.  Another event
 * there (written under an older epoch, by a node that held the
 * conversation before; or under this epoch, by a batch collected before
 * the node's lease lapsed and written after the node claimed the
 * conversation again) means the writer's copy of the conversation is
 * not the log's: the call raises AG002 (detail: the conversation, hint:
 * the seq) and the batch is rolled back, as for AG001, so that nothing
 * of that copy is taken as written; the writer drops the conversation
 * from its zone, and its next request or the sweep revives it from the
 * log.  The comparison costs only a conflict, which is rare.
 */

#define NGX_HTTP_AGENT_PG_WRITE_GUARDED                                      \
    "CREATE OR REPLACE FUNCTION "                                            \
    NGX_HTTP_AGENT_PG_WRITE_FN(" seen bigint; kind text; body text;")        \
    NGX_HTTP_AGENT_PG_WRITE_INSERT                                           \
    "   IF NOT FOUND THEN"                                                   \
    "    SELECT epoch, type, data INTO seen, kind, body FROM events"         \
    "     WHERE conversation = p_c[i] AND seq = p_s[i];"                     \
    "    IF seen <> p_ep[i] OR kind <> p_t[i] OR body <> p_d[i] THEN"        \
    "     RAISE EXCEPTION 'the log at seq % holds another event', p_s[i]"    \
    "      USING ERRCODE = 'AG002', DETAIL = p_c[i],"                        \
    "      HINT = p_s[i]::text;"                                             \
    "    END IF;"                                                            \
    "   ELSE"                                                                \
    NGX_HTTP_AGENT_PG_WRITE_NEW                                              \
    NGX_HTTP_AGENT_PG_WRITE_ROWS


/*
 * 2: writes fenced by a node's epoch, the epoch kept with each event;
 * 3: queued messages and the audit's rows fenced too, the queue's count
 * advanced as messages are queued, the audit keyed by node, the
 * notifications delivered; 4: an event at a seq the log holds with
 * another event refused (AG002)
 */

static char  *ngx_http_agent_pg_migrations[NGX_HTTP_AGENT_PG_VERSION] = {
    NGX_HTTP_AGENT_PG_TABLES
    NGX_HTTP_AGENT_PG_AUDIT,
    NGX_HTTP_AGENT_PG_WRITE,
    NGX_HTTP_AGENT_PG_ENQUEUE_FN
    NGX_HTTP_AGENT_PG_AUDIT_FENCED
    NGX_HTTP_AGENT_PG_NOTIFIED,
    NGX_HTTP_AGENT_PG_WRITE_GUARDED
};


ngx_int_t
ngx_http_agent_pg_open(ngx_str_t *conninfo, ngx_log_t *log)
{
    u_char     *p, sql[96];
    PGconn     *conn;
    PGresult   *res;
    ngx_int_t   version, v;

    conn = ngx_http_agent_pg_connect(conninfo, NGX_HTTP_AGENT_PG_OPEN_TIMEOUT,
                                     NGX_LOG_EMERG, log);
    if (conn == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_agent_pg_simple(conn,
                       "SELECT pg_advisory_lock(" NGX_HTTP_AGENT_PG_LOCK ");"
                       "CREATE TABLE IF NOT EXISTS schema_version ("
                       "  version integer PRIMARY KEY,"
                       "  applied timestamptz NOT NULL DEFAULT now());"
                       "SELECT coalesce(max(version), 0) FROM schema_version",
                       "schema", log, &res)
        != NGX_OK)
    {
        goto failed;
    }

    version = ngx_atoi((u_char *) PQgetvalue(res, 0, 0),
                       PQgetlength(res, 0, 0));
    PQclear(res);

    if (version == NGX_ERROR || version > NGX_HTTP_AGENT_PG_VERSION) {
        ngx_log_error(NGX_LOG_EMERG, log, 0,
                      "agent store \"%s\" has schema version %i, newer than "
                      "this module's %d", ngx_http_agent_pg_name, version,
                      NGX_HTTP_AGENT_PG_VERSION);
        goto failed;
    }

    for (v = version; v < NGX_HTTP_AGENT_PG_VERSION; v++) {

        if (v) {
            ngx_log_error(NGX_LOG_NOTICE, log, 0,
                          "agent store \"%s\": migrating the schema from "
                          "version %i to %i", ngx_http_agent_pg_name,
                          v, v + 1);
        }

        if (ngx_http_agent_pg_simple(conn, "BEGIN", "schema", log, NULL)
            != NGX_OK
            || ngx_http_agent_pg_simple(conn, ngx_http_agent_pg_migrations[v],
                                        "schema", log, NULL)
               != NGX_OK)
        {
            goto failed;
        }

        p = ngx_snprintf(sql, sizeof(sql) - 1,
                         "INSERT INTO schema_version (version) VALUES (%i);"
                         "COMMIT", v + 1);
        *p = '\0';

        if (ngx_http_agent_pg_simple(conn, (char *) sql, "schema", log, NULL)
            != NGX_OK)
        {
            goto failed;
        }
    }

    if (ngx_http_agent_pg_node.id.len
        && ngx_http_agent_pg_register(conn, log) != NGX_OK)
    {
        goto failed;
    }

    /* the lock goes with the session too: closed on an error above */

    (void) ngx_http_agent_pg_simple(conn,
                       "SELECT pg_advisory_unlock(" NGX_HTTP_AGENT_PG_LOCK ")",
                       "schema", log, NULL);

    PQfinish(conn);

    return NGX_OK;

failed:

    PQfinish(conn);

    return NGX_ERROR;
}


/* the node's row, its heartbeat fresh: it lives from now on */

static ngx_int_t
ngx_http_agent_pg_register(PGconn *conn, ngx_log_t *log)
{
    int          lengths[2];
    PGresult    *res;
    const char  *values[2];

    static const Oid  types[] = { 25, 25 };
    static const int  formats[] = { 1, 1 };

    values[0] = (char *) ngx_http_agent_pg_node.id.data;
    lengths[0] = ngx_http_agent_pg_node.id.len;
    values[1] = ngx_http_agent_pg_node.addr.data
                ? (char *) ngx_http_agent_pg_node.addr.data : "";
    lengths[1] = ngx_http_agent_pg_node.addr.len;

    res = ngx_http_agent_pg_exec(conn,
                    "INSERT INTO nodes (id, addr) VALUES ($1, nullif($2, ''))"
                    " ON CONFLICT (id) DO UPDATE SET addr = excluded.addr,"
                    " started = now(), heartbeat = now()",
                    2, types, values, lengths, formats, "node", log);
    if (res == NULL) {
        return NGX_ERROR;
    }

    PQclear(res);

    return NGX_OK;
}


/*
 * Statements in one string, through the simple protocol, each result
 * checked; the last's kept in *out if asked
 */

static ngx_int_t
ngx_http_agent_pg_simple(PGconn *conn, const char *sql, const char *what,
    ngx_log_t *log, PGresult **out)
{
    ngx_int_t       rc, ok;
    PGresult       *res, *last;
    ngx_msec_t      deadline;
    ExecStatusType  st;

    if (!PQsendQuery(conn, sql)) {
        ngx_http_agent_pg_log(NGX_LOG_EMERG, log, conn, NULL, what);
        return NGX_ERROR;
    }

    deadline = ngx_http_agent_pg_msec() + NGX_HTTP_AGENT_PG_OPEN_TIMEOUT
               + 1000;
    ok = NGX_OK;
    last = NULL;

    while ((res = ngx_http_agent_pg_result(conn, deadline, &rc, log))) {
        st = PQresultStatus(res);

        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
            if (ok == NGX_OK) {
                ngx_http_agent_pg_log(NGX_LOG_EMERG, log, conn, res, what);
            }

            ok = NGX_ERROR;
        }

        PQclear(last);
        last = res;
    }

    if (rc != NGX_OK) {
        if (rc == NGX_ERROR) {
            ngx_http_agent_pg_log(NGX_LOG_EMERG, log, conn, NULL, what);
        }

        ok = NGX_ERROR;
    }

    if (ok != NGX_OK || out == NULL || last == NULL
        || PQresultStatus(last) != PGRES_TUPLES_OK || PQntuples(last) == 0)
    {
        PQclear(last);
        return (ok == NGX_OK && out) ? NGX_ERROR : ok;
    }

    *out = last;

    return NGX_OK;
}
