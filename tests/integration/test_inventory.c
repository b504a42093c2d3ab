/* test_inventory: workers follow the leader with their inventory (protocol version 3,
 * proto/PROTOCOL.md section 10; docs/worker.md "Across a failover"), end to end with real
 * taskpushd processes, the real MariaDB, and libtaskpush workers on threads of this
 * process whose handlers count every execution of every task (by its payload "p<k>").
 *
 *   1. kill -9 of the one dispatcher while the workers hold long tasks, then a restart
 *      on the same port: every task ends SUCCESSFUL, none ran twice, and the restarted
 *      dispatcher adopted the running ones (adopted + foreign outcomes = every task).
 *   2. a leader and a standby, workers given both addresses: kill -9 of the leader while
 *      tasks run: the standby leads, the workers declare, none ran twice, results land.
 *   3. the tasks finish while the dispatcher is down: their outcomes are kept, sent again
 *      to the restarted dispatcher and written once (foreign outcomes), none ran twice.
 *   4. a worker that does not come back: after --adopt-grace-ms its rows are recovered
 *      and run by another worker; nothing is stranded, nothing adopted.
 *   5. a raw-protocol client: HOLDING entries naming a task that does not exist, another
 *      epoch or a wrong attempt are CANCELled and change no row; a right one is adopted
 *      (the row moves to the leader's epoch), refused to a second connection, and its
 *      DONE is written and CONFIRMed; a DONE naming a wrong attempt is CONFIRMed and
 *      changes nothing; a version-2 session that sends HOLDING is closed with ERROR
 *      UNEXPECTED.
 *
 * Nothing here asserts a duration: waits are bounded generously, and the times are only
 * printed.
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
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "proto.h"
#include "raw.h"
#include "rows.h"
#include "tap.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 60000   /* the longest a batch of tasks is waited for */
#define NTASKS 8        /* tasks per case: every one in flight at once (2 workers x CAP) */
#define CAP 4
#define LONG_MS 4000    /* a handler that straddles a kill and a restart */
#define MAX_TASKS 64

struct fx;

typedef struct iworker {
    struct fx *fx;
    tp_worker *w;
    tp_inproc run;
} iworker;

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d[2];
    iworker iw[3];
    int run_ms;                     /* each handler's run */
    _Atomic int started, finished;  /* handlers begun, ended (all workers) */
    _Atomic int execs[MAX_TASKS];   /* executions of task p<k> */
    _Atomic int by_last[MAX_TASKS]; /* executions of p<k> by worker 2 (case 4) */
    long long t0;
};

/* A progress line on stderr, stamped with the time since the case began (tap.h). */
#define note(fx, ...) tp_note((fx)->t0, __VA_ARGS__)

/* The k of a payload "p<k>", or -1. */
static int payload_index(tp_task *task)
{
    size_t len = 0;
    const char *p = tp_task_payload(task, &len);
    char buf[16];
    if (!p || len < 2 || len >= sizeof buf || p[0] != 'p')
        return -1;
    memcpy(buf, p + 1, len - 1);
    buf[len - 1] = '\0';
    int k = atoi(buf);
    return k >= 0 && k < MAX_TASKS ? k : -1;
}

/* Counts the execution, then runs fx->run_ms unless cancelled. */
static int handler(tp_task *task, void *arg)
{
    iworker *iw = arg;
    struct fx *fx = iw->fx;
    int k = payload_index(task);
    if (k >= 0) {
        atomic_fetch_add(&fx->execs[k], 1);
        if (iw == &fx->iw[2])
            atomic_fetch_add(&fx->by_last[k], 1);
    }
    atomic_fetch_add(&fx->started, 1);
    long long end = tp_mono_ms() + fx->run_ms;
    while (tp_mono_ms() < end && !tp_task_cancelled(task))
        tp_sleep_ms(20);
    atomic_fetch_add(&fx->finished, 1);
    if (tp_task_cancelled(task))
        return TP_FAIL;
    return tp_task_set_result(task, "done", 4) < 0 ? TP_FAIL : TP_SUCCESS;
}

static void quiet_log(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    (void)msg; /* reconnects are expected here */
}

static void iw_start(struct fx *fx, int i, const char *addresses)
{
    iworker *iw = &fx->iw[i];
    tp_worker_options o;
    tp_error err;
    char name[32];

    iw->fx = fx;
    tp_worker_options_init(&o);
    o.addresses = addresses;
    o.capacity = CAP;
    o.threads = CAP;
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 200;
    snprintf(name, sizeof name, "inv-%d", i);
    o.name = name;
    o.log = quiet_log;
    o.log_level = TP_LOG_ERROR;
    iw->w = tp_worker_new(&o, &err);
    if (!iw->w)
        fail_msg("tp_worker_new: %s", err.text);
    assert_int_equal(tp_worker_add_type(iw->w, "inv", handler, iw), 0);
    assert_int_equal(tp_inproc_start(&iw->run, iw->w), 0);
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    fx->t0 = tp_mono_ms();
    fx->run_ms = LONG_MS;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i < 2; i++)
        if (fx->d[i].pid > 0)
            tp_daemon_stop(&fx->d[i], SIGKILL, 5000);
    for (int i = 0; i < 3; i++) {
        if (fx->iw[i].run.running)
            tp_inproc_halt(&fx->iw[i].run);
        if (fx->iw[i].w)
            tp_worker_free(fx->iw[i].w);
    }
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

static void make_db(struct fx *fx, const char *tag)
{
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
}

static void start_daemon(struct fx *fx, int k, const char *const *extra)
{
    if (tp_daemon_start(&fx->d[k], fx->db.url, extra) != 0)
        fail_msg("taskpushd %d did not start", k);
}

/* Restarts daemon k (killed) on the ports it had, so that its workers find it again. */
static void restart_daemon(struct fx *fx, int k, const char *grace)
{
    char listen[128], admin[128];
    snprintf(listen, sizeof listen, "%s", fx->d[k].listen);
    snprintf(admin, sizeof admin, "%s", fx->d[k].admin);
    const char *extra[] = {"--listen", listen, "--admin", admin, "--adopt-grace-ms", grace, NULL};
    start_daemon(fx, k, extra);
}

static void wait_until(struct fx *fx, _Atomic int *v, int want, const char *what)
{
    long long end = tp_mono_ms() + WAIT_MS;
    while (atomic_load(v) < want) {
        if (tp_mono_ms() > end)
            fail_msg("%s: %d of %d", what, atomic_load(v), want);
        tp_sleep_ms(10);
    }
    note(fx, "%s: %d", what, want);
}

static void wait_successful(struct fx *fx, const char *type, int n, int k)
{
    uint64_t last = 0;
    if (!tp_rows_wait(&fx->db, type, 2, (uint64_t)n, WAIT_MS, 50, &last)) {
        tp_daemon_dump_log(&fx->d[k]);
        fail_msg("%" PRIu64 " of %d rows SUCCESSFUL", last, n);
    }
    note(fx, "%d rows SUCCESSFUL", n);
}

/* Every task of the case ran exactly once. */
static void assert_once(struct fx *fx, int n)
{
    int twice = 0;
    for (int k = 0; k < n; k++) {
        int e = atomic_load(&fx->execs[k]);
        if (e != 1)
            fprintf(stderr, "# task p%d ran %d times\n", k, e);
        twice += e > 1;
        assert_true(e >= 1);
    }
    note(fx, "%d task(s) ran more than once", twice);
    assert_int_equal(twice, 0);
}

static void kill9(struct fx *fx, int k)
{
    assert_int_equal(kill(fx->d[k].pid, SIGKILL), 0);
    tp_daemon_stop(&fx->d[k], 0, 5000); /* reaps it */
    note(fx, "taskpushd %d killed", k);
}

/* 1. One dispatcher, killed and restarted while the tasks run. */
static void test_restart_adopts(void **state)
{
    struct fx *fx = *state;
    make_db(fx, "inv_restart");
    start_daemon(fx, 0, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    iw_start(fx, 0, fx->d[0].listen);
    iw_start(fx, 1, fx->d[0].listen);
    assert_int_equal(tp_rows_insert(&fx->db, "inv", NTASKS, true), 0);
    wait_until(fx, &fx->started, NTASKS, "handlers started");

    kill9(fx, 0);
    restart_daemon(fx, 0, "3000");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    note(fx, "restarted and leading");
    wait_successful(fx, "inv", NTASKS, 0);
    assert_once(fx, NTASKS);

    long long adopted = tp_daemon_stat(&fx->d[0], "tasks.adopted_total");
    long long foreign = tp_daemon_stat(&fx->d[0], "tasks.foreign_written_total");
    note(fx, "adopted %lld, foreign outcomes written %lld", adopted, foreign);
    /* Each task was either adopted while running, or (a slow restart) finished and its
     * kept outcome was written: nothing was recovered and run again. */
    assert_int_equal(adopted + foreign, NTASKS);
    assert_true(adopted >= 1);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.adopt_refused_total"), 0);
    tp_worker_stats ws;
    assert_int_equal(tp_worker_get_stats(fx->iw[0].w, &ws, sizeof ws), 0);
    note(fx, "worker 0: carried %llu, confirmed %llu, resent %llu", (unsigned long long)ws.tasks_carried,
         (unsigned long long)ws.outcomes_confirmed, (unsigned long long)ws.outcomes_resent);
    assert_true(ws.tasks_carried >= 1);
}

/* 2. Leader and standby, workers given both addresses; kill -9 of the leader. */
static void test_standby_adopts(void **state)
{
    struct fx *fx = *state;
    char ab[300], ba[300];
    make_db(fx, "inv_standby");
    start_daemon(fx, 0, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    start_daemon(fx, 1, NULL);
    snprintf(ab, sizeof ab, "%s,%s", fx->d[0].listen, fx->d[1].listen);
    snprintf(ba, sizeof ba, "%s,%s", fx->d[1].listen, fx->d[0].listen);
    iw_start(fx, 0, ab);
    iw_start(fx, 1, ba);
    assert_int_equal(tp_rows_insert(&fx->db, "inv", NTASKS, true), 0);
    wait_until(fx, &fx->started, NTASKS, "handlers started on the leader");

    kill9(fx, 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[1], 20000), 0);
    note(fx, "the standby leads");
    wait_successful(fx, "inv", NTASKS, 1);
    assert_once(fx, NTASKS);
    long long adopted = tp_daemon_stat(&fx->d[1], "tasks.adopted_total");
    long long foreign = tp_daemon_stat(&fx->d[1], "tasks.foreign_written_total");
    note(fx, "adopted %lld, foreign outcomes written %lld", adopted, foreign);
    assert_int_equal(adopted + foreign, NTASKS);
    assert_true(adopted >= 1);
}

/* 3. The tasks finish while the dispatcher is down. */
static void test_outcomes_resent(void **state)
{
    struct fx *fx = *state;
    fx->run_ms = 1500;
    make_db(fx, "inv_resent");
    start_daemon(fx, 0, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    iw_start(fx, 0, fx->d[0].listen);
    iw_start(fx, 1, fx->d[0].listen);
    assert_int_equal(tp_rows_insert(&fx->db, "inv", NTASKS, true), 0);
    wait_until(fx, &fx->started, NTASKS, "handlers started");

    kill9(fx, 0);
    wait_until(fx, &fx->finished, NTASKS, "handlers finished, the dispatcher down");
    assert_int_equal(tp_rows_count(&fx->db, "inv", 1), NTASKS); /* nothing written yet */
    restart_daemon(fx, 0, "3000");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    wait_successful(fx, "inv", NTASKS, 0);
    assert_once(fx, NTASKS);
    long long foreign = tp_daemon_stat(&fx->d[0], "tasks.foreign_written_total");
    note(fx, "foreign outcomes written %lld, ignored %lld", foreign,
         tp_daemon_stat(&fx->d[0], "tasks.foreign_ignored_total"));
    assert_int_equal(foreign, NTASKS);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.adopted_total"), 0);
    /* The worker forgets them once confirmed. */
    long long end = tp_mono_ms() + WAIT_MS;
    tp_worker_stats a, b;
    do {
        assert_int_equal(tp_worker_get_stats(fx->iw[0].w, &a, sizeof a), 0);
        assert_int_equal(tp_worker_get_stats(fx->iw[1].w, &b, sizeof b), 0);
        if (a.outcomes_confirmed + b.outcomes_confirmed >= NTASKS)
            break;
        tp_sleep_ms(20);
    } while (tp_mono_ms() < end);
    note(fx, "outcomes resent %llu, confirmed %llu", (unsigned long long)(a.outcomes_resent + b.outcomes_resent),
         (unsigned long long)(a.outcomes_confirmed + b.outcomes_confirmed));
    assert_true(a.outcomes_resent + b.outcomes_resent >= NTASKS);
    assert_true(a.outcomes_confirmed + b.outcomes_confirmed >= NTASKS);
}

/* 4. A worker that does not come back: its rows are recovered after the grace. */
static void test_lost_worker_recovered(void **state)
{
    struct fx *fx = *state;
    fx->run_ms = 30000; /* only a cancel ends these */
    make_db(fx, "inv_lost");
    start_daemon(fx, 0, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    iw_start(fx, 0, fx->d[0].listen);
    assert_int_equal(tp_rows_insert(&fx->db, "inv", CAP, true), 0);
    wait_until(fx, &fx->started, CAP, "handlers started");

    kill9(fx, 0);
    tp_inproc_halt(&fx->iw[0].run); /* stops for good: cancels what it carried */
    note(fx, "worker 0 stopped");
    fx->run_ms = 50;
    restart_daemon(fx, 0, "1500");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    iw_start(fx, 2, fx->d[0].listen);
    wait_successful(fx, "inv", CAP, 0);
    for (int k = 0; k < CAP; k++)
        assert_int_equal(atomic_load(&fx->by_last[k]), 1);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.adopted_total"), 0);
    assert_true(tp_daemon_log_count(&fx->d[0], "left PROCESSING by earlier dispatchers") >= 1);
}

/* ---- 5. raw-protocol peers ---- */

static void send_msg(int fd, const proto_msg *m)
{
    uint8_t buf[4096];
    size_t n = proto_msg_encode(m, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void send_hello(int fd, uint16_t version)
{
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = version;
    m.u.hello.capacity = 4;
    m.u.hello.name.ptr = (const uint8_t *)"raw-inv";
    m.u.hello.name.len = 7;
    m.u.hello.ntypes = 1;
    m.u.hello.types[0].ptr = (const uint8_t *)"inv5";
    m.u.hello.types[0].len = 4;
    send_msg(fd, &m);
}

typedef struct rawconn {
    int fd;
    uint8_t buf[65536];
    size_t len;
    size_t used; /* bytes of the frame read_frame returned last */
} rawconn;

/* Reads the next frame that is not a HEARTBEAT into *m (borrowing rc->buf until the next
 * call); fails at EOF or after the receive timeout. */
static void read_frame(rawconn *rc, proto_msg *m)
{
    if (rc->used) { /* drop the frame returned last time */
        memmove(rc->buf, rc->buf + rc->used, rc->len - rc->used);
        rc->len -= rc->used;
        rc->used = 0;
    }
    for (;;) {
        uint32_t body = 0;
        int st = proto_frame_check(rc->buf, rc->len, sizeof rc->buf - PROTO_LEN_PREFIX, &body);
        if (st == PROTO_OK) {
            assert_int_equal(proto_msg_decode(rc->buf + PROTO_LEN_PREFIX, body, m), PROTO_OK);
            rc->used = PROTO_LEN_PREFIX + body;
            if (m->type != PROTO_HEARTBEAT)
                return;
            memmove(rc->buf, rc->buf + rc->used, rc->len - rc->used);
            rc->len -= rc->used;
            rc->used = 0;
            continue;
        }
        assert_int_equal(st, PROTO_NEED_MORE);
        ssize_t r = recv(rc->fd, rc->buf + rc->len, sizeof rc->buf - rc->len, 0);
        if (r <= 0)
            fail_msg("the connection ended (%zd) before a frame", r);
        rc->len += (size_t)r;
    }
}

static void send_list(int fd, uint8_t type, const proto_dlv *d, uint16_t n)
{
    proto_msg m = {.type = type};
    m.u.holding.n = n;
    m.u.holding.items = d;
    send_msg(fd, &m);
}

static void send_done(int fd, uint64_t id, uint32_t epoch, uint32_t attempt)
{
    proto_msg m = {.type = PROTO_DONE};
    m.u.done.task_id = id;
    m.u.done.epoch = epoch;
    m.u.done.attempt = attempt;
    m.u.done.outcome = PROTO_OUTCOME_SUCCESS;
    m.u.done.data.ptr = (const uint8_t *)"raw";
    m.u.done.data.len = 3;
    send_msg(fd, &m);
}

/* The row's state, epoch and attempts as "s/e/a". */
static void row_of(struct fx *fx, uint64_t id, char *out, size_t cap)
{
    snprintf(out, cap, "%" PRIu64 "/%" PRIu64 "/%" PRIu64,
             tp_rows_state(&fx->db, id),
             tp_testdb_query_u64(&fx->db, "SELECT epoch FROM task WHERE task_id = %" PRIu64, id),
             tp_testdb_query_u64(&fx->db, "SELECT attempts FROM task WHERE task_id = %" PRIu64, id));
}

/* Reads frames until a CONFIRM naming (id, epoch, attempt); fails on anything else but
 * a CONFIRM. */
static void expect_confirm(rawconn *rc, uint64_t id, uint32_t epoch, uint32_t attempt)
{
    for (;;) {
        proto_msg m;
        read_frame(rc, &m);
        assert_int_equal(m.type, PROTO_CONFIRM);
        for (uint16_t i = 0; i < m.u.confirm.n; i++) {
            proto_dlv d;
            proto_dlv_at(&m.u.confirm, i, &d);
            if (d.task_id == id && d.epoch == epoch && d.attempt == attempt)
                return;
        }
    }
}

static void test_hostile_inventory(void **state)
{
    struct fx *fx = *state;
    make_db(fx, "inv_hostile");
    /* No recovery for ten minutes: the rows set up below stay as they are unless adopted. */
    const char *extra[] = {"--adopt-grace-ms", "600000", "--heartbeat-ms", "5000", NULL};
    start_daemon(fx, 0, extra);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], 20000), 0);
    uint32_t cur = (uint32_t)tp_daemon_stat(&fx->d[0], "epoch");
    uint32_t old = cur + 100; /* an epoch this dispatcher never had */
    assert_int_equal(tp_rows_insert(&fx->db, "inv5", 2, true), 0);
    uint64_t x = tp_testdb_query_u64(&fx->db, "SELECT MIN(task_id) FROM task WHERE task_type = 'inv5'");
    uint64_t y = tp_testdb_query_u64(&fx->db, "SELECT MAX(task_id) FROM task WHERE task_type = 'inv5'");
    assert_true(tp_testdb_exec(&fx->db,
                               "UPDATE task SET task_state = 1, epoch = %u, attempts = 1"
                               " WHERE task_type = 'inv5'",
                               (unsigned)old) == 2);

    rawconn *rc = calloc(1, sizeof *rc);
    assert_non_null(rc);
    rc->fd = tp_raw_connect(fx->d[0].listen, 15);
    assert_true(rc->fd >= 0);
    send_hello(rc->fd, 3);
    proto_msg m;
    read_frame(rc, &m);
    assert_int_equal(m.type, PROTO_WELCOME);
    assert_int_equal(m.u.welcome.version, 3);

    /* Refused: a task that does not exist, another epoch, a wrong attempt, the current
     * epoch (a delivery of this dispatcher that it does not hold). */
    const proto_dlv bad[] = {{y + 1000, old, 1}, {x, old + 1, 1}, {x, old, 9}, {x, cur, 1}};
    const proto_dlv good = {y, old, 1};
    send_list(rc->fd, PROTO_HOLDING, bad, 4);
    send_list(rc->fd, PROTO_HOLDING, &good, 1);
    int cancels = 0;
    bool seen[4] = {false};
    while (cancels < 4) {
        read_frame(rc, &m);
        assert_int_equal(m.type, PROTO_CANCEL);
        for (int i = 0; i < 4; i++)
            if (!seen[i] && m.u.cancel.task_id == bad[i].task_id && m.u.cancel.epoch == bad[i].epoch &&
                m.u.cancel.attempt == bad[i].attempt) {
                seen[i] = true;
                cancels++;
                break;
            }
        assert_false(m.u.cancel.task_id == y);
    }
    note(fx, "the four bad declarations were CANCELled");
    /* The good one is adopted: its row moves to the leader's epoch. */
    long long end = tp_mono_ms() + WAIT_MS;
    while (tp_testdb_query_u64(&fx->db, "SELECT epoch FROM task WHERE task_id = %" PRIu64, y) != cur) {
        if (tp_mono_ms() > end)
            fail_msg("task %" PRIu64 " was not adopted", y);
        tp_sleep_ms(20);
    }
    char row[64], want[64];
    row_of(fx, x, row, sizeof row);
    snprintf(want, sizeof want, "1/%u/1", (unsigned)old);
    assert_string_equal(row, want); /* unchanged */
    /* the loop heard of it */
    assert_true(tp_daemon_wait_stat(&fx->d[0], "tasks.adopted_total", 1, false, (int)(end - tp_mono_ms())));
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.adopt_refused_total"), 4);

    /* Another connection declaring the task this dispatcher now holds is refused. */
    rawconn *rc2 = calloc(1, sizeof *rc2);
    assert_non_null(rc2);
    rc2->fd = tp_raw_connect(fx->d[0].listen, 15);
    assert_true(rc2->fd >= 0);
    send_hello(rc2->fd, 3);
    read_frame(rc2, &m);
    assert_int_equal(m.type, PROTO_WELCOME);
    send_list(rc2->fd, PROTO_HOLDING, &good, 1);
    read_frame(rc2, &m);
    assert_int_equal(m.type, PROTO_CANCEL);
    assert_true(m.u.cancel.task_id == y && m.u.cancel.epoch == old && m.u.cancel.attempt == 1);
    close(rc2->fd);
    free(rc2);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.adopt_refused_total"), 5);

    /* The adopted delivery's DONE (the triple it was declared with) is written. */
    send_done(rc->fd, y, old, 1);
    expect_confirm(rc, y, old, 1);
    assert_int_equal(tp_rows_state(&fx->db, y), 2);
    /* A DONE naming a wrong attempt is confirmed and writes nothing. */
    send_done(rc->fd, x, old, 7);
    expect_confirm(rc, x, old, 7);
    row_of(fx, x, row, sizeof row);
    assert_string_equal(row, want);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.foreign_ignored_total"), 1);
    close(rc->fd);

    /* A version-2 session may not send HOLDING. */
    rc->fd = tp_raw_connect(fx->d[0].listen, 15);
    rc->len = rc->used = 0;
    assert_true(rc->fd >= 0);
    send_hello(rc->fd, 2);
    read_frame(rc, &m);
    assert_int_equal(m.type, PROTO_WELCOME);
    assert_int_equal(m.u.welcome.version, 2);
    send_list(rc->fd, PROTO_HOLDING, &good, 1);
    read_frame(rc, &m);
    assert_int_equal(m.type, PROTO_ERROR);
    assert_int_equal(m.u.error.code, PROTO_ERR_UNEXPECTED);
    close(rc->fd);
    free(rc);
    row_of(fx, x, row, sizeof row);
    assert_string_equal(row, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restart_adopts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_standby_adopts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outcomes_resent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_worker_recovered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_inventory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
