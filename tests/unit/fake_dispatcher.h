/* fake_dispatcher.h: the dispatcher's end of the client tests, with no daemon: a
 * listening socket on 127.0.0.1:0 served from the test thread, reading and writing
 * frames through proto.h. Every wait is bounded by WAIT_MS; a failure fails the
 * test (cmocka). */
#ifndef TASKPUSH_TEST_FAKE_DISPATCHER_H
#define TASKPUSH_TEST_FAKE_DISPATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

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

void fake_listen(fake *f);
void fake_addr(const fake *f, char *buf, size_t n);
/* Closes the current connection (the listening socket stays). */
void fake_drop(fake *f);
void fake_close(fake *f);
/* Waits for the worker's next connection; replaces the current one. */
void fake_accept(fake *f);
/* Reads one frame: 1 when *m is filled, 0 on timeout, -1 at EOF. */
int fake_read(fake *f, proto_msg *m, int timeout_ms);
/* Reads the next frame that is not a HEARTBEAT and checks its type. */
void fake_expect(fake *f, proto_msg *m, uint8_t type);
/* Skips frames until the worker closes; returns how many had count_type. */
int fake_expect_eof(fake *f, uint8_t count_type);
/* Raw bytes, for the malformed frames no encoder writes. */
void send_all(int fd, const void *p, size_t n);
void fake_send(fake *f, const proto_msg *m);
void fake_send_welcome(fake *f, uint16_t version, uint32_t hb_ms, uint32_t max_body);
/* Accepts the next connection, checks HELLO and answers WELCOME. */
void fake_handshake(fake *f, uint32_t hb_ms, uint32_t max_body);
void fake_send_task_full(fake *f, uint64_t id, uint32_t epoch, uint32_t attempt,
                         uint32_t timeout_ms, uint8_t prio, const char *type,
                         const void *payload, size_t len);
void fake_send_task(fake *f, uint64_t id, const char *type, const char *payload);
/* A frame with no body (HEARTBEAT, STOP). */
void fake_send_bare(fake *f, uint8_t type);

#endif
