/* test_taskops: the task-level requests of the admin port (GET /task, GET /failed,
 * POST /retry, POST /cancel), pause/resume of unknown types, and the taskpushctl
 * commands behind them (show, failed, retry, cancel, pause --force), against the real
 * taskpushd, a private MariaDB and libtaskpush workers over TCP. Waits are bounded
 * polls; nothing asserts on how long something took.
 *
 * Cases:
 *   show_states       each state by its name, attempts, times, err_msg, result size; 404 for
 *                     an unknown id; 400 for a non-numeric, negative, zero or huge id;
 *                     taskpushctl show (output, exit 0/1/2)
 *   show_held         a task running on a worker names the worker; a buffered one says so
 *   failed_list       newest first, only FAILED, --type filter, --limit, bounds (400 for 0,
 *                     -1, 10^12, junk; a type not UTF-8); taskpushctl failed
 *   failed_by_time    rows imported FAILED with old failure times, with ids below and above
 *                     a task that a worker fails now: that one comes first in GET /failed
 *                     (the dashboard's request), with ?type and in taskpushctl failed; its
 *                     failure is permanent (the worker said so), an exhausted one is not;
 *                     EXPLAIN: the list is a range of failed_idx, without a filesort
 *   retry_failed_since POST /retry-failed over a raw socket: 401 without the token, 400 for
 *                     a bad type, since or limit, 405 for GET; the FAILED rows of the type
 *                     that failed since the time back to NEW, the latest first, at most
 *                     limit per request ("more"), others (older, another type) untouched
 *   retry             FAILED -> NEW with attempts 0, err_msg cleared, and it runs again;
 *                     409 for a task not FAILED, 404 unknown; taskpushctl retry
 *   cancel_new        a NEW row (no worker) becomes FAILED "cancelled"; again: 409
 *   cancel_buffered   a task buffered in the dispatcher is dropped and FAILED "cancelled";
 *                     the others still run
 *   cancel_running    the worker's handler sees the cancel (tp_task_cancelled); the row is
 *                     FAILED "cancelled" and stays so; the slot comes back
 *   cancel_finished   SUCCESSFUL -> 409; taskpushctl exits 1
 *   orphan_runs       rows written PROCESSING by SQL (epoch 0, and an epoch no dispatcher
 *                     was given) run and end SUCCESSFUL with --task-timeout-ms 3000;
 *                     table.orphans_recovered_total counts them; a row a live worker holds
 *                     past that age is never touched (it runs once, attempts 1)
 *   attempts_none_left rows claimed with no attempt left (attempts 2147483647 of 3, with
 *                     the table's attempts_max dropped as an older table had it; 50 of 1)
 *                     end FAILED "no attempt left: ..." without running; the 26 others of
 *                     their claim run and are written in batches (none one by one)
 *   orphan_cancel     such a row is cancelled at once (FAILED "cancelled", "unheld"), long
 *                     before the scan would find it; a PROCESSING row of the leader's
 *                     own epoch that it does not hold still answers 409
 *   pause_unknown     pause/resume of a type nobody registered: 404, with force 200; a type
 *                     a worker registers, registered (gone since) or the table has rows of:
 *                     200; taskpushctl --force
 *   post_protections  the new POSTs need the token (401) and POST (405 for GET)
 */
#include <errno.h>
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

#include "daemon.h"
#include "raw.h"
#include "inproc_worker.h"
#include "rows.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 60000
#define POLL_MS 20

struct fx;

struct wk {
    struct fx *fx;
    char name[64];
    bool gated;           /* handlers wait at fx->gate */
    bool until_cancelled; /* handlers run until tp_task_cancelled */
    bool fail_now;        /* handlers fail at once, permanently */
    atomic_int started, done, saw_cancel;
    tp_worker *w;
    tp_inproc run;
};

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
    struct wk wk[2];
    int nwk;
    tp_gate gate;
    char token_path[128];
    bool passed;
};

static int on_task(tp_task *t, void *arg)
{
    struct wk *k = arg;
    atomic_fetch_add(&k->started, 1);
    if (k->fail_now)
        return TP_FAIL_PERMANENT;
    if (k->gated)
        tp_gate_pass(&k->fx->gate);
    if (k->until_cancelled) {
        long long end = tp_mono_ms() + WAIT_MS;
        while (!tp_task_cancelled(t) && tp_mono_ms() < end)
            tp_sleep_ms(5);
        if (tp_task_cancelled(t))
            atomic_fetch_add(&k->saw_cancel, 1);
        return TP_FAIL_PERMANENT;
    }
    atomic_fetch_add(&k->done, 1);
    return TP_SUCCESS;
}

static struct wk *wk_start_as(struct fx *fx, const char *name, unsigned capacity, const char *type, bool gated,
                              bool until_cancelled, bool fail_now)
{
    assert_true(fx->nwk < 2);
    struct wk *k = &fx->wk[fx->nwk++];
    k->fx = fx;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->gated = gated;
    k->until_cancelled = until_cancelled;
    k->fail_now = fail_now;
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.name = k->name;
    o.capacity = capacity;
    o.threads = capacity;
    k->w = tp_worker_new(&o, &err);
    assert_non_null(k->w);
    assert_int_equal(tp_worker_add_type(k->w, type, on_task, k), 0);
    assert_int_equal(tp_inproc_start(&k->run, k->w), 0);
    return k;
}

static struct wk *wk_start(struct fx *fx, const char *name, unsigned capacity, const char *type, bool gated,
                           bool until_cancelled)
{
    return wk_start_as(fx, name, capacity, type, gated, until_cancelled, false);
}

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    tp_gate_init(&fx->gate, false);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    tp_gate_set(&fx->gate, true);
    for (int i = 0; i < fx->nwk; i++) {
        if (tp_inproc_halt(&fx->wk[i].run) != 0)
            fprintf(stderr, "tp_worker_run(%s) failed\n", fx->wk[i].name);
        tp_worker_free(fx->wk[i].w);
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
    if (fx->token_path[0])
        unlink(fx->token_path);
    tp_gate_destroy(&fx->gate);
    free(fx);
    return 0;
}

static void fx_start(struct fx *fx, const char *tag, const char *const *extra)
{
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, extra), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
}

/* Inserts one row with the given columns and values (SQL text); returns its id. */
static uint64_t insert_row(struct fx *fx, const char *cols, const char *vals)
{
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (%s) VALUES (%s)", cols, vals), 1);
    uint64_t id = (uint64_t)mysql_insert_id(fx->db.conn);
    assert_true(id > 0);
    return id;
}

/* An HTTP request; the status, and the body parsed as JSON in *out when asked. */
static int http_json(struct fx *fx, const char *method, json_t **out, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int http_json(struct fx *fx, const char *method, json_t **out, const char *fmt, ...)
{
    char path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof path, fmt, ap);
    va_end(ap);
    char *body = NULL;
    int st = tp_http_request(fx->d.admin, method, path, &body);
    if (out) {
        *out = body ? json_loads(body, 0, NULL) : NULL;
        if (st == 200 && !*out)
            fail_msg("%s %s: 200 but not JSON: %s", method, path, body ? body : "(none)");
    }
    free(body);
    return st;
}

static const char *jstr(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

/* Runs taskpushctl --admin <the daemon> ARGS; the exit status, its stdout in out. */
static int ctl(struct fx *fx, char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int ctl(struct fx *fx, char *out, size_t outlen, const char *fmt, ...)
{
    char args[1024], cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "env -u TASKPUSH_TOKEN -u TASKPUSH_ADMIN_TOKEN %s --admin %s %s",
             tp_build_path("ctl/taskpushctl"), fx->d.admin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    printf("# $ taskpushctl %s -> %d\n", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    for (char *line = buf, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        printf("#   %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
        if (!nl)
            break;
    }
    if (out)
        snprintf(out, outlen, "%s", buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static uint64_t row_u64(struct fx *fx, const char *expr, uint64_t id)
{
    return tp_testdb_query_u64(&fx->db, "SELECT %s FROM task WHERE task_id = %llu", expr, (unsigned long long)id);
}

/* Waits until the row's state is want and its err_msg is err (NULL: not checked). */
static void wait_row(struct fx *fx, uint64_t id, int want, const char *err)
{
    char expr[256];
    snprintf(expr, sizeof expr, "task_state = %d%s%s%s", want, err ? " AND err_msg = '" : "", err ? err : "",
             err ? "'" : "");
    long long end = tp_mono_ms() + WAIT_MS;
    while (row_u64(fx, expr, id) != 1) {
        if (tp_mono_ms() > end)
            fail_msg("task %llu never reached state %d (%s): state %llu", (unsigned long long)id, want,
                     err ? err : "", (unsigned long long)row_u64(fx, "task_state", id));
        tp_sleep_ms(POLL_MS);
    }
}

/* The ids of the task rows of type, ascending, into ids[0..n). */
static void ids_of(struct fx *fx, const char *type, uint64_t *ids, int n)
{
    for (int i = 0; i < n; i++) {
        ids[i] = tp_testdb_query_u64(&fx->db,
                                     "SELECT task_id FROM task WHERE task_type = '%s' ORDER BY task_id LIMIT 1 OFFSET %d",
                                     type, i);
        assert_true(ids[i] != TP_TESTDB_U64_ERR);
    }
}

/* Waits until the gate holds held handlers and the dispatcher buffers buffered tasks. */
static void wait_held_buffered(struct fx *fx, int held, long long buffered)
{
    long long end = tp_mono_ms() + WAIT_MS;
    while (tp_gate_waiting(&fx->gate) < held || tp_daemon_stat(&fx->d, "queue.buffered") != buffered) {
        if (tp_mono_ms() > end)
            fail_msg("never %d held and %lld buffered", held, buffered);
        tp_sleep_ms(POLL_MS);
    }
}

/* ---- show ---- */

static void show_states(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_show", NULL);
    int64_t now = tp_testdb_now_ms();
    char vals[512];
    /* No worker serves type s: the NEW row stays NEW. */
    snprintf(vals, sizeof vals, "'s', 0, 2, 0, 5, %lld, 250", (long long)(now + 3600000));
    uint64_t id_new = insert_row(fx, "task_type, task_state, task_priority, attempts, max_attempts, run_after, timeout_ms",
                                 vals);
    uint64_t id_proc = insert_row(fx, "task_type, task_state, attempts, epoch", "'s', 1, 1, 999999");
    uint64_t id_ok = insert_row(fx, "task_type, task_state, attempts, result", "'s', 2, 1, 'abcdef'");
    uint64_t id_fail = insert_row(fx, "task_type, task_state, attempts, max_attempts, err_msg",
                                  "'s', 3, 3, 3, 'disk full'");
    static const char *const names[4] = {"NEW", "PROCESSING", "SUCCESSFUL", "FAILED"};
    uint64_t ids[4] = {id_new, id_proc, id_ok, id_fail};
    for (int i = 0; i < 4; i++) {
        json_t *o;
        assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)ids[i]), 200);
        assert_string_equal(jstr(o, "state"), names[i]);
        assert_int_equal(jint(o, "task_id"), (long long)ids[i]);
        assert_string_equal(jstr(o, "type"), "s");
        assert_true(jint(o, "insert_time_ms") > 0);
        assert_true(jint(o, "last_update_time_ms") > 0);
        assert_true(json_is_null(json_object_get(o, "dispatcher"))); /* not held here */
        json_decref(o);
    }
    json_t *o;
    assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)id_new), 200);
    assert_int_equal(jint(o, "priority"), 2);
    assert_int_equal(jint(o, "max_attempts"), 5);
    assert_int_equal(jint(o, "run_after_ms"), now + 3600000);
    assert_int_equal(jint(o, "timeout_ms"), 250);
    assert_true(json_is_null(json_object_get(o, "err_msg")));
    json_decref(o);
    assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)id_ok), 200);
    assert_int_equal(jint(o, "result_bytes"), 6);
    assert_true(json_is_null(json_object_get(o, "timeout_ms")));
    json_decref(o);
    assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)id_fail), 200);
    assert_string_equal(jstr(o, "err_msg"), "disk full");
    assert_int_equal(jint(o, "attempts"), 3);
    json_decref(o);

    /* Unknown and hostile ids. */
    assert_int_equal(http_json(fx, "GET", NULL, "/task?id=%llu", (unsigned long long)id_fail + 1000), 404);
    assert_int_equal(http_json(fx, "GET", NULL, "/task?id=18446744073709551615"), 404);
    static const char *const bad[] = {"abc", "-1", "0", "18446744073709551616", "99999999999999999999999",
                                      "1e3", "%201", "+1", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(http_json(fx, "GET", NULL, "/task?id=%s", bad[i]), 400);
    assert_int_equal(http_json(fx, "GET", NULL, "/task"), 400);
    assert_int_equal(http_json(fx, "POST", NULL, "/task?id=1"), 405);

    /* taskpushctl show. */
    char out[8192];
    assert_int_equal(ctl(fx, out, sizeof out, "show %llu", (unsigned long long)id_fail), 0);
    assert_non_null(strstr(out, "state       FAILED"));
    assert_non_null(strstr(out, "attempts    3 of 3"));
    assert_non_null(strstr(out, "err_msg     disk full"));
    assert_int_equal(ctl(fx, out, sizeof out, "show %llu", (unsigned long long)id_ok), 0);
    assert_non_null(strstr(out, "state       SUCCESSFUL"));
    assert_non_null(strstr(out, "result      6 bytes"));
    assert_int_equal(ctl(fx, out, sizeof out, "--json show %llu", (unsigned long long)id_new), 0);
    assert_non_null(strstr(out, "\"state\":\"NEW\""));
    assert_int_equal(ctl(fx, NULL, 0, "show %llu", (unsigned long long)id_fail + 1000), 1);
    assert_int_equal(ctl(fx, NULL, 0, "show abc"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "show 99999999999999999999999"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "show"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "show 1 2"), 2);
    fx->passed = true;
}

static void show_held(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_held", NULL);
    wk_start(fx, "held-w", 1, "h", true, false);
    assert_int_equal(tp_rows_insert(&fx->db, "h", 3, false), 0);
    wait_held_buffered(fx, 1, 2);
    uint64_t ids[3];
    ids_of(fx, "h", ids, 3);
    int running = 0, buffered = 0;
    uint64_t running_id = 0;
    for (int i = 0; i < 3; i++) {
        json_t *o;
        assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)ids[i]), 200);
        assert_string_equal(jstr(o, "state"), "PROCESSING");
        json_t *held = json_object_get(o, "dispatcher");
        assert_true(json_is_object(held));
        if (strcmp(jstr(held, "state"), "running") == 0) {
            running++;
            running_id = ids[i];
            assert_string_equal(jstr(held, "worker"), "held-w");
            assert_true(jint(held, "since_ms") > 0);
            assert_int_equal(jint(held, "attempt"), 1);
        } else {
            assert_string_equal(jstr(held, "state"), "buffered");
            buffered++;
        }
        json_decref(o);
    }
    assert_int_equal(running, 1);
    assert_int_equal(buffered, 2);
    char out[8192];
    assert_int_equal(ctl(fx, out, sizeof out, "show %llu", (unsigned long long)running_id), 0);
    assert_non_null(strstr(out, "running on worker held-w"));
    assert_int_equal(ctl(fx, out, sizeof out, "show %llu", (unsigned long long)(running_id == ids[0] ? ids[1] : ids[0])), 0);
    assert_non_null(strstr(out, "buffered in the dispatcher"));
    tp_gate_set(&fx->gate, true);
    assert_true(tp_rows_wait(&fx->db, "h", 2, 3, WAIT_MS, POLL_MS, NULL));
    json_t *o;
    assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)running_id), 200);
    assert_string_equal(jstr(o, "state"), "SUCCESSFUL");
    assert_true(json_is_null(json_object_get(o, "dispatcher")));
    json_decref(o);
    fx->passed = true;
}

/* ---- failed ---- */

static void failed_list(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_failed", NULL);
    /* FAILED rows of a and b over every priority, between rows of other states. */
    uint64_t fa[4], fb[2];
    char vals[128];
    for (int i = 0; i < 4; i++) {
        snprintf(vals, sizeof vals, "'a', 3, %d, 'a-err-%d'", i % 3, i);
        fa[i] = insert_row(fx, "task_type, task_state, task_priority, err_msg", vals);
        insert_row(fx, "task_type, task_state", "'a', 2");
        if (i < 2) {
            snprintf(vals, sizeof vals, "'b', 3, %d, 'b-err-%d'", 2 - i, i);
            fb[i] = insert_row(fx, "task_type, task_state, task_priority, err_msg", vals);
        }
    }
    insert_row(fx, "task_type, task_state, `delayed`, err_msg", "'c', 3, 1, 'c-err'"); /* the delayed lane */
    json_t *list;
    assert_int_equal(http_json(fx, "GET", &list, "/failed"), 200);
    assert_int_equal(json_array_size(list), 7);
    /* Newest first. */
    long long prev = -1;
    size_t i;
    json_t *r;
    json_array_foreach(list, i, r) {
        if (i > 0)
            assert_true(jint(r, "task_id") < prev);
        prev = jint(r, "task_id");
        assert_true(strncmp(jstr(r, "err_msg"), jstr(r, "type"), 1) == 0);
    }
    assert_string_equal(jstr(json_array_get(list, 0), "type"), "c");
    json_decref(list);

    assert_int_equal(http_json(fx, "GET", &list, "/failed?type=a"), 200);
    assert_int_equal(json_array_size(list), 4);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(jint(json_array_get(list, (size_t)k), "task_id"), (long long)fa[3 - k]);
        assert_string_equal(jstr(json_array_get(list, (size_t)k), "type"), "a");
    }
    json_decref(list);
    assert_int_equal(http_json(fx, "GET", &list, "/failed?type=b&limit=1"), 200);
    assert_int_equal(json_array_size(list), 1);
    assert_int_equal(jint(json_array_get(list, 0), "task_id"), (long long)fb[1]);
    assert_string_equal(jstr(json_array_get(list, 0), "err_msg"), "b-err-1");
    json_decref(list);
    assert_int_equal(http_json(fx, "GET", &list, "/failed?limit=2"), 200);
    assert_int_equal(json_array_size(list), 2);
    json_decref(list);
    assert_int_equal(http_json(fx, "GET", &list, "/failed?limit=1000&type=nothing"), 200);
    assert_int_equal(json_array_size(list), 0);
    json_decref(list);

    /* Bounds and hostile values. */
    static const char *const bad[] = {"limit=0", "limit=-1", "limit=1000000000000", "limit=1001", "limit=abc",
                                      "limit=", "type=", "type=%FF%FE", "type=a%C3"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        assert_int_equal(http_json(fx, "GET", NULL, "/failed?%s", bad[k]), 400);
    char longtype[300];
    memset(longtype, 'x', 257);
    longtype[257] = '\0';
    assert_int_equal(http_json(fx, "GET", NULL, "/failed?type=%s", longtype), 400);

    char out[16384];
    assert_int_equal(ctl(fx, out, sizeof out, "failed --type a --limit 2"), 0);
    assert_non_null(strstr(out, "a-err-3"));
    assert_non_null(strstr(out, "a-err-2"));
    assert_null(strstr(out, "a-err-1"));
    assert_null(strstr(out, "b-err"));
    assert_int_equal(ctl(fx, out, sizeof out, "failed"), 0);
    assert_non_null(strstr(out, "b-err-0"));
    assert_non_null(strstr(out, "c-err"));
    assert_int_equal(ctl(fx, out, sizeof out, "failed --type nothing"), 0);
    assert_non_null(strstr(out, "(no FAILED task)"));
    assert_int_equal(ctl(fx, NULL, 0, "failed --limit 0"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "failed --limit -1"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "failed --limit 1000000000000"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "failed 12"), 2);
    fx->passed = true;
}

/* ---- the latest failures by the time they failed ---- */

static void failed_by_time(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_failed_time", NULL);
    int64_t now = tp_testdb_now_ms();
    char vals[256];
    /* Imported: FAILED long ago, with ids below and above the task that fails now. */
    snprintf(vals, sizeof vals, "'a', 3, 1, 3, %lld, 'old-low'", (long long)(now - 2 * 86400000LL));
    uint64_t old_low = insert_row(fx, "task_type, task_state, attempts, max_attempts, last_update_time, err_msg", vals);
    uint64_t late = insert_row(fx, "task_type, max_attempts", "'late', 3");
    uint64_t old_high[3];
    for (int i = 0; i < 3; i++) {
        snprintf(vals, sizeof vals, "'a', 3, 3, 3, %lld, 'old-high-%d'", (long long)(now - 86400000LL - i * 1000), i);
        old_high[i] = insert_row(fx, "task_type, task_state, attempts, max_attempts, last_update_time, err_msg", vals);
    }
    snprintf(vals, sizeof vals, "'b', 3, 3, 3, %lld, 'old-b'", (long long)(now - 3 * 86400000LL));
    uint64_t old_b = insert_row(fx, "task_type, task_state, attempts, max_attempts, last_update_time, err_msg", vals);
    for (int i = 0; i < 5; i++)
        insert_row(fx, "task_type, task_state", "'a', 2");
    assert_true(old_low < late && late < old_high[0]);

    wk_start_as(fx, "failer", 1, "late", false, false, true);
    wait_row(fx, late, 3, NULL);
    /* The type's answers (the dashboard's failure rate): one, failed. */
    json_t *st;
    assert_int_equal(http_json(fx, "GET", &st, "/stats"), 200);
    size_t ti;
    json_t *bt, *late_type = NULL;
    json_array_foreach(json_object_get(st, "by_type"), ti, bt) if (strcmp(jstr(bt, "type"), "late") == 0) late_type = bt;
    assert_non_null(late_type);
    assert_int_equal(jint(late_type, "answered_failed_total"), 1);
    assert_int_equal(jint(late_type, "answered_ok_total"), 0);
    json_decref(st);

    /* What the dashboard asks (/failed?limit=10): the one that failed now first. */
    const uint64_t want[] = {late, old_high[0], old_high[1], old_high[2], old_low, old_b};
    json_t *list;
    assert_int_equal(http_json(fx, "GET", &list, "/failed?limit=10"), 200);
    assert_int_equal(json_array_size(list), 6);
    for (size_t k = 0; k < 6; k++) {
        json_t *r = json_array_get(list, k);
        assert_int_equal(jint(r, "task_id"), (long long)want[k]);
        assert_int_equal(jint(r, "failed_at_ms"), jint(r, "last_update_time_ms"));
        if (k > 0)
            assert_true(jint(r, "failed_at_ms") <= jint(json_array_get(list, k - 1), "failed_at_ms"));
        /* Permanent: the worker said so with attempts left; old-low had attempts left too. */
        assert_int_equal(json_is_true(json_object_get(r, "permanent")), want[k] == late || want[k] == old_low);
    }
    assert_true(jint(json_array_get(list, 0), "failed_at_ms") >= now);
    json_decref(list);
    assert_int_equal(http_json(fx, "GET", &list, "/failed?limit=2"), 200);
    assert_int_equal(json_array_size(list), 2);
    assert_int_equal(jint(json_array_get(list, 0), "task_id"), (long long)late);
    assert_int_equal(jint(json_array_get(list, 1), "task_id"), (long long)old_high[0]);
    json_decref(list);
    assert_int_equal(http_json(fx, "GET", &list, "/failed?type=a&limit=2"), 200);
    assert_int_equal(json_array_size(list), 2);
    assert_int_equal(jint(json_array_get(list, 0), "task_id"), (long long)old_high[0]);
    assert_int_equal(jint(json_array_get(list, 1), "task_id"), (long long)old_high[1]);
    json_decref(list);

    /* taskpushctl failed: the header, then the one that failed now. */
    char out[16384], first[64];
    assert_int_equal(ctl(fx, out, sizeof out, "failed --limit 3"), 0);
    assert_non_null(strstr(out, "FAILED AT"));
    const char *line = strchr(out, '\n');
    assert_non_null(line);
    snprintf(first, sizeof first, "%llu ", (unsigned long long)late);
    assert_true(strncmp(line + 1, first, strlen(first)) == 0);
    assert_non_null(strstr(out, "old-high-1"));
    assert_null(strstr(out, "old-low"));

    /* The statement of one type's part (db_sql.c, checked word for word by test_sql): a
     * range of failed_idx read backwards, no filesort. */
    assert_int_equal(mysql_query(fx->db.conn, "EXPLAIN SELECT task_id, task_type, task_priority, attempts,"
                                              " max_attempts, failed_at, LEFT(err_msg, 1000) FROM task FORCE"
                                              " INDEX (failed_idx) WHERE task_type = _utf8mb4 X'61' AND"
                                              " failed_at IS NOT NULL ORDER BY failed_at DESC, task_id DESC"
                                              " LIMIT 20"),
                     0);
    MYSQL_RES *res = mysql_store_result(fx->db.conn);
    assert_non_null(res);
    MYSQL_ROW row = mysql_fetch_row(res);
    assert_non_null(row);
    const char *key = NULL, *extra = "";
    MYSQL_FIELD *f = mysql_fetch_fields(res);
    for (unsigned i = 0; i < mysql_num_fields(res); i++) {
        if (strcmp(f[i].name, "key") == 0)
            key = row[i];
        if (strcmp(f[i].name, "Extra") == 0 && row[i])
            extra = row[i];
    }
    printf("# EXPLAIN: key %s, Extra %s\n", key ? key : "NULL", extra);
    assert_non_null(key);
    assert_string_equal(key, "failed_idx");
    assert_null(strstr(extra, "filesort"));
    mysql_free_result(res);
    fx->passed = true;
}

/* A POST over a raw socket, as any HTTP client sends it: the status, the body in body. */
static int raw_post(struct fx *fx, const char *path, const char *token, char *body, size_t cap)
{
    char req[1024], buf[8192];
    int fd = tp_raw_connect(fx->d.admin, 10);
    assert_true(fd >= 0);
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Taskpush-Admin: 1\r\n%s%s%s"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n",
                     path, token ? "Authorization: Bearer " : "", token ? token : "", token ? "\r\n" : "");
    assert_true(n > 0 && (size_t)n < sizeof req);
    assert_int_equal(tp_raw_send(fd, req, (size_t)n), 0);
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0)
        got += (size_t)r;
    close(fd);
    buf[got] = '\0';
    int status = 0;
    assert_int_equal(sscanf(buf, "HTTP/1.1 %d", &status), 1);
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
    printf("# POST %s%s -> %d %s\n", path, token ? " (token)" : "", status, body);
    return status;
}

static void retry_failed_since(void **state)
{
    struct fx *fx = *state;
    snprintf(fx->token_path, sizeof fx->token_path, "/tmp/taskops-token-%d", (int)getpid());
    FILE *f = fopen(fx->token_path, "w");
    assert_non_null(f);
    fputs("taskops-secret\n", f);
    fclose(f);
    const char *extra[] = {"--admin-token-file", fx->token_path, NULL};
    fx_start(fx, "taskops_retry_since", extra);
    int64_t now = tp_testdb_now_ms(), since = now - 600000;
    char vals[256], body[4096], path[512];
    /* r: 5 failed within the last minute (ids interleaved with 3 that failed an hour
     * ago); q: one recent of another type; a NEW row of r. */
    uint64_t recent[5], old[3];
    for (int i = 0; i < 5; i++) {
        snprintf(vals, sizeof vals, "'r', 3, 3, %lld, 'recent-%d'", (long long)(now - 60000 + i * 1000), i);
        recent[i] = insert_row(fx, "task_type, task_state, attempts, last_update_time, err_msg", vals);
        if (i < 3) {
            snprintf(vals, sizeof vals, "'r', 3, 3, %lld, 'old-%d'", (long long)(now - 3600000), i);
            old[i] = insert_row(fx, "task_type, task_state, attempts, last_update_time, err_msg", vals);
        }
    }
    snprintf(vals, sizeof vals, "'q', 3, 3, %lld, 'q'", (long long)(now - 1000));
    uint64_t other = insert_row(fx, "task_type, task_state, attempts, last_update_time, err_msg", vals);
    uint64_t fresh = insert_row(fx, "task_type", "'r'");

    /* Refused, and nothing moves. */
    snprintf(path, sizeof path, "/retry-failed?type=r&since=%lld", (long long)since);
    assert_int_equal(raw_post(fx, path, NULL, body, sizeof body), 401);
    assert_int_equal(raw_post(fx, path, "wrong-token", body, sizeof body), 401);
    assert_int_equal(http_json(fx, "GET", NULL, "%s", path), 405);
    static const char *const bad[] = {
        "since=1000",                       /* no type */
        "type=&since=1000",                 /* empty */
        "type=%FF%FE&since=1000",           /* not UTF-8 */
        "type=r",                           /* no since */
        "type=r&since=",                    /* empty */
        "type=r&since=-5",                  /* negative */
        "type=r&since=12ab",                /* junk */
        "type=r&since=1.5",                 /* not whole */
        "type=r&since=253402300800000",     /* past year 9999 */
        "type=r&since=99999999999999999999999", /* past 64 bits */
        "type=r&since=1000&limit=0",        /* limit */
        "type=r&since=1000&limit=1001",
        "type=r&since=1000&limit=x",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(path, sizeof path, "/retry-failed?%s", bad[k]);
        assert_int_equal(raw_post(fx, path, "taskops-secret", body, sizeof body), 400);
    }
    char longtype[300];
    memset(longtype, 'x', 257);
    longtype[257] = '\0';
    snprintf(path, sizeof path, "/retry-failed?type=%s&since=1000", longtype);
    assert_int_equal(raw_post(fx, path, "taskops-secret", body, sizeof body), 400);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 3"), 9);

    /* The cap: 2 per request, the latest failures first; then the other 3; then none. */
    snprintf(path, sizeof path, "/retry-failed?type=r&since=%lld&limit=2", (long long)since);
    assert_int_equal(raw_post(fx, path, "taskops-secret", body, sizeof body), 200);
    json_t *a = json_loads(body, 0, NULL);
    assert_non_null(a);
    assert_int_equal(jint(a, "rows"), 2);
    assert_true(json_is_true(json_object_get(a, "more")));
    assert_string_equal(jstr(a, "type"), "r");
    assert_int_equal(jint(a, "since_ms"), since);
    json_decref(a);
    for (int i = 0; i < 5; i++)
        assert_int_equal(row_u64(fx, "task_state", recent[i]) == 3, i < 3);
    assert_int_equal(row_u64(fx, "attempts = 0 AND err_msg IS NULL AND `delayed` = 0", recent[4]), 1);
    snprintf(path, sizeof path, "/retry-failed?type=r&since=%lld", (long long)since);
    assert_int_equal(raw_post(fx, path, "taskops-secret", body, sizeof body), 200);
    a = json_loads(body, 0, NULL);
    assert_int_equal(jint(a, "rows"), 3);
    assert_true(json_is_false(json_object_get(a, "more")));
    json_decref(a);
    assert_int_equal(raw_post(fx, path, "taskops-secret", body, sizeof body), 200);
    a = json_loads(body, 0, NULL);
    assert_int_equal(jint(a, "rows"), 0);
    json_decref(a);
    for (int i = 0; i < 5; i++)
        assert_int_equal(row_u64(fx, "task_state", recent[i]), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(row_u64(fx, "task_state", old[i]), 3);
    assert_int_equal(row_u64(fx, "task_state", other), 3);
    assert_int_equal(row_u64(fx, "task_state", fresh), 0);
    /* A type nobody has: nothing, and 200. */
    assert_int_equal(raw_post(fx, "/retry-failed?type=nothing&since=0", "taskops-secret", body, sizeof body), 200);
    fx->passed = true;
}

/* ---- retry ---- */

static void retry(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_retry", NULL);
    wk_start(fx, "retry-w", 2, "r", false, false);
    uint64_t a = insert_row(fx, "task_type, task_state, attempts, err_msg", "'r', 3, 3, 'first try failed'");
    uint64_t b = insert_row(fx, "task_type, task_state, attempts, err_msg", "'r', 3, 3, 'also failed'");
    uint64_t ok = insert_row(fx, "task_type, task_state, attempts", "'r', 2, 1");
    tp_sleep_ms(300); /* a FAILED row is never claimed */
    assert_int_equal(row_u64(fx, "task_state", a), 3);

    json_t *o;
    assert_int_equal(http_json(fx, "POST", &o, "/retry?id=%llu", (unsigned long long)a), 200);
    assert_string_equal(jstr(o, "state"), "NEW");
    json_decref(o);
    /* It runs again: one attempt since the reset, the old error gone. */
    wait_row(fx, a, 2, NULL);
    assert_int_equal(row_u64(fx, "attempts", a), 1);
    assert_int_equal(row_u64(fx, "err_msg IS NULL", a), 1);
    assert_int_equal(row_u64(fx, "task_state", b), 3);

    assert_int_equal(http_json(fx, "POST", NULL, "/retry?id=%llu", (unsigned long long)ok), 409);
    assert_int_equal(http_json(fx, "POST", NULL, "/retry?id=%llu", (unsigned long long)a), 409);
    assert_int_equal(http_json(fx, "POST", NULL, "/retry?id=%llu", (unsigned long long)b + 1000), 404);
    assert_int_equal(http_json(fx, "POST", NULL, "/retry?id=x"), 400);
    assert_int_equal(http_json(fx, "POST", NULL, "/retry?id=184467440737095516150"), 400);

    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "retry %llu", (unsigned long long)b), 0);
    assert_non_null(strstr(out, "back to NEW"));
    wait_row(fx, b, 2, NULL);
    assert_int_equal(ctl(fx, NULL, 0, "retry %llu", (unsigned long long)b), 1);
    assert_int_equal(ctl(fx, NULL, 0, "retry"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "retry -5"), 2);
    fx->passed = true;
}

/* ---- cancel ---- */

static void cancel_new(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_cancel_new", NULL);
    /* No worker for n: the rows stay NEW in the table. */
    uint64_t a = insert_row(fx, "task_type", "'n'");
    uint64_t b = insert_row(fx, "task_type, run_after, `delayed`", "'n', 9999999999999, 1");
    json_t *o;
    assert_int_equal(http_json(fx, "POST", &o, "/cancel?id=%llu", (unsigned long long)a), 200);
    assert_string_equal(jstr(o, "cancelled"), "new");
    json_decref(o);
    assert_int_equal(row_u64(fx, "task_state = 3 AND err_msg = 'cancelled'", a), 1);
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)a), 409);
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)b + 1000), 404);
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=0"), 400);

    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "cancel %llu", (unsigned long long)b), 0);
    assert_non_null(strstr(out, "was NEW"));
    /* A delayed row ends in the ready lane, where GET /failed reads. */
    assert_int_equal(row_u64(fx, "task_state = 3 AND err_msg = 'cancelled' AND `delayed` = 0", b), 1);
    assert_int_equal(ctl(fx, NULL, 0, "cancel %llu", (unsigned long long)b), 1);
    assert_int_equal(ctl(fx, NULL, 0, "cancel x"), 2);
    fx->passed = true;
}

static void cancel_buffered(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_cancel_buf", NULL);
    struct wk *k = wk_start(fx, "buf-w", 1, "q", true, false);
    assert_int_equal(tp_rows_insert(&fx->db, "q", 3, false), 0);
    wait_held_buffered(fx, 1, 2);
    uint64_t ids[3];
    ids_of(fx, "q", ids, 3);
    /* The newest is buffered (dispatch order is by id within a priority). */
    json_t *o;
    assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)ids[2]), 200);
    assert_string_equal(jstr(json_object_get(o, "dispatcher"), "state"), "buffered");
    json_decref(o);
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "cancel %llu", (unsigned long long)ids[2]), 0);
    assert_non_null(strstr(out, "was buffered"));
    assert_int_equal(tp_daemon_stat(&fx->d, "queue.buffered"), 1);
    wait_row(fx, ids[2], 3, "cancelled");
    assert_int_equal(row_u64(fx, "attempts", ids[2]), 0);
    assert_int_equal(http_json(fx, "GET", &o, "/task?id=%llu", (unsigned long long)ids[2]), 200);
    assert_true(json_is_null(json_object_get(o, "dispatcher")));
    json_decref(o);
    /* The others still run; the cancelled one never does. */
    tp_gate_set(&fx->gate, true);
    wait_row(fx, ids[0], 2, NULL);
    wait_row(fx, ids[1], 2, NULL);
    tp_sleep_ms(300);
    assert_int_equal(atomic_load(&k->started), 2);
    assert_int_equal(row_u64(fx, "task_state", ids[2]), 3);
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)ids[0]), 409);
    fx->passed = true;
}

static void cancel_running(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_cancel_run", NULL);
    struct wk *k = wk_start(fx, "run-w", 1, "x", false, true);
    uint64_t id = insert_row(fx, "task_type, max_attempts", "'x', 5");
    long long end = tp_mono_ms() + WAIT_MS;
    while (atomic_load(&k->started) < 1) {
        if (tp_mono_ms() > end)
            fail_msg("the task never started");
        tp_sleep_ms(POLL_MS);
    }
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "cancel %llu", (unsigned long long)id), 0);
    assert_non_null(strstr(out, "run-w"));
    /* The handler is told, and the row is FAILED "cancelled" with its attempt. */
    end = tp_mono_ms() + WAIT_MS;
    while (atomic_load(&k->saw_cancel) < 1) {
        if (tp_mono_ms() > end)
            fail_msg("the handler never saw the cancel");
        tp_sleep_ms(POLL_MS);
    }
    wait_row(fx, id, 3, "cancelled");
    assert_int_equal(row_u64(fx, "attempts", id), 1);
    /* The worker's answer to the cancelled delivery frees its slot and changes nothing. */
    assert_true(tp_daemon_wait_stat(&fx->d, "queue.in_flight", 0, false, WAIT_MS));
    uint64_t next = insert_row(fx, "task_type", "'x'");
    end = tp_mono_ms() + WAIT_MS;
    while (atomic_load(&k->started) < 2) {
        if (tp_mono_ms() > end)
            fail_msg("the worker's slot never came back");
        tp_sleep_ms(POLL_MS);
    }
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)next), 200);
    wait_row(fx, next, 3, "cancelled");
    tp_sleep_ms(300);
    assert_int_equal(row_u64(fx, "task_state = 3 AND err_msg = 'cancelled'", id), 1);
    assert_int_equal(row_u64(fx, "task_state = 3 AND err_msg = 'cancelled'", next), 1);
    fx->passed = true;
}

static void cancel_finished(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_cancel_done", NULL);
    uint64_t ok = insert_row(fx, "task_type, task_state, result", "'f', 2, 'r'");
    uint64_t bad = insert_row(fx, "task_type, task_state, err_msg", "'f', 3, 'e'");
    char *body = NULL, path[64];
    snprintf(path, sizeof path, "/cancel?id=%llu", (unsigned long long)ok);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", path, &body), 409);
    assert_non_null(strstr(body, "SUCCESSFUL"));
    free(body);
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)bad), 409);
    assert_int_equal(ctl(fx, NULL, 0, "cancel %llu", (unsigned long long)ok), 1);
    assert_int_equal(row_u64(fx, "task_state", ok), 2);
    assert_int_equal(row_u64(fx, "err_msg = 'e'", bad), 1);
    fx->passed = true;
}

/* ---- rows with no attempt left ---- */

static void attempts_none_left(void **state)
{
    struct fx *fx = *state;
    fx_start(fx, "taskops_attempts", NULL);
    /* As a table of schema version 5 or older (no upper bound on attempts). */
    assert_int_equal(tp_testdb_exec(&fx->db, "ALTER TABLE task DROP CONSTRAINT IF EXISTS attempts_max"), 0);
    assert_int_equal(tp_rows_insert(&fx->db, "x", 13, false), 0);
    uint64_t huge = insert_row(fx, "task_type, attempts, max_attempts", "'x', 2147483647, 3");
    uint64_t fifty = insert_row(fx, "task_type, attempts, max_attempts", "'x', 50, 1");
    assert_int_equal(tp_rows_insert(&fx->db, "x", 13, false), 0);
    struct wk *k = wk_start(fx, "att-w", 32, "x", false, false);
    wait_row(fx, huge, 3, NULL);
    wait_row(fx, fifty, 3, NULL);
    assert_int_equal(row_u64(fx, "err_msg LIKE 'no attempt left: attempts % of max_attempts 3 when claimed'", huge), 1);
    assert_int_equal(row_u64(fx, "err_msg = 'no attempt left: attempts 50 of max_attempts 1 when claimed'", fifty), 1);
    assert_int_equal(row_u64(fx, "attempts", fifty), 50);
    long long end = tp_mono_ms() + WAIT_MS;
    while (tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 2 AND attempts = 1") != 26) {
        if (tp_mono_ms() > end)
            fail_msg("the 26 other tasks never all ended SUCCESSFUL");
        tp_sleep_ms(POLL_MS);
    }
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state IN (0, 1)"), 0);
    assert_int_equal(atomic_load(&k->started), 26);
    assert_int_equal(tp_daemon_log_count(&fx->d, "one by one"), 0);
    assert_int_equal(tp_daemon_log_count(&fx->d, "cannot be written"), 0);
    fx->passed = true;
}

/* ---- PROCESSING rows no dispatcher holds (orphans) ---- */

static void wait_stat_at_least(struct fx *fx, const char *key, long long want)
{
    assert_true(tp_daemon_wait_stat(&fx->d, key, want, true, WAIT_MS));
}

static void orphan_runs(void **state)
{
    struct fx *fx = *state;
    static const char *const extra[] = {"--task-timeout-ms", "3000", NULL};
    fx_start(fx, "taskops_orphan_runs", extra);
    struct wk *held = wk_start(fx, "held-w", 1, "h", true, false);
    struct wk *ow = wk_start(fx, "orphan-w", 2, "o", false, false);
    /* A task a worker holds far longer than --task-timeout-ms (its own timeout_ms). */
    uint64_t h = insert_row(fx, "task_type, timeout_ms", "'h', 600000");
    long long end = tp_mono_ms() + WAIT_MS;
    while (tp_gate_waiting(&fx->gate) < 1 || row_u64(fx, "attempts", h) != 1) {
        if (tp_mono_ms() > end)
            fail_msg("the held task never started (or its delivery was never recorded)");
        tp_sleep_ms(POLL_MS);
    }
    /* Its row changed last before these are inserted: a scan that finds them old
     * enough found it old enough too. */
    long long t0 = tp_mono_ms();
    uint64_t a = insert_row(fx, "task_type, task_state", "'o', 1");
    uint64_t b = insert_row(fx, "task_type, task_state, epoch", "'o', 1, 4000000000");
    char *body = NULL;
    wait_row(fx, a, 2, NULL);
    wait_row(fx, b, 2, NULL);
    printf("# the orphans ran within %lld ms of their INSERT (--task-timeout-ms 3000)\n", tp_mono_ms() - t0);
    assert_int_equal(row_u64(fx, "attempts", a), 1);
    assert_int_equal(row_u64(fx, "attempts", b), 1);
    wait_stat_at_least(fx, "table.orphans_recovered_total", 2);
    assert_int_equal(tp_daemon_stat(&fx->d, "table.orphans_recovered_total"), 2);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &body), 200);
    assert_non_null(strstr(body, "taskpush_table_orphans_recovered_total 2"));
    free(body);
    assert_true(tp_daemon_log_count(&fx->d, "no dispatcher held") >= 1);
    /* The held task was left alone: still PROCESSING under the leader's epoch, running
     * once; it ends SUCCESSFUL on its first attempt. */
    assert_int_equal(row_u64(fx, "task_state", h), 1);
    assert_int_equal(row_u64(fx, "epoch", h), (uint64_t)tp_daemon_stat(&fx->d, "epoch"));
    assert_int_equal(atomic_load(&held->started), 1);
    tp_gate_set(&fx->gate, true);
    wait_row(fx, h, 2, NULL);
    assert_int_equal(row_u64(fx, "attempts", h), 1);
    assert_int_equal(atomic_load(&held->started), 1);
    assert_int_equal(atomic_load(&ow->done), 2);
    fx->passed = true;
}

static void orphan_cancel(void **state)
{
    struct fx *fx = *state;
    /* The default --task-timeout-ms (60 s): the scan would not find these for a minute. */
    fx_start(fx, "taskops_orphan_cancel", NULL);
    uint64_t a = insert_row(fx, "task_type, task_state", "'c', 1");
    uint64_t b = insert_row(fx, "task_type, task_state", "'c', 1");
    long long epoch = tp_daemon_stat(&fx->d, "epoch");
    assert_true(epoch > 0);
    char vals[64];
    snprintf(vals, sizeof vals, "'c', 1, %lld", epoch);
    uint64_t mine = insert_row(fx, "task_type, task_state, epoch", vals);
    json_t *o;
    assert_int_equal(http_json(fx, "POST", &o, "/cancel?id=%llu", (unsigned long long)a), 200);
    assert_string_equal(jstr(o, "cancelled"), "unheld");
    json_decref(o);
    assert_int_equal(row_u64(fx, "task_state = 3 AND err_msg = 'cancelled'", a), 1);
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "cancel %llu", (unsigned long long)b), 0);
    assert_non_null(strstr(out, "held by no dispatcher"));
    assert_int_equal(row_u64(fx, "task_state = 3 AND err_msg = 'cancelled' AND `delayed` = 0", b), 1);
    assert_int_equal(ctl(fx, NULL, 0, "cancel %llu", (unsigned long long)b), 1);
    /* Its own epoch: maybe a claim on its way to the loop; left alone. */
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)mine), 409);
    assert_int_equal(row_u64(fx, "task_state", mine), 1);
    assert_int_equal(tp_daemon_stat(&fx->d, "table.orphans_recovered_total"), 0);
    fx->passed = true;
}

/* ---- pause and resume of unknown types ---- */

static void pause_unknown(void **state)
{
    struct fx *fx = *state;
    const char *extra[] = {"--table-stats-ms", "100", NULL};
    fx_start(fx, "taskops_pause", extra);
    wk_start(fx, "thumb-w", 1, "thumbnail", false, false);
    assert_true(tp_daemon_wait_stat(&fx->d, "workers", 1, false, WAIT_MS));
    char *body = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/pause?type=thumbnial", &body), 404);
    assert_non_null(strstr(body, "force"));
    free(body);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/resume?type=thumbnial", NULL), 404);
    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_int_equal(json_array_size(json_object_get(json_object_get(s, "paused"), "types")), 0);
    json_decref(s);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/pause?type=thumbnail", NULL), 200);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/resume?type=thumbnail", NULL), 200);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/pause?type=thumbnial&force=1", NULL), 200);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/resume?type=thumbnial&force=1", NULL), 200);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/pause?type=%FF%FE", NULL), 400);
    /* A type whose worker has gone (the type freed) is still known by name. */
    struct wk *g = wk_start(fx, "gone-w", 1, "gonetype", false, false);
    assert_true(tp_daemon_wait_stat(&fx->d, "types", 2, false, WAIT_MS));
    assert_int_equal(tp_inproc_halt(&g->run), 0);
    assert_true(tp_daemon_wait_stat(&fx->d, "types", 1, false, WAIT_MS));
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/pause?type=gonetype", NULL), 200);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/resume?type=gonetype", NULL), 200);
    /* A type the table has rows of (no worker): known once the figures show it. */
    insert_row(fx, "task_type", "'tableonly'");
    long long end = tp_mono_ms() + WAIT_MS;
    int st;
    while ((st = tp_http_request(fx->d.admin, "POST", "/pause?type=tableonly", NULL)) != 200) {
        assert_int_equal(st, 404);
        if (tp_mono_ms() > end)
            fail_msg("the table's type never became known");
        tp_sleep_ms(POLL_MS);
    }
    char out[4096];
    assert_int_equal(ctl(fx, NULL, 0, "pause --type thumbnial"), 1);
    assert_int_equal(ctl(fx, out, sizeof out, "pause --type thumbnial --force"), 0);
    assert_non_null(strstr(out, "pause thumbnial: done"));
    assert_int_equal(ctl(fx, out, sizeof out, "resume --type thumbnial --force"), 0);
    assert_int_equal(ctl(fx, NULL, 0, "pause --force"), 2);
    fx->passed = true;
}

static void post_protections(void **state)
{
    struct fx *fx = *state;
    snprintf(fx->token_path, sizeof fx->token_path, "/tmp/taskops-token-%d", (int)getpid());
    FILE *f = fopen(fx->token_path, "w");
    assert_non_null(f);
    fputs("taskops-secret\n", f);
    fclose(f);
    const char *extra[] = {"--admin-token-file", fx->token_path, NULL};
    fx_start(fx, "taskops_protect", extra);
    uint64_t a = insert_row(fx, "task_type, task_state, err_msg", "'p', 3, 'e'");
    uint64_t b = insert_row(fx, "task_type", "'p'");
    assert_int_equal(http_json(fx, "POST", NULL, "/retry?id=%llu", (unsigned long long)a), 401);
    assert_int_equal(http_json(fx, "POST", NULL, "/cancel?id=%llu", (unsigned long long)b), 401);
    assert_int_equal(http_json(fx, "GET", NULL, "/retry?id=%llu", (unsigned long long)a), 405);
    assert_int_equal(http_json(fx, "GET", NULL, "/cancel?id=%llu", (unsigned long long)b), 405);
    assert_int_equal(row_u64(fx, "task_state", a), 3);
    assert_int_equal(row_u64(fx, "task_state", b), 0);
    /* The GETs need no token. */
    assert_int_equal(http_json(fx, "GET", NULL, "/task?id=%llu", (unsigned long long)a), 200);
    assert_int_equal(http_json(fx, "GET", NULL, "/failed"), 200);
    assert_int_equal(ctl(fx, NULL, 0, "cancel %llu", (unsigned long long)b), 1);
    assert_int_equal(ctl(fx, NULL, 0, "--admin-token-file %s cancel %llu", fx->token_path, (unsigned long long)b), 0);
    assert_int_equal(ctl(fx, NULL, 0, "--admin-token-file %s retry %llu", fx->token_path, (unsigned long long)a), 0);
    assert_int_equal(row_u64(fx, "task_state", a), 0);
    assert_int_equal(row_u64(fx, "task_state", b), 3);
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(show_states, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(show_held, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(failed_list, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(failed_by_time, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(retry_failed_since, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(retry, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(cancel_new, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(cancel_buffered, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(cancel_running, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(cancel_finished, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(attempts_none_left, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(orphan_runs, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(orphan_cancel, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(pause_unknown, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(post_protections, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
