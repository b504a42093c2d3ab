/* shard: the set of task types this taskpushd owns (--types) and the shard's name
 * (--shard, or one derived from the types): parsing and bounding the list, the name the
 * shard's lease and epoch rows and its GET_LOCK carry, and the membership test the HELLO
 * and the claim use. Pure: no I/O, no global state. An empty set means unsharded: the
 * dispatcher owns every type, as before --types existed. */
#ifndef TASKPUSH_DISPATCHER_SHARD_H
#define TASKPUSH_DISPATCHER_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most types one shard lists, whatever --max-types says: every statement of the shard
 * carries the list, so it must stay a few hundred kB at most. */
#define DSP_SHARD_TYPES_MAX 256
/* A shard's name: [A-Za-z0-9_.-], so that 'lease:NAME' fits taskpush_meta.name
 * (VARCHAR(64) ascii) and the GET_LOCK name keeps it whole. */
#define DSP_SHARD_NAME_MAX 32

typedef struct dsp_shard {
    size_t ntypes;                       /* 0: unsharded */
    char **types;                        /* sorted by bytes (utf8mb4_bin's order), distinct */
    char name[DSP_SHARD_NAME_MAX + 1];   /* "" when unsharded */
} dsp_shard;

/* Parses --types (a comma-separated list; spaces around an item are dropped) and
 * --shard (NULL: derive "t" + 16 hex digits of a hash of the sorted list). types NULL:
 * unsharded (then name must be NULL too). Each type: 1..64 characters of valid UTF-8,
 * no trailing space (utf8mb4_bin ignores it); at most max_types and DSP_SHARD_TYPES_MAX
 * of them. Returns 0, or -1 with a one-line reason in err (s is then empty). */
int dsp_shard_parse(dsp_shard *s, const char *types, const char *name, size_t max_types,
                    char *err, size_t errlen);
void dsp_shard_free(dsp_shard *s);

/* Whether the shard owns type[0..len): always true when unsharded. */
bool dsp_shard_has(const dsp_shard *s, const uint8_t *type, size_t len);

#endif
