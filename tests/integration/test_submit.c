/* test_submit: submitting tasks through the dispatcher (SUBMIT, SUBMITTED, OUTCOME;
 * protocol version 2), against the real taskpushd and the private MariaDB.
 *
 * Cases:
 *   one_and_many        a producer-only libtaskpush client (no type) submits 1 task,
 *                       then 1000 in one call: every id names its row, with the fields
 *                       given; /stats counts the rows and the batches
 *   dedup               a dedup_key already present is answered DUPLICATE with the
 *                       existing id and no second row; twice in one call too
 *   delay               a task with delay_ms is never delivered before its run_after,
 *                       which is the insert time plus the delay
 *   wait_outcomes       TP_SUBMIT_WAIT: the OUTCOME of a success carries the result, of
 *                       a permanent failure the error text
 *   from_handler        a handler submits child tasks with its own worker; they run
 *   v1_hello            a version-1 HELLO is answered WELCOME version 1 and gets tasks;
 *                       a SUBMIT on it is refused (ERROR, closed)
 *   commit_before_ack   the dispatcher is stopped (SIGSTOP) the moment SUBMITTED
 *                       arrives: another database connection already finds every row
 *   hostile_submits     ntasks 0 and 1001, priority 3, a 192-byte dedup_key, a 257-byte
 *                       type, a flags bit: each closes only its own connection; a type
 *                       with a trailing space is INVALID and the connection stays
 *   standby_unavailable a dispatcher that does not lead answers UNAVAILABLE at once
 *   ctl_submit          taskpushctl submit prints the id, then "duplicate ID"; --wait
 *                       prints the result
 *
 * Waits are bounded polling; nothing asserts on how long anything took. */
#include <errno.h>
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "proto.h"
#include "raw.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 30000
#define SUBMIT_TIMEOUT_MS 20000

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d, d2;
    bool have_d, have_d2;
    tp_worker *w[3];
    tp_inproc run[3];
    bool passed;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        if (fx->w[i]) {
            tp_inproc_halt(&fx->run[i]);
            tp_worker_free(fx->w[i]);
        }
    }
    /* A clean exit after SIGTERM (under ASan: no leak, no error) is part of each case. */
    if (fx->have_d2 && tp_daemon_stop(&fx->d2, SIGTERM, 15000) != 0 && fx->passed) {
        tp_daemon_dump_log(&fx->d2);
        rc = -1;
    }
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
    static const char *const args[] = {"--poll-ms", "50", "--heartbeat-ms", "1000", NULL};
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_d = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
}

/* Starts worker slot i on the daemon: types[] with their handlers (NULL: producer). */
static tp_worker *worker(struct fx *fx, int i, unsigned threads, const char *const *types,
                         const tp_handler *fns, void *arg)
{
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.capacity = threads ? threads : 1;
    o.threads = threads;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    tp_worker *w = tp_worker_new(&o, &err);
    assert_non_null(w);
    for (int k = 0; types && types[k]; k++)
        assert_int_equal(tp_worker_add_type(w, types[k], fns[k], arg), 0);
    fx->w[i] = w;
    assert_int_equal(tp_inproc_start(&fx->run[i], w), 0);
    return w;
}

static tp_submit_task task_of(const char *type, const char *payload)
{
    tp_submit_task t;
    tp_submit_task_init(&t);
    t.type = type;
    t.payload = payload;
    t.payload_len = strlen(payload);
    return t;
}

static uint64_t q64(struct fx *fx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static uint64_t q64(struct fx *fx, const char *fmt, ...)
{
    char sql[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    return tp_testdb_query_u64(&fx->db, "%s", sql);
}

static bool wait_u64(struct fx *fx, uint64_t want, const char *sql)
{
    long long until = tp_mono_ms() + WAIT_MS;
    while (tp_mono_ms() < until) {
        if (tp_testdb_query_u64(&fx->db, "%s", sql) == want)
            return true;
        tp_sleep_ms(20);
    }
    return false;
}

/* ---- one_and_many ---- */

static void one_and_many(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_many");
    tp_worker *p = worker(fx, 0, 0, NULL, NULL, NULL); /* producer only */
    tp_submit_result r[1000];
    tp_error err;

    tp_submit_task t = task_of("resize", "{\"w\":640}");
    t.priority = 2;
    t.max_attempts = 7;
    t.timeout_ms = 45000;
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_true(r[0].task_id > 0);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                             " AND task_type = 'resize' AND task_priority = 2 AND max_attempts = 7"
                             " AND timeout_ms = 45000 AND payload = '{\"w\":640}' AND task_state = 0"
                             " AND `delayed` = 0 AND dedup_key IS NULL",
                         r[0].task_id),
                     1);

    static tp_submit_task many[1000];
    static char payloads[1000][16];
    for (int i = 0; i < 1000; i++) {
        snprintf(payloads[i], sizeof payloads[i], "p%d", i);
        many[i] = task_of(i % 2 ? "odd" : "even", payloads[i]);
    }
    assert_int_equal(tp_submit(p, many, 1000, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(r[i].duplicate, 0);
        /* Each id names the row of its own task, in order. */
        if (i > 0)
            assert_true(r[i].task_id > r[i - 1].task_id);
    }
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_id BETWEEN %" PRIu64 " AND %" PRIu64
                             " AND payload = CONCAT('p', task_id - %" PRIu64 ")"
                             " AND task_type = IF((task_id - %" PRIu64 ") %% 2, 'odd', 'even')",
                         r[0].task_id, r[999].task_id, r[0].task_id, r[0].task_id),
                     1000);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), 1001);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.submitted_rows_total"), 1001);
    assert_true(tp_daemon_stat(&fx->d, "db.submit_batches_total") >= 2);
    fx->passed = true;
}

/* ---- dedup ---- */

static void dedup(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_dedup");
    tp_worker *p = worker(fx, 0, 0, NULL, NULL, NULL);
    tp_submit_result r[3];
    tp_error err;

    tp_submit_task t = task_of("mail", "hello");
    t.dedup_key = "mail-42";
    t.dedup_key_len = 7;
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    uint64_t id = r[0].task_id;
    assert_true(id > 0);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(r[0].duplicate, 1);
    assert_true(r[0].task_id == id);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE dedup_key = 'mail-42'"), 1);

    /* The same new key twice in one call, beside a key already present. */
    tp_submit_task three[3] = {task_of("mail", "a"), task_of("mail", "b"), task_of("mail", "c")};
    three[0].dedup_key = three[1].dedup_key = "fresh";
    three[0].dedup_key_len = three[1].dedup_key_len = 5;
    three[2].dedup_key = "mail-42";
    three[2].dedup_key_len = 7;
    assert_int_equal(tp_submit(p, three, 3, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(r[1].duplicate, 1);
    assert_true(r[1].task_id == r[0].task_id);
    assert_int_equal(r[2].duplicate, 1);
    assert_true(r[2].task_id == id);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), 2);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE dedup_key = 'fresh' AND payload = 'a'"), 1);
    /* An empty payload is stored empty, not NULL. */
    tp_submit_task empty = task_of("mail", "");
    assert_int_equal(tp_submit(p, &empty, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64 " AND payload = ''",
                         r[0].task_id), 1);
    assert_int_equal(tp_daemon_stat(&fx->d, "db.submit_duplicates_total"), 3);
    fx->passed = true;
}

/* ---- handlers shared by the next cases ---- */

static _Atomic int64_t ran_wall_ms; /* when the delayed task ran (ms since the epoch) */

static int h_record(tp_task *t, void *arg)
{
    (void)arg;
    (void)t;
    atomic_store(&ran_wall_ms, tp_testdb_now_ms());
    return TP_SUCCESS;
}

static int h_echo(tp_task *t, void *arg)
{
    (void)arg;
    size_t n;
    const char *p = tp_task_payload(t, &n);
    char out[256];
    int len = snprintf(out, sizeof out, "echo:%.*s", (int)(n > 200 ? 200 : n), p);
    if (tp_task_set_result(t, out, (size_t)len) != 0)
        return TP_FAIL;
    return TP_SUCCESS;
}

static int h_fail(tp_task *t, void *arg)
{
    (void)arg;
    if (tp_task_set_error(t, "nope: bad input") != 0)
        return TP_FAIL;
    return TP_FAIL_PERMANENT;
}

/* ---- delay ---- */

static void delay(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_delay");
    static const char *const types[] = {"later", NULL};
    static const tp_handler fns[] = {h_record};
    atomic_store(&ran_wall_ms, 0);
    worker(fx, 1, 0, types, fns, NULL);
    tp_worker *p = worker(fx, 0, 0, NULL, NULL, NULL);
    tp_submit_result r[1];
    tp_error err;

    tp_submit_task t = task_of("later", "x");
    t.delay_ms = 1500;
    int64_t before = tp_testdb_now_ms();
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    int64_t after = tp_testdb_now_ms();
    uint64_t run_after = q64(fx, "SELECT run_after FROM task WHERE task_id = %" PRIu64, r[0].task_id);
    assert_true((int64_t)run_after >= before + 1500 && (int64_t)run_after <= after + 1500);
    assert_int_equal(q64(fx, "SELECT `delayed` FROM task WHERE task_id = %" PRIu64, r[0].task_id), 1);
    assert_true(wait_u64(fx, 1, "SELECT COUNT(*) FROM task WHERE task_state = 2"));
    /* Delivered only once due (the machine's one clock: the test's and the dispatcher's). */
    assert_true(atomic_load(&ran_wall_ms) >= (int64_t)run_after);
    fx->passed = true;
}

/* ---- wait_outcomes ---- */

static void wait_outcomes(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_wait");
    static const char *const types[] = {"echo", "fail", NULL};
    static const tp_handler fns[] = {h_echo, h_fail};
    worker(fx, 1, 2, types, fns, NULL);
    tp_worker *p = worker(fx, 0, 0, NULL, NULL, NULL);
    tp_submit_result r[3];
    tp_error err;

    tp_submit_task t[3] = {task_of("echo", "hi"), task_of("fail", "x"), task_of("echo", "dup")};
    t[2].dedup_key = "k";
    t[2].dedup_key_len = 1;
    assert_int_equal(tp_submit(p, &t[2], 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_true(wait_u64(fx, 1, "SELECT COUNT(*) FROM task WHERE task_state = 2"));
    /* Two inserted, one duplicate (no OUTCOME is due for it). */
    int rc = tp_submit(p, t, 3, TP_SUBMIT_WAIT, SUBMIT_TIMEOUT_MS, r, &err);
    if (rc != 0)
        fail_msg("tp_submit: %s", err.text);
    assert_int_equal(r[0].state, TP_TASK_SUCCESSFUL);
    assert_int_equal(r[0].output_len, 7);
    assert_memory_equal(r[0].output, "echo:hi", 7);
    assert_int_equal(r[1].state, TP_TASK_FAILED);
    assert_string_equal(r[1].output, "nope: bad input");
    assert_int_equal(r[2].duplicate, 1);
    assert_int_equal(r[2].state, 0);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                             " AND task_state = 2 AND result = 'echo:hi'", r[0].task_id), 1);
    tp_submit_results_free(r, 3);
    fx->passed = true;
}

/* ---- dispatched_on_commit ---- */

/* A submitted task goes out the moment its row is committed, not at the next poll: with
 * a poll of an hour, an idle dispatcher (its empty claim done, the poll timer armed)
 * runs a submitted task and answers its WAIT, twice in a row. Before the claim was
 * hastened past the armed timer, the task waited for the poll and the WAIT timed out. */
static void dispatched_on_commit(void **state)
{
    struct fx *fx = *state;
    static const char *const args[] = {"--poll-ms", "3600000", "--heartbeat-ms", "1000", NULL};
    assert_int_equal(tp_testdb_create("submit_oncommit", &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    fx->have_d = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    static const char *const types[] = {"echo", NULL};
    static const tp_handler fns[] = {h_echo};
    worker(fx, 1, 1, types, fns, NULL);
    tp_worker *p = worker(fx, 0, 0, NULL, NULL, NULL);
    /* The worker's arrival claims once (nothing there); after that only the poll would. */
    assert_true(wait_u64(fx, 1, "SELECT 1"));
    usleep(300 * 1000);
    for (int round = 0; round < 2; round++) {
        tp_submit_task t = task_of("echo", round ? "b" : "a");
        tp_submit_result r;
        tp_error err;
        int rc = tp_submit(p, &t, 1, TP_SUBMIT_WAIT, SUBMIT_TIMEOUT_MS, &r, &err);
        if (rc != 0)
            fail_msg("round %d: tp_submit: %s", round, err.text);
        assert_int_equal(r.state, TP_TASK_SUCCESSFUL);
        assert_int_equal(r.output_len, 6);
        assert_memory_equal(r.output, round ? "echo:b" : "echo:a", 6);
        tp_submit_results_free(&r, 1);
    }
    fx->passed = true;
}

/* ---- from_handler ---- */

static _Atomic int children_submitted;

static int h_parent(tp_task *t, void *arg)
{
    tp_worker *w = arg;
    tp_submit_task c[2] = {task_of("child", "c1"), task_of("child", "c2")};
    tp_submit_result r[2];
    tp_error err;
    (void)t;
    if (tp_submit(w, c, 2, 0, SUBMIT_TIMEOUT_MS, r, &err) != 0 || r[0].task_id == 0 || r[1].task_id == 0)
        return TP_FAIL_PERMANENT;
    atomic_fetch_add(&children_submitted, 2);
    return TP_SUCCESS;
}

static void from_handler(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_handler");
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.capacity = 4;
    o.threads = 4;
    tp_worker *w = tp_worker_new(&o, &err);
    assert_non_null(w);
    assert_int_equal(tp_worker_add_type(w, "parent", h_parent, w), 0);
    assert_int_equal(tp_worker_add_type(w, "child", h_echo, NULL), 0);
    fx->w[0] = w;
    atomic_store(&children_submitted, 0);
    assert_int_equal(tp_inproc_start(&fx->run[0], w), 0);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) VALUES"
                                              " ('parent', 'a'), ('parent', 'b')"), 2);
    assert_true(wait_u64(fx, 6, "SELECT COUNT(*) FROM task WHERE task_state = 2"));
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_type = 'child'"
                             " AND result LIKE 'echo:c_'"), 4);
    assert_int_equal(atomic_load(&children_submitted), 4);
    fx->passed = true;
}

/* ---- raw protocol helpers ---- */

/* Connects and says HELLO: a producer (version 2, no type) or a version-1 worker. */
static int raw_peer(struct fx *fx, uint16_t version, const char *type)
{
    int fd = tp_raw_connect(fx->d.listen, 10);
    assert_true(fd >= 0);
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = version;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"raw", 3};
    if (type) {
        m.u.hello.capacity = 1;
        m.u.hello.ntypes = 1;
        m.u.hello.types[0] = (proto_bytes){(const uint8_t *)type, strlen(type)};
    }
    assert_int_equal(tp_raw_send_msg(fd, &m), 0);
    static uint8_t buf[65536];
    long n = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(n > 0);
    proto_msg w;
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &w), PROTO_OK);
    assert_int_equal(w.type, PROTO_WELCOME);
    assert_int_equal(w.u.welcome.version, version);
    return fd;
}

static void raw_submit(int fd, uint32_t request_id, uint8_t flags, const proto_submit_task *t, uint16_t n)
{
    proto_msg m = {.type = PROTO_SUBMIT};
    m.u.submit.request_id = request_id;
    m.u.submit.flags = flags;
    m.u.submit.ntasks = n;
    m.u.submit.tasks = t;
    assert_int_equal(tp_raw_send_msg(fd, &m), 0);
}

static proto_submit_task raw_task(const char *type)
{
    proto_submit_task t;
    memset(&t, 0, sizeof t);
    t.priority = 1;
    t.type = (proto_bytes){(const uint8_t *)type, strlen(type)};
    t.payload = (proto_bytes){(const uint8_t *)"raw", 3};
    return t;
}

/* The connection ends with an ERROR of code (then EOF). */
static void expect_error_close(int fd, uint16_t code)
{
    static uint8_t buf[65536];
    long n = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(n > 0);
    proto_msg m;
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_ERROR);
    assert_int_equal(m.u.error.code, code);
    assert_true(tp_raw_read_frame(fd, buf, sizeof buf) < 0);
    close(fd);
}

/* ---- v1_hello ---- */

static void v1_hello(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_v1");
    int fd = raw_peer(fx, 1, "old");
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) VALUES ('old', 'v1')"), 1);
    static uint8_t buf[65536];
    long n = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(n > 0);
    proto_msg m;
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_TASK);
    proto_msg d = {.type = PROTO_DONE};
    d.u.done.task_id = m.u.task.task_id;
    d.u.done.epoch = m.u.task.epoch;
    d.u.done.attempt = m.u.task.attempt;
    d.u.done.data = (proto_bytes){(const uint8_t *)"ok", 2};
    assert_int_equal(tp_raw_send_msg(fd, &d), 0);
    assert_true(wait_u64(fx, 1, "SELECT COUNT(*) FROM task WHERE task_state = 2 AND result = 'ok'"));
    /* SUBMIT is a version-2 frame: on this session it is refused. */
    proto_submit_task t = raw_task("old");
    raw_submit(fd, 1, 0, &t, 1);
    expect_error_close(fd, PROTO_ERR_UNEXPECTED);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), 1);
    fx->passed = true;
}

/* ---- commit_before_ack ---- */

static void commit_before_ack(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_commit");
    MYSQL *other = tp_testdb_connect(&fx->db);
    assert_non_null(other);
    int fd = raw_peer(fx, 2, NULL);
    static proto_submit_task t[200];
    for (int i = 0; i < 200; i++)
        t[i] = raw_task("ack");
    for (uint32_t round = 1; round <= 5; round++) {
        raw_submit(fd, round, 0, t, 200);
        static uint8_t buf[65536];
        long n = tp_raw_read_frame(fd, buf, sizeof buf);
        /* The moment the acknowledgement is read, the dispatcher stops. */
        assert_int_equal(kill(fx->d.pid, SIGSTOP), 0);
        assert_true(n > 0);
        proto_msg m;
        assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
        assert_int_equal(m.type, PROTO_SUBMITTED);
        assert_int_equal(m.u.submitted.request_id, round);
        assert_int_equal(m.u.submitted.status, PROTO_SUBMIT_OK);
        assert_int_equal(m.u.submitted.n, 200);
        proto_submit_res first, last;
        proto_submitted_result(&m.u.submitted, 0, &first);
        proto_submitted_result(&m.u.submitted, 199, &last);
        /* Another connection, a new transaction: every acknowledged row is committed. */
        assert_int_equal(tp_testdb_query_u64_conn(other,
                                                  "SELECT COUNT(*) FROM task WHERE task_id BETWEEN %" PRIu64
                                                  " AND %" PRIu64 " AND task_type = 'ack'",
                                                  first.task_id, last.task_id),
                         200);
        assert_int_equal(tp_testdb_query_u64_conn(other, "SELECT COUNT(*) FROM task"), 200 * round);
        assert_int_equal(kill(fx->d.pid, SIGCONT), 0);
    }
    close(fd);
    mysql_close(other);
    fx->passed = true;
}

/* ---- hostile_submits ---- */

static void hostile_submits(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_hostile");
    int honest = raw_peer(fx, 2, NULL);
    static uint8_t buf[65536];
    static proto_submit_task many[1001];
    proto_msg m;

    for (int i = 0; i < 1001; i++)
        many[i] = raw_task("h");
    /* Frames the encoder refuses are written by hand: patch a good one. */
    struct {
        const char *what;
        size_t at;    /* body offset patched, 0: none */
        uint8_t value;
        uint16_t ntasks;
        uint8_t flags;
    } cases[] = {
        {"ntasks 0", 7, 0, 1, 0},
        {"ntasks 1001", 0, 0, 1001, 0},
        {"priority 3", 8, 3, 1, 0},
        {"flags bit 1", 5, 0x03, 1, 0},
        {"flags bit 7", 5, 0x80, 1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int fd = raw_peer(fx, 2, NULL);
        proto_msg s = {.type = PROTO_SUBMIT};
        s.u.submit.request_id = 9;
        s.u.submit.ntasks = cases[c].ntasks > 1000 ? 1000 : cases[c].ntasks;
        s.u.submit.tasks = many;
        size_t n = proto_msg_size(&s);
        size_t extra = cases[c].ntasks > 1000 ? 19 + 1 + 3 : 0; /* one more entry */
        uint8_t *f = calloc(1, n + extra);
        assert_non_null(f);
        assert_int_equal(proto_msg_encode(&s, f, n), n);
        if (extra) {
            /* the 1001st entry, and ntasks and the prefix made to say so */
            uint8_t *e = f + n;
            e[0] = 1;
            e[12] = 1;
            e[13] = 'h';
            e[19] = 3;
            memcpy(e + 20, "raw", 3);
            f[PROTO_LEN_PREFIX + 6] = 1001 >> 8;
            f[PROTO_LEN_PREFIX + 7] = 1001 & 0xff;
            uint32_t blen = (uint32_t)(n + extra - PROTO_LEN_PREFIX);
            f[0] = (uint8_t)(blen >> 24);
            f[1] = (uint8_t)(blen >> 16);
            f[2] = (uint8_t)(blen >> 8);
            f[3] = (uint8_t)blen;
        }
        if (cases[c].at)
            f[PROTO_LEN_PREFIX + cases[c].at] = cases[c].value;
        assert_int_equal(tp_raw_send(fd, f, n + extra), 0);
        free(f);
        print_message("# %s\n", cases[c].what);
        expect_error_close(fd, PROTO_ERR_BAD_FRAME);
    }
    /* Oversize entries: a 192-byte dedup_key, a 257-byte type (by hand, past the encoder). */
    for (int c = 0; c < 2; c++) {
        int fd = raw_peer(fx, 2, NULL);
        uint8_t f[600] = {0};
        size_t klen = c == 0 ? 192 : 0, tlen = c == 0 ? 1 : 257;
        uint8_t *b = f + PROTO_LEN_PREFIX;
        b[0] = PROTO_SUBMIT;
        b[8 - 1] = 1; /* ntasks */
        uint8_t *e = b + 8;
        e[0] = 1;
        e[11] = (uint8_t)(tlen >> 8);
        e[12] = (uint8_t)tlen;
        memset(e + 13, 't', tlen);
        uint8_t *k = e + 13 + tlen;
        k[0] = (uint8_t)(klen >> 8);
        k[1] = (uint8_t)klen;
        memset(k + 2, 'k', klen);
        uint8_t *pl = k + 2 + klen; /* payload length 0 */
        size_t blen = (size_t)(pl + 4 - b);
        f[2] = (uint8_t)(blen >> 8);
        f[3] = (uint8_t)blen;
        assert_int_equal(tp_raw_send(fd, f, PROTO_LEN_PREFIX + blen), 0);
        expect_error_close(fd, PROTO_ERR_BAD_FRAME);
    }
    /* A type the table cannot hold is INVALID; the connection stays. */
    proto_submit_task bad = raw_task("resize ");
    raw_submit(honest, 5, 0, &bad, 1);
    long n = tp_raw_read_frame(honest, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_SUBMITTED);
    assert_int_equal(m.u.submitted.status, PROTO_SUBMIT_INVALID);
    assert_int_equal(m.u.submitted.n, 0);
    assert_true(m.u.submitted.message.len > 0);
    /* Nothing was inserted by any of them, and the honest connection still submits. */
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), 0);
    proto_submit_task good = raw_task("fine");
    raw_submit(honest, 6, 0, &good, 1);
    n = tp_raw_read_frame(honest, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
    assert_int_equal(m.u.submitted.status, PROTO_SUBMIT_OK);
    assert_int_equal(m.u.submitted.request_id, 6);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), 1);
    close(honest);
    fx->passed = true;
}

/* ---- standby_unavailable ---- */

static void standby_unavailable(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_standby");
    static const char *const args[] = {NULL};
    assert_int_equal(tp_daemon_start(&fx->d2, fx->db.url, args), 0);
    fx->have_d2 = true;
    /* d2 is a standby: the same table, led by fx->d. */
    tp_daemon saved = fx->d;
    fx->d = fx->d2;
    int fd = raw_peer(fx, 2, NULL);
    fx->d = saved;
    proto_submit_task t = raw_task("any");
    raw_submit(fd, 77, 0, &t, 1);
    static uint8_t buf[65536];
    long n = tp_raw_read_frame(fd, buf, sizeof buf);
    assert_true(n > 0);
    proto_msg m;
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_SUBMITTED);
    assert_int_equal(m.u.submitted.request_id, 77);
    assert_int_equal(m.u.submitted.status, PROTO_SUBMIT_UNAVAILABLE);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task"), 0);
    close(fd);
    fx->passed = true;
}

/* ---- ctl_submit ---- */

/* Runs taskpushctl with stdin from `input`; returns its exit status, output in out. */
static int ctl(const char *input, char *out, size_t cap, const char *const *args)
{
    int in[2], o[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(o), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(o[1], 1);
        close(in[0]);
        close(in[1]);
        close(o[0]);
        close(o[1]);
        execv(tp_build_path("ctl/taskpushctl"), (char *const *)args);
        _exit(127);
    }
    close(in[0]);
    close(o[1]);
    size_t len = strlen(input);
    assert_true(write(in[1], input, len) == (ssize_t)len);
    close(in[1]);
    size_t got = 0;
    ssize_t k;
    while (got + 1 < cap && (k = read(o[0], out + got, cap - 1 - got)) > 0)
        got += (size_t)k;
    out[got] = '\0';
    close(o[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void ctl_submit(void **state)
{
    struct fx *fx = *state;
    start(fx, "submit_ctl");
    char out[4096];
    const char *base[] = {"taskpushctl", "--worker", fx->d.listen, "submit", "--type", "mail",
                          "--priority", "2", "--dedup-key", "welcome-7", "--delay-ms", "0", NULL};
    assert_int_equal(ctl("to: a@example.com", out, sizeof out, base), 0);
    uint64_t id = strtoull(out, NULL, 10);
    assert_true(id > 0);
    assert_int_equal(q64(fx, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                             " AND task_priority = 2 AND payload = 'to: a@example.com'"
                             " AND dedup_key = 'welcome-7'", id), 1);
    assert_int_equal(ctl("again", out, sizeof out, base), 0);
    char want[64];
    snprintf(want, sizeof want, "duplicate %" PRIu64 "\n", id);
    assert_string_equal(out, want);

    static const char *const types[] = {"echo", NULL};
    static const tp_handler fns[] = {h_echo};
    worker(fx, 1, 1, types, fns, NULL);
    const char *waiting[] = {"taskpushctl", "--worker", fx->d.listen, "submit", "--type", "echo",
                             "--wait", NULL};
    assert_int_equal(ctl("ping", out, sizeof out, waiting), 0);
    assert_non_null(strstr(out, "SUCCESSFUL"));
    assert_non_null(strstr(out, "echo:ping"));
    /* A bad flag exits 2. */
    const char *bad[] = {"taskpushctl", "--worker", fx->d.listen, "submit", "--type", "echo",
                         "--priority", "7", NULL};
    assert_int_equal(ctl("", out, sizeof out, bad), 2);
    fx->passed = true;
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(one_and_many), T(dedup),           T(delay),           T(wait_outcomes),
        T(from_handler), T(v1_hello),        T(commit_before_ack), T(hostile_submits),
        T(standby_unavailable), T(ctl_submit), T(dispatched_on_commit),
    };
    return cmocka_run_group_tests_name("submit", tests, NULL, NULL);
}
