/* test_admin: the admin port and taskpushctl against the real taskpushd.
 *
 * Real components only: MariaDB (scripts/tp-mariadb, see testdb.h), the taskpushd and
 * taskpushctl of the build tree, libtaskpush workers over TCP in threads. Waits are
 * bounded polls; nothing asserts on how long something took.
 *
 * Cases:
 *   stats_and_metrics   every documented key of /stats and /workers, values matching what ran;
 *                       /metrics counters equal /stats; `promtool check metrics` passes
 *   bad_requests        404, 405 (with Allow), garbage bytes, a 64 KB header: refused,
 *                       while a worker keeps being served
 *   ctl_pause_resume    taskpushctl pause / resume, per type and for all; 401 without token
 *   ctl_drain           drain releases buffered tasks, lets in-flight ones finish; resume
 *   ctl_requeue_failed  FAILED rows back to NEW, then run
 *   healthz_db_down     /healthz 503 while a MariaDB of the test's own is stopped, 200 after
 *   post_not_simple     a POST a browser sends cross-origin unasked (text/plain, no custom
 *                       header) gets 403 and changes nothing; X-Taskpush-Admin or JSON: 200
 *   host_header         on a loopback bind, a Host other than localhost/127.x/[::1] gets 421
 *                       (GET, POST, the page); a good one 200; on 0.0.0.0 no check
 *   admin_token         --admin-token-file: no, a wrong or the workers' bearer gets 401, the
 *                       admin token 200; taskpushctl --admin-token-file, TASKPUSH_ADMIN_TOKEN
 *   admin_token_fallback  only --token-file: the workers' token authorizes POSTs
 *   workers_non_utf8_name  a worker named with bytes FF FE is listed in /workers (as many as
 *                       /stats counts) and labelled in /metrics, U+FFFD in their place
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "proto.h"
#include "raw.h"
#include "rows.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 60000
#define POLL_MS 20
#define MAX_WK 4

/* ---- workers ---- */

struct fx;

struct wk {
    struct fx *fx;
    char name[64];
    const char *types[4];
    int ntypes;
    unsigned capacity;
    bool gated; /* handlers wait at fx->gate */
    atomic_uint_fast64_t done;
    tp_worker *w;
    tp_inproc run;
};

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
    struct wk wk[MAX_WK];
    int nwk;
    tp_gate gate;
    char token_path[128];
    char admin_token_path[128];
    int raw_fd; /* workers_non_utf8_name: its hand-made worker; 0 when none */
    char own_dir[128]; /* healthz_db_down: its MariaDB */
    bool passed;
};

static int on_task(tp_task *t, void *arg)
{
    struct wk *k = arg;
    (void)t;
    if (k->gated)
        tp_gate_pass(&k->fx->gate);
    atomic_fetch_add(&k->done, 1);
    return TP_SUCCESS;
}

static struct wk *wk_start(struct fx *fx, const char *name, unsigned capacity, bool gated, const char *t1,
                           const char *t2, const char *token)
{
    assert_true(fx->nwk < MAX_WK);
    struct wk *k = &fx->wk[fx->nwk++];
    k->fx = fx;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->capacity = capacity;
    k->gated = gated;
    k->types[k->ntypes++] = t1;
    if (t2)
        k->types[k->ntypes++] = t2;
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = fx->d.listen;
    o.name = k->name;
    o.capacity = capacity;
    o.threads = capacity;
    o.token = token;
    k->w = tp_worker_new(&o, &err);
    assert_non_null(k->w);
    for (int i = 0; i < k->ntypes; i++)
        assert_int_equal(tp_worker_add_type(k->w, k->types[i], on_task, k), 0);
    assert_int_equal(tp_inproc_start(&k->run, k->w), 0);
    return k;
}

/* ---- fixture ---- */

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    tp_gate_init(&fx->gate, false);
    *state = fx;
    return 0;
}

static void run_tp_mariadb(const char *cmd, const char *dir, bool apply_env);

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    tp_gate_set(&fx->gate, true);
    for (int i = 0; i < fx->nwk; i++) {
        struct wk *k = &fx->wk[i];
        if (tp_inproc_halt(&k->run) != 0)
            fprintf(stderr, "tp_worker_run(%s) failed\n", k->name);
        tp_worker_free(k->w);
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
    if (fx->own_dir[0]) {
        run_tp_mariadb("stop", fx->own_dir, false);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->own_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", fx->own_dir);
    }
    if (fx->token_path[0])
        unlink(fx->token_path);
    if (fx->admin_token_path[0])
        unlink(fx->admin_token_path);
    if (fx->raw_fd > 0)
        close(fx->raw_fd);
    tp_gate_destroy(&fx->gate);
    free(fx);
    return 0;
}

static void fx_daemon(struct fx *fx, const char *const *extra)
{
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, extra), 0);
    fx->have_daemon = true;
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
}

static void insert_tasks(struct fx *fx, const char *type, int n)
{
    assert_true(tp_rows_insert(&fx->db, type, n, false) == 0);
}

static uint64_t count_rows(struct fx *fx, const char *type, int state)
{
    return tp_rows_count(&fx->db, type, state);
}

/* Waits until count_rows(type, state) == want. */
static void wait_rows(struct fx *fx, const char *type, int state, uint64_t want)
{
    uint64_t n;
    if (!tp_rows_wait(&fx->db, type, state, want, WAIT_MS, POLL_MS, &n))
        fail_msg("type %s: %llu rows in state %d, want %llu", type, (unsigned long long)n, state,
                 (unsigned long long)want);
}

static void wait_stat(struct fx *fx, const char *dotted, long long want)
{
    assert_true(tp_daemon_wait_stat(&fx->d, dotted, want, false, WAIT_MS));
}

/* Runs taskpushctl with the daemon's admin port and the given arguments; the
 * exit status, and its stdout in out (when not NULL). */
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
             tp_build_path("ctl/taskpushctl"),
             fx->d.admin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    printf("# $ taskpushctl %s -> %d\n", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (out)
        snprintf(out, outlen, "%s", buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- /metrics parsing ---- */

/* The value of the sample whose name-and-labels part is exactly series; -1 when absent. */
static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (line[0] != '#' && strncmp(line, series, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    }
    return -1;
}

/* ---- cases ---- */

static const char *const spec_task_keys[] = {"claimed_total",  "dispatched_total", "succeeded_total",
                                             "failed_total",   "retried_total",    "requeued_total"};

static void stats_and_metrics(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_stats", &fx->db), 0);
    fx->have_db = true;
    const char *extra[] = {"--table-stats-ms", "100", NULL};
    fx_daemon(fx, extra);
    struct wk *a = wk_start(fx, "w-one", 4, false, "a", NULL, NULL);
    /* A name that needs escaping in a Prometheus label. */
    struct wk *b = wk_start(fx, "w\"two\\\n", 2, false, "a", NULL, NULL);
    enum { N = 300 };
    insert_tasks(fx, "a", N);
    wait_rows(fx, "a", 2, N);
    wait_stat(fx, "tasks.succeeded_total", N);
    wait_stat(fx, "queue.in_flight", 0);

    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_non_null(s);
    const char *top[] = {"uptime_s", "db_connected", "scheduler", "workers", "tasks", "queue", "rates", "table",
                         "paused", "draining"};
    for (size_t i = 0; i < sizeof top / sizeof *top; i++)
        if (!json_object_get(s, top[i]))
            fail_msg("/stats has no %s", top[i]);
    for (size_t i = 0; i < 6; i++) {
        char path[64];
        snprintf(path, sizeof path, "tasks.%s", spec_task_keys[i]);
        assert_true(tp_json_int_at(s, path) >= 0);
    }
    assert_true(json_is_true(json_object_get(s, "db_connected")));
    assert_int_equal(tp_json_int_at(s, "workers"), 2);
    assert_int_equal(tp_json_int_at(s, "tasks.claimed_total"), N);
    assert_int_equal(tp_json_int_at(s, "tasks.dispatched_total"), N);
    assert_int_equal(tp_json_int_at(s, "tasks.succeeded_total"), N);
    assert_int_equal(tp_json_int_at(s, "tasks.failed_total"), 0);
    assert_int_equal(tp_json_int_at(s, "tasks.retried_total"), 0);
    assert_int_equal(tp_json_int_at(s, "tasks.requeued_total"), 0);
    assert_int_equal(tp_json_int_at(s, "queue.buffered"), 0);
    assert_int_equal(tp_json_int_at(s, "queue.in_flight"), 0);
    assert_non_null(json_object_get(json_object_get(json_object_get(s, "rates"), "completed_per_s"), "60s"));
    assert_false(json_is_true(json_object_get(json_object_get(s, "paused"), "all")));
    json_decref(s);

    /* The table figures catch up with the table. */
    wait_stat(fx, "table.by_state.successful", N);

    json_t *ws = tp_daemon_json(&fx->d, "/workers");
    assert_true(json_is_array(ws));
    assert_int_equal(json_array_size(ws), 2);
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w) {
        const char *name = json_string_value(json_object_get(w, "name"));
        struct wk *k = strcmp(name, a->name) == 0 ? a : b;
        assert_string_equal(name, k->name);
        assert_int_equal(tp_json_int_at(w, "completed_total"), (long long)atomic_load(&k->done));
        assert_int_equal(tp_json_int_at(w, "capacity"), k->capacity);
        assert_int_equal(tp_json_int_at(w, "in_flight"), 0);
    }
    json_decref(ws);
    assert_int_equal(atomic_load(&a->done) + atomic_load(&b->done), N);

    /* /metrics against /stats. */
    char *text = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &text), 200);
    s = tp_daemon_json(&fx->d, "/stats");
    for (size_t k = 0; k < 6; k++) {
        char series[64], path[64];
        snprintf(series, sizeof series, "taskpush_%s", spec_task_keys[k]);
        snprintf(path, sizeof path, "tasks.%s", spec_task_keys[k]);
        assert_int_equal((long long)metric(text, series), tp_json_int_at(s, path));
    }
    assert_int_equal((long long)metric(text, "taskpush_workers"), 2);
    assert_int_equal((long long)metric(text, "taskpush_db_connected"), 1);
    assert_int_equal((long long)metric(text, "taskpush_queue_in_flight"), 0);
    assert_int_equal((long long)metric(text, "taskpush_task_execution_seconds_count"), N);
    assert_int_equal((long long)metric(text, "taskpush_task_execution_seconds_bucket{le=\"+Inf\"}"), N);
    assert_true(metric(text, "taskpush_claim_transaction_seconds_count") >= 1);
    assert_int_equal((long long)metric(text, "taskpush_table_tasks{state=\"successful\"}"), N);
    json_decref(s);
    /* Per worker, the escaped label. */
    assert_non_null(strstr(text, "taskpush_worker_completed_total{worker=\"w\\\"two\\\\\\n\""));
    char want[128];
    snprintf(want, sizeof want, "taskpush_worker_completed_total{worker=\"w-one\"}"); /* by name, no conn */
    const char *p = strstr(text, want);
    assert_non_null(p);
    p = strchr(p, '}');
    assert_int_equal(strtoll(p + 2, NULL, 10), (long long)atomic_load(&a->done));

    /* promtool, the reference parser and linter. */
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_admin_metrics_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int st = system(cmd);
    unlink(path);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
        fail_msg("promtool check metrics failed (status %d); is promtool installed (scripts/install-deps.sh)?", st);
    fx->passed = true;
}

/* A TCP connection to an IPv4 HOST:PORT, with a 10 s receive timeout. */
static int tcp_connect(const char *hostport)
{
    int fd = tp_raw_connect(hostport, 10);
    assert_true(fd >= 0);
    return fd;
}

/* Raw bytes to the admin port; returns the first line of the answer ("" when the
 * connection closed without one). */
static void raw_send(const char *hostport, const char *data, size_t len, char *first, size_t firstlen)
{
    int fd = tcp_connect(hostport);
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, data + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may close early: fine */
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    snprintf(first, firstlen, "%s", buf);
    close(fd);
}

static void bad_requests(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_bad", &fx->db), 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    struct wk *k = wk_start(fx, "steady", 2, false, "a", NULL, NULL);
    insert_tasks(fx, "a", 100);

    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/no/such/path", NULL), 404);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/pause", NULL), 405);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/stats", NULL), 405);
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/nope", NULL), 404);
    char first[512];
    raw_send(fx->d.admin, "GET /pause HTTP/1.0\r\n\r\n", 23, first, sizeof first);
    assert_non_null(strstr(first, " 405"));
    static const char garbage[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\xff\xfe\r\n\r\n";
    raw_send(fx->d.admin, garbage, sizeof garbage - 1, first, sizeof first);
    printf("# garbage -> '%s'\n", first);
    assert_true(first[0] == '\0' || strstr(first, " 4") != NULL);
    /* A 64 KB header. */
    size_t big = 64 * 1024 + 200;
    char *req = malloc(big);
    assert_non_null(req);
    int h = snprintf(req, big, "GET /stats HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + h, 'a', 64 * 1024);
    memcpy(req + h + 64 * 1024, "\r\n\r\n", 4);
    raw_send(fx->d.admin, req, (size_t)h + 64 * 1024 + 4, first, sizeof first);
    free(req);
    printf("# 64 KB header -> '%s'\n", first);
    assert_true(first[0] == '\0' || strstr(first, " 4") != NULL);

    /* The worker is still served: the first batch and a second one complete. */
    wait_rows(fx, "a", 2, 100);
    insert_tasks(fx, "a", 100);
    wait_rows(fx, "a", 2, 200);
    assert_int_equal(atomic_load(&k->done), 200);
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/healthz", NULL), 200);
    fx->passed = true;
}

static void write_token(struct fx *fx)
{
    snprintf(fx->token_path, sizeof fx->token_path, "/tmp/test_admin_token_%d", (int)getpid());
    FILE *f = fopen(fx->token_path, "w");
    assert_non_null(f);
    fputs("s3cret-admin-token\n", f);
    fclose(f);
}

static void ctl_pause_resume(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_pause", &fx->db), 0);
    fx->have_db = true;
    write_token(fx);
    const char *extra[] = {"--token-file", fx->token_path, NULL};
    fx_daemon(fx, extra);
    wk_start(fx, "ab", 4, false, "a", "b", "s3cret-admin-token");
    char out[16384];

    /* No token: 401, and taskpushctl exits 1. */
    assert_int_equal(tp_http_request(fx->d.admin, "POST", "/pause", NULL), 401);
    assert_int_equal(ctl(fx, NULL, 0, "pause"), 1);
    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_false(json_is_true(json_object_get(json_object_get(s, "paused"), "all")));
    json_decref(s);
    /* Bad usage: 2. */
    assert_int_equal(ctl(fx, NULL, 0, "drain --type a"), 2);
    assert_int_equal(ctl(fx, NULL, 0, "frobnicate"), 2);

    /* Pause everything: nothing is dispatched. */
    assert_int_equal(ctl(fx, out, sizeof out, "--token-file %s pause", fx->token_path), 0);
    s = tp_daemon_json(&fx->d, "/stats");
    assert_true(json_is_true(json_object_get(json_object_get(s, "paused"), "all")));
    json_decref(s);
    insert_tasks(fx, "a", 50);
    tp_sleep_ms(1500); /* a fair chance to (wrongly) dispatch */
    assert_int_equal(tp_daemon_stat(&fx->d, "tasks.dispatched_total"), 0);
    assert_int_equal(count_rows(fx, "a", 0), 50);
    assert_int_equal(ctl(fx, out, sizeof out, "--token-file %s resume", fx->token_path), 0);
    wait_rows(fx, "a", 2, 50);

    /* Pause type a only: b flows, a waits. */
    assert_int_equal(ctl(fx, out, sizeof out, "--token-file %s --json pause --type a", fx->token_path), 0);
    assert_non_null(strstr(out, "\"types\":[\"a\"]"));
    insert_tasks(fx, "a", 40);
    insert_tasks(fx, "b", 40);
    wait_rows(fx, "b", 2, 40);
    assert_int_equal(count_rows(fx, "a", 0), 40);
    assert_int_equal(ctl(fx, out, sizeof out, "--token-file %s stats", fx->token_path), 0);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
        printf("# %s\n", line);
    char again[16384];
    assert_int_equal(ctl(fx, again, sizeof again, "stats"), 0);
    assert_non_null(strstr(again, "paused types: a"));
    assert_int_equal(ctl(fx, out, sizeof out, "--token-file %s resume --type a", fx->token_path), 0);
    wait_rows(fx, "a", 2, 90);
    fx->passed = true;
}

static void ctl_drain(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_drain", &fx->db), 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    wk_start(fx, "gated", 2, true, "c", NULL, NULL);
    insert_tasks(fx, "c", 20);
    /* Two held by the worker, the rest buffered in the dispatcher. */
    long long end = tp_mono_ms() + WAIT_MS;
    while (tp_gate_waiting(&fx->gate) < 2 || tp_daemon_stat(&fx->d, "queue.buffered") != 18) {
        if (tp_mono_ms() > end)
            fail_msg("never 2 held and 18 buffered");
        tp_sleep_ms(POLL_MS);
    }
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "drain"), 0);
    printf("# %s", out);
    assert_int_equal(tp_daemon_stat(&fx->d, "queue.buffered"), 0);
    assert_int_equal(tp_daemon_stat(&fx->d, "queue.in_flight"), 2);
    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_true(json_is_true(json_object_get(s, "draining")));
    json_decref(s);
    /* The released rows are NEW again, without an attempt used. */
    wait_rows(fx, "c", 0, 18);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_state = 0 AND attempts = 0"),
                     18);
    /* The in-flight ones finish; nothing more is dispatched. */
    tp_gate_set(&fx->gate, true);
    wait_rows(fx, "c", 2, 2);
    wait_stat(fx, "queue.in_flight", 0);
    tp_sleep_ms(1000);
    assert_int_equal(tp_daemon_stat(&fx->d, "tasks.dispatched_total"), 2);
    assert_int_equal(count_rows(fx, "c", 0), 18);
    assert_true(tp_daemon_stat(&fx->d, "uptime_s") >= 0); /* still running */
    /* resume ends the drain. */
    assert_int_equal(ctl(fx, NULL, 0, "resume"), 0);
    wait_rows(fx, "c", 2, 20);
    fx->passed = true;
}

static void ctl_requeue_failed(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_requeue", &fx->db), 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    assert_true(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, task_state, attempts, err_msg) VALUES "
                                        "('a',3,3,'x'),('a',3,3,'x'),('a',3,1,'x'),('z',3,3,'x')") == 4);
    wk_start(fx, "a", 2, false, "a", NULL, NULL);
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "requeue-failed --type a"), 0);
    printf("# %s", out);
    wait_rows(fx, "a", 2, 3);
    assert_int_equal(count_rows(fx, "z", 3), 1);
    wait_stat(fx, "last_requeue.rows", 3);
    assert_int_equal(ctl(fx, out, sizeof out, "--json requeue-failed"), 0);
    wait_rows(fx, "z", 0, 1); /* all types: z back to NEW (no worker runs it) */
    fx->passed = true;
}

/* Runs the daemon binary with argv and returns its exit status; its stdout and
 * stderr together in out. */
static int run_daemon_binary(const char *const *args, char *out, size_t outlen)
{
    char cmd[2048];
    size_t used = (size_t)snprintf(cmd, sizeof cmd, "'%s'", tp_build_path("dispatcher/taskpushd"));
    for (int i = 0; args[i]; i++)
        used += (size_t)snprintf(cmd + used, sizeof cmd - used, " '%s'", args[i]);
    snprintf(cmd + used, sizeof cmd - used, " 2>&1");
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, outlen - 1, f);
    out[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* docs/taskpushd.md: --help and --version exit 0; a bad flag prints a clear message and
 * exits 2; SIGHUP does no harm (the daemon keeps serving). */
static void daemon_flags_and_sighup(void **state)
{
    struct fx *fx = *state;
    char out[8192];
    const char *const help[] = {"--help", NULL};
    assert_int_equal(run_daemon_binary(help, out, sizeof out), 0);
    assert_non_null(strstr(out, "--scheduler"));
    const char *const version[] = {"--version", NULL};
    assert_int_equal(run_daemon_binary(version, out, sizeof out), 0);
    assert_non_null(strstr(out, "taskpushd"));
    const char *const bad_flag[] = {"--db", "mysql://u@h/d", "--frobnicate", NULL};
    assert_int_equal(run_daemon_binary(bad_flag, out, sizeof out), 2);
    assert_non_null(strstr(out, "frobnicate"));
    const char *const bad_value[] = {"--db", "mysql://u@h/d", "--scheduler", "random", NULL};
    assert_int_equal(run_daemon_binary(bad_value, out, sizeof out), 2);
    assert_non_null(strstr(out, "random"));
    const char *const no_db[] = {"--listen", "127.0.0.1:0", NULL};
    unsetenv("TASKPUSH_DB");
    assert_int_equal(run_daemon_binary(no_db, out, sizeof out), 2);
    assert_non_null(strstr(out, "--db"));

    assert_int_equal(tp_testdb_create("admin_sighup", &fx->db), 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    wk_start(fx, "a", 2, false, "a", NULL, NULL);
    insert_tasks(fx, "a", 20);
    wait_rows(fx, "a", 2, 20);
    assert_int_equal(kill(fx->d.pid, SIGHUP), 0);
    insert_tasks(fx, "a", 20);
    wait_rows(fx, "a", 2, 40); /* still claiming and dispatching after SIGHUP */
    assert_int_equal(tp_daemon_log_count(&fx->d, "SIGHUP"), 1);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, 15000), 0);
    fx->passed = true;
}

/* Retention through the daemon's own flags: SUCCESSFUL rows older than
 * --retain-finished and FAILED rows older than --retain-failed are deleted, and
 * nothing else: not younger finished rows, not old NEW or PROCESSING rows. */
static void retention_flags(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_retention", &fx->db), 0);
    fx->have_db = true;
    int64_t now = tp_testdb_now_ms();
    const int64_t hour = 3600000;
    /* task_type names what each row is; last_update_time is set by hand. */
    static const struct {
        const char *type;
        int state;
        int64_t age;
        bool deleted;
    } rows[] = {
        {"ok_old", 2, 2 * 3600000LL, true},       {"ok_young", 2, 1800000LL, false},
        {"failed_old", 3, 5 * 3600000LL, true},   {"failed_young", 3, 3 * 3600000LL, false},
        {"new_old", 0, 48 * 3600000LL, false},    {"processing_old", 1, 48 * 3600000LL, false},
    };
    int want_deleted = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int k = 0; k < 30; k++) {
            assert_int_equal(tp_testdb_exec(&fx->db,
                                            "INSERT INTO task (task_type, task_state, last_update_time, "
                                            "run_after) VALUES ('%s', %d, %lld, %lld)",
                                            rows[i].type, rows[i].state, (long long)(now - rows[i].age),
                                            /* keep the NEW row away from any claim */
                                            (long long)(rows[i].state == 0 ? now + 48 * hour : 0)),
                             1);
            want_deleted += rows[i].deleted;
        }
    const char *const args[] = {"--retain-finished", "1h", "--retain-failed", "4h",
                                "--table-stats-ms", "200", NULL};
    fx_daemon(fx, args);
    wait_stat(fx, "table.retention_deleted_total", want_deleted);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        uint64_t left = tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_type = '%s'",
                                            rows[i].type);
        printf("# retention: %-15s %llu of 30 left\n", rows[i].type, (unsigned long long)left);
        assert_int_equal(left, rows[i].deleted ? 0 : 30);
    }
    fx->passed = true;
}

/* Runs scripts/tp-mariadb CMD DIR [--database tp_admin_own]; with apply_env, the
 * exports it prints become this process's environment. */
static void run_tp_mariadb(const char *cmd, const char *dir, bool apply_env)
{
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    char line[2048];
    snprintf(line, sizeof line, "'%s/scripts/tp-mariadb' %s '%s' 2>&1", root ? root : ".", cmd, dir);
    FILE *p = popen(line, "r");
    if (!p)
        return;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        char *eq;
        if (apply_env && strncmp(line, "export ", 7) == 0 && (eq = strchr(line + 7, '='))) {
            *eq = '\0';
            setenv(line + 7, eq + 1, 1);
        } else {
            printf("# %s\n", line);
        }
    }
    int st = pclose(p);
    if (apply_env)
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void wait_health(struct fx *fx, int want)
{
    long long end = tp_mono_ms() + WAIT_MS;
    int got;
    while ((got = tp_http_request(fx->d.admin, "GET", "/healthz", NULL)) != want) {
        if (tp_mono_ms() > end)
            fail_msg("/healthz answers %d, want %d", got, want);
        tp_sleep_ms(50);
    }
}

static void healthz_db_down(void **state)
{
    struct fx *fx = *state;
    snprintf(fx->own_dir, sizeof fx->own_dir, "/tmp/tpadm-%d", (int)getpid());
    /* Our own server: the shared one must stay up for the other tests. */
    static const char *const keys[] = {"TASKPUSH_TEST_MYSQL_HOST", "TASKPUSH_TEST_MYSQL_PORT",
                                       "TASKPUSH_TEST_MYSQL_SOCKET", "TASKPUSH_TEST_MYSQL_USER",
                                       "TASKPUSH_TEST_MYSQL_DIR"};
    char *saved[5];
    for (int i = 0; i < 5; i++)
        saved[i] = getenv(keys[i]) ? strdup(getenv(keys[i])) : NULL;
    run_tp_mariadb("start", fx->own_dir, true);
    int rc = tp_testdb_create("admin_health", &fx->db);
    for (int i = 0; i < 5; i++) {
        if (saved[i])
            setenv(keys[i], saved[i], 1);
        else
            unsetenv(keys[i]);
        free(saved[i]);
    }
    assert_int_equal(rc, 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    wait_health(fx, 200);

    mysql_close(fx->db.conn);
    fx->db.conn = NULL;
    run_tp_mariadb("stop", fx->own_dir, false);
    wait_health(fx, 503);
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "health"), 1);
    assert_int_equal(tp_daemon_stat(&fx->d, "db_connected"), -1); /* a boolean false, not an integer */

    run_tp_mariadb("start", fx->own_dir, false);
    wait_health(fx, 200);
    assert_int_equal(ctl(fx, out, sizeof out, "health"), 0);
    fx->db.conn = tp_testdb_connect(&fx->db);
    assert_non_null(fx->db.conn);
    fx->passed = true;
}

/* ---- the admin port's protections (issue 7, defect 8) ---- */

/* One HTTP exchange on a fresh connection, the request written exactly as formatted
 * (it should say Connection: close); the whole answer, read to EOF, in resp.
 * Returns the status, or -1 when there was none. */
static int raw_http(const char *hostport, char *resp, size_t resplen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int raw_http(const char *hostport, char *resp, size_t resplen, const char *fmt, ...)
{
    char req[4096];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(req, sizeof req, fmt, ap);
    va_end(ap);
    assert_true(len > 0 && (size_t)len < sizeof req);
    int fd = tcp_connect(hostport);
    assert_int_equal(send(fd, req, (size_t)len, MSG_NOSIGNAL), len);
    size_t used = 0;
    ssize_t n;
    while (used + 1 < resplen && (n = recv(fd, resp + used, resplen - 1 - used, 0)) > 0)
        used += (size_t)n;
    resp[used] = '\0';
    close(fd);
    int status = -1;
    if (sscanf(resp, "HTTP/%*d.%*d %d", &status) != 1)
        status = -1;
    return status;
}

/* POST path with X-Taskpush-Admin and, unless NULL, the Authorization value auth. */
static int admin_post(struct fx *fx, const char *path, const char *auth)
{
    char resp[4096];
    int st = raw_http(fx->d.admin, resp, sizeof resp,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nX-Taskpush-Admin: 1\r\n%s%s%s"
                      "Content-Length: 0\r\nConnection: close\r\n\r\n",
                      path, fx->d.admin, auth ? "Authorization: " : "", auth ? auth : "",
                      auth ? "\r\n" : "");
    printf("# POST %s (%s) -> %d\n", path, auth ? "with a bearer" : "no Authorization", st);
    return st;
}

static bool paused_all(struct fx *fx)
{
    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_non_null(s);
    bool p = json_is_true(json_object_get(json_object_get(s, "paused"), "all"));
    json_decref(s);
    return p;
}

static bool draining(struct fx *fx)
{
    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_non_null(s);
    bool d = json_is_true(json_object_get(s, "draining"));
    json_decref(s);
    return d;
}

/* What a web page can make an operator's browser send without a CORS preflight:
 * a POST with a text/plain or form body and no custom header. Refused, with a
 * message naming what is missing, and nothing changes. */
static void post_not_simple(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_csrf", &fx->db), 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    char resp[4096];
    static const char *const simple_types[] = {"text/plain", "application/x-www-form-urlencoded",
                                               "multipart/form-data; boundary=x"};
    static const char *const paths[] = {"/pause", "/drain", "/requeue-failed"};
    for (size_t i = 0; i < 3; i++) {
        int st = raw_http(fx->d.admin, resp, sizeof resp,
                          "POST %s HTTP/1.1\r\nHost: %s\r\nOrigin: http://evil.example\r\n"
                          "Content-Type: %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\nx=",
                          paths[i], fx->d.admin, simple_types[i]);
        printf("# cross-origin-style POST %s (%s) -> %d\n", paths[i], simple_types[i], st);
        assert_int_equal(st, 403);
        assert_non_null(strstr(resp, "X-Taskpush-Admin"));
    }
    assert_false(paused_all(fx));
    assert_false(draining(fx));
    json_t *s = tp_daemon_json(&fx->d, "/stats");
    assert_true(json_is_null(json_object_get(s, "last_requeue"))); /* no requeue was asked */
    json_decref(s);

    /* The same POST with the header is obeyed. */
    int st = raw_http(fx->d.admin, resp, sizeof resp,
                      "POST /pause HTTP/1.1\r\nHost: %s\r\nX-Taskpush-Admin: 1\r\n"
                      "Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nx=",
                      fx->d.admin);
    assert_int_equal(st, 200);
    assert_true(paused_all(fx));
    /* So is a JSON body, without the header. */
    st = raw_http(fx->d.admin, resp, sizeof resp,
                  "POST /resume HTTP/1.1\r\nHost: %s\r\nContent-Type: Application/JSON; charset=utf-8\r\n"
                  "Content-Length: 2\r\nConnection: close\r\n\r\n{}",
                  fx->d.admin);
    assert_int_equal(st, 200);
    assert_false(paused_all(fx));
    /* taskpushctl sends the header. */
    assert_int_equal(ctl(fx, NULL, 0, "pause"), 0);
    assert_true(paused_all(fx));
    fx->passed = true;
}

/* DNS rebinding: the browser reaches the loopback port under the attacker's name. */
static void host_header(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_host", &fx->db), 0);
    fx->have_db = true;
    fx_daemon(fx, NULL);
    const char *port = strrchr(fx->d.admin, ':') + 1;
    char resp[4096], host[128];
    static const char *const bad[] = {"evil.example", "evil.example:%s", "127.0.0.1.evil.example:%s",
                                      "localhost.evil.example", "", "[::2]:%s", "127.0.0.1:%sx",
                                      "10.0.0.1:%s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(host, sizeof host, bad[i], port);
        int st = raw_http(fx->d.admin, resp, sizeof resp,
                          "GET /stats HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host);
        printf("# GET /stats, Host '%s' -> %d\n", host, st);
        assert_int_equal(st, 421);
        assert_null(strstr(resp, "uptime_s"));
    }
    snprintf(host, sizeof host, "evil.example:%s", port);
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host),
                     421);
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "POST /pause HTTP/1.1\r\nHost: %s\r\nX-Taskpush-Admin: 1\r\n"
                              "Content-Length: 0\r\nConnection: close\r\n\r\n",
                              host),
                     421);
    assert_false(paused_all(fx));
    /* An absolute request target names a host too. */
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "GET http://evil.example/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Connection: close\r\n\r\n"),
                     421);
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "GET http://localhost/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Connection: close\r\n\r\n"),
                     200);

    static const char *const good[] = {"127.0.0.1:%s", "127.0.0.1", "localhost:%s", "LocalHost",
                                       "[::1]:%s", "[::1]", "127.0.0.2:%s"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(host, sizeof host, good[i], port);
        int st = raw_http(fx->d.admin, resp, sizeof resp,
                          "GET /stats HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host);
        printf("# GET /stats, Host '%s' -> %d\n", host, st);
        assert_int_equal(st, 200);
    }
    snprintf(host, sizeof host, "localhost:%s", port);
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "POST /pause HTTP/1.1\r\nHost: %s\r\nX-Taskpush-Admin: 1\r\n"
                              "Content-Length: 0\r\nConnection: close\r\n\r\n",
                              host),
                     200);
    assert_true(paused_all(fx));

    /* Bound to every address, the port is reached under names it cannot know: no check. */
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, 15000), 0);
    unlink(fx->d.log_path);
    const char *const any[] = {"--admin", "0.0.0.0:0", NULL};
    fx_daemon(fx, any);
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "GET /stats HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"),
                     200);
    fx->passed = true;
}

static void write_file(char *path, size_t pathlen, const char *tag, const char *text)
{
    snprintf(path, pathlen, "/tmp/test_admin_%s_%d", tag, (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void admin_token(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_token", &fx->db), 0);
    fx->have_db = true;
    write_token(fx); /* the workers' token: s3cret-admin-token */
    write_file(fx->admin_token_path, sizeof fx->admin_token_path, "admin_token", "0per4tor-only\n");
    const char *extra[] = {"--token-file", fx->token_path, "--admin-token-file", fx->admin_token_path, NULL};
    fx_daemon(fx, extra);
    /* The workers' token still admits a worker. */
    wk_start(fx, "w", 1, false, "a", NULL, "s3cret-admin-token");
    wait_stat(fx, "workers", 1);

    assert_int_equal(admin_post(fx, "/pause", NULL), 401);
    assert_int_equal(admin_post(fx, "/pause", "Bearer wrong"), 401);
    assert_int_equal(admin_post(fx, "/pause", "Bearer 0per4tor-onlyX"), 401);
    assert_int_equal(admin_post(fx, "/pause", "Bearer 0per4tor-onl"), 401);
    assert_int_equal(admin_post(fx, "/pause", "0per4tor-only"), 401);
    assert_int_equal(admin_post(fx, "/pause", "Bearer s3cret-admin-token"), 401); /* the workers' */
    assert_false(paused_all(fx));
    assert_int_equal(admin_post(fx, "/pause", "Bearer 0per4tor-only"), 200);
    assert_true(paused_all(fx));

    /* taskpushctl: the admin token file, not the workers'; or TASKPUSH_ADMIN_TOKEN. */
    assert_int_equal(ctl(fx, NULL, 0, "--admin-token-file %s resume", fx->admin_token_path), 0);
    assert_false(paused_all(fx));
    assert_int_equal(ctl(fx, NULL, 0, "--token-file %s pause", fx->token_path), 1);
    assert_false(paused_all(fx));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "env -u TASKPUSH_TOKEN TASKPUSH_ADMIN_TOKEN=0per4tor-only %s --admin %s pause >/dev/null",
             tp_build_path("ctl/taskpushctl"), fx->d.admin);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(paused_all(fx));
    /* Neither secret reaches the log. */
    assert_int_equal(tp_daemon_log_count(&fx->d, "0per4tor"), 0);
    assert_int_equal(tp_daemon_log_count(&fx->d, "s3cret"), 0);
    fx->passed = true;
}

/* Without --admin-token-file the workers' token authorizes POSTs; it does not
 * stand in for the non-simple request. */
static void admin_token_fallback(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_token_fb", &fx->db), 0);
    fx->have_db = true;
    write_token(fx);
    const char *extra[] = {"--token-file", fx->token_path, NULL};
    fx_daemon(fx, extra);
    char resp[4096];
    assert_int_equal(raw_http(fx->d.admin, resp, sizeof resp,
                              "POST /pause HTTP/1.1\r\nHost: %s\r\n"
                              "Authorization: Bearer s3cret-admin-token\r\n"
                              "Content-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                              fx->d.admin),
                     403);
    assert_int_equal(admin_post(fx, "/pause", NULL), 401);
    assert_int_equal(admin_post(fx, "/pause", "Bearer wrong"), 401);
    assert_false(paused_all(fx));
    assert_int_equal(admin_post(fx, "/pause", "Bearer s3cret-admin-token"), 200);
    assert_true(paused_all(fx));
    fx->passed = true;
}

/* A worker named with bytes that are not UTF-8 (only its HELLO says what its name
 * is): listed in /workers like any other, each bad byte as U+FFFD. */
static void workers_non_utf8_name(void **state)
{
    struct fx *fx = *state;
    assert_int_equal(tp_testdb_create("admin_utf8", &fx->db), 0);
    fx->have_db = true;
    const char *extra[] = {"--heartbeat-ms", "60000", NULL}; /* the raw worker sends none */
    fx_daemon(fx, extra);
    wk_start(fx, "good", 1, false, "a", NULL, NULL);

    static const char name[] = "bad\xff\xfename";
    fx->raw_fd = tcp_connect(fx->d.listen);
    assert_int_equal(tp_raw_hello(fx->raw_fd, name, sizeof name - 1, "a"), 0);
    wait_stat(fx, "workers", 2);

    json_t *ws = tp_daemon_json(&fx->d, "/workers");
    assert_true(json_is_array(ws));
    printf("# /workers lists %zu, /stats counts %lld\n", json_array_size(ws),
           tp_daemon_stat(&fx->d, "workers"));
    assert_int_equal(json_array_size(ws), tp_daemon_stat(&fx->d, "workers"));
    bool seen = false;
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w) {
        if (strcmp(json_string_value(json_object_get(w, "name")), "bad\xEF\xBF\xBD\xEF\xBF\xBDname") == 0) {
            seen = true;
            assert_int_equal(tp_json_int_at(w, "capacity"), 1);
        }
    }
    json_decref(ws);
    assert_true(seen);
    /* /metrics labels it the same way (the format wants UTF-8). */
    char *text = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &text), 200);
    bool labelled =
        strstr(text, "taskpush_worker_capacity{worker=\"bad\xEF\xBF\xBD\xEF\xBF\xBDname\"") != NULL;
    free(text);
    assert_true(labelled);
    /* taskpushctl prints it. */
    char out[4096];
    assert_int_equal(ctl(fx, out, sizeof out, "workers"), 0);
    assert_non_null(strstr(out, "bad\xEF\xBF\xBD\xEF\xBF\xBDname"));
    fx->passed = true;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(stats_and_metrics, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(bad_requests, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(ctl_pause_resume, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(ctl_drain, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(ctl_requeue_failed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(retention_flags, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(daemon_flags_and_sighup, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(healthz_db_down, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(post_not_simple, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(host_header, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(admin_token, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(admin_token_fallback, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(workers_non_utf8_name, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests_name("admin", tests, NULL, NULL);
}
