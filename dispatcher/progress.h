/* progress.h: the reports of PROGRESS on their way to the progress table (progress.c):
 * a task's latest report is written at most once a second, in one batch for all tasks
 * on the stats thread, and its row deleted when the task leaves the dispatcher. */
#ifndef TASKPUSH_DSP_PROGRESS_H
#define TASKPUSH_DSP_PROGRESS_H

#include "server.h"

#include <stdint.h>

/* t's report changed (conn.c): written with the next batch. */
void dsp_progress_note(dsp_server *srv, dsp_task *t);
/* t, whose report was written, leaves the dispatcher (ended, put back, released): its
 * row is deleted with the next batch. */
void dsp_progress_task_gone(dsp_server *srv, const dsp_task *t);
/* The housekeeping tick: at most once a second, hands the changed reports and the
 * deletions to the database (while leading). */
void dsp_progress_flush(dsp_server *srv, int64_t now_ms);
void dsp_progress_free(dsp_server *srv);

#endif
