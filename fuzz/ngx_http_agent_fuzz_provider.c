
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_fuzz.h"


/*
 * One provider stream through an adapter's init, feed and finish, as
 * the turn's body filter and ngx_http_agent_turn_call_done() drive
 * them (src/turn/ngx_http_agent_turn.c): pieces in the input's cuts, no more
 * feeds after one failed, finish only after a stream parsed whole.  The
 * reply is then checked as the turn would use it:
 *
 *   - every live delta, written as ngx_http_agent_turn_delta() writes
 *     it (ngx_escape_json), is valid JSON;
 *   - what the turn splices into the log verbatim (provider_content,
 *     a hosted tool's result) is one JSON text each;
 *   - the assistant message, written as ngx_http_agent_turn_record()
 *     writes it, is valid JSON and reads back where the log is read,
 *     and so is each hosted tool's result event;
 *   - the stream fed whole gives the same reply and the same deltas as
 *     in pieces: where a stream is cut must not matter.
 */


typedef struct {
    uint64_t                  deltas;
    uint64_t                  reply;
    ngx_int_t                 rc;
} ngx_http_agent_fuzz_run_t;


static void ngx_http_agent_fuzz_provider_run(
    ngx_http_agent_provider_t *provider, ngx_http_agent_fuzz_cuts_t *cuts,
    ngx_uint_t whole, ngx_http_agent_fuzz_run_t *run);
static void ngx_http_agent_fuzz_provider_delta(ngx_http_agent_reply_t *reply,
    ngx_uint_t kind, ngx_uint_t index, ngx_str_t *s);
static uint64_t ngx_http_agent_fuzz_provider_hash(
    ngx_http_agent_reply_t *reply);
static void ngx_http_agent_fuzz_provider_record(ngx_http_agent_reply_t *reply,
    ngx_uint_t complete);
static void ngx_http_agent_fuzz_provider_hosted(
    ngx_http_agent_reply_t *reply);
static void ngx_http_agent_fuzz_provider_check(ngx_str_t *json, char *what);


int
ngx_http_agent_fuzz_provider(ngx_http_agent_provider_t *provider,
    const uint8_t *data, size_t size)
{
    ngx_http_agent_fuzz_run_t   cut, whole;
    ngx_http_agent_fuzz_cuts_t  cuts;

    ngx_http_agent_fuzz_cuts_init(&cuts, data, size);

    ngx_http_agent_fuzz_provider_run(provider, &cuts, 0, &cut);
    ngx_http_agent_fuzz_provider_run(provider, &cuts, 1, &whole);

    if (cut.rc != whole.rc) {
        ngx_http_agent_fuzz_fail("the stream parses or fails depending on "
                                 "where it is cut", NULL, 0);
    }

    if (cut.deltas != whole.deltas) {
        ngx_http_agent_fuzz_fail("the deltas depend on where the stream "
                                 "is cut", NULL, 0);
    }

    if (cut.reply != whole.reply) {
        ngx_http_agent_fuzz_fail("the reply depends on where the stream "
                                 "is cut", NULL, 0);
    }

    return 0;
}


static void
ngx_http_agent_fuzz_provider_run(ngx_http_agent_provider_t *provider,
    ngx_http_agent_fuzz_cuts_t *cuts, ngx_uint_t whole,
    ngx_http_agent_fuzz_run_t *run)
{
    u_char                         *p, *last;
    ngx_uint_t                      i, complete;
    ngx_pool_t                     *pool;
    ngx_http_agent_reply_t         *reply;
    ngx_http_agent_reply_hosted_t  *hosted;

    ngx_memzero(run, sizeof(ngx_http_agent_fuzz_run_t));

    run->deltas = NGX_HTTP_AGENT_FUZZ_HASH;

    pool = ngx_http_agent_fuzz_pool();

    /* as ngx_http_agent_turn_model_call() prepares it */

    reply = ngx_pcalloc(pool, sizeof(ngx_http_agent_reply_t));
    if (reply == NULL) {
        abort();
    }

    if (ngx_array_init(&reply->calls, pool, 2,
                       sizeof(ngx_http_agent_reply_call_t))
        != NGX_OK)
    {
        abort();
    }

    reply->pool = pool;
    reply->log = ngx_http_agent_fuzz_log;
    reply->delta = ngx_http_agent_fuzz_provider_delta;
    reply->data = run;

    if (provider->init(reply) != NGX_OK) {
        abort();
    }

    ngx_http_agent_fuzz_cuts_rewind(cuts, whole);

    while (ngx_http_agent_fuzz_cuts_next(cuts, &p, &last) == NGX_OK) {
        if (provider->feed(reply, p, last) != NGX_OK) {
            run->rc = 1;
            break;
        }
    }

    ngx_http_agent_fuzz_cuts_rewind(cuts, whole);

    if (run->rc == 0 && provider->finish(reply) != NGX_OK) {
        run->rc = 2;
    }

    run->reply = ngx_http_agent_fuzz_provider_hash(reply);

    /* what ngx_http_agent_turn_outcome() makes of it */

    complete = (run->rc == 0 && reply->complete
                && reply->error_type.len == 0
                && reply->error_message.len == 0);

    /* what the log takes verbatim must be one JSON text, no more */

    if (reply->raw_content.len) {
        ngx_http_agent_fuzz_json(reply->raw_content.data,
                                 reply->raw_content.len,
                                 "provider_content is not one JSON text");
    }

    if (complete) {
        hosted = reply->hosted.elts;

        for (i = 0; hosted && i < reply->hosted.nelts; i++) {
            if (hosted[i].result.len) {
                ngx_http_agent_fuzz_json(hosted[i].result.data,
                                         hosted[i].result.len,
                                         "a hosted tool's result is not one "
                                         "JSON text");
            }
        }
    }

    /* what ngx_http_agent_turn_said() keeps of a partial reply */

    if (complete || reply->text.len || reply->thinking.len
        || reply->calls.nelts)
    {
        ngx_http_agent_fuzz_provider_record(reply, complete);
    }

    if (complete) {
        ngx_http_agent_fuzz_provider_hosted(reply);
    }

    ngx_destroy_pool(pool);
}


static void
ngx_http_agent_fuzz_provider_delta(ngx_http_agent_reply_t *reply,
    ngx_uint_t kind, ngx_uint_t index, ngx_str_t *s)
{
    ngx_http_agent_fuzz_run_t  *run = reply->data;

    u_char  *p, *json;
    size_t   len;

    if (kind > NGX_HTTP_AGENT_DELTA_TOOL_ARGS) {
        ngx_http_agent_fuzz_fail("a delta of an unknown kind", NULL, 0);
    }

    run->deltas = ngx_http_agent_fuzz_hash(run->deltas, (u_char *) &kind,
                                           sizeof(ngx_uint_t));
    run->deltas = ngx_http_agent_fuzz_hash(run->deltas, (u_char *) &index,
                                           sizeof(ngx_uint_t));
    run->deltas = ngx_http_agent_fuzz_hash(run->deltas, s->data, s->len);

    /* the live event, as ngx_http_agent_turn_delta() writes it */

    len = sizeof("{\"delta\":\"\"}") - 1 + s->len
          + ngx_escape_json(NULL, s->data, s->len);

    json = ngx_alloc(len, ngx_http_agent_fuzz_log);
    if (json == NULL) {
        abort();
    }

    p = ngx_cpymem(json, "{\"delta\":\"", sizeof("{\"delta\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, s->data, s->len);
    *p++ = '"';
    *p++ = '}';

    ngx_http_agent_fuzz_json(json, p - json, "a live delta is not JSON");

    ngx_free(json);
}


/* everything the turn reads of a reply, read whole */

static uint64_t
ngx_http_agent_fuzz_provider_hash(ngx_http_agent_reply_t *reply)
{
    uint64_t                        h;
    ngx_uint_t                      i, n[4];
    ngx_http_agent_bytes_t         *b, *bytes[8];
    ngx_http_agent_reply_call_t    *call;
    ngx_http_agent_reply_hosted_t  *hosted;

    bytes[0] = &reply->text;
    bytes[1] = &reply->thinking;
    bytes[2] = &reply->signature;
    bytes[3] = &reply->raw_content;
    bytes[4] = &reply->finish_reason;
    bytes[5] = &reply->response_id;
    bytes[6] = &reply->error_type;
    bytes[7] = &reply->error_message;

    h = NGX_HTTP_AGENT_FUZZ_HASH;

    for (i = 0; i < 8; i++) {
        b = bytes[i];
        h = ngx_http_agent_fuzz_hash(h, b->data, b->len);
    }

    n[0] = reply->input_tokens;
    n[1] = reply->output_tokens;
    n[2] = reply->started;
    n[3] = reply->complete;

    h = ngx_http_agent_fuzz_hash(h, (u_char *) n, sizeof(n));

    call = reply->calls.elts;

    for (i = 0; i < reply->calls.nelts; i++) {
        h = ngx_http_agent_fuzz_hash(h, (u_char *) &call[i].index,
                                     sizeof(ngx_uint_t));
        h = ngx_http_agent_fuzz_hash(h, call[i].id.data, call[i].id.len);
        h = ngx_http_agent_fuzz_hash(h, call[i].name.data, call[i].name.len);
        h = ngx_http_agent_fuzz_hash(h, call[i].arguments.data,
                                     call[i].arguments.len);
    }

    hosted = reply->hosted.elts;

    for (i = 0; hosted && i < reply->hosted.nelts; i++) {
        h = ngx_http_agent_fuzz_hash(h, hosted[i].id.data, hosted[i].id.len);
        h = ngx_http_agent_fuzz_hash(h, hosted[i].name.data,
                                     hosted[i].name.len);
        h = ngx_http_agent_fuzz_hash(h, hosted[i].input.data,
                                     hosted[i].input.len);
        h = ngx_http_agent_fuzz_hash(h, hosted[i].result.data,
                                     hosted[i].result.len);
    }

    return h;
}


/*
 * The assistant message event, by the writer ngx_http_agent_turn_record()
 * uses, after the calls' ids are made addressable as it does; a string
 * that is not UTF-8 fails the generator, which the turn survives (the
 * reply is not recorded), so only a document generated whole is checked.
 */

static void
ngx_http_agent_fuzz_provider_record(ngx_http_agent_reply_t *reply,
    ngx_uint_t complete)
{
    ngx_str_t                     json, status;
    ngx_uint_t                    i;
    ngx_http_agent_reply_call_t  *call;

    static ngx_str_t  message_id = ngx_string("msg_fuzz");

    /* a partial reply's calls are recorded too */

    if (ngx_http_agent_provider_call_ids(reply) != NGX_OK) {
        abort();
    }

    call = reply->calls.elts;

    for (i = 0; i < reply->calls.nelts; i++) {
        if (call[i].id.len == 0
            || call[i].id.len > NGX_HTTP_AGENT_CALL_ID_MAX)
        {
            ngx_http_agent_fuzz_fail("a call id is not addressable",
                                     call[i].id.data, call[i].id.len);
        }
    }

    if (complete) {
        ngx_str_set(&status, "complete");

    } else {
        ngx_str_set(&status, "interrupted");
    }

    if (ngx_http_agent_provider_reply_json(reply, reply->pool, &message_id,
                                           &status, &json)
        != NGX_OK)
    {
        return;
    }

    ngx_http_agent_fuzz_provider_check(&json,
                                       "the assistant message is not JSON");
}


/* the tool_result event of each hosted tool, its result verbatim */

static void
ngx_http_agent_fuzz_provider_hosted(ngx_http_agent_reply_t *reply)
{
    yajl_gen                        g;
    ngx_str_t                       s;
    ngx_uint_t                      i, failed;
    ngx_http_agent_reply_hosted_t  *h;

    h = reply->hosted.elts;

    for (i = 0; h && i < reply->hosted.nelts; i++) {
        g = ngx_http_agent_json_gen(reply->pool);
        if (g == NULL) {
            abort();
        }

        failed = yajl_gen_map_open(g);
        failed |= ngx_http_agent_json_key(g, "tool_call_id");
        failed |= yajl_gen_string(g, h[i].id.data, h[i].id.len);
        failed |= ngx_http_agent_json_key(g, "name");
        failed |= yajl_gen_string(g, h[i].name.data, h[i].name.len);
        failed |= ngx_http_agent_json_key(g, "arguments");
        failed |= yajl_gen_string(g, h[i].input.data, h[i].input.len);
        failed |= ngx_http_agent_json_key(g, "result");

        s.data = h[i].result.data;
        s.len = h[i].result.len;

        if (s.len) {
            failed |= ngx_http_agent_json_verbatim(g, &s);

        } else {
            failed |= yajl_gen_null(g);
        }

        failed |= yajl_gen_map_close(g);

        if (ngx_http_agent_json_result(g, failed, &s) == NGX_OK) {
            ngx_http_agent_fuzz_provider_check(&s, "a hosted tool's result "
                                               "event is not JSON");
        }
    }
}


/*
 * A document the turn would log: it must parse, and parse again where
 * the log is read back (ngx_http_agent_provider_parse_log(), with the
 * log's depth limit), or the conversation could not be revived.
 */

static void
ngx_http_agent_fuzz_provider_check(ngx_str_t *json, char *what)
{
    u_char    *p;
    yajl_val   v;

    ngx_http_agent_fuzz_json(json->data, json->len, what);

    p = ngx_alloc(json->len + 1, ngx_http_agent_fuzz_log);
    if (p == NULL) {
        abort();
    }

    ngx_memcpy(p, json->data, json->len);
    p[json->len] = '\0';

    v = ngx_http_agent_provider_parse_log(ngx_http_agent_fuzz_log, p,
                                          json->len);
    ngx_free(p);

    if (v == NULL) {
        ngx_http_agent_fuzz_fail("an event the turn logs cannot be read "
                                 "back from the log", json->data, json->len);
    }

    ngx_http_agent_json_free(v);
}
