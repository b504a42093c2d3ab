/* exec_harness.c: running a command through taskpush-worker's runner
 * (worker-client/exec.c) the way its handler threads do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "exec_harness.h"

extern char **environ;

int never_kill(void *arg, char *why, size_t n)
{
    (void)arg;
    (void)why;
    (void)n;
    return 0;
}

tpw_exec_req exec_req(const char *command, const void *input, size_t len)
{
    tpw_exec_req q;

    memset(&q, 0, sizeof(q));
    q.command = command;
    q.input = input;
    q.input_len = len;
    q.envp = environ;
    q.out_max = 8u << 20;
    q.err_max = 64;
    q.kill_grace_ms = 200;
    q.check_ms = 10;
    q.check = never_kill;
    return q;
}

/* run_exec runs a command with SIGPIPE blocked in this thread, as it is in
 * taskpush-worker's handler threads: a command that does not read its input
 * makes the write fail with EPIPE instead of killing the test. */
int run_exec(const tpw_exec_req *q, tpw_exec_res *res)
{
    sigset_t pipe_set;
    sigset_t old;
    struct timespec zero = {0, 0};
    int rc;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    rc = tpw_exec_run(q, res);
    while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE)
        ;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
