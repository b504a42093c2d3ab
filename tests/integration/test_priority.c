/* test_priority: a task's priority holds across the dispatcher's buffer, and the amount
 * claimed ahead of the workers follows what they finish (docs/taskpushd.md, "Priorities
 * and the buffer").
 *
 * Real components only: the private MariaDB of scripts/tp-mariadb, the taskpushd of the
 * build tree with its default --prefetch (1000) and --prefetch-ms (250), and two
 * in-process libtaskpush workers over TCP whose handlers record the order they start in
 * and sleep SLEEP_MS. No timing is asserted: the bounds below count tasks.
 *
 * Case high_overtakes_buffer: a backlog of 800 NORMAL then 400 LOW tasks drains through
 * CAPACITY slots. While it drains:
 *   - the dispatcher's buffer (/stats queue.buffered) stays within BUFFER_BOUND and the
 *     rows PROCESSING within PROCESSING_BOUND, far below --prefetch;
 * then one HIGH task is inserted:
 *   - at most START_BOUND LOW or NORMAL tasks start after the INSERT and before it;
 *   - no LOW or NORMAL task claimed at or after the HIGH task's claim starts before it.
 *
 * The bounds. The workers' total capacity is C = CAPACITY; they finish at most
 * R = C * 1000 / SLEEP_MS tasks a second, so the ahead a claim adds to the free slots is
 * about R times a horizon of at most 500 ms (--prefetch-ms and two claims' round trips
 * of at most half of it each), or the floor of 32 when that is less; AHEAD_MAX allows
 * twice the former (the average follows bursts). A claim asks for the free slots plus the ahead
 * less what is buffered, and one claim is outstanding at a time, so buffered tasks plus
 * one claim in flight never exceed C + AHEAD_MAX. The LOW
 * and NORMAL tasks that can start after the HIGH row is inserted and before it are those
 * already sent to a worker whose handler has not started yet (at most C) plus those
 * buffered or in the claim in flight (C + AHEAD_MAX): START_BOUND = 2 C + AHEAD_MAX. A
 * FIFO buffer instead lets every buffered task (up to --prefetch) go first. */
#include <inttypes.h>
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
#include "rows.h"
#include "testdb.h"

#define WAIT_MS 60000
#define STOP_MS 15000

#define NWORKERS 2
#define WORKER_CAPACITY 2
#define CAPACITY (NWORKERS * WORKER_CAPACITY)
#define SLEEP_MS 40
#define N_NORMAL 800
#define N_LOW 400
/* Twice R over the longest horizon (500 ms), and at least the ahead's floor (32,
 * DSP_AHEAD_FLOOR in dispatcher/dispatch.h). */
#define AHEAD_RATE (2 * (CAPACITY * 1000 / SLEEP_MS) * 500 / 1000)
#define AHEAD_MAX (AHEAD_RATE > 32 ? AHEAD_RATE : 32)
#define BUFFER_BOUND (CAPACITY + AHEAD_MAX)
#define START_BOUND (2 * CAPACITY + AHEAD_MAX)
/* Finished tasks whose outcome waits for its write (--result-flush-ms 50, plus the
 * write itself on a busy machine) are PROCESSING too: R for 300 ms. */
#define UNWRITTEN_MAX (CAPACITY * 1000 / SLEEP_MS * 300 / 1000)
#define PROCESSING_BOUND (2 * CAPACITY + AHEAD_MAX + UNWRITTEN_MAX)

struct start {
    uint64_t id;
    int priority;
};

struct fx {
    tp_testdb db;
    tp_daemon d;
    bool have_daemon;
    tp_worker *w[NWORKERS];
    tp_inproc run[NWORKERS];
    pthread_mutex_t mu;
    struct start *log; /* handler starts, in order */
    size_t nlog, caplog;
    bool passed;
};

static size_t log_len(struct fx *fx)
{
    pthread_mutex_lock(&fx->mu);
    size_t n = fx->nlog;
    pthread_mutex_unlock(&fx->mu);
    return n;
}

static int on_task(tp_task *task, void *arg)
{
    struct fx *fx = arg;
    pthread_mutex_lock(&fx->mu);
    if (fx->nlog < fx->caplog)
        fx->log[fx->nlog++] = (struct start){tp_task_id(task), tp_task_priority(task)};
    pthread_mutex_unlock(&fx->mu);
    struct timespec ts = {0, SLEEP_MS * 1000000L};
    nanosleep(&ts, NULL);
    return TP_SUCCESS;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    pthread_mutex_init(&fx->mu, NULL);
    fx->caplog = N_NORMAL + N_LOW + 16;
    fx->log = calloc(fx->caplog, sizeof *fx->log);
    *state = fx;
    return fx->log ? 0 : -1;
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
    free(fx->log);
    free(fx);
    return 0;
}

/* n rows of priority prio, 100 to an INSERT. */
static void insert_backlog(tp_testdb *db, int n, int prio)
{
    for (int done = 0; done < n;) {
        struct tp_sb b = {0};
        tp_sb_printf(&b, "INSERT INTO task (task_type, task_priority, payload) VALUES ");
        for (int k = 0; k < 100 && done < n; k++, done++)
            tp_sb_printf(&b, "%s('slow', %d, 'p%d-%d')", k ? "," : "", prio, prio, done);
        assert_true(tp_testdb_exec(db, "%s", b.s) > 0);
        tp_sb_free(&b);
    }
}

static void start_workers(struct fx *fx)
{
    for (int i = 0; i < NWORKERS; i++) {
        char name[32];
        snprintf(name, sizeof name, "prio-%d", i);
        fx->w[i] = tp_inproc_start_one(&fx->run[i], fx->d.listen, name, WORKER_CAPACITY, "slow",
                                       on_task, fx);
        assert_non_null(fx->w[i]);
    }
}

/* The claim order of the backlog: its ids by priority descending, then id. */
static uint64_t *claim_order(tp_testdb *db, size_t *n)
{
    assert_int_equal(mysql_query(db->conn, "SELECT task_id FROM task WHERE task_priority < 2"
                                           " ORDER BY task_priority DESC, task_id"),
                     0);
    MYSQL_RES *res = mysql_store_result(db->conn);
    assert_non_null(res);
    uint64_t *v = calloc(mysql_num_rows(res) + 1, sizeof *v);
    assert_non_null(v);
    size_t k = 0;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res));)
        v[k++] = strtoull(row[0], NULL, 10);
    mysql_free_result(res);
    *n = k;
    return v;
}

static size_t rank_of(const uint64_t *order, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (order[i] == id)
            return i;
    fail_msg("task %" PRIu64 " is not in the backlog", id);
    return n;
}

static void test_high_overtakes_buffer(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("prio_buffer", &fx->db), 0);
    insert_backlog(&fx->db, N_NORMAL, 1);
    insert_backlog(&fx->db, N_LOW, 0);
    const char *const args[] = {"--heartbeat-ms", "500", "--poll-ms", "20", NULL};
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    start_workers(fx);

    /* Draining: wait for the pace to settle, then watch the buffer and the table. */
    for (long long end = tp_mono_ms() + WAIT_MS; log_len(fx) < 40; tp_sleep_ms(5))
        assert_true(tp_mono_ms() < end);
    long long max_buffered = -1, max_processing = -1;
    for (long long end = tp_mono_ms() + 1000; tp_mono_ms() < end; tp_sleep_ms(10)) {
        long long b = tp_daemon_stat(&fx->d, "queue.buffered");
        long long p = (long long)tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 1");
        assert_true(b >= 0 && p >= 0);
        max_buffered = b > max_buffered ? b : max_buffered;
        max_processing = p > max_processing ? p : max_processing;
    }
    tp_diag("draining %d slots of %d ms tasks: at most %lld buffered (bound %d), %lld rows PROCESSING "
         "(bound %d); --prefetch 1000",
         CAPACITY, SLEEP_MS, max_buffered, BUFFER_BOUND, max_processing, PROCESSING_BOUND);
    assert_true(max_processing >= 1);
    assert_true(max_buffered <= BUFFER_BOUND);
    assert_true(max_processing <= PROCESSING_BOUND);

    /* The HIGH task. Starts are counted from before the INSERT (a few more, never fewer). */
    size_t before = log_len(fx);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, task_priority, payload)"
                                             " VALUES ('slow', 2, 'high')"),
                     1);
    uint64_t high = tp_testdb_query_u64(&fx->db, "SELECT LAST_INSERT_ID()");
    assert_true(high != TP_TESTDB_U64_ERR);
    /* The backlog rows not NEW once the HIGH row is claimed: at least every row claimed
     * before it (claims take the backlog in order), perhaps one claim more. */
    uint64_t claimed = 0;
    for (long long end = tp_mono_ms() + WAIT_MS;; tp_sleep_ms(1)) {
        if (tp_rows_state(&fx->db, high) != 0) {
            claimed = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_priority < 2"
                                                   " AND task_state <> 0");
            break;
        }
        assert_true(tp_mono_ms() < end);
    }
    size_t hi_pos = SIZE_MAX;
    for (long long end = tp_mono_ms() + WAIT_MS; hi_pos == SIZE_MAX; tp_sleep_ms(5)) {
        assert_true(tp_mono_ms() < end);
        pthread_mutex_lock(&fx->mu);
        for (size_t i = before; i < fx->nlog && hi_pos == SIZE_MAX; i++)
            if (fx->log[i].id == high)
                hi_pos = i;
        pthread_mutex_unlock(&fx->mu);
    }
    for (int i = 0; i < NWORKERS; i++)
        tp_worker_stop(fx->w[i]);
    for (int i = 0; i < NWORKERS; i++)
        assert_int_equal(tp_inproc_join(&fx->run[i]), 0);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, STOP_MS), 0);
    fx->have_daemon = false;

    size_t overtaking = hi_pos - before;
    tp_diag("HIGH task %" PRIu64 " started after %zu LOW/NORMAL starts that followed its INSERT (bound %d);"
         " %" PRIu64 " backlog rows claimed by then",
         high, overtaking, START_BOUND, claimed);
    assert_int_equal(fx->log[hi_pos].priority, 2);
    assert_true(overtaking <= START_BOUND);
    size_t n = 0;
    uint64_t *order = claim_order(&fx->db, &n);
    assert_int_equal(n, N_NORMAL + N_LOW);
    for (size_t i = 0; i < hi_pos; i++) {
        size_t r = rank_of(order, n, fx->log[i].id);
        if (r >= claimed)
            fail_msg("task %" PRIu64 " (priority %d, claim rank %zu) started before the HIGH task, "
                     "but only the first %" PRIu64 " backlog rows were claimed with or before it",
                     fx->log[i].id, fx->log[i].priority, r, claimed);
    }
    free(order);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_high_overtakes_buffer, setup, teardown),
    };
    return cmocka_run_group_tests_name("priority", tests, NULL, NULL);
}
