/* db_internal.h: what the files of taskpushd's database side (dispatcher/db/, the
 * threads db.h lists) share: the private struct dsp_db, the messages to the loop, one
 * MySQL connection (struct dbconn, db_conn.c) and its helpers. Included by db/ files
 * only; the loop sees db.h.
 */
#ifndef TASKPUSH_DSP_DB_INTERNAL_H
#define TASKPUSH_DSP_DB_INTERNAL_H

#include "db.h"

#include "clock.h"
#include "db_sql.h"
#include "shard.h"
#include "taskmap.h"

#include <mysql.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Server error numbers (mysqld_error.h has them, but not under the same names in every
 * client library version). */
#define ER_CON_COUNT_ERROR_ 1040
#define ER_DBACCESS_DENIED_ERROR_ 1044
#define ER_ACCESS_DENIED_ERROR_ 1045
#define ER_BAD_DB_ERROR_ 1049
#define ER_ACCESS_DENIED_NO_PASSWORD_ERROR_ 1698 /* a socket-authenticated login refused */
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

/* ---- waiting ---- */

/* Waits on cv (created with CLOCK_MONOTONIC) until the monotonic time until_ms. */
static inline void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms)
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
    MSG_REQUEUED,
    MSG_TASKOP,
    MSG_SUBMITTED,
    MSG_OUTCOME,
    MSG_WAKE, /* the wake follower's doorbell: rows = due (ms since 1970), 0 for now */
    MSG_SETTINGS
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
    dsp_taskop *op;      /* MSG_TASKOP: the request with its answer */
    dsp_submit_req *sreq;         /* MSG_SUBMITTED: the request with its answer */
    dsp_submit_outcome *outcome;  /* MSG_OUTCOME */
    dsp_setting *settings;        /* MSG_SETTINGS (rows is -1 when none could be read) */
    size_t nsettings;
};

/* A queued dsp_db_taskop. */
struct taskop_req {
    struct taskop_req *next;
    dsp_taskop *op;
};

/* A queued dsp_db_requeue_failed, or a runtime setting's write or load (the same queue
 * of the stats thread, in order). */
enum requeue_kind { REQ_REQUEUE = 0, REQ_SETTING_SAVE, REQ_SETTINGS_LOAD, REQ_PROGRESS };
struct requeue_req {
    struct requeue_req *next;
    char *type; /* NULL: every type */
    uint64_t request_id;
    enum requeue_kind kind;
    enum dsp_setting_what what; /* REQ_SETTING_SAVE: of setting (its type is `type`) */
    dsp_setting setting;
    dsp_progress_row *prows;    /* REQ_PROGRESS: rows to store, ids to delete (owned) */
    size_t nprows;
    uint64_t *pgone;
    size_t npgone;
};

/* dsp_db_claim's copy of a request. */
struct claim_req {
    size_t ntypes;
    char **types;
    uint32_t *limits;
    uint32_t total;
    uint64_t max_bytes; /* dsp_claim_request.max_bytes */
};

/* A queued outcome. */
struct wentry {
    dsp_outcome o;
    uint32_t epoch;    /* the epoch the loop held when it queued it: the fence */
    int64_t queued_ms; /* monotonic */
    size_t bytes;      /* o.len when queued: what it adds to dsp_db.qbytes */
};

enum { CONN_CLAIM = 0, CONN_WRITE = 1 };

/* The connections the lease records (db_lease.c), so that a standby taking over can KILL
 * them; a connection's slot comes from its dbconn.who. */
/* The connections the lease records, so that a dispatcher taking over KILLs them all:
 * any of them may hold row locks (the claim helper's too, db_claim_helper.c). */
enum { LEASE_CONN_CLAIM = 0, LEASE_CONN_WRITE, LEASE_CONN_LEASE, LEASE_CONN_STATS,
       LEASE_CONN_HELPER, LEASE_NCONN };

/* The table's lease as this process knows it (db_lease.c); under dsp_db.mu. */
struct dsp_lease {
    bool held;              /* acquired and not given up (valid_until may still pass) */
    bool wanted;            /* the claim thread waits for it: the schema is one to use */
    bool stop;              /* dsp_db_stop: give the lease back and end */
    bool renew_now;         /* a connection waits to be recorded */
    uint64_t gen;           /* acquisitions so far; a claim thread serves one */
    int64_t valid_until;    /* monotonic ms: past it, nothing may act as leader */
    int64_t length_ms;      /* the lease's length and renewal in use (db_lease.c's */
    int64_t renew_ms;       /* lease_timing), 0 before the first connection */
    bool galera;            /* the lease connection's server is a Galera node */
    uint64_t holder;        /* this process's holder id, drawn at init, never 0; its
                             * connections hold the locks dsp_dbi_conn_lock_name names */
    uint64_t conn[LEASE_NCONN];     /* the connections' ids now (0: none) */
    uint64_t recorded[LEASE_NCONN]; /* the ids the lease row holds */
    pthread_cond_t cv;
    pthread_t thr;
    bool thread_ok;
};

#define DB_OPEN_CONNS_MAX 16 /* the database threads' connections, with room to spare */

struct dsp_db {
    dsp_db_options opts;
    const dsp_log *log;
    struct event *wake_ev;
    size_t max_batch;
    dsp_strbuf get_lock_sql;
    dsp_strbuf release_lock_sql;
    dsp_strbuf used_lock_sql; /* who holds the leadership lock (db_lease.c) */
    /* The shard's filter (dsp_db_sql_type_in) and its taskpush_meta rows: 'lease' and
     * 'epoch' when unsharded (in is then NULL), 'lease:NAME' and 'epoch:NAME' when not. */
    dsp_strbuf type_in;
    const char *in;
    char lease_row[48];
    char epoch_row[48];
    char shard[DSP_SHARD_NAME_MAX + 1]; /* "" when unsharded: task_claim.shard */
    /* The tables' names (--table), for every statement: set once in dsp_db_new. */
    dsp_table_names names;

    pthread_mutex_t mu;
    /* The open connections (db_conn.c), so that a node of --db's list that failed on one
     * of them stops holding the others in a statement; under conns_mu, taken alone. */
    pthread_mutex_t conns_mu;
    struct dbconn *open_conns[DB_OPEN_CONNS_MAX];
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
    /* Result and error bytes of the queue and of the batch being written
     * (--max-unwritten-bytes). Changed under mu; atomic so that the loop's check at each
     * dispatch pass reads it without taking mu. */
    _Atomic size_t qbytes;
    bool write_stop;
    int64_t write_deadline_ms; /* monotonic */
    bool write_exited;

    bool conn_ok[2];
    bool healthy;
    /* Why this dispatcher cannot do its job although connected (no schema, statements
     * failing in a loop); "" when none. dsp_db_problem reads it for /healthz. */
    char problem[DSP_DB_PROBLEM_MAX];

    struct dsp_lease lease; /* db_lease.c */

    /* The claims of claims_epoch whose task_claim row still lists a PROCESSING row of
     * ours (db_claim_log.c): seq -> struct open_claim. A claim's rows are settled by the
     * write thread as their outcomes are written; once all are, its seq moves to
     * settled, and the write thread deletes those rows of task_claim. */
    dsp_taskmap open_claims;
    uint32_t claims_epoch;
    uint64_t *settled;
    size_t nsettled, settled_cap;
    uint32_t settled_epoch;

    /* The stats thread. */
    bool stats_thread_ok;
    pthread_t stats_thr;
    bool stats_stop;             /* dsp_db_stop began */
    bool stats_exited;           /* requests are answered at once with -1 */
    struct requeue_req *rq_head; /* requeue requests, in order */
    struct requeue_req **rq_tail;
    struct taskop_req *top_head; /* task-level requests, in order (before requeues) */
    struct taskop_req **top_tail;
    dsp_table_stats *tstats;     /* the published figures (retention total aside) */

    /* The schedule thread (db_schedule.c). */
    pthread_cond_t sched_cv;
    pthread_t sched_thr;
    bool sched_thread_ok;
    bool sched_stop;
    dsp_schedule_list *schedules; /* the published listing, NULL before the first read */

    /* The epoch of the last on_leader delivered on the loop thread: outcomes queued
     * after it belong to it. */
    _Atomic uint32_t loop_epoch;

    /* The largest result the write connection can store (its max_allowed_packet, at
     * most the column's 16 MiB - 1); 0 before it first connected. The loop fails a
     * larger result at once (dsp_db_result_max). */
    _Atomic size_t result_max;

    _Atomic uint64_t statements, claims, claimed_rows, claim_us_total, write_batches,
        reconnects, retention_deleted, orphans_recovered, submitted_rows, submit_duplicates,
        submit_batches, submit_autocommit_batches, submit_us_total, submit_gather_us_total, submit_requests,
        claim_skipped, node_moves, cert_retries, claims_fenced, progress_rows_written, progress_rows_deleted,
        deps_released, deps_failed, deps_sweeps;
    /* Progress batches queued for the stats thread and not yet written: bounded, so that a
     * database away for long does not pile them up (dsp_db_progress_save). */
    _Atomic unsigned progress_pending;

    struct dsp_binlog *binlog; /* the wake follower (db_binlog.c); NULL with --wake poll */
    struct dsp_submitter *sub; /* the submit thread and the waited-for tasks (db_submit.c) */
    _Atomic bool leader;
    _Atomic uint32_t epoch;
    _Atomic uint64_t claim_seq;
    /* Rows with a group_key the submit thread inserted: a change makes the claim
     * thread's next claim take the fair read (db_claim_fair.h). */
    _Atomic uint64_t keyed_submits;
    /* Waiting tasks may exist (db_deps.c): true from the start (rows a producer inserted
     * before), set by a submission of one and by a sweep that found one, cleared by a
     * sweep that found none and by the leader's look that found no dependency row. While clear, the write thread skips the dependants'
     * statements after its batches (the sweep catches a race). */
    _Atomic bool deps_seen;
    /* Submissions that made tasks wait (dsp_dbi_deps_rows_exist): a change wakes the
     * leader's sweep, which otherwise looks for dependencies rarely while it knows of
     * none (db_stats.c, stats_deps). */
    _Atomic uint64_t deps_marks;
    struct dsp_deps_progress *deps; /* db_deps.c */ /* the last task_claim seq handed out (db_claim_log.c) */
    /* The dialect the last connection opened with (enum dsp_sql_dialect; AUTO before the
     * first): logged when it changes, shown in /stats (dsp_dbi_conn_open). */
    _Atomic int sql_dialect_seen;
    /* --db's server in use (an index in its list): every connection opens there, and
     * moves on together when it dies, hangs or leaves the primary component. */
    atomic_uint node;
};

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
    char errtext[256];    /* mysql_error of the last failed connect */
    size_t stmt_limit;    /* the largest statement this connection may send */
    size_t max_packet;    /* the session's max_allowed_packet (want_packet), else 0 */
    bool no_lock_wait;    /* innodb_lock_wait_timeout = 0: a locked row fails at once */
    unsigned long client_flag; /* mysql_real_connect's: CLIENT_FOUND_ROWS for the lease */
    unsigned rw_timeout_s;     /* read and write timeout; 0: the default */
    bool quiet;                /* its owner reports a streak of failures: statement errors
                                * and reconnects logged at debug, not once per retry */
    bool mysql;                /* this connection sends MySQL's dialect (set at open) */
    bool autocommit;           /* each statement commits alone (set at open): a conflict
                                * undoes only that statement (dsp_dbi_exec_retry) */
    unsigned node;             /* the index in --db's server list it was opened on */
    bool galera;               /* the server is a synced Galera node (set at open) */
    /* Galera's write-set limits as read at open (wsrep_max_ws_rows, wsrep_max_ws_size);
     * 0: none (not Galera, or unlimited). A claim or a result statement stays within them. */
    uint64_t ws_max_rows;
    uint64_t ws_max_bytes;
};

/* ---- db.c: messages to the loop ---- */

/* Wakes the loop thread, which delivers every queued message. */
void dsp_dbi_wake_loop(dsp_db *db);
/* Appends m to the loop's queue; mu held. The caller wakes the loop after unlocking. */
void dsp_dbi_post_locked(dsp_db *db, struct msg *m);
/* Queues m and wakes the loop; mu not held. */
void dsp_dbi_post(dsp_db *db, struct msg *m);
/* A zeroed message of that kind, or NULL (out of memory). */
struct msg *dsp_dbi_msg_new(enum msg_kind kind);
/* Reachability: healthy while both the claim and the write connection are up. */
void dsp_dbi_set_conn_ok(dsp_db *db, int which, bool ok);
/* Sets (text) or clears (NULL) the reason /healthz is 503 while connected. */
void dsp_dbi_set_problem(dsp_db *db, const char *text);

/* ---- db_conn.c: one connection ---- */

int64_t dsp_dbi_backoff_next(struct dbconn *c);
/* Tries of a transaction that a conflict aborted (Galera's certification, a deadlock, a
 * lock wait timeout) before the error counts as a failure (the caller's drop path). */
#define DSP_DBI_CONFLICT_TRIES 8
/* Errors that abort a transaction for a conflict with another one, leaving the
 * connection fine: 1213 (a deadlock victim, or Galera's certification failure, at any
 * statement including COMMIT) and 1205 (a lock wait timeout). */
bool dsp_dbi_error_is_conflict(unsigned e);
/* After a conflict of try `tries` (1, 2, ...): rolls c's transaction back, counts the
 * retry (db.cert_retries_total) and sleeps a short growing pause (1, 2, 4 ... 64 ms, with
 * jitter). 0: run the transaction again; -1: the ROLLBACK failed (the connection is
 * broken: drop it). */
int dsp_dbi_conflict_retry(struct dbconn *c, unsigned tries);
bool dsp_dbi_error_is_transient(unsigned e);
/* True for a refused login or an unknown database: --db is wrong, a retry cannot mend it. */
bool dsp_dbi_error_is_config(unsigned e);
int dsp_dbi_exec(struct dbconn *c, const char *sql, size_t len, uint64_t *affected);
/* Runs one query and stores its result (the caller frees it); NULL on error (c->err
 * set; logged at warn, at debug while c->quiet). Counted in db.statements. */
MYSQL_RES *dsp_dbi_query(struct dbconn *c, const char *sql, size_t len);
/* dsp_dbi_query and dsp_dbi_exec that run the statement again after a conflict (1213:
 * Galera's certification or a deadlock; 1205: a lock wait timeout), as the claims and the
 * result writes do: on an autocommit connection each statement is its own transaction,
 * so it runs again alone, up to DSP_DBI_CONFLICT_TRIES tries with dsp_dbi_conflict_retry's
 * pause (db.cert_retries_total); the retried failures are logged at debug. A 1205 is
 * retried only on a connection that does not wait for locks (no_lock_wait). On a
 * connection in a transaction they fail at once: its owner runs the transaction again. */
MYSQL_RES *dsp_dbi_query_retry(struct dbconn *c, const char *sql, size_t len);
int dsp_dbi_exec_retry(struct dbconn *c, const char *sql, size_t len, uint64_t *affected);
/* A streak of failures (1, 2, 3 ...) is logged at its 1st, 2nd, 4th, 8th ... failure and
 * at debug otherwise: a statement that fails every second (a dropped index, a revoked
 * privilege) leaves a few lines, not a screen a minute. True for the loud ones. */
bool dsp_dbi_streak_loud(unsigned failures);
/* The shortest innodb_lock_wait_timeout c's server takes: 0 (MariaDB: no wait) or 1
 * (MySQL's minimum). */
int dsp_dbi_lock_wait_min(const struct dbconn *c);
int dsp_dbi_exec_str(struct dbconn *c, const char *sql);
/* Runs sql, a statement with one '?' (a value too large for the hex text of a statement:
 * results, payloads), as a prepared statement whose parameter is data[0..len) sent in
 * pieces (mysql_stmt_send_long_data): no copy of the bytes, and a value may be as large
 * as max_allowed_packet. Returns 0 (*affected set when not NULL), or -1 with c->err set
 * (logged). db_conn.c. */
int dsp_dbi_exec_blob(struct dbconn *c, const char *sql, size_t sql_len, const uint8_t *data,
                      size_t len, uint64_t *affected);
int dsp_dbi_query_u64(struct dbconn *c, const char *sql, uint64_t *out, bool *isnull,
                      unsigned quiet_err);
void dsp_dbi_conn_close(struct dbconn *c);
/* With several servers in --db: true when c is open on another server than the one in
 * use now (its owner closes it between transactions, and opens it again there). */
bool dsp_dbi_conn_stale(const struct dbconn *c);
int dsp_dbi_conn_open(struct dbconn *c, bool autocommit, bool want_packet);

/* ---- db_lease.c: the table's lease ---- */

/* Notes c's connection id for the lease and, for the connections the lease records,
 * takes the lock that names it as this process's (dsp_dbi_conn_open calls it). 0, or -1
 * on a connection error. */
int dsp_dbi_lease_conn_opened(struct dbconn *c);
/* May the thread owning connection slot (LEASE_CONN_*) act as the leader now? gen 0 or
 * the lease generation it serves; epoch 0 or the epoch it acts for (then the claim
 * thread must have announced it). 0: yes; 1: not yet (its connection is not recorded in
 * the lease row yet; a renewal is asked for); -1: no (not leading, or the lease ran out
 * on this process's monotonic clock, or another generation or epoch). */
int dsp_dbi_lease_gate(dsp_db *db, int slot, uint64_t conn_id, uint64_t gen, uint32_t epoch);
/* The generation of the lease held now, or 0 when not held. */
uint64_t dsp_dbi_lease_gen(dsp_db *db);
/* The claim thread waits for the lease (true) or no longer (false). */
void dsp_dbi_lease_want(dsp_db *db, bool want);
/* Leadership ends (leader false, claims refused, on_leader_lost once); mu not held. */
void dsp_dbi_leadership_end(dsp_db *db);
/* The fencing write of a claim transaction (db_lease.c): on c, in its transaction, writes
 * the lease row where it is still this process's with epoch. 1: written (the claim may
 * commit); 0: the row is another's (roll back, then dsp_dbi_lease_deposed); -1: error
 * (c->err set). */
int dsp_dbi_lease_fence(dsp_db *db, struct dbconn *c, uint32_t epoch);
/* A claim found the lease row another's: counts it (db.claims_fenced_total) and gives the
 * lease and the leadership up. mu not held. */
void dsp_dbi_lease_deposed(dsp_db *db);
void *dsp_dbi_lease_main(void *arg);
int dsp_dbi_lease_init(dsp_db *db);
void dsp_dbi_lease_destroy(dsp_db *db);

/* ---- db_deps.c: task dependencies (schema version 10) ---- */

/* Waiting tasks one sweep probes at most (in one statement). */
#define DSP_DEPS_SWEEP_TASKS 256u
/* How often the leader's stats thread sweeps the waiting tasks. */
#define DSP_DEPS_SWEEP_MS 1000
/* Windows one sweep reads at most, one after the other while they are full. */
#define DSP_DEPS_SWEEP_WINDOWS 1

/* While a table has no dependency rows the leader looks for one this often (one
 * statement); a SUBMIT with AFTER starts the sweeps at once. docs/producers.md. */
#define DSP_DEPS_DISCOVER_MS 60000
/* While it has dependency rows but no task waits: the sweep this often. */
#define DSP_DEPS_IDLE_MS 10000

/* A submission inserted waiting tasks: the leader's sweeps start (or go on). */
void dsp_dbi_deps_rows_exist(dsp_db *db);

/* Where the next sweep starts, in delay_idx's order; {0, 0}: at the first. */
struct dsp_deps_cursor {
    int64_t run_after;
    uint64_t task_id;
    uint64_t clean_after; /* the clean-up's: dependency rows of tasks after this id */
    unsigned passes;      /* sweeps so far (the read of FAILED parents is every 10th) */
};

/* The probes' starts (db_deps.c), made by dsp_dbi_deps_init at dsp_db_new. 0 or -1. */
int dsp_dbi_deps_init(dsp_db *db);
void dsp_dbi_deps_free(dsp_db *db);

/* After outcomes were written: the waiting dependants of ok[0..nok) (SUCCESSFUL) are
 * probed and released when every dependency is SUCCESSFUL; the waiting dependants of
 * failed[0..nfailed) (FAILED) end FAILED ("dependency N failed"), transitively. On c
 * (autocommit); sql is scratch. 0, or -1 on a database error (c->err set). */
int dsp_dbi_deps_parents_ended(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ok,
                               size_t nok, const uint64_t *failed, size_t nfailed);
/* The waiting tasks children[0..n), just committed: released when every dependency is
 * SUCCESSFUL already, FAILED when one is FAILED or missing. The caller commits when c
 * is not autocommit. 0 or -1. */
int dsp_dbi_deps_settle(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *children,
                        size_t n);
/* One sweep of a window of waiting tasks from *cur (advanced), as db_deps.c says. 1: the
 * window was full (more to read from *cur), 0: it reached the last waiting task (*cur is
 * back at the first), -1: a database error. */
int dsp_dbi_deps_sweep(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct dsp_deps_cursor *cur);

/* ---- db_claim_log.c: the claims listed in task_claim ---- */

/* Inserts the task_claim row listing ids_csv (dsp_db_sql_id_csv's text, len bytes, at
 * least one id) under epoch, on c in its current transaction (or autocommit), with a new
 * seq (unique in this process, so under each of its epochs) stored in *seq. Returns 0,
 * -1 on a database error (c->err set), or -2 out of memory (nothing sent). */
int dsp_dbi_claim_list(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, uint32_t epoch,
                       const char *ids_csv, size_t len, uint64_t *seq);
/* The claim seq under epoch listed n rows now PROCESSING (its transaction committed).
 * A claim of another epoch than the one held forgets every older claim first: their
 * rows are the next leader's (recovery). Returns 0, or -1 out of memory (then the row
 * is left for recovery). mu not held. */
int dsp_dbi_claims_open(dsp_db *db, uint32_t epoch, uint64_t seq, uint32_t n);
/* One row of claim seq under epoch left PROCESSING for good (its outcome written or
 * fenced): at the last one, seq joins the settled list. mu held. */
void dsp_dbi_claims_settle_locked(dsp_db *db, uint32_t epoch, uint64_t seq);
/* A task_claim row to delete without counting (a claim or an adoption that did not
 * happen). mu held. */
void dsp_dbi_claims_forget_locked(dsp_db *db, uint32_t epoch, uint64_t seq);
/* Deletes the settled claims' rows on c (autocommit); those it could not delete stay
 * listed for the next call. mu not held. */
void dsp_dbi_claims_delete_settled(dsp_db *db, struct dbconn *c, dsp_strbuf *sql);
void dsp_dbi_claims_free(dsp_db *db);

/* ---- requests ---- */

void dsp_dbi_claim_req_free(struct claim_req *r);   /* db.c */
void dsp_dbi_requeue_req_free(struct requeue_req *r); /* db_stats.c */
/* Answers op with DSP_TASKOP_ERROR (the stats thread is gone); frees r. */
void dsp_dbi_taskop_fail(dsp_db *db, struct taskop_req *r); /* db_stats.c */

/* ---- the threads, started by dsp_db_start with the dsp_db as arg ---- */

void *dsp_dbi_claim_main(void *arg); /* db_claim.c */
void *dsp_dbi_write_main(void *arg); /* db_write.c */
void *dsp_dbi_stats_main(void *arg); /* db_stats.c */
void *dsp_dbi_sched_main(void *arg); /* db_schedule.c */

/* ---- db_binlog.c: the wake follower ---- */

/* Starts it unless --wake poll; 0 or -1. */
int dsp_dbi_binlog_start(dsp_db *db);
/* Stops and joins it (returns within a heartbeat, 1 s, or the read timeout). */
void dsp_dbi_binlog_stop(dsp_db *db);
void dsp_dbi_binlog_free(dsp_db *db);
/* The loop took a MSG_WAKE of due_wall (0: now): the next one may be posted. */
void dsp_dbi_binlog_delivered(dsp_db *db, int64_t due_wall);

/* ---- db_submit.c ---- */

/* Creates and starts the submit thread (db->sub); 0 or -1. */
int dsp_dbi_submit_start(dsp_db *db);
/* Stops it: what is queued is answered UNAVAILABLE; joins the thread. */
void dsp_dbi_submit_stop(dsp_db *db);
/* Frees db->sub (after stop). */
void dsp_dbi_submit_free(dsp_db *db);
/* Runs the callback of a MSG_SUBMITTED or MSG_OUTCOME on the loop thread. */
void dsp_dbi_submit_deliver(dsp_db *db, struct msg *m);
/* Frees what a MSG_SUBMITTED or MSG_OUTCOME still owns. */
void dsp_dbi_submit_msg_free(struct msg *m);
/* The write thread's hook: batch[i] was written as final (SUCCEEDED or FAILED) where
 * written[i] is set; a waited-for task gets an OUTCOME message, which takes its data
 * (set to NULL in the batch). */
void dsp_dbi_submit_notify(dsp_db *db, struct wentry *batch, const uint8_t *written, size_t n);
/* The same for one task made FAILED with err_msg text by its dependencies (db_deps.c). */
void dsp_dbi_submit_notify_failed(dsp_db *db, uint64_t task_id, const char *text);

#endif
