/* test_schedules: periodic tasks (docs/producers.md, "Periodic tasks") inserted by the
 * leading dispatcher exactly once, across a kill -9 of the leader, a takeover by the
 * standby, a stretch with no dispatcher at all, and a restart.
 *
 * Real components only: the private MariaDB of scripts/tp-mariadb and two taskpushd of
 * the build tree on one table (leader A and standby B, as test_failover starts them),
 * with their default --lease-ms (1000). No worker: the inserted rows stay NEW and are
 * counted in the table. Times are the database's clock (NOW(3)), as the dispatchers'.
 *
 * Case runs_inserted_once_across_failover:
 *   schedules 'beat-catch-up' and 'beat-skip' every 1000 ms from T0, and 'minutely'
 *   (cron "* * * * *", next_run 0). A leads, B stands by; A is killed with SIGKILL
 *   mid-way, B takes over; B is killed too and no dispatcher runs for GAP_MS; A is
 *   started again and runs a few seconds, then stops. Then:
 *   - 'beat-catch-up' has exactly one row per due time T0, T0 + 1000, ..., E (its last):
 *     no due time missing, none twice (rows = distinct due times = (E - T0) / 1000 + 1),
 *     each with dedup_key 'schedule:beat-catch-up:<due>' and run_after = its due time,
 *     and E is past the restart;
 *   - 'beat-skip' has no due time twice, none of the due times that fell inside the gap
 *     (those the rule skips), and goes on after the restart;
 *   - GET /schedules and `taskpushctl schedules` list the three with their next run;
 *     'minutely' got a next_run on a minute boundary and no row. */
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon.h"
#include "tap.h"
#include "testdb.h"

#define WAIT_MS 20000
#define GAP_MS 3500
#define NOW_SQL "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

struct fx {
    tp_testdb db;
    tp_daemon d[2];
    bool up[2];
    bool passed;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    *state = fx;
    return fx ? 0 : -1;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i < 2; i++)
        if (fx->up[i]) {
            tp_daemon_stop(&fx->d[i], SIGKILL, 5000);
            if (!fx->passed)
                tp_daemon_dump_log(&fx->d[i]);
        }
    tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

static int64_t db_now(struct fx *fx)
{
    uint64_t v = tp_testdb_query_u64(&fx->db, NOW_SQL);
    assert_true(v != TP_TESTDB_U64_ERR);
    return (int64_t)v;
}

/* Waits until the database's clock reaches t. */
static void wait_db_time(struct fx *fx, int64_t t)
{
    for (int64_t now; (now = db_now(fx)) < t;)
        tp_sleep_ms((int)(t - now < 200 ? t - now : 200));
}

/* Waits until schedule name has a row for due time due (its catch-up rows come in by
 * the leader's rounds). */
static void wait_run(struct fx *fx, const char *name, int64_t due)
{
    long long end = tp_mono_ms() + WAIT_MS;
    while (tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE dedup_key = 'schedule:%s:%" PRId64 "'",
                               name, due) != 1) {
        if (tp_mono_ms() > end)
            fail_msg("schedule %s: no run for due time %" PRId64 " within %d ms", name, due, WAIT_MS);
        tp_sleep_ms(50);
    }
}

static void start(struct fx *fx, int k)
{
    assert_int_equal(tp_daemon_start(&fx->d[k], fx->db.url, NULL), 0);
    fx->up[k] = true;
}

static void kill9(struct fx *fx, int k)
{
    assert_int_equal(tp_daemon_stop(&fx->d[k], SIGKILL, 10000), 128 + SIGKILL);
    fx->up[k] = false;
}

/* The due times of schedule name's rows, ascending, into out (at most cap); their count.
 * Checks each row's dedup_key and run_after against its due time. */
static size_t due_times(struct fx *fx, const char *name, int64_t *out, size_t cap)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT run_after, dedup_key, task_type, task_priority, payload FROM task"
             " WHERE dedup_key LIKE 'schedule:%s:%%' ORDER BY run_after",
             name);
    assert_int_equal(mysql_query(fx->db.conn, sql), 0);
    MYSQL_RES *res = mysql_store_result(fx->db.conn);
    assert_non_null(res);
    size_t n = 0;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res));) {
        char want[160];
        snprintf(want, sizeof want, "schedule:%s:%s", name, row[0]);
        assert_string_equal(row[1], want);
        assert_string_equal(row[2], "beat");
        assert_string_equal(row[3], "2");
        assert_string_equal(row[4], name);
        assert_true(n < cap);
        out[n++] = strtoll(row[0], NULL, 10);
    }
    mysql_free_result(res);
    return n;
}

static bool has(const int64_t *v, size_t n, int64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

static void check_listing(struct fx *fx, int k)
{
    json_t *o = tp_daemon_json(&fx->d[k], "/schedules");
    assert_non_null(o);
    long long valid_wait = tp_mono_ms() + WAIT_MS;
    while (!json_is_true(json_object_get(o, "valid")) ||
           json_array_size(json_object_get(o, "schedules")) != 3) { /* read once a second */
        json_decref(o);
        assert_true(tp_mono_ms() < valid_wait);
        tp_sleep_ms(100);
        o = tp_daemon_json(&fx->d[k], "/schedules");
        assert_non_null(o);
    }
    json_t *list = json_object_get(o, "schedules"), *sc;
    size_t i;
    int seen = 0;
    json_array_foreach(list, i, sc) {
        const char *name = json_string_value(json_object_get(sc, "name"));
        assert_non_null(name);
        long long next = tp_json_int_at(sc, "next_run");
        assert_true(next > 0);
        if (strcmp(name, "minutely") == 0) {
            assert_string_equal(json_string_value(json_object_get(sc, "cron")), "* * * * *");
            assert_int_equal(next % 60000, 0);
            seen |= 1;
        } else {
            assert_int_equal(tp_json_int_at(sc, "interval_ms"), 1000);
            assert_string_equal(json_string_value(json_object_get(sc, "missed")),
                                strcmp(name, "beat-skip") == 0 ? "skip" : "catch-up");
            seen |= strcmp(name, "beat-skip") == 0 ? 2 : 4;
        }
    }
    assert_int_equal(seen, 7);
    json_decref(o);

    /* taskpushctl schedules prints the same three. */
    char cmd[512], out[4096];
    snprintf(cmd, sizeof cmd, "%s --admin %s schedules", tp_build_path("ctl/taskpushctl"), fx->d[k].admin);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    assert_int_equal(pclose(p), 0);
    assert_non_null(strstr(out, "NEXT RUN"));
    assert_non_null(strstr(out, "beat-catch-up"));
    assert_non_null(strstr(out, "beat-skip"));
    assert_non_null(strstr(out, "minutely"));
    assert_non_null(strstr(out, "* * * * *"));
}

static void test_runs_inserted_once_across_failover(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("schedules", &fx->db), 0);
    int64_t t0 = (db_now(fx) / 1000 + 2) * 1000;
    assert_int_equal(tp_testdb_exec(&fx->db,
                                    "INSERT INTO task_schedule (name, task_type, payload, task_priority,"
                                    " interval_ms, missed, catch_up_max, next_run) VALUES"
                                    " ('beat-catch-up', 'beat', 'beat-catch-up', 2, 1000, 'catch-up', 1000, %" PRId64
                                    "), ('beat-skip', 'beat', 'beat-skip', 2, 1000, 'skip', 100, %" PRId64 ")",
                                    t0, t0),
                     2);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task_schedule (name, task_type, cron) VALUES"
                                             " ('minutely', 'beat', '* * * * *')"),
                     1);

    /* A leads, B stands by; A runs the schedules for a few seconds. */
    start(fx, 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    start(fx, 1);
    wait_run(fx, "beat-catch-up", t0 + 3000);
    check_listing(fx, 1); /* a standby lists them too */

    /* kill -9 of A: B takes over and goes on. */
    kill9(fx, 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[1], WAIT_MS), 0);
    int64_t b_led = db_now(fx);
    wait_run(fx, "beat-catch-up", (b_led / 1000 + 2) * 1000);

    /* kill -9 of B: nobody leads for GAP_MS. */
    kill9(fx, 1);
    int64_t gap_start = db_now(fx);
    tp_sleep_ms(GAP_MS);
    int64_t gap_end = db_now(fx);

    /* A again: catches up, and runs on for a while. */
    start(fx, 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    int64_t last = (db_now(fx) / 1000 + 3) * 1000;
    wait_run(fx, "beat-catch-up", last);
    wait_run(fx, "beat-skip", last);
    check_listing(fx, 0);
    assert_int_equal(tp_daemon_stop(&fx->d[0], SIGTERM, 15000), 0);
    fx->up[0] = false;
    wait_db_time(fx, last + 100);

    static int64_t cu[4096], sk[4096];
    size_t ncu = due_times(fx, "beat-catch-up", cu, 4096), nsk = due_times(fx, "beat-skip", sk, 4096);
    tp_diag("catch-up: %zu runs from %" PRId64 " to %" PRId64 "; skip: %zu runs; gap (no dispatcher) %" PRId64
         " to %" PRId64,
         ncu, cu[0], ncu ? cu[ncu - 1] : 0, nsk, gap_start, gap_end);
    /* Catch-up: every due time from T0 to its last, each once. */
    assert_true(ncu >= 8);
    assert_int_equal(cu[0], t0);
    assert_true(cu[ncu - 1] >= last);
    for (size_t i = 0; i < ncu; i++)
        assert_int_equal(cu[i], t0 + 1000 * (int64_t)i);
    /* Rows per schedule and due time, counted by the table: one each. */
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM (SELECT payload, run_after FROM task"
                                                  " WHERE dedup_key LIKE 'schedule:%%' GROUP BY payload, run_after"
                                                  " HAVING COUNT(*) > 1) t"),
                     0);
    /* Skip: no due time twice, none of the gap's, and runs after the restart. */
    int skipped = 0;
    for (size_t i = 1; i < nsk; i++)
        assert_true(sk[i] > sk[i - 1]);
    for (int64_t d = (gap_start / 1000 + 1) * 1000; d <= gap_end - 1000; d += 1000) {
        assert_false(has(sk, nsk, d));
        assert_true(has(cu, ncu, d));
        skipped++;
    }
    tp_diag("skip: %d due times inside the gap skipped (and caught up by the other)", skipped);
    assert_true(skipped >= 2);
    assert_true(has(sk, nsk, last));
    /* 'minutely' (cron): only on minute boundaries, each once. */
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE dedup_key LIKE 'schedule:minutely:%%'"
                                                  " AND (run_after %% 60000 <> 0 OR run_after < %" PRId64 ")",
                                         t0 - 2000),
                     0);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_runs_inserted_once_across_failover, setup, teardown),
    };
    return cmocka_run_group_tests_name("schedules", tests, NULL, NULL);
}
