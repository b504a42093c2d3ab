/* db_sql: see db_sql.h. */
#include "db_sql.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- statements ---- */

static const char *const kind_set[DSP_WRITE_KINDS] = {
    [DSP_WRITE_SUCCEEDED] = "task_state = 2",
    [DSP_WRITE_FAILED] = "task_state = 3",
    [DSP_WRITE_RETRY] = "task_state = 0, `delayed` = 1",
    [DSP_WRITE_RELEASE] = "task_state = 0, `delayed` = 0",
    [DSP_WRITE_DELIVERED] = "task_state = 1", /* unchanged: no index entry moves */
};

/* Per-row columns. */
enum col { COL_DATA, COL_ATTEMPTS, COL_RUN_AFTER };

static bool kind_has_data(int kind)
{
    return kind != DSP_WRITE_RELEASE && kind != DSP_WRITE_DELIVERED;
}

static bool same_value(enum col c, const dsp_db_sql_row *a, const dsp_db_sql_row *b)
{
    switch (c) {
    case COL_DATA:
        return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
    case COL_ATTEMPTS:
        return a->attempts == b->attempts;
    case COL_RUN_AFTER:
        return a->run_after_ms == b->run_after_ms;
    }
    return false;
}

static void put_value(dsp_strbuf *b, enum col c, int kind, const dsp_db_sql_row *r)
{
    switch (c) {
    case COL_DATA:
        /* err_msg is utf8mb4 text; result is bytes. */
        dsp_strbuf_put_hex(b, r->data, r->len, kind != DSP_WRITE_SUCCEEDED);
        break;
    case COL_ATTEMPTS:
        /* Never a value the column's CHECK refuses: one refused row fails its batch. */
        dsp_strbuf_put_u64(b, "", r->attempts < DSP_DB_ATTEMPTS_MAX ? r->attempts : DSP_DB_ATTEMPTS_MAX);
        break;
    case COL_RUN_AFTER:
        dsp_strbuf_put_i64(b, "", r->run_after_ms);
        break;
    }
}

/* CASE task_id WHEN id THEN value ... END over rows[0..n). */
static void put_flat_case(dsp_strbuf *b, enum col c, int kind, const dsp_db_sql_row *rows, size_t n)
{
    size_t i;

    dsp_strbuf_puts(b, "CASE task_id");
    for (i = 0; i < n; i++) {
        dsp_strbuf_put_u64(b, " WHEN ", rows[i].task_id);
        dsp_strbuf_puts(b, " THEN ");
        put_value(b, c, kind, &rows[i]);
    }
    dsp_strbuf_puts(b, " END");
}

/* ", name = value" with one literal when every row has the same value, else a CASE.
 *
 * The server tries a CASE's arms one after the other for every row, so a flat CASE over
 * n rows costs n * n / 2 comparisons: measured on MariaDB 10.11, 2,000 distinct results
 * took 54 ms against 20 ms for the same rows with one value. Over rows sorted by
 * task_id the CASE is split in two levels instead, about sqrt(n) groups of sqrt(n) arms
 * each picked by "WHEN task_id <= last id of the group": about sqrt(n) comparisons per
 * row (24 ms for those 2,000 rows), still one statement. */
static void put_column(dsp_strbuf *b, const char *name, enum col c, int kind,
                       const dsp_db_sql_row *rows, size_t n)
{
    size_t i, g, s, e;
    bool same = true, sorted = true;

    for (i = 1; i < n && same; i++)
        same = same_value(c, &rows[0], &rows[i]);
    dsp_strbuf_printf(b, ", %s = ", name);
    if (same) {
        put_value(b, c, kind, &rows[0]);
        return;
    }
    for (i = 1; i < n && sorted; i++)
        sorted = rows[i - 1].task_id < rows[i].task_id;
    if (!sorted || n <= DSP_DB_SQL_FLAT_CASE_MAX) {
        put_flat_case(b, c, kind, rows, n);
        return;
    }
    for (g = 1; g * g < n; g++)
        ;
    dsp_strbuf_puts(b, "CASE");
    for (s = 0; s < n; s = e) {
        e = s + g < n ? s + g : n;
        if (e < n) {
            dsp_strbuf_put_u64(b, " WHEN task_id <= ", rows[e - 1].task_id);
            dsp_strbuf_puts(b, " THEN ");
        } else
            dsp_strbuf_puts(b, " ELSE ");
        put_flat_case(b, c, kind, rows + s, e - s);
    }
    dsp_strbuf_puts(b, " END");
}

static void put_id_list(dsp_strbuf *b, const uint64_t *ids, const dsp_db_sql_row *rows, size_t n)
{
    size_t i;

    dsp_strbuf_puts(b, " WHERE task_id IN (");
    for (i = 0; i < n; i++)
        dsp_strbuf_put_u64(b, i ? ", " : "", ids ? ids[i] : rows[i].task_id);
    dsp_strbuf_puts(b, ")");
}

/* " WHERE task_id IN (...)" over the rows whose skip[i] is 0 (every row when skip is
 * NULL); at least one id must remain. */
static void put_id_list_masked(dsp_strbuf *b, const dsp_db_sql_row *rows, const uint8_t *skip,
                               size_t n)
{
    bool first = true;

    dsp_strbuf_puts(b, " WHERE task_id IN (");
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i])
            continue;
        dsp_strbuf_put_u64(b, first ? "" : ", ", rows[i].task_id);
        first = false;
    }
    dsp_strbuf_puts(b, ")");
}

size_t dsp_db_sql_write_row_cost(int kind, const dsp_db_sql_row *row)
{
    /* ", " + id in the IN list, then per CASE arm " WHEN id THEN " + the value, and
     * the row's share of a two-level CASE's group ("WHEN task_id <= id THEN CASE
     * task_id ... END", some 60 bytes per group of at least 6 rows). */
    const size_t id = 2 + 20, arm = 6 + 20 + 6 + 12;
    size_t cost = id + arm + 10; /* attempts */

    if (kind == DSP_WRITE_RETRY)
        cost += arm + 20; /* run_after */
    if (kind_has_data(kind))
        cost += arm + 2 * row->len + 16; /* _utf8mb4 X'...' or NULL */
    return cost;
}

bool dsp_db_sql_write(dsp_strbuf *b, const dsp_table_names *t, int kind, uint32_t epoch,
                      int64_t now_ms, const dsp_db_sql_row *rows, size_t n)
{
    t = dsp_table_names_or_task(t);
    if (n == 0 || kind < 0 || kind >= DSP_WRITE_KINDS)
        return false;
    dsp_strbuf_printf(b, "UPDATE %s FORCE INDEX (PRIMARY) SET ", t->task);
    dsp_strbuf_puts(b, kind_set[kind]);
    if (kind == DSP_WRITE_RETRY)
        put_column(b, "run_after", COL_RUN_AFTER, kind, rows, n);
    if (kind == DSP_WRITE_SUCCEEDED)
        put_column(b, "result", COL_DATA, kind, rows, n);
    else if (kind_has_data(kind))
        put_column(b, "err_msg", COL_DATA, kind, rows, n);
    put_column(b, "attempts", COL_ATTEMPTS, kind, rows, n);
    dsp_strbuf_printf(b, ", last_update_time = %" PRId64, now_ms);
    put_id_list(b, NULL, rows, n);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32, epoch);
    return true;
}

void dsp_db_sql_write_result_param(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                   int64_t now_ms, const dsp_db_sql_row *row)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "UPDATE %s FORCE INDEX (PRIMARY) SET ", t->task);
    dsp_strbuf_puts(b, kind_set[DSP_WRITE_SUCCEEDED]);
    dsp_strbuf_put_u64(b, ", result = ?, attempts = ", row->attempts);
    dsp_strbuf_printf(b, ", last_update_time = %" PRId64, now_ms);
    put_id_list(b, NULL, row, 1);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32, epoch);
}

void dsp_db_sql_id_csv(dsp_strbuf *b, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dsp_strbuf_put_u64(b, i ? "," : "", ids[i]);
}

static void put_id_csv_list(dsp_strbuf *b, const char *ids_csv, size_t len)
{
    dsp_strbuf_puts(b, " WHERE task_id IN (");
    dsp_strbuf_put(b, ids_csv, len);
    dsp_strbuf_puts(b, ")");
}

void dsp_db_sql_claim_lock(dsp_strbuf *b, const dsp_table_names *t, int64_t now_ms,
                           const char *ids_csv, size_t len)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT task_id, attempts, max_attempts, timeout_ms, payload, group_key"
                      " FROM %s FORCE INDEX (PRIMARY)",
                      t->task);
    put_id_csv_list(b, ids_csv, len);
    dsp_strbuf_printf(b,
                      " AND task_state = 0 AND `delayed` = 0 AND run_after <= %" PRId64
                      " FOR UPDATE SKIP LOCKED",
                      now_ms);
}

void dsp_db_sql_claim_mark(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch, int64_t now_ms,
                           const char *ids_csv, size_t len)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "UPDATE %s FORCE INDEX (PRIMARY) SET task_state = 1, epoch = %" PRIu32
                      ", last_update_time = %" PRId64,
                      t->task, epoch, now_ms);
    put_id_csv_list(b, ids_csv, len);
}

void dsp_db_sql_release_ids(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch, int64_t now_ms,
                            const uint64_t *ids, size_t n)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(
        b, "UPDATE %s FORCE INDEX (PRIMARY) SET task_state = 0, last_update_time = %" PRId64,
        t->task, now_ms);
    put_id_list(b, ids, NULL, n);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32, epoch);
}

void dsp_db_sql_lock_free(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                          const dsp_db_sql_row *rows, const uint8_t *skip, size_t n)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT task_id FROM %s FORCE INDEX (PRIMARY)", t->task);
    put_id_list_masked(b, rows, skip, n);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32 " FOR UPDATE SKIP LOCKED", epoch);
}

void dsp_db_sql_still_ours(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                           const dsp_db_sql_row *rows, const uint8_t *skip, size_t n)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT task_id FROM %s FORCE INDEX (PRIMARY)", t->task);
    put_id_list_masked(b, rows, skip, n);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32, epoch);
}

/* A type literal: '' for the empty one (put_hex writes NULL for no bytes). */
static void put_type_any(dsp_strbuf *b, const char *type, size_t len)
{
    if (len == 0)
        dsp_strbuf_puts(b, "''");
    else
        dsp_strbuf_put_hex(b, (const uint8_t *)type, len, true);
}

void dsp_db_sql_type_in(dsp_strbuf *b, const char *const *types, size_t n)
{
    if (n == 0)
        return;
    dsp_strbuf_puts(b, " AND task_type IN (");
    for (size_t i = 0; i < n; i++) {
        if (i)
            dsp_strbuf_puts(b, ", ");
        put_type_any(b, types[i], strlen(types[i]));
    }
    dsp_strbuf_puts(b, ")");
}

/* The shard's filter, or nothing when unsharded. */
static void put_in(dsp_strbuf *b, const char *in)
{
    if (in)
        dsp_strbuf_puts(b, in);
}

/* The `delayed` of a FAILED row run again: 2 (waiting) when it has dependency rows, so that
 * a task that failed by a dependency waits for it again instead of running at once (the
 * sweep settles it: released, or FAILED again while the dependency is). */
static void put_delayed_again(dsp_strbuf *b, const dsp_table_names *t)
{
    dsp_strbuf_printf(b, "`delayed` = IF(EXISTS (SELECT 1 FROM %s d WHERE d.task_id = %s.task_id), 2, 0)", t->dep,
                      t->task);
}

/* The SET of a recovery: a row back to NEW, or FAILED when its last allowed delivery
 * was made (recovery of an older epoch's listed rows, and of orphans, alike). */
static void put_recover_set(dsp_strbuf *b, const dsp_table_names *t, int64_t now_ms)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "UPDATE %s FORCE INDEX (PRIMARY) SET"
                      " task_state = IF(attempts >= max_attempts, 3, 0),"
                      " `delayed` = 0,"
                      " err_msg = IF(attempts >= max_attempts,"
                      " 'the dispatcher stopped during the last attempt', err_msg),"
                      " last_update_time = %" PRId64,
                      t->task, now_ms);
}

void dsp_db_sql_recover_ids(dsp_strbuf *b, const dsp_table_names *t, uint32_t row_epoch,
                            int64_t now_ms, const uint64_t *ids, size_t n, const char *in)
{
    /* attempts already counts every delivery the old dispatcher made: each is written
     * with its outcome, or as a DSP_WRITE_DELIVERED record while it runs (docs: the
     * attempts column). A row only buffered keeps its count: no attempt is charged for
     * a claim that was never delivered. A row whose last allowed delivery was made and
     * whose outcome died with the dispatcher ends FAILED, as it would have had its
     * worker been lost. */
    put_recover_set(b, t, now_ms);
    put_id_list(b, ids, NULL, n);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32, row_epoch);
    put_in(b, in);
}

/* The orphan condition (db_sql.h): an epoch older than the leader's, or one the counter
 * never handed out. The counter is read in the statement: an epoch taken meanwhile by
 * another shard's leader is at most the counter's value, and so never an orphan's. */
static void put_orphan_epoch(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      " AND task_state = 1 AND (epoch < %" PRIu32
                      " OR epoch > (SELECT value FROM %s WHERE name = 'epoch'))",
                      epoch, t->meta);
}

void dsp_db_sql_orphan_range(dsp_strbuf *b, const dsp_table_names *t, uint64_t after_id,
                             unsigned limit)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT COUNT(*), MAX(task_id) FROM (SELECT task_id FROM %s FORCE INDEX"
                      " (PRIMARY) WHERE task_id > %" PRIu64 " ORDER BY task_id LIMIT %u) s",
                      t->task, after_id, limit);
}

static void put_orphan(dsp_strbuf *b, const dsp_db_sql_orphan *o)
{
    dsp_strbuf_printf(b,
                      " AND task_state = 1 AND (epoch < %" PRIu32 " OR epoch > %" PRIu64
                      ") AND last_update_time < %" PRId64,
                      o->epoch, o->counter, o->older_than_ms);
    put_in(b, o->in);
}

void dsp_db_sql_orphan_select(dsp_strbuf *b, const dsp_table_names *t, const dsp_db_sql_orphan *o,
                              uint64_t after_id, uint64_t hi_id, unsigned limit,
                              const uint64_t *ids, size_t n)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT task_id FROM %s FORCE INDEX (PRIMARY)", t->task);
    if (ids) {
        put_id_list(b, ids, NULL, n);
        put_orphan(b, o);
        dsp_strbuf_puts(b, " FOR UPDATE SKIP LOCKED");
    } else {
        dsp_strbuf_printf(b, " WHERE task_id > %" PRIu64 " AND task_id <= %" PRIu64, after_id, hi_id);
        put_orphan(b, o);
        dsp_strbuf_printf(b, " LIMIT %u", limit);
    }
}

void dsp_db_sql_orphan_recover(dsp_strbuf *b, const dsp_table_names *t, const dsp_db_sql_orphan *o,
                               int64_t now_ms, const uint64_t *ids, size_t n)
{
    put_recover_set(b, t, now_ms);
    put_id_list(b, ids, NULL, n);
    put_orphan(b, o);
}

void dsp_db_sql_claim_log_insert(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                 uint64_t seq, const char *shard, const char *ids_csv, size_t len)
{
    t = dsp_table_names_or_task(t);
    /* The shard name is [A-Za-z0-9_.-] (shard.c) and the list digits and commas: no
     * quoting needed. */
    dsp_strbuf_printf(
        b, "INSERT INTO %s (epoch, seq, shard, task_ids) VALUES (%" PRIu32 ", %" PRIu64 ", '%s', '",
        t->claim, epoch, seq, shard ? shard : "");
    dsp_strbuf_put(b, ids_csv, len);
    dsp_strbuf_puts(b, "')");
}

void dsp_db_sql_claim_log_delete(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                 const uint64_t *seqs, size_t n)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "DELETE FROM %s WHERE epoch = %" PRIu32 " AND seq IN (", t->claim, epoch);
    for (size_t i = 0; i < n; i++)
        dsp_strbuf_put_u64(b, i ? ", " : "", seqs[i]);
    dsp_strbuf_puts(b, ")");
}

void dsp_db_sql_claim_log_next(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                               const char *shard, uint32_t after_epoch, uint64_t after_seq)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT epoch, seq, task_ids FROM %s WHERE epoch < %" PRIu32
                      " AND (epoch > %" PRIu32 " OR (epoch = %" PRIu32 " AND seq > %" PRIu64 "))",
                      t->claim, epoch, after_epoch, after_epoch, after_seq);
    if (shard)
        dsp_strbuf_printf(b, " AND shard = '%s'", shard);
    dsp_strbuf_puts(b, " ORDER BY epoch, seq LIMIT 1 FOR UPDATE");
}

void dsp_db_sql_claim_log_probe(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                                const char *shard)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT seq FROM %s WHERE epoch < %" PRIu32, t->claim, epoch);
    if (shard)
        dsp_strbuf_printf(b, " AND shard = '%s'", shard);
    dsp_strbuf_puts(b, " LIMIT 1");
}

void dsp_db_sql_still_processing(dsp_strbuf *b, const dsp_table_names *t, uint32_t row_epoch,
                                 const uint64_t *ids, size_t n)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT COUNT(*) FROM %s FORCE INDEX (PRIMARY)", t->task);
    put_id_list(b, ids, NULL, n);
    dsp_strbuf_printf(b, " AND task_state = 1 AND epoch = %" PRIu32, row_epoch);
}

int dsp_claim_ids_parse(const char *text, size_t len, uint64_t *ids, size_t cap, size_t *n)
{
    size_t i = 0, count = 0;

    *n = 0;
    if (text == NULL || len == 0)
        return -1;
    while (i < len) {
        uint64_t v = 0;
        size_t start = i;

        while (i < len && text[i] >= '0' && text[i] <= '9') {
            unsigned d = (unsigned)(text[i] - '0');
            if (v > (UINT64_MAX - d) / 10)
                return -1; /* more than 64 bits */
            v = v * 10 + d;
            i++;
        }
        if (i == start || i - start > 20 || v == 0 || count == cap)
            return -1;
        ids[count++] = v;
        if (i < len) {
            if (text[i] != ',' || i + 1 == len)
                return -1;
            i++;
        }
    }
    *n = count;
    return 0;
}

/* ---- the inventory ---- */

static void put_attempt_fence(dsp_strbuf *b, uint32_t attempt)
{
    if (attempt > 0)
        dsp_strbuf_printf(b, " AND attempts IN (%" PRIu32 ", %" PRIu32 ")", attempt - 1, attempt);
    else
        dsp_strbuf_puts(b, " AND attempts = 0");
}

void dsp_db_sql_adopt(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch, int64_t now_ms,
                      uint64_t task_id, uint32_t old_epoch, uint32_t attempt, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "UPDATE %s FORCE INDEX (PRIMARY) SET epoch = %" PRIu32 ", attempts = %" PRIu32
                      ", last_update_time = %" PRId64 " WHERE task_id = %" PRIu64
                      " AND task_state = 1 AND epoch = %" PRIu32,
                      t->task, epoch, attempt < DSP_DB_ATTEMPTS_MAX ? attempt : DSP_DB_ATTEMPTS_MAX,
                      now_ms, task_id, old_epoch);
    put_attempt_fence(b, attempt);
    put_in(b, in);
}

void dsp_db_sql_adopted_row(dsp_strbuf *b, const dsp_table_names *t, uint32_t epoch,
                            uint64_t task_id, uint32_t attempt)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT task_type, max_attempts, task_priority FROM %s FORCE INDEX (PRIMARY)"
                      " WHERE task_id = %" PRIu64 " AND task_state = 1 AND epoch = %" PRIu32
                      " AND attempts = %" PRIu32,
                      t->task, task_id, epoch, attempt);
}

void dsp_db_sql_foreign_fence(dsp_strbuf *b, uint32_t attempt, int last)
{
    put_attempt_fence(b, attempt);
    /* The attempt is the delivery's, whatever the column held before. */
    if (last >= 0)
        dsp_strbuf_printf(b, last ? " AND max_attempts <= %" PRIu32 : " AND max_attempts > %" PRIu32,
                          attempt);
}

/* ---- the stats thread ---- */

void dsp_db_sql_stats_counts(dsp_strbuf *b, const dsp_table_names *t, int64_t now_ms,
                             const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT claim_lane, `delayed`, task_type, COUNT(*),"
                      " SUM(run_after <= %" PRId64 "),"
                      " SUM(task_priority = 0), SUM(task_priority = 1), SUM(task_priority = 2), 0"
                      " FROM %s FORCE INDEX (claim_idx) WHERE claim_lane IN (0, 3)",
                      now_ms, t->task);
    put_in(b, in);
    dsp_strbuf_puts(b, " GROUP BY claim_lane, `delayed`, task_type");
    /* The NEW rows with a key: claim_lane NULL since version 12, group_lane 0. */
    dsp_strbuf_printf(b,
                      " UNION ALL SELECT group_lane, `delayed`, task_type, COUNT(*),"
                      " SUM(run_after <= %" PRId64 "),"
                      " SUM(task_priority = 0), SUM(task_priority = 1), SUM(task_priority = 2), 1"
                      " FROM %s FORCE INDEX (group_idx) WHERE group_lane = 0",
                      now_ms, t->task);
    put_in(b, in);
    dsp_strbuf_puts(b, " GROUP BY group_lane, `delayed`, task_type");
}

void dsp_db_sql_stats_processing(dsp_strbuf *b, const dsp_table_names *t, const uint64_t *ids,
                                 size_t n, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT task_type, COUNT(*) FROM %s FORCE INDEX (PRIMARY)", t->task);
    put_id_list(b, ids, NULL, n);
    dsp_strbuf_puts(b, " AND task_state = 1");
    put_in(b, in);
    dsp_strbuf_puts(b, " GROUP BY task_type");
}

void dsp_db_sql_stats_successful(dsp_strbuf *b, const dsp_table_names *t, unsigned cap,
                                 const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM %s FORCE INDEX (claim_idx)"
                      " WHERE claim_lane = 1",
                      t->task);
    put_in(b, in);
    dsp_strbuf_printf(b,
                      " LIMIT %u) x) + (SELECT COUNT(*) FROM (SELECT 1 FROM %s FORCE INDEX"
                      " (group_idx) WHERE group_lane = 1",
                      cap, t->task);
    put_in(b, in);
    dsp_strbuf_printf(b, " LIMIT %u) y)", cap);
}

void dsp_db_sql_stats_oldest_part(dsp_strbuf *b, const dsp_table_names *t, bool first,
                                  const char *type, size_t type_len, int priority, int64_t now_ms,
                                  bool keyed)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_puts(b, first ? "SELECT t, MIN(g) FROM (" : " UNION ALL ");
    if (keyed) {
        /* group_idx holds a type's keyed rows key by key: the smallest id among the first
         * DSP_DB_SQL_OLDEST_KEYED_SCAN, then that row. */
        dsp_strbuf_printf(b,
                          "(SELECT task_type t, GREATEST(insert_time, run_after) g FROM %s"
                          " FORCE INDEX (PRIMARY) WHERE task_id = (SELECT MIN(task_id) FROM"
                          " (SELECT task_id FROM %s FORCE INDEX (group_idx) WHERE group_lane = 0"
                          " AND `delayed` = 0 AND task_type = ",
                          t->task, t->task);
        if (type_len == 0)
            dsp_strbuf_puts(b, "''");
        else
            dsp_strbuf_put_hex(b, (const uint8_t *)type, type_len, true);
        dsp_strbuf_printf(b,
                          " AND task_priority = %d AND run_after <= %" PRId64 " LIMIT %u) s))",
                          priority, now_ms, DSP_DB_SQL_OLDEST_KEYED_SCAN);
        return;
    }
    dsp_strbuf_printf(
        b,
        "(SELECT task_type t, GREATEST(insert_time, run_after) g FROM %s FORCE INDEX (claim_idx)"
        " WHERE claim_lane = 0 AND `delayed` = 0 AND task_type = ",
        t->task);
    if (type_len == 0)
        dsp_strbuf_puts(b, "''"); /* put_hex writes NULL for no bytes */
    else
        dsp_strbuf_put_hex(b, (const uint8_t *)type, type_len, true);
    dsp_strbuf_printf(b,
                      " AND task_priority = %d AND run_after <= %" PRId64
                      " ORDER BY task_id LIMIT 1)",
                      priority, now_ms);
}

void dsp_db_sql_stats_oldest_end(dsp_strbuf *b)
{
    dsp_strbuf_puts(b, ") u GROUP BY t");
}

void dsp_db_sql_stats_keys_part(dsp_strbuf *b, const dsp_table_names *t, bool first, unsigned slot,
                                const char *type, size_t type_len, unsigned scan_max, unsigned top)
{
    t = dsp_table_names_or_task(t);
    if (!first)
        dsp_strbuf_puts(b, " UNION ALL ");
    /* The window sum counts every row read (before the LIMIT of the keys): whether the
     * scan stopped at scan_max. */
    dsp_strbuf_printf(b,
                      "(SELECT %u s, k, COUNT(*) n, SUM(COUNT(*)) OVER () r FROM (SELECT group_key k"
                      " FROM %s FORCE INDEX (group_idx) WHERE group_lane = 0 AND `delayed` = 0"
                      " AND task_type = ",
                      slot, t->task);
    if (type_len == 0)
        dsp_strbuf_puts(b, "''");
    else
        dsp_strbuf_put_hex(b, (const uint8_t *)type, type_len, true);
    dsp_strbuf_printf(b, " LIMIT %u) d GROUP BY k ORDER BY n DESC, k LIMIT %u)", scan_max, top);
}

void dsp_db_sql_retention(dsp_strbuf *b, const dsp_table_names *t, int state, bool keyed,
                          int64_t before_ms, unsigned limit, const char *in)
{
    t = dsp_table_names_or_task(t);
    if ((state != 2 && state != 3) || (keyed && state != 2))
        return;
    dsp_strbuf_printf(b,
                      "DELETE FROM %s WHERE %s = %d AND task_state = %d"
                      " AND last_update_time < %" PRId64,
                      t->task, keyed ? "group_lane" : "claim_lane", state == 2 ? 1 : 3, state,
                      before_ms);
    put_in(b, in);
    dsp_strbuf_printf(b, " LIMIT %u", limit);
}

void dsp_db_sql_requeue_failed(dsp_strbuf *b, const dsp_table_names *t, const char *type,
                               int64_t now_ms, unsigned limit, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "UPDATE %s FORCE INDEX (claim_idx) SET task_state = 0, attempts = 0, ", t->task);
    put_delayed_again(b, t);
    dsp_strbuf_printf(b, ", run_after = 0, last_update_time = %" PRId64 " WHERE claim_lane = 3", now_ms);
    if (type) {
        dsp_strbuf_puts(b, " AND task_type = ");
        if (type[0] == '\0')
            dsp_strbuf_puts(b, "''");
        else
            dsp_strbuf_put_hex(b, (const uint8_t *)type, strlen(type), true);
    }
    put_in(b, in);
    dsp_strbuf_printf(b, " LIMIT %u", limit);
}

/* ---- task-level operator requests ---- */

void dsp_db_sql_task_show(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(
        b,
        "SELECT task_id, task_type, task_state, task_priority, attempts, max_attempts,"
        " insert_time, last_update_time, run_after, timeout_ms, err_msg,"
        " LENGTH(result), LENGTH(payload), epoch, `delayed`"
        " FROM %s WHERE task_id = %" PRIu64,
        t->task, task_id);
    put_in(b, in);
}

void dsp_db_sql_task_state(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                           const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "SELECT task_state FROM %s WHERE task_id = %" PRIu64, t->task, task_id);
    put_in(b, in);
}

static void put_type(dsp_strbuf *b, const char *type, size_t len)
{
    if (len == 0)
        dsp_strbuf_puts(b, "''"); /* put_hex writes NULL for no bytes */
    else
        dsp_strbuf_put_hex(b, (const uint8_t *)type, len, true);
}

void dsp_db_sql_failed_next_type(dsp_strbuf *b, const dsp_table_names *t, int lane,
                                 const char *after, size_t after_len, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "SELECT MIN(task_type) FROM %s FORCE INDEX (claim_idx)"
                      " WHERE claim_lane = 3 AND `delayed` = %d",
                      t->task, lane);
    if (after) {
        dsp_strbuf_puts(b, " AND task_type > ");
        put_type(b, after, after_len);
    }
    put_in(b, in);
}

void dsp_db_sql_failed_part(dsp_strbuf *b, const dsp_table_names *t, bool first,
                            const char *type, size_t type_len, unsigned limit, unsigned err_max,
                            const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_puts(b, first ? "SELECT * FROM (" : " UNION ALL ");
    dsp_strbuf_printf(b,
                      "(SELECT task_id, task_type, task_priority, attempts, max_attempts,"
                      " failed_at, LEFT(err_msg, %u) FROM %s FORCE INDEX (failed_idx)"
                      " WHERE task_type = ",
                      err_max, t->task);
    put_type(b, type, type_len);
    put_in(b, in);
    dsp_strbuf_printf(b, " AND failed_at IS NOT NULL ORDER BY failed_at DESC, task_id DESC LIMIT %u)",
                      limit);
}

void dsp_db_sql_failed_end(dsp_strbuf *b, unsigned limit)
{
    dsp_strbuf_printf(b, ") u ORDER BY failed_at DESC, task_id DESC LIMIT %u", limit);
}

void dsp_db_sql_retry_failed_since(dsp_strbuf *b, const dsp_table_names *t, const char *type,
                                   size_t type_len, int64_t since_ms, int64_t now_ms,
                                   unsigned limit, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "UPDATE %s FORCE INDEX (failed_idx) SET task_state = 0, attempts = 0, err_msg = NULL, ",
                      t->task);
    put_delayed_again(b, t);
    dsp_strbuf_printf(b, ", run_after = %" PRId64 ", last_update_time = %" PRId64 " WHERE task_type = ", now_ms,
                      now_ms);
    put_type(b, type, type_len);
    put_in(b, in);
    dsp_strbuf_printf(b, " AND failed_at >= %" PRId64 " ORDER BY failed_at DESC, task_id DESC LIMIT %u",
                      since_ms, limit);
}

void dsp_db_sql_task_retry(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                           int64_t now_ms, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b, "UPDATE %s SET task_state = 0, attempts = 0, err_msg = NULL, ", t->task);
    put_delayed_again(b, t);
    dsp_strbuf_printf(b, ", run_after = %" PRId64 ", last_update_time = %" PRId64 " WHERE task_id = %" PRIu64
                      " AND task_state = 3", now_ms, now_ms, task_id);
    put_in(b, in);
}

void dsp_db_sql_task_cancel(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                            int64_t now_ms, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "UPDATE %s SET task_state = 3, err_msg = 'cancelled', `delayed` = 0,"
                      " last_update_time = %" PRId64 " WHERE task_id = %" PRIu64
                      " AND task_state = 0",
                      t->task, now_ms, task_id);
    put_in(b, in);
}

void dsp_db_sql_task_cancel_orphan(dsp_strbuf *b, const dsp_table_names *t, uint64_t task_id,
                                   uint32_t epoch, int64_t now_ms, const char *in)
{
    t = dsp_table_names_or_task(t);
    dsp_strbuf_printf(b,
                      "UPDATE %s SET task_state = 3, err_msg = 'cancelled', `delayed` = 0,"
                      " last_update_time = %" PRId64 " WHERE task_id = %" PRIu64,
                      t->task, now_ms, task_id);
    put_orphan_epoch(b, t, epoch);
    put_in(b, in);
}
