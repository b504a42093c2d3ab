/* raw: plain TCP connections for tests that speak bytes to taskpushd themselves
 * (hostile or plaintext peers on the worker port, raw HTTP on the admin port; the
 * frames are proto/PROTOCOL.md's). */
#ifndef TASKPUSH_TESTS_RAW_H
#define TASKPUSH_TESTS_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/* Connects to an IPv4 "HOST:PORT" (close-on-exec). With rcv_timeout_s > 0 a recv that
 * waits longer fails with EAGAIN. Returns the socket, or -1 (message on stderr). */
int tp_raw_connect(const char *hostport, int rcv_timeout_s);

/* Sends a HELLO of protocol version PROTO_VERSION for one task type, capacity 1, no
 * token; the name is name_len bytes (any bytes). Returns 0 when all of it was sent. */
int tp_raw_hello(int fd, const char *name, size_t name_len, const char *type);

/* Sends all n bytes of buf (MSG_NOSIGNAL). Returns 0, or -1 when a send fails. */
int tp_raw_send(int fd, const void *buf, size_t n);

/* m as a whole frame (length prefix included) in a malloc'd buffer of *n bytes; NULL
 * when it does not encode or out of memory. */
uint8_t *tp_raw_encode(const proto_msg *m, size_t *n);

/* Encodes m and sends it. Returns 0, or -1. */
int tp_raw_send_msg(int fd, const proto_msg *m);

/* Reads one frame into buf, skipping heartbeats; returns its body length, or -1 on EOF,
 * error, timeout (tp_raw_connect's rcv_timeout_s) or a frame empty or over cap bytes. */
long tp_raw_read_frame(int fd, uint8_t *buf, size_t cap);

#endif
