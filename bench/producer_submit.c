/* producer_submit.c: the SUBMIT producers of the stream and latency modes
 * (--producer submit). Each producer is a producer-only libtaskpush client (a
 * tp_worker with no type registered): one thread runs its I/O (tp_worker_run), another
 * calls tp_submit, which returns once the dispatcher has committed the rows. The ids
 * the answers carry are recorded so that the mode can check that every task it was
 * told about ran, and ended SUCCESSFUL, exactly once. */
#include "bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One answer may wait behind a busy dispatcher's commit; longer is a failure. */
#define SUBMIT_TIMEOUT_MS 30000u
#define CONNECT_TIMEOUT_S 30.0
/* An unavailable dispatcher (it gave its lease up when a renewal took longer than
 * --lease-ms, and takes it again) is asked again this often, for this long at most. */
#define RESEND_PAUSE_MS 20u
#define RESEND_FOR_S 10.0

typedef struct bench_submitter {
    tp_worker *w;
    pthread_t io_thr, sub_thr;
    bool io_running, sub_running;
    unsigned rows;
    double end;
    uint64_t cap;
    _Atomic uint64_t *total;
    bench_tally *acked; /* NULL: the ids are not kept (the window alone) */
    bench_tally *t;     /* where a failure is told */
    _Atomic uint64_t *resent;
} submitter;

static void *io_main(void *arg)
{
    submitter *sp = arg;
    if (tp_worker_run(sp->w) != 0)
        bench_tally_fail(sp->t, "tp_worker_run of a submit producer failed");
    return NULL;
}

/* Creates the client and starts its I/O thread. */
static int submitter_start(submitter *sp, const char *addr, unsigned i, bench_tally *t)
{
    tp_worker_options opts;
    tp_error err;
    char name[32];

    tp_worker_options_init(&opts);
    snprintf(name, sizeof name, "bench-submit-%u", i);
    opts.addresses = addr;
    opts.name = name;
    opts.threads = 0;
    sp->t = t;
    sp->w = tp_worker_new(&opts, &err);
    if (sp->w == NULL) {
        bench_tally_fail(t, "tp_worker_new (submit producer): %s", err.text);
        return -1;
    }
    if (pthread_create(&sp->io_thr, NULL, io_main, sp) != 0) {
        bench_tally_fail(t, "cannot start a submit producer's I/O thread");
        return -1;
    }
    sp->io_running = true;
    return 0;
}

static void submitter_stop(submitter *sp)
{
    if (sp->io_running) {
        tp_worker_stop(sp->w);
        pthread_join(sp->io_thr, NULL);
        sp->io_running = false;
    }
    if (sp->w)
        tp_worker_free(sp->w);
    sp->w = NULL;
}

/* Waits for every client's handshake, so that the clock starts with all connected. */
static int wait_connected(submitter *sps, unsigned n, bench_tally *t)
{
    double end = bench_now() + CONNECT_TIMEOUT_S;
    for (unsigned i = 0; i < n; i++) {
        tp_worker_stats st;
        for (;;) {
            memset(&st, 0, sizeof st);
            if (tp_worker_get_stats(sps[i].w, &st, sizeof st) == 0 && st.connections >= 1)
                break;
            if (bench_now() > end || atomic_load(&t->failed)) {
                bench_tally_fail(t, "submit producer %u did not connect to taskpushd", i);
                return -1;
            }
            bench_sleep_ms(5);
        }
    }
    return 0;
}

/* Records the answer's ids; any duplicate or missing id fails the run: the bench's
 * tasks carry no dedup_key, so every one must have been inserted. */
static int take_answer(submitter *sp, const tp_submit_result *res, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (res[i].duplicate || res[i].task_id == 0) {
            bench_tally_fail(sp->t, "submit answered %s for a task without a key",
                             res[i].duplicate ? "duplicate" : "no id");
            return -1;
        }
        if (sp->acked)
            bench_tally_ran(sp->acked, res[i].task_id);
    }
    return 0;
}

/* tp_submit, sent again while the dispatcher answers TP_EUNAVAIL: nothing was
 * committed, and docs/producers.md tells a producer to send again. */
static int submit_resending(submitter *sp, const tp_submit_task *tasks, unsigned n,
                            tp_submit_result *res, tp_error *err)
{
    double give_up = bench_now() + RESEND_FOR_S;
    for (;;) {
        int rc = tp_submit(sp->w, tasks, n, 0, SUBMIT_TIMEOUT_MS, res, err);
        if (rc != TP_EUNAVAIL || bench_now() > give_up || atomic_load(&sp->t->failed))
            return rc;
        atomic_fetch_add(sp->resent, 1);
        bench_sleep_ms(RESEND_PAUSE_MS);
    }
}

static void *submit_main(void *arg)
{
    submitter *sp = arg;
    tp_submit_task *tasks = calloc(sp->rows, sizeof *tasks);
    tp_submit_result *res = calloc(sp->rows, sizeof *res);
    tp_error err;

    if (tasks == NULL || res == NULL) {
        bench_tally_fail(sp->t, "out of memory");
        goto done;
    }
    for (unsigned i = 0; i < sp->rows; i++) {
        tp_submit_task_init(&tasks[i]);
        tasks[i].type = "default"; /* the workers' type, and the column's default */
        tasks[i].priority = (int)(i % 3);
    }
    while (bench_now() < sp->end && !atomic_load(&sp->t->failed)) {
        if (atomic_load(sp->total) + sp->rows > sp->cap)
            break;
        int rc = submit_resending(sp, tasks, sp->rows, res, &err);
        if (rc != 0) {
            bench_tally_fail(sp->t, "tp_submit of %u tasks: %s", sp->rows, err.text);
            break;
        }
        if (take_answer(sp, res, sp->rows) < 0)
            break;
        atomic_fetch_add(sp->total, sp->rows);
    }
done:
    free(tasks);
    free(res);
    return NULL;
}

double bench_submit_stream(bench_ctx *ctx, const char *addr, unsigned np, unsigned rows,
                           unsigned s, uint64_t cap, bench_tally *acked, uint64_t *inserted)
{
    bench_tally *t = &ctx->tally;
    submitter *sps = calloc(np, sizeof *sps);
    _Atomic uint64_t total = 0;
    double rate = -1, t0 = 0;
    unsigned started = 0, submitting = 0;

    if (sps == NULL || rows == 0 || rows > TP_MAX_SUBMIT_TASKS) {
        bench_tally_fail(t, "submit producers: out of memory or %u tasks per submit", rows);
        goto done;
    }
    for (; started < np; started++)
        if (submitter_start(&sps[started], addr, started, t) < 0)
            goto done;
    if (wait_connected(sps, np, t) < 0)
        goto done;
    t0 = bench_now();
    for (; submitting < np; submitting++) {
        submitter *sp = &sps[submitting];
        sp->rows = rows;
        sp->end = t0 + s;
        sp->cap = cap;
        sp->total = &total;
        sp->acked = acked;
        sp->resent = &ctx->submit_resent;
        if (pthread_create(&sp->sub_thr, NULL, submit_main, sp) != 0) {
            bench_tally_fail(t, "cannot start submit producer thread %u", submitting);
            break;
        }
    }
    for (unsigned i = 0; i < submitting; i++)
        pthread_join(sps[i].sub_thr, NULL);
    if (submitting == np && !atomic_load(&t->failed))
        rate = (double)atomic_load(&total) / (bench_now() - t0);
done:
    for (unsigned i = 0; sps && i < np; i++) /* calloc: the unstarted are empty */
        submitter_stop(&sps[i]);
    free(sps);
    *inserted = atomic_load(&total);
    return rate;
}

int bench_submit_latency(bench_ctx *ctx, const char *addr, uint64_t count, double *sent,
                         double *acked)
{
    const bench_opts *o = ctx->o;
    bench_tally *t = &ctx->tally;
    submitter sp;
    tp_submit_task task;
    tp_submit_result res;
    tp_error err;
    char payload[32];
    int rc = -1;

    memset(&sp, 0, sizeof sp);
    if (submitter_start(&sp, addr, 0, t) < 0 || wait_connected(&sp, 1, t) < 0)
        goto done;
    sp.resent = &ctx->submit_resent;
    tp_submit_task_init(&task);
    task.type = "default";
    task.payload = payload;
    double t0 = bench_now();
    rc = 0;
    for (uint64_t i = 0; i < count && rc == 0; i++) {
        double at = t0 + (double)i * o->interval_ms / 1000.0, now = bench_now();
        if (at > now)
            bench_sleep_ms((unsigned)((at - now) * 1000.0));
        double s0 = bench_now();
        /* The handler reads the send time back from the payload, as with INSERT. */
        task.payload_len = (size_t)snprintf(payload, sizeof payload, "%.0f", s0 * 1e6);
        if (submit_resending(&sp, &task, 1, &res, &err) != 0) {
            bench_tally_fail(t, "latency tp_submit: %s", err.text);
            rc = -1;
            break;
        }
        double done = bench_now();
        if (res.duplicate || res.task_id < 1 || res.task_id > count) {
            bench_tally_fail(t, "submit answered id %" PRIu64 "%s, expected 1..%" PRIu64,
                             res.task_id, res.duplicate ? " (duplicate)" : "", count);
            rc = -1;
        } else {
            sent[res.task_id] = s0;
            acked[res.task_id] = done;
        }
    }
done:
    submitter_stop(&sp);
    return rc;
}

/* Every id 1..n was both answered to a producer and run by a handler, once (the
 * counts and the duplicates are checked first; then the two bitmaps are full). */
int bench_acked_match(const bench_tally *acked, const bench_tally *ran, uint64_t n, char *why,
                      size_t cap)
{
    uint64_t calls = atomic_load(&acked->calls), dups = atomic_load(&acked->dups);
    uint64_t strays = atomic_load(&acked->strays);
    if (calls != n || dups || strays) {
        snprintf(why, cap, "submit answered %" PRIu64 " ids (%" PRIu64 " twice, %" PRIu64
                 " out of range) for %" PRIu64 " rows", calls, dups, strays, n);
        return -1;
    }
    for (uint64_t w = 0; n > 0 && w <= (n - 1) / 64; w++) {
        uint64_t bits = w < (n - 1) / 64 || n % 64 == 0 ? ~0ull : (1ull << (n % 64)) - 1;
        uint64_t a = atomic_load(&acked->seen[w]), r = atomic_load(&ran->seen[w]);
        if ((a & bits) != bits || (r & bits) != bits) {
            snprintf(why, cap, "ids %" PRIu64 "..%" PRIu64 ": answered and run differ",
                     w * 64 + 1, w * 64 + 64);
            return -1;
        }
    }
    return 0;
}

/* The clients alone, for a mode that drives tp_submit itself (mode_mixed.c). */
bench_submitter *bench_submitters_open(bench_ctx *ctx, const char *addr, unsigned n)
{
    submitter *sps = calloc(n ? n : 1, sizeof *sps);
    if (sps == NULL) {
        bench_tally_fail(&ctx->tally, "out of memory");
        return NULL;
    }
    for (unsigned i = 0; i < n; i++) {
        sps[i].resent = &ctx->submit_resent;
        if (submitter_start(&sps[i], addr, i, &ctx->tally) < 0) {
            bench_submitters_close(sps, n);
            return NULL;
        }
    }
    if (wait_connected(sps, n, &ctx->tally) < 0) {
        bench_submitters_close(sps, n);
        return NULL;
    }
    return sps;
}

void bench_submitters_close(bench_submitter *sps, unsigned n)
{
    for (unsigned i = 0; sps && i < n; i++) /* calloc: the unstarted are empty */
        submitter_stop(&sps[i]);
    free(sps);
}

int bench_submitter_submit(bench_submitter *sps, unsigned i, const tp_submit_task *tasks,
                           unsigned n, tp_submit_result *res, tp_error *err)
{
    return submit_resending(&sps[i], tasks, n, res, err);
}
