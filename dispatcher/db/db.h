/* db.h: taskpushd's database side, the only code that calls MySQL (dispatcher/db/,
 * its own library: it links nothing of the loop, tests/check-thread-boundary.sh).
 *
 * The event loop never calls MySQL. This module owns seven threads, each with its own
 * connection (db_conn.c):
 *  - lease (db_lease.c): holds the table's leadership lease: takes it over once it
 *    expired, renews it, gives it up when a renewal did not come in time;
 *  - claim (db_claim.c): while the lease is held, holds the table's lock (GET_LOCK),
 *    takes a new epoch, puts rows of older epochs back to NEW, moves rows between the
 *    delayed and ready lanes, and runs the claim transactions (the SELECT's text:
 *    db_claim_sql.c; the claims still listed in task_claim: db_claim_log.c);
 *  - claim helper (db_claim_helper.c): locks and marks the second half of a large claim
 *    at the same time, connected at the first claim large enough to split;
 *  - write (db_write.c): writes outcomes in batches, a few statements per batch, each
 *    fenced by "task_state = PROCESSING AND epoch = ours";
 *  - stats (db_stats.c): reads the table's figures (dsp_table_stats), deletes rows past
 *    their retention, serves the operator's requeue of FAILED rows and task requests;
 *    it takes no part in leadership;
 *  - submit (db_submit.c): inserts SUBMITted tasks, many per transaction;
 *  - schedule (db_schedule.c): reads task_schedule and, while leading, inserts due runs
 *    of periodic tasks;
 *  - binlog (db_binlog.c; not with --wake poll): while leading, follows the server's
 *    binary log as a replica does and wakes the claim (on_wake) when a committed row of
 *    the task table is NEW (events parsed by binlog_event.c).
 * Every other statement's text is built in db_sql.c. Requests go in through the
 * thread-safe calls below; replies come back on the loop thread, through callbacks run
 * from a libevent event that the database threads activate (db.c; so
 * evthread_use_pthreads() must run before the base exists). While the database is
 * unreachable the threads reconnect with backoff, and the claim and write connections
 * report it through on_health; queued outcomes are kept, never dropped.
 */
#ifndef TASKPUSH_DSP_DB_H
#define TASKPUSH_DSP_DB_H

#include "log.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

/* Longest err_msg written (TEXT holds 65,535 bytes) and longest result (MEDIUMBLOB). */
#define DSP_DB_ERR_MSG_MAX 65535u
#define DSP_DB_RESULT_MAX (16u * 1024 * 1024 - 1)

struct event_base;
typedef struct dsp_db dsp_db;

/* One claimed row, as the claim SELECT returned it. */
typedef struct dsp_claimed_task {
    uint64_t task_id;
    uint32_t attempts;     /* the row's attempts column at claim time */
    uint32_t max_attempts;
    int64_t timeout_ms;    /* the row's timeout_ms, or -1 for NULL */
    uint8_t priority;
    uint16_t type_index;   /* index into dsp_claim_reply.types */
    uint64_t claim_seq;    /* the claim's row in task_claim (its seq under the epoch) */
    size_t payload_len;
    uint8_t *payload;      /* malloc'd, NULL when empty; the reply owns it unless stolen */
    bool has_group_key;    /* the row's group_key is not NULL: group_key_len bytes */
    uint8_t group_key_len; /* 0 .. 191 */
    uint8_t group_key[191];
} dsp_claimed_task;

typedef struct dsp_claim_request {
    size_t ntypes;
    const char *const *types; /* copied by dsp_db_claim */
    const uint32_t *limits;   /* per type: most rows of that type */
    uint32_t total;           /* most rows in all */
    /* Payload bytes the claim may take (--max-buffered-bytes less what the loop holds);
     * a claim takes at least one row whatever its size. 0: no limit. */
    uint64_t max_bytes;
} dsp_claim_request;

typedef struct dsp_claim_reply {
    int status;               /* 0, or -1 when the transaction failed (no tasks) */
    size_t ntasks;
    dsp_claimed_task *tasks;  /* in dispatch order: priority desc, task_id asc */
    size_t ntypes;
    char **types;             /* the request's types */
    int64_t duration_us;      /* the claim transaction, BEGIN to COMMIT */
    bool more;                /* cut short by the byte budget, not by the rows there are */
} dsp_claim_reply;

/* What to write for one task. */
enum dsp_write_kind {
    DSP_WRITE_SUCCEEDED = 0, /* SUCCESSFUL, result = data */
    DSP_WRITE_FAILED = 1,    /* FAILED, err_msg = data */
    DSP_WRITE_RETRY = 2,     /* NEW in the delayed lane until run_after_ms, err_msg = data */
    DSP_WRITE_RELEASE = 3,   /* NEW and ready at once, err_msg untouched (never delivered, or drained) */
    DSP_WRITE_DELIVERED = 4, /* still PROCESSING: records a delivery's attempt before its outcome,
                              * so that recovery after a crash charges exactly the deliveries made */
};
#define DSP_WRITE_KINDS 5
/* Entries of the write queue that are not outcomes of the leader's own deliveries
 * (protocol version 3, the inventory; proto/PROTOCOL.md section 10): */
#define DSP_WRITE_ADOPT 16 /* a worker's HOLDING entry: move the row from the delivery's
                            * epoch (dlv_epoch, attempts dlv_attempt) to the leader's */
#define DSP_WRITE_NOTE 17  /* nothing to write: a DONE never applicable, to CONFIRM */

typedef struct dsp_outcome {
    uint64_t task_id;
    uint8_t kind;          /* enum dsp_write_kind, DSP_WRITE_ADOPT or DSP_WRITE_NOTE */
    bool foreign;          /* a DONE for a delivery this dispatcher does not hold: fenced
                            * by dlv_epoch and dlv_attempt instead of the leader's epoch */
    uint32_t attempts;     /* the new value of the attempts column */
    int64_t run_after_ms;  /* DSP_WRITE_RETRY only */
    uint64_t conn_id;      /* version 3: the connection to CONFIRM to (or answer an ADOPT
                            * to); 0: none */
    uint32_t dlv_epoch;    /* with conn_id: the delivery as the worker names it */
    uint32_t dlv_attempt;
    uint64_t claim_seq;    /* the task_claim row that lists the task (0: none, e.g. a
                            * foreign outcome): settled once a final kind is written */
    size_t len;
    uint8_t *data;         /* malloc'd result or error text, or NULL; dsp_db_write takes it */
} dsp_outcome;

/* What became of an entry that carried a conn_id, for the loop: an outcome settled (to
 * CONFIRM: written, or no longer applicable), or the answer to an ADOPT. Outcomes left
 * unwritten (leadership lost, stopped, errors) get none: they are never confirmed. */
typedef struct dsp_write_ack {
    uint64_t conn_id;
    uint64_t task_id;
    uint32_t epoch;        /* the delivery as the worker named it */
    uint32_t attempt;
    bool adopt;            /* an ADOPT's answer; else an outcome to CONFIRM */
    bool ok;               /* ADOPT: the row is now the leader's */
    uint8_t priority;      /* ADOPT ok: the row's */
    uint64_t claim_seq;    /* ADOPT ok: the task_claim row listing it under the new epoch */
    uint32_t max_attempts;
    char *type;            /* ADOPT ok: the row's task_type (malloc'd; the report owns it;
                            * NULL when the row could not be read: put it back to NEW) */
    size_t order;          /* its place in the queue (the sort keeps the DONEs' order) */
} dsp_write_ack;

/* Frees acks and their types (NULL is fine). */
void dsp_write_acks_free(dsp_write_ack *acks, size_t n);

/* What a batch of writes did, for the counters. */
typedef struct dsp_write_report {
    uint64_t written[DSP_WRITE_KINDS]; /* rows changed, by kind */
    uint64_t fenced;                   /* outcomes whose row was no longer ours */
    uint64_t deferred;                 /* outcomes whose row another transaction locked:
                                        * queued again to be written later */
    uint64_t foreign_written;          /* foreign outcomes written */
    uint64_t foreign_ignored;          /* foreign outcomes whose row had moved on */
    dsp_write_ack *acks;               /* sorted by conn_id, then in queue order */
    size_t nacks;
} dsp_write_report;

/* Figures read from the table itself by the stats thread (a third connection,
 * so that a slow count never delays a claim or a write), refreshed every
 * table_stats_ms and cached. */
#define DSP_TABLE_STATS_MAX_TYPES 256
typedef struct dsp_table_type_stats {
    char type[257];
    uint64_t new_ready;   /* NEW and due */
    uint64_t new_delayed; /* NEW, waiting for run_after */
    uint64_t processing;
    uint64_t failed;
    int64_t oldest_ready_age_ms; /* as oldest_ready_age_ms below, for this type */
    uint64_t keyed_read;  /* ready keyed rows read for its busiest keys (DSP_TABLE_KEYS_SCAN
                           * at most: then the counts are of a sample) */
} dsp_table_type_stats;

/* The busiest keys (group_key) waiting of each type: per round, for the
 * DSP_TABLE_KEYS_TYPES types with the most ready rows, the DSP_TABLE_KEYS_TOP keys with
 * the most ready keyed rows among the first DSP_TABLE_KEYS_SCAN of the type in
 * group_idx (priority first, then key): a bounded index range per type, never per
 * claim (docs/admin.md, GET /keys). */
#define DSP_TABLE_KEYS_TYPES 16
#define DSP_TABLE_KEYS_TOP 10
#define DSP_TABLE_KEYS_SCAN 10000
typedef struct dsp_table_key_stats {
    uint16_t type_slot;  /* its type: types[type_slot] */
    uint8_t key_len;
    uint8_t key[191];
    uint64_t waiting;    /* NEW ready rows of (type, key) among those read */
} dsp_table_key_stats;

typedef struct dsp_table_stats {
    bool valid;                 /* false until the first refresh succeeded */
    int64_t refreshed_wall_ms;  /* when (ms since the epoch) the figures were read */
    int64_t duration_us;        /* how long the refresh took */
    uint64_t by_state[4];       /* NEW, PROCESSING, SUCCESSFUL, FAILED */
    bool successful_capped;     /* by_state[2] stopped counting at its cap (a huge table) */
    uint64_t new_by_priority[3]; /* NEW rows (ready or delayed) by priority LOW, NORMAL, HIGH */
    int64_t oldest_ready_age_ms; /* age of the oldest ready NEW task (since it became due); -1: none */
    size_t ntypes;              /* types with NEW, PROCESSING or FAILED rows, at most the max */
    dsp_table_type_stats types[DSP_TABLE_STATS_MAX_TYPES];
    size_t nkeys;               /* the busiest waiting keys, by type slot then count */
    dsp_table_key_stats keys[DSP_TABLE_KEYS_TYPES * DSP_TABLE_KEYS_TOP];
    uint64_t retention_deleted_total; /* rows deleted by retention since start */
    uint64_t orphans_recovered_total; /* orphaned PROCESSING rows put back since start */
} dsp_table_stats;

/* A task-level operator request (docs/admin.md: GET /task, GET /failed, POST /retry,
 * POST /cancel), run by the stats thread: each statement by primary key, or an index
 * range with a LIMIT. */
enum dsp_taskop_kind {
    DSP_TASKOP_SHOW,   /* the row of task_id */
    DSP_TASKOP_FAILED, /* the latest FAILED rows (of type, or all), at most limit */
    DSP_TASKOP_RETRY,  /* FAILED -> NEW, attempts 0, err_msg NULL, due now */
    DSP_TASKOP_CANCEL, /* NEW -> FAILED "cancelled" (a row no dispatcher holds) */
    DSP_TASKOP_CANCEL_ORPHAN, /* PROCESSING -> FAILED "cancelled", an orphan for epoch */
    DSP_TASKOP_RETRY_FAILED,  /* FAILED rows of type that failed since since_ms -> NEW, at
                               * most limit (the latest failures first); rows says how many */
};
enum dsp_taskop_status {
    DSP_TASKOP_OK = 0,
    DSP_TASKOP_NOT_FOUND = 1, /* no row of task_id */
    DSP_TASKOP_CONFLICT = 2,  /* the row is not in the state the request needs (state says) */
    DSP_TASKOP_ERROR = 3,     /* no database connection, or the statement failed */
};
#define DSP_TASKOP_LIMIT_MAX 1000   /* most rows of one DSP_TASKOP_FAILED */
#define DSP_TASKOP_ERR_LIST_MAX 1000 /* err_msg bytes per row in a DSP_TASKOP_FAILED list */
typedef struct dsp_taskop {
    int kind;            /* enum dsp_taskop_kind */
    uint64_t task_id;    /* SHOW, RETRY, CANCEL */
    uint32_t epoch;      /* CANCEL_ORPHAN: the epoch the loop leads with */
    char *type;          /* FAILED: NULL for every type; RETRY_FAILED: the type; owned */
    unsigned limit;      /* FAILED, RETRY_FAILED: 1 .. DSP_TASKOP_LIMIT_MAX */
    int64_t since_ms;    /* RETRY_FAILED: failed at or after this (ms since 1970) */
    uint64_t rows;       /* RETRY_FAILED: the rows moved back to NEW */
    void *ctx;           /* the caller's (the HTTP request), given back untouched */
    /* The answer, filled by the stats thread. */
    int status;          /* enum dsp_taskop_status */
    int state;           /* the row's task_state (SHOW; RETRY and CANCEL on a conflict) */
    json_t *answer;      /* SHOW: the row as an object; FAILED: an array of rows */
} dsp_taskop;

/* ---- submissions through the dispatcher (SUBMIT frames; db_submit.c) ---- */

/* One task of a submission. The byte fields point into the request's body. */
typedef struct dsp_submit_item {
    uint8_t priority;
    uint16_t max_attempts; /* 0: the column's default */
    uint32_t delay_ms;
    uint32_t timeout_ms;   /* 0: NULL; at most INT32_MAX (checked by the loop) */
    const uint8_t *type;
    size_t type_len;
    const uint8_t *key;    /* dedup_key; key_len 0: none */
    size_t key_len;
    const uint8_t *group_key; /* group_key (fair share); group_key_len 0: none (NULL) */
    size_t group_key_len;     /* at most 191 (the decoder's bound) */
    const uint8_t *payload;
    size_t payload_len;
    /* The task ids it waits for: nafter ids of 8 bytes each, big-endian (the frame's
     * bytes); nafter 0: none. At most PROTO_MAX_AFTER (checked by the loop). */
    const uint8_t *after;
    uint16_t nafter;
    /* The answer. */
    uint8_t result;        /* 0 inserted, 1 duplicate (proto.h's enum proto_submit_result) */
    uint64_t task_id;      /* the new row, or the existing row of a duplicate (0: unknown) */
} dsp_submit_item;

/* One SUBMIT frame, owned by the database side from dsp_db_submit until on_submitted. */
typedef struct dsp_submit_req {
    struct dsp_submit_req *next; /* the submit queue */
    uint64_t conn_id;      /* the connection to answer (it may be gone by then) */
    uint32_t request_id;
    bool wait;             /* remember the inserted tasks and report their outcome */
    size_t nitems;
    dsp_submit_item *items;
    uint8_t *body;         /* the frame's body, which the items point into */
    size_t body_len;
    /* The answer. */
    uint16_t status;       /* proto.h's enum proto_submit_status */
    char message[200];     /* why, when status is not OK */
} dsp_submit_req;

/* The final state of a task a submitter waits for (OUTCOME), written by the write thread. */
typedef struct dsp_submit_outcome {
    uint64_t conn_id;
    uint32_t request_id;
    uint64_t task_id;
    uint8_t state;         /* 2 SUCCESSFUL, 3 FAILED */
    size_t len;
    uint8_t *data;         /* the result or err_msg as written; owned by the message */
} dsp_submit_outcome;

/* Frees req, its body and items (NULL is fine). */
void dsp_submit_req_free(dsp_submit_req *req);

struct dsp_setting; /* below: runtime settings */

typedef struct dsp_db_callbacks {
    /* Leadership taken: epoch is new and larger than every earlier one; rows of older
     * epochs are recovered now, or after adopt_grace_ms. Claims may start. */
    void (*on_leader)(void *arg, uint32_t epoch);
    /* Leadership lost (the lock's connection died and another dispatcher took
     * the table meanwhile): every claimed task is no longer ours. */
    void (*on_leader_lost)(void *arg);
    /* The answer to dsp_db_claim; the callee owns reply (dsp_claim_reply_free). */
    void (*on_claim)(void *arg, dsp_claim_reply *reply);
    void (*on_written)(void *arg, const dsp_write_report *report);
    /* The database became reachable (true) or unreachable (false). */
    void (*on_health)(void *arg, bool connected);
    /* The answer to dsp_db_requeue_failed: rows moved from FAILED to NEW, or -1. */
    void (*on_requeued)(void *arg, uint64_t request_id, int64_t rows);
    /* Something no retry can mend (e.g. a schema version this build does not
     * know): the daemon should log it and exit. */
    void (*on_fatal)(void *arg, const char *message);
    /* The answer to dsp_db_taskop; the callee owns op (dsp_taskop_free). */
    void (*on_taskop)(void *arg, struct dsp_taskop *op);
    /* The answer to dsp_db_submit, after COMMIT (or a failure: status says); the callee
     * owns req (dsp_submit_req_free). */
    void (*on_submitted)(void *arg, dsp_submit_req *req);
    /* A waited-for task reached its final state (its row is written); o is borrowed. */
    void (*on_outcome)(void *arg, const dsp_submit_outcome *o);
    /* The binary log showed a committed row of the task table that is NEW: claim now
     * (due_wall_ms 0), or at due_wall_ms (ms since 1970: its run_after). */
    void (*on_wake)(void *arg, int64_t due_wall_ms);
    /* The answer to dsp_db_settings_load (request_id echoed): the rows of the settings
     * table, or ok false (no database, an error: none read). settings[0..n) are the
     * callee's to read only during the call. */
    void (*on_settings)(void *arg, uint64_t request_id, bool ok, const struct dsp_setting *settings,
                        size_t n);
} dsp_db_callbacks;

/* A parsed mysql:// URL. Strings are owned by the struct (dsp_db_url_clear, config.h). */
#define DSP_DB_NODES_MAX 16 /* servers one --db may list */

/* One server of --db's list. */
typedef struct dsp_db_node {
    char *host;
    unsigned port; /* 0: none given (the client's default, 3306) */
} dsp_db_node;

typedef struct dsp_db_url {
    char *user;
    char *password; /* NULL when none */
    char *host;     /* the first node's (owned by nodes[0]) */
    unsigned port;  /* the first node's; 0: none given */
    char *socket;   /* NULL unless ?socket=, no port and one node */
    char *dbname;
    /* HOST1:PORT1,HOST2:PORT2,...: the servers of one replicated database, in the order
     * taskpushd tries them (docs/replication.md); one for a plain URL. */
    size_t nnodes;
    dsp_db_node nodes[DSP_DB_NODES_MAX];
} dsp_db_url;

/* Which SQL the database threads send (--sql-dialect). MariaDB's has INSERT ... RETURNING;
 * MySQL's is only what MySQL >= 8.0.13 accepts. AUTO decides at each connect from the
 * server's version string (MariaDB's contains "MariaDB"). */
enum dsp_sql_dialect { DSP_SQL_DIALECT_AUTO, DSP_SQL_DIALECT_MYSQL, DSP_SQL_DIALECT_MARIADB };

/* "auto", "mysql" or "mariadb". */
const char *dsp_sql_dialect_name(int dialect);

/* The lease's length and renewal when neither --lease-ms nor --lease-renew-ms is given
 * (docs/replication.md, "Lease timing"): one server's, and a Galera node's, where a
 * node's death or join stalls every commit for about the cluster's suspect timeout
 * (5 s by default), renewals included. When only one flag is given the other takes its
 * one-server default. */
#define DSP_LEASE_MS_DEFAULT 1000
#define DSP_LEASE_RENEW_MS_DEFAULT 250
#define DSP_LEASE_MS_GALERA 5000
#define DSP_LEASE_RENEW_MS_GALERA 1000

/* How rows inserted by SQL are noticed (--wake; db_binlog.c, docs/taskpushd.md "Waking on
 * inserts"): BINLOG follows the server's binary log while leading and wakes the claim
 * when a row of the task table becomes NEW; AUTO does so when the log is in ROW format
 * and the user may replicate; POLL only polls. Polling at --poll-ms goes on in every mode. */
enum dsp_wake_mode { DSP_WAKE_AUTO, DSP_WAKE_BINLOG, DSP_WAKE_POLL };
#define DSP_WAKE_REASON_MAX 256
#define DSP_WAKE_DUES_MAX 32 /* future run_after times told to the loop at once, at most */

/* "auto", "binlog" or "poll". */
const char *dsp_wake_mode_name(int mode);

/* /stats "wake": the mode in use now (BINLOG or POLL) and why, and the follower's counters. */
typedef struct dsp_wake_status {
    int mode;                          /* DSP_WAKE_BINLOG or DSP_WAKE_POLL */
    char reason[DSP_WAKE_REASON_MAX];
    uint64_t events;                   /* binary log events read */
    uint64_t wakes;                    /* transactions that made a task row NEW */
    uint64_t reconnects;               /* sessions of the follower that ended */
    uint64_t unreadable;               /* ROWS events of the task table not read (woke at once) */
    uint64_t rests;                    /* floods during which the follower rested */
    bool resting;                      /* resting now (dsp_db_wake_rest): polling meanwhile */
    uint32_t server_id;                /* the replica server_id of the session following now; 0: none */
    char last_end[DSP_WAKE_REASON_MAX]; /* why the last session that followed ended; "": none yet */
} dsp_wake_status;

typedef struct dsp_db_options {
    const dsp_db_url *url;      /* borrowed for the life of the dsp_db */
    const dsp_log *log;         /* borrowed */
    struct event_base *base;    /* the loop that runs the callbacks */
    int64_t result_flush_ms;    /* longest an outcome waits to be batched with others */
    size_t max_write_batch;     /* most outcomes per statement */
    int64_t table_stats_ms;     /* refresh interval of dsp_table_stats; 0: never */
    uint32_t claim_split;       /* claims keeping this many rows (>= 2) use the helper; 0: never */
    int64_t retain_succeeded_ms; /* delete SUCCESSFUL rows older than this; 0: keep all */
    int64_t retain_failed_ms;    /* the same for FAILED rows; 0: keep all */
    int64_t lease_ms;            /* the leadership lease's length; 0: see DSP_LEASE_MS_DEFAULT */
    int64_t lease_renew_ms;      /* how often the leader renews it; 0: the same */
    int64_t adopt_grace_ms;      /* a new leader recovers older epochs' rows this long after
                                  * it starts leading (workers declare theirs first); 0: at once */
    int64_t orphan_age_ms;       /* a PROCESSING row no dispatcher can hold (db_sql.h, orphans)
                                  * goes back to NEW once unchanged this long (--task-timeout-ms);
                                  * 0: 60000 */
    /* The shard (shard.h; borrowed): with types, every statement on task rows is limited
     * to them, and the lease, epoch row and lock are the shard's. NULL or empty: all. */
    const struct dsp_shard *shard;
    /* --table: the task table's name (tables.h makes the other three from it); NULL:
     * task. A name that is not valid makes dsp_db_new fail (the config checked it). */
    const char *table;
    int sql_dialect;             /* enum dsp_sql_dialect; 0: AUTO */
    int wake;                    /* enum dsp_wake_mode; 0: AUTO */
    dsp_db_callbacks cb;
    void *cb_arg;
} dsp_db_options;

/* The "db" object of /stats: the database threads' counters (dsp_db_counters,
 * db.h), X(field, /stats key, /metrics name, divisor, help). /metrics shows
 * value / divisor: claim time is summed in microseconds and shown in seconds. */
#define DSP_DB_COUNTERS(X)                                                                    \
    X(statements, "statements_total", "db_statements_total", 1,                               \
      "statements sent to the database") /* every statement, all connections */               \
    X(claims, "claims_total", "db_claims_total", 1, "claim transactions committed")            \
    X(claimed_rows, "claimed_rows_total", "db_claimed_rows_total", 1, "rows claimed")          \
    X(claim_us_total, "claim_us_total", "db_claim_seconds_total", 1000000,                    \
      "claim transaction time summed")                                                        \
    X(write_batches, "write_batches_total", "db_write_batches_total", 1, "outcome batches written") \
    X(reconnects, "reconnects_total", "db_reconnects_total", 1, "database reconnections")      \
    X(submitted_rows, "submitted_rows_total", "db_submitted_rows_total", 1,                   \
      "rows inserted by SUBMIT frames")                                                       \
    X(submit_duplicates, "submit_duplicates_total", "db_submit_duplicates_total", 1,          \
      "submitted tasks answered as duplicates (dedup_key present)")                           \
    X(submit_batches, "submit_batches_total", "db_submit_batches_total", 1,                   \
      "submission transactions committed")                                                    \
    X(submit_autocommit_batches, "submit_autocommit_batches_total",                          \
      "db_submit_autocommit_batches_total", 1,                                                \
      "submission batches inserted by one autocommit INSERT (no key, dependency or wait)")    \
    X(submit_us_total, "submit_us_total", "db_submit_seconds_total", 1000000,                 \
      "submission batches' database time summed (statements to COMMIT)")                       \
    X(submit_gather_us_total, "submit_gather_us_total", "db_submit_gather_seconds_total", 1000000, \
      "time the submit thread waited for more submissions before a batch (the gather), summed") \
    X(submit_requests, "submit_requests_total", "db_submit_requests_total", 1,                \
      "SUBMIT frames handed to the submit thread (batches / requests: its group commit)")     \
    X(claim_skipped, "claim_skipped_locked_total", "db_claim_skipped_locked_total", 1,        \
      "rows a claim found locked by another transaction (or changed) and skipped")           \
    X(node_moves, "node_moves_total", "db_node_moves_total", 1,                               \
      "moves to the next server of --db's list (one died, hung or left its cluster)")          \
    X(cert_retries, "cert_retries_total", "db_cert_retries_total", 1,                         \
      "transactions rolled back for a conflict (1213, 1205) and run again on the same connection") \
    X(claims_fenced, "claims_fenced_total", "db_claims_fenced_total", 1,                      \
      "claims rolled back because the lease row was no longer this dispatcher's")             \
    X(progress_rows_written, "progress_rows_written_total", "db_progress_rows_written_total", 1, \
      "progress rows written to the progress table (at most one a second per task)")          \
    X(progress_rows_deleted, "progress_rows_deleted_total", "db_progress_rows_deleted_total", 1, \
      "progress rows deleted because their task ended")                 \
    X(deps_released, "deps_released_total", "db_deps_released_total", 1,                      \
      "waiting tasks released: every task they waited for SUCCESSFUL")                        \
    X(deps_failed, "deps_failed_total", "db_deps_failed_total", 1,                            \
      "waiting tasks made FAILED by their dependencies (one failed, is missing, or a cycle)") \
    X(deps_sweeps, "deps_sweeps_total", "db_deps_sweeps_total", 1,                            \
      "sweeps of the waiting tasks (every second while tasks wait; none without dependencies)")

#define DSP_DB_STATS_FIELD(field, key, metric, divisor, help) uint64_t field;

/* The latest progress of one delivery, as the progress table stores it (version 11). */
#define DSP_DB_PROGRESS_MSG_MAX 256
typedef struct dsp_progress_row {
    uint64_t task_id;
    uint32_t epoch, attempt;
    uint16_t permille;  /* 0 .. 1000 */
    uint16_t msg_len;   /* 0 .. DSP_DB_PROGRESS_MSG_MAX */
    int64_t reported_ms;
    char msg[DSP_DB_PROGRESS_MSG_MAX];
} dsp_progress_row;

/* At most this many rows or deletions per dsp_db_progress_save (one statement each), and
 * batches waiting for the stats thread: a batch beyond is dropped (progress is advisory;
 * a running task's next report is written again). */
#define DSP_DB_PROGRESS_BATCH 1000
#define DSP_DB_PROGRESS_PENDING_MAX 4

/* Hands the stats thread one batch of the progress table: rows to store (replacing a
 * task's row) and the ids of ended tasks whose rows to delete, each at most
 * DSP_DB_PROGRESS_BATCH; takes both arrays (malloc'd, or NULL with a count of 0) in
 * every case. 0, or -1 when nothing was queued (no database, the thread stopped, a
 * count over the bound, DSP_DB_PROGRESS_PENDING_MAX batches waiting). */
int dsp_db_progress_save(dsp_db *db, dsp_progress_row *rows, size_t nrows, uint64_t *gone, size_t ngone);

/* dsp_db_write, dsp_db_pending_writes, dsp_db_counters_get, dsp_db_table_stats_get
 * and dsp_db_requeue_failed accept db == NULL (an offline server, see
 * dsp_server_init_offline): writes are dropped, figures are zero, requeue fails. */

/* Shared counters, readable from any thread; the uint64_t ones are listed in
 * DSP_DB_COUNTERS (stats.h). */
typedef struct dsp_db_counters {
    DSP_DB_COUNTERS(DSP_DB_STATS_FIELD)
    bool connected;
    bool leader;
    uint32_t epoch;
    const char *sql_dialect; /* the dialect in use: "mysql" or "mariadb"; "auto" until the
                              * first connection told (a static string) */
    const char *node_host;   /* the server of --db in use (the URL's string) and its port, */
    unsigned node_port;      /* 0 when the URL gave none */
    bool galera;             /* the lease connection's server is a Galera node */
    int64_t lease_ms;        /* the lease in use (flags, or the defaults for the server); */
    int64_t lease_renew_ms;  /* 0 until the lease connection first connected */
} dsp_db_counters;

/* The wake follower's state (db == NULL: polling, "no database"). */
void dsp_db_wake_status(dsp_db *db, dsp_wake_status *out);

/* In a flood of inserts (the loop's claims keep finding several rows at the widest gap,
 * --poll-ms) the doorbell adds nothing, while following the log still costs the server
 * a dump of every transaction and this process its parsing, on the cores the producers
 * use: rest true makes the follower leave the log and poll; rest false (a claim found
 * fewer than 2 rows) makes it follow again from the log's end. Only a flag under the
 * mutex: the loop may call it. */
void dsp_db_wake_rest(dsp_db *db, bool rest);

/* Returns NULL on allocation failure. Nothing runs before dsp_db_start. */
dsp_db *dsp_db_new(const dsp_db_options *opts) __attribute__((warn_unused_result));

/* Starts the threads; returns at once. Connecting, waiting for leadership and
 * recovery happen in the background and end in on_leader. Returns 0 or -1. */
int dsp_db_start(dsp_db *db) __attribute__((warn_unused_result));

/* Asks the claim thread for one claim transaction. At most one is outstanding:
 * returns -1 when one is, or when not leader; the answer comes to on_claim. */
int dsp_db_claim(dsp_db *db, const dsp_claim_request *req) __attribute__((warn_unused_result));

/* Queues outcomes for the write thread; takes ownership of each data buffer
 * (the array itself stays the caller's). Never blocks on the database. */
void dsp_db_write(dsp_db *db, dsp_outcome *outcomes, size_t n);

/* Outcomes queued or being written. */
size_t dsp_db_pending_writes(dsp_db *db);
/* The result and error bytes of those outcomes (--max-unwritten-bytes). */
size_t dsp_db_pending_write_bytes(dsp_db *db);

/* The largest result the table can take: the write connection's max_allowed_packet,
 * at most the column's 16 MiB - 1 (that, before the first connect). A larger result
 * cannot be stored whole: its task fails instead (never a cut result called success). */
size_t dsp_db_result_max(dsp_db *db);

/* Stops claiming, writes every queued outcome (retrying while the database is
 * unreachable, for at most deadline_ms), releases the lock and joins the
 * threads. Outcomes still unwritten then are logged and dropped: their rows
 * stay PROCESSING under this epoch, and the next dispatcher recovers them. */
void dsp_db_stop(dsp_db *db, int64_t deadline_ms);

void dsp_db_free(dsp_db *db);

void dsp_db_counters_get(dsp_db *db, dsp_db_counters *out);

/* Called by the loop's tick: gives the leadership up when the lease was not renewed in
 * time on this process's monotonic clock, even while the lease thread is stuck in a
 * statement (on_leader_lost follows). Accepts NULL. */
void dsp_db_lease_check(dsp_db *db);
/* Whether the lease is held and not past on the monotonic clock (true for NULL): /stats
 * says leader only then, also in the moment between a thaw and the tick that steps down. */
bool dsp_db_lease_valid(dsp_db *db);
/* Longest reason dsp_db_problem copies, with its NUL. */
#define DSP_DB_PROBLEM_MAX 320
/* Copies why this dispatcher cannot do its job although the database is reachable (no
 * taskpush schema, its statements failing in a loop) into out (cap bytes, NUL-ended);
 * returns false, out "", when there is nothing wrong. Takes only a mutex: the loop may
 * call it. */
bool dsp_db_problem(dsp_db *db, char *out, size_t cap);

/* Copies the latest table figures (thread-safe; cheap: no query). */
void dsp_db_table_stats_get(dsp_db *db, dsp_table_stats *out);

/* Periodic tasks (db_schedule.c): the schedule thread reads task_schedule every second
 * on its own connection (on a standby too) and publishes what it read, so that GET
 * /schedules answers from memory; the leader also inserts the due runs. */
#define DSP_SCHEDULES_LISTED 1000 /* most schedules listed (by name) */
typedef struct dsp_schedule_row {
    char name[129];
    char type[257];
    char cron[129];       /* "" for an interval schedule */
    int64_t interval_ms;  /* 0 for a cron schedule */
    bool catch_up;        /* missed = 'catch-up' */
    uint32_t catch_up_max;
    uint8_t priority;
    int64_t next_run;     /* ms since 1970; 0: not yet set */
} dsp_schedule_row;
typedef struct dsp_schedule_list {
    bool valid;                /* read at least once */
    int64_t read_wall_ms;      /* when it was read (this process's wall clock) */
    uint64_t inserted_total;   /* runs this process inserted */
    bool cut;                  /* more schedules than listed */
    size_t n;
    dsp_schedule_row rows[];   /* n of them */
} dsp_schedule_list;
/* A copy of the latest listing (free() it), or NULL (out of memory, or db NULL). */
dsp_schedule_list *dsp_db_schedules_get(dsp_db *db);

/* ---- runtime settings (the settings table, schema version 9; docs/taskpushd.md,
 * "Runtime settings") ---- */

/* One row of the settings table. */
typedef struct dsp_setting {
    char *type;          /* NUL-terminated, 1 .. 256 bytes; "" every type (pause) */
    bool has_limit;      /* the limits were set at run time */
    uint32_t concurrency, rate, per_group;
    bool paused;
} dsp_setting;

/* What dsp_db_setting_save writes of s. */
enum dsp_setting_what {
    DSP_SETTING_LIMITS,     /* has_limit = 1 and the three limits */
    DSP_SETTING_PAUSE,      /* paused */
    DSP_SETTING_RESUME_ALL, /* paused = 0 on every row (s->type unused) */
};

/* Queues a write of s (copied) to the settings table for the stats thread: an upsert of
 * its type's row. Errors are logged, not answered. Returns 0, or -1 (out of memory, or
 * the thread has stopped). */
int dsp_db_setting_save(dsp_db *db, const dsp_setting *s, enum dsp_setting_what what);

/* Asks the stats thread to read the settings table (at most DSP_SETTINGS_MAX rows); the
 * answer comes to on_settings with request_id. Returns 0, or -1 (out of memory: no
 * answer comes). */
int dsp_db_settings_load(dsp_db *db, uint64_t request_id) __attribute__((warn_unused_result));
#define DSP_SETTINGS_MAX 10001

/* Asks the stats thread to move FAILED rows (of one type, or all when type is
 * NULL) back to NEW with attempts 0, in batches; the answer comes to
 * on_requeued with request_id. Returns 0, or -1 (out of memory). */
int dsp_db_requeue_failed(dsp_db *db, const char *type, uint64_t request_id)
    __attribute__((warn_unused_result));

/* Queues op for the stats thread, which takes ownership of it; the answer comes to
 * on_taskop (also when the thread has stopped: status DSP_TASKOP_ERROR). Returns 0, or
 * -1 (no database side: op stays the caller's). */
int dsp_db_taskop(dsp_db *db, dsp_taskop *op) __attribute__((warn_unused_result));
void dsp_taskop_free(dsp_taskop *op);

/* The table's leadership lock is the user lock 'taskpush.<dbname>' for the table task,
 * 'taskpush/TABLE.<dbname>' for another (--table), with '.SHARD' after it for a shard
 * (NULL: none), the database's name cut so that it fits the DSP_DB_LOCK_NAME_MAX bytes
 * MySQL allows. Writes it to out (NUL-terminated) and returns its length, or 0 when it
 * does not fit in cap or the table's and shard's names leave no room. taskpushd
 * --migrate takes the same lock (unsharded). table NULL: task. */
#define DSP_DB_LOCK_NAME_MAX 64
size_t dsp_db_lock_name(const char *dbname, const char *table, const char *shard, char *out,
                        size_t cap);

/* Queues a submission for the submit thread, which inserts it with others in one
 * transaction (INSERT IGNORE ... RETURNING on a connection of its own) and answers
 * through on_submitted; it takes ownership of req. Returns 0, or -1 (no database side,
 * or stopping: req stays the caller's). */
int dsp_db_submit(dsp_db *db, dsp_submit_req *req) __attribute__((warn_unused_result));

/* Forgets the waited-for tasks of a connection that closed (thread-safe; db may be NULL). */
void dsp_db_submit_forget(dsp_db *db, uint64_t conn_id);

/* Frees a reply and whatever payloads were not stolen. */
void dsp_claim_reply_free(dsp_claim_reply *reply);

#endif
