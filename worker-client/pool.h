/* pool.h: the handler threads and the queues between them and the I/O thread
 * (pool.c). The tags in brackets name the thread that may call (internal.h). */
#ifndef TASKPUSH_WC_POOL_H
#define TASKPUSH_WC_POOL_H

#include "internal.h"

/* Runs a task's handler (or answers it without one) and fills its outcome. [hdl] */
void tpi_task_execute(tp_task *t);

/* Starts opts.threads handler threads; returns 0 or TP_ESYS. [io] */
int tpi_pool_start(tp_worker *w);

/* Lets the threads finish the queue, then joins them. [io] */
void tpi_pool_join(tp_worker *w);

/* Queues a task for the handler threads. [io] */
void tpi_pool_submit(tp_worker *w, tp_task *t);

/* Gives a task whose handler returned back to the I/O thread. [hdl] */
void tpi_done_push(tp_worker *w, tp_task *t);

/* Takes the done queue (linked by next) and the EXTEND requests (linked by
 * ext_taken_next, since a handler may queue a new request meanwhile) at once,
 * under done_mu. Process *ext first: an EXTEND in it was queued before its
 * task's DONE, and the task lives until that DONE is processed. [io] */
void tpi_done_take(tp_worker *w, tp_task **done, tp_task **ext);

/* Frees a task and its outcome. */
void tpi_task_free(tp_task *t);

/* Queues an EXTEND request for the I/O thread. [hdl] or any thread */
void tpi_extend_push(tp_worker *w, tp_task *t, uint32_t ms);

/* Queues a PROGRESS report for the I/O thread, replacing one not yet taken. [hdl] or
 * any thread */
void tpi_progress_push(tp_worker *w, tp_task *t, uint16_t permille, const char *msg, size_t len);

#endif
