/* test_ports: a peer at the wrong port, or at no port, is told so at once (issue 32,
 * items 1 and 2), against the real taskpushd over TCP.
 *
 * Real components only: MariaDB (scripts/tp-mariadb, see testdb.h), the taskpushd,
 * taskpushctl and taskpush-worker of the build tree.
 *
 * Cases:
 *   ctl_refused         taskpushctl submit to a port nothing listens on: exit 1 within
 *                       2 s, "refused" in the message (it used to wait 30 s)
 *   ctl_admin_port      taskpushctl submit --worker at the admin port: exit 1 within 2 s,
 *                       the message names the admin port
 *   ctl_general_options --admin before and after `submit`, and after `stats`, accepted
 *   worker_admin_port   taskpush-worker (libtaskpush) at the admin port logs that it is
 *                       the admin port within 3 s (not a 5 s handshake timeout), and
 *                       taskpushd logs a worker at its admin port
 *   worker_http_server  libtaskpush says "an HTTP server answered" of any HTTP server's
 *                       answer to its HELLO, within 3 s
 *   http_worker_port    an HTTP request on the worker port is answered 400 with where
 *                       the admin port is; 200 of them are logged rate-limited; the
 *                       admin port still serves HTTP and the worker port workers
 *   metrics_reconnects  (item 7) the series /metrics showed over 101 sessions of one
 *                       worker are those of the first (they were labelled by
 *                       connection id: 3 new ones a reconnect); taskpush_build_info
 *
 * The 2 s and 3 s bounds: each thing timed is immediate when it works (a refused connect,
 * an answer to the first bytes), a few ms measured; without the change each lasted 5 s or
 * 30 s. So they check "does not wait for a timeout", not speed, and a loaded machine does
 * not trip them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
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
#include "run.h"
#include "testdb.h"

#define BOUND_MS 2000
#define WORKER_BOUND_MS 3000

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
};

static int group_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    unsetenv("TASKPUSH_ADMIN");
    unsetenv("TASKPUSH_WORKER");
    unsetenv("TASKPUSH_TOKEN");
    if (tp_testdb_create("ports", &fx->db) < 0)
        return -1;
    fx->have_db = true;
    if (tp_daemon_start(&fx->d, fx->db.url, NULL) < 0)
        return -1;
    fx->have_daemon = true;
    if (tp_daemon_wait_leader(&fx->d, 30000) < 0) {
        tp_daemon_dump_log(&fx->d);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->have_daemon)
        tp_daemon_stop(&fx->d, SIGTERM, 15000);
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

/* Runs taskpushctl with args (NULL-terminated, after argv[0]); returns its exit code,
 * its output (stdout and stderr) in out and how long it took in *ms. */
static int ctl(char *out, size_t cap, long long *ms, ...)
{
    const char *argv[24] = {tp_build_path("ctl/taskpushctl")};
    size_t n = 1;
    va_list ap;
    va_start(ap, ms);
    for (const char *a; n < 23 && (a = va_arg(ap, const char *));)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    long long start = tp_mono_ms();
    int rc = tp_run(argv, NULL, out, cap, 30000);
    *ms = tp_mono_ms() - start;
    printf("# exit %d in %lld ms\n", rc, *ms);
    return rc;
}

/* A loopback port nothing listens on: bound by the kernel, then closed. */
static unsigned closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void ctl_refused(void **state)
{
    (void)state;
    char where[64], out[4096];
    long long ms;
    snprintf(where, sizeof where, "127.0.0.1:%u", closed_port());
    int rc = ctl(out, sizeof out, &ms, "submit", "--worker", where, "--type", "t", NULL);
    assert_int_equal(rc, 1);
    if (!strstr(out, "refused"))
        fail_msg("no \"refused\" in: %s", out);
    if (ms >= BOUND_MS)
        fail_msg("took %lld ms: it waited for a timeout", ms);
}

static void ctl_admin_port(void **state)
{
    struct fx *fx = *state;
    char out[4096];
    long long ms;
    int rc = ctl(out, sizeof out, &ms, "submit", "--worker", fx->d.admin, "--type", "t", NULL);
    assert_int_equal(rc, 1);
    if (!strstr(out, "admin HTTP port") || !strstr(out, fx->d.admin))
        fail_msg("the admin port is not named in: %s", out);
    if (ms >= BOUND_MS)
        fail_msg("took %lld ms: it waited for a timeout", ms);
}

static bool is_id_line(const char *out)
{
    /* tp_run echoes nothing into out: the first line is the task id. */
    size_t d = strspn(out, "0123456789");
    return d > 0 && out[d] == '\n';
}

static void ctl_general_options(void **state)
{
    struct fx *fx = *state;
    char out[4096];
    long long ms;
    assert_int_equal(ctl(out, sizeof out, &ms, "--admin", fx->d.admin, "submit", "--worker", fx->d.listen,
                         "--type", "t", NULL), 0);
    assert_true(is_id_line(out));
    assert_int_equal(ctl(out, sizeof out, &ms, "submit", "--type", "t", "--worker", fx->d.listen, "--admin",
                         fx->d.admin, NULL), 0);
    assert_true(is_id_line(out));
    assert_int_equal(ctl(out, sizeof out, &ms, "stats", "--admin", fx->d.admin, NULL), 0);
    /* A general option still takes its value. */
    assert_int_equal(ctl(out, sizeof out, &ms, "submit", "--type", "t", "--worker", fx->d.listen, "--admin",
                         NULL), 2);
}

/* Whether the file at path has needle, polled until deadline_ms (tp_mono_ms). */
static bool file_has(const char *path, const char *needle, long long deadline_ms)
{
    char buf[16384];
    do {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        if (strstr(buf, needle))
            return true;
        tp_sleep_ms(20);
    } while (tp_mono_ms() < deadline_ms);
    printf("# %s has no \"%s\":\n%s\n", path, needle, buf);
    return false;
}

/* Runs taskpush-worker --connect at; true when its log has needle within bound_ms of its
 * first line ("starting"): the bound is the connection's, not the start of a process
 * that a loaded machine (an ASan build beside another suite) may take seconds to run. */
static bool worker_says(const char *at, const char *needle, long long bound_ms, const char *also)
{
    char log_path[128];
    snprintf(log_path, sizeof log_path, "/tmp/tp-ports-worker-%d.log", (int)getpid());
    long long start = tp_mono_ms();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int e = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (e < 0)
            _exit(126);
        dup2(e, 1);
        dup2(e, 2);
        execl(tp_build_path("worker-client/taskpush-worker"), "taskpush-worker", "--connect", at, "--type", "t",
              "--exec", "true", (char *)NULL);
        _exit(127);
    }
    bool started = file_has(log_path, "starting", start + 60000);
    long long from = tp_mono_ms();
    bool said = started && file_has(log_path, needle, from + bound_ms);
    long long ms = tp_mono_ms() - from;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    bool named = !also || file_has(log_path, also, 0);
    unlink(log_path);
    printf("# the worker's log said \"%s\" %lld ms after its start (%lld ms after the fork)\n", needle, ms,
           from - start);
    return said && named;
}

static void worker_admin_port(void **state)
{
    struct fx *fx = *state;
    int before = tp_daemon_log_count(&fx->d, "a worker connected to the admin port");
    assert_true(worker_says(fx->d.admin, "admin HTTP port", WORKER_BOUND_MS, fx->d.admin));
    bool logged = false;
    for (long long end = tp_mono_ms() + 2000; !logged && tp_mono_ms() < end; tp_sleep_ms(20))
        logged = tp_daemon_log_count(&fx->d, "a worker connected to the admin port") > before;
    assert_true(logged);
}

/* libtaskpush recognises any HTTP server's answer to its HELLO ("HTTP/" where a length
 * should be), not only taskpushd's admin port. */
static void worker_http_server(void **state)
{
    (void)state;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(ls >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(ls, 8), 0);
    assert_int_equal(getsockname(ls, (struct sockaddr *)&sa, &sl), 0);
    pid_t srv = fork();
    assert_true(srv >= 0);
    if (srv == 0) {
        static const char ans[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        for (;;) {
            int c = accept(ls, NULL, NULL);
            if (c >= 0) {
                if (send(c, ans, sizeof ans - 1, MSG_NOSIGNAL) < 0) {
                    /* the worker went: the next */
                }
                close(c);
            }
        }
    }
    close(ls);
    char at[64];
    snprintf(at, sizeof at, "127.0.0.1:%u", ntohs(sa.sin_port));
    bool said = worker_says(at, "an HTTP server answered", WORKER_BOUND_MS, NULL);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    assert_true(said);
}

/* Sends an HTTP request to the worker port; returns what came back (up to EOF). */
static void http_at(const char *hostport, char *buf, size_t cap)
{
    int fd = tp_raw_connect(hostport, 5);
    assert_true(fd >= 0);
    static const char req[] = "GET /stats HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert_int_equal(tp_raw_send(fd, req, sizeof req - 1), 0);
    size_t n = 0;
    for (ssize_t k; n < cap - 1 && (k = recv(fd, buf + n, cap - 1 - n, 0)) > 0;)
        n += (size_t)k;
    buf[n] = '\0';
    close(fd);
}

static void http_worker_port(void **state)
{
    struct fx *fx = *state;
    static const char needle[] = "an HTTP request on the worker port";
    int before = tp_daemon_log_count(&fx->d, needle);
    char buf[2048], want[200];
    http_at(fx->d.listen, buf, sizeof buf);
    printf("# %.*s\n", (int)strcspn(buf, "\r\n"), buf);
    assert_true(strncmp(buf, "HTTP/1.0 400 ", 13) == 0);
    snprintf(want, sizeof want, "the admin HTTP is at --admin %s", fx->d.admin);
    if (!strstr(buf, want))
        fail_msg("no \"%s\" in the answer", want);
    /* 200 more: logged, but not 200 times (10 lines a second at most). */
    long long start = tp_mono_ms();
    for (int i = 0; i < 200; i++) {
        http_at(fx->d.listen, buf, sizeof buf);
        assert_true(strncmp(buf, "HTTP/1.0 400 ", 13) == 0);
    }
    long long secs = (tp_mono_ms() - start) / 1000 + 2;
    tp_sleep_ms(100);
    int lines = tp_daemon_log_count(&fx->d, needle) - before;
    printf("# 201 requests in %lld ms, %d log lines\n", tp_mono_ms() - start, lines);
    assert_true(lines >= 1);
    assert_true(lines <= 10 * secs && lines < 201);
    /* Both ports still do their own work. */
    char *body = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/healthz", &body), 200);
    free(body);
    char out[4096];
    long long ms;
    assert_int_equal(ctl(out, sizeof out, &ms, "submit", "--worker", fx->d.listen, "--type", "t", NULL), 0);
    assert_true(is_id_line(out));
}

/* The series of /metrics (lines that are not comments), and whether it has needle. */
static int series_count(const struct fx *fx, const char *needle, bool *has)
{
    char *text = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &text), 200);
    int n = 0;
    for (const char *p = text; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        n += *p != '#' && *p != '\n';
    *has = strstr(text, needle) != NULL;
    free(text);
    return n;
}

/* The series seen so far: each line's name and labels, without its value. */
struct series_set {
    char **v;
    size_t n, cap;
};

static void series_add(struct series_set *set, const char *text)
{
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        const char *sp = memchr(p, ' ', len);
        /* The table's figures come per type and state as its reading lists them (a type
         * with a worker may appear a reading later): bounded by the types, not by
         * connections, so not counted here. */
        bool table = strncmp(p, "taskpush_table_", strlen("taskpush_table_")) == 0;
        if (*p != '#' && sp && !table) {
            size_t k = (size_t)(sp - p), i = 0;
            while (i < set->n && !(strlen(set->v[i]) == k && memcmp(set->v[i], p, k) == 0))
                i++;
            if (i == set->n) {
                if (set->n == set->cap) {
                    set->cap = set->cap ? set->cap * 2 : 256;
                    set->v = realloc(set->v, set->cap * sizeof *set->v);
                    assert_non_null(set->v);
                }
                set->v[set->n++] = strndup(p, k);
            }
        }
        p += len + (p[len] == '\n');
    }
}

/* One session of worker "host-a": HELLO, WELCOME, a scrape of /metrics while it is
 * connected (its series are there), close. */
static void session_scraped(const struct fx *fx, struct series_set *set)
{
    int fd = tp_raw_connect(fx->d.listen, 5);
    assert_true(fd >= 0);
    assert_int_equal(tp_raw_hello(fd, "host-a", 6, "t"), 0);
    uint8_t buf[4096];
    assert_true(tp_raw_read_frame(fd, buf, sizeof buf) > 0);
    assert_int_equal(buf[0], PROTO_WELCOME);
    char *text = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &text), 200);
    assert_non_null(strstr(text, "{worker=\"host-a\""));
    series_add(set, text);
    free(text);
    close(fd);
}

/* What Prometheus keeps is every series it ever scraped: with the connection id as a
 * label, each reconnect added new ones. Scraped during each of 101 sessions, the
 * series of the first are all there is. */
static void metrics_reconnects(void **state)
{
    struct fx *fx = *state;
    bool valid = false;
    for (long long end = tp_mono_ms() + 30000; !valid && tp_mono_ms() < end; tp_sleep_ms(50))
        series_count(fx, "taskpush_table_stats_valid 1", &valid);
    assert_true(valid);
    struct series_set set = {0};
    session_scraped(fx, &set);
    size_t first = set.n;
    for (int i = 0; i < 100; i++)
        session_scraped(fx, &set);
    printf("# /metrics series: %zu in the first session, %zu seen over 101\n", first, set.n);
    for (size_t i = first; i < set.n && i < first + 10; i++)
        printf("# new: %s\n", set.v[i]);
    assert_int_equal(set.n, first);
    for (size_t i = 0; i < set.n; i++)
        free(set.v[i]);
    free(set.v);
    bool has = false;
    series_count(fx, "taskpush_build_info{version=\"" TASKPUSH_VERSION "\"} 1\n", &has);
    assert_true(has);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ctl_refused),
        cmocka_unit_test(ctl_admin_port),
        cmocka_unit_test(ctl_general_options),
        cmocka_unit_test(worker_admin_port),
        cmocka_unit_test(worker_http_server),
        cmocka_unit_test(http_worker_port),
        cmocka_unit_test(metrics_reconnects),
    };
    return cmocka_run_group_tests_name("ports", tests, group_setup, group_teardown);
}
