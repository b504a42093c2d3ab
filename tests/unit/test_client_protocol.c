/* test_client_protocol.c: libtaskpush against a fake dispatcher: a listening
 * socket on 127.0.0.1:0 served from the test thread, speaking the protocol through
 * proto.h (fake_dispatcher.h), while tp_worker_run() runs on its own thread.
 *
 * No sleep asserts anything about timing: every wait is bounded (WAIT_MS) and
 * ends as soon as what it waits for happens. Set TP_TEST_LOG=1 to see the
 * library's log lines on stderr.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client_harness.h"
#include "fake_dispatcher.h"
#include "proto.h"
#include "taskpush.h"

/* ================================================================== */
/* Handlers under test control                                         */
/* ================================================================== */

typedef struct hctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold; /* handlers wait for gate_open */
    int gate_open;
    int wait_cancel; /* handlers wait (bounded) for tp_task_cancelled */
    uint32_t extend_ms;
    int started;
    int finished;
    int running;
    int max_running;
    int saw_cancel;
    int extend_rc;
    int extend_after_cancel_rc;
    int64_t remaining_after_extend;
    int set_result_rc;
    /* the last task seen */
    uint64_t id;
    uint32_t epoch;
    uint32_t attempt;
    uint32_t timeout_ms;
    int priority;
    char type[TP_MAX_TYPE_LEN + 1];
    uint8_t *payload;
    size_t payload_len;
    int payload_nul;
} hctx;

static void hctx_init(hctx *h)
{
    memset(h, 0, sizeof(*h));
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
}

static void hctx_destroy(hctx *h)
{
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->payload);
}

static void deadline_ts(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

/* hctx_wait waits until *field >= value; returns 1, or 0 after WAIT_MS. */
static int hctx_wait(hctx *h, const int *field, int value)
{
    struct timespec ts;
    int ok = 1;

    deadline_ts(&ts, WAIT_MS);
    pthread_mutex_lock(&h->mu);
    while (*field < value && ok)
        ok = pthread_cond_timedwait(&h->cv, &h->mu, &ts) == 0;
    ok = *field >= value;
    pthread_mutex_unlock(&h->mu);
    return ok;
}

static void hctx_open_gate(hctx *h)
{
    pthread_mutex_lock(&h->mu);
    h->gate_open = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static int payload_is(const void *p, size_t len, const char *word)
{
    return len == strlen(word) && memcmp(p, word, len) == 0;
}

static int test_handler(tp_task *t, void *arg)
{
    hctx *h = arg;
    size_t len;
    const uint8_t *p = tp_task_payload(t, &len);
    struct timespec ts;
    int rc = TP_SUCCESS;

    pthread_mutex_lock(&h->mu);
    h->started++;
    h->running++;
    if (h->running > h->max_running)
        h->max_running = h->running;
    h->id = tp_task_id(t);
    h->epoch = tp_task_epoch(t);
    h->attempt = tp_task_attempt(t);
    h->timeout_ms = tp_task_timeout_ms(t);
    h->priority = tp_task_priority(t);
    snprintf(h->type, sizeof(h->type), "%s", tp_task_type(t));
    free(h->payload);
    h->payload = malloc(len + 1);
    if (h->payload != NULL && len > 0)
        memcpy(h->payload, p, len);
    h->payload_len = len;
    h->payload_nul = p[len] == '\0';
    pthread_cond_broadcast(&h->cv);
    if (h->extend_ms > 0) {
        h->extend_rc = tp_task_extend(t, h->extend_ms);
        h->remaining_after_extend = tp_task_remaining_ms(t);
    }
    deadline_ts(&ts, WAIT_MS);
    while (h->hold && !h->gate_open)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) != 0)
            break;
    if (h->wait_cancel) {
        int64_t end = now_ms() + WAIT_MS;

        while (!tp_task_cancelled(t) && now_ms() < end) {
            pthread_mutex_unlock(&h->mu);
            poll(NULL, 0, 5);
            pthread_mutex_lock(&h->mu);
        }
        h->saw_cancel = tp_task_cancelled(t);
        h->extend_after_cancel_rc = tp_task_extend(t, 100);
    }
    pthread_mutex_unlock(&h->mu);

    if (payload_is(p, len, "fail")) {
        rc = tp_task_set_error(t, "boom") == 0 ? TP_FAIL : -1;
    } else if (payload_is(p, len, "perm")) {
        rc = tp_task_set_error(t, "bad input") == 0 ? TP_FAIL_PERMANENT : -1;
    } else if (payload_is(p, len, "retry")) {
        rc = tp_task_set_error(t, "later") == 0 ? TP_RETRY_AFTER : -1;
        tp_task_set_retry_after(t, 1234);
    } else if (payload_is(p, len, "bogus")) {
        rc = 42;
    } else if (payload_is(p, len, "big")) {
        static char big[5000];

        memset(big, 'x', sizeof(big));
        h->set_result_rc = tp_task_set_result(t, big, sizeof(big));
    } else if (payload_is(p, len, "longerr")) {
        char msg[3000];

        memset(msg, 'e', sizeof(msg) - 1);
        msg[sizeof(msg) - 1] = '\0';
        rc = tp_task_set_error(t, msg) == 0 ? TP_FAIL : -1;
    } else if (!h->wait_cancel) {
        rc = tp_task_set_result(t, p, len) == 0 ? TP_SUCCESS : -1; /* echo */
    } else {
        rc = TP_FAIL;
    }

    pthread_mutex_lock(&h->mu);
    h->running--;
    h->finished++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* ================================================================== */
/* Running a worker on its own thread                                  */
/* ================================================================== */

typedef struct runner {
    tp_worker *w;
    pthread_t th;
    int rc;
    int pipe_blocked_after; /* SIGPIPE still blocked in the thread after run */
} runner;
static void *runner_main(void *arg)
{
    runner *r = arg;
    sigset_t now;

    r->rc = tp_worker_run(r->w);
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    r->pipe_blocked_after = sigismember(&now, SIGPIPE);
    return NULL;
}

static void runner_start(runner *r, tp_worker *w)
{
    memset(r, 0, sizeof(*r));
    r->w = w;
    r->rc = -100;
    assert_int_equal(pthread_create(&r->th, NULL, runner_main, r), 0);
}

/* runner_join waits (bounded) for tp_worker_run to return and frees the worker. */
static void runner_join(runner *r)
{
    struct timespec ts;

    deadline_ts(&ts, WAIT_MS);
    if (pthread_timedjoin_np(r->th, NULL, &ts) != 0)
        fail_msg("tp_worker_run did not return");
    assert_int_equal(r->rc, 0);
    assert_false(r->pipe_blocked_after);
    tp_worker_free(r->w);
    r->w = NULL;
}

/* wait_stat waits (bounded) until the counter at offset off reaches value. */
static int wait_stat(tp_worker *w, size_t off, uint64_t value)
{
    int64_t end = now_ms() + WAIT_MS;

    for (;;) {
        tp_worker_stats s = stats_of(w);
        uint64_t v;

        memcpy(&v, (const char *)&s + off, sizeof(v));
        if (v >= value)
            return 1;
        if (now_ms() > end)
            return 0;
        poll(NULL, 0, 2);
    }
}

#define WAIT_STAT(w, field, value) wait_stat((w), offsetof(tp_worker_stats, field), (value))

/* A worker with the test handler for types "alpha" and "beta", running against f. */
typedef struct setup {
    fake f;
    hctx h;
    runner r;
    char addr[64];
} setup;

static void setup_start(setup *s, unsigned capacity, unsigned threads)
{
    tp_worker *w;

    fake_listen(&s->f);
    fake_addr(&s->f, s->addr, sizeof(s->addr));
    w = new_worker(s->addr, capacity, threads);
    assert_int_equal(tp_worker_add_type(w, "alpha", test_handler, &s->h), 0);
    assert_int_equal(tp_worker_add_type(w, "beta", test_handler, &s->h), 0);
    runner_start(&s->r, w);
}

static void setup_finish(setup *s)
{
    hctx_open_gate(&s->h);
    if (s->r.w != NULL) {
        tp_worker_stop(s->r.w);
        runner_join(&s->r);
    }
    fake_close(&s->f);
}

/* ================================================================== */
/* Against the fake dispatcher                                         */
/* ================================================================== */

static void test_hello_fields(void **state)
{
    fake f;
    runner r;
    tp_worker_options o;
    tp_worker *w;
    proto_msg m;
    char addr[64];

    (void)state;
    fake_listen(&f);
    fake_addr(&f, addr, sizeof(addr));
    tp_worker_options_init(&o);
    o.addresses = addr;
    o.name = "w-17";
    o.token = "s3cret";
    o.capacity = 3;
    o.threads = 2;
    o.log = verbose() ? test_log : NULL;
    o.log_level = TP_LOG_DEBUG;
    w = tp_worker_new(&o, NULL);
    assert_non_null(w);
    assert_int_equal(tp_worker_add_type(w, "alpha", noop_handler, NULL), 0);
    assert_int_equal(tp_worker_add_type(w, "beta", noop_handler, NULL), 0);
    runner_start(&r, w);
    /* A second run of the same worker is refused while the first runs. */
    assert_true(WAIT_STAT(w, connect_attempts, 1));
    assert_int_equal(tp_worker_run(w), TP_EBUSY);
    assert_int_equal(tp_worker_add_type(w, "gamma", noop_handler, NULL), TP_EBUSY);

    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.version, PROTO_VERSION);
    assert_int_equal(m.u.hello.capacity, 3);
    assert_int_equal(m.u.hello.name.len, 4);
    assert_memory_equal(m.u.hello.name.ptr, "w-17", 4);
    assert_int_equal(m.u.hello.token.len, 6);
    assert_memory_equal(m.u.hello.token.ptr, "s3cret", 6);
    assert_int_equal(m.u.hello.ntypes, 2);
    assert_int_equal(m.u.hello.types[0].len, 5);
    assert_memory_equal(m.u.hello.types[0].ptr, "alpha", 5);
    assert_int_equal(m.u.hello.types[1].len, 4);
    assert_memory_equal(m.u.hello.types[1].ptr, "beta", 4);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);
    assert_true(WAIT_STAT(w, connections, 1));

    tp_worker_stop(w);
    fake_expect(&f, &m, PROTO_STOP);
    fake_expect_eof(&f, PROTO_DONE);
    runner_join(&r);
    fake_close(&f);
}

static void test_task_roundtrip(void **state)
{
    setup s;
    proto_msg m;
    size_t len = 100000;
    uint8_t *payload = malloc(len);

    (void)state;
    assert_non_null(payload);
    for (size_t i = 0; i < len; i++)
        payload[i] = (uint8_t)(i * 31 + (i >> 8)); /* binary, with NUL bytes */
    hctx_init(&s.h);
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task_full(&s.f, 0x0102030405060708ull, 9, 3, 45000, 2, "beta", payload, len);
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 0x0102030405060708ull);
    assert_int_equal(m.u.done.epoch, 9);
    assert_int_equal(m.u.done.attempt, 3);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(m.u.done.retry_after_ms, 0);
    assert_int_equal(m.u.done.data.len, len); /* the handler echoes the payload */
    assert_memory_equal(m.u.done.data.ptr, payload, len);

    assert_int_equal(s.h.id, 0x0102030405060708ull);
    assert_int_equal(s.h.epoch, 9);
    assert_int_equal(s.h.attempt, 3);
    assert_int_equal(s.h.timeout_ms, 45000);
    assert_int_equal(s.h.priority, 2);
    assert_string_equal(s.h.type, "beta");
    assert_int_equal(s.h.payload_len, len);
    assert_memory_equal(s.h.payload, payload, len);
    assert_true(s.h.payload_nul);

    assert_true(WAIT_STAT(s.r.w, tasks_completed, 1));
    assert_int_equal(stats_of(s.r.w).tasks_received, 1);
    assert_int_equal(stats_of(s.r.w).in_flight, 0);
    setup_finish(&s);
    hctx_destroy(&s.h);
    free(payload);
}

static void test_outcomes(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);

    fake_send_task(&s.f, 1, "alpha", "fail");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 1);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
    assert_int_equal(m.u.done.data.len, 4);
    assert_memory_equal(m.u.done.data.ptr, "boom", 4);

    fake_send_task(&s.f, 2, "alpha", "perm");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 2);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_PERM);
    assert_int_equal(m.u.done.data.len, 9);
    assert_memory_equal(m.u.done.data.ptr, "bad input", 9);

    fake_send_task(&s.f, 3, "alpha", "retry");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_RETRY_AFTER);
    assert_int_equal(m.u.done.retry_after_ms, 1234);
    assert_memory_equal(m.u.done.data.ptr, "later", 5);

    fake_send_task(&s.f, 4, "alpha", "bogus"); /* not a tp_outcome: counts as a failure */
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
    assert_true(m.u.done.data.len > 0);

    fake_send_task(&s.f, 5, "gamma", "x"); /* a type nobody registered */
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 5);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
    assert_non_null(memmem(m.u.done.data.ptr, m.u.done.data.len, "gamma", 5));

    fake_send_task(&s.f, 6, "alpha", ""); /* an empty payload */
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(m.u.done.data.len, 0);
    assert_int_equal(s.h.started, 5); /* gamma never reached a handler */
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_result_limits(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, 1000); /* the dispatcher takes bodies of 1000 bytes at most */

    fake_send_task(&s.f, 1, "alpha", "big");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(s.h.set_result_rc, TP_ETOOBIG);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_PERM);
    assert_non_null(memmem(m.u.done.data.ptr, m.u.done.data.len, "exceeds", 7));

    fake_send_task(&s.f, 2, "alpha", "longerr");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
    assert_true(m.u.done.data.len > 900 && m.u.done.data.len <= 1000 - 22);
    assert_true(s.f.frame_len <= 1000);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_capacity_threads(void **state)
{
    setup s;
    proto_msg m;
    int seen[3] = {0, 0, 0};

    (void)state;
    hctx_init(&s.h);
    s.h.hold = 1;
    setup_start(&s, 2, 2);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "one");
    fake_send_task(&s.f, 2, "alpha", "two");
    /* Both slow handlers run at once: the worker holds 2 deliveries. */
    assert_true(hctx_wait(&s.h, &s.h.started, 2));
    assert_int_equal(s.h.max_running, 2);
    assert_int_equal(stats_of(s.r.w).in_flight, 2);
    hctx_open_gate(&s.h);
    for (int i = 0; i < 2; i++) {
        fake_expect(&s.f, &m, PROTO_DONE);
        assert_true(m.u.done.task_id >= 1 && m.u.done.task_id <= 2);
        seen[m.u.done.task_id]++;
    }
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 1);
    assert_true(WAIT_STAT(s.r.w, tasks_completed, 2));
    assert_int_equal(stats_of(s.r.w).in_flight, 0);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_fewer_threads_than_capacity(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 3, 1); /* queued deliveries wait for the one thread */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    for (uint64_t id = 1; id <= 3; id++)
        fake_send_task(&s.f, id, "alpha", "x");
    for (uint64_t id = 1; id <= 3; id++) {
        fake_expect(&s.f, &m, PROTO_DONE);
        assert_int_equal(m.u.done.task_id, id); /* one thread: in arrival order */
    }
    assert_int_equal(s.h.max_running, 1);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_over_capacity_closes(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    s.h.wait_cancel = 1;
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    fake_send_task(&s.f, 2, "alpha", "x"); /* beyond the capacity of 1 */
    fake_expect(&s.f, &m, PROTO_ERROR);
    assert_int_equal(m.u.error.code, PROTO_ERR_UNEXPECTED);
    fake_expect_eof(&s.f, PROTO_DONE);
    /* The worker comes back and declares the held delivery (version 3); the dispatcher
     * cancels it. */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_expect(&s.f, &m, PROTO_HOLDING);
    assert_int_equal(m.u.holding.n, 1);
    proto_msg x = {.type = PROTO_CANCEL};
    x.u.cancel.task_id = 1;
    x.u.cancel.epoch = 7;
    x.u.cancel.attempt = 1;
    fake_send(&s.f, &x);
    assert_true(hctx_wait(&s.h, &s.h.finished, 1));
    assert_int_equal(s.h.saw_cancel, 1);
    assert_true(WAIT_STAT(s.r.w, connections, 2));
    assert_int_equal(stats_of(s.r.w).protocol_errors, 1);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_extend(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    s.h.extend_ms = 7000;
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task_full(&s.f, 77, 4, 2, 1000, 1, "alpha", "x", 1);
    fake_expect(&s.f, &m, PROTO_EXTEND);
    assert_int_equal(m.u.extend.task_id, 77);
    assert_int_equal(m.u.extend.epoch, 4);
    assert_int_equal(m.u.extend.attempt, 2);
    assert_int_equal(m.u.extend.extend_ms, 7000);
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 77);
    assert_int_equal(s.h.extend_rc, 0);
    /* The local lease moved from 1 s to 7 s. */
    assert_true(s.h.remaining_after_extend > 5000 && s.h.remaining_after_extend <= 7000);
    assert_int_equal(stats_of(s.r.w).extends_sent, 1);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* A handler that reports progress PROGRESS_CALLS times in a burst, then "last" at 777. */
enum { PROGRESS_CALLS = 2000 };
typedef struct progress_ctx {
    atomic_int first_rc, last_rc;
} progress_ctx;

static int progress_handler(tp_task *t, void *arg)
{
    progress_ctx *p = arg;
    atomic_store(&p->first_rc, tp_task_progress(t, 1, "first"));
    for (int i = 0; i < PROGRESS_CALLS; i++)
        (void)tp_task_progress(t, (unsigned)(i % 1001), "burst");
    atomic_store(&p->last_rc, tp_task_progress(t, 777, "last"));
    return TP_SUCCESS;
}

/* Starts a worker of progress_handler (threads handler threads) welcomed in version;
 * sends one task and reads up to its DONE: the PROGRESS frames seen, the last in *last. */
static int progress_run(unsigned threads, uint16_t version, progress_ctx *p, proto_msg *last)
{
    fake f;
    runner r;
    char addr[64];
    proto_msg m;
    int n = 0;

    fake_listen(&f);
    fake_addr(&f, addr, sizeof(addr));
    tp_worker *w = new_worker(addr, 1, threads);
    assert_int_equal(tp_worker_add_type(w, "alpha", progress_handler, p), 0);
    runner_start(&r, w);
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.version, PROTO_VERSION);
    if (version < PROTO_VERSION) {
        /* An older dispatcher refuses the HELLO; the worker comes back in version. */
        proto_msg e = {.type = PROTO_ERROR};
        e.u.error.code = PROTO_ERR_VERSION;
        fake_send(&f, &e);
        fake_expect_eof(&f, PROTO_DONE);
        fake_accept(&f);
        fake_expect(&f, &m, PROTO_HELLO);
        assert_int_equal(m.u.hello.version, version);
    }
    fake_send_welcome(&f, version, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task_full(&f, 91, 5, 3, 60000, 1, "alpha", "x", 1);
    for (;;) {
        assert_int_equal(fake_read(&f, &m, 10000), 1);
        if (m.type == PROTO_DONE)
            break;
        assert_int_equal(m.type, PROTO_PROGRESS);
        assert_int_equal(m.u.progress.task_id, 91);
        assert_int_equal(m.u.progress.epoch, 5);
        assert_int_equal(m.u.progress.attempt, 3);
        *last = m; /* its message points into the fake's buffer: compared before the next read */
        assert_true(m.u.progress.permille <= 1000);
        n++;
        if (m.u.progress.permille == 777 && m.u.progress.message.len == 4)
            assert_memory_equal(m.u.progress.message.ptr, "last", 4);
    }
    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&f);
    return n;
}

/* From a handler thread, the reports are queued and coalesced: fewer frames than calls
 * go out (never more), and the last one is the last report. */
static void test_progress_coalesced(void **state)
{
    progress_ctx p = {0};
    proto_msg last = {0};

    (void)state;
    int n = progress_run(1, PROTO_VERSION, &p, &last);
    printf("# %d PROGRESS frames for %d reports\n", n, PROGRESS_CALLS + 2);
    assert_int_equal(atomic_load(&p.first_rc), TP_OK);
    assert_int_equal(atomic_load(&p.last_rc), TP_OK);
    assert_true(n >= 1 && n <= PROGRESS_CALLS + 2);
    assert_int_equal(last.u.progress.permille, 777);
    /* Inline (threads 0): each report is written at once, in order. */
    memset(&p, 0, sizeof p);
    n = progress_run(0, PROTO_VERSION, &p, &last);
    assert_int_equal(n, PROGRESS_CALLS + 2);
    assert_int_equal(last.u.progress.permille, 777);
}

/* A version-3 session: TP_ENOTSUP, and no PROGRESS frame (the dispatcher would close). */
static void test_progress_v3_not_sent(void **state)
{
    progress_ctx p = {0};
    proto_msg last = {0};

    (void)state;
    assert_int_equal(progress_run(1, 3, &p, &last), 0);
    assert_int_equal(atomic_load(&p.first_rc), TP_ENOTSUP);
    assert_int_equal(atomic_load(&p.last_rc), TP_ENOTSUP);
}

static int inline_extend_handler(tp_task *t, void *arg)
{
    int *rc = arg;

    *rc = tp_task_extend(t, 2500);
    return TP_SUCCESS;
}

static void test_extend_inline(void **state)
{
    fake f;
    runner r;
    proto_msg m;
    char addr[64];
    int rc = -100;
    tp_worker *w;

    (void)state;
    fake_listen(&f);
    fake_addr(&f, addr, sizeof(addr));
    w = new_worker(addr, 1, 0);
    assert_int_equal(tp_worker_add_type(w, "alpha", inline_extend_handler, &rc), 0);
    runner_start(&r, w);
    fake_handshake(&f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&f, 5, "alpha", "x");
    fake_expect(&f, &m, PROTO_EXTEND); /* sent before the DONE, from the I/O thread */
    assert_int_equal(m.u.extend.task_id, 5);
    assert_int_equal(m.u.extend.extend_ms, 2500);
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(rc, 0);
    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&f);
}

static void test_cancel(void **state)
{
    setup s;
    proto_msg m;
    proto_msg c = {.type = PROTO_CANCEL};

    (void)state;
    hctx_init(&s.h);
    s.h.wait_cancel = 1;
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task_full(&s.f, 41, 3, 1, 60000, 1, "alpha", "x", 1);
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    /* A CANCEL for another delivery changes nothing. */
    c.u.cancel.task_id = 41;
    c.u.cancel.epoch = 3;
    c.u.cancel.attempt = 2;
    fake_send(&s.f, &c);
    c.u.cancel.attempt = 1;
    fake_send(&s.f, &c);
    fake_expect(&s.f, &m, PROTO_DONE); /* still answered, to free the slot */
    assert_int_equal(m.u.done.task_id, 41);
    assert_int_equal(m.u.done.attempt, 1);
    assert_int_equal(s.h.saw_cancel, 1);
    assert_int_equal(s.h.extend_after_cancel_rc, TP_EGONE);
    assert_int_equal(stats_of(s.r.w).cancels_received, 1);
    assert_int_equal(stats_of(s.r.w).disconnects, 0);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_heartbeats(void **state)
{
    setup s;
    proto_msg m;
    int beats = 0;
    int64_t end;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 50, PROTO_MAX_BODY_DEFAULT);
    end = now_ms() + WAIT_MS;
    while (beats < 4 && now_ms() < end) {
        assert_int_equal(fake_read(&s.f, &m, WAIT_MS), 1);
        assert_int_equal(m.type, PROTO_HEARTBEAT);
        beats++;
        fake_send_bare(&s.f, PROTO_HEARTBEAT); /* we are alive too */
    }
    assert_int_equal(beats, 4);
    assert_true(stats_of(s.r.w).heartbeats_sent >= 4);
    assert_int_equal(stats_of(s.r.w).disconnects, 0);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_silent_dispatcher_is_lost(void **state)
{
    setup s;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 40, PROTO_MAX_BODY_DEFAULT);
    /* We never answer: after 3 intervals the worker gives up and reconnects. */
    fake_expect_eof(&s.f, PROTO_DONE);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    assert_true(WAIT_STAT(s.r.w, connections, 2));
    assert_true(stats_of(s.r.w).disconnects >= 1);
    assert_int_equal(stats_of(s.r.w).protocol_errors, 0);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_garbage_reconnects(void **state)
{
    setup s;
    proto_msg m;
    static const uint8_t zero_len[] = {0, 0, 0, 0, 0x42};
    static const uint8_t unknown_type[] = {0, 0, 0, 3, 0x7f, 1, 2};
    static const uint8_t too_big[] = {0, 0, 0x10, 0}; /* 4096 > max_body 1000 */

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 1);

    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    send_all(s.f.fd, zero_len, sizeof(zero_len));
    fake_expect(&s.f, &m, PROTO_ERROR);
    assert_int_equal(m.u.error.code, PROTO_ERR_BAD_FRAME);
    fake_expect_eof(&s.f, PROTO_DONE);

    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    send_all(s.f.fd, unknown_type, sizeof(unknown_type));
    fake_expect(&s.f, &m, PROTO_ERROR);
    assert_int_equal(m.u.error.code, PROTO_ERR_BAD_FRAME);
    fake_expect_eof(&s.f, PROTO_DONE);

    fake_handshake(&s.f, 0, 1000);
    send_all(s.f.fd, too_big, sizeof(too_big));
    fake_expect(&s.f, &m, PROTO_ERROR);
    fake_expect_eof(&s.f, PROTO_DONE);

    /* Still a working worker afterwards. */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 9, "alpha", "still here");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(stats_of(s.r.w).protocol_errors, 3);
    assert_int_equal(stats_of(s.r.w).connections, 4);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_handshake_refused(void **state)
{
    setup s;
    proto_msg m;
    proto_msg e = {.type = PROTO_ERROR};

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 1);
    /* ERROR instead of WELCOME (say, a wrong token): the worker retries. */
    fake_accept(&s.f);
    fake_expect(&s.f, &m, PROTO_HELLO);
    e.u.error.code = PROTO_ERR_AUTH;
    e.u.error.message.ptr = (const uint8_t *)"bad token";
    e.u.error.message.len = 9;
    fake_send(&s.f, &e);
    fake_expect_eof(&s.f, PROTO_DONE);
    /* A WELCOME of another protocol version: the worker says so, and retries. */
    fake_accept(&s.f);
    fake_expect(&s.f, &m, PROTO_HELLO);
    fake_send_welcome(&s.f, PROTO_VERSION + 1, 0, PROTO_MAX_BODY_DEFAULT);
    fake_expect(&s.f, &m, PROTO_ERROR);
    assert_int_equal(m.u.error.code, PROTO_ERR_VERSION);
    fake_expect_eof(&s.f, PROTO_DONE);
    /* A TASK before WELCOME is a protocol error. */
    fake_accept(&s.f);
    fake_expect(&s.f, &m, PROTO_HELLO);
    fake_send_task(&s.f, 1, "alpha", "x");
    fake_expect_eof(&s.f, PROTO_DONE);
    assert_int_equal(stats_of(s.r.w).connections, 0);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    assert_true(WAIT_STAT(s.r.w, connections, 1));
    assert_int_equal(s.h.started, 0);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_address_failover(void **state)
{
    fake f;
    fake dead;
    runner r;
    proto_msg m;
    char list[128];
    tp_worker *w;

    (void)state;
    fake_listen(&dead);
    fake_listen(&f);
    snprintf(list, sizeof(list), "127.0.0.1:%u,127.0.0.1:%u", dead.port, f.port);
    fake_close(&dead); /* nobody listens on the first address any more */
    w = new_worker(list, 1, 0);
    assert_int_equal(tp_worker_add_type(w, "alpha", noop_handler, NULL), 0);
    runner_start(&r, w);
    fake_handshake(&f, 0, PROTO_MAX_BODY_DEFAULT);
    assert_true(WAIT_STAT(w, connections, 1));
    assert_true(stats_of(w).connect_attempts >= 2);
    fake_send_task(&f, 1, "alpha", "x");
    fake_expect(&f, &m, PROTO_DONE);
    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&f);
}

/* Counts the log lines that say a dispatcher does not lead (the log thread writes). */
static void not_leader_log(void *arg, int level, const char *msg)
{
    (void)level;
    if (strstr(msg, "does not lead") != NULL)
        __atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST);
    if (verbose())
        test_log(NULL, level, msg);
}

static void send_not_leader(fake *f)
{
    proto_msg e = {.type = PROTO_ERROR};

    e.u.error.code = PROTO_ERR_NOT_LEADER;
    e.u.error.message.ptr = (const uint8_t *)"standby";
    e.u.error.message.len = 7;
    fake_send(f, &e);
}

/* A dispatcher that answers NOT_LEADER (to HELLO, or in a session) is left for the
 * next address at once, although the backoff here is 30 s (longer than any wait);
 * once every address said NOT_LEADER in a row, the backoff applies. */
static void test_not_leader_next_address(void **state)
{
    fake a;
    fake b;
    runner r;
    proto_msg m;
    char list[128];
    tp_worker_options o;
    tp_worker *w;
    int said = 0;
    struct pollfd p;

    (void)state;
    fake_listen(&a);
    fake_listen(&b);
    snprintf(list, sizeof(list), "127.0.0.1:%u,127.0.0.1:%u", a.port, b.port);
    tp_worker_options_init(&o);
    o.addresses = list;
    o.reconnect_min_ms = 30000;
    o.reconnect_max_ms = 30000;
    o.log = not_leader_log;
    o.log_arg = &said;
    o.log_level = TP_LOG_DEBUG;
    w = tp_worker_new(&o, NULL);
    assert_non_null(w);
    assert_int_equal(tp_worker_add_type(w, "alpha", noop_handler, NULL), 0);
    runner_start(&r, w);

    fake_accept(&a); /* a standby: HELLO answered NOT_LEADER */
    fake_expect(&a, &m, PROTO_HELLO);
    send_not_leader(&a);
    fake_expect_eof(&a, PROTO_DONE);
    fake_handshake(&b, 0, PROTO_MAX_BODY_DEFAULT); /* the leader, within WAIT_MS */
    assert_true(WAIT_STAT(w, connections, 1));
    fake_send_task(&b, 1, "alpha", "x");
    fake_expect(&b, &m, PROTO_DONE);

    send_not_leader(&b); /* the leader loses its lease */
    fake_expect_eof(&b, PROTO_DONE);
    fake_accept(&a);
    fake_expect(&a, &m, PROTO_HELLO);
    send_not_leader(&a); /* both said NOT_LEADER in a row: now the backoff */
    fake_expect_eof(&a, PROTO_DONE);
    p = (struct pollfd){.fd = b.lfd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 1000), 0);
    p = (struct pollfd){.fd = a.lfd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0);
    assert_true(__atomic_load_n(&said, __ATOMIC_SEQ_CST) >= 3);

    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&a);
    fake_close(&b);
}

/* fake_handshake_v2 plays a dispatcher of protocol version 2: the worker's HELLOs of
 * versions PROTO_VERSION down to 3 are refused, and the next one, of version 2,
 * welcomed. With fallen, the worker already speaks version 2. */
static void fake_handshake_v2(fake *f, int fallen)
{
    proto_msg m;
    proto_msg e = {.type = PROTO_ERROR};

    fake_accept(f);
    fake_expect(f, &m, PROTO_HELLO);
    for (uint16_t v = PROTO_VERSION; !fallen && v >= 3; v--) {
        assert_int_equal(m.u.hello.version, v);
        e.u.error.code = PROTO_ERR_VERSION;
        fake_send(f, &e);
        fake_expect_eof(f, PROTO_DONE);
        fake_accept(f);
        fake_expect(f, &m, PROTO_HELLO);
    }
    assert_int_equal(m.u.hello.version, 2);
    fake_send_welcome(f, 2, 0, PROTO_MAX_BODY_DEFAULT);
}

/* In a version-2 session, a lost connection cancels what the worker ran. */
static void test_lost_connection_drops_outcome(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    s.h.wait_cancel = 1;
    setup_start(&s, 1, 1);
    fake_handshake_v2(&s.f, 0);
    fake_send_task(&s.f, 1, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    fake_drop(&s.f); /* the dispatcher goes away */
    assert_true(hctx_wait(&s.h, &s.h.finished, 1));
    assert_int_equal(s.h.saw_cancel, 1); /* the handler learnt its work is moot */
    assert_true(WAIT_STAT(s.r.w, tasks_dropped, 1));
    fake_handshake_v2(&s.f, 1);
    /* The next DONE on the new connection is the new task's, not the old one. */
    s.h.wait_cancel = 0;
    fake_send_task(&s.f, 2, "alpha", "y");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 2);
    assert_int_equal(stats_of(s.r.w).tasks_completed, 1);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* Version 3: a lost connection does not cancel; the next session gets HOLDING for the
 * running task, then its DONE with the old triple, sent again until CONFIRMed. */
static void test_inventory_across_reconnects(void **state)
{
    setup s;
    proto_msg m;
    proto_msg c = {.type = PROTO_CONFIRM};
    proto_dlv d;

    (void)state;
    hctx_init(&s.h);
    s.h.hold = 1;
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "x"); /* epoch 7, attempt 1 */
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    fake_drop(&s.f);
    assert_true(WAIT_STAT(s.r.w, tasks_carried, 1));
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_expect(&s.f, &m, PROTO_HOLDING);
    assert_int_equal(m.u.holding.n, 1);
    proto_dlv_at(&m.u.holding, 0, &d);
    assert_true(d.task_id == 1 && d.epoch == 7 && d.attempt == 1);
    hctx_open_gate(&s.h);
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_true(m.u.done.task_id == 1 && m.u.done.epoch == 7 && m.u.done.attempt == 1);
    assert_int_equal(s.h.saw_cancel, 0);
    /* Not confirmed: the next session gets it again, and no HOLDING. */
    fake_drop(&s.f);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_true(m.u.done.task_id == 1 && m.u.done.epoch == 7 && m.u.done.attempt == 1);
    assert_true(WAIT_STAT(s.r.w, outcomes_resent, 1));
    c.u.confirm.n = 1;
    c.u.confirm.items = &d;
    fake_send(&s.f, &c);
    assert_true(WAIT_STAT(s.r.w, outcomes_confirmed, 1));
    /* Confirmed: forgotten. The first frame of the next session is the new task's DONE. */
    fake_drop(&s.f);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 2, "alpha", "y");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 2);
    assert_int_equal(stats_of(s.r.w).outcomes_resent, 1);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* Version 3: unconfirmed outcomes are bounded (4 x capacity + 1024): beyond, the oldest
 * are forgotten, and only the kept ones are sent again after a reconnect. */
static void test_inventory_kept_bounded(void **state)
{
    setup s;
    proto_msg m;
    const int n = 4 * 1 + 1024 + 3;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, 1, 0); /* capacity 1, handlers inline */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    for (int i = 1; i <= n; i++) {
        fake_send_task(&s.f, (uint64_t)i, "alpha", "x");
        fake_expect(&s.f, &m, PROTO_DONE);
        assert_int_equal(m.u.done.task_id, i);
    }
    assert_int_equal(stats_of(s.r.w).outcomes_forgotten, 3);
    fake_drop(&s.f);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    for (int i = 4; i <= n; i++) { /* the oldest three were forgotten */
        fake_expect(&s.f, &m, PROTO_DONE);
        assert_int_equal(m.u.done.task_id, i);
    }
    assert_int_equal(stats_of(s.r.w).outcomes_resent, n - 3);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* Version 3: a CANCEL of a carried task reaches its handler; HOLDING is never sent to a
 * version-2 session, which cancels what was carried. */
static void test_inventory_cancel_and_fallback(void **state)
{
    setup s;
    proto_msg m;
    proto_msg x = {.type = PROTO_CANCEL};

    (void)state;
    hctx_init(&s.h);
    s.h.wait_cancel = 1;
    setup_start(&s, 2, 2);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    fake_drop(&s.f);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_expect(&s.f, &m, PROTO_HOLDING);
    x.u.cancel.task_id = 1;
    x.u.cancel.epoch = 7;
    x.u.cancel.attempt = 1;
    fake_send(&s.f, &x); /* refused by the new dispatcher */
    assert_true(hctx_wait(&s.h, &s.h.finished, 1));
    assert_int_equal(s.h.saw_cancel, 1);
    fake_expect(&s.f, &m, PROTO_DONE); /* answered, as any cancelled delivery */
    assert_int_equal(m.u.done.task_id, 1);
    assert_true(WAIT_STAT(s.r.w, cancels_received, 1));
    /* Carried into a version-2 session: cancelled. */
    fake_drop(&s.f);
    s.h.saw_cancel = 0;
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 2, "alpha", "y");
    assert_true(hctx_wait(&s.h, &s.h.started, 2));
    fake_drop(&s.f); /* carried */
    fake_handshake_v2(&s.f, 0);
    assert_true(hctx_wait(&s.h, &s.h.finished, 2));
    assert_int_equal(s.h.saw_cancel, 1); /* cancelled: a version-2 dispatcher cannot adopt */
    s.h.wait_cancel = 0;
    fake_send_task(&s.f, 3, "alpha", "z");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 3);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_graceful_stop(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    s.h.hold = 1;
    setup_start(&s, 2, 2);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    tp_worker_stop(s.r.w);
    fake_expect(&s.f, &m, PROTO_STOP);
    assert_int_equal(s.h.finished, 0); /* the handler is still at work */
    /* A TASK that crossed our STOP on the wire is still taken and answered. */
    fake_send_task(&s.f, 2, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 2));
    hctx_open_gate(&s.h);
    fake_expect(&s.f, &m, PROTO_DONE);
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(fake_expect_eof(&s.f, PROTO_DONE), 0);
    runner_join(&s.r);
    assert_int_equal(s.h.finished, 2);
    fake_close(&s.f);
    hctx_destroy(&s.h);
}

static void test_stop_twice_abandons(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    s.h.wait_cancel = 1;
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    tp_worker_stop(s.r.w);
    fake_expect(&s.f, &m, PROTO_STOP);
    tp_worker_stop(s.r.w); /* second call: stop at once */
    assert_int_equal(fake_expect_eof(&s.f, PROTO_DONE), 0);
    runner_join(&s.r);
    assert_int_equal(s.h.saw_cancel, 1);
    fake_close(&s.f);
    hctx_destroy(&s.h);
}

static void test_dispatcher_stop(void **state)
{
    setup s;
    proto_msg m;

    (void)state;
    hctx_init(&s.h);
    s.h.hold = 1;
    setup_start(&s, 1, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&s.f, 1, "alpha", "x");
    assert_true(hctx_wait(&s.h, &s.h.started, 1));
    fake_send_bare(&s.f, PROTO_STOP);
    hctx_open_gate(&s.h);
    fake_expect(&s.f, &m, PROTO_DONE); /* it finishes what it holds ... */
    assert_int_equal(m.u.done.task_id, 1);
    fake_expect_eof(&s.f, PROTO_DONE); /* ... then closes, and comes back later */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    assert_true(WAIT_STAT(s.r.w, connections, 2));
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* Encodes the TASKs of ids 1..n (type "alpha", payload "p<id>") into frames; when at is
 * not NULL, at[i] is where task i + 1's frame starts and at[n] the end. Returns the
 * bytes written. */
static size_t encode_numbered_tasks(uint8_t *frames, size_t cap, int n, size_t *at)
{
    size_t len = 0;

    for (int id = 1; id <= n; id++) {
        proto_msg t = {.type = PROTO_TASK};
        char payload[16];

        snprintf(payload, sizeof(payload), "p%d", id);
        t.u.task.task_id = (uint64_t)id;
        t.u.task.attempt = 1;
        t.u.task.type.ptr = (const uint8_t *)"alpha";
        t.u.task.type.len = 5;
        t.u.task.payload.ptr = (const uint8_t *)payload;
        t.u.task.payload.len = strlen(payload);
        if (at != NULL)
            at[id - 1] = len;
        len += proto_msg_encode(&t, frames + len, cap - len);
    }
    if (at != NULL)
        at[n] = len;
    return len;
}

/* Reads n DONEs: each of the tasks 1..n answered once, with its payload as its result. */
static void expect_numbered_dones(fake *f, int n)
{
    int *seen = calloc((size_t)n + 1, sizeof(*seen));
    proto_msg m;

    assert_non_null(seen);
    for (int i = 0; i < n; i++) {
        char want[16];

        fake_expect(f, &m, PROTO_DONE);
        assert_true(m.u.done.task_id >= 1 && m.u.done.task_id <= (uint64_t)n);
        seen[m.u.done.task_id]++;
        snprintf(want, sizeof(want), "p%llu", (unsigned long long)m.u.done.task_id);
        assert_int_equal(m.u.done.data.len, strlen(want));
        assert_memory_equal(m.u.done.data.ptr, want, strlen(want));
    }
    for (int id = 1; id <= n; id++)
        assert_int_equal(seen[id], 1);
    free(seen);
}

static void test_inline_batch_and_yield(void **state)
{
    enum { N = 1000 };
    setup s;
    uint8_t *frames;
    size_t len;
    size_t cap = (size_t)N * 64;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, N, 0); /* handlers inline on the I/O thread */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    frames = malloc(cap);
    assert_non_null(frames);
    len = encode_numbered_tasks(frames, cap, N, NULL);
    send_all(s.f.fd, frames, len); /* one burst: far more than one read's budget */
    free(frames);
    expect_numbered_dones(&s.f, N);
    assert_true(stats_of(s.r.w).read_yields >= 1);
    assert_int_equal(stats_of(s.r.w).tasks_completed, N);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* TASK frames cut anywhere. Each piece sent is some whole frames (0, 1 or 2) and the
 * first bytes of the next (1 byte, then 2, ... up to all but one), and the piece after
 * it the rest of that frame: so a read that finds nothing buffered ends inside a
 * prefix or a body at every place, and the read after it completes the frame from the
 * buffered part. Each task is run once, with its own payload. */
static void test_split_frames(void **state)
{
    enum { N = 200 };
    setup s;
    uint8_t *frames;
    size_t at[N + 1]; /* where frame i starts; at[N] is the end */
    size_t cap = (size_t)N * 64;

    (void)state;
    hctx_init(&s.h);
    setup_start(&s, N, 0);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    frames = malloc(cap);
    assert_non_null(frames);
    encode_numbered_tasks(frames, cap, N, at);
    for (size_t i = 0, k = 0; i < N; k++) {
        size_t whole = k % 3;
        size_t cut;

        if (i + whole >= N)
            whole = N - 1 - i;
        cut = 1 + k % (at[i + whole + 1] - at[i + whole] - 1);
        send_all(s.f.fd, frames + at[i], at[i + whole] + cut - at[i]);
        usleep(1000); /* a read of its own */
        send_all(s.f.fd, frames + at[i + whole] + cut, at[i + whole + 1] - at[i + whole] - cut);
        usleep(1000);
        i += whole + 1;
    }
    free(frames);
    expect_numbered_dones(&s.f, N);
    assert_int_equal(stats_of(s.r.w).tasks_completed, N);
    assert_int_equal(stats_of(s.r.w).protocol_errors, 0);
    assert_int_equal(stats_of(s.r.w).connections, 1);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

/* Task id's payload for test_output_backpressure, also its expected result: "p<id>:"
 * then one letter up to 16 to 12,015 bytes in all. Returns its length. */
static size_t numbered_big_payload(char *buf, int id)
{
    size_t len = 16 + (size_t)id * 7919 % 12000;
    int head = snprintf(buf, 16, "p%d:", id);

    memset(buf + head, 'a' + id % 26, len - (size_t)head);
    return len;
}

/* Results of 16 bytes to 12 KB, 18 MB in all, answered while the dispatcher sends and
 * reads nothing: the worker's sends are refused in part, later DONEs queue behind the
 * rest, and a pass's DONEs pass the 64 KiB gathered for one send. Every DONE arrives
 * whole, once, with its own result. */
static void test_output_backpressure(void **state)
{
    enum { N = 3000 };
    setup s;
    size_t cap = (size_t)N * 12100, len = 0;
    uint8_t *frames = malloc(cap);
    char *payload = malloc(12100), *want = malloc(12100);
    int *seen = calloc(N + 1, sizeof(*seen));
    int small = 65536;
    proto_msg m;

    (void)state;
    assert_non_null(frames);
    assert_non_null(payload);
    assert_non_null(want);
    assert_non_null(seen);
    hctx_init(&s.h);
    setup_start(&s, N, 0); /* inline: each read's tasks answered in the same pass */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    /* A receive window of its own size, and no more: the worker's sends fill up. */
    assert_int_equal(setsockopt(s.f.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    for (int id = 1; id <= N; id++) {
        proto_msg t = {.type = PROTO_TASK};

        t.u.task.task_id = (uint64_t)id;
        t.u.task.attempt = 1;
        t.u.task.type.ptr = (const uint8_t *)"alpha";
        t.u.task.type.len = 5;
        t.u.task.payload.ptr = (const uint8_t *)payload;
        t.u.task.payload.len = numbered_big_payload(payload, id);
        len += proto_msg_encode(&t, frames + len, cap - len);
    }
    send_all(s.f.fd, frames, len);
    for (int i = 0; i < N; i++) {
        size_t wlen;

        fake_expect(&s.f, &m, PROTO_DONE);
        assert_true(m.u.done.task_id >= 1 && m.u.done.task_id <= N);
        seen[m.u.done.task_id]++;
        wlen = numbered_big_payload(want, (int)m.u.done.task_id);
        assert_int_equal(m.u.done.data.len, wlen);
        assert_memory_equal(m.u.done.data.ptr, want, wlen);
    }
    for (int id = 1; id <= N; id++)
        assert_int_equal(seen[id], 1);
    assert_int_equal(stats_of(s.r.w).tasks_completed, N);
    assert_int_equal(stats_of(s.r.w).protocol_errors, 0);
    assert_int_equal(stats_of(s.r.w).connections, 1);
    free(seen);
    free(want);
    free(payload);
    free(frames);
    setup_finish(&s);
    hctx_destroy(&s.h);
}

static void test_two_workers_in_one_process(void **state)
{
    setup a;
    setup b;
    proto_msg m;

    (void)state;
    hctx_init(&a.h);
    hctx_init(&b.h);
    a.h.hold = 1;
    b.h.hold = 1;
    setup_start(&a, 1, 1);
    setup_start(&b, 1, 0);
    fake_handshake(&a.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_handshake(&b.f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&a.f, 100, "alpha", "from-a");
    fake_send_task(&b.f, 200, "beta", "from-b");
    assert_true(hctx_wait(&a.h, &a.h.started, 1));
    assert_true(hctx_wait(&b.h, &b.h.started, 1));
    hctx_open_gate(&b.h);
    hctx_open_gate(&a.h);
    fake_expect(&a.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 100);
    assert_memory_equal(m.u.done.data.ptr, "from-a", 6);
    fake_expect(&b.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 200);
    assert_memory_equal(m.u.done.data.ptr, "from-b", 6);
    assert_int_equal(stats_of(a.r.w).tasks_completed, 1);
    assert_int_equal(stats_of(b.r.w).tasks_completed, 1);
    setup_finish(&a);
    setup_finish(&b);
    hctx_destroy(&a.h);
    hctx_destroy(&b.h);
}

static int big_result_handler(tp_task *t, void *arg)
{
    static uint8_t big[4 << 20];

    (void)arg;
    return tp_task_set_result(t, big, sizeof(big)) == 0 ? TP_SUCCESS : TP_FAIL;
}

/* The dispatcher vanishes while the worker writes a 4 MiB DONE: the write fails
 * with EPIPE or ECONNRESET, and the process must not die of SIGPIPE. */
static void test_sigpipe_safe(void **state)
{
    fake f;
    runner r;
    char addr[64];
    tp_worker *w;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    int small = 4096;

    (void)state;
    fake_listen(&f);
    fake_addr(&f, addr, sizeof(addr));
    w = new_worker(addr, 1, 1);
    assert_int_equal(tp_worker_add_type(w, "alpha", big_result_handler, NULL), 0);
    runner_start(&r, w);
    fake_accept(&f);
    setsockopt(f.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    {
        proto_msg m;

        fake_expect(&f, &m, PROTO_HELLO);
    }
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&f, 1, "alpha", "x");
    assert_true(WAIT_STAT(w, tasks_completed, 1));
    setsockopt(f.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    fake_drop(&f);   /* a reset while the result is being written */
    fake_accept(&f); /* still alive, and reconnecting */
    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&f);
}

/* ================================================================== */
/* tp_submit against the fake dispatcher                               */
/* ================================================================== */

/* One tp_submit call on a thread of its own. */
typedef struct submitter {
    tp_worker *w;
    pthread_t th;
    tp_submit_task tasks[2];
    size_t n;
    unsigned flags;
    tp_submit_result res[2];
    tp_error err;
    int rc;
} submitter;

static void *submitter_main(void *arg)
{
    submitter *s = arg;
    s->rc = tp_submit(s->w, s->tasks, s->n, s->flags, WAIT_MS, s->res, &s->err);
    return NULL;
}

static void submitter_start(submitter *s, tp_worker *w, size_t n, unsigned flags)
{
    memset(s, 0, sizeof(*s));
    s->w = w;
    s->n = n;
    s->flags = flags;
    for (size_t i = 0; i < n; i++) {
        tp_submit_task_init(&s->tasks[i]);
        s->tasks[i].type = i ? "beta" : "alpha";
        s->tasks[i].payload = "pl";
        s->tasks[i].payload_len = 2;
    }
    s->tasks[0].dedup_key = "key-1";
    s->tasks[0].dedup_key_len = 5;
    s->tasks[0].priority = 2;
    s->tasks[0].delay_ms = 1500;
    assert_int_equal(pthread_create(&s->th, NULL, submitter_main, s), 0);
}

static int submitter_join(submitter *s)
{
    struct timespec ts;

    deadline_ts(&ts, WAIT_MS);
    if (pthread_timedjoin_np(s->th, NULL, &ts) != 0)
        fail_msg("tp_submit did not return");
    return s->rc;
}

static void send_submitted(fake *f, uint32_t request_id, uint16_t status, const proto_submit_res *r,
                           uint16_t n, const char *msg)
{
    proto_msg m = {.type = PROTO_SUBMITTED};

    m.u.submitted.request_id = request_id;
    m.u.submitted.status = status;
    m.u.submitted.n = n;
    m.u.submitted.results = r;
    m.u.submitted.message.ptr = (const uint8_t *)msg;
    m.u.submitted.message.len = strlen(msg);
    fake_send(f, &m);
}

static void test_submit_producer(void **state)
{
    fake f;
    runner r;
    submitter s;
    proto_msg m;
    char addr[64];
    tp_worker *w;
    proto_submit_task t;
    static const proto_submit_res ok[2] = {{PROTO_SUBMIT_DUPLICATE, 41}, {PROTO_SUBMIT_INSERTED, 42}};

    (void)state;
    fake_listen(&f);
    fake_addr(&f, addr, sizeof(addr));
    w = new_worker(addr, 1, 0); /* no type: a producer-only client */
    runner_start(&r, w);
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.version, PROTO_VERSION);
    assert_int_equal(m.u.hello.ntypes, 0);
    assert_int_equal(m.u.hello.capacity, 0);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);

    /* The fields arrive as given; the answer fills the results. */
    submitter_start(&s, w, 2, 0);
    fake_expect(&f, &m, PROTO_SUBMIT);
    assert_int_equal(m.u.submit.ntasks, 2);
    assert_int_equal(m.u.submit.flags, 0);
    proto_bytes cur = m.u.submit.entries;
    assert_int_equal(proto_submit_next(&cur, &t), PROTO_OK);
    assert_int_equal(t.priority, 2);
    assert_int_equal(t.delay_ms, 1500);
    assert_int_equal(t.dedup_key.len, 5);
    assert_memory_equal(t.type.ptr, "alpha", 5);
    send_submitted(&f, m.u.submit.request_id, PROTO_SUBMIT_OK, ok, 2, "");
    assert_int_equal(submitter_join(&s), 0);
    assert_int_equal(s.res[0].duplicate, 1);
    assert_true(s.res[0].task_id == 41);
    assert_int_equal(s.res[1].duplicate, 0);
    assert_true(s.res[1].task_id == 42);

    /* INVALID and UNAVAILABLE become TP_EINVAL and TP_EUNAVAIL with the reason. */
    submitter_start(&s, w, 1, 0);
    fake_expect(&f, &m, PROTO_SUBMIT);
    send_submitted(&f, m.u.submit.request_id, PROTO_SUBMIT_INVALID, NULL, 0, "task 0: bad type");
    assert_int_equal(submitter_join(&s), TP_EINVAL);
    assert_non_null(strstr(s.err.text, "bad type"));
    submitter_start(&s, w, 1, 0);
    fake_expect(&f, &m, PROTO_SUBMIT);
    send_submitted(&f, m.u.submit.request_id, PROTO_SUBMIT_UNAVAILABLE, NULL, 0, "standby");
    assert_int_equal(submitter_join(&s), TP_EUNAVAIL);

    /* WAIT: done once each inserted task's OUTCOME came (none for the duplicate). */
    submitter_start(&s, w, 2, TP_SUBMIT_WAIT);
    fake_expect(&f, &m, PROTO_SUBMIT);
    assert_int_equal(m.u.submit.flags, PROTO_SUBMIT_WAIT);
    uint32_t rid = m.u.submit.request_id;
    send_submitted(&f, rid, PROTO_SUBMIT_OK, ok, 2, "");
    proto_msg o = {.type = PROTO_OUTCOME};
    o.u.outcome.request_id = rid;
    o.u.outcome.task_id = 42;
    o.u.outcome.state = PROTO_STATE_FAILED;
    o.u.outcome.data = (proto_bytes){(const uint8_t *)"boom", 4};
    fake_send(&f, &o);
    assert_int_equal(submitter_join(&s), 0);
    assert_int_equal(s.res[1].state, TP_TASK_FAILED);
    assert_string_equal(s.res[1].output, "boom");
    assert_int_equal(s.res[0].state, 0);
    tp_submit_results_free(s.res, 2);

    /* The connection lost before the answer: TP_EGONE, and the worker reconnects. */
    submitter_start(&s, w, 1, 0);
    fake_expect(&f, &m, PROTO_SUBMIT);
    fake_drop(&f);
    assert_int_equal(submitter_join(&s), TP_EGONE);

    /* Submitted while disconnected: sent once connected again. */
    submitter_start(&s, w, 1, 0);
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);
    fake_expect(&f, &m, PROTO_SUBMIT);
    send_submitted(&f, m.u.submit.request_id, PROTO_SUBMIT_OK, &ok[1], 1, "");
    assert_int_equal(submitter_join(&s), 0);
    assert_true(s.res[0].task_id == 42);

    /* Bad arguments never reach the wire. */
    tp_submit_task bad;
    tp_submit_result br;
    tp_submit_task_init(&bad);
    assert_int_equal(tp_submit(w, &bad, 1, 0, 1000, &br, NULL), TP_EINVAL); /* no type */
    bad.type = "alpha";
    bad.priority = 3;
    assert_int_equal(tp_submit(w, &bad, 1, 0, 1000, &br, NULL), TP_EINVAL);
    bad.priority = 1;
    bad.dedup_key = "k";
    bad.dedup_key_len = TP_MAX_DEDUP_KEY_LEN + 1;
    assert_int_equal(tp_submit(w, &bad, 1, 0, 1000, &br, NULL), TP_ERANGE);
    assert_int_equal(tp_submit(w, &bad, 0, 0, 1000, &br, NULL), TP_EINVAL);
    assert_int_equal(tp_submit(w, &bad, TP_MAX_SUBMIT_TASKS + 1, 0, 1000, &br, NULL), TP_ERANGE);

    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&f);
}

static int inline_submit_rc = 1;

static int submitting_handler(tp_task *t, void *arg)
{
    tp_submit_task st;
    tp_submit_result r;

    (void)t;
    tp_submit_task_init(&st);
    st.type = "alpha";
    /* On the I/O thread (threads 0) a blocking call would wait forever. */
    inline_submit_rc = tp_submit(arg, &st, 1, 0, 1000, &r, NULL);
    return TP_SUCCESS;
}

static void test_submit_v1_fallback_and_inline(void **state)
{
    fake f;
    runner r;
    submitter s;
    proto_msg m;
    proto_msg e = {.type = PROTO_ERROR};
    char addr[64];
    tp_worker *w;

    (void)state;
    fake_listen(&f);
    fake_addr(&f, addr, sizeof(addr));
    w = new_worker(addr, 1, 0);
    assert_int_equal(tp_worker_add_type(w, "alpha", submitting_handler, w), 0);
    runner_start(&r, w);
    /* An old dispatcher refuses versions PROTO_VERSION to 2: the worker comes back in
     * version 1. */
    e.u.error.code = PROTO_ERR_VERSION;
    for (uint16_t v = PROTO_VERSION; v >= 2; v--) {
        fake_accept(&f);
        fake_expect(&f, &m, PROTO_HELLO);
        assert_int_equal(m.u.hello.version, v);
        fake_send(&f, &e);
        fake_expect_eof(&f, PROTO_DONE);
    }
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.version, 1);
    fake_send_welcome(&f, 1, 0, PROTO_MAX_BODY_DEFAULT);
    assert_true(WAIT_STAT(w, connections, 1));
    /* It takes tasks; its handler runs inline, where tp_submit is refused at once. */
    fake_send_task(&f, 7, "alpha", "x");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(inline_submit_rc, TP_EBUSY);
    /* From another thread, on a version-1 session: unavailable, nothing sent. */
    submitter_start(&s, w, 1, 0);
    assert_int_equal(submitter_join(&s), TP_EUNAVAIL);
    tp_worker_stop(w);
    runner_join(&r);
    fake_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hello_fields),
        cmocka_unit_test(test_task_roundtrip),
        cmocka_unit_test(test_outcomes),
        cmocka_unit_test(test_result_limits),
        cmocka_unit_test(test_capacity_threads),
        cmocka_unit_test(test_fewer_threads_than_capacity),
        cmocka_unit_test(test_over_capacity_closes),
        cmocka_unit_test(test_extend),
        cmocka_unit_test(test_progress_coalesced),
        cmocka_unit_test(test_progress_v3_not_sent),
        cmocka_unit_test(test_extend_inline),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_heartbeats),
        cmocka_unit_test(test_silent_dispatcher_is_lost),
        cmocka_unit_test(test_garbage_reconnects),
        cmocka_unit_test(test_handshake_refused),
        cmocka_unit_test(test_address_failover),
        cmocka_unit_test(test_not_leader_next_address),
        cmocka_unit_test(test_lost_connection_drops_outcome),
        cmocka_unit_test(test_inventory_across_reconnects),
        cmocka_unit_test(test_inventory_cancel_and_fallback),
        cmocka_unit_test(test_inventory_kept_bounded),
        cmocka_unit_test(test_graceful_stop),
        cmocka_unit_test(test_stop_twice_abandons),
        cmocka_unit_test(test_dispatcher_stop),
        cmocka_unit_test(test_inline_batch_and_yield),
        cmocka_unit_test(test_split_frames),
        cmocka_unit_test(test_output_backpressure),
        cmocka_unit_test(test_two_workers_in_one_process),
        cmocka_unit_test(test_sigpipe_safe),
        cmocka_unit_test(test_submit_producer),
        cmocka_unit_test(test_submit_v1_fallback_and_inline),
    };

    if (getenv("TP_TEST_FILTER") != NULL) /* e.g. TP_TEST_FILTER='test_exec*' */
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    return cmocka_run_group_tests_name("client-protocol", tests, NULL, NULL);
}
