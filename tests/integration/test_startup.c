/* test_startup: what taskpushd does at start with a wrong --db, an absent database
 * server, ports open beyond loopback, and malformed addresses.
 *
 * Real components only: MariaDB (scripts/tp-mariadb, see testdb.h) and the taskpushd of
 * the build tree. Waits are bounded polls; nothing asserts on how long something took.
 *
 * Cases:
 *   db_wrong_password     a password the server refuses (error 1045): exit 1, and the log
 *                         names the error and what to check
 *   db_unknown_database   a DBNAME the server does not have (error 1049): exit 1, likewise
 *   db_server_down        nothing listens on the --db port (a network error): still running
 *                         after 3 s, /healthz 503, the log says it retries; SIGTERM: exit 0
 *   open_port_warning     --admin or --listen on 0.0.0.0 without a token: one WARN line
 *                         naming the port and the flag to set; with --token-file or (admin
 *                         only) --admin-token-file, or on loopback: none
 *   bad_addresses         --listen/--admin with a scheme, a port over 65535 or a path:
 *                         exit 2 with the reason
 *   bad_durations         a duration flag with garbage, an overflow or a value beyond its
 *                         range in any unit: exit 2 naming the flag and the forms taken
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
#include "testdb.h"

/* Bounds of the polls: only so that a hung daemon fails the test instead of hanging it. */
#define EXIT_WAIT_MS 30000
#define WARN_TEXT "beyond loopback without a token"

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
    char log_path[256];
};

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    unsetenv("TASKPUSH_TOKEN");
    unsetenv("TASKPUSH_ADMIN_TOKEN");
    unsetenv("TASKPUSH_DB");
    if (tp_testdb_create("startup", &fx->db) < 0)
        return -1;
    fx->have_db = true;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->have_daemon)
        tp_daemon_stop(&fx->d, SIGTERM, 15000);
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    if (fx->log_path[0])
        unlink(fx->log_path);
    free(fx);
    return 0;
}

static bool file_has(const char *path, const char *needle)
{
    char buf[16384];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return strstr(buf, needle) != NULL;
}

/* Runs taskpushd with argv (NULL-terminated, argv[0] ignored) until it exits, stderr into
 * fx->log_path; returns its exit code, or -1 when it was still running after
 * EXIT_WAIT_MS (then killed). The ready file is not waited for: it may exit first. */
static int run_to_exit(struct fx *fx, const char *const *args)
{
    snprintf(fx->log_path, sizeof fx->log_path, "/tmp/tp-startup-%d.log", (int)getpid());
    const char *argv[32] = {tp_build_path("dispatcher/taskpushd")};
    int argc = 1;
    for (int i = 0; args[i] && argc < 31; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(fx->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(126);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    for (long long end = tp_mono_ms() + EXIT_WAIT_MS; waitpid(pid, &st, WNOHANG) == 0;) {
        if (tp_mono_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        tp_sleep_ms(10);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void dump(const char *path)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    fprintf(stderr, "---- %s ----\n%s", path, buf);
}

static void expect_config_exit(struct fx *fx, const char *url, const char *const *needles)
{
    const char *args[] = {"--db", url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", NULL};
    int rc = run_to_exit(fx, args);
    for (size_t i = 0; needles[i]; i++)
        if (!file_has(fx->log_path, needles[i])) {
            dump(fx->log_path);
            fail_msg("the log does not say \"%s\"", needles[i]);
        }
    if (rc != 1) {
        dump(fx->log_path);
        fail_msg("taskpushd --db %s: exit %d, not 1", url, rc);
    }
    /* Refused, not an outage: nothing says it retries. */
    assert_false(file_has(fx->log_path, "retrying"));
}

static void db_wrong_password(void **state)
{
    struct fx *fx = *state;
    char url[600];
    snprintf(url, sizeof url, "mysql://%s:not-the-password@%s:%u/%s", fx->db.user, fx->db.host,
             fx->db.port, fx->db.name);
    const char *says[] = {"MySQL error 1045", "Access denied", "check the user and password of --db",
                          NULL};
    expect_config_exit(fx, url, says);
}

static void db_unknown_database(void **state)
{
    struct fx *fx = *state;
    char url[600];
    snprintf(url, sizeof url, "mysql://%s@%s:%u/tp_no_such_db_%d", fx->db.user, fx->db.host, fx->db.port,
             (int)getpid());
    const char *says[] = {"MySQL error 1049", "Unknown database", "check DBNAME of --db", NULL};
    expect_config_exit(fx, url, says);
}

/* A loopback port nobody listens on: bound, read, closed. */
static unsigned dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void db_server_down(void **state)
{
    struct fx *fx = *state;
    char url[600];
    snprintf(url, sizeof url, "mysql://%s@127.0.0.1:%u/%s", fx->db.user, dead_port(), fx->db.name);
    if (tp_daemon_start(&fx->d, url, NULL) < 0)
        fail_msg("taskpushd did not start with its database down");
    fx->have_daemon = true;
    /* Several reconnects happen in 3 s (backoff from 100 ms): none may end the process. */
    tp_sleep_ms(3000);
    int st;
    if (waitpid(fx->d.pid, &st, WNOHANG) != 0) {
        tp_daemon_dump_log(&fx->d);
        fail_msg("taskpushd exited while its database was down");
    }
    char *body = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/healthz", &body), 503);
    free(body);
    assert_true(tp_daemon_log_count(&fx->d, "retrying with backoff") >= 1);
    assert_int_equal(tp_daemon_log_count(&fx->d, "refused taskpushd"), 0);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, EXIT_WAIT_MS), 0);
    fx->have_daemon = false;
}

/* Starts taskpushd with extra, and returns how many log lines carry the warning. The
 * warning is logged before the ready file is written, so it is there on return. */
static int warnings_with(struct fx *fx, const char *const *extra)
{
    if (tp_daemon_start(&fx->d, fx->db.url, extra) < 0)
        fail_msg("taskpushd did not start");
    fx->have_daemon = true;
    int n = tp_daemon_log_count(&fx->d, WARN_TEXT);
    if (n > 0)
        printf("# warned (%d line(s)) with %s %s\n", n, extra[0], extra[1]);
    tp_daemon_stop(&fx->d, SIGTERM, EXIT_WAIT_MS);
    fx->have_daemon = false;
    return n;
}

static void open_port_warning(void **state)
{
    struct fx *fx = *state;
    char token[] = "/tmp/tp-startup-token-XXXXXX";
    int fd = mkstemp(token);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cret\n", 7), 7);
    close(fd);

    const char *admin_open[] = {"--admin", "0.0.0.0:0", NULL};
    assert_int_equal(warnings_with(fx, admin_open), 1);
    assert_true(tp_daemon_log_count(&fx->d, "warn") >= 1);
    assert_int_equal(tp_daemon_log_count(&fx->d, "the admin port 0.0.0.0:"), 1);
    assert_int_equal(tp_daemon_log_count(&fx->d, "set --admin-token-file"), 1);

    const char *workers_open[] = {"--listen", "0.0.0.0:0", NULL};
    assert_int_equal(warnings_with(fx, workers_open), 1);
    assert_int_equal(tp_daemon_log_count(&fx->d, "the worker port 0.0.0.0:"), 1);
    assert_int_equal(tp_daemon_log_count(&fx->d, "set --token-file"), 1);

    const char *both_open[] = {"--listen", "0.0.0.0:0", "--admin", "0.0.0.0:0", NULL};
    assert_int_equal(warnings_with(fx, both_open), 1); /* one line for both */

    const char *admin_token[] = {"--admin", "0.0.0.0:0", "--admin-token-file", token, NULL};
    assert_int_equal(warnings_with(fx, admin_token), 0);
    const char *worker_token[] = {"--listen", "0.0.0.0:0", "--admin", "0.0.0.0:0", "--token-file", token, NULL};
    assert_int_equal(warnings_with(fx, worker_token), 0);
    const char *loopback[] = {"--admin", "127.0.0.1:0", NULL};
    assert_int_equal(warnings_with(fx, loopback), 0);
    /* The admin token does not protect the worker port. */
    const char *workers_only_admin_token[] = {"--listen", "0.0.0.0:0", "--admin-token-file", token, NULL};
    assert_int_equal(warnings_with(fx, workers_only_admin_token), 1);
    unlink(token);
}

static void bad_addresses(void **state)
{
    struct fx *fx = *state;
    static const struct {
        const char *flag, *value, *says;
    } cases[] = {
        {"--admin", "http://127.0.0.1:7071", "no scheme such as http://"},
        {"--listen", "127.0.0.1:99999", "the port is not a number from 0 to 65535"},
        {"--admin", "127.0.0.1:7071/stats", "no path"},
        {"--listen", ":7070", "the host is empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[] = {"--db", fx->db.url, cases[i].flag, cases[i].value, NULL};
        char want[200];
        snprintf(want, sizeof want, "taskpushd: %s '%s': %s", cases[i].flag, cases[i].value, cases[i].says);
        int rc = run_to_exit(fx, args);
        if (rc != 2 || !file_has(fx->log_path, want)) {
            dump(fx->log_path);
            fail_msg("%s %s: exit %d; want exit 2 and \"%s\"", cases[i].flag, cases[i].value, rc, want);
        }
    }
}

static void bad_durations(void **state)
{
    struct fx *fx = *state;
    static const char *const cases[][2] = {
        {"--task-timeout-ms", "30x"},
        {"--heartbeat-ms", "99999999999999999999"},
        {"--task-timeout-ms", "25d"},
        {"--retain-finished", "-7d"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[] = {"--db", fx->db.url, cases[i][0], cases[i][1], NULL};
        char want[200];
        snprintf(want, sizeof want, "taskpushd: %s: '%s' is not a duration", cases[i][0], cases[i][1]);
        int rc = run_to_exit(fx, args);
        if (rc != 2 || !file_has(fx->log_path, want)) {
            dump(fx->log_path);
            fail_msg("%s %s: exit %d; want exit 2 and \"%s\"", cases[i][0], cases[i][1], rc, want);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(db_wrong_password, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(db_unknown_database, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(db_server_down, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(open_port_warning, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(bad_addresses, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(bad_durations, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests_name("startup", tests, NULL, NULL);
}
