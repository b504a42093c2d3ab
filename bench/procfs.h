/* procfs: a process's CPU time and memory as Linux's /proc shows them. The bench's
 * figures come from here (server_status.c), and the tests that watch taskpushd's memory
 * and CPU (tests/testlib, tests/chaos) read them the same way. */
#ifndef TASKPUSH_PROCFS_H
#define TASKPUSH_PROCFS_H

#include <stddef.h>
#include <sys/types.h>

/* User + system CPU seconds pid has used (/proc/PID/stat); < 0 when unknown. */
double procfs_cpu_seconds(pid_t pid);

/* The value of the line "Key:\tvalue" of /proc/PID/status, without the blanks before
 * it, into buf: 0, or -1 when the process, the key or room for the value is missing. */
int procfs_status_value(pid_t pid, const char *key, char *buf, size_t len);

/* One "Key: N kB" line of /proc/PID/status, e.g. "VmRSS", "VmHWM", or "RssAnon" (the
 * heap and stacks without the library pages); < 0 when unknown. */
long procfs_status_kb(pid_t pid, const char *key);

/* pid's peak RSS in kB: VmHWM, or more when an earlier VmRSS read (seen_kb) was higher.
 * The kernel's RSS counters are approximate (per-CPU batches), and it raises VmHWM only
 * when it lowers RSS, from the approximate figure: VmHWM read just after VmRSS was seen
 * up to 256 kB below it here (3 of 243,723 read pairs). < 0 when unknown. */
long procfs_peak_rss_kb(pid_t pid, long seen_kb);

#endif
