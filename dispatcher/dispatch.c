#include "dispatch.h"

#include "config.h"

int dsp_sched_pick(int policy, dsp_sched_slots *const *ws, size_t n, size_t *cursor)
{
    if (n == 0)
        return -1;
    size_t start = *cursor % n;
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        const dsp_sched_slots *s = ws[i];
        if (!dsp_sched_has_room(s))
            continue;
        if (policy == DSP_SCHED_ROUND_ROBIN) {
            best = (int)i;
            break;
        }
        if (best < 0) {
            best = (int)i;
            if (s->in_flight == 0)
                break; /* nothing is less loaded than idle */
            continue;
        }
        /* s->in_flight / s->capacity < b->in_flight / b->capacity, without division */
        const dsp_sched_slots *b = ws[best];
        if ((uint64_t)s->in_flight * b->capacity < (uint64_t)b->in_flight * s->capacity)
            best = (int)i;
    }
    if (best >= 0)
        *cursor = (size_t)best + 1;
    return best;
}
