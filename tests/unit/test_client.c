/* test_client.c: unit tests of libtaskpush and taskpush-worker.
 *
 * Three groups in one executable (one TAP plan):
 * - pure checks: option validation, the address list, the backoff, the API's
 *   argument checks;
 * - a fake dispatcher: a listening socket on 127.0.0.1:0 served from the test
 *   thread, speaking the protocol through proto.h, while tp_worker_run() runs
 *   on its own thread;
 * - the command runner of taskpush-worker, and the program itself against the
 *   fake dispatcher (TASKPUSH_WORKER_BIN, set by meson).
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

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "exec.h"
#include "proto.h"
#include "taskpush.h"

extern char **environ;

#define WAIT_MS 10000 /* the longest any single wait may take before the test fails */

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_log(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "# [%d] %s\n", level, msg);
}

static int verbose(void)
{
    const char *v = getenv("TP_TEST_LOG");

    return v != NULL && v[0] == '1';
}

/* ================================================================== */
/* The fake dispatcher                                                 */
/* ================================================================== */

typedef struct fake {
    int lfd;
    int fd;
    uint16_t port;
    uint8_t *in; /* bytes received and not yet framed */
    size_t in_len;
    size_t in_cap;
    uint8_t *frame; /* the body of the last frame read; the proto_msg points into it */
    size_t frame_len;
    int answered_stop; /* this connection's STOP was answered */
} fake;

static void fake_listen(fake *f)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    int one = 1;

    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->lfd >= 0);
    setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f->lfd, 16), 0);
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sa, &len), 0);
    f->port = ntohs(sa.sin_port);
}

static void fake_addr(const fake *f, char *buf, size_t n)
{
    snprintf(buf, n, "127.0.0.1:%u", f->port);
}

static void fake_drop(fake *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    f->in_len = 0;
}

static void fake_close(fake *f)
{
    fake_drop(f);
    if (f->lfd >= 0)
        close(f->lfd);
    f->lfd = -1;
    free(f->in);
    free(f->frame);
    f->in = NULL;
    f->frame = NULL;
}

/* fake_accept waits for the worker's next connection; replaces the current one. */
static void fake_accept(fake *f)
{
    struct pollfd p = {.fd = f->lfd, .events = POLLIN};

    fake_drop(f);
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(f->fd >= 0);
    f->answered_stop = 0;
}

/* fake_read reads one frame: 1 when *m is filled, 0 on timeout, -1 at EOF. */
static int fake_read(fake *f, proto_msg *m, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;

    for (;;) {
        uint32_t blen = 0;
        int rc = f->in_len > 0 ? proto_frame_check(f->in, f->in_len, PROTO_MAX_BODY_DEFAULT, &blen)
                               : PROTO_NEED_MORE;
        struct pollfd p = {.fd = f->fd, .events = POLLIN};
        int64_t left;
        ssize_t n;

        assert_true(rc == PROTO_OK || rc == PROTO_NEED_MORE);
        if (rc == PROTO_OK) {
            free(f->frame);
            f->frame = malloc(blen);
            assert_non_null(f->frame);
            memcpy(f->frame, f->in + PROTO_LEN_PREFIX, blen);
            f->frame_len = blen;
            memmove(f->in, f->in + PROTO_LEN_PREFIX + blen, f->in_len - PROTO_LEN_PREFIX - blen);
            f->in_len -= PROTO_LEN_PREFIX + blen;
            assert_int_equal(proto_msg_decode(f->frame, blen, m), PROTO_OK);
            if (m->type == PROTO_STOP && !f->answered_stop) {
                /* like taskpushd: a worker's STOP is answered with STOP */
                static const uint8_t stop[] = {0, 0, 0, 1, PROTO_STOP};
                assert_int_equal(write(f->fd, stop, sizeof stop), (ssize_t)sizeof stop);
                f->answered_stop = 1;
            }
            return 1;
        }
        left = deadline - now_ms();
        if (left <= 0)
            return 0;
        if (poll(&p, 1, (int)left) == 0)
            return 0;
        if (f->in_cap - f->in_len < 65536) {
            f->in_cap = f->in_cap * 2 + 65536;
            f->in = realloc(f->in, f->in_cap);
            assert_non_null(f->in);
        }
        n = read(f->fd, f->in + f->in_len, f->in_cap - f->in_len);
        if (n <= 0)
            return -1; /* EOF, or a reset */
        f->in_len += (size_t)n;
    }
}

/* fake_next reads the next frame that is not a HEARTBEAT. */
static int fake_next(fake *f, proto_msg *m, int timeout_ms)
{
    int rc;

    do
        rc = fake_read(f, m, timeout_ms);
    while (rc == 1 && m->type == PROTO_HEARTBEAT);
    return rc;
}

/* fake_expect reads the next non-HEARTBEAT frame and checks its type. */
static void fake_expect(fake *f, proto_msg *m, uint8_t type)
{
    int rc = fake_next(f, m, WAIT_MS);

    if (rc != 1)
        fail_msg("expected a %s frame, got %s", proto_type_name(type), rc == 0 ? "nothing" : "EOF");
    if (m->type != type)
        fail_msg("expected a %s frame, got %s", proto_type_name(type), proto_type_name(m->type));
}

/* fake_expect_eof skips frames until the worker closes; returns how many
 * frames of type `count_type` went by. */
static int fake_expect_eof(fake *f, uint8_t count_type)
{
    proto_msg m;
    int n = 0;
    int rc;

    while ((rc = fake_read(f, &m, WAIT_MS)) == 1)
        if (m.type == count_type)
            n++;
    if (rc != -1)
        fail_msg("the worker did not close the connection");
    return n;
}

static void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;

    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

        if (w < 0 && errno == EINTR)
            continue;
        assert_true(w > 0);
        b += w;
        n -= (size_t)w;
    }
}

static void fake_send(fake *f, const proto_msg *m)
{
    size_t size = proto_msg_size(m);
    uint8_t *buf = malloc(size);

    assert_true(size > 0);
    assert_non_null(buf);
    assert_int_equal(proto_msg_encode(m, buf, size), size);
    send_all(f->fd, buf, size);
    free(buf);
}

static void fake_send_welcome(fake *f, uint16_t version, uint32_t hb_ms, uint32_t max_body)
{
    proto_msg m = {.type = PROTO_WELCOME};

    m.u.welcome.version = version;
    m.u.welcome.heartbeat_ms = hb_ms;
    m.u.welcome.max_body = max_body;
    m.u.welcome.server.ptr = (const uint8_t *)"fake 1.0";
    m.u.welcome.server.len = 8;
    fake_send(f, &m);
}

/* fake_handshake accepts the next connection, checks HELLO and answers WELCOME
 * (heartbeat hb_ms, 0: none). */
static void fake_handshake(fake *f, uint32_t hb_ms, uint32_t max_body)
{
    proto_msg m;

    fake_accept(f);
    fake_expect(f, &m, PROTO_HELLO);
    fake_send_welcome(f, PROTO_VERSION, hb_ms, max_body);
}

static void fake_send_task_full(fake *f, uint64_t id, uint32_t epoch, uint32_t attempt,
                                uint32_t timeout_ms, uint8_t prio, const char *type,
                                const void *payload, size_t len)
{
    proto_msg m = {.type = PROTO_TASK};

    m.u.task.task_id = id;
    m.u.task.epoch = epoch;
    m.u.task.attempt = attempt;
    m.u.task.timeout_ms = timeout_ms;
    m.u.task.priority = prio;
    m.u.task.type.ptr = (const uint8_t *)type;
    m.u.task.type.len = strlen(type);
    m.u.task.payload.ptr = payload;
    m.u.task.payload.len = len;
    fake_send(f, &m);
}

static void fake_send_task(fake *f, uint64_t id, const char *type, const char *payload)
{
    fake_send_task_full(f, id, 7, 1, 60000, 1, type, payload, strlen(payload));
}

static void fake_send_bare(fake *f, uint8_t type)
{
    proto_msg m = {.type = type};

    fake_send(f, &m);
}

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

static tp_worker *new_worker(const char *addresses, unsigned capacity, unsigned threads)
{
    tp_worker_options o;
    tp_error err;
    tp_worker *w;

    tp_worker_options_init(&o);
    o.addresses = addresses;
    o.name = "test-worker";
    o.capacity = capacity;
    o.threads = threads;
    o.reconnect_min_ms = 5;
    o.reconnect_max_ms = 50;
    o.connect_timeout_ms = 3000;
    o.log_level = TP_LOG_DEBUG;
    o.log = verbose() ? test_log : NULL;
    w = tp_worker_new(&o, &err);
    if (w == NULL)
        fail_msg("tp_worker_new: %s", err.text);
    return w;
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

static tp_worker_stats stats_of(tp_worker *w)
{
    tp_worker_stats s;

    assert_int_equal(tp_worker_get_stats(w, &s, sizeof(s)), 0);
    return s;
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
/* Pure checks                                                         */
/* ================================================================== */

static void test_options_defaults(void **state)
{
    tp_worker_options o;
    tp_worker *w;
    tp_error err;

    (void)state;
    memset(&o, 0xAB, sizeof(o));
    tp_worker_options_init(&o);
    assert_int_equal(o.version, TP_OPTIONS_VERSION);
    assert_int_equal(o.capacity, 1);
    assert_int_equal(o.threads, 0);
    assert_true(o.reconnect_min_ms >= 1 && o.reconnect_min_ms <= o.reconnect_max_ms);
    assert_true(o.connect_timeout_ms > 0);
    assert_int_equal(o.log_level, TP_LOG_INFO);
    assert_null(o.addresses);
    assert_null(o.name);
    assert_null(o.token);
    assert_null(o.log);

    o.addresses = "localhost:7070";
    w = tp_worker_new(&o, &err);
    assert_non_null(w);
    assert_int_equal(err.code, TP_OK);
    tp_worker_free(w);
    tp_worker_free(NULL);
}

static void expect_bad_options(const tp_worker_options *o, const char *needle)
{
    tp_error err;
    tp_worker *w = tp_worker_new(o, &err);

    if (w != NULL) {
        tp_worker_free(w);
        fail_msg("options accepted, expected a complaint about '%s'", needle);
    }
    assert_int_equal(err.code, TP_EINVAL);
    if (strstr(err.text, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", err.text, needle);
}

static void test_options_invalid(void **state)
{
    tp_worker_options o;
    char long_name[TP_MAX_NAME_LEN + 2];
    char long_token[TP_MAX_TOKEN_LEN + 2];

    (void)state;
    expect_bad_options(NULL, "NULL");
    memset(&o, 0, sizeof(o));
    o.addresses = "h:1";
    expect_bad_options(&o, "version");

#define BAD(field, value, needle)                                                                  \
    do {                                                                                           \
        tp_worker_options_init(&o);                                                                \
        o.addresses = "h:1";                                                                       \
        o.field = value;                                                                           \
        expect_bad_options(&o, needle);                                                            \
    } while (0)
    BAD(addresses, NULL, "address");
    BAD(addresses, "", "address");
    BAD(addresses, "nohostport", "HOST:PORT");
    BAD(capacity, 0, "capacity");
    BAD(capacity, TP_MAX_CAPACITY + 1, "capacity");
    BAD(threads, TP_MAX_THREADS + 1, "threads");
    BAD(reconnect_min_ms, 0, "reconnect");
    BAD(reconnect_max_ms, 50, "reconnect"); /* below the default min of 100 */
    BAD(connect_timeout_ms, 0, "timeout");
    BAD(log_level, 7, "log level");
    BAD(name, "", "name");
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    BAD(name, long_name, "name");
    memset(long_token, 't', sizeof(long_token) - 1);
    long_token[sizeof(long_token) - 1] = '\0';
    BAD(token, long_token, "token");
#undef BAD
    /* The error struct is optional. */
    tp_worker_options_init(&o);
    assert_null(tp_worker_new(&o, NULL));
}

/* Options of version 1 (built against the header before TLS): the library
 * reads no byte past log_arg (a heap block of exactly that size, so ASan sees
 * an over-read), and TLS stays off. */
static void test_options_version1(void **state)
{
    size_t v1 = offsetof(tp_worker_options, tls);
    tp_worker_options full;
    tp_worker_options *o = malloc(v1);
    tp_worker *w;
    tp_error err;

    (void)state;
    assert_non_null(o);
    tp_worker_options_init(&full);
    full.version = 1;
    full.addresses = "127.0.0.1:7070";
    memcpy(o, &full, v1);
    w = tp_worker_new(o, &err);
    free(o);
    if (w == NULL)
        fail_msg("version 1 options refused: %s", err.text);
    assert_null(w->tls_ctx);
    assert_int_equal(w->opts.tls, 0);
    tp_worker_free(w);
}

/* TLS options: files named only with tls, certificate and key together, and
 * a file that cannot be read is an error of tp_worker_new (not a retry loop). */
static void test_options_tls(void **state)
{
    tp_worker_options o;
    tp_worker *w;
    tp_error err;
    char junk[256];
    int fd;

    (void)state;
    /* A readable file that is no PEM. */
    snprintf(junk, sizeof(junk), "%s/test_client_junk_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    fd = mkstemp(junk);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a certificate\n", 18), 18);
    close(fd);
#define BAD_TLS(tls_on, ca, cert, key, needle)                                                         do {                                                                                                   tp_worker_options_init(&o);                                                                        o.addresses = "h:1";                                                                               o.tls = (tls_on);                                                                                  o.tls_ca_file = (ca);                                                                              o.tls_cert_file = (cert);                                                                          o.tls_key_file = (key);                                                                            expect_bad_options(&o, needle);                                                                } while (0)
    BAD_TLS(0, junk, NULL, NULL, "need tls");
    BAD_TLS(1, NULL, junk, NULL, "go together");
    BAD_TLS(1, NULL, NULL, junk, "go together");
    BAD_TLS(1, "/nonexistent/ca.pem", NULL, NULL, "/nonexistent/ca.pem");
    BAD_TLS(1, junk, NULL, NULL, "no usable PEM");
    BAD_TLS(1, NULL, junk, junk, "not a usable PEM certificate");
#undef BAD_TLS
    unlink(junk);
    /* tls alone trusts the system's CAs. */
    tp_worker_options_init(&o);
    o.addresses = "h:1";
    o.tls = 1;
    w = tp_worker_new(&o, &err);
    if (w == NULL)
        fail_msg("tls with the system's CAs refused: %s", err.text);
    assert_non_null(w->tls_ctx);
    tp_worker_free(w);
}

static void test_addr_parse_valid(void **state)
{
    tpi_addr *a = NULL;
    size_t n = 0;
    tp_error err;

    (void)state;
    assert_int_equal(tpi_addr_parse("127.0.0.1:7070", &a, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(a[0].host, "127.0.0.1");
    assert_string_equal(a[0].port, "7070");
    free(a);

    assert_int_equal(tpi_addr_parse("db1.example:1, [::1]:65535 ,host-2:08", &a, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(a[0].host, "db1.example");
    assert_string_equal(a[0].port, "1");
    assert_string_equal(a[1].host, "::1");
    assert_string_equal(a[1].port, "65535");
    assert_string_equal(a[2].host, "host-2");
    assert_string_equal(a[2].port, "8");
    free(a);
}

static void test_addr_parse_invalid(void **state)
{
    static const char *const bad[] = {
        "",          "host",    "host:",  ":80",     "host:0",      "host:65536",
        "host:12ab", "host:-1", "::1:80", "[::1]80", "[::1]",       "[]:80",
        "a:1,,b:2",  "a:1,",    ",a:1",   " , ",     "host:123456",
    };
    char many[TP_MAX_ADDRESSES * 8 + 16] = "";

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tpi_addr *a = NULL;
        size_t n = 0;
        tp_error err = {0, ""};

        if (tpi_addr_parse(bad[i], &a, &n, &err) != TP_EINVAL) {
            free(a);
            fail_msg("address list '%s' was accepted", bad[i]);
        }
        assert_int_equal(err.code, TP_EINVAL);
        assert_true(err.text[0] != '\0');
        assert_null(a);
    }
    for (unsigned i = 0; i <= TP_MAX_ADDRESSES; i++)
        strcat(many, i == 0 ? "h:1" : ",h:1");
    {
        tpi_addr *a = NULL;
        size_t n = 0;

        assert_int_equal(tpi_addr_parse(many, &a, &n, NULL), TP_EINVAL);
        assert_null(a);
    }
}

static int noop_handler(tp_task *t, void *arg)
{
    (void)t;
    (void)arg;
    return TP_SUCCESS;
}

static void test_add_type_and_run_checks(void **state)
{
    tp_worker *w = new_worker("127.0.0.1:1", 1, 0);
    char long_type[TP_MAX_TYPE_LEN + 2];
    char name[16];

    (void)state;
    /* A worker without types cannot run. */
    assert_int_equal(tp_worker_run(w), TP_EINVAL);
    assert_int_equal(tp_worker_run(NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(NULL, "a", noop_handler, NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(w, NULL, noop_handler, NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(w, "", noop_handler, NULL), TP_EINVAL);
    assert_int_equal(tp_worker_add_type(w, "a", NULL, NULL), TP_EINVAL);
    memset(long_type, 'x', sizeof(long_type) - 1);
    long_type[sizeof(long_type) - 1] = '\0';
    assert_int_equal(tp_worker_add_type(w, long_type, noop_handler, NULL), TP_ERANGE);
    long_type[TP_MAX_TYPE_LEN] = '\0'; /* exactly the limit */
    assert_int_equal(tp_worker_add_type(w, long_type, noop_handler, NULL), 0);
    assert_int_equal(tp_worker_add_type(w, long_type, noop_handler, NULL), TP_EEXIST);
    for (unsigned i = 1; i < TP_MAX_TYPES; i++) {
        snprintf(name, sizeof(name), "t%u", i);
        assert_int_equal(tp_worker_add_type(w, name, noop_handler, NULL), 0);
    }
    assert_int_equal(tp_worker_add_type(w, "one-too-many", noop_handler, NULL), TP_ERANGE);
    assert_int_equal(tp_worker_get_stats(w, NULL, 0), TP_EINVAL);
    assert_int_equal(tp_worker_get_stats(NULL, NULL, 0), TP_EINVAL);
    tp_worker_free(w);
}

static void test_strerror_and_version(void **state)
{
    static const int codes[] = {TP_OK,     TP_EINVAL, TP_ENOMEM,  TP_ESYS, TP_EBUSY,
                                TP_EEXIST, TP_ERANGE, TP_ETOOBIG, TP_EGONE};

    (void)state;
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *s = tp_strerror(codes[i]);

        assert_non_null(s);
        assert_string_not_equal(s, "unknown error");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, tp_strerror(codes[j]));
    }
    assert_string_equal(tp_strerror(-1000), "unknown error");
    assert_string_equal(tp_strerror(5), "unknown error");
    assert_string_equal(tp_version(), TASKPUSH_VERSION);
}

static void test_backoff(void **state)
{
    uint64_t rng = 12345;

    (void)state;
    for (int round = 0; round < 200; round++) {
        for (unsigned failures = 0; failures < 40; failures++) {
            uint64_t full = 100;
            uint32_t d;

            for (unsigned i = 0; i < failures && full < 5000; i++)
                full *= 2;
            if (full > 5000)
                full = 5000;
            d = tpi_backoff_ms(&rng, 100, 5000, failures);
            assert_true(d >= full - full / 2 && d <= full);
        }
    }
    /* The jitter really varies. */
    {
        uint32_t first = tpi_backoff_ms(&rng, 1000, 1000, 0);
        int differs = 0;

        for (int i = 0; i < 50 && !differs; i++)
            differs = tpi_backoff_ms(&rng, 1000, 1000, 0) != first;
        assert_true(differs);
    }
    assert_true(tpi_backoff_ms(&rng, 1, 1, 0) == 1);
}

static void test_stop_before_run(void **state)
{
    tp_worker *w = new_worker("127.0.0.1:1", 1, 2);

    (void)state;
    assert_int_equal(tp_worker_add_type(w, "a", noop_handler, NULL), 0);
    tp_worker_stop(w);
    assert_int_equal(tp_worker_run(w), 0);
    assert_int_equal(stats_of(w).connect_attempts, 0);
    tp_worker_free(w);
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
    /* The held delivery is abandoned, and the worker comes back. */
    assert_true(hctx_wait(&s.h, &s.h.finished, 1));
    assert_int_equal(s.h.saw_cancel, 1);
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
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

static void test_lost_connection_drops_outcome(void **state)
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
    fake_drop(&s.f); /* the dispatcher goes away */
    assert_true(hctx_wait(&s.h, &s.h.finished, 1));
    assert_int_equal(s.h.saw_cancel, 1); /* the handler learnt its work is moot */
    assert_true(WAIT_STAT(s.r.w, tasks_dropped, 1));
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    /* The next DONE on the new connection is the new task's, not the old one. */
    s.h.wait_cancel = 0;
    fake_send_task(&s.f, 2, "alpha", "y");
    fake_expect(&s.f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 2);
    assert_int_equal(stats_of(s.r.w).tasks_completed, 1);
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

static void test_inline_batch_and_yield(void **state)
{
    enum { N = 1000 };
    setup s;
    proto_msg m;
    uint8_t *frames;
    size_t off = 0;
    size_t cap = (size_t)N * 64;
    static int seen[N + 1];

    (void)state;
    memset(seen, 0, sizeof(seen));
    hctx_init(&s.h);
    setup_start(&s, N, 0); /* handlers inline on the I/O thread */
    fake_handshake(&s.f, 0, PROTO_MAX_BODY_DEFAULT);
    frames = malloc(cap);
    assert_non_null(frames);
    for (uint64_t id = 1; id <= N; id++) {
        proto_msg t = {.type = PROTO_TASK};
        char payload[16];

        snprintf(payload, sizeof(payload), "p%llu", (unsigned long long)id);
        t.u.task.task_id = id;
        t.u.task.attempt = 1;
        t.u.task.type.ptr = (const uint8_t *)"alpha";
        t.u.task.type.len = 5;
        t.u.task.payload.ptr = (const uint8_t *)payload;
        t.u.task.payload.len = strlen(payload);
        off += proto_msg_encode(&t, frames + off, cap - off);
    }
    send_all(s.f.fd, frames, off); /* one burst: far more than one read's budget */
    free(frames);
    for (int i = 0; i < N; i++) {
        char want[16];

        fake_expect(&s.f, &m, PROTO_DONE);
        assert_true(m.u.done.task_id >= 1 && m.u.done.task_id <= N);
        seen[m.u.done.task_id]++;
        snprintf(want, sizeof(want), "p%llu", (unsigned long long)m.u.done.task_id);
        assert_int_equal(m.u.done.data.len, strlen(want));
        assert_memory_equal(m.u.done.data.ptr, want, strlen(want));
    }
    for (int id = 1; id <= N; id++)
        assert_int_equal(seen[id], 1);
    assert_true(stats_of(s.r.w).read_yields >= 1);
    assert_int_equal(stats_of(s.r.w).tasks_completed, N);
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
/* taskpush-worker: the command runner and the program                 */
/* ================================================================== */

static int never_kill(void *arg, char *why, size_t n)
{
    (void)arg;
    (void)why;
    (void)n;
    return 0;
}

static int kill_when_set(void *arg, char *why, size_t n)
{
    const int *flag = arg;

    if (*flag)
        snprintf(why, n, "asked to");
    return *flag;
}

static tpw_exec_req exec_req(const char *command, const void *input, size_t len)
{
    tpw_exec_req q;

    memset(&q, 0, sizeof(q));
    q.command = command;
    q.input = input;
    q.input_len = len;
    q.envp = environ;
    q.out_max = 8u << 20;
    q.err_max = 64;
    q.kill_grace_ms = 200;
    q.check_ms = 10;
    q.check = never_kill;
    return q;
}

/* run_exec runs a command with SIGPIPE blocked in this thread, as it is in
 * taskpush-worker's handler threads: a command that does not read its input
 * makes the write fail with EPIPE instead of killing the test. */
static int run_exec(const tpw_exec_req *q, tpw_exec_res *res)
{
    sigset_t pipe_set;
    sigset_t old;
    struct timespec zero = {0, 0};
    int rc;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    rc = tpw_exec_run(q, res);
    while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE)
        ;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static void test_exec_large_io(void **state)
{
    size_t len = 3u << 20; /* far beyond a pipe buffer, both ways */
    uint8_t *in = malloc(len);
    tpw_exec_req q;
    tpw_exec_res res;

    (void)state;
    assert_non_null(in);
    for (size_t i = 0; i < len; i++)
        in[i] = (uint8_t)(i * 7);
    q = exec_req("cat; printf 'line1\\n' >&2; head -c 200 /dev/zero | tr '\\0' e >&2", in, len);
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0);
    assert_int_equal(res.out_len, len);
    assert_memory_equal(res.out, in, len);
    assert_int_equal(res.out_truncated, 0);
    /* Only the tail of stderr is kept. */
    assert_int_equal(res.err_len, 64);
    for (size_t i = 0; i < 64; i++)
        assert_int_equal(res.err[i], 'e');
    tpw_exec_res_free(&res);

    /* A capped stdout, and a command that never reads its input. */
    q = exec_req("head -c 100000 /dev/zero; exit 65", in, len);
    q.out_max = 1000;
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 65);
    assert_int_equal(res.out_len, 1000);
    assert_int_equal(res.out_truncated, 1);
    tpw_exec_res_free(&res);
    free(in);
}

static void test_exec_env_and_status(void **state)
{
    char *envp[] = {"TASKPUSH_TASK_ID=12", "PATH=/usr/bin:/bin", NULL};
    tpw_exec_req q = exec_req("echo \"id=$TASKPUSH_TASK_ID\"; kill -USR1 $$", NULL, 0);
    tpw_exec_res res;

    (void)state;
    q.envp = envp;
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGUSR1);
    assert_string_equal(res.out, "id=12\n");
    assert_int_equal(res.killed, 0);
    tpw_exec_res_free(&res);
}

static int proc_gone(pid_t pid)
{
    char path[64];
    char buf[512];
    FILE *f;
    size_t n;
    char *close_paren;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return 1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    close_paren = strrchr(buf, ')');
    return close_paren != NULL && close_paren[1] == ' ' && close_paren[2] == 'Z'; /* a zombie */
}

static void test_exec_kills_process_group(void **state)
{
    int flag = 0;
    tpw_exec_req q;
    tpw_exec_res res;
    int64_t start;
    pid_t bg;
    int64_t end;

    (void)state;
    /* The background sleep writes its pid, then holds stdout open; the
     * foreground one ignores SIGTERM, so SIGKILL must follow. */
    q = exec_req("trap '' TERM; sleep 30 & echo $!; sleep 30", NULL, 0);
    q.check = kill_when_set;
    q.check_arg = &flag;
    flag = 1;
    start = now_ms();
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(now_ms() - start < WAIT_MS);
    assert_int_equal(res.killed, 1);
    assert_string_equal(res.why, "asked to");
    assert_true(WIFSIGNALED(res.status));
    bg = (pid_t)atol(res.out != NULL ? res.out : "0");
    tpw_exec_res_free(&res);
    if (bg > 0) {
        end = now_ms() + WAIT_MS;
        while (!proc_gone(bg) && now_ms() < end)
            poll(NULL, 0, 5);
        assert_true(proc_gone(bg));
    }

    /* A command that exits while a background child keeps the pipes open
     * does not hang the runner. */
    q = exec_req("sleep 30 & echo hi", NULL, 0);
    start = now_ms();
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(now_ms() - start < WAIT_MS);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0);
    assert_string_equal(res.out, "hi\n");
    tpw_exec_res_free(&res);
}

static const char *worker_bin(void)
{
    const char *bin = getenv("TASKPUSH_WORKER_BIN");

    return bin != NULL && access(bin, X_OK) == 0 ? bin : NULL;
}

/* run_cli runs the program with args (a shell word list) and captures it. */
static void run_cli(const char *args, tpw_exec_res *res)
{
    char cmd[1024];
    tpw_exec_req q;

    snprintf(cmd, sizeof(cmd), "exec '%s' %s", worker_bin(), args);
    q = exec_req(cmd, NULL, 0);
    q.err_max = 4096;
    assert_int_equal(run_exec(&q, res), 0);
    assert_true(WIFEXITED(res->status));
}

static void test_worker_cli(void **state)
{
    static const char *const bad[] = {
        "",
        "--type a --exec true",
        "--connect 127.0.0.1:1 --exec true",
        "--connect 127.0.0.1:1 --type a",
        "--connect 127.0.0.1:1 --type a --exec true --concurrency 0",
        "--connect 127.0.0.1:1 --type a --exec true --concurrency many",
        "--connect 127.0.0.1:1 --type a --exec true --bogus",
        "--connect 127.0.0.1:1 --type a --exec true --log-level loud",
        "--connect nohost --type a --exec true",
        "--connect 127.0.0.1:1 --type a,,b --exec true",
        "--connect 127.0.0.1:1 --type a --exec true --token-file /nonexistent/token",
        "--connect 127.0.0.1:1 --type a --exec true extra",
        "--connect",
    };
    tpw_exec_res res;

    (void)state;
    if (worker_bin() == NULL)
        skip();
    run_cli("--help", &res);
    assert_int_equal(WEXITSTATUS(res.status), 0);
    assert_non_null(strstr(res.out, "Usage: taskpush-worker"));
    assert_non_null(strstr(res.out, "--concurrency"));
    tpw_exec_res_free(&res);
    run_cli("--version", &res);
    assert_int_equal(WEXITSTATUS(res.status), 0);
    assert_non_null(strstr(res.out, TASKPUSH_VERSION));
    tpw_exec_res_free(&res);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        run_cli(bad[i], &res);
        if (WEXITSTATUS(res.status) != 2)
            fail_msg("'%s' exited %d, not 2", bad[i], WEXITSTATUS(res.status));
        assert_true(res.err_len > 0);
        assert_non_null(strstr(res.err, "--help")); /* a usage hint */
        assert_true(res.out_len == 0);
        tpw_exec_res_free(&res);
    }
}

/* The script the program runs: its first input line picks the behaviour. */
static const char worker_script[] =
    "read what rest; case $what in "
    "ok) echo \"id=$TASKPUSH_TASK_ID type=$TASKPUSH_TASK_TYPE attempt=$TASKPUSH_ATTEMPT "
    "rest=$rest\";; "
    "perm) echo 'bad input' >&2; exit 65;; "
    "fail) echo oops >&2; exit 3;; "
    "slow) : >\"$TP_TEST_MARKER\"; sleep 0.3; echo finished;; "
    "hang) sleep 30;; "
    "env) echo \"token=${TASKPUSH_TOKEN-unset}\";; "
    "esac";

/* The marker file the "slow" command creates when it starts. */
static char marker_path[64];

/* The last taskpush-worker started; kill_spawned() ends it after a test, so
 * that a failed assertion does not leave it running. */
static pid_t spawned_pid = -1;

static int kill_spawned(void **state)
{
    (void)state;
    if (spawned_pid > 0 && waitpid(spawned_pid, NULL, WNOHANG) == 0) {
        kill(spawned_pid, SIGKILL);
        waitpid(spawned_pid, NULL, 0);
    }
    spawned_pid = -1;
    return 0;
}

/* spawn_worker starts taskpush-worker against f; extra_arg (with its value
 * extra_val) and extra_env are added when not NULL. */
static pid_t spawn_worker_with(const fake *f, const char *concurrency, const char *extra_arg,
                               const char *extra_val, const char *extra_env)
{
    char addr[64];
    char *argv[] = {"taskpush-worker",
                    "--connect",
                    addr,
                    "--type",
                    "echo,other",
                    "--exec",
                    (char *)worker_script,
                    "--concurrency",
                    (char *)concurrency,
                    "--name",
                    "cli-worker",
                    "--log-level",
                    verbose() ? "debug" : "error",
                    "--kill-grace-ms",
                    "200",
                    (char *)extra_arg,
                    (char *)extra_val,
                    NULL};
    pid_t pid;
    char marker_var[96];
    size_t n = 0;
    char **envp;
    posix_spawn_file_actions_t fa;

    for (char **e = environ; *e != NULL; e++)
        n++;
    envp = calloc(n + 3, sizeof(*envp));
    assert_non_null(envp);
    n = 0;
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, "TASKPUSH_TOKEN=", 15) != 0)
            envp[n++] = *e;
    snprintf(marker_path, sizeof(marker_path), "/tmp/tp-test-marker.%ld", (long)getpid());
    unlink(marker_path);
    snprintf(marker_var, sizeof(marker_var), "TP_TEST_MARKER=%s", marker_path);
    envp[n++] = marker_var;
    if (extra_env != NULL)
        envp[n++] = (char *)extra_env;
    fake_addr(f, addr, sizeof(addr));
    /* Its stdout must not mix with our TAP output. */
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    assert_int_equal(posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0),
                     0);
    assert_int_equal(posix_spawn(&pid, worker_bin(), &fa, NULL, argv, envp), 0);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    spawned_pid = pid;
    return pid;
}

static pid_t spawn_worker(const fake *f, const char *concurrency)
{
    return spawn_worker_with(f, concurrency, NULL, NULL, NULL);
}

static int wait_exit(pid_t pid)
{
    int64_t end = now_ms() + WAIT_MS;
    int status = 0;

    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);

        if (r == pid) {
            if (pid == spawned_pid)
                spawned_pid = -1;
            return status;
        }
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("taskpush-worker did not exit");
        }
        poll(NULL, 0, 5);
    }
}

static void test_worker_program_tasks(void **state)
{
    fake f;
    proto_msg m;
    pid_t pid;
    proto_msg c = {.type = PROTO_CANCEL};
    const char *ok_out = "id=11 type=echo attempt=2 rest=hello world\n";

    (void)state;
    if (worker_bin() == NULL)
        skip();
    fake_listen(&f);
    pid = spawn_worker(&f, "2");
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.capacity, 2);
    assert_int_equal(m.u.hello.ntypes, 2);
    assert_memory_equal(m.u.hello.types[0].ptr, "echo", 4);
    assert_memory_equal(m.u.hello.types[1].ptr, "other", 5);
    assert_memory_equal(m.u.hello.name.ptr, "cli-worker", 10);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);

    fake_send_task_full(&f, 11, 1, 2, 60000, 1, "echo", "ok hello world\n", 15);
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 11);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(m.u.done.data.len, strlen(ok_out));
    assert_memory_equal(m.u.done.data.ptr, ok_out, strlen(ok_out));

    fake_send_task(&f, 12, "echo", "perm\n");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_PERM);
    assert_int_equal(m.u.done.data.len, 10);
    assert_memory_equal(m.u.done.data.ptr, "bad input\n", 10);

    fake_send_task(&f, 13, "other", "fail\n");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
    assert_memory_equal(m.u.done.data.ptr, "oops\n", 5);

    /* A task that outlives its lease is killed, and reported as a failure. */
    fake_send_task_full(&f, 14, 1, 1, 300, 1, "echo", "hang\n", 5);
    /* One cancelled by the dispatcher, at the same time (concurrency 2). */
    fake_send_task_full(&f, 15, 1, 1, 60000, 1, "echo", "hang\n", 5);
    c.u.cancel.task_id = 15;
    c.u.cancel.epoch = 1;
    c.u.cancel.attempt = 1;
    fake_send(&f, &c);
    for (int i = 0; i < 2; i++) {
        fake_expect(&f, &m, PROTO_DONE);
        assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
        if (m.u.done.task_id == 14)
            assert_non_null(memmem(m.u.done.data.ptr, m.u.done.data.len, "timed out", 9));
        else if (m.u.done.task_id == 15)
            assert_non_null(memmem(m.u.done.data.ptr, m.u.done.data.len, "cancelled", 9));
        else
            fail_msg("unexpected DONE for task %llu", (unsigned long long)m.u.done.task_id);
    }

    kill(pid, SIGTERM);
    fake_expect(&f, &m, PROTO_STOP);
    fake_expect_eof(&f, PROTO_DONE);
    {
        int status = wait_exit(pid);

        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    fake_close(&f);
}

static void test_worker_program_sigterm_finishes(void **state)
{
    fake f;
    proto_msg m;
    pid_t pid;
    int status;

    (void)state;
    if (worker_bin() == NULL)
        skip();
    fake_listen(&f);
    pid = spawn_worker(&f, "1");
    fake_handshake(&f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&f, 21, "echo", "slow\n");
    /* Once the command runs (it creates the marker), SIGTERM: the STOP must
     * come first, and the DONE of the task held after it. */
    {
        int64_t end = now_ms() + WAIT_MS;

        while (access(marker_path, F_OK) != 0 && now_ms() < end)
            poll(NULL, 0, 2);
        assert_int_equal(access(marker_path, F_OK), 0);
        unlink(marker_path);
    }
    kill(pid, SIGTERM);
    fake_expect(&f, &m, PROTO_STOP);
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 21);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_memory_equal(m.u.done.data.ptr, "finished\n", 9);
    fake_expect_eof(&f, PROTO_DONE);
    status = wait_exit(pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    fake_close(&f);
}

/* The secret comes from --token-file (trailing newline dropped) or from
 * TASKPUSH_TOKEN, and the commands never see it. */
static void test_worker_program_token(void **state)
{
    fake f;
    proto_msg m;
    pid_t pid;
    char path[64];
    FILE *tf;
    int status;

    (void)state;
    if (worker_bin() == NULL)
        skip();
    snprintf(path, sizeof(path), "/tmp/tp-test-token.%ld", (long)getpid());
    tf = fopen(path, "w");
    assert_non_null(tf);
    fputs("file-secret\n", tf);
    fclose(tf);
    fake_listen(&f);

    pid = spawn_worker_with(&f, "1", "--token-file", path, "TASKPUSH_TOKEN=env-secret");
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.token.len, 11);
    assert_memory_equal(m.u.hello.token.ptr, "file-secret", 11); /* the flag wins */
    kill(pid, SIGTERM);
    status = wait_exit(pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    pid = spawn_worker_with(&f, "1", NULL, NULL, "TASKPUSH_TOKEN=env-secret");
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.token.len, 10);
    assert_memory_equal(m.u.hello.token.ptr, "env-secret", 10);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&f, 31, "echo", "env\n");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(m.u.done.data.len, 12);
    assert_memory_equal(m.u.done.data.ptr, "token=unset\n", 12);
    kill(pid, SIGTERM);
    status = wait_exit(pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fake_close(&f);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_defaults),
        cmocka_unit_test(test_options_invalid),
        cmocka_unit_test(test_options_version1),
        cmocka_unit_test(test_options_tls),
        cmocka_unit_test(test_addr_parse_valid),
        cmocka_unit_test(test_addr_parse_invalid),
        cmocka_unit_test(test_add_type_and_run_checks),
        cmocka_unit_test(test_strerror_and_version),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_stop_before_run),
        cmocka_unit_test(test_hello_fields),
        cmocka_unit_test(test_task_roundtrip),
        cmocka_unit_test(test_outcomes),
        cmocka_unit_test(test_result_limits),
        cmocka_unit_test(test_capacity_threads),
        cmocka_unit_test(test_fewer_threads_than_capacity),
        cmocka_unit_test(test_over_capacity_closes),
        cmocka_unit_test(test_extend),
        cmocka_unit_test(test_extend_inline),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_heartbeats),
        cmocka_unit_test(test_silent_dispatcher_is_lost),
        cmocka_unit_test(test_garbage_reconnects),
        cmocka_unit_test(test_handshake_refused),
        cmocka_unit_test(test_address_failover),
        cmocka_unit_test(test_lost_connection_drops_outcome),
        cmocka_unit_test(test_graceful_stop),
        cmocka_unit_test(test_stop_twice_abandons),
        cmocka_unit_test(test_dispatcher_stop),
        cmocka_unit_test(test_inline_batch_and_yield),
        cmocka_unit_test(test_two_workers_in_one_process),
        cmocka_unit_test(test_sigpipe_safe),
        cmocka_unit_test(test_exec_large_io),
        cmocka_unit_test(test_exec_env_and_status),
        cmocka_unit_test(test_exec_kills_process_group),
        cmocka_unit_test(test_worker_cli),
        cmocka_unit_test_teardown(test_worker_program_tasks, kill_spawned),
        cmocka_unit_test_teardown(test_worker_program_sigterm_finishes, kill_spawned),
        cmocka_unit_test_teardown(test_worker_program_token, kill_spawned),
    };

    if (getenv("TP_TEST_FILTER") != NULL) /* e.g. TP_TEST_FILTER='test_exec*' */
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
