/* test_fence: Galera's rules on one server (issue 33): the fencing write of a claim and
 * the retry of a transaction a conflict aborted.
 *
 * Real components only: the private MariaDB of scripts/tp-mariadb, the taskpushd of the
 * build tree and an in-process libtaskpush worker over TCP. No timing is asserted: the
 * waits are loose bounds. Both cases run with --lease-ms 60000 --lease-renew-ms 30000, so
 * that the lease thread's renewal neither notices the row first nor waits for the lock
 * the test holds.
 *
 * Case fenced: once a first task ran, the lease row is given to another holder by SQL,
 * behind the leader's back (its lease is valid for a minute yet on its own clock). Rows
 * inserted then are never delivered: the next claim's fencing write matches nothing, the
 * claim rolls back (the rows stay NEW, none PROCESSING), db.claims_fenced_total counts
 * it, and the dispatcher steps down (/stats leader false) and leaves the row to its new
 * holder. fenced_split: the same with --claim-split 2 (the claim helper's half writes the
 * lease row too).
 *
 * Case deadlock: a second session with a large transaction of its own (2,000 rows
 * inserted, so that InnoDB picks the claim as the deadlock's victim) locks the lease row;
 * a task is inserted; the claim locks its row and waits for the lease row (its fencing
 * write); the session then asks for the task's row: a deadlock, and the claim gets 1213.
 * It is rolled back and run again on the same connection: db.cert_retries_total > 0
 * (and the /metrics line), no reconnect, the same epoch, and once the session commits the
 * task runs once and ends SUCCESSFUL. */
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

#include <cmocka.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "taskpush.h"
#include "tap.h"
#include "rows.h"
#include "testdb.h"

#define WAIT_MS 60000
#define STOP_MS 15000
#define N_FENCED 5
#define HEAVY_ROWS 2000
#define OTHER_HOLDER 4242

struct fx {
    tp_testdb db;
    tp_daemon d;
    bool have_daemon;
    tp_worker *w;
    tp_inproc run;
    MYSQL *locker;
    pthread_mutex_t mu;
    unsigned runs[256]; /* per task id: handler starts */
    bool passed;
};

static const char *const daemon_args[] = {"--poll-ms", "20", "--lease-ms", "60000",
                                          "--lease-renew-ms", "30000", NULL};

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
    free(fx);
    return 0;
}

static int on_task(tp_task *task, void *arg)
{
    struct fx *fx = arg;
    uint64_t id = tp_task_id(task);
    pthread_mutex_lock(&fx->mu);
    if (id < sizeof fx->runs / sizeof fx->runs[0])
        fx->runs[id]++;
    pthread_mutex_unlock(&fx->mu);
    return TP_SUCCESS;
}

static unsigned runs_of(struct fx *fx, uint64_t id)
{
    unsigned n;
    pthread_mutex_lock(&fx->mu);
    n = id < sizeof fx->runs / sizeof fx->runs[0] ? fx->runs[id] : 0;
    pthread_mutex_unlock(&fx->mu);
    return n;
}

static unsigned runs_total(struct fx *fx)
{
    unsigned n = 0;
    pthread_mutex_lock(&fx->mu);
    for (size_t i = 0; i < sizeof fx->runs / sizeof fx->runs[0]; i++)
        n += fx->runs[i];
    pthread_mutex_unlock(&fx->mu);
    return n;
}

static uint64_t insert_task(struct fx *fx, const char *type)
{
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) VALUES ('%s', 'p')", type), 1);
    return (uint64_t)mysql_insert_id(fx->db.conn);
}

/* Waits until task id is SUCCESSFUL (state 2); false after the deadline. */
static bool wait_successful(struct fx *fx, uint64_t id)
{
    for (long long end = tp_mono_ms() + WAIT_MS; tp_mono_ms() < end; tp_sleep_ms(20))
        if (tp_rows_state(&fx->db, id) == 2)
            return true;
    return false;
}

/* The daemon leading (args), a worker of type on it, and first tasks run (the claim path
 * works before the test changes anything): `first` of them inserted in one statement
 * (twice when more than one), so that with --claim-split 2 claims split and the helper is
 * connected. */
static void start(struct fx *fx, const char *tag, const char *type, const char *const *args,
                  int first)
{
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "fence-w", 4, type, on_task, fx);
    assert_non_null(fx->w);
    /* Twice when several: the first split claim only asks the helper to connect. */
    for (int round = 1; round <= (first > 1 ? 2 : 1); round++) {
        assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) SELECT '%s', 'p'"
                                                 " FROM seq_1_to_%d", type, first),
                         first);
        bool all = false;
        for (long long end = tp_mono_ms() + WAIT_MS; !all && tp_mono_ms() < end; tp_sleep_ms(20))
            all = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 2") ==
                  (uint64_t)(round * first);
        assert_true(all);
        assert_int_equal(runs_total(fx), round * first);
    }
    /* Every connection recorded in the lease row ("B C W L S H": the server's start, then
     * the claim, write, lease, stats and helper connections): none opens later and asks
     * for a renewal, which would see the row change before the claim does. */
    bool recorded = false;
    int fields = first > 1 ? 6 : 5;
    for (long long end = tp_mono_ms() + WAIT_MS; !recorded && tp_mono_ms() < end; tp_sleep_ms(20))
        recorded = tp_testdb_query_u64(&fx->db, "SELECT conns <> '' AND LOCATE(' 0 ', CONCAT(SUBSTRING_INDEX(conns, ' ', %d),"
                                                " ' ')) = 0 FROM taskpush_meta WHERE name = 'lease'",
                                       fields) == 1;
    assert_true(recorded);
}

static void fenced(struct fx *fx, const char *tag, const char *const *args, int first)
{
    start(fx, tag, "f", args, first);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.claims_fenced_total"), 0);
    /* Another holder, behind the leader's back; its lease lasts 10 minutes. */
    assert_int_equal(tp_testdb_exec(&fx->db, "UPDATE taskpush_meta SET holder = %d,"
                                             " expires_ms = UNIX_TIMESTAMP(NOW(3)) * 1000 + 600000"
                                             " WHERE name = 'lease'",
                                    OTHER_HOLDER),
                     1);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) SELECT 'f', 'p'"
                                             " FROM seq_1_to_%d", N_FENCED),
                     N_FENCED);

    long long fenced = 0, leader = 1;
    for (long long end = tp_mono_ms() + WAIT_MS; tp_mono_ms() < end; tp_sleep_ms(20)) {
        json_t *st = tp_daemon_json(&fx->d, "/stats");
        if (st) {
            fenced = tp_json_int_at(st, "db.claims_fenced_total");
            json_t *l = json_object_get(st, "leader");
            leader = l && json_is_true(l);
            json_decref(st);
        }
        if (fenced >= 1 && !leader)
            break;
    }
    tp_diag("lease row taken by SQL: db.claims_fenced_total %lld, leader %lld", fenced, leader);
    assert_true(fenced >= 1);
    assert_int_equal(leader, 0);
    assert_true(tp_daemon_log_count(&fx->d, "the lease row is no longer this dispatcher's") >= 1);

    /* Nothing was delivered or marked: the rows wait for the row's holder. */
    tp_sleep_ms(300);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 0 AND attempts = 0"),
                     N_FENCED);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 1"), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task_claim"), 0);
    assert_int_equal(runs_total(fx), first > 1 ? 2 * first : first);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT holder FROM taskpush_meta WHERE name = 'lease'"),
                     OTHER_HOLDER);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.claims_total") >= 1, 1);

    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, STOP_MS), 0);
    fx->have_daemon = false;
    fx->passed = true;
}

static void test_fenced(void **state)
{
    fenced(*state, "fence_fenced", daemon_args, 1);
}

/* The same with the claim helper: the claims split, and the helper's half writes the
 * lease row too (db_claim_helper.c). */
static void test_fenced_split(void **state)
{
    const char *const args[] = {"--poll-ms", "20", "--lease-ms", "60000", "--lease-renew-ms", "30000",
                                "--claim-split", "2", NULL};
    fenced(*state, "fence_fenced_split", args, 4);
}

static void test_deadlock(void **state)
{
    struct fx *fx = *state;

    start(fx, "fence_deadlock", "c", daemon_args, 1);
    long long reconnects = tp_daemon_stat(&fx->d, "db.reconnects_total");
    long long epoch = tp_daemon_stat(&fx->d, "epoch");
    assert_true(reconnects >= 0);
    assert_true(epoch > 0);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.cert_retries_total"), 0);

    /* The second session: heavy (its inserts), then the lease row locked. */
    assert_true(tp_testdb_exec(&fx->db, "CREATE TABLE heavy (id INT PRIMARY KEY, pad CHAR(100))"
                                        " ENGINE = InnoDB") >= 0);
    fx->locker = tp_testdb_connect(&fx->db);
    assert_non_null(fx->locker);
    assert_true(tp_testdb_exec_conn(fx->locker, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") >= 0);
    assert_true(tp_testdb_exec_conn(fx->locker, "SET SESSION innodb_lock_wait_timeout = 30") >= 0);
    assert_true(tp_testdb_exec_conn(fx->locker, "START TRANSACTION") >= 0);
    assert_int_equal(tp_testdb_exec_conn(fx->locker,
                                         "INSERT INTO heavy (id, pad) SELECT seq, 'x' FROM seq_1_to_%d",
                                         HEAVY_ROWS),
                     HEAVY_ROWS);
    assert_true(tp_testdb_exec_conn(fx->locker, "SELECT value FROM taskpush_meta WHERE name = 'lease' FOR UPDATE") >= 0);

    uint64_t id = insert_task(fx, "c");
    /* The claim has locked the row (a third session's SKIP LOCKED read passes over it);
     * its fencing write waits, or will, for the lease row. */
    bool locked = false;
    for (long long end = tp_mono_ms() + WAIT_MS; !locked && tp_mono_ms() < end; tp_sleep_ms(10))
        locked = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM (SELECT task_id FROM task"
                                              " WHERE task_id = %" PRIu64 " FOR UPDATE SKIP LOCKED) t",
                                     id) == 0;
    assert_true(locked);
    /* The session asks for the task's row: a deadlock, whose victim is the claim. */
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE", id);
    int q = mysql_query(fx->locker, sql);
    unsigned err = q ? mysql_errno(fx->locker) : 0;
    if (q == 0) {
        MYSQL_RES *res = mysql_store_result(fx->locker);
        mysql_free_result(res);
    }
    tp_diag("the second session's lock of the claimed row: %s (error %u)", q ? mysql_error(fx->locker) : "granted",
            err);
    assert_int_equal(q, 0); /* the claim was the victim, not the session */
    assert_true(tp_testdb_exec_conn(fx->locker, "COMMIT") >= 0);

    assert_true(wait_successful(fx, id));
    long long retries = tp_daemon_stat(&fx->d, "db.cert_retries_total");
    tp_diag("claim deadlocked on the lease row: db.cert_retries_total %lld, reconnects %lld -> %lld,"
            " epoch %lld -> %lld",
            retries, reconnects, tp_daemon_stat(&fx->d, "db.reconnects_total"), epoch,
            tp_daemon_stat(&fx->d, "epoch"));
    assert_true(retries >= 1);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.reconnects_total"), reconnects);
    assert_int_equal(tp_daemon_stat(&fx->d, "epoch"), epoch);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.claims_fenced_total"), 0);
    assert_int_equal(runs_of(fx, id), 1);
    assert_int_equal(runs_total(fx), 2);
    assert_int_equal(runs_of(fx, 1), 1);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state <> 2"), 0);

    char *body = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &body), 200);
    char line[96];
    snprintf(line, sizeof line, "\ntaskpush_db_cert_retries_total %lld", retries);
    bool found = body && strstr(body, line) != NULL;
    free(body);
    assert_true(found);

    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, STOP_MS), 0);
    fx->have_daemon = false;
    tp_worker_stop(fx->w);
    assert_int_equal(tp_inproc_join(&fx->run), 0);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fenced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fenced_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadlock, setup, teardown),
    };
    return cmocka_run_group_tests_name("fence", tests, NULL, NULL);
}
