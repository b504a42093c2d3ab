/* db_binlog: the wake follower (--wake auto|binlog|poll; docs/taskpushd.md, "Waking on
 * inserts"). While this dispatcher leads, a thread with its own connection follows the
 * server's binary log from its current end, as a replica does (Connector/C's
 * mariadb_rpl_*), and rings the claim's doorbell when a committed transaction wrote a
 * row of the task table that is NEW now: inserted, or put back to NEW by an UPDATE.
 *
 * The log is a doorbell, not the source of truth: claims still read the table, polling
 * goes on at --poll-ms, and every failure (a lost connection, a purged or rotated log, a
 * restart, an event this code cannot read) ends in "start again from the current end and
 * ring once", so a missed doorbell costs at most one poll interval, never a task.
 *
 * The doorbell reaches the loop as a MSG_WAKE, the way SUBMIT's committed rows do (the
 * loop then calls dsp_dispatch_claim_now); at most one wake-now message is queued at a
 * time, and rows due later (a future run_after) are told to the loop at most
 * WAKE_DUES_MAX at a time: a flood of inserts costs a bounded number of messages, and
 * the loop coalesces wake-ups while a claim runs.
 *
 * It never acknowledges as a semi-sync replica (no @rpl_semi_sync_slave, no
 * MARIADB_RPL_SEMI_SYNC), so a semi-sync primary never waits for it; its server_id is
 * drawn from WAKE_SERVER_ID_BASE .. + 65535 at each connect (docs say: keep real replicas
 * out of that range); a replica of the same id would make the server end the older
 * dump (MariaDB: error 4052), and the next connect draws another. /stats wake.server_id
 * shows the id in use, wake.last_end why the last stream ended.
 */
#include "binlog_event.h"
#include "db_internal.h"
#include "utf8.h"

#include <mariadb_rpl.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define WAKE_SERVER_ID_BASE 2052063232u /* 0x7A500000 */
#define WAKE_HEARTBEAT_NS "1000000000"  /* the server sends a heartbeat after 1 s idle */
#define WAKE_RW_TIMEOUT_S 5u            /* > the heartbeat: a dead server is noticed */
#define WAKE_BACKOFF_MIN_MS 100
#define WAKE_BACKOFF_MAX_MS 1000        /* "latency back within a second" after a restart */
#define WAKE_RECHECK_MS 30000           /* a server that cannot be followed is asked again */
#define WAKE_DUE_MERGE_MS 10            /* future dues this close share one wake-up */

struct dsp_binlog {
    pthread_t thr;
    bool thread_ok;
    pthread_cond_t cv;  /* under db->mu: stop, leadership changes */
    bool stop;
    int fd;             /* the replication stream's socket while following, else -1:
                         * dsp_dbi_binlog_stop shuts it down to end a blocked read */
    bool wake_posted;   /* a MSG_WAKE for now is queued, not delivered yet */
    bool rest;          /* under db->mu: a flood: leave the log until cleared (dsp_db_wake_rest) */
    int mode;           /* enum dsp_wake_mode in use */
    char reason[DSP_WAKE_REASON_MAX];
    /* Future dues posted to the loop and not yet passed (sorted), the follower's own. */
    int64_t dues[DSP_WAKE_DUES_MAX];
    size_t ndues;
    _Atomic uint64_t events, wakes, reconnects, unreadable, rests;
    uint32_t server_id;  /* under db->mu: the dump's server_id while following, else 0 */
    char last_end[DSP_WAKE_REASON_MAX]; /* under db->mu: why the last followed stream ended */
};

/* ---- status ---- */

static void set_status(dsp_db *db, int mode, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_status(dsp_db *db, int mode, const char *fmt, ...)
{
    struct dsp_binlog *b = db->binlog;
    char raw[DSP_WAKE_REASON_MAX], text[DSP_WAKE_REASON_MAX];
    va_list ap;
    bool changed;

    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* The text may carry a server's error message, in whatever character set the server
     * speaks: /stats and the log want UTF-8. */
    text[dsp_utf8_sanitize((const uint8_t *)raw, strlen(raw), (uint8_t *)text, sizeof text - 1)] = '\0';
    pthread_mutex_lock(&db->mu);
    changed = b->mode != mode || strcmp(b->reason, text) != 0;
    b->mode = mode;
    memcpy(b->reason, text, sizeof text);
    pthread_mutex_unlock(&db->mu);
    if (changed)
        dsp_log_at(db->log, mode == DSP_WAKE_BINLOG || db->opts.wake == DSP_WAKE_AUTO ? DSP_LOG_INFO : DSP_LOG_WARN, "wake: %s: %s",
                   mode == DSP_WAKE_BINLOG ? "binlog" : "poll", text);
}

void dsp_db_wake_status(dsp_db *db, dsp_wake_status *out)
{
    memset(out, 0, sizeof *out);
    out->mode = DSP_WAKE_POLL;
    if (db == NULL || db->binlog == NULL) {
        snprintf(out->reason, sizeof out->reason, "%s",
                 db && db->opts.wake == DSP_WAKE_POLL ? "--wake poll" : "no database");
        return;
    }
    struct dsp_binlog *b = db->binlog;
    pthread_mutex_lock(&db->mu);
    out->mode = b->mode;
    memcpy(out->reason, b->reason, sizeof out->reason);
    out->server_id = b->server_id;
    out->resting = b->rest;
    memcpy(out->last_end, b->last_end, sizeof out->last_end);
    pthread_mutex_unlock(&db->mu);
    out->rests = atomic_load_explicit(&b->rests, memory_order_relaxed);
    out->events = atomic_load_explicit(&b->events, memory_order_relaxed);
    out->wakes = atomic_load_explicit(&b->wakes, memory_order_relaxed);
    out->reconnects = atomic_load_explicit(&b->reconnects, memory_order_relaxed);
    out->unreadable = atomic_load_explicit(&b->unreadable, memory_order_relaxed);
}

const char *dsp_wake_mode_name(int mode)
{
    return mode == DSP_WAKE_BINLOG ? "binlog" : mode == DSP_WAKE_POLL ? "poll" : "auto";
}

void dsp_db_wake_rest(dsp_db *db, bool rest)
{
    struct dsp_binlog *b = db ? db->binlog : NULL;
    if (b == NULL)
        return;
    pthread_mutex_lock(&db->mu);
    if (b->rest != rest) {
        b->rest = rest;
        if (rest)
            atomic_fetch_add_explicit(&b->rests, 1, memory_order_relaxed);
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&db->mu);
}

/* ---- the doorbell ---- */

/* Wakes the claim at once: one message at a time (the loop clears wake_posted). */
static void ring_now(dsp_db *db)
{
    struct dsp_binlog *b = db->binlog;
    struct msg *m = NULL;

    atomic_fetch_add_explicit(&b->wakes, 1, memory_order_relaxed);
    pthread_mutex_lock(&db->mu);
    if (!b->wake_posted && (m = dsp_dbi_msg_new(MSG_WAKE)) != NULL) {
        b->wake_posted = true;
        m->rows = 0;
        dsp_dbi_post_locked(db, m);
    }
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
}

/* Rows due at due_wall (ms since 1970): the claim thread promotes them then (as for a
 * SUBMIT with a delay), and the loop claims then. Dues within WAKE_DUE_MERGE_MS of one
 * posted share it; past DSP_WAKE_DUES_MAX the latest are left to the poll. */
static void ring_at(dsp_db *db, int64_t due_wall)
{
    struct dsp_binlog *b = db->binlog;
    int64_t now = dsp_wall_ms();
    size_t i, k = 0;
    struct msg *m = NULL;

    for (i = 0; i < b->ndues; i++) /* forget the passed ones */
        if (b->dues[i] > now)
            b->dues[k++] = b->dues[i];
    b->ndues = k;
    for (i = 0; i < b->ndues; i++)
        if (b->dues[i] - WAKE_DUE_MERGE_MS <= due_wall && due_wall <= b->dues[i] + WAKE_DUE_MERGE_MS)
            return;
    if (b->ndues == DSP_WAKE_DUES_MAX && due_wall > b->dues[b->ndues - 1])
        return;
    if (b->ndues == DSP_WAKE_DUES_MAX)
        b->ndues--; /* the latest goes: the poll covers it */
    for (i = b->ndues; i > 0 && b->dues[i - 1] > due_wall; i--)
        b->dues[i] = b->dues[i - 1];
    b->dues[i] = due_wall;
    b->ndues++;

    pthread_mutex_lock(&db->mu);
    if (due_wall < db->retry_due_ms) {
        db->retry_due_ms = due_wall;
        pthread_cond_signal(&db->claim_cv);
    }
    if ((m = dsp_dbi_msg_new(MSG_WAKE)) != NULL) {
        m->rows = due_wall;
        dsp_dbi_post_locked(db, m);
    }
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
}

void dsp_dbi_binlog_delivered(dsp_db *db, int64_t due_wall)
{
    if (db->binlog && due_wall == 0) {
        pthread_mutex_lock(&db->mu);
        db->binlog->wake_posted = false;
        pthread_mutex_unlock(&db->mu);
    }
}

/* ---- one session ---- */

struct follow {
    dsp_db *db;
    struct dbconn c;
    MARIADB_RPL *rpl;
    char file[512];
    unsigned long long pos;
    bool mysql_server;
    bool row_format;
    unsigned long own_server_id; /* the server's @@server_id: never the follower's */
    unsigned server_id;          /* the dump's server_id (rpl_start draws it) */
    dsp_binlog_task_cols cols;
    dsp_binlog_table map;   /* the latest TABLE_MAP naming the task table */
    bool map_valid;
    bool pending_now;       /* this transaction made a row NEW, due now */
    int64_t pending_due;    /* ... or due then (DSP_BINLOG_DUE_NONE: none) */
};

static bool stopping(dsp_db *db)
{
    bool s;
    pthread_mutex_lock(&db->mu);
    s = db->binlog->stop;
    pthread_mutex_unlock(&db->mu);
    return s;
}

/* Stopped, or asked to rest: the session leaves the log. */
static bool leaving(dsp_db *db)
{
    bool s;
    pthread_mutex_lock(&db->mu);
    s = db->binlog->stop || db->binlog->rest;
    pthread_mutex_unlock(&db->mu);
    return s;
}

/* Waits while resting (and not stopped). */
static void rest_while_asked(dsp_db *db)
{
    pthread_mutex_lock(&db->mu);
    while (db->binlog->rest && !db->binlog->stop)
        cond_wait_until(&db->binlog->cv, &db->mu, dsp_now_ms() + 1000);
    pthread_mutex_unlock(&db->mu);
}

/* Waits up to ms, or until stopped (or, want_leader, until leadership is taken). */
static void nap(dsp_db *db, int64_t ms, bool want_leader)
{
    int64_t until = dsp_now_ms() + ms;
    pthread_mutex_lock(&db->mu);
    while (!db->binlog->stop && dsp_now_ms() < until && !(want_leader && atomic_load(&db->leader)))
        cond_wait_until(&db->binlog->cv, &db->mu, until < dsp_now_ms() + 200 ? until : dsp_now_ms() + 200);
    pthread_mutex_unlock(&db->mu);
}

/* Runs sql and copies the first row's first ncols fields (NULL: ""). 0, -1 (errno in c->err),
 * or 1 (no row). */
static int query_row(struct follow *f, const char *sql, char (*out)[128], unsigned ncols)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 1;

    atomic_fetch_add_explicit(&f->db->statements, 1, memory_order_relaxed);
    if (mysql_query(f->c.m, sql) != 0 || (res = mysql_store_result(f->c.m)) == NULL) {
        f->c.err = mysql_errno(f->c.m);
        return -1;
    }
    if ((row = mysql_fetch_row(res)) != NULL && mysql_num_fields(res) >= ncols) {
        for (unsigned i = 0; i < ncols; i++)
            snprintf(out[i], sizeof out[i], "%s", row[i] ? row[i] : "");
        rc = 0;
    }
    mysql_free_result(res);
    return rc;
}

/* Checks that this server can be followed and where its log ends. 0: follow; 1: poll
 * (status set, reason given); -1: a connection error (retry soon). */
static int prepare(struct follow *f)
{
    dsp_db *db = f->db;
    int want = db->opts.wake;
    char v[5][128];
    char sql[512];

    f->mysql_server = f->c.mysql;
    if (query_row(f, "SELECT @@log_bin, @@binlog_format, @@server_id", v, 3) != 0)
        return -1;
    if (strcmp(v[0], "1") != 0) {
        set_status(db, DSP_WAKE_POLL, "the server has no binary log (log_bin is OFF)");
        return 1;
    }
    f->row_format = strcasecmp(v[1], "ROW") == 0;
    if (!f->row_format && want == DSP_WAKE_AUTO) {
        set_status(db, DSP_WAKE_POLL,
                   "binlog_format is %.16s: --wake auto follows only ROW (--wake binlog follows "
                   "%.16s too, waking on INSERTs that name the table)", v[1], v[1]);
        return 1;
    }
    f->own_server_id = strtoul(v[2], NULL, 10);
    /* Galera (MariaDB's wsrep): only with log_slave_updates does a node's log hold the
     * other nodes' writes. Asked apart: MySQL has neither variable under these names. */
    if (!f->mysql_server && query_row(f, "SELECT @@wsrep_on, @@log_slave_updates", v, 2) == 0 &&
        strcmp(v[0], "1") == 0 && strcmp(v[1], "1") != 0) {
        set_status(db, DSP_WAKE_POLL, "a Galera node without log_slave_updates: rows written "
                                      "through other nodes are not in its binary log");
        return 1;
    }
    /* Where the log ends: SHOW MASTER STATUS (MariaDB, MySQL 8.0), SHOW BINARY LOG STATUS
     * (MySQL 8.2 on, the only one in 8.4). BINLOG MONITOR or REPLICATION CLIENT. */
    int rc = query_row(f, "SHOW MASTER STATUS", v, 2);
    if (rc < 0 && f->c.err == 1064)
        rc = query_row(f, "SHOW BINARY LOG STATUS", v, 2);
    if (rc < 0 && (f->c.err == 1227 || f->c.err == 1142)) {
        set_status(db, DSP_WAKE_POLL, "the user may not read the binary log's position: %.150s "
                   "(GRANT BINLOG MONITOR on MariaDB, REPLICATION CLIENT on MySQL)", mysql_error(f->c.m));
        return 1;
    }
    if (rc < 0)
        return -1;
    if (rc > 0 || v[0][0] == '\0') {
        set_status(db, DSP_WAKE_POLL, "the server has no binary log (SHOW MASTER STATUS is empty)");
        return 1;
    }
    snprintf(f->file, sizeof f->file, "%s", v[0]);
    f->pos = strtoull(v[1], NULL, 10);

    /* The task table's shape: its column count and where task_state and run_after are. */
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*), MAX(IF(COLUMN_NAME = 'task_state', ORDINAL_POSITION, 0)), "
             "MAX(IF(COLUMN_NAME = 'run_after', ORDINAL_POSITION, 0)) FROM information_schema.COLUMNS "
             "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '%s'", db->names.task);
    if (query_row(f, sql, v, 3) != 0)
        return -1;
    unsigned long n = strtoul(v[0], NULL, 10), st = strtoul(v[1], NULL, 10), ra = strtoul(v[2], NULL, 10);
    if (n == 0 || n > DSP_BINLOG_COLS_MAX || st == 0 || ra == 0) {
        set_status(db, DSP_WAKE_POLL, "the table %s is not taskpush's shape yet", db->names.task);
        return 1;
    }
    f->cols.ncols = (uint32_t)n;
    f->cols.state = (uint32_t)st - 1;
    f->cols.run_after = (uint32_t)ra - 1;

    /* Heartbeats while idle: the read timeout stays armed and leadership is looked at. */
    /* Events keep their checksum (the server refuses a replica that cannot take them;
     * the last 4 bytes of each are skipped). User variables that the dump thread reads:
     * MySQL 8.0.26 and later also know the source_ names. */
    if (dsp_dbi_exec_str(&f->c, "SET @master_heartbeat_period = " WAKE_HEARTBEAT_NS
                                ", @source_heartbeat_period = " WAKE_HEARTBEAT_NS
                                ", @master_binlog_checksum = @@global.binlog_checksum"
                                ", @source_binlog_checksum = @@global.binlog_checksum") < 0)
        return -1;
    return 0;
}

static int rpl_start(struct follow *f, unsigned long own_server_id)
{
    uint64_t r = f->c.rng;
    unsigned sid;

    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    f->c.rng = r ? r : 1;
    sid = WAKE_SERVER_ID_BASE + (unsigned)(r & 0xffff);
    if (sid == own_server_id)
        sid++;
    f->server_id = sid;
    if ((f->rpl = mariadb_rpl_init(f->c.m)) == NULL)
        return -1;
    if (mariadb_rpl_optionsv(f->rpl, MARIADB_RPL_FILENAME, f->file, strlen(f->file)) != 0 ||
        mariadb_rpl_optionsv(f->rpl, MARIADB_RPL_START, (unsigned long)f->pos) != 0 ||
        mariadb_rpl_optionsv(f->rpl, MARIADB_RPL_SERVER_ID, sid) != 0 ||
        mariadb_rpl_optionsv(f->rpl, MARIADB_RPL_FLAGS, 0) != 0)
        return -1;
    atomic_fetch_add_explicit(&f->db->statements, 1, memory_order_relaxed);
    if (mariadb_rpl_open(f->rpl) != 0) {
        f->c.err = mysql_errno(f->c.m);
        return -1;
    }
    return 0;
}

/* The transaction ended: ring for what it made NEW. */
static void flush_pending(struct follow *f)
{
    if (f->pending_now)
        ring_now(f->db);
    else if (f->pending_due != DSP_BINLOG_DUE_NONE) {
        if (f->pending_due <= dsp_wall_ms())
            ring_now(f->db);
        else
            ring_at(f->db, f->pending_due);
    }
    f->pending_now = false;
    f->pending_due = DSP_BINLOG_DUE_NONE;
}

static void handle(struct follow *f, const uint8_t *ev, size_t len, bool checksum)
{
    dsp_db *db = f->db;
    struct dsp_binlog *b = db->binlog;
    dsp_binlog_header h;

    atomic_fetch_add_explicit(&b->events, 1, memory_order_relaxed);
    if (dsp_binlog_header_parse(ev, len, &h) < 0)
        return; /* the library's artificial events may not carry a matching size */
    size_t blen = len - DSP_BINLOG_HEADER_LEN;
    if (checksum && h.type != DSP_BINLOG_HEARTBEAT) /* the 4 bytes of CRC32 */
        blen = blen >= 4 ? blen - 4 : 0;
    const uint8_t *body = ev + DSP_BINLOG_HEADER_LEN;

    if (h.type == DSP_BINLOG_TABLE_MAP) {
        dsp_binlog_table t;
        if (dsp_binlog_table_map_parse(body, blen, &t) == 0 && strcmp(t.table, db->names.task) == 0 &&
            db->opts.url && db->opts.url->dbname && strcmp(t.db, db->opts.url->dbname) == 0) {
            f->map = t;
            f->map_valid = true;
        }
    } else if (dsp_binlog_is_rows(h.type)) {
        uint64_t id;
        dsp_binlog_rows rows;
        if (!f->map_valid || dsp_binlog_rows_table_id(body, blen, &id) < 0 || id != f->map.table_id)
            return;
        if (dsp_binlog_rows_scan(h.type, body, blen, &f->map, &f->cols, &rows) < 0) {
            atomic_fetch_add_explicit(&b->unreadable, 1, memory_order_relaxed);
            f->pending_now = true;
        } else if (rows.new_rows > 0) {
            if (rows.earliest_due <= dsp_wall_ms())
                f->pending_now = true;
            else if (rows.earliest_due < f->pending_due)
                f->pending_due = rows.earliest_due;
        }
    } else if (h.type == DSP_BINLOG_QUERY) {
        switch (dsp_binlog_query_kind(body, blen, db->names.task)) {
        case DSP_BINLOG_Q_TASK_WRITE: /* MIXED or STATEMENT: the row's values are not read */
            f->pending_now = true;
            break;
        case DSP_BINLOG_Q_COMMIT:
            flush_pending(f);
            break;
        default:
            break;
        }
    } else if (h.type == 40) {
        /* MySQL's TRANSACTION_PAYLOAD (binlog_transaction_compression): the transaction's
         * events are compressed inside; not read, so any such transaction rings. */
        atomic_fetch_add_explicit(&b->unreadable, 1, memory_order_relaxed);
        f->pending_now = true;
        flush_pending(f);
    } else if (h.type == DSP_BINLOG_XID) {
        flush_pending(f);
    } else if (h.type == DSP_BINLOG_HEARTBEAT || h.type == 162 /* MariaDB GTID */ ||
               h.type == 33 /* MySQL GTID */) {
        flush_pending(f); /* a transaction without XID (a non-transactional table) ended */
    }
}

/* One session: connect, check, follow until an error, leadership lost or stop. Returns
 * 1 when the server cannot be followed (recheck later), 0 after a session that followed,
 * -1 after a failure before following. */
static int session(struct follow *f)
{
    dsp_db *db = f->db;
    int rc = -1;
    bool announced = false; /* the dump was accepted: this session followed */

    f->map_valid = false;
    f->pending_now = false;
    f->pending_due = DSP_BINLOG_DUE_NONE;
    if (dsp_dbi_conn_open(&f->c, true, false) < 0) {
        set_status(db, DSP_WAKE_POLL, "cannot connect to follow the binary log: %.150s", f->c.errtext);
        return -1;
    }
    if ((rc = prepare(f)) != 0)
        goto done;
    if (rpl_start(f, f->own_server_id) < 0) {
        rc = -1;
        goto fail_rpl;
    }
    pthread_mutex_lock(&db->mu);
    db->binlog->fd = (int)mysql_get_socket(f->c.m);
    if (db->binlog->stop && db->binlog->fd >= 0)
        shutdown(db->binlog->fd, SHUT_RDWR);
    pthread_mutex_unlock(&db->mu);
    /* The first event answers the dump: a refused privilege or a purged file shows here. */
    for (;;) {
        MARIADB_RPL_EVENT *ev;
        if (leaving(db) || !atomic_load(&db->leader)) {
            rc = 0;
            break;
        }
        if ((ev = mariadb_rpl_fetch(f->rpl, NULL)) == NULL) {
            f->c.err = mysql_errno(f->c.m);
            rc = announced ? 0 : -1;
            goto fail_rpl;
        }
        if (!announced && ev->event_type == FORMAT_DESCRIPTION_EVENT) {
            /* The dump was accepted: the server's own description of its log comes first. */
            announced = true;
            pthread_mutex_lock(&db->mu);
            db->binlog->server_id = f->server_id;
            pthread_mutex_unlock(&db->mu);
            set_status(db, DSP_WAKE_BINLOG, "following the binary log (%s format) from %.200s:%llu",
                       f->row_format ? "ROW" : "MIXED or STATEMENT", f->file, f->pos);
            ring_now(db); /* rows inserted before this position: claim once */
        }
        if (ev->raw_data && ev->raw_data_size > 1)
            handle(f, ev->raw_data + 1, ev->raw_data_size - 1, f->rpl->use_checksum != 0);
        mariadb_free_rpl_event(ev);
    }
    goto done;
fail_rpl:
    if (f->c.err == 1227 || f->c.err == 1045 || f->c.err == 1142) {
        set_status(db, DSP_WAKE_POLL, "the user may not replicate: %.150s (GRANT REPLICATION SLAVE)",
                   mysql_error(f->c.m));
        rc = 1;
    } else if (!stopping(db)) {
        log_info(db->log, "wake: the binary log's stream ended: %s (error %u); following again from "
                          "its end", f->c.m ? mysql_error(f->c.m) : "?", f->c.err);
        /* /stats wake.last_end: e.g. another replica's dump with the same server_id made
         * the server end this one (it keeps the newer); the next session draws another. */
        if (announced) {
            pthread_mutex_lock(&db->mu);
            snprintf(db->binlog->last_end, sizeof db->binlog->last_end,
                     "the stream as server_id %u ended: %.150s (error %u)", f->server_id,
                     f->c.m ? mysql_error(f->c.m) : "?", f->c.err);
            pthread_mutex_unlock(&db->mu);
        }
    }
done:
    pthread_mutex_lock(&db->mu);
    db->binlog->fd = -1; /* before the socket is closed: its number may be reused */
    db->binlog->server_id = 0;
    pthread_mutex_unlock(&db->mu);
    if (f->rpl) {
        mariadb_rpl_close(f->rpl);
        f->rpl = NULL;
    }
    dsp_dbi_conn_close(&f->c);
    return rc;
}

static void *binlog_main(void *arg)
{
    dsp_db *db = arg;
    struct dsp_binlog *b = db->binlog;
    struct follow f;
    int64_t backoff = WAKE_BACKOFF_MIN_MS;
    bool followed_once = false;

    memset(&f, 0, sizeof f);
    f.db = db;
    f.c.db = db;
    f.c.who = "binlog";
    f.c.quiet = true;
    f.c.rw_timeout_s = WAKE_RW_TIMEOUT_S;
    f.c.rng = (uint64_t)dsp_now_us() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)&f;
    if (f.c.rng == 0)
        f.c.rng = 1;
    mysql_thread_init();
    while (!stopping(db)) {
        pthread_mutex_lock(&db->mu);
        bool rest = b->rest;
        pthread_mutex_unlock(&db->mu);
        if (rest) {
            set_status(db, DSP_WAKE_POLL, "resting in a flood of inserts: claims at --poll-ms take every row "
                                          "committed; following again when a claim finds fewer than 2");
            rest_while_asked(db);
            f.c.ever_connected = false; /* following again is no lost connection (db.reconnects_total) */
            continue;
        }
        if (!atomic_load(&db->leader)) {
            if (followed_once)
                set_status(db, DSP_WAKE_POLL, "not leading: only the leader follows the binary log");
            nap(db, 1000, true);
            continue;
        }
        int64_t began = dsp_now_ms();
        int rc = session(&f);
        if (rc == 0)
            followed_once = true;
        if (stopping(db))
            break;
        if (rc == 0 && leaving(db))
            continue; /* asked to rest: not a lost stream */
        atomic_fetch_add_explicit(&b->reconnects, 1, memory_order_relaxed);
        if (rc == 1) { /* cannot be followed: polling; ask again later */
            nap(db, WAKE_RECHECK_MS, false);
            continue;
        }
        if (rc == 0 && dsp_now_ms() - began > 5000)
            backoff = WAKE_BACKOFF_MIN_MS;
        if (!atomic_load(&db->leader))
            continue;
        pthread_mutex_lock(&db->mu);
        if (b->mode == DSP_WAKE_BINLOG)
            snprintf(b->reason, sizeof b->reason, "reconnecting to the binary log (polling meanwhile)");
        b->mode = DSP_WAKE_POLL;
        pthread_mutex_unlock(&db->mu);
        nap(db, backoff, false);
        backoff = backoff * 2 > WAKE_BACKOFF_MAX_MS ? WAKE_BACKOFF_MAX_MS : backoff * 2;
    }
    mysql_thread_end();
    return NULL;
}

/* ---- start and stop (db.c) ---- */

int dsp_dbi_binlog_start(dsp_db *db)
{
    struct dsp_binlog *b;
    pthread_condattr_t ca;
    bool cv_ok = false;

    if (db->opts.wake == DSP_WAKE_POLL)
        return 0;
    if ((b = calloc(1, sizeof *b)) == NULL)
        return -1;
    if (pthread_condattr_init(&ca) == 0) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        cv_ok = pthread_cond_init(&b->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!cv_ok) {
        free(b);
        return -1;
    }
    b->mode = DSP_WAKE_POLL;
    b->fd = -1;
    snprintf(b->reason, sizeof b->reason, "not leading yet: only the leader follows the binary log");
    atomic_init(&b->events, 0);
    atomic_init(&b->wakes, 0);
    atomic_init(&b->reconnects, 0);
    atomic_init(&b->unreadable, 0);
    atomic_init(&b->rests, 0);
    db->binlog = b;
    if (pthread_create(&b->thr, NULL, binlog_main, db) != 0) {
        db->binlog = NULL;
        pthread_cond_destroy(&b->cv);
        free(b);
        return -1;
    }
    b->thread_ok = true;
    return 0;
}

void dsp_dbi_binlog_stop(dsp_db *db)
{
    struct dsp_binlog *b = db->binlog;
    if (b == NULL || !b->thread_ok)
        return;
    pthread_mutex_lock(&db->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    if (b->fd >= 0) /* a blocked fetch returns at once (an error it takes for the end) */
        shutdown(b->fd, SHUT_RDWR);
    pthread_mutex_unlock(&db->mu);
    pthread_join(b->thr, NULL);
    b->thread_ok = false;
}

void dsp_dbi_binlog_free(dsp_db *db)
{
    if (db->binlog) {
        pthread_cond_destroy(&db->binlog->cv);
        free(db->binlog);
        db->binlog = NULL;
    }
}
