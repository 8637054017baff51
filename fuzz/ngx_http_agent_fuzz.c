
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_agent_fuzz.h"


/*
 * The least of nginx's start-up that the parsers need: the page size
 * (pools), the cached time and the error strings (logging), and a cycle
 * whose log is the targets' own.  The log takes every level, debug
 * included, so that each log call formats its arguments; its writer
 * drops the line.  Pools are built with NGX_DEBUG_PALLOC (see the
 * Makefile): every allocation is a malloc() of its own that ASan guards.
 */


static void ngx_http_agent_fuzz_writer(ngx_log_t *log, ngx_uint_t level,
    u_char *buf, size_t len);


static ngx_open_file_t  ngx_http_agent_fuzz_file;
static ngx_log_t        ngx_http_agent_fuzz_log_s;
static ngx_cycle_t      ngx_http_agent_fuzz_cycle;

ngx_log_t  *ngx_http_agent_fuzz_log = &ngx_http_agent_fuzz_log_s;


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    ngx_uint_t  n;

    ngx_pid = getpid();
    ngx_pagesize = getpagesize();
    ngx_cacheline_size = NGX_CPU_CACHE_LINE;

    for (n = ngx_pagesize; n >>= 1; ngx_pagesize_shift++) { /* void */ }

    if (ngx_strerror_init() != NGX_OK) {
        abort();
    }

    ngx_time_init();

    /* errors would be written to stderr too, as when nginx starts */
    ngx_use_stderr = 0;

    ngx_http_agent_fuzz_file.fd = ngx_stderr;
    ngx_http_agent_fuzz_file.name.len = 0;

    ngx_http_agent_fuzz_log_s.file = &ngx_http_agent_fuzz_file;
    ngx_http_agent_fuzz_log_s.log_level = NGX_LOG_DEBUG_ALL;
    ngx_http_agent_fuzz_log_s.writer = ngx_http_agent_fuzz_writer;

    ngx_http_agent_fuzz_cycle.log = &ngx_http_agent_fuzz_log_s;
    ngx_cycle = &ngx_http_agent_fuzz_cycle;

    return 0;
}


static void
ngx_http_agent_fuzz_writer(ngx_log_t *log, ngx_uint_t level, u_char *buf,
    size_t len)
{
    /* the line was formatted, which is what is checked; it goes nowhere */
}


ngx_pool_t *
ngx_http_agent_fuzz_pool(void)
{
    ngx_pool_t  *pool;

    pool = ngx_create_pool(NGX_DEFAULT_POOL_SIZE, ngx_http_agent_fuzz_log);
    if (pool == NULL) {
        abort();
    }

    return pool;
}


void
ngx_http_agent_fuzz_cuts_init(ngx_http_agent_fuzz_cuts_t *cuts,
    const uint8_t *data, size_t size)
{
    ngx_uint_t  n;

    ngx_memzero(cuts, sizeof(ngx_http_agent_fuzz_cuts_t));

    cuts->unit = 1;
    cuts->start = (u_char *) data;
    cuts->pos = cuts->start;
    cuts->last = cuts->start + size;

    if (size == 0) {
        return;
    }

    n = data[0] & 0x07;

    if (n > size - 1) {
        n = size - 1;
    }

    cuts->nlens = n;
    cuts->unit = (data[0] & 0x08) ? 64 : 1;
    cuts->flags = data[0] >> 4;

    ngx_memcpy(cuts->lens, data + 1, n);

    cuts->start += 1 + n;
    cuts->pos = cuts->start;
}


/* the stream again from its start, in its pieces or whole */

void
ngx_http_agent_fuzz_cuts_rewind(ngx_http_agent_fuzz_cuts_t *cuts,
    ngx_uint_t whole)
{
    if (cuts->piece) {
        ngx_free(cuts->piece);
        cuts->piece = NULL;
    }

    cuts->pos = cuts->start;
    cuts->next = 0;
    cuts->whole = whole;
}


/* NGX_OK and the next piece, or NGX_DONE at the end of the stream */

ngx_int_t
ngx_http_agent_fuzz_cuts_next(ngx_http_agent_fuzz_cuts_t *cuts, u_char **p,
    u_char **last)
{
    size_t  len, n;

    if (cuts->piece) {
        ngx_free(cuts->piece);
        cuts->piece = NULL;
    }

    if (cuts->pos == cuts->last) {
        return NGX_DONE;
    }

    len = cuts->last - cuts->pos;

    if (!cuts->whole && cuts->nlens) {
        n = (cuts->lens[cuts->next++ % cuts->nlens] + 1) * cuts->unit;
        len = ngx_min(len, n);
    }

    cuts->piece = ngx_alloc(len, ngx_http_agent_fuzz_log);
    if (cuts->piece == NULL) {
        abort();
    }

    ngx_memcpy(cuts->piece, cuts->pos, len);
    cuts->pos += len;

    *p = cuts->piece;
    *last = cuts->piece + len;

    return NGX_OK;
}


/* the input as a NUL-terminated string of the pool, as request bodies */

u_char *
ngx_http_agent_fuzz_copy(ngx_pool_t *pool, const uint8_t *data, size_t size)
{
    u_char  *p;

    p = ngx_pnalloc(pool, size + 1);
    if (p == NULL) {
        abort();
    }

    ngx_memcpy(p, data, size);
    p[size] = '\0';

    return p;
}


/* FNV-1a: reads every byte, so a length past the data is caught too */

uint64_t
ngx_http_agent_fuzz_hash(uint64_t h, u_char *p, size_t len)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }

    /* the length too: "ab","c" and "a","bc" differ */
    h ^= len;
    h *= 0x100000001b3ULL;

    return h;
}


/* what the module writes to its log must read back as JSON */

void
ngx_http_agent_fuzz_json(u_char *p, size_t len, char *what)
{
    char      err[256];
    u_char   *s;
    yajl_val  v;

    if (ngx_strlchr(p, p + len, '\0') != NULL) {
        ngx_http_agent_fuzz_fail(what, p, len);
    }

    s = ngx_alloc(len + 1, ngx_http_agent_fuzz_log);
    if (s == NULL) {
        abort();
    }

    ngx_memcpy(s, p, len);
    s[len] = '\0';

    v = yajl_tree_parse((char *) s, err, sizeof(err));

    ngx_free(s);

    if (v == NULL) {
        fprintf(stderr, "yajl: %s\n", err);
        ngx_http_agent_fuzz_fail(what, p, len);
    }

    yajl_tree_free(v);
}


void
ngx_http_agent_fuzz_fail(char *what, u_char *p, size_t len)
{
    fprintf(stderr, "\n==== invariant failed: %s\n", what);

    if (p) {
        fprintf(stderr, "==== %zu bytes: \"%.*s\"\n", len,
                (int) ngx_min(len, 2048), p);
    }

    abort();
}
