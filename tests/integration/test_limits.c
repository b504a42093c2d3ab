/* test_limits: per-type limits held by the dispatcher across all its workers
 * (docs/taskpushd.md, "Per-type limits"), counted by the handlers themselves.
 *
 * Real components only: the private MariaDB of scripts/tp-mariadb, the taskpushd of the
 * build tree started with --type-limit, and two in-process libtaskpush workers over TCP
 * with CAPACITY slots in all, far more than the limits. Each handler notes its start on
 * the monotonic clock and the number of handlers running at once, then sleeps SLEEP_MS.
 * No duration is asserted: only counts.
 *
 * Case limits_hold_and_change_at_run_time:
 *   1. --type-limit lim:concurrency=3,rate=50, N1 tasks: never more than 3 handlers at
 *      once, at most 50 + 50 (rate + burst) starts in any one-second window, and at most
 *      BUFFER_BOUND tasks buffered by the dispatcher (its claims follow the limit);
 *   2. POST /limit?type=lim&concurrency=6&rate=0 (no rate limit): N2 tasks, never more than 6
 *      at once, and more than 3 at some point (the raised limit took effect);
 *   3. POST /limit?type=lim&rate=20 (concurrency stays 6): N3 tasks, at most 20 + 20
 *      starts in any one-second window;
 *   and /stats shows the limits ("limits" and the by_type row), /limit refuses what is
 *   malformed (400) or names an unknown type (404). */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "sb.h"
#include "taskpush.h"
#include "tap.h"
#include "testdb.h"

#define WAIT_MS 60000
#define STOP_MS 15000
#define NWORKERS 2
#define WORKER_CAPACITY 8
#define CAPACITY (NWORKERS * WORKER_CAPACITY)
#define SLEEP_MS 30
#define N1 150
#define N2 200
#define N3 60
#define NALL (N1 + N2 + N3)
/* A handler starts a moment after its dispatch (a frame, a thread's wake-up): starts
 * that the dispatcher made more than a second apart may land within one second at the
 * handlers. This many are allowed for that jitter on a loaded machine. */
#define JITTER_STARTS 2
/* Phase 1's buffer: concurrency 3 of free slots plus an ahead capped at 3. */
#define BUFFER_BOUND 6

struct fx {
    tp_testdb db;
    tp_daemon d;
    bool have_daemon;
    tp_worker *w[NWORKERS];
    tp_inproc run[NWORKERS];
    pthread_mutex_t mu;
    long long starts[NALL + 16]; /* handler starts, monotonic ms, in order */
    size_t nstarts;
    int running, max_running; /* max_running since the last reset */
    bool passed;
};

static int on_task(tp_task *task, void *arg)
{
    (void)task;
    struct fx *fx = arg;
    pthread_mutex_lock(&fx->mu);
    if (fx->nstarts < sizeof fx->starts / sizeof fx->starts[0])
        fx->starts[fx->nstarts++] = tp_mono_ms();
    if (++fx->running > fx->max_running)
        fx->max_running = fx->running;
    pthread_mutex_unlock(&fx->mu);
    struct timespec ts = {0, SLEEP_MS * 1000000L};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&fx->mu);
    fx->running--;
    pthread_mutex_unlock(&fx->mu);
    return TP_SUCCESS;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    pthread_mutex_init(&fx->mu, NULL);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i < NWORKERS; i++) {
        tp_inproc_halt(&fx->run[i]);
        tp_worker_free(fx->w[i]);
    }
    if (fx->have_daemon) {
        tp_daemon_stop(&fx->d, SIGTERM, STOP_MS);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
    }
    tp_testdb_drop(&fx->db);
    pthread_mutex_destroy(&fx->mu);
    free(fx);
    return 0;
}

static void insert_tasks(tp_testdb *db, int n, const char *tag)
{
    for (int done = 0; done < n;) {
        struct tp_sb b = {0};
        tp_sb_printf(&b, "INSERT INTO task (task_type, payload) VALUES ");
        for (int k = 0; k < 100 && done < n; k++, done++)
            tp_sb_printf(&b, "%s('lim', '%s-%d')", k ? "," : "", tag, done);
        assert_true(tp_testdb_exec(db, "%s", b.s) > 0);
        tp_sb_free(&b);
    }
}

static void start_workers(struct fx *fx)
{
    for (int i = 0; i < NWORKERS; i++) {
        char name[32];
        snprintf(name, sizeof name, "lim-%d", i);
        fx->w[i] = tp_inproc_start_one(&fx->run[i], fx->d.listen, name, WORKER_CAPACITY, "lim",
                                       on_task, fx);
        assert_non_null(fx->w[i]);
    }
}

/* Waits until done tasks have finished (SUCCESSFUL in the table). */
static void wait_succeeded(struct fx *fx, uint64_t done)
{
    for (long long end = tp_mono_ms() + WAIT_MS;; tp_sleep_ms(20)) {
        uint64_t n = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 2");
        if (n >= done)
            return;
        if (tp_mono_ms() >= end)
            fail_msg("only %llu of %llu tasks succeeded", (unsigned long long)n, (unsigned long long)done);
    }
}

/* Starts from index from on: the most in any window of 1000 ms. */
static size_t max_per_second(struct fx *fx, size_t from)
{
    pthread_mutex_lock(&fx->mu);
    size_t best = 0;
    for (size_t i = from, j = from; i < fx->nstarts; i++) {
        while (fx->starts[i] - fx->starts[j] >= 1000)
            j++;
        if (i - j + 1 > best)
            best = i - j + 1;
    }
    pthread_mutex_unlock(&fx->mu);
    return best;
}

/* Begins a phase: the peak of handlers at once starts again; returns where its starts
 * begin. */
static size_t phase_begin(struct fx *fx)
{
    pthread_mutex_lock(&fx->mu);
    fx->max_running = 0;
    size_t at = fx->nstarts;
    pthread_mutex_unlock(&fx->mu);
    return at;
}

static int phase_peak(struct fx *fx)
{
    pthread_mutex_lock(&fx->mu);
    int m = fx->max_running;
    pthread_mutex_unlock(&fx->mu);
    return m;
}

static int post(struct fx *fx, const char *path)
{
    char *body = NULL;
    int code = tp_http_request(fx->d.admin, "POST", path, &body);
    if (code != 200)
        tp_diag("POST %s: %d %s", path, code, body ? body : "");
    free(body);
    return code;
}

/* The by_type row of lim in /stats, and the "limits" entry of lim. */
static void check_stats(struct fx *fx, long long concurrency, long long rate)
{
    json_t *st = tp_daemon_json(&fx->d, "/stats");
    assert_non_null(st);
    json_t *row = NULL, *lim = NULL, *v;
    size_t i;
    json_array_foreach(json_object_get(st, "by_type"), i, v)
        if (json_is_string(json_object_get(v, "type")) &&
            strcmp(json_string_value(json_object_get(v, "type")), "lim") == 0)
            row = v;
    json_array_foreach(json_object_get(st, "limits"), i, v)
        if (strcmp(json_string_value(json_object_get(v, "type")), "lim") == 0)
            lim = v;
    assert_non_null(row);
    assert_non_null(lim);
    assert_int_equal(tp_json_int_at(row, "limit_concurrency"), concurrency);
    assert_int_equal(tp_json_int_at(row, "limit_rate"), rate);
    assert_int_equal(tp_json_int_at(lim, "concurrency"), concurrency);
    assert_int_equal(tp_json_int_at(lim, "rate"), rate);
    json_decref(st);
}

static void test_limits_hold_and_change_at_run_time(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("limits", &fx->db), 0);
    const char *const args[] = {"--heartbeat-ms", "200", "--poll-ms", "20", "--type-limit",
                                "lim:concurrency=3,rate=50", NULL};
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    start_workers(fx);

    /* 1: concurrency 3, rate 50 a second. While it drains, the dispatcher buffers no
     * more than the limit lets start soon: the slots it leaves (at most 3) plus an ahead
     * of at most 3 (without the limit's cap the ahead alone is at least 32). */
    size_t from = phase_begin(fx);
    insert_tasks(&fx->db, N1, "one");
    long long max_buffered = 0;
    while (tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 2") < N1 - 20) {
        long long b = tp_daemon_stat(&fx->d, "queue.buffered");
        assert_true(b >= 0);
        max_buffered = b > max_buffered ? b : max_buffered;
        tp_sleep_ms(10);
    }
    wait_succeeded(fx, N1);
    tp_diag("phase 1: at most %lld tasks buffered (bound %d)", max_buffered, BUFFER_BOUND);
    assert_true(max_buffered <= BUFFER_BOUND);
    size_t per_s = max_per_second(fx, from);
    int peak = phase_peak(fx);
    tp_diag("phase 1 (concurrency 3, rate 50): at most %d at once, %zu starts in one second (bound %d)", peak,
         per_s, 100 + JITTER_STARTS);
    assert_in_range(peak, 1, 3);
    assert_true(per_s <= 100 + JITTER_STARTS);
    check_stats(fx, 3, 50);

    /* /limit refuses what is malformed, and a type nobody knows. */
    assert_int_equal(post(fx, "/limit?type=lim"), 400);
    assert_int_equal(post(fx, "/limit?concurrency=2"), 400);
    assert_int_equal(post(fx, "/limit?type=lim&concurrency=-1"), 400);
    assert_int_equal(post(fx, "/limit?type=lim&rate=1000001"), 400);
    assert_int_equal(post(fx, "/limit?type=lim&rate=12x"), 400);
    assert_int_equal(post(fx, "/limit?type=lim&rate=99999999999999999999999"), 400);
    assert_int_equal(post(fx, "/limit?type=limm&rate=1"), 404);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/limit?type=lim&rate=1", NULL), 405);
    check_stats(fx, 3, 50); /* nothing changed */

    /* 2: concurrency 6, no rate limit. */
    assert_int_equal(post(fx, "/limit?type=lim&concurrency=6&rate=0"), 200);
    check_stats(fx, 6, 0);
    from = phase_begin(fx);
    insert_tasks(&fx->db, N2, "two");
    wait_succeeded(fx, N1 + N2);
    peak = phase_peak(fx);
    tp_diag("phase 2 (concurrency 6): at most %d at once (capacity %d)", peak, CAPACITY);
    assert_in_range(peak, 4, 6);

    /* 3: rate 20 a second, concurrency kept. */
    assert_int_equal(post(fx, "/limit?type=lim&rate=20"), 200);
    check_stats(fx, 6, 20);
    from = phase_begin(fx);
    insert_tasks(&fx->db, N3, "three");
    wait_succeeded(fx, NALL);
    per_s = max_per_second(fx, from);
    peak = phase_peak(fx);
    tp_diag("phase 3 (rate 20): %zu starts in one second (bound %d), at most %d at once", per_s,
         40 + JITTER_STARTS, peak);
    assert_true(per_s <= 40 + JITTER_STARTS);
    assert_true(peak <= 6);

    /* Both 0: the limits are gone. */
    assert_int_equal(post(fx, "/limit?type=lim&concurrency=0&rate=0"), 200);
    json_t *st = tp_daemon_json(&fx->d, "/stats");
    assert_non_null(st);
    assert_int_equal(json_array_size(json_object_get(st, "limits")), 0);
    json_decref(st);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_limits_hold_and_change_at_run_time, setup, teardown),
    };
    return cmocka_run_group_tests_name("limits", tests, NULL, NULL);
}
