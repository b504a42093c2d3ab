/* client.c: the worker object, its event loop and its connection.
 *
 * Everything here runs on the thread inside tp_worker_run() (the I/O thread),
 * except tp_worker_new/free/add_type (before and after a run), tp_worker_stop
 * (any thread, signal handlers included) and tp_worker_get_stats (any thread).
 * Frames and log lines leave through output.c, which inventory.c, pool.c and
 * submit.c use too.
 *
 * The connection is a state machine (enum tpi_conn_state); every transition
 * goes through set_state(), which logs it at debug level:
 *
 *   IDLE --connect--> CONNECTING --connected, HELLO sent--> HANDSHAKE
 *   HANDSHAKE --WELCOME--> READY --STOP sent or received--> DRAINING
 *   READY/DRAINING --protocol error, or drained--> CLOSING --flushed--> IDLE
 *   any state --connection lost, timeout--> IDLE (then the reconnect timer)
 *
 * A connection that never got to READY counts as a failed attempt: the next
 * attempt goes to the next resolved address of the same host at once, or to
 * the next host after a short pause; only once every host failed in a row comes
 * a backoff delay that doubles with every such round. A host that answers
 * PROTO_ERR_NOT_LEADER (a standby, or a leader that lost its lease) is left the
 * same way, so a worker given every dispatcher ends up on the one that leads; a
 * session that ends also moves on to the next host when there are several.
 */
#include "client.h"
#include "frame_reader.h"
#include "inventory.h"
#include "options.h"
#include "output.h"
#include "pool.h"
#include "submit.h"
#include "tls.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

/* taskpush.h states the library's limits without including the codec: they must be
 * the protocol's (proto/PROTOCOL.md), or a worker could register what the wire cannot
 * carry. */
_Static_assert(TP_MAX_TYPES == PROTO_MAX_TYPES, "TP_MAX_TYPES is the protocol's");
_Static_assert(TP_MAX_TYPE_LEN == PROTO_MAX_TYPE_LEN, "TP_MAX_TYPE_LEN is the protocol's");
_Static_assert(TP_MAX_NAME_LEN == PROTO_MAX_NAME_LEN, "TP_MAX_NAME_LEN is the protocol's");
_Static_assert(TP_MAX_TOKEN_LEN == PROTO_MAX_TOKEN_LEN, "TP_MAX_TOKEN_LEN is the protocol's");
/* HELLO carries the capacity as a u32. */
_Static_assert(TP_MAX_CAPACITY <= UINT32_MAX, "a capacity fits HELLO");

static const char *const state_texts[TPI_STATE_COUNT] = {
    [TPI_IDLE] = "IDLE",   [TPI_CONNECTING] = "CONNECTING", [TPI_HANDSHAKE] = "HANDSHAKE",
    [TPI_READY] = "READY", [TPI_DRAINING] = "DRAINING",     [TPI_CLOSING] = "CLOSING",
};

const char *tpi_state_text(enum tpi_conn_state s)
{
    return (unsigned)s < TPI_STATE_COUNT ? state_texts[s] : "UNKNOWN";
}

/* ---- small helpers ---- */

static void set_state(tp_worker *w, enum tpi_conn_state s)
{
    assert((unsigned)s < TPI_STATE_COUNT);
    if (w->state != s)
        tpi_log(w, TP_LOG_DEBUG, "connection %llu: %s -> %s", (unsigned long long)w->gen,
                tpi_state_text(w->state), tpi_state_text(s));
    w->state = s;
}

static struct timeval ms_to_tv(uint32_t ms)
{
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};

    return tv;
}

static const tpi_addr *cur_addr(const tp_worker *w)
{
    return &w->addrs[w->addr_idx];
}

/* receiving: the states in which frames from the dispatcher are read */
static int receiving(const tp_worker *w)
{
    return w->state == TPI_HANDSHAKE || w->state == TPI_READY || w->state == TPI_DRAINING;
}

/* sending_outcomes: the states in which DONE and EXTEND frames may be sent */
static int sending_outcomes(const tp_worker *w)
{
    return w->state == TPI_READY || w->state == TPI_DRAINING;
}

static void set_in_flight(tp_worker *w, unsigned n)
{
    w->in_flight = n;
    atomic_store_explicit(&w->counters.in_flight, n, memory_order_relaxed);
}

/* send_msg encodes a frame without a trailing field into the output buffer. */
static int send_msg(tp_worker *w, const proto_msg *m)
{
    uint8_t buf[64];
    size_t n = proto_msg_encode(m, buf, sizeof(buf));

    if (n == 0 || w->bev == NULL)
        return -1;
    w->last_tx_ns = tpi_now_ns();
    return tpi_write(w, buf, n);
}

/* The event loop of one tp_worker_run_many() call, shared by its workers. */
typedef struct tpi_loop {
    struct event_base *base;
    size_t live; /* workers not finished */
} tpi_loop;

static void maybe_finish(tp_worker *w)
{
    if (w->finished || !w->stopping || w->state != TPI_IDLE || w->tasks_alive != 0)
        return;
    w->finished = 1;
    if (--w->loop->live == 0)
        event_base_loopbreak(w->base);
}

/* ---- reading ---- */

static void on_read(struct bufferevent *bev, void *arg);
static void on_event(struct bufferevent *bev, short what, void *arg);
static void close_after_flush(tp_worker *w, int level, const char *why);

static void read_frames_from(tp_worker *w, const uint8_t *buf, size_t n);

/* Reads the socket into the end of the input (something is buffered there already).
 * Returns what read returned, or -2 when out of memory (the connection is closed). */
static ssize_t read_into_input(tp_worker *w, evutil_socket_t fd, struct evbuffer *in)
{
    struct evbuffer_iovec v[2];
    struct iovec iov[2];
    int nv;
    ssize_t n;
    int err;

    evbuffer_unfreeze(in, 0); /* the bufferevent keeps the input's end frozen */
    nv = evbuffer_reserve_space(in, TPI_READ_MAX, v, 2);
    if (nv <= 0) {
        evbuffer_freeze(in, 0);
        close_after_flush(w, TP_LOG_ERROR, "out of memory");
        return -2;
    }
    for (int i = 0; i < nv; i++) {
        iov[i].iov_base = v[i].iov_base;
        iov[i].iov_len = v[i].iov_len;
    }
    n = readv(fd, iov, nv);
    err = errno;
    if (n > 0) {
        if ((size_t)n <= v[0].iov_len) {
            v[0].iov_len = (size_t)n;
            nv = 1;
        } else {
            v[1].iov_len = (size_t)n - v[0].iov_len;
        }
        evbuffer_commit_space(in, v, nv);
    }
    evbuffer_freeze(in, 0);
    errno = err;
    return n;
}

/* A plaintext connection reads its socket itself, too: libevent's own read first asks
 * the kernel how much is waiting (ioctl FIONREAD), one system call in three of a
 * worker's round trip. With nothing buffered, the frames are taken from the stack
 * (read_frames_from); else what comes joins the input, as the bufferevent would. */
static void on_sock_read(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;
    struct evbuffer *in;
    ssize_t n;
    int err;

    (void)what;
    if (w->bev == NULL)
        return;
    in = bufferevent_get_input(w->bev);
    if (evbuffer_get_length(in) == 0) {
        uint8_t buf[TPI_READ_MAX];

        n = read(fd, buf, sizeof(buf));
        err = errno;
        if (n > 0) {
            read_frames_from(w, buf, (size_t)n);
            return;
        }
    } else {
        n = read_into_input(w, fd, in);
        err = errno;
        if (n > 0) {
            on_read(w->bev, w);
            return;
        }
    }
    if (n == -2)
        return;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
        return;
    errno = err;
    on_event(w->bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), w);
}

/* Called once connected: a plaintext connection's output is written by output.c's
 * tpi_output_on_flush and its input read by on_sock_read from now on; TLS keeps the
 * bufferevent's own. */
static void start_direct_io(tp_worker *w)
{
    if (w->tls_ctx != NULL)
        return;
    tpi_output_start_direct(w);
    w->read_ev = event_new(w->base, bufferevent_getfd(w->bev), EV_READ | EV_PERSIST, on_sock_read, w);
    if (w->read_ev == NULL)
        return; /* out of memory: the bufferevent reads */
    if (event_add(w->read_ev, NULL) < 0) {
        event_free(w->read_ev);
        w->read_ev = NULL;
        return;
    }
    bufferevent_disable(w->bev, EV_READ);
}

static void stop_direct_read(tp_worker *w)
{
    if (w->read_ev != NULL)
        event_free(w->read_ev);
    w->read_ev = NULL;
}

/* ---- connecting and closing ---- */

/* The pause before the next host of a round (TPI_NEXT_HOST_MS to twice that), and
 * the backoff exponent's cap for a round that met a standby (min_ms * 2^3). */
#define TPI_NEXT_HOST_MS 20u
#define TPI_NOT_LEADER_MAX_FAILURES 3u

static void start_connect(tp_worker *w);

static void schedule_reconnect(tp_worker *w, int at_once)
{
    uint32_t ms = 0;
    struct timeval tv;

    if (w->stopping)
        return;
    if (!at_once) {
        ms = tpi_backoff_ms(&w->rng, w->opts.reconnect_min_ms, w->opts.reconnect_max_ms,
                            w->failures);
        /* Said once per outage; each failed attempt already logged a warning. */
        tpi_log(w, w->failures <= 1 ? TP_LOG_INFO : TP_LOG_DEBUG, "reconnecting to %s:%s in %u ms",
                cur_addr(w)->host, cur_addr(w)->port, ms);
    }
    tv = ms_to_tv(ms);
    evtimer_add(w->reconnect_ev, &tv);
}

/* give_up_submits ends the submissions waiting for a connection once
 * submit_give_up_rounds rounds in a row failed, while no attempt is under way (a
 * one-shot producer is told at once why it cannot connect, not after its timeout). */
static void give_up_submits(tp_worker *w)
{
    if (w->opts.submit_give_up_rounds == 0 || w->failures < w->opts.submit_give_up_rounds ||
        w->state != TPI_IDLE || w->last_failure[0] == '\0')
        return;
    tpi_submit_fail_waiting(w, TP_EUNAVAIL, w->last_failure);
}

static void drop_addrinfo(tp_worker *w)
{
    if (w->ai_list != NULL)
        freeaddrinfo(w->ai_list);
    w->ai_list = NULL;
    w->ai_cur = NULL;
}

/* next_host moves on from a host that failed or does not lead: after a short,
 * jittered pause (workers leaving a standby together do not arrive in one burst)
 * while the round has untried hosts, after the backoff once all failed in a row.
 * A round that met a standby keeps that backoff short: a leader is expected soon. */
static void next_host(tp_worker *w)
{
    struct timeval tv;

    drop_addrinfo(w);
    w->addr_idx = (w->addr_idx + 1) % w->naddrs;
    if (++w->round_misses < w->naddrs) {
        if (w->stopping)
            return;
        tv = ms_to_tv(TPI_NEXT_HOST_MS + (uint32_t)(tpi_rand(&w->rng) % TPI_NEXT_HOST_MS));
        evtimer_add(w->reconnect_ev, &tv);
        return;
    }
    w->round_misses = 0;
    w->failures++;
    if (w->round_not_leader && w->failures > TPI_NOT_LEADER_MAX_FAILURES)
        w->failures = TPI_NOT_LEADER_MAX_FAILURES;
    w->round_not_leader = 0;
    schedule_reconnect(w, 0);
    give_up_submits(w);
}

/* release tears the connection down without deciding what comes next: deliveries it
 * held are marked cancelled, and their outcomes will be dropped; in a version-3 session
 * (unless stopping) they go on running instead, carried to the next connection. */
static void release(tp_worker *w)
{
    stop_direct_read(w);
    if (w->bev != NULL)
        bufferevent_free(w->bev); /* closes the socket */
    w->bev = NULL;
    w->direct_write = 0;
    w->stage.len = 0; /* the connection's unsent frames go with it, as its output does */
    event_del(w->hs_ev);
    event_del(w->hb_ev);
    event_del(w->more_ev);
    event_del(w->linger_ev);
    event_del(w->stop_wait_ev);
    if (w->established && w->session_version >= 3 && !w->stopping)
        tpi_inv_carry(w);
    for (tp_task *t = w->held; t != NULL; t = t->held_next) {
        atomic_store(&t->cancelled, 1);
        t->held = 0;
    }
    w->held = NULL;
    set_in_flight(w, 0);
    tpi_submit_conn_lost(w);
    w->established = 0;
    w->peer_stopped = 0;
    w->stop_sent = 0;
    w->max_body_in = PROTO_MAX_BODY_DEFAULT;
    set_state(w, TPI_IDLE);
}

/* attempt_failed ends an attempt that never reached READY and moves on: to the
 * next resolved address at once, else to the next host after a backoff. */
static void attempt_failed(tp_worker *w, const char *why)
{
    const tpi_addr *a = cur_addr(w);

    tpi_log(w, TP_LOG_WARN, "cannot connect to %s:%s: %s", a->host, a->port, why);
    snprintf(w->last_failure, sizeof(w->last_failure), "cannot connect to %.64s:%s: %s", a->host,
             a->port, why);
    release(w);
    if (w->ai_cur != NULL && w->ai_cur->ai_next != NULL) {
        w->ai_cur = w->ai_cur->ai_next;
        schedule_reconnect(w, 1);
    } else {
        next_host(w);
    }
    maybe_finish(w);
}

/* not_leader leaves a dispatcher that said PROTO_ERR_NOT_LEADER, in the handshake
 * or in a session, for the next host. */
static void not_leader(tp_worker *w, const char *why)
{
    const tpi_addr *a = cur_addr(w);
    const tpi_addr *n = &w->addrs[(w->addr_idx + 1) % w->naddrs];

    tpi_log(w, TP_LOG_INFO, "%s:%s does not lead (%s); trying %s:%s", a->host, a->port, why,
            n->host, n->port);
    if (w->established) {
        TPI_COUNT(w, disconnects);
        w->failures = 0; /* the session was fine; its dispatcher stepped down */
    }
    w->round_not_leader = 1;
    release(w);
    next_host(w);
    maybe_finish(w);
}

/* conn_close closes a connection that had reached READY. A session that
 * carried tasks or lasted a while resets the backoff; one that ended early
 * (e.g. STOP or ERROR right after WELCOME) counts as a failure, so that a
 * dispatcher that keeps refusing us is not hammered. */
static void conn_close(tp_worker *w, int level, const char *why)
{
    int64_t lasted_ms;

    if (w->state == TPI_IDLE)
        return;
    if (!w->established) {
        attempt_failed(w, why);
        return;
    }
    lasted_ms = (tpi_now_ns() - w->welcome_ns) / 1000000;
    tpi_log(w, level, "connection to %s:%s closed: %s", cur_addr(w)->host, cur_addr(w)->port, why);
    TPI_COUNT(w, disconnects);
    release(w);
    drop_addrinfo(w);
    if (w->session_tasks > 0 || lasted_ms >= (int64_t)w->opts.reconnect_max_ms)
        w->failures = 0;
    else
        w->failures++;
    /* With several dispatchers, the one that went away (killed, frozen, stopping) is
     * likely no longer the leader: the next one is tried first, after a short pause
     * (a standby sends us on with NOT_LEADER). */
    if (w->naddrs > 1)
        next_host(w);
    else
        schedule_reconnect(w, 0);
    maybe_finish(w);
}

static void on_linger(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;

    (void)fd;
    (void)what;
    conn_close(w, TP_LOG_WARN, "could not flush the last frames in time");
}

static void on_flushed(struct bufferevent *bev, void *arg)
{
    tp_worker *w = arg;

    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        conn_close(w, w->close_level, w->close_reason);
}

/* close_after_flush stops reading and closes once the output is written;
 * the close is then logged at level with why. */
static void close_after_flush(tp_worker *w, int level, const char *why)
{
    struct timeval tv = ms_to_tv(TPI_LINGER_MS);

    snprintf(w->close_reason, sizeof(w->close_reason), "%s", why);
    w->close_level = level;
    if (w->state == TPI_CONNECTING) {
        attempt_failed(w, why);
        return;
    }
    set_state(w, TPI_CLOSING);
    event_del(w->hs_ev);
    event_del(w->hb_ev);
    event_del(w->more_ev);
    bufferevent_disable(w->bev, EV_READ);
    stop_direct_read(w);
    (void)tpi_stage_spill(w);
    if (evbuffer_get_length(bufferevent_get_output(w->bev)) == 0) {
        conn_close(w, level, w->close_reason);
        return;
    }
    /* The bufferevent writes the rest, so that on_flushed hears when it is gone. */
    w->direct_write = 0;
    bufferevent_enable(w->bev, EV_WRITE);
    bufferevent_setcb(w->bev, NULL, on_flushed, on_event, w);
    evtimer_add(w->linger_ev, &tv);
}

/* protocol_error: the dispatcher sent something we cannot accept. Tell it
 * (ERROR), then close once that is written, and reconnect. */
static void protocol_error(tp_worker *w, uint16_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void protocol_error(tp_worker *w, uint16_t code, const char *fmt, ...)
{
    char text[200];
    va_list ap;
    proto_msg m = {.type = PROTO_ERROR};
    uint8_t head[16];
    size_t n;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    TPI_COUNT(w, protocol_errors);
    if (w->state == TPI_HANDSHAKE || w->state == TPI_READY || w->state == TPI_DRAINING) {
        m.u.error.code = code;
        m.u.error.message.ptr = (const uint8_t *)text;
        m.u.error.message.len = strlen(text);
        n = proto_msg_encode_head(&m, head, sizeof(head));
        if (n > 0) {
            tpi_write(w, head, n);
            tpi_write(w, text, m.u.error.message.len);
            w->last_tx_ns = tpi_now_ns();
        }
    }
    close_after_flush(w, TP_LOG_WARN, text);
}

/* Used when the dispatcher sends no heartbeats. */
#define STOP_ANSWER_WAIT_MS 500

/* check_drained closes a DRAINING connection once nothing is held. After our
 * own STOP it waits for the dispatcher's answering STOP, since every TASK sent
 * before that answer arrives ahead of it (PROTOCOL.md 6.5); a dispatcher that
 * does not answer gets one heartbeat interval. */
static void check_drained(tp_worker *w)
{
    if (w->state != TPI_DRAINING || w->in_flight != 0 || tpi_submit_unanswered(w))
        return;
    if (w->peer_stopped) {
        close_after_flush(w, TP_LOG_INFO, w->stopping ? "worker stopped" : "dispatcher sent STOP");
        return;
    }
    if (w->stopping && !evtimer_pending(w->stop_wait_ev, NULL)) {
        uint32_t ms = w->heartbeat_ms ? w->heartbeat_ms : STOP_ANSWER_WAIT_MS;
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
        evtimer_add(w->stop_wait_ev, &tv);
    }
}

static void on_stop_wait(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;

    (void)fd;
    (void)what;
    if (w->state == TPI_DRAINING && w->in_flight == 0 && !tpi_submit_unanswered(w))
        close_after_flush(w, TP_LOG_INFO, "worker stopped (STOP not answered)");
}

static void send_stop(tp_worker *w)
{
    proto_msg m = {.type = PROTO_STOP};

    if (w->stop_sent)
        return;
    if (send_msg(w, &m) == 0)
        w->stop_sent = 1;
}

static void send_hello(tp_worker *w)
{
    proto_msg m = {.type = PROTO_HELLO};
    proto_hello *h = &m.u.hello;
    uint8_t *buf = NULL;
    size_t size;

    h->version = w->hello_version;
    /* No type: a producer-only client (version 2), which takes no task. */
    h->capacity = w->ntypes > 0 ? w->opts.capacity : 0;
    h->name.ptr = (const uint8_t *)w->name;
    h->name.len = strlen(w->name);
    if (w->token != NULL) {
        h->token.ptr = (const uint8_t *)w->token;
        h->token.len = strlen(w->token);
    }
    h->ntypes = (uint16_t)w->ntypes;
    for (size_t i = 0; i < w->ntypes; i++) {
        h->types[i].ptr = (const uint8_t *)w->types[i].name;
        h->types[i].len = w->types[i].len;
    }
    size = proto_msg_size(&m);
    if (size > 0)
        buf = malloc(size);
    if (buf == NULL || proto_msg_encode(&m, buf, size) != size ||
        tpi_write(w, buf, size) != 0) {
        free(buf);
        attempt_failed(w, "cannot encode or queue HELLO");
        return;
    }
    free(buf);
    w->last_tx_ns = tpi_now_ns();
    set_state(w, TPI_HANDSHAKE);
}

static void start_connect(tp_worker *w)
{
    const tpi_addr *a = cur_addr(w);
    struct timeval tv;

    if (w->stopping || w->state != TPI_IDLE)
        return;
    if (w->ai_cur == NULL) {
        struct addrinfo hints;
        int e;

        drop_addrinfo(w);
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_protocol = IPPROTO_TCP;
        hints.ai_flags = AI_NUMERICSERV;
        TPI_COUNT(w, connect_attempts);
        e = getaddrinfo(a->host, a->port, &hints, &w->ai_list);
        if (e != 0) {
            w->ai_list = NULL;
            attempt_failed(w, gai_strerror(e));
            return;
        }
        w->ai_cur = w->ai_list;
    } else {
        TPI_COUNT(w, connect_attempts);
    }
    w->gen++;
    w->session_tasks = 0;
    w->max_body_in = PROTO_MAX_BODY_DEFAULT;
    w->bev = w->tls_ctx != NULL ? tpi_tls_bev_new(w->base, w->tls_ctx, a->host)
                                : bufferevent_socket_new(w->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (w->bev == NULL) {
        attempt_failed(w, "cannot create a bufferevent");
        return;
    }
    bufferevent_setcb(w->bev, on_read, tpi_output_on_drained, on_event, w);
    set_state(w, TPI_CONNECTING);
    tv = ms_to_tv(w->opts.connect_timeout_ms);
    evtimer_add(w->hs_ev, &tv);
    if (bufferevent_socket_connect(w->bev, w->ai_cur->ai_addr, (int)w->ai_cur->ai_addrlen) < 0) {
        attempt_failed(w, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        return;
    }
    bufferevent_enable(w->bev, EV_READ | EV_WRITE);
}

static void on_reconnect(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    start_connect(arg);
}

static void on_handshake_timeout(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;
    char why[64];

    (void)fd;
    (void)what;
    snprintf(why, sizeof(why), "%s not done within %u ms",
             w->state == TPI_CONNECTING ? "connect" : "handshake", w->opts.connect_timeout_ms);
    attempt_failed(w, why);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    tp_worker *w = arg;
    char why[160];

    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;

        /* DONEs are small and already batched per loop turn: Nagle would only delay them. */
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        start_direct_io(w);
        w->last_rx_ns = tpi_now_ns();
        tpi_log(w, TP_LOG_DEBUG, "connected to %s:%s, sending HELLO", cur_addr(w)->host,
                cur_addr(w)->port);
        send_hello(w);
        return;
    }
    if (what & BEV_EVENT_EOF)
        snprintf(why, sizeof(why), "closed by the dispatcher");
    else if ((what & BEV_EVENT_ERROR) && !tpi_tls_error_text(bev, why, sizeof(why)))
        snprintf(why, sizeof(why), "%s", evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    else if (!(what & BEV_EVENT_ERROR))
        snprintf(why, sizeof(why), "event 0x%x", (unsigned)what);
    conn_close(w, w->stopping || w->peer_stopped ? TP_LOG_INFO : TP_LOG_WARN, why);
}

/* ---- sending outcomes ---- */

static void free_reference(const void *data, size_t len, void *extra)
{
    (void)len;
    (void)extra;
    free((void *)data);
}

/* done_of fills d with t's DONE (note: room for the text of a refused result).
 * Results that did not fit were refused by tp_task_set_result; errors were cut to fit
 * by tp_task_set_error. */
static void done_of(const tp_task *t, proto_done *d, char *note, size_t note_len)
{
    const void *data = t->error;
    size_t len = t->error_len;

    memset(d, 0, sizeof(*d));
    d->task_id = t->id;
    d->epoch = t->epoch;
    d->attempt = t->attempt;
    switch (t->outcome) {
    case TP_SUCCESS:
        d->outcome = PROTO_OUTCOME_SUCCESS;
        data = t->result;
        len = t->result_len;
        if (t->result_refused > 0) {
            d->outcome = PROTO_OUTCOME_FAIL_PERM;
            snprintf(note, note_len,
                     "result of %zu bytes exceeds the dispatcher's limit of %zu", t->result_refused,
                     t->max_data);
            data = note;
            len = strlen(note) < t->max_data ? strlen(note) : t->max_data;
        }
        break;
    case TP_FAIL_PERMANENT:
        d->outcome = PROTO_OUTCOME_FAIL_PERM;
        break;
    case TP_RETRY_AFTER:
        d->outcome = PROTO_OUTCOME_RETRY_AFTER;
        d->retry_after_ms = t->retry_after_ms;
        break;
    default:
        d->outcome = PROTO_OUTCOME_FAIL_RETRY;
        break;
    }
    d->data.ptr = data;
    d->data.len = len;
}

/* send_done writes t's DONE; in a version-3 session it also keeps a copy until confirmed. */
static void send_done(tp_worker *w, tp_task *t)
{
    proto_msg m; /* not `= {...}`, which zeroes the whole union (over 1 KiB) per task */
    proto_done *d = &m.u.done;
    uint8_t head[64], *p;
    char note[128];
    const void *data;
    size_t len;
    size_t n;
    int by_reference;

    m.type = PROTO_DONE;
    done_of(t, d, note, sizeof(note)); /* fills all of *d */
    data = d->data.ptr;
    len = d->data.len;
    if (w->session_version >= 3)
        tpi_inv_keep(w, d);
    by_reference = len >= TPI_RESULT_BY_REFERENCE && data == t->result;
    p = by_reference ? NULL : tpi_stage_reserve(w, sizeof(head) + len);
    n = proto_msg_encode_head(&m, p != NULL ? p : head, sizeof(head));
    if (n == 0) {
        tpi_log(w, TP_LOG_ERROR, "cannot encode DONE for task %llu", (unsigned long long)t->id);
        return;
    }
    w->last_tx_ns = tpi_now_ns();
    if (p != NULL) {
        if (len > 0)
            memcpy(p + n, data, len);
        tpi_stage_commit(w, n + len);
    } else {
        struct evbuffer *out = bufferevent_get_output(w->bev);

        (void)tpi_stage_spill(w); /* the frames before it go first */
        evbuffer_add(out, head, n);
        if (by_reference && evbuffer_add_reference(out, t->result, len, free_reference, NULL) == 0)
            t->result = NULL; /* the buffer frees it once written */
        else if (len > 0)
            evbuffer_add(out, data, len);
    }
    tpi_log(w, TP_LOG_DEBUG, "task %llu attempt %u: %s, %zu bytes", (unsigned long long)t->id,
            t->attempt, proto_outcome_name(d->outcome), len);
}

void tpi_conn_send_extend(tp_worker *w, tp_task *t, uint32_t ms)
{
    proto_msg m = {.type = PROTO_EXTEND};

    if (t->gen != w->gen || !sending_outcomes(w))
        return;
    m.u.extend.task_id = t->id;
    m.u.extend.epoch = t->epoch;
    m.u.extend.attempt = t->attempt;
    m.u.extend.extend_ms = ms;
    if (send_msg(w, &m) == 0)
        TPI_COUNT(w, extends_sent);
}

void tpi_conn_send_progress(tp_worker *w, tp_task *t, uint16_t permille, const char *msg, size_t len)
{
    proto_msg m = {.type = PROTO_PROGRESS};

    if (t->gen != w->gen || !sending_outcomes(w) || w->session_version < 4)
        return;
    m.u.progress.task_id = t->id;
    m.u.progress.epoch = t->epoch;
    m.u.progress.attempt = t->attempt;
    m.u.progress.permille = permille;
    m.u.progress.message.ptr = (const uint8_t *)msg;
    m.u.progress.message.len = len;
    (void)send_msg(w, &m);
}

static void unhold(tp_worker *w, tp_task *t)
{
    if (!t->held)
        return;
    if (t->held_prev != NULL)
        t->held_prev->held_next = t->held_next;
    else
        w->held = t->held_next;
    if (t->held_next != NULL)
        t->held_next->held_prev = t->held_prev;
    t->held_prev = t->held_next = NULL;
    t->held = 0;
}

/* keep_unsent keeps the outcome of a version-3 delivery that cannot be sent now: it
 * goes with the others after the next WELCOME. */
static void keep_unsent(tp_worker *w, tp_task *t)
{
    proto_done d;
    char note[128];

    done_of(t, &d, note, sizeof(note));
    tpi_inv_keep(w, &d);
    TPI_COUNT(w, tasks_completed);
}

/* finish_task sends (or drops, or keeps) the outcome of a task whose handler returned. */
static void finish_task(tp_worker *w, tp_task *t)
{
    if (t->held) {
        unhold(w, t);
        if (sending_outcomes(w)) {
            send_done(w, t);
            set_in_flight(w, w->in_flight - 1);
            TPI_COUNT(w, tasks_completed);
        } else if (w->session_version >= 3 && !w->stopping && !atomic_load(&t->cancelled)) {
            keep_unsent(w, t); /* CLOSING: carried over with the connection */
        } else {
            TPI_COUNT(w, tasks_dropped); /* CLOSING: the connection is going */
        }
    } else if (t->carried) {
        tpi_inv_uncarry(w, t);
        if (sending_outcomes(w) && w->session_version >= 3) {
            send_done(w, t);
            TPI_COUNT(w, tasks_completed);
        } else if (!atomic_load(&t->cancelled)) {
            keep_unsent(w, t);
        } else {
            TPI_COUNT(w, tasks_dropped); /* cancelled by the dispatcher: nobody wants it */
        }
    } else {
        TPI_COUNT(w, tasks_dropped);
        tpi_log(w, TP_LOG_DEBUG, "task %llu attempt %u: connection gone, outcome dropped",
                (unsigned long long)t->id, t->attempt);
    }
    tpi_task_free(t);
    w->tasks_alive--;
    check_drained(w);
    maybe_finish(w);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;
    uint64_t v;
    tp_task *done;
    tp_task *ext;

    (void)what;
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        tpi_log(w, TP_LOG_WARN, "reading the wake-up eventfd: %s", strerror(errno));
    tpi_done_take(w, &done, &ext);
    for (tp_task *t = ext; t != NULL; t = t->ext_taken_next) {
        if (t->ext_send_ms > 0)
            tpi_conn_send_extend(w, t, t->ext_send_ms);
        if (t->prog_send)
            tpi_conn_send_progress(w, t, t->prog_send_permille, t->prog_send_msg, t->prog_send_len);
    }
    while (done != NULL) {
        tp_task *t = done;

        done = t->next;
        finish_task(w, t);
    }
    tpi_submit_flush(w);
    give_up_submits(w); /* a submission that came after the attempts failed */
}

/* ---- receiving ---- */

static const tpi_type *find_type(const tp_worker *w, const uint8_t *name, size_t len)
{
    for (size_t i = 0; i < w->ntypes; i++)
        if (w->types[i].len == len && memcmp(w->types[i].name, name, len) == 0)
            return &w->types[i];
    return NULL;
}

/* receive_task takes the TASK frame rd announced: from body when not NULL, else off the
 * input in. The body is copied once, into the task, which the payload then points into. */
static void receive_task(tp_worker *w, const proto_frame_reader *rd, const uint8_t *body,
                         struct evbuffer *in)
{
    uint32_t body_len = rd->body_len;
    tp_task *t = NULL;
    proto_msg m;
    int64_t now = tpi_now_ns();

    if (!sending_outcomes(w)) {
        protocol_error(w, PROTO_ERR_UNEXPECTED, "TASK in state %s", tpi_state_text(w->state));
        goto done;
    }
    if (w->in_flight >= w->opts.capacity) {
        protocol_error(w, PROTO_ERR_UNEXPECTED, "TASK beyond the capacity of %u deliveries",
                       w->opts.capacity);
        goto done;
    }
    /* malloc, not calloc: glibc's calloc skips the per-thread cache, and this runs for
     * every task. Only the header needs zeroing; the body is copied in below. */
    t = malloc(sizeof(*t) + (size_t)body_len + 1);
    if (t != NULL)
        memset(t, 0, sizeof(*t));
    if (t == NULL) {
        tpi_log(w, TP_LOG_ERROR, "no memory for a task of %u bytes", body_len);
        close_after_flush(w, TP_LOG_ERROR, "out of memory");
        goto done;
    }
    if (body != NULL) {
        memcpy(t->body, body, body_len);
    } else {
        evbuffer_drain(in, PROTO_LEN_PREFIX);
        if (evbuffer_remove(in, t->body, body_len) != (int)body_len)
            body_len = 0; /* a short read: the decode below refuses an empty body */
    }
    if (body_len != rd->body_len || proto_frame_decode(rd, t->body, &m) != PROTO_OK) {
        protocol_error(w, PROTO_ERR_BAD_FRAME, "malformed TASK frame of %u bytes", rd->body_len);
        goto done;
    }
    t->body[body_len] = '\0';
    t->w = w;
    t->id = m.u.task.task_id;
    t->epoch = m.u.task.epoch;
    t->attempt = m.u.task.attempt;
    t->timeout_ms = m.u.task.timeout_ms;
    t->priority = m.u.task.priority;
    memcpy(t->type, m.u.task.type.ptr, m.u.task.type.len);
    t->type[m.u.task.type.len] = '\0';
    t->payload = m.u.task.payload.ptr; /* the rest of body, which ends with a NUL */
    t->payload_len = m.u.task.payload.len;
    t->gen = w->gen;
    t->version = w->session_version;
    t->max_data = w->max_data;
    atomic_init(&t->deadline_ns,
                t->timeout_ms > 0 ? now + (int64_t)t->timeout_ms * 1000000 : INT64_MAX);
    atomic_init(&t->cancelled, 0);
    t->type_reg = find_type(w, m.u.task.type.ptr, m.u.task.type.len);
    if (t->type_reg == NULL)
        tpi_log(w, TP_LOG_WARN, "task %llu has type '%s', which this worker did not register",
                (unsigned long long)t->id, t->type);
    tpi_log(w, TP_LOG_DEBUG, "task %llu attempt %u (%s): %zu bytes, lease %u ms",
            (unsigned long long)t->id, t->attempt, t->type, t->payload_len, t->timeout_ms);

    t->held = 1;
    t->held_prev = NULL;
    t->held_next = w->held;
    if (w->held != NULL)
        w->held->held_prev = t;
    w->held = t;
    set_in_flight(w, w->in_flight + 1);
    w->tasks_alive++;
    w->session_tasks++;
    TPI_COUNT(w, tasks_received);
    if (w->opts.threads == 0) {
        tpi_task_execute(t);
        finish_task(w, t);
    } else {
        tpi_pool_submit(w, t);
    }
    t = NULL;
done:
    tpi_task_free(t);
}

static void on_welcome(tp_worker *w, const proto_welcome *wm)
{
    size_t head;
    proto_msg probe = {.type = PROTO_DONE};

    if (wm->version != w->hello_version) {
        protocol_error(w, PROTO_ERR_VERSION,
                       "dispatcher speaks protocol version %u, this worker version %u", wm->version,
                       w->hello_version);
        return;
    }
    w->session_version = wm->version;
    w->heartbeat_ms = wm->heartbeat_ms;
    w->max_body_out = wm->max_body > 0 ? wm->max_body : PROTO_MAX_BODY_DEFAULT;
    w->max_body_in = w->max_body_out;
    head = proto_msg_size(&probe) - PROTO_LEN_PREFIX;
    w->max_data = w->max_body_out > head ? w->max_body_out - head : 0;
    w->welcome_ns = tpi_now_ns();
    w->established = 1;
    w->round_misses = 0;
    w->round_not_leader = 0;
    event_del(w->hs_ev);
    set_state(w, TPI_READY);
    TPI_COUNT(w, connections);
    w->last_failure[0] = '\0';
    tpi_log(w, TP_LOG_INFO, "connected to %s:%s (%.*s), heartbeat %u ms, capacity %u",
            cur_addr(w)->host, cur_addr(w)->port, (int)wm->server.len, (const char *)wm->server.ptr,
            wm->heartbeat_ms, w->opts.capacity);
    if (tpi_inv_session_start(w) < 0) {
        close_after_flush(w, TP_LOG_ERROR, "cannot queue the inventory (out of memory)");
        return;
    }
    if (w->heartbeat_ms > 0) {
        /* Ticks at half the interval, so that a heartbeat leaves at most one
         * interval after the last frame (PROTOCOL.md 6.2). */
        struct timeval tv = ms_to_tv(w->heartbeat_ms / 2 > 0 ? w->heartbeat_ms / 2 : 1);

        event_add(w->hb_ev, &tv);
    }
    tpi_submit_flush(w); /* what waited for a connection */
}

static void on_cancel(tp_worker *w, const proto_cancel *c)
{
    tp_task *carried = tpi_inv_find_carried(w, c->task_id, c->epoch, c->attempt);

    for (tp_task *t = carried != NULL ? carried : w->held; t != NULL; t = t->held_next) {
        if (t->id == c->task_id && t->epoch == c->epoch && t->attempt == c->attempt) {
            atomic_store(&t->cancelled, 1);
            TPI_COUNT(w, cancels_received);
            tpi_log(w, TP_LOG_INFO, "task %llu attempt %u cancelled by the dispatcher",
                    (unsigned long long)t->id, t->attempt);
            return;
        }
    }
    /* Its DONE crossed the CANCEL on the wire: nothing to do. */
    tpi_log(w, TP_LOG_DEBUG, "CANCEL for task %llu attempt %u, which is not held here",
            (unsigned long long)c->task_id, c->attempt);
}

/* handle_msg acts on one decoded frame other than TASK. */
static void handle_msg(tp_worker *w, const proto_msg *m)
{
    char why[200];

    if (w->state == TPI_HANDSHAKE && m->type != PROTO_WELCOME && m->type != PROTO_ERROR &&
        m->type != PROTO_HEARTBEAT) {
        protocol_error(w, PROTO_ERR_UNEXPECTED, "%s before WELCOME", proto_type_name(m->type));
        return;
    }
    switch (m->type) {
    case PROTO_WELCOME:
        if (w->state != TPI_HANDSHAKE)
            protocol_error(w, PROTO_ERR_UNEXPECTED, "second WELCOME");
        else
            on_welcome(w, &m->u.welcome);
        break;
    case PROTO_HEARTBEAT:
        break; /* last_rx_ns was updated when the bytes arrived */
    case PROTO_SUBMITTED:
    case PROTO_OUTCOME:
        if (w->session_version < 2) {
            protocol_error(w, PROTO_ERR_UNEXPECTED, "%s in a version-1 session", proto_type_name(m->type));
            break;
        }
        if (m->type == PROTO_OUTCOME) {
            tpi_submit_on_outcome(w, &m->u.outcome);
            break;
        }
        tpi_submit_on_submitted(w, &m->u.submitted);
        check_drained(w);
        break;
    case PROTO_CONFIRM:
        if (w->session_version < 3) {
            protocol_error(w, PROTO_ERR_UNEXPECTED, "CONFIRM in a version-%u session",
                           w->session_version);
            break;
        }
        tpi_inv_on_confirm(w, &m->u.confirm);
        break;
    case PROTO_ERROR:
        /* An older dispatcher refuses our HELLO: the next attempt offers the version
         * below (3, then 2, then 1: no inventory below 3, no SUBMIT below 2); a
         * producer-only client has nothing to say in version 1. */
        if (w->state == TPI_HANDSHAKE && m->u.error.code == PROTO_ERR_VERSION &&
            w->hello_version > PROTO_VERSION_MIN && (w->ntypes > 0 || w->hello_version > 2)) {
            tpi_log(w, TP_LOG_INFO, "the dispatcher does not speak protocol version %u; using %u",
                    w->hello_version, w->hello_version - 1);
            w->hello_version--;
        }
        snprintf(why, sizeof(why), "dispatcher sent ERROR %u: %.*s", m->u.error.code,
                 (int)(m->u.error.message.len > 150 ? 150 : m->u.error.message.len),
                 (const char *)m->u.error.message.ptr);
        /* The receiver of an ERROR closes, without answering. */
        if (m->u.error.code == PROTO_ERR_NOT_LEADER) {
            not_leader(w, why);
            break;
        }
        conn_close(w, m->u.error.code == PROTO_ERR_SHUTDOWN ? TP_LOG_INFO : TP_LOG_WARN, why);
        break;
    case PROTO_STOP:
        w->peer_stopped = 1;
        tpi_log(w, TP_LOG_INFO, "dispatcher sent STOP; finishing %u deliveries", w->in_flight);
        if (w->state == TPI_READY)
            set_state(w, TPI_DRAINING);
        check_drained(w);
        break;
    case PROTO_CANCEL:
        on_cancel(w, &m->u.cancel);
        break;
    default:
        protocol_error(w, PROTO_ERR_UNEXPECTED, "unexpected %s frame", proto_type_name(m->type));
        break;
    }
}

/* take_msg decodes the whole frame at p (rd announced it; not a TASK) and acts on it.
 * Returns 0, or -1 when it was malformed (the connection is being closed). */
static int take_msg(tp_worker *w, const proto_frame_reader *rd, const uint8_t *p)
{
    proto_msg m;

    if (proto_frame_decode(rd, p + PROTO_LEN_PREFIX, &m) != PROTO_OK) {
        protocol_error(w, PROTO_ERR_BAD_FRAME, "malformed %s frame of %u bytes",
                       proto_type_name(p[PROTO_LEN_PREFIX]), rd->body_len);
        return -1;
    }
    handle_msg(w, &m);
    return 0;
}

/* http_answered: an HTTP server answered our HELLO (its "HTTP/" announces a frame of
 * over 1 GB, refused anyway): the address is not a dispatcher's worker port, most
 * likely taskpushd's admin port. The attempt fails saying so, with no ERROR frame
 * (an HTTP server could not read it). Returns 1 when it did. */
static int http_answered(tp_worker *w, const uint8_t *p, size_t n)
{
    if (w->state != TPI_HANDSHAKE || p == NULL || !proto_looks_like_http_response(p, n))
        return 0;
    conn_close(w, TP_LOG_WARN, "an HTTP server answered: this is not a dispatcher's worker port "
                               "(taskpushd's admin port?); workers connect to taskpushd --listen");
    return 1;
}

/* process_input decodes whole frames from the input, at most
 * TPI_FRAMES_PER_EVENT of them; if more are waiting it re-arms more_ev and
 * returns, so that timers and other events run in between. Only the frame
 * being decoded is made contiguous (evbuffer_pullup of its own length). */
static void process_input(tp_worker *w)
{
    proto_frame_reader rd;
    uint64_t gen = w->gen;

    proto_frame_reader_init(&rd, TPI_FRAMES_PER_EVENT);
    while (w->bev != NULL && w->gen == gen && receiving(w)) {
        struct evbuffer *in = bufferevent_get_input(w->bev);
        size_t avail = evbuffer_get_length(in);
        const uint8_t *p;
        uint32_t body_len;
        int rc;

        if (avail < PROTO_LEN_PREFIX)
            break;
        /* Yields as soon as a prefix waits, before looking at it (the dispatcher
         * yields only when a whole frame waits). */
        if (proto_frame_reader_spent(&rd)) {
            TPI_COUNT(w, read_yields);
            event_active(w->more_ev, EV_TIMEOUT, 0);
            break;
        }
        p = evbuffer_pullup(in, PROTO_LEN_PREFIX);
        rc = proto_frame_next(&rd, p, avail, w->max_body_in);
        body_len = rd.body_len;
        if (rc == PROTO_FRAME_NEED_MORE)
            break;
        if (rc != PROTO_FRAME_WHOLE) {
            if (http_answered(w, evbuffer_pullup(in, avail < 5 ? (ev_ssize_t)avail : 5), avail))
                break;
            protocol_error(w, PROTO_ERR_BAD_FRAME, "frame announcing %u bytes: %s (limit %u)",
                           body_len, proto_status_text(rc), w->max_body_in);
            break;
        }
        TPI_COUNT(w, frames_received);
        p = evbuffer_pullup(in, PROTO_LEN_PREFIX + 1);
        if (p[PROTO_LEN_PREFIX] == PROTO_TASK) {
            receive_task(w, &rd, NULL, in);
            continue;
        }
        p = evbuffer_pullup(in, (ssize_t)proto_frame_size(&rd));
        if (p == NULL) {
            close_after_flush(w, TP_LOG_ERROR, "out of memory");
            break;
        }
        if (take_msg(w, &rd, p) < 0)
            break;
        if (w->bev != NULL && w->gen == gen)
            evbuffer_drain(in, proto_frame_size(&rd));
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    tp_worker *w = arg;

    (void)bev;
    w->last_rx_ns = tpi_now_ns();
    process_input(w);
}

static void on_more(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    process_input(arg);
}

/* read_frames_from takes the frames of one read when nothing was buffered before it,
 * where they lie rather than through the input evbuffer (whose chains are allocated by
 * each read and freed by the drain that empties them, with its callbacks run at each
 * add and drain). The rules are process_input's. What is left, part of a frame or the
 * frames after a yield, goes into the input for process_input. */
static void read_frames_from(tp_worker *w, const uint8_t *buf, size_t n)
{
    proto_frame_reader rd;
    uint64_t gen = w->gen;
    size_t off = 0;
    int yielded = 0;

    w->last_rx_ns = tpi_now_ns();
    proto_frame_reader_init(&rd, TPI_FRAMES_PER_EVENT);
    while (w->bev != NULL && w->gen == gen && receiving(w) && n - off >= PROTO_LEN_PREFIX) {
        const uint8_t *p = buf + off;
        int rc;

        if (proto_frame_reader_spent(&rd)) {
            yielded = 1;
            break;
        }
        rc = proto_frame_next(&rd, p, n - off, w->max_body_in);
        if (rc == PROTO_FRAME_NEED_MORE)
            break;
        if (rc != PROTO_FRAME_WHOLE) {
            if (http_answered(w, p, n - off))
                return;
            protocol_error(w, PROTO_ERR_BAD_FRAME, "frame announcing %u bytes: %s (limit %u)",
                           rd.body_len, proto_status_text(rc), w->max_body_in);
            return;
        }
        TPI_COUNT(w, frames_received);
        off += proto_frame_size(&rd);
        if (p[PROTO_LEN_PREFIX] == PROTO_TASK) {
            receive_task(w, &rd, p + PROTO_LEN_PREFIX, NULL);
            continue;
        }
        if (take_msg(w, &rd, p) < 0)
            return;
    }
    if (off == n || w->bev == NULL || w->gen != gen)
        return;
    struct evbuffer *in = bufferevent_get_input(w->bev);
    evbuffer_unfreeze(in, 0); /* the bufferevent keeps the input's end frozen */
    int rc = evbuffer_add(in, buf + off, n - off);
    evbuffer_freeze(in, 0);
    if (rc < 0) {
        close_after_flush(w, TP_LOG_ERROR, "out of memory");
        return;
    }
    if (yielded) {
        TPI_COUNT(w, read_yields);
        event_active(w->more_ev, EV_TIMEOUT, 0);
    }
}

static void on_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;
    proto_msg m = {.type = PROTO_HEARTBEAT};
    int64_t now = tpi_now_ns();
    int64_t silent_ms = (now - w->last_rx_ns) / 1000000;
    int64_t quiet_ms = (now - w->last_tx_ns) / 1000000;

    (void)fd;
    (void)what;
    if (silent_ms >= (int64_t)w->heartbeat_ms * TPI_HEARTBEAT_MISSES) {
        char why[96];

        snprintf(why, sizeof(why), "dispatcher silent for %lld ms", (long long)silent_ms);
        conn_close(w, TP_LOG_WARN, why);
        return;
    }
    /* Sent when this side has sent nothing for an interval: the timer ticks
     * every half interval, so more than half an interval of quiet now means a
     * full one by the next tick. */
    if (quiet_ms * 2 > (int64_t)w->heartbeat_ms && send_msg(w, &m) == 0)
        TPI_COUNT(w, heartbeats_sent);
}

/* ---- stopping ---- */

static void stop_graceful(tp_worker *w)
{
    if (w->stopping)
        return;
    w->stopping = 1;
    event_del(w->reconnect_ev);
    tpi_log(w, TP_LOG_INFO, "stopping: finishing %u deliveries", w->in_flight);
    tpi_inv_abandon(w); /* no next connection will take them */
    switch (w->state) {
    case TPI_CONNECTING:
    case TPI_HANDSHAKE:
        release(w);
        drop_addrinfo(w);
        break;
    case TPI_READY:
        set_state(w, TPI_DRAINING);
        /* fall through */
    case TPI_DRAINING:
        send_stop(w);
        check_drained(w);
        break;
    default: /* IDLE: nothing to close; CLOSING: closing already */
        break;
    }
    maybe_finish(w);
}

static void stop_now(tp_worker *w)
{
    w->stopping = 1;
    event_del(w->reconnect_ev);
    tpi_log(w, TP_LOG_INFO, "stopping at once: abandoning %u deliveries", w->in_flight);
    if (w->established)
        TPI_COUNT(w, disconnects);
    release(w); /* marks every delivery held cancelled */
    tpi_inv_abandon(w);
    drop_addrinfo(w);
    maybe_finish(w);
}

/* read_stops adds the tp_worker_stop() calls not seen yet; returns them. */
static uint64_t read_stops(tp_worker *w)
{
    uint64_t v = 0;

    if (read(w->stop_fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        v = 0;
    w->stop_requests += v;
    return v;
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    tp_worker *w = arg;

    (void)fd;
    (void)what;
    if (read_stops(w) == 0)
        return;
    if (w->stop_requests >= 2)
        stop_now(w);
    else
        stop_graceful(w);
}

/* ---- the public calls ---- */

tp_worker *tp_worker_new(const tp_worker_options *opts, tp_error *err)
{
    tp_worker_options o;
    tp_worker *w = NULL;
    tp_worker *ret = NULL;
    int rc;
    int mutexes = 0;

    if (err != NULL) {
        err->code = TP_OK;
        err->text[0] = '\0';
    }
    if (tpi_options_copy(opts, &o, err) < 0 || tpi_options_check(&o, err) < 0)
        goto done;
    opts = &o;
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        tpi_error_set(err, TP_ENOMEM, "out of memory");
        goto done;
    }
    w->stop_fd = -1;
    w->wake_fd = -1;
    w->opts = o;
    /* The TLS files are read here, once; the copy keeps no pointer to them. */
    w->opts.tls_ca_file = w->opts.tls_cert_file = w->opts.tls_key_file = NULL;
    if (o.tls && tpi_tls_ctx_new(&o, &w->tls_ctx, err) < 0)
        goto done;
    w->addresses = strdup(opts->addresses);
    if (opts->name != NULL) {
        w->name = strdup(opts->name);
    } else {
        char host[128] = "localhost";
        char name[TP_MAX_NAME_LEN + 1];

        if (gethostname(host, sizeof(host)) != 0)
            snprintf(host, sizeof(host), "localhost");
        host[sizeof(host) - 1] = '\0';
        snprintf(name, sizeof(name), "%s:%ld", host, (long)getpid());
        w->name = strdup(name);
    }
    if (opts->token != NULL && opts->token[0] != '\0')
        w->token = strdup(opts->token);
    if (w->addresses == NULL || w->name == NULL ||
        (opts->token != NULL && opts->token[0] != '\0' && w->token == NULL)) {
        tpi_error_set(err, TP_ENOMEM, "out of memory");
        goto done;
    }
    w->opts.addresses = w->addresses;
    w->opts.name = w->name;
    w->opts.token = w->token;
    rc = tpi_addr_parse(w->addresses, &w->addrs, &w->naddrs, err);
    if (rc < 0)
        goto done;
    w->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->stop_fd < 0 || w->wake_fd < 0) {
        tpi_error_set(err, TP_ESYS, "eventfd: %s", strerror(errno));
        goto done;
    }
    if (pthread_mutex_init(&w->job_mu, NULL) != 0 || pthread_mutex_init(&w->done_mu, NULL) != 0 ||
        pthread_cond_init(&w->job_cv, NULL) != 0 || tpi_submit_init(w) != 0) {
        tpi_error_set(err, TP_ESYS, "cannot initialise a mutex");
        goto done;
    }
    mutexes = 1;
    w->rng = (uint64_t)tpi_now_ns() ^ (uint64_t)(uintptr_t)w ^ ((uint64_t)getpid() << 32);
    if (w->rng == 0)
        w->rng = 1;
    atomic_init(&w->running, 0);
    w->state = TPI_IDLE;
    ret = w;
    w = NULL;
done:
    if (w != NULL) {
        /* Before the mutexes exist tp_worker_free() cannot be used (it
         * destroys them); a failed pthread_*_init leaves nothing to free. */
        if (!mutexes) {
            if (w->stop_fd >= 0)
                close(w->stop_fd);
            if (w->wake_fd >= 0)
                close(w->wake_fd);
            free(w->addresses);
            free(w->name);
            free(w->token);
            free(w->addrs);
            tpi_tls_ctx_free(w->tls_ctx);
            free(w);
        } else {
            tp_worker_free(w);
        }
    }
    return ret;
}

int tp_worker_add_type(tp_worker *w, const char *type, tp_handler fn, void *arg)
{
    int rc = TP_EINVAL;
    size_t len;

    if (w == NULL || type == NULL || fn == NULL || type[0] == '\0')
        goto done;
    rc = TP_EBUSY;
    if (atomic_load(&w->running))
        goto done;
    len = strlen(type);
    rc = TP_ERANGE;
    if (len > TP_MAX_TYPE_LEN || w->ntypes >= TP_MAX_TYPES)
        goto done;
    rc = TP_EEXIST;
    if (find_type(w, (const uint8_t *)type, len) != NULL)
        goto done;
    memcpy(w->types[w->ntypes].name, type, len + 1);
    w->types[w->ntypes].len = len;
    w->types[w->ntypes].fn = fn;
    w->types[w->ntypes].arg = arg;
    w->ntypes++;
    rc = TP_OK;
done:
    return rc;
}

void tp_worker_stop(tp_worker *w)
{
    int saved = errno;
    uint64_t one = 1;
    ssize_t n;

    if (w == NULL)
        return;
    do
        n = write(w->stop_fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
    errno = saved;
}

void tp_worker_free(tp_worker *w)
{
    if (w == NULL)
        return;
    close(w->stop_fd);
    close(w->wake_fd);
    pthread_mutex_destroy(&w->job_mu);
    pthread_mutex_destroy(&w->done_mu);
    pthread_cond_destroy(&w->job_cv);
    tpi_submit_destroy(w);
    free(w->addresses);
    free(w->name);
    free(w->token);
    free(w->addrs);
    tpi_tls_ctx_free(w->tls_ctx);
    proto_frame_stage_free(&w->stage);
    free(w);
}

int tp_worker_get_stats(const tp_worker *w, tp_worker_stats *out, size_t size)
{
    tp_worker_stats s;

    if (w == NULL || out == NULL)
        return TP_EINVAL;
    memset(&s, 0, sizeof(s));
#define TPI_COUNTER_COPY(name)                                                                     \
    s.name = atomic_load_explicit(&((tp_worker *)w)->counters.name, memory_order_relaxed);
    TPI_COUNTERS(TPI_COUNTER_COPY)
#undef TPI_COUNTER_COPY
    s.in_flight = atomic_load_explicit(&((tp_worker *)w)->counters.in_flight, memory_order_relaxed);
    memcpy(out, &s, size < sizeof(s) ? size : sizeof(s));
    return TP_OK;
}

/* free_events releases what run_setup created; safe on a partial setup. */
static void free_events(tp_worker *w)
{
    struct event **evs[] = {&w->stop_ev,   &w->wake_ev,   &w->reconnect_ev, &w->hs_ev,
                            &w->hb_ev,     &w->more_ev,   &w->linger_ev,    &w->stop_wait_ev,
                            &w->flush_ev};

    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++) {
        if (*evs[i] != NULL)
            event_free(*evs[i]);
        *evs[i] = NULL;
    }
    w->base = NULL;
    w->loop = NULL;
}

static int run_setup(tp_worker *w, tpi_loop *loop)
{
    w->loop = loop;
    w->base = loop->base;
    w->stop_ev = event_new(w->base, w->stop_fd, EV_READ | EV_PERSIST, on_stop, w);
    w->wake_ev = event_new(w->base, w->wake_fd, EV_READ | EV_PERSIST, on_wake, w);
    w->reconnect_ev = evtimer_new(w->base, on_reconnect, w);
    w->hs_ev = evtimer_new(w->base, on_handshake_timeout, w);
    w->hb_ev = event_new(w->base, -1, EV_PERSIST, on_heartbeat, w);
    w->more_ev = event_new(w->base, -1, 0, on_more, w);
    w->linger_ev = evtimer_new(w->base, on_linger, w);
    w->stop_wait_ev = evtimer_new(w->base, on_stop_wait, w);
    w->flush_ev = event_new(w->base, -1, 0, tpi_output_on_flush, w);
    if (w->stop_ev == NULL || w->wake_ev == NULL || w->reconnect_ev == NULL || w->hs_ev == NULL ||
        w->hb_ev == NULL || w->more_ev == NULL || w->linger_ev == NULL || w->stop_wait_ev == NULL ||
        w->flush_ev == NULL) {
        tpi_log(w, TP_LOG_ERROR, "cannot set up the event loop");
        return TP_ENOMEM;
    }
    if (event_add(w->stop_ev, NULL) < 0 || event_add(w->wake_ev, NULL) < 0) {
        tpi_log(w, TP_LOG_ERROR, "cannot set up the event loop");
        return TP_ESYS;
    }
    return TP_OK;
}

/* run_begin readies w for a run in loop; it connects once the loop runs. */
static int run_begin(tp_worker *w, tpi_loop *loop)
{
    int rc;

    w->io_thread = pthread_self();
    w->state = TPI_IDLE;
    w->bev = NULL;
    w->direct_write = 0;
    w->flush_queued = 0;
    w->read_ev = NULL;
    w->held = NULL;
    w->in_flight = 0;
    w->tasks_alive = 0;
    w->stopping = 0;
    w->finished = 0;
    w->stop_requests = 0;
    w->failures = 0;
    w->last_failure[0] = '\0';
    w->addr_idx = 0;
    w->peer_stopped = 0;
    w->stop_sent = 0;
    w->max_body_in = PROTO_MAX_BODY_DEFAULT;
    w->max_body_out = PROTO_MAX_BODY_DEFAULT;

    rc = run_setup(w, loop);
    if (rc < 0)
        return rc;
    rc = tpi_pool_start(w);
    if (rc < 0)
        return rc;
    read_stops(w);
    if (w->stop_requests > 0) {
        tpi_log(w, TP_LOG_INFO, "stop requested before the run: not connecting");
        w->finished = 1;
        return TP_OK;
    }
    tpi_log(w, TP_LOG_INFO, "worker %s starting: %zu types, capacity %u, %u threads", w->name,
            w->ntypes, w->opts.capacity, w->opts.threads);
    event_active(w->reconnect_ev, EV_TIMEOUT, 0);
    loop->live++;
    return TP_OK;
}

/* run_end closes what the loop left of w and drops every task. */
static void run_end(tp_worker *w)
{
    tp_task *done;
    tp_task *ext;

    /* The loop ends only when every worker is stopped, idle and with no task alive;
     * an error exit may leave a connection and tasks behind. */
    w->stopping = 1;
    release(w);
    tpi_inv_abandon(w);
    drop_addrinfo(w);
    tpi_submit_fail_all(w, "the worker stopped");
    tpi_pool_join(w);
    tpi_done_take(w, &done, &ext);
    while (done != NULL) {
        tp_task *t = done;

        done = t->next;
        tpi_task_free(t);
        w->tasks_alive--;
    }
    tpi_inv_free(w);
    tpi_log(w, TP_LOG_INFO, "worker %s stopped", w->name);
}

int tp_worker_run(tp_worker *w)
{
    return tp_worker_run_many(&w, 1);
}

int tp_worker_run_many(tp_worker *const *ws, size_t n)
{
    int rc = TP_EINVAL;
    size_t claimed = 0;
    size_t begun = 0;
    sigset_t pipe_set;
    sigset_t old_mask;
    int mask_set = 0;
    struct event_config *cfg = NULL;
    tpi_loop loop = {NULL, 0};

    if (ws == NULL || n == 0)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (ws[i] == NULL)
            goto out;
    rc = TP_EBUSY;
    for (; claimed < n; claimed++) {
        int expected = 0;

        if (!atomic_compare_exchange_strong(&ws[claimed]->running, &expected, 1))
            goto out; /* running elsewhere, or named twice */
    }

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    mask_set = pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask) == 0;

    rc = TP_ENOMEM;
    cfg = event_config_new();
    if (cfg == NULL)
        goto teardown;
    /* One base, used by this thread only: libevent needs no locks. */
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
    loop.base = event_base_new_with_config(cfg);
    if (loop.base == NULL) {
        tpi_log(ws[0], TP_LOG_ERROR, "cannot set up the event loop");
        goto teardown;
    }
    for (; begun < n; begun++) {
        rc = run_begin(ws[begun], &loop);
        if (rc < 0) {
            begun++; /* its partial setup is undone below */
            goto teardown;
        }
    }
    if (loop.live > 0 && event_base_dispatch(loop.base) < 0) {
        tpi_log(ws[0], TP_LOG_ERROR, "event loop failed");
        rc = TP_ESYS;
    }
    for (size_t i = 0; i < n; i++)
        run_end(ws[i]);
teardown:
    for (size_t i = 0; i < begun; i++) {
        tpi_pool_join(ws[i]);
        free_events(ws[i]);
    }
    if (loop.base != NULL)
        event_base_free(loop.base);
    if (cfg != NULL)
        event_config_free(cfg);
    if (mask_set) {
        if (!sigismember(&old_mask, SIGPIPE)) {
            struct timespec zero = {0, 0};

            while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE)
                ;
        }
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    }
out:
    for (size_t i = 0; i < claimed; i++)
        atomic_store(&ws[i]->running, 0);
    return rc;
}
