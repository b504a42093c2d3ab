/* tap: a diagnostic line of a TAP test ("# ..." on standard output, flushed at once, so
 * that it lands between the cmocka results it explains). */
#ifndef TASKPUSH_TESTS_TAP_H
#define TASKPUSH_TESTS_TAP_H

void tp_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
