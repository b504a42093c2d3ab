/* clock: the two clocks of taskpushd, for the loop and the database threads alike.
 * Deadlines, timeouts and rates use the monotonic clock (a wall-clock step must not
 * expire leases or stall claims); what is written into the table or shown to an
 * operator as a date uses the wall clock. */
#ifndef TASKPUSH_DSP_CLOCK_H
#define TASKPUSH_DSP_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t dsp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t dsp_now_ms(void)
{
    return dsp_now_us() / 1000;
}

/* Milliseconds since 1970 (UTC). */
static inline int64_t dsp_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
