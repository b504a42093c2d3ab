/* db_claim_fair: fair share between group keys inside the claim (schema version 8,
 * docs/architecture.md "Fair share").
 *
 * Within one type and priority the tasks of different group_keys are handed out in turn:
 * each type keeps, in memory, the key it served last (its rotation cursor), and a claim
 * reads group_idx (per type and priority, the ready rows key by key) twice per type in
 * its one SELECT: part A, the rows after the cursor's key at the cursor's priority, and
 * part B, the rows from the start (highest priority, first key). Together they are the
 * keys in turn starting after the cursor, wrapping around. The claim then takes one row
 * per key per round, as many rounds as it needs, and moves the cursor to the last key
 * it took from. A key with a million rows costs one index seek to pass: the next claim
 * starts after it. No query per key.
 *
 * The rows without a key (NULL) are one key of their own, the first of each round.
 * group_idx holds them under group_lane NULL (so that their claims do not move it), so B
 * takes them from a third read: claim_idx's lane 0, which since schema version 12 holds
 * only keyless NEW rows (a keyed row's claim_lane is NULL unless FAILED, so that its
 * claim moves one index entry, not two), `want` rows, covering. A type that has shown no
 * keyed row reads B with the claim's own limit, as the plain claim did; A stays an empty
 * range read then.
 *
 * The fair read costs more than the plain claim's read even without keys (two range
 * reads of group_idx per type and the rotation's bookkeeping), so a claim takes it only
 * when one of its types is known to have keyed rows (dsp_fair_use); every other claim
 * is the plain claim (dsp_claim_sql_candidates, which also reads each type's first
 * ready keyed row from group_idx: claim_idx's lane 0 has none). A type becomes keyed
 * when a plain claim's lock read returns a row of it with a key (dsp_fair_saw_key) or a
 * fair claim
 * reads one, and goes back to the plain read after FAIR_KEYLESS_CLAIMS (64) fair claims
 * that read rows and saw no key. A SUBMIT with a key makes the next claim fair, and so
 * are the claims after the thread starts up to the first that reads rows; a keyed backlog that appears otherwise
 * (rows inserted by SQL while the dispatcher runs) gives at most one plain (FIFO) batch
 * before its keys take turns.
 *
 * The cursors and the keyed marks are bounded (256 types, least recently used
 * replaced) and live on the claim thread only; a new leader starts from the first key.
 */
#ifndef TASKPUSH_DSP_DB_CLAIM_FAIR_H
#define TASKPUSH_DSP_DB_CLAIM_FAIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dsp_table_names;

/* Longest group_key the table holds (VARBINARY(191)). */
#define DSP_FAIR_KEY_MAX 191u

/* The columns of a fair claim's read, in this order (the first three as
 * DSP_CLAIM_SQL_CAND_COLUMNS), and their number. */
#define DSP_FAIR_COL_GROUP_KEY 3
#define DSP_FAIR_COL_PART 4
#define DSP_FAIR_COL_COUNT 5

typedef struct dsp_fair dsp_fair;

dsp_fair *dsp_fair_new(void);
void dsp_fair_free(dsp_fair *f);

/* Whether a claim of these types takes the fair read: keyed_submits (the count of keyed
 * SUBMITs) moved since the last call, no claim of the thread read rows yet, or one of
 * the types is marked keyed. Costs two loads when no type is marked. */
bool dsp_fair_use(dsp_fair *f, const char *const *types, size_t ntypes, uint64_t keyed_submits);

/* A plain claim saw a row of type with a key: its claims take the fair read from now. */
void dsp_fair_saw_key(dsp_fair *f, const char *type);

/* A buffer size always large enough for dsp_fair_sql on these types. */
size_t dsp_fair_sql_bound(const char *const *types, size_t ntypes);

/* Builds the claim's read of candidates: for each type, parts A and B (see above), each
 * row with its group_key and the part's tag (0 A, 1 B, 2 B's keyless rows), at most `want` rows to take per
 * type. Also forgets the rows of the last claim. Returns the length written, or -1
 * (buffer too small, a bad argument). */
int dsp_fair_sql(dsp_fair *f, char *buf, size_t cap, const char *const *types, size_t ntypes,
                 int64_t now_ms, unsigned want, const struct dsp_table_names *t);

/* Adds one row of the read, of type index `part` (in types[] as given to dsp_fair_sql).
 * A row with a key longer than DSP_FAIR_KEY_MAX, or a tag other than 0, 1 and 2, is
 * dropped (returns -1); -1 also when out of memory. */
int dsp_fair_add(dsp_fair *f, size_t part, uint64_t id, uint8_t prio, const void *key,
                 size_t key_len, bool key_null, unsigned tag);

/* dsp_fair_add of a row as the server sent it (the lengths of mysql_fetch_lengths): id,
 * priority and tag decimal digits only (a tag 0, 1 or 2, a priority up to 255); key NULL for
 * a NULL group_key. -1 for anything else, as dsp_fair_add. */
int dsp_fair_add_text(dsp_fair *f, size_t part, const char *id, unsigned long id_len,
                      const char *prio, unsigned long prio_len, const char *key,
                      unsigned long key_len, const char *tag, unsigned long tag_len);

/* Takes at most `want` rows of type `part` in turn between the keys, writes their ids and
 * priorities to ids[]/prios[] (room for want), and moves the type's cursor. *more: rows
 * may be left (a part was cut by its limit, a window of keyless rows filled its limit,
 * or rows were read and not taken: the rotation takes one round only when it wraps with
 * few keys seen). Taking fewer than want with *more set is a claim cut short, not a
 * drained table: the claim says so to the loop, which claims again at once.
 * Returns the number taken. */
size_t dsp_fair_pick(dsp_fair *f, size_t part, unsigned want, uint64_t *ids, uint8_t *prios,
                     bool *more);

/* Rows the last claim's read brought (a bound of what dsp_fair_pick can take in all). */
size_t dsp_fair_nrows(const dsp_fair *f);

/* After a claim: gives back the memory a large one grew (many types, a wide read), so
 * that a burst of types or rows does not hold the claim thread's heap up. */
void dsp_fair_trim(dsp_fair *f);

#endif
