/* wait: sleeping in integration tests (a poll interval between checks of a condition).
 * The wait-until loops stay in the tests, which name what they wait for in their own
 * failure messages; tp_mono_ms() gives their deadlines. */
#ifndef TASKPUSH_TESTS_WAIT_H
#define TASKPUSH_TESTS_WAIT_H

/* Milliseconds on a monotonic clock. */
long long tp_mono_ms(void);

/* Sleeps ms milliseconds, resuming after a signal (a SIGCHLD must not cut a poll short). */
void tp_sleep_ms(int ms);

#endif
