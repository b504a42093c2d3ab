/* db_claim_sql: the text of the dispatcher's claim and lane-sweep statements.
 *
 * Pure string builders: no MYSQL *, no allocation, no global state. Each writes into a
 * caller buffer, NUL-terminates it, and returns the number of bytes written (without
 * the NUL), or -1 when the buffer is too small or an argument is invalid; on -1 the
 * buffer holds an empty string (when cap > 0).
 *
 * The statements depend on sql/schema.sql (table task, indexes claim_idx and
 * delay_idx): change them together, and bump schema_version there.
 *
 * Measured on MariaDB 10.11 (tests/integration/test_schema.c checks it): each part of
 * the claim reads claim_idx as ref on (task_state, `delayed`, task_type) in ORDER BY
 * order (no filesort), one index lookup plus one index step per row returned;
 * FOR UPDATE SKIP LOCKED is accepted inside the parenthesised UNION ALL parts.
 *
 * Every statement names its index (FORCE INDEX). Without the hint MariaDB 10.11 chose
 * delay_idx (ref on `delayed` = 0) plus a filesort for the claim right after a large
 * demote sweep: until purge removes the delete-marked claim_idx entries the sweep left,
 * the range estimate of claim_idx counts them, and the claim would then read and lock
 * every ready row of every type. Both MariaDB and MySQL accept FORCE INDEX in SELECT and
 * single-table UPDATE.
 */
#ifndef TASKPUSH_DSP_DB_CLAIM_SQL_H
#define TASKPUSH_DSP_DB_CLAIM_SQL_H

#include <stddef.h>
#include <stdint.h>

/* The table names (common/tables.h): the builders that take one name its tables; NULL
 * means the default, task. Those without one (the one-statement claim, the plain
 * sweeps) write task's. */
struct dsp_table_names;

/* The length a builder returns is the only sign that it worked: use it. */
#define DSP_CLAIM_SQL_MUST_USE __attribute__((warn_unused_result))

/* The columns a claim returns, in this order (see enum dsp_claim_col). */
#define DSP_CLAIM_SQL_COLUMNS                                                                      \
    "task_id, task_type, task_priority, attempts, max_attempts, timeout_ms, payload"

/* Index of each column in a claim's result row. */
enum dsp_claim_col {
    DSP_CLAIM_COL_TASK_ID = 0,  /* BIGINT UNSIGNED */
    DSP_CLAIM_COL_TASK_TYPE,    /* VARCHAR(64) utf8mb4_bin */
    DSP_CLAIM_COL_PRIORITY,     /* TINYINT 0..2 */
    DSP_CLAIM_COL_ATTEMPTS,     /* INT */
    DSP_CLAIM_COL_MAX_ATTEMPTS, /* INT */
    DSP_CLAIM_COL_TIMEOUT_MS,   /* INT or NULL: the dispatcher's default */
    DSP_CLAIM_COL_PAYLOAD,      /* MEDIUMBLOB or NULL; binary, use the field length */
    DSP_CLAIM_COL_COUNT
};

/* The columns of a claim's candidates (dsp_claim_sql_candidates), all in claim_idx, in
 * this order: task_id, task_type, task_priority (the first three of a claim's row). */
#define DSP_CLAIM_SQL_CAND_COLUMNS "task_id, task_type, task_priority"
#define DSP_CLAIM_SQL_CAND_COL_COUNT 3

/* Longest task_type the table holds (VARCHAR(64) characters; in bytes up to 4 times). */
#define DSP_CLAIM_SQL_TYPE_MAX_BYTES 256

/* The same sweeps as dsp_claim_sql_promote()/dsp_claim_sql_demote(), with placeholders
 * for a prepared statement: (now_ms BIGINT, limit INT). */
#define DSP_CLAIM_SQL_PROMOTE_PS                                                                   \
    "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 0 WHERE `delayed` = 1 AND "               \
    "run_after <= ? LIMIT ?"
#define DSP_CLAIM_SQL_DEMOTE_PS                                                                    \
    "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 1 WHERE `delayed` = 0 AND "               \
    "task_state = 0 AND run_after > ? LIMIT ?"

/* Takes the next dispatcher epoch (the fencing token); read it back with
 * mysql_insert_id() or SELECT LAST_INSERT_ID() on the same connection. Autocommit, or
 * commit it at once: the row lock serialises dispatchers. */
#define DSP_CLAIM_SQL_EPOCH_NEXT                                                                   \
    "UPDATE taskpush_meta SET value = LAST_INSERT_ID(value + 1) WHERE name = 'epoch'"

/* Reads the schema version sql/schema.sql wrote (one row, one column). */
#define DSP_CLAIM_SQL_SCHEMA_VERSION "SELECT value FROM taskpush_meta WHERE name = 'schema_version'"

/* The same two for any table names: printf formats of one %s, the meta table's name
 * (common/tables.h; taskpush_meta for task gives the texts above). */
#define DSP_CLAIM_SQL_EPOCH_NEXT_FMT                                                               \
    "UPDATE %s SET value = LAST_INSERT_ID(value + 1) WHERE name = 'epoch'"
#define DSP_CLAIM_SQL_SCHEMA_VERSION_FMT "SELECT value FROM %s WHERE name = 'schema_version'"

/* The schema version this code was written for: the one sql/schema.sql writes and the last
 * sql/migrations file reaches (the build checks both, see embed.py --migrations). */
#define DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN 12

/* Writes the SQL string literal (quotes included) for the bytes from[0..len) into to,
 * at most cap bytes, no NUL needed. Returns the length written, or -1 when cap is too
 * small. ctx is the caller's (for instance a MYSQL * for mysql_real_escape_string).
 * It must write at most DSP_CLAIM_SQL_LITERAL_MAX(len) bytes for
 * dsp_claim_sql_select_bound() to hold. */
typedef int (*dsp_claim_sql_quote_fn)(void *ctx, char *to, size_t cap, const char *from,
                                      size_t len);

/* Upper bound of a quoted literal of len bytes, from any quote function given here. */
#define DSP_CLAIM_SQL_LITERAL_MAX(len) (2 * (size_t)(len) + 16)

/* The default quote function: writes _utf8mb4 X'hex', a literal that means the same
 * under every sql_mode and connection character set, so no escaping can go wrong.
 * ctx is unused. */
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_quote_hex(void *ctx, char *to, size_t cap,
                                                   const char *from, size_t len);

/* Builds the one-statement claim of up to `limit` ready tasks of each type in
 * types[0..ntypes). taskpushd no longer runs it: it reads dsp_claim_sql_candidates() and
 * locks by primary key, which under load costs a fraction of this locking scan. It stays
 * as the claim a poller of this schema would write; tests/integration/test_schema.c
 * checks claim_idx's plan and SKIP LOCKED against it:
 *
 *   (SELECT <DSP_CLAIM_SQL_COLUMNS> FROM task FORCE INDEX (claim_idx)
 *     WHERE task_state = 0 AND `delayed` = 0 AND task_type = <T1> AND run_after <= now_ms
 *     ORDER BY task_priority DESC, task_id LIMIT limit FOR UPDATE SKIP LOCKED)
 *   UNION ALL (... T2 ...) ...
 *
 * Run it inside a transaction; rows locked by another transaction are skipped, not
 * waited for. Each type returns its own rows in dispatch order (priority descending,
 * then task_id), part after part; the whole result can hold ntypes * limit rows, and is
 * not globally ordered across types: merge by (priority DESC, task_id) if that matters.
 * types are NUL-terminated byte strings (at most DSP_CLAIM_SQL_TYPE_MAX_BYTES each);
 * quote writes them as literals, NULL means dsp_claim_sql_quote_hex.
 * Returns the length written, or -1 (buffer too small, ntypes == 0, limit == 0,
 * now_ms < 0, a NULL or too long type). */
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_select(char *buf, size_t cap, const char *const *types,
                                                size_t ntypes, int64_t now_ms, unsigned limit,
                                                dsp_claim_sql_quote_fn quote, void *quote_ctx);

/* The claim's candidates: the same parts as dsp_claim_sql_select() with the columns
 * DSP_CLAIM_SQL_CAND_COLUMNS and no FOR UPDATE SKIP LOCKED, so a consistent read of
 * claim_idx alone (a covering index read: no row is looked up, nothing is locked); each
 * part followed by the type's first ready keyed row from group_idx (LIMIT 1, covering
 * too), since claim_idx's lane 0 holds no keyed row (schema version 12): a keyed row
 * inserted by SQL into a type the claim thread takes as keyless is claimed, and marks
 * the type keyed.
 * taskpushd's claim runs this, keeps the rows it wants, then locks those by primary key
 * (dsp_db_sql_claim_lock): a locking read of a secondary index costs InnoDB an implicit
 * lock check of every entry it passes (a clustered lookup while the index pages are
 * being changed by other transactions), which made the one-statement claim several
 * times slower under load than the same read without locks. Same arguments and
 * returns as dsp_claim_sql_select(), and the same bound. */
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_candidates(char *buf, size_t cap, const char *const *types,
                                                    size_t ntypes, int64_t now_ms, unsigned limit,
                                                    dsp_claim_sql_quote_fn quote, void *quote_ctx,
                                                    const struct dsp_table_names *t);

/* The candidates after a position: the same parts as dsp_claim_sql_candidates(), each
 * with " AND (task_priority < P OR (task_priority = P AND task_id > ID))" for its own
 * after_prio[i] and after_id[i], so that part i reads on from the last row a claim
 * already tried (a range of claim_idx in ORDER BY order, no filesort). A claim whose
 * rows were locked by another transaction reads past them this way (db_claim.c).
 * Same returns and bound as dsp_claim_sql_candidates(); -1 also for NULL arrays. */
DSP_CLAIM_SQL_MUST_USE int
dsp_claim_sql_candidates_after(char *buf, size_t cap, const char *const *types, size_t ntypes,
                               int64_t now_ms, unsigned limit, const uint8_t *after_prio,
                               const uint64_t *after_id, dsp_claim_sql_quote_fn quote,
                               void *quote_ctx, const struct dsp_table_names *t);

/* The longest text a part's position adds (dsp_claim_sql_candidates_after). */
#define DSP_CLAIM_SQL_AFTER_MAX 96

/* A buffer size always large enough for dsp_claim_sql_select(), candidates() and
 * candidates_after() on these types (with any quote function obeying
 * DSP_CLAIM_SQL_LITERAL_MAX). */
size_t dsp_claim_sql_select_bound(const char *const *types, size_t ntypes);

/* Promote: NEW rows of the delayed lane whose run_after has passed become ready.
 *   UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 0
 *    WHERE `delayed` = 1 AND run_after <= now_ms LIMIT limit
 * Reads delay_idx as a range; repeat while it changes `limit` rows. */
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_promote(char *buf, size_t cap, int64_t now_ms,
                                                 unsigned limit);

/* Demote: NEW rows a producer inserted with a future run_after move to the delayed lane.
 *   UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 1
 *    WHERE `delayed` = 0 AND task_state = 0 AND run_after > now_ms LIMIT limit
 * Reads delay_idx as a range; repeat while it changes `limit` rows. */
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_demote(char *buf, size_t cap, int64_t now_ms,
                                                unsigned limit);

/* The same two sweeps for a shard (--types): `in` (NULL: none) is appended to the WHERE,
 * the text db_sql.h's dsp_db_sql_type_in wrote (" AND task_type IN (X'..', ...)"), so a
 * shard moves only its own types' rows between the lanes. A range of delay_idx still,
 * the type checked on each row it reads. */
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_promote_in(char *buf, size_t cap, int64_t now_ms,
                                                    unsigned limit, const char *in,
                                                    const struct dsp_table_names *t);
DSP_CLAIM_SQL_MUST_USE int dsp_claim_sql_demote_in(char *buf, size_t cap, int64_t now_ms,
                                                   unsigned limit, const char *in,
                                                   const struct dsp_table_names *t);

#endif
