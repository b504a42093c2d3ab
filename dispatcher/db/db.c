/* db: see db.h. This file owns the API of db.h (start, stop, the requests the loop
 * queues), the queue of messages to the loop and the event (wake_ev) that delivers them
 * on the loop thread. The threads live in the files db.h lists; db_internal.h holds what
 * they share, db_conn.c their connections.
 *
 * The three busiest threads, and the loop:
 *
 *  claim thread (autocommit off): connect, check the schema version, take the
 *      table's leadership lock (GET_LOCK), take an epoch, recover rows older
 *      epochs left PROCESSING, announce on_leader, then serve claim requests one
 *      transaction each (SELECT ... FOR UPDATE SKIP LOCKED, one UPDATE ... IN, COMMIT:
 *      3 statements per claim, 2 when nothing was ready), and between claims run the
 *      lane sweeps, rarely: promote only when the earliest delayed row is due, demote at
 *      most once a second.
 *  write thread (autocommit on): takes up to max_write_batch queued outcomes and
 *      writes them with one UPDATE per kind present (one statement for the common
 *      batch), each fenced by "task_state = 1 AND epoch = E".
 *  stats thread (autocommit on, READ COMMITTED): every table_stats_ms reads the table's
 *      figures (dsp_table_stats: 2 statements, 3 when the ready lane has rows; each an
 *      index range of claim_idx, see db_sql.h) and publishes them under mu; after each
 *      refresh, retention deletes old SUCCESSFUL/FAILED rows in bounded batches; and it
 *      serves the operator's requeue of FAILED rows. It never takes part in leadership,
 *      and its connection does not count for on_health (a slow count is no outage).
 *  loop thread: calls dsp_db_claim/dsp_db_write, and runs the callbacks from one
 *      event (wake_ev) that the threads activate after queueing a message.
 *
 * Shared state is under db->mu; counters are atomics. Nothing here blocks the loop
 * thread on MySQL.
 */
#include "db_internal.h"
#include "shard.h"

#include <event2/event.h>
#include <mysql.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOCK_TRY_S 1          /* GET_LOCK's wait per try */
#define LOCK_NAME_MAX DSP_DB_LOCK_NAME_MAX


/* ---- messages to the loop ---- */

void dsp_dbi_wake_loop(dsp_db *db)
{
    event_active(db->wake_ev, EV_TIMEOUT, 0);
}

/* Appends m to the loop's queue; mu held. The caller wakes the loop after unlocking. */
void dsp_dbi_post_locked(dsp_db *db, struct msg *m)
{
    m->next = NULL;
    *db->mtail = m;
    db->mtail = &m->next;
}

void dsp_dbi_post(dsp_db *db, struct msg *m)
{
    pthread_mutex_lock(&db->mu);
    dsp_dbi_post_locked(db, m);
    pthread_mutex_unlock(&db->mu);
    dsp_dbi_wake_loop(db);
}

struct msg *dsp_dbi_msg_new(enum msg_kind kind)
{
    struct msg *m = calloc(1, sizeof *m);
    if (m)
        m->kind = kind;
    return m;
}

void dsp_write_acks_free(dsp_write_ack *acks, size_t n)
{
    for (size_t i = 0; acks && i < n; i++)
        free(acks[i].type);
    free(acks);
}

static void msg_free(struct msg *m)
{
    dsp_write_acks_free(m->report.acks, m->report.nacks);
    if (m->reply)
        dsp_claim_reply_free(m->reply);
    dsp_taskop_free(m->op);
    dsp_dbi_submit_msg_free(m);
    for (size_t i = 0; i < m->nsettings; i++)
        free(m->settings[i].type);
    free(m->settings);
    free(m->text);
    free(m);
}

static void deliver(dsp_db *db, struct msg *m)
{
    const dsp_db_callbacks *cb = &db->opts.cb;
    void *arg = db->opts.cb_arg;

    switch (m->kind) {
    case MSG_LEADER:
        atomic_store(&db->loop_epoch, m->epoch);
        if (cb->on_leader)
            cb->on_leader(arg, m->epoch);
        break;
    case MSG_LEADER_LOST:
        if (cb->on_leader_lost)
            cb->on_leader_lost(arg);
        break;
    case MSG_CLAIM:
        if (cb->on_claim) {
            dsp_claim_reply *r = m->reply;
            m->reply = NULL; /* the callee owns it */
            cb->on_claim(arg, r);
        }
        break;
    case MSG_WRITTEN:
        if (cb->on_written)
            cb->on_written(arg, &m->report);
        break;
    case MSG_HEALTH:
        if (cb->on_health)
            cb->on_health(arg, m->connected);
        break;
    case MSG_FATAL:
        if (cb->on_fatal)
            cb->on_fatal(arg, m->text ? m->text : "fatal database error");
        break;
    case MSG_REQUEUED:
        if (cb->on_requeued)
            cb->on_requeued(arg, m->request_id, m->rows);
        break;
    case MSG_TASKOP:
        if (cb->on_taskop) {
            dsp_taskop *op = m->op;
            m->op = NULL; /* the callee owns it */
            cb->on_taskop(arg, op);
        }
        break;
    case MSG_SUBMITTED:
    case MSG_OUTCOME:
        dsp_dbi_submit_deliver(db, m);
        break;
    case MSG_WAKE:
        dsp_dbi_binlog_delivered(db, m->rows);
        if (cb->on_wake)
            cb->on_wake(arg, m->rows);
        break;
    case MSG_SETTINGS:
        if (cb->on_settings)
            cb->on_settings(arg, m->request_id, m->rows >= 0, m->settings, m->nsettings);
        break;
    }
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    dsp_db *db = arg;
    struct msg *m, *next;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&db->mu);
    m = db->mhead;
    db->mhead = NULL;
    db->mtail = &db->mhead;
    pthread_mutex_unlock(&db->mu);
    for (; m; m = next) {
        next = m->next;
        deliver(db, m);
        msg_free(m);
    }
}

/* Reachability: healthy while both connections are up. */
void dsp_dbi_set_conn_ok(dsp_db *db, int which, bool ok)
{
    struct msg *m = NULL;
    bool h;

    pthread_mutex_lock(&db->mu);
    db->conn_ok[which] = ok;
    h = db->conn_ok[CONN_CLAIM] && db->conn_ok[CONN_WRITE];
    if (h != db->healthy && (m = dsp_dbi_msg_new(MSG_HEALTH)) != NULL) {
        db->healthy = h;
        m->connected = h;
        dsp_dbi_post_locked(db, m);
    }
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
}

void dsp_dbi_set_problem(dsp_db *db, const char *text)
{
    pthread_mutex_lock(&db->mu);
    snprintf(db->problem, sizeof db->problem, "%s", text ? text : "");
    pthread_mutex_unlock(&db->mu);
}

bool dsp_db_problem(dsp_db *db, char *out, size_t cap)
{
    if (cap == 0)
        return false;
    out[0] = '\0';
    if (db == NULL)
        return false;
    pthread_mutex_lock(&db->mu);
    snprintf(out, cap, "%s", db->problem);
    pthread_mutex_unlock(&db->mu);
    return out[0] != '\0';
}

/* ---- claim replies ---- */

void dsp_claim_reply_free(dsp_claim_reply *reply)
{
    size_t i;

    if (reply == NULL)
        return;
    for (i = 0; i < reply->ntasks; i++)
        free(reply->tasks[i].payload);
    free(reply->tasks);
    for (i = 0; i < reply->ntypes; i++)
        free(reply->types[i]);
    free(reply->types);
    free(reply);
}

void dsp_dbi_claim_req_free(struct claim_req *r)
{
    size_t i;

    if (r == NULL)
        return;
    for (i = 0; r->types && i < r->ntypes; i++)
        free(r->types[i]);
    free(r->types);
    free(r->limits);
    free(r);
}

/* ---- the API ---- */

size_t dsp_db_lock_name(const char *dbname, const char *table, const char *shard, char *out,
                        size_t cap)
{
    char head[sizeof "taskpush/." + DSP_TABLE_NAME_MAX];
    size_t hl, sl = shard ? strlen(shard) + 1 : 0, dl;

    /* task's lock is named as it always was; another table's carries its name before the
     * database's, after a '/' no database-only name has there, so no two collide. */
    if (table == NULL || strcmp(table, DSP_TABLE_NAME_DEFAULT) == 0)
        snprintf(head, sizeof head, "taskpush.");
    else
        snprintf(head, sizeof head, "taskpush/%.*s.", DSP_TABLE_NAME_MAX, table);
    hl = strlen(head);
    if (hl + sl >= LOCK_NAME_MAX || cap <= LOCK_NAME_MAX)
        return 0; /* no byte of the database's name would be left */
    /* The table's and the shard's names are kept whole: the database's name is cut. */
    dl = dsp_utf8_cut((const uint8_t *)dbname,
                      dsp_utf8_valid_prefix((const uint8_t *)dbname, strlen(dbname)),
                      LOCK_NAME_MAX - hl - sl);
    memcpy(out, head, hl);
    memcpy(out + hl, dbname, dl);
    if (shard)
        snprintf(out + hl + dl, cap - hl - dl, ".%s", shard);
    out[hl + dl + sl] = '\0';
    return hl + dl + sl;
}

/* The shard's filter, meta rows and lock name (see db_internal.h). Returns the lock
 * name's length, 0 when it cannot be made. */
static size_t shard_setup(dsp_db *db, const dsp_db_options *opts, char *name, size_t cap)
{
    const dsp_shard *sh = opts->shard;

    if (sh == NULL || sh->ntypes == 0) {
        snprintf(db->lease_row, sizeof db->lease_row, "lease");
        snprintf(db->epoch_row, sizeof db->epoch_row, "epoch");
        return dsp_db_lock_name(opts->url->dbname, db->names.task, NULL, name, cap);
    }
    dsp_db_sql_type_in(&db->type_in, (const char *const *)sh->types, sh->ntypes);
    db->in = db->type_in.p;
    snprintf(db->shard, sizeof db->shard, "%s", sh->name);
    snprintf(db->lease_row, sizeof db->lease_row, "lease:%s", sh->name);
    snprintf(db->epoch_row, sizeof db->epoch_row, "epoch:%s", sh->name);
    return dsp_db_lock_name(opts->url->dbname, db->names.task, sh->name, name, cap);
}

dsp_db *dsp_db_new(const dsp_db_options *opts)
{
    dsp_db *db;
    pthread_condattr_t ca;
    char name[LOCK_NAME_MAX + 1];
    size_t nl;
    int mu_ok = 0, conns_ok = 0, cv1 = 0, cv2 = 0, cv3 = 0, cv4 = 0;

    if (opts == NULL || opts->url == NULL || opts->log == NULL || opts->base == NULL ||
        opts->url->dbname == NULL)
        return NULL;
    if ((db = calloc(1, sizeof *db)) == NULL)
        return NULL;
    if (dsp_table_names_init(&db->names, opts->table ? opts->table : DSP_TABLE_NAME_DEFAULT) < 0) {
        free(db);
        return NULL;
    }
    db->opts = *opts;
    db->log = opts->log;
    db->max_batch = opts->max_write_batch ? opts->max_write_batch : 1;
    db->mtail = &db->mhead;
    db->rq_tail = &db->rq_head;
    db->top_tail = &db->top_head;
    db->retry_due_ms = INT64_MAX;
    db->tstats = calloc(1, sizeof *db->tstats);
    if (db->tstats)
        db->tstats->oldest_ready_age_ms = -1;
    atomic_init(&db->loop_epoch, 0);
    atomic_init(&db->qbytes, 0);
    atomic_init(&db->result_max, 0);
    atomic_init(&db->deps_seen, true); /* until a sweep finds no waiting task */
    if (dsp_dbi_deps_init(db) < 0)
        log_warn(db->log, "out of memory: dependency probes start at each task's first parent");
    atomic_init(&db->statements, 0);
    atomic_init(&db->claims, 0);
    atomic_init(&db->claimed_rows, 0);
    atomic_init(&db->claim_us_total, 0);
    atomic_init(&db->claim_skipped, 0);
    atomic_init(&db->write_batches, 0);
    atomic_init(&db->reconnects, 0);
    atomic_init(&db->retention_deleted, 0);
    atomic_init(&db->orphans_recovered, 0);
    atomic_init(&db->submitted_rows, 0);
    atomic_init(&db->submit_duplicates, 0);
    atomic_init(&db->submit_batches, 0);
    atomic_init(&db->submit_autocommit_batches, 0);
    atomic_init(&db->submit_us_total, 0);
    atomic_init(&db->submit_gather_us_total, 0);
    atomic_init(&db->submit_requests, 0);
    atomic_init(&db->leader, false);
    atomic_init(&db->epoch, 0);
    atomic_init(&db->sql_dialect_seen, DSP_SQL_DIALECT_AUTO);
    atomic_init(&db->node, 0);

    mu_ok = pthread_mutex_init(&db->mu, NULL) == 0;
    conns_ok = pthread_mutex_init(&db->conns_mu, NULL) == 0;
    if (pthread_condattr_init(&ca) == 0) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        cv1 = pthread_cond_init(&db->claim_cv, &ca) == 0;
        cv2 = pthread_cond_init(&db->write_cv, &ca) == 0;
        cv3 = pthread_cond_init(&db->stats_cv, &ca) == 0;
        cv4 = pthread_cond_init(&db->sched_cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }

    /* The leadership lock: 'taskpush.<dbname>' (another table's: 'taskpush/TABLE.<dbname>'),
     * at most 64 bytes; a shard's ends in '.NAME', kept whole (the database's name is cut
     * first). */
    nl = shard_setup(db, opts, name, sizeof name);
    dsp_strbuf_puts(&db->get_lock_sql, "SELECT GET_LOCK(");
    dsp_strbuf_put_hex(&db->get_lock_sql, (const uint8_t *)name, nl, true);
    dsp_strbuf_printf(&db->get_lock_sql, ", %d)", LOCK_TRY_S);
    dsp_strbuf_puts(&db->release_lock_sql, "SELECT RELEASE_LOCK(");
    dsp_strbuf_put_hex(&db->release_lock_sql, (const uint8_t *)name, nl, true);
    dsp_strbuf_puts(&db->release_lock_sql, ")");
    dsp_strbuf_puts(&db->used_lock_sql, "SELECT IS_USED_LOCK(");
    dsp_strbuf_put_hex(&db->used_lock_sql, (const uint8_t *)name, nl, true);
    dsp_strbuf_puts(&db->used_lock_sql, ")");

    db->wake_ev = event_new(opts->base, -1, 0, wake_cb, db);
    int lease_ok = dsp_dbi_lease_init(db) == 0;
    if (!mu_ok || !conns_ok || !cv1 || !cv2 || !cv3 || !cv4 || db->wake_ev == NULL || db->get_lock_sql.oom ||
        db->type_in.oom ||
        db->release_lock_sql.oom || db->used_lock_sql.oom || nl == 0 || db->tstats == NULL || !lease_ok) {
        if (lease_ok)
            dsp_dbi_lease_destroy(db);
        if (db->wake_ev)
            event_free(db->wake_ev);
        dsp_strbuf_free(&db->get_lock_sql);
        dsp_strbuf_free(&db->release_lock_sql);
        dsp_strbuf_free(&db->used_lock_sql);
        dsp_strbuf_free(&db->type_in);
        if (cv1)
            pthread_cond_destroy(&db->claim_cv);
        if (cv2)
            pthread_cond_destroy(&db->write_cv);
        if (cv3)
            pthread_cond_destroy(&db->stats_cv);
        if (cv4)
            pthread_cond_destroy(&db->sched_cv);
        free(db->tstats);
        if (mu_ok)
            pthread_mutex_destroy(&db->mu);
        if (conns_ok)
            pthread_mutex_destroy(&db->conns_mu);
        free(db);
        return NULL;
    }
    return db;
}

int dsp_db_start(dsp_db *db)
{
    if (db->started)
        return -1;
    if (pthread_create(&db->write_thr, NULL, dsp_dbi_write_main, db) != 0) {
        log_error(db->log, "cannot start the write thread: %s", strerror(errno));
        return -1;
    }
    db->write_thread_ok = true;
    db->started = true;
    if (pthread_create(&db->claim_thr, NULL, dsp_dbi_claim_main, db) != 0) {
        log_error(db->log, "cannot start the claim thread");
        dsp_db_stop(db, 0);
        return -1;
    }
    db->claim_thread_ok = true;
    if (pthread_create(&db->lease.thr, NULL, dsp_dbi_lease_main, db) != 0) {
        log_error(db->log, "cannot start the lease thread");
        dsp_db_stop(db, 0);
        return -1;
    }
    db->lease.thread_ok = true;
    if (pthread_create(&db->stats_thr, NULL, dsp_dbi_stats_main, db) != 0) {
        log_error(db->log, "cannot start the stats thread");
        dsp_db_stop(db, 0);
        return -1;
    }
    db->stats_thread_ok = true;
    if (dsp_dbi_submit_start(db) < 0) {
        log_error(db->log, "cannot start the submit thread");
        dsp_db_stop(db, 0);
        return -1;
    }
    if (pthread_create(&db->sched_thr, NULL, dsp_dbi_sched_main, db) != 0) {
        log_error(db->log, "cannot start the schedule thread");
        dsp_db_stop(db, 0);
        return -1;
    }
    db->sched_thread_ok = true;
    /* Without the follower taskpushd still works: it polls (and /stats says why). */
    if (dsp_dbi_binlog_start(db) < 0)
        log_warn(db->log, "cannot start the binary log follower; polling only");
    return 0;
}

int dsp_db_claim(dsp_db *db, const dsp_claim_request *req)
{
    struct claim_req *r;
    size_t i;
    bool ok;

    if (req == NULL || req->ntypes > UINT16_MAX || (req->ntypes && (!req->types || !req->limits)))
        return -1;
    pthread_mutex_lock(&db->mu);
    ok = db->accepting && !db->claim_busy && !db->stop_claims;
    pthread_mutex_unlock(&db->mu);
    if (!ok)
        return -1;

    /* Copy outside the lock; check again before posting. */
    if ((r = calloc(1, sizeof *r)) == NULL)
        return -1;
    r->ntypes = req->ntypes;
    r->total = req->total;
    r->max_bytes = req->max_bytes;
    r->types = calloc(req->ntypes ? req->ntypes : 1, sizeof *r->types);
    r->limits = calloc(req->ntypes ? req->ntypes : 1, sizeof *r->limits);
    if (!r->types || !r->limits)
        goto fail;
    for (i = 0; i < req->ntypes; i++) {
        if (req->types[i] == NULL || (r->types[i] = strdup(req->types[i])) == NULL)
            goto fail;
        r->limits[i] = req->limits[i];
    }
    pthread_mutex_lock(&db->mu);
    ok = db->accepting && !db->claim_busy && !db->stop_claims;
    if (ok) {
        db->req = r;
        db->claim_busy = true;
        pthread_cond_signal(&db->claim_cv);
    }
    pthread_mutex_unlock(&db->mu);
    if (ok)
        return 0;
fail:
    dsp_dbi_claim_req_free(r);
    return -1;
}

void dsp_db_write(dsp_db *db, dsp_outcome *outcomes, size_t n)
{
    if (db == NULL) { /* an offline server: nowhere to write, but the buffers are ours */
        for (size_t k = 0; k < n; k++)
            free(outcomes[k].data);
        return;
    }
    uint32_t epoch = atomic_load(&db->loop_epoch);
    int64_t now = dsp_now_ms();
    size_t i, was;
    const char *why = NULL;

    if (n == 0)
        return;
    pthread_mutex_lock(&db->mu);
    if (db->write_exited) {
        why = "the database side has stopped";
    } else {
        if (db->qhead + db->qlen + n > db->qcap && db->qhead > 0) {
            memmove(db->q, db->q + db->qhead, db->qlen * sizeof *db->q);
            db->qhead = 0;
        }
        if (db->qlen + n > db->qcap) {
            size_t cap = db->qcap ? db->qcap * 2 : 1024;
            struct wentry *q;
            while (cap < db->qlen + n)
                cap *= 2;
            if ((q = realloc(db->q, cap * sizeof *q)) == NULL) {
                why = "out of memory";
            } else {
                db->q = q;
                db->qcap = cap;
            }
        }
    }
    if (why == NULL) {
        struct wentry *dst = db->q + db->qhead + db->qlen;
        size_t bytes = 0;
        for (i = 0; i < n; i++) {
            dst[i].o = outcomes[i];
            dst[i].epoch = epoch;
            dst[i].queued_ms = now;
            dst[i].bytes = outcomes[i].data ? outcomes[i].len : 0;
            bytes += dst[i].bytes;
        }
        atomic_fetch_add_explicit(&db->qbytes, bytes, memory_order_relaxed);
        was = db->qlen;
        db->qlen += n;
        if (was == 0 || (was < db->max_batch && db->qlen >= db->max_batch))
            pthread_cond_signal(&db->write_cv);
    }
    pthread_mutex_unlock(&db->mu);
    if (why) {
        /* The rows stay PROCESSING under this epoch; the next dispatcher recovers them. */
        log_error(db->log, "%zu outcome(s) not queued for writing: %s", n, why);
        for (i = 0; i < n; i++)
            free(outcomes[i].data);
    }
}

size_t dsp_db_pending_writes(dsp_db *db)
{
    size_t n;
    if (db == NULL)
        return 0;
    pthread_mutex_lock(&db->mu);
    n = db->qlen + db->writing;
    pthread_mutex_unlock(&db->mu);
    return n;
}

size_t dsp_db_pending_write_bytes(dsp_db *db)
{
    return db ? atomic_load_explicit(&db->qbytes, memory_order_relaxed) : 0;
}

size_t dsp_db_result_max(dsp_db *db)
{
    size_t n = db ? atomic_load(&db->result_max) : 0;
    return n ? n : DSP_DB_RESULT_MAX;
}

void dsp_db_stop(dsp_db *db, int64_t deadline_ms)
{
    if (!db->started || db->stopped)
        return;
    dsp_dbi_binlog_stop(db); /* no more doorbells */
    pthread_mutex_lock(&db->mu);
    db->stop_claims = true;
    db->accepting = false;
    db->write_stop = true;
    db->stats_stop = true;
    db->sched_stop = true;
    pthread_cond_broadcast(&db->sched_cv);
    db->write_deadline_ms = dsp_now_ms() + (deadline_ms > 0 ? deadline_ms : 0);
    pthread_cond_broadcast(&db->claim_cv);
    pthread_cond_broadcast(&db->write_cv);
    pthread_cond_broadcast(&db->stats_cv);
    pthread_mutex_unlock(&db->mu);
    /* No insert after this; what is queued is answered UNAVAILABLE. */
    dsp_dbi_submit_stop(db);

    /* Everything queued is written (or the deadline passed) before the lock goes. */
    if (db->write_thread_ok)
        pthread_join(db->write_thr, NULL);
    db->write_thread_ok = false;
    pthread_mutex_lock(&db->mu);
    db->write_exited = true;
    db->claim_exit = true;
    pthread_cond_broadcast(&db->claim_cv);
    pthread_mutex_unlock(&db->mu);
    if (db->claim_thread_ok)
        pthread_join(db->claim_thr, NULL);
    db->claim_thread_ok = false;
    /* The lease goes last: the writes and the lock's release happened under it. */
    pthread_mutex_lock(&db->mu);
    db->lease.stop = true;
    pthread_cond_broadcast(&db->lease.cv);
    pthread_mutex_unlock(&db->mu);
    if (db->lease.thread_ok)
        pthread_join(db->lease.thr, NULL);
    db->lease.thread_ok = false;
    /* It ends after its current statement; requests still queued are answered -1. */
    if (db->stats_thread_ok)
        pthread_join(db->stats_thr, NULL);
    db->stats_thread_ok = false;
    if (db->sched_thread_ok)
        pthread_join(db->sched_thr, NULL);
    db->sched_thread_ok = false;
    pthread_mutex_lock(&db->mu);
    db->stats_exited = true;
    pthread_mutex_unlock(&db->mu);
    db->stopped = true;
}

void dsp_db_free(dsp_db *db)
{
    struct msg *m, *next;
    size_t i;

    if (db == NULL)
        return;
    dsp_db_stop(db, 0);
    for (i = 0; i < db->qlen; i++)
        free(db->q[db->qhead + i].o.data);
    free(db->q);
    dsp_dbi_claim_req_free(db->req);
    while (db->rq_head) {
        struct requeue_req *r = db->rq_head;
        db->rq_head = r->next;
        dsp_dbi_requeue_req_free(r);
    }
    while (db->top_head) {
        struct taskop_req *r = db->top_head;
        db->top_head = r->next;
        dsp_taskop_free(r->op);
        free(r);
    }
    free(db->tstats);
    dsp_dbi_submit_free(db);
    dsp_dbi_deps_free(db);
    dsp_dbi_binlog_free(db);
    free(db->schedules);
    for (m = db->mhead; m; m = next) {
        next = m->next;
        msg_free(m);
    }
    event_free(db->wake_ev);
    dsp_strbuf_free(&db->get_lock_sql);
    dsp_strbuf_free(&db->release_lock_sql);
    dsp_strbuf_free(&db->used_lock_sql);
    dsp_strbuf_free(&db->type_in);
    pthread_cond_destroy(&db->claim_cv);
    pthread_cond_destroy(&db->write_cv);
    pthread_cond_destroy(&db->stats_cv);
    pthread_cond_destroy(&db->sched_cv);
    dsp_dbi_claims_free(db);
    dsp_dbi_lease_destroy(db);
    pthread_mutex_destroy(&db->mu);
    pthread_mutex_destroy(&db->conns_mu);
    free(db);
}

const char *dsp_sql_dialect_name(int dialect)
{
    return dialect == DSP_SQL_DIALECT_MYSQL     ? "mysql"
           : dialect == DSP_SQL_DIALECT_MARIADB ? "mariadb"
                                                : "auto";
}

void dsp_db_counters_get(dsp_db *db, dsp_db_counters *out)
{
    memset(out, 0, sizeof *out);
    out->sql_dialect = dsp_sql_dialect_name(DSP_SQL_DIALECT_AUTO);
    if (db == NULL)
        return;
#define X(field, key, metric, divisor, help) \
    out->field = atomic_load_explicit(&db->field, memory_order_relaxed);
    DSP_DB_COUNTERS(X)
#undef X
    out->leader = atomic_load(&db->leader);
    out->epoch = atomic_load(&db->epoch);
    out->sql_dialect = dsp_sql_dialect_name(atomic_load(&db->sql_dialect_seen));
    if (db->opts.url && db->opts.url->nnodes > 0) {
        const dsp_db_node *n = &db->opts.url->nodes[atomic_load(&db->node) % db->opts.url->nnodes];
        out->node_host = n->host;
        out->node_port = n->port;
    }
    pthread_mutex_lock(&db->mu);
    out->connected = db->healthy;
    out->galera = db->lease.galera;
    out->lease_ms = db->lease.length_ms;
    out->lease_renew_ms = db->lease.renew_ms;
    pthread_mutex_unlock(&db->mu);
}

void dsp_db_table_stats_get(dsp_db *db, dsp_table_stats *out)
{
    if (db == NULL) {
        memset(out, 0, sizeof *out);
        out->oldest_ready_age_ms = -1;
        return;
    }
    pthread_mutex_lock(&db->mu);
    memcpy(out, db->tstats, sizeof *out);
    pthread_mutex_unlock(&db->mu);
    out->retention_deleted_total = atomic_load_explicit(&db->retention_deleted, memory_order_relaxed);
    out->orphans_recovered_total = atomic_load_explicit(&db->orphans_recovered, memory_order_relaxed);
}

/* Queues r for the stats thread; false when it has stopped (r is then the caller's). */
static bool stats_queue(dsp_db *db, struct requeue_req *r)
{
    bool now;
    pthread_mutex_lock(&db->mu);
    now = db->stats_exited || db->stats_stop;
    if (!now) {
        *db->rq_tail = r;
        db->rq_tail = &r->next;
        pthread_cond_signal(&db->stats_cv);
    }
    pthread_mutex_unlock(&db->mu);
    return !now;
}

int dsp_db_setting_save(dsp_db *db, const dsp_setting *s, enum dsp_setting_what what)
{
    if (db == NULL || s == NULL)
        return -1;
    struct requeue_req *r = calloc(1, sizeof *r);
    if (r == NULL || (r->type = strdup(s->type ? s->type : "")) == NULL) {
        free(r);
        return -1;
    }
    r->kind = REQ_SETTING_SAVE;
    r->what = what;
    r->setting = *s;
    r->setting.type = NULL; /* r->type is the copy */
    if (!stats_queue(db, r)) {
        dsp_dbi_requeue_req_free(r);
        return -1;
    }
    return 0;
}

int dsp_db_progress_save(dsp_db *db, dsp_progress_row *rows, size_t nrows, uint64_t *gone, size_t ngone)
{
    struct requeue_req *r = NULL;
    if (db == NULL || nrows > DSP_DB_PROGRESS_BATCH || ngone > DSP_DB_PROGRESS_BATCH ||
        atomic_load(&db->progress_pending) >= DSP_DB_PROGRESS_PENDING_MAX || (r = calloc(1, sizeof *r)) == NULL) {
        free(rows);
        free(gone);
        return -1;
    }
    r->kind = REQ_PROGRESS;
    r->prows = rows;
    r->nprows = nrows;
    r->pgone = gone;
    r->npgone = ngone;
    atomic_fetch_add(&db->progress_pending, 1);
    if (!stats_queue(db, r)) {
        atomic_fetch_sub(&db->progress_pending, 1);
        dsp_dbi_requeue_req_free(r);
        return -1;
    }
    return 0;
}

int dsp_db_settings_load(dsp_db *db, uint64_t request_id)
{
    if (db == NULL)
        return -1;
    struct requeue_req *r = calloc(1, sizeof *r);
    if (r == NULL)
        return -1;
    r->kind = REQ_SETTINGS_LOAD;
    r->request_id = request_id;
    if (!stats_queue(db, r)) {
        struct msg *m = dsp_dbi_msg_new(MSG_SETTINGS);
        dsp_dbi_requeue_req_free(r);
        if (m == NULL)
            return -1;
        m->request_id = request_id;
        m->rows = -1;
        dsp_dbi_post(db, m);
    }
    return 0;
}

int dsp_db_requeue_failed(dsp_db *db, const char *type, uint64_t request_id)
{
    if (db == NULL)
        return -1;
    struct requeue_req *r = calloc(1, sizeof *r);
    bool now;

    if (r == NULL)
        return -1;
    if (type && (r->type = strdup(type)) == NULL) {
        free(r);
        return -1;
    }
    r->request_id = request_id;
    pthread_mutex_lock(&db->mu);
    /* Before dsp_db_start it waits for the thread; after dsp_db_stop nobody serves it. */
    now = db->stats_exited || db->stats_stop;
    if (!now) {
        *db->rq_tail = r;
        db->rq_tail = &r->next;
        pthread_cond_signal(&db->stats_cv);
    }
    pthread_mutex_unlock(&db->mu);
    if (now) {
        struct msg *m = dsp_dbi_msg_new(MSG_REQUEUED);
        dsp_dbi_requeue_req_free(r);
        if (m == NULL)
            return -1;
        m->request_id = request_id;
        m->rows = -1;
        dsp_dbi_post(db, m);
    }
    return 0;
}

void dsp_taskop_free(dsp_taskop *op)
{
    if (op) {
        free(op->type);
        json_decref(op->answer);
        free(op);
    }
}

int dsp_db_taskop(dsp_db *db, dsp_taskop *op)
{
    if (db == NULL)
        return -1;
    struct taskop_req *r = calloc(1, sizeof *r);
    bool gone;

    if (r == NULL)
        return -1;
    r->op = op;
    pthread_mutex_lock(&db->mu);
    gone = db->stats_exited || db->stats_stop;
    if (!gone) {
        *db->top_tail = r;
        db->top_tail = &r->next;
        pthread_cond_signal(&db->stats_cv);
    }
    pthread_mutex_unlock(&db->mu);
    if (gone)
        dsp_dbi_taskop_fail(db, r);
    return 0;
}
