/* taskmap.h: task_id -> pointer, open addressing with linear probing.
 *
 * Holds every task the dispatcher has claimed and not yet finished, so that a
 * DONE finds its task in O(1). Deletion uses backward shifting, so there are no
 * tombstones and lookups stay short under churn. */
#ifndef TASKPUSH_DSP_TASKMAP_H
#define TASKPUSH_DSP_TASKMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct dsp_taskmap {
    uint64_t *keys;
    void **vals; /* NULL marks an empty slot */
    size_t mask; /* capacity - 1; capacity is a power of two */
    size_t count;
} dsp_taskmap;

int dsp_taskmap_init(dsp_taskmap *m, size_t initial) __attribute__((warn_unused_result));
void dsp_taskmap_free(dsp_taskmap *m);
void *dsp_taskmap_get(const dsp_taskmap *m, uint64_t key);
/* Inserts or replaces; val must not be NULL. Returns 0 or -1 (out of memory). */
int dsp_taskmap_put(dsp_taskmap *m, uint64_t key, void *val) __attribute__((warn_unused_result));
/* Removes key; returns its value or NULL. */
void *dsp_taskmap_del(dsp_taskmap *m, uint64_t key);

#endif
