/* daemon: the real taskpushd as a child process of an integration test, and a
 * small HTTP client for its admin port.
 *
 * taskpushd is started from the build tree (TASKPUSH_BUILD_ROOT, set by
 * tests/meson.build) on loopback port 0 for both ports; the ports it got are
 * read back from its --ready-file. Its stderr goes to a log file kept beside
 * the test (printed by tp_daemon_dump_log when a test wants to show it). */
#ifndef TASKPUSH_TESTS_DAEMON_H
#define TASKPUSH_TESTS_DAEMON_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "procfs.h" /* the daemon's memory and CPU: procfs_status_kb(d.pid, "VmRSS") */
#include "wait.h" /* tp_mono_ms(), tp_sleep_ms() */

typedef struct tp_daemon {
    pid_t pid;
    char listen[128];    /* HOST:PORT for workers */
    char admin[128];     /* HOST:PORT for HTTP */
    char ready_path[256];
    char log_path[256];
    int exit_status;     /* after tp_daemon_wait: the exit code, or 128 + signal */
} tp_daemon;

/* Path of a program in the build tree, e.g. "dispatcher/taskpushd". Static buffer. */
const char *tp_build_path(const char *relative);

/* Starts taskpushd --db db_url --listen 127.0.0.1:0 --admin 127.0.0.1:0 plus
 * the NULL-terminated extra arguments, and waits (at most 15 s) for its ready
 * file. Returns 0, or -1 (message on stderr). */
int tp_daemon_start(tp_daemon *d, const char *db_url, const char *const *extra_args);

/* Polls /stats until "leader" is true (at most timeout_ms). Returns 0 or -1. */
int tp_daemon_wait_leader(tp_daemon *d, int timeout_ms);

/* Sends sig (0: none) and waits at most timeout_ms for the process to end;
 * then SIGKILL. Returns the exit code (or 128 + signal), -1 on error. */
int tp_daemon_stop(tp_daemon *d, int sig, int timeout_ms);

/* Prints the daemon's log to stderr (for failing tests). */
void tp_daemon_dump_log(const tp_daemon *d);

/* Counts lines of the log that contain needle. */
int tp_daemon_log_count(const tp_daemon *d, const char *needle);

/* GET (or method) http://hostport/path; a POST carries X-Taskpush-Admin: 1. Returns
 * the status (or -1 when no answer), and the body (malloc'd, NUL-terminated) in
 * *body when body != NULL. */
int tp_http_request(const char *hostport, const char *method, const char *path, char **body);

/* GET /stats (or another JSON path) parsed; NULL on failure. Caller decrefs. */
json_t *tp_daemon_json(const tp_daemon *d, const char *path);

/* An integer at a dotted path of a parsed JSON object, e.g. "tasks.succeeded_total";
 * -1 when absent or not an integer. */
long long tp_json_int_at(json_t *root, const char *dotted);

/* The same read from a fresh GET /stats. */
long long tp_daemon_stat(const tp_daemon *d, const char *dotted);

/* Polls tp_daemon_stat(dotted) every 20 ms until it equals want (at_least: is at least
 * want) or timeout_ms has passed. Returns whether it got there; on a timeout it says on
 * stderr what it last read, so the caller only asserts. */
bool tp_daemon_wait_stat(const tp_daemon *d, const char *dotted, long long want, bool at_least,
                         int timeout_ms);

/* The bound a memory test asserts on taskpushd's RSS, given the bound of a plain build.
 * Under AddressSanitizer (the test command's second build) freed memory waits in a
 * quarantine of 256 MB before reuse and every block has redzones, so the bound becomes
 * twice the plain one plus 256 MB there; the plain build asserts the tight one. */
#if defined(__SANITIZE_ADDRESS__)
#define TP_DAEMON_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TP_DAEMON_UNDER_ASAN 1
#endif
#endif
static inline long tp_daemon_rss_bound_kb(long plain_kb)
{
#ifdef TP_DAEMON_UNDER_ASAN
    return 2 * plain_kb + 256L * 1024;
#else
    return plain_kb;
#endif
}

#endif
