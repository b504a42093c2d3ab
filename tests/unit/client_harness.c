/* client_harness.c: what the libtaskpush tests share: the bounded clock of
 * their waits, the log switch (TP_TEST_LOG=1), and a worker made for tests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "client_harness.h"

int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void test_log(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "# [%d] %s\n", level, msg);
}

int verbose(void)
{
    const char *v = getenv("TP_TEST_LOG");

    return v != NULL && v[0] == '1';
}

tp_worker *new_worker(const char *addresses, unsigned capacity, unsigned threads)
{
    tp_worker_options o;
    tp_error err;
    tp_worker *w;

    tp_worker_options_init(&o);
    o.addresses = addresses;
    o.name = "test-worker";
    o.capacity = capacity;
    o.threads = threads;
    o.reconnect_min_ms = 5;
    o.reconnect_max_ms = 50;
    o.connect_timeout_ms = 3000;
    o.log_level = TP_LOG_DEBUG;
    o.log = verbose() ? test_log : NULL;
    w = tp_worker_new(&o, &err);
    if (w == NULL)
        fail_msg("tp_worker_new: %s", err.text);
    return w;
}

tp_worker_stats stats_of(tp_worker *w)
{
    tp_worker_stats s;

    assert_int_equal(tp_worker_get_stats(w, &s, sizeof(s)), 0);
    return s;
}

int noop_handler(tp_task *t, void *arg)
{
    (void)t;
    (void)arg;
    return TP_SUCCESS;
}