/* db: see db.h.
 *
 * Three threads, each with its own MySQL connection, and the loop thread:
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
#include "db.h"

#include "claim_sql.h"
#include "db_sql.h"
#include "migrate.h"

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
#include <time.h>

/* Every blocking client call ends within these (seconds): a dead server costs a
 * reconnect, never a thread stuck forever. The read timeout must exceed GET_LOCK's
 * wait and the session's lock wait timeout. */
#define CONNECT_TIMEOUT_S 5u
#define RW_TIMEOUT_S 15u
#define LOCK_WAIT_TIMEOUT_S 10

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

#define RECOVER_BATCH 5000u   /* rows per recovery UPDATE, committed each */
#define SWEEP_LIMIT 5000u     /* rows per promote/demote UPDATE */
#define PROMOTE_GAP_MS 200    /* least time between two promote sweeps */
#define DEMOTE_EVERY_MS 1000  /* demote at most this often */
#define DUE_REFRESH_MS 5000   /* re-read MIN(run_after) of the delayed lane at least this often */
#define SCHEMA_RETRY_MS 2000  /* while the tables are missing */
#define LOCK_TRY_S 1          /* GET_LOCK's wait per try */
#define LOCK_NAME_MAX DSP_DB_LOCK_NAME_MAX

#define STMT_MARGIN 1024u               /* kept free below max_allowed_packet */
#define STMT_CAP (64u * 1024 * 1024)    /* largest statement built, whatever the server allows */

/* Server error numbers (mysqld_error.h has them, but not under the same names in every
 * client library version). */
#define ER_CON_COUNT_ERROR_ 1040
#define ER_SERVER_SHUTDOWN_ 1053
#define ER_NO_SUCH_TABLE_ 1146
#define ER_NET_PACKET_TOO_LARGE_ 1153
#define ER_TOO_MANY_USER_CONNECTIONS_ 1203
#define ER_LOCK_WAIT_TIMEOUT_ 1205
#define ER_LOCK_DEADLOCK_ 1213
#define ER_USER_LIMIT_REACHED_ 1226
#define ER_OPTION_PREVENTS_STATEMENT_ 1290
#define ER_QUERY_INTERRUPTED_ 1317
#define ER_READ_ONLY_MODE_ 1836
#define ER_CONNECTION_KILLED_ 1927
#define ER_CLIENT_INTERACTION_TIMEOUT_ 4031

/* ---- time ---- */

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t mono_ms(void)
{
    return mono_us() / 1000;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits on cv (created with CLOCK_MONOTONIC) until the monotonic time until_ms. */
static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(until_ms / 1000);
    ts.tv_nsec = (long)(until_ms % 1000) * 1000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- the shared state ---- */

enum msg_kind {
    MSG_LEADER,
    MSG_LEADER_LOST,
    MSG_CLAIM,
    MSG_WRITTEN,
    MSG_HEALTH,
    MSG_FATAL,
    MSG_REQUEUED
};

/* A message from a database thread to the loop. */
struct msg {
    struct msg *next;
    enum msg_kind kind;
    uint32_t epoch;
    bool connected;
    dsp_claim_reply *reply;
    dsp_write_report report;
    char *text;
    uint64_t request_id; /* MSG_REQUEUED */
    int64_t rows;        /* MSG_REQUEUED: rows moved, or -1 */
};

/* A queued dsp_db_requeue_failed. */
struct requeue_req {
    struct requeue_req *next;
    char *type; /* NULL: every type */
    uint64_t request_id;
};

/* dsp_db_claim's copy of a request. */
struct claim_req {
    size_t ntypes;
    char **types;
    uint32_t *limits;
    uint32_t total;
};

/* A queued outcome. */
struct wentry {
    dsp_outcome o;
    uint32_t epoch;    /* the epoch the loop held when it queued it: the fence */
    int64_t queued_ms; /* monotonic */
};

enum { CONN_CLAIM = 0, CONN_WRITE = 1 };

struct dsp_db {
    dsp_db_options opts;
    const dsp_log *log;
    struct event *wake_ev;
    size_t max_batch;
    dsp_strbuf get_lock_sql;
    dsp_strbuf release_lock_sql;

    pthread_mutex_t mu;
    pthread_cond_t claim_cv;
    pthread_cond_t write_cv;
    pthread_cond_t stats_cv;

    /* Everything below up to the atomics is under mu. */
    struct msg *mhead;
    struct msg **mtail;

    bool started, stopped;
    bool claim_thread_ok, write_thread_ok;
    pthread_t claim_thr, write_thr;

    struct claim_req *req; /* posted, not yet taken by the claim thread */
    bool claim_busy;       /* a request posted or being served */
    bool accepting;        /* leadership announced and not lost, not stopping */
    bool stop_claims;      /* dsp_db_stop began: no more claims or sweeps */
    bool claim_exit;       /* the claim thread should let go of the lock and end */
    int64_t retry_due_ms;  /* earliest run_after of RETRY rows written since the last promote */

    struct wentry *q;      /* the write queue: q[qhead .. qhead + qlen) */
    size_t qhead, qlen, qcap;
    size_t writing;        /* taken by the write thread, not finished */
    bool write_stop;
    int64_t write_deadline_ms; /* monotonic */
    bool write_exited;

    bool conn_ok[2];
    bool healthy;

    /* The stats thread. */
    bool stats_thread_ok;
    pthread_t stats_thr;
    bool stats_stop;             /* dsp_db_stop began */
    bool stats_exited;           /* requests are answered at once with -1 */
    struct requeue_req *rq_head; /* requeue requests, in order */
    struct requeue_req **rq_tail;
    dsp_table_stats *tstats;     /* the published figures (retention total aside) */

    /* The epoch of the last on_leader delivered on the loop thread: outcomes queued
     * after it belong to it. */
    _Atomic uint32_t loop_epoch;

    _Atomic uint64_t statements, claims, claimed_rows, claim_us_total, write_batches,
        reconnects, retention_deleted;
    _Atomic bool leader;
    _Atomic uint32_t epoch;
};

/* ---- messages to the loop ---- */

static void dsp_dbi_wake_loop(dsp_db *db)
{
    event_active(db->wake_ev, EV_TIMEOUT, 0);
}

/* Appends m to the loop's queue; mu held. The caller wakes the loop after unlocking. */
static void dsp_dbi_post_locked(dsp_db *db, struct msg *m)
{
    m->next = NULL;
    *db->mtail = m;
    db->mtail = &m->next;
}

static void dsp_dbi_post(dsp_db *db, struct msg *m)
{
    pthread_mutex_lock(&db->mu);
    dsp_dbi_post_locked(db, m);
    pthread_mutex_unlock(&db->mu);
    dsp_dbi_wake_loop(db);
}

static struct msg *dsp_dbi_msg_new(enum msg_kind kind)
{
    struct msg *m = calloc(1, sizeof *m);
    if (m)
        m->kind = kind;
    return m;
}

static void msg_free(struct msg *m)
{
    if (m->reply)
        dsp_claim_reply_free(m->reply);
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
static void dsp_dbi_set_conn_ok(dsp_db *db, int which, bool ok)
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

/* ---- one connection ---- */

struct dbconn {
    dsp_db *db;
    const char *who; /* "claim" or "write", for the log */
    MYSQL *m;
    bool ever_connected;
    bool down_logged;     /* a failure of the current streak was logged at warn */
    int64_t backoff_ms;   /* base of the next wait; 0 after a success */
    uint64_t rng;
    unsigned err;         /* mysql_errno of the last failure */
    size_t stmt_limit;    /* the largest statement this connection may send */
    bool no_lock_wait;    /* innodb_lock_wait_timeout = 0: a locked row fails at once */
};

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* The next reconnect wait: 100 ms doubling up to 5 s, plus up to a quarter of jitter
 * so that restarted dispatchers and both threads do not knock in step. */
static int64_t dsp_dbi_backoff_next(struct dbconn *c)
{
    int64_t base = c->backoff_ms ? c->backoff_ms : BACKOFF_MIN_MS;
    int64_t cap = BACKOFF_MAX_MS * 4 / 5;
    int64_t d;

    if (base > cap)
        base = cap;
    d = base + (int64_t)(rng_next(&c->rng) % (uint64_t)(base / 4 + 1));
    c->backoff_ms = base * 2;
    return d;
}

/* True when the error says the connection or the server is the problem (reconnect and
 * try again), false for an error about the statement itself. */
static bool dsp_dbi_error_is_transient(unsigned e)
{
    if (e >= 2000 && e < 3000) /* client errors: lost connection, timeouts, ... */
        return true;
    switch (e) {
    case ER_CON_COUNT_ERROR_:
    case ER_SERVER_SHUTDOWN_:
    case ER_NO_SUCH_TABLE_:
    case ER_NET_PACKET_TOO_LARGE_:
    case ER_TOO_MANY_USER_CONNECTIONS_:
    case ER_LOCK_WAIT_TIMEOUT_:
    case ER_LOCK_DEADLOCK_:
    case ER_USER_LIMIT_REACHED_:
    case ER_OPTION_PREVENTS_STATEMENT_:
    case ER_QUERY_INTERRUPTED_:
    case ER_READ_ONLY_MODE_:
    case ER_CONNECTION_KILLED_:
    case ER_CLIENT_INTERACTION_TIMEOUT_:
        return true;
    }
    return e >= 1152 && e <= 1161; /* ER_NET_* */
}

/* Sends one statement and discards any result. *affected gets the changed rows. */
static int dsp_dbi_exec(struct dbconn *c, const char *sql, size_t len, uint64_t *affected)
{
    dsp_db *db = c->db;

    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)len) != 0) {
        c->err = mysql_errno(c->m);
        log_warn(db->log, "%s connection: %s (error %u) in: %.160s", c->who, mysql_error(c->m),
                 c->err, sql);
        return -1;
    }
    if (mysql_field_count(c->m) != 0) {
        MYSQL_RES *res = mysql_store_result(c->m);
        if (res == NULL) {
            c->err = mysql_errno(c->m);
            log_warn(db->log, "%s connection: %s (error %u) reading the result of: %.160s",
                     c->who, mysql_error(c->m), c->err, sql);
            return -1;
        }
        mysql_free_result(res);
        if (affected)
            *affected = 0;
        return 0;
    }
    if (affected) {
        /* (uint64_t): my_ulonglong is not in every client library's header. */
        uint64_t n = (uint64_t)mysql_affected_rows(c->m);
        *affected = n == UINT64_MAX ? 0 : n;
    }
    return 0;
}

static int dsp_dbi_exec_str(struct dbconn *c, const char *sql)
{
    return dsp_dbi_exec(c, sql, strlen(sql), NULL);
}

/* Runs a query whose answer is one unsigned number. Returns 0 with *out set (*isnull
 * for SQL NULL), 1 when it returned no row, -1 on error (logged unless quiet_err is
 * that error number). */
static int dsp_dbi_query_u64(struct dbconn *c, const char *sql, uint64_t *out, bool *isnull,
                        unsigned quiet_err)
{
    dsp_db *db = c->db;
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 1;

    *out = 0;
    *isnull = false;
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)strlen(sql)) != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        if (c->err != quiet_err)
            log_warn(db->log, "%s connection: %s (error %u) in: %.160s", c->who,
                     c->err ? mysql_error(c->m) : "no result", c->err, sql);
        return -1;
    }
    if ((row = mysql_fetch_row(res)) != NULL) {
        rc = 0;
        if (row[0] == NULL)
            *isnull = true;
        else
            *out = strtoull(row[0], NULL, 10);
    }
    mysql_free_result(res);
    return rc;
}

static void dsp_dbi_conn_close(struct dbconn *c)
{
    if (c->m) {
        mysql_close(c->m);
        c->m = NULL;
    }
}

/* Opens the connection and sets the session up; want_packet reads max_allowed_packet
 * into c->stmt_limit. Returns 0 or -1 (logged). */
static int dsp_dbi_conn_open(struct dbconn *c, bool autocommit, bool want_packet)
{
    dsp_db *db = c->db;
    const dsp_db_url *u = db->opts.url;
    unsigned int connect_to = CONNECT_TIMEOUT_S, rw_to = RW_TIMEOUT_S, proto;
    unsigned port = 0;
    const char *sock = NULL;
    uint64_t packet;
    bool isnull;
    MYSQL *m;

    c->m = NULL;
    if ((m = mysql_init(NULL)) == NULL) {
        log_error(db->log, "%s connection: out of memory", c->who);
        return -1;
    }
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &connect_to);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rw_to);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &rw_to);
    /* Type names and error texts travel as utf8mb4. Automatic reconnection stays off
     * (the default of both client libraries; setting it explicitly prints a
     * deprecation warning with libmysqlclient 8): a silent reconnect would drop the
     * leadership lock and the session settings. We reconnect ourselves. */
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (u->port) {
        /* A port means TCP, even to localhost. */
        proto = MYSQL_PROTOCOL_TCP;
        port = u->port;
        mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    } else if (u->socket) {
        proto = MYSQL_PROTOCOL_SOCKET;
        sock = u->socket;
        mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    }
    if (mysql_real_connect(m, u->host, u->user, u->password, u->dbname, port, sock, 0) == NULL) {
        c->err = mysql_errno(m);
        if (!c->down_logged)
            log_warn(db->log, "%s connection to %s: %s (error %u); retrying with backoff", c->who,
                     u->host ? u->host : "(default)", mysql_error(m), c->err);
        else
            log_debug(db->log, "%s connection: %s (error %u)", c->who, mysql_error(m), c->err);
        c->down_logged = true;
        mysql_close(m);
        return -1;
    }
    c->m = m;

    /* READ COMMITTED, although REPEATABLE READ measured 20-40 % faster for claims on
     * MariaDB 10.11: at REPEATABLE READ the locking claim (FOR UPDATE SKIP LOCKED) takes
     * next-key and gap locks at the end of the range of claim_idx it scanned, which is
     * exactly where producers' INSERTs of new NEW rows land, so producers would wait for
     * the claim's commit. READ COMMITTED takes no gap locks: a claim never makes an
     * INSERT wait, and that is a hard requirement. */
    if (dsp_dbi_exec_str(c, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") < 0)
        goto fail;
    /* A lock wait (rare: recovery against an old dispatcher's last writes) must end as a
     * server error before the client's read timeout drops the connection. */
    {
        char sql[96];
        snprintf(sql, sizeof sql, "SET SESSION innodb_lock_wait_timeout = %d, autocommit = %d",
                 c->no_lock_wait ? 0 : LOCK_WAIT_TIMEOUT_S, autocommit ? 1 : 0);
        if (dsp_dbi_exec_str(c, sql) < 0)
            goto fail;
    }
    /* The writes are the statements that can grow large. */
    c->stmt_limit = STMT_MARGIN;
    if (want_packet) {
        if (dsp_dbi_query_u64(c, "SELECT @@max_allowed_packet", &packet, &isnull, 0) != 0)
            goto fail;
        if (packet > STMT_CAP)
            packet = STMT_CAP;
        c->stmt_limit = packet > 2 * STMT_MARGIN ? (size_t)packet - STMT_MARGIN : STMT_MARGIN;
    }

    if (c->ever_connected) {
        atomic_fetch_add_explicit(&db->reconnects, 1, memory_order_relaxed);
        log_info(db->log, "%s connection: reconnected", c->who);
    }
    c->ever_connected = true;
    c->down_logged = false;
    c->backoff_ms = 0;
    return 0;

fail:
    dsp_dbi_conn_close(c);
    return -1;
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

static void dsp_dbi_claim_req_free(struct claim_req *r)
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
    const char *payload;
    unsigned long payload_len;
};

struct claim_ctx {
    dsp_db *db;
    struct dbconn c;
    bool schema_ok;
    bool schema_logged;
    bool fatal;
    bool have_lock;
    bool wait_logged;
    bool confirmed;   /* lock and epoch confirmed on this connection: claims may run */
    bool announced;   /* on_leader was posted for epoch and no loss since */
    uint32_t epoch;
    dsp_strbuf sql;
    uint64_t *release_ids; /* rows of a claim whose COMMIT has an unknown outcome */
    size_t nrelease;
    int64_t next_due_wall;   /* earliest run_after of the delayed lane, as last read */
    int64_t last_promote;    /* monotonic */
    int64_t next_demote;     /* monotonic */
    int64_t next_refresh;    /* monotonic */
    struct cand *cands;
    size_t cands_cap;
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
 * that the loop keeps polling. Returns early when stopping. */
static void claim_idle(struct claim_ctx *x, int64_t ms)
{
    dsp_db *db = x->db;
    int64_t until = mono_ms() + ms;
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
        if (db->stop_claims || db->claim_exit || mono_ms() >= until)
            break;
        cond_wait_until(&db->claim_cv, &db->mu, until);
    }
    pthread_mutex_unlock(&db->mu);
}

static void claim_drop(struct claim_ctx *x)
{
    dsp_dbi_conn_close(&x->c);
    x->have_lock = false;
    x->confirmed = false;
    x->schema_ok = false;
    dsp_dbi_set_conn_ok(x->db, CONN_CLAIM, false);
}

static int commit(struct dbconn *c)
{
    return dsp_dbi_exec(c, "COMMIT", 6, NULL);
}

/* 1: the schema is one this build knows; 0: not yet (missing tables, retry later, or
 * fatal); -1: connection error. */
static int check_schema(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t v;
    bool isnull;
    int rc = dsp_dbi_query_u64(&x->c, DSP_CLAIM_SQL_SCHEMA_VERSION, &v, &isnull, ER_NO_SUCH_TABLE_);

    if (rc < 0 && x->c.err != ER_NO_SUCH_TABLE_)
        return -1;
    /* End the read's transaction: it holds a metadata lock on the table until then,
     * which would make an ALTER or DROP (and everything queued behind it) wait. */
    if (commit(&x->c) < 0)
        return -1;
    if (rc != 0 || isnull) {
        if (!x->schema_logged)
            log_warn(db->log,
                     "database %s has no taskpush schema (taskpush_meta.schema_version);"
                     " load sql/schema.sql. Retrying every %d s",
                     db->opts.url->dbname, SCHEMA_RETRY_MS / 1000);
        x->schema_logged = true;
        return 0;
    }
    x->schema_logged = false;
    /* Older (taskpushd --migrate upgrades it) or newer: fatal, a retry cannot mend it. */
    char text[DSP_SCHEMA_PROBLEM_MAX];
    if (dsp_schema_version_problem(v, text, sizeof text) != 0) {
        struct msg *m = dsp_dbi_msg_new(MSG_FATAL);
        log_error(db->log, "database %s: %s", db->opts.url->dbname, text);
        if (m) {
            m->text = strdup(text);
            dsp_dbi_post(db, m);
        }
        x->fatal = true;
        return 0;
    }
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
         * tables are gone) the claim loop waits as for a busy lock. */
        rc = check_schema(x);
        if (rc == 0)
            x->schema_ok = false;
        return rc;
    }
    if (!x->wait_logged)
        log_info(db->log, "another taskpushd holds the table; waiting");
    x->wait_logged = true;
    return 0;
}

static void leadership_lost(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    struct msg *m = dsp_dbi_msg_new(MSG_LEADER_LOST);

    log_error(db->log, "another dispatcher took the table after epoch %u", (unsigned)x->epoch);
    x->announced = false;
    x->nrelease = 0;
    atomic_store(&db->leader, false);
    pthread_mutex_lock(&db->mu);
    db->accepting = false;
    if (m)
        dsp_dbi_post_locked(db, m);
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
}

/* Reads the epoch counter. Returns 0 or -1. */
static int read_meta_epoch(struct claim_ctx *x, uint64_t *out)
{
    bool isnull;
    int rc = dsp_dbi_query_u64(&x->c, "SELECT value FROM taskpush_meta WHERE name = 'epoch'", out,
                          &isnull, 0);
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
    dsp_db_sql_release_ids(&x->sql, x->epoch, wall_ms(), x->release_ids, x->nrelease);
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

/* Puts rows of older epochs back to NEW (see dsp_db_sql_recover for the attempts rule). */
static int recover(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t n, total = 0;

    do {
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_recover(&x->sql, x->epoch, wall_ms(), RECOVER_BATCH);
        if (x->sql.oom)
            return -1;
        if (dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0 || commit(&x->c) < 0)
            return -1;
        total += n;
    } while (n >= RECOVER_BATCH && !claim_stopping(db));
    if (total)
        log_info(db->log, "recovered %" PRIu64 " row(s) left PROCESSING by earlier dispatchers",
                 total);
    return 0;
}

/* Makes the leadership of this connection certain: keeps the epoch when nobody took
 * over since, else takes a new one and recovers. 1: serving; 0: retry later; -1: error. */
static int confirm_leadership(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t e, n;
    struct msg *m;

    if (x->announced) {
        if (read_meta_epoch(x, &e) < 0)
            return -1;
        if (e == x->epoch) {
            if (release_unknown(x) < 0)
                return -1;
            x->confirmed = true;
            log_info(db->log, "kept the table with epoch %u", (unsigned)x->epoch);
            return 1;
        }
        leadership_lost(x);
    }
    if (dsp_dbi_exec(&x->c, DSP_CLAIM_SQL_EPOCH_NEXT, strlen(DSP_CLAIM_SQL_EPOCH_NEXT), &n) < 0)
        return -1;
    e = mysql_insert_id(x->c.m);
    if (commit(&x->c) < 0)
        return -1;
    if (n != 1) {
        log_warn(db->log, "taskpush_meta has no 'epoch' row; load sql/schema.sql");
        x->schema_ok = false;
        return 0;
    }
    if (e == 0 || e > UINT32_MAX) {
        if ((m = dsp_dbi_msg_new(MSG_FATAL)) != NULL) {
            m->text = strdup("the epoch counter in taskpush_meta is out of range");
            dsp_dbi_post(db, m);
        }
        x->fatal = true;
        return 0;
    }
    x->epoch = (uint32_t)e;
    x->nrelease = 0;
    atomic_store(&db->epoch, x->epoch);
    if (recover(x) < 0)
        return -1;
    x->confirmed = true;
    x->announced = true;
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

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    if (a->priority != b->priority)
        return a->priority > b->priority ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Runs one claim transaction for r and answers it. Returns 0, or -1 on a database
 * error (answered with a failure; the caller reconnects). */
static int do_claim(struct claim_ctx *x, struct claim_req *r)
{
    dsp_db *db = x->db;
    const char **ptypes = NULL;
    uint16_t *pindex = NULL;
    uint32_t *taken = NULL;
    size_t nparts = 0, ncand = 0, nkept = 0, nforeign = 0, i, p;
    uint64_t first_foreign = 0;
    uint32_t limit = 0;
    dsp_claim_reply *reply = NULL;
    uint64_t *ids = NULL;
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int64_t t0;
    uint64_t affected;
    char *sel = NULL;
    size_t cap;
    int n, rc = -1;
    bool db_error = false;

    ptypes = calloc(r->ntypes ? r->ntypes : 1, sizeof *ptypes);
    pindex = calloc(r->ntypes ? r->ntypes : 1, sizeof *pindex);
    taken = calloc(r->ntypes ? r->ntypes : 1, sizeof *taken);
    reply = calloc(1, sizeof *reply);
    if (!ptypes || !pindex || !taken || !reply)
        goto oom;
    /* Only types that may take rows; a type name the table cannot hold has no rows. */
    for (i = 0; i < r->ntypes; i++) {
        if (r->limits[i] == 0)
            continue;
        if (strlen(r->types[i]) > DSP_CLAIM_SQL_TYPE_MAX_BYTES) {
            log_warn(db->log, "task type of %zu bytes cannot be in the table; not claimed",
                     strlen(r->types[i]));
            continue;
        }
        ptypes[nparts] = r->types[i];
        pindex[nparts++] = (uint16_t)i;
        if (r->limits[i] > limit)
            limit = r->limits[i];
    }
    if (limit > r->total)
        limit = r->total;
    if (nparts == 0 || limit == 0) {
        claim_answer(db, r, reply); /* nothing to ask for: an empty success */
        rc = 0;
        goto out;
    }

    cap = dsp_claim_sql_select_bound(ptypes, nparts);
    if ((sel = malloc(cap)) == NULL)
        goto oom;
    n = dsp_claim_sql_select(sel, cap, ptypes, nparts, wall_ms(), limit, NULL, NULL);
    if (n < 0) {
        log_error(db->log, "cannot build the claim statement");
        goto fail;
    }

    t0 = mono_us();
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, sel, (unsigned long)n) != 0 ||
        (res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: %s (error %u)", x->c.err ? mysql_error(x->c.m) : "no result",
                 x->c.err);
        db_error = true;
        goto fail;
    }
    if (mysql_num_fields(res) != DSP_CLAIM_COL_COUNT) {
        log_error(db->log, "claim: %u columns, expected %d", mysql_num_fields(res),
                  DSP_CLAIM_COL_COUNT);
        db_error = true;
        goto fail;
    }
    if (mysql_num_rows(res) > x->cands_cap) {
        size_t want = (size_t)mysql_num_rows(res);
        struct cand *nc = realloc(x->cands, want * sizeof *nc);
        if (nc == NULL)
            goto oom_rollback;
        x->cands = nc;
        x->cands_cap = want;
    }

    /* The parts come one after the other, each in dispatch order; a row's part is the
     * one whose type it carries. */
    p = 0;
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        struct cand *cd;
        size_t tl;

        if (row[DSP_CLAIM_COL_TASK_ID] == NULL || row[DSP_CLAIM_COL_TASK_TYPE] == NULL)
            continue;
        tl = len[DSP_CLAIM_COL_TASK_TYPE];
        if (p >= nparts || strlen(ptypes[p]) != tl ||
            memcmp(ptypes[p], row[DSP_CLAIM_COL_TASK_TYPE], tl) != 0) {
            size_t q;
            for (q = 0; q < nparts; q++)
                if (strlen(ptypes[q]) == tl && memcmp(ptypes[q], row[DSP_CLAIM_COL_TASK_TYPE], tl) == 0)
                    break;
            if (q == nparts) {
                /* Equal in SQL but not byte for byte (utf8mb4_bin pads: 'a ' = 'a'):
                 * no worker asked for it. It stays NEW. */
                if (nforeign++ == 0)
                    first_foreign = strtoull(row[DSP_CLAIM_COL_TASK_ID], NULL, 10);
                continue;
            }
            p = q;
        }
        cd = &x->cands[ncand++];
        cd->id = strtoull(row[DSP_CLAIM_COL_TASK_ID], NULL, 10);
        cd->type_index = pindex[p];
        cd->priority = row[DSP_CLAIM_COL_PRIORITY]
                           ? (uint8_t)strtoul(row[DSP_CLAIM_COL_PRIORITY], NULL, 10)
                           : 0;
        {
            long long a = row[DSP_CLAIM_COL_ATTEMPTS] ? strtoll(row[DSP_CLAIM_COL_ATTEMPTS], NULL, 10) : 0;
            long long ma = row[DSP_CLAIM_COL_MAX_ATTEMPTS]
                               ? strtoll(row[DSP_CLAIM_COL_MAX_ATTEMPTS], NULL, 10)
                               : 0;
            cd->attempts = a < 0 ? 0 : a > UINT32_MAX ? UINT32_MAX : (uint32_t)a;
            cd->max_attempts = ma < 0 ? 0 : ma > UINT32_MAX ? UINT32_MAX : (uint32_t)ma;
        }
        cd->timeout_ms = row[DSP_CLAIM_COL_TIMEOUT_MS]
                             ? strtoll(row[DSP_CLAIM_COL_TIMEOUT_MS], NULL, 10)
                             : -1;
        cd->payload = row[DSP_CLAIM_COL_PAYLOAD];
        cd->payload_len = row[DSP_CLAIM_COL_PAYLOAD] ? len[DSP_CLAIM_COL_PAYLOAD] : 0;
    }
    if (nforeign)
        log_warn(db->log,
                 "claim returned %zu row(s) whose task_type is not byte for byte a type asked"
                 " for (trailing spaces?), e.g. task %" PRIu64 "; left NEW",
                 nforeign, first_foreign);
    if (mysql_errno(x->c.m) != 0) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(db->log, "claim: reading rows: %s", mysql_error(x->c.m));
        db_error = true;
        goto fail;
    }

    /* Merge the types into dispatch order, then keep rows while their type and the
     * total have room; the rest stay NEW (the COMMIT unlocks them). */
    if (ncand > 1)
        qsort(x->cands, ncand, sizeof *x->cands, cand_cmp);
    for (i = 0; i < ncand && nkept < r->total; i++) {
        struct cand *cd = &x->cands[i];
        if (taken[cd->type_index] >= r->limits[cd->type_index])
            continue;
        taken[cd->type_index]++;
        x->cands[nkept++] = *cd; /* compacts in place: nkept <= i */
    }

    if (nkept > 0) {
        /* Everything the reply needs is allocated before the rows change. */
        reply->tasks = calloc(nkept, sizeof *reply->tasks);
        ids = malloc(nkept * sizeof *ids);
        if (!reply->tasks || !ids)
            goto oom_rollback;
        for (i = 0; i < nkept; i++) {
            const struct cand *cd = &x->cands[i];
            dsp_claimed_task *t = &reply->tasks[i];
            t->task_id = cd->id;
            t->attempts = cd->attempts;
            t->max_attempts = cd->max_attempts;
            t->timeout_ms = cd->timeout_ms;
            t->priority = cd->priority;
            t->type_index = cd->type_index;
            t->payload_len = cd->payload_len;
            if (cd->payload_len) {
                if ((t->payload = malloc(cd->payload_len)) == NULL) {
                    reply->ntasks = i;
                    goto oom_rollback;
                }
                memcpy(t->payload, cd->payload, cd->payload_len);
            }
            ids[i] = cd->id;
        }
        reply->ntasks = nkept;
        mysql_free_result(res);
        res = NULL;

        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_claim_mark(&x->sql, x->epoch, wall_ms(), ids, nkept);
        if (x->sql.oom)
            goto oom_rollback;
        if (dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &affected) < 0) {
            db_error = true;
            goto fail;
        }
        if (affected != nkept)
            log_error(db->log, "claim marked %" PRIu64 " row(s) of %zu kept", affected, nkept);
    } else {
        mysql_free_result(res);
        res = NULL;
    }
    if (commit(&x->c) < 0) {
        /* The commit may have happened: after reconnecting, these rows go back to NEW
         * if the epoch is still ours. */
        if (nkept > 0) {
            uint64_t *keep = realloc(x->release_ids, (x->nrelease + nkept) * sizeof *keep);
            if (keep) {
                memcpy(keep + x->nrelease, ids, nkept * sizeof *ids);
                x->release_ids = keep;
                x->nrelease += nkept;
            }
        }
        db_error = true;
        goto fail;
    }
    reply->duration_us = mono_us() - t0;
    atomic_fetch_add_explicit(&db->claims, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->claimed_rows, nkept, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->claim_us_total, (uint64_t)reply->duration_us,
                              memory_order_relaxed);
    claim_answer(db, r, reply);
    reply = NULL;
    rc = 0;
    goto out;

oom_rollback:
    log_error(db->log, "out of memory during a claim; rolling it back");
    if (res) {
        mysql_free_result(res);
        res = NULL;
    }
    if (dsp_dbi_exec_str(&x->c, "ROLLBACK") < 0)
        db_error = true;
    goto fail;
oom:
    log_error(db->log, "out of memory during a claim");
fail:
    if (res)
        mysql_free_result(res);
    res = NULL;
    dsp_claim_reply_free(reply);
    reply = NULL;
    claim_fail(db, r);
    rc = db_error ? -1 : 0;
out:
    free(ids);
    free(sel);
    free(ptypes);
    free(pindex);
    free(taken);
    return rc;
}

/* The lane sweeps, when due: demote at most once a second; promote when the earliest
 * delayed row (as last read, or as the write thread reported for retries it wrote) is
 * due, at most every PROMOTE_GAP_MS. Returns 0 or -1 (database error). */
static int sweeps(struct claim_ctx *x)
{
    dsp_db *db = x->db;
    int64_t now_m = mono_ms(), now_w = wall_ms(), due, taken_due = INT64_MAX;
    bool promote, demote, refresh;
    uint64_t n, v;
    bool isnull;
    char sql[256];

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

    if (demote) {
        x->next_demote = now_m + DEMOTE_EVERY_MS;
        do {
            if (dsp_claim_sql_demote(sql, sizeof sql, wall_ms(), SWEEP_LIMIT) < 0 ||
                dsp_dbi_exec(&x->c, sql, strlen(sql), &n) < 0)
                goto fail;
            if (n)
                refresh = true; /* new rows in the delayed lane */
            if (n >= SWEEP_LIMIT && commit(&x->c) < 0)
                goto fail;
        } while (n >= SWEEP_LIMIT);
    }
    if (promote) {
        x->last_promote = now_m;
        do {
            if (dsp_claim_sql_promote(sql, sizeof sql, wall_ms(), SWEEP_LIMIT) < 0 ||
                dsp_dbi_exec(&x->c, sql, strlen(sql), &n) < 0)
                goto fail;
            if (n >= SWEEP_LIMIT && commit(&x->c) < 0)
                goto fail;
        } while (n >= SWEEP_LIMIT);
    }
    if (refresh) {
        if (dsp_dbi_query_u64(&x->c, "SELECT MIN(run_after) FROM task WHERE `delayed` = 1", &v, &isnull,
                         0) < 0)
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
        now_m = mono_ms();
        now_w = wall_ms();
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
        if (now_m >= wake)
            break;
        cond_wait_until(&db->claim_cv, &db->mu, wake);
    }
    pthread_mutex_unlock(&db->mu);
    if (r && do_claim(x, r) < 0)
        return -1;
    if (claim_stopping(db))
        return 0;
    return sweeps(x);
}

static void *dsp_dbi_claim_main(void *arg)
{
    dsp_db *db = arg;
    struct claim_ctx x;
    struct claim_req *r;
    uint64_t e;
    int rc;

    memset(&x, 0, sizeof x);
    x.db = db;
    x.c.db = db;
    x.c.who = "claim";
    x.c.rng = (uint64_t)mono_us() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)&x;
    if (x.c.rng == 0)
        x.c.rng = 1;
    mysql_thread_init();

    while (!claim_stopping(db)) {
        if (x.c.m == NULL) {
            if (dsp_dbi_conn_open(&x.c, false, false) < 0) {
                dsp_dbi_set_conn_ok(db, CONN_CLAIM, false);
                claim_idle(&x, dsp_dbi_backoff_next(&x.c));
                continue;
            }
            dsp_dbi_set_conn_ok(db, CONN_CLAIM, true);
        }
        if (x.fatal) {
            claim_idle(&x, 60000); /* the loop exits on on_fatal; wait for dsp_db_stop */
            continue;
        }
        if (!x.schema_ok) {
            rc = check_schema(&x);
            if (rc < 0)
                goto drop;
            if (rc == 0) {
                claim_idle(&x, SCHEMA_RETRY_MS);
                continue;
            }
            x.schema_ok = true;
        }
        if (!x.have_lock) {
            rc = take_lock(&x); /* waits up to LOCK_TRY_S on the server */
            if (rc < 0)
                goto drop;
            if (rc == 0) {
                /* Lost the lock with the old connection; if the epoch moved on meanwhile,
                 * another dispatcher took the table and recovered our rows. */
                if (x.announced) {
                    if (read_meta_epoch(&x, &e) < 0)
                        goto drop;
                    if (e != x.epoch)
                        leadership_lost(&x);
                }
                claim_idle(&x, 0);
                continue;
            }
        }
        if (!x.confirmed) {
            rc = confirm_leadership(&x);
            if (rc < 0)
                goto drop;
            if (rc == 0) {
                claim_idle(&x, SCHEMA_RETRY_MS);
                continue;
            }
        }
        if (serve(&x) == 0)
            continue;
    drop:
        log_warn(db->log, "claim connection: reconnecting");
        claim_drop(&x);
        claim_idle(&x, dsp_dbi_backoff_next(&x.c));
    }

    /* Claims stopped: hold the lock until the write thread has written everything. */
    pthread_mutex_lock(&db->mu);
    db->accepting = false;
    while (!db->claim_exit)
        pthread_cond_wait(&db->claim_cv, &db->mu);
    r = db->req;
    db->req = NULL;
    pthread_mutex_unlock(&db->mu);
    if (r)
        claim_fail(db, r);
    if (x.c.m) {
        if (x.have_lock) {
            uint64_t v;
            bool isnull;
            if (dsp_dbi_query_u64(&x.c, db->release_lock_sql.p, &v, &isnull, 0) == 0)
                log_debug(db->log, "released the table's lock");
        }
        dsp_dbi_conn_close(&x.c);
    }
    atomic_store(&db->leader, false);
    dsp_dbi_set_conn_ok(db, CONN_CLAIM, false);
    dsp_strbuf_free(&x.sql);
    free(x.release_ids);
    free(x.cands);
    mysql_thread_end();
    return NULL;
}

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
    past = db->write_stop && mono_ms() >= db->write_deadline_ms;
    pthread_mutex_unlock(&db->mu);
    return past;
}

/* Sleeps ms, or until the stop deadline when that comes first. */
static void write_sleep(dsp_db *db, int64_t ms)
{
    int64_t until = mono_ms() + ms, end;

    pthread_mutex_lock(&db->mu);
    for (;;) {
        end = until;
        if (db->write_stop && db->write_deadline_ms < end)
            end = db->write_deadline_ms;
        if (mono_ms() >= end)
            break;
        cond_wait_until(&db->write_cv, &db->mu, end);
    }
    pthread_mutex_unlock(&db->mu);
}

/* Makes each outcome's data fit its column: error texts valid UTF-8 of at most
 * 65,535 bytes, results at most 16 MiB - 1. */
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
            o->len = 0; /* err_msg stays as it was */
            break;
        case DSP_WRITE_SUCCEEDED:
            if (o->len > DSP_DB_RESULT_MAX) {
                log_warn(db->log, "result of task %" PRIu64 " cut from %zu to %u bytes",
                         o->task_id, o->len, DSP_DB_RESULT_MAX);
                o->len = DSP_DB_RESULT_MAX;
            }
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
            (*left)--;
            w->dropped++;
            break;
        }
    }
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
static int write_skip_locked(struct write_ctx *w, int kind, size_t s, size_t e,
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
    dsp_db_sql_lock_free(&w->sql, epoch, w->rows + s, NULL, n);
    if (w->sql.oom || mark_ids(w, s, e, w->ours) < 0)
        return -1;
    for (k = 0; k < n; k++)
        if (w->ours[k])
            w->sub[m++] = w->rows[s + k];
    if (m > 0) {
        dsp_strbuf_reset(&w->sql);
        dsp_db_sql_write(&w->sql, kind, epoch, wall_ms(), w->sub, m);
        if (w->sql.oom || dsp_dbi_exec(&w->c, w->sql.p, w->sql.len, &affected) < 0)
            return -1;
    }
    if (dsp_dbi_exec_str(&w->c, "COMMIT") < 0 ||
        dsp_dbi_exec_str(&w->c, "SET SESSION innodb_lock_wait_timeout = 0, autocommit = 1") < 0)
        return -1;
    if (m < n) {
        /* A plain read (no lock, no wait) finds which of the others are still ours. */
        dsp_strbuf_reset(&w->sql);
        dsp_db_sql_still_ours(&w->sql, epoch, w->rows + s, w->ours, n);
        if (w->sql.oom || mark_ids(w, s, e, w->busy) < 0)
            return -1;
    }
    rep->written[kind] += affected;
    for (k = 0; k < n; k++) {
        size_t i = w->idx[s + k];
        w->done[i] = 1;
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
    size_t limit = w->c.stmt_limit;

    for (int ko = 0; ko < DSP_WRITE_KINDS; ko++) {
        int kind = kind_order[ko];
        size_t m = 0, s, e, i;

        for (i = 0; i < w->n; i++) {
            if (w->done[i] || w->batch[i].o.kind != kind)
                continue;
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
                    if (e > s && cost + rc > limit)
                        break;
                    cost += rc;
                    e++;
                }
            }
            cnt = e - s;
            if (cnt == 1 && cost > limit && w->rows[s].len > 0) {
                /* One outcome larger than a statement may be: keep what fits. */
                dsp_db_sql_row *r = &w->rows[s];
                size_t room = limit > DSP_DB_SQL_WRITE_FIXED + 512
                                  ? (limit - DSP_DB_SQL_WRITE_FIXED - 512) / 2
                                  : 0;
                size_t nl = kind == DSP_WRITE_SUCCEEDED ? room : dsp_utf8_cut(r->data, r->len, room);
                log_warn(db->log,
                         "%s of task %" PRIu64 " cut from %zu to %zu bytes to fit max_allowed_packet",
                         kind == DSP_WRITE_SUCCEEDED ? "result" : "error text", r->task_id, r->len, nl);
                r->len = nl;
                w->batch[w->idx[s]].o.len = nl;
            }
            dsp_strbuf_reset(&w->sql);
            dsp_db_sql_write(&w->sql, kind, w->batch[w->idx[s]].epoch, wall_ms(), &w->rows[s], cnt);
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
                rep->written[kind] += affected;
                /* A delivery record finds no row when the outcome came first: harmless. */
                if (kind != DSP_WRITE_DELIVERED)
                    rep->fenced += affected < cnt ? cnt - affected : 0;
                for (i = s; i < e; i++) {
                    w->done[w->idx[i]] = 1;
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
            if (w->c.err == ER_NET_PACKET_TOO_LARGE_ && cnt == 1) {
                log_error(db->log, "outcome of task %" PRIu64 " is too large to write; its row stays PROCESSING",
                          w->rows[s].task_id);
                w->done[w->idx[s]] = 1;
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
    db->q[db->qhead + db->qlen].queued_ms = mono_ms();
    db->qlen++;
    return 0;
}

/* Writes w->batch, reconnecting and writing again until done or past the stop
 * deadline; reports through on_written. */
static void write_batch(struct write_ctx *w)
{
    dsp_db *db = w->db;
    dsp_write_report rep;
    size_t left = w->n, i;
    int64_t retry_min = INT64_MAX;
    struct msg *m;

    memset(&rep, 0, sizeof rep);
    memset(w->done, 0, w->n);
    memset(w->isolate, 0, w->n);
    memset(w->defer, 0, w->n);
    write_prepare(w, &left);
    while (left > 0) {
        if (w->c.m == NULL) {
            if (write_past_deadline(db))
                break;
            if (dsp_dbi_conn_open(&w->c, true, true) < 0) {
                dsp_dbi_set_conn_ok(db, CONN_WRITE, false);
                write_sleep(db, dsp_dbi_backoff_next(&w->c));
                continue;
            }
            dsp_dbi_set_conn_ok(db, CONN_WRITE, true);
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
    atomic_fetch_add_explicit(&db->write_batches, 1, memory_order_relaxed);
    m = dsp_dbi_msg_new(MSG_WRITTEN);
    pthread_mutex_lock(&db->mu);
    /* Deferred outcomes go back to the queue (they keep their data) unless the stop
     * deadline has passed; the rest are done with. */
    for (i = 0; i < w->n; i++) {
        if (w->defer[i] && !(db->write_stop && mono_ms() >= db->write_deadline_ms) &&
            write_requeue_locked(db, &w->batch[i]) == 0)
            continue;
        if (w->defer[i])
            w->dropped++;
        free(w->batch[i].o.data);
        w->batch[i].o.data = NULL;
    }
    /* No longer pending by the time the loop hears of it. */
    db->writing = 0;
    if (m) {
        m->report = rep;
        dsp_dbi_post_locked(db, m);
    }
    if (retry_min < db->retry_due_ms) {
        db->retry_due_ms = retry_min;
        pthread_cond_signal(&db->claim_cv);
    }
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
}

static void *dsp_dbi_write_main(void *arg)
{
    dsp_db *db = arg;
    struct write_ctx w;
    size_t cap = db->max_batch, k;
    int64_t flush = db->opts.result_flush_ms > 0 ? db->opts.result_flush_ms : 0;

    memset(&w, 0, sizeof w);
    w.db = db;
    w.c.db = db;
    w.c.who = "write";
    w.c.rng = (uint64_t)mono_us() * 0xBF58476D1CE4E5B9ULL ^ (uint64_t)(uintptr_t)&w;
    if (w.c.rng == 0)
        w.c.rng = 1;
    w.c.no_lock_wait = true;
    w.batch = calloc(cap, sizeof *w.batch);
    w.done = calloc(cap, 1);
    w.isolate = calloc(cap, 1);
    w.defer = calloc(cap, 1);
    w.ours = calloc(cap, 1);
    w.busy = calloc(cap, 1);
    w.sub = calloc(cap, sizeof *w.sub);
    w.rows = calloc(cap, sizeof *w.rows);
    w.idx = calloc(cap, sizeof *w.idx);
    w.refs = calloc(cap, sizeof *w.refs);
    mysql_thread_init();
    if (!w.batch || !w.done || !w.isolate || !w.defer || !w.ours || !w.busy || !w.sub ||
        !w.rows || !w.idx || !w.refs) {
        log_error(db->log, "write thread: out of memory; outcomes will not be written");
        cap = 0;
    }

    pthread_mutex_lock(&db->mu);
    for (;;) {
        if (db->qlen == 0 || cap == 0) {
            if (db->write_stop)
                break;
            if (w.c.m == NULL && mono_ms() >= w.next_connect && cap) {
                /* Connect while idle, so that on_health tells the truth early. */
                pthread_mutex_unlock(&db->mu);
                if (dsp_dbi_conn_open(&w.c, true, true) == 0) {
                    dsp_dbi_set_conn_ok(db, CONN_WRITE, true);
                } else {
                    dsp_dbi_set_conn_ok(db, CONN_WRITE, false);
                    w.next_connect = mono_ms() + dsp_dbi_backoff_next(&w.c);
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
            if (mono_ms() < until) {
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
    for (k = 0; k < db->qlen; k++)
        free(db->q[db->qhead + k].o.data);
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
    free(w.ours);
    free(w.busy);
    free(w.sub);
    free(w.rows);
    free(w.idx);
    free(w.refs);
    mysql_thread_end();
    return NULL;
}

/* ---- the stats thread ---- */

#define RETAIN_BATCH 1000u         /* rows per retention DELETE */
#define RETAIN_BATCHES 20          /* most DELETEs per state per round: figures stay fresh */
#define RETAIN_EVERY_MS 10000      /* least gap between retention rounds that found no more
                                    * to delete (each reads every SUCCESSFUL/FAILED row's
                                    * last_update_time: no index has it) */
#define REQUEUE_BATCH 5000u        /* rows per requeue UPDATE */

struct stats_ctx {
    dsp_db *db;
    struct dbconn c;
    dsp_strbuf sql;
    dsp_table_stats *work;                      /* the figures being read */
    uint8_t lane0[DSP_TABLE_STATS_MAX_TYPES];   /* per type: priorities (bits) in the ready lane */
    int64_t next_connect;                       /* monotonic: no connection attempt before */
    int64_t next_retain;                        /* monotonic: no retention round before */
    bool types_full_logged;
};

static bool stats_stopping(dsp_db *db)
{
    bool s;
    pthread_mutex_lock(&db->mu);
    s = db->stats_stop;
    pthread_mutex_unlock(&db->mu);
    return s;
}

/* Sends one query and stores its result; NULL on error (logged). */
static MYSQL_RES *db_query_res(struct dbconn *c, const char *sql, size_t len)
{
    dsp_db *db = c->db;
    MYSQL_RES *res;

    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)len) != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        log_warn(db->log, "%s connection: %s (error %u) in: %.160s", c->who,
                 c->err ? mysql_error(c->m) : "no result", c->err, sql);
        return NULL;
    }
    return res;
}

static void stats_drop(struct stats_ctx *x)
{
    dsp_dbi_conn_close(&x->c);
    x->next_connect = mono_ms() + dsp_dbi_backoff_next(&x->c);
}

/* 0 when connected; -1 while the backoff lasts or the connection failed. With now,
 * tries at once whatever the backoff. */
static int stats_connect(struct stats_ctx *x, bool now)
{
    if (x->c.m)
        return 0;
    if (!now && mono_ms() < x->next_connect)
        return -1;
    if (dsp_dbi_conn_open(&x->c, true, false) < 0) {
        x->next_connect = mono_ms() + dsp_dbi_backoff_next(&x->c);
        return -1;
    }
    return 0;
}

static uint64_t field_u64(const char *v)
{
    return v ? strtoull(v, NULL, 10) : 0;
}

/* The slot of type t[0..len) in w->types, added when new; -1 when full. */
static int stats_type_slot(struct stats_ctx *x, const char *t, size_t len)
{
    dsp_table_stats *w = x->work;
    size_t i;

    if (len >= sizeof w->types[0].type)
        return -1;
    for (i = 0; i < w->ntypes; i++)
        if (strlen(w->types[i].type) == len && memcmp(w->types[i].type, t, len) == 0)
            return (int)i;
    if (w->ntypes >= DSP_TABLE_STATS_MAX_TYPES) {
        if (!x->types_full_logged)
            log_warn(x->db->log, "more than %d task types have rows; table figures show %d",
                     DSP_TABLE_STATS_MAX_TYPES, DSP_TABLE_STATS_MAX_TYPES);
        x->types_full_logged = true;
        return -1;
    }
    memcpy(w->types[w->ntypes].type, t, len);
    w->types[w->ntypes].type[len] = '\0';
    x->lane0[w->ntypes] = 0;
    return (int)w->ntypes++;
}

static int type_stats_cmp(const void *pa, const void *pb)
{
    const dsp_table_type_stats *a = pa, *b = pb;
    return strcmp(a->type, b->type);
}

/* Reads the figures and publishes them. Returns 0 or -1 (database error). */
static int stats_refresh(struct stats_ctx *x)
{
    dsp_db *db = x->db;
    dsp_table_stats *w = x->work;
    int64_t t0 = mono_us(), now = wall_ms();
    MYSQL_RES *res;
    MYSQL_ROW row;
    uint64_t v;
    bool isnull, any = false;
    size_t i;
    int p;

    memset(w, 0, sizeof *w);
    w->oldest_ready_age_ms = -1;

    /* 1. NEW, PROCESSING and FAILED per (state, lane, type). */
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_stats_counts(&x->sql, now);
    if (x->sql.oom || (res = db_query_res(&x->c, x->sql.p, x->sql.len)) == NULL)
        return -1;
    if (mysql_num_fields(res) != DSP_DB_SQL_COUNTS_NCOLS) {
        log_error(db->log, "table figures: %u columns, expected %d", mysql_num_fields(res),
                  DSP_DB_SQL_COUNTS_NCOLS);
        mysql_free_result(res);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        uint64_t state = field_u64(row[DSP_DB_SQL_COUNTS_STATE]);
        uint64_t lane = field_u64(row[DSP_DB_SQL_COUNTS_DELAYED]);
        uint64_t rows = field_u64(row[DSP_DB_SQL_COUNTS_ROWS]);
        uint64_t due = field_u64(row[DSP_DB_SQL_COUNTS_DUE]);
        uint64_t pr[3];
        int slot;

        if (state > 3 || row[DSP_DB_SQL_COUNTS_TYPE] == NULL)
            continue;
        for (p = 0; p < 3; p++)
            pr[p] = field_u64(row[DSP_DB_SQL_COUNTS_P0 + p]);
        w->by_state[state] += rows;
        if (state == 0)
            for (p = 0; p < 3; p++)
                w->new_by_priority[p] += pr[p];
        slot = stats_type_slot(x, row[DSP_DB_SQL_COUNTS_TYPE], len[DSP_DB_SQL_COUNTS_TYPE]);
        if (slot < 0)
            continue;
        switch (state) {
        case 0:
            w->types[slot].new_ready += due;
            w->types[slot].new_delayed += rows - (due < rows ? due : rows);
            if (lane == 0)
                for (p = 0; p < 3; p++)
                    if (pr[p])
                        x->lane0[slot] |= (uint8_t)(1u << p);
            break;
        case 1:
            w->types[slot].processing += rows;
            break;
        case 3:
            w->types[slot].failed += rows;
            break;
        }
    }
    mysql_free_result(res);

    /* 2. SUCCESSFUL, up to the cap. */
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_stats_successful(&x->sql, DSP_DB_SQL_SUCCESSFUL_CAP);
    if (x->sql.oom || dsp_dbi_query_u64(&x->c, x->sql.p, &v, &isnull, 0) < 0)
        return -1;
    w->by_state[2] = v;
    w->successful_capped = v >= DSP_DB_SQL_SUCCESSFUL_CAP;

    /* 3. The oldest ready row: the head of each (type, priority) of the ready lane. */
    dsp_strbuf_reset(&x->sql);
    for (i = 0; i < w->ntypes; i++)
        for (p = 2; p >= 0; p--)
            if (x->lane0[i] & (1u << p)) {
                dsp_db_sql_stats_oldest_part(&x->sql, !any, w->types[i].type,
                                             strlen(w->types[i].type), p, now);
                any = true;
            }
    if (any) {
        dsp_db_sql_stats_oldest_end(&x->sql);
        if (x->sql.oom || dsp_dbi_query_u64(&x->c, x->sql.p, &v, &isnull, 0) < 0)
            return -1;
        if (!isnull) {
            int64_t since = (int64_t)v; /* a signed BIGINT: the cast gives it back */
            w->oldest_ready_age_ms = now > since ? now - since : 0;
        }
    }

    qsort(w->types, w->ntypes, sizeof w->types[0], type_stats_cmp);
    w->valid = true;
    w->refreshed_wall_ms = now;
    w->duration_us = mono_us() - t0;
    pthread_mutex_lock(&db->mu);
    memcpy(db->tstats, w, sizeof *w);
    pthread_mutex_unlock(&db->mu);
    log_debug(db->log,
              "table figures: NEW %" PRIu64 " PROCESSING %" PRIu64 " SUCCESSFUL %" PRIu64
              "%s FAILED %" PRIu64 ", %zu type(s), oldest ready %" PRId64 " ms, in %" PRId64 " us",
              w->by_state[0], w->by_state[1], w->by_state[2], w->successful_capped ? "+" : "",
              w->by_state[3], w->ntypes, w->oldest_ready_age_ms, w->duration_us);
    return 0;
}

/* Deletes SUCCESSFUL and FAILED rows older than their retention, at most RETAIN_BATCHES
 * batches of each per round. Returns 0 when done, 1 when a state has more to delete,
 * -1 on a database error. */
static int stats_retention(struct stats_ctx *x)
{
    dsp_db *db = x->db;
    static const int states[2] = {2, 3};
    int64_t keep[2] = {db->opts.retain_succeeded_ms, db->opts.retain_failed_ms};
    uint64_t n, total;
    int k, b, more = 0;

    for (k = 0; k < 2; k++) {
        if (keep[k] <= 0)
            continue;
        total = 0;
        for (b = 0; b < RETAIN_BATCHES && !stats_stopping(db); b++) {
            dsp_strbuf_reset(&x->sql);
            dsp_db_sql_retention(&x->sql, states[k], wall_ms() - keep[k], RETAIN_BATCH);
            if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
                if (total)
                    log_info(db->log, "retention deleted %" PRIu64 " %s row(s)", total,
                             states[k] == 2 ? "SUCCESSFUL" : "FAILED");
                return -1;
            }
            total += n;
            atomic_fetch_add_explicit(&db->retention_deleted, n, memory_order_relaxed);
            if (n < RETAIN_BATCH)
                break;
        }
        if (b == RETAIN_BATCHES)
            more = 1;
        if (total)
            log_info(db->log, "retention deleted %" PRIu64 " %s row(s)", total,
                     states[k] == 2 ? "SUCCESSFUL" : "FAILED");
    }
    return more;
}

static void requeue_answer(dsp_db *db, uint64_t request_id, int64_t rows)
{
    struct msg *m = dsp_dbi_msg_new(MSG_REQUEUED);

    if (m == NULL) {
        log_error(db->log, "out of memory answering requeue request %" PRIu64, request_id);
        return;
    }
    m->request_id = request_id;
    m->rows = rows;
    dsp_dbi_post(db, m);
}

static void dsp_dbi_requeue_req_free(struct requeue_req *r)
{
    if (r) {
        free(r->type);
        free(r);
    }
}

/* Moves the FAILED rows of r back to NEW, in batches, and answers. */
static void stats_requeue(struct stats_ctx *x, struct requeue_req *r)
{
    dsp_db *db = x->db;
    uint64_t n = 0, total = 0;
    int64_t rows = -1;
    bool done = false;

    if (stats_connect(x, true) < 0) {
        log_warn(db->log, "requeue of FAILED rows: no database connection");
        goto out;
    }
    do {
        if (stats_stopping(db))
            break;
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_requeue_failed(&x->sql, r->type, wall_ms(), REQUEUE_BATCH);
        if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
            if (!x->sql.oom)
                stats_drop(x);
            break;
        }
        total += n;
        done = n < REQUEUE_BATCH;
    } while (!done);
    if (done)
        rows = (int64_t)total;
    if (total)
        log_info(db->log, "requeued %" PRIu64 " FAILED row(s) of %s%s", total,
                 r->type ? "type " : "every type", r->type ? r->type : "");
    if (rows < 0)
        log_warn(db->log, "requeue of FAILED rows stopped after %" PRIu64 " row(s)", total);
out:
    requeue_answer(db, r->request_id, rows);
    dsp_dbi_requeue_req_free(r);
}

/* One round: the figures (when enabled), then retention (when enabled and due: after
 * the refresh, but at most every RETAIN_EVERY_MS unless the last round left more). */
static void stats_round(struct stats_ctx *x, bool refresh, bool retain)
{
    int rc;

    if (stats_connect(x, false) < 0)
        return;
    if (refresh && stats_refresh(x) < 0) {
        stats_drop(x);
        return;
    }
    if (retain && mono_ms() >= x->next_retain) {
        rc = stats_retention(x);
        x->next_retain = mono_ms() + (rc == 1 ? 0 : RETAIN_EVERY_MS);
        if (rc < 0)
            stats_drop(x);
    }
}

static void *dsp_dbi_stats_main(void *arg)
{
    dsp_db *db = arg;
    struct stats_ctx x;
    struct requeue_req *r, *pending;
    const dsp_db_options *o = &db->opts;
    bool refresh = o->table_stats_ms > 0;
    bool retain = o->retain_succeeded_ms > 0 || o->retain_failed_ms > 0;
    int64_t period = refresh ? o->table_stats_ms : retain ? RETAIN_EVERY_MS : 0;
    int64_t next_round = period > 0 ? mono_ms() : INT64_MAX;

    memset(&x, 0, sizeof x);
    x.db = db;
    x.c.db = db;
    x.c.who = "stats";
    x.c.rng = (uint64_t)mono_us() * 0x94D049BB133111EBULL ^ (uint64_t)(uintptr_t)&x;
    if (x.c.rng == 0)
        x.c.rng = 1;
    x.work = malloc(sizeof *x.work);
    mysql_thread_init();
    if (x.work == NULL) {
        log_error(db->log, "stats thread: out of memory; no table figures");
        refresh = false;
    }

    pthread_mutex_lock(&db->mu);
    for (;;) {
        int64_t now, at;

        if (db->stats_stop)
            break;
        if ((r = db->rq_head) != NULL) {
            db->rq_head = r->next;
            if (db->rq_head == NULL)
                db->rq_tail = &db->rq_head;
            pthread_mutex_unlock(&db->mu);
            stats_requeue(&x, r);
            pthread_mutex_lock(&db->mu);
            continue;
        }
        now = mono_ms();
        at = next_round;
        if (at != INT64_MAX && x.c.m == NULL && x.next_connect > at)
            at = x.next_connect;
        if (now >= at) {
            pthread_mutex_unlock(&db->mu);
            next_round = now + period;
            stats_round(&x, refresh, retain);
            pthread_mutex_lock(&db->mu);
            continue;
        }
        if (at == INT64_MAX)
            pthread_cond_wait(&db->stats_cv, &db->mu);
        else
            cond_wait_until(&db->stats_cv, &db->mu, at);
    }
    db->stats_exited = true;
    pending = db->rq_head;
    db->rq_head = NULL;
    db->rq_tail = &db->rq_head;
    pthread_mutex_unlock(&db->mu);

    for (; pending; pending = r) {
        r = pending->next;
        requeue_answer(db, pending->request_id, -1);
        dsp_dbi_requeue_req_free(pending);
    }
    dsp_dbi_conn_close(&x.c);
    dsp_strbuf_free(&x.sql);
    free(x.work);
    mysql_thread_end();
    return NULL;
}

/* ---- the API ---- */

size_t dsp_db_lock_name(const char *dbname, char *out, size_t cap)
{
    char name[sizeof "taskpush." + LOCK_NAME_MAX];
    size_t nl;

    snprintf(name, sizeof name, "taskpush.%s", dbname);
    nl = dsp_utf8_cut((const uint8_t *)name, dsp_utf8_valid_prefix((const uint8_t *)name, strlen(name)),
                      LOCK_NAME_MAX);
    if (nl == 0 || nl >= cap)
        return 0;
    memcpy(out, name, nl);
    out[nl] = '\0';
    return nl;
}

dsp_db *dsp_db_new(const dsp_db_options *opts)
{
    dsp_db *db;
    pthread_condattr_t ca;
    char name[LOCK_NAME_MAX + 1];
    size_t nl;
    int mu_ok = 0, cv1 = 0, cv2 = 0, cv3 = 0;

    if (opts == NULL || opts->url == NULL || opts->log == NULL || opts->base == NULL ||
        opts->url->dbname == NULL)
        return NULL;
    if ((db = calloc(1, sizeof *db)) == NULL)
        return NULL;
    db->opts = *opts;
    db->log = opts->log;
    db->max_batch = opts->max_write_batch ? opts->max_write_batch : 1;
    db->mtail = &db->mhead;
    db->rq_tail = &db->rq_head;
    db->retry_due_ms = INT64_MAX;
    db->tstats = calloc(1, sizeof *db->tstats);
    if (db->tstats)
        db->tstats->oldest_ready_age_ms = -1;
    atomic_init(&db->loop_epoch, 0);
    atomic_init(&db->statements, 0);
    atomic_init(&db->claims, 0);
    atomic_init(&db->claimed_rows, 0);
    atomic_init(&db->claim_us_total, 0);
    atomic_init(&db->write_batches, 0);
    atomic_init(&db->reconnects, 0);
    atomic_init(&db->retention_deleted, 0);
    atomic_init(&db->leader, false);
    atomic_init(&db->epoch, 0);

    mu_ok = pthread_mutex_init(&db->mu, NULL) == 0;
    if (pthread_condattr_init(&ca) == 0) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        cv1 = pthread_cond_init(&db->claim_cv, &ca) == 0;
        cv2 = pthread_cond_init(&db->write_cv, &ca) == 0;
        cv3 = pthread_cond_init(&db->stats_cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }

    /* The leadership lock: 'taskpush.<dbname>', at most 64 bytes. */
    nl = dsp_db_lock_name(opts->url->dbname, name, sizeof name);
    dsp_strbuf_puts(&db->get_lock_sql, "SELECT GET_LOCK(");
    dsp_strbuf_put_hex(&db->get_lock_sql, (const uint8_t *)name, nl, true);
    dsp_strbuf_printf(&db->get_lock_sql, ", %d)", LOCK_TRY_S);
    dsp_strbuf_puts(&db->release_lock_sql, "SELECT RELEASE_LOCK(");
    dsp_strbuf_put_hex(&db->release_lock_sql, (const uint8_t *)name, nl, true);
    dsp_strbuf_puts(&db->release_lock_sql, ")");

    db->wake_ev = event_new(opts->base, -1, 0, wake_cb, db);
    if (!mu_ok || !cv1 || !cv2 || !cv3 || db->wake_ev == NULL || db->get_lock_sql.oom ||
        db->release_lock_sql.oom || nl == 0 || db->tstats == NULL) {
        if (db->wake_ev)
            event_free(db->wake_ev);
        dsp_strbuf_free(&db->get_lock_sql);
        dsp_strbuf_free(&db->release_lock_sql);
        if (cv1)
            pthread_cond_destroy(&db->claim_cv);
        if (cv2)
            pthread_cond_destroy(&db->write_cv);
        if (cv3)
            pthread_cond_destroy(&db->stats_cv);
        free(db->tstats);
        if (mu_ok)
            pthread_mutex_destroy(&db->mu);
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
    if (pthread_create(&db->stats_thr, NULL, dsp_dbi_stats_main, db) != 0) {
        log_error(db->log, "cannot start the stats thread");
        dsp_db_stop(db, 0);
        return -1;
    }
    db->stats_thread_ok = true;
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
    int64_t now = mono_ms();
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
        for (i = 0; i < n; i++) {
            dst[i].o = outcomes[i];
            dst[i].epoch = epoch;
            dst[i].queued_ms = now;
        }
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

void dsp_db_stop(dsp_db *db, int64_t deadline_ms)
{
    if (!db->started || db->stopped)
        return;
    pthread_mutex_lock(&db->mu);
    db->stop_claims = true;
    db->accepting = false;
    db->write_stop = true;
    db->stats_stop = true;
    db->write_deadline_ms = mono_ms() + (deadline_ms > 0 ? deadline_ms : 0);
    pthread_cond_broadcast(&db->claim_cv);
    pthread_cond_broadcast(&db->write_cv);
    pthread_cond_broadcast(&db->stats_cv);
    pthread_mutex_unlock(&db->mu);

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
    /* It ends after its current statement; requests still queued are answered -1. */
    if (db->stats_thread_ok)
        pthread_join(db->stats_thr, NULL);
    db->stats_thread_ok = false;
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
    free(db->tstats);
    for (m = db->mhead; m; m = next) {
        next = m->next;
        msg_free(m);
    }
    event_free(db->wake_ev);
    dsp_strbuf_free(&db->get_lock_sql);
    dsp_strbuf_free(&db->release_lock_sql);
    pthread_cond_destroy(&db->claim_cv);
    pthread_cond_destroy(&db->write_cv);
    pthread_cond_destroy(&db->stats_cv);
    pthread_mutex_destroy(&db->mu);
    free(db);
}

void dsp_db_counters_get(dsp_db *db, dsp_db_counters *out)
{
    memset(out, 0, sizeof *out);
    if (db == NULL)
        return;
    out->statements = atomic_load_explicit(&db->statements, memory_order_relaxed);
    out->claims = atomic_load_explicit(&db->claims, memory_order_relaxed);
    out->claimed_rows = atomic_load_explicit(&db->claimed_rows, memory_order_relaxed);
    out->claim_us_total = atomic_load_explicit(&db->claim_us_total, memory_order_relaxed);
    out->write_batches = atomic_load_explicit(&db->write_batches, memory_order_relaxed);
    out->reconnects = atomic_load_explicit(&db->reconnects, memory_order_relaxed);
    out->leader = atomic_load(&db->leader);
    out->epoch = atomic_load(&db->epoch);
    pthread_mutex_lock(&db->mu);
    out->connected = db->healthy;
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
