/* run: a program of the build or of the system (the mariadb client) as a child process,
 * its stdin from a file, its stdout and stderr captured, its exit awaited with a bound. */
#ifndef TASKPUSH_TESTS_RUN_H
#define TASKPUSH_TESTS_RUN_H

#include <stddef.h>

/* Runs argv (argv[0] found on PATH when it has no '/') with stdin from stdin_path (NULL:
 * /dev/null), stdout and stderr both into out (at most cap - 1 bytes, NUL-terminated),
 * and echoes the command and its output as TAP comments. A child still running after
 * limit_ms is killed. Returns its exit code, 128 + signal, or -1 (could not run, or
 * killed at the limit). */
int tp_run(const char *const *argv, const char *stdin_path, char *out, size_t cap, int limit_ms);

#endif
