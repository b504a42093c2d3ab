/* tap: a diagnostic line of a TAP test ("# ..." on standard output, flushed at once, so
 * that it lands between the cmocka results it explains). */
#ifndef TASKPUSH_TESTS_TAP_H
#define TASKPUSH_TESTS_TAP_H

void tp_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A progress line "# [   123 ms] ..." on standard error, stamped with the milliseconds
 * of tp_mono_ms() (wait.h) since t0: where a long case spent its time. */
void tp_note(long long t0, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
