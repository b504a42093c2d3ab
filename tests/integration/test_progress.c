/* test_progress: a worker's progress of a running task (PROGRESS, protocol version 4),
 * against the real taskpushd, a private MariaDB, libtaskpush workers and raw-protocol
 * clients over TCP. Waits are bounded polls; nothing asserts on how long something took.
 *
 * Cases:
 *   worker_reports   a handler reports 3 times within a second, then twice more slowly:
 *                    GET /task and taskpushctl show the latest value and message; after
 *                    the task ends its progress is gone (null)
 *   raw_rules        a raw version-4 client: a PROGRESS for a delivery it does not hold
 *                    (unknown id, older attempt, other epoch) is ignored and counted
 *                    (tasks.progress_ignored_total), the connection stays and a valid one
 *                    is taken; a value of 1001, a message of 257 bytes, a message that is
 *                    not UTF-8 or holds a NUL, a length past the end: ERROR BAD_FRAME and
 *                    a close; a PROGRESS in a version-3 session: ERROR UNEXPECTED, close
 *   v3_client        a raw version-3 client is welcomed in version 3, gets its TASK and
 *                    its DONE is written as before
 *   stored           two tasks report every 5 ms for about 2 s: the progress table holds
 *                    each one's latest report, db.progress_rows_written_total stays within
 *                    2 x (seconds elapsed + 5) and a tenth of the reports (a write a second
 *                    per task, not one per report); once the tasks end their rows are deleted
 *   new_dispatcher   kill -9 of the dispatcher while a task runs: another taskpushd on the
 *                    table shows the report the first one stored (GET /task, "from":
 *                    "table"; taskpushctl show)
 *   exec_worker      taskpush-worker --exec: a command's "progress 420 half way" line on
 *                    descriptor 3 (TASKPUSH_PROGRESS_FD) shows in GET /task
 *   keys_busiest     GET /keys: 30, 20 and 10 tasks of keys a, b, c (and 1 of a key that
 *                    is not UTF-8, 5 without a key), first with no worker (all waiting,
 *                    from the table figures), then with a worker of 3 slots held in its
 *                    handlers: per key running + buffered + waiting is its count, 3
 *                    running in all, the busiest first; top=2 lists two; bad top: 400
 */
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
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

#include "daemon.h"
#include "inproc_worker.h"
#include "raw.h"
#include "taskpush.h"
#include "rows.h"
#include "testdb.h"

#define WAIT_MS 60000
#define POLL_MS 20

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
    tp_worker *w;
    tp_inproc run;
    tp_gate step;         /* the handler waits here between its slow reports */
    atomic_int phase;     /* how far the handler got */
    atomic_int report_rc; /* the first non-zero tp_task_progress result */
    atomic_int held_keyless; /* keys_busiest: tasks without a key in on_held */
    bool passed;
};

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    tp_gate_init(&fx->step, false);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    tp_gate_set(&fx->step, true);
    if (fx->w) {
        tp_inproc_halt(&fx->run);
        tp_worker_free(fx->w);
    }
    if (fx->have_daemon) {
        if (fx->d.pid > 0)
            tp_daemon_stop(&fx->d, SIGKILL, 5000);
        if (!fx->passed)
            tp_daemon_dump_log(&fx->d);
        unlink(fx->d.log_path);
    }
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    tp_gate_destroy(&fx->step);
    free(fx);
    return 0;
}

static void fx_start_with(struct fx *fx, const char *tag, const char *const *extra)
{
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, extra), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
}

static void fx_start(struct fx *fx, const char *tag)
{
    fx_start_with(fx, tag, NULL);
}

/* max_attempts 1000: the raw cases close many connections that hold it. */
static uint64_t insert_task(struct fx *fx, const char *type)
{
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload, max_attempts) "
                                             "VALUES ('%s', 'x', 1000)", type), 1);
    return (uint64_t)mysql_insert_id(fx->db.conn);
}

/* GET /task?id= parsed; NULL when not 200. */
static json_t *get_task(struct fx *fx, uint64_t id)
{
    char path[64];
    snprintf(path, sizeof path, "/task?id=%llu", (unsigned long long)id);
    return tp_daemon_json(&fx->d, path);
}

/* Waits until /task shows progress permille want (with message msg); returns the object
 * so that the caller can look further, or fails. */
static json_t *wait_progress(struct fx *fx, uint64_t id, long long want, const char *msg)
{
    long long end = tp_mono_ms() + WAIT_MS, seen = -2;
    while (tp_mono_ms() < end) {
        json_t *o = get_task(fx, id);
        json_t *p = json_object_get(o, "progress");
        seen = json_is_object(p) ? (long long)json_integer_value(json_object_get(p, "permille")) : -1;
        const char *m = json_string_value(json_object_get(p, "message"));
        if (seen == want && m && strcmp(m, msg) == 0)
            return o;
        json_decref(o);
        tp_sleep_ms(POLL_MS);
    }
    fail_msg("task %llu: progress %lld, want %lld \"%s\"", (unsigned long long)id, seen, want, msg);
    return NULL;
}

/* Runs taskpushctl --admin <the daemon> ARGS; the exit status, its stdout in out. */
static int ctl(struct fx *fx, char *out, size_t outlen, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env -u TASKPUSH_TOKEN -u TASKPUSH_ADMIN_TOKEN %s --admin %s %s",
             tp_build_path("ctl/taskpushctl"), fx->d.admin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    printf("# $ taskpushctl %s -> %d\n", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    for (char *line = out, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        printf("#   %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
        if (!nl)
            break;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- worker_reports ---- */

static void note_rc(struct fx *fx, int rc)
{
    int zero = 0;
    if (rc != 0)
        atomic_compare_exchange_strong(&fx->report_rc, &zero, rc);
}

static int on_long_task(tp_task *t, void *arg)
{
    struct fx *fx = arg;
    /* Three reports within a second: the dispatcher keeps the latest. */
    note_rc(fx, tp_task_progress(t, 100, "step 1"));
    note_rc(fx, tp_task_progress(t, 200, "step 2"));
    note_rc(fx, tp_task_progress(t, 300, "step 3 of 10"));
    atomic_store(&fx->phase, 1);
    tp_gate_pass(&fx->step);
    /* Then more slowly, each after the test saw the one before. */
    note_rc(fx, tp_task_progress(t, 600, "sechs \xc3\xa9tapes")); /* UTF-8 */
    atomic_store(&fx->phase, 2);
    while (atomic_load(&fx->phase) < 3 && !tp_task_cancelled(t))
        tp_sleep_ms(5);
    note_rc(fx, tp_task_progress(t, 1000, NULL));
    atomic_store(&fx->phase, 4);
    while (atomic_load(&fx->phase) < 5 && !tp_task_cancelled(t))
        tp_sleep_ms(5);
    /* Refused before anything is sent. */
    char long_msg[TP_MAX_PROGRESS_MSG_LEN + 2];
    memset(long_msg, 'a', sizeof long_msg - 1);
    long_msg[sizeof long_msg - 1] = '\0';
    if (tp_task_progress(t, 1001, NULL) != TP_ERANGE || tp_task_progress(t, 5, long_msg) != TP_ERANGE ||
        tp_task_progress(t, 5, "\xff") != TP_EINVAL || tp_task_progress(NULL, 5, NULL) != TP_EINVAL)
        note_rc(fx, -100);
    return TP_SUCCESS;
}

static void worker_reports(void **state)
{
    struct fx *fx = *state;
    char out[8192];
    fx_start(fx, "progress_reports");
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "reporter", 1, "long", on_long_task, fx);
    assert_non_null(fx->w);
    uint64_t id = insert_task(fx, "long");

    json_t *o = wait_progress(fx, id, 300, "step 3 of 10");
    json_t *p = json_object_get(o, "progress");
    assert_true(json_integer_value(json_object_get(p, "at_ms")) > 1700000000000LL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "dispatcher"), "state")), "running");
    json_decref(o);
    assert_int_equal(ctl(fx, out, sizeof out, "show " /* id below */ "0") != 0, 1);
    char args[64];
    snprintf(args, sizeof args, "show %llu", (unsigned long long)id);
    assert_int_equal(ctl(fx, out, sizeof out, args), 0);
    assert_non_null(strstr(out, "progress    30.0% (step 3 of 10) at "));

    tp_gate_set(&fx->step, true);
    json_decref(wait_progress(fx, id, 600, "sechs \xc3\xa9tapes"));
    assert_int_equal(ctl(fx, out, sizeof out, args), 0);
    assert_non_null(strstr(out, "progress    60.0% (sechs \xc3\xa9tapes)"));
    atomic_store(&fx->phase, 3);
    json_decref(wait_progress(fx, id, 1000, ""));
    assert_true(tp_daemon_stat(&fx->d, "tasks.progress_total") >= 3);
    atomic_store(&fx->phase, 5);

    tp_rows_wait_state(&fx->db, id, 2, WAIT_MS); /* the next line asserts the state */
    o = get_task(fx, id);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "SUCCESSFUL");
    assert_true(json_is_null(json_object_get(o, "progress")));
    json_decref(o);
    assert_int_equal(atomic_load(&fx->report_rc), 0);
    fx->passed = true;
}

/* ---- raw clients ---- */

struct raw {
    int fd;
    proto_task task; /* the delivery it got (payload not kept) */
};

/* Connects, says HELLO in version (capacity 1, type "raw"), reads WELCOME. */
static void raw_open(struct fx *fx, struct raw *r, uint16_t version)
{
    r->fd = tp_raw_connect(fx->d.listen, 30);
    assert_true(r->fd >= 0);
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.u.hello.version = version;
    m.u.hello.capacity = 1;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"raw", 3};
    m.u.hello.ntypes = 1;
    m.u.hello.types[0] = (proto_bytes){(const uint8_t *)"raw", 3};
    assert_int_equal(tp_raw_send_msg(r->fd, &m), 0);
    uint8_t buf[4096];
    long n = tp_raw_read_frame(r->fd, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_WELCOME);
    assert_int_equal(m.u.welcome.version, version);
}

/* Reads frames until a TASK comes (CONFIRMs and the like are skipped). */
static void raw_take_task(struct raw *r)
{
    uint8_t buf[4096];
    proto_msg m;
    for (int i = 0; i < 100; i++) {
        long n = tp_raw_read_frame(r->fd, buf, sizeof buf);
        assert_true(n > 0);
        assert_int_equal(proto_msg_decode(buf, (size_t)n, &m), PROTO_OK);
        if (m.type == PROTO_TASK) {
            r->task = m.u.task;
            r->task.type.ptr = NULL;
            r->task.payload.ptr = NULL;
            return;
        }
    }
    fail_msg("no TASK");
}

static void raw_send_progress(struct raw *r, uint64_t id, uint32_t epoch, uint32_t attempt, uint16_t permille,
                              const char *msg)
{
    proto_msg m = {.type = PROTO_PROGRESS};
    m.u.progress.task_id = id;
    m.u.progress.epoch = epoch;
    m.u.progress.attempt = attempt;
    m.u.progress.permille = permille;
    m.u.progress.message = (proto_bytes){(const uint8_t *)msg, strlen(msg)};
    assert_int_equal(tp_raw_send_msg(r->fd, &m), 0);
}

/* A PROGRESS body built byte by byte (the encoder refuses what is tested here). */
static void raw_send_bytes_progress(struct raw *r, uint16_t permille, uint16_t msg_len, const void *msg, size_t n)
{
    uint8_t f[4 + 21 + 300];
    size_t body = 21 + n;
    f[0] = 0, f[1] = 0, f[2] = (uint8_t)(body >> 8), f[3] = (uint8_t)body;
    uint8_t *b = f + 4;
    b[0] = PROTO_PROGRESS;
    for (int i = 0; i < 8; i++)
        b[1 + i] = (uint8_t)(r->task.task_id >> (56 - 8 * i));
    for (int i = 0; i < 4; i++) {
        b[9 + i] = (uint8_t)(r->task.epoch >> (24 - 8 * i));
        b[13 + i] = (uint8_t)(r->task.attempt >> (24 - 8 * i));
    }
    b[17] = (uint8_t)(permille >> 8), b[18] = (uint8_t)permille;
    b[19] = (uint8_t)(msg_len >> 8), b[20] = (uint8_t)msg_len;
    memcpy(b + 21, msg, n);
    assert_int_equal(tp_raw_send(r->fd, f, 4 + body), 0);
}

/* Expects ERROR code and then the end of the connection. */
static void raw_expect_error_close(struct raw *r, uint16_t code, const char *what)
{
    uint8_t buf[4096];
    proto_msg m;
    long n;
    int got = -1;
    while ((n = tp_raw_read_frame(r->fd, buf, sizeof buf)) > 0)
        if (proto_msg_decode(buf, (size_t)n, &m) == PROTO_OK && m.type == PROTO_ERROR)
            got = m.u.error.code;
    printf("# %s: ERROR %d, then closed\n", what, got);
    if (got != code)
        fail_msg("%s: ERROR %d, want %u and a close", what, got, code);
    close(r->fd);
    r->fd = -1;
}

static void raw_done(struct raw *r)
{
    proto_msg m = {.type = PROTO_DONE};
    m.u.done.task_id = r->task.task_id;
    m.u.done.epoch = r->task.epoch;
    m.u.done.attempt = r->task.attempt;
    m.u.done.outcome = PROTO_OUTCOME_SUCCESS;
    m.u.done.data = (proto_bytes){(const uint8_t *)"ok", 2};
    assert_int_equal(tp_raw_send_msg(r->fd, &m), 0);
}

static void wait_state(struct fx *fx, uint64_t id, uint64_t state)
{
    assert_true(tp_rows_wait_state(&fx->db, id, state, WAIT_MS));
}

/* One bad PROGRESS on a fresh connection that holds a task: ERROR code and a close; the
 * task goes back (to NEW, then to the next connection). */
static void bad_progress_closes(struct fx *fx, const char *what, uint16_t permille, uint16_t msg_len,
                                const void *msg, size_t n)
{
    struct raw r;
    raw_open(fx, &r, PROTO_VERSION);
    raw_take_task(&r);
    long long bad = tp_daemon_stat(&fx->d, "connections.bad_frames_total");
    raw_send_bytes_progress(&r, permille, msg_len, msg, n);
    raw_expect_error_close(&r, PROTO_ERR_BAD_FRAME, what);
    assert_true(tp_daemon_stat(&fx->d, "connections.bad_frames_total") > bad);
}

static void raw_rules(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "progress_raw");
    uint64_t id = insert_task(fx, "raw");

    struct raw r;
    raw_open(fx, &r, PROTO_VERSION);
    raw_take_task(&r);
    assert_int_equal(r.task.task_id, id);
    long long ignored = tp_daemon_stat(&fx->d, "tasks.progress_ignored_total");
    raw_send_progress(&r, id + 1000, r.task.epoch, r.task.attempt, 10, "unknown task");
    raw_send_progress(&r, id, r.task.epoch, r.task.attempt + 1, 20, "another attempt");
    raw_send_progress(&r, id, r.task.epoch + 1, r.task.attempt, 30, "another epoch");
    raw_send_progress(&r, id, r.task.epoch, r.task.attempt, 420, "held");
    json_decref(wait_progress(fx, id, 420, "held"));
    assert_int_equal(tp_daemon_stat(&fx->d, "tasks.progress_ignored_total"), ignored + 3);
    /* Bounds: 1000 and a message of 256 bytes are taken. */
    char max_msg[PROTO_MAX_PROGRESS_MSG + 1];
    memset(max_msg, 'm', PROTO_MAX_PROGRESS_MSG);
    max_msg[PROTO_MAX_PROGRESS_MSG] = '\0';
    raw_send_progress(&r, id, r.task.epoch, r.task.attempt, 1000, max_msg);
    json_decref(wait_progress(fx, id, 1000, max_msg));
    raw_done(&r);
    wait_state(fx, id, 2);
    close(r.fd);

    /* Each bad frame on a connection of its own, holding a task. */
    char long_msg[PROTO_MAX_PROGRESS_MSG + 1];
    memset(long_msg, 'a', sizeof long_msg);
    insert_task(fx, "raw");
    bad_progress_closes(fx, "permille 1001", 1001, 0, "", 0);
    bad_progress_closes(fx, "permille 65535", 65535, 0, "", 0);
    bad_progress_closes(fx, "a message of 257 bytes", 0, 257, long_msg, 257);
    bad_progress_closes(fx, "a message not UTF-8", 0, 2, "\xc3\x28", 2);
    bad_progress_closes(fx, "an overlong UTF-8 form", 0, 2, "\xc0\xaf", 2);
    bad_progress_closes(fx, "a surrogate", 0, 3, "\xed\xa0\x80", 3);
    bad_progress_closes(fx, "a NUL in the message", 0, 3, "a\0b", 3);
    bad_progress_closes(fx, "a length past the end", 0, 10, "abc", 3);
    bad_progress_closes(fx, "a byte after the message", 0, 2, "abc", 3);

    /* A version-3 session has no PROGRESS. */
    raw_open(fx, &r, 3);
    raw_take_task(&r);
    raw_send_progress(&r, r.task.task_id, r.task.epoch, r.task.attempt, 1, "v3");
    raw_expect_error_close(&r, PROTO_ERR_UNEXPECTED, "PROGRESS in a version-3 session");
    fx->passed = true;
}

static void v3_client(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "progress_v3");
    uint64_t id = insert_task(fx, "raw");
    struct raw r;
    raw_open(fx, &r, 3);
    raw_take_task(&r);
    assert_int_equal(r.task.task_id, id);
    raw_done(&r);
    wait_state(fx, id, 2);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT attempts FROM task WHERE task_id = %llu",
                                         (unsigned long long)id), 1);
    close(r.fd);
    fx->passed = true;
}

/* ---- stored, new_dispatcher ---- */

struct reporter {
    struct fx *fx;
    atomic_int reports;    /* tp_task_progress calls that returned 0 */
    atomic_int finished;   /* handlers past their reports, waiting at the gate */
    atomic_llong first_ms, last_ms;
    int rounds;            /* reports per task */
};

static int on_reporting(tp_task *t, void *arg)
{
    struct reporter *r = arg;
    long long zero = 0;
    atomic_compare_exchange_strong(&r->first_ms, &zero, tp_mono_ms());
    for (int i = 1; i <= r->rounds && !tp_task_cancelled(t); i++) {
        char msg[64];
        snprintf(msg, sizeof msg, "report %d of %d", i, r->rounds);
        if (tp_task_progress(t, (unsigned)(i * 1000 / r->rounds), msg) == TP_OK)
            atomic_fetch_add(&r->reports, 1);
        tp_sleep_ms(5);
    }
    atomic_store(&r->last_ms, tp_mono_ms());
    atomic_fetch_add(&r->finished, 1);
    tp_gate_pass(&r->fx->step);
    return TP_SUCCESS;
}

static uint64_t q64(struct fx *fx, const char *sql)
{
    return tp_testdb_query_u64(&fx->db, "%s", sql);
}

static void wait_q64(struct fx *fx, const char *sql, uint64_t want)
{
    long long end = tp_mono_ms() + WAIT_MS;
    uint64_t got;
    while ((got = q64(fx, sql)) != want && tp_mono_ms() < end)
        tp_sleep_ms(POLL_MS);
    if (got != want)
        fail_msg("%s: %llu, want %llu", sql, (unsigned long long)got, (unsigned long long)want);
}

static void stored(void **state)
{
    struct fx *fx = *state;
    static struct reporter r;
    memset(&r, 0, sizeof r);
    r.fx = fx;
    r.rounds = 400;
    fx_start(fx, "progress_stored");
    uint64_t a = insert_task(fx, "rep"), b = insert_task(fx, "rep");
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "reporter", 2, "rep", on_reporting, &r);
    assert_non_null(fx->w);
    long long end = tp_mono_ms() + WAIT_MS;
    while (atomic_load(&r.finished) < 2 && tp_mono_ms() < end)
        tp_sleep_ms(POLL_MS);
    assert_int_equal(atomic_load(&r.finished), 2);
    /* The last reports reach the table within a second or so. */
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM task_progress WHERE permille = 1000 AND message = "
                              "'report 400 of 400' AND task_id IN (%llu, %llu)",
             (unsigned long long)a, (unsigned long long)b);
    wait_q64(fx, sql, 2);
    long long elapsed_ms = atomic_load(&r.last_ms) - atomic_load(&r.first_ms);
    long long written = tp_daemon_stat(&fx->d, "db.progress_rows_written_total");
    long long received = tp_daemon_stat(&fx->d, "tasks.progress_total");
    /* Per task: one write a second while it reports, and the last one after (+ 2), and
     * three seconds of slack for frames delayed on a loaded machine (+ 3). */
    long long bound = 2 * (elapsed_ms / 1000 + 5);
    printf("# %d reports sent over %lld ms, %lld received, %lld rows written (bound %lld)\n",
           atomic_load(&r.reports), elapsed_ms, received, written, bound);
    assert_int_equal(atomic_load(&r.reports), 800);
    assert_true(written >= 2);
    assert_true(written <= bound);
    assert_true(written * 10 <= received);
    json_t *o = get_task(fx, a);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "progress"), "from")), "dispatcher");
    json_decref(o);

    /* The tasks end: their rows go. */
    tp_gate_set(&fx->step, true);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM task WHERE task_state = 2 AND task_id IN (%llu, %llu)",
             (unsigned long long)a, (unsigned long long)b);
    wait_q64(fx, sql, 2);
    wait_q64(fx, "SELECT COUNT(*) FROM task_progress", 0);
    assert_true(tp_daemon_stat(&fx->d, "db.progress_rows_deleted_total") >= 2);
    fx->passed = true;
}

static void new_dispatcher(void **state)
{
    struct fx *fx = *state;
    static struct reporter r;
    memset(&r, 0, sizeof r);
    r.fx = fx;
    r.rounds = 3;
    fx_start(fx, "progress_newdsp");
    uint64_t id = insert_task(fx, "rep");
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "reporter", 1, "rep", on_reporting, &r);
    assert_non_null(fx->w);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM task_progress WHERE task_id = %llu AND permille = 1000",
             (unsigned long long)id);
    wait_q64(fx, sql, 1);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGKILL, 5000), 128 + SIGKILL);
    unlink(fx->d.log_path);

    /* Another dispatcher on the table: the row is still PROCESSING (nobody recovers it
     * for a minute), and it shows the report stored. */
    const char *const extra[] = {"--adopt-grace-ms", "60000", NULL};
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, extra), 0);
    json_t *o = NULL;
    long long end = tp_mono_ms() + WAIT_MS;
    for (; tp_mono_ms() < end; tp_sleep_ms(POLL_MS)) {
        json_decref(o);
        o = get_task(fx, id);
        if (json_is_object(json_object_get(o, "progress")))
            break;
    }
    json_t *p = json_object_get(o, "progress");
    assert_string_equal(json_string_value(json_object_get(o, "state")), "PROCESSING");
    assert_int_equal(json_integer_value(json_object_get(p, "permille")), 1000);
    assert_string_equal(json_string_value(json_object_get(p, "message")), "report 3 of 3");
    assert_string_equal(json_string_value(json_object_get(p, "from")), "table");
    json_decref(o);
    char out[8192], args[64];
    snprintf(args, sizeof args, "show %llu", (unsigned long long)id);
    assert_int_equal(ctl(fx, out, sizeof out, args), 0);
    assert_non_null(strstr(out, "progress    100.0% (report 3 of 3) at "));
    fx->passed = true;
}

/* ---- exec_worker ---- */

extern char **environ;

static void exec_worker(void **state)
{
    struct fx *fx = *state;
    char mark[128], cmd[512];
    fx_start(fx, "progress_exec");
    snprintf(mark, sizeof mark, "/tmp/tp-progress-exec-%ld", (long)getpid());
    unlink(mark);
    snprintf(cmd, sizeof cmd,
             "echo \"progress 420 half way\" >&$TASKPUSH_PROGRESS_FD; "
             "while [ ! -e %s ]; do sleep 0.02; done; echo done", mark);
    const char *argv[] = {tp_build_path("worker-client/taskpush-worker"), "--connect", fx->d.listen,
                          "--type", "ex", "--exec", cmd, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, argv[0], NULL, NULL, (char *const *)argv, environ), 0);
    uint64_t id = insert_task(fx, "ex");
    json_t *o = wait_progress(fx, id, 420, "half way");
    json_decref(o);
    FILE *f = fopen(mark, "w");
    assert_non_null(f);
    fclose(f);
    wait_state(fx, id, 2);
    unlink(mark);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fx->passed = true;
}

/* ---- keys_busiest ---- */

static int on_held(tp_task *t, void *arg)
{
    struct fx *fx = arg;
    size_t n = 0;
    const void *p = tp_task_payload(t, &n);
    if (n == 5 && memcmp(p, "nokey", 5) == 0)
        atomic_fetch_add(&fx->held_keyless, 1);
    tp_gate_pass(&fx->step);
    return TP_SUCCESS;
}

/* The entry of type in a GET /keys answer, or NULL. */
static json_t *keys_type(json_t *o, const char *type)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(o, "types"), i, e) {
        const char *t = json_string_value(json_object_get(e, "type"));
        if (t && strcmp(t, type) == 0)
            return e;
    }
    return NULL;
}

static long long key_field(json_t *k, const char *f)
{
    return (long long)json_integer_value(json_object_get(k, f));
}

/* Whether /keys shows, for type kt, the keys in order with these totals (running +
 * buffered + waiting), and running in all as given (-1: any). */
static bool keys_match(json_t *o, const char *const *names, const long long *totals, int n, long long running)
{
    json_t *e = keys_type(o, "kt");
    json_t *keys = json_object_get(e, "keys");
    long long run = 0;
    if (!e || json_array_size(keys) < (size_t)n)
        return false;
    for (int i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, (size_t)i);
        const char *name = json_string_value(json_object_get(k, "key"));
        long long total = key_field(k, "running") + key_field(k, "buffered") + key_field(k, "waiting");
        if (!name || strcmp(name, names[i]) != 0 || total != totals[i])
            return false;
    }
    for (size_t i = 0; i < json_array_size(keys); i++)
        run += key_field(json_array_get(keys, i), "running");
    return running < 0 || (run == running && key_field(e, "running") == running);
}

static void keys_busiest(void **state)
{
    struct fx *fx = *state;
    const char *const extra[] = {"--table-stats-ms", "200", NULL};
    static const char *const names[] = {"a", "b", "c"};
    static const long long totals[] = {30, 20, 10};
    fx_start_with(fx, "progress_keys", extra);
    assert_int_equal(tp_testdb_exec(&fx->db,
                                    "INSERT INTO task (task_type, payload, group_key) SELECT 'kt', 'x', "
                                    "IF(seq < 30, 'a', IF(seq < 50, 'b', 'c')) FROM seq_0_to_59"),
                     60);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload, group_key) VALUES "
                                             "('kt', 'x', X'ff00')"), 1);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) SELECT 'kt', 'nokey' "
                                             "FROM seq_0_to_4"), 5);
    printf("# keys: a %llu, b %llu, c %llu\n",
           (unsigned long long)tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE group_key = 'a'"),
           (unsigned long long)tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE group_key = 'b'"),
           (unsigned long long)tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE group_key = 'c'"));

    /* No worker: everything waits in the table. */
    json_t *o = NULL;
    long long end = tp_mono_ms() + WAIT_MS;
    for (; tp_mono_ms() < end; tp_sleep_ms(POLL_MS)) {
        json_decref(o);
        o = tp_daemon_json(&fx->d, "/keys");
        if (keys_match(o, names, totals, 3, 0))
            break;
    }
    char *dump = json_dumps(o, JSON_COMPACT);
    printf("# GET /keys: %s\n", dump ? dump : "?");
    free(dump);
    assert_true(keys_match(o, names, totals, 3, 0));
    json_t *kt = keys_type(o, "kt");
    assert_int_equal(json_array_size(json_object_get(kt, "keys")), 4);
    json_t *bin = json_array_get(json_object_get(kt, "keys"), 3);
    assert_true(json_is_null(json_object_get(bin, "key")));
    assert_string_equal(json_string_value(json_object_get(bin, "key_hex")), "ff00");
    assert_int_equal(key_field(bin, "waiting"), 1);
    assert_false(json_is_true(json_object_get(kt, "waiting_sampled")));
    json_decref(o);
    o = NULL;

    /* A worker of 3 slots, held in its handlers. The keyless rows take their turns too
     * (docs/taskpushd.md, fair share): /keys counts the keyed ones running. */
    fx->w = tp_inproc_start_one(&fx->run, fx->d.listen, "holder", 3, "kt", on_held, fx);
    assert_non_null(fx->w);
    long long keyed_running = -1;
    end = tp_mono_ms() + WAIT_MS;
    for (; tp_mono_ms() < end; tp_sleep_ms(POLL_MS)) {
        json_decref(o);
        o = tp_daemon_json(&fx->d, "/keys");
        keyed_running = 3 - atomic_load(&fx->held_keyless);
        if (tp_gate_waiting(&fx->step) == 3 && keys_match(o, names, totals, 3, -1) &&
            key_field(keys_type(o, "kt"), "running") == keyed_running)
            break;
    }
    dump = json_dumps(o, JSON_COMPACT);
    printf("# GET /keys with 3 running (%lld keyed): %s\n", keyed_running, dump ? dump : "?");
    free(dump);
    assert_int_equal(tp_gate_waiting(&fx->step), 3);
    assert_true(keys_match(o, names, totals, 3, -1));
    assert_int_equal(key_field(keys_type(o, "kt"), "running"), keyed_running);
    json_decref(o);

    o = tp_daemon_json(&fx->d, "/keys?top=2");
    assert_int_equal(json_array_size(json_object_get(keys_type(o, "kt"), "keys")), 2);
    json_decref(o);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/keys?top=0", NULL), 400);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/keys?top=101", NULL), 400);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/keys?top=x", NULL), 400);
    tp_gate_set(&fx->step, true);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(worker_reports, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(raw_rules, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(v3_client, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(stored, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(new_dispatcher, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(exec_worker, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(keys_busiest, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
