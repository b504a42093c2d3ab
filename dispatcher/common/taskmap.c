/* taskmap: see taskmap.h. */
#include "taskmap.h"

#include <stdlib.h>

static size_t slot_of(uint64_t key, size_t mask)
{
    /* task ids are sequential: mix them so neighbours do not cluster */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & mask;
}

int dsp_taskmap_init(dsp_taskmap *m, size_t initial)
{
    size_t cap = 16;
    while (cap < initial * 2)
        cap <<= 1;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->mask = cap - 1;
    m->count = 0;
    if (!m->keys || !m->vals) {
        dsp_taskmap_free(m);
        return -1;
    }
    return 0;
}

void dsp_taskmap_free(dsp_taskmap *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->count = 0;
}

void *dsp_taskmap_get(const dsp_taskmap *m, uint64_t key)
{
    for (size_t i = slot_of(key, m->mask);; i = (i + 1) & m->mask) {
        if (!m->vals[i])
            return NULL;
        if (m->keys[i] == key)
            return m->vals[i];
    }
}

static int grow(dsp_taskmap *m)
{
    dsp_taskmap bigger;
    if (dsp_taskmap_init(&bigger, m->mask + 1) < 0)
        return -1;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->vals[i]) {
            size_t j = slot_of(m->keys[i], bigger.mask);
            while (bigger.vals[j])
                j = (j + 1) & bigger.mask;
            bigger.keys[j] = m->keys[i];
            bigger.vals[j] = m->vals[i];
        }
    bigger.count = m->count;
    dsp_taskmap_free(m);
    *m = bigger;
    return 0;
}

int dsp_taskmap_put(dsp_taskmap *m, uint64_t key, void *val)
{
    if ((m->count + 1) * 4 > (m->mask + 1) * 3 && grow(m) < 0) /* keep load under 3/4 */
        return -1;
    size_t i = slot_of(key, m->mask);
    while (m->vals[i] && m->keys[i] != key)
        i = (i + 1) & m->mask;
    if (!m->vals[i])
        m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
    return 0;
}

void *dsp_taskmap_del(dsp_taskmap *m, uint64_t key)
{
    size_t i = slot_of(key, m->mask);
    while (m->vals[i] && m->keys[i] != key)
        i = (i + 1) & m->mask;
    void *val = m->vals[i];
    if (!val)
        return NULL;
    m->count--;
    /* Backward-shift: pull later entries of the probe run into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->vals[j]; j = (j + 1) & m->mask) {
        size_t home = slot_of(m->keys[j], m->mask);
        /* can entry j move to hole? only if its home is not in (hole, j] cyclically */
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->keys[hole] = m->keys[j];
            m->vals[hole] = m->vals[j];
            hole = j;
        }
    }
    m->vals[hole] = NULL;
    return val;
}
