/* test_sizes: large results and payloads, and the bytes of outcomes waiting to be
 * written, against the real taskpushd, libtaskpush workers and the private MariaDB
 * (max_allowed_packet 16 MiB unless a case sets it).
 *
 * Cases:
 *   large_result         a 12,000,000-byte result ends SUCCESSFUL with every byte (the
 *                        server compares it with the pattern), and so does a WAIT
 *                        producer's OUTCOME; a 16,777,312-byte result (over the
 *                        MEDIUMBLOB column) ends FAILED with an err_msg that says so, never
 *                        SUCCESSFUL; /stats counts one failure, two successes
 *   submit_large_payload SUBMIT of a 12,000,000-byte payload (WAIT) and of a 16,777,215-byte
 *                        one (PROTOCOL.md's largest) are stored whole; their echoes come
 *                        back whole as results (stored, and in the OUTCOME)
 *   over_packet          with the server's max_allowed_packet at 4 MiB: a 4,000,000-byte
 *                        result is stored whole (above the hex text's 2 MiB), a
 *                        5,000,000-byte one fails with "exceeds the database's
 *                        max_allowed_packet of 4194304" (the WAIT producer gets FAILED
 *                        with it), and SUBMIT of a 5,000,000-byte payload is INVALID
 *                        with that limit
 *   unwritten_bytes      a worker of 16 slots answers 350 results of 2,000,000 bytes while
 *                        another transaction holds each answered row's lock (so no outcome
 *                        can be written): taskpushd's peak RSS stays under 480 MB
 *                        (--max-unwritten-bytes, 256 MiB by default, pauses dispatch;
 *                        the count alone let 700 MB pile up); once the lock goes, every
 *                        task ends SUCCESSFUL with its whole result
 *
 * Waits are bounded polling; nothing asserts on how long anything took. */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "rows.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 120000
#define SUBMIT_TIMEOUT_MS 120000
#define BLOCK 16 /* the pattern's unit: "t=%014llu;" */

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_d;
    tp_worker *w[2];
    tp_inproc run[2];
    bool restore_packet;
    bool passed;
    /* unwritten_bytes: the transaction holding the answered rows */
    MYSQL *blocker;
    pthread_mutex_t mu;
    bool holding;
    atomic_int handled;
    size_t result_len;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    pthread_mutex_init(&fx->mu, NULL);
    atomic_init(&fx->handled, 0);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    int rc = 0;
    if (fx->blocker) {
        pthread_mutex_lock(&fx->mu);
        fx->holding = false;
        mysql_query(fx->blocker, "ROLLBACK");
        pthread_mutex_unlock(&fx->mu);
    }
    for (int i = 0; i < 2; i++) {
        if (fx->w[i]) {
            tp_inproc_halt(&fx->run[i]);
            tp_worker_free(fx->w[i]);
        }
    }
    if (fx->blocker)
        mysql_close(fx->blocker);
    if (fx->have_d) {
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
        if (tp_daemon_stop(&fx->d, SIGTERM, 30000) != 0 && fx->passed) {
            fprintf(stderr, "taskpushd did not exit 0 after SIGTERM\n");
            tp_daemon_dump_log(&fx->d);
            rc = -1;
        }
    }
    if (fx->restore_packet && fx->have_db)
        tp_testdb_exec(&fx->db, "SET GLOBAL max_allowed_packet = 16777216");
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    pthread_mutex_destroy(&fx->mu);
    free(fx);
    return rc;
}

/* Fills buf[0..len) with "t=<task_id, 14 digits>;" repeated (len a multiple of BLOCK):
 * the server checks a stored value with REPEAT(), the test with memcmp. */
static void fill(uint8_t *buf, size_t len, uint64_t id)
{
    char unit[32];
    snprintf(unit, sizeof unit, "t=%014" PRIu64 ";", id % 100000000000000u);
    for (size_t k = 0; k + BLOCK <= len; k += BLOCK)
        memcpy(buf + k, unit, BLOCK);
    for (size_t k = len - len % BLOCK; k < len; k++)
        buf[k] = 'x';
}

static bool matches(const void *data, size_t len, uint64_t id, size_t want)
{
    if (len != want)
        return false;
    uint8_t *buf = malloc(want ? want : 1);
    if (buf == NULL)
        return false;
    fill(buf, want, id);
    bool same = memcmp(buf, data, want) == 0;
    free(buf);
    return same;
}

/* The SQL condition: column col of the row is the pattern of its task_id, len bytes. */
static void pattern_sql(char *out, size_t cap, const char *col, size_t len)
{
    snprintf(out, cap, "LENGTH(%s) = %zu AND %s = REPEAT(CAST(CONCAT('t=', LPAD(task_id, 14, '0'), ';') AS BINARY(16)), %zu)",
             col, len, col, len / BLOCK);
}

/* "big": the payload is a decimal length; the result is that many bytes of the pattern. */
static int big_handler(tp_task *task, void *arg)
{
    (void)arg;
    size_t plen;
    const char *p = tp_task_payload(task, &plen);
    char num[32];
    if (plen == 0 || plen >= sizeof num)
        return TP_FAIL_PERMANENT;
    memcpy(num, p, plen);
    num[plen] = 0;
    size_t n = (size_t)strtoull(num, NULL, 10);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return TP_FAIL;
    fill(buf, n, tp_task_id(task));
    int rc = tp_task_set_result(task, buf, n);
    free(buf);
    return rc == 0 ? TP_SUCCESS : TP_FAIL_PERMANENT;
}

/* "echo": the result is the payload. */
static int echo_handler(tp_task *task, void *arg)
{
    (void)arg;
    size_t plen;
    const void *p = tp_task_payload(task, &plen);
    return tp_task_set_result(task, p, plen) == 0 ? TP_SUCCESS : TP_FAIL_PERMANENT;
}

static void start(struct fx *fx, const char *tag, const char *packet)
{
    static const char *const args[] = {"--poll-ms", "50", "--heartbeat-ms", "1000", NULL};
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    if (packet) {
        /* Sessions read it when they connect: taskpushd's, started next, get it. */
        assert_true(tp_testdb_exec(&fx->db, "SET GLOBAL max_allowed_packet = %s", packet) >= 0);
        fx->restore_packet = true;
    }
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_d = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, 30000), 0);
}

/* Worker slot i: "big" and "echo" handlers (types NULL: a producer only). */
static tp_worker *worker(struct fx *fx, int i, unsigned slots, bool producer)
{
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.capacity = slots;
    o.threads = slots;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    tp_worker *w = tp_worker_new(&o, &err);
    assert_non_null(w);
    if (!producer) {
        assert_int_equal(tp_worker_add_type(w, "big", big_handler, fx), 0);
        assert_int_equal(tp_worker_add_type(w, "echo", echo_handler, fx), 0);
    }
    fx->w[i] = w;
    assert_int_equal(tp_inproc_start(&fx->run[i], w), 0);
    return w;
}

static bool wait_u64(struct fx *fx, uint64_t want, const char *sql)
{
    long long until = tp_mono_ms() + WAIT_MS;
    while (tp_mono_ms() < until) {
        if (tp_testdb_query_u64(&fx->db, "%s", sql) == want)
            return true;
        tp_sleep_ms(50);
    }
    return false;
}

static uint64_t insert_big(struct fx *fx, size_t len)
{
    assert_true(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) VALUES ('big', '%zu')", len) == 1);
    return (uint64_t)mysql_insert_id(fx->db.conn);
}

/* ---- large_result ---- */

static void large_result(void **state)
{
    struct fx *fx = *state;
    char cond[256];
    start(fx, "sizes_result", NULL);
    worker(fx, 0, 2, false);
    tp_worker *p = worker(fx, 1, 1, true);

    uint64_t ok = insert_big(fx, 12000000);
    uint64_t over = insert_big(fx, 16777312);
    assert_true(wait_u64(fx, 2, "SELECT COUNT(*) FROM task WHERE task_state IN (2, 3)"));
    pattern_sql(cond, sizeof cond, "result", 12000000);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT LENGTH(result) FROM task WHERE task_id = %" PRIu64, ok),
                     12000000);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 2 AND %s", ok, cond),
                     1);
    /* Too large for the column: failed, with the reason, never SUCCESSFUL. */
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 3 AND result IS NULL AND err_msg ="
                                                  " 'result of 16777312 bytes exceeds the result column''s"
                                                  " largest value of 16777215'", over),
                     1);

    /* A WAIT producer hears of the whole result. */
    tp_submit_task t;
    tp_submit_result r;
    tp_error err;
    tp_submit_task_init(&t);
    t.type = "big";
    t.payload = "12000000";
    t.payload_len = 8;
    assert_int_equal(tp_submit(p, &t, 1, TP_SUBMIT_WAIT, SUBMIT_TIMEOUT_MS, &r, &err), 0);
    assert_int_equal(r.state, TP_TASK_SUCCESSFUL);
    assert_true(matches(r.output, r.output_len, r.task_id, 12000000));
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 2 AND %s", r.task_id, cond),
                     1);
    tp_submit_results_free(&r, 1);
    assert_int_equal(tp_daemon_stat(&fx->d, "tasks.succeeded_total"), 2);
    assert_int_equal(tp_daemon_stat(&fx->d, "tasks.failed_total"), 1);
    assert_int_equal(tp_daemon_log_count(&fx->d, " cut "), 0);
    fx->passed = true;
}

/* ---- submit_large_payload ---- */

static void submit_large_payload(void **state)
{
    struct fx *fx = *state;
    char cond[256];
    start(fx, "sizes_submit", NULL);
    worker(fx, 0, 2, false);
    tp_worker *p = worker(fx, 1, 1, true);
    tp_submit_task t;
    tp_submit_result r;
    tp_error err;
    size_t big = 12000000, max = 16777215;
    uint8_t *payload = malloc(max);
    assert_non_null(payload);

    /* The id is not known before the insert: the pattern of task 0, checked as bytes. */
    fill(payload, big, 0);
    tp_submit_task_init(&t);
    t.type = "echo";
    t.payload = payload;
    t.payload_len = big;
    int rc = tp_submit(p, &t, 1, TP_SUBMIT_WAIT, SUBMIT_TIMEOUT_MS, &r, &err);
    if (rc != 0)
        fprintf(stderr, "# tp_submit of %zu bytes: %d %s\n", big, rc, err.text);
    assert_int_equal(rc, 0);
    assert_int_equal(r.state, TP_TASK_SUCCESSFUL);
    assert_true(matches(r.output, r.output_len, 0, big));
    uint64_t id = r.task_id;
    tp_submit_results_free(&r, 1);
    snprintf(cond, sizeof cond,
             "LENGTH(payload) = %zu AND payload = REPEAT(CAST(CONCAT('t=', LPAD(0, 14, '0'), ';') AS BINARY(16)), %zu)"
             " AND result = payload",
             big, big / BLOCK);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 2 AND %s", id, cond),
                     1);

    /* The largest payload PROTOCOL.md allows: stored whole, delivered whole, and its
     * echo (a result of the column's largest size) stored whole. */
    fill(payload, max, 7);
    t.payload_len = max;
    rc = tp_submit(p, &t, 1, TP_SUBMIT_WAIT, SUBMIT_TIMEOUT_MS, &r, &err);
    if (rc != 0)
        fprintf(stderr, "# tp_submit of %zu bytes: %d %s\n", max, rc, err.text);
    assert_int_equal(rc, 0);
    assert_int_equal(r.state, TP_TASK_SUCCESSFUL);
    assert_true(matches(r.output, r.output_len, 7, max));
    id = r.task_id;
    tp_submit_results_free(&r, 1);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 2 AND LENGTH(payload) = %zu AND LEFT(payload, %zu) ="
                                                  " REPEAT(CAST(CONCAT('t=', LPAD(7, 14, '0'), ';') AS BINARY(16)), %zu)"
                                                  " AND RIGHT(payload, 15) = 'xxxxxxxxxxxxxxx' AND result = payload",
                                      id, max, max - max % BLOCK, max / BLOCK),
                     1);
    free(payload);
    fx->passed = true;
}

/* ---- over_packet ---- */

static void over_packet(void **state)
{
    struct fx *fx = *state;
    char cond[256];
    start(fx, "sizes_packet", "4194304");
    worker(fx, 0, 2, false);
    tp_worker *p = worker(fx, 1, 1, true);

    uint64_t fits = insert_big(fx, 4000000);
    uint64_t over = insert_big(fx, 5000000);
    assert_true(wait_u64(fx, 2, "SELECT COUNT(*) FROM task WHERE task_state IN (2, 3)"));
    pattern_sql(cond, sizeof cond, "result", 4000000);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT LENGTH(result) FROM task WHERE task_id = %" PRIu64, fits),
                     4000000);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 2 AND %s", fits, cond),
                     1);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND task_state = 3 AND result IS NULL AND err_msg ="
                                                  " 'result of 5000000 bytes exceeds the database''s"
                                                  " max_allowed_packet of 4194304'", over),
                     1);

    /* The WAIT producer is told it failed, and why. */
    tp_submit_task t;
    tp_submit_result r;
    tp_error err;
    tp_submit_task_init(&t);
    t.type = "big";
    t.payload = "5000000";
    t.payload_len = 7;
    assert_int_equal(tp_submit(p, &t, 1, TP_SUBMIT_WAIT, SUBMIT_TIMEOUT_MS, &r, &err), 0);
    assert_int_equal(r.state, TP_TASK_FAILED);
    assert_non_null(r.output);
    assert_non_null(strstr(r.output, "exceeds the database's max_allowed_packet of 4194304"));
    tp_submit_results_free(&r, 1);

    /* A payload over the limit is refused with it; nothing is inserted. */
    uint8_t *payload = malloc(5000000);
    assert_non_null(payload);
    fill(payload, 5000000, 1);
    t.type = "keep";
    t.payload = payload;
    t.payload_len = 5000000;
    int rc = tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, &r, &err);
    free(payload);
    assert_int_equal(rc, TP_EINVAL);
    assert_non_null(strstr(err.text, "payload of 5000000 bytes exceeds the database's max_allowed_packet of 4194304"));
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_type = 'keep'"), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 2 AND task_type = 'big'"
                                                  " AND LENGTH(result) <> 4000000"),
                     0);
    fx->passed = true;
}

/* ---- unwritten_bytes ---- */

#define HELD_TASKS 350
#define HELD_RESULT 2000000u
#define RSS_BOUND_KB tp_daemon_rss_bound_kb(480L * 1024)

/* "held": takes the row's lock in the test's open transaction first (while the test
 * holds them), so that its outcome cannot be written; then answers HELD_RESULT bytes. */
static int held_handler(tp_task *task, void *arg)
{
    struct fx *fx = arg;
    pthread_mutex_lock(&fx->mu);
    if (fx->holding &&
        tp_testdb_exec_conn(fx->blocker, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE",
                            tp_task_id(task)) < 0) {
        pthread_mutex_unlock(&fx->mu);
        return TP_FAIL;
    }
    pthread_mutex_unlock(&fx->mu);
    uint8_t *buf = malloc(HELD_RESULT);
    if (buf == NULL)
        return TP_FAIL;
    fill(buf, HELD_RESULT, tp_task_id(task));
    int rc = tp_task_set_result(task, buf, HELD_RESULT);
    free(buf);
    atomic_fetch_add(&fx->handled, 1);
    return rc == 0 ? TP_SUCCESS : TP_FAIL;
}

static void unwritten_bytes(void **state)
{
    struct fx *fx = *state;
    char cond[256], sql[512];
    start(fx, "sizes_unwritten", NULL);
    fx->blocker = tp_testdb_connect(&fx->db);
    assert_non_null(fx->blocker);
    assert_true(tp_testdb_exec_conn(fx->blocker, "SET SESSION autocommit = 0, innodb_lock_wait_timeout = 100") >= 0);
    fx->holding = true;
    assert_int_equal(tp_rows_insert(&fx->db, "held", HELD_TASKS, false), 0);
    long base_kb = procfs_status_kb(fx->d.pid, "VmRSS");

    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.capacity = 16;
    o.threads = 16;
    fx->w[0] = tp_worker_new(&o, &err);
    assert_non_null(fx->w[0]);
    assert_int_equal(tp_worker_add_type(fx->w[0], "held", held_handler, fx), 0);
    assert_int_equal(tp_inproc_start(&fx->run[0], fx->w[0]), 0);

    /* Until every task was answered, or answers stopped coming for 5 s (dispatch
     * paused): the outcomes cannot be written meanwhile. */
    int last = -1;
    long long still_since = tp_mono_ms(), until = tp_mono_ms() + WAIT_MS;
    while (tp_mono_ms() < until) {
        int n = atomic_load(&fx->handled);
        if (n >= HELD_TASKS)
            break;
        if (n != last) {
            last = n;
            still_since = tp_mono_ms();
        } else if (n >= 16 && tp_mono_ms() - still_since > 5000) {
            break;
        }
        tp_sleep_ms(100);
    }
    long peak_kb = procfs_status_kb(fx->d.pid, "VmHWM");
    long long pending = tp_daemon_stat(&fx->d, "db.pending_write_bytes");
    fprintf(stderr, "# answered %d of %d while their rows were held; taskpushd VmRSS %ld kB before,"
                    " peak %ld kB (bound %ld kB); pending_write_bytes %lld\n",
            atomic_load(&fx->handled), HELD_TASKS, base_kb, peak_kb, RSS_BOUND_KB, pending);
    assert_true(peak_kb > 0);
    assert_true(peak_kb < RSS_BOUND_KB);

    /* The lock goes: everything is written, dispatch resumes, nothing is lost. */
    pthread_mutex_lock(&fx->mu);
    fx->holding = false;
    assert_int_equal(mysql_query(fx->blocker, "COMMIT"), 0);
    pthread_mutex_unlock(&fx->mu);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM task WHERE task_type = 'held' AND task_state = 2");
    assert_true(wait_u64(fx, HELD_TASKS, sql));
    pattern_sql(cond, sizeof cond, "result", HELD_RESULT);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_type = 'held'"
                                                  " AND task_state = 2 AND %s", cond),
                     HELD_TASKS);
    fx->passed = true;
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(large_result),
        T(submit_large_payload),
        T(over_packet),
        T(unwritten_bytes),
    };
    return cmocka_run_group_tests_name("sizes", tests, NULL, NULL);
}
