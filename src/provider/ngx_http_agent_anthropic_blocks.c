
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * Anthropic content blocks as the API returned them: each block's
 * content_block_start, every field as it came, with the fields its
 * deltas build filled in, kept as the message's provider_content when
 * the canonical fields cannot rebuild it.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_json.h"
#include "ngx_http_agent_provider.h"
#include "ngx_http_agent_anthropic.h"
#include "ngx_http_agent_anthropic_ctx.h"


static ngx_uint_t ngx_http_agent_anthropic_raw_block(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_gen g,
    ngx_http_agent_anthropic_block_t *block);
static ngx_int_t ngx_http_agent_anthropic_member(
    ngx_http_agent_anthropic_block_t *block, char *key);
static ngx_uint_t ngx_http_agent_anthropic_built(
    ngx_http_agent_anthropic_ctx_t *ctx, yajl_gen g,
    ngx_http_agent_anthropic_block_t *block, ngx_uint_t n);


/*
 * The members of a block by its kind: first those its deltas build, then
 * those the canonical fields rebuild as they are.  Any other member is
 * the block's own.
 */
static ngx_http_agent_anthropic_members_t  ngx_http_agent_anthropic_members[]
    = {
    { 2, { "text", "citations", "type", NULL } },
    { 2, { "thinking", "signature", "type", NULL } },
    { 1, { "input", "type", "id", "name", NULL } },
    { 1, { "input", "type", "id", "name", NULL } }
};


/* a citation of a text block, added to those before it */

ngx_int_t
ngx_http_agent_anthropic_cite(ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_anthropic_block_t *block, yajl_val cite)
{
    if (!YAJL_IS_OBJECT(cite)) {
        return NGX_OK;
    }

    if (block->extra.len
        && ngx_http_agent_bytes_append(ctx->reply->pool, &block->extra,
                                       (u_char *) ",", 1)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_agent_anthropic_json(ctx, &block->extra, cite);
}


/* a value appended to b as a JSON text */

ngx_int_t
ngx_http_agent_anthropic_json(ngx_http_agent_anthropic_ctx_t *ctx,
    ngx_http_agent_bytes_t *b, yajl_val v)
{
    ngx_str_t  text;

    if (ngx_http_agent_provider_text(ctx->sub, v, &text) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_agent_bytes_append(ctx->reply->pool, b, text.data,
                                       text.len);
}


/* the blocks, as the API returns them unstreamed, for provider_content */

ngx_int_t
ngx_http_agent_anthropic_raw(ngx_http_agent_anthropic_ctx_t *ctx)
{
    yajl_gen                           g;
    ngx_str_t                          json;
    ngx_uint_t                         i, failed;
    ngx_http_agent_reply_t            *reply;
    ngx_http_agent_anthropic_block_t  *block;

    reply = ctx->reply;

    g = ngx_http_agent_json_gen(reply->pool);
    if (g == NULL) {
        return NGX_ERROR;
    }

    block = ctx->blocks.elts;

    failed = yajl_gen_array_open(g);

    for (i = 0; i < ctx->blocks.nelts; i++) {
        failed |= ngx_http_agent_anthropic_raw_block(ctx, g, &block[i]);
    }

    failed |= yajl_gen_array_close(g);

    if (ngx_http_agent_json_result(g, failed, &json) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, reply->log, 0,
                      "anthropic_messages reply content could not be kept");
        return NGX_ERROR;
    }

    return ngx_http_agent_bytes_set(reply->pool, &reply->raw_content,
                                    json.data, json.len);
}


/*
 * A block as its start came, with the members its deltas built in their
 * place, or after the others if its start had none
 */

static ngx_uint_t
ngx_http_agent_anthropic_raw_block(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_gen g, ngx_http_agent_anthropic_block_t *block)
{
    char                                *key;
    size_t                               i;
    yajl_val                             cb;
    ngx_int_t                            n;
    ngx_str_t                            s;
    ngx_uint_t                           failed, done;
    ngx_http_agent_anthropic_members_t  *m;

    s.data = block->start.data;
    s.len = block->start.len;

    if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_VERBATIM) {
        return ngx_http_agent_json_verbatim(g, &s);
    }

    /* the API refuses an empty text block */
    if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_TEXT
        && block->text.len == 0 && block->extra.len == 0)
    {
        return 0;
    }

    cb = ngx_http_agent_provider_parse(ctx->reply->log, s.data, s.len,
                                       "anthropic_messages content block");
    if (cb == NULL) {
        return 1;
    }

    m = &ngx_http_agent_anthropic_members[block->kind];
    done = 0;

    failed = yajl_gen_map_open(g);

    for (i = 0; i < cb->u.object.len; i++) {
        key = (char *) cb->u.object.keys[i];
        n = ngx_http_agent_anthropic_member(block, key);

        failed |= yajl_gen_string(g, (u_char *) key, ngx_strlen(key));

        if (n == NGX_DECLINED) {
            failed |= ngx_http_agent_provider_value(g, cb->u.object.values[i]);
            continue;
        }

        failed |= ngx_http_agent_anthropic_built(ctx, g, block, n);
        done |= 1 << n;
    }

    for (n = 0; n < (ngx_int_t) m->built; n++) {
        if (done & (1 << n)
            || ngx_http_agent_anthropic_member(block, (char *) m->names[n])
               == NGX_DECLINED)
        {
            continue;
        }

        failed |= yajl_gen_string(g, (u_char *) m->names[n],
                                  ngx_strlen(m->names[n]));
        failed |= ngx_http_agent_anthropic_built(ctx, g, block, n);
    }

    ngx_http_agent_json_free(cb);

    return failed | yajl_gen_map_close(g);
}


/*
 * Which of the members its deltas build a key is, or NGX_DECLINED: a
 * member they do not build, or built nothing for (a text block's
 * citations, when none came), goes back as its start had it
 */

static ngx_int_t
ngx_http_agent_anthropic_member(ngx_http_agent_anthropic_block_t *block,
    char *key)
{
    ngx_uint_t                           n;
    ngx_http_agent_anthropic_members_t  *m;

    m = &ngx_http_agent_anthropic_members[block->kind];

    for (n = 0; n < m->built; n++) {
        if (ngx_strcmp(m->names[n], key) != 0) {
            continue;
        }

        if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_TEXT && n == 1
            && block->extra.len == 0)
        {
            return NGX_DECLINED;
        }

        return n;
    }

    return NGX_DECLINED;
}


/* the value of member n as the deltas built it */

static ngx_uint_t
ngx_http_agent_anthropic_built(ngx_http_agent_anthropic_ctx_t *ctx,
    yajl_gen g, ngx_http_agent_anthropic_block_t *block, ngx_uint_t n)
{
    u_char      *p;
    ngx_str_t    s;
    ngx_uint_t   failed;

    if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_TOOL_USE
        || block->kind == NGX_HTTP_AGENT_ANTHROPIC_SERVER_TOOL_USE)
    {
        /* the input, parsed back, since it must be valid to go back */

        p = ngx_pnalloc(ctx->reply->pool, block->text.len + 1);
        if (p == NULL) {
            return 1;
        }

        *ngx_cpymem(p, block->text.data, block->text.len) = '\0';

        return ngx_http_agent_anthropic_input(g, p);
    }

    if (n == 0) {
        /* a text's text, a thinking's thinking */
        return yajl_gen_string(g, block->text.data, block->text.len);
    }

    s.data = block->extra.data;
    s.len = block->extra.len;

    if (block->kind == NGX_HTTP_AGENT_ANTHROPIC_THINKING) {
        return ngx_http_agent_json_str(g, &s);
    }

    /* the citations, JSON texts joined with commas */

    failed = yajl_gen_array_open(g);
    failed |= ngx_http_agent_json_verbatim(g, &s);

    return failed | yajl_gen_array_close(g);
}


/* the block has members the canonical fields cannot rebuild */

ngx_uint_t
ngx_http_agent_anthropic_own(ngx_http_agent_anthropic_block_t *block,
    yajl_val cb)
{
    size_t                               i;
    ngx_uint_t                           n;
    ngx_http_agent_anthropic_members_t  *m;

    m = &ngx_http_agent_anthropic_members[block->kind];

    for (i = 0; i < cb->u.object.len; i++) {

        for (n = 0; m->names[n]; n++) {
            if (ngx_strcmp(m->names[n], cb->u.object.keys[i]) == 0) {
                break;
            }
        }

        if (m->names[n] == NULL) {
            return 1;
        }
    }

    return 0;
}
