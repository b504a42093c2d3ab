/* raw: plain TCP connections for tests that speak bytes to taskpushd themselves
 * (hostile or plaintext peers on the worker port, raw HTTP on the admin port; the
 * frames are proto/PROTOCOL.md's). */
#ifndef TASKPUSH_TESTS_RAW_H
#define TASKPUSH_TESTS_RAW_H

#include <stddef.h>

/* Connects to an IPv4 "HOST:PORT" (close-on-exec). With rcv_timeout_s > 0 a recv that
 * waits longer fails with EAGAIN. Returns the socket, or -1 (message on stderr). */
int tp_raw_connect(const char *hostport, int rcv_timeout_s);

/* Sends a HELLO of protocol version PROTO_VERSION for one task type, capacity 1, no
 * token; the name is name_len bytes (any bytes). Returns 0 when all of it was sent. */
int tp_raw_hello(int fd, const char *name, size_t name_len, const char *type);

#endif
