/* bench.h: the internals shared by the files of taskpush-bench (bench/).
 *
 * bench.c owns main(), the flags, the run loop and the output; db.c the MySQL
 * connections, the fresh table of each run and the server's settings;
 * server_status.c what is measured around a drain (SHOW GLOBAL STATUS deltas, CPU
 * and RSS from /proc, the admin port's /stats); verify.c the exactly-once check;
 * designs_poll.c the polling designs and the ceiling; design_taskpush.c taskpushd
 * with workers on libtaskpush. A design is one entry of a table (bench_designs[]):
 * a name, a drain function and its parameters. The modes beyond the drain (--mode):
 * modes.c runs them and prints their lines, mode_stream.c the stream and latency
 * modes (producers inserting while taskpush drains), producer_submit.c their SUBMIT
 * producers (tp_submit through taskpushd), mode_mixed.c the mixed and soak modes
 * (four kinds of producers and the workers at once, payloads and results), mode_scale.c the connections
 * and backlog modes (taskpushd's memory with many workers or many waiting rows). */
#ifndef TASKPUSH_BENCH_H
#define TASKPUSH_BENCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>
#include <mysql.h>
#include <pthread.h>

#include "procfs.h"
#include "taskpush.h"

#define BENCH_MAX_K 4096u          /* threads and connections of one run */
#define BENCH_MAX_N 100000000ull   /* rows of one run */
#define BENCH_MAX_LIST 16          /* entries of --k */
#define BENCH_FLAT_SLOTS 1024u     /* total capacity kept by --flat */
#define BENCH_WORKER_THREADS 4u    /* --worker-threads */
#define BENCH_WHY_LEN 256
#define BENCH_MAX_TPD_ARGS 8       /* --taskpushd-arg */
#define BENCH_LARGE_K 64           /* from here the polling designs drain fewer rows */

/* Where the database server is. */
typedef struct bench_dbconf {
    char host[256];
    char user[128];
    char password[128];
    unsigned port;
    char dbname[65]; /* the scratch database, dropped and re-created for every run */
    char table[65];  /* --table: the task table's name (taskpushd --table), default task */
    unsigned group_keys; /* --group-keys: preloaded rows get group_key 'k<row % N>'; 0: none */
} bench_dbconf;

struct bench_design;

/* --mode */
typedef enum bench_mode {
    BENCH_MODE_DRAIN = 0,
    BENCH_MODE_STREAM,
    BENCH_MODE_LATENCY,
    BENCH_MODE_CONNECTIONS,
    BENCH_MODE_BACKLOG,
    BENCH_MODE_MIXED,
    BENCH_MODE_SOAK,
} bench_mode;

/* --producer: how the stream and latency modes add their tasks. */
typedef enum bench_producer {
    BENCH_PRODUCER_SQL = 0,  /* INSERT on the producer's own database connection */
    BENCH_PRODUCER_SUBMIT,   /* tp_submit through taskpushd (a producer-only client) */
} bench_producer;

/* The flags, after parsing. */
typedef struct bench_opts {
    bench_dbconf db;
    const struct bench_design *designs[16];
    int ndesigns;
    unsigned ks[BENCH_MAX_LIST];
    int nks;
    uint64_t n;       /* rows for taskpush and the ceiling */
    uint64_t n_poll;  /* rows for the polling designs */
    uint64_t n_poll_large_k; /* ... at K >= BENCH_LARGE_K: they run at 100 tasks/s there */
    unsigned poll_seconds;   /* a polling run stops claiming after this long; 0: never */
    unsigned repeat;
    unsigned capacity;
    bool flat;
    unsigned worker_threads; /* taskpush: threads the K workers share; 0: one each */
    bool json_only;
    bool sabotage;    /* hidden: breaks a row after the drain, for the test */
    bool hold_row;    /* hidden: a polling run's last row is locked throughout, for the test */
    char taskpushd[1024];
    const char *taskpushd_args[BENCH_MAX_TPD_ARGS]; /* --taskpushd-arg, from argv */
    int ntaskpushd_args;
    /* The modes beyond the drain (modes.c). */
    bench_mode mode;
    bool quick;
    unsigned producers;           /* stream */
    unsigned rows_per_insert[BENCH_MAX_LIST];
    int nrows_per_insert;
    bench_producer producer_kinds[2]; /* stream, latency: --producer, one result each */
    int nproducer_kinds;
    unsigned seconds;             /* stream, latency */
    unsigned interval_ms;         /* latency */
    unsigned poll_ms[BENCH_MAX_LIST];
    int npoll_ms;
    const char *wake[3];          /* latency: taskpushd --wake, one result each (default poll) */
    int nwake;
    unsigned load_rate;           /* latency: inserts/s of the loaded window (0: none) */
    bool load_rate_set;
    unsigned connections;         /* connections: idle workers */
    uint64_t backlog_rows;        /* backlog */
    unsigned payload_bytes[BENCH_MAX_LIST]; /* mixed, soak: one result each (soak: the first) */
    int npayload_bytes;
    unsigned submit_producers;    /* mixed: the single-task SUBMIT case's producers; 0: none */
    bool submit_producers_set;
    bool payload_bytes_none;   /* --payload-bytes none: mixed runs submit-only alone */
} bench_opts;

/* Claim latencies of one thread (microseconds), merged after the run. */
typedef struct bench_lat {
    double *v;
    size_t n, cap;
} bench_lat;

/* What the threads of one run count; shared, hence atomics. */
typedef struct bench_tally {
    uint64_t n;                /* rows preloaded: ids 1..n */
    _Atomic uint64_t *seen;    /* one bit per id */
    _Atomic uint64_t calls;    /* handler (no-op) runs */
    _Atomic uint64_t dups;     /* ids run more than once */
    _Atomic uint64_t strays;   /* ids outside 1..n */
    _Atomic uint64_t misses;   /* CAS updates that matched no row */
    _Atomic int cut;           /* a polling client stopped at --poll-seconds */
    _Atomic uint64_t interrupted; /* claims still running past the cut, interrupted */
    _Atomic int failed;        /* a design thread hit an error; why holds the first */
    char why[BENCH_WHY_LEN - 64];
} bench_tally;

/* Snapshot of the counters read around a drain. */
typedef struct bench_snap {
    double t;              /* monotonic seconds */
    uint64_t statements;   /* sum of the Com_* counters listed in server_status.c */
    uint64_t lock_waits;   /* Innodb_row_lock_waits */
    uint64_t handler_reads;    /* sum of Handler_read_* (Innodb_rows_read is gone in MariaDB 10.11) */
    double db_cpu;         /* mariadbd utime+stime seconds, < 0 unknown */
    double tpd_cpu;        /* taskpushd's, < 0 unknown */
    double bench_cpu;      /* this process's: the clients or the workers */
} bench_snap;

/* One run's figures: one JSON line. */
typedef struct bench_run {
    const char *design;
    unsigned k;
    uint64_t n;            /* rows preloaded */
    uint64_t done;         /* rows done: n, or fewer when the run was cut */
    bool cut;              /* stopped at --poll-seconds (polling designs only; verify.c) */
    unsigned capacity;     /* taskpush only, else 0 */
    unsigned round;        /* 1-based index of the interleaved round */
    double seconds;
    uint64_t statements, lock_waits, handler_reads, cas_misses;
    uint64_t interrupted;  /* claim statements interrupted past the cut (designs_poll.c) */
    bool has_latency;
    double p50_ms, p99_ms;
    double db_cpu_s, tpd_cpu_s;   /* < 0: unknown */
    double bench_cpu_s;           /* the bench's own (clients, workers); < 0: unknown */
    long tpd_rss_kb;              /* < 0: unknown */
    long long daemon_succeeded;   /* taskpush: /stats tasks.succeeded_total, else -1 */
    long long daemon_failed;
    bool verified;
    char why[BENCH_WHY_LEN];
} bench_run;

/* Everything a design needs. */
typedef struct bench_ctx {
    const bench_opts *o;
    MYSQL *admin;        /* the main thread's connection, on the scratch database */
    pid_t db_pid;        /* mariadbd, for /proc; 0 unknown */
    bench_tally tally;
    unsigned serial;     /* names taskpushd's ready and log files apart */
    double poll_deadline; /* bench_now() when polling clients stop claiming; 0: never */
    _Atomic uint64_t submit_resent; /* tp_submit answered TP_EUNAVAIL and was sent again */
} bench_ctx;

typedef int (*bench_drain_fn)(bench_ctx *ctx, const struct bench_design *d, unsigned k,
                              bench_run *r);

typedef struct bench_design {
    const char *name;
    bench_drain_fn drain;
    bool polling;       /* uses --n-poll and reports claim latency */
    bool single;        /* one connection whatever K: run once per round, k = 1 */
    unsigned batch;     /* rows per claim (polling designs) */
    bool cas;           /* CAS claim instead of SKIP LOCKED */
    bool backoff;       /* sleep 1-10 ms after a CAS miss */
    const char *scheduler; /* taskpush */
    bool deps;          /* the preload waits in groups of 100 (bench_db_add_deps); opt-in:
                         * not in the default list of designs */
} bench_design;

extern const bench_design bench_designs[];
extern const size_t bench_ndesigns;

/* A taskpushd child process and its loopback addresses (design_taskpush.c). */
typedef struct bench_daemon {
    pid_t pid;
    char listen[128];
    char admin[128];
    char ready[256];
    char log[256];
} bench_daemon;

/* One libtaskpush worker. The first worker of each thread's share also holds the
 * thread, which runs ws[0 .. nrun) with tp_worker_run_many(). */
typedef struct bench_worker {
    tp_worker *w;
    pthread_t thr;
    tp_worker **run; /* the share of the thread (first worker only) */
    size_t nrun;
    bench_tally *tally; /* told when tp_worker_run_many() fails (first worker only) */
    bool running;
} bench_worker;

/* db.c */
MYSQL *bench_db_connect(const bench_dbconf *c, const char *dbname);
int bench_db_exec(MYSQL *m, const char *sql);   /* affected rows >= 0, or -1 */
int bench_db_u64(MYSQL *m, const char *sql, uint64_t *out);
int bench_db_reset(const bench_dbconf *c, MYSQL *admin, uint64_t n);
/* After bench_db_reset's preload of ids 1..n: dependencies (docs/producers.md) in groups
 * of 100 ids 100g+1 .. 100g+100: the 99th waits on the 98 before it (a fan-in), the
 * 100th on the 99th (a chain); 2 % of the rows wait, 99 dependency rows a group.
 * MariaDB's sequence engine. 0 or -1. */
int bench_db_add_deps(const bench_dbconf *c, MYSQL *admin, uint64_t n);
int bench_db_drop(MYSQL *admin, const bench_dbconf *c);
void bench_db_url(const bench_dbconf *c, char *out, size_t cap);
json_t *bench_db_settings(MYSQL *m);
pid_t bench_db_pid(MYSQL *m);
int bench_parse_url(const char *url, bench_dbconf *c, char *err, size_t errcap);

/* server_status.c */
int bench_snap_take(bench_ctx *ctx, pid_t tpd_pid, bench_snap *s);
void bench_snap_delta(const bench_snap *a, const bench_snap *b, bench_run *r);
double bench_now(void);
json_t *bench_http_json(const char *hostport, const char *path);
long long bench_json_int(json_t *root, const char *dotted);

/* verify.c */
int bench_tally_init(bench_tally *t, uint64_t n);
void bench_tally_free(bench_tally *t);
void bench_tally_ran(bench_tally *t, uint64_t id);
void bench_tally_fail(bench_tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bench_verify(bench_ctx *ctx, bench_run *r);
int bench_sabotage(bench_ctx *ctx);

/* designs_poll.c, design_taskpush.c */
int bench_drain_poll(bench_ctx *ctx, const bench_design *d, unsigned k, bench_run *r);
int bench_drain_taskpush(bench_ctx *ctx, const bench_design *d, unsigned k, bench_run *r);
void bench_sleep_ms(unsigned ms);
int bench_daemon_start(bench_ctx *ctx, const char *const *extra, bench_daemon *dp);
void bench_daemon_stop(bench_daemon *dp, int sig, double timeout_s);
void bench_daemon_dump_log(const bench_daemon *dp);
/* fn NULL: the no-op handler that records the id in t. */
int bench_workers_make(bench_worker *ws, unsigned k, unsigned capacity, const char *addr,
                       tp_handler fn, void *arg, bench_tally *t);
/* Runs the k workers on `threads` threads (0: one thread each), as even shares. */
int bench_workers_start(bench_worker *ws, unsigned k, unsigned threads, bench_tally *t);
void bench_workers_stop(bench_worker *ws, unsigned k);
int bench_wait_drained(bench_ctx *ctx, const bench_daemon *dp, bench_run *r);

/* modes.c, mode_stream.c, mode_scale.c: each mode function prints its JSON lines,
 * adds one Markdown row per result to rows (a JSON array of strings) and returns
 * the number of results that failed verification (or could not run). */
int bench_modes_main(bench_ctx *ctx);
int bench_mode_stream(bench_ctx *ctx, json_t *rows);
int bench_mode_latency(bench_ctx *ctx, json_t *rows);
int bench_mode_connections(bench_ctx *ctx, json_t *rows);
int bench_mode_backlog(bench_ctx *ctx, json_t *rows);
int bench_mode_mixed(bench_ctx *ctx, json_t *rows);   /* mode_mixed.c */
int bench_mode_soak(bench_ctx *ctx, json_t *rows);
void bench_mode_emit(json_t *line);        /* prints one JSON line, takes the reference */
void bench_mode_row(json_t *rows, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* statements, handler reads, lock waits and CPU of a window, per task of n */
void bench_mode_server_figures(json_t *j, const bench_run *r, uint64_t n);
int bench_wait_workers(const bench_daemon *dp, long long want, double timeout_s);
int bench_verify_subset(bench_ctx *ctx, uint64_t rows, char *why, size_t cap);
extern const char *const bench_producer_names[]; /* "sql", "submit" */

/* producer_submit.c: the SUBMIT producers. Each is a producer-only libtaskpush client
 * (a tp_worker with no type) connected to addr. acked records every id an answer
 * returned (bench_tally_ran: a second answer for the same id counts as a dup). */
double bench_submit_stream(bench_ctx *ctx, const char *addr, unsigned np, unsigned rows,
                           unsigned s, uint64_t cap, bench_tally *acked, uint64_t *inserted);
/* One task every interval_ms, count in all: sent[id] when tp_submit was called,
 * acked[id] when it returned (ids 1..count, else the run fails). */
int bench_submit_latency(bench_ctx *ctx, const char *addr, uint64_t count, double *sent,
                         double *acked);
/* Producer-only clients for a mode that calls tp_submit itself (mode_mixed.c): n of
 * them connected to addr with their I/O threads running, or NULL (told to ctx's tally);
 * bench_submitter_submit is tp_submit on client i, sent again while TP_EUNAVAIL. */
typedef struct bench_submitter bench_submitter;
bench_submitter *bench_submitters_open(bench_ctx *ctx, const char *addr, unsigned n);
void bench_submitters_close(bench_submitter *sps, unsigned n);
int bench_submitter_submit(bench_submitter *sps, unsigned i, const tp_submit_task *tasks,
                           unsigned n, tp_submit_result *res, tp_error *err);
int bench_acked_match(const bench_tally *acked, const bench_tally *ran, uint64_t n, char *why,
                      size_t cap);

/* latency helpers (designs_poll.c) */
int bench_lat_add(bench_lat *l, double us);
void bench_lat_free(bench_lat *l);
double bench_lat_pct(bench_lat *l, double p); /* sorts; ms */

#endif
