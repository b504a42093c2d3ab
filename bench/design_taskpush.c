/* design_taskpush.c: the real taskpushd (a child process, default flags plus
 * --scheduler, its own loopback ports read back from --ready-file) and K workers on
 * libtaskpush on threads of this process, each of capacity C with a no-op handler
 * that reports success. The drain ends when every handler ran and taskpushd has
 * written every outcome (its /stats: tasks.succeeded_total = N, db.pending_writes =
 * 0); verify.c then checks the table itself. */
#include "bench.h"

#include "taskpush.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READY_TIMEOUT_S 20.0
/* No progress at all for this long fails the run instead of hanging it. */
#define STALL_TIMEOUT_S 60.0
#define STOP_TIMEOUT_S 20.0

void bench_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int noop_handler(tp_task *task, void *arg)
{
    bench_tally_ran(arg, tp_task_id(task));
    return TP_SUCCESS;
}

static void *worker_main(void *arg)
{
    bench_worker *bw = arg;
    int rc = tp_worker_run_many(bw->run, bw->nrun);
    /* A share that could not run leaves its tasks to the others, and the figures would
     * be of fewer workers than the line says. */
    if (rc != 0)
        bench_tally_fail(bw->tally, "tp_worker_run_many of %zu workers: %s", bw->nrun,
                         tp_strerror(rc));
    return NULL;
}

/* Sends sig, waits up to timeout_s, then SIGKILL. */
void bench_daemon_stop(bench_daemon *dp, int sig, double timeout_s)
{
    if (dp->pid <= 0)
        return;
    kill(dp->pid, sig);
    double end = bench_now() + timeout_s;
    int status;
    while (waitpid(dp->pid, &status, WNOHANG) == 0) {
        if (bench_now() > end) {
            fprintf(stderr, "taskpush-bench: taskpushd did not stop; killing it\n");
            kill(dp->pid, SIGKILL);
            waitpid(dp->pid, &status, 0);
            break;
        }
        bench_sleep_ms(10);
    }
    dp->pid = 0;
    unlink(dp->ready);
}

void bench_daemon_dump_log(const bench_daemon *dp)
{
    FILE *f = fopen(dp->log, "r");
    char line[1024];
    if (f == NULL)
        return;
    fprintf(stderr, "---- %s ----\n", dp->log);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fclose(f);
}

/* Starts taskpushd with its default flags plus extra (NULL-terminated, may be NULL)
 * and the --taskpushd-arg flags, and waits for its ready file and its leadership. It inherits this process's
 * descriptor limit, which the modes raise before (and it raises its own to fit
 * --max-connections). */
int bench_daemon_start(bench_ctx *ctx, const char *const *extra, bench_daemon *dp)
{
    char url[700];
    unsigned serial = ctx->serial++;
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

    memset(dp, 0, sizeof *dp);
    snprintf(dp->ready, sizeof dp->ready, "%s/taskpush-bench-%d-%u.ready", tmp, (int)getpid(), serial);
    snprintf(dp->log, sizeof dp->log, "%s/taskpush-bench-%d-%u.log", tmp, (int)getpid(), serial);
    unlink(dp->ready);
    bench_db_url(&ctx->o->db, url, sizeof url);
    const char *argv[24] = {ctx->o->taskpushd, "--db", url, "--listen", "127.0.0.1:0",
                            "--admin", "127.0.0.1:0", "--ready-file", dp->ready};
    size_t argc = 9;
    if (strcmp(ctx->o->db.table, "task") != 0) { /* taskpushd's default: its argv as before */
        argv[argc++] = "--table";
        argv[argc++] = ctx->o->db.table;
    }
    for (size_t i = 0; extra && extra[i] && argc < sizeof argv / sizeof argv[0] - 1; i++)
        argv[argc++] = extra[i];
    /* The user's last, so that they win over the mode's. */
    for (int i = 0; i < ctx->o->ntaskpushd_args && argc < sizeof argv / sizeof argv[0] - 1; i++)
        argv[argc++] = ctx->o->taskpushd_args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(dp->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    dp->pid = pid;
    for (double end = bench_now() + READY_TIMEOUT_S; bench_now() < end; bench_sleep_ms(20)) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            dp->pid = 0;
            break;
        }
        if (!dp->listen[0]) {
            json_t *o = json_load_file(dp->ready, 0, NULL);
            const char *l = json_string_value(json_object_get(o, "listen"));
            const char *a = json_string_value(json_object_get(o, "admin"));
            if (l && a && strlen(l) < sizeof dp->listen && strlen(a) < sizeof dp->admin) {
                strcpy(dp->listen, l);
                strcpy(dp->admin, a);
            }
            json_decref(o);
            continue;
        }
        json_t *s = bench_http_json(dp->admin, "/stats");
        bool leader = json_is_true(json_object_get(s, "leader"));
        json_decref(s);
        if (leader)
            return 0;
    }
    bench_tally_fail(&ctx->tally, "taskpushd did not start (log: %s)", dp->log);
    bench_daemon_dump_log(dp);
    bench_daemon_stop(dp, SIGKILL, 5);
    return -1;
}

int bench_workers_make(bench_worker *ws, unsigned k, unsigned capacity, const char *addr,
                       tp_handler fn, void *arg, bench_tally *t)
{
    for (unsigned i = 0; i < k; i++) {
        tp_worker_options opts;
        tp_error err;
        char name[32];
        tp_worker_options_init(&opts);
        snprintf(name, sizeof name, "bench-%u", i);
        opts.addresses = addr;
        opts.name = name;
        opts.capacity = capacity;
        opts.threads = 0; /* the handler takes nanoseconds: run it on the I/O thread */
        ws[i].w = tp_worker_new(&opts, &err);
        if (ws[i].w == NULL) {
            bench_tally_fail(t, "tp_worker_new: %s", err.text);
            return -1;
        }
        if (tp_worker_add_type(ws[i].w, "default", fn ? fn : noop_handler, fn ? arg : t) != 0) {
            bench_tally_fail(t, "tp_worker_add_type failed");
            return -1;
        }
    }
    return 0;
}

int bench_workers_start(bench_worker *ws, unsigned k, unsigned threads, bench_tally *t)
{
    if (threads == 0 || threads > k)
        threads = k;
    for (unsigned g = 0; g < threads; g++) {
        unsigned first = (unsigned)((uint64_t)k * g / threads);
        unsigned end = (unsigned)((uint64_t)k * (g + 1) / threads);
        bench_worker *lead = &ws[first];
        lead->run = malloc((end - first) * sizeof *lead->run);
        if (lead->run == NULL) {
            bench_tally_fail(t, "out of memory");
            return -1;
        }
        for (unsigned i = first; i < end; i++)
            lead->run[i - first] = ws[i].w;
        lead->nrun = end - first;
        lead->tally = t;
        if (pthread_create(&lead->thr, NULL, worker_main, lead) != 0) {
            free(lead->run);
            lead->run = NULL;
            bench_tally_fail(t, "cannot start worker thread %u", g);
            return -1;
        }
        for (unsigned i = first; i < end; i++)
            ws[i].running = true;
    }
    return 0;
}

void bench_workers_stop(bench_worker *ws, unsigned k)
{
    for (unsigned i = 0; i < k; i++)
        if (ws[i].running)
            tp_worker_stop(ws[i].w);
    for (unsigned i = 0; i < k; i++) {
        if (ws[i].run != NULL) {
            pthread_join(ws[i].thr, NULL);
            free(ws[i].run);
            ws[i].run = NULL;
        }
    }
    for (unsigned i = 0; i < k; i++)
        if (ws[i].w)
            tp_worker_free(ws[i].w);
}

/* Waits until the handlers ran N times and taskpushd has written every outcome.
 * Only the handler count and the admin port are polled: no SQL in the window. */
int bench_wait_drained(bench_ctx *ctx, const bench_daemon *dp, bench_run *r)
{
    bench_tally *t = &ctx->tally;
    uint64_t last = 0;
    double progress = bench_now();
    for (;;) {
        uint64_t calls = atomic_load(&t->calls);
        if (calls != last) {
            last = calls;
            progress = bench_now();
        }
        if (calls >= r->n) {
            json_t *s = bench_http_json(dp->admin, "/stats");
            long long ok = bench_json_int(s, "tasks.succeeded_total");
            long long failed = bench_json_int(s, "tasks.failed_total");
            long long pending = bench_json_int(s, "db.pending_writes");
            json_decref(s);
            if (ok + failed >= (long long)r->n && pending == 0)
                return 0;
            if (ok >= 0 && ok + failed != (long long)last) {
                last = (uint64_t)(ok + failed);
                progress = bench_now();
            }
            bench_sleep_ms(5);
        } else {
            bench_sleep_ms(2);
        }
        if (atomic_load(&t->failed))
            return -1;
        if (bench_now() - progress > STALL_TIMEOUT_S) {
            bench_tally_fail(t, "no progress for %.0f s at %" PRIu64 " of %" PRIu64
                             " handler runs (log: %s)", STALL_TIMEOUT_S,
                             atomic_load(&t->calls), r->n, dp->log);
            return -1;
        }
    }
}

int bench_drain_taskpush(bench_ctx *ctx, const bench_design *d, unsigned k, bench_run *r)
{
    bench_daemon dp;
    bench_snap a, b;
    int rc = -1;
    bench_worker *ws = calloc(k, sizeof *ws);

    if (ws == NULL)
        return -1;
    const char *const extra[] = {"--scheduler", d->scheduler, NULL};
    if (bench_daemon_start(ctx, extra, &dp) < 0)
        goto done;
    if (bench_workers_make(ws, k, r->capacity, dp.listen, NULL, NULL, &ctx->tally) < 0 ||
        bench_snap_take(ctx, dp.pid, &a) < 0)
        goto done;
    if (bench_workers_start(ws, k, ctx->o->worker_threads, &ctx->tally) < 0)
        goto done;
    if (bench_wait_drained(ctx, &dp, r) < 0 || bench_snap_take(ctx, dp.pid, &b) < 0)
        goto done;
    bench_snap_delta(&a, &b, r);
    r->tpd_rss_kb = procfs_status_kb(dp.pid, "VmHWM");
    json_t *s = bench_http_json(dp.admin, "/stats");
    r->daemon_succeeded = bench_json_int(s, "tasks.succeeded_total");
    r->daemon_failed = bench_json_int(s, "tasks.failed_total");
    json_decref(s);
    rc = 0;
done:
    bench_workers_stop(ws, k);
    free(ws);
    if (dp.pid > 0) {
        bench_daemon_stop(&dp, SIGTERM, STOP_TIMEOUT_S);
        if (rc == 0)
            unlink(dp.log);
    }
    return rc;
}
