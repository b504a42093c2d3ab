/* exec_harness.h: taskpush-worker's command runner as the tests call it
 * (exec_harness.c). */
#ifndef TASKPUSH_TEST_EXEC_HARNESS_H
#define TASKPUSH_TEST_EXEC_HARNESS_H

#include <stddef.h>

#include "exec.h"

/* A check callback that never asks for a kill. */
int never_kill(void *arg, char *why, size_t n);
/* A request for command with this input, this process's environment, an 8 MiB
 * stdout, the last 64 bytes of stderr, and never_kill. */
tpw_exec_req exec_req(const char *command, const void *input, size_t len);
/* tpw_exec_run with SIGPIPE blocked in this thread, as in the handler threads. */
int run_exec(const tpw_exec_req *q, tpw_exec_res *res);

#endif
