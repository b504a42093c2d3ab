/* test_deps: task dependencies (docs/producers.md, "Dependencies").
 *
 * Real components only: the private MariaDB of scripts/tp-mariadb, the taskpushd of the
 * build tree, in-process libtaskpush workers over TCP whose handler logs the order tasks
 * start and end in. No timing is asserted; waits are on conditions with generous
 * deadlines.
 *
 * Case after_ab: A and B (type p, their handlers held at a gate), then C (type c) with
 * tp_submit_after(A, B). While A or B is pending C is not dispatched: its row stays NEW
 * and waiting, GET /task and taskpushctl show say it waits on 2; after A ends, still not
 * (B pending); after B ends C runs, and it started after both had ended.
 *
 * Case fail_cascade: A fails for good (TP_FAIL_PERMANENT); C waits on A, D on C (SQL
 * form for D, SUBMIT for C): C ends FAILED "dependency A failed", D "dependency C
 * failed"; neither ran. POST /retry of C makes it wait again, not run: FAILED again for A.
 *
 * Case fan_in_chain: N_FAN parents and a child waiting on all of them (the SQL form, one
 * transaction); a chain of N_CHAIN tasks each waiting on the one before (SQL). Every task
 * runs once; the child starts after every parent ended; the chain's tasks start in
 * order, each after the one before ended.
 *
 * Case bad_input: with a raw client, a SUBMIT entry waiting on 1001 tasks, on a task that
 * does not exist, on itself (the id the row would take): each INVALID with its reason,
 * nothing inserted; taskpushctl --after with 1001 ids (exit 2) and an unknown id (exit
 * 1). By SQL: a task waiting on itself refused (CHECK dep_not_self); a cycle X <-> Y
 * (and Z behind X) ends FAILED "dependency cycle" (Z: "dependency ..."); a task waiting on
 * a missing task ends FAILED "dependency N does not exist"; a task waiting on one already
 * SUCCESSFUL (the race) is released by the sweep and runs.
 *
 * Case idle_sweep: a table that has never had a dependency costs no sweep: leading for
 * 3 s, db.deps_sweeps_total stays 0 (one look at the start, then one a minute); a SUBMIT
 * with AFTER starts them at once (the child runs after its parent; sweeps > 0).
 *
 * Case conflict_retry: a second session holds the lock of one of two waiting tasks (C2)
 * when their parent succeeds: the release (one UPDATE of both) meets the lock (1205: the
 * write connection does not wait for locks) and is run again, counted in
 * db.cert_retries_total, as the claims and the result writes are; once the session
 * commits, both run, and no connection was dropped.
 *
 * Case deadlock_retry: the same, and once the write thread has left the release to the
 * sweep, whose UPDATE locks C1 and waits for C2, the session (heavy with 2,000 inserted
 * rows, so that InnoDB picks the sweep as the victim) asks for C1: a deadlock (the
 * server's Innodb_deadlocks grows), 1213 for the sweep's statement, which is run again on
 * the same connection: both run, no reconnect. */
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "proto.h"
#include "raw.h"
#include "sb.h"
#include "taskpush.h"
#include "tap.h"
#include "testdb.h"

#define WAIT_MS 180000
#define STOP_MS 15000
#define N_FAN 10000
#define N_CHAIN 1000

struct ev {
    uint64_t id;
    long long seq_start, seq_end; /* order of starts and ends over all tasks */
};

struct fx {
    tp_testdb db;
    tp_daemon d;
    bool have_daemon;
    tp_worker *w;
    tp_inproc run;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ev *log;
    size_t nlog, caplog;
    long long seq;
    bool hold_open; /* handlers of type p wait until the test lets them go */
    uint64_t release_id; /* ...one at a time: the task id let go */
    uint64_t fail_id;    /* this task fails for good */
    bool passed;
};

static struct ev *find_ev(struct fx *fx, uint64_t id)
{
    for (size_t i = 0; i < fx->nlog; i++)
        if (fx->log[i].id == id)
            return &fx->log[i];
    return NULL;
}

static int on_task(tp_task *task, void *arg)
{
    struct fx *fx = arg;
    uint64_t id = tp_task_id(task);
    struct ev *e = NULL;

    pthread_mutex_lock(&fx->mu);
    if (fx->nlog < fx->caplog) {
        e = &fx->log[fx->nlog++];
        e->id = id;
        e->seq_start = ++fx->seq;
    }
    pthread_cond_broadcast(&fx->cv);
    if (strcmp(tp_task_type(task), "p") == 0)
        while (fx->hold_open && fx->release_id != id)
            pthread_cond_wait(&fx->cv, &fx->mu);
    if (e)
        e->seq_end = ++fx->seq;
    pthread_cond_broadcast(&fx->cv);
    bool fail = id == fx->fail_id;
    pthread_mutex_unlock(&fx->mu);
    if (fail) {
        if (tp_task_set_error(task, "broken on purpose") != 0)
            return TP_FAIL_PERMANENT;
        return TP_FAIL_PERMANENT;
    }
    return TP_SUCCESS;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    pthread_mutex_init(&fx->mu, NULL);
    pthread_cond_init(&fx->cv, NULL);
    fx->caplog = N_FAN + N_CHAIN + 64;
    fx->log = calloc(fx->caplog, sizeof *fx->log);
    *state = fx;
    return fx->log ? 0 : -1;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    pthread_mutex_lock(&fx->mu);
    fx->hold_open = false;
    pthread_cond_broadcast(&fx->cv);
    pthread_mutex_unlock(&fx->mu);
    if (fx->w)
        tp_worker_stop(fx->w);
    tp_inproc_halt(&fx->run);
    tp_worker_free(fx->w);
    if (fx->have_daemon) {
        tp_daemon_stop(&fx->d, SIGTERM, STOP_MS);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
    }
    tp_testdb_drop(&fx->db);
    pthread_cond_destroy(&fx->cv);
    pthread_mutex_destroy(&fx->mu);
    free(fx->log);
    free(fx);
    return 0;
}

/* A dispatcher (results written at once: a chain's step costs no flush interval) and a
 * worker of types p and c with `capacity` slots. */
static void start(struct fx *fx, const char *tag, unsigned capacity)
{
    const char *const args[] = {"--heartbeat-ms", "500", "--poll-ms", "200", "--result-flush-ms", "0", NULL};
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.name = "deps";
    o.capacity = capacity;
    o.threads = capacity;
    fx->w = tp_worker_new(&o, &err);
    assert_non_null(fx->w);
    assert_int_equal(tp_worker_add_type(fx->w, "p", on_task, fx), 0);
    assert_int_equal(tp_worker_add_type(fx->w, "c", on_task, fx), 0);
    assert_int_equal(tp_inproc_start(&fx->run, fx->w), 0);
}

/* Submits one task of type with the ids it waits for (n may be 0). */
static uint64_t submit(struct fx *fx, const char *type, const uint64_t *after, size_t n, unsigned max_attempts)
{
    tp_submit_task t;
    tp_submit_result r;
    tp_error err;
    tp_task_after a = {after, n};
    tp_submit_task_init(&t);
    t.type = type;
    t.max_attempts = max_attempts;
    int rc = tp_submit_after(fx->w, &t, NULL, n ? &a : NULL, 1, 0, WAIT_MS, &r, &err);
    if (rc != 0)
        tp_diag("tp_submit_after: %s", err.text);
    assert_int_equal(rc, 0);
    assert_true(r.task_id > 0);
    return r.task_id;
}

static uint64_t state_of(struct fx *fx, uint64_t id)
{
    return tp_testdb_query_u64(&fx->db, "SELECT task_state FROM task WHERE task_id = %" PRIu64, id);
}

/* The err_msg of task id into out ("" when NULL). */
static void err_of(struct fx *fx, uint64_t id, char *out, size_t cap)
{
    char q[128];
    out[0] = '\0';
    snprintf(q, sizeof q, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, id);
    assert_int_equal(mysql_query(fx->db.conn, q), 0);
    MYSQL_RES *res = mysql_store_result(fx->db.conn);
    assert_non_null(res);
    MYSQL_ROW row = mysql_fetch_row(res);
    if (row && row[0])
        snprintf(out, cap, "%s", row[0]);
    mysql_free_result(res);
}

static void wait_state(struct fx *fx, uint64_t id, uint64_t st)
{
    for (long long end = tp_mono_ms() + WAIT_MS; state_of(fx, id) != st; tp_sleep_ms(20))
        assert_true(tp_mono_ms() < end);
}

static bool started(struct fx *fx, uint64_t id)
{
    pthread_mutex_lock(&fx->mu);
    bool s = find_ev(fx, id) != NULL;
    pthread_mutex_unlock(&fx->mu);
    return s;
}

static void wait_started(struct fx *fx, uint64_t id)
{
    for (long long end = tp_mono_ms() + WAIT_MS; !started(fx, id); tp_sleep_ms(10))
        assert_true(tp_mono_ms() < end);
}

static void let_go(struct fx *fx, uint64_t id)
{
    pthread_mutex_lock(&fx->mu);
    fx->release_id = id;
    pthread_cond_broadcast(&fx->cv);
    pthread_mutex_unlock(&fx->mu);
}

/* The sweep (every second) and the write path have had their chance: a few sweeps. */
static void let_sweeps_run(void)
{
    tp_sleep_ms(2500);
}

static void test_after_ab(void **state)
{
    struct fx *fx = *state;
    fx->hold_open = true;
    start(fx, "deps_ab", 4);
    uint64_t a = submit(fx, "p", NULL, 0, 0), b = submit(fx, "p", NULL, 0, 0);
    uint64_t ab[2] = {a, b};
    uint64_t c = submit(fx, "c", ab, 2, 0);
    wait_started(fx, a);
    wait_started(fx, b);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT `delayed` FROM task WHERE task_id = %" PRIu64, c), 2);

    /* /task and taskpushctl show: it waits on 2, 2 pending. */
    char path[64];
    snprintf(path, sizeof path, "/task?id=%" PRIu64, c);
    json_t *t = tp_daemon_json(&fx->d, path);
    assert_non_null(t);
    assert_int_equal(tp_json_int_at(t, "dependencies.total"), 2);
    assert_int_equal(tp_json_int_at(t, "dependencies.pending"), 2);
    assert_true(json_is_true(json_object_get(json_object_get(t, "dependencies"), "waiting")));
    json_decref(t);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --admin %s show %" PRIu64 " | grep -q '^waits on    2 task(s), 2 pending$'",
             tp_build_path("ctl/taskpushctl"), fx->d.admin, c);
    assert_int_equal(system(cmd), 0);

    let_go(fx, a);
    wait_state(fx, a, 2);
    let_sweeps_run();
    assert_false(started(fx, c)); /* B is pending */
    assert_int_equal(state_of(fx, c), 0);
    t = tp_daemon_json(&fx->d, path);
    assert_int_equal(tp_json_int_at(t, "dependencies.pending"), 1);
    json_decref(t);

    let_go(fx, b);
    wait_state(fx, c, 2);
    pthread_mutex_lock(&fx->mu);
    struct ev ea = *find_ev(fx, a), eb = *find_ev(fx, b), ec = *find_ev(fx, c);
    pthread_mutex_unlock(&fx->mu);
    tp_diag("A ended at %lld, B at %lld, C started at %lld (event order)", ea.seq_end, eb.seq_end, ec.seq_start);
    assert_true(ec.seq_start > ea.seq_end && ec.seq_start > eb.seq_end);
    /* Its rows stay while it does: GET /task says it waited on 2, none pending. */
    t = tp_daemon_json(&fx->d, path);
    assert_int_equal(tp_json_int_at(t, "dependencies.total"), 2);
    assert_int_equal(tp_json_int_at(t, "dependencies.pending"), 0);
    assert_false(json_is_true(json_object_get(json_object_get(t, "dependencies"), "waiting")));
    json_decref(t);
    /* Once the task is gone (retention, or by hand), a sweep deletes its rows. */
    assert_int_equal(tp_testdb_exec(&fx->db, "DELETE FROM task WHERE task_id = %" PRIu64, c), 1);
    for (long long end = tp_mono_ms() + WAIT_MS;
         tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task_dep WHERE task_id = %" PRIu64, c) > 0;
         tp_sleep_ms(50))
        assert_true(tp_mono_ms() < end);
    fx->passed = true;
}

static void test_fail_cascade(void **state)
{
    struct fx *fx = *state;
    fx->hold_open = true;
    start(fx, "deps_fail", 4);
    uint64_t a = submit(fx, "p", NULL, 0, 1);
    pthread_mutex_lock(&fx->mu);
    fx->fail_id = a;
    pthread_mutex_unlock(&fx->mu);
    uint64_t c = submit(fx, "c", &a, 1, 0);
    /* D waits on C, by SQL in one transaction. */
    assert_int_equal(mysql_query(fx->db.conn, "START TRANSACTION"), 0);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, `delayed`) VALUES ('c', 2)"), 1);
    uint64_t d = mysql_insert_id(fx->db.conn);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task_dep (task_id, parent_id) VALUES (%" PRIu64 ", %" PRIu64 ")",
                                    d, c),
                     1);
    assert_int_equal(mysql_query(fx->db.conn, "COMMIT"), 0);
    wait_started(fx, a);
    let_sweeps_run(); /* D is seen by a sweep before A ends: it keeps waiting */
    assert_int_equal(state_of(fx, d), 0);
    let_go(fx, a);
    wait_state(fx, a, 3);
    wait_state(fx, c, 3);
    wait_state(fx, d, 3);
    char e1[256], e2[256], want[64];
    err_of(fx, c, e1, sizeof e1);
    err_of(fx, d, e2, sizeof e2);
    tp_diag("C: '%s'; D: '%s'", e1, e2);
    snprintf(want, sizeof want, "dependency %" PRIu64 " failed", a);
    assert_string_equal(e1, want);
    snprintf(want, sizeof want, "dependency %" PRIu64 " failed", c);
    assert_string_equal(e2, want);
    assert_false(started(fx, c));
    assert_false(started(fx, d));
    /* POST /retry of C while A is still FAILED: C waits again (it does not run) and the
     * sweep fails it again for A. */
    char path[64], *body = NULL;
    uint64_t touched = tp_testdb_query_u64(&fx->db, "SELECT last_update_time FROM task WHERE task_id = %" PRIu64, c);
    tp_sleep_ms(5); /* the times are in ms: the next writes' differ */
    snprintf(path, sizeof path, "/retry?id=%" PRIu64, c);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", path, &body), 200);
    free(body);
    for (long long end = tp_mono_ms() + WAIT_MS;
         state_of(fx, c) != 3 ||
         tp_testdb_query_u64(&fx->db, "SELECT last_update_time FROM task WHERE task_id = %" PRIu64, c) <= touched;
         tp_sleep_ms(20))
        assert_true(tp_mono_ms() < end);
    err_of(fx, c, e1, sizeof e1);
    tp_diag("C retried while A is FAILED: '%s'", e1);
    snprintf(want, sizeof want, "dependency %" PRIu64 " failed", a);
    assert_string_equal(e1, want);
    assert_false(started(fx, c));
    fx->passed = true;
}

/* n rows of type c with explicit ids first..first+n-1, waiting (`delayed` 2) or not. */
static void insert_range(struct fx *fx, uint64_t first, int n, int delayed)
{
    for (int done = 0; done < n;) {
        struct tp_sb b = {0};
        tp_sb_printf(&b, "INSERT INTO task (task_id, task_type, `delayed`) VALUES ");
        for (int k = 0; k < 1000 && done < n; k++, done++)
            tp_sb_printf(&b, "%s(%" PRIu64 ", 'c', %d)", k ? "," : "", first + (uint64_t)done, delayed);
        assert_true(tp_testdb_exec(&fx->db, "%s", b.s) > 0);
        tp_sb_free(&b);
    }
}

static void test_fan_in_chain(void **state)
{
    struct fx *fx = *state;
    const uint64_t fan0 = 1000000, child = 2000000, chain0 = 3000000;
    start(fx, "deps_fan", 16);
    /* The worker is there before the rows: stop it taking them until all are in. */
    assert_int_equal(mysql_query(fx->db.conn, "START TRANSACTION"), 0);
    insert_range(fx, fan0, N_FAN, 0);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_id, task_type, `delayed`) VALUES (%" PRIu64 ", 'c', 2)", child), 1);
    for (int done = 0; done < N_FAN;) {
        struct tp_sb b = {0};
        tp_sb_printf(&b, "INSERT INTO task_dep (task_id, parent_id) VALUES ");
        for (int k = 0; k < 1000 && done < N_FAN; k++, done++)
            tp_sb_printf(&b, "%s(%" PRIu64 ", %" PRIu64 ")", k ? "," : "", child, fan0 + (uint64_t)done);
        assert_true(tp_testdb_exec(&fx->db, "%s", b.s) > 0);
        tp_sb_free(&b);
    }
    /* The chain: its head ready, each other task waiting on the one before. */
    insert_range(fx, chain0, 1, 0);
    insert_range(fx, chain0 + 1, N_CHAIN - 1, 2);
    for (int done = 1; done < N_CHAIN;) {
        struct tp_sb b = {0};
        tp_sb_printf(&b, "INSERT INTO task_dep (task_id, parent_id) VALUES ");
        for (int k = 0; k < 1000 && done < N_CHAIN; k++, done++)
            tp_sb_printf(&b, "%s(%" PRIu64 ", %" PRIu64 ")", k ? "," : "", chain0 + (uint64_t)done,
                         chain0 + (uint64_t)done - 1);
        assert_true(tp_testdb_exec(&fx->db, "%s", b.s) > 0);
        tp_sb_free(&b);
    }
    assert_int_equal(mysql_query(fx->db.conn, "COMMIT"), 0);
    long long t0 = tp_mono_ms();
    wait_state(fx, child, 2);
    long long t_fan = tp_mono_ms() - t0;
    wait_state(fx, chain0 + N_CHAIN - 1, 2);
    long long t_chain = tp_mono_ms() - t0;
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state <> 2"), 0);
    pthread_mutex_lock(&fx->mu);
    size_t n = fx->nlog;
    struct ev *ce = find_ev(fx, child);
    assert_non_null(ce);
    long long last_parent_end = 0, prev_end = 0, bad_order = 0;
    for (size_t i = 0; i < n; i++)
        if (fx->log[i].id >= fan0 && fx->log[i].id < fan0 + N_FAN && fx->log[i].seq_end > last_parent_end)
            last_parent_end = fx->log[i].seq_end;
    for (int k = 0; k < N_CHAIN; k++) {
        struct ev *e = find_ev(fx, chain0 + (uint64_t)k);
        assert_non_null(e);
        bad_order += e->seq_start < prev_end;
        prev_end = e->seq_end;
    }
    long long child_start = ce->seq_start;
    pthread_mutex_unlock(&fx->mu);
    tp_diag("fan-in of %d: the child ran %.1f s after the insert; chain of %d: done after %.1f s;"
            " %zu starts in all",
            N_FAN, t_fan / 1000.0, N_CHAIN, t_chain / 1000.0, n);
    assert_int_equal(n, (size_t)(N_FAN + 1 + N_CHAIN));
    assert_true(child_start > last_parent_end);
    assert_int_equal(bad_order, 0);
    fx->passed = true;
}

/* A raw producer's SUBMIT of one task of type c waiting on ids[0..n): the SUBMITTED
 * status, its message in msg. */
static int raw_submit(int fd, const uint64_t *ids, size_t n, char *msg, size_t cap)
{
    static uint8_t buf[65536];
    proto_submit_task t = {.priority = 1, .type = {(const uint8_t *)"c", 1}};
    t.nafter = (uint16_t)n;
    t.after = ids;
    proto_msg m = {.type = PROTO_SUBMIT};
    m.u.submit.request_id = 9;
    m.u.submit.flags = PROTO_SUBMIT_AFTER;
    m.u.submit.ntasks = 1;
    m.u.submit.tasks = &t;
    assert_int_equal(tp_raw_send_msg(fd, &m), 0);
    long len = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(len > 0);
    proto_msg a;
    assert_int_equal(proto_msg_decode(buf, (size_t)len, &a), PROTO_OK);
    assert_int_equal(a.type, PROTO_SUBMITTED);
    snprintf(msg, cap, "%.*s", (int)a.u.submitted.message.len, (const char *)a.u.submitted.message.ptr);
    return a.u.submitted.status;
}

static int ctl_after(struct fx *fx, const char *list)
{
    char *cmd = malloc(strlen(list) + 512);
    sprintf(cmd, "%s --worker %s submit --type c --after %s < /dev/null > /dev/null 2>&1",
            tp_build_path("ctl/taskpushctl"), fx->d.listen, list);
    int st = system(cmd);
    free(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bad_input(void **state)
{
    struct fx *fx = *state;
    char msg[256];
    start(fx, "deps_bad", 4);
    uint64_t ok = submit(fx, "p", NULL, 0, 0);
    wait_state(fx, ok, 2);
    uint64_t before = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task");

    int fd = tp_raw_connect(fx->d.listen, 30);
    assert_true(fd >= 0);
    proto_msg h = {.type = PROTO_HELLO};
    h.u.hello.version = PROTO_VERSION;
    h.u.hello.name = (proto_bytes){(const uint8_t *)"raw", 3};
    assert_int_equal(tp_raw_send_msg(fd, &h), 0);
    static uint8_t buf[65536];
    long n = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(buf[0], PROTO_WELCOME);

    uint64_t *many = malloc(1001 * sizeof *many);
    for (int i = 0; i < 1001; i++)
        many[i] = ok;
    assert_int_equal(raw_submit(fd, many, 1001, msg, sizeof msg), PROTO_SUBMIT_INVALID);
    tp_diag("1001 ids: '%s'", msg);
    assert_non_null(strstr(msg, "at most 1000"));
    free(many);
    uint64_t unknown = ok + 1000000;
    assert_int_equal(raw_submit(fd, &unknown, 1, msg, sizeof msg), PROTO_SUBMIT_INVALID);
    tp_diag("an unknown id: '%s'", msg);
    assert_non_null(strstr(msg, "does not exist"));
    /* Itself: the id the row would take (the next AUTO_INCREMENT value). */
    uint64_t next = tp_testdb_query_u64(&fx->db, "SELECT MAX(task_id) + 1 FROM task");
    assert_int_equal(raw_submit(fd, &next, 1, msg, sizeof msg), PROTO_SUBMIT_INVALID);
    tp_diag("itself: '%s'", msg);
    assert_non_null(strstr(msg, "does not exist"));
    uint64_t zero = 0;
    assert_int_equal(raw_submit(fd, &zero, 1, msg, sizeof msg), PROTO_SUBMIT_INVALID);
    tp_diag("id 0: '%s'", msg);
    /* A good one on the same connection goes in. */
    assert_int_equal(raw_submit(fd, &ok, 1, msg, sizeof msg), PROTO_SUBMIT_OK);
    close(fd);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), before + 1);

    /* taskpushctl: 1001 ids is a usage error (2), an unknown id refused (1). */
    struct tp_sb b = {0};
    for (int i = 0; i < 1001; i++)
        tp_sb_printf(&b, "%s%" PRIu64, i ? "," : "", ok);
    assert_int_equal(ctl_after(fx, b.s), 2);
    tp_sb_free(&b);
    char one[32];
    snprintf(one, sizeof one, "%" PRIu64, unknown);
    assert_int_equal(ctl_after(fx, one), 1);
    snprintf(one, sizeof one, "%" PRIu64, ok);
    assert_int_equal(ctl_after(fx, one), 0);

    /* SQL: a task waiting on itself is refused by the table. */
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task_dep (task_id, parent_id) VALUES (%" PRIu64 ", %" PRIu64 ")",
                                    ok, ok),
                     -1);
    /* SQL: a cycle X <-> Y, Z behind X; W waits on a missing task; V on one already done. */
    const uint64_t x = 5000001, y = 5000002, z = 5000003, w = 5000004, v = 5000005;
    assert_int_equal(mysql_query(fx->db.conn, "START TRANSACTION"), 0);
    insert_range(fx, x, 5, 2);
    assert_int_equal(tp_testdb_exec(&fx->db,
                                    "INSERT INTO task_dep (task_id, parent_id) VALUES (%" PRIu64 ", %" PRIu64
                                    "), (%" PRIu64 ", %" PRIu64 "), (%" PRIu64 ", %" PRIu64 "), (%" PRIu64
                                    ", 4999999), (%" PRIu64 ", %" PRIu64 ")",
                                    x, y, y, x, z, x, w, v, ok),
                     5);
    assert_int_equal(mysql_query(fx->db.conn, "COMMIT"), 0);
    wait_state(fx, x, 3);
    wait_state(fx, y, 3);
    wait_state(fx, z, 3);
    wait_state(fx, w, 3);
    wait_state(fx, v, 2);
    char ex[256], ey[256], ez[256], ew[256], want[64];
    err_of(fx, x, ex, sizeof ex);
    err_of(fx, y, ey, sizeof ey);
    err_of(fx, z, ez, sizeof ez);
    err_of(fx, w, ew, sizeof ew);
    tp_diag("cycle: X '%s', Y '%s', Z behind it '%s'; missing parent: '%s'", ex, ey, ez, ew);
    assert_string_equal(ex, "dependency cycle");
    assert_string_equal(ey, "dependency cycle");
    assert_true(strncmp(ez, "dependency", 10) == 0);
    assert_string_equal(ew, "dependency 4999999 does not exist");
    snprintf(want, sizeof want, "%s", "");
    (void)want;
    assert_false(started(fx, x) || started(fx, y) || started(fx, z) || started(fx, w));
    assert_true(started(fx, v));
    fx->passed = true;
}

static void test_idle_sweep(void **state)
{
    struct fx *fx = *state;
    start(fx, "deps_idle", 4);
    long long st0 = tp_daemon_stat(&fx->d, "db.statements_total");
    tp_sleep_ms(3000); /* a window for sweeps that must not happen (one a second before) */
    long long sweeps = tp_daemon_stat(&fx->d, "db.deps_sweeps_total");
    tp_diag("idle, no dependency: %lld sweep(s), %lld statement(s) in all in 3 s", sweeps,
            tp_daemon_stat(&fx->d, "db.statements_total") - st0);
    assert_int_equal(sweeps, 0);
    uint64_t a = submit(fx, "p", NULL, 0, 0);
    uint64_t c = submit(fx, "c", &a, 1, 0);
    wait_state(fx, c, 2);
    for (long long end = tp_mono_ms() + WAIT_MS; tp_daemon_stat(&fx->d, "db.deps_sweeps_total") < 1; tp_sleep_ms(20))
        assert_true(tp_mono_ms() < end);
    pthread_mutex_lock(&fx->mu);
    assert_true(find_ev(fx, c)->seq_start > find_ev(fx, a)->seq_end);
    pthread_mutex_unlock(&fx->mu);
    fx->passed = true;
}

static void test_conflict_retry(void **state)
{
    struct fx *fx = *state;
    fx->hold_open = true;
    start(fx, "deps_conflict", 4);
    long long reconnects = tp_daemon_stat(&fx->d, "db.reconnects_total");
    assert_int_equal(tp_daemon_stat(&fx->d, "db.cert_retries_total"), 0);
    uint64_t a = submit(fx, "p", NULL, 0, 0);
    uint64_t c1 = submit(fx, "c", &a, 1, 0), c2 = submit(fx, "c", &a, 1, 0);
    wait_started(fx, a);

    MYSQL *locker = tp_testdb_connect(&fx->db);
    assert_non_null(locker);
    assert_true(tp_testdb_exec_conn(locker, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") >= 0);
    assert_true(tp_testdb_exec_conn(locker, "START TRANSACTION") >= 0);
    assert_true(tp_testdb_exec_conn(locker, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE", c2) >= 0);
    let_go(fx, a);
    wait_state(fx, a, 2);
    /* The release meets the lock and is run again (a conflict), while the lock is held. */
    long long retries = 0;
    for (long long end = tp_mono_ms() + WAIT_MS; (retries = tp_daemon_stat(&fx->d, "db.cert_retries_total")) < 1;
         tp_sleep_ms(20))
        assert_true(tp_mono_ms() < end);
    assert_int_equal(state_of(fx, c2), 0);
    assert_true(tp_testdb_exec_conn(locker, "COMMIT") >= 0);
    mysql_close(locker);
    wait_state(fx, c1, 2);
    wait_state(fx, c2, 2);
    tp_diag("the release met a locked row: db.cert_retries_total %lld (%lld at the end), reconnects %lld -> %lld",
            retries, tp_daemon_stat(&fx->d, "db.cert_retries_total"), reconnects,
            tp_daemon_stat(&fx->d, "db.reconnects_total"));
    assert_int_equal(tp_daemon_stat(&fx->d, "db.reconnects_total"), reconnects);
    fx->passed = true;
}

static void test_deadlock_retry(void **state)
{
    struct fx *fx = *state;
    fx->hold_open = true;
    start(fx, "deps_deadlock", 4);
    long long reconnects = tp_daemon_stat(&fx->d, "db.reconnects_total");
    uint64_t a = submit(fx, "p", NULL, 0, 0);
    uint64_t c1 = submit(fx, "c", &a, 1, 0), c2 = submit(fx, "c", &a, 1, 0);
    wait_started(fx, a);
    uint64_t deadlocks = tp_testdb_query_u64(&fx->db, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                                                      " WHERE VARIABLE_NAME = 'INNODB_DEADLOCKS'");

    assert_true(tp_testdb_exec(&fx->db, "CREATE TABLE heavy (id INT PRIMARY KEY, pad CHAR(100)) ENGINE = InnoDB") >= 0);
    MYSQL *locker = tp_testdb_connect(&fx->db);
    assert_non_null(locker);
    assert_true(tp_testdb_exec_conn(locker, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") >= 0);
    assert_true(tp_testdb_exec_conn(locker, "SET SESSION innodb_lock_wait_timeout = 30") >= 0);
    assert_true(tp_testdb_exec_conn(locker, "START TRANSACTION") >= 0);
    assert_int_equal(tp_testdb_exec_conn(locker, "INSERT INTO heavy (id, pad) SELECT seq, 'x' FROM seq_1_to_2000"), 2000);
    assert_true(tp_testdb_exec_conn(locker, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE", c2) >= 0);
    let_go(fx, a);
    wait_state(fx, a, 2);
    /* The write thread's release met C2 locked at each of its 8 tries (7 retries) and left
     * it to the sweep, whose release holds C1 and waits for C2. */
    for (long long end = tp_mono_ms() + WAIT_MS; tp_daemon_stat(&fx->d, "db.cert_retries_total") < 7; tp_sleep_ms(10))
        assert_true(tp_mono_ms() < end);
    bool locked = false;
    for (long long end = tp_mono_ms() + WAIT_MS; !locked && tp_mono_ms() < end; tp_sleep_ms(10))
        locked = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM (SELECT task_id FROM task WHERE task_id = %" PRIu64
                                              " FOR UPDATE SKIP LOCKED) t",
                                     c1) == 0;
    assert_true(locked);
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE", c1);
    int q = mysql_query(locker, sql);
    unsigned err = q ? mysql_errno(locker) : 0;
    if (q == 0)
        mysql_free_result(mysql_store_result(locker));
    tp_diag("the session's lock of C1: %s (error %u)", q ? mysql_error(locker) : "granted", err);
    assert_int_equal(q, 0); /* the sweep's statement was the victim */
    assert_true(tp_testdb_exec_conn(locker, "COMMIT") >= 0);
    mysql_close(locker);
    wait_state(fx, c1, 2);
    wait_state(fx, c2, 2);
    uint64_t now_deadlocks = tp_testdb_query_u64(&fx->db, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                                                          " WHERE VARIABLE_NAME = 'INNODB_DEADLOCKS'");
    tp_diag("deadlocks %" PRIu64 " -> %" PRIu64 ", db.cert_retries_total %lld, reconnects %lld -> %lld", deadlocks,
            now_deadlocks, tp_daemon_stat(&fx->d, "db.cert_retries_total"), reconnects,
            tp_daemon_stat(&fx->d, "db.reconnects_total"));
    assert_true(now_deadlocks > deadlocks);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.reconnects_total"), reconnects);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_after_ab, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_cascade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fan_in_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conflict_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadlock_retry, setup, teardown),
    };
    return cmocka_run_group_tests_name("deps", tests, NULL, NULL);
}
