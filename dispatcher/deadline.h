/* deadline.h: a binary min-heap of deadlines, for the leases of deliveries.
 *
 * Each item embeds a dsp_deadline_node; the heap keeps the node's index, so that
 * removing or moving an item is O(log n) without a search, and the housekeeping
 * tick looks only at the items that are due instead of at every delivery. The
 * heap owns none of the items. */
#ifndef TASKPUSH_DSP_DEADLINE_H
#define TASKPUSH_DSP_DEADLINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_DEADLINE_NONE SIZE_MAX /* the index of a node in no heap */

typedef struct dsp_deadline_node {
    size_t index; /* in the heap's array, or DSP_DEADLINE_NONE */
} dsp_deadline_node;

typedef struct dsp_deadline_heap {
    struct dsp_deadline_slot {
        int64_t at_ms;           /* a copy of the key beside the node: sifting reads no item */
        dsp_deadline_node *node;
    } *slots;
    size_t n, cap;
    /* realloc, unless a test sets another to make growth fail. */
    void *(*realloc_fn)(void *ptr, size_t size);
} dsp_deadline_heap;

/* An empty heap: allocates nothing until the first insert. */
void dsp_deadline_init(dsp_deadline_heap *h);
/* Frees the array; the nodes are left as they are. */
void dsp_deadline_free(dsp_deadline_heap *h);

static inline void dsp_deadline_node_init(dsp_deadline_node *node)
{
    node->index = DSP_DEADLINE_NONE;
}

static inline bool dsp_deadline_queued(const dsp_deadline_node *node)
{
    return node->index != DSP_DEADLINE_NONE;
}

/* Makes room for n items in all, so that the inserts up to then cannot fail.
 * Returns 0, or -1 when out of memory (the heap is unchanged). */
int dsp_deadline_reserve(dsp_deadline_heap *h, size_t n) __attribute__((warn_unused_result));
/* Adds node, which must be in no heap, due at at_ms. Returns 0, or -1 when out of
 * memory (node stays out). */
int dsp_deadline_insert(dsp_deadline_heap *h, dsp_deadline_node *node, int64_t at_ms)
    __attribute__((warn_unused_result));
/* Takes node out; harmless when it is in no heap. */
void dsp_deadline_remove(dsp_deadline_heap *h, dsp_deadline_node *node);
/* Moves node, which must be in h, to at_ms. */
void dsp_deadline_update(dsp_deadline_heap *h, dsp_deadline_node *node, int64_t at_ms);

/* The earliest node and its deadline (*at_ms), or NULL when h is empty. */
static inline dsp_deadline_node *dsp_deadline_peek(const dsp_deadline_heap *h, int64_t *at_ms)
{
    if (h->n == 0)
        return NULL;
    *at_ms = h->slots[0].at_ms;
    return h->slots[0].node;
}

#endif
