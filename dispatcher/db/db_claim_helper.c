/* db_claim_helper: the claim helper, a thread with a connection of its own that locks and
 * marks the second half of a large claim while the claim thread does the first half, so
 * that the two halves' statements and commits overlap (see db_claim.c do_claim). It owns
 * its connection and the one job the claim thread hands it at a time.
 *
 * The helper's connection does not hold the table's lock, so its transaction is fenced
 * by the epoch instead: it first reads taskpush_meta's epoch with a shared lock. A
 * dispatcher that takes the table over must update that row (a new epoch) before it
 * recovers, so either the helper commits first (and the recovery that follows sees its
 * rows PROCESSING under the old epoch and puts them back), or the helper reads the new
 * epoch and claims nothing. The helper connects at the first claim large enough to
 * split, so a dispatcher that only ever claims a few rows holds no extra connection.
 * While it is not connected, claims run whole on the claim thread; its connection does
 * not count for health. The lease records its connection like the others'.
 */
#include "db_claim_helper.h"

#include "db_sql.h"

#include <mysql.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum half_state { HALF_IDLE, HALF_POSTED, HALF_RUNNING, HALF_DONE };

struct dsp_claim_half {
    dsp_db *db;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the helper waits for a job or the end; the claim thread for a result */
    bool exit;
    bool wanted;    /* a claim could have used the helper: connect */
    bool connected;
    enum half_state state;

    /* The job: in, then out. */
    uint64_t *ids;
    size_t n;
    uint32_t epoch;
    int64_t now_ms;
    int rc;            /* enum dsp_half_rc */
    MYSQL_RES *res;    /* HALF_CLAIMED: the rows locked and marked */
    uint64_t *locked;  /* their ids (HALF_CLAIMED, HALF_UNKNOWN) */
    size_t nlocked;
    uint64_t seq;      /* HALF_CLAIMED with rows: its task_claim row */

    struct dbconn c;   /* the helper thread's only */
    dsp_strbuf sql;
    dsp_strbuf ids_csv; /* the job's ids, then the locked ones: formatted once a claim */
};

/* Reads the epoch counter with a shared lock: 1 when it is still epoch, 0 when it
 * moved on, -1 on error. */
static int half_fence(dsp_claim_half *h)
{
    uint64_t v;
    bool isnull;
    char sql[64 + DSP_TABLE_IDENT_CAP];

    snprintf(sql, sizeof sql, "SELECT value FROM %s WHERE name = 'epoch' LOCK IN SHARE MODE",
             h->db->names.meta);
    if (dsp_dbi_query_u64(&h->c, sql, &v, &isnull, 0) != 0)
        return -1;
    return !isnull && v == h->epoch ? 1 : 0;
}

/* The lock read of the job's ids; keeps the result and the ids it returned. 0 or -1. */
static int half_lock(dsp_claim_half *h)
{
    dsp_db *db = h->db;
    MYSQL_ROW row;

    dsp_strbuf_reset(&h->ids_csv);
    dsp_db_sql_id_csv(&h->ids_csv, h->ids, h->n);
    dsp_strbuf_reset(&h->sql);
    dsp_db_sql_claim_lock(&h->sql, &h->db->names, h->now_ms, h->ids_csv.p, h->ids_csv.len);
    if (h->ids_csv.oom || h->sql.oom)
        return -1;
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(h->c.m, h->sql.p, (unsigned long)h->sql.len) != 0 ||
        (h->res = mysql_store_result(h->c.m)) == NULL) {
        h->c.err = mysql_errno(h->c.m);
        log_warn(db->log, "claim helper: locking: %s (error %u)",
                 h->c.err ? mysql_error(h->c.m) : "no result", h->c.err);
        return -1;
    }
    if (mysql_num_fields(h->res) != DSP_DB_SQL_LOCK_NCOLS)
        return -1;
    h->locked = malloc((mysql_num_rows(h->res) + 1) * sizeof *h->locked);
    if (h->locked == NULL)
        return -1;
    while ((row = mysql_fetch_row(h->res)) != NULL)
        if (row[DSP_DB_SQL_LOCK_ID] != NULL)
            h->locked[h->nlocked++] = strtoull(row[DSP_DB_SQL_LOCK_ID], NULL, 10);
    if (mysql_errno(h->c.m) != 0)
        return -1;
    mysql_data_seek(h->res, 0); /* the claim thread reads the rows again */
    return 0;
}

/* Runs the job on the connection: fence, lock, mark, commit. Sets h->rc. Returns -1
 * when the connection is no longer to be trusted. */
static int half_run(dsp_claim_half *h)
{
    int f;

    h->rc = DSP_HALF_NONE;
    h->c.err = 0;
    /* Only once the lease records this connection: a dispatcher taking over then KILLs
     * it, so a frozen helper's shared lock on the epoch row cannot hold up the epoch
     * change (and the takeover) for innodb_lock_wait_timeout. */
    if (dsp_dbi_lease_gate(h->db, LEASE_CONN_HELPER, (uint64_t)mysql_thread_id(h->c.m), 0,
                           h->epoch) != 0) {
        log_debug(h->db->log, "claim helper: not yet recorded in the lease; claiming nothing");
        return 0;
    }
    if ((f = half_fence(h)) < 0)
        return -1;
    if (f == 0) {
        log_info(h->db->log, "claim helper: the epoch moved on from %u; claiming nothing",
                 (unsigned)h->epoch);
        return dsp_dbi_exec_str(&h->c, "ROLLBACK");
    }
    if (half_lock(h) < 0)
        return -1;
    h->seq = 0;
    if (h->nlocked > 0) {
        /* Every row locked: the lock's list is the mark's (a set, in any order). */
        if (h->nlocked != h->n) {
            dsp_strbuf_reset(&h->ids_csv);
            dsp_db_sql_id_csv(&h->ids_csv, h->locked, h->nlocked);
        }
        dsp_strbuf_reset(&h->sql);
        dsp_db_sql_claim_mark(&h->sql, &h->db->names, h->epoch, dsp_wall_ms(), h->ids_csv.p,
                              h->ids_csv.len);
        if (h->ids_csv.oom || h->sql.oom || dsp_dbi_exec(&h->c, h->sql.p, h->sql.len, NULL) < 0)
            return -1;
        /* Its own task_claim row, in its own transaction (db_claim.c claim_mark). */
        if (dsp_dbi_claim_list(h->db, &h->c, &h->sql, h->epoch, h->ids_csv.p, h->ids_csv.len,
                               &h->seq) < 0)
            return -1;
        /* The fencing write, as the claim thread's (db_claim.c claim_mark): on Galera the
         * shared lock of half_fence is not certified, this write is. */
        if ((f = dsp_dbi_lease_fence(h->db, &h->c, h->epoch)) < 0)
            return -1;
        if (f == 0) {
            log_error(h->db->log, "claim helper: the lease row is no longer this dispatcher's;"
                                  " claiming nothing");
            dsp_dbi_lease_deposed(h->db);
            return -1; /* closing the connection rolls back */
        }
    }
    if (dsp_dbi_exec_str(&h->c, "COMMIT") < 0) {
        /* It may have committed: the claim thread puts these rows back to NEW. A
         * conflict (Galera's certification) is a rollback for sure. */
        h->rc = dsp_dbi_error_is_conflict(h->c.err) ? DSP_HALF_NONE : DSP_HALF_UNKNOWN;
        return -1;
    }
    if (h->seq && dsp_dbi_claims_open(h->db, h->epoch, h->seq, (uint32_t)h->nlocked) < 0)
        log_error(h->db->log, "out of memory noting claim %" PRIu64, h->seq);
    h->rc = DSP_HALF_CLAIMED;
    return 0;
}

/* A failed job: nothing claimed (the connection closes, the server rolls back; after a
 * conflict, a ROLLBACK keeps it), or an unknown outcome whose ids stay for the claim
 * thread. Its rows stay NEW for the next claim. */
static void half_failed(dsp_claim_half *h)
{
    bool keep = h->rc == DSP_HALF_NONE && dsp_dbi_error_is_conflict(h->c.err) &&
                dsp_dbi_exec_str(&h->c, "ROLLBACK") == 0;

    if (h->res) {
        mysql_free_result(h->res);
        h->res = NULL;
    }
    if (h->rc != DSP_HALF_UNKNOWN) {
        free(h->locked);
        h->locked = NULL;
        h->nlocked = 0;
    }
    if (!keep)
        dsp_dbi_conn_close(&h->c);
}

static void *half_main(void *arg)
{
    dsp_claim_half *h = arg;

    mysql_thread_init();
    pthread_mutex_lock(&h->mu);
    while (!h->exit) {
        if (dsp_dbi_conn_stale(&h->c))
            dsp_dbi_conn_close(&h->c); /* off to the server in use */
        if (h->c.m == NULL && !h->wanted) {
            pthread_cond_wait(&h->cv, &h->mu);
            continue;
        }
        if (h->c.m == NULL) {
            int64_t wait_ms;
            bool ok;

            pthread_mutex_unlock(&h->mu);
            ok = dsp_dbi_conn_open(&h->c, false, false) == 0;
            wait_ms = ok ? 0 : dsp_dbi_backoff_next(&h->c);
            pthread_mutex_lock(&h->mu);
            h->connected = ok;
            if (!ok && !h->exit)
                cond_wait_until(&h->cv, &h->mu, dsp_now_ms() + wait_ms);
            continue;
        }
        if (h->state != HALF_POSTED) {
            pthread_cond_wait(&h->cv, &h->mu);
            continue;
        }
        h->state = HALF_RUNNING;
        pthread_mutex_unlock(&h->mu);
        if (half_run(h) < 0)
            half_failed(h);
        pthread_mutex_lock(&h->mu);
        h->connected = h->c.m != NULL;
        h->state = HALF_DONE;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    dsp_dbi_conn_close(&h->c);
    mysql_thread_end();
    return NULL;
}

dsp_claim_half *dsp_dbi_half_start(dsp_db *db)
{
    dsp_claim_half *h = calloc(1, sizeof *h);
    pthread_condattr_t ca;

    if (h == NULL)
        return NULL;
    h->db = db;
    h->c.db = db;
    h->c.who = "claim helper";
    h->c.rng = (uint64_t)dsp_now_us() * 0xBF58476D1CE4E5B9ULL ^ (uint64_t)(uintptr_t)h;
    if (h->c.rng == 0)
        h->c.rng = 1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&h->thr, NULL, half_main, h) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    return h;
}

bool dsp_dbi_half_post(dsp_claim_half *h, const uint64_t *ids, size_t n, uint32_t epoch,
                       int64_t now_ms)
{
    uint64_t *copy;
    bool ok;

    if (h == NULL || n == 0)
        return false;
    pthread_mutex_lock(&h->mu);
    ok = h->connected && h->state == HALF_IDLE && !h->exit;
    if (!h->wanted) {
        h->wanted = true;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    if (!ok || (copy = malloc(n * sizeof *copy)) == NULL)
        return false;
    memcpy(copy, ids, n * sizeof *copy);
    pthread_mutex_lock(&h->mu);
    h->ids = copy;
    h->n = n;
    h->epoch = epoch;
    h->now_ms = now_ms;
    h->rc = DSP_HALF_NONE;
    h->res = NULL;
    h->locked = NULL;
    h->nlocked = 0;
    h->state = HALF_POSTED;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return true;
}

uint64_t dsp_dbi_half_seq(dsp_claim_half *h)
{
    return h->seq;
}

int dsp_dbi_half_wait(dsp_claim_half *h, MYSQL_RES **res, uint64_t **ids, size_t *n)
{
    int rc;

    pthread_mutex_lock(&h->mu);
    while (h->state != HALF_DONE)
        pthread_cond_wait(&h->cv, &h->mu);
    rc = h->rc;
    *res = h->res;
    *ids = h->locked;
    *n = h->nlocked;
    free(h->ids);
    h->ids = NULL;
    h->res = NULL;
    h->locked = NULL;
    h->state = HALF_IDLE;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

void dsp_dbi_half_stop(dsp_claim_half *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->exit = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thr, NULL);
    dsp_strbuf_free(&h->sql);
    dsp_strbuf_free(&h->ids_csv);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
