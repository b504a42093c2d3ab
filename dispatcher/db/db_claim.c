/* db_claim: the claim thread (see db_internal.h for what it shares). It owns the
 * table's leadership (GET_LOCK and the epoch), the recovery of rows older epochs left
 * PROCESSING, the lane sweeps (promote/demote) and the claim transactions, and answers
 * dsp_db_claim through MSG_CLAIM.
 *
 * The thread's life is a state machine (enum claim_state), one function per state,
 * driven by dsp_dbi_claim_main until dsp_db_stop:
 *
 *   CONNECT --> SCHEMA --> LEASE --> LOCK --> CONFIRM --> SERVE
 *
 *   CONNECT  open the connection; on failure wait (backoff) and try again, except
 *            when the very first connect is refused for the login or the database
 *            (a wrong --db, not an outage): that is FATAL.
 *   SCHEMA   read the schema version: missing tables, wait SCHEMA_RETRY_MS and read
 *            again; known, on to LOCK (to CONFIRM when the lock is already held).
 *   LEASE    wait until the lease thread holds the table's lease (db_lease.c) and has
 *            recorded this connection in it (a standby taking over KILLs what the
 *            lease names, which frees the lock); a leadership whose lease is gone ends.
 *   LOCK     GET_LOCK: busy, back to LEASE (and note a lost leadership); taken, on to
 *            CONFIRM, or back to SCHEMA, lock kept, when the version read again under
 *            the lock is not one to use (taskpushd --migrate ran meanwhile).
 *   CONFIRM  keep the announced epoch, or take a new one and recover; then SERVE
 *            (back to SCHEMA when taskpush_meta has no epoch row).
 *   SERVE    claims and lane sweeps, one per step; every RECOVER_EVERY_MS, recovery
 *            again (rows a stale leader committed late). Once the lease is gone (or
 *            ran out on the monotonic clock): step down, release the lock, LEASE.
 *   FATAL    a schema, epoch counter or --db no retry mends was reported (on_fatal): wait
 *            for dsp_db_stop. Latched: a reconnect comes back here, so the report
 *            is made once.
 *   DROP     a database error in any state: close, wait (backoff), CONNECT.
 *
 * Beside the state, two facts outlive a state: have_lock (this connection holds the
 * lock: always in CONFIRM and SERVE) and announced (the loop was told of epoch; it
 * survives a reconnect, so that CONFIRM can keep the epoch). Steps that move forward
 * through the setup run back to back; dsp_db_stop is looked at after every wait.
 * Afterwards the thread holds the lock until the write thread is done, then
 * releases it.
 */
#include "db_internal.h"
#include "shard.h"

#include "db_claim_sql.h"
#include "db_claim_fair.h"
#include "db_claim_helper.h"
#include "migrate.h"

#include <mysql.h>

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RECOVER_BATCH 5000u   /* rows per recovery UPDATE, committed each */
#define SWEEP_LIMIT 5000u     /* rows per promote/demote UPDATE */
#define PROMOTE_GAP_MS 200    /* least time between two promote sweeps */
#define DEMOTE_EVERY_MS 1000  /* demote at most this often */
#define DUE_REFRESH_MS 5000   /* re-read MIN(run_after) of the delayed lane at least this often */
#define SCHEMA_RETRY_MS 2000  /* while the tables are missing; a standby's re-check */
#define DROPS_UNHEALTHY 3     /* DROPs in a row that make /healthz 503 (one is a KILL, a blip) */
#define DROPS_CLEAR_MS 10000  /* serving this long without a DROP ends such a streak */
#define RECOVER_EVERY_MS 1000 /* recovery while leading: rows of older epochs */
/* A claim whose candidates were locked by another transaction reads on past them, in
 * the same transaction: at most CONT_ROUNDS more reads, each part reading at most
 * CONT_READ_MAX candidates (twice the rows still wanted at the first, doubling). */
#define CONT_ROUNDS 6
#define CONT_READ_MAX 2048u
/* Rows a claim asks for while no claim has told how large a row is (under a byte
 * budget): the rows past the budget come through the lock read all the same, only to be
 * dropped, and that read is what a SIGTERM waits for. */
#define FIRST_CLAIM_ROWS 32u
#define ORPHAN_STEP_ROWS 5000u /* rows of the table one step of the orphan scan reads */
#define ORPHAN_REST_FACTOR 10  /* a step waits 10 x its own duration before the next one */

/* ---- claim replies ---- */

/* Posts the reply to the request r (which it consumes): reply may be NULL for a
 * failed claim. */
static void claim_answer(dsp_db *db, struct claim_req *r, dsp_claim_reply *reply)
{
    struct msg *m = dsp_dbi_msg_new(MSG_CLAIM);

    if (reply == NULL)
        reply = calloc(1, sizeof *reply);
    if (m == NULL || reply == NULL) {
        /* Nothing can tell the loop; it would wait for this answer forever. */
        log_error(db->log, "out of memory answering a claim");
        free(m);
        dsp_claim_reply_free(reply);
        dsp_dbi_claim_req_free(r);
        pthread_mutex_lock(&db->mu);
        db->claim_busy = false;
        pthread_mutex_unlock(&db->mu);
        return;
    }
    if (reply->types == NULL) {
        reply->ntypes = r->ntypes;
        reply->types = r->types;
        r->types = NULL;
    }
    dsp_dbi_claim_req_free(r);
    m->reply = reply;
    pthread_mutex_lock(&db->mu);
    dsp_dbi_post_locked(db, m);
    db->claim_busy = false;
    pthread_mutex_unlock(&db->mu);
    dsp_dbi_wake_loop(db);
}

static void claim_fail(dsp_db *db, struct claim_req *r)
{
    dsp_claim_reply *reply = calloc(1, sizeof *reply);
    if (reply)
        reply->status = -1;
    claim_answer(db, r, reply);
}

/* ---- the claim thread ---- */

struct cand {
    uint64_t id;
    uint8_t priority;
    uint16_t type_index;
    uint32_t attempts, max_attempts;
    int64_t timeout_ms;
    uint8_t *payload; /* malloc'd (the one copy of it), until the reply takes it */
    unsigned long payload_len;
    bool seen;   /* returned by the lock read: locked by this claim */
    bool locked; /* seen, and taken: its payload is held and it will be marked */
    bool cut;    /* seen, not taken: past the byte budget or beyond what its type wants */
    bool has_group_key; /* from the lock read: the row's group_key, NULL or up to 191 bytes */
    uint8_t group_key_len;
    uint8_t group_key[DSP_FAIR_KEY_MAX]; /* last: cand_clear leaves it, only group_key_len counts */
};

/* Zeroes a candidate but its key's bytes (read only up to group_key_len): a keyless
 * claim does not pay for the 191 bytes a row. */
#define cand_clear(cd) memset((cd), 0, offsetof(struct cand, group_key))

/* See the opening comment. The order matters: a step to a later state up to SERVE
 * runs the next one at once. */
enum claim_state {
    CLAIM_CONNECT,
    CLAIM_SCHEMA,
    CLAIM_LEASE,
    CLAIM_LOCK,
    CLAIM_CONFIRM,
    CLAIM_SERVE,
    CLAIM_FATAL,
    CLAIM_DROP, /* passed through at once: never the state between two steps */
};

struct claim_ctx {
    dsp_db *db;
    struct dbconn c;
    enum claim_state state;
    bool fatal;       /* FATAL was entered: latched */
    bool have_lock;   /* this connection holds the table's lock */
    bool announced;   /* on_leader was posted for epoch and no loss since */
    bool schema_logged;
    bool wait_logged;
    uint32_t epoch;
    uint64_t lease_gen;      /* the lease generation this thread serves (db_lease.c) */
    uint64_t announced_gen;  /* the one epoch was announced under */
    int64_t next_recover;    /* monotonic */
    dsp_strbuf sql;
    dsp_strbuf ids_csv;    /* the ids this thread locks, then marks: formatted once a claim */
    uint64_t *recover_ids; /* recovery's scratch: one task_claim row's ids */
    size_t recover_cap;
    uint32_t bad_epoch;    /* the last task_claim row that listed no ids, logged once */
    uint64_t bad_seq;
    bool recovered_once;   /* this epoch's first recovery (every shard's rows) ran */
    uint64_t orphan_after; /* the orphan scan's place: the last task_id it read */
    int64_t next_orphan;   /* monotonic: the orphan scan's next step */
    uint64_t *release_ids; /* rows of a claim whose COMMIT has an unknown outcome */
    size_t nrelease;
    int64_t next_due_wall;   /* earliest run_after of the delayed lane, as last read */
    int64_t last_promote;    /* monotonic */
    int64_t next_demote;     /* monotonic */
    int64_t next_refresh;    /* monotonic */
    struct cand *cands;
    size_t cands_cap;
    dsp_claim_half *half; /* NULL: every claim runs whole here */
    dsp_fair *fair;       /* the group keys' rotation (db_claim_fair.c) */
    uint64_t row_bytes;   /* payload bytes per row the last claim's lock read returned */
    bool row_bytes_known;
    bool skip_logged;     /* a claim skipped locked rows and no claim since found none */
    /* Health (dsp_dbi_set_problem): */
    bool shape_ok;          /* the table was found taskpush's once; later faults are not fatal */
    bool schema_missing;    /* the last schema read found no taskpush schema */
    unsigned drops;         /* DROPs in a row without a stretch of working statements */
    int64_t drop_backoff;   /* that streak's backoff: a reconnect does not reset it */
    int64_t serve_since;    /* monotonic: SERVE entered */
    int64_t next_schema;    /* monotonic: a standby reads the schema again then */
    char drop_text[200];    /* the error that ended the last step */
};

static bool claim_stopping(dsp_db *db)
{
    bool s;
    pthread_mutex_lock(&db->mu);
    s = db->stop_claims || db->claim_exit;
    pthread_mutex_unlock(&db->mu);
    return s;
}

/* Waits up to ms while not serving, answering every claim request with a failure so
 * that the loop keeps polling. Returns early when stopping, or (lease_id != 0) once the
 * lease is held with that claim connection recorded in it (the lease thread signals
 * claim_cv then). */
static void claim_idle_for(struct claim_ctx *x, int64_t ms, uint64_t lease_id)
{
    dsp_db *db = x->db;
    int64_t until = dsp_now_ms() + ms;
    struct claim_req *r;

    pthread_mutex_lock(&db->mu);
    for (;;) {
        if ((r = db->req) != NULL) {
            db->req = NULL;
            pthread_mutex_unlock(&db->mu);
            claim_fail(db, r);
            pthread_mutex_lock(&db->mu);
            continue;
        }
        if (db->stop_claims || db->claim_exit || dsp_now_ms() >= until ||
            (lease_id != 0 && db->lease.held && db->lease.recorded[LEASE_CONN_CLAIM] == lease_id))
            break;
        cond_wait_until(&db->claim_cv, &db->mu, until);
    }
    pthread_mutex_unlock(&db->mu);
}

static void claim_idle(struct claim_ctx *x, int64_t ms)
{
    claim_idle_for(x, ms, 0);
}

static void claim_drop(struct claim_ctx *x)
{
    /* A server that answered with an error of its own (below 2000) is reachable: the
     * reconnect is not an outage, and /healthz names the failing statement instead. */
    bool answered = x->c.m && mysql_errno(x->c.m) != 0 && mysql_errno(x->c.m) < 2000;

    dsp_dbi_conn_close(&x->c);
    x->have_lock = false;
    if (!answered)
        dsp_dbi_set_conn_ok(x->db, CONN_CLAIM, false);
}

static int commit(struct dbconn *c)
{
    return dsp_dbi_exec(c, "COMMIT", 6, NULL);
}

/* Tells dsp_db what /healthz should say about this thread (see db.h, dsp_db_problem). */
static void claim_health(struct claim_ctx *x)
{
    char text[DSP_DB_PROBLEM_MAX];

    if (x->schema_missing)
        snprintf(text, sizeof text,
                 "database %s has no taskpush schema (%s.schema_version);"
                 " load sql/schema.sql",
                 x->db->opts.url->dbname, x->db->names.meta);
    else if (x->drops >= DROPS_UNHEALTHY)
        snprintf(text, sizeof text, "the claim connection's statements keep failing (%u times in a row): %s",
                 x->drops, x->drop_text);
    else
        text[0] = '\0';
    dsp_dbi_set_problem(x->db, text[0] ? text : NULL);
}

/* The statements work again (a standby's schema read, or SERVE without a DROP for
 * DROPS_CLEAR_MS): the streak of DROPs ends. */
static void drops_end(struct claim_ctx *x)
{
    if (x->drops == 0)
        return;
    if (x->drops >= DROPS_UNHEALTHY)
        log_info(x->db->log, "claim connection: statements succeed again");
    x->drops = 0;
    x->drop_backoff = 0;
    x->c.quiet = false;
    claim_health(x);
}

/* Runs sql, whose answer is one text (or NULL: ""), into out. 0 or -1 (logged). */
static int query_text(struct dbconn *c, const char *sql, char *out, size_t cap)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    out[0] = '\0';
    atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)strlen(sql)) != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        log_warn(c->db->log, "%s connection: %s (error %u) in: %.160s", c->who,
                 c->err ? mysql_error(c->m) : "no result", c->err, sql);
        return -1;
    }
    if ((row = mysql_fetch_row(res)) != NULL && mysql_num_fields(res) >= 1 && row[0]) {
        unsigned long n = mysql_fetch_lengths(res)[0];
        if (n >= cap)
            n = (unsigned long)cap - 1; /* names the catalog returned: bounded here */
        memcpy(out, row[0], n);
        out[n] = '\0';
    }
    mysql_free_result(res);
    return 0;
}

/* Whether the table task is taskpush's (docs/adopting.md: a team's own task table is
 * never adopted): it has the columns and indexes taskpush's statements name. A taskpush
 * table whose taskpush_meta is missing is a missing schema (503, retried), not a foreign
 * table. have_version: taskpush_meta has a schema version (for the message). 2: it is
 * taskpush's; 0: there is no task table; 1: it is not, why in out; -1: connection error. */
static int foreign_table(struct claim_ctx *x, bool have_version, char *out, size_t cap)
{
    char cols[256], idx[128];
    uint64_t n;
    bool isnull;

    dsp_strbuf_reset(&x->sql);
    dsp_schema_exists_sql(&x->sql, &x->db->names);
    if (x->sql.oom || dsp_dbi_query_u64(&x->c, x->sql.p, &n, &isnull, 0) < 0)
        return -1;
    if (n == 0)
        return 0;
    dsp_strbuf_reset(&x->sql);
    dsp_schema_missing_sql(&x->sql, &x->db->names, DSP_SCHEMA_COLUMNS_CURRENT);
    if (x->sql.oom || query_text(&x->c, x->sql.p, cols, sizeof cols) < 0)
        return -1;
    dsp_strbuf_reset(&x->sql);
    dsp_schema_missing_sql(&x->sql, &x->db->names, DSP_SCHEMA_INDEXES_CURRENT);
    if (x->sql.oom || query_text(&x->c, x->sql.p, idx, sizeof idx) < 0)
        return -1;
    if (cols[0] == '\0' && idx[0] == '\0')
        return 2;
    dsp_schema_foreign_text(out, cap, &x->db->names, "refusing to start", x->db->opts.url->dbname,
                            cols, idx, have_version);
    return 1;
}

/* Reports a table that is not taskpush's at start: the loop exits 1 (on_fatal). */
static void foreign_fatal(struct claim_ctx *x, const char *text)
{
    struct msg *m = dsp_dbi_msg_new(MSG_FATAL);

    if (m) {
        m->text = strdup(text);
        dsp_dbi_post(x->db, m);
    }
    x->fatal = true;
}

/* 1: the schema is one this build knows; 0: not yet (missing tables, retry later, or
 * fatal); -1: connection error. */
static int check_schema(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t v;
    bool isnull;
    char vsql[DSP_SCHEMA_SQL_MAX];
    int rc = dsp_dbi_query_u64(&x->c, dsp_schema_version_sql(vsql, &db->names), &v, &isnull,
                               ER_NO_SUCH_TABLE_);

    if (rc < 0 && x->c.err != ER_NO_SUCH_TABLE_)
        return -1;
    /* End the read's transaction: it holds a metadata lock on the table until then,
     * which would make an ALTER or DROP (and everything queued behind it) wait. */
    if (commit(&x->c) < 0)
        return -1;
    x->next_schema = dsp_now_ms() + SCHEMA_RETRY_MS;
    bool have_version = rc == 0 && !isnull;
    /* A version row makes the table taskpush's: older (taskpushd --migrate upgrades it)
     * or newer is fatal with its own message, before any look at the table's shape, which
     * an older version's table does not have yet. A retry cannot mend either. */
    char text[DSP_SCHEMA_PROBLEM_MAX];
    if (have_version && dsp_schema_version_problem(v, text, sizeof text) != 0) {
        struct msg *m = dsp_dbi_msg_new(MSG_FATAL);
        log_error(db->log, "database %s: %s", db->opts.url->dbname, text);
        if (m) {
            m->text = strdup(text);
            dsp_dbi_post(db, m);
        }
        x->fatal = true;
        return 0;
    }
    if (!x->shape_ok) {
        char shape[DSP_SCHEMA_FOREIGN_MAX];
        int f = foreign_table(x, have_version, shape, sizeof shape);
        if (f < 0 || commit(&x->c) < 0)
            return -1;
        if (f == 1) {
            foreign_fatal(x, shape);
            return 0;
        }
        x->shape_ok = f == 2;
    }
    x->schema_missing = !have_version;
    claim_health(x);
    if (!have_version) {
        if (!x->schema_logged)
            log_warn(db->log,
                     "database %s has no taskpush schema (%s.schema_version);"
                     " load sql/schema.sql. Retrying every %d s",
                     db->opts.url->dbname, db->names.meta, SCHEMA_RETRY_MS / 1000);
        x->schema_logged = true;
        return 0;
    }
    x->schema_logged = false;
    return 1;
}

/* 1: the lock is ours; 0: someone else holds it; -1: error. */
static int take_lock(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t v;
    bool isnull;
    int rc = dsp_dbi_query_u64(&x->c, db->get_lock_sql.p, &v, &isnull, 0);

    if (rc < 0)
        return -1;
    if (rc == 0 && !isnull && v == 1) {
        x->have_lock = true;
        if (x->wait_logged)
            log_info(db->log, "took the table's lock");
        x->wait_logged = false;
        /* taskpushd --migrate holds this lock while it changes the schema: read the
         * version again now that nobody can change it under us. On 0 (fatal, or the
         * tables are gone) claim_on_lock waits as for a busy lock, then goes back to
         * SCHEMA with the lock kept. */
        return check_schema(x);
    }
    if (!x->wait_logged)
        log_info(db->log, "another taskpushd holds the table; waiting");
    x->wait_logged = true;
    return 0;
}

static void leadership_lost(struct claim_ctx *x)
{
    dsp_db *db = x->db;

    log_error(db->log, "another dispatcher took the table after epoch %u", (unsigned)x->epoch);
    x->announced = false;
    x->nrelease = 0;
    dsp_dbi_leadership_end(db); /* on_leader_lost once, whoever ends it first */
}

/* Reads the epoch counter. Returns 0 or -1. */
static int read_meta_epoch(struct claim_ctx *x, uint64_t *out)
{
    bool isnull;
    char sql[96 + DSP_TABLE_IDENT_CAP];
    int rc;

    /* A shard's own row: another shard taking an epoch moves the counter, not it. */
    snprintf(sql, sizeof sql, "SELECT value FROM %s WHERE name = '%s'", x->db->names.meta,
             x->db->epoch_row);
    rc = dsp_dbi_query_u64(&x->c, sql, out, &isnull, 0);
    if (rc == 1 || isnull)
        *out = 0;
    /* Ends the read's transaction (and its metadata lock). */
    return rc < 0 || commit(&x->c) < 0 ? -1 : 0;
}

/* Rows of a claim whose COMMIT failed: the commit may have happened, and the loop was
 * told it did not. Puts them back to NEW (no attempt used) when the epoch held. */
static int release_unknown(struct claim_ctx *x)
{
    uint64_t n;

    if (x->nrelease == 0)
        return 0;
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_release_ids(&x->sql, &x->db->names, x->epoch, dsp_wall_ms(), x->release_ids,
                           x->nrelease);
    if (x->sql.oom)
        return -1;
    if (dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0 || commit(&x->c) < 0)
        return -1;
    if (n)
        log_info(x->db->log, "released %" PRIu64 " row(s) of a claim whose commit was not confirmed",
                 n);
    x->nrelease = 0;
    return 0;
}

/* Recovers the rows one task_claim row lists (its lock held, ids parsed): those still
 * PROCESSING under its epoch, of this shard, go back to NEW or to FAILED (see
 * dsp_db_sql_recover_ids for the attempts rule); the row is deleted once none of its
 * ids is PROCESSING under that epoch in any shard. Adds the rows changed to *total.
 * Returns 0 or -1 (database error). */
static int recover_listed(struct claim_ctx *x, uint32_t row_epoch, uint64_t row_seq,
                          const uint64_t *ids, size_t n, uint64_t *total)
{
    uint64_t changed, left = 0, deleted;
    bool isnull;

    for (size_t s = 0; s < n; s += RECOVER_BATCH) {
        size_t m = n - s < RECOVER_BATCH ? n - s : RECOVER_BATCH;
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_recover_ids(&x->sql, &x->db->names, row_epoch, dsp_wall_ms(), ids + s, m,
                               x->db->in);
        if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &changed) < 0)
            return -1;
        *total += changed;
    }
    for (size_t s = 0; s < n && left == 0; s += RECOVER_BATCH) {
        size_t m = n - s < RECOVER_BATCH ? n - s : RECOVER_BATCH;
        uint64_t k;
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_still_processing(&x->sql, &x->db->names, row_epoch, ids + s, m);
        if (x->sql.oom || dsp_dbi_query_u64(&x->c, x->sql.p, &k, &isnull, 0) < 0)
            return -1;
        left += isnull ? 0 : k;
    }
    if (left == 0) {
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_claim_log_delete(&x->sql, &x->db->names, row_epoch, &row_seq, 1);
        if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &deleted) < 0)
            return -1;
    }
    return 0;
}

/* Puts back to NEW the rows older epochs left PROCESSING, as task_claim lists them, one
 * of its rows per transaction. At takeover (all_shards) the rows of every shard are
 * read, so that a type moved from one shard to another is recovered by its new owner;
 * the periodic pass reads this shard's only. */
static int recover_once(struct claim_ctx *x, bool all_shards);

/* recover_once, run again on the same connection when a conflict (Galera's
 * certification, a deadlock, a lock wait timeout) rolled a transaction of it back: what
 * it committed before stays done, and it reads on from the first row still listed. */
static int recover(struct claim_ctx *x, bool all_shards)
{
    for (unsigned tries = 1;; tries++) {
        x->c.err = 0;
        if (recover_once(x, all_shards) == 0)
            return 0;
        if (!dsp_dbi_error_is_conflict(x->c.err) || tries >= DSP_DBI_CONFLICT_TRIES ||
            dsp_dbi_conflict_retry(&x->c, tries) < 0)
            return -1;
    }
}

static int recover_once(struct claim_ctx *x, bool all_shards)
{
    dsp_db *db = x->db;
    uint64_t total = 0, seq = 0;
    uint32_t epoch = 0;
    size_t nlisted = 0;

    while (!claim_stopping(db)) {
        MYSQL_RES *res;
        MYSQL_ROW row;
        unsigned long *len;
        size_t n = 0, most;
        int bad;

        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_claim_log_next(&x->sql, &x->db->names, x->epoch, all_shards ? NULL : db->shard,
                                  epoch, seq);
        if (x->sql.oom)
            return -1;
        atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
        if (mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
            (res = mysql_store_result(x->c.m)) == NULL) {
            x->c.err = mysql_errno(x->c.m);
            log_warn(db->log, "recovery: %s (error %u)", mysql_error(x->c.m), x->c.err);
            return -1;
        }
        row = mysql_num_fields(res) == 3 ? mysql_fetch_row(res) : NULL;
        if (row == NULL || row[0] == NULL || row[1] == NULL) {
            mysql_free_result(res);
            if (commit(&x->c) < 0)
                return -1;
            break;
        }
        len = mysql_fetch_lengths(res);
        epoch = (uint32_t)strtoul(row[0], NULL, 10);
        seq = strtoull(row[1], NULL, 10);
        most = row[2] ? len[2] / 2 + 1 : 0; /* "1,2,3": one id per 2 bytes at most */
        if (most > DSP_CLAIM_IDS_MAX)
            most = DSP_CLAIM_IDS_MAX;
        if (most > x->recover_cap) {
            uint64_t *p = realloc(x->recover_ids, most * sizeof *p);
            if (p == NULL) {
                mysql_free_result(res);
                log_error(db->log, "out of memory recovering rows of older epochs");
                commit(&x->c);
                return 0; /* tried again at the next pass */
            }
            x->recover_ids = p;
            x->recover_cap = most;
        }
        bad = dsp_claim_ids_parse(row[2], row[2] ? len[2] : 0, x->recover_ids, most, &n);
        mysql_free_result(res);
        if (bad < 0) {
            /* Not what a dispatcher writes: left as it is, for an operator to read. */
            if (epoch != x->bad_epoch || seq != x->bad_seq)
                log_error(db->log,
                          "task_claim row (epoch %u, seq %" PRIu64 ") does not list task ids;"
                          " left as it is, and its rows are not recovered",
                          (unsigned)epoch, seq);
            x->bad_epoch = epoch;
            x->bad_seq = seq;
        } else if (recover_listed(x, epoch, seq, x->recover_ids, n, &total) < 0) {
            return -1;
        }
        if (commit(&x->c) < 0)
            return -1;
        nlisted++;
    }
    if (total)
        log_info(db->log,
                 "recovered %" PRIu64 " row(s) left PROCESSING by earlier dispatchers"
                 " (%zu claim(s) listed)",
                 total, nlisted);
    return 0;
}

/* A shard's epoch comes from the one counter of the table (so that it is larger than
 * every earlier epoch of every shard, and each epoch names one shard), and is recorded
 * in the shard's row 'epoch:NAME' in the same transaction, which confirm_leadership
 * compares with. The name is [A-Za-z0-9_.-] (shard.c). Returns 0 or -1. */
static int record_shard_epoch(struct claim_ctx *x, uint64_t e)
{
    char sql[160 + DSP_TABLE_IDENT_CAP];
    uint64_t n;

    if (x->c.mysql) /* VALUES() in ON DUPLICATE KEY UPDATE is deprecated since MySQL 8.0.20 */
        snprintf(sql, sizeof sql,
                 "INSERT INTO %s (name, value) VALUES ('%s', %" PRIu64 ")"
                 " ON DUPLICATE KEY UPDATE value = %" PRIu64,
                 x->db->names.meta, x->db->epoch_row, e, e);
    else
        snprintf(sql, sizeof sql,
                 "INSERT INTO %s (name, value) VALUES ('%s', %" PRIu64 ")"
                 " ON DUPLICATE KEY UPDATE value = VALUES(value)",
                 x->db->names.meta, x->db->epoch_row, e);
    return dsp_dbi_exec(&x->c, sql, strlen(sql), &n);
}

/* Makes the leadership of this connection certain: keeps the epoch when nobody took
 * over since, else takes a new one and recovers. 1: serving; 0: retry later; -1: error. */
static int confirm_leadership(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t e, n;
    struct msg *m;
    char next[sizeof DSP_CLAIM_SQL_EPOCH_NEXT_FMT + DSP_TABLE_IDENT_CAP];
    char text[96 + DSP_TABLE_IDENT_CAP];

    if (x->announced && x->announced_gen != x->lease_gen) {
        /* The lease was lost and taken again meanwhile: the loop dropped everything. */
        x->announced = false;
        x->nrelease = 0;
        dsp_dbi_leadership_end(db);
    }
    if (x->announced) {
        if (read_meta_epoch(x, &e) < 0)
            return -1;
        if (e == x->epoch) {
            if (release_unknown(x) < 0)
                return -1;
            dsp_log_at(db->log, x->drops ? DSP_LOG_DEBUG : DSP_LOG_INFO, "kept the table with epoch %u",
                       (unsigned)x->epoch);
            return 1;
        }
        leadership_lost(x);
    }
    snprintf(next, sizeof next, DSP_CLAIM_SQL_EPOCH_NEXT_FMT, db->names.meta);
    if (dsp_dbi_exec(&x->c, next, strlen(next), &n) < 0)
        return -1;
    e = mysql_insert_id(x->c.m);
    if (n == 1 && x->db->in && record_shard_epoch(x, e) < 0)
        return -1;
    if (commit(&x->c) < 0)
        return -1;
    if (n != 1) {
        log_warn(db->log, "%s has no 'epoch' row; load sql/schema.sql", db->names.meta);
        return 0;
    }
    if (e == 0 || e > UINT32_MAX) {
        if ((m = dsp_dbi_msg_new(MSG_FATAL)) != NULL) {
            snprintf(text, sizeof text, "the epoch counter in %s is out of range", db->names.meta);
            m->text = strdup(text);
            dsp_dbi_post(db, m);
        }
        x->fatal = true;
        return 0;
    }
    x->epoch = (uint32_t)e;
    x->nrelease = 0;
    x->recovered_once = false;
    atomic_store(&db->epoch, x->epoch);
    /* Workers that ran tasks of an older epoch reconnect and declare them (protocol
     * version 3): their rows wait --adopt-grace-ms, then the periodic recovery takes
     * what nobody adopted. */
    if (db->opts.adopt_grace_ms > 0) {
        log_info(db->log, "rows of older epochs are recovered in %" PRId64 " ms (--adopt-grace-ms)",
                 db->opts.adopt_grace_ms);
        x->next_recover = dsp_now_ms() + db->opts.adopt_grace_ms;
    } else {
        if (recover(x, true) < 0)
            return -1;
        x->recovered_once = true;
        x->next_recover = dsp_now_ms() + RECOVER_EVERY_MS;
    }
    x->announced = true;
    x->announced_gen = x->lease_gen;
    x->next_due_wall = 0; /* sweep both lanes at once */
    x->next_demote = 0;
    x->next_refresh = 0;
    atomic_store(&db->leader, true);
    if ((m = dsp_dbi_msg_new(MSG_LEADER)) == NULL)
        return -1;
    m->epoch = x->epoch;
    pthread_mutex_lock(&db->mu);
    db->accepting = !db->stop_claims;
    dsp_dbi_post_locked(db, m);
    pthread_mutex_unlock(&db->mu);
    dsp_dbi_wake_loop(db);
    return 1;
}

/* Sorts n elements unless they already are in order: a claim of one type and one
 * priority reads its candidates from the index in id order, and qsort's merge sort was
 * a fifth of the claim thread's instructions. */
static void sort_unless_sorted(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    const char *p = base;
    for (size_t i = 1; i < n; i++)
        if (cmp(p + (i - 1) * size, p + i * size) > 0) {
            qsort(base, n, size, cmp);
            return;
        }
}

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    if (a->priority != b->priority)
        return a->priority > b->priority ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Per type of a claim: where its candidates' read stands, for reading past rows
 * locked by another transaction (claim_continue). */
struct claim_cursor {
    uint64_t id;     /* the last candidate tried (locked or not) */
    uint8_t prio;
    bool more;       /* rows may follow it: the read was cut by its LIMIT, or merge left some */
    uint32_t nread;  /* candidates the first read returned */
    uint32_t need;   /* rows tried and found locked: to take from further on */
};

/* One claim transaction, as do_claim's steps (plan, select, merge, mark) pass it on. */
struct claim_run {
    struct claim_req *r;
    const char **ptypes;    /* the types that may take rows: the SELECT's parts */
    uint16_t *pindex;       /* per part: its index in r->types */
    uint32_t *taken;        /* per type of r: rows kept */
    size_t nparts;
    uint32_t limit;         /* most rows per part */
    uint64_t max_bytes;     /* r->max_bytes */
    MYSQL_RES *res;         /* the candidates' rows, until merge */
    size_t ncand, nkept;
    uint64_t *ids;          /* the kept rows, in dispatch order */
    struct idpos *byid;     /* the kept rows by id, to find a locked row's candidate */
    size_t nmine;           /* ids[0..nmine) are locked here, the rest by the helper */
    bool half_posted;       /* the helper has ids[nmine..nkept) and was not waited for */
    uint64_t *mark;         /* the rows locked here, for the mark */
    size_t nmark;
    dsp_claim_reply *reply;
    int64_t now_ms;         /* wall clock of the claim: run_after <= now_ms */
    int64_t t0;             /* the SELECT went out (monotonic, us) */
    bool fair_read;         /* claim_select took the fair read (db_claim_fair.h) */
    bool fair_short;        /* the rotation took fewer rows than asked and left some */
    uint32_t keyed_marked;  /* 1 + the type index last marked keyed by this claim; 0: none */
    struct claim_cursor *cur; /* per type of r */
    size_t ncand_all;       /* x->cands[0..ncand_all) may hold payloads: the kept rows, then
                             * those claim_continue read on */
    /* The byte budget (r->max_bytes, 0: none): the rows taken, in dispatch order, stop
     * where their payloads would pass it; at least one row is taken. */
    uint64_t bytes;         /* payloads of the rows taken */
    size_t ntaken;
    size_t top;             /* every taken row is below this rank (index in x->cands) */
    size_t evict_lo;        /* rows below this rank are in the reply already */
    size_t cut_rank;        /* the best rank cut for the budget; SIZE_MAX: none */
    uint64_t seen_bytes;    /* payloads of every row the lock reads returned */
    size_t nseen;
    size_t skipped;         /* rows tried that the lock read did not return */
    uint64_t first_skipped;
};

/* A kept candidate by id (claim_lock). */
struct idpos {
    uint64_t id;
    size_t pos; /* in x->cands */
};

/* How a step of a claim ended. */
enum claim_step_rc {
    STEP_OK = 0,
    STEP_FAILED,       /* answer with a failure; the connection is fine */
    STEP_DB_ERROR,     /* answer with a failure; the caller reconnects */
    STEP_OOM,          /* out of memory before the SELECT */
    STEP_OOM_ROLLBACK, /* out of memory inside the transaction: roll it back */
    STEP_FENCED,       /* the lease row is another's: roll back, deliver nothing, step down */
};

/* Plans the SELECT: only types that may take rows, each asked for the largest
 * per-type limit (capped by the total). */
static int claim_plan(struct claim_ctx *x, struct claim_run *cr)
{
    dsp_db *db = x->db;
    struct claim_req *r = cr->r;
    size_t i;

    cr->ptypes = calloc(r->ntypes ? r->ntypes : 1, sizeof *cr->ptypes);
    cr->pindex = calloc(r->ntypes ? r->ntypes : 1, sizeof *cr->pindex);
    cr->taken = calloc(r->ntypes ? r->ntypes : 1, sizeof *cr->taken);
    cr->reply = calloc(1, sizeof *cr->reply);
    cr->cur = calloc(r->ntypes ? r->ntypes : 1, sizeof *cr->cur);
    cr->max_bytes = r->max_bytes;
    cr->cut_rank = SIZE_MAX;
    /* Galera's write-set limits (read at connect): the marked rows, the task_claim row
     * and the lease row are one transaction's; each row goes in with its images (the
     * payload twice at most). The loop claims the rest next time. */
    if (x->c.ws_max_rows > 0) {
        uint64_t room = x->c.ws_max_rows > 3 ? x->c.ws_max_rows - 2 : 1;
        if (r->total > room)
            r->total = (uint32_t)room;
    }
    if (x->c.ws_max_bytes > 0) {
        uint64_t room = x->c.ws_max_bytes / 2 > 1 ? x->c.ws_max_bytes / 2 : 1;
        if (cr->max_bytes == 0 || cr->max_bytes > room)
            cr->max_bytes = room;
    }
    if (!cr->ptypes || !cr->pindex || !cr->taken || !cr->reply || !cr->cur)
        return STEP_OOM;
    /* Only types that may take rows; a type name the table cannot hold has no rows. */
    for (i = 0; i < r->ntypes; i++) {
        if (r->limits[i] == 0)
            continue;
        /* Another shard's type never reaches the claim (the HELLO refuses it); checked
         * here too, so that no path can claim another shard's rows. */
        if (!dsp_shard_has(db->opts.shard, (const uint8_t *)r->types[i], strlen(r->types[i])))
            continue;
        if (strlen(r->types[i]) > DSP_CLAIM_SQL_TYPE_MAX_BYTES) {
            log_warn(db->log, "task type of %zu bytes cannot be in the table; not claimed",
                     strlen(r->types[i]));
            continue;
        }
        cr->ptypes[cr->nparts] = r->types[i];
        cr->pindex[cr->nparts++] = (uint16_t)i;
        if (r->limits[i] > cr->limit)
            cr->limit = r->limits[i];
    }
    if (cr->limit > r->total)
        cr->limit = r->total;
    return STEP_OK;
}

/* The part of a row whose type is t[0..tl): p when it is p's (the usual case: the
 * parts come one after the other), else the part found, or nparts for none. */
static size_t claim_row_part(const char *const *ptypes, size_t nparts, size_t p, const char *t,
                             size_t tl)
{
    size_t q;

    if (p < nparts && strlen(ptypes[p]) == tl && memcmp(ptypes[p], t, tl) == 0)
        return p;
    for (q = 0; q < nparts; q++)
        if (strlen(ptypes[q]) == tl && memcmp(ptypes[q], t, tl) == 0)
            break;
    return q;
}

/* Fills a candidate from a row of the candidates' read; the rest comes with the lock. */
static void cand_fill(struct cand *cd, MYSQL_ROW row, uint16_t type_index)
{
    cand_clear(cd);
    cd->id = strtoull(row[DSP_CLAIM_COL_TASK_ID], NULL, 10);
    cd->type_index = type_index;
    cd->priority = row[DSP_CLAIM_COL_PRIORITY]
                       ? (uint8_t)strtoul(row[DSP_CLAIM_COL_PRIORITY], NULL, 10)
                       : 0;
}

/* Select, the plain read (no type of the claim is known to have keyed rows, see
 * db_claim_fair.h): reads the candidates (one part per type, a consistent read of
 * claim_idx alone: see dsp_claim_sql_candidates) into x->cands, each part in dispatch
 * order. */
static int claim_select_plain(struct claim_ctx *x, struct claim_run *cr)
{
    dsp_db *db = x->db;
    size_t cap = dsp_claim_sql_select_bound(cr->ptypes, cr->nparts), nforeign = 0, p, q;
    uint64_t first_foreign = 0;
    MYSQL_ROW row;
    char *sel;
    int n;

    if ((sel = malloc(cap)) == NULL)
        return STEP_OOM;
    n = dsp_claim_sql_candidates(sel, cap, cr->ptypes, cr->nparts, cr->now_ms, cr->limit, NULL,
                                 NULL, &db->names);
    if (n < 0) {
        log_error(db->log, "cannot build the claim statement");
        free(sel);
        return STEP_FAILED;
    }

    cr->t0 = dsp_now_us();
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, sel, (unsigned long)n) != 0 ||
        (cr->res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: %s (error %u)", x->c.err ? mysql_error(x->c.m) : "no result",
                 x->c.err);
        free(sel);
        return STEP_DB_ERROR;
    }
    free(sel);
    if (mysql_num_fields(cr->res) != DSP_CLAIM_SQL_CAND_COL_COUNT) {
        log_error(db->log, "claim: %u columns, expected %d", mysql_num_fields(cr->res),
                  DSP_CLAIM_SQL_CAND_COL_COUNT);
        return STEP_DB_ERROR;
    }
    if (mysql_num_rows(cr->res) > x->cands_cap) {
        size_t want = (size_t)mysql_num_rows(cr->res);
        struct cand *nc = realloc(x->cands, want * sizeof *nc);
        if (nc == NULL)
            return STEP_OOM_ROLLBACK;
        x->cands = nc;
        x->cands_cap = want;
    }

    /* The parts come one after the other, each in dispatch order; a row's part is the
     * one whose type it carries. */
    p = 0;
    while ((row = mysql_fetch_row(cr->res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(cr->res);

        if (row[DSP_CLAIM_COL_TASK_ID] == NULL || row[DSP_CLAIM_COL_TASK_TYPE] == NULL)
            continue;
        q = claim_row_part(cr->ptypes, cr->nparts, p, row[DSP_CLAIM_COL_TASK_TYPE],
                           len[DSP_CLAIM_COL_TASK_TYPE]);
        if (q == cr->nparts) {
            /* Equal in SQL but not byte for byte (utf8mb4_bin pads: 'a ' = 'a'):
             * no worker asked for it. It stays NEW. */
            if (nforeign++ == 0)
                first_foreign = strtoull(row[DSP_CLAIM_COL_TASK_ID], NULL, 10);
            continue;
        }
        p = q;
        cr->cur[cr->pindex[p]].nread++;
        cand_fill(&x->cands[cr->ncand++], row, cr->pindex[p]);
    }
    for (p = 0; p < cr->nparts; p++)
        if (cr->cur[cr->pindex[p]].nread >= cr->limit)
            cr->cur[cr->pindex[p]].more = true;
    if (nforeign)
        log_warn(db->log,
                 "claim returned %zu row(s) whose task_type is not byte for byte a type asked"
                 " for (trailing spaces?), e.g. task %" PRIu64 "; left NEW",
                 nforeign, first_foreign);
    if (mysql_errno(x->c.m) != 0) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: reading rows: %s", mysql_error(x->c.m));
        return STEP_DB_ERROR;
    }
    return STEP_OK;
}

/* Select, the fair read: reads the candidates (one read of group_idx for all types, see
 * db_claim_fair.h: the keys in turn) and keeps, per type, the rows the rotation takes,
 * into x->cands. */
static int claim_select_fair(struct claim_ctx *x, struct claim_run *cr)
{
    dsp_db *db = x->db;
    size_t cap = dsp_fair_sql_bound(cr->ptypes, cr->nparts), nforeign = 0, nbad = 0, p, q;
    uint64_t first_foreign = 0;
    MYSQL_ROW row;
    char *sel;
    int n;

    if (x->fair == NULL)
        return STEP_OOM;
    if ((sel = malloc(cap)) == NULL)
        return STEP_OOM;
    n = dsp_fair_sql(x->fair, sel, cap, cr->ptypes, cr->nparts, cr->now_ms, cr->limit, &db->names);
    if (n < 0) {
        log_error(db->log, "cannot build the claim statement");
        free(sel);
        return STEP_FAILED;
    }

    cr->t0 = dsp_now_us();
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, sel, (unsigned long)n) != 0 ||
        (cr->res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: %s (error %u)", x->c.err ? mysql_error(x->c.m) : "no result",
                 x->c.err);
        free(sel);
        return STEP_DB_ERROR;
    }
    free(sel);
    if (mysql_num_fields(cr->res) != DSP_FAIR_COL_COUNT) {
        log_error(db->log, "claim: %u columns, expected %d", mysql_num_fields(cr->res),
                  DSP_FAIR_COL_COUNT);
        return STEP_DB_ERROR;
    }

    /* A row's part is the one whose type it carries (mostly the one of the row before). */
    p = 0;
    while ((row = mysql_fetch_row(cr->res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(cr->res);

        if (row[DSP_CLAIM_COL_TASK_ID] == NULL || row[DSP_CLAIM_COL_TASK_TYPE] == NULL ||
            row[DSP_CLAIM_COL_PRIORITY] == NULL || row[DSP_FAIR_COL_PART] == NULL)
            continue;
        q = claim_row_part(cr->ptypes, cr->nparts, p, row[DSP_CLAIM_COL_TASK_TYPE],
                           len[DSP_CLAIM_COL_TASK_TYPE]);
        if (q == cr->nparts) {
            /* Equal in SQL but not byte for byte (utf8mb4_bin pads: 'a ' = 'a'):
             * no worker asked for it. It stays NEW. */
            if (nforeign++ == 0)
                first_foreign = strtoull(row[DSP_CLAIM_COL_TASK_ID], NULL, 10);
            continue;
        }
        p = q;
        if (dsp_fair_add_text(x->fair, p, row[DSP_CLAIM_COL_TASK_ID], len[DSP_CLAIM_COL_TASK_ID],
                              row[DSP_CLAIM_COL_PRIORITY], len[DSP_CLAIM_COL_PRIORITY],
                              row[DSP_FAIR_COL_GROUP_KEY], len[DSP_FAIR_COL_GROUP_KEY],
                              row[DSP_FAIR_COL_PART], len[DSP_FAIR_COL_PART]) != 0)
            nbad++; /* stays NEW: a key the column cannot hold, a malformed number, out of memory */
    }
    if (mysql_errno(x->c.m) != 0) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: reading rows: %s", mysql_error(x->c.m));
        return STEP_DB_ERROR;
    }
    /* The rows taken are at most the rows read (and cr->limit a type). */
    size_t most = dsp_fair_nrows(x->fair);
    if (most > x->cands_cap) {
        struct cand *nc = realloc(x->cands, most * sizeof *nc);
        if (nc == NULL)
            return STEP_OOM_ROLLBACK;
        x->cands = nc;
        x->cands_cap = most;
    }
    uint64_t *ids = malloc(cr->limit * sizeof *ids);
    uint8_t *prios = malloc(cr->limit);
    if (ids == NULL || prios == NULL) {
        free(ids);
        free(prios);
        return STEP_OOM_ROLLBACK;
    }
    for (p = 0; p < cr->nparts; p++) {
        bool more = false;
        struct claim_cursor *c = &cr->cur[cr->pindex[p]];
        size_t got = dsp_fair_pick(x->fair, p, cr->limit, ids, prios, &more);

        if (got > x->cands_cap - cr->ncand) /* cannot be: each row is taken once */
            got = x->cands_cap - cr->ncand;
        for (size_t i = 0; i < got; i++) {
            struct cand *cd = &x->cands[cr->ncand++];
            cand_clear(cd);
            cd->id = ids[i];
            cd->priority = prios[i];
            cd->type_index = cr->pindex[p];
        }
        c->nread += (uint32_t)got;
        if (more)
            c->more = true;
        /* Fewer rows than asked while rows are left (the rotation took one round of the
         * keys it saw, or the reads were cut): the loop claims again at once rather than
         * waiting --poll-ms as after a drained table (do_claim: when rows were taken). */
        if (more && got < cr->limit)
            cr->fair_short = true;
    }
    free(ids);
    free(prios);
    dsp_fair_trim(x->fair);
    if (nforeign)
        log_warn(db->log,
                 "claim returned %zu row(s) whose task_type is not byte for byte a type asked"
                 " for (trailing spaces?), e.g. task %" PRIu64 "; left NEW",
                 nforeign, first_foreign);
    if (nbad)
        log_warn(db->log,
                 "claim: %zu row(s) with a group_key over %u bytes or a malformed id, priority"
                 " or part left NEW",
                 nbad, DSP_FAIR_KEY_MAX);
    return STEP_OK;
}

/* Select: the fair read when a type of the claim may have keyed rows, else the plain
 * one (db_claim_fair.h: a table without keys pays what it paid before them). */
static int claim_select(struct claim_ctx *x, struct claim_run *cr)
{
    cr->fair_read = x->fair != NULL &&
                    dsp_fair_use(x->fair, cr->ptypes, cr->nparts,
                                 atomic_load_explicit(&x->db->keyed_submits, memory_order_relaxed));
    return cr->fair_read ? claim_select_fair(x, cr) : claim_select_plain(x, cr);
}

/* Merge: the parts into dispatch order, keeping rows while their type and the total
 * have room (the rest are not locked: they stay NEW). */
static int claim_merge(struct claim_ctx *x, struct claim_run *cr)
{
    struct claim_req *r = cr->r;
    size_t i;

    mysql_free_result(cr->res); /* the candidates hold no pointer into it */
    cr->res = NULL;
    /* One type's rows come in the order its keys take turns (highest priority first),
     * which is the order to hand them out in: only several types are merged by
     * (priority, id). */
    if (!cr->fair_read || cr->nparts > 1)
        sort_unless_sorted(x->cands, cr->ncand, sizeof *x->cands, cand_cmp);
    for (i = 0; i < cr->ncand && cr->nkept < r->total; i++) {
        struct cand *cd = &x->cands[i];
        if (cr->taken[cd->type_index] >= r->limits[cd->type_index]) {
            cr->cur[cd->type_index].more = true;
            continue;
        }
        cr->taken[cd->type_index]++;
        x->cands[cr->nkept++] = *cd; /* compacts in place: nkept <= i */
    }
    for (; i < cr->ncand; i++) /* left out by the total */
        cr->cur[x->cands[i].type_index].more = true;
    return STEP_OK;
}

static int idpos_cmp(const void *pa, const void *pb)
{
    const struct idpos *a = pa, *b = pb;
    return a->id < b->id ? -1 : a->id > b->id;
}


/* The candidate whose id is id among byid[0..n) (sorted by id), or NULL. */
static struct cand *claim_find(struct claim_ctx *x, const struct idpos *byid, size_t n, uint64_t id)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (byid[mid].id == id)
            return &x->cands[byid[mid].pos];
        if (byid[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Adds ids to the rows put back to NEW at the next step (release_unknown): rows whose
 * claim may have committed while the loop was told nothing of them. */
static void claim_release_later(struct claim_ctx *x, const uint64_t *ids, size_t n)
{
    uint64_t *keep;

    if (n == 0)
        return;
    keep = realloc(x->release_ids, (x->nrelease + n) * sizeof *keep);
    if (keep == NULL) {
        /* Left PROCESSING under this epoch: the next leader recovers them. */
        log_error(x->db->log, "out of memory: %zu claimed row(s) stay PROCESSING", n);
        return;
    }
    memcpy(keep + x->nrelease, ids, n * sizeof *ids);
    x->release_ids = keep;
    x->nrelease += n;
}

/* Index: the kept rows' ids in dispatch order, and by id; then hands the second half
 * to the helper when the claim is large and the helper free. */
static int claim_index(struct claim_ctx *x, struct claim_run *cr)
{
    size_t i;

    /* The last claim's rows tell how large a row is: ask for no more than the byte
     * budget holds of such rows (the lock read would return the rest for nothing). */
    if (cr->max_bytes && (!x->row_bytes_known || x->row_bytes > 0)) {
        uint64_t most = x->row_bytes_known ? cr->max_bytes / x->row_bytes : FIRST_CLAIM_ROWS;
        if (most == 0)
            most = 1;
        for (i = most; i < cr->nkept; i++)
            cr->cur[x->cands[i].type_index].more = true;
        if (cr->nkept > most) {
            cr->nkept = (size_t)most;
            cr->reply->more = true;
        }
    }
    cr->ncand_all = cr->nkept;
    cr->ids = malloc(cr->nkept * sizeof *cr->ids);
    cr->byid = malloc(cr->nkept * sizeof *cr->byid);
    cr->mark = malloc(cr->nkept * sizeof *cr->mark);
    if (!cr->ids || !cr->byid || !cr->mark)
        return STEP_OOM_ROLLBACK;
    for (i = 0; i < cr->nkept; i++) {
        struct claim_cursor *c = &cr->cur[x->cands[i].type_index];
        cr->ids[i] = x->cands[i].id;
        cr->byid[i] = (struct idpos){x->cands[i].id, i};
        c->id = x->cands[i].id; /* in dispatch order: the type's last one stays */
        c->prio = x->cands[i].priority;
    }
    sort_unless_sorted(cr->byid, cr->nkept, sizeof *cr->byid, idpos_cmp);
    cr->nmine = cr->nkept;
    /* A large claim is split (--claim-split): the claim helper locks and marks the
     * second half on its own connection while this thread does the first. The helper
     * keeps its lock read's whole result until the join: only when the last claim's
     * rows say that the claim's payloads are a small part of the byte budget. */
    if (x->db->opts.claim_split > 0 && cr->nkept >= x->db->opts.claim_split && cr->nkept >= 2 &&
        (cr->max_bytes == 0 ||
         (x->row_bytes_known && x->row_bytes <= cr->max_bytes / 4 / cr->nkept))) {
        size_t half = cr->nkept / 2;
        if (dsp_dbi_half_post(x->half, cr->ids + half, cr->nkept - half, x->epoch, cr->now_ms)) {
            cr->nmine = half;
            cr->half_posted = true;
        }
    }
    return STEP_OK;
}

/* Gives back a taken row: its payload is freed, it is not marked (it stays NEW; the
 * lock goes at the commit). */
static void claim_untake(struct claim_run *cr, struct cand *cd)
{
    free(cd->payload);
    cd->payload = NULL;
    cr->bytes -= cd->payload_len;
    cr->ntaken--;
    cd->locked = false;
    cd->cut = true;
}

/* Gives back the taken row of worst rank at or above evict_lo; false when there is none. */
static bool claim_evict_worst(struct claim_ctx *x, struct claim_run *cr)
{
    size_t i = cr->top;

    while (i > cr->evict_lo) {
        struct cand *cd = &x->cands[--i];
        if (!cd->locked)
            continue;
        claim_untake(cr, cd);
        if (i < cr->cut_rank)
            cr->cut_rank = i;
        cr->top = i;
        return true;
    }
    return false;
}

/* One row of a lock read: its candidate gets the rest of the row and the one copy of
 * its payload (the row itself is the connection's buffer, or the helper's result,
 * freed right after). The byte budget keeps the rows taken a prefix in dispatch order:
 * rows come in primary-key order, so a row past the budget gives back the taken rows
 * of worse rank first, and a row ranked after one cut for bytes is not taken. 0, or -1
 * out of memory. */
static int claim_take_row(struct claim_ctx *x, struct claim_run *cr, const struct idpos *byid,
                          size_t nbyid, MYSQL_ROW row, const unsigned long *len)
{
    struct cand *cd;
    long long a, ma;
    unsigned long plen;
    size_t rank;

    if (row[DSP_DB_SQL_LOCK_ID] == NULL ||
        (cd = claim_find(x, byid, nbyid, strtoull(row[DSP_DB_SQL_LOCK_ID], NULL, 10))) == NULL ||
        cd->seen)
        return 0;
    cd->seen = true;
    rank = (size_t)(cd - x->cands);
    a = row[DSP_DB_SQL_LOCK_ATTEMPTS] ? strtoll(row[DSP_DB_SQL_LOCK_ATTEMPTS], NULL, 10) : 0;
    ma = row[DSP_DB_SQL_LOCK_MAX_ATTEMPTS] ? strtoll(row[DSP_DB_SQL_LOCK_MAX_ATTEMPTS], NULL, 10)
                                           : 0;
    cd->attempts = a < 0 ? 0 : a > UINT32_MAX ? UINT32_MAX : (uint32_t)a;
    cd->max_attempts = ma < 0 ? 0 : ma > UINT32_MAX ? UINT32_MAX : (uint32_t)ma;
    cd->timeout_ms = row[DSP_DB_SQL_LOCK_TIMEOUT_MS]
                         ? strtoll(row[DSP_DB_SQL_LOCK_TIMEOUT_MS], NULL, 10)
                         : -1;
    /* A key longer than the column holds cannot come from the table; cut to none. */
    cd->has_group_key = row[DSP_DB_SQL_LOCK_GROUP_KEY] != NULL &&
                        len[DSP_DB_SQL_LOCK_GROUP_KEY] <= DSP_FAIR_KEY_MAX;
    cd->group_key_len = cd->has_group_key ? (uint8_t)len[DSP_DB_SQL_LOCK_GROUP_KEY] : 0;
    if (cd->group_key_len)
        memcpy(cd->group_key, row[DSP_DB_SQL_LOCK_GROUP_KEY], cd->group_key_len);
    /* A keyed row from the plain read: its type takes the fair read from the next claim
     * on (once per run of rows of one type). */
    if (cd->has_group_key && !cr->fair_read && x->fair != NULL &&
        cr->keyed_marked != (uint32_t)cd->type_index + 1) {
        cr->keyed_marked = (uint32_t)cd->type_index + 1;
        dsp_fair_saw_key(x->fair, cr->r->types[cd->type_index]);
    }
    plen = row[DSP_DB_SQL_LOCK_PAYLOAD] ? len[DSP_DB_SQL_LOCK_PAYLOAD] : 0;
    cr->seen_bytes += plen;
    cr->nseen++;
    if (cr->max_bytes && rank > cr->cut_rank) {
        cd->cut = true;
        return 0;
    }
    if (plen) {
        if ((cd->payload = malloc(plen)) == NULL)
            return -1;
        memcpy(cd->payload, row[DSP_DB_SQL_LOCK_PAYLOAD], plen);
    }
    cd->payload_len = plen;
    cd->locked = true;
    cr->bytes += plen;
    cr->ntaken++;
    if (rank >= cr->top)
        cr->top = rank + 1;
    while (cr->max_bytes && cr->bytes > cr->max_bytes && cr->ntaken > 1 &&
           claim_evict_worst(x, cr))
        ;
    return 0;
}

/* The rows tried among cands[from..to) that the lock read did not return: locked by
 * another transaction (or changed since the candidates' read). Counted, and (owe: the
 * rows the claim kept) each is owed to its type by claim_continue. */
static void claim_note_skipped(struct claim_ctx *x, struct claim_run *cr, size_t from, size_t to,
                               bool owe)
{
    for (size_t i = from; i < to; i++) {
        const struct cand *cd = &x->cands[i];
        if (cd->seen)
            continue;
        if (cr->skipped++ == 0)
            cr->first_skipped = cd->id;
        if (owe)
            cr->cur[cd->type_index].need++;
    }
}

/* Locks the candidates ids[0..n) by primary key (FOR UPDATE SKIP LOCKED, the state read
 * again under the lock) and takes their rows (claim_take_row), reading the result a row
 * at a time (mysql_use_result): a payload is held once, in its candidate, and the
 * budget is applied as the rows come. A candidate not returned (changed since the
 * candidates' read, or locked by another transaction) is left out of the claim. byid:
 * the candidates by id. */
static int claim_lock_ids(struct claim_ctx *x, struct claim_run *cr, const uint64_t *ids,
                          size_t n, const struct idpos *byid, size_t nbyid)
{
    dsp_db *db = x->db;
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = STEP_OK;

    dsp_strbuf_reset(&x->ids_csv);
    dsp_db_sql_id_csv(&x->ids_csv, ids, n);
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_claim_lock(&x->sql, &x->db->names, cr->now_ms, x->ids_csv.p, x->ids_csv.len);
    if (x->ids_csv.oom || x->sql.oom)
        return STEP_OOM_ROLLBACK;
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
        (res = mysql_use_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: locking: %s (error %u)",
                 x->c.err ? mysql_error(x->c.m) : "no result", x->c.err);
        return STEP_DB_ERROR;
    }
    if (mysql_num_fields(res) != DSP_DB_SQL_LOCK_NCOLS) {
        log_error(db->log, "claim: locking: %u columns, expected %d", mysql_num_fields(res),
                  DSP_DB_SQL_LOCK_NCOLS);
        mysql_free_result(res);
        return STEP_DB_ERROR;
    }
    /* Every row is read, even after a failure: the connection must be free again. */
    while ((row = mysql_fetch_row(res)) != NULL)
        if (rc == STEP_OK && claim_take_row(x, cr, byid, nbyid, row, mysql_fetch_lengths(res)) < 0)
            rc = STEP_OOM_ROLLBACK;
    if (mysql_errno(x->c.m) != 0) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: locking: reading rows: %s", mysql_error(x->c.m));
        rc = STEP_DB_ERROR;
    }
    mysql_free_result(res);
    return rc;
}

/* Lock: this thread's share of the kept rows, ids[0..nmine). */
static int claim_lock(struct claim_ctx *x, struct claim_run *cr)
{
    int rc = claim_lock_ids(x, cr, cr->ids, cr->nmine, cr->byid, cr->nkept);

    if (rc == STEP_OK)
        claim_note_skipped(x, cr, 0, cr->nmine, true);
    return rc;
}

/* Continue: the rows the lock read skipped (locked by another transaction: a user's
 * long SELECT ... FOR UPDATE on the oldest rows) are made up for from the rows after
 * them, in the same transaction: each type that lost some reads its candidates on from
 * the last one tried (dsp_claim_sql_candidates_after), locks them, and takes as many as
 * it lost, in dispatch order. Without this, every claim read the same locked head again
 * and the type stalled while the lock was held. Bounded: CONT_ROUNDS reads of at most
 * CONT_READ_MAX rows a part; none once the byte budget cut a row. The normal claim (no
 * row skipped) runs none of it. */
static int claim_continue(struct claim_ctx *x, struct claim_run *cr)
{
    dsp_db *db = x->db;
    struct claim_req *r = cr->r;
    const char **ptypes = NULL;
    uint16_t *pt = NULL;
    uint8_t *aprio = NULL;
    uint64_t *aid = NULL, *ids = NULL;
    uint32_t *got = NULL;
    struct idpos *byid = NULL;
    char *sel = NULL;
    int rc = STEP_OK;

    /* With the helper's half out, this reads on after the helper's rows too (the cursors
     * are the last kept of each type); only this thread's skipped rows are made up. */
    if (cr->skipped == 0)
        return STEP_OK;
    ptypes = calloc(r->ntypes, sizeof *ptypes);
    pt = calloc(r->ntypes, sizeof *pt);
    aprio = calloc(r->ntypes, sizeof *aprio);
    aid = calloc(r->ntypes, sizeof *aid);
    got = calloc(r->ntypes, sizeof *got);
    if (!ptypes || !pt || !aprio || !aid || !got) {
        rc = STEP_OOM_ROLLBACK;
        goto out;
    }
    for (unsigned round = 1; round <= CONT_ROUNDS && cr->cut_rank == SIZE_MAX; round++) {
        size_t np = 0, base = cr->ncand_all, nnew = 0, cap, p = 0, q;
        uint64_t lim = 0;
        MYSQL_RES *res;
        MYSQL_ROW row;
        int n;

        for (size_t t = 0; t < r->ntypes; t++) {
            struct claim_cursor *c = &cr->cur[t];
            uint64_t l;
            if (c->need == 0 || !c->more)
                continue;
            ptypes[np] = r->types[t];
            pt[np] = (uint16_t)t;
            aprio[np] = c->prio;
            aid[np++] = c->id;
            l = (uint64_t)c->need << round;
            lim = l > lim ? l : lim;
        }
        if (np == 0)
            break;
        if (lim > CONT_READ_MAX)
            lim = CONT_READ_MAX;
        cap = dsp_claim_sql_select_bound(ptypes, np);
        free(sel);
        if ((sel = malloc(cap)) == NULL) {
            rc = STEP_OOM_ROLLBACK;
            goto out;
        }
        n = dsp_claim_sql_candidates_after(sel, cap, ptypes, np, cr->now_ms, (unsigned)lim, aprio,
                                           aid, NULL, NULL, &db->names);
        if (n < 0) {
            log_error(db->log, "cannot build the claim's read past locked rows");
            rc = STEP_FAILED;
            goto out;
        }
        atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
        if (mysql_real_query(x->c.m, sel, (unsigned long)n) != 0 ||
            (res = mysql_store_result(x->c.m)) == NULL) {
            x->c.err = mysql_errno(x->c.m);
            log_warn(db->log, "claim: reading past locked rows: %s (error %u)",
                     x->c.err ? mysql_error(x->c.m) : "no result", x->c.err);
            rc = STEP_DB_ERROR;
            goto out;
        }
        if (mysql_num_fields(res) != DSP_CLAIM_SQL_CAND_COL_COUNT) {
            mysql_free_result(res);
            rc = STEP_DB_ERROR;
            goto out;
        }
        if (base + mysql_num_rows(res) > x->cands_cap) {
            size_t want = base + (size_t)mysql_num_rows(res);
            struct cand *nc = realloc(x->cands, want * sizeof *nc);
            if (nc == NULL) {
                mysql_free_result(res);
                rc = STEP_OOM_ROLLBACK;
                goto out;
            }
            x->cands = nc;
            x->cands_cap = want;
        }
        memset(got, 0, r->ntypes * sizeof *got);
        while ((row = mysql_fetch_row(res)) != NULL) {
            unsigned long *len = mysql_fetch_lengths(res);
            struct cand *cd;
            if (row[DSP_CLAIM_COL_TASK_ID] == NULL || row[DSP_CLAIM_COL_TASK_TYPE] == NULL)
                continue;
            q = claim_row_part(ptypes, np, p, row[DSP_CLAIM_COL_TASK_TYPE],
                               len[DSP_CLAIM_COL_TASK_TYPE]);
            if (q == np)
                continue; /* not byte for byte a type asked for: claim_select logs those */
            p = q;
            cd = &x->cands[base + nnew++];
            cand_fill(cd, row, pt[p]);
            got[pt[p]]++;
            cr->cur[pt[p]].id = cd->id;
            cr->cur[pt[p]].prio = cd->priority;
        }
        mysql_free_result(res);
        for (q = 0; q < np; q++)
            if (got[pt[q]] < lim)
                cr->cur[pt[q]].more = false; /* read to its end */
        if (nnew == 0)
            break;
        cr->ncand_all = base + nnew;

        free(ids);
        free(byid);
        ids = malloc(nnew * sizeof *ids);
        byid = malloc(nnew * sizeof *byid);
        if (!ids || !byid) {
            rc = STEP_OOM_ROLLBACK;
            goto out;
        }
        for (size_t i = 0; i < nnew; i++) {
            ids[i] = x->cands[base + i].id;
            byid[i] = (struct idpos){ids[i], base + i};
        }
        qsort(byid, nnew, sizeof *byid, idpos_cmp);
        if ((rc = claim_lock_ids(x, cr, ids, nnew, byid, nnew)) != STEP_OK)
            goto out;
        claim_note_skipped(x, cr, base, base + nnew, false);
        /* Each type takes as many as it lost, the best ranked; the rest this read locked
         * is given back (locked until the commit, not marked). */
        memset(got, 0, r->ntypes * sizeof *got);
        for (size_t i = base; i < base + nnew; i++) {
            struct cand *cd = &x->cands[i];
            if (!cd->locked)
                continue;
            if (got[cd->type_index] >= cr->cur[cd->type_index].need)
                claim_untake(cr, cd);
            else
                got[cd->type_index]++;
        }
        for (size_t t = 0; t < r->ntypes; t++)
            cr->cur[t].need -= got[t] < cr->cur[t].need ? got[t] : cr->cur[t].need;
    }
out:
    free(sel);
    free(ids);
    free(byid);
    free(ptypes);
    free(pt);
    free(aprio);
    free(aid);
    free(got);
    return rc;
}

/* Copy: the taken rows among cands[from..to) into the reply, in dispatch order; the
 * reply takes their payloads over. The reply has room for every candidate. */
static int claim_copy(struct claim_ctx *x, struct claim_run *cr, size_t from, size_t to)
{
    dsp_claim_reply *reply = cr->reply;
    size_t i;

    if (reply->tasks == NULL &&
        (reply->tasks = malloc((cr->ncand_all ? cr->ncand_all : 1) * sizeof *reply->tasks)) == NULL)
        return STEP_OOM_ROLLBACK;
    for (i = from; i < to; i++) {
        struct cand *cd = &x->cands[i];
        dsp_claimed_task *t = &reply->tasks[reply->ntasks];

        if (!cd->locked)
            continue;
        /* Every field but the key's bytes past group_key_len (not zeroed: 191 bytes a
         * row a keyless claim would pay for). */
        t->task_id = cd->id;
        t->claim_seq = 0;
        t->attempts = cd->attempts;
        t->max_attempts = cd->max_attempts;
        t->timeout_ms = cd->timeout_ms;
        t->priority = cd->priority;
        t->type_index = cd->type_index;
        t->payload_len = cd->payload_len;
        t->payload = cd->payload;
        cd->payload = NULL;
        t->has_group_key = cd->has_group_key;
        t->group_key_len = cd->group_key_len;
        if (cd->group_key_len)
            memcpy(t->group_key, cd->group_key, cd->group_key_len);
        reply->ntasks++;
    }
    return STEP_OK;
}

/* Mark: the rows locked here become PROCESSING under our epoch (one UPDATE ... IN), and
 * the transaction commits. Everything the reply needs of them is copied already. */
static int claim_mark(struct claim_ctx *x, struct claim_run *cr)
{
    dsp_db *db = x->db;
    uint64_t affected, seq = 0;
    size_t i;

    if (cr->ncand_all > cr->nkept) { /* claim_continue's rows */
        uint64_t *m = realloc(cr->mark, (cr->nmine + cr->ncand_all - cr->nkept) * sizeof *m);
        if (m == NULL)
            return STEP_OOM_ROLLBACK;
        cr->mark = m;
    }
    for (i = 0; i < cr->nmine; i++)
        if (x->cands[i].locked)
            cr->mark[cr->nmark++] = x->cands[i].id;
    for (i = cr->nkept; i < cr->ncand_all; i++)
        if (x->cands[i].locked)
            cr->mark[cr->nmark++] = x->cands[i].id;
    if (cr->nmark > 0) {
        /* Usually every row locked: the lock's list is the mark's (a set, in any order). */
        if (cr->nmark != cr->nmine || cr->ncand_all > cr->nkept) {
            dsp_strbuf_reset(&x->ids_csv);
            dsp_db_sql_id_csv(&x->ids_csv, cr->mark, cr->nmark);
        }
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_claim_mark(&x->sql, &x->db->names, x->epoch, dsp_wall_ms(), x->ids_csv.p,
                              x->ids_csv.len);
        if (x->ids_csv.oom || x->sql.oom)
            return STEP_OOM_ROLLBACK;
        if (dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &affected) < 0)
            return STEP_DB_ERROR;
        if (affected != cr->nmark)
            log_error(db->log, "claim marked %" PRIu64 " row(s) of %zu kept", affected, cr->nmark);
        /* The list recovery reads (task_claim), in the same transaction as the mark. */
        int rc = dsp_dbi_claim_list(db, &x->c, &x->sql, x->epoch, x->ids_csv.p, x->ids_csv.len,
                                    &seq);
        if (rc == -2)
            return STEP_OOM_ROLLBACK;
        if (rc < 0)
            return STEP_DB_ERROR;
        /* The fencing write, last: the lease row stays locked only until the COMMIT. On
         * Galera a deposed leader's claim then fails certification against the
         * takeover's write of that row (docs/replication.md). */
        rc = dsp_dbi_lease_fence(db, &x->c, x->epoch);
        if (rc < 0)
            return STEP_DB_ERROR;
        if (rc == 0)
            return STEP_FENCED;
    }
    if (commit(&x->c) < 0) {
        /* The commit may have happened: after reconnecting, these rows go back to NEW
         * if the epoch is still ours (their task_claim row waits for the next leader).
         * A conflict (Galera's certification) is a rollback for sure: do_claim runs the
         * transaction again. */
        if (!dsp_dbi_error_is_conflict(x->c.err))
            claim_release_later(x, cr->mark, cr->nmark);
        return STEP_DB_ERROR;
    }
    if (seq) {
        /* Before the reply reaches the loop, so that no outcome of these rows is
         * written before the claim is known. Out of memory, the row is never deleted
         * by us: the next leader's recovery finds its rows finished and deletes it. */
        for (i = 0; i < cr->reply->ntasks; i++)
            cr->reply->tasks[i].claim_seq = seq;
        if (dsp_dbi_claims_open(db, x->epoch, seq, (uint32_t)cr->nmark) < 0)
            log_error(db->log, "out of memory noting claim %" PRIu64, seq);
    }
    return STEP_OK;
}

/* Waits for the helper's half. With `keep`, its rows join the reply after ours;
 * without (this claim failed), or when they cannot be copied, the rows it may have
 * marked go back to NEW at the next step. */
static void claim_join(struct claim_ctx *x, struct claim_run *cr, bool keep)
{
    MYSQL_RES *res;
    uint64_t *ids;
    size_t n, was;
    int rc;

    if (!cr->half_posted)
        return;
    cr->half_posted = false;
    rc = dsp_dbi_half_wait(x->half, &res, &ids, &n);
    if (rc == DSP_HALF_CLAIMED && keep) {
        uint64_t seq = dsp_dbi_half_seq(x->half);
        MYSQL_ROW row;
        bool oom = false;
        size_t nback = 0;
        was = cr->reply->ntasks;
        /* Its rows join under the same budget; ours (claim_continue's too, ranked from
         * nkept on) are in the reply already: only its own may be given back. */
        cr->evict_lo = cr->nmine;
        cr->top = cr->nkept;
        while (res && (row = mysql_fetch_row(res)) != NULL)
            if (!oom && claim_take_row(x, cr, cr->byid, cr->nkept, row, mysql_fetch_lengths(res)) < 0)
                oom = true;
        claim_note_skipped(x, cr, cr->nmine, cr->nkept, false);
        if (oom || claim_copy(x, cr, cr->nmine, cr->nkept) != STEP_OK) {
            log_error(x->db->log, "out of memory copying a claim's second half; releasing it");
            for (size_t i = was; i < cr->reply->ntasks; i++) {
                free(cr->reply->tasks[i].payload);
                cr->reply->tasks[i].payload = NULL;
            }
            cr->reply->ntasks = was;
            keep = false;
        } else {
            for (size_t i = was; i < cr->reply->ntasks; i++)
                cr->reply->tasks[i].claim_seq = seq;
            /* Rows the helper marked that the budget left out: back to NEW at the next
             * step, as for a half that could not be copied. */
            for (size_t i = 0; i < n; i++) {
                struct cand *cd = claim_find(x, cr->byid, cr->nkept, ids[i]);
                if (cd == NULL || !cd->locked)
                    ids[nback++] = ids[i];
            }
            claim_release_later(x, ids, nback);
        }
    }
    if (rc != DSP_HALF_NONE && !keep)
        claim_release_later(x, ids, n);
    if (res)
        mysql_free_result(res);
    free(ids);
}

/* The payloads no reply took (rows cut, or a claim that failed). */
static void claim_cands_free(struct claim_ctx *x, struct claim_run *cr)
{
    for (size_t i = 0; i < cr->ncand_all; i++) {
        free(x->cands[i].payload);
        x->cands[i].payload = NULL;
    }
    cr->ncand_all = 0;
}

static void claim_run_free(struct claim_run *cr)
{
    if (cr->res)
        mysql_free_result(cr->res);
    free(cr->cur);
    dsp_claim_reply_free(cr->reply);
    free(cr->ids);
    free(cr->byid);
    free(cr->mark);
    free(cr->ptypes);
    free(cr->pindex);
    free(cr->taken);
}

/* Answers a claim that failed at step rc with a failure. Returns 0, or -1 when the
 * connection is no longer to be trusted. */
static int claim_run_fail(struct claim_ctx *x, struct claim_run *cr, int rc)
{
    dsp_db *db = x->db;
    bool db_error = rc == STEP_DB_ERROR;

    claim_join(x, cr, false);
    claim_cands_free(x, cr);
    if (rc == STEP_OOM_ROLLBACK || rc == STEP_FENCED) {
        if (rc == STEP_OOM_ROLLBACK)
            log_error(db->log, "out of memory during a claim; rolling it back");
        else
            log_error(db->log, "claim: the lease row is no longer this dispatcher's (epoch %u);"
                               " rolled back, nothing delivered", (unsigned)x->epoch);
        if (cr->res) {
            mysql_free_result(cr->res);
            cr->res = NULL;
        }
        if (dsp_dbi_exec_str(&x->c, "ROLLBACK") < 0)
            db_error = true;
    } else if (rc == STEP_OOM) {
        log_error(db->log, "out of memory during a claim");
    }
    if (cr->res)
        mysql_free_result(cr->res);
    cr->res = NULL;
    dsp_claim_reply_free(cr->reply);
    cr->reply = NULL;
    claim_fail(db, cr->r);
    claim_run_free(cr);
    if (rc == STEP_FENCED)
        dsp_dbi_lease_deposed(db); /* after the rollback: the row is the new holder's */
    return db_error ? -1 : 0;
}

static bool claim_may_lead(struct claim_ctx *x);

/* The steps of one try of a claim transaction after its plan, up to its COMMIT. */
static int claim_steps(struct claim_ctx *x, struct claim_run *cr)
{
    int rc = claim_select(x, cr);

    if (rc == STEP_OK)
        rc = claim_merge(x, cr);
    if (rc == STEP_OK && cr->nkept > 0) {
        rc = claim_index(x, cr);
        if (rc == STEP_OK)
            rc = claim_lock(x, cr);
        if (rc == STEP_OK)
            rc = claim_continue(x, cr);
        if (rc == STEP_OK)
            rc = claim_copy(x, cr, 0, cr->nmine);
        if (rc == STEP_OK)
            rc = claim_copy(x, cr, cr->nkept, cr->ncand_all);
    }
    if (rc == STEP_OK)
        rc = claim_mark(x, cr);
    return rc;
}

/* Runs one claim transaction for r and answers it: plan, select, merge, then index
 * (maybe handing the second half to the helper), lock, copy and mark our half, and
 * join the helper's. A transaction a conflict aborted (Galera's certification failure or
 * a deadlock, 1213; a lock wait timeout, 1205) is rolled back and run again on the same
 * connection, up to DSP_DBI_CONFLICT_TRIES times: nothing of it reached the loop (the
 * reply is posted only after COMMIT returned OK).
 * Returns 0, or -1 on a database error (answered with a failure; the caller
 * reconnects). */
static int do_claim(struct claim_ctx *x, struct claim_req *r)
{
    dsp_db *db = x->db;
    struct claim_run cr;
    int rc;

    for (unsigned tries = 1;; tries++) {
        memset(&cr, 0, sizeof cr);
        x->c.err = 0;
        cr.r = r;
        cr.now_ms = dsp_wall_ms();
        rc = claim_plan(x, &cr);
        if (rc == STEP_OK && (cr.nparts == 0 || cr.limit == 0)) {
            claim_answer(db, r, cr.reply); /* nothing to ask for: an empty success */
            cr.reply = NULL;
            claim_run_free(&cr);
            return 0;
        }
        if (rc == STEP_OK)
            rc = claim_steps(x, &cr);
        if (rc != STEP_DB_ERROR || !dsp_dbi_error_is_conflict(x->c.err) ||
            tries >= DSP_DBI_CONFLICT_TRIES || !claim_may_lead(x))
            break;
        /* The helper's half committed on its own: its rows go back to NEW before the
         * next claim (claim_join without keep). */
        claim_join(x, &cr, false);
        claim_cands_free(x, &cr);
        claim_run_free(&cr);
        if (dsp_dbi_conflict_retry(&x->c, tries) < 0) {
            claim_fail(db, r);
            return -1;
        }
    }
    if (rc != STEP_OK)
        return claim_run_fail(x, &cr, rc);
    claim_join(x, &cr, true);
    claim_cands_free(x, &cr);
    if (cr.cut_rank != SIZE_MAX)
        cr.reply->more = true;
    /* A fair claim cut short by its rotation: claim again at once. Not when it took no
     * row (every row it read was locked by another transaction, say): the loop then
     * waits as after an empty claim rather than spinning on the same rows. */
    if (cr.fair_short && cr.reply->ntasks > 0)
        cr.reply->more = true;
    if (cr.nseen > 0) {
        x->row_bytes = cr.seen_bytes / cr.nseen;
        x->row_bytes_known = true;
    }
    /* Rows locked by another transaction: counted, and logged once while it lasts. */
    if (cr.skipped > 0) {
        atomic_fetch_add_explicit(&db->claim_skipped, cr.skipped, memory_order_relaxed);
        if (!x->skip_logged)
            log_warn(db->log,
                     "claim: %zu row(s) locked by another transaction were skipped (e.g. task %" PRIu64
                     "); claims read past them while they stay locked"
                     " (db.claim_skipped_locked_total)",
                     cr.skipped, cr.first_skipped);
        x->skip_logged = true;
    } else if (x->skip_logged && cr.nmine > 0) {
        log_info(db->log, "claims no longer find rows locked by another transaction");
        x->skip_logged = false;
    }

    cr.reply->duration_us = dsp_now_us() - cr.t0;
    atomic_fetch_add_explicit(&db->claims, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->claimed_rows, cr.reply->ntasks, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->claim_us_total, (uint64_t)cr.reply->duration_us,
                              memory_order_relaxed);
    claim_answer(db, r, cr.reply);
    cr.reply = NULL;
    claim_run_free(&cr);
    return 0;
}

/* The lane sweeps, when due: demote at most once a second; promote when the earliest
 * delayed row (as last read, or as the write thread reported for retries it wrote) is
 * due, at most every PROMOTE_GAP_MS. Returns 0 or -1 (database error). */
static int sweeps(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    int64_t now_m = dsp_now_ms(), now_w = dsp_wall_ms(), due, taken_due = INT64_MAX;
    bool promote, demote, refresh;
    uint64_t n, v;
    bool isnull;
    /* A shard's sweeps carry its type list: sized for it, in the claim's buffer. */
    size_t cap = 256 + DSP_TABLE_NAME_MAX + (db->in ? db->type_in.len : 0);
    char *sql;

    dsp_strbuf_reset(&x->sql);
    if (!dsp_strbuf_reserve(&x->sql, cap))
        return -1;
    sql = x->sql.p;

    pthread_mutex_lock(&db->mu);
    due = db->retry_due_ms < x->next_due_wall ? db->retry_due_ms : x->next_due_wall;
    promote = now_w >= due && now_m >= x->last_promote + PROMOTE_GAP_MS;
    if (promote) {
        /* Retries written from now on raise it again; the MIN below covers the rest. */
        taken_due = db->retry_due_ms;
        db->retry_due_ms = INT64_MAX;
    }
    pthread_mutex_unlock(&db->mu);
    demote = now_m >= x->next_demote;
    if (!promote && !demote)
        return 0;
    refresh = promote || now_m >= x->next_refresh;
    /* Galera: each sweep UPDATE's rows are one transaction's (wsrep_max_ws_rows). */
    unsigned limit = SWEEP_LIMIT;
    if (x->c.ws_max_rows > 0 && x->c.ws_max_rows - 1 < limit)
        limit = x->c.ws_max_rows > 1 ? (unsigned)x->c.ws_max_rows - 1 : 1;

    if (demote) {
        x->next_demote = now_m + DEMOTE_EVERY_MS;
        do {
            if (dsp_claim_sql_demote_in(sql, cap, dsp_wall_ms(), limit, db->in,
                                         &db->names) < 0 ||
                dsp_dbi_exec(&x->c, sql, strlen(sql), &n) < 0)
                goto fail;
            if (n)
                refresh = true; /* new rows in the delayed lane */
            if (n >= limit && commit(&x->c) < 0)
                goto fail;
        } while (n >= limit);
    }
    if (promote) {
        x->last_promote = now_m;
        do {
            if (dsp_claim_sql_promote_in(sql, cap, dsp_wall_ms(), limit, db->in,
                                          &db->names) < 0 ||
                dsp_dbi_exec(&x->c, sql, strlen(sql), &n) < 0)
                goto fail;
            if (n >= limit && commit(&x->c) < 0)
                goto fail;
        } while (n >= limit);
    }
    if (refresh) {
        snprintf(sql, cap, "SELECT MIN(run_after) FROM %s WHERE `delayed` = 1%s", db->names.task,
                 db->in ? db->in : "");
        if (dsp_dbi_query_u64(&x->c, sql, &v, &isnull, 0) < 0)
            goto fail;
        /* run_after is a signed BIGINT: the cast gives back a negative value. */
        x->next_due_wall = isnull ? INT64_MAX : (int64_t)v;
        x->next_refresh = now_m + DUE_REFRESH_MS;
    }
    if (commit(&x->c) < 0)
        goto fail;
    return 0;

fail:
    if (taken_due != INT64_MAX) {
        pthread_mutex_lock(&db->mu);
        if (taken_due < db->retry_due_ms)
            db->retry_due_ms = taken_due;
        pthread_mutex_unlock(&db->mu);
    }
    return -1;
}

/* Whether this thread may still act as the leader of epoch (db_lease.c's gate). */
static bool claim_may_lead(struct claim_ctx *x)
{
    uint64_t id = x->c.m ? (uint64_t)mysql_thread_id(x->c.m) : 0;
    return dsp_dbi_lease_gate(x->db, LEASE_CONN_CLAIM, id, x->lease_gen, x->epoch) == 0;
}

/* Waits for a claim request or a sweep, and runs them. Returns 0, or -1 on a database
 * error (the caller reconnects). */
static int serve(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    struct claim_req *r = NULL;

    pthread_mutex_lock(&db->mu);
    for (;;) {
        int64_t now_m, now_w, due, at, wake;

        if (db->stop_claims || db->claim_exit)
            break;
        if ((r = db->req) != NULL) {
            db->req = NULL;
            break;
        }
        now_m = dsp_now_ms();
        now_w = dsp_wall_ms();
        due = db->retry_due_ms < x->next_due_wall ? db->retry_due_ms : x->next_due_wall;
        if (due == INT64_MAX)
            at = INT64_MAX;
        else if (due <= now_w)
            at = now_m;
        else
            at = now_m + (due - now_w < 3600000 ? due - now_w : 3600000);
        if (at < x->last_promote + PROMOTE_GAP_MS)
            at = x->last_promote + PROMOTE_GAP_MS;
        wake = at < x->next_demote ? at : x->next_demote;
        if (now_m >= wake || !db->lease.held)
            break;
        cond_wait_until(&db->claim_cv, &db->mu, wake);
    }
    pthread_mutex_unlock(&db->mu);
    /* Leadership (db_lease.c): a leader whose lease is gone claims and sweeps nothing;
     * claim_step steps down. */
    if (!claim_may_lead(x)) {
        if (r)
            claim_fail(db, r);
        return 0;
    }
    /* Rows of a claim the loop was not told of (the helper's half of a failed claim, or
     * an unconfirmed commit of the helper's) go back to NEW before the next claim. */
    if (x->nrelease > 0 && release_unknown(x) < 0) {
        if (r)
            claim_fail(db, r);
        return -1;
    }
    if (r && do_claim(x, r) < 0)
        return -1;
    if (claim_stopping(db))
        return 0;
    x->c.err = 0;
    if (sweeps(x) == 0)
        return 0;
    /* A conflict rolled the sweep back: the connection is fine, and the sweep runs again
     * when next due (a demote within DEMOTE_EVERY_MS, a promote after PROMOTE_GAP_MS). */
    if (dsp_dbi_error_is_conflict(x->c.err) && dsp_dbi_conflict_retry(&x->c, 1) == 0)
        return 0;
    return -1;
}

/* ---- the claim thread's states (see the opening comment) ---- */

/* The first connect was refused for the login or the database: posts MSG_FATAL (the
 * loop logs it and exits 1). Later, the same errors are retried: a password being
 * rotated, or a database being restored, must not stop a running dispatcher. */
static enum claim_state claim_config_error(struct claim_ctx *x)
{
    const dsp_db_url *u = x->db->opts.url;
    struct msg *m = dsp_dbi_msg_new(MSG_FATAL);
    char text[640];

    snprintf(text, sizeof text, "database %s on %s refused taskpushd: %s (MySQL error %u): %s",
             u->dbname, u->host ? u->host : "(default)", x->c.errtext, x->c.err,
             x->c.err == ER_BAD_DB_ERROR_ ? "check DBNAME of --db, or create the database and load sql/schema.sql"
             : x->c.err == ER_DBACCESS_DENIED_ERROR_ ? "grant the user access to the database, or check --db"
                                                      : "check the user and password of --db (or TASKPUSH_DB_PASSWORD)");
    if (m) {
        m->text = strdup(text);
        dsp_dbi_post(x->db, m);
    }
    x->fatal = true;
    return CLAIM_FATAL;
}

static enum claim_state claim_on_connect(struct claim_ctx *x)
{
    if (dsp_dbi_conn_open(&x->c, false, false) < 0) {
        dsp_dbi_set_conn_ok(x->db, CONN_CLAIM, false);
        if (!x->c.ever_connected && dsp_dbi_error_is_config(x->c.err))
            return claim_config_error(x);
        claim_idle(x, dsp_dbi_backoff_next(&x->c));
        return CLAIM_CONNECT;
    }
    dsp_dbi_set_conn_ok(x->db, CONN_CLAIM, true);
    return x->fatal ? CLAIM_FATAL : CLAIM_SCHEMA;
}

static enum claim_state claim_on_schema(struct claim_ctx *x)
{
    int rc = check_schema(x);

    if (rc < 0)
        return CLAIM_DROP;
    if (rc == 0) {
        claim_idle(x, SCHEMA_RETRY_MS);
        return x->fatal ? CLAIM_FATAL : CLAIM_SCHEMA;
    }
    return x->have_lock ? CLAIM_CONFIRM : CLAIM_LEASE;
}

/* Waits for the lease (see the opening comment). */
static enum claim_state claim_on_lease(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t id = x->c.m ? (uint64_t)mysql_thread_id(x->c.m) : 0;
    int g;

    dsp_dbi_lease_want(db, true);
    g = dsp_dbi_lease_gate(db, LEASE_CONN_CLAIM, id, 0, 0);
    if (g == 0) {
        x->lease_gen = dsp_dbi_lease_gen(db);
        return CLAIM_LOCK;
    }
    if (g < 0 && x->announced) {
        x->announced = false;
        x->nrelease = 0;
        dsp_dbi_leadership_end(db);
    }
    if (g < 0) {
        /* A standby is healthy only while it could take over: its schema read just
         * worked, and it reads it again every SCHEMA_RETRY_MS. */
        drops_end(x);
        if (dsp_now_ms() >= x->next_schema)
            return CLAIM_SCHEMA;
    }
    claim_idle_for(x, 1000, id);
    return x->fatal ? CLAIM_FATAL : CLAIM_LEASE;
}

/* The lease is gone: stop leading and let the lock go (a standby needs it), then wait
 * for the lease again. */
static enum claim_state claim_step_down(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t v;
    bool isnull;

    x->announced = false;
    x->nrelease = 0; /* whoever leads next recovers them */
    dsp_dbi_leadership_end(db);
    if (x->have_lock) {
        if (dsp_dbi_query_u64(&x->c, db->release_lock_sql.p, &v, &isnull, 0) < 0 || commit(&x->c) < 0)
            return CLAIM_DROP; /* closing the connection lets the lock go too */
        x->have_lock = false;
        log_info(db->log, "released the table's lock");
    }
    return CLAIM_LEASE;
}

static enum claim_state claim_on_lock(struct claim_ctx *x)
{
    uint64_t e;
    int rc = take_lock(x); /* waits up to LOCK_TRY_S on the server */

    if (rc < 0)
        return CLAIM_DROP;
    if (rc == 1)
        return CLAIM_CONFIRM;
    /* Lost the lock with the old connection; if the epoch moved on meanwhile,
     * another dispatcher took the table and recovered our rows. */
    if (x->announced) {
        if (read_meta_epoch(x, &e) < 0)
            return CLAIM_DROP;
        if (e != x->epoch)
            leadership_lost(x);
    }
    claim_idle(x, 0);
    if (x->fatal)
        return CLAIM_FATAL;
    /* Holding the lock here means the version read again under it was not one to use. */
    return x->have_lock ? CLAIM_SCHEMA : CLAIM_LEASE;
}

static enum claim_state claim_on_confirm(struct claim_ctx *x)
{
    int rc;

    if (dsp_dbi_lease_gate(x->db, LEASE_CONN_CLAIM, x->c.m ? (uint64_t)mysql_thread_id(x->c.m) : 0,
                           x->lease_gen, 0) < 0)
        return claim_step_down(x);
    rc = confirm_leadership(x);

    if (rc < 0)
        return CLAIM_DROP;
    if (rc == 0) {
        claim_idle(x, SCHEMA_RETRY_MS);
        return x->fatal ? CLAIM_FATAL : CLAIM_SCHEMA;
    }
    return CLAIM_SERVE;
}

static enum claim_state claim_on_fatal(struct claim_ctx *x)
{
    claim_idle(x, 60000); /* the loop exits on on_fatal; wait for dsp_db_stop */
    return CLAIM_FATAL;
}

static enum claim_state claim_on_drop(struct claim_ctx *x)
{
    unsigned e = x->c.m ? mysql_errno(x->c.m) : 0;
    int64_t wait;

    if (e)
        snprintf(x->drop_text, sizeof x->drop_text, "%s (error %u)", mysql_error(x->c.m), e);
    else
        snprintf(x->drop_text, sizeof x->drop_text, "error %u", x->c.err);
    if (x->drops < UINT_MAX)
        x->drops++;
    /* A statement that fails every time (a missing index, a revoked privilege) must
     * not make a reconnect and a screen of log every 100 ms: the streak's backoff keeps
     * growing across reconnects (dsp_dbi_conn_open resets the connection's), and only
     * the streak's 1st, 2nd, 4th, 8th ... drop is logged as a warning. */
    if (dsp_dbi_streak_loud(x->drops))
        log_warn(x->db->log, "claim connection: reconnecting (%u in a row): %s", x->drops, x->drop_text);
    else
        log_debug(x->db->log, "claim connection: reconnecting (%u in a row)", x->drops);
    claim_health(x);
    claim_drop(x);
    x->c.quiet = x->drops >= 2; /* this line reports the streak from now on */
    x->c.backoff_ms = x->drop_backoff;
    wait = dsp_dbi_backoff_next(&x->c);
    x->drop_backoff = x->c.backoff_ms;
    claim_idle(x, wait);
    return CLAIM_CONNECT;
}

/* Recovery while leading: rows PROCESSING under an older epoch that a stale leader
 * committed late (after the recovery at takeover) must not stay stranded. */
static enum claim_state claim_recover_again(struct claim_ctx *x)
{
    uint64_t id;
    bool isnull;
    int rc;

    x->next_recover = dsp_now_ms() + RECOVER_EVERY_MS;
    if (!x->recovered_once) {
        /* The takeover's pass, after --adopt-grace-ms: every shard's rows. */
        rc = recover(x, true);
        x->recovered_once = rc == 0;
        return rc < 0 ? CLAIM_DROP : CLAIM_SERVE;
    }
    /* A plain read first: the UPDATE's locks would meet the write thread's. */
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_claim_log_probe(&x->sql, &x->db->names, x->epoch, x->db->shard);
    if (x->sql.oom)
        return CLAIM_SERVE;
    rc = dsp_dbi_query_u64(&x->c, x->sql.p, &id, &isnull, 0);
    if (rc < 0 || commit(&x->c) < 0)
        return CLAIM_DROP;
    if (rc == 1)
        return CLAIM_SERVE;
    return recover(x, false) < 0 ? CLAIM_DROP : CLAIM_SERVE;
}

/* Runs x->sql, a query of task ids, into x->recover_ids (at most ORPHAN_STEP_ROWS).
 * Returns how many, or -1 on a database error. */
static long orphan_ids(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    MYSQL_RES *res;
    MYSQL_ROW row;
    size_t n = 0;

    if (x->recover_cap < ORPHAN_STEP_ROWS) {
        uint64_t *p = realloc(x->recover_ids, ORPHAN_STEP_ROWS * sizeof *p);
        if (p == NULL)
            return 0; /* tried again at the next pass */
        x->recover_ids = p;
        x->recover_cap = ORPHAN_STEP_ROWS;
    }
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
        (res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "orphan scan: %s (error %u)", mysql_error(x->c.m), x->c.err);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL && n < ORPHAN_STEP_ROWS)
        if (row[0])
            x->recover_ids[n++] = strtoull(row[0], NULL, 10);
    mysql_free_result(res);
    return (long)n;
}

/* One step of the orphan scan (db_sql.h): the next ORPHAN_STEP_ROWS rows of the table
 * by primary key; the orphans among them unchanged for --task-timeout-ms go back to NEW
 * (or FAILED, recovery's rule). No index tells PROCESSING from SUCCESSFUL rows (the
 * claim lane puts them together), so the scan reads the table: a step reads a bounded
 * range with plain reads (no lock), the next waits ORPHAN_REST_FACTOR times as long as
 * it took (at most a tenth of the claim connection's time), and a whole pass starts every
 * half of --task-timeout-ms (1 s to 60 s). So an orphan runs again about 1.5 x
 * --task-timeout-ms after its last change on a table a pass reads in that time. Only the
 * orphans found are locked, skipping any another transaction holds (found again at a
 * later pass). Runs only after this epoch's first recovery, i.e. after
 * --adopt-grace-ms: the rows that workers of an older epoch declare are adopted (moved
 * to this epoch) first. */
static enum claim_state claim_orphans(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    int64_t t0 = dsp_now_ms(), age = db->opts.orphan_age_ms > 0 ? db->opts.orphan_age_ms : 60000;
    int64_t pass = age / 2 < 1000 ? 1000 : age / 2 > 60000 ? 60000 : age / 2;
    uint64_t count = 0, hi = 0, n = 0;
    dsp_db_sql_orphan o = {.epoch = x->epoch, .older_than_ms = dsp_wall_ms() - age, .in = db->in};
    bool isnull;
    MYSQL_RES *res;
    MYSQL_ROW row;
    long found;

    x->next_orphan = t0 + pass;
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_orphan_range(&x->sql, &x->db->names, x->orphan_after, ORPHAN_STEP_ROWS);
    if (x->sql.oom)
        return CLAIM_SERVE;
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
        (res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "orphan scan: %s (error %u)", mysql_error(x->c.m), x->c.err);
        return CLAIM_DROP;
    }
    row = mysql_num_fields(res) == 2 ? mysql_fetch_row(res) : NULL;
    if (row && row[0] && row[1]) {
        count = strtoull(row[0], NULL, 10);
        hi = strtoull(row[1], NULL, 10);
    }
    mysql_free_result(res);
    if (count > 0 && hi > x->orphan_after) {
        /* The counter first: an epoch above it was never handed out. */
        char csql[64 + DSP_TABLE_IDENT_CAP];
        snprintf(csql, sizeof csql, "SELECT value FROM %s WHERE name = 'epoch'", x->db->names.meta);
        if (dsp_dbi_query_u64(&x->c, csql, &o.counter, &isnull, 0) != 0 || isnull)
            return commit(&x->c) < 0 ? CLAIM_DROP : CLAIM_SERVE;
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_orphan_select(&x->sql, &x->db->names, &o, x->orphan_after, hi, ORPHAN_STEP_ROWS,
                                 NULL, 0);
        if (x->sql.oom || (found = orphan_ids(x)) < 0)
            return x->sql.oom ? CLAIM_SERVE : CLAIM_DROP;
        if (found > 0) {
            dsp_strbuf_reset(&x->sql);
            dsp_db_sql_orphan_select(&x->sql, &x->db->names, &o, 0, 0, 0, x->recover_ids,
                                     (size_t)found);
            if (x->sql.oom || (found = orphan_ids(x)) < 0)
                return x->sql.oom ? CLAIM_SERVE : CLAIM_DROP;
        }
        if (found > 0) {
            dsp_strbuf_reset(&x->sql);
            dsp_db_sql_orphan_recover(&x->sql, &x->db->names, &o, dsp_wall_ms(), x->recover_ids,
                                      (size_t)found);
            if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0)
                return x->sql.oom ? CLAIM_SERVE : CLAIM_DROP;
        }
    }
    if (commit(&x->c) < 0)
        return CLAIM_DROP;
    if (n > 0) {
        atomic_fetch_add_explicit(&db->orphans_recovered, n, memory_order_relaxed);
        log_warn(db->log,
                 "put back %" PRIu64 " PROCESSING row(s) that no dispatcher held (task ids %" PRIu64
                 " to %" PRIu64 "; written PROCESSING by something other than taskpushd?)",
                 n, x->orphan_after + 1, hi);
    }
    if (count >= ORPHAN_STEP_ROWS && hi > x->orphan_after) {
        int64_t spent = dsp_now_ms() - t0;
        x->orphan_after = hi; /* more to read in this pass */
        x->next_orphan = dsp_now_ms() + (spent > 0 ? spent * ORPHAN_REST_FACTOR : 1);
    } else {
        x->orphan_after = 0; /* the pass is over */
    }
    return CLAIM_SERVE;
}

/* Runs the current state's step and returns the next state. DROP runs at once, in
 * the same step: the connection it closes is broken. */
static enum claim_state claim_step(struct claim_ctx *x)
{
    enum claim_state next = CLAIM_DROP;

    switch (x->state) {
    case CLAIM_CONNECT:
        next = claim_on_connect(x);
        break;
    case CLAIM_SCHEMA:
        next = claim_on_schema(x);
        break;
    case CLAIM_LEASE:
        next = claim_on_lease(x);
        break;
    case CLAIM_LOCK:
        next = claim_on_lock(x);
        break;
    case CLAIM_CONFIRM:
        next = claim_on_confirm(x);
        if (next == CLAIM_SERVE)
            x->serve_since = dsp_now_ms();
        break;
    case CLAIM_SERVE:
        if (dsp_dbi_conn_stale(&x->c)) { /* between claims: off to the server in use */
            claim_drop(x);
            next = CLAIM_CONNECT;
        } else if (!claim_may_lead(x))
            next = claim_step_down(x);
        else if (dsp_now_ms() >= x->next_recover)
            next = claim_recover_again(x);
        else if (x->recovered_once && dsp_now_ms() >= x->next_orphan)
            next = claim_orphans(x);
        else
            next = serve(x) == 0 ? CLAIM_SERVE : CLAIM_DROP;
        if (next == CLAIM_SERVE && dsp_now_ms() - x->serve_since >= DROPS_CLEAR_MS)
            drops_end(x);
        break;
    case CLAIM_FATAL:
        next = claim_on_fatal(x);
        break;
    case CLAIM_DROP:
        break;
    }
    if (next == CLAIM_DROP)
        next = claim_on_drop(x);
    return next;
}

/* After dsp_db_stop: hold the lock until the write thread has written everything,
 * then let it go. */
static void claim_finish(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    struct claim_req *r;

    pthread_mutex_lock(&db->mu);
    db->accepting = false;
    while (!db->claim_exit)
        pthread_cond_wait(&db->claim_cv, &db->mu);
    r = db->req;
    db->req = NULL;
    pthread_mutex_unlock(&db->mu);
    if (r)
        claim_fail(db, r);
    if (x->c.m) {
        if (x->have_lock) {
            uint64_t v;
            bool isnull;
            if (dsp_dbi_query_u64(&x->c, db->release_lock_sql.p, &v, &isnull, 0) == 0)
                log_debug(db->log, "released the table's lock");
        }
        dsp_dbi_conn_close(&x->c);
    }
    atomic_store(&db->leader, false);
    dsp_dbi_set_conn_ok(db, CONN_CLAIM, false);
}

void *dsp_dbi_claim_main(void *arg)
{
    dsp_db *db = arg;
    struct claim_ctx x;
    enum claim_state was;

    memset(&x, 0, sizeof x);
    x.db = db;
    x.c.db = db;
    x.c.who = "claim";
    x.c.rng = (uint64_t)dsp_now_us() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)&x;
    if (x.c.rng == 0)
        x.c.rng = 1;
    x.state = CLAIM_CONNECT;
    mysql_thread_init();
    if ((x.fair = dsp_fair_new()) == NULL)
        log_error(db->log, "out of memory: claims fail until a restart");
    if (db->opts.claim_split > 0 && (x.half = dsp_dbi_half_start(db)) == NULL)
        log_warn(db->log, "cannot start the claim helper; every claim runs on one connection");

    while (!claim_stopping(db)) {
        /* Forward through the setup the steps run back to back; every other step
         * waited, and dsp_db_stop is looked at again. */
        do {
            was = x.state;
            x.state = claim_step(&x);
        } while (x.state > was && x.state <= CLAIM_SERVE);
    }

    dsp_dbi_half_stop(x.half);
    claim_finish(&x);
    dsp_strbuf_free(&x.sql);
    dsp_strbuf_free(&x.ids_csv);
    free(x.release_ids);
    free(x.recover_ids);
    free(x.cands);
    dsp_fair_free(x.fair);
    mysql_thread_end();
    return NULL;
}
