/* fuzz_admin.c: libFuzzer target of the admin port's request handling.
 *
 * The input is the bytes a client sends to the admin port. They go to the real
 * evhttp server with the real handlers (dsp_admin_http_new) of an offline
 * dispatcher (dsp_server_init_offline: loop and timers, no database, no worker
 * port), over a local stream socket: evhttp accepts it from a listening
 * AF_UNIX socket (evhttp has no public call that takes an accepted fd). The
 * client writes the input, lets the server answer all it can, then shuts its
 * sending side and reads until the server closes. Each input runs twice: without a token,
 * and with an admin token set. Any broken promise calls abort():
 *  - every request ends: the server closes the connection (no hang);
 *  - whatever the server answers starts as an HTTP status line (evhttp
 *    echoes the request's version, so "HTTP/0.1 200" is one);
 *  - state changes (pause, drain, a paused type) only come from a POST, and
 *    with a token set only from a request that carries it;
 *  - the server frees everything (LeakSanitizer in the fuzz and ASan builds).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/util.h>

#include "config.h"
#include "server.h"

#define FUZZ_TOKEN "fuzz-admin-token"

/* Longer than any request needs here; a server that neither answers nor closes
 * by then has hung. */
#define FUZZ_DEADLINE_S 5

/* Loop passes without progress after which the client shuts its sending side. */
#define FUZZ_QUIET_PASSES 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* check(cond): abort, naming the broken promise, when cond is false. */
#define check(cond) ((cond) ? (void)0 : fail(__LINE__, #cond))

static void fail(int line, const char *what)
{
    fprintf(stderr, "fuzz_admin.c:%d: check failed: %s\n", line, what);
    abort();
}

typedef struct client {
    struct event_base *base;
    int fd;
    const uint8_t *data;
    size_t size, off;
    struct event *wev, *rev, *deadline;
    char head[8]; /* first bytes of the answer */
    size_t nhead, got;
    bool closed;
} client;

static void client_write_cb(evutil_socket_t fd, short what, void *arg)
{
    client *cl = arg;
    (void)what;
    while (cl->off < cl->size) {
        ssize_t n = send(fd, cl->data + cl->off, cl->size - cl->off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return; /* called again when there is room */
        if (n <= 0)
            break; /* the server closed first: the rest is not wanted */
        cl->off += (size_t)n;
    }
    cl->off = cl->size;
    event_del(cl->wev);
}

static void client_read_cb(evutil_socket_t fd, short what, void *arg)
{
    client *cl = arg;
    char buf[16384];
    (void)what;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            cl->closed = true;
            event_base_loopbreak(cl->base);
            return;
        }
        size_t take = sizeof cl->head - cl->nhead;
        if (take > (size_t)n)
            take = (size_t)n;
        memcpy(cl->head + cl->nhead, buf, take);
        cl->nhead += take;
        cl->got += (size_t)n;
    }
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    fprintf(stderr, "fuzz_admin: the admin port neither answered nor closed in %d s\n",
            FUZZ_DEADLINE_S);
    abort();
}

/* contains: needle occurs in data (case-insensitive, as a header name may be). */
static bool contains(const uint8_t *data, size_t size, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= size; i++)
        if (strncasecmp((const char *)data + i, needle, n) == 0)
            return true;
    return false;
}

static bool state_changed(const dsp_server *srv)
{
    bool changed = srv->paused_all || srv->admin_draining || srv->draining || srv->last_requeue.id;
    for (const dsp_type *ty = srv->types; ty; ty = ty->next)
        changed |= ty->paused;
    return changed;
}

/* serve runs one connection carrying data against a fresh offline server. */
static void serve(const dsp_config *cfg, const uint8_t *data, size_t size)
{
    dsp_server srv;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    socklen_t sl = sizeof(sa_family_t);
    client cl = {.data = data, .size = size, .fd = -1};
    int lfd;

    check(dsp_server_init_offline(&srv, cfg) == 0 && dsp_admin_http_new(&srv) == 0);
    /* An autobound abstract address: unique, nothing on disk to clean up. */
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    check(lfd >= 0 && bind(lfd, (struct sockaddr *)&sun, sl) == 0 && listen(lfd, 4) == 0);
    sl = sizeof sun;
    check(getsockname(lfd, (struct sockaddr *)&sun, &sl) == 0);
    check(evutil_make_socket_nonblocking(lfd) == 0);
    check(evhttp_accept_socket_with_handle(srv.http, lfd) != NULL); /* owns lfd now */

    cl.base = srv.base;
    cl.fd = socket(AF_UNIX, SOCK_STREAM, 0);
    check(cl.fd >= 0 && connect(cl.fd, (struct sockaddr *)&sun, sl) == 0);
    check(evutil_make_socket_nonblocking(cl.fd) == 0);
    cl.wev = event_new(srv.base, cl.fd, EV_WRITE | EV_PERSIST, client_write_cb, &cl);
    cl.rev = event_new(srv.base, cl.fd, EV_READ | EV_PERSIST, client_read_cb, &cl);
    cl.deadline = evtimer_new(srv.base, deadline_cb, &cl);
    check(cl.wev && cl.rev && cl.deadline);
    struct timeval tv = {FUZZ_DEADLINE_S, 0};
    check(event_add(cl.wev, NULL) == 0 && event_add(cl.rev, NULL) == 0 &&
          event_add(cl.deadline, &tv) == 0);

    /* Let the server work through all it was sent (pipelined requests too)
     * before it sees the end: everything is in this process, so a few loop
     * passes without a new byte for the client mean it is waiting for more. */
    for (size_t quiet = 0, seen = 0; !cl.closed && quiet < FUZZ_QUIET_PASSES;) {
        event_base_loop(srv.base, EVLOOP_NONBLOCK);
        quiet = cl.off == cl.size && cl.got == seen ? quiet + 1 : 0;
        seen = cl.got;
    }
    shutdown(cl.fd, SHUT_WR);
    if (!cl.closed)
        event_base_dispatch(srv.base);
    check(cl.closed);
    if (cl.got > 0)
        check(cl.nhead >= 5 && memcmp(cl.head, "HTTP/", 5) == 0);
    if (state_changed(&srv)) {
        check(contains(data, size, "POST"));
        if (cfg->token)
            check(contains(data, size, "Bearer " FUZZ_TOKEN));
    }

    event_free(cl.wev);
    event_free(cl.rev);
    event_free(cl.deadline);
    close(cl.fd);
    dsp_server_free(&srv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char *argv[] = {"taskpushd", "--db", "mysql://fuzz@localhost/fuzz", "--log-level",
                           "error", NULL};
    dsp_config cfg;
    char err[256];

    if (size > 256 * 1024)
        return 0; /* past evhttp's header and body limits there is nothing new */
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
