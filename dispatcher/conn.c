#include "conn.h"

#include "utf8.h"
#include "stats.h"
#include "progress.h"
#include "frame_reader.h"
#include "proto.h"
#include "tls.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

/* Frames handled per read callback before yielding to other connections
 * (memcached's reqs_per_event): a worker that floods DONEs cannot starve the
 * rest of the loop. */
#define FRAMES_PER_EVENT 256
/* Bytes read per wake-up of a plaintext connection at most: before HELLO as libevent's
 * own reads (a hostile connection holds no more than one chunk), after it more. */
#define READ_MAX_PRE_HELLO 4096
#define READ_MAX 16384

/* A CLOSING connection whose peer does not read its last frame is freed after this. */
#define CLOSING_LINGER_MS 1000

/* Until its HELLO is accepted a peer may send no frame larger than the largest HELLO
 * (every field at its bound, about 17 KiB): nothing unauthenticated makes the daemon
 * buffer a 16 MiB frame. */
#define PRE_HELLO_MAX_BODY ((uint32_t)(PROTO_MAX_HEAD - PROTO_LEN_PREFIX))

/* A frame that has begun must go on arriving at this rate at least (bytes per ms, about
 * 64 KB/s) beyond the 3 heartbeats any peer gets: a slow sender of half frames
 * (slowloris) is dropped, a large result on a slow link is not. */
#define MIN_FRAME_BYTES_PER_MS 64

static void submit_budget_leave(dsp_conn *c);

static const char *const state_names[DSP_CONN_NSTATES] = {"want-hello", "active", "closing"};

const char *dsp_conn_state_text(int state)
{
    return state >= 0 && state < DSP_CONN_NSTATES ? state_names[state] : "?";
}

static void conn_set_state(dsp_conn *c, int state)
{
    if (state < 0 || state >= DSP_CONN_NSTATES)
        abort();
    log_debug(&c->srv->log, "conn %llu %s: %s -> %s", (unsigned long long)c->id, c->addr,
              dsp_conn_state_text(c->state), dsp_conn_state_text(state));
    c->state = state;
}

/* A plaintext connection writes its socket itself, once per loop pass (flush_ev), rather
 * than through the bufferevent's write event: that saves two epoll_ctl calls and a loop
 * round for every batch of TASK frames, and for every connection closed with an ERROR
 * (hostile ones included). The write event is enabled only while the socket refuses part
 * of the output. TLS connections keep the bufferevent's own writes. */
void dsp_conn_output_added(dsp_conn *c)
{
    dsp_server *srv = c->srv;
    if (!c->direct_write || c->flush_queued)
        return;
    c->flush_queued = true;
    c->flush_next = srv->conns.flush_head;
    srv->conns.flush_head = c;
    event_active(srv->conns.flush_ev, EV_TIMEOUT, 0);
}

/* The stage's frames go after what the output already holds. */
static void stage_spill(dsp_conn *c)
{
    if (c->stage.len == 0)
        return;
    if (evbuffer_add(bufferevent_get_output(c->bev), c->stage.buf, c->stage.len) < 0)
        log_error(&c->srv->log, "out of memory: %zu bytes to %s lost", c->stage.len, c->addr);
    c->stage.len = 0;
}

/* A pass's frames to a plaintext connection are gathered in its stage (frame_stage.h)
 * and go to the socket in one send, past the bufferevent: about 550 instructions a task
 * less at K=256 of capacity 4. */
uint8_t *dsp_conn_stage_reserve(dsp_conn *c, size_t n)
{
    if (!c->direct_write) {
        stage_spill(c); /* frames staged before a close turned direct writes off */
        return NULL;
    }
    uint8_t *p = proto_frame_stage_reserve(&c->stage, n);
    if (!p) { /* full, too large a frame, or no memory */
        stage_spill(c);
        p = proto_frame_stage_reserve(&c->stage, n);
    }
    return p;
}

/* Sends the stage when the output is empty; what the socket does not take now, and
 * the whole stage otherwise, joins the output. */
static void stage_send(dsp_conn *c)
{
    if (c->stage.len == 0)
        return;
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0 &&
        proto_frame_stage_send(&c->stage, bufferevent_getfd(c->bev)) > 0)
        c->out_progress_ms = dsp_now_ms();
    stage_spill(c);
    proto_frame_stage_shrink(&c->stage, c->slots.in_flight > 0);
}

/* Writes what the socket takes now. On EAGAIN or an error the rest waits for the write
 * event, which reports an error through event_cb like any other. Returns the bytes left. */
static size_t conn_write_socket(dsp_conn *c)
{
    stage_send(c);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(out) == 0)
        return 0;
    /* The bufferevent keeps the start of its output frozen except inside its own write
     * callback; do as it does. */
    evbuffer_unfreeze(out, 1);
    (void)evbuffer_write(out, bufferevent_getfd(c->bev));
    evbuffer_freeze(out, 1);
    size_t left = evbuffer_get_length(out);
    if (left > 0)
        bufferevent_enable(c->bev, EV_WRITE);
    return left;
}

static void conn_flush(dsp_conn *c)
{
    if (conn_write_socket(c) == 0 && c->state == DSP_CONN_CLOSING)
        event_active(c->free_ev, EV_TIMEOUT, 0);
}

void dsp_conn_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    while (srv->conns.flush_head) {
        dsp_conn *c = srv->conns.flush_head;
        srv->conns.flush_head = c->flush_next;
        if (c->nconfirms > 0) /* while still queued, so that they join this write */
            dsp_conn_send_confirms(c);
        c->flush_queued = false;
        conn_flush(c);
    }
}

static void conn_unqueue_flush(dsp_conn *c)
{
    if (!c->flush_queued)
        return;
    for (dsp_conn **p = &c->srv->conns.flush_head; *p; p = &(*p)->flush_next)
        if (*p == c) {
            *p = c->flush_next;
            break;
        }
    c->flush_queued = false;
}

/* Bytes waiting to be sent to c (its output and its stage). */
static size_t conn_output_len(dsp_conn *c)
{
    return evbuffer_get_length(bufferevent_get_output(c->bev)) + c->stage.len;
}

bool dsp_conn_output_room(dsp_conn *c, size_t n)
{
    int64_t max = c->srv->cfg->max_conn_output_bytes;
    if (c->state == DSP_CONN_CLOSING)
        return false;
    /* One frame always fits (a result of --max-frame into an empty output). */
    if (conn_output_len(c) == 0 || (int64_t)(conn_output_len(c) + n) <= max)
        return true;
    if (c->direct_write) { /* a reader that keeps up takes a burst's frames as they come */
        conn_write_socket(c);
        if (conn_output_len(c) == 0 || (int64_t)(conn_output_len(c) + n) <= max)
            return true;
    }
    /* Over the bound: a burst (one write batch's OUTCOMEs) gets 3 heartbeats to drain
     * under it (dsp_conn_tick), within twice the bound. Beyond, holding more would let
     * one slow reader hold every answer in memory (each OUTCOME up to 16 MiB): it is
     * stalled. What it waited for is in the table. */
    if ((int64_t)(conn_output_len(c) + n) <= 2 * max) {
        if (c->out_over_ms == 0)
            c->out_over_ms = dsp_now_ms();
        return true;
    }
    c->srv->stats.conns.stalled_total++;
    dsp_conn_close(c, 0, "does not read what it is sent fast enough (--max-conn-output-bytes)");
    event_active(c->free_ev, EV_TIMEOUT, 0); /* its output will not drain in time */
    return false;
}

/* The write event of a direct-write connection goes off again once the socket took
 * the rest of the output. */
static void drained_cb(struct bufferevent *bev, void *arg)
{
    dsp_conn *c = arg;
    if (c->direct_write && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE);
}

/* Reading stops while high bytes wait in the input (a frame larger than any legal one
 * is buffered; the frame check closes such a connection long before that). */
static void conn_set_read_high(dsp_conn *c, size_t high)
{
    c->read_high = high;
    bufferevent_setwatermark(c->bev, EV_READ, 0, high);
}

static void conn_write(dsp_conn *c, const void *data, size_t len)
{
    uint8_t *p = dsp_conn_stage_reserve(c, len);
    if (p) {
        memcpy(p, data, len);
        c->stage.len += len;
    } else {
        evbuffer_add(bufferevent_get_output(c->bev), data, len);
    }
    c->last_tx_ms = dsp_now_ms();
    c->srv->stats.conns.frames_out_total++;
    dsp_conn_output_added(c);
}

static void conn_send_msg(dsp_conn *c, const proto_msg *m)
{
    uint8_t buf[PROTO_LEN_PREFIX + 64 + PROTO_MAX_NAME_LEN + 1024];
    size_t n = proto_msg_encode(m, buf, sizeof buf);
    if (n == 0) {
        log_error(&c->srv->log, "cannot encode a %s frame", proto_type_name(m->type));
        return;
    }
    conn_write(c, buf, n);
}

void dsp_conn_send_simple(dsp_conn *c, uint8_t type)
{
    const uint8_t frame[PROTO_LEN_PREFIX + 1] = {0, 0, 0, 1, type};
    conn_write(c, frame, sizeof frame);
}

void dsp_conn_send_frame(dsp_conn *c, const proto_msg *m)
{
    size_t n = proto_msg_size(m);
    if (n == 0) {
        log_error(&c->srv->log, "cannot encode a %s frame", proto_type_name(m->type));
        return;
    }
    if (!dsp_conn_output_room(c, n))
        return;
    uint8_t *p = dsp_conn_stage_reserve(c, n);
    if (p) {
        proto_msg_encode(m, p, n);
        c->stage.len += n;
    } else {
        /* Written in place: a SUBMITTED of 1000 results or an OUTCOME with a 16 MiB result. */
        struct evbuffer *out = bufferevent_get_output(c->bev);
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(out, (ev_ssize_t)n, &v, 1) < 1 || v.iov_len < n) {
            log_error(&c->srv->log, "out of memory for a %s frame of %zu bytes",
                      proto_type_name(m->type), n);
            return;
        }
        proto_msg_encode(m, v.iov_base, n);
        v.iov_len = n;
        evbuffer_commit_space(out, &v, 1);
    }
    c->last_tx_ms = dsp_now_ms();
    c->srv->stats.conns.frames_out_total++;
    dsp_conn_output_added(c);
}

void dsp_conn_send_confirms(dsp_conn *c)
{
    uint32_t sent = 0;

    if (c->state != DSP_CONN_ACTIVE)
        c->nconfirms = 0;
    while (sent < c->nconfirms) {
        uint32_t k = c->nconfirms - sent;
        proto_msg m = {.type = PROTO_CONFIRM};

        if (k > PROTO_MAX_CONFIRM)
            k = PROTO_MAX_CONFIRM;
        m.u.confirm.n = (uint16_t)k;
        m.u.confirm.items = c->confirms + sent;
        dsp_conn_send_frame(c, &m);
        c->srv->stats.tasks.confirmed_total += k;
        sent += k;
    }
    c->nconfirms = 0;
}

static void free_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_conn_free(arg);
}

static void closing_write_cb(struct bufferevent *bev, void *arg)
{
    dsp_conn *c = arg;
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        event_active(c->free_ev, EV_TIMEOUT, 0);
}

void dsp_conn_close(dsp_conn *c, uint16_t code, const char *why)
{
    if (c->state == DSP_CONN_CLOSING)
        return;
    if (c->state == DSP_CONN_ACTIVE) {
        log_limited(&c->srv->log, &c->srv->conns.peer_log, dsp_now_ms(), DSP_LOG_INFO,
                    "worker %s (%s) leaves: %s; %u deliveries taken back",
                 c->name ? c->name : "?", c->addr, why, (unsigned)c->slots.in_flight);
        dsp_dispatch_worker_left(c->srv, c, c->refund);
        dsp_conn_send_confirms(c); /* what waited: spares the worker sending them again */
    } else {
        log_limited(&c->srv->log, &c->srv->conns.peer_log, dsp_now_ms(), DSP_LOG_INFO,
                    "connection %s closed before HELLO: %s", c->addr, why);
    }
    c->slots.accepting = false;
    submit_budget_leave(c);
    conn_set_state(c, DSP_CONN_CLOSING);
    c->last_rx_ms = dsp_now_ms(); /* start of the linger */
    bufferevent_disable(c->bev, EV_READ);
    if (c->read_ev)
        event_del(c->read_ev);
    if (code) {
        proto_msg m = {.type = PROTO_ERROR};
        m.u.error.code = code;
        m.u.error.message.ptr = (const uint8_t *)why;
        m.u.error.message.len = strlen(why);
        conn_send_msg(c, &m);
    }
    bufferevent_setcb(c->bev, NULL, closing_write_cb, NULL, c);
    if (c->direct_write) { /* at once: most closing peers take the ERROR whole */
        conn_unqueue_flush(c);
        conn_write_socket(c);
    }
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        event_active(c->free_ev, EV_TIMEOUT, 0);
}

void dsp_conn_free(dsp_conn *c)
{
    dsp_server *srv = c->srv;
    dsp_conn_submit_closed(c);
    submit_budget_leave(c);
    dsp_inv_conn_freed(c);
    if (c->name) /* past HELLO: its name's /metrics series goes on */
        dsp_stats_worker_left(srv, c->name, c->completed_total, dsp_now_ms());
    if (c->state == DSP_CONN_ACTIVE)
        dsp_dispatch_worker_left(srv, c, c->refund);
    for (dsp_zombie *z = c->zombies, *next; z; z = next) {
        next = z->next;
        free(z);
    }
    conn_unqueue_flush(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns.list = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->conns.n--;
    srv->tick.closed_since_trim++;
    if (!c->welcomed)
        dsp_server_handshake_failed(srv);
    if (c->read_ev)
        event_free(c->read_ev);
    bufferevent_free(c->bev);
    event_free(c->free_ev);
    free(c->name);
    free(c->types);
    proto_frame_stage_free(&c->stage);
    free(c);
}

/* ---- the server's budget of submissions (--max-submit-bytes) ---- */

/* Whether c may read the SUBMIT frame of size bytes now: it reserves the bytes in the
 * budget, which they stay in as the frame's copy until the rows are committed. One frame
 * is always admitted when nothing else is held, so a frame larger than the budget still
 * goes (alone). */
static bool submit_budget_take(dsp_conn *c, uint64_t size)
{
    dsp_server *srv = c->srv;
    if (c->submit_reserved > 0)
        return true; /* reserved when it began */
    uint64_t held = srv->submit.bytes_held + srv->submit.bytes_reserved;
    if (held > 0 && held + size > (uint64_t)srv->cfg->max_submit_bytes)
        return false;
    c->submit_reserved = size;
    srv->submit.bytes_reserved += size;
    return true;
}

/* Whether the frame at head (avail bytes of it here, at least its prefix) may be read on:
 * anything but a SUBMIT may; a SUBMIT when the budget takes it. */
static bool frame_admitted(dsp_conn *c, const uint8_t *head, size_t avail)
{
    if (c->state != DSP_CONN_ACTIVE || avail < PROTO_LEN_PREFIX + 1 || head[PROTO_LEN_PREFIX] != PROTO_SUBMIT)
        return true;
    return submit_budget_take(c, (uint64_t)PROTO_LEN_PREFIX + proto_frame_announced(head, avail));
}

/* c is not read until the budget has room (dsp_conn_submit_budget_freed). */
static void submit_budget_wait(dsp_conn *c)
{
    if (c->budget_wait)
        return;
    c->budget_wait = true;
    c->srv->submit.budget_waiters++;
    if (c->read_ev)
        event_del(c->read_ev);
    else
        bufferevent_disable(c->bev, EV_READ);
}

/* The frame c reserved was taken (its copy, if queued, is held instead) or dropped. */
static void submit_budget_release(dsp_conn *c)
{
    if (c->submit_reserved == 0)
        return;
    c->srv->submit.bytes_reserved -= c->submit_reserved;
    c->submit_reserved = 0;
    dsp_conn_submit_budget_freed(c->srv);
}

/* c closes: it reserves and waits for nothing any more. */
static void submit_budget_leave(dsp_conn *c)
{
    if (c->budget_wait) {
        c->budget_wait = false;
        c->srv->submit.budget_waiters--;
    }
    submit_budget_release(c);
}

void dsp_conn_submit_budget_freed(dsp_server *srv)
{
    if (srv->submit.budget_waiters == 0)
        return;
    for (dsp_conn *c = srv->conns.list; c && srv->submit.budget_waiters > 0; c = c->next) {
        if (!c->budget_wait)
            continue;
        c->budget_wait = false;
        srv->submit.budget_waiters--;
        if (c->state != DSP_CONN_ACTIVE)
            continue;
        if (c->read_ev) {
            c->read_suspended = false; /* sock_read_cb suspends it again if need be */
            event_add(c->read_ev, NULL);
        } else {
            bufferevent_enable(c->bev, EV_READ);
        }
        bufferevent_trigger(c->bev, EV_READ, BEV_OPT_DEFER_CALLBACKS); /* what is buffered */
    }
}

/* ---- frames from the worker ---- */

static bool token_matches(const char *want, proto_bytes got)
{
    size_t n = strlen(want);
    unsigned char diff = (unsigned char)(n != got.len);
    /* compare every byte whatever the length, so timing tells nothing */
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)want[i] ^ (i < got.len ? got.ptr[i] : 0);
    return diff == 0;
}

/* Why a task type from HELLO cannot name rows of the table's task_type column
 * (VARCHAR(64) utf8mb4, binary collation), or NULL when it can. A type the table cannot
 * hold would make every claim fail (MariaDB error 1300 for bytes that are not UTF-8). */
static const char *type_problem(proto_bytes t)
{
    return dsp_conn_type_problem(t.ptr, t.len);
}

const char *dsp_conn_type_problem(const uint8_t *ptr, size_t len)
{
    proto_bytes t = {ptr, len};
    if (t.len == 0)
        return "a task type may not be empty";
    if (dsp_utf8_valid_prefix(t.ptr, t.len) != t.len)
        return "a task type must be UTF-8";
    size_t chars = 0;
    for (size_t i = 0; i < t.len; i++) {
        if (t.ptr[i] == 0)
            return "a task type may not contain a NUL byte";
        chars += (t.ptr[i] & 0xC0) != 0x80;
    }
    if (chars > 64)
        return "a task type has at most 64 characters";
    /* utf8mb4_bin pads: in SQL 'resize ' = 'resize', in C they differ. */
    if (t.ptr[t.len - 1] == ' ')
        return "a task type may not end with a space";
    return NULL;
}

/* Lets go of the types c registered (none are in use by c's slots yet). */
static void drop_types(dsp_conn *c)
{
    for (size_t i = 0; i < c->ntypes; i++)
        dsp_server_type_release_if_unused(c->srv, c->types[i]);
    c->ntypes = 0;
}

static void refuse_hello(dsp_conn *c, uint16_t code, const char *why)
{
    c->srv->stats.conns.rejected_total++;
    drop_types(c);
    dsp_conn_close(c, code, why);
}

static void handle_hello(dsp_conn *c, const proto_hello *h)
{
    dsp_server *srv = c->srv;
    const dsp_config *cfg = srv->cfg;
    if (h->version < PROTO_VERSION_MIN || h->version > PROTO_VERSION) {
        refuse_hello(c, PROTO_ERR_VERSION, "protocol version not supported");
        return;
    }
    if (cfg->token && !token_matches(cfg->token, h->token)) {
        refuse_hello(c, PROTO_ERR_AUTH, "missing or wrong token");
        return;
    }
    /* A standby would hold a worker idle: it sends it on to the leader. A producer
     * stays; its SUBMITs are answered UNAVAILABLE (conn_submit.c). */
    if (h->ntypes > 0 && srv->db && !(srv->lead.leading && dsp_db_lease_valid(srv->db))) {
        refuse_hello(c, PROTO_ERR_NOT_LEADER, "this dispatcher does not lead the table");
        return;
    }
    if ((int64_t)h->ntypes > cfg->max_types_per_worker) {
        refuse_hello(c, PROTO_ERR_UNEXPECTED, "too many task types for one worker (--max-types-per-worker)");
        return;
    }
    for (uint16_t i = 0; i < h->ntypes; i++) {
        const char *why = type_problem(h->types[i]);
        if (why) {
            refuse_hello(c, PROTO_ERR_UNEXPECTED, why);
            return;
        }
        /* A shard never delivers another shard's type: say so rather than hold it idle. */
        if (!dsp_shard_has(&cfg->shard_spec, h->types[i].ptr, h->types[i].len)) {
            refuse_hello(c, PROTO_ERR_UNEXPECTED,
                         "a task type this dispatcher's shard does not own (--types)");
            return;
        }
    }
    c->version = h->version;
    c->name = strndup((const char *)h->name.ptr, h->name.len);
    c->types = calloc(h->ntypes ? h->ntypes : 1, sizeof *c->types); /* 0 types: a producer */
    if (!c->name || !c->types) {
        dsp_conn_close(c, PROTO_ERR_SHUTDOWN, "out of memory");
        return;
    }
    for (uint16_t i = 0; i < h->ntypes; i++) {
        size_t before = srv->types.n;
        dsp_type *t = dsp_server_type_intern(srv, h->types[i].ptr, h->types[i].len);
        if (!t) {
            refuse_hello(c, PROTO_ERR_SHUTDOWN, "out of memory");
            return;
        }
        bool dup = false;
        for (size_t k = 0; k < c->ntypes; k++)
            dup |= c->types[k] == t;
        if (!dup)
            c->types[c->ntypes++] = t;
        if (srv->types.n > before && (int64_t)srv->types.n > cfg->max_types) {
            refuse_hello(c, PROTO_ERR_UNEXPECTED, "too many task types on this dispatcher (--max-types)");
            return;
        }
    }
    /* Credit beyond --max-capacity is not granted: the worker simply gets fewer tasks. */
    c->slots.capacity = (int64_t)h->capacity > cfg->max_capacity ? (uint32_t)cfg->max_capacity
                                                                  : h->capacity;
    if (c->slots.capacity < h->capacity)
        log_info(&srv->log, "worker %s (%s) asked for capacity %u; granted %u (--max-capacity)",
                 c->name, c->addr, (unsigned)h->capacity, (unsigned)c->slots.capacity);

    proto_msg w = {.type = PROTO_WELCOME};
    w.u.welcome.version = c->version; /* a version-1 worker is answered in version 1 */
    w.u.welcome.heartbeat_ms = (uint32_t)srv->cfg->heartbeat_ms;
    w.u.welcome.max_body = (uint32_t)srv->cfg->max_frame;
    static const char server_name[] = "taskpushd " TASKPUSH_VERSION;
    w.u.welcome.server.ptr = (const uint8_t *)server_name;
    w.u.welcome.server.len = sizeof server_name - 1;
    conn_send_msg(c, &w);

    conn_set_state(c, DSP_CONN_ACTIVE);
    c->welcomed = true;
    /* Authenticated: frames up to --max-frame may come now. */
    conn_set_read_high(c, (size_t)cfg->max_frame + PROTO_LEN_PREFIX + 65536);
    c->slots.accepting = !srv->control.draining;
    dsp_dispatch_worker_joined(srv, c);
    dsp_inv_conn_joined(c);
    if (srv->control.draining)
        dsp_conn_send_simple(c, PROTO_STOP);
    log_limited(&srv->log, &srv->conns.peer_log, dsp_now_ms(), DSP_LOG_INFO,
                "worker %s (%s) joined: capacity %u, %zu type(s)", c->name, c->addr,
             (unsigned)c->slots.capacity, c->ntypes);
}

/* Returns true when (task_id, attempt) was a cancelled delivery of c. */
static bool zombie_take(dsp_conn *c, uint64_t task_id, uint32_t attempt)
{
    for (dsp_zombie **pz = &c->zombies; *pz; pz = &(*pz)->next) {
        dsp_zombie *z = *pz;
        if (z->task_id == task_id && z->attempt == attempt) {
            *pz = z->next;
            free(z);
            return true;
        }
    }
    return false;
}

/* An adopted delivery keeps the epoch its worker named (dlv_epoch). */
static dsp_task *current_delivery(dsp_conn *c, uint64_t id, uint32_t epoch, uint32_t attempt)
{
    dsp_task *t = dsp_taskmap_get(&c->srv->tasks.map, id);
    if (t && t->holder == c && t->attempts == attempt && epoch == t->dlv_epoch)
        return t;
    return NULL;
}

static void handle_done(dsp_conn *c, const proto_done *d)
{
    dsp_task *t = current_delivery(c, d->task_id, d->epoch, d->attempt);
    if (!t) {
        bool zombie = zombie_take(c, d->task_id, d->attempt);
        c->srv->stats.tasks.late_results_total++;
        if (zombie)
            dsp_dispatch_inflight_del(c, NULL, DSP_SLOT_FREE);
        dsp_inv_done(c, d, zombie);
        return;
    }
    dsp_dispatch_inflight_del(c, t, DSP_SLOT_FREE);
    c->completed_total++;
    c->timeouts_in_row = 0;
    dsp_server_task_done(c->srv, c, t, d->outcome, d->retry_after_ms, d->data.ptr, d->data.len);
}

/* PROGRESS (version 4): the latest report of a delivery c holds replaces the one before.
 * One for a delivery c does not hold is ignored, as EXTEND: it may cross a CANCEL or a
 * lease expiry. The decoder has checked the value, the length and the UTF-8. */
_Static_assert(DSP_PROGRESS_MSG_MAX == PROTO_MAX_PROGRESS_MSG, "dsp_progress holds any message");

static void handle_progress(dsp_conn *c, const proto_progress *p)
{
    dsp_server *srv = c->srv;
    dsp_task *t = current_delivery(c, p->task_id, p->epoch, p->attempt);
    if (!t) {
        srv->stats.tasks.progress_ignored_total++;
        return;
    }
    if (!t->progress && !(t->progress = calloc(1, sizeof *t->progress)))
        return; /* out of memory: progress is advisory */
    dsp_progress *pr = t->progress;
    pr->attempt = p->attempt;
    pr->permille = p->permille;
    pr->msg_len = (uint16_t)p->message.len;
    if (p->message.len)
        memcpy(pr->msg, p->message.ptr, p->message.len);
    pr->msg[p->message.len] = '\0';
    pr->at_ms = dsp_wall_ms();
    srv->stats.tasks.progress_total++;
    dsp_progress_note(srv, t);
}

static void handle_stop(dsp_conn *c)
{
    if (!c->slots.accepting)
        return;
    dsp_dispatch_worker_stop(c->srv, c);
    /* The answer tells the worker that no TASK is on its way any more, so it
     * may close as soon as its own deliveries are answered. */
    dsp_conn_send_simple(c, PROTO_STOP);
    log_info(&c->srv->log, "worker %s asked for no more tasks", c->name);
}

/* Returns false when the connection is closing and must not be read further. body is
 * the frame's body, which m borrows from. */
static bool handle_frame(dsp_conn *c, const proto_msg *m, const uint8_t *body, size_t body_len)
{
    if (c->state == DSP_CONN_WANT_HELLO) {
        if (m->type != PROTO_HELLO) {
            dsp_conn_close(c, PROTO_ERR_UNEXPECTED, "the first frame must be HELLO");
            return false;
        }
        handle_hello(c, &m->u.hello);
        return c->state == DSP_CONN_ACTIVE;
    }
    switch (m->type) {
    case PROTO_DONE:
        handle_done(c, &m->u.done);
        break;
    case PROTO_HEARTBEAT:
        break;
    case PROTO_EXTEND: {
        dsp_task *t = current_delivery(c, m->u.extend.task_id, m->u.extend.epoch, m->u.extend.attempt);
        if (t) {
            t->deadline_ms = dsp_now_ms() + m->u.extend.extend_ms;
            c->srv->stats.tasks.extends_total++;
        }
        break;
    }
    case PROTO_STOP:
        handle_stop(c);
        break;
    case PROTO_PROGRESS:
        if (c->version < 4) {
            dsp_conn_close(c, PROTO_ERR_UNEXPECTED, "PROGRESS needs protocol version 4");
            return false;
        }
        handle_progress(c, &m->u.progress);
        break;
    case PROTO_ERROR:
        dsp_conn_close(c, 0, "the worker sent ERROR");
        return false;
    case PROTO_HOLDING:
        if (c->version < 3) {
            dsp_conn_close(c, PROTO_ERR_UNEXPECTED, "HOLDING needs protocol version 3");
            return false;
        }
        dsp_inv_holding(c, &m->u.holding);
        return c->state != DSP_CONN_CLOSING;
    case PROTO_SUBMIT:
        if (c->version < 2) {
            dsp_conn_close(c, PROTO_ERR_UNEXPECTED, "SUBMIT needs protocol version 2");
            return false;
        }
        dsp_conn_submit(c, &m->u.submit, body, body_len);
        return c->state != DSP_CONN_CLOSING;
    default:
        dsp_conn_close(c, PROTO_ERR_UNEXPECTED, "unexpected frame type");
        return false;
    }
    return true;
}

static void event_cb(struct bufferevent *bev, short what, void *arg);

/* Takes one whole frame (rd has announced it; frame starts with its length prefix).
 * Returns false when the connection is closing and must not be read further. */
static bool take_frame(dsp_conn *c, const proto_frame_reader *rd, const uint8_t *frame)
{
    dsp_server *srv = c->srv;
    uint32_t body_len = rd->body_len;
    /* PROTOCOL.md fixes where HELLO keeps its version in every version, so a
     * newer worker hears "version" even if the rest of its HELLO differs. */
    if (frame && c->state == DSP_CONN_WANT_HELLO && body_len >= 3 &&
        frame[PROTO_LEN_PREFIX] == PROTO_HELLO &&
        (((frame[PROTO_LEN_PREFIX + 1] << 8) | frame[PROTO_LEN_PREFIX + 2]) < PROTO_VERSION_MIN ||
         ((frame[PROTO_LEN_PREFIX + 1] << 8) | frame[PROTO_LEN_PREFIX + 2]) > PROTO_VERSION)) {
        srv->stats.conns.rejected_total++;
        dsp_conn_close(c, PROTO_ERR_VERSION, "protocol version not supported");
        return false;
    }
    proto_msg m;
    if (!frame || proto_frame_decode(rd, frame + PROTO_LEN_PREFIX, &m) != PROTO_OK) {
        srv->stats.conns.bad_frames_total++;
        log_limited(&srv->log, &srv->conns.peer_log, c->last_rx_ms, DSP_LOG_WARN,
                    "%s: malformed frame (type %u, length %u); closing", c->addr,
                    frame ? frame[PROTO_LEN_PREFIX] : 0, (unsigned)body_len);
        dsp_conn_close(c, PROTO_ERR_BAD_FRAME, "bad frame");
        return false;
    }
    srv->stats.conns.frames_in_total++;
    return handle_frame(c, &m, frame + PROTO_LEN_PREFIX, body_len);
}

/* An HTTP request on the worker port (a browser, curl, taskpushctl given this port as
 * --admin): its first four bytes announce a body of over 1 GB, beyond any HELLO, so the
 * connection is refused either way; an HTTP client is told where the admin port is, in
 * its own terms, instead of the ERROR frame it could not read. */
static void wrong_port_http(dsp_conn *c)
{
    dsp_server *srv = c->srv;
    char body[400], head[160];
    int bl = snprintf(body, sizeof body,
                      "this is taskpushd's worker port (--listen %s); the admin HTTP is at --admin %s\n",
                      srv->listen_bound, srv->admin_bound);
    if (bl < 0 || (size_t)bl >= sizeof body)
        bl = (int)strlen(body);
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                      "Connection: close\r\n\r\n", bl);
    srv->stats.conns.bad_frames_total++;
    log_limited(&srv->log, &srv->conns.peer_log, c->last_rx_ms, DSP_LOG_WARN,
                "%s: an HTTP request on the worker port; the admin HTTP is at --admin %s; answered 400",
                c->addr, srv->admin_bound);
    if (hl > 0 && (size_t)hl < sizeof head) {
        conn_write(c, head, (size_t)hl);
        conn_write(c, body, (size_t)bl);
    }
    dsp_conn_close(c, 0, "an HTTP request on the worker port");
}

/* Looks at the next frame of the bytes avail (starting with prefix). Returns
 * PROTO_FRAME_WHOLE when one can be taken now; otherwise the caller stops reading:
 * PROTO_FRAME_NEED_MORE, a yield (the connection's turn is over, YIELDED), or an error
 * (the connection is closed). */
enum { YIELDED = 100 };
static int next_frame(dsp_conn *c, proto_frame_reader *rd, const uint8_t *prefix, size_t avail)
{
    dsp_server *srv = c->srv;
    uint32_t max_body = c->state == DSP_CONN_WANT_HELLO ? PRE_HELLO_MAX_BODY : (uint32_t)srv->cfg->max_frame;
    int st = proto_frame_next(rd, prefix, avail, max_body);
    if (st == PROTO_FRAME_TOO_BIG && c->state == DSP_CONN_WANT_HELLO && proto_looks_like_http_request(prefix, avail)) {
        wrong_port_http(c);
        return st;
    }
    if (st < 0) {
        srv->stats.conns.bad_frames_total++;
        log_limited(&srv->log, &srv->conns.peer_log, c->last_rx_ms, DSP_LOG_WARN,
                    "%s: %s frame (length %u); closing", c->addr, proto_status_text(st),
                    (unsigned)rd->body_len);
        dsp_conn_close(c, PROTO_ERR_BAD_FRAME, st == PROTO_FRAME_TOO_BIG ? "frame too big" : "bad frame");
        return st;
    }
    if (st == PROTO_FRAME_WHOLE && proto_frame_reader_spent(rd)) {
        /* come back after the other ready connections had their turn */
        srv->stats.conns.yields_total++;
        return YIELDED;
    }
    return st;
}

/* After a read's frames: whether a frame is begun, the refill, reading again. */
static void read_done(dsp_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (evbuffer_get_length(in) == 0)
        c->frame_started_ms = 0;
    else if (c->frame_started_ms == 0)
        c->frame_started_ms = c->last_rx_ms;
    /* A SUBMIT begun is read on only once the budget holds all of it: connections that
     * wait hold a few KiB each, not a frame of up to --max-frame. */
    uint8_t head[PROTO_LEN_PREFIX + 1];
    size_t have = evbuffer_copyout(in, head, sizeof head) == (ev_ssize_t)sizeof head ? sizeof head : 0;
    if (have && !frame_admitted(c, head, have))
        submit_budget_wait(c);
    dsp_dispatch_refill(c->srv, c);
    if (c->read_suspended && !c->budget_wait && evbuffer_get_length(in) < c->read_high) {
        c->read_suspended = false;
        event_add(c->read_ev, NULL);
    }
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    dsp_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    proto_frame_reader rd;
    c->last_rx_ms = dsp_now_ms();
    proto_frame_reader_init(&rd, FRAMES_PER_EVENT);
    while (c->state != DSP_CONN_CLOSING && !c->submit_paused && !c->budget_wait) {
        uint8_t prefix[PROTO_LEN_PREFIX];
        evbuffer_copyout(in, prefix, sizeof prefix);
        int st = next_frame(c, &rd, prefix, evbuffer_get_length(in));
        if (st < 0)
            return;
        if (st == YIELDED)
            bufferevent_trigger(bev, EV_READ, BEV_OPT_DEFER_CALLBACKS);
        if (st != PROTO_FRAME_WHOLE)
            break;
        const uint8_t *frame = evbuffer_pullup(in, (ssize_t)proto_frame_size(&rd));
        if (frame && !frame_admitted(c, frame, proto_frame_size(&rd))) {
            submit_budget_wait(c);
            break;
        }
        bool go_on = take_frame(c, &rd, frame);
        evbuffer_drain(in, proto_frame_size(&rd));
        submit_budget_release(c);
        if (!go_on)
            return;
        c->frame_started_ms = c->last_rx_ms;
    }
    read_done(c);
}

/* The frames of one read when nothing was buffered before it, taken where they lie
 * rather than through the input evbuffer (whose chains are allocated by each add and
 * freed by the drain that empties them, with its callbacks run at each: a third of the
 * loop's instructions per task with 256 workers of 4 slots). What is left, part of a
 * frame or the frames after a yield, goes into the input for read_cb. */
static void read_frames_from(dsp_conn *c, const uint8_t *buf, size_t n)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    proto_frame_reader rd;
    size_t off = 0;
    bool yielded = false;
    c->last_rx_ms = dsp_now_ms();
    proto_frame_reader_init(&rd, FRAMES_PER_EVENT);
    while (c->state != DSP_CONN_CLOSING && !c->submit_paused && !c->budget_wait) {
        int st = next_frame(c, &rd, buf + off, n - off);
        if (st < 0)
            return;
        yielded = st == YIELDED;
        if (st != PROTO_FRAME_WHOLE)
            break;
        if (!frame_admitted(c, buf + off, proto_frame_size(&rd))) {
            submit_budget_wait(c);
            break;
        }
        bool go_on = take_frame(c, &rd, buf + off);
        off += proto_frame_size(&rd);
        submit_budget_release(c);
        if (!go_on)
            break;
    }
    if (c->state == DSP_CONN_CLOSING)
        return;
    if (off < n) {
        evbuffer_unfreeze(in, 0); /* the bufferevent keeps the input's end frozen */
        int rc = evbuffer_add(in, buf + off, n - off);
        evbuffer_freeze(in, 0);
        if (rc < 0) {
            dsp_conn_close(c, 0, "out of memory");
            return;
        }
        if (yielded)
            bufferevent_trigger(c->bev, EV_READ, BEV_OPT_DEFER_CALLBACKS);
    }
    read_done(c);
}

/* A plaintext connection reads its socket itself: libevent's own read first asks the
 * kernel how much is waiting (ioctl FIONREAD), one system call in three of a worker's
 * round trip. Like the bufferevent, it stops reading while read_high bytes wait. */
static void sock_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    dsp_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t have = evbuffer_get_length(in);
    if (c->budget_wait) {
        event_del(c->read_ev);
        return;
    }
    if (have >= c->read_high) {
        event_del(c->read_ev);
        c->read_suspended = true;
        return;
    }
    size_t want = c->welcomed ? READ_MAX : READ_MAX_PRE_HELLO;
    if (want > c->read_high - have)
        want = c->read_high - have;
    /* Read into the stack: whole frames are taken from there, and the input grows by
     * what is left, not by a whole chunk (an idle peer that sent one byte holds 1 KiB,
     * not 8). */
    uint8_t buf[READ_MAX];
    ssize_t n = read(fd, buf, want);
    int err = errno;
    if (n > 0) {
        if (have == 0) {
            read_frames_from(c, buf, (size_t)n);
            return;
        }
        evbuffer_unfreeze(in, 0);
        int rc = evbuffer_add(in, buf, (size_t)n);
        evbuffer_freeze(in, 0);
        if (rc < 0)
            dsp_conn_close(c, 0, "out of memory");
        else
            read_cb(c->bev, c);
        return;
    }
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))
        return;
    errno = err;
    event_cb(c->bev, (short)(BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR)), c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    dsp_conn *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (c->state == DSP_CONN_ACTIVE)
            c->srv->stats.conns.lost_total++;
        char why[320];
        dsp_tls_event_text(bev, what, why, sizeof why); /* a failed handshake says why */
        dsp_conn_close(c, 0, why);
        event_active(c->free_ev, EV_TIMEOUT, 0); /* nothing more can be flushed */
    }
}

/* Notes when the peer drains its output (or the output starts from empty), so that a
 * peer that stops reading is found by dsp_conn_tick. */
static void output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    (void)buf;
    dsp_conn *c = arg;
    if (info->n_deleted > 0 || info->orig_size == 0)
        c->out_progress_ms = dsp_now_ms();
}

void dsp_conn_accept(dsp_server *srv, int fd, const struct sockaddr *sa, int salen)
{
    (void)salen;
    dsp_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    evutil_make_socket_nonblocking(fd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->srv = srv;
    c->id = ++srv->conns.next_id;
    c->bev = srv->tls ? dsp_tls_accept_bev_new(srv->base, srv->tls->worker, fd)
                      : bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->free_ev = event_new(srv->base, -1, 0, free_cb, c);
    if (!c->bev || !c->free_ev) {
        if (c->bev)
            bufferevent_free(c->bev);
        else
            close(fd);
        if (c->free_ev)
            event_free(c->free_ev);
        free(c);
        return;
    }
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    snprintf(c->addr, sizeof c->addr, "%s:%u", host, port);
    c->connected_ms = c->last_rx_ms = c->last_tx_ms = dsp_now_ms();
    c->state = DSP_CONN_WANT_HELLO;

    c->next = srv->conns.list;
    if (srv->conns.list)
        srv->conns.list->prev = c;
    srv->conns.list = c;
    srv->conns.n++;
    srv->stats.conns.accepted_total++;

    /* Until HELLO, the largest legal frame is a HELLO. */
    conn_set_read_high(c, PRE_HELLO_MAX_BODY + PROTO_LEN_PREFIX + 4096);
    c->out_progress_ms = c->connected_ms;
    evbuffer_add_cb(bufferevent_get_output(c->bev), output_cb, c);
    c->direct_write = srv->tls == NULL;
    bufferevent_setcb(c->bev, read_cb, drained_cb, event_cb, c);
    if (c->direct_write) { /* a new bufferevent starts with EV_WRITE enabled */
        bufferevent_disable(c->bev, EV_WRITE);
        c->read_ev = event_new(srv->base, fd, EV_READ | EV_PERSIST, sock_read_cb, c);
        if (c->read_ev && event_add(c->read_ev, NULL) < 0) {
            event_free(c->read_ev);
            c->read_ev = NULL;
        }
    }
    if (!c->read_ev) /* TLS, or out of memory: the bufferevent reads */
        bufferevent_enable(c->bev, EV_READ);
    if (!c->direct_write)
        bufferevent_enable(c->bev, EV_WRITE);
    log_debug(&srv->log, "connection %llu from %s", (unsigned long long)c->id, c->addr);
}

void dsp_conn_send_task(dsp_conn *c, const dsp_task *t, int64_t now_ms)
{
    dsp_server *srv = c->srv;
    /* Not `proto_msg m = {...}`: that zeroes the whole union, a HELLO's 64 types
     * included (over 1 KiB), for every task. */
    proto_msg m;
    m.type = PROTO_TASK;
    m.u.task = (proto_task){
        .task_id = t->id,
        .epoch = t->dlv_epoch,
        .attempt = t->attempts,
        .timeout_ms = t->timeout_ms,
        .priority = t->priority,
        .type = {(const uint8_t *)t->type->name, t->type->len},
        .payload = {t->payload, t->payload_len},
    };
    uint8_t head[PROTO_LEN_PREFIX + 32 + PROTO_MAX_TYPE_LEN];
    uint8_t *p = dsp_conn_stage_reserve(c, sizeof head + t->payload_len);
    if (p) {
        size_t n = proto_msg_encode_head(&m, p, sizeof head);
        if (t->payload_len)
            memcpy(p + n, t->payload, t->payload_len);
        c->stage.len += n + t->payload_len;
    } else {
        size_t n = proto_msg_encode_head(&m, head, sizeof head);
        struct evbuffer *out = bufferevent_get_output(c->bev);
        evbuffer_add(out, head, n);
        if (t->payload_len)
            evbuffer_add(out, t->payload, t->payload_len);
    }
    c->last_tx_ms = now_ms;
    srv->stats.conns.frames_out_total++;
    dsp_conn_output_added(c);
}

void dsp_conn_cancel(dsp_conn *c, dsp_task *t)
{
    dsp_zombie *z = malloc(sizeof *z);
    if (z) {
        z->task_id = t->id;
        z->attempt = t->attempts;
        z->next = c->zombies;
        c->zombies = z;
    }
    proto_msg m = {.type = PROTO_CANCEL};
    m.u.cancel.task_id = t->id;
    m.u.cancel.epoch = t->dlv_epoch;
    m.u.cancel.attempt = t->attempts;
    conn_send_msg(c, &m);
    /* Without a record the slot could never be freed: give it back now. */
    dsp_dispatch_inflight_del(c, t, z ? DSP_SLOT_KEEP : DSP_SLOT_GIVE_BACK);
}

bool dsp_conn_note_timeout(dsp_conn *c)
{
    dsp_server *srv = c->srv;
    if (++c->timeouts_in_row < (uint64_t)srv->cfg->max_timeouts)
        return false;
    srv->stats.conns.timeouts_dropped_total++;
    c->refund = true;
    dsp_conn_close(c, PROTO_ERR_TIMEOUT, "every recent delivery timed out");
    return true;
}

/* Closes c when a frame it began stopped arriving, or when it stopped reading what it
 * is sent. Returns true when it did. */
static bool conn_stalled(dsp_conn *c, int64_t now_ms, int64_t hb)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t pending = evbuffer_get_length(in);
    /* While paused for its submissions, its input waits on us, not on the peer. */
    if (pending > 0 && c->frame_started_ms > 0 && !c->submit_paused && !c->budget_wait) {
        uint8_t prefix[PROTO_LEN_PREFIX] = {0};
        evbuffer_copyout(in, prefix, sizeof prefix);
        uint32_t announced = proto_frame_announced(prefix, pending);
        if (now_ms - c->frame_started_ms > 3 * hb + (int64_t)(announced / MIN_FRAME_BYTES_PER_MS)) {
            c->srv->stats.conns.stalled_total++;
            dsp_conn_close(c, PROTO_ERR_TIMEOUT, "a frame stopped arriving halfway");
            return true;
        }
    }
    if (c->out_over_ms > 0 && (int64_t)conn_output_len(c) <= c->srv->cfg->max_conn_output_bytes)
        c->out_over_ms = 0;
    if ((evbuffer_get_length(bufferevent_get_output(c->bev)) > 0 && now_ms - c->out_progress_ms > 3 * hb) ||
        (c->out_over_ms > 0 && now_ms - c->out_over_ms > 3 * hb)) {
        c->srv->stats.conns.stalled_total++;
        dsp_conn_close(c, 0, "does not read what it is sent");
        event_active(c->free_ev, EV_TIMEOUT, 0); /* its output will never drain */
        return true;
    }
    return false;
}

void dsp_conn_tick(dsp_conn *c, int64_t now_ms)
{
    const int64_t hb = c->srv->cfg->heartbeat_ms;
    if (c->state != DSP_CONN_CLOSING && conn_stalled(c, now_ms, hb))
        return;
    switch (c->state) {
    case DSP_CONN_WANT_HELLO:
        if (now_ms - c->connected_ms > 3 * hb)
            dsp_conn_close(c, PROTO_ERR_TIMEOUT, "no HELLO within 3 heartbeats");
        break;
    case DSP_CONN_ACTIVE:
        if (c->submit_paused || c->budget_wait)
            c->last_rx_ms = now_ms; /* not read by choice: silence means nothing */
        if (now_ms - c->last_rx_ms > 3 * hb) {
            c->srv->stats.conns.lost_total++;
            dsp_conn_close(c, PROTO_ERR_TIMEOUT, "silent for 3 heartbeats");
        } else if (now_ms - c->last_tx_ms >= hb) {
            dsp_conn_send_simple(c, PROTO_HEARTBEAT);
        }
        break;
    case DSP_CONN_CLOSING:
        if (now_ms - c->last_rx_ms > CLOSING_LINGER_MS)
            event_active(c->free_ev, EV_TIMEOUT, 0);
        break;
    }
}
