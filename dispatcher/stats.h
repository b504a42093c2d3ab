/* stats.h: the dispatcher's counters, listed once, and the snapshot that /stats
 * and /metrics are built from (stats.c).
 *
 * Each X(name, help) line generates a struct field and its entry in /stats and
 * /metrics, so a counter cannot be added to one and forgotten in the other.
 * Counters only grow. The task and connection counters are touched on the loop
 * thread only; the database counters belong to the database threads (db*.c). */
#ifndef TASKPUSH_DSP_STATS_H
#define TASKPUSH_DSP_STATS_H

#include "db.h" /* DSP_DB_COUNTERS */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The "tasks" object of /stats (docs/admin.md; the first six are the contract). */
#define DSP_TASK_COUNTERS(X)                                                                  \
    X(claimed_total, "tasks claimed from the table")                                         \
    X(dispatched_total, "deliveries sent to workers")                                        \
    X(succeeded_total, "tasks that ended SUCCESSFUL")                                        \
    X(failed_total, "tasks that ended FAILED")                                               \
    X(retried_total, "failed attempts sent back to NEW with a backoff")                     \
    X(requeued_total, "deliveries taken back from a lost or timed-out worker")              \
    X(released_total, "claimed tasks put back to NEW undelivered (drain, shutdown)")        \
    X(timed_out_total, "deliveries cancelled because their lease expired")                  \
    X(late_results_total, "results ignored because their delivery was no longer current")   \
    X(extends_total, "lease extensions received")                                          \
    X(delivery_records_total, "deliveries recorded in the table before their outcome")      \
    X(refunded_total, "deliveries taken back uncharged from a worker dropped for timeouts") \
    X(orphans_released_total, "buffered tasks put back to NEW after their type lost its workers") \
    X(adopted_total, "deliveries a worker declared (HOLDING) and this dispatcher adopted")   \
    X(adopt_refused_total, "declared deliveries refused (CANCEL): recovered, finished, held") \
    X(foreign_written_total, "outcomes of deliveries not held here written (an earlier epoch)") \
    X(foreign_ignored_total, "outcomes of deliveries not held here whose row had moved on") \
    X(confirmed_total, "outcomes confirmed to version-3 workers (CONFIRM entries)")         \
    X(progress_total, "progress reports received for deliveries held (PROGRESS)")         \
    X(progress_ignored_total, "progress reports for deliveries not held here: ignored")

/* The "connections" object of /stats. */
#define DSP_CONN_COUNTERS(X)                                                                  \
    X(accepted_total, "worker connections accepted")                                         \
    X(rejected_total, "connections refused at HELLO (version, token, bad hello)")           \
    X(bad_frames_total, "connections closed for a malformed or oversized frame")            \
    X(lost_total, "workers lost: disconnected or silent for 3 heartbeats")                  \
    X(yields_total, "read callbacks that stopped at the frame budget to let others run")    \
    X(frames_in_total, "frames received")                                                    \
    X(frames_out_total, "frames sent")                                                       \
    X(refused_total, "connections closed on accept: --max-connections reached")             \
    X(accept_errors_total, "accept() failures such as EMFILE (the listener backs off)")     \
    X(handshake_pauses_total, "pauses of accepting past --max-failed-handshakes a second")   \
    X(timeouts_dropped_total, "workers dropped after --max-timeouts lease expiries in a row")\
    X(stalled_total, "connections dropped for a half frame or an unread output")           \
    X(dispatch_throttled_total, "dispatch passes held back by --max-unwritten")

#define DSP_STATS_FIELD(name, help) uint64_t name;

typedef struct dsp_task_stats {
    DSP_TASK_COUNTERS(DSP_STATS_FIELD)
} dsp_task_stats;

typedef struct dsp_conn_stats {
    DSP_CONN_COUNTERS(DSP_STATS_FIELD)
} dsp_conn_stats;

/* Latency histograms: fixed log-scale buckets, upper bounds in milliseconds
 * (inclusive, as Prometheus' "le"), plus the +Inf bucket. Counts per bucket are
 * kept non-cumulative; /metrics sums them up. */
#define DSP_HIST_BOUNDS_MS(X)                                                                 \
    X(1) X(2) X(5) X(10) X(25) X(50) X(100) X(250) X(500) X(1000) X(2500) X(5000) X(10000)   \
    X(30000) X(60000)
#define DSP_HIST_COUNT_ONE(b) +1
#define DSP_HIST_NBOUNDS (0 DSP_HIST_BOUNDS_MS(DSP_HIST_COUNT_ONE))

typedef struct dsp_hist {
    uint64_t buckets[DSP_HIST_NBOUNDS + 1]; /* the last one is +Inf */
    uint64_t count;
    double sum_ms;
} dsp_hist;

/* The upper bound of bucket i in ms (i < DSP_HIST_NBOUNDS). */
static inline double dsp_hist_bound_ms(int i)
{
#define DSP_HIST_BOUND_ENTRY(b) (double)(b),
    static const double bounds[] = {DSP_HIST_BOUNDS_MS(DSP_HIST_BOUND_ENTRY)};
#undef DSP_HIST_BOUND_ENTRY
    return bounds[i];
}

static inline void dsp_hist_add(dsp_hist *h, double ms)
{
    int i = 0;
    while (i < DSP_HIST_NBOUNDS && ms > dsp_hist_bound_ms(i))
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum_ms += ms;
}

/* The histograms, listed once like the counters: X(field, metric name, help). */
#define DSP_HISTOGRAMS(X)                                                                     \
    X(exec, "task_execution_seconds", "time from a task's delivery to its DONE")             \
    X(claim, "claim_transaction_seconds", "claim transaction time, BEGIN to COMMIT")

#define DSP_HIST_FIELD(field, name, help) dsp_hist field;
typedef struct dsp_histograms {
    DSP_HISTOGRAMS(DSP_HIST_FIELD)
} dsp_histograms;

/* Per-second samples of the task counters, for the rates of /stats. */
#define DSP_RATE_SAMPLES 61
typedef struct dsp_rate_sample {
    int64_t at_ms;
    uint64_t dispatched;
    uint64_t completed; /* succeeded + failed */
} dsp_rate_sample;

typedef struct dsp_rates {
    dsp_rate_sample s[DSP_RATE_SAMPLES];
    unsigned head; /* index of the newest sample */
    unsigned n;    /* samples held */
} dsp_rates;

static inline void dsp_rates_push(dsp_rates *r, int64_t at_ms, uint64_t dispatched, uint64_t completed)
{
    r->head = r->n ? (r->head + 1) % DSP_RATE_SAMPLES : 0;
    r->s[r->head] = (dsp_rate_sample){at_ms, dispatched, completed};
    if (r->n < DSP_RATE_SAMPLES)
        r->n++;
}

/* Per-second rates over the last window_s seconds (fewer when the daemon is
 * younger); 0 before two samples exist. */
static inline void dsp_rates_get(const dsp_rates *r, unsigned window_s, double *dispatched,
                                 double *completed)
{
    *dispatched = *completed = 0;
    if (r->n < 2)
        return;
    unsigned back = window_s < r->n - 1 ? window_s : r->n - 1;
    const dsp_rate_sample *now = &r->s[r->head];
    const dsp_rate_sample *old = &r->s[(r->head + DSP_RATE_SAMPLES - back) % DSP_RATE_SAMPLES];
    double secs = (double)(now->at_ms - old->at_ms) / 1000.0;
    if (secs <= 0)
        return;
    *dispatched = (double)(now->dispatched - old->dispatched) / secs;
    *completed = (double)(now->completed - old->completed) / secs;
}


/* ---- the snapshot and its views (stats.c) ---- */

struct dsp_config;
struct dsp_server;
struct dsp_table_stats;
struct evbuffer;
struct json_t;

typedef struct dsp_db_stats {
    DSP_DB_COUNTERS(DSP_DB_STATS_FIELD)
} dsp_db_stats;

/* The windows of the rates in /stats: 1 s, 10 s and 60 s. */
#define DSP_STATS_RATE_WINDOWS 3

/* One worker past HELLO, for the per-worker lines of /metrics. */
/* /metrics' per-worker series are labelled by name (HELLO's, as valid UTF-8, cut to
 * DSP_WORKER_LABEL_MAX bytes), not by connection: a reconnect is the same series. */
#define DSP_WORKER_LABEL_MAX 128
#define DSP_WORKER_NAMES_MAX 1024
typedef struct dsp_worker_total {
    char label[DSP_WORKER_LABEL_MAX + 1];
    uint64_t completed; /* by its connections that closed */
    int64_t left_ms;    /* when one last closed */
} dsp_worker_total;

/* Writes name's /metrics label into out (DSP_WORKER_LABEL_MAX + 1 bytes). */
void dsp_stats_worker_label(const char *name, char *out);
/* A worker's connection closed: adds what it finished to its name's total. */
void dsp_stats_worker_left(struct dsp_server *srv, const char *name, uint64_t completed, int64_t now_ms);
void dsp_stats_worker_totals_free(struct dsp_server *srv);

typedef struct dsp_stats_worker {
    const char *name; /* borrowed: what its HELLO said ("" for none), not yet UTF-8-checked */
    uint64_t conn_id;
    uint64_t capacity, in_flight, completed_total;
} dsp_stats_worker;

/* Everything /stats and /metrics show, copied from the server and the database
 * side at one moment on the loop thread. The borrowed strings (the settings,
 * type and worker names) stay valid until the loop runs again, so a snapshot is
 * used within the callback that filled it. */
/* The last POST /requeue-failed, as /stats shows it. */
typedef struct dsp_requeue_status {
    uint64_t id;    /* 0: none asked yet */
    char type[257]; /* "" for every type */
    bool done;
    int64_t rows;   /* when done: rows moved, or -1 on failure */
} dsp_requeue_status;

/* One task type the dispatcher holds (a worker registered it, tasks of it are
 * buffered, or it is paused), for the "by_type" array of /stats. */
#define DSP_STATS_TYPES_MAX 256
typedef struct dsp_stats_type {
    const char *name; /* borrowed */
    uint64_t workers, buffered, in_flight;
    bool paused;
    uint32_t limit_concurrency, limit_rate; /* --type-limit / POST /limit; 0: none */
    uint32_t limit_per_group;               /* --group-limit / POST /limit; 0: none */
    uint64_t answered_ok, answered_failed;  /* dsp_type's */
} dsp_stats_type;

typedef struct dsp_stats_snapshot {
    int64_t uptime_ms;
    int64_t wall_ms;                /* the wall clock when taken (age of the table figures) */
    const struct dsp_config *cfg;   /* borrowed: the effective settings */
    const char *scheduler;          /* the policy's name */
    const char *sql_dialect;        /* db.sql_dialect: the SQL dialect in use (static) */
    dsp_wake_status wake;           /* "wake": the binary log follower (--wake) */
    const char *node_host;          /* db.node, db.node_port: the server of --db in use */
    unsigned node_port;
    bool galera;                    /* db.galera, db.lease_ms, db.lease_renew_ms: the lease */
    int64_t lease_ms, lease_renew_ms; /* in use (0 before the first connection) */
    bool db_connected, leader;
    /* What /healthz answers (dsp_stats_health): ok, or the reason it is 503. */
    bool health_ok;
    char health_reason[320];
    uint32_t epoch;
    size_t nconns, nworkers, ntypes;
    uint64_t nbuffered, ninflight;
    uint64_t payload_bytes;         /* of the claimed tasks held, buffered or in flight */
    bool draining;                  /* either kind: POST /drain, or a signal's drain before exit */
    bool shutting_down;             /* a signal's drain */
    bool paused_all;
    const char **paused_types;      /* malloc'd array of borrowed names */
    size_t npaused_types;
    dsp_task_stats tasks;
    dsp_conn_stats conns;
    dsp_db_stats db;
    uint64_t pending_writes;        /* in the loop's outbox, queued or being written */
    uint64_t pending_write_bytes;   /* their result and error bytes */
    dsp_histograms hist;
    double dispatched_per_s[DSP_STATS_RATE_WINDOWS];
    double completed_per_s[DSP_STATS_RATE_WINDOWS];
    dsp_requeue_status last_requeue;
    struct dsp_table_stats *table;  /* malloc'd; NULL when out of memory */
    dsp_stats_worker *workers;      /* malloc'd */
    size_t nworker_rows;
    const dsp_worker_total *worker_totals; /* borrowed: the workers that left, by label */
    size_t nworker_totals;
    dsp_stats_type *held_types;     /* malloc'd; at most DSP_STATS_TYPES_MAX */
    size_t nheld_types;
    bool held_types_cut;            /* more types are held than listed */
    const struct dsp_type_limit *limits; /* borrowed: the per-type limits (limits.c) */
    size_t nlimits;
} dsp_stats_snapshot;

/* Fills snap from srv; call dsp_stats_snapshot_clear after. When out of memory
 * it shows less (no table, no paused type or worker listed) rather than fail. */
void dsp_stats_snapshot_fill(dsp_stats_snapshot *snap, const struct dsp_server *srv);
/* Whether this dispatcher can do its job (SPEC, /healthz): the database reachable, the
 * schema taskpush's and its statements succeeding. false with the reason in why (cap
 * bytes, NUL-ended; "" when ok). */
bool dsp_stats_health(const struct dsp_server *srv, char *why, size_t cap);
void dsp_stats_snapshot_clear(dsp_stats_snapshot *snap);

/* The /stats object (docs/admin.md); a new reference, NULL when out of memory. */
struct json_t *dsp_stats_json(const dsp_stats_snapshot *snap);
/* Appends the /metrics text (Prometheus text format 0.0.4, docs/admin.md) to out. */
void dsp_stats_metrics(const dsp_stats_snapshot *snap, struct evbuffer *out);

#endif
