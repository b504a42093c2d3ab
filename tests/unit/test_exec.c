/* test_exec.c: taskpush-worker's command runner (worker-client/exec.c): large
 * input and output, the environment and the exit status, and the kill of the
 * whole process group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "client_harness.h"
#include "exec_harness.h"

static int kill_when_set(void *arg, char *why, size_t n)
{
    const int *flag = arg;

    if (*flag)
        snprintf(why, n, "asked to");
    return *flag;
}

static void test_exec_large_io(void **state)
{
    size_t len = 3u << 20; /* far beyond a pipe buffer, both ways */
    uint8_t *in = malloc(len);
    tpw_exec_req q;
    tpw_exec_res res;

    (void)state;
    assert_non_null(in);
    for (size_t i = 0; i < len; i++)
        in[i] = (uint8_t)(i * 7);
    q = exec_req("cat; printf 'line1\\n' >&2; head -c 200 /dev/zero | tr '\\0' e >&2", in, len);
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0);
    assert_int_equal(res.out_len, len);
    assert_memory_equal(res.out, in, len);
    assert_int_equal(res.out_truncated, 0);
    /* Only the tail of stderr is kept. */
    assert_int_equal(res.err_len, 64);
    for (size_t i = 0; i < 64; i++)
        assert_int_equal(res.err[i], 'e');
    tpw_exec_res_free(&res);

    /* A capped stdout, and a command that never reads its input. */
    q = exec_req("head -c 100000 /dev/zero; exit 65", in, len);
    q.out_max = 1000;
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 65);
    assert_int_equal(res.out_len, 1000);
    assert_int_equal(res.out_truncated, 1);
    tpw_exec_res_free(&res);
    free(in);
}

static void test_exec_env_and_status(void **state)
{
    char *envp[] = {"TASKPUSH_TASK_ID=12", "PATH=/usr/bin:/bin", NULL};
    tpw_exec_req q = exec_req("echo \"id=$TASKPUSH_TASK_ID\"; kill -USR1 $$", NULL, 0);
    tpw_exec_res res;

    (void)state;
    q.envp = envp;
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGUSR1);
    assert_string_equal(res.out, "id=12\n");
    assert_int_equal(res.killed, 0);
    tpw_exec_res_free(&res);
}

/* What the progress callback saw. */
typedef struct seen {
    int n;
    unsigned last;
    char text[300];
} seen;

static void on_progress(void *arg, unsigned permille, const char *text)
{
    seen *s = arg;
    s->n++;
    s->last = permille;
    snprintf(s->text, sizeof s->text, "%s", text);
}

/* Lines on descriptor 3: the well-formed ones reach the callback, in order; the rest
 * (a value over 1000, no number, a trailing word glued on, a text over 256 bytes, a line
 * over the bound, a last line without its newline) are skipped; stdout is unaffected. */
static void test_exec_progress_fd(void **state)
{
    tpw_exec_req q = exec_req(
        "echo out; printf 'progress 10\\n' >&3; printf 'progress 1001\\nprogress x\\nprogress 5x\\n' >&3;"
        " printf 'progress 7 %0300d\\n' 0 >&3; printf 'progress 20 %0250d\\n' 0 >&3;"
        " printf 'progress 999 page 9 of 10\\nprogress 5 no newline' >&3",
        NULL, 0);
    tpw_exec_res res;
    seen s = {0};
    char *envp[] = {"PATH=/usr/bin:/bin", NULL};

    (void)state;
    q.envp = envp;
    q.progress = on_progress;
    q.progress_arg = &s;
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0);
    assert_string_equal(res.out, "out\n");
    assert_int_equal(s.n, 3); /* 10, 20 (a text of 250 bytes), 999 */
    assert_int_equal(s.last, 999);
    assert_string_equal(s.text, "page 9 of 10");
    tpw_exec_res_free(&res);

    /* Without a callback the command has no descriptor 3: writing to it fails. */
    tpw_exec_req q2 = exec_req("printf 'progress 1\\n' >&3 2>/dev/null || echo closed", NULL, 0);
    q2.envp = envp;
    assert_int_equal(run_exec(&q2, &res), 0);
    assert_string_equal(res.out, "closed\n");
    tpw_exec_res_free(&res);

    /* The parser alone. */
    assert_int_equal(tpw_exec_progress_line("progress 0", 10, on_progress, &s), 1);
    assert_int_equal(s.last, 0);
    assert_string_equal(s.text, "");
    assert_int_equal(tpw_exec_progress_line("progress 1000 done", 18, on_progress, &s), 1);
    assert_int_equal(tpw_exec_progress_line("progress 00001000", 17, on_progress, &s), 0);
    assert_int_equal(tpw_exec_progress_line("progress  5", 11, on_progress, &s), 0);
    assert_int_equal(tpw_exec_progress_line("Progress 5", 10, on_progress, &s), 0);
    assert_int_equal(tpw_exec_progress_line("progress 5 a\0b", 14, on_progress, &s), 0);
}

static int proc_gone(pid_t pid)
{
    char path[64];
    char buf[512];
    FILE *f;
    size_t n;
    char *close_paren;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return 1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    close_paren = strrchr(buf, ')');
    return close_paren != NULL && close_paren[1] == ' ' && close_paren[2] == 'Z'; /* a zombie */
}

static void test_exec_kills_process_group(void **state)
{
    int flag = 0;
    tpw_exec_req q;
    tpw_exec_res res;
    int64_t start;
    pid_t bg;
    int64_t end;

    (void)state;
    /* The background sleep writes its pid, then holds stdout open; the
     * foreground one ignores SIGTERM, so SIGKILL must follow. */
    q = exec_req("trap '' TERM; sleep 30 & echo $!; sleep 30", NULL, 0);
    q.check = kill_when_set;
    q.check_arg = &flag;
    flag = 1;
    start = now_ms();
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(now_ms() - start < WAIT_MS);
    assert_int_equal(res.killed, 1);
    assert_string_equal(res.why, "asked to");
    assert_true(WIFSIGNALED(res.status));
    bg = (pid_t)atol(res.out != NULL ? res.out : "0");
    tpw_exec_res_free(&res);
    if (bg > 0) {
        end = now_ms() + WAIT_MS;
        while (!proc_gone(bg) && now_ms() < end)
            poll(NULL, 0, 5);
        assert_true(proc_gone(bg));
    }

    /* A command that exits while a background child keeps the pipes open
     * does not hang the runner. */
    q = exec_req("sleep 30 & echo hi", NULL, 0);
    start = now_ms();
    assert_int_equal(run_exec(&q, &res), 0);
    assert_true(now_ms() - start < WAIT_MS);
    assert_true(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0);
    assert_string_equal(res.out, "hi\n");
    tpw_exec_res_free(&res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_large_io),
        cmocka_unit_test(test_exec_env_and_status),
        cmocka_unit_test(test_exec_progress_fd),
        cmocka_unit_test(test_exec_kills_process_group),
    };

    if (getenv("TP_TEST_FILTER") != NULL) /* e.g. TP_TEST_FILTER='test_exec*' */
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    return cmocka_run_group_tests_name("exec", tests, NULL, NULL);
}
