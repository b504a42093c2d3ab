/* deadline.c: the deadline heap (deadline.h): an array in heap order, each slot's
 * node told its index whenever it moves. */
#include "deadline.h"

#include <stdlib.h>

void dsp_deadline_init(dsp_deadline_heap *h)
{
    h->slots = NULL;
    h->n = h->cap = 0;
    h->realloc_fn = realloc;
}

void dsp_deadline_free(dsp_deadline_heap *h)
{
    free(h->slots);
    h->slots = NULL;
    h->n = h->cap = 0;
}

int dsp_deadline_reserve(dsp_deadline_heap *h, size_t n)
{
    if (n <= h->cap)
        return 0;
    size_t cap = h->cap ? h->cap : 64;
    while (cap < n)
        cap *= 2;
    if (cap > SIZE_MAX / sizeof *h->slots)
        return -1;
    struct dsp_deadline_slot *s = h->realloc_fn(h->slots, cap * sizeof *s);
    if (!s)
        return -1;
    h->slots = s;
    h->cap = cap;
    return 0;
}

/* Writes slot s at index i and tells its node. */
static void place(dsp_deadline_heap *h, size_t i, struct dsp_deadline_slot s)
{
    h->slots[i] = s;
    s.node->index = i;
}

/* Moves the slot at i up while it is earlier than its parent; returns where it ends. */
static size_t sift_up(dsp_deadline_heap *h, size_t i)
{
    struct dsp_deadline_slot s = h->slots[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->slots[parent].at_ms <= s.at_ms)
            break;
        place(h, i, h->slots[parent]);
        i = parent;
    }
    place(h, i, s);
    return i;
}

/* Moves the slot at i down while a child is earlier. */
static void sift_down(dsp_deadline_heap *h, size_t i)
{
    struct dsp_deadline_slot s = h->slots[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= h->n)
            break;
        if (child + 1 < h->n && h->slots[child + 1].at_ms < h->slots[child].at_ms)
            child++;
        if (s.at_ms <= h->slots[child].at_ms)
            break;
        place(h, i, h->slots[child]);
        i = child;
    }
    place(h, i, s);
}

int dsp_deadline_insert(dsp_deadline_heap *h, dsp_deadline_node *node, int64_t at_ms)
{
    if (h->n == h->cap && dsp_deadline_reserve(h, h->n + 1) < 0)
        return -1;
    h->slots[h->n] = (struct dsp_deadline_slot){.at_ms = at_ms, .node = node};
    sift_up(h, h->n++);
    return 0;
}

void dsp_deadline_remove(dsp_deadline_heap *h, dsp_deadline_node *node)
{
    size_t i = node->index;
    if (i == DSP_DEADLINE_NONE)
        return;
    node->index = DSP_DEADLINE_NONE;
    if (i == --h->n)
        return; /* it was the last slot */
    /* The last slot fills the hole, then goes up or down to its place. */
    h->slots[i] = h->slots[h->n];
    if (sift_up(h, i) == i)
        sift_down(h, i);
}

void dsp_deadline_update(dsp_deadline_heap *h, dsp_deadline_node *node, int64_t at_ms)
{
    size_t i = node->index;
    h->slots[i].at_ms = at_ms;
    if (sift_up(h, i) == i)
        sift_down(h, i);
}
