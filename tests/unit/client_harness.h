/* client_harness.h: what the libtaskpush tests share (client_harness.c). */
#ifndef TASKPUSH_TEST_CLIENT_HARNESS_H
#define TASKPUSH_TEST_CLIENT_HARNESS_H

#include <stdint.h>

#include "taskpush.h"

#define WAIT_MS 10000 /* the longest any single wait may take before the test fails */

/* The monotonic clock, in milliseconds, that bounds every wait. */
int64_t now_ms(void);
/* 1 when TP_TEST_LOG=1: the library's log lines go to stderr (test_log). */
int verbose(void);
void test_log(void *arg, int level, const char *msg);

/* A worker with short reconnect delays, failing the test when refused. */
tp_worker *new_worker(const char *addresses, unsigned capacity, unsigned threads);
/* tp_worker_get_stats, asserted to succeed. */
tp_worker_stats stats_of(tp_worker *w);
/* A handler that succeeds at once. */
int noop_handler(tp_task *t, void *arg);

#endif
