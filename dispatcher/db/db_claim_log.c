/* db_claim_log: the claims whose task_claim row still lists a PROCESSING row of ours
 * (schema version 5; see db_internal.h). The claim thread opens a claim once its
 * transaction committed; the write thread settles each row as its final outcome is
 * written (or fenced: the row is no longer ours), and deletes the rows of task_claim
 * whose claims are settled. Rows never settled (an outcome lost, a crash, leadership
 * lost) keep their task_claim row: the next leader's recovery reads it. */
#include "db_internal.h"

#include <stdlib.h>
#include <string.h>

struct open_claim {
    uint32_t left; /* rows still PROCESSING */
};

int dsp_dbi_claim_list(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, uint32_t epoch,
                       const char *ids_csv, size_t len, uint64_t *seq)
{
    *seq = atomic_fetch_add_explicit(&db->claim_seq, 1, memory_order_relaxed) + 1;
    dsp_strbuf_reset(sql);
    dsp_db_sql_claim_log_insert(sql, &db->names, epoch, *seq, db->shard, ids_csv, len);
    if (sql->oom)
        return -2;
    return dsp_dbi_exec(c, sql->p, sql->len, NULL) < 0 ? -1 : 0;
}

/* Forgets every open claim (their epoch is over for this process). mu held. */
static void claims_reset_locked(dsp_db *db, uint32_t epoch)
{
    for (size_t i = 0; db->open_claims.keys && i <= db->open_claims.mask; i++)
        free(db->open_claims.vals[i]);
    dsp_taskmap_free(&db->open_claims);
    db->claims_epoch = epoch;
}

static int settled_add_locked(dsp_db *db, uint32_t epoch, uint64_t seq)
{
    if (epoch != db->settled_epoch) {
        /* An older epoch's rows are recovered by whoever leads next. */
        db->nsettled = 0;
        db->settled_epoch = epoch;
    }
    if (db->nsettled == db->settled_cap) {
        size_t cap = db->settled_cap ? db->settled_cap * 2 : 64;
        uint64_t *p = realloc(db->settled, cap * sizeof *p);
        if (p == NULL)
            return -1; /* the row stays: recovery finds its rows finished and deletes it */
        db->settled = p;
        db->settled_cap = cap;
    }
    db->settled[db->nsettled++] = seq;
    return 0;
}

int dsp_dbi_claims_open(dsp_db *db, uint32_t epoch, uint64_t seq, uint32_t n)
{
    struct open_claim *oc;
    int rc = 0;

    if (n == 0)
        return 0;
    if ((oc = malloc(sizeof *oc)) == NULL)
        return -1;
    oc->left = n;
    pthread_mutex_lock(&db->mu);
    if (epoch != db->claims_epoch || db->open_claims.keys == NULL) {
        if (epoch != db->claims_epoch)
            claims_reset_locked(db, epoch);
        if (db->open_claims.keys == NULL && dsp_taskmap_init(&db->open_claims, 64) < 0)
            rc = -1;
    }
    if (rc == 0 && dsp_taskmap_put(&db->open_claims, seq, oc) < 0)
        rc = -1;
    pthread_mutex_unlock(&db->mu);
    if (rc < 0)
        free(oc);
    return rc;
}

void dsp_dbi_claims_settle_locked(dsp_db *db, uint32_t epoch, uint64_t seq)
{
    struct open_claim *oc;

    if (seq == 0 || epoch != db->claims_epoch || db->open_claims.keys == NULL ||
        (oc = dsp_taskmap_get(&db->open_claims, seq)) == NULL)
        return;
    if (--oc->left > 0)
        return;
    free(dsp_taskmap_del(&db->open_claims, seq));
    settled_add_locked(db, epoch, seq);
}

void dsp_dbi_claims_forget_locked(dsp_db *db, uint32_t epoch, uint64_t seq)
{
    if (seq == 0)
        return;
    if (epoch == db->claims_epoch && db->open_claims.keys != NULL)
        free(dsp_taskmap_del(&db->open_claims, seq));
    settled_add_locked(db, epoch, seq);
}

void dsp_dbi_claims_delete_settled(dsp_db *db, struct dbconn *c, dsp_strbuf *sql)
{
    /* At most this many per statement: each seq is a few bytes. */
    enum { CHUNK = 1000 };
    uint64_t seqs[CHUNK];
    uint32_t epoch;
    uint64_t affected;
    size_t n;

    if (c->m == NULL)
        return;
    for (;;) {
        pthread_mutex_lock(&db->mu);
        n = db->nsettled < CHUNK ? db->nsettled : CHUNK;
        if (n == 0) {
            pthread_mutex_unlock(&db->mu);
            return;
        }
        memcpy(seqs, db->settled + (db->nsettled - n), n * sizeof *seqs);
        epoch = db->settled_epoch;
        db->nsettled -= n;
        pthread_mutex_unlock(&db->mu);
        dsp_strbuf_reset(sql);
        dsp_db_sql_claim_log_delete(sql, &db->names, epoch, seqs, n);
        if (sql->oom || dsp_dbi_exec(c, sql->p, sql->len, &affected) < 0) {
            /* Listed again for the next batch; the write connection logs its errors. */
            pthread_mutex_lock(&db->mu);
            for (size_t i = 0; i < n; i++)
                if (settled_add_locked(db, epoch, seqs[i]) < 0)
                    break;
            pthread_mutex_unlock(&db->mu);
            return;
        }
    }
}

void dsp_dbi_claims_free(dsp_db *db)
{
    claims_reset_locked(db, 0);
    free(db->settled);
    db->settled = NULL;
    db->nsettled = db->settled_cap = 0;
}
