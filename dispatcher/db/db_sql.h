/* db_sql: the text of the database threads' statements other than the claim SELECT
 * and the lane sweeps (those are db_claim_sql.h): the claim mark, recovery, outcome
 * writes, task_claim rows, the inventory's adoptions, the stats thread's reads,
 * retention and the operator's task requests.
 *
 * Used by dispatcher/db/ (and the unit tests). Pure: no MYSQL *, no global state. Every
 * value goes into the text as a number or as an X'hex' literal, so nothing depends on
 * sql_mode, the connection character set or escaping; text that came from outside is
 * made valid UTF-8 first (common/utf8.h).
 *
 * The builders that name a table take the table names t (common/tables.h, made from
 * --table); NULL means task's. The texts below show task's names.
 */
#ifndef TASKPUSH_DISPATCHER_DB_SQL_H
#define TASKPUSH_DISPATCHER_DB_SQL_H

#include "db.h"
#include "strbuf.h"
#include "tables.h"
#include "utf8.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One row of an outcome write. data/len is the result (SUCCEEDED) or the error text
 * (FAILED, RETRY; already valid UTF-8 and capped), empty for SQL NULL. */
typedef struct dsp_db_sql_row {
    uint64_t task_id;
    uint32_t attempts;
    int64_t run_after_ms;
    const uint8_t *data;
    size_t len;
} dsp_db_sql_row;

/* Bytes of a write statement without its rows, and an upper bound of what one row can
 * add to it (whether or not the statement needs CASE for it): the write thread sums
 * them to keep a statement under max_allowed_packet. */
#define DSP_DB_SQL_WRITE_FIXED 400u
size_t dsp_db_sql_write_row_cost(int kind, const dsp_db_sql_row *row);

/* Up to this many rows a CASE is flat; beyond, it has two levels (see db_sql.c). */
#define DSP_DB_SQL_FLAT_CASE_MAX 32u

/* Appends the one UPDATE that writes rows[0..n) of one kind (enum dsp_write_kind):
 *
 *   UPDATE task FORCE INDEX (PRIMARY) SET task_state = 2, result = R, attempts = A,
 *     last_update_time = now_ms
 *   WHERE task_id IN (...) AND task_state = 1 AND epoch = E
 *
 * A column whose value is the same for every row gets that one literal; one whose values
 * differ gets CASE task_id WHEN id THEN value ... END (in two levels, over groups of
 * about sqrt(n) rows, when n > DSP_DB_SQL_FLAT_CASE_MAX and the rows are sorted by
 * task_id: pass them sorted). So the common batch (all succeeded, same attempts, no
 * result) is one plain UPDATE ... IN (...).
 *   SUCCEEDED: task_state 2, result, attempts, last_update_time
 *   FAILED:    task_state 3, err_msg, attempts, last_update_time
 *   RETRY:     task_state 0, `delayed` 1, run_after, err_msg, attempts, last_update_time
 *   RELEASE:   task_state 0, `delayed` 0, attempts, last_update_time (err_msg untouched)
 *   DELIVERED: attempts, last_update_time (the row stays PROCESSING)
 * Returns false for n == 0 or a bad kind (nothing appended). */
bool dsp_db_sql_write(dsp_strbuf *b, const dsp_table_names *t, int kind, uint32_t epoch,
                      int64_t now_ms, const dsp_db_sql_row *rows, size_t n);

/* Appends the UPDATE of dsp_db_sql_write for one SUCCEEDED row whose result is the
 * statement's one parameter ('?', sent by dsp_dbi_exec_blob): a result too large for
 * the hex text of a batch.
 *   UPDATE task FORCE INDEX (PRIMARY) SET task_state = 2, result = ?, attempts = A,
 *     last_update_time = now_ms WHERE task_id IN (id) AND task_state = 1 AND epoch = E */
void dsp_db_sql_write_result_param(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                   int64_t now_ms, const dsp_db_sql_row *row);

/* Results of this many bytes or more are written by dsp_db_sql_write_result_param, one
 * statement each: their hex text (twice their size) would be copied and parsed for
 * nothing, and from 8 MiB on it would not fit max_allowed_packet. Smaller ones share the
 * batch's statement (one per kind for the whole batch). */
#define DSP_DB_RESULT_PARAM_MIN (64u * 1024)

/* Appends ids[0..n) as "id,id,...", the form task_claim.task_ids stores. A claim formats
 * its ids once and hands the text to its lock, its mark and its task_claim row (each
 * claim names 1,000 to 2,000 ids three times). */
void dsp_db_sql_id_csv(dsp_strbuf *b, const uint64_t *ids, size_t n);

/* Appends the claim's lock of the candidates it kept (see dsp_claim_sql_candidates),
 * by primary key, reading what the dispatcher needs of each:
 *   SELECT task_id, attempts, max_attempts, timeout_ms, payload, group_key
 *     FROM task FORCE INDEX (PRIMARY) WHERE task_id IN (...) AND task_state = 0
 *     AND `delayed` = 0 AND run_after <= now_ms FOR UPDATE SKIP LOCKED
 * The state is read again under the lock: a row changed since the candidates' read
 * (cancelled, say) or locked by another transaction is not returned and stays as it is.
 * Rows come in primary-key order, not in the order of the list. ids_csv is the kept
 * ids as dsp_db_sql_id_csv wrote them (len bytes, at least one id). */
void dsp_db_sql_claim_lock(dsp_strbuf *b, const dsp_table_names *t, int64_t now_ms,
                           const char *ids_csv, size_t len);

/* The columns of dsp_db_sql_claim_lock's rows. */
enum {
    DSP_DB_SQL_LOCK_ID = 0,
    DSP_DB_SQL_LOCK_ATTEMPTS,
    DSP_DB_SQL_LOCK_MAX_ATTEMPTS,
    DSP_DB_SQL_LOCK_TIMEOUT_MS,
    DSP_DB_SQL_LOCK_PAYLOAD,
    DSP_DB_SQL_LOCK_GROUP_KEY, /* VARBINARY(191) or NULL (schema version 8) */
    DSP_DB_SQL_LOCK_NCOLS
};

/* Appends the claim's mark of exactly the rows it locked (ids_csv as for the lock):
 *   UPDATE task FORCE INDEX (PRIMARY) SET task_state = 1, epoch = E,
 *     last_update_time = now_ms WHERE task_id IN (...) */
void dsp_db_sql_claim_mark(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch, int64_t now_ms,
                           const char *ids_csv, size_t len);

/* Appends the release of rows whose claim may have committed while its answer was
 * lost (back to NEW, no attempt used):
 *   UPDATE task FORCE INDEX (PRIMARY) SET task_state = 0, last_update_time = now_ms
 *   WHERE task_id IN (...) AND task_state = 1 AND epoch = E */
void dsp_db_sql_release_ids(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch, int64_t now_ms,
                            const uint64_t *ids, size_t n);

/* The write thread's way round a row locked by another transaction (see db_write.c
 * write_skip_locked). Both read the ids of rows[0..n) whose skip[i] is 0 (all when skip
 * is NULL) that are still PROCESSING under epoch:
 *   lock_free:  SELECT task_id ... FOR UPDATE SKIP LOCKED (locks those free to lock)
 *   still_ours: SELECT task_id ... (a plain read: no lock, no wait) */
void dsp_db_sql_lock_free(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                          const dsp_db_sql_row *rows, const uint8_t *skip, size_t n);
void dsp_db_sql_still_ours(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                           const dsp_db_sql_row *rows, const uint8_t *skip, size_t n);

/* ---- shards (--types, see shard.h) ----
 * The builders below that take `in` append it to their WHERE: a shard passes the text
 * dsp_db_sql_type_in wrote for its types, so that recovery, the sweeps, retention,
 * requeue and the task-level requests never reach another shard's rows; NULL when
 * unsharded (the statement is then exactly the unsharded one). */

/* Appends " AND task_type IN (_utf8mb4 X'..', ...)" for types[0..n) (nothing when n is
 * 0); an empty type is written ''. */
void dsp_db_sql_type_in(dsp_strbuf *b, const char *const *types, size_t n);

/* ---- the claim list (table task_claim, schema version 5) ----
 * claim_idx no longer tells PROCESSING from SUCCESSFUL (both are claim_lane 1), so each
 * claim transaction lists the ids it made PROCESSING in a task_claim row of its epoch,
 * and recovery reads those rows (docs/schema.md, task_claim). */

/* Appends the row of one claim: INSERT INTO task_claim (epoch, seq, shard, task_ids)
 * VALUES (E, S, 'shard', 'id,id,...'), the list being ids_csv (dsp_db_sql_id_csv, at
 * least one id); shard NULL or "" when unsharded. */
void dsp_db_sql_claim_log_insert(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                 uint64_t seq, const char *shard, const char *ids_csv, size_t len);
/* Appends DELETE FROM task_claim WHERE epoch = E AND seq IN (...) over seqs[0..n), n >= 1. */
void dsp_db_sql_claim_log_delete(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                 const uint64_t *seqs, size_t n);
/* Appends the locking read of the next row, after (after_epoch, after_seq) in (epoch,
 * seq) order, of an epoch older than epoch (of one shard, or of every shard when shard
 * is NULL):
 *   SELECT epoch, seq, task_ids FROM task_claim WHERE epoch < E
 *   AND (epoch > AE OR (epoch = AE AND seq > AS)) [AND shard = 'S']
 *   ORDER BY epoch, seq LIMIT 1 FOR UPDATE */
void dsp_db_sql_claim_log_next(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                               const char *shard, uint32_t after_epoch, uint64_t after_seq);
/* Appends a plain read that finds whether such a row exists (the periodic recovery's
 * probe): SELECT seq FROM task_claim WHERE epoch < E [AND shard = 'S'] LIMIT 1 */
void dsp_db_sql_claim_log_probe(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                const char *shard);
/* Appends the recovery of the listed rows still PROCESSING under row_epoch: each goes
 * back to NEW (ready) with its attempts unchanged (they count the deliveries recorded),
 * or FAILED when its last allowed delivery was made (see db_sql.c), with the shard's
 * filter `in`. */
void dsp_db_sql_recover_ids(dsp_strbuf *b, const dsp_table_names *t, uint32_t row_epoch,
                            int64_t now_ms, const uint64_t *ids, size_t n, const char *in);
/* Appends SELECT COUNT(*) FROM task WHERE task_id IN (...) AND task_state = 1 AND
 * epoch = row_epoch (every shard): a claim's row is deleted only when this is 0. */
void dsp_db_sql_still_processing(dsp_strbuf *b, const dsp_table_names *t, uint32_t row_epoch,
                                 const uint64_t *ids, size_t n);
/* The largest attempts the schema accepts (CHECK attempts_max, version 6; max_attempts
 * is at most 1000 too): what the dispatcher writes is capped to it. */
#define DSP_DB_ATTEMPTS_MAX 1000u

/* Orphans: PROCESSING rows that no dispatcher can hold, because no task_claim row lists
 * them (a producer wrote task_state 1 itself, or a path nobody foresaw left them). A
 * row is an orphan for the leader of epoch E when its epoch is older than E (past the
 * adoption grace every delivery of an older epoch was adopted, and moved to E, or is
 * fair game for recovery anyway) or was never handed out (above the epoch counter).
 * Rows of E itself and of newer epochs (another shard's leader, or one that took this
 * shard over) are never orphans. */
/* Appends the end of the next step of the orphan scan, in primary-key order:
 *   SELECT COUNT(*), MAX(task_id) FROM (SELECT task_id FROM task FORCE INDEX (PRIMARY)
 *   WHERE task_id > AFTER ORDER BY task_id LIMIT L) s */
void dsp_db_sql_orphan_range(dsp_strbuf *b, const dsp_table_names *t, uint64_t after_id,
                             unsigned limit);
/* The orphan condition for the leader of epoch, with the epoch counter's value read just
 * before (counter), for rows whose last_update_time is before older_than_ms. */
typedef struct dsp_db_sql_orphan {
    uint32_t epoch;
    uint64_t counter;
    int64_t older_than_ms;
    const char *in; /* the shard's filter, or NULL */
} dsp_db_sql_orphan;
/* Appends the orphans' ids: with ids NULL, a plain read of those with AFTER < task_id <=
 * HI, at most limit; else a locking read of ids[0..n) still orphans, skipping rows
 * another transaction holds (FOR UPDATE SKIP LOCKED: an orphan never makes a wait). */
void dsp_db_sql_orphan_select(dsp_strbuf *b, const dsp_table_names *t, const dsp_db_sql_orphan *o,
                              uint64_t after_id, uint64_t hi_id, unsigned limit,
                              const uint64_t *ids, size_t n);
/* Appends the put-back of the orphans ids[0..n) (locked by the read above), with
 * recovery's attempts rule (dsp_db_sql_recover_ids). */
void dsp_db_sql_orphan_recover(dsp_strbuf *b, const dsp_table_names *t, const dsp_db_sql_orphan *o,
                               int64_t now_ms, const uint64_t *ids, size_t n);
/* Parses task_claim.task_ids as read from the table, which is untrusted: decimal ids in
 * 1..2^64-1 of at most 20 digits, separated by single commas, no sign, space or empty
 * item, at most cap of them. Returns 0 with *n ids in ids[], or -1. */
int dsp_claim_ids_parse(const char *text, size_t len, uint64_t *ids, size_t cap, size_t *n);
/* Most ids one task_claim row may list: ten times the largest --batch (10,000). */
#define DSP_CLAIM_IDS_MAX 100000u

/* The inventory (protocol version 3). A delivery (old_epoch, attempt) is still current
 * while its row is PROCESSING under old_epoch with attempts = attempt, or attempt - 1: a
 * delivery younger than DSP_DELIVERY_RECORD_MS has no record yet. */
/* Appends the adoption of such a delivery by the leader of epoch: the row moves to
 * epoch and records attempts = attempt (with the shard's filter in). */
void dsp_db_sql_adopt(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch, int64_t now_ms,
                      uint64_t task_id, uint32_t old_epoch, uint32_t attempt, const char *in);
/* Appends the read of a row just adopted (PROCESSING under epoch with attempts =
 * attempt): task_type, max_attempts, task_priority. */
void dsp_db_sql_adopted_row(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                            uint64_t task_id, uint32_t attempt);
/* Appends, after a dsp_db_sql_write of one row fenced by the delivery's epoch, the
 * delivery's attempt; with last 1 only a row whose max_attempts that attempt reached,
 * with last 0 only one with attempts left (a foreign retry: RETRY, else FAILED), with
 * last -1 either. */
void dsp_db_sql_foreign_fence(dsp_strbuf *b, uint32_t attempt, int last);

/* ---- the stats thread's statements (see db_stats.c) ----
 *
 * Measured on MariaDB 10.11 (tests/integration/test_db.c checks the plans with EXPLAIN):
 * none reads a row of another state than the ones it counts, and only the oldest-ready
 * query reads table rows (one per part). MariaDB does not use a loose index scan
 * ("Using index for group-by") on claim_idx, whose task_priority part is descending, nor
 * grouping by that part without a temporary table: so the counts group by the prefix
 * (task_state, `delayed`, task_type) and sum the priorities, and the oldest ready row
 * is read with one LIMIT 1 index dive per (type, priority). */

/* Counts of NEW and FAILED rows per (claim_lane, `delayed`, task_type), an index-only
 * range scan of claim_idx grouped in index order (no temporary table); claim_lane is
 * the state for these two (PROCESSING rows are counted from task_claim's lists). Since
 * version 12 a keyed row is in claim_lane 0 never (NULL while NEW): its NEW rows come from
 * group_idx, the same columns and KEYED 1:
 *   SELECT claim_lane, `delayed`, task_type, COUNT(*), SUM(run_after <= now_ms),
 *     SUM(task_priority = 0), SUM(task_priority = 1), SUM(task_priority = 2), 0
 *   FROM task FORCE INDEX (claim_idx) WHERE claim_lane IN (0, 3)
 *   GROUP BY claim_lane, `delayed`, task_type
 *   UNION ALL SELECT group_lane, ..., 1 FROM task FORCE INDEX (group_idx)
 *   WHERE group_lane = 0 GROUP BY group_lane, `delayed`, task_type */
enum dsp_db_sql_counts_col {
    DSP_DB_SQL_COUNTS_STATE = 0,
    DSP_DB_SQL_COUNTS_DELAYED,
    DSP_DB_SQL_COUNTS_TYPE,
    DSP_DB_SQL_COUNTS_ROWS,
    DSP_DB_SQL_COUNTS_DUE, /* rows with run_after <= now_ms */
    DSP_DB_SQL_COUNTS_P0,  /* rows of priority LOW, NORMAL, HIGH */
    DSP_DB_SQL_COUNTS_P1,
    DSP_DB_SQL_COUNTS_P2,
    DSP_DB_SQL_COUNTS_KEYED, /* 1: NEW rows with a group_key (group_idx) */
    DSP_DB_SQL_COUNTS_NCOLS
};
/* `in` as below (shards): a shard's figures are those of its types. */
void dsp_db_sql_stats_counts(dsp_strbuf *b, const dsp_table_names *t, int64_t now_ms,
                             const char *in);

/* PROCESSING rows among ids[0..n) (task_claim's lists), per type:
 *   SELECT task_type, COUNT(*) FROM task FORCE INDEX (PRIMARY) WHERE task_id IN (...)
 *   AND task_state = 1 GROUP BY task_type */
void dsp_db_sql_stats_processing(dsp_strbuf *b, const dsp_table_names *t, const uint64_t *ids,
                                 size_t n, const char *in);

/* SUCCESSFUL and PROCESSING rows together (lane 1: claim_lane without a key, group_lane
 * with one), each counted up to cap (index-only ranges); the caller takes the PROCESSING
 * ones away:
 *   SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM task FORCE INDEX (claim_idx)
 *     WHERE claim_lane = 1 LIMIT cap) x) + (the same of group_idx, group_lane = 1) */
#define DSP_DB_SQL_SUCCESSFUL_CAP 1000000u
void dsp_db_sql_stats_successful(dsp_strbuf *b, const dsp_table_names *t, unsigned cap,
                                 const char *in);

/* The time the oldest ready NEW row of each type became due, over the head (smallest
 * task_id) of each (type, priority) group of the ready lane, one row per type:
 *   SELECT t, MIN(g) FROM (
 *     (SELECT task_type t, GREATEST(insert_time, run_after) g FROM task FORCE INDEX (claim_idx)
 *      WHERE claim_lane = 0 AND `delayed` = 0 AND task_type = T AND task_priority = P
 *        AND run_after <= now_ms ORDER BY task_id LIMIT 1)
 *     UNION ALL ...) u GROUP BY t
 * Each part is a ref on four parts of claim_idx in index order, run_after checked by
 * index condition pushdown, one row read. A keyed part (the group's rows with a key,
 * group_idx, which holds them key by key) takes the smallest id among the first
 * DSP_DB_SQL_OLDEST_KEYED_SCAN of them and reads that row: exact up to that many ready
 * keyed rows of the type and priority, else the oldest of the first keys' rows (about
 * 2,000 handler reads a part, every --table-stats-ms: 4,096 cost a drain of 30,000
 * keyed tasks 0.8 reads a task more when a refresh fell in it). Call _part once per group (first = true for the
 * first), then _end. */
#define DSP_DB_SQL_OLDEST_KEYED_SCAN 1024u
void dsp_db_sql_stats_oldest_part(dsp_strbuf *b, const dsp_table_names *t, bool first,
                                  const char *type, size_t type_len, int priority, int64_t now_ms,
                                  bool keyed);
void dsp_db_sql_stats_oldest_end(dsp_strbuf *b);

/* The busiest waiting keys of one type (GET /keys), a part of a UNION ALL (first: the
 * first part): columns slot (the caller's number for the type), group_key, the count of
 * its ready rows and the rows read, among the first scan_max ready keyed rows of the
 * type in group_idx, the top keys by count. */
void dsp_db_sql_stats_keys_part(dsp_strbuf *b, const dsp_table_names *t, bool first, unsigned slot,
                                const char *type, size_t type_len, unsigned scan_max, unsigned top);

/* Retention: one batch of SUCCESSFUL (state 2) or FAILED (state 3) rows last updated
 * before before_ms (a range of claim_idx on the state's lane, L 1 or 3; with keyed, the
 * SUCCESSFUL rows with a key, a range of group_idx: their claim_lane is NULL):
 *   DELETE FROM task WHERE claim_lane = L AND task_state = S AND last_update_time < before_ms
 *   LIMIT limit
 *   DELETE FROM task WHERE group_lane = 1 AND task_state = 2 AND ... (keyed)
 * Does nothing (appends nothing) for another state, or keyed with state 3 (FAILED rows
 * are all in claim_lane 3). */
void dsp_db_sql_retention(dsp_strbuf *b, const dsp_table_names *t, int state, bool keyed,
                          int64_t before_ms, unsigned limit, const char *in);

/* One batch of the operator's requeue of FAILED rows (of one type, or all when type is
 * NULL): back to NEW and ready, attempts 0, err_msg kept:
 *   UPDATE task FORCE INDEX (claim_idx) SET task_state = 0, attempts = 0,
 *     `delayed` = IF(EXISTS (SELECT 1 FROM task_dep d WHERE d.task_id = task.task_id), 2, 0),
 *     run_after = 0, last_update_time = now_ms
 *   WHERE claim_lane = 3 [AND task_type = _utf8mb4 X'..'] LIMIT limit */
void dsp_db_sql_requeue_failed(dsp_strbuf *b, const dsp_table_names *t, const char *type,
                               int64_t now_ms, unsigned limit, const char *in);

/* ---- task-level operator requests (db_stats.c), one row by primary key or a bounded
 * range of claim_idx ---- */

/* GET /task: the row of task_id, columns DSP_DB_SQL_SHOW_* in that order. */
enum {
    DSP_DB_SQL_SHOW_ID, DSP_DB_SQL_SHOW_TYPE, DSP_DB_SQL_SHOW_STATE, DSP_DB_SQL_SHOW_PRIORITY,
    DSP_DB_SQL_SHOW_ATTEMPTS, DSP_DB_SQL_SHOW_MAX_ATTEMPTS, DSP_DB_SQL_SHOW_INSERT_TIME,
    DSP_DB_SQL_SHOW_UPDATE_TIME, DSP_DB_SQL_SHOW_RUN_AFTER, DSP_DB_SQL_SHOW_TIMEOUT,
    DSP_DB_SQL_SHOW_ERR_MSG, DSP_DB_SQL_SHOW_RESULT_LEN, DSP_DB_SQL_SHOW_PAYLOAD_LEN,
    DSP_DB_SQL_SHOW_EPOCH, DSP_DB_SQL_SHOW_DELAYED, DSP_DB_SQL_SHOW_NCOLS
};
void dsp_db_sql_task_show(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                          const char *in);
/* The state of task_id alone: SELECT task_state FROM task WHERE task_id = N. */
void dsp_db_sql_task_state(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                           const char *in);

/* GET /failed, step 1 (for every type): the next type after `after` (the first when
 * after is NULL) that has FAILED rows in lane `lane`, one index dive of claim_idx:
 *   SELECT MIN(task_type) FROM task WHERE claim_lane = 3 AND `delayed` = L
 *     [AND task_type > X]
 * (MariaDB does not choose a loose index scan for a GROUP BY here: it would read every
 * FAILED row's index entry.) */
void dsp_db_sql_failed_next_type(dsp_strbuf *b, const dsp_table_names *t, int lane,
                                 const char *after, size_t after_len, const char *in);
/* Step 2: one part per type (first: the first part), each the limit FAILED rows of its
 * type that failed last (a backward range of failed_idx after the type's NULLs, no
 * sort), then _end merges them, the latest failure first (ties: the higher task_id):
 * columns task_id, task_type, task_priority, attempts, max_attempts, failed_at,
 * LEFT(err_msg, err_max). */
void dsp_db_sql_failed_part(dsp_strbuf *b, const dsp_table_names *t, bool first,
                            const char *type, size_t type_len, unsigned limit, unsigned err_max,
                            const char *in);
void dsp_db_sql_failed_end(dsp_strbuf *b, unsigned limit);

/* POST /retry-failed: the FAILED rows of type that failed at or after since_ms back to
 * NEW as POST /retry does, the latest failures first, at most limit of them: a range of
 * failed_idx. */
void dsp_db_sql_retry_failed_since(dsp_strbuf *b, const dsp_table_names *t, const char *type,
                                   size_t type_len, int64_t since_ms, int64_t now_ms,
                                   unsigned limit, const char *in);

/* POST /retry: FAILED -> NEW, ready and due at now_ms, attempts 0, err_msg NULL; a task
 * with dependency rows waits for them again (`delayed` 2), as with the two above. */
void dsp_db_sql_task_retry(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                           int64_t now_ms, const char *in);
/* POST /cancel of a NEW row (no dispatcher holds it): FAILED, err_msg 'cancelled'. A
 * claim racing it has the row locked; once it commits the row is PROCESSING and this
 * changes nothing. */
void dsp_db_sql_task_cancel(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                            int64_t now_ms, const char *in);
/* POST /cancel of a PROCESSING row that the leader of epoch does not hold and that is an
 * orphan for it (see dsp_db_sql_orphan_range): FAILED, err_msg 'cancelled'. */
void dsp_db_sql_task_cancel_orphan(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                                   uint32_t epoch, int64_t now_ms, const char *in);

#endif
