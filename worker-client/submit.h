/* submit.h: what client.c calls of tp_submit()'s side (submit.c): the set-up and
 * tear-down in tp_worker_new/free, the rest on the I/O thread. */
#ifndef TASKPUSH_WC_SUBMIT_H
#define TASKPUSH_WC_SUBMIT_H

#include "internal.h"
#include "proto.h"

/* Sets up / tears down the submission state (tp_worker_new / tp_worker_free). */
int tpi_submit_init(tp_worker *w);
void tpi_submit_destroy(tp_worker *w);
/* Takes the queue and sends what a version-2 session can carry. [io] */
void tpi_submit_flush(tp_worker *w);
/* A SUBMITTED or OUTCOME frame. [io] */
void tpi_submit_on_submitted(tp_worker *w, const proto_submitted *s);
void tpi_submit_on_outcome(tp_worker *w, const proto_outcome_msg *o);
/* The connection closed: what was sent gets TP_EGONE. [io] */
void tpi_submit_conn_lost(tp_worker *w);
/* tp_worker_run() ends: everything queued or pending gets TP_EGONE. [io] */
void tpi_submit_fail_all(tp_worker *w, const char *why);
/* Ends the submissions waiting for a connection (none sent) with rc and why. */
void tpi_submit_fail_waiting(tp_worker *w, int rc, const char *why);
/* Sent submissions still waiting for SUBMITTED (a drain waits for them). [io] */
int tpi_submit_unanswered(const tp_worker *w);

#endif
