/* mode_mixed.c: the modes of a real workload (issue 36): producers and workers at once.
 *
 * mixed: P producers of each of four kinds - SQL single-row INSERTs (sql-1), SQL
 * 100-row INSERTs (sql-100), single-task SUBMITs (submit-1) and 100-task SUBMITs
 * (submit-100) - and K taskpush workers at once for S seconds, on a fresh table with a
 * fresh taskpushd, once per --payload-bytes. Every payload starts with a 20-byte header,
 * the bench's monotonic clock (us) when its producer sent it, and the handler returns a
 * result as long as its payload. Then everything is drained and verified exactly-once,
 * the ids SUBMIT answered included. In the same run: --submit-producers producers of
 * single-task SUBMITs alone (header-only payloads), and the no-op preloaded drain at the
 * same K (taskpush-ll), before and after, whose mean rate the others are divided by.
 * The header also names the producer's kind, so that the ids the handlers ran for
 * SUBMIT producers can be matched with the ids their answers carried.
 *
 * soak: mixed, unpaced for a short window (its peak), then paced at 80 % of that for
 * --seconds, sampling every 10 s (2 s with --quick) the enqueue-to-start p99 and
 * taskpushd's RSS. Whether they stayed flat is reported, not verified: on a shared
 * machine a window's p99 moves with the neighbours' load (bench/README.md). */
#include "bench.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEADER_LEN 20u      /* 18 decimal digits of microseconds, the kind ('a' + kind), '|' */
#define BATCH 100u          /* rows of sql-100 and submit-100 */
#define NKINDS 4
#define MIXED_CAP BENCH_MAX_N /* ids of one window: the tally's bitmap (untouched pages stay unmapped) */
#define WORKERS_TIMEOUT_S 30.0
#define SOAK_SHARE 0.8
#define SOAK_CALIBRATE_S 10u
#define QUICK_SOAK_CALIBRATE_S 3u
#define SOAK_SAMPLE_S 10.0
#define QUICK_SOAK_SAMPLE_S 2.0
#define SOAK_WARMUP_S 60.0  /* flatness counts from minute 1 (at most a fifth of the window) */
#define FLAT_WITHIN 0.10

enum { KIND_SQL1, KIND_SQL100, KIND_SUB1, KIND_SUB100 };
static const char *const kind_names[NKINDS] = {"sql-1", "sql-100", "submit-1", "submit-100"};
static const unsigned kind_rows[NKINDS] = {1, BATCH, 1, BATCH};

/* Microseconds in log-linear buckets (64 per power of two: within 1.6 %), counted
 * from any thread; exact below 64 us, up to 2^40 us. */
#define HIST_SUB 64u
#define HIST_BUCKETS (35u * HIST_SUB)
typedef struct hist {
    _Atomic uint64_t c[HIST_BUCKETS];
} hist;

static unsigned hist_index(uint64_t us)
{
    if (us < HIST_SUB)
        return (unsigned)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us);
    if (e > 39)
        return HIST_BUCKETS - 1;
    return (e - 5) * HIST_SUB + (unsigned)((us >> (e - 6)) & (HIST_SUB - 1));
}

static double hist_value(unsigned i)
{
    if (i < HIST_SUB)
        return i;
    unsigned e = i / HIST_SUB + 5, sub = i % HIST_SUB;
    uint64_t width = 1ull << (e - 6);
    return (double)((HIST_SUB + sub) * width) + (double)(width - 1) / 2;
}

static void hist_add(hist *h, double us)
{
    atomic_fetch_add_explicit(&h->c[hist_index(us > 0 ? (uint64_t)us : 0)], 1,
                              memory_order_relaxed);
}

/* out = h now, minus prev when given (a window's counts). */
static void hist_read(const hist *h, const uint64_t *prev, uint64_t *out)
{
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        out[i] = atomic_load_explicit(&h->c[i], memory_order_relaxed) - (prev ? prev[i] : 0);
}

static uint64_t counts_total(const uint64_t *c)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        n += c[i];
    return n;
}

/* The p-th percentile in ms, < 0 when nothing was counted. */
static double counts_pct_ms(const uint64_t *c, double p)
{
    uint64_t total = counts_total(c), cum = 0;
    if (total == 0)
        return -1;
    double w = p / 100.0 * (double)total;
    uint64_t want = (uint64_t)w;
    if ((double)want < w)
        want++;
    if (want == 0)
        want = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        if ((cum += c[i]) >= want)
            return hist_value(i) / 1000.0;
    return hist_value(HIST_BUCKETS - 1) / 1000.0;
}

/* What the handlers and producers of one window share. */
typedef struct mixed_state {
    bench_tally *t;
    unsigned payload_len; /* every payload's bytes, the header included; the results' too */
    char *result;         /* payload_len bytes */
    bench_tally *submitted; /* the ids the handlers ran whose payload a SUBMIT producer sent */
    hist start;           /* enqueue (the header's time) to the handler's start */
    hist ack[NKINDS];     /* a producer's call to its return */
} mixed_state;

static void header_write(char *p, double now, int kind)
{
    char buf[HEADER_LEN + 1];
    snprintf(buf, sizeof buf, "%018" PRIu64 "%c|", (uint64_t)(now * 1e6) % UINT64_C(1000000000000000000),
             'a' + kind);
    memcpy(p, buf, HEADER_LEN);
}

/* The payload is ours, but it crossed the table: its length and header are checked. */
static int header_read(const char *p, size_t len, uint64_t *us, int *kind)
{
    uint64_t v = 0;
    if (p == NULL || len < HEADER_LEN || p[HEADER_LEN - 1] != '|' || p[HEADER_LEN - 2] < 'a' ||
        p[HEADER_LEN - 2] >= 'a' + NKINDS)
        return -1;
    for (unsigned i = 0; i < HEADER_LEN - 2; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    *us = v;
    *kind = p[HEADER_LEN - 2] - 'a';
    return 0;
}

static int mixed_handler(tp_task *task, void *arg)
{
    mixed_state *ms = arg;
    double now = bench_now();
    uint64_t id = tp_task_id(task), sent;
    size_t len;
    int kind;
    const char *p = tp_task_payload(task, &len);

    bench_tally_ran(ms->t, id);
    if (len != ms->payload_len || header_read(p, len, &sent, &kind) < 0) {
        bench_tally_fail(ms->t, "task %" PRIu64 ": a payload of %zu bytes without its header"
                         " (expected %u bytes)", id, len, ms->payload_len);
        return TP_SUCCESS;
    }
    if (kind >= KIND_SUB1)
        bench_tally_ran(ms->submitted, id);
    hist_add(&ms->start, now * 1e6 - (double)sent);
    if (tp_task_set_result(task, ms->result, ms->payload_len) != 0)
        bench_tally_fail(ms->t, "task %" PRIu64 ": tp_task_set_result of %u bytes failed", id,
                         ms->payload_len);
    return TP_SUCCESS;
}

/* One producer thread of one kind. */
typedef struct mproducer {
    mixed_state *ms;
    int kind;
    MYSQL *m;             /* sql kinds */
    bench_submitter *sps; /* submit kinds: the clients, and this one's index */
    unsigned client;
    bench_tally *acked;   /* every id SUBMIT answered */
    const char *table;
    double t0, end;
    double rate;          /* tasks/s of this producer; 0: as fast as it can */
    _Atomic uint64_t *total, *kind_total;
    pthread_t thr;
} mproducer;

/* Waits for the producer's next call when paced: call j at t0 + j * rows / rate. */
static void pace(const mproducer *p, uint64_t calls)
{
    if (p->rate <= 0)
        return;
    double at = p->t0 + (double)calls * kind_rows[p->kind] / p->rate, now = bench_now();
    if (at > p->end)
        at = p->end;
    if (at > now)
        bench_sleep_ms((unsigned)((at - now) * 1000.0) + 1);
}

static bool go_on(const mproducer *p, unsigned rows)
{
    return bench_now() < p->end && !atomic_load(&p->ms->t->failed) &&
           atomic_load(p->total) + rows <= MIXED_CAP;
}

/* One INSERT of rows rows, priorities 0, 1, 2 in turn, each row's payload the same:
 * the header's places are kept in at[] and rewritten before each call. */
static void *sql_main(void *arg)
{
    mproducer *p = arg;
    mixed_state *ms = p->ms;
    unsigned rows = kind_rows[p->kind], len = ms->payload_len;
    size_t cap = 128 + (size_t)rows * (len + 16), n;
    char *sql = malloc(cap);
    size_t *at = calloc(rows, sizeof *at);
    uint64_t calls = 0;

    if (sql == NULL || at == NULL) {
        bench_tally_fail(ms->t, "out of memory");
        goto done;
    }
    n = (size_t)snprintf(sql, cap, "INSERT INTO %s (task_priority, payload) VALUES ", p->table);
    for (unsigned i = 0; i < rows; i++) {
        n += (size_t)snprintf(sql + n, cap - n, "%s(%u,'", i ? "," : "", i % 3);
        at[i] = n;
        memset(sql + n, 'p', len); /* ASCII: nothing to escape */
        n += len;
        sql[n++] = '\'';
        sql[n++] = ')';
    }
    while (go_on(p, rows)) {
        pace(p, calls++);
        if (bench_now() >= p->end)
            break;
        double s0 = bench_now();
        for (unsigned i = 0; i < rows; i++)
            header_write(sql + at[i], s0, p->kind);
        if (mysql_real_query(p->m, sql, (unsigned long)n) != 0 ||
            mysql_affected_rows(p->m) != rows) {
            bench_tally_fail(ms->t, "%s INSERT: %s", kind_names[p->kind], mysql_error(p->m));
            break;
        }
        hist_add(&ms->ack[p->kind], (bench_now() - s0) * 1e6);
        atomic_fetch_add(p->total, rows);
        atomic_fetch_add(p->kind_total, rows);
    }
done:
    free(sql);
    free(at);
    return NULL;
}

static void *submit_main(void *arg)
{
    mproducer *p = arg;
    mixed_state *ms = p->ms;
    unsigned rows = kind_rows[p->kind];
    tp_submit_task tasks[BATCH];
    tp_submit_result res[BATCH];
    char *payload = malloc(ms->payload_len);
    tp_error err;
    uint64_t calls = 0;

    if (payload == NULL) {
        bench_tally_fail(ms->t, "out of memory");
        return NULL;
    }
    memset(payload, 'p', ms->payload_len);
    for (unsigned i = 0; i < rows; i++) {
        tp_submit_task_init(&tasks[i]);
        tasks[i].type = "default";
        tasks[i].priority = (int)(i % 3);
        tasks[i].payload = payload; /* borrowed by tp_submit: one buffer for the batch */
        tasks[i].payload_len = ms->payload_len;
    }
    while (go_on(p, rows)) {
        pace(p, calls++);
        if (bench_now() >= p->end)
            break;
        double s0 = bench_now();
        header_write(payload, s0, p->kind);
        if (bench_submitter_submit(p->sps, p->client, tasks, rows, res, &err) != 0) {
            bench_tally_fail(ms->t, "%s tp_submit: %s", kind_names[p->kind], err.text);
            break;
        }
        hist_add(&ms->ack[p->kind], (bench_now() - s0) * 1e6);
        for (unsigned i = 0; i < rows; i++) {
            if (res[i].duplicate || res[i].task_id == 0) {
                bench_tally_fail(ms->t, "submit answered %s for a task without a key",
                                 res[i].duplicate ? "duplicate" : "no id");
                goto done;
            }
            bench_tally_ran(p->acked, res[i].task_id);
        }
        atomic_fetch_add(p->total, rows);
        atomic_fetch_add(p->kind_total, rows);
    }
done:
    free(payload);
    return NULL;
}

/* The ids SUBMIT answered are exactly the ids the handlers ran with a payload a SUBMIT
 * producer sent, as many as were submitted, each once. Read after bench_verify: every
 * id that ran lies in 1..n, so equal counts and equal bits there leave none outside. */
static int acked_match(const bench_tally *acked, const bench_tally *submitted, uint64_t n,
                       uint64_t by_submit, char *why, size_t cap)
{
    uint64_t answered = atomic_load(&acked->calls), ran = atomic_load(&submitted->calls);
    if (answered != by_submit || ran != by_submit || atomic_load(&acked->dups) ||
        atomic_load(&acked->strays)) {
        snprintf(why, cap, "submit answered %" PRIu64 " ids (%" PRIu64 " twice, %" PRIu64
                 " out of range) and the handlers ran %" PRIu64 " submitted payloads for %" PRIu64
                 " submitted tasks", answered, atomic_load(&acked->dups),
                 atomic_load(&acked->strays), ran, by_submit);
        return -1;
    }
    for (uint64_t w = 0; n > 0 && w <= (n - 1) / 64; w++) {
        uint64_t bits = w < (n - 1) / 64 || n % 64 == 0 ? ~0ull : (1ull << (n % 64)) - 1;
        if ((atomic_load(&acked->seen[w]) & bits) != (atomic_load(&submitted->seen[w]) & bits)) {
            snprintf(why, cap, "ids %" PRIu64 "..%" PRIu64 ": the ids SUBMIT answered and the "
                     "submitted payloads the handlers ran differ", w * 64 + 1, w * 64 + 64);
            return -1;
        }
    }
    return 0;
}

/* taskpushd's /stats counters a window reports the delta of (what its statements went to). */
static const char *const TPD_KEYS[] = {"db.statements_total",    "db.submit_requests_total",
                                       "db.submit_batches_total", "db.claims_total",
                                       "db.claimed_rows_total",   "db.write_batches_total",
                                       "db.submit_us_total",      "db.submit_gather_us_total"};
#define NTPD (sizeof TPD_KEYS / sizeof TPD_KEYS[0])

static void tpd_read(json_t *s, long long *out)
{
    for (size_t i = 0; i < NTPD; i++)
        out[i] = bench_json_int(s, TPD_KEYS[i]);
}

/* What one window runs. */
typedef struct window {
    const char *name;       /* "mixed", "submit-only", "peak", "soak" */
    unsigned np[NKINDS];    /* producers of each kind */
    double rate[NKINDS];    /* tasks/s of each producer of the kind; 0: unpaced */
    unsigned seconds;
    unsigned payload;       /* --payload-bytes: 0 means the header only */
    double sample_s;        /* soak: sample every; 0: no samples */
} window;

/* Its figures. */
typedef struct window_result {
    uint64_t kind_inserted[NKINDS];
    double window_s, tasks_per_s, inserted_per_s, tail;
    uint64_t start_counts[HIST_BUCKETS];
    uint64_t ack_counts[NKINDS][HIST_BUCKETS];
    json_t *samples;        /* soak: [{t, tasks_per_s, start_p99_ms, rss_kb}] */
    uint64_t resent;
    long long tpd[NTPD];    /* taskpushd's own counters (TPD_KEYS) over the same span; -1: unknown */
    bench_run r;            /* n: tasks inserted; the per-task figures run from the window's
                               start until every task was written */
} window_result;

/* One soak sample: since the previous one. */
static void take_sample(const bench_daemon *dp, mixed_state *ms, double t0, uint64_t *prev,
                        uint64_t *cur, long long *prev_ok, double *prev_t, json_t *samples)
{
    json_t *s = bench_http_json(dp->admin, "/stats");
    long long ok = bench_json_int(s, "tasks.succeeded_total");
    json_decref(s);
    double now = bench_now();
    hist_read(&ms->start, prev, cur);
    double p99 = counts_pct_ms(cur, 99);
    long rss = procfs_status_kb(dp->pid, "VmRSS");
    json_t *j = json_pack("{s:f}", "t", now - t0);
    json_object_set_new(j, "tasks_per_s",
                        ok >= 0 && *prev_ok >= 0 ? json_real((double)(ok - *prev_ok) / (now - *prev_t))
                                                 : json_null());
    json_object_set_new(j, "start_p99_ms", p99 >= 0 ? json_real(p99) : json_null());
    json_object_set_new(j, "rss_kb", rss >= 0 ? json_integer(rss) : json_null());
    json_array_append_new(samples, j);
    hist_read(&ms->start, NULL, prev);
    *prev_ok = ok;
    *prev_t = now;
}

/* A fresh table and taskpushd, K workers, the producers for the window, the drain of
 * what they inserted and the verification. Fills wr; wr->r.verified says how it went. */
static void run_window(bench_ctx *ctx, const window *w, window_result *wr)
{
    const bench_opts *o = ctx->o;
    unsigned k = o->ks[0], nprod = 0, nsub = 0, started = 0;
    bench_daemon dp = {0};
    bench_snap a, b;
    bench_tally acked, submitted;
    bench_worker *ws = calloc(k, sizeof *ws);
    mixed_state *ms = calloc(1, sizeof *ms);
    mproducer *ps = NULL;
    bench_submitter *sps = NULL;
    _Atomic uint64_t total = 0, kind_total[NKINDS] = {0, 0, 0, 0};
    bench_run *r = &wr->r;
    bool ready = false;

    memset(&acked, 0, sizeof acked);
    memset(&submitted, 0, sizeof submitted);
    memset(r, 0, sizeof *r);
    r->db_cpu_s = r->tpd_cpu_s = r->bench_cpu_s = -1;
    r->tpd_rss_kb = -1;
    r->daemon_succeeded = r->daemon_failed = -1;
    wr->tasks_per_s = wr->inserted_per_s = wr->tail = -1;
    for (size_t i = 0; i < NTPD; i++)
        wr->tpd[i] = -1;
    for (int i = 0; i < NKINDS; i++) {
        nprod += w->np[i];
        if (i >= KIND_SUB1)
            nsub += w->np[i];
    }
    if (ws == NULL || ms == NULL || (ps = calloc(nprod ? nprod : 1, sizeof *ps)) == NULL ||
        bench_tally_init(&ctx->tally, MIXED_CAP) < 0 || bench_tally_init(&acked, MIXED_CAP) < 0 ||
        bench_tally_init(&submitted, MIXED_CAP) < 0) {
        snprintf(r->why, sizeof r->why, "out of memory");
        goto out;
    }
    ms->t = &ctx->tally;
    ms->submitted = &submitted;
    ms->payload_len = w->payload > HEADER_LEN ? w->payload : HEADER_LEN;
    if ((ms->result = malloc(ms->payload_len)) == NULL) {
        snprintf(r->why, sizeof r->why, "out of memory");
        goto out;
    }
    memset(ms->result, 'r', ms->payload_len);
    atomic_store(&ctx->submit_resent, 0);
    if (bench_db_reset(&o->db, ctx->admin, 0) < 0) {
        snprintf(r->why, sizeof r->why, "could not prepare the table");
        goto out;
    }
    const char *const extra[] = {"--scheduler", "least-loaded", NULL}; /* as taskpush-ll */
    if (bench_daemon_start(ctx, extra, &dp) < 0 ||
        bench_workers_make(ws, k, o->capacity, dp.listen, mixed_handler, ms, &ctx->tally) < 0 ||
        bench_workers_start(ws, k, o->worker_threads, &ctx->tally) < 0)
        goto verify;
    if (bench_wait_workers(&dp, k, WORKERS_TIMEOUT_S) < 0) {
        bench_tally_fail(&ctx->tally, "the %u workers did not connect", k);
        goto verify;
    }
    /* Every connection is open before the clock starts. */
    if (nsub > 0 && (sps = bench_submitters_open(ctx, dp.listen, nsub)) == NULL)
        goto verify;
    for (int kind = 0, i = 0, client = 0; kind < NKINDS; kind++)
        for (unsigned j = 0; j < w->np[kind]; j++, i++) {
            mproducer *p = &ps[i];
            p->ms = ms;
            p->kind = kind;
            p->rate = w->rate[kind];
            p->table = o->db.table;
            p->total = &total;
            p->kind_total = &kind_total[kind];
            p->acked = &acked;
            if (kind >= KIND_SUB1) {
                p->sps = sps;
                p->client = (unsigned)client++;
            } else if ((p->m = bench_db_connect(&o->db, o->db.dbname)) == NULL) {
                bench_tally_fail(&ctx->tally, "producer %u cannot connect", i);
                goto verify;
            }
        }
    if (bench_snap_take(ctx, dp.pid, &a) < 0)
        goto verify;
    json_t *s = bench_http_json(dp.admin, "/stats");
    long long ok0 = bench_json_int(s, "tasks.succeeded_total"), tpd0[NTPD];
    tpd_read(s, tpd0);
    json_decref(s);
    double t0 = bench_now();
    for (; started < nprod; started++) {
        ps[started].t0 = t0;
        ps[started].end = t0 + w->seconds;
        if (pthread_create(&ps[started].thr, NULL,
                           ps[started].kind >= KIND_SUB1 ? submit_main : sql_main,
                           &ps[started]) != 0) {
            bench_tally_fail(&ctx->tally, "cannot start producer thread %u", started);
            break;
        }
    }
    if (w->sample_s > 0 && (wr->samples = json_array()) != NULL) {
        uint64_t *prev = calloc(2 * HIST_BUCKETS, sizeof *prev);
        long long prev_ok = ok0;
        double prev_t = t0;
        for (double next = t0 + w->sample_s; prev && next <= t0 + w->seconds + 0.5;
             next += w->sample_s) {
            double now = bench_now();
            if (next > now)
                bench_sleep_ms((unsigned)((next - now) * 1000.0));
            if (atomic_load(&ctx->tally.failed))
                break;
            take_sample(&dp, ms, t0, prev, prev + HIST_BUCKETS, &prev_ok, &prev_t, wr->samples);
        }
        free(prev);
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(ps[i].thr, NULL);
    double t_end = bench_now();
    s = bench_http_json(dp.admin, "/stats");
    long long ok1 = bench_json_int(s, "tasks.succeeded_total");
    json_decref(s);
    wr->window_s = t_end - t0;
    r->n = atomic_load(&total);
    for (int i = 0; i < NKINDS; i++)
        wr->kind_inserted[i] = atomic_load(&kind_total[i]);
    wr->inserted_per_s = (double)r->n / wr->window_s;
    if (ok0 >= 0 && ok1 >= ok0)
        wr->tasks_per_s = (double)(ok1 - ok0) / wr->window_s;
    if (started < nprod || atomic_load(&ctx->tally.failed) || r->n == 0 ||
        bench_wait_drained(ctx, &dp, r) < 0 || bench_snap_take(ctx, dp.pid, &b) < 0)
        goto verify;
    wr->tail = bench_now() - t_end;
    bench_snap_delta(&a, &b, r);
    r->tpd_rss_kb = procfs_status_kb(dp.pid, "VmHWM");
    s = bench_http_json(dp.admin, "/stats");
    r->daemon_succeeded = bench_json_int(s, "tasks.succeeded_total");
    r->daemon_failed = bench_json_int(s, "tasks.failed_total");
    tpd_read(s, wr->tpd);
    for (size_t i = 0; i < NTPD; i++)
        wr->tpd[i] = wr->tpd[i] >= 0 && tpd0[i] >= 0 && wr->tpd[i] >= tpd0[i] ? wr->tpd[i] - tpd0[i] : -1;
    json_decref(s);
    ready = true;
verify:
    wr->resent = atomic_load(&ctx->submit_resent);
    bench_workers_stop(ws, k);
    bench_submitters_close(sps, nsub);
    for (unsigned i = 0; i < nprod; i++)
        if (ps[i].m)
            mysql_close(ps[i].m);
    if (dp.pid > 0)
        bench_daemon_stop(&dp, SIGTERM, 20);
    if (dp.log[0] && !atomic_load(&ctx->tally.failed))
        unlink(dp.log); /* kept when something failed */
    if (o->sabotage)
        bench_sabotage(ctx);
    if (!ready && !atomic_load(&ctx->tally.failed))
        bench_tally_fail(&ctx->tally, "the %s window inserted %" PRIu64 " tasks and did not drain",
                         w->name, r->n);
    bench_verify(ctx, r);
    if (r->verified) {
        uint64_t by_submit = 0;
        for (int i = KIND_SUB1; i < NKINDS; i++)
            by_submit += wr->kind_inserted[i];
        if (acked_match(&acked, &submitted, r->n, by_submit, r->why, sizeof r->why) < 0)
            r->verified = false;
    }
    hist_read(&ms->start, NULL, wr->start_counts);
    for (int i = 0; i < NKINDS; i++)
        hist_read(&ms->ack[i], NULL, wr->ack_counts[i]);
out:
    bench_tally_free(&acked);
    bench_tally_free(&submitted);
    bench_tally_free(&ctx->tally);
    if (ms)
        free(ms->result);
    free(ms);
    free(ps);
    free(ws);
}

static json_t *jnum(double v)
{
    return v >= 0 ? json_real(v) : json_null();
}

static json_t *producers_json(const window *w)
{
    json_t *j = json_object();
    for (int i = 0; i < NKINDS; i++)
        json_object_set_new(j, kind_names[i], json_integer(w->np[i]));
    return j;
}

/* p50, p99, p99.9 (ms) and the count of each producer kind's calls. */
static json_t *ack_json(const window_result *wr)
{
    json_t *j = json_object();
    for (int i = 0; i < NKINDS; i++) {
        uint64_t n = counts_total(wr->ack_counts[i]);
        if (n == 0)
            continue;
        json_object_set_new(j, kind_names[i],
                            json_pack("{s:o,s:o,s:o,s:I}", "p50",
                                      jnum(counts_pct_ms(wr->ack_counts[i], 50)), "p99",
                                      jnum(counts_pct_ms(wr->ack_counts[i], 99)), "p999",
                                      jnum(counts_pct_ms(wr->ack_counts[i], 99.9)), "calls",
                                      (json_int_t)n));
    }
    return j;
}

/* The figures every window's line carries. */
static void window_json(json_t *j, const bench_ctx *ctx, const window *w, const window_result *wr)
{
    const bench_run *r = &wr->r;
    json_object_set_new(j, "payload_bytes", json_integer(w->payload));
    json_object_set_new(j, "payload_len", json_integer(w->payload > HEADER_LEN ? w->payload : HEADER_LEN));
    json_object_set_new(j, "producers", producers_json(w));
    json_object_set_new(j, "workers", json_integer(ctx->o->ks[0]));
    json_object_set_new(j, "capacity", json_integer(ctx->o->capacity));
    json_object_set_new(j, "seconds", json_real(wr->window_s));
    json_object_set_new(j, "n", json_integer((json_int_t)r->n));
    json_object_set_new(j, "inserted_per_s", jnum(wr->inserted_per_s));
    json_object_set_new(j, "tasks_per_s", jnum(wr->tasks_per_s));
    json_object_set_new(j, "ack_ms", ack_json(wr));
    json_object_set_new(j, "start_p50_ms", jnum(counts_pct_ms(wr->start_counts, 50)));
    json_object_set_new(j, "start_p99_ms", jnum(counts_pct_ms(wr->start_counts, 99)));
    json_object_set_new(j, "start_p999_ms", jnum(counts_pct_ms(wr->start_counts, 99.9)));
    bench_mode_server_figures(j, r, r->n);
    json_object_set_new(j, "taskpushd_peak_rss_kb",
                        r->tpd_rss_kb >= 0 ? json_integer(r->tpd_rss_kb) : json_null());
    json_object_set_new(j, "tail_seconds", jnum(wr->tail));
    json_object_set_new(j, "submit_resent", json_integer((json_int_t)wr->resent));
    /* Where taskpushd's statements went: "db.submit_batches_total" becomes "submit_batches". */
    json_t *t = json_object();
    for (size_t i = 0; i < NTPD; i++) {
        char key[64];
        const char *k = TPD_KEYS[i] + 3;
        size_t len = strlen(k) - strlen("_total");
        snprintf(key, sizeof key, "%.*s", (int)len, k);
        json_object_set_new(t, key, wr->tpd[i] >= 0 ? json_integer(wr->tpd[i]) : json_null());
    }
    json_object_set_new(j, "taskpushd_db", t);
}

static double ack_p99(const window_result *wr, int kind)
{
    return counts_pct_ms(wr->ack_counts[kind], 99);
}

/* "-" for a figure not there. */
static const char *fmt_ms(char *buf, size_t cap, double v)
{
    if (v < 0)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.1f", v);
    return buf;
}

static void window_row(json_t *rows, const bench_ctx *ctx, const window *w, const window_result *wr,
                       double ratio, const char *target, bool met)
{
    const bench_run *r = &wr->r;
    char a[4][16], prod[64];
    double per = r->n ? 1e6 / (double)r->n : 0;
    if (w->np[KIND_SQL1] == w->np[KIND_SQL100] && w->np[KIND_SQL1] == w->np[KIND_SUB1] &&
        w->np[KIND_SQL1] == w->np[KIND_SUB100])
        snprintf(prod, sizeof prod, "4 × %u", w->np[0]);
    else
        snprintf(prod, sizeof prod, "%u submit-1", w->np[KIND_SUB1]);
    bench_mode_row(rows, "| %s | %u%s | %s | %u | %.0f | %.2f | %s | %s | %s | %s | %.1f / %.1f / %.1f |"
                   " %.3f | %.1f | %.1f | %ld | %s: %s | %s |",
                   w->name, w->payload, w->payload <= HEADER_LEN ? " (header)" : "", prod, ctx->o->ks[0],
                   wr->tasks_per_s, ratio, fmt_ms(a[0], 16, ack_p99(wr, 0)), fmt_ms(a[1], 16, ack_p99(wr, 1)),
                   fmt_ms(a[2], 16, ack_p99(wr, 2)), fmt_ms(a[3], 16, ack_p99(wr, 3)),
                   counts_pct_ms(wr->start_counts, 50), counts_pct_ms(wr->start_counts, 99),
                   counts_pct_ms(wr->start_counts, 99.9), r->n ? (double)r->statements / (double)r->n : 0,
                   r->db_cpu_s * per, r->tpd_cpu_s * per, r->tpd_rss_kb, target,
                   met ? "met" : "not met", r->verified ? "yes" : r->why);
}

/* The no-op preloaded drain of taskpush-ll at the mode's K: the rate the others are
 * divided by. */
static void noop_drain(bench_ctx *ctx, bench_run *r)
{
    const bench_opts *o = ctx->o;
    const bench_design *d = NULL;
    for (size_t i = 0; i < bench_ndesigns; i++)
        if (strcmp(bench_designs[i].name, "taskpush-ll") == 0)
            d = &bench_designs[i];
    memset(r, 0, sizeof *r);
    r->design = "taskpush-ll";
    r->k = o->ks[0];
    r->n = r->done = o->n;
    r->capacity = o->capacity;
    r->db_cpu_s = r->tpd_cpu_s = r->bench_cpu_s = -1;
    r->tpd_rss_kb = -1;
    r->daemon_succeeded = r->daemon_failed = -1;
    if (!o->json_only)
        fprintf(stderr, "taskpush-bench: mixed: the no-op drain, taskpush-ll K=%u N=%" PRIu64 "\n",
                r->k, r->n);
    if (d == NULL || bench_tally_init(&ctx->tally, r->n) < 0) {
        snprintf(r->why, sizeof r->why, "out of memory");
        return;
    }
    if (bench_db_reset(&o->db, ctx->admin, r->n) < 0) {
        snprintf(r->why, sizeof r->why, "could not prepare the table");
    } else {
        d->drain(ctx, d, r->k, r);
        if (o->sabotage)
            bench_sabotage(ctx);
        bench_verify(ctx, r);
    }
    bench_tally_free(&ctx->tally);
}

static void say_failed(const char *mode, const char *what, const bench_run *r)
{
    if (!r->verified)
        fprintf(stderr, "taskpush-bench: %s %s: VERIFICATION FAILED: %s\n", mode, what, r->why);
}

int bench_mode_mixed(bench_ctx *ctx, json_t *rows)
{
    const bench_opts *o = ctx->o;
    int nres = o->npayload_bytes + (o->submit_producers > 0), failed = 0;
    window ws[BENCH_MAX_LIST + 1];
    window_result *wrs = calloc((size_t)nres, sizeof *wrs);
    bench_run before, after;

    if (wrs == NULL)
        return 1;
    memset(ws, 0, sizeof ws);
    for (int i = 0; i < o->npayload_bytes; i++) {
        ws[i].name = "mixed";
        for (int k = 0; k < NKINDS; k++)
            ws[i].np[k] = o->producers;
        ws[i].payload = o->payload_bytes[i];
    }
    if (o->submit_producers > 0) {
        ws[nres - 1].name = "submit-only";
        ws[nres - 1].np[KIND_SUB1] = o->submit_producers;
    }
    /* The drain before and after: the machine drifts, the mean is the reference. */
    noop_drain(ctx, &before);
    for (int i = 0; i < nres; i++) {
        ws[i].seconds = o->seconds;
        if (!o->json_only)
            fprintf(stderr, "taskpush-bench: mixed: %s, payload %u bytes, %u s\n", ws[i].name,
                    ws[i].payload, ws[i].seconds);
        run_window(ctx, &ws[i], &wrs[i]);
    }
    noop_drain(ctx, &after);
    double rb = before.verified && before.seconds > 0 ? (double)before.n / before.seconds : -1;
    double ra = after.verified && after.seconds > 0 ? (double)after.n / after.seconds : -1;
    double drain = rb > 0 && ra > 0 ? (rb + ra) / 2 : -1;

    json_t *j = json_pack("{s:s,s:s,s:I,s:I,s:I}", "kind", "mixed", "case", "drain", "workers",
                          (json_int_t)o->ks[0], "capacity", (json_int_t)o->capacity, "n",
                          (json_int_t)o->n);
    json_object_set_new(j, "tasks_per_s", jnum(drain));
    json_object_set_new(j, "drain_before", jnum(rb));
    json_object_set_new(j, "drain_after", jnum(ra));
    bench_mode_server_figures(j, &before, before.n);
    json_object_set_new(j, "taskpushd_peak_rss_kb",
                        before.tpd_rss_kb >= 0 ? json_integer(before.tpd_rss_kb) : json_null());
    json_object_set_new(j, "target", json_string("the reference: taskpush-ll's no-op drain"));
    json_object_set_new(j, "met", json_boolean(before.verified && after.verified));
    json_object_set_new(j, "verified", json_boolean(before.verified && after.verified));
    if (!before.verified || !after.verified)
        json_object_set_new(j, "why", json_string(before.verified ? after.why : before.why));
    bench_mode_emit(j);
    bench_mode_row(rows, "| drain (no-op, preloaded %" PRIu64 ") | 0 | - | %u | %.0f | 1.00 | | | | | |"
                   " %.3f | %.1f | %.1f | %ld | | %s |", o->n, o->ks[0], drain,
                   before.n ? (double)before.statements / (double)before.n : 0,
                   before.n ? before.db_cpu_s * 1e6 / (double)before.n : 0,
                   before.n ? before.tpd_cpu_s * 1e6 / (double)before.n : 0, before.tpd_rss_kb,
                   before.verified && after.verified ? "yes" : before.verified ? after.why : before.why);
    say_failed("mixed", "drain before", &before);
    say_failed("mixed", "drain after", &after);
    failed += !before.verified + !after.verified;

    for (int i = 0; i < nres; i++) {
        const window *w = &ws[i];
        window_result *wr = &wrs[i];
        bool submit_only = strcmp(w->name, "submit-only") == 0;
        double ratio = drain > 0 && wr->tasks_per_s > 0 ? wr->tasks_per_s / drain : -1;
        double stmts = wr->r.n ? (double)wr->r.statements / (double)wr->r.n : -1;
        double p99 = ack_p99(wr, KIND_SUB1);
        /* The targets: 1 KB mixed >= 0.85 of the drain; single-task SUBMITs
         * >= 0.6 of it at <= 0.02 statements a task and an ack p99 <= 10 ms. */
        const char *target = submit_only
                                 ? "ratio >= 0.6, statements/task <= 0.02, submit-1 ack p99 <= 10 ms"
                                 : "ratio >= 0.85";
        bool met = wr->r.verified && (submit_only ? ratio >= 0.6 && stmts <= 0.02 && p99 >= 0 &&
                                                        p99 <= 10
                                                  : ratio >= 0.85);
        j = json_pack("{s:s,s:s}", "kind", "mixed", "case", w->name);
        window_json(j, ctx, w, wr);
        json_object_set_new(j, "drain_tasks_per_s", jnum(drain));
        json_object_set_new(j, "ratio", jnum(ratio));
        json_object_set_new(j, "target", json_string(target));
        json_object_set_new(j, "met", json_boolean(met));
        json_object_set_new(j, "verified", json_boolean(wr->r.verified));
        if (!wr->r.verified)
            json_object_set_new(j, "why", json_string(wr->r.why));
        bench_mode_emit(j);
        window_row(rows, ctx, w, wr, ratio, submit_only ? "≥ 0.6, ≤ 0.02, ≤ 10 ms" : "≥ 0.85", met);
        say_failed("mixed", w->name, &wr->r);
        failed += !wr->r.verified;
    }
    free(wrs);
    return failed;
}

/* Within FLAT_WITHIN of their median; min and max out. */
static bool flat(const double *v, size_t n, double *lo, double *hi)
{
    double *s = malloc((n ? n : 1) * sizeof *s), med;
    bool ok = true;
    *lo = *hi = -1;
    if (s == NULL || n == 0) {
        free(s);
        return false;
    }
    memcpy(s, v, n * sizeof *s);
    for (size_t i = 1; i < n; i++) /* a few dozen samples: insertion sort */
        for (size_t j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    *lo = s[0];
    *hi = s[n - 1];
    ok = *lo >= med * (1 - FLAT_WITHIN) && *hi <= med * (1 + FLAT_WITHIN);
    free(s);
    return ok;
}

int bench_mode_soak(bench_ctx *ctx, json_t *rows)
{
    const bench_opts *o = ctx->o;
    window peak, soak;
    window_result *pr = calloc(2, sizeof *pr), *sr = pr ? pr + 1 : NULL;
    json_t *j;

    if (pr == NULL)
        return 1;
    memset(&peak, 0, sizeof peak);
    peak.name = "peak";
    for (int k = 0; k < NKINDS; k++)
        peak.np[k] = o->producers;
    peak.payload = o->payload_bytes[0];
    peak.seconds = o->quick ? QUICK_SOAK_CALIBRATE_S : SOAK_CALIBRATE_S;
    if (!o->json_only)
        fprintf(stderr, "taskpush-bench: soak: the peak, unpaced, payload %u bytes, %u s\n",
                peak.payload, peak.seconds);
    run_window(ctx, &peak, pr);

    /* 80 % of what was completed at the peak, in the peak's mix of kinds. */
    soak = peak;
    soak.name = "soak";
    soak.seconds = o->seconds;
    soak.sample_s = o->quick ? QUICK_SOAK_SAMPLE_S : SOAK_SAMPLE_S;
    double scale = pr->r.verified && pr->inserted_per_s > 0 && pr->tasks_per_s > 0
                       ? SOAK_SHARE * pr->tasks_per_s / pr->inserted_per_s : -1;
    for (int k = 0; k < NKINDS && scale > 0; k++)
        soak.rate[k] = scale * (double)pr->kind_inserted[k] / pr->window_s / soak.np[k];
    for (int k = 0; k < NKINDS; k++)
        if (soak.rate[k] <= 0)
            scale = -1; /* a kind that inserted nothing at the peak: no rate to pace it at */
    if (scale > 0) {
        if (!o->json_only)
            fprintf(stderr, "taskpush-bench: soak: paced at %.0f tasks/s (peak %.0f), %u s\n",
                    SOAK_SHARE * pr->tasks_per_s, pr->tasks_per_s, soak.seconds);
        run_window(ctx, &soak, sr);
    } else {
        sr->r.verified = false;
        sr->r.db_cpu_s = sr->r.tpd_cpu_s = sr->r.bench_cpu_s = -1;
        sr->r.tpd_rss_kb = -1;
        sr->tasks_per_s = sr->inserted_per_s = sr->tail = -1;
        snprintf(sr->r.why, sizeof sr->r.why, "the peak window failed: %.200s",
                 pr->r.verified ? "no rate measured" : pr->r.why);
    }

    /* Flatness from minute 1 (a fifth of a shorter window) to the end. */
    double warmup = SOAK_WARMUP_S < soak.seconds / 5.0 ? SOAK_WARMUP_S : soak.seconds / 5.0;
    size_t ns = sr->samples ? json_array_size(sr->samples) : 0, nr = 0, np = 0;
    double *rss = calloc(ns ? ns : 1, sizeof *rss), *p99 = calloc(ns ? ns : 1, sizeof *p99);
    for (size_t i = 0; rss && p99 && i < ns; i++) {
        json_t *s = json_array_get(sr->samples, i);
        if (json_real_value(json_object_get(s, "t")) < warmup)
            continue;
        json_t *v = json_object_get(s, "rss_kb");
        if (json_is_integer(v))
            rss[nr++] = (double)json_integer_value(v);
        v = json_object_get(s, "start_p99_ms");
        if (json_is_real(v))
            p99[np++] = json_real_value(v);
    }
    double rss_lo, rss_hi, p99_lo, p99_hi;
    bool rss_flat = rss && nr >= 2 && flat(rss, nr, &rss_lo, &rss_hi);
    bool p99_flat = p99 && np >= 2 && flat(p99, np, &p99_lo, &p99_hi);
    if (nr < 2)
        rss_lo = rss_hi = -1;
    if (np < 2)
        p99_lo = p99_hi = -1;
    free(rss);
    free(p99);

    j = json_pack("{s:s}", "kind", "soak");
    window_json(j, ctx, &soak, sr);
    json_object_set_new(j, "peak_tasks_per_s", jnum(pr->tasks_per_s));
    json_object_set_new(j, "peak_inserted_per_s", jnum(pr->inserted_per_s));
    json_object_set_new(j, "peak_seconds", json_real(pr->window_s));
    json_object_set_new(j, "peak_verified", json_boolean(pr->r.verified));
    json_object_set_new(j, "paced_tasks_per_s", jnum(scale > 0 ? SOAK_SHARE * pr->tasks_per_s : -1));
    json_object_set_new(j, "sample_seconds", json_real(soak.sample_s));
    json_object_set_new(j, "warmup_seconds", json_real(warmup));
    json_object_set_new(j, "samples", sr->samples ? sr->samples : json_array());
    json_object_set_new(j, "rss_kb_min", rss_lo >= 0 ? json_integer((json_int_t)rss_lo) : json_null());
    json_object_set_new(j, "rss_kb_max", rss_hi >= 0 ? json_integer((json_int_t)rss_hi) : json_null());
    json_object_set_new(j, "start_p99_ms_min", jnum(p99_lo));
    json_object_set_new(j, "start_p99_ms_max", jnum(p99_hi));
    json_object_set_new(j, "rss_flat", json_boolean(rss_flat));
    json_object_set_new(j, "p99_flat", json_boolean(p99_flat));
    json_object_set_new(j, "flat", json_boolean(rss_flat && p99_flat));
    json_object_set_new(j, "target", json_string("RSS and enqueue-to-start p99 within 10 % of their "
                                                 "median from minute 1 (reported, not verified)"));
    json_object_set_new(j, "met", json_boolean(sr->r.verified && rss_flat && p99_flat));
    bool verified = sr->r.verified && pr->r.verified;
    json_object_set_new(j, "verified", json_boolean(verified));
    if (!verified)
        json_object_set_new(j, "why", json_string(pr->r.verified ? sr->r.why : pr->r.why));
    bench_mode_emit(j);
    bench_mode_row(rows, "| %u | %.0f | %.0f | %.0f | %.0f | %zu | %.1f–%.1f | %.0f–%.0f | %s | %s |",
                   soak.payload, pr->tasks_per_s, scale > 0 ? SOAK_SHARE * pr->tasks_per_s : 0,
                   sr->tasks_per_s, sr->window_s, ns, p99_lo, p99_hi, rss_lo, rss_hi,
                   rss_flat && p99_flat ? "yes" : !rss_flat && !p99_flat ? "no (RSS, p99)"
                                                                          : !rss_flat ? "no (RSS)" : "no (p99)",
                   verified ? "yes" : pr->r.verified ? sr->r.why : pr->r.why);
    say_failed("soak", "peak", &pr->r);
    say_failed("soak", "paced", &sr->r);
    free(pr);
    return !verified;
}
