/* test_group_commit: the submit thread's group commit (docs/producers.md, "Submitting
 * without SQL"): the submissions of many connections that arrive while one insert runs go
 * together in the next transaction, each answered only after its COMMIT, each dedup_key
 * answered per task. Real taskpushd, real MariaDB, raw protocol clients over TCP.
 *
 * To make the coalescing certain rather than likely, a second session holds the submit
 * thread's first insert: it locks the task table for reading (LOCK TABLES), so the first
 * submission's INSERT waits for the table's metadata lock. The other submissions then
 * queue behind it; the test waits until /stats db.submit_requests_total says every one
 * was handed to the submit thread, and only then unlocks the table.
 *
 * Cases:
 *   per_row_duplicates  a row with dedup_key "gate" committed by SQL; 33 connections
 *                       queued behind the held insert (which names "gate"), one task
 *                       each: 15 pairs with the same dedup_key, one naming "gate" again,
 *                       one without a key. Once released: exactly two transactions in all
 *                       (the held one and one for the 32), one row per key, each pair one
 *                       INSERTED and one DUPLICATE with the same id, "gate" DUPLICATE with
 *                       the SQL row's id on both connections.
 *   ack_after_commit    16 connections of 50 tasks each queued behind a held insert. The
 *                       moment the first answer of their coalesced batch is read, the
 *                       dispatcher is stopped (SIGSTOP): another connection then finds
 *                       every task of every answer already readable. Three rounds. The
 *                       batches have no dedup_key: each is ONE autocommit INSERT ...
 *                       RETURNING (db.submit_autocommit_batches_total), so this is the
 *                       check that the autocommit path answers only after its statement.
 *   autocommit_ids      32 connections of one keyless task each, distinct payloads,
 *                       queued behind a held insert: one autocommit batch for the 32, and
 *                       the id each answer carries is the row holding that task's payload
 *                       (ids from RETURNING, never LAST_INSERT_ID arithmetic). Then the
 *                       same with one task carrying a dedup_key, and with one submission
 *                       waiting for its OUTCOME: each batch goes as a transaction (the
 *                       autocommit counter stays), and is still answered per row.
 *   lone_producer       one connection submitting one task at a time, 40 times: each its
 *                       own batch, and the gather never held one (db.submit_gather_us_total
 *                       stays 0: the count it waits for is the connections of the last
 *                       two batches, here one, which the next submission reaches).
 *
 * Waits are bounded polling; nothing asserts on how long anything took. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "proto.h"
#include "raw.h"
#include "testdb.h"

#define WAIT_MS 60000
#define PAIRS 15
#define NCONN (2 * PAIRS + 3) /* the gated one, the pairs, the gate's key again, no key */
#define ACK_CONNS 16
#define ACK_TASKS 50
#define ACK_ROUNDS 3
#define AUTO_CONNS 32 /* autocommit_ids: NCONN - 1 */

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_d;
    MYSQL *gate;  /* the session holding the gate row's lock */
    MYSQL *other; /* a reader on a connection of its own */
    int fds[NCONN];
    bool passed;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    for (int i = 0; i < NCONN; i++)
        fx->fds[i] = -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    int rc = 0;
    for (int i = 0; i < NCONN; i++)
        if (fx->fds[i] >= 0)
            close(fx->fds[i]);
    if (fx->gate)
        mysql_close(fx->gate);
    if (fx->other)
        mysql_close(fx->other);
    if (fx->have_d) {
        kill(fx->d.pid, SIGCONT);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
        if (tp_daemon_stop(&fx->d, SIGTERM, 15000) != 0 && fx->passed) {
            fprintf(stderr, "taskpushd did not exit 0 after SIGTERM\n");
            tp_daemon_dump_log(&fx->d);
            rc = -1;
        }
    }
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    free(fx);
    return rc;
}

static void start(struct fx *fx, const char *tag)
{
    /* No worker connects: the rows stay NEW, so what the test reads is what SUBMIT wrote. */
    static const char *const args[] = {"--poll-ms", "50", "--heartbeat-ms", "30000", NULL};
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_d = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    fx->gate = tp_testdb_connect(&fx->db);
    fx->other = tp_testdb_connect(&fx->db);
    assert_non_null(fx->gate);
    assert_non_null(fx->other);
}

/* A producer connection: HELLO of the current version with no type. */
static int producer(struct fx *fx)
{
    int fd = tp_raw_connect(fx->d.listen, 60);
    assert_true(fd >= 0);
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"gc", 2};
    assert_int_equal(tp_raw_send_msg(fd, &m), 0);
    static uint8_t buf[65536];
    long n = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(n > 0);
    proto_msg w;
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &w), PROTO_OK);
    assert_int_equal(w.type, PROTO_WELCOME);
    return fd;
}

static proto_submit_task task_keyed(const char *key)
{
    proto_submit_task t;
    memset(&t, 0, sizeof t);
    t.priority = 1;
    t.type = (proto_bytes){(const uint8_t *)"gc", 2};
    t.payload = (proto_bytes){(const uint8_t *)"p", 1};
    if (key)
        t.dedup_key = (proto_bytes){(const uint8_t *)key, strlen(key)};
    return t;
}

static void submit(int fd, uint32_t request_id, const proto_submit_task *t, uint16_t n)
{
    proto_msg m = {.type = PROTO_SUBMIT};
    m.u.submit.request_id = request_id;
    m.u.submit.ntasks = n;
    m.u.submit.tasks = t;
    assert_int_equal(tp_raw_send_msg(fd, &m), 0);
}

/* Reads the SUBMITTED answer to request_id (OK, n results) into buf and m. */
static void read_answer(int fd, uint32_t request_id, uint16_t n, uint8_t *buf, size_t cap, proto_msg *m)
{
    long len = tp_raw_read_frame(fd, buf, cap);
    assert_true(len > 0);
    assert_int_equal(proto_msg_decode(buf, (size_t)len, m), PROTO_OK);
    assert_int_equal(m->type, PROTO_SUBMITTED);
    assert_int_equal(m->u.submitted.request_id, request_id);
    assert_int_equal(m->u.submitted.status, PROTO_SUBMIT_OK);
    assert_int_equal(m->u.submitted.n, n);
}

static long long stat_of(struct fx *fx, const char *key)
{
    return tp_daemon_stat(&fx->d, key);
}

static bool wait_stat(struct fx *fx, const char *key, long long want)
{
    long long until = tp_mono_ms() + WAIT_MS;
    while (tp_mono_ms() < until) {
        if (stat_of(fx, key) == want)
            return true;
        tp_sleep_ms(20);
    }
    fprintf(stderr, "%s: %lld, waited for %lld\n", key, stat_of(fx, key), want);
    return false;
}

/* The gate: the task table locked for reading (LOCK TABLES), so that the submit thread's
 * next INSERT waits for the table's metadata lock. (A row lock would not do: the submit
 * connection waits for no row lock, it answers "unavailable" at once.) */
static void gate_close(struct fx *fx)
{
    assert_int_equal(tp_testdb_exec_conn(fx->gate, "LOCK TABLES task READ"), 0);
}

static void gate_open(struct fx *fx)
{
    assert_int_equal(tp_testdb_exec_conn(fx->gate, "UNLOCK TABLES"), 0);
}

/* Waits until the submit thread's INSERT waits behind the gate. */
static bool wait_gated(struct fx *fx)
{
    long long until = tp_mono_ms() + WAIT_MS;
    while (tp_mono_ms() < until) {
        if (tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM information_schema.processlist"
                                                " WHERE db = DATABASE() AND info LIKE 'INSERT%%'"
                                                " AND state LIKE 'Waiting for table%%'") >= 1)
            return true;
        tp_sleep_ms(20);
    }
    return false;
}

/* ---- per_row_duplicates ---- */

static void per_row_duplicates(void **state)
{
    struct fx *fx = *state;
    start(fx, "gc_dups");
    static uint8_t buf[NCONN][4096];
    proto_msg ans[NCONN];
    char keys[NCONN][32];
    const char *key[NCONN];

    for (int i = 0; i < NCONN; i++)
        fx->fds[i] = producer(fx);
    key[0] = "gate";
    for (int p = 0; p < PAIRS; p++) {
        snprintf(keys[1 + 2 * p], sizeof keys[0], "pair-%d", p);
        key[1 + 2 * p] = key[2 + 2 * p] = keys[1 + 2 * p];
    }
    key[NCONN - 2] = "gate";
    key[NCONN - 1] = NULL;

    /* A row of the gate's key, committed by SQL. */
    assert_int_equal(tp_testdb_exec_conn(fx->other, "INSERT INTO task (task_type, payload, dedup_key)"
                                                    " VALUES ('gc', 'sql', 'gate')"),
                     1);
    uint64_t gate_id = (uint64_t)mysql_insert_id(fx->other);
    gate_close(fx);
    long long batches0 = stat_of(fx, "db.submit_batches_total");
    long long requests0 = stat_of(fx, "db.submit_requests_total");
    proto_submit_task t0 = task_keyed(key[0]);
    submit(fx->fds[0], 1, &t0, 1);
    assert_true(wait_gated(fx));
    for (int i = 1; i < NCONN; i++) {
        proto_submit_task t = task_keyed(key[i]);
        submit(fx->fds[i], (uint32_t)(i + 1), &t, 1);
    }
    /* Every submission is queued behind the gated insert before the gate opens. */
    assert_true(wait_stat(fx, "db.submit_requests_total", requests0 + NCONN));
    assert_int_equal(stat_of(fx, "db.submit_batches_total"), batches0);
    gate_open(fx);

    for (int i = 0; i < NCONN; i++)
        read_answer(fx->fds[i], (uint32_t)(i + 1), 1, buf[i], sizeof buf[i], &ans[i]);
    proto_submit_res r[NCONN];
    for (int i = 0; i < NCONN; i++)
        proto_submitted_result(&ans[i].u.submitted, 0, &r[i]);

    /* Two transactions: the gated one, and one that gathered the other 32; neither in
     * autocommit (keys). */
    assert_true(wait_stat(fx, "db.submit_batches_total", batches0 + 2));
    assert_int_equal(stat_of(fx, "db.submit_autocommit_batches_total"), 0);
    /* The gate's key on both connections: the session's row. */
    assert_int_equal(r[0].result, PROTO_SUBMIT_DUPLICATE);
    assert_int_equal(r[0].task_id, gate_id);
    assert_int_equal(r[NCONN - 2].result, PROTO_SUBMIT_DUPLICATE);
    assert_int_equal(r[NCONN - 2].task_id, gate_id);
    /* Each pair, within one INSERT: one row, one INSERTED, one DUPLICATE, the same id. */
    for (int p = 0; p < PAIRS; p++) {
        const proto_submit_res *a = &r[1 + 2 * p], *b = &r[2 + 2 * p];
        assert_int_equal(a->result + b->result, PROTO_SUBMIT_INSERTED + PROTO_SUBMIT_DUPLICATE);
        assert_true(a->task_id > 0);
        assert_int_equal(a->task_id, b->task_id);
        assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task WHERE dedup_key = 'pair-%d'", p),
                         1);
        assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT task_id FROM task WHERE dedup_key = 'pair-%d'", p),
                         a->task_id);
    }
    assert_int_equal(r[NCONN - 1].result, PROTO_SUBMIT_INSERTED);
    assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                         " AND dedup_key IS NULL",
                                              r[NCONN - 1].task_id),
                     1);
    assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task"), 1 + PAIRS + 1);
    assert_int_equal(stat_of(fx, "db.submitted_rows_total"), PAIRS + 1);
    assert_int_equal(stat_of(fx, "db.submit_duplicates_total"), PAIRS + 2);
    fx->passed = true;
}

/* ---- ack_after_commit ---- */

static void ack_after_commit(void **state)
{
    struct fx *fx = *state;
    start(fx, "gc_ack");
    static proto_submit_task tasks[ACK_TASKS];
    static uint8_t buf[65536];
    for (int i = 0; i < ACK_TASKS; i++)
        tasks[i] = task_keyed(NULL);
    for (int i = 0; i <= ACK_CONNS; i++)
        fx->fds[i] = producer(fx);

    for (uint32_t round = 1; round <= ACK_ROUNDS; round++) {
        gate_close(fx);
        long long batches0 = stat_of(fx, "db.submit_batches_total");
        long long auto0 = stat_of(fx, "db.submit_autocommit_batches_total");
        long long requests0 = stat_of(fx, "db.submit_requests_total");
        submit(fx->fds[0], round, tasks, 1);
        assert_true(wait_gated(fx));
        for (int i = 1; i <= ACK_CONNS; i++)
            submit(fx->fds[i], round, tasks, ACK_TASKS);
        assert_true(wait_stat(fx, "db.submit_requests_total", requests0 + 1 + ACK_CONNS));
        gate_open(fx);
        proto_msg m;
        read_answer(fx->fds[0], round, 1, buf, sizeof buf, &m);

        /* The first answer of the coalesced batch: stop the dispatcher at once. */
        bool answered[ACK_CONNS + 1] = {false};
        read_answer(fx->fds[1], round, ACK_TASKS, buf, sizeof buf, &m);
        assert_int_equal(kill(fx->d.pid, SIGSTOP), 0);
        answered[1] = true;
        int checked = 0;
        for (int i = 1; i <= ACK_CONNS; i++) {
            if (i > 1) {
                /* Only what was sent before the stop: a readable answer. */
                struct pollfd p = {.fd = fx->fds[i], .events = POLLIN};
                if (poll(&p, 1, 0) != 1)
                    continue;
                read_answer(fx->fds[i], round, ACK_TASKS, buf, sizeof buf, &m);
                answered[i] = true;
            }
            proto_submit_res first, last;
            proto_submitted_result(&m.u.submitted, 0, &first);
            proto_submitted_result(&m.u.submitted, ACK_TASKS - 1, &last);
            assert_int_equal(first.result, PROTO_SUBMIT_INSERTED);
            /* A new transaction on another connection: every acknowledged row is there. */
            uint64_t found = 0;
            for (int k = 0; k < ACK_TASKS; k++) {
                proto_submit_res r;
                proto_submitted_result(&m.u.submitted, (size_t)k, &r);
                found += tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64,
                                                  r.task_id);
            }
            assert_int_equal(found, ACK_TASKS);
            (void)last;
            checked++;
        }
        assert_true(checked >= 1);
        assert_int_equal(kill(fx->d.pid, SIGCONT), 0);
        for (int i = 2; i <= ACK_CONNS; i++)
            if (!answered[i])
                read_answer(fx->fds[i], round, ACK_TASKS, buf, sizeof buf, &m);
        /* The gated task's batch and one for the 16 connections, both autocommit. */
        assert_int_equal(stat_of(fx, "db.submit_batches_total"), batches0 + 2);
        assert_int_equal(stat_of(fx, "db.submit_autocommit_batches_total"), auto0 + 2);
    }
    assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task"),
                     ACK_ROUNDS * (1 + ACK_CONNS * ACK_TASKS));
    fx->passed = true;
}

/* ---- autocommit_ids ---- */

/* One round: the gated task, then AUTO_CONNS connections of one task each (payload
 * "<tag>-<i>"; key_at >= 0: that one carries a dedup_key; wait_at >= 0: that one waits
 * for its OUTCOME), released together. Checks every answer against the table and
 * returns how many autocommit batches the round added. */
static long long auto_round(struct fx *fx, uint32_t round, const char *tag, int key_at, int wait_at)
{
    static uint8_t buf[AUTO_CONNS + 1][4096];
    proto_msg ans[AUTO_CONNS + 1];
    char payload[AUTO_CONNS + 1][32];
    char key[32];
    proto_submit_res r[AUTO_CONNS + 1];

    gate_close(fx);
    long long batches0 = stat_of(fx, "db.submit_batches_total");
    long long auto0 = stat_of(fx, "db.submit_autocommit_batches_total");
    long long requests0 = stat_of(fx, "db.submit_requests_total");
    for (int i = 0; i <= AUTO_CONNS; i++) {
        proto_submit_task t = task_keyed(NULL);
        snprintf(payload[i], sizeof payload[i], "%s-%d", tag, i);
        t.payload = (proto_bytes){(const uint8_t *)payload[i], strlen(payload[i])};
        if (i == key_at) {
            snprintf(key, sizeof key, "%s-key", tag);
            t.dedup_key = (proto_bytes){(const uint8_t *)key, strlen(key)};
        }
        proto_msg m = {.type = PROTO_SUBMIT};
        m.u.submit.request_id = round;
        m.u.submit.ntasks = 1;
        m.u.submit.tasks = &t;
        m.u.submit.flags = i == wait_at ? PROTO_SUBMIT_WAIT : 0;
        assert_int_equal(tp_raw_send_msg(fx->fds[i], &m), 0);
        if (i == 0)
            assert_true(wait_gated(fx));
    }
    assert_true(wait_stat(fx, "db.submit_requests_total", requests0 + 1 + AUTO_CONNS));
    gate_open(fx);
    for (int i = 0; i <= AUTO_CONNS; i++) {
        read_answer(fx->fds[i], round, 1, buf[i], sizeof buf[i], &ans[i]);
        proto_submitted_result(&ans[i].u.submitted, 0, &r[i]);
        assert_int_equal(r[i].result, PROTO_SUBMIT_INSERTED);
        /* The id answered is the row that holds this task's payload. */
        assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT task_id FROM task WHERE payload = '%s'",
                                                  payload[i]),
                         r[i].task_id);
        for (int j = 0; j < i; j++)
            assert_true(r[j].task_id != r[i].task_id);
    }
    assert_int_equal(stat_of(fx, "db.submit_batches_total"), batches0 + 2);
    return stat_of(fx, "db.submit_autocommit_batches_total") - auto0;
}

static void autocommit_ids(void **state)
{
    struct fx *fx = *state;
    start(fx, "gc_auto");
    for (int i = 0; i <= AUTO_CONNS; i++)
        fx->fds[i] = producer(fx);
    /* Keyless, no wait: the gated batch and the 32 together, each one autocommit INSERT. */
    assert_int_equal(auto_round(fx, 1, "plain", -1, -1), 2);
    /* One task with a dedup_key: its batch is a transaction (the gated one is not). */
    assert_int_equal(auto_round(fx, 2, "keyed", 7, -1), 1);
    /* One submission waiting for its OUTCOME: the same. */
    assert_int_equal(auto_round(fx, 3, "wait", -1, 11), 1);
    /* And back: the session's autocommit follows the batch. */
    assert_int_equal(auto_round(fx, 4, "again", -1, -1), 2);
    assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task"), 4 * (1 + AUTO_CONNS));
    assert_int_equal(stat_of(fx, "db.submitted_rows_total"), 4 * (1 + AUTO_CONNS));
    /* The batches' time is counted (what an acknowledgement waited for). */
    assert_true(stat_of(fx, "db.submit_us_total") > 0);
    assert_true(stat_of(fx, "db.submit_gather_us_total") >= 0);
    fx->passed = true;
}

/* ---- lone_producer ---- */

static void lone_producer(void **state)
{
    struct fx *fx = *state;
    start(fx, "gc_lone");
    static uint8_t buf[4096];
    fx->fds[0] = producer(fx);
    long long batches0 = stat_of(fx, "db.submit_batches_total");
    for (uint32_t i = 1; i <= 40; i++) {
        proto_submit_task t = task_keyed(NULL);
        proto_msg m;
        submit(fx->fds[0], i, &t, 1);
        read_answer(fx->fds[0], i, 1, buf, sizeof buf, &m);
    }
    assert_int_equal(stat_of(fx, "db.submit_batches_total"), batches0 + 40);
    assert_int_equal(stat_of(fx, "db.submit_gather_us_total"), 0);
    assert_int_equal(tp_testdb_query_u64_conn(fx->other, "SELECT COUNT(*) FROM task"), 40);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(per_row_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(ack_after_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(autocommit_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(lone_producer, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
