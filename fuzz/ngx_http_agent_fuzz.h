
/*
 * Copyright (C) The nginx agent module authors
 */


#ifndef _NGX_HTTP_AGENT_FUZZ_H_INCLUDED_
#define _NGX_HTTP_AGENT_FUZZ_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"


/*
 * What the fuzz targets share: nginx's process-wide state set up once,
 * a pool per input, the cut points of a stream, and the checks that
 * stop the fuzzer (abort) when an invariant fails.
 *
 * An input of a stream target is a header, then the stream:
 *
 *     byte 0        bits 0-2: n, how many length bytes follow;
 *                   bit 3: the lengths count in 64-byte units;
 *                   bits 4-7: the target's own flags
 *     bytes 1..n    the lengths of the pieces, each plus one, taken in
 *                   turn until the stream is fed whole
 *     the rest      the stream
 *
 * With n == 0 the stream goes in one piece.  Each piece is a buffer of
 * its own, freed once it was fed, so that a read past its end or a
 * pointer kept into it is caught by AddressSanitizer.
 */


#define NGX_HTTP_AGENT_FUZZ_CUTS_MAX  7


typedef struct {
    u_char                   *start;
    u_char                   *pos;
    u_char                   *last;

    /* the piece last handed out, freed on the next call */
    u_char                   *piece;

    u_char                    lens[NGX_HTTP_AGENT_FUZZ_CUTS_MAX];
    ngx_uint_t                nlens;
    ngx_uint_t                unit;
    ngx_uint_t                next;
    ngx_uint_t                whole;

    /* bits 4-7 of byte 0, shifted down */
    ngx_uint_t                flags;
} ngx_http_agent_fuzz_cuts_t;


extern ngx_log_t  *ngx_http_agent_fuzz_log;


int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

ngx_pool_t *ngx_http_agent_fuzz_pool(void);

void ngx_http_agent_fuzz_cuts_init(ngx_http_agent_fuzz_cuts_t *cuts,
    const uint8_t *data, size_t size);
void ngx_http_agent_fuzz_cuts_rewind(ngx_http_agent_fuzz_cuts_t *cuts,
    ngx_uint_t whole);
ngx_int_t ngx_http_agent_fuzz_cuts_next(ngx_http_agent_fuzz_cuts_t *cuts,
    u_char **p, u_char **last);

u_char *ngx_http_agent_fuzz_copy(ngx_pool_t *pool, const uint8_t *data,
    size_t size);
uint64_t ngx_http_agent_fuzz_hash(uint64_t h, u_char *p, size_t len);
void ngx_http_agent_fuzz_json(u_char *p, size_t len, char *what);
void ngx_http_agent_fuzz_fail(char *what, u_char *p, size_t len);

/* the provider targets: one stream through an adapter */
int ngx_http_agent_fuzz_provider(ngx_http_agent_provider_t *provider,
    const uint8_t *data, size_t size);


#define NGX_HTTP_AGENT_FUZZ_HASH  0xcbf29ce484222325ULL


#endif /* _NGX_HTTP_AGENT_FUZZ_H_INCLUDED_ */
