/* test_worker_cli.c: the taskpush-worker program (TASKPUSH_WORKER_BIN, set by
 * meson): its command line, and the program against the fake dispatcher
 * (fake_dispatcher.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_harness.h"
#include "exec_harness.h"
#include "fake_dispatcher.h"
#include "proto.h"

extern char **environ;

/* worker_bin: the program under test. meson test always sets TASKPUSH_WORKER_BIN,
 * so a missing or unusable one is a broken set-up: the test fails, never skips. */
static const char *worker_bin(void)
{
    const char *bin = getenv("TASKPUSH_WORKER_BIN");

    if (bin == NULL || access(bin, X_OK) != 0)
        fail_msg("TASKPUSH_WORKER_BIN=%s is not an executable taskpush-worker "
                 "(meson test sets it; run this test through meson test)",
                 bin != NULL ? bin : "(unset)");
    return bin;
}

/* run_cli runs the program with args (a shell word list) and captures it. */
static void run_cli(const char *args, tpw_exec_res *res)
{
    char cmd[1024];
    tpw_exec_req q;

    snprintf(cmd, sizeof(cmd), "exec '%s' %s", worker_bin(), args);
    q = exec_req(cmd, NULL, 0);
    q.err_max = 4096;
    assert_int_equal(run_exec(&q, res), 0);
    assert_true(WIFEXITED(res->status));
}

static void test_worker_cli(void **state)
{
    static const char *const bad[] = {
        "",
        "--type a --exec true",
        "--connect 127.0.0.1:1 --exec true",
        "--connect 127.0.0.1:1 --type a",
        "--connect 127.0.0.1:1 --type a --exec true --concurrency 0",
        "--connect 127.0.0.1:1 --type a --exec true --concurrency many",
        "--connect 127.0.0.1:1 --type a --exec true --bogus",
        "--connect 127.0.0.1:1 --type a --exec true --log-level loud",
        "--connect nohost --type a --exec true",
        "--connect 127.0.0.1:1 --type a,,b --exec true",
        "--connect 127.0.0.1:1 --type a --exec true --token-file /nonexistent/token",
        "--connect 127.0.0.1:1 --type a --exec true extra",
        "--connect",
    };
    tpw_exec_res res;

    (void)state;
    worker_bin(); /* fails the test here, before any set-up, when it is missing */
    run_cli("--help", &res);
    assert_int_equal(WEXITSTATUS(res.status), 0);
    assert_non_null(strstr(res.out, "Usage: taskpush-worker"));
    assert_non_null(strstr(res.out, "--concurrency"));
    tpw_exec_res_free(&res);
    run_cli("--version", &res);
    assert_int_equal(WEXITSTATUS(res.status), 0);
    assert_non_null(strstr(res.out, TASKPUSH_VERSION));
    tpw_exec_res_free(&res);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        run_cli(bad[i], &res);
        if (WEXITSTATUS(res.status) != 2)
            fail_msg("'%s' exited %d, not 2", bad[i], WEXITSTATUS(res.status));
        assert_true(res.err_len > 0);
        assert_non_null(strstr(res.err, "--help")); /* a usage hint */
        assert_true(res.out_len == 0);
        tpw_exec_res_free(&res);
    }
}

/* A malformed --connect exits 2 and says what is wrong with it. */
static void test_worker_cli_connect_messages(void **state)
{
    static const struct {
        const char *arg, *says;
    } cases[] = {
        {"http://127.0.0.1:7070", "no scheme such as http://"},
        {"127.0.0.1:99999", "the port must be a number from 1 to 65535"},
        {"127.0.0.1:7070/tasks", "no path"},
        {":7070", "the host is empty"},
        {"::1:7070", "write an IPv6 address as [ADDR]:PORT"},
    };
    tpw_exec_res res;
    char args[256];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(args, sizeof(args), "--connect '%s' --type a --exec true", cases[i].arg);
        run_cli(args, &res);
        if (WEXITSTATUS(res.status) != 2 || strstr(res.err, cases[i].says) == NULL)
            fail_msg("--connect '%s' exited %d with \"%s\"", cases[i].arg, WEXITSTATUS(res.status),
                     res.err);
        assert_non_null(strstr(res.err, cases[i].arg)); /* the address is quoted back */
        tpw_exec_res_free(&res);
    }
}

/* The script the program runs: its first input line picks the behaviour. */
static const char worker_script[] =
    "read what rest; case $what in "
    "ok) echo \"id=$TASKPUSH_TASK_ID type=$TASKPUSH_TASK_TYPE attempt=$TASKPUSH_ATTEMPT "
    "rest=$rest\";; "
    "perm) echo 'bad input' >&2; exit 65;; "
    "fail) echo oops >&2; exit 3;; "
    "slow) : >\"$TP_TEST_MARKER\"; sleep 0.3; echo finished;; "
    "hang) sleep 30;; "
    "env) echo \"token=${TASKPUSH_TOKEN-unset}\";; "
    "esac";

/* The marker file the "slow" command creates when it starts. */
static char marker_path[64];

/* The last taskpush-worker started; kill_spawned() ends it after a test, so
 * that a failed assertion does not leave it running. */
static pid_t spawned_pid = -1;

static int kill_spawned(void **state)
{
    (void)state;
    if (spawned_pid > 0 && waitpid(spawned_pid, NULL, WNOHANG) == 0) {
        kill(spawned_pid, SIGKILL);
        waitpid(spawned_pid, NULL, 0);
    }
    spawned_pid = -1;
    return 0;
}

/* spawn_worker starts taskpush-worker against f; extra_arg (with its value
 * extra_val) and extra_env are added when not NULL. */
static pid_t spawn_worker_with(const fake *f, const char *concurrency, const char *extra_arg,
                               const char *extra_val, const char *extra_env)
{
    char addr[64];
    char *argv[] = {"taskpush-worker",
                    "--connect",
                    addr,
                    "--type",
                    "echo,other",
                    "--exec",
                    (char *)worker_script,
                    "--concurrency",
                    (char *)concurrency,
                    "--name",
                    "cli-worker",
                    "--log-level",
                    verbose() ? "debug" : "error",
                    "--kill-grace-ms",
                    "200",
                    (char *)extra_arg,
                    (char *)extra_val,
                    NULL};
    pid_t pid;
    char marker_var[96];
    size_t n = 0;
    char **envp;
    posix_spawn_file_actions_t fa;

    for (char **e = environ; *e != NULL; e++)
        n++;
    envp = calloc(n + 3, sizeof(*envp));
    assert_non_null(envp);
    n = 0;
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, "TASKPUSH_TOKEN=", 15) != 0)
            envp[n++] = *e;
    snprintf(marker_path, sizeof(marker_path), "/tmp/tp-test-marker.%ld", (long)getpid());
    unlink(marker_path);
    snprintf(marker_var, sizeof(marker_var), "TP_TEST_MARKER=%s", marker_path);
    envp[n++] = marker_var;
    if (extra_env != NULL)
        envp[n++] = (char *)extra_env;
    fake_addr(f, addr, sizeof(addr));
    /* Its stdout must not mix with our TAP output. */
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    assert_int_equal(posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0),
                     0);
    assert_int_equal(posix_spawn(&pid, worker_bin(), &fa, NULL, argv, envp), 0);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    spawned_pid = pid;
    return pid;
}

static pid_t spawn_worker(const fake *f, const char *concurrency)
{
    return spawn_worker_with(f, concurrency, NULL, NULL, NULL);
}

static int wait_exit(pid_t pid)
{
    int64_t end = now_ms() + WAIT_MS;
    int status = 0;

    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);

        if (r == pid) {
            if (pid == spawned_pid)
                spawned_pid = -1;
            return status;
        }
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("taskpush-worker did not exit");
        }
        poll(NULL, 0, 5);
    }
}

static void test_worker_program_tasks(void **state)
{
    fake f;
    proto_msg m;
    pid_t pid;
    proto_msg c = {.type = PROTO_CANCEL};
    const char *ok_out = "id=11 type=echo attempt=2 rest=hello world\n";

    (void)state;
    worker_bin(); /* fails the test here, before any set-up, when it is missing */
    fake_listen(&f);
    pid = spawn_worker(&f, "2");
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.capacity, 2);
    assert_int_equal(m.u.hello.ntypes, 2);
    assert_memory_equal(m.u.hello.types[0].ptr, "echo", 4);
    assert_memory_equal(m.u.hello.types[1].ptr, "other", 5);
    assert_memory_equal(m.u.hello.name.ptr, "cli-worker", 10);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);

    fake_send_task_full(&f, 11, 1, 2, 60000, 1, "echo", "ok hello world\n", 15);
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 11);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(m.u.done.data.len, strlen(ok_out));
    assert_memory_equal(m.u.done.data.ptr, ok_out, strlen(ok_out));

    fake_send_task(&f, 12, "echo", "perm\n");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_PERM);
    assert_int_equal(m.u.done.data.len, 10);
    assert_memory_equal(m.u.done.data.ptr, "bad input\n", 10);

    fake_send_task(&f, 13, "other", "fail\n");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
    assert_memory_equal(m.u.done.data.ptr, "oops\n", 5);

    /* A task that outlives its lease is killed, and reported as a failure. */
    fake_send_task_full(&f, 14, 1, 1, 300, 1, "echo", "hang\n", 5);
    /* One cancelled by the dispatcher, at the same time (concurrency 2). */
    fake_send_task_full(&f, 15, 1, 1, 60000, 1, "echo", "hang\n", 5);
    c.u.cancel.task_id = 15;
    c.u.cancel.epoch = 1;
    c.u.cancel.attempt = 1;
    fake_send(&f, &c);
    for (int i = 0; i < 2; i++) {
        fake_expect(&f, &m, PROTO_DONE);
        assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_FAIL_RETRY);
        if (m.u.done.task_id == 14)
            assert_non_null(memmem(m.u.done.data.ptr, m.u.done.data.len, "timed out", 9));
        else if (m.u.done.task_id == 15)
            assert_non_null(memmem(m.u.done.data.ptr, m.u.done.data.len, "cancelled", 9));
        else
            fail_msg("unexpected DONE for task %llu", (unsigned long long)m.u.done.task_id);
    }

    kill(pid, SIGTERM);
    fake_expect(&f, &m, PROTO_STOP);
    fake_expect_eof(&f, PROTO_DONE);
    {
        int status = wait_exit(pid);

        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    fake_close(&f);
}

static void test_worker_program_sigterm_finishes(void **state)
{
    fake f;
    proto_msg m;
    pid_t pid;
    int status;

    (void)state;
    worker_bin(); /* fails the test here, before any set-up, when it is missing */
    fake_listen(&f);
    pid = spawn_worker(&f, "1");
    fake_handshake(&f, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&f, 21, "echo", "slow\n");
    /* Once the command runs (it creates the marker), SIGTERM: the STOP must
     * come first, and the DONE of the task held after it. */
    {
        int64_t end = now_ms() + WAIT_MS;

        while (access(marker_path, F_OK) != 0 && now_ms() < end)
            poll(NULL, 0, 2);
        assert_int_equal(access(marker_path, F_OK), 0);
        unlink(marker_path);
    }
    kill(pid, SIGTERM);
    fake_expect(&f, &m, PROTO_STOP);
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.task_id, 21);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_memory_equal(m.u.done.data.ptr, "finished\n", 9);
    fake_expect_eof(&f, PROTO_DONE);
    status = wait_exit(pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    fake_close(&f);
}

/* The secret comes from --token-file (trailing newline dropped) or from
 * TASKPUSH_TOKEN, and the commands never see it. */
static void test_worker_program_token(void **state)
{
    fake f;
    proto_msg m;
    pid_t pid;
    char path[64];
    FILE *tf;
    int status;

    (void)state;
    worker_bin(); /* fails the test here, before any set-up, when it is missing */
    snprintf(path, sizeof(path), "/tmp/tp-test-token.%ld", (long)getpid());
    tf = fopen(path, "w");
    assert_non_null(tf);
    fputs("file-secret\n", tf);
    fclose(tf);
    fake_listen(&f);

    pid = spawn_worker_with(&f, "1", "--token-file", path, "TASKPUSH_TOKEN=env-secret");
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.token.len, 11);
    assert_memory_equal(m.u.hello.token.ptr, "file-secret", 11); /* the flag wins */
    kill(pid, SIGTERM);
    status = wait_exit(pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    pid = spawn_worker_with(&f, "1", NULL, NULL, "TASKPUSH_TOKEN=env-secret");
    fake_accept(&f);
    fake_expect(&f, &m, PROTO_HELLO);
    assert_int_equal(m.u.hello.token.len, 10);
    assert_memory_equal(m.u.hello.token.ptr, "env-secret", 10);
    fake_send_welcome(&f, PROTO_VERSION, 0, PROTO_MAX_BODY_DEFAULT);
    fake_send_task(&f, 31, "echo", "env\n");
    fake_expect(&f, &m, PROTO_DONE);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_SUCCESS);
    assert_int_equal(m.u.done.data.len, 12);
    assert_memory_equal(m.u.done.data.ptr, "token=unset\n", 12);
    kill(pid, SIGTERM);
    status = wait_exit(pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fake_close(&f);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_cli),
        cmocka_unit_test(test_worker_cli_connect_messages),
        cmocka_unit_test_teardown(test_worker_program_tasks, kill_spawned),
        cmocka_unit_test_teardown(test_worker_program_sigterm_finishes, kill_spawned),
        cmocka_unit_test_teardown(test_worker_program_token, kill_spawned),
    };

    if (getenv("TP_TEST_FILTER") != NULL) /* e.g. TP_TEST_FILTER='test_exec*' */
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    return cmocka_run_group_tests_name("worker-cli", tests, NULL, NULL);
}
