/* test_claims: what a claim transaction costs the rest of the table (issue 29, items 5
 * and 6).
 *
 * Real components only: the private MariaDB of scripts/tp-mariadb, the taskpushd of the
 * build tree and in-process libtaskpush workers over TCP. No timing is asserted: the
 * waits are loose bounds.
 *
 * Case locked_head: another session holds SELECT ... FOR UPDATE on the 100 oldest NEW
 * rows of a type (as a user's long transaction would); newer rows of the type are
 * inserted one by one behind them while a worker of 16 slots serves the type. At least
 * NEWER_RUN of the newer rows must run while the lock is held (a claim that reads the
 * same locked head again and again runs none); after the COMMIT the locked rows run
 * too, and no task runs twice. locked_head_split: the same with --claim-split 2. /stats counts the rows skipped because locked
 * (db.claim_skipped_locked_total).
 *
 * Case payload_bytes: N_BIG rows of BIG_LEN-byte payloads, a worker of N_BIG slots whose
 * handlers hold each task HOLD_MS. taskpushd's peak RSS (VmHWM) stays under RSS_BOUND_KB
 * with the default --max-buffered-bytes (64 MiB); a claim that counts rows only takes
 * all of them at once (the lock read's result plus a copy of each payload: over 800 MB).
 * Every task ends SUCCESSFUL with its payload intact, and SIGTERM then exits 0.
 *
 * Case payload_over_budget: --max-buffered-bytes 65536 and 4 MiB payloads: every task
 * still runs, one at a time (/stats queue.payload_bytes and the tasks held, sampled). */
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
#include "taskpush.h"
#include "tap.h"
#include "testdb.h"

#define WAIT_MS 60000
#define STOP_MS 15000

#define N_LOCKED 100
#define N_NEWER 100
#define NEWER_RUN 50
#define LOCK_SLOTS 16

#define N_BIG 100
#define BIG_LEN (4 * 1024 * 1024)
#define HOLD_MS 200
#define RSS_BOUND_KB tp_daemon_rss_bound_kb(200 * 1024)

struct fx {
    tp_testdb db;
    tp_daemon d;
    bool have_daemon;
    tp_worker *w;
    tp_inproc run;
    MYSQL *locker;
    pthread_mutex_t mu;
    unsigned *runs; /* per task id: handler starts */
    size_t nruns;
    unsigned bad_payloads;
    bool passed;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    pthread_mutex_init(&fx->mu, NULL);
    fx->nruns = 4096;
    fx->runs = calloc(fx->nruns, sizeof *fx->runs);
    *state = fx;
    return fx->runs ? 0 : -1;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->locker)
        mysql_close(fx->locker);
    tp_inproc_halt(&fx->run);
    tp_worker_free(fx->w);
    if (fx->have_daemon) {
        tp_daemon_stop(&fx->d, SIGTERM, STOP_MS);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
    }
    tp_testdb_drop(&fx->db);
    pthread_mutex_destroy(&fx->mu);
    free(fx->runs);
    free(fx);
    return 0;
}

static void note_run(struct fx *fx, uint64_t id)
{
    pthread_mutex_lock(&fx->mu);
    if (id < fx->nruns)
        fx->runs[id]++;
    pthread_mutex_unlock(&fx->mu);
}

static int on_quick(tp_task *task, void *arg)
{
    note_run(arg, tp_task_id(task));
    return TP_SUCCESS;
}

static uint64_t count_state(tp_testdb *db, const char *where, int state)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE %s AND task_state = %d", where,
                               state);
}

static void locked_head(struct fx *fx, const char *const *args)
{
    assert_int_equal(tp_testdb_create("claims_locked", &fx->db), 0);
    for (int i = 0; i < N_LOCKED; i++)
        assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload)"
                                                 " VALUES ('lk', 'old%d')", i),
                         1);
    uint64_t last_locked = tp_testdb_query_u64(&fx->db, "SELECT MAX(task_id) FROM task");
    assert_true(last_locked != TP_TESTDB_U64_ERR);

    /* The user's transaction: READ COMMITTED, so that it locks those rows and no gap
     * (the newer rows can be inserted behind them). */
    fx->locker = tp_testdb_connect(&fx->db);
    assert_non_null(fx->locker);
    assert_true(tp_testdb_exec_conn(fx->locker, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") >= 0);
    assert_true(tp_testdb_exec_conn(fx->locker, "START TRANSACTION") >= 0);
    assert_int_equal(mysql_query(fx->locker, "SELECT task_id FROM task WHERE task_id <= 100"
                                             " ORDER BY task_id FOR UPDATE"),
                     0);
    MYSQL_RES *res = mysql_store_result(fx->locker);
    assert_non_null(res);
    assert_int_equal(mysql_num_rows(res), N_LOCKED);
    mysql_free_result(res);

    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "claims-lk", LOCK_SLOTS, "lk", on_quick, fx);
    assert_non_null(fx->w);

    /* The newer rows, one INSERT each, while the lock is held. */
    for (int i = 0; i < N_NEWER; i++) {
        assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload)"
                                                 " VALUES ('lk', 'new%d')", i),
                         1);
        tp_sleep_ms(5);
    }
    char newer[64], older[64];
    snprintf(newer, sizeof newer, "task_id > %" PRIu64, last_locked);
    snprintf(older, sizeof older, "task_id <= %" PRIu64, last_locked);
    uint64_t ran = 0;
    for (long long end = tp_mono_ms() + 30000; tp_mono_ms() < end; tp_sleep_ms(50))
        if ((ran = count_state(&fx->db, newer, 2)) >= N_NEWER)
            break;
    long long skipped = tp_daemon_stat(&fx->d, "db.claim_skipped_locked_total");
    tp_diag("lock held on the %d oldest rows: %" PRIu64 " of the %d newer rows SUCCESSFUL"
            " (at least %d wanted); db.claim_skipped_locked_total %lld",
            N_LOCKED, ran, N_NEWER, NEWER_RUN, skipped);
    assert_true(ran != TP_TESTDB_U64_ERR);
    assert_true(ran >= NEWER_RUN);
    assert_int_equal(count_state(&fx->db, older, 0), N_LOCKED);
    assert_true(skipped > 0);

    assert_true(tp_testdb_exec_conn(fx->locker, "COMMIT") >= 0);
    bool all = false;
    for (long long end = tp_mono_ms() + WAIT_MS; !all && tp_mono_ms() < end; tp_sleep_ms(50))
        all = count_state(&fx->db, "1", 2) == N_LOCKED + N_NEWER;
    assert_true(all);
    tp_worker_stop(fx->w);
    assert_int_equal(tp_inproc_join(&fx->run), 0);
    pthread_mutex_lock(&fx->mu);
    unsigned total = 0;
    for (size_t i = 0; i < fx->nruns; i++) {
        if (fx->runs[i] > 1)
            fail_msg("task %zu ran %u times", i, fx->runs[i]);
        total += fx->runs[i];
    }
    pthread_mutex_unlock(&fx->mu);
    assert_int_equal(total, N_LOCKED + N_NEWER);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, STOP_MS), 0);
    fx->have_daemon = false;
    fx->passed = true;
}

static void test_locked_head(void **state)
{
    const char *const args[] = {"--poll-ms", "20", NULL};
    locked_head(*state, args);
}

/* The same with every claim of 2 rows or more split with the claim helper. */
static void test_locked_head_split(void **state)
{
    const char *const args[] = {"--poll-ms", "20", "--claim-split", "2", NULL};
    locked_head(*state, args);
}

/* The payload of row i (1-based insert order): 8 digits of i, then one letter repeated. */
static int on_big(tp_task *task, void *arg)
{
    struct fx *fx = arg;
    size_t len = 0;
    const char *p = tp_task_payload(task, &len);
    bool ok = p != NULL && len == BIG_LEN;
    if (ok) {
        char head[9];
        memcpy(head, p, 8);
        head[8] = '\0';
        unsigned long i = strtoul(head, NULL, 10);
        char c = (char)('A' + i % 26);
        for (size_t k = 8; k < len && ok; k += 4093)
            ok = p[k] == c;
        ok = ok && p[len - 1] == c;
    }
    if (!ok) {
        pthread_mutex_lock(&fx->mu);
        fx->bad_payloads++;
        pthread_mutex_unlock(&fx->mu);
    }
    note_run(fx, tp_task_id(task));
    struct timespec ts = {0, HOLD_MS * 1000000L};
    nanosleep(&ts, NULL);
    return ok ? TP_SUCCESS : TP_FAIL;
}

static void test_payload_bytes(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("claims_bytes", &fx->db), 0);
    for (int i = 1; i <= N_BIG; i++)
        assert_int_equal(tp_testdb_exec(&fx->db,
                                        "INSERT INTO task (task_type, payload) VALUES ('big',"
                                        " CONCAT(LPAD(%d, 8, '0'), REPEAT(CHAR(%d), %d)))",
                                        i, 'A' + i % 26, BIG_LEN - 8),
                         1);

    const char *const args[] = {"--poll-ms", "20", NULL};
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    long rss_start = procfs_status_kb(fx->d.pid, "VmRSS");
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "claims-big", N_BIG, "big", on_big, fx);
    assert_non_null(fx->w);

    bool all = false;
    long hwm = 0;
    for (long long end = tp_mono_ms() + 2 * WAIT_MS; !all && tp_mono_ms() < end; tp_sleep_ms(50)) {
        all = count_state(&fx->db, "1", 2) + count_state(&fx->db, "1", 3) == N_BIG;
        long h = procfs_status_kb(fx->d.pid, "VmHWM");
        hwm = h > hwm ? h : hwm;
        if (hwm > 2 * RSS_BOUND_KB)
            break; /* the old code: no need to go on eating memory */
    }
    long long claimed = tp_daemon_stat(&fx->d, "tasks.claimed_total");
    tp_diag("%d rows of %d-byte payloads, %d slots: taskpushd VmRSS %ld kB at start, VmHWM %ld kB"
            " (bound %ld kB), %lld claimed",
            N_BIG, BIG_LEN, N_BIG, rss_start, hwm, RSS_BOUND_KB, claimed);
    assert_true(hwm > 0);
    assert_true(hwm < RSS_BOUND_KB);
    assert_true(all);
    assert_int_equal(count_state(&fx->db, "1", 2), N_BIG);
    pthread_mutex_lock(&fx->mu);
    assert_int_equal(fx->bad_payloads, 0);
    pthread_mutex_unlock(&fx->mu);

    long long t0 = tp_mono_ms();
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, STOP_MS), 0);
    fx->have_daemon = false;
    tp_diag("SIGTERM: exited 0 in %lld ms", tp_mono_ms() - t0);
    tp_worker_stop(fx->w);
    assert_int_equal(tp_inproc_join(&fx->run), 0);
    fx->passed = true;
}

/* A budget smaller than one payload: each task still runs, one at a time (a claim
 * always takes one row; none is made while the payloads held reach the budget). */
static void test_payload_over_budget(void **state)
{
    struct fx *fx = *state;
    enum { N = 6 };
    assert_int_equal(tp_testdb_create("claims_over", &fx->db), 0);
    for (int i = 1; i <= N; i++)
        assert_int_equal(tp_testdb_exec(&fx->db,
                                        "INSERT INTO task (task_type, payload) VALUES ('big',"
                                        " CONCAT(LPAD(%d, 8, '0'), REPEAT(CHAR(%d), %d)))",
                                        i, 'A' + i % 26, BIG_LEN - 8),
                         1);
    const char *const args[] = {"--poll-ms", "20", "--max-buffered-bytes", "65536", NULL};
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "claims-over", N, "big", on_big, fx);
    assert_non_null(fx->w);

    long long most_held = 0, most_out = 0;
    bool all = false;
    for (long long end = tp_mono_ms() + WAIT_MS; !all && tp_mono_ms() < end; tp_sleep_ms(20)) {
        json_t *s = tp_daemon_json(&fx->d, "/stats");
        if (s) {
            long long held = tp_json_int_at(s, "queue.payload_bytes");
            long long out = tp_json_int_at(s, "queue.in_flight") + tp_json_int_at(s, "queue.buffered");
            most_held = held > most_held ? held : most_held;
            most_out = out > most_out ? out : most_out;
            json_decref(s);
        }
        all = count_state(&fx->db, "1", 2) + count_state(&fx->db, "1", 3) == N;
    }
    tp_diag("--max-buffered-bytes 65536, %d tasks of %d bytes: at most %lld payload bytes and %lld"
            " tasks held at once",
            N, BIG_LEN, most_held, most_out);
    assert_true(all);
    assert_int_equal(count_state(&fx->db, "1", 2), N);
    assert_true(most_held <= BIG_LEN);
    assert_true(most_out <= 1);
    pthread_mutex_lock(&fx->mu);
    assert_int_equal(fx->bad_payloads, 0);
    pthread_mutex_unlock(&fx->mu);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, STOP_MS), 0);
    fx->have_daemon = false;
    tp_worker_stop(fx->w);
    assert_int_equal(tp_inproc_join(&fx->run), 0);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_locked_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_locked_head_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_over_budget, setup, teardown),
    };
    return cmocka_run_group_tests_name("claims", tests, NULL, NULL);
}
