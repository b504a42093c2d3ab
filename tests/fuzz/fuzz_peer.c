#include "fuzz_peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/util.h>

/* Loop passes without progress after which the client shuts its sending side:
 * everything is in this process, so that means the server waits for more. */
#define QUIET_PASSES 8

static void write_cb(evutil_socket_t fd, short what, void *arg)
{
    fuzz_peer *p = arg;
    (void)what;
    while (p->off < p->size) {
        ssize_t n = send(fd, p->data + p->off, p->size - p->off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return; /* called again when there is room */
        if (n <= 0)
            break; /* the server closed first: the rest is not wanted */
        p->off += (size_t)n;
    }
    p->off = p->size;
    event_del(p->wev);
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
    fuzz_peer *p = arg;
    uint8_t buf[16384];
    (void)what;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            p->closed = true;
            event_base_loopbreak(p->base);
            return;
        }
        size_t take = p->cap - p->nout;
        if (take > (size_t)n)
            take = (size_t)n;
        memcpy(p->out + p->nout, buf, take);
        p->nout += take;
        p->got += (size_t)n;
    }
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    const fuzz_peer *p = arg;
    (void)fd;
    (void)what;
    fprintf(stderr, "%s: the connection was still open after %d s\n", p->who, FUZZ_PEER_DEADLINE_S);
    abort();
}

int fuzz_peer_start(fuzz_peer *p, struct event_base *base, int fd, const uint8_t *data,
                    size_t size, size_t keep, const char *who)
{
    memset(p, 0, sizeof *p);
    p->base = base;
    p->fd = fd;
    p->data = data;
    p->size = size;
    p->cap = keep;
    p->who = who;
    p->out = malloc(keep ? keep : 1);
    p->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, write_cb, p);
    p->rev = event_new(base, fd, EV_READ | EV_PERSIST, read_cb, p);
    p->deadline = evtimer_new(base, deadline_cb, p);
    struct timeval tv = {FUZZ_PEER_DEADLINE_S, 0};
    if (!p->out || !p->wev || !p->rev || !p->deadline || evutil_make_socket_nonblocking(fd) != 0 ||
        event_add(p->wev, NULL) != 0 || event_add(p->rev, NULL) != 0 || event_add(p->deadline, &tv) != 0)
        return -1;
    return 0;
}

void fuzz_peer_run(fuzz_peer *p, void (*each)(void *arg), void *arg)
{
    for (size_t quiet = 0, seen = 0; !p->closed && quiet < QUIET_PASSES;) {
        event_base_loop(p->base, EVLOOP_NONBLOCK);
        if (each)
            each(arg);
        quiet = p->off == p->size && p->got == seen ? quiet + 1 : 0;
        seen = p->got;
    }
    shutdown(p->fd, SHUT_WR);
    if (!p->closed)
        event_base_dispatch(p->base);
}

void fuzz_peer_free(fuzz_peer *p)
{
    if (p->wev)
        event_free(p->wev);
    if (p->rev)
        event_free(p->rev);
    if (p->deadline)
        event_free(p->deadline);
    if (p->fd >= 0)
        close(p->fd);
    free(p->out);
    memset(p, 0, sizeof *p);
    p->fd = -1;
}
