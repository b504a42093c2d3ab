/* exec.h: run one shell command for taskpush-worker, with its input on stdin,
 * capturing stdout and the tail of stderr, and killing its whole process group
 * when asked to. Not part of libtaskpush; prefix tpw_. */
#ifndef TASKPUSH_WORKER_EXEC_H
#define TASKPUSH_WORKER_EXEC_H

#include <stddef.h>
#include <stdint.h>

/* Polled while the command runs: return 1 (with a reason in why) to kill it. */
typedef int (*tpw_exec_check_fn)(void *arg, char *why, size_t why_len);

/* The command's file descriptor for progress lines (TASKPUSH_PROGRESS_FD). */
#define TPW_PROGRESS_FD 3
/* Bytes of one progress line at most, its newline included; a longer one is skipped. */
#define TPW_PROGRESS_LINE_MAX 300
/* Called for each well-formed line "progress PERMILLE[ TEXT]" (PERMILLE 0 .. 1000, TEXT
 * at most 256 bytes, NUL-terminated here; its UTF-8 is for the callee to check). */
typedef void (*tpw_exec_progress_fn)(void *arg, unsigned permille, const char *text);

typedef struct tpw_exec_req {
    const char *command; /* run as /bin/sh -c command, in a new process group */
    const void *input;   /* written to its stdin, which is then closed */
    size_t input_len;
    char *const *envp;       /* its environment */
    size_t out_max;          /* stdout bytes kept; the rest is read and discarded */
    size_t err_max;          /* the last err_max bytes of stderr are kept */
    unsigned kill_grace_ms;  /* between SIGTERM and SIGKILL to the group */
    unsigned check_ms;       /* check runs at least this often (ms) */
    tpw_exec_check_fn check; /* may be NULL */
    void *check_arg;
    /* NULL: the command gets no progress descriptor. Else its descriptor
     * TPW_PROGRESS_FD is a pipe whose lines are read as the command runs. */
    tpw_exec_progress_fn progress;
    void *progress_arg;
} tpw_exec_req;

typedef struct tpw_exec_res {
    int status;    /* as waitpid() reports it */
    int killed;    /* 1: check asked for the kill */
    char why[192]; /* check's reason */
    char *out;     /* stdout (malloc'd, NUL-terminated), out_len bytes */
    size_t out_len;
    int out_truncated; /* 1: stdout was longer than out_max */
    char *err;         /* the tail of stderr (malloc'd, NUL-terminated) */
    size_t err_len;
    int64_t elapsed_ms;
} tpw_exec_res;

/* tpw_exec_progress_line parses one line (without its newline) and calls fn for a
 * well-formed one; returns 1 when it was, 0 when it was ignored. */
int tpw_exec_progress_line(const char *line, size_t len, tpw_exec_progress_fn fn, void *arg);

/* tpw_exec_run runs req->command to its end (or kill) and fills *res, which
 * the caller releases with tpw_exec_res_free() whatever the return value.
 * Stdin, stdout and stderr are served together with poll(), so neither a large
 * input nor a large output can deadlock. When the command's first process has
 * exited but others of its group keep the pipes open, they are killed after a
 * short wait. Returns 0, or a negative errno when the command could not be
 * started. Thread-safe (posix_spawn; the caller must not change the signal
 * dispositions of SIGPIPE concurrently). */
int tpw_exec_run(const tpw_exec_req *req, tpw_exec_res *res);

void tpw_exec_res_free(tpw_exec_res *res);

#endif
