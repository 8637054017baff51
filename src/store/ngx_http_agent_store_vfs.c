
/*
 * Copyright (C) The nginx agent module authors
 */


/*
 * The log's writer opens the store's file through "agent", a VFS over
 * SQLite's default one that differs in one thing: the WAL's frames of a
 * transaction are written to the file together, not one write(2) for
 * each frame's header and one for its page.  SQLite writes a frame as
 * those two writes, at offsets that follow each other; a turn's commit
 * of some twelve pages made 24 pwrite(2) calls, where one call of the
 * same bytes costs a tenth of their time.
 *
 * A WAL file's writes that follow each other are kept in a buffer of the
 * file's own and written as one when:
 *
 *   - the page of a commit's frame (one whose header carries the
 *     database's size) is written: before the commit is made visible to
 *     other connections, and before its sync, with the write's error
 *     returned by the write that completed the commit, as without the
 *     buffer;
 *   - a write does not follow the buffer's end, or would overflow it;
 *   - anything else is done to the file (a read, a sync, its size, a
 *     truncation, a file control), but its close.
 *
 * After a commit's frame, and until the header of a frame that is not a
 * commit's, writes go to the file as they come: padding frames, and the
 * headers whose checksums a transaction that wrote a page twice rewrites
 * at the end, are each the last write before the commit is made visible,
 * and the buffer never holds one.
 *
 * A connection through this VFS must not spill its page cache (PRAGMA
 * cache_spill=OFF, ngx_http_agent_sqlite_connect_vfs()): then all of a
 * transaction's frames are written by its commit, and none is left in
 * the buffer when the commit's call returns.  Frames spilled before the
 * commit, of a transaction then rolled back, would be left there, and
 * written later, over what another connection committed meanwhile.
 *
 * The VFS is a copy of the default one but for its xOpen, and a WAL
 * file's methods a copy of the default's but for those above; other
 * files are the default VFS's own, untouched.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <pthread.h>
#include <sqlite3.h>

#include "ngx_http_agent_store_sqlite.h"


/*
 * The default VFS writes less than 128 KB a call (it masks the length
 * with 0x1ffff, and a longer write is cut short, to its error "database
 * or disk is full"): a turn's commit is some 50 KB
 */
#define NGX_HTTP_AGENT_VFS_BUFFER  (120 * 1024)

/* a frame's header: page number, database size on a commit, salts, sums */
#define NGX_HTTP_AGENT_VFS_FRAME   24


/* after the default VFS's file */
typedef struct {
    u_char                       *buf;
    sqlite3_int64                 start;
    int                           len;
    unsigned                      commit:1;   /* a commit's header last */
    unsigned                      through:1;  /* since a commit's frame */
} ngx_http_agent_vfs_wal_t;


static void ngx_http_agent_vfs_register(void);
static int ngx_http_agent_vfs_open(sqlite3_vfs *vfs, const char *name,
    sqlite3_file *file, int flags, int *out);
static int ngx_http_agent_vfs_write(sqlite3_file *file, const void *buf,
    int n, sqlite3_int64 off);
static int ngx_http_agent_vfs_flush(sqlite3_file *file);
static int ngx_http_agent_vfs_close(sqlite3_file *file);
static int ngx_http_agent_vfs_read(sqlite3_file *file, void *buf, int n,
    sqlite3_int64 off);
static int ngx_http_agent_vfs_truncate(sqlite3_file *file,
    sqlite3_int64 size);
static int ngx_http_agent_vfs_sync(sqlite3_file *file, int flags);
static int ngx_http_agent_vfs_file_size(sqlite3_file *file,
    sqlite3_int64 *size);
static int ngx_http_agent_vfs_file_control(sqlite3_file *file, int op,
    void *arg);


static sqlite3_vfs   ngx_http_agent_vfs;
static sqlite3_vfs  *ngx_http_agent_vfs_default;
static int           ngx_http_agent_vfs_offset;
static int           ngx_http_agent_vfs_rc = SQLITE_ERROR;

static pthread_once_t  ngx_http_agent_vfs_once = PTHREAD_ONCE_INIT;

/* a WAL file's methods: the default VFS's, and the copy made of them */
static const sqlite3_io_methods  *ngx_http_agent_vfs_wal_default;
static sqlite3_io_methods         ngx_http_agent_vfs_wal_methods;
static pthread_mutex_t            ngx_http_agent_vfs_mutex =
                                                     PTHREAD_MUTEX_INITIALIZER;


/*
 * The VFS's name for sqlite3_open_v2(), registered once in a process;
 * NULL (SQLite's default VFS) if it could not be
 */

const char *
ngx_http_agent_vfs_name(void)
{
    (void) pthread_once(&ngx_http_agent_vfs_once,
                        ngx_http_agent_vfs_register);

    return (ngx_http_agent_vfs_rc == SQLITE_OK) ? NGX_HTTP_AGENT_VFS : NULL;
}


static void
ngx_http_agent_vfs_register(void)
{
    sqlite3_vfs  *vfs;

    vfs = sqlite3_vfs_find(NULL);
    if (vfs == NULL) {
        return;
    }

    ngx_http_agent_vfs_default = vfs;

    /* a file is the default VFS's, with the buffer's state after it */
    ngx_http_agent_vfs_offset = (int) ngx_align(vfs->szOsFile,
                                                sizeof(void *));

    ngx_http_agent_vfs = *vfs;
    ngx_http_agent_vfs.pNext = NULL;
    ngx_http_agent_vfs.zName = NGX_HTTP_AGENT_VFS;
    ngx_http_agent_vfs.szOsFile = ngx_http_agent_vfs_offset
                                  + sizeof(ngx_http_agent_vfs_wal_t);
    ngx_http_agent_vfs.xOpen = ngx_http_agent_vfs_open;

    ngx_http_agent_vfs_rc = sqlite3_vfs_register(&ngx_http_agent_vfs, 0);
}


#define ngx_http_agent_vfs_wal(file)                                         \
    ((ngx_http_agent_vfs_wal_t *)                                            \
         ((u_char *) (file) + ngx_http_agent_vfs_offset))


/*
 * Opened by the default VFS: its file is the default's in every way but
 * its xOpen's pVfs (ours, a copy of the default one but for xOpen).  A
 * WAL file with the default's methods of the first WAL file opened gets
 * the copy of them; another (none on this system) is left as it is.
 */

static int
ngx_http_agent_vfs_open(sqlite3_vfs *vfs, const char *name,
    sqlite3_file *file, int flags, int *out)
{
    int                        rc;
    sqlite3_io_methods        *m;
    ngx_http_agent_vfs_wal_t  *wal;

    vfs = ngx_http_agent_vfs_default;

    rc = vfs->xOpen(vfs, name, file, flags, out);

    if (rc != SQLITE_OK || file->pMethods == NULL
        || !(flags & SQLITE_OPEN_WAL))
    {
        return rc;
    }

    (void) pthread_mutex_lock(&ngx_http_agent_vfs_mutex);

    if (ngx_http_agent_vfs_wal_default == NULL) {
        m = &ngx_http_agent_vfs_wal_methods;

        *m = *file->pMethods;
        m->xClose = ngx_http_agent_vfs_close;
        m->xRead = ngx_http_agent_vfs_read;
        m->xWrite = ngx_http_agent_vfs_write;
        m->xTruncate = ngx_http_agent_vfs_truncate;
        m->xSync = ngx_http_agent_vfs_sync;
        m->xFileSize = ngx_http_agent_vfs_file_size;
        m->xFileControl = ngx_http_agent_vfs_file_control;

        /* a WAL file is never mapped: no xFetch to see the buffer */
        if (m->iVersion >= 3) {
            m->xFetch = NULL;
            m->xUnfetch = NULL;
            m->iVersion = 2;
        }

        ngx_http_agent_vfs_wal_default = file->pMethods;
    }

    if (file->pMethods == ngx_http_agent_vfs_wal_default) {
        wal = ngx_http_agent_vfs_wal(file);
        ngx_memzero(wal, sizeof(ngx_http_agent_vfs_wal_t));
        wal->through = 1;

        file->pMethods = &ngx_http_agent_vfs_wal_methods;
    }

    (void) pthread_mutex_unlock(&ngx_http_agent_vfs_mutex);

    return SQLITE_OK;
}


static int
ngx_http_agent_vfs_write(sqlite3_file *file, const void *buf, int n,
    sqlite3_int64 off)
{
    int                        rc;
    unsigned                   commit, header;
    const u_char              *p;
    ngx_http_agent_vfs_wal_t  *wal;

    wal = ngx_http_agent_vfs_wal(file);

    p = buf;
    header = (n == NGX_HTTP_AGENT_VFS_FRAME);
    commit = header && (p[4] | p[5] | p[6] | p[7]);

    if (wal->len && (off != wal->start + wal->len
                     || n > NGX_HTTP_AGENT_VFS_BUFFER - wal->len))
    {
        rc = ngx_http_agent_vfs_flush(file);
        if (rc != SQLITE_OK) {
            return rc;
        }
    }

    if (header && !commit) {
        wal->through = 0;
    }

    /*
     * through: since a commit's frame; but its own page, which follows
     * its header in the buffer.  A commit's header goes in the buffer
     * only after frames of its transaction there, its page to come: one
     * written alone is the last of rewritten headers.
     */

    if ((wal->through && !(wal->commit && wal->len))
        || (commit && wal->len == 0)
        || n > NGX_HTTP_AGENT_VFS_BUFFER)
    {
        wal->commit = 0;
        wal->through |= commit;

        return ngx_http_agent_vfs_wal_default->xWrite(file, buf, n, off);
    }

    if (wal->buf == NULL) {
        wal->buf = sqlite3_malloc(NGX_HTTP_AGENT_VFS_BUFFER);
        if (wal->buf == NULL) {
            return ngx_http_agent_vfs_wal_default->xWrite(file, buf, n, off);
        }
    }

    if (wal->len == 0) {
        wal->start = off;
    }

    ngx_memcpy(wal->buf + wal->len, buf, n);
    wal->len += n;

    if (commit) {
        /* its page next */
        wal->commit = 1;
        wal->through = 1;
        return SQLITE_OK;
    }

    if (wal->commit) {
        return ngx_http_agent_vfs_flush(file);
    }

    return SQLITE_OK;
}


/* the buffer written; an error is the default VFS's write's */

static int
ngx_http_agent_vfs_flush(sqlite3_file *file)
{
    int                        len;
    ngx_http_agent_vfs_wal_t  *wal;

    wal = ngx_http_agent_vfs_wal(file);

    len = wal->len;

    wal->len = 0;
    wal->commit = 0;

    if (len == 0) {
        return SQLITE_OK;
    }

    return ngx_http_agent_vfs_wal_default->xWrite(file, wal->buf, len,
                                                  wal->start);
}


/*
 * What is left in the buffer at the close is no commit's (a commit's
 * frames are written with its last): a transaction's the close rolls
 * back, dropped
 */

static int
ngx_http_agent_vfs_close(sqlite3_file *file)
{
    ngx_http_agent_vfs_wal_t  *wal;

    wal = ngx_http_agent_vfs_wal(file);

    sqlite3_free(wal->buf);
    wal->buf = NULL;
    wal->len = 0;

    return ngx_http_agent_vfs_wal_default->xClose(file);
}


/* what else is done to the file sees what was written */


static int
ngx_http_agent_vfs_read(sqlite3_file *file, void *buf, int n,
    sqlite3_int64 off)
{
    int  rc;

    rc = ngx_http_agent_vfs_flush(file);

    return (rc != SQLITE_OK)
           ? rc : ngx_http_agent_vfs_wal_default->xRead(file, buf, n, off);
}


static int
ngx_http_agent_vfs_truncate(sqlite3_file *file, sqlite3_int64 size)
{
    int  rc;

    rc = ngx_http_agent_vfs_flush(file);

    return (rc != SQLITE_OK)
           ? rc : ngx_http_agent_vfs_wal_default->xTruncate(file, size);
}


static int
ngx_http_agent_vfs_sync(sqlite3_file *file, int flags)
{
    int  rc;

    rc = ngx_http_agent_vfs_flush(file);

    return (rc != SQLITE_OK)
           ? rc : ngx_http_agent_vfs_wal_default->xSync(file, flags);
}


static int
ngx_http_agent_vfs_file_size(sqlite3_file *file, sqlite3_int64 *size)
{
    int  rc;

    rc = ngx_http_agent_vfs_flush(file);

    return (rc != SQLITE_OK)
           ? rc : ngx_http_agent_vfs_wal_default->xFileSize(file, size);
}


static int
ngx_http_agent_vfs_file_control(sqlite3_file *file, int op, void *arg)
{
    int  rc;

    rc = ngx_http_agent_vfs_flush(file);

    return (rc != SQLITE_OK)
           ? rc : ngx_http_agent_vfs_wal_default->xFileControl(file, op, arg);
}
