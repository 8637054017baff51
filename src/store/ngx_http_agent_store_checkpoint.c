
/*
 * Copyright (C) The nginx agent module authors
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_agent_module.h"
#include "ngx_http_agent_store.h"


/*
 * The WAL's checkpoint on the thread pool, beside the writer.  A batch
 * whose commit leaves the WAL past the store's threshold asks for one
 * (b->checkpoint), and the batch's end posts it: one at a time in a
 * worker, on a connection of the store's own.  A PASSIVE checkpoint
 * takes no writer's lock, so the batches that follow, and the inputs
 * they answer, go on meanwhile; made by the writer after its commit, it
 * held them for some 8 ms at the median and up to 60 ms under load.
 * Frames committed while it runs are left to the next one, which the
 * next batch asks for as long as the WAL has not started again.
 *
 * The task is the worker's one: its event says whether it is posted.
 * A worker that exits waits for it with the thread pool's other tasks.
 */


static void ngx_http_agent_store_checkpoint_thread(void *data,
    ngx_log_t *log);
static void ngx_http_agent_store_checkpoint_done(ngx_event_t *ev);


static ngx_thread_task_t  ngx_http_agent_store_checkpoint_task;


void
ngx_http_agent_store_checkpoint(ngx_http_agent_store_conf_t *scf)
{
    ngx_thread_task_t  *task;

    task = &ngx_http_agent_store_checkpoint_task;

    if (task->event.active || scf->store->checkpoint == NULL) {
        return;
    }

    task->ctx = scf;
    task->handler = ngx_http_agent_store_checkpoint_thread;
    task->event.handler = ngx_http_agent_store_checkpoint_done;
    task->event.data = scf;
    task->event.log = ngx_cycle->log;

    /* a full queue: the next batch asks again */
    (void) ngx_thread_task_post(scf->thread_pool, task);
}


static void
ngx_http_agent_store_checkpoint_thread(void *data, ngx_log_t *log)
{
    ngx_http_agent_store_conf_t *scf = data;

    (void) scf->store->checkpoint(&scf->path, log);
}


static void
ngx_http_agent_store_checkpoint_done(ngx_event_t *ev)
{
    /* the thread pool made the task inactive: it may be posted again */
}
