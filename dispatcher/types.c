/* types.c: the task types the dispatcher knows, interned once and found by a hash of
 * the name (a type lives while a worker serves it, tasks of it are buffered, or an
 * operator paused it), and the names of registered types that were freed since. The
 * per-type queues themselves are dispatch.c's. */
#include "dispatch.h"
#include "server.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TYPE_INDEX_MIN 64 /* buckets of the type index at the least */

/* FNV-1a: names are short, and peers choose them, so the index also caps each
 * bucket's length by growing with the number of types (a peer can make collisions
 * cost it, not others, only as far as --max-types allows). */
static uint32_t type_hash(const uint8_t *name, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ name[i]) * 16777619u;
    return h;
}

/* Resizes the index to n buckets (a power of two). Returns 0 or -1. */
static int type_index_resize(dsp_server *srv, size_t n)
{
    dsp_type **b = calloc(n, sizeof *b);
    if (!b)
        return -1;
    for (dsp_type *t = srv->types.list; t; t = t->next) {
        t->hnext = b[t->hash & (n - 1)];
        b[t->hash & (n - 1)] = t;
    }
    free(srv->types.buckets);
    srv->types.buckets = b;
    srv->types.nbuckets = n;
    return 0;
}

static dsp_type *type_find(const dsp_server *srv, const uint8_t *name, size_t len, uint32_t h)
{
    if (srv->types.nbuckets)
        for (dsp_type *t = srv->types.buckets[h & (srv->types.nbuckets - 1)]; t; t = t->hnext)
            if (t->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
                return t;
    return NULL;
}

dsp_type *dsp_server_type_intern(dsp_server *srv, const uint8_t *name, size_t len)
{
    uint32_t h = type_hash(name, len);
    dsp_type *found = type_find(srv, name, len, h);
    if (found)
        return found;
    /* Doubled when it holds more types than buckets; halved in
     * dsp_server_type_release_if_unused once a quarter is used. */
    if (srv->types.n >= srv->types.nbuckets &&
        type_index_resize(srv, srv->types.nbuckets ? srv->types.nbuckets * 2 : TYPE_INDEX_MIN) < 0)
        return NULL;
    dsp_type *t = calloc(1, sizeof *t);
    if (!t || !(t->name = malloc(len + 1))) {
        free(t);
        return NULL;
    }
    /* The length is the name's: HELLO refuses NUL bytes, but never trust strlen here. */
    memcpy(t->name, name, len);
    t->name[len] = '\0';
    t->len = len;
    t->hash = h;
    dsp_type **bucket = &srv->types.buckets[h & (srv->types.nbuckets - 1)];
    t->hnext = *bucket;
    *bucket = t;
    t->next = srv->types.list;
    if (srv->types.list)
        srv->types.list->prev = t;
    srv->types.list = t;
    srv->types.n++;
    dsp_limits_apply(srv, t);
    return t;
}

static void type_free(dsp_type *t)
{
    dsp_groups_free(t);
    free(t->workers);
    free(t->ll.e);
    free(t->name);
    free(t);
}

/* A type a worker registered (its workers array was ever grown) is remembered by name
 * when freed, so that POST /pause can tell a type whose workers are away from a typo.
 * Bounded: once DSP_GONE_NAMES_MAX names are kept, no more are (and none is searched
 * for, so a peer churning names costs nothing more). The names share one buffer: a
 * small allocation each, made while a flood of connections came and went, would pin
 * the pages of the flood's freed buffers in the heap for good. */
static void remember_gone(dsp_server *srv, const dsp_type *ty)
{
    if (ty->cap == 0 || srv->types.ngone_names >= DSP_GONE_NAMES_MAX ||
        dsp_server_type_ever_registered(srv, ty->name))
        return;
    size_t need = srv->types.gone_len + ty->len + 1;
    if (need > srv->types.gone_cap) {
        size_t cap = srv->types.gone_cap ? srv->types.gone_cap : 1024;
        while (cap < need)
            cap *= 2;
        char *grown = realloc(srv->types.gone_names, cap);
        if (!grown)
            return;
        srv->types.gone_names = grown;
        srv->types.gone_cap = cap;
    }
    memcpy(srv->types.gone_names + srv->types.gone_len, ty->name, ty->len + 1);
    srv->types.gone_len = need;
    srv->types.ngone_names++;
}

bool dsp_server_type_ever_registered(const dsp_server *srv, const char *name)
{
    const dsp_type *ty = dsp_server_type_find(srv, (const uint8_t *)name, strlen(name));
    if (ty && ty->cap > 0)
        return true;
    for (size_t at = 0; at < srv->types.gone_len; at += strlen(srv->types.gone_names + at) + 1)
        if (strcmp(srv->types.gone_names + at, name) == 0)
            return true;
    return false;
}

void dsp_server_type_release_if_unused(dsp_server *srv, dsp_type *ty)
{
    if (ty->nworkers > 0 || ty->nbuffered > 0 || ty->paused)
        return;
    for (dsp_type **p = &srv->types.buckets[ty->hash & (srv->types.nbuckets - 1)]; *p; p = &(*p)->hnext)
        if (*p == ty) {
            *p = ty->hnext;
            break;
        }
    if (ty->prev)
        ty->prev->next = ty->next;
    else
        srv->types.list = ty->next;
    if (ty->next)
        ty->next->prev = ty->prev;
    srv->types.n--;
    remember_gone(srv, ty);
    type_free(ty);
    /* Shrunk as it grew, so that a burst of types (a flood of HELLOs) leaves no large
     * index behind; when the allocation fails, the larger one stays. */
    if (srv->types.nbuckets > TYPE_INDEX_MIN && srv->types.n < srv->types.nbuckets / 4)
        (void)type_index_resize(srv, srv->types.nbuckets / 2);
}

dsp_type *dsp_server_type_find(const dsp_server *srv, const uint8_t *name, size_t len)
{
    return type_find(srv, name, len, type_hash(name, len));
}

void dsp_server_types_free(dsp_server *srv)
{
    for (dsp_type *t = srv->types.list, *next; t; t = next) {
        next = t->next;
        type_free(t);
    }
    srv->types.list = NULL;
    free(srv->types.buckets);
    srv->types.buckets = NULL;
    srv->types.nbuckets = 0;
    srv->types.n = 0;
    free(srv->types.gone_names);
    srv->types.gone_names = NULL;
    srv->types.ngone_names = srv->types.gone_len = srv->types.gone_cap = 0;
}
