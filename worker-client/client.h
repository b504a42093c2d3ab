/* client.h: what client.c (the worker's event loop and connection) offers the
 * other files: the state names, and the EXTEND that task.c sends from the I/O
 * thread. */
#ifndef TASKPUSH_WC_CLIENT_H
#define TASKPUSH_WC_CLIENT_H

#include "internal.h"

#include <stdint.h>

/* The name of a connection state, for log lines. */
const char *tpi_state_text(enum tpi_conn_state s);

/* Sends an EXTEND for t now (on the I/O thread). */
void tpi_conn_send_extend(tp_worker *w, tp_task *t, uint32_t ms);
/* Sends PROGRESS for t when its connection is still the current one, of version 4. [io] */
void tpi_conn_send_progress(tp_worker *w, tp_task *t, uint16_t permille, const char *msg, size_t len);

#endif
