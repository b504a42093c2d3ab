/* fuzz_hello.c: libFuzzer target of a worker connection before and at HELLO.
 *
 * The input is the byte stream a worker sends. It goes to the real connection
 * code (dsp_conn_accept on one end of a socketpair) of an offline dispatcher
 * (dsp_server_init_offline: loop and timers, no database, no listener), so
 * that framing, the HELLO checks, type interning, the limits and the close
 * path all run as in taskpushd. The client writes the input, lets the server
 * work through it, then closes its sending side and reads until the server
 * closes. Each input runs twice: without a worker token, and with one. Any
 * broken promise calls abort():
 *  - the connection ends once the worker has closed (no hang, nothing left:
 *    no connection, no worker, no room, nothing in flight);
 *  - while it is open, the room counted for workers never wraps (it is at
 *    most one worker's u32 capacity) and no type has more room than the
 *    total; every interned type name is exactly its bytes (no NUL inside);
 *  - what the server sends is whole, well-formed frames: WELCOME or ERROR
 *    first, nothing after an ERROR, and only WELCOME, ERROR, HEARTBEAT,
 *    STOP and SUBMITTED other than OK (no task exists to deliver or cancel,
 *    and no database to insert into); with a token set, a WELCOME
 *    only for an input that carries the token;
 *  - the server frees everything (LeakSanitizer in the fuzz and ASan builds).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/util.h>

#include "config.h"
#include "conn.h"
#include "proto.h"
#include "server.h"

#include "fuzz_peer.h"

#define FUZZ_TOKEN "fuzz-hello-token"



/* The server's output kept for the checks; it sends a few small frames. */
#define FUZZ_OUT_MAX 65536

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* check(cond): abort, naming the broken promise, when cond is false. */
#define check(cond) ((cond) ? (void)0 : fail(__LINE__, #cond))

static void fail(int line, const char *what)
{
    fprintf(stderr, "fuzz_hello.c:%d: check failed: %s\n", line, what);
    abort();
}

/* check_open_state: invariants while the connection may still be open. */
static void check_open_state(const dsp_server *srv)
{
    check(srv->conns.n <= 1 && srv->sched.nworkers <= srv->conns.n);
    check(srv->sched.room <= UINT32_MAX);
    for (const dsp_type *ty = srv->types.list; ty; ty = ty->next) {
        check(ty->room <= srv->sched.room);
        check(ty->name != NULL && ty->len >= 1 && ty->len <= PROTO_MAX_TYPE_LEN);
        check(memchr(ty->name, '\0', ty->len) == NULL && ty->name[ty->len] == '\0');
    }
    for (const dsp_conn *c = srv->conns.list; c; c = c->next)
        if (c->state == DSP_CONN_ACTIVE) /* 0 types: a version-2 producer, capacity 0 */
            check(c->ntypes <= PROTO_MAX_TYPES && (c->ntypes >= 1 || c->slots.capacity == 0) &&
                  c->version >= 1 && c->version <= PROTO_VERSION);
}

/* check_output: the server's bytes are whole frames in a legal order. */
static void check_output(const fuzz_peer *cl, const dsp_config *cfg, const uint8_t *data, size_t size)
{
    size_t off = 0;
    bool first = true, errored = false;

    if (cl->got > cl->nout)
        return; /* more than was kept: nothing sends that much before a task */
    /* An HTTP request on the worker port gets one plain HTTP answer that says where the
     * admin port is (docs/protocol.md, "A peer at the wrong port"), and nothing else. */
    if (size >= 4 && proto_looks_like_http_request(data, size)) {
        static const char http400[] = "HTTP/1.0 400 ";
        check(cl->nout == 0 || (cl->nout >= sizeof http400 - 1 &&
                                memcmp(cl->out, http400, sizeof http400 - 1) == 0));
        return;
    }
    while (off < cl->nout) {
        uint32_t body_len = 0;
        proto_msg m;
        check(proto_frame_check(cl->out + off, cl->nout - off, PROTO_MAX_BODY_DEFAULT, &body_len) ==
              PROTO_OK);
        check(proto_msg_decode(cl->out + off + PROTO_LEN_PREFIX, body_len, &m) == PROTO_OK);
        check(!errored);
        if (first)
            check(m.type == PROTO_WELCOME || m.type == PROTO_ERROR);
        else /* SUBMITTED: an offline server answers UNAVAILABLE (no database) or INVALID */
            check(m.type == PROTO_HEARTBEAT || m.type == PROTO_STOP || m.type == PROTO_ERROR ||
                  (m.type == PROTO_SUBMITTED && m.u.submitted.status != PROTO_SUBMIT_OK));
        if (m.type == PROTO_WELCOME && cfg->token)
            check(memmem(data, size, FUZZ_TOKEN, strlen(FUZZ_TOKEN)) != NULL);
        errored = m.type == PROTO_ERROR;
        first = false;
        off += PROTO_LEN_PREFIX + (size_t)body_len;
    }
}

static void check_open_state_cb(void *srv)
{
    check_open_state(srv);
}

/* serve runs one worker connection carrying data against a fresh offline server. */
static void serve(const dsp_config *cfg, const uint8_t *data, size_t size)
{
    dsp_server srv;
    int sv[2];
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(40000)};
    fuzz_peer cl;

    check(dsp_server_init_offline(&srv, cfg) == 0);
    check(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dsp_conn_accept(&srv, sv[0], (const struct sockaddr *)&peer, (int)sizeof peer); /* owns sv[0] */
    check(srv.conns.n == 1);

    check(fuzz_peer_start(&cl, srv.base, sv[1], data, size, FUZZ_OUT_MAX, "fuzz_hello") == 0);
    fuzz_peer_run(&cl, check_open_state_cb, &srv);
    check(cl.closed);
    /* The server closes the socket when it frees the connection. */
    check(srv.conns.n == 0 && srv.sched.nworkers == 0 && srv.sched.room == 0 && srv.sched.ninflight == 0);
    for (const dsp_type *ty = srv.types.list; ty; ty = ty->next)
        check(ty->room == 0 && ty->nworkers == 0);
    check_output(&cl, cfg, data, size);
    fuzz_peer_free(&cl);
    dsp_server_free(&srv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char *argv[] = {"taskpushd", "--db", "mysql://fuzz@localhost/fuzz", "--log-level",
                           "error", NULL};
    dsp_config cfg;
    char err[256];

    if (size > 1024 * 1024)
        return 0; /* a HELLO is a few KiB; nothing new past the frame limits */
    check(dsp_config_load(&cfg, 5, argv, stderr, err, sizeof err) == DSP_CONFIG_OK);
    free(cfg.token); /* whatever TASKPUSH_TOKEN says: first without a token */
    cfg.token = NULL;
    serve(&cfg, data, size);
    cfg.token = strdup(FUZZ_TOKEN);
    check(cfg.token != NULL);
    serve(&cfg, data, size);
    dsp_config_free(&cfg);
    return 0;
}
