/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_parse.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_agent_json.h"


/*
 * The one door for JSON from outside: provider events, tool results,
 * client bodies and resolutions, and the log read back.  The tree is
 * built through yajl's parser callbacks, in an arena: the nodes, their
 * strings and yajl's own buffers are carved out of blocks that go
 * together in ngx_http_agent_json_free(), and the worker keeps one block
 * for the next text, so a stream event costs no allocation.  A reader
 * of the module's own drives the same callbacks first, for the texts
 * that make most of the traffic (a provider's stream events are small
 * and many): it takes only what it is sure yajl takes, as yajl would
 * read it, and leaves anything else (an error, a comment, an escaped
 * lone surrogate) to yajl, whose tree and messages stay the reference,
 * from the start of the text and a fresh arena.  The text is
 * read up to len, never past it.  The nesting is checked against depth
 * (NGX_HTTP_AGENT_JSON_DEPTH, or NGX_HTTP_AGENT_JSON_LOG_DEPTH for the
 * log, whose events wrap what came from outside), since the tree's
 * readers recurse, and a NUL, raw or escaped, is refused: the tree's
 * strings are NUL-terminated and would end there.  NULL: err says why,
 * on one line, as a predicate ("is nested deeper than 64 levels");
 * size > 1.
 */

#define NGX_HTTP_AGENT_JSON_BLOCK  16384
#define NGX_HTTP_AGENT_JSON_MAGIC  0x6a736f6e74726565


/*
 * A tree's memory is not free()d when the tree goes: its first block is
 * the next text's, so a pointer kept into an old tree reads whatever the
 * next parse wrote there, and AddressSanitizer, which watches malloc()
 * and free(), sees nothing.  In the sanitizer build an arena's memory is
 * poisoned from the moment it holds no tree until the next parse hands
 * it out again, piece by piece: such a read is reported where it is
 * made, as a use after free.
 */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NGX_HTTP_AGENT_JSON_ASAN  1
#endif
#endif

#if defined(__SANITIZE_ADDRESS__) && !defined(NGX_HTTP_AGENT_JSON_ASAN)
#define NGX_HTTP_AGENT_JSON_ASAN  1
#endif

#if (NGX_HTTP_AGENT_JSON_ASAN)

#include <sanitizer/asan_interface.h>

#define ngx_http_agent_json_poison(p, size)                                  \
    ASAN_POISON_MEMORY_REGION(p, size)
#define ngx_http_agent_json_unpoison(p, size)                                \
    ASAN_UNPOISON_MEMORY_REGION(p, size)

#else

#define ngx_http_agent_json_poison(p, size)
#define ngx_http_agent_json_unpoison(p, size)

#endif

/* all of a block but its head: its nodes, strings and yajl's buffers */
#define ngx_http_agent_json_poison_block(b)                                  \
    ngx_http_agent_json_poison((b)->root,                                    \
        (b)->size - offsetof(ngx_http_agent_json_block_t, root))


typedef struct ngx_http_agent_json_block_s  ngx_http_agent_json_block_t;

struct ngx_http_agent_json_block_s {
    ngx_http_agent_json_block_t  *next;
    size_t                        size;
    uint64_t                      magic;
    /* the first block's first node is the root */
    struct yajl_val_s             root[1];
};


typedef struct {
    yajl_val                      node;
    size_t                        slots;
    const char                   *key;
} ngx_http_agent_json_frame_t;


typedef struct {
    ngx_http_agent_json_block_t  *first;
    ngx_http_agent_json_block_t  *last;
    u_char                       *pos;
    u_char                       *end;
    yajl_val                      root;
    ngx_uint_t                    depth;
    ngx_uint_t                    max;
    char                         *reason;

    /* the text: a string yajl did not unescape lies within it */
    u_char                       *text;
    u_char                       *text_end;

    /* a string the reader decoded into the arena, NUL-terminated */
    u_char                       *decoded;

    ngx_http_agent_json_frame_t   stack[NGX_HTTP_AGENT_JSON_LOG_DEPTH + 1];
} ngx_http_agent_json_tree_t;


static void *ngx_http_agent_json_alloc(ngx_http_agent_json_tree_t *t,
    size_t size);
static void *ngx_http_agent_json_yajl_malloc(void *ctx, size_t size);
static void *ngx_http_agent_json_yajl_realloc(void *ctx, void *ptr,
    size_t size);
static void ngx_http_agent_json_yajl_free(void *ctx, void *ptr);
static yajl_val ngx_http_agent_json_node(ngx_http_agent_json_tree_t *t,
    yajl_type type);
static int ngx_http_agent_json_add(ngx_http_agent_json_tree_t *t,
    yajl_val v);
static char *ngx_http_agent_json_strdup(ngx_http_agent_json_tree_t *t,
    const unsigned char *s, size_t len);
static int ngx_http_agent_json_t_null(void *ctx);
static int ngx_http_agent_json_t_boolean(void *ctx, int b);
static int ngx_http_agent_json_t_number(void *ctx, const char *s,
    size_t len);
static int ngx_http_agent_json_t_string(void *ctx, const unsigned char *s,
    size_t len);
static int ngx_http_agent_json_t_map_key(void *ctx, const unsigned char *s,
    size_t len);
static int ngx_http_agent_json_t_start(ngx_http_agent_json_tree_t *t,
    yajl_type type);
static int ngx_http_agent_json_t_start_map(void *ctx);
static int ngx_http_agent_json_t_start_array(void *ctx);
static int ngx_http_agent_json_t_end(void *ctx);
static void ngx_http_agent_json_blocks_free(ngx_http_agent_json_block_t *b);
static ngx_int_t ngx_http_agent_json_read(ngx_http_agent_json_tree_t *t,
    u_char *p, u_char *last);
static u_char *ngx_http_agent_json_read_string(ngx_http_agent_json_tree_t *t,
    u_char *p, u_char *last, ngx_str_t *s);
static u_char *ngx_http_agent_json_read_escaped(ngx_http_agent_json_tree_t *t,
    u_char *p, u_char *last, ngx_str_t *s);
static u_char *ngx_http_agent_json_read_number(u_char *p, u_char *last);
static ngx_int_t ngx_http_agent_json_hex(u_char *p);


static yajl_callbacks  ngx_http_agent_json_tree_callbacks = {
    ngx_http_agent_json_t_null,
    ngx_http_agent_json_t_boolean,
    NULL,
    NULL,
    ngx_http_agent_json_t_number,
    ngx_http_agent_json_t_string,
    ngx_http_agent_json_t_start_map,
    ngx_http_agent_json_t_map_key,
    ngx_http_agent_json_t_end,
    ngx_http_agent_json_t_start_array,
    ngx_http_agent_json_t_end
};


/* the block kept for the next text, one per thread that parses */
static __thread ngx_http_agent_json_block_t  *ngx_http_agent_json_spare;


yajl_val
ngx_http_agent_json_parse(u_char *json, size_t len, ngx_uint_t depth,
    char *err, size_t size)
{
    u_char                       *p, *msg;
    yajl_status                   status;
    yajl_handle                   h;
    yajl_alloc_funcs              afs;
    ngx_http_agent_json_block_t  *b;
    ngx_http_agent_json_tree_t    t;

    b = ngx_http_agent_json_spare;

    if (b) {
        ngx_http_agent_json_spare = NULL;

    } else {
        b = ngx_alloc(NGX_HTTP_AGENT_JSON_BLOCK, ngx_cycle->log);
        if (b == NULL) {
            ngx_cpystrn((u_char *) err, (u_char *) "could not be allocated",
                        size);
            return NULL;
        }

        b->size = NGX_HTTP_AGENT_JSON_BLOCK;

        ngx_http_agent_json_poison_block(b);
    }

    /* the root's place is handed out at once, the rest as it is taken */
    ngx_http_agent_json_unpoison(b->root, sizeof(struct yajl_val_s));

    b->next = NULL;
    b->magic = NGX_HTTP_AGENT_JSON_MAGIC;

    t.first = b;
    t.last = b;
    t.pos = (u_char *) &b->root[1];
    t.end = (u_char *) b + b->size;
    t.root = NULL;
    t.depth = 0;
    t.max = ngx_min(depth, NGX_HTTP_AGENT_JSON_LOG_DEPTH);
    t.reason = NULL;
    t.text = json;
    t.text_end = json + len;
    t.decoded = NULL;

    if (ngx_http_agent_json_read(&t, json, json + len) == NGX_OK) {
        return t.root;
    }

    /* the reader declines a NUL byte, which yajl would take for the end */

    if (len && memchr(json, '\0', len)) {
        ngx_http_agent_json_blocks_free(b);
        ngx_cpystrn((u_char *) err, (u_char *) "holds a NUL byte", size);
        return NULL;
    }

    /* yajl reads it again, into the first block alone */

    ngx_http_agent_json_blocks_free(b->next);

    b->next = NULL;

    /* the reader's tree is gone: what it took is poisoned again */
    ngx_http_agent_json_poison(&b->root[1],
                               b->size - sizeof(ngx_http_agent_json_block_t));

    t.last = b;
    t.pos = (u_char *) &b->root[1];
    t.end = (u_char *) b + b->size;
    t.root = NULL;
    t.depth = 0;
    t.reason = NULL;
    t.decoded = NULL;

    afs.malloc = ngx_http_agent_json_yajl_malloc;
    afs.realloc = ngx_http_agent_json_yajl_realloc;
    afs.free = ngx_http_agent_json_yajl_free;
    afs.ctx = &t;

    h = yajl_alloc(&ngx_http_agent_json_tree_callbacks, &afs, &t);
    if (h == NULL) {
        ngx_http_agent_json_blocks_free(t.first);
        ngx_cpystrn((u_char *) err, (u_char *) "could not be allocated",
                    size);
        return NULL;
    }

    yajl_config(h, yajl_allow_comments, 1);

    status = yajl_parse(h, json, len);

    if (status == yajl_status_ok) {
        status = yajl_complete_parse(h);
    }

    if (status == yajl_status_ok && t.root) {
        /* yajl's buffers stay in the arena until the tree goes */
        yajl_free(h);
        return t.root;
    }

    if (t.reason) {
        ngx_cpystrn((u_char *) err, (u_char *) t.reason, size);

    } else {
        msg = yajl_get_error(h, 0, json, len);

        /* yajl's message ends with a line feed */
        p = ngx_snprintf((u_char *) err, size - 1, "is not valid JSON: %s",
                         msg ? (char *) msg : "could not be read");
        *p = '\0';

        p = (u_char *) ngx_strchr(err, LF);
        if (p) {
            *p = '\0';
        }
    }

    yajl_free(h);
    ngx_http_agent_json_blocks_free(t.first);

    return NULL;
}


void
ngx_http_agent_json_free(yajl_val v)
{
    ngx_http_agent_json_block_t  *b;

    if (v == NULL) {
        return;
    }

    b = (ngx_http_agent_json_block_t *)
            ((u_char *) v - offsetof(ngx_http_agent_json_block_t, root));

    /* only a tree's root is freed, and with it the whole tree */
    if (b->magic != NGX_HTTP_AGENT_JSON_MAGIC) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "agent json: freeing a value that is not a root");
        return;
    }

    b->magic = 0;

    ngx_http_agent_json_blocks_free(b);
}


static void
ngx_http_agent_json_blocks_free(ngx_http_agent_json_block_t *b)
{
    ngx_http_agent_json_block_t  *next;

    for ( /* void */ ; b; b = next) {
        next = b->next;

        if (ngx_http_agent_json_spare == NULL
            && b->size == NGX_HTTP_AGENT_JSON_BLOCK)
        {
            ngx_http_agent_json_poison_block(b);
            ngx_http_agent_json_spare = b;
            continue;
        }

        ngx_free(b);
    }
}


static void *
ngx_http_agent_json_alloc(ngx_http_agent_json_tree_t *t, size_t size)
{
    u_char                       *p;
    size_t                        bsize;
    ngx_http_agent_json_block_t  *b;

    size = ngx_align(size, sizeof(uint64_t));

    if ((size_t) (t->end - t->pos) < size) {
        bsize = ngx_max(t->last->size * 2,
                        size + offsetof(ngx_http_agent_json_block_t, root));

        b = ngx_alloc(bsize, ngx_cycle->log);
        if (b == NULL) {
            t->reason = "could not be allocated";
            return NULL;
        }

        b->next = NULL;
        b->size = bsize;
        b->magic = 0;

        ngx_http_agent_json_poison_block(b);

        t->last->next = b;
        t->last = b;
        t->pos = (u_char *) b->root;
        t->end = (u_char *) b + bsize;
    }

    p = t->pos;
    t->pos += size;

    ngx_http_agent_json_unpoison(p, size);

    return p;
}


/* yajl's own allocations: the size goes before each, for realloc */

static void *
ngx_http_agent_json_yajl_malloc(void *ctx, size_t size)
{
    uint64_t  *p;

    p = ngx_http_agent_json_alloc(ctx, size + sizeof(uint64_t));
    if (p == NULL) {
        return NULL;
    }

    *p = size;

    return p + 1;
}


static void *
ngx_http_agent_json_yajl_realloc(void *ctx, void *ptr, size_t size)
{
    void      *p;
    uint64_t   old;

    if (ptr == NULL) {
        return ngx_http_agent_json_yajl_malloc(ctx, size);
    }

    old = ((uint64_t *) ptr)[-1];

    if (size <= old) {
        return ptr;
    }

    p = ngx_http_agent_json_yajl_malloc(ctx, size);
    if (p == NULL) {
        return NULL;
    }

    ngx_memcpy(p, ptr, old);

    return p;
}


static void
ngx_http_agent_json_yajl_free(void *ctx, void *ptr)
{
    /* the arena goes as a whole */
}


static yajl_val
ngx_http_agent_json_node(ngx_http_agent_json_tree_t *t, yajl_type type)
{
    yajl_val  v;

    if (t->root == NULL && t->depth == 0) {
        /* the root has its place at the first block's head */
        v = t->first->root;

    } else {
        v = ngx_http_agent_json_alloc(t, sizeof(struct yajl_val_s));
        if (v == NULL) {
            return NULL;
        }
    }

    ngx_memzero(v, sizeof(struct yajl_val_s));
    v->type = type;

    return v;
}


static int
ngx_http_agent_json_add(ngx_http_agent_json_tree_t *t, yajl_val v)
{
    size_t                        n;
    void                         *p;
    yajl_val                      c;
    ngx_http_agent_json_frame_t  *f;

    if (t->depth == 0) {
        t->root = v;
        return 1;
    }

    f = &t->stack[t->depth - 1];
    c = f->node;

    n = (c->type == yajl_t_object) ? c->u.object.len : c->u.array.len;

    if (n == f->slots) {
        f->slots = f->slots ? f->slots * 2 : 8;

        p = ngx_http_agent_json_alloc(t, f->slots * sizeof(yajl_val));
        if (p == NULL) {
            return 0;
        }

        if (c->type == yajl_t_array) {
            if (n) {
                ngx_memcpy(p, c->u.array.values, n * sizeof(yajl_val));
            }

            c->u.array.values = p;

        } else {
            if (n) {
                ngx_memcpy(p, c->u.object.values, n * sizeof(yajl_val));
            }

            c->u.object.values = p;

            p = ngx_http_agent_json_alloc(t, f->slots * sizeof(char *));
            if (p == NULL) {
                return 0;
            }

            if (n) {
                ngx_memcpy(p, c->u.object.keys, n * sizeof(char *));
            }

            c->u.object.keys = p;
        }
    }

    if (c->type == yajl_t_object) {
        c->u.object.keys[n] = f->key;
        c->u.object.values[n] = v;
        c->u.object.len++;

    } else {
        c->u.array.values[n] = v;
        c->u.array.len++;
    }

    return 1;
}


static char *
ngx_http_agent_json_strdup(ngx_http_agent_json_tree_t *t,
    const unsigned char *s, size_t len)
{
    u_char  *p;

    /* the reader's decoded string is in the arena already, with no NUL */

    if ((u_char *) s == t->decoded) {
        t->decoded = NULL;
        return (char *) s;
    }

    /*
     * the text has no NUL byte; only a string yajl unescaped into its
     * own buffer can hold one, from a \u0000
     */

    if (len
        && ((u_char *) s < t->text || (u_char *) s >= t->text_end)
        && memchr(s, '\0', len))
    {
        t->reason = "holds a NUL character (\\u0000)";
        return NULL;
    }

    p = ngx_http_agent_json_alloc(t, len + 1);
    if (p == NULL) {
        return NULL;
    }

    if (len) {
        ngx_memcpy(p, s, len);
    }

    p[len] = '\0';

    return (char *) p;
}


static int
ngx_http_agent_json_t_null(void *ctx)
{
    yajl_val  v;

    v = ngx_http_agent_json_node(ctx, yajl_t_null);

    return v && ngx_http_agent_json_add(ctx, v);
}


static int
ngx_http_agent_json_t_boolean(void *ctx, int b)
{
    yajl_val  v;

    v = ngx_http_agent_json_node(ctx, b ? yajl_t_true : yajl_t_false);

    return v && ngx_http_agent_json_add(ctx, v);
}


/* as yajl's tree has it: the text, and the integer or double it reads */

static int
ngx_http_agent_json_t_number(void *ctx, const char *s, size_t len)
{
    ngx_http_agent_json_tree_t *t = ctx;

    char       *r, *end;
    size_t      i;
    yajl_val    v;
    long long   n, digit;

    v = ngx_http_agent_json_node(t, yajl_t_number);
    if (v == NULL) {
        return 0;
    }

    r = ngx_http_agent_json_strdup(t, (const unsigned char *) s, len);
    if (r == NULL) {
        return 0;
    }

    v->u.number.r = r;

    i = (r[0] == '-');
    n = 0;

    for ( /* void */ ; i < len; i++) {
        if (r[i] < '0' || r[i] > '9') {
            break;
        }

        digit = r[i] - '0';

        if (n > (LLONG_MAX - digit) / 10) {
            break;
        }

        n = n * 10 + digit;
    }

    if (i == len && len > (size_t) (r[0] == '-')) {
        v->u.number.i = (r[0] == '-') ? -n : n;

        /* strtod()'s double: the exact value rounded, "-0" negative */
        v->u.number.d = (r[0] == '-') ? -(double) n : (double) n;

        v->u.number.flags = YAJL_NUMBER_INT_VALID
                            | YAJL_NUMBER_DOUBLE_VALID;

        return ngx_http_agent_json_add(t, v);
    }

    errno = 0;
    v->u.number.d = strtod(r, &end);

    if (errno == 0 && *end == '\0') {
        v->u.number.flags |= YAJL_NUMBER_DOUBLE_VALID;
    }

    return ngx_http_agent_json_add(t, v);
}


static int
ngx_http_agent_json_t_string(void *ctx, const unsigned char *s, size_t len)
{
    ngx_http_agent_json_tree_t *t = ctx;

    yajl_val  v;

    v = ngx_http_agent_json_node(t, yajl_t_string);
    if (v == NULL) {
        return 0;
    }

    v->u.string = ngx_http_agent_json_strdup(t, s, len);
    if (v->u.string == NULL) {
        return 0;
    }

    return ngx_http_agent_json_add(t, v);
}


static int
ngx_http_agent_json_t_map_key(void *ctx, const unsigned char *s, size_t len)
{
    ngx_http_agent_json_tree_t *t = ctx;

    t->stack[t->depth - 1].key = ngx_http_agent_json_strdup(t, s, len);

    return t->stack[t->depth - 1].key != NULL;
}


static int
ngx_http_agent_json_t_start(ngx_http_agent_json_tree_t *t, yajl_type type)
{
    yajl_val                      v;
    ngx_http_agent_json_frame_t  *f;

    if (t->depth == t->max) {
        t->reason = (t->max == NGX_HTTP_AGENT_JSON_DEPTH)
                    ? "is nested deeper than "
                      NGX_HTTP_AGENT_JSON_DEPTH_STR " levels"
                    : "is nested too deep";
        return 0;
    }

    v = ngx_http_agent_json_node(t, type);
    if (v == NULL || !ngx_http_agent_json_add(t, v)) {
        return 0;
    }

    f = &t->stack[t->depth++];
    f->node = v;
    f->slots = 0;
    f->key = NULL;

    return 1;
}


static int
ngx_http_agent_json_t_start_map(void *ctx)
{
    return ngx_http_agent_json_t_start(ctx, yajl_t_object);
}


static int
ngx_http_agent_json_t_start_array(void *ctx)
{
    return ngx_http_agent_json_t_start(ctx, yajl_t_array);
}


static int
ngx_http_agent_json_t_end(void *ctx)
{
    ngx_http_agent_json_tree_t *t = ctx;

    t->depth--;

    return 1;
}


/*
 * The module's own reader: one pass over the text, the tree built
 * through the callbacks yajl calls, in the same order.  NGX_OK: the text
 * is one JSON value, as yajl (comments allowed, strings checked as
 * yajl's lexer checks UTF-8) reads it, and the tree is built.
 * NGX_DECLINED: anything else, for yajl to read or refuse: whitespace
 * but JSON's own, a comment, an error of any kind, a \u0000 or a
 * surrogate escaped alone, a callback's refusal (too deep, out of
 * memory).  What it takes is a subset of what yajl takes; the fuzz
 * target json checks its trees against yajl_tree_parse()'s.
 */

/* the bytes a string holds as they are: not '"', '\\', a control or >= 0x80 */
static const u_char  ngx_http_agent_json_plain[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
    /* 0x80 to 0xff: 0 */
};


#define ngx_http_agent_json_skip(p, last)                                    \
    while (p < last && ngx_http_agent_json_space(*p)) { p++; }

#define ngx_http_agent_json_digit(c)  ((c) >= '0' && (c) <= '9')


static ngx_int_t
ngx_http_agent_json_read(ngx_http_agent_json_tree_t *t, u_char *p,
    u_char *last)
{
    char        *word;
    size_t       n;
    u_char      *start;
    ngx_str_t    s;
    ngx_uint_t   object;

value:

    ngx_http_agent_json_skip(p, last);

    if (p == last) {
        return NGX_DECLINED;
    }

    switch (*p) {

    case '{':
    case '[':
        object = (*p == '{');

        if (!ngx_http_agent_json_t_start(t, object ? yajl_t_object
                                                   : yajl_t_array))
        {
            return NGX_DECLINED;
        }

        p++;
        ngx_http_agent_json_skip(p, last);

        if (p < last && *p == (object ? '}' : ']')) {
            t->depth--;
            p++;
            goto next;
        }

        if (object) {
            goto key;
        }

        goto value;

    case '"':
        p = ngx_http_agent_json_read_string(t, p + 1, last, &s);

        if (p == NULL || !ngx_http_agent_json_t_string(t, s.data, s.len)) {
            return NGX_DECLINED;
        }

        goto next;

    case 't':
    case 'f':
    case 'n':
        word = (*p == 't') ? "true" : (*p == 'f') ? "false" : "null";
        n = ngx_strlen(word);

        if ((size_t) (last - p) < n || ngx_strncmp(p, word, n) != 0
            || !((*p == 'n') ? ngx_http_agent_json_t_null(t)
                             : ngx_http_agent_json_t_boolean(t, *p == 't')))
        {
            return NGX_DECLINED;
        }

        p += n;
        goto next;

    default:
        start = p;
        p = ngx_http_agent_json_read_number(p, last);

        if (p == NULL
            || !ngx_http_agent_json_t_number(t, (char *) start, p - start))
        {
            return NGX_DECLINED;
        }

        goto next;
    }

key:

    if (p == last || *p != '"') {
        return NGX_DECLINED;
    }

    p = ngx_http_agent_json_read_string(t, p + 1, last, &s);

    if (p == NULL || !ngx_http_agent_json_t_map_key(t, s.data, s.len)) {
        return NGX_DECLINED;
    }

    ngx_http_agent_json_skip(p, last);

    if (p == last || *p != ':') {
        return NGX_DECLINED;
    }

    p++;
    goto value;

next:

    /* a value was read: what may follow it, a literal or a number too */

    ngx_http_agent_json_skip(p, last);

    if (t->depth == 0) {
        return (p == last) ? NGX_OK : NGX_DECLINED;
    }

    if (p == last) {
        return NGX_DECLINED;
    }

    object = (t->stack[t->depth - 1].node->type == yajl_t_object);

    switch (*p) {

    case ',':
        p++;
        ngx_http_agent_json_skip(p, last);

        if (object) {
            goto key;
        }

        goto value;

    case '}':
        if (!object) {
            return NGX_DECLINED;
        }

        break;

    case ']':
        if (object) {
            return NGX_DECLINED;
        }

        break;

    default:
        return NGX_DECLINED;
    }

    t->depth--;
    p++;

    goto next;
}


/*
 * A string, p past its opening quote: s is the text itself if nothing
 * in it is escaped.  A byte from 0x80 starts a sequence as yajl's lexer
 * checks it: a lead byte of 2, 3 or 4 bytes and its continuation bytes,
 * the values they make left as they are.  NULL: declined.
 */

static u_char *
ngx_http_agent_json_read_string(ngx_http_agent_json_tree_t *t, u_char *p,
    u_char *last, ngx_str_t *s)
{
    u_char      *start;
    uint64_t     w, q, b, m;
    ngx_uint_t   n, escaped;

    start = p;
    escaped = 0;

    for ( ;; ) {

        /*
         * eight bytes at a time while none is '"', '\\', a control or
         * from 0x80: each test flags such a byte, and may flag a byte
         * above it too, never one below; so the lowest flag is the first
         */

        while (last - p >= 8) {
            ngx_memcpy(&w, p, 8);

            q = w ^ 0x2222222222222222;
            b = w ^ 0x5c5c5c5c5c5c5c5c;

            m = (((q - 0x0101010101010101) & ~q)
                 | ((b - 0x0101010101010101) & ~b)
                 | ((w - 0x2020202020202020) & ~w)
                 | w)
                & 0x8080808080808080;

            if (m) {
#if (NGX_HAVE_LITTLE_ENDIAN && defined __GNUC__)
                p += __builtin_ctzll(m) >> 3;
#endif
                break;
            }

            p += 8;
        }

        while (p < last && ngx_http_agent_json_plain[*p]) {
            p++;
        }

        if (p == last) {
            return NULL;
        }

        if (*p == '"') {
            break;
        }

        if (*p == '\\') {
            if (last - p < 2) {
                return NULL;
            }

            switch (p[1]) {

            case '"': case '\\': case '/':
            case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                break;

            case 'u':
                if (last - p < 6 || ngx_http_agent_json_hex(p + 2) < 0) {
                    return NULL;
                }

                p += 6;
                break;

            default:
                return NULL;
            }

            escaped = 1;
            continue;
        }

        if (*p < 0x80) {
            /* a control character */
            return NULL;
        }

        if ((*p >> 5) == 0x06) {
            n = 1;

        } else if ((*p >> 4) == 0x0e) {
            n = 2;

        } else if ((*p >> 3) == 0x1e) {
            n = 3;

        } else {
            return NULL;
        }

        if ((size_t) (last - p) <= n) {
            return NULL;
        }

        for (p++; n; n--, p++) {
            if ((*p & 0xc0) != 0x80) {
                return NULL;
            }
        }
    }

    s->data = start;
    s->len = p - start;

    if (escaped) {
        return ngx_http_agent_json_read_escaped(t, start, p, s) ? p + 1
                                                                : NULL;
    }

    return p + 1;
}


/*
 * The escapes of a string already scanned, [p, last), decoded as yajl
 * decodes them, into the arena: never longer than the text.  NULL: a
 * \u0000, or a surrogate that is not a high one followed by a low one,
 * which yajl decodes its own way.
 */

static u_char *
ngx_http_agent_json_read_escaped(ngx_http_agent_json_tree_t *t, u_char *p,
    u_char *last, ngx_str_t *s)
{
    u_char      *d, *start;
    ngx_int_t    c, low;

    start = ngx_http_agent_json_alloc(t, last - p + 1);
    if (start == NULL) {
        return NULL;
    }

    d = start;

    while (p < last) {

        if (*p != '\\') {
            *d++ = *p++;
            continue;
        }

        switch (p[1]) {

        case 'b':
            *d++ = '\b';
            break;

        case 'f':
            *d++ = '\f';
            break;

        case 'n':
            *d++ = LF;
            break;

        case 'r':
            *d++ = CR;
            break;

        case 't':
            *d++ = '\t';
            break;

        case 'u':
            c = ngx_http_agent_json_hex(p + 2);
            p += 6;

            if (c == 0 || (c >= 0xdc00 && c <= 0xdfff)) {
                return NULL;
            }

            if (c >= 0xd800 && c <= 0xdbff) {
                if (last - p < 6 || p[0] != '\\' || p[1] != 'u') {
                    return NULL;
                }

                low = ngx_http_agent_json_hex(p + 2);

                if (low < 0xdc00 || low > 0xdfff) {
                    return NULL;
                }

                c = 0x10000 + ((c - 0xd800) << 10) + (low - 0xdc00);
                p += 6;
            }

            if (c < 0x80) {
                *d++ = (u_char) c;

            } else if (c < 0x800) {
                *d++ = (u_char) (0xc0 | (c >> 6));
                *d++ = (u_char) (0x80 | (c & 0x3f));

            } else if (c < 0x10000) {
                *d++ = (u_char) (0xe0 | (c >> 12));
                *d++ = (u_char) (0x80 | ((c >> 6) & 0x3f));
                *d++ = (u_char) (0x80 | (c & 0x3f));

            } else {
                *d++ = (u_char) (0xf0 | (c >> 18));
                *d++ = (u_char) (0x80 | ((c >> 12) & 0x3f));
                *d++ = (u_char) (0x80 | ((c >> 6) & 0x3f));
                *d++ = (u_char) (0x80 | (c & 0x3f));
            }

            continue;

        default:
            /* '"', '\\' and '/' stand for themselves */
            *d++ = p[1];
            break;
        }

        p += 2;
    }

    *d = '\0';

    s->data = start;
    s->len = d - start;

    /* taken by the tree as it is, not copied again */
    t->decoded = start;

    return start;
}


/*
 * A number as yajl's lexer reads it: -?(0|[1-9][0-9]*)(\.[0-9]+)?
 * ([eE][+-]?[0-9]+)?; what follows it is the caller's to check.
 */

static u_char *
ngx_http_agent_json_read_number(u_char *p, u_char *last)
{
    if (*p == '-') {
        p++;
    }

    if (p == last) {
        return NULL;
    }

    if (*p == '0') {
        p++;

    } else if (*p >= '1' && *p <= '9') {
        do { p++; } while (p < last && ngx_http_agent_json_digit(*p));

    } else {
        return NULL;
    }

    if (p < last && *p == '.') {
        p++;

        if (p == last || !ngx_http_agent_json_digit(*p)) {
            return NULL;
        }

        do { p++; } while (p < last && ngx_http_agent_json_digit(*p));
    }

    if (p < last && (*p == 'e' || *p == 'E')) {
        p++;

        if (p < last && (*p == '+' || *p == '-')) {
            p++;
        }

        if (p == last || !ngx_http_agent_json_digit(*p)) {
            return NULL;
        }

        do { p++; } while (p < last && ngx_http_agent_json_digit(*p));
    }

    return p;
}


/* four hex digits, or -1 */

static ngx_int_t
ngx_http_agent_json_hex(u_char *p)
{
    u_char      c;
    ngx_int_t   n;
    ngx_uint_t  i;

    n = 0;

    for (i = 0; i < 4; i++) {
        c = p[i];

        if (c >= '0' && c <= '9') {
            n = n * 16 + (c - '0');

        } else {
            c |= 0x20;

            if (c < 'a' || c > 'f') {
                return -1;
            }

            n = n * 16 + (c - 'a' + 10);
        }
    }

    return n;
}
