/* test_ctl_conn: how taskpushctl reaches the admin port, against the real taskpushd.
 *
 * Real components only: MariaDB (scripts/tp-mariadb, see testdb.h), the taskpushd and
 * taskpushctl of the build tree, over TCP.
 *
 * Cases:
 *   ctl_returns_at_answer  health, stats and workers each exit 0 with their answer, and
 *                          well before the client's 5 s connection timeout (once, each
 *                          waited for it: the kept-alive connection held the loop)
 *   ctl_admin_forms        HOST:PORT, http://HOST:PORT[/], [::1]:PORT and
 *                          http://[::1]:PORT[/] reach the dispatcher; https:// speaks TLS
 *                          (a plain port then does not answer: exit 1)
 *   ctl_admin_refused      a port outside 1..65535, a path, a query, a user name, an
 *                          unknown scheme, an empty host, no port, an unbracketed IPv6
 *                          address: exit 2 before any connection, with the reason
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "testdb.h"

/* The longest a command may take here. taskpushctl's connection timeout is 5 s, and the
 * bug this guards against made every command last exactly that long; a working command
 * answers in milliseconds (about 3 ms measured). 2 s is hundreds of times the normal
 * figure, so a loaded machine does not trip it, and well under 5 s, so a command that
 * waits for the timeout cannot pass. It checks "does not wait for the timeout", not speed. */
#define CTL_BOUND_MS 2000
/* Only to stop a hung taskpushctl from hanging the test. */
#define CTL_KILL_MS 30000

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d;
    bool have_daemon;
};

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    unsetenv("TASKPUSH_ADMIN");
    unsetenv("TASKPUSH_TOKEN");
    unsetenv("TASKPUSH_ADMIN_TOKEN");
    if (tp_testdb_create("ctl_conn", &fx->db) < 0)
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
    free(fx);
    return 0;
}

static void start_daemon(struct fx *fx, const char *const *extra, bool wait_leader)
{
    if (tp_daemon_start(&fx->d, fx->db.url, extra) < 0)
        fail_msg("taskpushd did not start");
    fx->have_daemon = true;
    if (wait_leader && tp_daemon_wait_leader(&fx->d, 30000) < 0) {
        tp_daemon_dump_log(&fx->d);
        fail_msg("taskpushd did not lead the table");
    }
}

/* What one run of taskpushctl did. */
struct run {
    int status; /* exit code; 128 + signal when killed */
    long long ms;
    char out[8192];
    char err[2048];
};

static void slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    unlink(path);
}

/* Runs taskpushctl --admin admin cmd (no shell: the argument reaches it as it is). */
static void run_ctl(const char *admin, const char *cmd, struct run *r)
{
    char out_path[128], err_path[128];
    snprintf(out_path, sizeof out_path, "/tmp/tp-ctl-conn-%d.out", (int)getpid());
    snprintf(err_path, sizeof err_path, "/tmp/tp-ctl-conn-%d.err", (int)getpid());
    const char *bin = tp_build_path("ctl/taskpushctl");
    long long start = tp_mono_ms();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0)
            _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        execl(bin, "taskpushctl", "--admin", admin, cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tp_mono_ms() - start > CTL_KILL_MS) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        tp_sleep_ms(1);
    }
    r->ms = tp_mono_ms() - start;
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    slurp(out_path, r->out, sizeof r->out);
    slurp(err_path, r->err, sizeof r->err);
    printf("# taskpushctl --admin '%s' %s -> %d in %lld ms%s%.*s\n", admin, cmd, r->status, r->ms,
           r->err[0] ? ": " : "", (int)strcspn(r->err, "\n"), r->err);
}

static void ctl_returns_at_answer(void **state)
{
    struct fx *fx = *state;
    start_daemon(fx, NULL, true);
    static const struct {
        const char *cmd, *says;
    } cmds[] = {
        {"health", "ok"},
        {"stats", "leading the table"},
        {"workers", "(no worker connected)"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        struct run r;
        run_ctl(fx->d.admin, cmds[i].cmd, &r);
        assert_int_equal(r.status, 0);
        if (!strstr(r.out, cmds[i].says))
            fail_msg("taskpushctl %s printed \"%s\"", cmds[i].cmd, r.out);
        if (r.ms >= CTL_BOUND_MS)
            fail_msg("taskpushctl %s took %lld ms: it waited for the connection to time out",
                     cmds[i].cmd, r.ms);
    }
}

static void ctl_admin_forms(void **state)
{
    struct fx *fx = *state;
    /* Both ports on [::1], so that the IPv6 forms have a dispatcher to reach. */
    static const char *const v6[] = {"--admin", "[::1]:0", "--listen", "[::1]:0", NULL};
    start_daemon(fx, v6, false); /* the test's HTTP client takes no [::1]: wait below */
    /* The ready file writes the bound address as HOST:PORT without brackets: take the port. */
    const char *colon = strrchr(fx->d.admin, ':');
    assert_non_null(colon);
    unsigned port = (unsigned)atoi(colon + 1);
    assert_true(port > 0 && port < 65536);
    char good[3][96];
    snprintf(good[0], sizeof good[0], "[::1]:%u", port);
    snprintf(good[1], sizeof good[1], "http://[::1]:%u", port);
    snprintf(good[2], sizeof good[2], "http://[::1]:%u/", port);
    for (size_t i = 0; i < 3; i++) {
        struct run r;
        run_ctl(good[i], "health", &r);
        /* Healthy once the database is reached: a bounded wait, the first time only. */
        for (long long end = tp_mono_ms() + 30000; i == 0 && r.status == 1 && tp_mono_ms() < end;) {
            tp_sleep_ms(100);
            run_ctl(good[i], "health", &r);
        }
        if (r.status != 0 || strncmp(r.out, "ok", 2) != 0)
            fail_msg("--admin %s: exit %d, out \"%s\", err \"%s\"", good[i], r.status, r.out, r.err);
    }
    tp_daemon_stop(&fx->d, SIGTERM, 15000);
    fx->have_daemon = false;

    start_daemon(fx, NULL, true);
    char a[4][160];
    snprintf(a[0], sizeof a[0], "%s", fx->d.admin);
    snprintf(a[1], sizeof a[1], "http://%s", fx->d.admin);
    snprintf(a[2], sizeof a[2], "http://%s/", fx->d.admin);
    snprintf(a[3], sizeof a[3], "https://%s", fx->d.admin);
    for (size_t i = 0; i < 3; i++) {
        struct run r;
        run_ctl(a[i], "health", &r);
        if (r.status != 0 || strncmp(r.out, "ok", 2) != 0)
            fail_msg("--admin %s: exit %d, out \"%s\", err \"%s\"", a[i], r.status, r.out, r.err);
    }
    /* https:// means TLS: a plain HTTP port cannot complete the handshake. */
    struct run r;
    run_ctl(a[3], "health", &r);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "no answer from"));
    assert_non_null(strstr(r.err, "TLS"));
    assert_string_equal(r.out, "");
}

static void ctl_admin_refused(void **state)
{
    (void)state; /* refused before any connection: the database is not used */
    static const struct {
        const char *admin, *says;
    } cases[] = {
        {"127.0.0.1:99999", "the port '99999' is not a number from 1 to 65535"},
        {"127.0.0.1:0", "is not a number from 1 to 65535"},
        {"127.0.0.1:+80", "is not a number from 1 to 65535"},
        {"127.0.0.1:", "is not a number from 1 to 65535"},
        {"127.0.0.1:7071/stats", "a path or query ('/stats') is not taken"},
        {"http://127.0.0.1:7071/x/", "a path or query"},
        {"127.0.0.1:7071?x=1", "a path or query"},
        {"http://admin@127.0.0.1:7071", "a user name is not taken"},
        {"ftp://127.0.0.1:7071", "unknown scheme 'ftp://'"},
        {"HTTP+unix://x", "unknown scheme"},
        {":7071", "the host is empty"},
        {"http://:7071", "the host is empty"},
        {"[]:7071", "the host is empty"},
        {"127.0.0.1", "no port"},
        {"http://", "the host is empty"},
        {"::1:7071", "write an IPv6 address as [ADDR]:PORT"},
        {"[::1]", "no port after the IPv6 address"},
        {"[::1]7071", "no port after the IPv6 address"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r;
        run_ctl(cases[i].admin, "health", &r);
        char quoted[160];
        snprintf(quoted, sizeof quoted, "taskpushctl: --admin '%s': ", cases[i].admin);
        if (r.status != 2 || strncmp(r.err, quoted, strlen(quoted)) != 0 || !strstr(r.err, cases[i].says))
            fail_msg("--admin '%s': exit %d, stderr \"%s\"; want exit 2 and \"%s\"", cases[i].admin,
                     r.status, r.err, cases[i].says);
        assert_string_equal(r.out, "");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(ctl_returns_at_answer, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(ctl_admin_forms, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(ctl_admin_refused, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests_name("ctl_conn", tests, NULL, NULL);
}
