/* groups.c: the per-key limit of a type (--group-limit T:N, docs/taskpushd.md "Per-key
 * limits"): at most N deliveries of type T in flight at once per group_key, over all
 * workers. The loop counts, per type, the deliveries in flight of each key (only while
 * the type has such a limit), and a dispatch takes the first buffered task, in dispatch
 * order, whose key is below its limit. Tasks without a key are not limited. Runs on
 * the loop thread. */
#include "dispatch.h"
#include "conn.h"
#include "server.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

struct dsp_group_run {
    uint32_t n; /* deliveries in flight */
    uint8_t len;
    uint8_t key[DSP_GROUP_KEY_MAX];
};

/* The keys with deliveries in flight are at most the type's deliveries in flight: a
 * linear search, on each delivery of a limited type and each of its answers. */
static struct dsp_group_run *run_find(const dsp_type *ty, const dsp_task *t)
{
    for (size_t i = 0; i < ty->ngruns; i++)
        if (ty->gruns[i].len == t->group_key_len &&
            memcmp(ty->gruns[i].key, t->group_key, t->group_key_len) == 0)
            return &ty->gruns[i];
    return NULL;
}

bool dsp_groups_allows(const dsp_type *ty, const dsp_task *t)
{
    if (!ty->max_per_group || !t->has_group_key)
        return true;
    const struct dsp_group_run *r = run_find(ty, t);
    return r == NULL || r->n < ty->max_per_group;
}

dsp_task *dsp_groups_peek(const dsp_type *ty)
{
    if (!ty->max_per_group)
        return dsp_dispatch_peek(ty);
    /* Past the tasks of keys at their limit: at most the type's buffer. */
    for (unsigned p = DSP_PRIORITIES; p-- > 0;)
        for (dsp_task *t = ty->head[p]; t; t = t->next)
            if (dsp_groups_allows(ty, t))
                return t;
    return NULL;
}

void dsp_groups_add(dsp_type *ty, dsp_task *t)
{
    if (!ty->max_per_group || !t->has_group_key || t->group_counted)
        return;
    struct dsp_group_run *r = run_find(ty, t);
    if (!r) {
        if (ty->ngruns == ty->gruns_cap) {
            size_t cap = ty->gruns_cap ? 2 * ty->gruns_cap : 16;
            struct dsp_group_run *g = realloc(ty->gruns, cap * sizeof *g);
            if (!g)
                return; /* not counted: the limit lets this key's tasks through */
            ty->gruns = g;
            ty->gruns_cap = cap;
        }
        r = &ty->gruns[ty->ngruns++];
        r->n = 0;
        r->len = t->group_key_len;
        memcpy(r->key, t->group_key, t->group_key_len);
    }
    r->n++;
    t->group_counted = true;
}

void dsp_groups_del(dsp_type *ty, dsp_task *t)
{
    if (!t->group_counted)
        return;
    t->group_counted = false;
    struct dsp_group_run *r = run_find(ty, t);
    if (r && --r->n == 0)
        *r = ty->gruns[--ty->ngruns]; /* a key with nothing in flight is forgotten */
}

void dsp_groups_set(dsp_type *ty, uint32_t max_per_group)
{
    if (ty->max_per_group == max_per_group)
        return;
    ty->max_per_group = max_per_group;
    /* Counted afresh from the deliveries in flight now, or forgotten. */
    for (size_t w = 0; w < ty->nworkers; w++) {
        dsp_conn *c = container_of(ty->workers[w], dsp_conn, slots);
        for (dsp_task *t = c->inflight; t; t = t->next)
            if (t->type == ty) /* another type's counts are its own */
                t->group_counted = false;
    }
    ty->ngruns = 0;
    if (!max_per_group) {
        free(ty->gruns);
        ty->gruns = NULL;
        ty->gruns_cap = 0;
        return;
    }
    for (size_t w = 0; w < ty->nworkers; w++) {
        dsp_conn *c = container_of(ty->workers[w], dsp_conn, slots);
        for (dsp_task *t = c->inflight; t; t = t->next)
            if (t->type == ty)
                dsp_groups_add(ty, t);
    }
}

void dsp_groups_free(dsp_type *ty)
{
    free(ty->gruns);
    ty->gruns = NULL;
    ty->ngruns = ty->gruns_cap = 0;
}
