/* inventory.h: what a worker carries across a lost connection in protocol version 3
 * (inventory.c), for client.c. Every call is made on the I/O thread. */
#ifndef TASKPUSH_WC_INVENTORY_H
#define TASKPUSH_WC_INVENTORY_H

#include "internal.h"
#include "proto.h"

#include <stdint.h>

/* Keeps a copy of a DONE until a CONFIRM names it; beyond 4 x capacity + 1024 kept, the
 * oldest is forgotten (and logged). */
void tpi_inv_keep(tp_worker *w, const proto_done *d);
/* A CONFIRM: forgets the outcomes it names. */
void tpi_inv_on_confirm(tp_worker *w, const proto_dlv_list *l);
/* A version-3 connection was lost: its held deliveries go on running, carried. */
void tpi_inv_carry(tp_worker *w);
/* t's handler returned: it leaves the carried list (no-op when not on it). */
void tpi_inv_uncarry(tp_worker *w, tp_task *t);
/* The carried task of that delivery, or NULL. */
tp_task *tpi_inv_find_carried(tp_worker *w, uint64_t id, uint32_t epoch, uint32_t attempt);
/* Stopping, or a session older than version 3: carried tasks are cancelled (their
 * outcomes will be dropped), kept outcomes forgotten. */
void tpi_inv_abandon(tp_worker *w);
/* After WELCOME: in version 3, HOLDING for the carried tasks, then every kept outcome
 * again; in older versions, tpi_inv_abandon. Returns 0, or -1 when it cannot be queued. */
int tpi_inv_session_start(tp_worker *w);
/* tp_worker_run() ends: frees what is kept (the tasks themselves are freed elsewhere). */
void tpi_inv_free(tp_worker *w);

#endif
