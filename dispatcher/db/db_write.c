/* db_write: the write thread (see db_internal.h for what it shares). It owns taking
 * batches from the write queue, writing them (one fenced UPDATE per kind, the skip-locked
 * path when another transaction holds a row, deferring such rows), the inventory's
 * entries (adoptions and foreign outcomes, one statement each), and on_written with the
 * acknowledgements the loop turns into CONFIRM frames and adoptions.
 */
#include "db_internal.h"

#include <mysql.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the write thread ---- */

/* An outcome of the batch, by task_id, for sorting. */
struct wref {
    uint64_t task_id;
    size_t i; /* index in the batch */
};

struct write_ctx {
    dsp_db *db;
    struct dbconn c;
    struct wentry *batch;
    size_t n;
    uint8_t *done;
    uint8_t *isolate; /* write this outcome in a statement of its own */
    uint8_t *defer;   /* its row is locked by another transaction: queue it again */
    uint8_t *final;   /* written as SUCCESSFUL or FAILED for sure: a submitter may wait for it */
    uint8_t *lost;    /* given up without a statement that settled it: never confirmed */
    uint8_t *tried;   /* an ADOPT sent once already (the connection broke after it) */
    dsp_write_ack *acks; /* one per entry of the batch with a conn_id; NULL when none has */
    size_t *ackidx;      /* entry i's ack: acks[ackidx[i]] */
    uint8_t *ours, *busy; /* scratch of write_skip_locked, per row of a statement */
    dsp_db_sql_row *sub;  /* scratch of write_skip_locked: the rows it writes */
    dsp_db_sql_row *rows;
    struct wref *refs;
    size_t *idx;
    dsp_strbuf sql;
    uint64_t dropped;
    int64_t next_connect;
};

static bool write_past_deadline(dsp_db *db)
{
    bool past;
    pthread_mutex_lock(&db->mu);
    past = db->write_stop && dsp_now_ms() >= db->write_deadline_ms;
    pthread_mutex_unlock(&db->mu);
    return past;
}

/* Sleeps ms, or until the stop deadline when that comes first. */
static void write_sleep(dsp_db *db, int64_t ms)
{
    int64_t until = dsp_now_ms() + ms, end;

    pthread_mutex_lock(&db->mu);
    for (;;) {
        end = until;
        if (db->write_stop && db->write_deadline_ms < end)
            end = db->write_deadline_ms;
        if (dsp_now_ms() >= end)
            break;
        cond_wait_until(&db->write_cv, &db->mu, end);
    }
    pthread_mutex_unlock(&db->mu);
}

/* Makes each outcome's error text fit its column: valid UTF-8 of at most 65,535 bytes.
 * Results are never cut: one the table cannot hold whole fails its task (result_refuse). */
static void write_prepare(struct write_ctx *w, size_t *left)
{
    dsp_db *db = w->db;
    size_t i;

    for (i = 0; i < w->n; i++) {
        dsp_outcome *o = &w->batch[i].o;
        if (o->data == NULL)
            o->len = 0;
        switch (o->kind) {
        case DSP_WRITE_RELEASE:
        case DSP_WRITE_DELIVERED:
        case DSP_WRITE_ADOPT:
        case DSP_WRITE_NOTE:
            o->len = 0; /* err_msg stays as it was */
            break;
        case DSP_WRITE_SUCCEEDED:
            break;
        case DSP_WRITE_FAILED:
        case DSP_WRITE_RETRY: {
            size_t valid = o->len ? dsp_utf8_valid_prefix(o->data, o->len) : 0;
            size_t cap;
            uint8_t *clean;
            if (valid == o->len && o->len <= DSP_DB_ERR_MSG_MAX)
                break;
            cap = o->len > DSP_DB_ERR_MSG_MAX / 3 ? DSP_DB_ERR_MSG_MAX : 3 * o->len;
            if ((clean = malloc(cap)) != NULL) {
                size_t nl = dsp_utf8_sanitize(o->data, o->len, clean, cap);
                free(o->data);
                o->data = clean;
                o->len = nl;
            } else {
                o->len = dsp_utf8_cut(o->data, valid, DSP_DB_ERR_MSG_MAX);
            }
            break;
        }
        default:
            log_error(db->log, "outcome of task %" PRIu64 " has an unknown kind %u; not written",
                      o->task_id, (unsigned)o->kind);
            w->done[i] = 1;
            w->lost[i] = 1;
            (*left)--;
            w->dropped++;
            break;
        }
    }
}

/* ---- results too large for a statement's text ---- */

/* The largest result c can store whole: a parameter sent as long data may be as large
 * as the session's max_allowed_packet; the column holds 16 MiB - 1. */
static size_t result_cap(const struct dbconn *c)
{
    return c->max_packet && c->max_packet < DSP_DB_RESULT_MAX ? c->max_packet : DSP_DB_RESULT_MAX;
}

/* Written by write_large rather than in the text of a batch statement. */
static bool result_is_large(const struct write_ctx *w, const dsp_outcome *o)
{
    return o->len >= DSP_DB_RESULT_PARAM_MIN ||
           DSP_DB_SQL_WRITE_FIXED + 2 * (size_t)o->len + 512 > w->c.stmt_limit;
}

/* A result the table cannot hold whole: the task fails with a text that says why (a
 * cut result must never be called a success), written as any FAILED outcome is. */
static void result_refuse(struct write_ctx *w, dsp_outcome *o)
{
    size_t cap = result_cap(&w->c);
    char text[200];
    int n;
    uint8_t *copy;

    if (cap < DSP_DB_RESULT_MAX)
        n = snprintf(text, sizeof text, "result of %zu bytes exceeds the database's max_allowed_packet of %zu",
                     o->len, cap);
    else
        n = snprintf(text, sizeof text, "result of %zu bytes exceeds the result column's largest value of %u",
                     o->len, DSP_DB_RESULT_MAX);
    log_error(w->db->log, "task %" PRIu64 ": %s; the task fails", o->task_id, text);
    free(o->data);
    o->data = NULL;
    o->len = 0;
    if (n > 0 && (copy = malloc((size_t)n)) != NULL) {
        memcpy(copy, text, (size_t)n);
        o->data = copy;
        o->len = (size_t)n;
    }
    o->kind = DSP_WRITE_FAILED;
}

/* A large result (result_is_large): one UPDATE of its own, the bytes its parameter (no
 * hex copy). One too large for the table becomes a FAILED outcome, which the pass writes
 * with the other failures. Returns 0, or -1 on a connection error. */
static int write_large(struct write_ctx *w, size_t i, dsp_write_report *rep, size_t *left)
{
    dsp_outcome *o = &w->batch[i].o;
    dsp_db_sql_row row = {o->task_id, o->attempts, o->run_after_ms, o->data, o->len};
    uint64_t affected = 0;

    if (o->len > result_cap(&w->c)) {
        result_refuse(w, o);
        return 0;
    }
    /* A row another transaction holds refuses this read at once (the connection does
     * not wait for locks): its outcome is deferred without sending the bytes, which a
     * deferred outcome would otherwise send again at every flush. */
    dsp_strbuf_reset(&w->sql);
    dsp_strbuf_printf(&w->sql, "SELECT task_id FROM %s FORCE INDEX (PRIMARY)", w->db->names.task);
    dsp_strbuf_put_u64(&w->sql, " WHERE task_id = ", o->task_id);
    dsp_strbuf_puts(&w->sql, " FOR UPDATE");
    if (w->sql.oom)
        return -1;
    int probe = dsp_dbi_exec(&w->c, w->sql.p, w->sql.len, NULL);
    if (probe == 0) {
        dsp_strbuf_reset(&w->sql);
        dsp_db_sql_write_result_param(&w->sql, &w->db->names, w->batch[i].epoch, dsp_wall_ms(),
                                      &row);
        if (w->sql.oom)
            return -1;
    }
    if (probe < 0 ||
        dsp_dbi_exec_blob(&w->c, w->sql.p, w->sql.len, o->data, o->len, &affected) < 0) {
        if (w->c.err == ER_LOCK_WAIT_TIMEOUT_) {
            /* Another transaction holds the row: queued again, like the batch's. A row
             * no longer ours by then is fenced by the later try. */
            w->done[i] = 1;
            w->defer[i] = 1;
            rep->deferred++;
            (*left)--;
            return 0;
        }
        if (w->c.err == ER_NET_PACKET_TOO_LARGE_) {
            result_refuse(w, o); /* the server's limit moved: fail it, after a reconnect */
            return -1;
        }
        if (dsp_dbi_error_is_transient(w->c.err))
            return -1;
        log_error(w->db->log, "result of task %" PRIu64 " cannot be written (error %u); its row stays PROCESSING",
                  o->task_id, w->c.err);
        w->done[i] = 1;
        w->lost[i] = 1;
        (*left)--;
        w->dropped++;
        return 0;
    }
    w->done[i] = 1;
    w->final[i] = affected == 1;
    if (affected == 1)
        rep->written[DSP_WRITE_SUCCEEDED]++;
    else
        rep->fenced++;
    (*left)--;
    return 0;
}

/* ---- the inventory's entries (protocol version 3) ---- */

/* Reads the row entry i just adopted into its ack. A row adopted whose read fails is
 * still acknowledged as adopted, without a type: the loop puts it back to NEW. */
static void adopted_row(struct write_ctx *w, size_t i, uint32_t epoch)
{
    dsp_write_ack *a = &w->acks[w->ackidx[i]];
    MYSQL_RES *res;
    MYSQL_ROW row;

    dsp_strbuf_reset(&w->sql);
    dsp_db_sql_adopted_row(&w->sql, &w->db->names, epoch, w->batch[i].o.task_id,
                           w->batch[i].o.dlv_attempt);
    atomic_fetch_add_explicit(&w->db->statements, 1, memory_order_relaxed);
    if (w->sql.oom || mysql_real_query(w->c.m, w->sql.p, (unsigned long)w->sql.len) != 0 ||
        (res = mysql_store_result(w->c.m)) == NULL)
        return;
    if ((row = mysql_fetch_row(res)) != NULL && row[0] && row[1] && row[2]) {
        unsigned long long max = strtoull(row[1], NULL, 10);
        unsigned long long prio = strtoull(row[2], NULL, 10);
        a->type = strdup(row[0]);
        a->max_attempts = max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
        a->priority = (uint8_t)(prio > 2 ? 2 : prio);
    }
    mysql_free_result(res);
}

/* An ADOPT: one fenced UPDATE that a locked row refuses at once (the connection does not
 * wait). Returns 0, or -1 on a connection error (the caller reconnects). */
static int write_adopt(struct write_ctx *w, size_t i)
{
    const struct wentry *e = &w->batch[i];
    dsp_write_ack *a = &w->acks[w->ackidx[i]];
    uint64_t affected = 0, seq;
    bool again = w->tried[i];

    w->tried[i] = 1;
    /* Listed in task_claim under our epoch first (autocommit): a crash between the two
     * statements leaves a list naming a row that is not ours, which recovery skips, and
     * never a row of ours that no list names. */
    char id_csv[24];
    int id_len = snprintf(id_csv, sizeof id_csv, "%" PRIu64, e->o.task_id);
    switch (dsp_dbi_claim_list(w->db, &w->c, &w->sql, e->epoch, id_csv, (size_t)id_len, &seq)) {
    case -2: return -1;
    case -1:
        if (dsp_dbi_error_is_transient(w->c.err))
            return -1;
        a->ok = false; /* cannot be listed: not adopted */
        return 0;
    default: break;
    }
    dsp_strbuf_reset(&w->sql);
    dsp_db_sql_adopt(&w->sql, &w->db->names, e->epoch, dsp_wall_ms(), e->o.task_id, e->o.dlv_epoch,
                     e->o.dlv_attempt, w->db->in);
    if (w->sql.oom)
        return -1;
    if (dsp_dbi_exec(&w->c, w->sql.p, w->sql.len, &affected) < 0) {
        if (w->c.err != ER_LOCK_WAIT_TIMEOUT_ && dsp_dbi_error_is_transient(w->c.err))
            return -1;
        affected = 0; /* locked by another transaction, or refused: not adopted */
    }
    a->ok = affected == 1;
    if (affected == 1) {
        adopted_row(w, i, e->epoch);
    } else if (again) {
        /* The connection broke after the first try, which may have committed: a row of
         * this epoch at that attempt is then ours (the loop refuses it when it holds the
         * task in another form), and must not be left unheld. */
        adopted_row(w, i, e->epoch);
        a->ok = a->type != NULL;
    }
    if (a->ok) {
        /* Out of memory, the list stays until the next leader's recovery deletes it. */
        if (dsp_dbi_claims_open(w->db, e->epoch, seq, 1) == 0)
            a->claim_seq = seq;
    } else {
        pthread_mutex_lock(&w->db->mu);
        dsp_dbi_claims_forget_locked(w->db, e->epoch, seq);
        pthread_mutex_unlock(&w->db->mu);
    }
    return 0;
}

/* A foreign outcome: written only if its row is still PROCESSING under the delivery the
 * worker named; a retry at the delivery's last attempt becomes FAILED. Returns 0, or -1
 * on a connection error. */
static int write_foreign(struct write_ctx *w, size_t i, dsp_write_report *rep, int64_t *retry_min)
{
    dsp_outcome *o = &w->batch[i].o;
    dsp_db_sql_row row = {o->task_id, o->dlv_attempt, o->run_after_ms, o->data, o->len};
    int kind = o->kind;
    int last = kind == DSP_WRITE_RETRY ? 0 : -1;
    uint64_t affected = 0;

    if (kind == DSP_WRITE_SUCCEEDED && o->len > result_cap(&w->c)) {
        result_refuse(w, o);
        kind = o->kind;
        row.data = o->data;
        row.len = o->len;
    }
    for (;;) {
        bool blob = kind == DSP_WRITE_SUCCEEDED && result_is_large(w, o);
        dsp_strbuf_reset(&w->sql);
        if (blob)
            dsp_db_sql_write_result_param(&w->sql, &w->db->names, o->dlv_epoch, dsp_wall_ms(),
                                          &row);
        else
            dsp_db_sql_write(&w->sql, &w->db->names, kind, o->dlv_epoch, dsp_wall_ms(), &row, 1);
        dsp_db_sql_foreign_fence(&w->sql, o->dlv_attempt, last);
        if (w->sql.oom)
            return -1;
        if ((blob ? dsp_dbi_exec_blob(&w->c, w->sql.p, w->sql.len, o->data, o->len, &affected)
                  : dsp_dbi_exec(&w->c, w->sql.p, w->sql.len, &affected)) < 0) {
            if (w->c.err == ER_LOCK_WAIT_TIMEOUT_) {
                w->defer[i] = 1; /* queued again, like any outcome whose row is locked */
                rep->deferred++;
                return 0;
            }
            if (dsp_dbi_error_is_transient(w->c.err) || w->c.err == ER_NET_PACKET_TOO_LARGE_)
                return -1;
            log_error(w->db->log, "foreign outcome of task %" PRIu64 " cannot be written (error %u)",
                      o->task_id, w->c.err);
            w->lost[i] = 1;
            w->dropped++;
            return 0;
        }
        if (affected > 0 || last != 0)
            break;
        kind = DSP_WRITE_FAILED; /* not written as a retry: maybe it was the last attempt */
        last = 1;
    }
    if (affected > 0) {
        rep->foreign_written++;
        rep->written[kind] += affected;
        w->final[i] = kind != DSP_WRITE_RETRY;
        if (kind == DSP_WRITE_RETRY && o->run_after_ms < *retry_min)
            *retry_min = o->run_after_ms;
    } else {
        rep->foreign_ignored++;
    }
    return 0;
}

/* The entries written one statement each (adoptions, foreign outcomes; rare: after a
 * failover) and those with nothing to write. Returns 0, or -1 on a connection error. */
static int write_singles(struct write_ctx *w, dsp_write_report *rep, size_t *left, int64_t *retry_min)
{
    for (size_t i = 0; i < w->n; i++) {
        const dsp_outcome *o = &w->batch[i].o;
        int rc = 0;

        if (w->done[i] || (o->kind != DSP_WRITE_ADOPT && o->kind != DSP_WRITE_NOTE && !o->foreign))
            continue;
        if (o->kind == DSP_WRITE_ADOPT)
            rc = w->acks != NULL ? write_adopt(w, i) : 0;
        else if (o->foreign)
            rc = write_foreign(w, i, rep, retry_min);
        if (rc < 0)
            return -1;
        w->done[i] = 1;
        (*left)--;
    }
    return 0;
}

static int wref_cmp(const void *pa, const void *pb)
{
    const struct wref *a = pa, *b = pb;
    if (a->task_id != b->task_id)
        return a->task_id < b->task_id ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Runs w->sql, a query of task ids, and sets mark[k] for each id found at
 * w->rows[s + k] (rows[s..e) are sorted by task_id). Returns 0 or -1. */
static int mark_ids(struct write_ctx *w, size_t s, size_t e, uint8_t *mark)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    atomic_fetch_add_explicit(&w->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(w->c.m, w->sql.p, (unsigned long)w->sql.len) != 0 ||
        (res = mysql_store_result(w->c.m)) == NULL) {
        w->c.err = mysql_errno(w->c.m);
        log_warn(w->db->log, "write connection: %s (error %u) in: %.160s", mysql_error(w->c.m),
                 w->c.err, w->sql.p);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        uint64_t id = row[0] ? strtoull(row[0], NULL, 10) : 0;
        size_t lo = s, hi = e;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (w->rows[mid].task_id < id)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < e && w->rows[lo].task_id == id)
            mark[lo - s] = 1;
    }
    mysql_free_result(res);
    return 0;
}

/* The statement for rows[s..e) met a row locked by another transaction (the write
 * connection does not wait for locks: one long transaction must not stall every
 * write). Locks what is free with FOR UPDATE SKIP LOCKED and writes those rows in one
 * transaction; rows still ours but locked by someone else are deferred (queued again
 * and written later); the rest are fenced. Returns 0, or -1 on a connection or server
 * error (the caller reconnects and writes the batch again). */
static int write_skip_locked_once(struct write_ctx *w, int kind, size_t s, size_t e,
                                  dsp_write_report *rep, size_t *left)
{
    uint32_t epoch = w->batch[w->idx[s]].epoch;
    size_t n = e - s, k, m = 0;
    uint64_t affected = 0;

    memset(w->ours, 0, n);
    memset(w->busy, 0, n);
    /* The wait is 1 s here, not 0: with 0, MariaDB 10.11 fails the COMMIT of a
     * transaction whose SKIP LOCKED read passed over a locked row (error 1180). */
    if (dsp_dbi_exec_str(&w->c, "SET SESSION innodb_lock_wait_timeout = 1, autocommit = 0") < 0)
        return -1;
    dsp_strbuf_reset(&w->sql);
    dsp_db_sql_lock_free(&w->sql, &w->db->names, epoch, w->rows + s, NULL, n);
    if (w->sql.oom || mark_ids(w, s, e, w->ours) < 0)
        return -1;
    for (k = 0; k < n; k++)
        if (w->ours[k])
            w->sub[m++] = w->rows[s + k];
    if (m > 0) {
        dsp_strbuf_reset(&w->sql);
        dsp_db_sql_write(&w->sql, &w->db->names, kind, epoch, dsp_wall_ms(), w->sub, m);
        if (w->sql.oom || dsp_dbi_exec(&w->c, w->sql.p, w->sql.len, &affected) < 0)
            return -1;
    }
    char back[80];
    snprintf(back, sizeof back, "SET SESSION innodb_lock_wait_timeout = %d, autocommit = 1",
             dsp_dbi_lock_wait_min(&w->c));
    if (dsp_dbi_exec_str(&w->c, "COMMIT") < 0 || dsp_dbi_exec_str(&w->c, back) < 0)
        return -1;
    if (m < n) {
        /* A plain read (no lock, no wait) finds which of the others are still ours. */
        dsp_strbuf_reset(&w->sql);
        dsp_db_sql_still_ours(&w->sql, &w->db->names, epoch, w->rows + s, w->ours, n);
        if (w->sql.oom || mark_ids(w, s, e, w->busy) < 0)
            return -1;
    }
    rep->written[kind] += affected;
    for (k = 0; k < n; k++) {
        size_t i = w->idx[s + k];
        w->done[i] = 1;
        w->final[i] = w->ours[k];
        if (w->busy[k]) {
            w->defer[i] = 1;
            rep->deferred++;
        } else if (!w->ours[k] && kind != DSP_WRITE_DELIVERED) {
            rep->fenced++;
        }
    }
    *left -= n;
    return 0;
}

/* write_skip_locked_once, whose transaction a conflict (Galera's certification, a
 * deadlock) aborted, rolled back and run again on the same connection up to
 * DSP_DBI_CONFLICT_TRIES times. */
static int write_skip_locked(struct write_ctx *w, int kind, size_t s, size_t e,
                             dsp_write_report *rep, size_t *left)
{
    for (unsigned tries = 1;; tries++) {
        w->c.err = 0;
        if (write_skip_locked_once(w, kind, s, e, rep, left) == 0)
            return 0;
        if (!dsp_dbi_error_is_conflict(w->c.err) || tries >= DSP_DBI_CONFLICT_TRIES ||
            dsp_dbi_conflict_retry(&w->c, tries) < 0)
            return -1;
    }
}

/* One pass over the outcomes not written yet: one statement per kind (more when one
 * would pass max_allowed_packet), one per outcome for those marked isolate. Returns 0,
 * or -1 on an error of the connection or the server (reconnect and write again). */
static int write_pass(struct write_ctx *w, dsp_write_report *rep, size_t *left, int64_t *retry_min)
{
    /* Delivery records first: a task's outcome in the same batch then lands after its
     * record and not before it (the record's fence would fail and it would count as
     * fenced). */
    static const int kind_order[DSP_WRITE_KINDS] = {DSP_WRITE_DELIVERED, DSP_WRITE_SUCCEEDED,
                                                    DSP_WRITE_FAILED, DSP_WRITE_RETRY,
                                                    DSP_WRITE_RELEASE};
    dsp_db *db = w->db;
    size_t limit = w->c.stmt_limit, rows_max = SIZE_MAX;

    /* Galera: one statement is one transaction, whose write set carries each row's
     * images (the result twice at most: before and after). */
    if (w->c.ws_max_bytes > 0 && w->c.ws_max_bytes / 2 < limit)
        limit = w->c.ws_max_bytes / 2 > DSP_DB_SQL_WRITE_FIXED + 1024 ? (size_t)(w->c.ws_max_bytes / 2)
                                                                      : DSP_DB_SQL_WRITE_FIXED + 1024;
    if (w->c.ws_max_rows > 0 && w->c.ws_max_rows < SIZE_MAX)
        rows_max = (size_t)w->c.ws_max_rows;

    if (write_singles(w, rep, left, retry_min) < 0)
        return -1;
    for (int ko = 0; ko < DSP_WRITE_KINDS; ko++) {
        int kind = kind_order[ko];
        size_t m = 0, s, e, i;

        for (i = 0; i < w->n; i++) {
            if (w->done[i] || w->batch[i].o.kind != kind)
                continue;
            if (kind == DSP_WRITE_SUCCEEDED && result_is_large(w, &w->batch[i].o)) {
                /* Large results go one by one; one refused becomes FAILED, which comes
                 * later in kind_order. */
                if (write_large(w, i, rep, left) < 0)
                    return -1;
                continue;
            }
            w->refs[m].task_id = w->batch[i].o.task_id;
            w->refs[m++].i = i;
        }
        /* By task_id: the two-level CASE needs it, and every statement then locks its
         * rows in primary-key order. */
        if (m > 1)
            qsort(w->refs, m, sizeof *w->refs, wref_cmp);
        for (i = 0; i < m; i++) {
            const dsp_outcome *o = &w->batch[w->refs[i].i].o;
            w->idx[i] = w->refs[i].i;
            w->rows[i] = (dsp_db_sql_row){o->task_id, o->attempts, o->run_after_ms, o->data, o->len};
        }
        unsigned conflicts = 0; /* tries of the statement at s a conflict aborted */
        for (s = 0; s < m; s = e) {
            size_t cost = DSP_DB_SQL_WRITE_FIXED, cnt;
            uint64_t affected;

            e = s;
            if (w->isolate[w->idx[s]]) {
                cost += dsp_db_sql_write_row_cost(kind, &w->rows[s]);
                e = s + 1;
            } else {
                while (e < m && !w->isolate[w->idx[e]]) {
                    size_t rc = dsp_db_sql_write_row_cost(kind, &w->rows[e]);
                    if (e > s && (cost + rc > limit || e - s >= rows_max))
                        break;
                    cost += rc;
                    e++;
                }
            }
            cnt = e - s;
            if (cnt == 1 && cost > limit && w->rows[s].len > 0 && kind != DSP_WRITE_SUCCEEDED) {
                /* An error text larger than a statement may be (a max_allowed_packet
                 * under 128 KiB): keep what fits, at a character's end. Results never
                 * get here (write_large). */
                dsp_db_sql_row *r = &w->rows[s];
                size_t room = limit > DSP_DB_SQL_WRITE_FIXED + 512
                                  ? (limit - DSP_DB_SQL_WRITE_FIXED - 512) / 2
                                  : 0;
                size_t nl = dsp_utf8_cut(r->data, r->len, room);
                log_warn(db->log, "error text of task %" PRIu64 " cut from %zu to %zu bytes to fit max_allowed_packet",
                         r->task_id, r->len, nl);
                r->len = nl;
                w->batch[w->idx[s]].o.len = nl;
            }
            dsp_strbuf_reset(&w->sql);
            dsp_db_sql_write(&w->sql, &w->db->names, kind, w->batch[w->idx[s]].epoch, dsp_wall_ms(),
                             &w->rows[s], cnt);
            if (w->sql.oom) {
                log_error(db->log, "out of memory building a write of %zu outcome(s)", cnt);
                if (cnt > 1) {
                    for (i = s; i < e; i++)
                        w->isolate[w->idx[i]] = 1;
                    continue;
                }
                return -1; /* try again after a pause */
            }
            if (dsp_dbi_exec(&w->c, w->sql.p, w->sql.len, &affected) == 0) {
                conflicts = 0;
                rep->written[kind] += affected;
                /* A delivery record finds no row when the outcome came first: harmless. */
                if (kind != DSP_WRITE_DELIVERED)
                    rep->fenced += affected < cnt ? cnt - affected : 0;
                for (i = s; i < e; i++) {
                    w->done[w->idx[i]] = 1;
                    w->final[w->idx[i]] = affected == cnt; /* else some were fenced: which, unknown */
                    if (kind == DSP_WRITE_RETRY && w->rows[i].run_after_ms < *retry_min)
                        *retry_min = w->rows[i].run_after_ms;
                }
                *left -= cnt;
                continue;
            }
            if (w->c.err == ER_LOCK_WAIT_TIMEOUT_) {
                if (write_skip_locked(w, kind, s, e, rep, left) < 0)
                    return -1;
                continue;
            }
            if (w->c.err == ER_LOCK_DEADLOCK_ && ++conflicts < DSP_DBI_CONFLICT_TRIES) {
                /* Galera's certification (or a deadlock) rolled the statement back: the
                 * same statement again, on the same connection. */
                if (dsp_dbi_conflict_retry(&w->c, conflicts) < 0)
                    return -1;
                e = s;
                continue;
            }
            if (w->c.err == ER_NET_PACKET_TOO_LARGE_ && cnt == 1) {
                log_error(db->log, "outcome of task %" PRIu64 " is too large to write; its row stays PROCESSING",
                          w->rows[s].task_id);
                w->done[w->idx[s]] = 1;
                w->lost[w->idx[s]] = 1;
                (*left)--;
                w->dropped++;
                return -1; /* the server closed the connection */
            }
            if (w->c.err == ER_NET_PACKET_TOO_LARGE_ || !dsp_dbi_error_is_transient(w->c.err)) {
                if (cnt > 1) {
                    log_warn(db->log, "writing %zu outcome(s) in one statement failed; writing them one by one",
                             cnt);
                    for (i = s; i < e; i++)
                        w->isolate[w->idx[i]] = 1;
                    if (w->c.err == ER_NET_PACKET_TOO_LARGE_)
                        return -1;
                    continue;
                }
                log_error(db->log,
                          "outcome of task %" PRIu64 " cannot be written (error %u); its row stays PROCESSING",
                          w->rows[s].task_id, w->c.err);
                w->done[w->idx[s]] = 1;
                w->lost[w->idx[s]] = 1;
                (*left)--;
                w->dropped++;
                continue;
            }
            return -1;
        }
    }
    return 0;
}

/* Puts one outcome back at the end of the write queue, to be written after a flush
 * interval. Returns 0, or -1 when the queue cannot grow. Under db->mu. */
static int write_requeue_locked(dsp_db *db, const struct wentry *e)
{
    if (db->qhead + db->qlen == db->qcap) {
        if (db->qhead > 0) {
            memmove(db->q, db->q + db->qhead, db->qlen * sizeof *db->q);
            db->qhead = 0;
        } else {
            size_t cap = db->qcap ? db->qcap * 2 : 1024;
            struct wentry *q = realloc(db->q, cap * sizeof *q);
            if (q == NULL)
                return -1;
            db->q = q;
            db->qcap = cap;
        }
    }
    db->q[db->qhead + db->qlen] = *e;
    db->q[db->qhead + db->qlen].queued_ms = dsp_now_ms();
    db->qlen++;
    return 0;
}

static int ack_cmp(const void *pa, const void *pb)
{
    const dsp_write_ack *a = pa, *b = pb;
    if (a->conn_id != b->conn_id)
        return a->conn_id < b->conn_id ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

/* acks_begin gives every entry with a conn_id its ack: one allocation per batch, none
 * when no entry has one (workers of version 1 and 2). */
static void acks_begin(struct write_ctx *w)
{
    size_t i, m = 0;

    w->acks = NULL;
    for (i = 0; i < w->n; i++)
        m += w->batch[i].o.conn_id != 0;
    if (m == 0 || (w->acks = calloc(m, sizeof *w->acks)) == NULL)
        return; /* out of memory: no CONFIRM, the worker sends them again later */
    for (i = 0, m = 0; i < w->n; i++) {
        const dsp_outcome *o = &w->batch[i].o;
        if (o->conn_id == 0)
            continue;
        w->ackidx[i] = m;
        w->acks[m++] = (dsp_write_ack){.conn_id = o->conn_id, .task_id = o->task_id,
                                       .epoch = o->dlv_epoch, .attempt = o->dlv_attempt,
                                       .adopt = o->kind == DSP_WRITE_ADOPT, .order = i};
    }
}

/* acks_end keeps the acks of what was settled (every ADOPT is answered), sorted by
 * connection, and hands them to the report. */
static void acks_end(struct write_ctx *w, dsp_write_report *rep)
{
    size_t m = 0;
    bool sorted = true;

    if (w->acks == NULL)
        return;
    for (size_t i = 0; i < w->n; i++) {
        dsp_write_ack *a;
        bool settled = w->done[i] && !w->defer[i] && !w->lost[i];
        if (w->batch[i].o.conn_id == 0)
            continue;
        a = &w->acks[w->ackidx[i]]; /* at or after m: compacting in place is safe */
        if (!a->adopt && !settled)
            continue;
        if (a->adopt && !settled)
            a->ok = false; /* not done (leadership lost, stopping): the loop cancels it */
        if (m > 0 && w->acks[m - 1].conn_id > a->conn_id)
            sorted = false;
        w->acks[m++] = *a;
    }
    if (m == 0) {
        free(w->acks);
        w->acks = NULL;
        return;
    }
    if (!sorted) /* several connections in one batch */
        qsort(w->acks, m, sizeof *w->acks, ack_cmp);
    rep->acks = w->acks;
    rep->nacks = m;
    w->acks = NULL;
}

/* Writes w->batch, reconnecting and writing again until done or past the stop
 * deadline; reports through on_written. */
/* The dependants of the rows this batch wrote SUCCESSFUL or FAILED (db_deps.c), after
 * the batch is acknowledged: released, or FAILED in turn. Nothing when no task waits. */
static void write_dependants(struct write_ctx *w)
{
    uint64_t *ok, *failed;
    size_t nok = 0, nfailed = 0;

    if (!atomic_load(&w->db->deps_seen) || w->c.m == NULL)
        return;
    ok = malloc(w->n * sizeof *ok);
    failed = malloc(w->n * sizeof *failed);
    if (ok && failed) {
        for (size_t i = 0; i < w->n; i++) {
            const dsp_outcome *o = &w->batch[i].o;
            if (!w->done[i] || w->lost[i] || w->defer[i])
                continue;
            if (o->kind == DSP_WRITE_SUCCEEDED)
                ok[nok++] = o->task_id;
            else if (o->kind == DSP_WRITE_FAILED)
                failed[nfailed++] = o->task_id;
        }
        /* A failure here leaves the work to the sweep (db_deps.c). */
        if ((nok || nfailed) &&
            dsp_dbi_deps_parents_ended(w->db, &w->c, &w->sql, ok, nok, failed, nfailed) < 0)
            log_warn(w->db->log, "write connection: the dependants of %zu task(s) are left to the sweep",
                     nok + nfailed);
    }
    free(ok);
    free(failed);
}

static void write_batch(struct write_ctx *w)
{
    dsp_db *db = w->db;
    dsp_write_report rep;
    size_t left = w->n, i;
    int64_t retry_min = INT64_MAX;
    struct msg *m;
    size_t freed = 0;

    memset(&rep, 0, sizeof rep);
    memset(w->done, 0, w->n);
    memset(w->isolate, 0, w->n);
    memset(w->defer, 0, w->n);
    memset(w->final, 0, w->n);
    memset(w->lost, 0, w->n);
    memset(w->tried, 0, w->n);
    acks_begin(w);
    write_prepare(w, &left);
    while (left > 0) {
        if (dsp_dbi_conn_stale(&w->c))
            dsp_dbi_conn_close(&w->c); /* off to the server in use: each write commits alone */
        if (w->c.m == NULL) {
            if (write_past_deadline(db))
                break;
            if (dsp_dbi_conn_open(&w->c, true, true) < 0) {
                dsp_dbi_set_conn_ok(db, CONN_WRITE, false);
                write_sleep(db, dsp_dbi_backoff_next(&w->c));
                continue;
            }
            atomic_store(&db->result_max, result_cap(&w->c));
            dsp_dbi_set_conn_ok(db, CONN_WRITE, true);
        }
        /* Leadership (db_lease.c): only the leader of the batch's epoch writes, on a
         * connection the lease has recorded; a deposed leader drops its outcomes. */
        int gate = dsp_dbi_lease_gate(db, LEASE_CONN_WRITE, (uint64_t)mysql_thread_id(w->c.m), 0,
                                      w->batch[0].epoch);
        if (gate < 0) {
            rep.fenced += left;
            left = 0;
            break;
        }
        if (gate > 0) {
            if (write_past_deadline(db))
                break;
            write_sleep(db, 5); /* the lease thread records the connection */
            continue;
        }
        if (write_pass(w, &rep, &left, &retry_min) < 0) {
            log_warn(db->log, "write connection: reconnecting; %zu outcome(s) to write again", left);
            dsp_dbi_conn_close(&w->c);
            dsp_dbi_set_conn_ok(db, CONN_WRITE, false);
            if (write_past_deadline(db))
                break;
            write_sleep(db, dsp_dbi_backoff_next(&w->c));
        }
    }
    w->dropped += left;
    acks_end(w, &rep);
    dsp_dbi_submit_notify(db, w->batch, w->final, w->n); /* OUTCOMEs of waited-for tasks */
    atomic_fetch_add_explicit(&db->write_batches, 1, memory_order_relaxed);
    m = dsp_dbi_msg_new(MSG_WRITTEN);
    pthread_mutex_lock(&db->mu);
    /* Deferred outcomes go back to the queue (they keep their data) unless the stop
     * deadline has passed; the rest are done with. */
    for (i = 0; i < w->n; i++) {
        const dsp_outcome *o = &w->batch[i].o;
        /* A final outcome written, or fenced (the row is no longer ours): its row has
         * left PROCESSING under this epoch, as far as its claim's list goes. */
        if (w->done[i] && !w->lost[i] && !w->defer[i] && o->claim_seq && !o->foreign &&
            o->kind != DSP_WRITE_DELIVERED && o->kind < DSP_WRITE_KINDS)
            dsp_dbi_claims_settle_locked(db, w->batch[i].epoch, o->claim_seq);
        if (w->defer[i] && !(db->write_stop && dsp_now_ms() >= db->write_deadline_ms) &&
            write_requeue_locked(db, &w->batch[i]) == 0)
            continue; /* its bytes stay counted */
        if (w->defer[i])
            w->dropped++;
        freed += w->batch[i].bytes;
        free(w->batch[i].o.data);
        w->batch[i].o.data = NULL;
    }
    /* No longer pending by the time the loop hears of it. */
    atomic_fetch_sub_explicit(&db->qbytes, freed, memory_order_relaxed);
    db->writing = 0;
    if (m) {
        m->report = rep;
        dsp_dbi_post_locked(db, m);
    } else {
        dsp_write_acks_free(rep.acks, rep.nacks);
    }
    if (retry_min < db->retry_due_ms) {
        db->retry_due_ms = retry_min;
        pthread_cond_signal(&db->claim_cv);
    }
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
    /* The task_claim rows of the claims now settled; with the batch's connection. */
    dsp_dbi_claims_delete_settled(db, &w->c, &w->sql);
    write_dependants(w);
}

void *dsp_dbi_write_main(void *arg)
{
    dsp_db *db = arg;
    struct write_ctx w;
    size_t cap = db->max_batch, k;
    int64_t flush = db->opts.result_flush_ms > 0 ? db->opts.result_flush_ms : 0;

    memset(&w, 0, sizeof w);
    w.db = db;
    w.c.db = db;
    w.c.who = "write";
    w.c.rng = (uint64_t)dsp_now_us() * 0xBF58476D1CE4E5B9ULL ^ (uint64_t)(uintptr_t)&w;
    if (w.c.rng == 0)
        w.c.rng = 1;
    w.c.no_lock_wait = true;
    w.batch = calloc(cap, sizeof *w.batch);
    w.done = calloc(cap, 1);
    w.isolate = calloc(cap, 1);
    w.defer = calloc(cap, 1);
    w.final = calloc(cap, 1);
    w.lost = calloc(cap, 1);
    w.ackidx = calloc(cap, sizeof *w.ackidx);
    w.tried = calloc(cap, 1);
    w.ours = calloc(cap, 1);
    w.busy = calloc(cap, 1);
    w.sub = calloc(cap, sizeof *w.sub);
    w.rows = calloc(cap, sizeof *w.rows);
    w.idx = calloc(cap, sizeof *w.idx);
    w.refs = calloc(cap, sizeof *w.refs);
    mysql_thread_init();
    if (!w.batch || !w.done || !w.isolate || !w.defer || !w.final || !w.lost || !w.ackidx || !w.tried || !w.ours || !w.busy || !w.sub ||
        !w.rows || !w.idx || !w.refs) {
        log_error(db->log, "write thread: out of memory; outcomes will not be written");
        cap = 0;
    }

    pthread_mutex_lock(&db->mu);
    for (;;) {
        if (db->qlen == 0 || cap == 0) {
            if (db->write_stop)
                break;
            if (w.c.m == NULL && dsp_now_ms() >= w.next_connect && cap) {
                /* Connect while idle, so that on_health tells the truth early. */
                pthread_mutex_unlock(&db->mu);
                if (dsp_dbi_conn_open(&w.c, true, true) == 0) {
                    atomic_store(&db->result_max, result_cap(&w.c));
                    dsp_dbi_set_conn_ok(db, CONN_WRITE, true);
                } else {
                    dsp_dbi_set_conn_ok(db, CONN_WRITE, false);
                    w.next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&w.c);
                }
                pthread_mutex_lock(&db->mu);
                continue;
            }
            if (w.c.m == NULL && cap)
                cond_wait_until(&db->write_cv, &db->mu, w.next_connect);
            else
                pthread_cond_wait(&db->write_cv, &db->mu);
            continue;
        }
        if (db->qlen < db->max_batch && !db->write_stop && flush > 0) {
            int64_t until = db->q[db->qhead].queued_ms + flush;
            if (dsp_now_ms() < until) {
                cond_wait_until(&db->write_cv, &db->mu, until);
                continue;
            }
        }
        /* One epoch per batch: the fence is per statement. */
        for (k = 0; k < cap && k < db->qlen && db->q[db->qhead + k].epoch == db->q[db->qhead].epoch; k++)
            ;
        memcpy(w.batch, db->q + db->qhead, k * sizeof *w.batch);
        db->qhead += k;
        db->qlen -= k;
        if (db->qlen == 0)
            db->qhead = 0;
        db->writing = k;
        pthread_mutex_unlock(&db->mu);
        w.n = k;
        write_batch(&w); /* sets writing back to 0 */
        pthread_mutex_lock(&db->mu);
    }
    /* Whatever is still queued could not be written (no memory for batches). */
    for (k = 0; k < db->qlen; k++) {
        free(db->q[db->qhead + k].o.data);
        atomic_fetch_sub_explicit(&db->qbytes, db->q[db->qhead + k].bytes, memory_order_relaxed);
    }
    w.dropped += db->qlen;
    db->qlen = db->qhead = 0;
    db->write_exited = true;
    pthread_mutex_unlock(&db->mu);

    if (w.dropped)
        log_error(db->log,
                  "%" PRIu64 " outcome(s) not written; their rows stay PROCESSING until the next"
                  " dispatcher recovers them",
                  w.dropped);
    dsp_dbi_conn_close(&w.c);
    dsp_dbi_set_conn_ok(db, CONN_WRITE, false);
    dsp_strbuf_free(&w.sql);
    free(w.batch);
    free(w.done);
    free(w.isolate);
    free(w.defer);
    free(w.final);
    free(w.lost);
    free(w.ackidx);
    free(w.tried);
    free(w.ours);
    free(w.busy);
    free(w.sub);
    free(w.rows);
    free(w.idx);
    free(w.refs);
    mysql_thread_end();
    return NULL;
}
