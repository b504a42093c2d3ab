/* fuzz_peer: the client end of one connection in a fuzz harness that runs the real
 * server code in-process (fuzz_admin, fuzz_hello). It sends the fuzz input, keeps the
 * first bytes of the answer and notes the server's close, all on the server's own
 * event loop, and aborts when the connection is still open after FUZZ_PEER_DEADLINE_S
 * (a hang). */
#ifndef TASKPUSH_TESTS_FUZZ_PEER_H
#define TASKPUSH_TESTS_FUZZ_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event;
struct event_base;

/* Longer than any input needs here; a connection still open by then has hung. */
#define FUZZ_PEER_DEADLINE_S 5

typedef struct fuzz_peer {
    struct event_base *base; /* borrowed: the server's loop */
    int fd;                  /* owned: closed by fuzz_peer_free */
    const uint8_t *data;     /* borrowed: what is sent */
    size_t size, off;
    struct event *wev, *rev, *deadline;
    uint8_t *out;            /* the first cap bytes of the answer (malloc'd) */
    size_t cap, nout;
    size_t got;              /* every byte of the answer */
    bool closed;             /* the server closed the connection */
    const char *who;         /* for the hang message */
} fuzz_peer;

/* Starts sending data[0..size) on fd (made non-blocking; the peer owns it from now on)
 * and keeping up to keep bytes of the answer. Returns 0, or -1 (out of memory). */
int fuzz_peer_start(fuzz_peer *p, struct event_base *base, int fd, const uint8_t *data,
                    size_t size, size_t keep, const char *who);

/* Runs the loop until the server has taken everything and waits for more (a few
 * passes without a new byte for the client), calling each(arg) after every pass when
 * each is not NULL; then shuts the client's sending side and runs the loop until the
 * server closes. */
void fuzz_peer_run(fuzz_peer *p, void (*each)(void *arg), void *arg);

void fuzz_peer_free(fuzz_peer *p);

#endif
