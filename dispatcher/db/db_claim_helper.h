/* db_claim_helper.h: the claim helper (db_claim_helper.c), used by the claim thread only. */
#ifndef TASKPUSH_DSP_DB_CLAIM_HELPER_H
#define TASKPUSH_DSP_DB_CLAIM_HELPER_H

#include "db_internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsp_claim_half dsp_claim_half;

/* How a job ended. */
enum dsp_half_rc {
    DSP_HALF_CLAIMED, /* committed: the rows returned are PROCESSING under the epoch */
    DSP_HALF_NONE,    /* nothing claimed (an error before the commit, or the epoch moved on) */
    DSP_HALF_UNKNOWN, /* the COMMIT failed: the rows returned may be PROCESSING */
};

/* Starts the helper thread; it connects (and reconnects, with backoff) once the first
 * job was offered. NULL when it cannot start: claims then run whole on the claim
 * thread. */
dsp_claim_half *dsp_dbi_half_start(dsp_db *db);

/* Hands the helper the ids to lock and mark under epoch (copied), when it is connected
 * and idle. Returns false when it cannot take them (the first call also asks it to
 * connect): claim them yourself. */
bool dsp_dbi_half_post(dsp_claim_half *h, const uint64_t *ids, size_t n, uint32_t epoch,
                       int64_t now_ms);

/* Waits for the posted job to end. On DSP_HALF_CLAIMED *res holds the rows locked and
 * marked (the columns of dsp_db_sql_claim_lock; the caller frees it) and *ids their ids;
 * on DSP_HALF_UNKNOWN *res is NULL and *ids the rows that may have been marked; else
 * both are NULL. The caller frees *ids. */
int dsp_dbi_half_wait(dsp_claim_half *h, MYSQL_RES **res, uint64_t **ids, size_t *n);
/* After a wait that returned DSP_HALF_CLAIMED: the seq of the half's task_claim row (0
 * when it marked no row). */
uint64_t dsp_dbi_half_seq(dsp_claim_half *h);

/* Ends the helper (after its current job) and frees it. NULL is fine. */
void dsp_dbi_half_stop(dsp_claim_half *h);

#endif
