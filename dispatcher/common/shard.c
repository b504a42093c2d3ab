/* shard: see shard.h. */
#include "shard.h"

#include "utf8.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bytes_cmp(const void *pa, const void *pb)
{
    return strcmp(*(char *const *)pa, *(char *const *)pb); /* unsigned bytes: code points */
}

/* NULL when t[0..len) is a type the table can hold and a worker may name. */
static const char *type_problem(const char *t, size_t len)
{
    size_t chars = 0;

    if (len == 0)
        return "an empty task type";
    if (dsp_utf8_valid_prefix((const uint8_t *)t, len) != len)
        return "a task type that is not UTF-8";
    for (size_t i = 0; i < len; i++)
        chars += ((unsigned char)t[i] & 0xC0) != 0x80;
    if (chars > 64)
        return "a task type longer than 64 characters";
    return NULL;
}

static bool name_ok(const char *n)
{
    size_t len = strlen(n);

    if (len == 0 || len > DSP_SHARD_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

/* FNV-1a 64 over the sorted types, each ended by a NUL: the same set gives the same
 * name on every dispatcher of the shard, in any order it was written. */
static void derive_name(dsp_shard *s)
{
    uint64_t h = 14695981039346656037ULL;

    for (size_t i = 0; i < s->ntypes; i++) {
        const unsigned char *p = (const unsigned char *)s->types[i];
        do
            h = (h ^ *p) * 1099511628211ULL;
        while (*p++);
    }
    snprintf(s->name, sizeof s->name, "t%016" PRIx64, h);
}

static int bad(dsp_shard *s, char *err, size_t errlen, const char *why, const char *what)
{
    dsp_shard_free(s);
    snprintf(err, errlen, "--types: %s%s%.80s%s", why, what ? " ('" : "", what ? what : "",
             what ? "')" : "");
    return -1;
}

/* Splits list into s->types (trimmed, unsorted). */
static int split(dsp_shard *s, const char *list, size_t cap, char *err, size_t errlen)
{
    const char *p = list;

    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *why;
        while (len && *p == ' ') {
            p++;
            len--;
        }
        while (len && p[len - 1] == ' ')
            len--;
        if (s->ntypes >= cap)
            return bad(s, err, errlen, "too many task types (at most --max-types and 256)", NULL);
        if ((why = type_problem(p, len)) != NULL)
            return bad(s, err, errlen, why, len ? p : NULL);
        if ((s->types[s->ntypes] = strndup(p, len)) == NULL)
            return bad(s, err, errlen, "out of memory", NULL);
        s->ntypes++;
        if (!end)
            return 0;
        p = end + 1;
    }
}

int dsp_shard_parse(dsp_shard *s, const char *types, const char *name, size_t max_types,
                    char *err, size_t errlen)
{
    size_t cap = max_types < DSP_SHARD_TYPES_MAX ? max_types : DSP_SHARD_TYPES_MAX, k = 0;

    memset(s, 0, sizeof *s);
    if (types == NULL) {
        if (name == NULL)
            return 0;
        snprintf(err, errlen, "--shard needs --types (the task types the shard owns)");
        return -1;
    }
    if (name && !name_ok(name)) {
        snprintf(err, errlen, "--shard '%.40s': 1 to 32 of A-Z a-z 0-9 _ . -", name);
        return -1;
    }
    if (cap == 0 || (s->types = calloc(cap, sizeof *s->types)) == NULL)
        return bad(s, err, errlen, "out of memory", NULL);
    if (split(s, types, cap, err, errlen) < 0)
        return -1;
    qsort(s->types, s->ntypes, sizeof *s->types, bytes_cmp);
    for (size_t i = 0; i < s->ntypes; i++) { /* drop repeats */
        if (k && strcmp(s->types[k - 1], s->types[i]) == 0)
            free(s->types[i]);
        else
            s->types[k++] = s->types[i];
    }
    s->ntypes = k;
    if (name)
        snprintf(s->name, sizeof s->name, "%s", name);
    else
        derive_name(s);
    return 0;
}

void dsp_shard_free(dsp_shard *s)
{
    for (size_t i = 0; i < s->ntypes; i++)
        free(s->types[i]);
    free(s->types);
    memset(s, 0, sizeof *s);
}

bool dsp_shard_has(const dsp_shard *s, const uint8_t *type, size_t len)
{
    size_t lo = 0, hi;

    if (s == NULL || s->ntypes == 0)
        return true;
    hi = s->ntypes;
    while (lo < hi) { /* the list is sorted by bytes */
        size_t mid = lo + (hi - lo) / 2;
        const char *t = s->types[mid];
        size_t tl = strlen(t);
        int c = memcmp(t, type, tl < len ? tl : len);
        if (c == 0)
            c = tl < len ? -1 : tl > len;
        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}
