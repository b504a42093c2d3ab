/* sched.h: choosing the worker for the next task.
 *
 * Pure functions over an array of slot counts, so that the policy is unit
 * tested without sockets. Credit-based flow control lives here too: a worker
 * is eligible only while in_flight < capacity and it accepts tasks. */
#ifndef TASKPUSH_DSP_SCHED_H
#define TASKPUSH_DSP_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsp_sched_slots {
    uint32_t in_flight; /* deliveries not yet answered, cancelled ones included */
    uint32_t capacity;  /* from HELLO */
    bool accepting;     /* false after STOP either way, or before WELCOME */
} dsp_sched_slots;

static inline bool dsp_sched_has_room(const dsp_sched_slots *s)
{
    return s->accepting && s->in_flight < s->capacity;
}

/* Picks one of ws[0..n) with room, or returns -1.
 * round-robin: the first with room at or after *cursor;
 * least-loaded: the lowest in_flight/capacity, ties going to the first at or
 * after *cursor. Either way *cursor moves just past the pick, so equal workers
 * take turns. O(n). */
int dsp_sched_pick(int policy, dsp_sched_slots *const *ws, size_t n, size_t *cursor);

#endif
