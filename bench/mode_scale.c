/* mode_scale.c: taskpushd's memory at scale.
 *
 * connections: C idle workers stay connected while K active ones drain N tasks. An
 * idle worker is a bare socket, not a libtaskpush instance: a HELLO for a task type no
 * row has (so nothing is ever sent to it), the WELCOME read back, then a HEARTBEAT every
 * interval from one thread, as a library worker would send. Reported: taskpushd's RSS
 * with the idle workers connected, its peak, and the active workers' tasks/s.
 *
 * backlog: N NEW rows loaded with INSERT ... SELECT from the Sequence engine, then
 * taskpushd left running with them; its RSS must stay O(claimed), not O(waiting).
 * Then K workers drain a slice of --n tasks, taskpushd is stopped (SIGTERM puts what it
 * buffered back to NEW) and the slice is verified exactly-once. */
#include "bench.h"

#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define IDLE_TYPE "bench-idle" /* no row has this type: idle workers get nothing */
#define IDLE_TICK_MS 50u
#define CONNECT_TIMEOUT_S 10
#define BACKLOG_CHUNK 1000000u /* rows per INSERT ... SELECT: bounded transactions */
#define STALL_TIMEOUT_S 60.0
#define MB_100_KB 97656L       /* 100,000,000 bytes in KiB */
#define MIB_32_KB 32768L

typedef struct idle_set {
    int *fd;
    unsigned n;
    unsigned heartbeat_ms;
    _Atomic bool stop;
    _Atomic uint64_t lost;
    pthread_t thr;
    bool running;
} idle_set;

/* Reads exactly len bytes (the socket has a receive timeout). */
static int read_full(int fd, uint8_t *buf, size_t len)
{
    for (size_t got = 0; got < len;) {
        ssize_t r = recv(fd, buf + got, len - got, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* HELLO, then WELCOME read back and decoded; returns its heartbeat interval, 0 on
 * failure. */
static unsigned idle_handshake(int fd, const uint8_t *hello, size_t hello_len)
{
    uint8_t buf[512];
    uint32_t body_len;
    proto_msg m;

    if (send(fd, hello, hello_len, MSG_NOSIGNAL) != (ssize_t)hello_len ||
        read_full(fd, buf, PROTO_LEN_PREFIX) < 0)
        return 0;
    body_len = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
    if (body_len == 0 || body_len > sizeof buf - PROTO_LEN_PREFIX ||
        read_full(fd, buf + PROTO_LEN_PREFIX, body_len) < 0 ||
        proto_msg_decode(buf + PROTO_LEN_PREFIX, body_len, &m) != PROTO_OK ||
        m.type != PROTO_WELCOME || m.u.welcome.heartbeat_ms == 0)
        return 0;
    return m.u.welcome.heartbeat_ms;
}

static int idle_connect_one(const struct addrinfo *ai, const uint8_t *hello, size_t len,
                            unsigned *heartbeat_ms)
{
    struct timeval tv = {CONNECT_TIMEOUT_S, 0};
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        (*heartbeat_ms = idle_handshake(fd, hello, len)) == 0 ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Opens is->n idle workers to listen ("HOST:PORT", "[V6]:PORT"). */
static int idle_open(idle_set *is, const char *listen, bench_tally *t)
{
    char host[128], port[16];
    const char *colon = strrchr(listen, ':');
    size_t hl = colon ? (size_t)(colon - listen) : 0;
    bool v6 = listen[0] == '[';
    if (colon == NULL || hl >= sizeof host || hl < 1u + 2u * v6 || strlen(colon + 1) >= sizeof port)
        return -1;
    memcpy(host, listen + v6, hl - 2u * v6);
    host[hl - 2u * v6] = '\0';
    strcpy(port, colon + 1);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL) {
        bench_tally_fail(t, "cannot resolve %s", listen);
        return -1;
    }
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = 1;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"bench-idle", 10};
    m.u.hello.ntypes = 1;
    m.u.hello.types[0] = (proto_bytes){(const uint8_t *)IDLE_TYPE, strlen(IDLE_TYPE)};
    uint8_t hello[256];
    size_t len = proto_msg_encode(&m, hello, sizeof hello);
    int rc = len > 0 ? 0 : -1;
    for (unsigned i = 0; rc == 0 && i < is->n; i++) {
        is->fd[i] = idle_connect_one(ai, hello, len, &is->heartbeat_ms);
        if (is->fd[i] < 0) {
            bench_tally_fail(t, "idle worker %u of %u: connect or HELLO failed: %s", i + 1, is->n,
                             strerror(errno));
            rc = -1;
        }
    }
    freeaddrinfo(ai);
    return rc;
}

/* One heartbeat out, whatever came in read and dropped (the dispatcher's heartbeats);
 * a closed connection counts as lost. */
static void idle_beat(idle_set *is, unsigned i)
{
    static const uint8_t beat[] = {0, 0, 0, 1, PROTO_HEARTBEAT};
    uint8_t sink[4096];
    int fd = is->fd[i];
    if (fd < 0)
        return;
    bool dead = send(fd, beat, sizeof beat, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
                errno != EAGAIN && errno != EWOULDBLOCK;
    for (;;) {
        ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r > 0)
            continue;
        dead |= r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        break;
    }
    if (dead) {
        close(fd);
        is->fd[i] = -1;
        atomic_fetch_add(&is->lost, 1);
    }
}

/* Every socket once per heartbeat interval, spread over the interval in ticks. */
static void *idle_main(void *arg)
{
    idle_set *is = arg;
    unsigned ticks = is->heartbeat_ms / IDLE_TICK_MS ? is->heartbeat_ms / IDLE_TICK_MS : 1;
    unsigned per_tick = is->n / ticks + 1, next = 0;
    while (!atomic_load(&is->stop)) {
        for (unsigned j = 0; j < per_tick; j++, next = (next + 1) % is->n)
            idle_beat(is, next);
        bench_sleep_ms(IDLE_TICK_MS);
    }
    return NULL;
}

static void idle_close(idle_set *is)
{
    if (is->running) {
        atomic_store(&is->stop, true);
        pthread_join(is->thr, NULL);
    }
    for (unsigned i = 0; is->fd && i < is->n; i++)
        if (is->fd[i] >= 0)
            close(is->fd[i]);
    free(is->fd);
    is->fd = NULL;
}

typedef struct scale_result {
    long rss_before_kb;  /* connections: idle workers connected; backlog: waiting */
    long rss_after_kb;
    long peak_kb;
    long long workers_seen;
    long long buffered;  /* backlog: queue.buffered before the workers came */
    double load_s;
} scale_result;

/* The idle workers, then the K active ones drain N. */
static void connections_run(bench_ctx *ctx, idle_set *is, scale_result *sr, bench_run *r)
{
    const bench_opts *o = ctx->o;
    unsigned k = o->ks[0];
    char maxc[16];
    bench_daemon dp = {0};
    bench_snap a, b;
    bench_worker *ws = calloc(k, sizeof *ws);

    snprintf(maxc, sizeof maxc, "%u", o->connections + k + 16);
    const char *const extra[] = {"--max-connections", maxc, NULL};
    if (ws == NULL || bench_daemon_start(ctx, extra, &dp) < 0 ||
        idle_open(is, dp.listen, &ctx->tally) < 0)
        goto done;
    if (pthread_create(&is->thr, NULL, idle_main, is) != 0) {
        bench_tally_fail(&ctx->tally, "cannot start the heartbeat thread");
        goto done;
    }
    is->running = true;
    if (bench_wait_workers(&dp, o->connections, 30) < 0) {
        bench_tally_fail(&ctx->tally, "taskpushd does not count %u workers", o->connections);
        goto done;
    }
    bench_sleep_ms(1000); /* a few heartbeats each way */
    sr->rss_before_kb = procfs_status_kb(dp.pid, "VmRSS");
    if (bench_workers_make(ws, k, o->capacity, dp.listen, NULL, NULL, &ctx->tally) < 0 ||
        bench_snap_take(ctx, dp.pid, &a) < 0 || bench_workers_start(ws, k, ctx->o->worker_threads, &ctx->tally) < 0 ||
        bench_wait_drained(ctx, &dp, r) < 0 || bench_snap_take(ctx, dp.pid, &b) < 0)
        goto done;
    bench_snap_delta(&a, &b, r);
    sr->rss_after_kb = procfs_status_kb(dp.pid, "VmRSS");
    sr->peak_kb = r->tpd_rss_kb = procfs_peak_rss_kb(
        dp.pid, sr->rss_before_kb > sr->rss_after_kb ? sr->rss_before_kb : sr->rss_after_kb);
    json_t *s = bench_http_json(dp.admin, "/stats");
    r->daemon_succeeded = bench_json_int(s, "tasks.succeeded_total");
    r->daemon_failed = bench_json_int(s, "tasks.failed_total");
    sr->workers_seen = bench_json_int(s, "workers");
    json_decref(s);
    if (atomic_load(&is->lost) > 0 || sr->workers_seen < (long long)(o->connections + k))
        bench_tally_fail(&ctx->tally, "%" PRIu64 " idle workers lost; taskpushd counts %lld workers",
                         atomic_load(&is->lost), sr->workers_seen);
done:
    if (ws)
        bench_workers_stop(ws, k);
    free(ws);
    idle_close(is);
    if (dp.pid > 0)
        bench_daemon_stop(&dp, SIGTERM, 20);
    if (dp.log[0] && !atomic_load(&ctx->tally.failed))
        unlink(dp.log); /* kept when something failed */
}

static json_t *jkb(long kb)
{
    return kb >= 0 ? json_integer(kb) : json_null();
}

int bench_mode_connections(bench_ctx *ctx, json_t *rows)
{
    const bench_opts *o = ctx->o;
    idle_set is = {.n = o->connections};
    scale_result sr = {-1, -1, -1, -1, -1, 0};
    bench_run r;

    memset(&r, 0, sizeof r);
    r.n = o->n;
    r.daemon_succeeded = r.daemon_failed = -1;
    r.tpd_rss_kb = -1;
    if (!o->json_only)
        fprintf(stderr, "taskpush-bench: connections: %u idle, %u active, N=%" PRIu64 "\n",
                o->connections, o->ks[0], o->n);
    is.fd = malloc(o->connections * sizeof *is.fd);
    for (unsigned i = 0; is.fd && i < o->connections; i++)
        is.fd[i] = -1;
    if (is.fd == NULL || bench_tally_init(&ctx->tally, o->n) < 0) {
        snprintf(r.why, sizeof r.why, "out of memory");
        free(is.fd);
    } else {
        if (bench_db_reset(&o->db, ctx->admin, o->n) < 0)
            bench_tally_fail(&ctx->tally, "could not prepare the table");
        else
            connections_run(ctx, &is, &sr, &r);
        free(is.fd);
        if (o->sabotage)
            bench_sabotage(ctx);
        bench_verify(ctx, &r);
        bench_tally_free(&ctx->tally);
    }
    double rate = r.verified && r.seconds > 0 ? (double)r.n / r.seconds : 0;
    bool met = r.verified && sr.peak_kb >= 0 && sr.peak_kb < MB_100_KB;
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:I}", "kind", "connections", "idle_workers",
                          (json_int_t)o->connections, "active_workers", (json_int_t)o->ks[0],
                          "capacity", (json_int_t)o->capacity, "n", (json_int_t)o->n);
    json_object_set_new(j, "seconds", json_real(r.seconds));
    json_object_set_new(j, "tasks_per_s", json_real(rate));
    json_object_set_new(j, "taskpushd_rss_kb_idle_connected", jkb(sr.rss_before_kb));
    json_object_set_new(j, "taskpushd_rss_kb_after", jkb(sr.rss_after_kb));
    json_object_set_new(j, "taskpushd_peak_rss_kb", jkb(sr.peak_kb));
    bench_mode_server_figures(j, &r, r.n);
    json_object_set_new(j, "workers_seen", json_integer(sr.workers_seen));
    json_object_set_new(j, "idle_lost", json_integer((json_int_t)atomic_load(&is.lost)));
    json_object_set_new(j, "target_peak_rss_kb", json_integer(MB_100_KB));
    json_object_set_new(j, "met", json_boolean(met));
    json_object_set_new(j, "verified", json_boolean(r.verified));
    if (!r.verified)
        json_object_set_new(j, "why", json_string(r.why));
    bench_mode_emit(j);
    bench_mode_row(rows, "| %u | %u | %" PRIu64 " | %.0f | %.1f MB | %.1f MB | %s | %s |",
                   o->connections, o->ks[0], o->n, rate, sr.rss_before_kb * 1.024 / 1000,
                   sr.peak_kb * 1.024 / 1000, met ? "met" : "not met", r.verified ? "yes" : r.why);
    if (!r.verified)
        fprintf(stderr, "taskpush-bench: connections: VERIFICATION FAILED: %s\n", r.why);
    return !r.verified;
}

/* N NEW rows in bounded INSERT ... SELECT statements from the Sequence engine. */
static int backlog_load(bench_ctx *ctx, uint64_t n)
{
    char sql[224];
    for (uint64_t first = 1; first <= n; first += BACKLOG_CHUNK) {
        uint64_t last = n - first < BACKLOG_CHUNK ? n : first + BACKLOG_CHUNK - 1;
        snprintf(sql, sizeof sql, "INSERT INTO %s (task_priority) SELECT seq %% 3 FROM seq_%"
                 PRIu64 "_to_%" PRIu64, ctx->o->db.table, first, last);
        if (bench_db_exec(ctx->admin, sql) < 0) {
            bench_tally_fail(&ctx->tally, "backlog load: %s", mysql_error(ctx->admin));
            return -1;
        }
    }
    return 0;
}

/* Waits until the handlers ran at least want times. */
static int wait_calls(bench_tally *t, uint64_t want)
{
    uint64_t last = 0;
    double progress = bench_now();
    while (atomic_load(&t->calls) < want) {
        if (atomic_load(&t->failed))
            return -1;
        uint64_t c = atomic_load(&t->calls);
        if (c != last) {
            last = c;
            progress = bench_now();
        } else if (bench_now() - progress > STALL_TIMEOUT_S) {
            bench_tally_fail(t, "no progress for %.0f s at %" PRIu64 " of %" PRIu64 " handler runs",
                             STALL_TIMEOUT_S, c, want);
            return -1;
        }
        bench_sleep_ms(2);
    }
    return 0;
}

/* taskpushd with the backlog, then K workers drain the slice; taskpushd is stopped
 * while they are still connected so that its in-flight tasks finish and are written. */
static void backlog_run(bench_ctx *ctx, uint64_t slice, scale_result *sr, bench_run *r)
{
    const bench_opts *o = ctx->o;
    unsigned k = o->ks[0];
    bench_daemon dp = {0};
    bench_snap a, b;
    bench_worker *ws = calloc(k, sizeof *ws);

    if (ws == NULL || bench_daemon_start(ctx, NULL, &dp) < 0)
        goto done;
    bench_sleep_ms(o->quick ? 1000 : 5000);
    sr->rss_before_kb = procfs_status_kb(dp.pid, "VmRSS");
    json_t *s = bench_http_json(dp.admin, "/stats");
    sr->buffered = bench_json_int(s, "queue.buffered");
    json_decref(s);
    if (bench_workers_make(ws, k, o->capacity, dp.listen, NULL, NULL, &ctx->tally) < 0 ||
        bench_snap_take(ctx, dp.pid, &a) < 0 || bench_workers_start(ws, k, ctx->o->worker_threads, &ctx->tally) < 0 ||
        wait_calls(&ctx->tally, slice) < 0 || bench_snap_take(ctx, dp.pid, &b) < 0)
        goto done;
    bench_snap_delta(&a, &b, r);
    r->n = atomic_load(&ctx->tally.calls); /* the slice as run, for the rate */
    sr->rss_after_kb = procfs_status_kb(dp.pid, "VmRSS");
    sr->peak_kb = procfs_peak_rss_kb(
        dp.pid, sr->rss_before_kb > sr->rss_after_kb ? sr->rss_before_kb : sr->rss_after_kb);
done:
    if (dp.pid > 0)
        bench_daemon_stop(&dp, SIGTERM, 60);
    if (dp.log[0] && !atomic_load(&ctx->tally.failed))
        unlink(dp.log); /* kept when something failed */
    if (ws)
        bench_workers_stop(ws, k);
    free(ws);
}

int bench_mode_backlog(bench_ctx *ctx, json_t *rows)
{
    const bench_opts *o = ctx->o;
    uint64_t n = o->backlog_rows, slice = o->n < n ? o->n : n;
    scale_result sr = {-1, -1, -1, -1, -1, 0};
    bench_run r;

    memset(&r, 0, sizeof r);
    if (!o->json_only)
        fprintf(stderr, "taskpush-bench: backlog: %" PRIu64 " rows waiting, slice %" PRIu64
                ", K=%u\n", n, slice, o->ks[0]);
    if (bench_tally_init(&ctx->tally, n) < 0) {
        snprintf(r.why, sizeof r.why, "out of memory");
    } else {
        double t0 = bench_now();
        if (bench_db_reset(&o->db, ctx->admin, 0) == 0 && backlog_load(ctx, n) == 0) {
            sr.load_s = bench_now() - t0;
            backlog_run(ctx, slice, &sr, &r);
        } else {
            bench_tally_fail(&ctx->tally, "could not prepare the table");
        }
        if (o->sabotage)
            bench_sabotage(ctx);
        r.verified = bench_verify_subset(ctx, n, r.why, sizeof r.why) == 0;
        bench_tally_free(&ctx->tally);
    }
    double rate = r.verified && r.seconds > 0 ? (double)r.n / r.seconds : 0;
    bool met = r.verified && sr.peak_kb >= 0 && sr.peak_kb < MIB_32_KB;
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:I}", "kind", "backlog", "backlog_rows", (json_int_t)n,
                          "slice", (json_int_t)r.n, "workers", (json_int_t)o->ks[0], "capacity",
                          (json_int_t)o->capacity);
    json_object_set_new(j, "load_seconds", json_real(sr.load_s));
    json_object_set_new(j, "seconds", json_real(r.seconds));
    json_object_set_new(j, "tasks_per_s", json_real(rate));
    bench_mode_server_figures(j, &r, r.n);
    json_object_set_new(j, "buffered_while_waiting", json_integer(sr.buffered));
    json_object_set_new(j, "taskpushd_rss_kb_waiting", jkb(sr.rss_before_kb));
    json_object_set_new(j, "taskpushd_rss_kb_after", jkb(sr.rss_after_kb));
    json_object_set_new(j, "taskpushd_peak_rss_kb", jkb(sr.peak_kb));
    json_object_set_new(j, "target_peak_rss_kb", json_integer(MIB_32_KB));
    json_object_set_new(j, "met", json_boolean(met));
    json_object_set_new(j, "verified", json_boolean(r.verified));
    if (!r.verified)
        json_object_set_new(j, "why", json_string(r.why));
    bench_mode_emit(j);
    bench_mode_row(rows, "| %" PRIu64 " | %.1f | %.1f MiB | %.1f MiB | %" PRIu64 " | %.0f | %s | %s |",
                   n, sr.load_s, sr.rss_before_kb / 1024.0, sr.peak_kb / 1024.0, r.n, rate,
                   met ? "met" : "not met", r.verified ? "yes" : r.why);
    if (!r.verified)
        fprintf(stderr, "taskpush-bench: backlog: VERIFICATION FAILED: %s\n", r.why);
    return !r.verified;
}
