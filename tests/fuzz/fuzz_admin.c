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

#include "admin_http.h"
#include "config.h"
#include "proto.h"
#include "server.h"

#include "fuzz_peer.h"

#define FUZZ_TOKEN "fuzz-admin-token"



int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* check(cond): abort, naming the broken promise, when cond is false. */
#define check(cond) ((cond) ? (void)0 : fail(__LINE__, #cond))

static void fail(int line, const char *what)
{
    fprintf(stderr, "fuzz_admin.c:%d: check failed: %s\n", line, what);
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
    bool changed = srv->control.paused_all || srv->control.admin_draining ||
                   srv->control.draining || srv->control.last_requeue.id;
    for (const dsp_type *ty = srv->types.list; ty; ty = ty->next)
        changed |= ty->paused;
    return changed;
}

/* serve runs one connection carrying data against a fresh offline server. */
static void serve(const dsp_config *cfg, const uint8_t *data, size_t size)
{
    dsp_server srv;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    socklen_t sl = sizeof(sa_family_t);
    fuzz_peer cl;
    int lfd, fd;

    check(dsp_server_init_offline(&srv, cfg) == 0 && dsp_admin_http_new(&srv) == 0);
    /* An autobound abstract address: unique, nothing on disk to clean up. */
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    check(lfd >= 0 && bind(lfd, (struct sockaddr *)&sun, sl) == 0 && listen(lfd, 4) == 0);
    sl = sizeof sun;
    check(getsockname(lfd, (struct sockaddr *)&sun, &sl) == 0);
    check(evutil_make_socket_nonblocking(lfd) == 0);
    check(evhttp_accept_socket_with_handle(srv.admin.http, lfd) != NULL); /* owns lfd now */

    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    check(fd >= 0 && connect(fd, (struct sockaddr *)&sun, sl) == 0);
    /* Only the start of the answer is checked (its status line). The server works
     * through all it was sent (pipelined requests too) before it sees the end. */
    check(fuzz_peer_start(&cl, srv.base, fd, data, size, 8, "fuzz_admin") == 0);
    fuzz_peer_run(&cl, NULL, NULL);
    check(cl.closed);
    /* An HTTP answer; or, to a worker's HELLO sent to the wrong port (a zero first byte,
     * as no request line has), one ERROR frame saying where workers connect. */
    if (cl.got > 0) {
        bool hello = size > PROTO_LEN_PREFIX && data[0] == 0 && proto_looks_like_hello(data, size);
        if (hello)
            check(cl.nout > PROTO_LEN_PREFIX && cl.out[0] == 0 && cl.out[PROTO_LEN_PREFIX] == PROTO_ERROR);
        else
            check(cl.nout >= 5 && memcmp(cl.out, "HTTP/", 5) == 0);
    }
    if (state_changed(&srv)) {
        check(contains(data, size, "POST"));
        if (cfg->token)
            check(contains(data, size, "Bearer " FUZZ_TOKEN));
    }
    fuzz_peer_free(&cl);
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
