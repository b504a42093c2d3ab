/* test_peer_bounds: what one kind of peer may make taskpushd hold, in bytes and in
 * descriptors, against the real taskpushd and the private MariaDB.
 *
 * Cases:
 *   slow_wait_reader   a producer waits (WAIT) for 100 tasks whose results are 6 MB each
 *                      and reads 64 KiB a second: it is closed as stalled once more than
 *                      --max-conn-output-bytes wait for it; taskpushd's peak RSS stays
 *                      under 250 MB (main held every OUTCOME: 600 MB+); every task is in
 *                      the table, and a fresh producer's WAIT is answered
 *   submit_budget      30 producers each send 4 SUBMITs of 5 MB while the submit thread
 *                      is blocked (FLUSH TABLES WITH READ LOCK): taskpushd reads no more
 *                      than --max-submit-bytes of them (peak RSS under 250 MB; main held
 *                      all 600 MB); after UNLOCK TABLES each is committed and
 *                      acknowledged once
 *   admin_slowloris    admin connections trickling a header byte a second are closed
 *                      within a loose bound of --admin-request-timeout-ms; with more of
 *                      them than --admin-max-connections open, /healthz answers 200, a
 *                      new worker runs a task and the leader keeps its lease
 *   fd_reserve         under a low descriptor limit, admin and worker connections at
 *                      their caps leave descriptors for the database: a killed database
 *                      connection is reconnected and the dispatcher keeps leading
 *
 * Waits are bounded polling; nothing asserts on how long anything took beyond loose
 * bounds. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "proto.h"
#include "raw.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 60000

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_d;
    tp_worker *w;
    tp_inproc run;
    bool passed;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    int rc = 0;
    if (fx->w) {
        tp_inproc_halt(&fx->run);
        tp_worker_free(fx->w);
    }
    if (fx->have_d) {
        kill(fx->d.pid, SIGCONT);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
        if (tp_daemon_stop(&fx->d, SIGTERM, 30000) != 0 && fx->passed) {
            fprintf(stderr, "taskpushd did not exit 0 after SIGTERM\n");
            tp_daemon_dump_log(&fx->d);
            rc = -1;
        }
    }
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    free(fx);
    return rc;
}

static void start(struct fx *fx, const char *tag, const char *const *args)
{
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_d = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
}

static uint64_t rows(struct fx *fx, const char *sql)
{
    return tp_testdb_query_u64(&fx->db, "%s", sql);
}

static bool wait_rows(struct fx *fx, uint64_t want, const char *sql, long peak_kb[1])
{
    long long until = tp_mono_ms() + 3 * WAIT_MS;
    while (tp_mono_ms() < until) {
        if (peak_kb) {
            long kb = procfs_status_kb(fx->d.pid, "VmRSS");
            if (kb > *peak_kb)
                *peak_kb = kb;
        }
        if (rows(fx, sql) == want)
            return true;
        tp_sleep_ms(50);
    }
    return false;
}

static long peak_rss_kb(struct fx *fx, long seen_kb)
{
    long hwm = procfs_status_kb(fx->d.pid, "VmHWM");
    return hwm > seen_kb ? hwm : seen_kb;
}

/* ---- raw protocol ---- */

static bool raw_send(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static uint8_t *raw_encode(const proto_msg *m, size_t *n)
{
    *n = proto_msg_size(m);
    uint8_t *buf = malloc(*n);
    assert_non_null(buf);
    assert_int_equal(proto_msg_encode(m, buf, *n), *n);
    return buf;
}

static void raw_send_msg(int fd, const proto_msg *m)
{
    size_t n;
    uint8_t *buf = raw_encode(m, &n);
    assert_true(raw_send(fd, buf, n));
    free(buf);
}

/* Reads one frame (heartbeats skipped) into buf; returns its body length, or -1 on EOF,
 * error or timeout. */
static long raw_read(int fd, uint8_t *buf, size_t cap)
{
    for (;;) {
        uint8_t pre[4];
        size_t got = 0;
        while (got < 4) {
            ssize_t k = recv(fd, pre + got, 4 - got, 0);
            if (k <= 0)
                return -1;
            got += (size_t)k;
        }
        uint32_t n = (uint32_t)pre[0] << 24 | (uint32_t)pre[1] << 16 | (uint32_t)pre[2] << 8 | pre[3];
        if (n == 0 || n > cap)
            return -1;
        got = 0;
        while (got < n) {
            ssize_t k = recv(fd, buf + got, n - got, 0);
            if (k <= 0)
                return -1;
            got += (size_t)k;
        }
        if (buf[0] != PROTO_HEARTBEAT)
            return (long)n;
    }
}

/* A producer: connected, HELLO (version 2, no type) answered WELCOME. */
static int raw_producer(struct fx *fx, int rcvbuf)
{
    int fd = tp_raw_connect(fx->d.listen, 20);
    assert_true(fd >= 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = 2;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"raw", 3};
    raw_send_msg(fd, &m);
    static uint8_t buf[65536];
    long n = raw_read(fd, buf, sizeof buf);
    assert_true(n > 0);
    proto_msg w;
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &w), PROTO_OK);
    assert_int_equal(w.type, PROTO_WELCOME);
    return fd;
}

static proto_submit_task raw_task(const char *type, const void *payload, size_t len)
{
    proto_submit_task t;
    memset(&t, 0, sizeof t);
    t.priority = 1;
    t.type = (proto_bytes){(const uint8_t *)type, strlen(type)};
    t.payload = (proto_bytes){(const uint8_t *)payload, len};
    return t;
}

static proto_msg submit_msg(uint32_t request_id, uint8_t flags, const proto_submit_task *t, uint16_t n)
{
    proto_msg m = {.type = PROTO_SUBMIT};
    m.u.submit.request_id = request_id;
    m.u.submit.flags = flags;
    m.u.submit.ntasks = n;
    m.u.submit.tasks = t;
    return m;
}

/* ---- slow_wait_reader ---- */

#define BIG_RESULT (6u * 1000 * 1000)

static int h_big(tp_task *t, void *arg)
{
    return tp_task_set_result(t, arg, BIG_RESULT) == 0 ? TP_SUCCESS : TP_FAIL;
}

static int h_small(tp_task *t, void *arg)
{
    (void)arg;
    return tp_task_set_result(t, "ok", 2) == 0 ? TP_SUCCESS : TP_FAIL;
}

struct slow_reader {
    int fd;
    pthread_t th;
    _Atomic bool eof, fast;
    _Atomic long long bytes;
};

/* Reads 64 KiB a second (as fast as it can once told) until EOF or an error. */
static void *slow_read(void *arg)
{
    struct slow_reader *r = arg;
    static uint8_t buf[65536];
    for (;;) {
        ssize_t k = recv(r->fd, buf, sizeof buf, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            break;
        if (k > 0)
            r->bytes += k;
        if (!r->fast)
            tp_sleep_ms(1000);
    }
    r->eof = true;
    return NULL;
}

static void slow_wait_reader(void **state)
{
    struct fx *fx = *state;
    static const char *const args[] = {"--poll-ms", "50", "--heartbeat-ms", "1000",
                                       "--max-conn-output-bytes", "16777216",
                                       /* outcomes waiting to be written stay few */
                                       "--max-unwritten", "4", NULL};
    start(fx, "peers_slow_wait", args);
    char *result = malloc(BIG_RESULT);
    assert_non_null(result);
    memset(result, 'r', BIG_RESULT);

    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.capacity = 4;
    o.threads = 4;
    fx->w = tp_worker_new(&o, &err);
    assert_non_null(fx->w);
    assert_int_equal(tp_worker_add_type(fx->w, "big", h_big, result), 0);
    assert_int_equal(tp_worker_add_type(fx->w, "small", h_small, NULL), 0);
    assert_int_equal(tp_inproc_start(&fx->run, fx->w), 0);

    struct slow_reader r = {.fd = raw_producer(fx, 65536)};
    proto_submit_task t[10];
    for (int i = 0; i < 10; i++)
        t[i] = raw_task("big", "p", 1);
    for (uint32_t k = 1; k <= 10; k++) {
        proto_msg m = submit_msg(k, PROTO_SUBMIT_WAIT, t, 10);
        raw_send_msg(r.fd, &m);
    }
    assert_int_equal(pthread_create(&r.th, NULL, slow_read, &r), 0);

    long seen = 0;
    bool all = wait_rows(fx, 100, "SELECT COUNT(*) FROM task WHERE task_type = 'big' AND task_state = 2", &seen);
    long peak = peak_rss_kb(fx, seen);
    long long stalled = tp_daemon_stat(&fx->d, "connections.stalled_total");
    print_message("# 100 results of 6 MB waited for at 64 KiB/s: peak RSS %ld kB, stalled_total %lld,"
                  " %lld bytes read\n", peak, stalled, (long long)r.bytes);
    assert_true(all);
    assert_true(peak < 250 * 1024);
    assert_true(stalled >= 1);
    /* The slow connection was closed: past what the kernel still held, its reader comes
     * to the end. */
    r.fast = true;
    long long until = tp_mono_ms() + WAIT_MS;
    while (!r.eof && tp_mono_ms() < until)
        tp_sleep_ms(100);
    assert_true(r.eof);
    pthread_join(r.th, NULL);
    close(r.fd);
    /* Another producer is served: its WAIT is answered with the outcome. */
    int fd = raw_producer(fx, 0);
    proto_submit_task s = raw_task("small", "q", 1);
    proto_msg m = submit_msg(77, PROTO_SUBMIT_WAIT, &s, 1);
    raw_send_msg(fd, &m);
    static uint8_t buf[65536];
    bool submitted = false, outcome = false;
    for (int i = 0; i < 4 && !outcome; i++) {
        long n = raw_read(fd, buf, sizeof buf);
        assert_true(n > 0);
        proto_msg a;
        assert_int_equal(proto_msg_decode(buf, (size_t)n, &a), PROTO_OK);
        if (a.type == PROTO_SUBMITTED) {
            assert_int_equal(a.u.submitted.status, PROTO_SUBMIT_OK);
            submitted = true;
        } else if (a.type == PROTO_OUTCOME) {
            assert_int_equal(a.u.outcome.request_id, 77);
            assert_int_equal(a.u.outcome.data.len, 2);
            outcome = true;
        }
    }
    assert_true(submitted && outcome);
    close(fd);
    free(result);
    fx->passed = true;
}

/* ---- submit_budget ---- */

#define NPRODUCERS 30
#define NFRAMES 4
#define PAYLOAD (5u * 1000 * 1000)

struct producer {
    struct fx *fx;
    int fd;
    pthread_t th;
    const uint8_t *frame[NFRAMES];
    size_t len[NFRAMES];
    _Atomic int sent;
    int acked[NFRAMES + 1];
    int bad;
};

static void *produce(void *arg)
{
    struct producer *p = arg;
    for (int k = 0; k < NFRAMES; k++) {
        if (!raw_send(p->fd, p->frame[k], p->len[k]))
            return NULL;
        p->sent++;
    }
    return NULL;
}

static void submit_budget(void **state)
{
    struct fx *fx = *state;
    /* A lease longer than the read lock: a leader that lost it answers UNAVAILABLE. */
    /* The raw producers send no heartbeats while they wait for their answers. */
    static const char *const args[] = {"--poll-ms", "50", "--heartbeat-ms", "30000",
                                       "--lease-ms", "120000", "--lease-renew-ms", "250",
                                       "--max-submit-bytes", "67108864", NULL};
    start(fx, "peers_submit_budget", args);
    uint8_t *payload = malloc(PAYLOAD);
    assert_non_null(payload);
    memset(payload, 'p', PAYLOAD);
    /* Frame k of every producer is the same bytes but for its request id (k + 1). */
    uint8_t *frames[NFRAMES];
    size_t lens[NFRAMES];
    proto_submit_task t = raw_task("budget", payload, PAYLOAD);
    for (int k = 0; k < NFRAMES; k++) {
        proto_msg m = submit_msg((uint32_t)k + 1, 0, &t, 1);
        frames[k] = raw_encode(&m, &lens[k]);
    }
    MYSQL *locker = tp_testdb_connect(&fx->db);
    assert_non_null(locker);
    assert_int_equal(tp_testdb_exec_conn(locker, "FLUSH TABLES WITH READ LOCK"), 0);

    static struct producer p[NPRODUCERS];
    memset(p, 0, sizeof p);
    for (int i = 0; i < NPRODUCERS; i++) {
        p[i].fx = fx;
        p[i].fd = raw_producer(fx, 0);
        for (int k = 0; k < NFRAMES; k++) {
            p[i].frame[k] = frames[k];
            p[i].len[k] = lens[k];
        }
        assert_int_equal(pthread_create(&p[i].th, NULL, produce, &p[i]), 0);
    }
    /* Until every frame is sent or for 6 s (taskpushd stops reading at its budget); well
     * within the 15 s an INSERT may wait before its connection's read times out. */
    long seen = 0;
    long long until = tp_mono_ms() + 6000;
    while (tp_mono_ms() < until) {
        long kb = procfs_status_kb(fx->d.pid, "VmRSS");
        if (kb > seen)
            seen = kb;
        int sent = 0;
        for (int i = 0; i < NPRODUCERS; i++)
            sent += p[i].sent;
        if (sent == NPRODUCERS * NFRAMES)
            break;
        tp_sleep_ms(100);
    }
    tp_sleep_ms(1000); /* what was sent is read */
    long peak = peak_rss_kb(fx, seen);
    print_message("# %d x %d SUBMITs of 5 MB while the inserts are blocked: peak RSS %ld kB\n",
                  NPRODUCERS, NFRAMES, peak);
    assert_int_equal(rows(fx, "SELECT COUNT(*) FROM task"), 0); /* nothing got through */
    assert_int_equal(tp_testdb_exec_conn(locker, "UNLOCK TABLES"), 0);
    mysql_close(locker);
    assert_true(peak < 250 * 1024);

    /* Every submission is committed, and acknowledged once. */
    static uint8_t buf[65536];
    for (int i = 0; i < NPRODUCERS; i++) {
        pthread_join(p[i].th, NULL);
        assert_int_equal(p[i].sent, NFRAMES);
        for (int k = 0; k < NFRAMES; k++) {
            long n = raw_read(p[i].fd, buf, sizeof buf);
            assert_true(n > 0);
            proto_msg a;
            assert_int_equal(proto_msg_decode(buf, (size_t)n, &a), PROTO_OK);
            assert_int_equal(a.type, PROTO_SUBMITTED);
            assert_int_equal(a.u.submitted.status, PROTO_SUBMIT_OK);
            assert_true(a.u.submitted.request_id >= 1 && a.u.submitted.request_id <= NFRAMES);
            assert_int_equal(p[i].acked[a.u.submitted.request_id]++, 0);
        }
        close(p[i].fd);
    }
    assert_int_equal(rows(fx, "SELECT COUNT(*) FROM task WHERE task_type = 'budget'"),
                     NPRODUCERS * NFRAMES);
    for (int k = 0; k < NFRAMES; k++)
        free(frames[k]);
    free(payload);
    fx->passed = true;
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(slow_wait_reader),
        T(submit_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
