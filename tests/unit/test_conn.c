/* test_conn.c: the dispatcher's worker connection (dispatcher/conn.c) as a state
 * machine. One end of a socketpair goes to dsp_conn_accept on an offline server
 * (dsp_server_init_offline: the loop and timers, no database, no listener); the test
 * plays the worker on the other end, runs the loop without blocking until what it
 * waits for has happened, and checks the frames it gets back, the counters, and that
 * the connection is closed and freed (LeakSanitizer in the ASan build). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

#include "clock.h"
#include "config.h"
#include "conn.h"
#include "dispatch.h"
#include "proto.h"
#include "server.h"

/* The dispatcher's limit before HELLO (conn.c): the largest HELLO body. */
#define PRE_HELLO_MAX_BODY ((uint32_t)(PROTO_MAX_HEAD - PROTO_LEN_PREFIX))

/* Loop passes a step may take: the loop never blocks, so this bounds work, not time. */
#define MAX_PASSES 100000

/* A heartbeat long enough that no timer of the connection fires during a test. */
#define HEARTBEAT_MS 600000

typedef struct fixture {
    dsp_config cfg;
    dsp_server srv;
    int peer;           /* the worker's end */
    uint8_t in[262144]; /* what the server sent */
    size_t nin, parsed; /* bytes received; bytes already taken as frames */
    bool eof;           /* the server closed its end */
} fixture;

static int setup(void **state)
{
    static char *argv[] = {"taskpushd",   "--db",  "mysql://test@localhost/test",
                           "--log-level", "error", "--heartbeat-ms",
                           "600000",      NULL};
    fixture *f = calloc(1, sizeof *f);
    char err[256];
    int sv[2];
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};

    assert_non_null(f);
    unsetenv("TASKPUSH_TOKEN");
    assert_int_equal(dsp_config_load(&f->cfg, 7, argv, stderr, err, sizeof err), DSP_CONFIG_OK);
    assert_int_equal(f->cfg.heartbeat_ms, HEARTBEAT_MS);
    assert_int_equal(dsp_server_init_offline(&f->srv, &f->cfg), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dsp_conn_accept(&f->srv, sv[0], (const struct sockaddr *)&peer,
                    (int)sizeof peer); /* owns sv[0] */
    assert_int_equal(f->srv.conns.n, 1);
    assert_int_equal(f->srv.conns.list->state, DSP_CONN_WANT_HELLO);
    f->peer = sv[1];
    assert_int_equal(evutil_make_socket_nonblocking(f->peer), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    close(f->peer);
    dsp_server_free(&f->srv);
    dsp_config_free(&f->cfg);
    free(f);
    return 0;
}

static void send_bytes(fixture *f, const void *p, size_t n)
{
    assert_int_equal(send(f->peer, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void send_msg(fixture *f, const proto_msg *m)
{
    uint8_t buf[4096];
    size_t n = proto_msg_encode(m, buf, sizeof buf);
    assert_true(n > 0);
    send_bytes(f, buf, n);
}

static void send_hello(fixture *f, uint16_t version)
{
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = version;
    m.u.hello.capacity = 2;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"w1", 2};
    m.u.hello.ntypes = 1;
    m.u.hello.types[0] = (proto_bytes){(const uint8_t *)"resize", 6};
    send_msg(f, &m);
}

static void send_prefix(fixture *f, uint32_t body_len)
{
    const uint8_t p[PROTO_LEN_PREFIX] = {(uint8_t)(body_len >> 24), (uint8_t)(body_len >> 16),
                                         (uint8_t)(body_len >> 8), (uint8_t)body_len};
    send_bytes(f, p, sizeof p);
}

/* Whatever the server sent is taken in. */
static void take_in(fixture *f)
{
    while (!f->eof) {
        ssize_t n = recv(f->peer, f->in + f->nin, sizeof f->in - f->nin, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        assert_true(n >= 0);
        assert_true(f->nin + (size_t)n < sizeof f->in);
        f->nin += (size_t)n;
        f->eof = n == 0;
    }
}

/* One loop pass, then whatever the server sent is taken in. */
static void pump(fixture *f)
{
    event_base_loop(f->srv.base, EVLOOP_NONBLOCK);
    take_in(f);
}

/* next_frame runs the loop until the server has sent a whole frame, and decodes it
 * into *m (borrowing f->in). Returns false when the server closed first. */
static bool next_frame(fixture *f, proto_msg *m)
{
    for (int pass = 0; pass < MAX_PASSES; pass++) {
        uint32_t body_len = 0;
        int st = proto_frame_check(f->in + f->parsed, f->nin - f->parsed, PROTO_MAX_BODY_DEFAULT,
                                   &body_len);
        assert_true(st == PROTO_OK || st == PROTO_NEED_MORE);
        if (st == PROTO_OK) {
            assert_int_equal(proto_msg_decode(f->in + f->parsed + PROTO_LEN_PREFIX, body_len, m),
                             PROTO_OK);
            f->parsed += PROTO_LEN_PREFIX + (size_t)body_len;
            return true;
        }
        if (f->eof)
            return false;
        pump(f);
    }
    fail_msg("no frame and no close after %d loop passes", MAX_PASSES);
    return false;
}

/* expect_error: the next frame is ERROR with this code and text, then the server
 * closes the socket and frees the connection. */
static void expect_error_and_close(fixture *f, uint16_t code, const char *text)
{
    proto_msg m;
    assert_true(next_frame(f, &m));
    assert_int_equal(m.type, PROTO_ERROR);
    assert_int_equal(m.u.error.code, code);
    assert_int_equal(m.u.error.message.len, strlen(text));
    assert_memory_equal(m.u.error.message.ptr, text, strlen(text));
    assert_false(next_frame(f, &m)); /* nothing after ERROR: closed */
    assert_int_equal(f->srv.conns.n, 0);
    assert_null(f->srv.conns.list);
    assert_int_equal(f->srv.sched.nworkers, 0);
}

/* run_until_quiet runs the loop until the server has nothing left to do for now. */
static void run_until_quiet(fixture *f)
{
    for (int pass = 0; pass < 64; pass++)
        pump(f);
}

static void expect_welcome(fixture *f)
{
    proto_msg m;
    assert_true(next_frame(f, &m));
    assert_int_equal(m.type, PROTO_WELCOME);
    assert_int_equal(m.u.welcome.version, PROTO_VERSION);
    assert_int_equal(m.u.welcome.heartbeat_ms, HEARTBEAT_MS);
    assert_int_equal(m.u.welcome.max_body, (uint32_t)f->cfg.max_frame);
    assert_int_equal(f->srv.sched.nworkers, 1);
    assert_int_equal(f->srv.conns.list->state, DSP_CONN_ACTIVE);
}

/* HELLO, WELCOME; STOP, STOP; the worker closes: the connection is freed without an
 * ERROR, and counted as lost (an ACTIVE connection that ended). */
static void test_hello_stop_close(void **state)
{
    fixture *f = *state;
    proto_msg m;
    send_hello(f, PROTO_VERSION);
    expect_welcome(f);
    send_msg(f, &(proto_msg){.type = PROTO_STOP});
    assert_true(next_frame(f, &m));
    assert_int_equal(m.type, PROTO_STOP);
    assert_false(f->srv.conns.list->slots.accepting);
    assert_int_equal(shutdown(f->peer, SHUT_WR), 0);
    assert_false(next_frame(f, &m));
    assert_int_equal(f->srv.conns.n, 0);
    assert_int_equal(f->srv.sched.nworkers, 0);
    assert_int_equal(f->srv.stats.conns.accepted_total, 1);
    assert_int_equal(f->srv.stats.conns.frames_in_total, 2);
    assert_int_equal(f->srv.stats.conns.lost_total, 1);
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 0);
}

/* A worker that closes before HELLO gets no ERROR and is freed. */
static void test_close_before_hello(void **state)
{
    fixture *f = *state;
    proto_msg m;
    send_bytes(f, "\0\0", 2); /* half a prefix */
    run_until_quiet(f);
    assert_int_equal(f->srv.conns.n, 1);
    assert_int_equal(shutdown(f->peer, SHUT_WR), 0);
    assert_false(next_frame(f, &m));
    assert_int_equal(f->nin, 0);
    assert_int_equal(f->srv.conns.n, 0);
    assert_int_equal(f->srv.stats.conns.lost_total, 0);
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 0);
}

/* A zero length prefix is a bad frame. */
static void test_zero_length_frame(void **state)
{
    fixture *f = *state;
    send_prefix(f, 0);
    expect_error_and_close(f, PROTO_ERR_BAD_FRAME, "bad frame");
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 1);
    assert_int_equal(f->srv.stats.conns.frames_in_total, 0);
}

/* A whole frame whose body does not decode (a HELLO cut short) is a bad frame. */
static void test_malformed_hello(void **state)
{
    fixture *f = *state;
    static const uint8_t frame[] = {0, 0, 0, 5, PROTO_HELLO, 0, PROTO_VERSION, 0, 0};
    send_bytes(f, frame, sizeof frame);
    expect_error_and_close(f, PROTO_ERR_BAD_FRAME, "bad frame");
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 1);
    assert_int_equal(f->srv.stats.conns.rejected_total, 0);
}

/* Before HELLO a prefix announcing the largest HELLO is waited for... */
static void test_pre_hello_limit_waits(void **state)
{
    fixture *f = *state;
    send_prefix(f, PRE_HELLO_MAX_BODY);
    run_until_quiet(f);
    assert_int_equal(f->nin, 0);
    assert_int_equal(f->srv.conns.n, 1);
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 0);
}

/* ...and one announcing a byte more is refused on the prefix alone. */
static void test_pre_hello_over_limit(void **state)
{
    fixture *f = *state;
    send_prefix(f, PRE_HELLO_MAX_BODY + 1);
    expect_error_and_close(f, PROTO_ERR_BAD_FRAME, "frame too big");
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 1);
}

/* After HELLO the limit is --max-frame: a DONE larger than any HELLO is read (a late
 * result, as no task was delivered), and a prefix beyond --max-frame is refused. */
static void test_limit_after_hello(void **state)
{
    fixture *f = *state;
    static uint8_t data[PRE_HELLO_MAX_BODY + 1000];
    proto_msg m = {.type = PROTO_DONE};
    send_hello(f, PROTO_VERSION);
    expect_welcome(f);
    m.u.done.task_id = 7;
    m.u.done.attempt = 1;
    m.u.done.data = (proto_bytes){data, sizeof data};
    uint8_t *buf = malloc(proto_msg_size(&m));
    assert_non_null(buf);
    size_t n = proto_msg_encode(&m, buf, proto_msg_size(&m));
    assert_true(n > PRE_HELLO_MAX_BODY + PROTO_LEN_PREFIX);
    for (size_t off = 0; off < n;) { /* more than the socket buffer may take at once */
        ssize_t k = send(f->peer, buf + off, n - off, MSG_NOSIGNAL);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            pump(f);
            continue;
        }
        assert_true(k > 0);
        off += (size_t)k;
    }
    free(buf);
    for (int pass = 0; pass < MAX_PASSES && f->srv.stats.tasks.late_results_total == 0; pass++)
        pump(f);
    assert_int_equal(f->srv.stats.tasks.late_results_total, 1);
    assert_int_equal(f->srv.conns.n, 1);
    send_prefix(f, (uint32_t)f->cfg.max_frame + 1);
    expect_error_and_close(f, PROTO_ERR_BAD_FRAME, "frame too big");
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 1);
    assert_int_equal(f->srv.stats.conns.lost_total, 0);
}

/* The first frame must be HELLO. */
static void test_first_frame_not_hello(void **state)
{
    fixture *f = *state;
    send_msg(f, &(proto_msg){.type = PROTO_HEARTBEAT});
    expect_error_and_close(f, PROTO_ERR_UNEXPECTED, "the first frame must be HELLO");
    assert_int_equal(f->srv.stats.conns.frames_in_total, 1);
}

/* A HELLO of another version hears "version", even though it decodes. */
static void test_hello_other_version(void **state)
{
    fixture *f = *state;
    send_hello(f, PROTO_VERSION + 1);
    expect_error_and_close(f, PROTO_ERR_VERSION, "protocol version not supported");
    assert_int_equal(f->srv.stats.conns.rejected_total, 1);
    assert_int_equal(f->srv.stats.conns.bad_frames_total, 0);
}

/* More frames than one read callback's budget arrive at once: all are handled, over
 * more than one turn. */
static void test_frame_budget_yields(void **state)
{
    fixture *f = *state;
    enum { NBEATS = 300 };
    uint8_t beats[NBEATS * 5];
    send_hello(f, PROTO_VERSION);
    expect_welcome(f);
    for (int i = 0; i < NBEATS; i++)
        memcpy(beats + 5 * i, (const uint8_t[]){0, 0, 0, 1, PROTO_HEARTBEAT}, 5);
    send_bytes(f, beats, sizeof beats);
    for (int pass = 0; pass < MAX_PASSES && f->srv.stats.conns.frames_in_total < 1 + NBEATS; pass++)
        pump(f);
    assert_int_equal(f->srv.stats.conns.frames_in_total, 1 + NBEATS);
    assert_true(f->srv.stats.conns.yields_total >= 1);
    assert_int_equal(f->srv.conns.n, 1);
}

/* A frame that began and stopped arriving is dropped once 3 heartbeats and its
 * announced length's worth of time have passed, not before. */
static void test_half_frame_stalls(void **state)
{
    fixture *f = *state;
    send_hello(f, PROTO_VERSION);
    expect_welcome(f);
    send_prefix(f, 64000);
    send_bytes(f, "\x11\0\0", 3);
    run_until_quiet(f);
    dsp_conn *c = f->srv.conns.list;
    assert_non_null(c);
    assert_true(c->frame_started_ms > 0);
    int64_t limit = c->frame_started_ms + 3 * (int64_t)HEARTBEAT_MS + 64000 / 64;
    /* only the half frame is at stake: no silence, no heartbeat due */
    c->last_rx_ms = c->last_tx_ms = limit;
    dsp_conn_tick(c, limit);
    assert_int_equal(f->srv.stats.conns.stalled_total, 0);
    dsp_conn_tick(c, limit + 1);
    assert_int_equal(f->srv.stats.conns.stalled_total, 1);
    expect_error_and_close(f, PROTO_ERR_TIMEOUT, "a frame stopped arriving halfway");
}

/* Queues n CANCEL frames numbered from first (task_id), as one pass's output. */
static void send_numbered(dsp_conn *c, uint64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        proto_msg m = {.type = PROTO_CANCEL};
        m.u.cancel.task_id = first + i;
        m.u.cancel.epoch = 7;
        m.u.cancel.attempt = 1;
        dsp_conn_send_frame(c, &m);
    }
}

/* A plaintext connection gathers a pass's frames and writes its socket itself in the
 * loop pass that produced them (conn.c, stage_send): one pass after a frame is queued,
 * the peer has it and the bufferevent's write event is off. When the socket takes only
 * part of them, the write event carries the rest; frames of later passes, and those past
 * the 64 KiB gathered at once, queue behind it; all arrive whole and in order, and the
 * write event goes off again once everything is written. */
static void test_direct_write_and_rest(void **state)
{
    fixture *f = *state;
    send_hello(f, PROTO_VERSION);
    expect_welcome(f);
    dsp_conn *c = f->srv.conns.list;
    struct bufferevent *bev = c->bev;
    assert_true(c->direct_write);
    assert_int_equal(bufferevent_get_enabled(bev) & EV_WRITE, 0);

    dsp_conn_send_simple(c, PROTO_HEARTBEAT);
    size_t before = f->nin;
    pump(f);
    assert_int_equal(f->nin - before, PROTO_LEN_PREFIX + 1);
    assert_int_equal(evbuffer_get_length(bufferevent_get_output(bev)), 0);
    assert_int_equal(bufferevent_get_enabled(bev) & EV_WRITE, 0);

    /* A pass of 2,000 CANCELs (42,000 bytes) against a small send buffer: sent in part. */
    int small = 4096;
    assert_int_equal(setsockopt(bufferevent_getfd(bev), SOL_SOCKET, SO_SNDBUF, &small,
                                sizeof small), 0);
    enum { FIRST = 2000, SECOND = 4000 };
    send_numbered(c, 0, FIRST);
    event_base_loop(f->srv.base, EVLOOP_NONBLOCK);
    assert_true(evbuffer_get_length(bufferevent_get_output(bev)) > 0);
    assert_true(bufferevent_get_enabled(bev) & EV_WRITE);
    /* The peer reads what the socket holds; the next pass, 84,000 bytes (past 64 KiB),
     * comes before the write event has sent the rest of the first. */
    before = f->nin;
    take_in(f);
    assert_true(f->nin > before);
    send_numbered(c, FIRST, SECOND);
    event_base_loop(f->srv.base, EVLOOP_NONBLOCK);

    for (int pass = 0; pass < MAX_PASSES && evbuffer_get_length(bufferevent_get_output(bev)) > 0;
         pass++)
        pump(f);
    pump(f); /* the write callback has seen the output empty */
    uint64_t want = 0;
    for (size_t at = before; at < f->nin; want++) {
        uint32_t body_len = 0;
        proto_msg m;
        assert_int_equal(proto_frame_check(f->in + at, f->nin - at, PROTO_MAX_BODY_DEFAULT, &body_len),
                         PROTO_OK);
        assert_true(f->nin - at >= PROTO_LEN_PREFIX + (size_t)body_len);
        assert_int_equal(proto_msg_decode(f->in + at + PROTO_LEN_PREFIX, body_len, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_CANCEL);
        assert_int_equal(m.u.cancel.task_id, want);
        at += PROTO_LEN_PREFIX + (size_t)body_len;
    }
    assert_int_equal(want, FIRST + SECOND);
    assert_int_equal(evbuffer_get_length(bufferevent_get_output(bev)), 0);
    assert_int_equal(bufferevent_get_enabled(bev) & EV_WRITE, 0);
    assert_int_equal(f->srv.conns.n, 1);
}

/* ---- refills: two workers on their own socketpairs, frames read here ---- */

/* A worker end for the scheduling tests, with the deliveries it holds. */
typedef struct worker {
    int fd;
    uint8_t in[16384];
    size_t nin;
    uint64_t ids[16];
    uint32_t epochs[16], attempts[16];
    size_t nheld;  /* TASKs received and not answered yet */
    bool welcomed;
} worker;

/* Takes in what the server sent w: TASKs join w's deliveries, WELCOME is noted, the
 * rest (CONFIRM) is read past. */
static void worker_take(worker *w)
{
    if (w->fd < 0)
        return; /* not connected yet */
    for (;;) {
        ssize_t n = recv(w->fd, w->in + w->nin, sizeof w->in - w->nin, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        assert_true(n > 0);
        w->nin += (size_t)n;
    }
    size_t at = 0;
    for (;;) {
        uint32_t body_len = 0;
        proto_msg m;
        int st = proto_frame_check(w->in + at, w->nin - at, PROTO_MAX_BODY_DEFAULT, &body_len);
        if (st == PROTO_NEED_MORE)
            break;
        assert_int_equal(st, PROTO_OK);
        assert_int_equal(proto_msg_decode(w->in + at + PROTO_LEN_PREFIX, body_len, &m), PROTO_OK);
        if (m.type == PROTO_WELCOME)
            w->welcomed = true;
        if (m.type == PROTO_TASK) {
            assert_true(w->nheld < 16);
            w->ids[w->nheld] = m.u.task.task_id;
            w->epochs[w->nheld] = m.u.task.epoch;
            w->attempts[w->nheld++] = m.u.task.attempt;
        }
        at += PROTO_LEN_PREFIX + (size_t)body_len;
    }
    memmove(w->in, w->in + at, w->nin - at);
    w->nin -= at;
}

/* One loop pass of the server, then each worker takes in what it was sent. */
static void pump_workers(fixture *f, worker *a, worker *b)
{
    event_base_loop(f->srv.base, EVLOOP_NONBLOCK);
    worker_take(a);
    worker_take(b);
}

/* A connection for w, its HELLO (capacity 2, type "resize"), and its WELCOME. */
static void worker_join(fixture *f, worker *w, worker *other, const char *name)
{
    int sv[2];
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40001)};
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dsp_conn_accept(&f->srv, sv[0], (const struct sockaddr *)&peer, (int)sizeof peer);
    w->fd = sv[1];
    assert_int_equal(evutil_make_socket_nonblocking(w->fd), 0);
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = 2;
    m.u.hello.name = (proto_bytes){(const uint8_t *)name, strlen(name)};
    m.u.hello.ntypes = 1;
    m.u.hello.types[0] = (proto_bytes){(const uint8_t *)"resize", 6};
    uint8_t buf[512];
    size_t n = proto_msg_encode(&m, buf, sizeof buf);
    assert_int_equal(send(w->fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
    for (int pass = 0; pass < MAX_PASSES && !w->welcomed; pass++)
        pump_workers(f, w, other);
    assert_true(w->welcomed);
}

/* Buffers n claimed tasks of "resize", as a claim's answer does (server.c), without
 * asking for a dispatch pass. */
static void buffer_tasks(fixture *f, uint64_t first_id, size_t n)
{
    dsp_server *srv = &f->srv;
    dsp_type *ty = dsp_server_type_find(srv, (const uint8_t *)"resize", 6);
    assert_non_null(ty);
    for (size_t i = 0; i < n; i++) {
        dsp_task *t = dsp_server_task_new(srv);
        assert_non_null(t);
        t->id = first_id + i;
        dsp_deadline_node_init(&t->lease);
        t->seq = srv->sched.next_seq++;
        t->type = ty;
        t->max_attempts = 3;
        t->timeout_ms = 60000;
        t->priority = 1;
        assert_int_equal(dsp_taskmap_put(&srv->tasks.map, t->id, t), 0);
        dsp_dispatch_enqueue(srv, ty, t);
        srv->sched.nbuffered++;
    }
}

/* w answers every delivery it holds with a success, in one write. */
static void worker_done_all(worker *w)
{
    uint8_t buf[4096];
    size_t len = 0;
    for (size_t i = 0; i < w->nheld; i++) {
        proto_msg m = {.type = PROTO_DONE};
        m.u.done.task_id = w->ids[i];
        m.u.done.epoch = w->epochs[i];
        m.u.done.attempt = w->attempts[i];
        m.u.done.outcome = PROTO_OUTCOME_SUCCESS;
        size_t n = proto_msg_encode(&m, buf + len, sizeof buf - len);
        assert_true(n > 0);
        len += n;
    }
    assert_int_equal(send(w->fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
    w->nheld = 0;
}

/* Workers a and b join, n tasks (ids from 100) are buffered and a pass hands them out. */
static void two_workers_given(fixture *f, worker *a, worker *b, size_t n)
{
    worker_join(f, a, b, "a");
    worker_join(f, b, a, "b");
    buffer_tasks(f, 100, n);
    dsp_server_kick(&f->srv);
    for (int pass = 0; pass < MAX_PASSES && a->nheld + b->nheld < n; pass++)
        pump_workers(f, a, b);
    assert_int_equal(a->nheld + b->nheld, n);
}

/* Two workers of capacity 2, both full; 2 tasks wait. Both answer in the same loop pass:
 * the first whose DONEs are read is refilled with both tasks in one write, rather than
 * each getting one (the pass's least-loaded choice once both answers are known). */
static void test_refill_fills_the_first_to_answer(void **state)
{
    fixture *f = *state;
    worker a = {.fd = -1}, b = {.fd = -1};
    two_workers_given(f, &a, &b, 4);
    assert_int_equal(a.nheld, 2); /* both idle: the pass gives each its 2 */
    assert_int_equal(b.nheld, 2);

    buffer_tasks(f, 200, 2); /* no room: they wait */
    worker_done_all(&a);
    worker_done_all(&b);
    for (int pass = 0; pass < 64; pass++)
        pump_workers(f, &a, &b);
    assert_int_equal(f->srv.stats.tasks.succeeded_total, 4);
    assert_int_equal(f->srv.sched.nbuffered, 0);
    assert_true((a.nheld == 2 && b.nheld == 0) || (a.nheld == 0 && b.nheld == 2));
    worker *got = a.nheld ? &a : &b;
    assert_true(got->ids[0] == 200 && got->ids[1] == 201); /* in dispatch order */
    close(a.fd);
    close(b.fd);
}

/* When another worker of the type already has a free slot, the worker whose DONEs are
 * read is not refilled on the spot: the pass chooses among both by the scheduler, and
 * least-loaded, both idle, gives each one task. */
static void test_refill_leaves_the_choice_to_the_scheduler(void **state)
{
    fixture *f = *state;
    worker a = {.fd = -1}, b = {.fd = -1};
    two_workers_given(f, &a, &b, 2);
    assert_int_equal(a.nheld, 1); /* one each */
    worker_done_all(&b); /* b is idle, its free slots known */
    for (int pass = 0; pass < 64; pass++)
        pump_workers(f, &a, &b);
    assert_int_equal(f->srv.stats.tasks.succeeded_total, 1);

    buffer_tasks(f, 200, 2); /* buffered while b has room: no pass asked for yet */
    worker_done_all(&a);
    for (int pass = 0; pass < 64; pass++)
        pump_workers(f, &a, &b);
    assert_int_equal(f->srv.stats.tasks.succeeded_total, 2);
    assert_int_equal(f->srv.sched.nbuffered, 0);
    assert_int_equal(a.nheld, 1);
    assert_int_equal(b.nheld, 1);
    close(a.fd);
    close(b.fd);
}

/* The binary log's doorbell on the loop (dispatch.c, dsp_dispatch_on_wake): a rung claim
 * is retried when it found nothing (the commit not yet visible), wake-ups while a claim
 * runs come to one claim after it, the gap between rung claims widens only in a flood and
 * never past --poll-ms, and future due times are kept sorted and bounded. */
static void test_wake_doorbell_pacing(void **state)
{
    fixture *f = *state;
    dsp_server *srv = &f->srv;
    int64_t now = dsp_now_ms();

    dsp_dispatch_on_wake(srv, 0);
    assert_int_equal(srv->claim.wake_retries, 3);
    assert_int_equal(srv->claim.not_before, 0); /* claim now */

    /* Rung while a claim runs: one claim when it is answered, not one per wake-up. */
    srv->claim.outstanding = true;
    srv->claim.sent_ms = now;
    srv->claim.requested = 10;
    for (int i = 0; i < 100; i++)
        dsp_dispatch_on_wake(srv, 0);
    assert_true(srv->claim.wake_at >= now && srv->claim.wake_at <= dsp_now_ms() + 10);
    srv->claim.outstanding = false;
    /* It found nothing: tried again within the retry delay, the wake-up taken. */
    dsp_claim_pacing_claimed(srv, now, 0, false);
    assert_int_equal(srv->claim.wake_at, 0);
    assert_true(srv->claim.not_before <= now + 20);
    assert_int_equal(srv->claim.wake_retries, 2);

    /* A flood: only after 4 claims in a row found several rows does the gap widen,
     * doubling up to --poll-ms (100). */
    for (int i = 0; i < 3; i++) {
        dsp_claim_pacing_claimed(srv, now, 5, false);
        assert_true(srv->claim.wake_gap_ms <= 10);
    }
    int64_t last = 10;
    for (int i = 0; i < 10; i++) {
        dsp_claim_pacing_claimed(srv, now, 5, false);
        assert_true(srv->claim.wake_gap_ms >= last && srv->claim.wake_gap_ms <= f->cfg.poll_ms);
        last = srv->claim.wake_gap_ms;
    }
    assert_int_equal(last, f->cfg.poll_ms);
    dsp_claim_pacing_claimed(srv, now, 1, false); /* a single row: back to the shortest */
    assert_int_equal(srv->claim.wake_gap_ms, 10);

    /* Future rows: 40 due times, in no order; the 32 earliest are kept, sorted. */
    int64_t base = dsp_wall_ms() + 600000;
    for (int i = 0; i < 40; i++)
        dsp_dispatch_on_wake(srv, base + (int64_t)((i * 7) % 40) * 1000);
    assert_int_equal(srv->claim.ndues, DSP_WAKE_DUES_MAX);
    for (size_t i = 0; i < srv->claim.ndues; i++)
        assert_int_equal(srv->claim.dues[i], base + (int64_t)i * 1000);
    assert_true(evtimer_pending(srv->claim.due_timer, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wake_doorbell_pacing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_stop_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_before_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_length_frame, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pre_hello_limit_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pre_hello_over_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limit_after_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_frame_not_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_other_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_budget_yields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_half_frame_stalls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_direct_write_and_rest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refill_fills_the_first_to_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refill_leaves_the_choice_to_the_scheduler, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
