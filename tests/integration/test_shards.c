/* test_shards: several dispatchers share one table by shard (--types, docs/taskpushd.md
 * "Shards"), end to end with four real taskpushd, the real MariaDB and libtaskpush
 * workers in threads of this process, one per dispatcher.
 *
 *   Shard A (--types sa2,sa1: its name derived) and shard B (--types sb --shard beta)
 *   each have a leader and a standby on one table; a trigger records the epoch of every
 *   claim (a row going to PROCESSING). A mixed backlog (some rows delayed) drains.
 *   1. Each shard leads with its own lease row and epoch; epochs are distinct.
 *   2. kill -9 of A's leader mid-backlog, while B's workers hold their tasks (B has
 *      rows PROCESSING): A's standby leads A with a newer epoch and recovers A's rows
 *      only (B's stay PROCESSING under B's epoch through a periodic recovery too); B's
 *      leader keeps its epoch and its lease, B's standby stays a standby.
 *   3. Every row ends SUCCESSFUL; every claim of a type was made under an epoch of that
 *      type's shard; B's tasks each ran exactly once (its leader was never disturbed).
 *      Each shard's /stats table figures count its own types' rows only.
 *   4. A's dispatcher answers 404 for a row of B on /task, /retry and /cancel, and its
 *      /requeue-failed leaves B's FAILED row alone; a worker offering B's type to A is
 *      refused; an unsharded taskpushd on the table refuses to lead.
 * The takeover time is printed, never compared with the 2 s target.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "rows.h"
#include "tap.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 60000
#define TAKEOVER_BOUND_MS 15000 /* generous: the machine may be busy */
#define N_SA1 120
#define N_SA2 60
#define N_SB 150
#define N_DELAYED 10            /* per type, due 1.5 s after the insert */
#define SLEEP_MS 15
#define CAP 4

enum { A0, A1, B0, B1, ND };

struct fx;

typedef struct sworker {
    struct fx *fx;
    tp_worker *w;
    tp_inproc run;
    bool b; /* serves shard B's type */
} sworker;

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d[ND + 1]; /* [ND]: the unsharded one of step 4 */
    sworker sw[ND];
    _Atomic long exec_a, exec_b;
    atomic_bool hold_b;
    long long t0;
};

/* A progress line on stderr, stamped with the time since the case began (tap.h). */
#define note(fx, ...) tp_note((fx)->t0, __VA_ARGS__)

#define q64(fx, ...) tp_testdb_query_u64(&(fx)->db, __VA_ARGS__)

static int handler(tp_task *task, void *arg)
{
    sworker *sw = arg;
    atomic_fetch_add(sw->b ? &sw->fx->exec_b : &sw->fx->exec_a, 1);
    /* B's runs wait while A fails over, so that B has rows PROCESSING under its epoch
     * through A's takeover and recovery (bounded: a failing test still ends). */
    for (int i = 0; sw->b && atomic_load(&sw->fx->hold_b) && i < 2000; i++)
        tp_sleep_ms(10);
    tp_sleep_ms(SLEEP_MS);
    return tp_task_set_result(task, "done", 4) < 0 ? TP_FAIL : TP_SUCCESS;
}

static void quiet_log(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    (void)msg; /* reconnects are expected here */
}

static tp_worker *worker_new(const char *addr, const char *name)
{
    tp_worker_options o;
    tp_error err;
    tp_worker *w;

    tp_worker_options_init(&o);
    o.addresses = addr;
    o.capacity = CAP;
    o.threads = CAP;
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 200;
    o.name = name;
    o.log = quiet_log;
    o.log_level = TP_LOG_ERROR;
    if ((w = tp_worker_new(&o, &err)) == NULL)
        fail_msg("tp_worker_new: %s", err.text);
    return w;
}

static void sw_start(struct fx *fx, int k)
{
    sworker *sw = &fx->sw[k];
    char name[32];

    sw->fx = fx;
    sw->b = k == B0 || k == B1;
    snprintf(name, sizeof name, "shard-%d", k);
    sw->w = worker_new(fx->d[k].listen, name);
    if (sw->b) {
        assert_int_equal(tp_worker_add_type(sw->w, "sb", handler, sw), 0);
    } else {
        assert_int_equal(tp_worker_add_type(sw->w, "sa1", handler, sw), 0);
        assert_int_equal(tp_worker_add_type(sw->w, "sa2", handler, sw), 0);
    }
    assert_int_equal(tp_inproc_start(&sw->run, sw->w), 0);
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    fx->t0 = tp_mono_ms();
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i <= ND; i++)
        if (fx->d[i].pid > 0)
            tp_daemon_stop(&fx->d[i], SIGKILL, 5000);
    for (int i = 0; i < ND; i++) {
        if (fx->sw[i].run.running)
            tp_inproc_halt(&fx->sw[i].run);
        if (fx->sw[i].w)
            tp_worker_free(fx->sw[i].w);
    }
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

static int leader_of(struct fx *fx, int k)
{
    json_t *s = tp_daemon_json(&fx->d[k], "/stats");
    int v = s == NULL ? -1 : json_is_true(json_object_get(s, "leader")) ? 1 : 0;
    json_decref(s);
    return v;
}

static void start(struct fx *fx, int k, const char *types, const char *shard)
{
    const char *args[] = {"--types", types, shard ? "--shard" : NULL, shard, NULL};
    assert_int_equal(tp_daemon_start(&fx->d[k], fx->db.url, types ? args : NULL), 0);
}

static long long wait_leader(struct fx *fx, int k, long long since, const char *what)
{
    while (leader_of(fx, k) != 1) {
        if (tp_mono_ms() - since > TAKEOVER_BOUND_MS) {
            tp_daemon_dump_log(&fx->d[k]);
            fail_msg("%s: not within %d ms", what, TAKEOVER_BOUND_MS);
        }
        tp_sleep_ms(10);
    }
    note(fx, "%s: %lld ms", what, tp_mono_ms() - since);
    return tp_mono_ms() - since;
}

static void insert(struct fx *fx, const char *type, int n, int delayed)
{
    if (tp_rows_insert(&fx->db, type, n, true) != 0)
        fail_msg("insert: %s", mysql_error(fx->db.conn));
    if (delayed)
        tp_testdb_exec(&fx->db,
                       "INSERT INTO task (task_type, payload, run_after) SELECT task_type, payload,"
                       " CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 1500 FROM task"
                       " WHERE task_type = '%s' ORDER BY task_id LIMIT %d",
                       type, delayed);
}

/* Waits (a table-figures round is 2 s by default) for daemon k's /stats
 * table.by_state.successful to be want. */
static void wait_figure(struct fx *fx, int k, long long want)
{
    assert_true(tp_daemon_wait_stat(&fx->d[k], "table.by_state.successful", want, false, 15000));
}

/* The claims the trigger saw: each (type, epoch) pair, checked against the shards. */
static void check_audit(struct fx *fx, const char *a_epochs, uint64_t eb)
{
    assert_true(q64(fx, "SELECT COUNT(*) FROM claim_audit") >= N_SA1 + N_SA2 + N_SB);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM claim_audit WHERE task_type IN ('sa1', 'sa2')"
                             " AND epoch NOT IN (%s)", a_epochs), 0);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM claim_audit WHERE task_type = 'sb'"
                             " AND epoch <> %" PRIu64, eb), 0);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM claim_audit WHERE task_type NOT IN"
                             " ('sa1', 'sa2', 'sb')"), 0);
}

/* Step 4: another shard's rows are out of reach of A's operator requests and workers;
 * an unsharded dispatcher does not lead beside shards. */
static void check_refusals(struct fx *fx, int a)
{
    char path[96];
    long long end;
    uint64_t id_b = q64(fx, "SELECT MIN(task_id) FROM task WHERE task_type = 'sb'");
    uint64_t id_a = q64(fx, "SELECT MIN(task_id) FROM task WHERE task_type = 'sa1'");

    snprintf(path, sizeof path, "/task?id=%" PRIu64, id_b);
    assert_int_equal(tp_http_request(fx->d[a].admin, "GET", path, NULL), 404);
    assert_int_equal(tp_http_request(fx->d[B0].admin, "GET", path, NULL), 200);
    snprintf(path, sizeof path, "/task?id=%" PRIu64, id_a);
    assert_int_equal(tp_http_request(fx->d[a].admin, "GET", path, NULL), 200);
    tp_testdb_exec(&fx->db, "UPDATE task SET task_state = 3 WHERE task_id = %" PRIu64, id_b);
    snprintf(path, sizeof path, "/retry?id=%" PRIu64, id_b);
    assert_int_equal(tp_http_request(fx->d[a].admin, "POST", path, NULL), 404);
    assert_int_equal(tp_rows_state(&fx->db, id_b), 3);
    /* A requeue of every FAILED row moves A's (which A then runs), never B's. */
    tp_testdb_exec(&fx->db, "UPDATE task SET task_state = 3 WHERE task_id = %" PRIu64, id_a);
    assert_int_equal(tp_http_request(fx->d[a].admin, "POST", "/requeue-failed", NULL), 202);
    assert_true(tp_rows_wait_state(&fx->db, id_a, 2, 20000));
    assert_int_equal(tp_rows_state(&fx->db, id_b), 3);
    tp_testdb_exec(&fx->db, "UPDATE task SET task_state = 2 WHERE task_id = %" PRIu64, id_b);
    /* /cancel of B's NEW row from A: 404, the row untouched. */
    tp_testdb_exec(&fx->db, "UPDATE task SET task_state = 0, run_after = 9000000000000"
                            " WHERE task_id = %" PRIu64, id_b);
    snprintf(path, sizeof path, "/cancel?id=%" PRIu64, id_b);
    assert_int_equal(tp_http_request(fx->d[a].admin, "POST", path, NULL), 404);
    assert_int_equal(tp_rows_state(&fx->db, id_b), 0);
    assert_int_equal(tp_http_request(fx->d[B0].admin, "POST", path, NULL), 200);
    assert_int_equal(tp_rows_state(&fx->db, id_b), 3);
    tp_testdb_exec(&fx->db, "UPDATE task SET task_state = 2 WHERE task_id = %" PRIu64, id_b);

    /* A worker offering sb to shard A: its HELLO is refused, it never registers. */
    tp_worker *w = worker_new(fx->d[a].listen, "stray");
    tp_inproc run;
    assert_int_equal(tp_worker_add_type(w, "sb", handler, &fx->sw[B0]), 0);
    assert_int_equal(tp_inproc_start(&run, w), 0);
    end = tp_mono_ms() + 10000;
    while (tp_daemon_log_count(&fx->d[a], "does not own") == 0 && tp_mono_ms() < end)
        tp_sleep_ms(20);
    tp_inproc_halt(&run);
    tp_worker_free(w);
    assert_true(tp_daemon_log_count(&fx->d[a], "does not own") >= 1);

    /* An unsharded taskpushd: sees the shards' live leases, refuses to lead. */
    start(fx, ND, NULL, NULL);
    end = tp_mono_ms() + 10000;
    while (tp_daemon_log_count(&fx->d[ND], "refusing the lease") == 0 && tp_mono_ms() < end)
        tp_sleep_ms(20);
    assert_true(tp_daemon_log_count(&fx->d[ND], "refusing the lease") >= 1);
    assert_int_equal(leader_of(fx, ND), 0);
    assert_int_equal(tp_daemon_stop(&fx->d[ND], SIGTERM, 15000), 0);
}

static void test_shards(void **state)
{
    struct fx *fx = *state;
    uint64_t ea, eb, ea2, total = N_SA1 + N_SA2 + N_SB + 3 * N_DELAYED;
    char a_epochs[64];
    long long t;

    assert_int_equal(tp_testdb_create("shards", &fx->db), 0);
    fx->have_db = true;
    assert_true(tp_testdb_exec(&fx->db, "CREATE TABLE claim_audit (task_id BIGINT UNSIGNED,"
                                        " task_type VARCHAR(64) COLLATE utf8mb4_bin,"
                                        " epoch INT UNSIGNED)") >= 0);
    assert_true(tp_testdb_exec(&fx->db, "CREATE TRIGGER claim_audit_t AFTER UPDATE ON task"
                                        " FOR EACH ROW INSERT INTO claim_audit SELECT NEW.task_id,"
                                        " NEW.task_type, NEW.epoch FROM DUAL"
                                        " WHERE NEW.task_state = 1 AND OLD.task_state <> 1") >= 0);

    /* 1. Two shards, a leader and a standby each. */
    start(fx, A0, "sa2, sa1", NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[A0], 20000), 0);
    start(fx, B0, "sb", "beta");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[B0], 20000), 0);
    start(fx, A1, "sa1,sa2", NULL);
    start(fx, B1, "sb", "beta");
    ea = (uint64_t)tp_daemon_stat(&fx->d[A0], "epoch");
    eb = (uint64_t)tp_daemon_stat(&fx->d[B0], "epoch");
    assert_true(ea >= 1 && eb >= 1 && ea != eb);
    assert_int_equal(leader_of(fx, A1), 0);
    assert_int_equal(leader_of(fx, B1), 0);
    assert_int_equal(q64(fx, "SELECT value FROM taskpush_meta WHERE name = 'epoch:beta'"), eb);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM taskpush_meta WHERE name LIKE 'lease:t%%'"
                             " AND holder <> 0"), 1);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM taskpush_meta WHERE name = 'lease:beta'"
                             " AND holder <> 0"), 1);
    assert_int_equal(q64(fx, "SELECT holder FROM taskpush_meta WHERE name = 'lease'"), 0);
    for (int k = 0; k < ND; k++)
        sw_start(fx, k);

    atomic_store(&fx->hold_b, true);
    insert(fx, "sa1", N_SA1, N_DELAYED);
    insert(fx, "sb", N_SB, N_DELAYED);
    insert(fx, "sa2", N_SA2, N_DELAYED);
    uint64_t holder_b = q64(fx, "SELECT holder FROM taskpush_meta WHERE name = 'lease:beta'");

    /* 2. kill -9 of A's leader mid-backlog. */
    t = tp_mono_ms() + WAIT_MS;
    while (q64(fx, "SELECT COUNT(*) FROM task WHERE task_state = 2 AND task_type LIKE 'sa%%'") < 20) {
        if (tp_mono_ms() > t)
            fail_msg("shard A made no progress");
        tp_sleep_ms(5);
    }
    t = tp_mono_ms();
    assert_int_equal(tp_daemon_stop(&fx->d[A0], SIGKILL, 10000), 128 + SIGKILL);
    long long took = wait_leader(fx, A1, t, "kill -9 of A's leader: A's standby leads after");
    ea2 = (uint64_t)tp_daemon_stat(&fx->d[A1], "epoch");
    assert_true(ea2 > ea && ea2 != eb);
    assert_int_equal(leader_of(fx, B0), 1);
    assert_int_equal(leader_of(fx, B1), 0);
    assert_int_equal((uint64_t)tp_daemon_stat(&fx->d[B0], "epoch"), eb);
    assert_int_equal(q64(fx, "SELECT holder FROM taskpush_meta WHERE name = 'lease:beta'"), holder_b);
    assert_int_equal(q64(fx, "SELECT value FROM taskpush_meta WHERE name = 'epoch:beta'"), eb);
    assert_int_equal(q64(fx, "SELECT value FROM taskpush_meta WHERE name LIKE 'epoch:t%%'"), ea2);
    /* A's new leader recovered at takeover and recovers again every second: B's rows,
     * PROCESSING under B's epoch all the while, stay so. */
    tp_sleep_ms(1500);
    assert_true(q64(fx, "SELECT COUNT(*) FROM task WHERE task_type = 'sb' AND task_state = 1"
                        " AND epoch = %" PRIu64, eb) >= CAP);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_type = 'sb' AND task_state = 2"), 0);
    atomic_store(&fx->hold_b, false);

    /* 3. Everything drains, each claim under its own shard's epoch. */
    t = tp_mono_ms() + WAIT_MS;
    while (q64(fx, "SELECT COUNT(*) FROM task WHERE task_state = 2") < total) {
        if (tp_mono_ms() > t) {
            for (int k = 0; k < ND; k++)
                tp_daemon_dump_log(&fx->d[k]);
            fail_msg("%" PRIu64 " of %" PRIu64 " SUCCESSFUL",
                     q64(fx, "SELECT COUNT(*) FROM task WHERE task_state = 2"), total);
        }
        tp_sleep_ms(20);
    }
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), total);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_state = 2 AND result = 'done'"),
                     total);
    snprintf(a_epochs, sizeof a_epochs, "%" PRIu64 ", %" PRIu64, ea, ea2);
    check_audit(fx, a_epochs, eb);
    /* B never noticed: one claim and one run per row, its leader and epoch the same. */
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM claim_audit WHERE task_type = 'sb'"),
                     N_SB + N_DELAYED);
    assert_int_equal(atomic_load(&fx->exec_b), N_SB + N_DELAYED);
    assert_int_equal(leader_of(fx, B0), 1);
    assert_int_equal(leader_of(fx, B1), 0);
    assert_int_equal((uint64_t)tp_daemon_stat(&fx->d[B0], "epoch"), eb);
    assert_int_equal(q64(fx, "SELECT holder FROM taskpush_meta WHERE name = 'lease:beta'"), holder_b);

    /* Each shard's table figures count its own types' rows. */
    wait_figure(fx, A1, N_SA1 + N_SA2 + 2 * N_DELAYED);
    wait_figure(fx, B0, N_SB + N_DELAYED);

    /* 4. */
    check_refusals(fx, A1);

    note(fx, "shard A takeover after kill -9: %lld ms; epochs A %" PRIu64 " -> %" PRIu64
             ", B %" PRIu64 " throughout; %ld runs of A's %d rows, %ld of B's %d",
         took, ea, ea2, eb, (long)atomic_load(&fx->exec_a), N_SA1 + N_SA2 + 2 * N_DELAYED,
         (long)atomic_load(&fx->exec_b), N_SB + N_DELAYED);
    assert_int_equal(tp_daemon_stop(&fx->d[A1], SIGTERM, 15000), 0);
    assert_int_equal(tp_daemon_stop(&fx->d[B0], SIGTERM, 15000), 0);
    assert_int_equal(tp_daemon_stop(&fx->d[B1], SIGTERM, 15000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shards, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
