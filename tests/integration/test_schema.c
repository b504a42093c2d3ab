/* test_schema: sql/schema.sql and dispatcher/db/db_claim_sql.c against a real MariaDB.
 *
 * Needs a server from scripts/tp-mariadb (see tests/testlib/testdb.h); without one every
 * case fails. Two databases: `small` is emptied before each case; `big` holds 100,000
 * rows built once, and the claims run on it are rolled back, so it stays as built.
 *
 * Nothing here asserts on time: the claim's cost is checked with the server's
 * Handler_* counters, and "did not wait for a lock" with Innodb_row_lock_waits.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "db_claim_fair.h"
#include "db_claim_sql.h"
#include "db_sql.h"
#include "sb.h"
#include "testdb.h"

/* MariaDB's ER_CONSTRAINT_FAILED and MySQL's ER_CHECK_CONSTRAINT_VIOLATED. */
#define ERR_CHECK_MARIADB 4025u
#define ERR_CHECK_MYSQL 3819u
#define ERR_DUP_ENTRY 1062u

/* The big table. */
#define BIG_ROWS 100000
#define BIG_READY 2000   /* ready NEW rows of the registered type 'resize' */
#define BIG_FUTURE 45000 /* 'resize' inserted with a future run_after, then demoted */
#define BIG_THUMB 1000   /* 'thumb' (registered) inserted with a future run_after, demoted */
#define BIG_OTHER 44000  /* ready NEW rows of unregistered types */
#define BIG_DONE 7000    /* 'resize' rows already SUCCESSFUL */
#define BIG_LATE 1000    /* 'resize' with a future run_after, inserted after the demote */
#define CLAIM_N 500
#define LOCKED_N 100

#define HOUR_MS 3600000LL

struct state {
    tp_testdb small;
    tp_testdb big;
    int64_t big_now_ms; /* a "now" for claims on big: after every ready row's run_after */
};

/* ---- helpers ---- */

/* Runs a statement that is expected to fail; returns its error number (0: it worked). */
static unsigned exec_expect_error(MYSQL *conn, const char *sql)
{
    MYSQL_RES *res;

    if (mysql_query(conn, sql) != 0)
        return mysql_errno(conn);
    res = mysql_store_result(conn);
    if (res)
        mysql_free_result(res);
    return 0;
}

static uint64_t count_rows(tp_testdb *db)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task");
}

/* A result as a malloc'ed array of the first column as u64; returns the row count or -1. */
static long query_ids(MYSQL *conn, const char *sql, uint64_t **ids_out)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    uint64_t *ids;
    long n = 0;

    *ids_out = NULL;
    if (mysql_query(conn, sql) != 0) {
        fprintf(stderr, "query failed: %s\n  %.200s\n", mysql_error(conn), sql);
        return -1;
    }
    res = mysql_store_result(conn);
    if (res == NULL) {
        fprintf(stderr, "no result: %s\n", mysql_error(conn));
        return -1;
    }
    ids = calloc(mysql_num_rows(res) + 1, sizeof *ids);
    if (ids == NULL) {
        mysql_free_result(res);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL)
        ids[n++] = row[0] ? strtoull(row[0], NULL, 10) : 0;
    mysql_free_result(res);
    *ids_out = ids;
    return n;
}

/* One claimed row, as the dispatcher would read it. */
struct claimed {
    uint64_t id;
    char type[DSP_CLAIM_SQL_TYPE_MAX_BYTES + 1];
    int priority;
};

/* Runs a claim and returns its rows (malloc'ed, caller frees) or -1. */
static long run_claim(MYSQL *conn, const char *sql, struct claimed **out)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    struct claimed *rows;
    long n = 0;

    *out = NULL;
    if (mysql_query(conn, sql) != 0) {
        fprintf(stderr, "claim failed: %s (errno %u)\n", mysql_error(conn), mysql_errno(conn));
        return -1;
    }
    res = mysql_store_result(conn);
    if (res == NULL) {
        fprintf(stderr, "claim: no result: %s\n", mysql_error(conn));
        return -1;
    }
    if (mysql_num_fields(res) != DSP_CLAIM_COL_COUNT) {
        fprintf(stderr, "claim: %u columns, expected %d\n", mysql_num_fields(res),
                DSP_CLAIM_COL_COUNT);
        mysql_free_result(res);
        return -1;
    }
    rows = calloc(mysql_num_rows(res) + 1, sizeof *rows);
    if (rows == NULL) {
        mysql_free_result(res);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        size_t tl = len[DSP_CLAIM_COL_TASK_TYPE];

        rows[n].id = strtoull(row[DSP_CLAIM_COL_TASK_ID], NULL, 10);
        if (tl > DSP_CLAIM_SQL_TYPE_MAX_BYTES)
            tl = DSP_CLAIM_SQL_TYPE_MAX_BYTES;
        memcpy(rows[n].type, row[DSP_CLAIM_COL_TASK_TYPE], tl);
        rows[n].type[tl] = '\0';
        rows[n].priority = atoi(row[DSP_CLAIM_COL_PRIORITY]);
        n++;
    }
    mysql_free_result(res);
    *out = rows;
    return n;
}

/* Builds the claim text for types (NULL-terminated list) into a malloc'ed string. */
static char *claim_text(const char *const *types, int64_t now_ms, unsigned limit,
                        dsp_claim_sql_quote_fn quote, void *ctx)
{
    size_t ntypes = 0, cap;
    char *buf;

    while (types[ntypes])
        ntypes++;
    cap = dsp_claim_sql_select_bound(types, ntypes);
    buf = malloc(cap);
    assert_non_null(buf);
    assert_true(dsp_claim_sql_select(buf, cap, types, ntypes, now_ms, limit, quote, ctx) > 0);
    return buf;
}

static int64_t promote(tp_testdb *db, int64_t now_ms, unsigned limit)
{
    char sql[256];

    assert_true(dsp_claim_sql_promote(sql, sizeof sql, now_ms, limit) > 0);
    return tp_testdb_exec(db, "%s", sql);
}

static int64_t demote(tp_testdb *db, int64_t now_ms, unsigned limit)
{
    char sql[256];

    assert_true(dsp_claim_sql_demote(sql, sizeof sql, now_ms, limit) > 0);
    return tp_testdb_exec(db, "%s", sql);
}

/* A quote function over mysql_real_escape_string, as the dispatcher may use it. */
static int quote_mysql(void *ctx, char *to, size_t cap, const char *from, size_t len)
{
    unsigned long n;

    if (cap < 2 * len + 3)
        return -1;
    to[0] = '\'';
    n = mysql_real_escape_string((MYSQL *)ctx, to + 1, from, (unsigned long)len);
    to[n + 1] = '\'';
    return (int)n + 2;
}

/* Inserts `count` rows as a producer would, in multi-row INSERTs of 1,000:
 * types[i % ntypes], priority (i * 7 + salt) % 3, the given run_after and state. */
static void bulk_insert(tp_testdb *db, int count, const char *const *types, int ntypes,
                        int64_t run_after, int state, int salt)
{
    struct tp_sb b = {NULL, 0, 0};
    int i = 0;

    while (i < count) {
        int j;

        b.len = 0;
        tp_sb_printf(&b, "INSERT INTO task (task_type, task_priority, task_state, run_after, "
                      "payload) VALUES ");
        for (j = 0; j < 1000 && i < count; j++, i++)
            tp_sb_printf(&b, "%s('%s', %d, %d, %lld, 'p%d')", j ? "," : "", types[i % ntypes],
                      (i * 7 + salt) % 3, state, (long long)run_after, i);
        assert_int_equal(tp_testdb_exec(db, "%s", b.s), j);
    }
    tp_sb_free(&b);
}

/* The ids a claim of `type` must return, by a plan that does not use claim_idx. */
static long expected_order(tp_testdb *db, const char *type, int64_t now_ms, unsigned limit,
                           uint64_t **ids)
{
    char sql[512];

    snprintf(sql, sizeof sql,
             "SELECT task_id FROM task IGNORE INDEX (claim_idx) WHERE task_state = 0 AND "
             "`delayed` = 0 AND task_type = '%s' AND run_after <= %lld "
             "ORDER BY task_priority DESC, task_id LIMIT %u",
             type, (long long)now_ms, limit);
    return query_ids(db->conn, sql, ids);
}

/* Sum of the counters that count index entries read. Handler_icp_attempts is added where
 * the server has it (MariaDB): rows rejected by index condition pushdown cost too. */
static uint64_t index_reads(MYSQL *conn)
{
    static const char *const names[] = {
        "Handler_read_key",  "Handler_read_next",     "Handler_read_prev",   "Handler_read_first",
        "Handler_read_last", "Handler_read_rnd_next", "Handler_icp_attempts"};
    uint64_t sum = 0, v;
    size_t i;

    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (tp_testdb_status(conn, TP_TESTDB_SESSION, names[i], &v) == 0)
            sum += v;
        else
            assert_string_equal(names[i], "Handler_icp_attempts"); /* only that may lack */
    }
    return sum;
}

/* ---- fixtures ---- */

static void build_big(struct state *st)
{
    static const char *const resize[] = {"resize"};
    static const char *const thumb[] = {"thumb"};
    static const char *const other[] = {"video", "audio", "Resize"};
    tp_testdb *db = &st->big;
    int64_t now = tp_testdb_now_ms();

    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    /* Interleave the kinds so that the ready rows are spread over the id range. */
    bulk_insert(db, BIG_FUTURE / 2, resize, 1, now + HOUR_MS, 0, 0);
    bulk_insert(db, BIG_OTHER / 2, other, 3, 0, 0, 1);
    bulk_insert(db, BIG_READY / 2, resize, 1, 0, 0, 2);
    bulk_insert(db, BIG_DONE, resize, 1, 0, 2, 0);
    bulk_insert(db, BIG_THUMB, thumb, 1, now + HOUR_MS, 0, 1);
    bulk_insert(db, BIG_READY / 2, resize, 1, now - 1000, 0, 1);
    bulk_insert(db, BIG_OTHER / 2, other, 3, 0, 0, 2);
    bulk_insert(db, BIG_FUTURE / 2, resize, 1, now + 2 * HOUR_MS, 0, 2);
    assert_int_equal(tp_testdb_exec(db, "COMMIT"), 0);

    /* The dispatcher's demote sweep moves every future NEW row to the delayed lane. */
    assert_int_equal(demote(db, now, 1000000), BIG_FUTURE + BIG_THUMB);
    /* Future rows a producer inserted after that sweep stay in the ready lane for now. */
    bulk_insert(db, BIG_LATE, resize, 1, now + HOUR_MS, 0, 0);

    assert_int_equal(count_rows(db), BIG_ROWS);
    assert_int_equal(tp_testdb_exec(db, "ANALYZE TABLE task"), 0);
    st->big_now_ms = now;
}

static int group_setup(void **ctx)
{
    struct state *st = calloc(1, sizeof *st);

    if (st == NULL)
        return -1;
    *ctx = st;
    if (tp_testdb_create("schema", &st->small) < 0 || tp_testdb_create("claim", &st->big) < 0)
        return -1;
    build_big(st);
    return 0;
}

static int group_teardown(void **ctx)
{
    struct state *st = *ctx;

    if (st) {
        tp_testdb_drop(&st->small);
        tp_testdb_drop(&st->big);
        free(st);
    }
    mysql_library_end();
    return 0;
}

/* Every case on `small` starts from an empty task table (the meta rows stay). */
static int small_setup(void **ctx)
{
    struct state *st = *ctx;

    return tp_testdb_exec(&st->small, "TRUNCATE TABLE task") < 0 ? -1 : 0;
}

/* ---- the producer's view ---- */

static void test_producer_insert_defaults(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    int64_t before = tp_testdb_now_ms();

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, task_priority, payload) "
                                        "VALUES ('resize', 2, '{\"id\":7}')"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_state FROM task"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_priority FROM task"), 2);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_type = 'resize' FROM task"), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT attempts FROM task"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT max_attempts FROM task"), 3);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT run_after FROM task"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT `delayed` FROM task"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT epoch FROM task"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT timeout_ms IS NULL FROM task"), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT dedup_key IS NULL AND err_msg IS NULL "
                                             "AND result IS NULL FROM task"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT payload = '{\"id\":7}' FROM task"), 1);
    /* insert_time and last_update_time are the current time in ms (same clock). */
    uint64_t ins = tp_testdb_query_u64(db, "SELECT insert_time FROM task");
    uint64_t upd = tp_testdb_query_u64(db, "SELECT last_update_time FROM task");
    int64_t after = tp_testdb_now_ms();
    assert_in_range(ins, (uint64_t)(before - 5000), (uint64_t)(after + 5000));
    assert_in_range(upd, (uint64_t)(before - 5000), (uint64_t)(after + 5000));
    /* Milliseconds, not seconds: not a multiple of 1000 on every insert. */
    assert_true(ins > 1000000000000ULL);
}

static void test_payload_only_insert(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (payload) VALUES ('x')"), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_type = BINARY 'default' FROM task"), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_priority FROM task"), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_state FROM task"), 0);
    /* An INSERT with no column at all also works. */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task () VALUES ()"), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE payload IS NULL "
                                             "AND task_type = 'default'"),
                     1);
}

static void test_payload_binary_safe(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    unsigned char payload[512];
    char hex[2 * sizeof payload + 1];
    MYSQL_RES *res;
    MYSQL_ROW row;
    unsigned long *len;
    size_t i;

    for (i = 0; i < sizeof payload; i++)
        payload[i] = (unsigned char)(i * 37 + 11);
    payload[0] = 0x00;
    payload[1] = 0xFF;
    payload[2] = '\'';
    payload[3] = '\\';
    payload[sizeof payload - 1] = 0x00;
    for (i = 0; i < sizeof payload; i++)
        snprintf(hex + 2 * i, 3, "%02X", payload[i]);
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_type, payload) VALUES "
                                    "('bin', X'%s')",
                                    hex),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT LENGTH(payload) FROM task"), sizeof payload);

    /* Read back through the claim, as the dispatcher does. */
    const char *types[] = {"bin", NULL};
    char *sql = claim_text(types, tp_testdb_now_ms(), 10, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    len = mysql_fetch_lengths(res);
    assert_int_equal(len[DSP_CLAIM_COL_PAYLOAD], sizeof payload);
    assert_memory_equal(row[DSP_CLAIM_COL_PAYLOAD], payload, sizeof payload);
    mysql_free_result(res);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(sql);
}

/* ---- CHECK constraints ---- */

static void assert_check_error(unsigned err)
{
    if (err != ERR_CHECK_MARIADB && err != ERR_CHECK_MYSQL)
        fail_msg("expected a CHECK constraint error, got error %u", err);
}

static void test_check_rejects_bad_priority_and_state(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (payload) VALUES ('ok')"), 1);
    assert_check_error(exec_expect_error(db->conn, "INSERT INTO task (task_priority) VALUES (7)"));
    assert_check_error(exec_expect_error(db->conn, "INSERT INTO task (task_priority) VALUES (-1)"));
    assert_check_error(exec_expect_error(db->conn, "INSERT INTO task (task_state) VALUES (9)"));
    assert_check_error(exec_expect_error(db->conn, "INSERT INTO task (task_state) VALUES (-1)"));
    /* An UPDATE is held to the same ranges. */
    assert_check_error(exec_expect_error(db->conn, "UPDATE task SET task_state = 4"));
    assert_check_error(exec_expect_error(db->conn, "UPDATE task SET task_priority = 3"));
    assert_int_equal(count_rows(db), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_state * 10 + task_priority FROM task"),
                     1);
    /* The edges of the ranges are accepted. */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_priority, task_state) VALUES "
                                        "(0, 0), (2, 3)"),
                     2);
}

/* MariaDB 10.11: a single-row INSERT IGNORE that violates a CHECK still fails with error
 * 4025 (IGNORE does not turn it into a warning), a multi-row INSERT IGNORE skips the bad
 * rows with a warning and stores the others, UPDATE IGNORE leaves the row unchanged with
 * a warning. MySQL 8.0.16+ gives warnings in all three. Either way: never stored. */
static void test_check_holds_under_insert_ignore(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    static const char *const bad[] = {
        "INSERT IGNORE INTO task (task_priority) VALUES (7)",
        "INSERT IGNORE INTO task (task_state) VALUES (9)",
        "INSERT IGNORE INTO task (task_priority, payload) VALUES (3, 'x')",
    };
    size_t i;

    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned err = exec_expect_error(db->conn, bad[i]);

        if (err != 0)
            assert_check_error(err);
        else
            assert_true(mysql_warning_count(db->conn) >= 1);
        printf("# %s -> %s %u\n", bad[i], err ? "error" : "warning", err);
        assert_int_equal(count_rows(db), 0);
    }

    /* Multi-row: the good rows go in, the bad ones do not. */
    unsigned err = exec_expect_error(db->conn, "INSERT IGNORE INTO task (task_state, payload) "
                                               "VALUES (0, 'a'), (9, 'b'), (1, 'c')");
    if (err != 0)
        assert_check_error(err);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE payload = 'b'"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_state > 3"), 0);
    printf("# multi-row INSERT IGNORE with one bad row -> %" PRIu64 " rows stored\n",
           count_rows(db));

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_priority) VALUES (1)"), 1);
    err = exec_expect_error(db->conn, "UPDATE IGNORE task SET task_priority = 5");
    if (err != 0)
        assert_check_error(err);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_priority > 2"),
                     0);
}

/* ---- dedup_key and task_type ---- */

static void test_dedup_key(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (dedup_key) VALUES ('Page')"), 1);
    assert_int_equal(exec_expect_error(db->conn, "INSERT INTO task (dedup_key) VALUES ('Page')"),
                     ERR_DUP_ENTRY);
    /* INSERT IGNORE of a duplicate inserts nothing, without an error. */
    assert_int_equal(tp_testdb_exec(db, "INSERT IGNORE INTO task (dedup_key, payload) VALUES "
                                        "('Page', 'second')"),
                     0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE payload = "
                                             "'second'"),
                     0);
    /* The key is binary: case and trailing spaces make another key. */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (dedup_key) VALUES ('page')"), 1);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (dedup_key) VALUES ('Page ')"), 1);
    /* Any number of rows without a key. */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (payload) VALUES ('a'), ('b')"), 2);
    assert_int_equal(count_rows(db), 5);
    /* Once the row is gone, the key can be used again. */
    assert_int_equal(tp_testdb_exec(db, "DELETE FROM task WHERE dedup_key = 'Page'"), 1);
    assert_int_equal(tp_testdb_exec(db, "INSERT IGNORE INTO task (dedup_key) VALUES ('Page')"), 1);
}

static void test_task_type_is_binary(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type) VALUES ('Resize'), "
                                        "('resize'), ('RESIZE'), ('r\xC3\xA9size'), "
                                        "('resiz\xC3\xA9')"),
                     5);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type = "
                                             "'resize'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type = "
                                             "'Resize'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type = "
                                             "'r\xC3\xA9size'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(DISTINCT task_type) FROM task"), 5);
    /* The claim routes the same way. */
    const char *types[] = {"resize", NULL};
    struct claimed *rows;
    char *sql = claim_text(types, tp_testdb_now_ms(), 100, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(run_claim(db->conn, sql, &rows), 1);
    assert_string_equal(rows[0].type, "resize");
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);
    free(sql);
}

/* utf8mb4_bin (the collation docs/schema.md names, the only binary one MariaDB and MySQL share)
 * is a PAD SPACE collation: 'resize ' equals 'resize' in SQL, so a claim for 'resize'
 * would return a row naming another type. The schema refuses such types (LIKE does not
 * pad), also under INSERT IGNORE, while a space inside a type is fine. */
static void test_task_type_trailing_space(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;

    assert_int_equal(tp_testdb_query_u64(db, "SELECT 'resize ' = 'resize' COLLATE utf8mb4_bin"), 1);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type) VALUES ('resize ')"), -1);
    tp_testdb_exec(db, "INSERT IGNORE INTO task (task_type) VALUES ('resize '), ('re size')");
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type LIKE '%% '"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type = 're size'"), 1);
}

/* ---- the schema file itself ---- */

static void test_schema_rerun_keeps_rows(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    uint64_t epoch;

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, payload, dedup_key) "
                                        "VALUES ('a', 'x', 'k1'), ('b', 'y', 'k2'), "
                                        "('c', 'z', NULL)"),
                     3);
    assert_int_equal(tp_testdb_exec(db, "UPDATE task SET task_state = 2, attempts = 1, "
                                        "result = 'done' WHERE task_type = 'a'"),
                     1);
    assert_int_equal(tp_testdb_exec(db, DSP_CLAIM_SQL_EPOCH_NEXT), 1);
    epoch = tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = 'epoch'");
    assert_true(epoch >= 1 && epoch != TP_TESTDB_U64_ERR);
    uint64_t sum = tp_testdb_query_u64(db, "SELECT CRC32(GROUP_CONCAT(CONCAT_WS(',', task_id, "
                                           "task_type, task_state, payload, dedup_key, "
                                           "result, insert_time) ORDER BY task_id)) FROM task");

    assert_int_equal(tp_testdb_load_file(db->conn, tp_testdb_schema_path()), 0);
    assert_int_equal(tp_testdb_load_file(db->conn, tp_testdb_schema_path()), 0);

    assert_int_equal(count_rows(db), 3);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT CRC32(GROUP_CONCAT(CONCAT_WS(',', "
                                             "task_id, task_type, task_state, payload, "
                                             "dedup_key, result, insert_time) ORDER BY "
                                             "task_id)) FROM task"),
                     sum);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = "
                                             "'epoch'"),
                     epoch);
    assert_int_equal(tp_testdb_query_u64(db, DSP_CLAIM_SQL_SCHEMA_VERSION),
                     DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM taskpush_meta"), 3); /* version, epoch, lease */
    /* The unique key is still there. */
    assert_int_equal(exec_expect_error(db->conn, "INSERT INTO task (dedup_key) VALUES ('k1')"),
                     ERR_DUP_ENTRY);
}

static void test_schema_version_and_indexes(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;

    assert_int_equal(tp_testdb_query_u64(db, DSP_CLAIM_SQL_SCHEMA_VERSION),
                     DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    /* Exactly the indexes the schema promises: PRIMARY, claim_idx, delay_idx, dedup_key,
     * failed_idx (version 7), group_idx (version 8). */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(DISTINCT index_name) FROM "
                                             "information_schema.statistics WHERE "
                                             "table_schema = DATABASE() AND table_name = "
                                             "'task'"),
                     6);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(column_name ORDER BY "
                                             "seq_in_index) = 'group_lane,delayed,task_type,"
                                             "task_priority,group_key,task_id,run_after' FROM "
                                             "information_schema.statistics WHERE "
                                             "table_schema = DATABASE() AND table_name = "
                                             "'task' AND index_name = 'group_idx'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(column_name ORDER BY "
                                             "seq_in_index) = 'task_type,failed_at' FROM "
                                             "information_schema.statistics WHERE "
                                             "table_schema = DATABASE() AND table_name = "
                                             "'task' AND index_name = 'failed_idx'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(column_name ORDER BY "
                                             "seq_in_index) = 'claim_lane,delayed,task_type,"
                                             "task_priority,task_id,run_after' FROM "
                                             "information_schema.statistics WHERE "
                                             "table_schema = DATABASE() AND table_name = "
                                             "'task' AND index_name = 'claim_idx'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema."
                                             "statistics WHERE table_schema = DATABASE() AND "
                                             "table_name = 'task' AND index_name = "
                                             "'dedup_key' AND non_unique = 0"),
                     1);
    /* Version 5: claim_lane is computed by the server (SUCCESSFUL in PROCESSING's lane),
     * and task_claim is keyed by (epoch, seq). */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.columns"
                                             " WHERE table_schema = DATABASE() AND table_name ="
                                             " 'task' AND column_name = 'claim_lane' AND extra"
                                             " LIKE '%%VIRTUAL%%'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(column_name ORDER BY "
                                             "seq_in_index) = 'epoch,seq' FROM "
                                             "information_schema.statistics WHERE "
                                             "table_schema = DATABASE() AND table_name = "
                                             "'task_claim' AND index_name = 'PRIMARY'"),
                     1);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, task_state) VALUES"
                                        " ('lane_check', 0), ('lane_check', 1), ('lane_check', 2),"
                                        " ('lane_check', 3)"),
                     4);
    /* NEW 0, PROCESSING 1, SUCCESSFUL 1, FAILED 3: digit k of the sum is state k's lane. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT SUM(claim_lane * POW(10, task_state)) FROM"
                                             " task WHERE task_type = 'lane_check'"),
                     3110);
    /* Version 8: group_lane is claim_lane for a keyed row, NULL for a keyless one in every
     * state, so that claiming or finishing a keyless row moves nothing in group_idx. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type ="
                                             " 'lane_check' AND group_lane IS NULL"),
                     4);
    assert_int_equal(tp_testdb_exec(db, "UPDATE task SET group_key = 'k' WHERE task_type = 'lane_check'"), 4);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT SUM(group_lane * POW(10, task_state)) FROM"
                                             " task WHERE task_type = 'lane_check'"),
                     3110);
    /* Version 12: claim_lane is NULL for a keyed row unless FAILED, so that its claim and
     * its success move nothing in claim_idx (group_idx has its state). */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT SUM(claim_lane * POW(10, task_state)) FROM"
                                             " task WHERE task_type = 'lane_check'"),
                     3000);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type ="
                                             " 'lane_check' AND claim_lane IS NULL"),
                     3);
    assert_int_equal(tp_testdb_exec(db, "DELETE FROM task WHERE task_type = 'lane_check'"), 4);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables "
                                             "WHERE table_schema = DATABASE() AND table_name "
                                             "= 'task' AND engine = 'InnoDB' AND "
                                             "table_collation LIKE 'utf8mb4%%'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.columns "
                                             "WHERE table_schema = DATABASE() AND table_name "
                                             "= 'task' AND column_name = 'task_type' AND "
                                             "collation_name = 'utf8mb4_bin'"),
                     1);
}

static void test_epoch_strictly_increases(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    MYSQL *other = tp_testdb_connect(db);
    uint64_t last = tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = "
                                            "'epoch'");
    int i;

    assert_non_null(other);
    assert_int_not_equal(last, TP_TESTDB_U64_ERR);
    for (i = 0; i < 10; i++) {
        MYSQL *c = (i % 2) ? other : db->conn;
        uint64_t id, sel;

        assert_int_equal(tp_testdb_exec_conn(c, DSP_CLAIM_SQL_EPOCH_NEXT), 1);
        id = mysql_insert_id(c);
        sel = tp_testdb_query_u64_conn(c, "SELECT LAST_INSERT_ID()");
        assert_int_equal(id, sel);
        assert_int_equal(id, last + 1);
        last = id;
    }
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = "
                                             "'epoch'"),
                     last);
    mysql_close(other);
}

/* ---- claim_sql text ---- */

static void test_claim_sql_text(void **ctx)
{
    static const char expect[] =
        "(SELECT task_id, task_type, task_priority, attempts, max_attempts, timeout_ms, "
        "payload FROM task FORCE INDEX (claim_idx) WHERE claim_lane = 0 AND `delayed` = 0 "
        "AND task_type = _utf8mb4 X'61' AND run_after <= 1700000000123 ORDER BY task_priority "
        "DESC, task_id "
        "LIMIT 500 FOR UPDATE SKIP LOCKED) UNION ALL (SELECT task_id, task_type, "
        "task_priority, attempts, max_attempts, timeout_ms, payload FROM task FORCE INDEX "
        "(claim_idx) WHERE claim_lane = 0 AND `delayed` = 0 AND task_type = _utf8mb4 X'27FF' AND "
        "run_after <= "
        "1700000000123 ORDER BY task_priority DESC, task_id LIMIT 500 FOR UPDATE SKIP LOCKED)";
    const char *types[] = {"a", "'\xFF"};
    char buf[1024], small[64];
    char longtype[DSP_CLAIM_SQL_TYPE_MAX_BYTES + 2];
    const char *toolong[] = {longtype};
    const char *withnull[] = {"a", NULL};
    size_t cap;
    int n;

    (void)ctx;
    n = dsp_claim_sql_select(buf, sizeof buf, types, 2, 1700000000123LL, 500, NULL, NULL);
    assert_int_equal(n, (int)strlen(expect));
    assert_string_equal(buf, expect);
    assert_true(dsp_claim_sql_select_bound(types, 2) >= (size_t)n + 1);

    /* Every buffer shorter than the text plus its NUL fails cleanly; n + 1 suffices. */
    for (cap = 0; cap <= (size_t)n; cap++) {
        memset(buf, 'z', sizeof buf);
        assert_int_equal(dsp_claim_sql_select(buf, cap, types, 2, 1700000000123LL, 500, NULL, NULL),
                         -1);
        if (cap > 0)
            assert_int_equal(buf[0], '\0');
        assert_int_equal(buf[cap], 'z'); /* nothing written past cap */
    }
    assert_int_equal(
        dsp_claim_sql_select(buf, (size_t)n + 1, types, 2, 1700000000123LL, 500, NULL, NULL), n);

    /* Invalid arguments. */
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, types, 0, 1, 500, NULL, NULL), -1);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, types, 1, 1, 0, NULL, NULL), -1);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, types, 1, -1, 5, NULL, NULL), -1);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, withnull, 2, 1, 5, NULL, NULL), -1);
    memset(longtype, 'x', sizeof longtype - 1);
    longtype[sizeof longtype - 1] = '\0';
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, toolong, 1, 1, 5, NULL, NULL), -1);
    longtype[DSP_CLAIM_SQL_TYPE_MAX_BYTES] = '\0';
    assert_true(dsp_claim_sql_select(buf, sizeof buf, toolong, 1, 1, 5, NULL, NULL) > 0);

    /* The sweeps. */
    n = dsp_claim_sql_promote(buf, sizeof buf, 1700000000123LL, 1000);
    assert_string_equal(buf, "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 0 WHERE "
                             "`delayed` = 1 AND run_after <= 1700000000123 LIMIT 1000");
    assert_int_equal(n, (int)strlen(buf));
    n = dsp_claim_sql_demote(buf, sizeof buf, 1700000000123LL, 1000);
    assert_string_equal(buf, "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 1 WHERE "
                             "`delayed` = 0 AND task_state = 0 AND run_after > 1700000000123 "
                             "LIMIT 1000");
    assert_int_equal(n, (int)strlen(buf));
    assert_int_equal(dsp_claim_sql_demote(small, 20, 1700000000123LL, 1000), -1);
    assert_int_equal(small[0], '\0');
    assert_int_equal(dsp_claim_sql_promote(small, 0, 1, 1), -1);
    assert_int_equal(dsp_claim_sql_promote(small, sizeof small, 1, 0), -1);
}

/* Types that need quoting reach the right rows with either quote function, and a type
 * cannot inject SQL. */
static void test_claim_quotes_types(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    static const char *const weird[] = {"it's", "back\\slash", "x' OR '1'='1", NULL};
    struct claimed *rows;
    char *sql;
    int q;

    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type) VALUES ('it''s'), "
                                        "('back\\\\slash'), ('plain')"),
                     3);
    for (q = 0; q < 2; q++) {
        dsp_claim_sql_quote_fn fn = q ? quote_mysql : NULL;
        int i;

        for (i = 0; weird[i]; i++) {
            const char *one[] = {weird[i], NULL};
            long n;

            sql = claim_text(one, tp_testdb_now_ms(), 10, fn, db->conn);
            assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
            n = run_claim(db->conn, sql, &rows);
            assert_int_equal(n, i < 2 ? 1 : 0);
            if (n == 1)
                assert_string_equal(rows[0].type, weird[i]);
            assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
            free(rows);
            free(sql);
        }
    }
}

static void test_claim_union_of_types(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    const char *types[] = {"a", "b", "empty", NULL};
    struct claimed *rows;
    char *sql;
    long n;

    /* ids 1..9 */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, task_priority) VALUES "
                                        "('a', 0), ('b', 1), ('a', 2), ('c', 2), ('a', 1), "
                                        "('b', 2), ('a', 2), ('A', 2), ('b', 0)"),
                     9);
    sql = claim_text(types, tp_testdb_now_ms(), 3, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    n = run_claim(db->conn, sql, &rows);
    assert_int_equal(n, 6);
    /* Each type's rows in dispatch order, at most `limit` per type. */
    static const uint64_t want[] = {3, 7, 5, 6, 2, 9};
    static const char *const want_type[] = {"a", "a", "a", "b", "b", "b"};
    static const int want_prio[] = {2, 2, 1, 2, 1, 0};
    for (long i = 0; i < n; i++) {
        assert_int_equal(rows[i].id, want[i]);
        assert_string_equal(rows[i].type, want_type[i]);
        assert_int_equal(rows[i].priority, want_prio[i]);
    }
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);
    free(sql);
}

/* ---- the lanes ---- */

static void test_promote_sweep(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    int64_t now = tp_testdb_now_ms();
    const char *types[] = {"job", NULL};
    struct claimed *rows;
    char *sql;

    /* A retry whose backoff has passed, and one still waiting. */
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_type, run_after, `delayed`, "
                                    "attempts) VALUES ('job', %lld, 1, 1), "
                                    "('job', %lld, 1, 1)",
                                    (long long)(now - 1000), (long long)(now + HOUR_MS)),
                     2);
    sql = claim_text(types, now, 10, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(run_claim(db->conn, sql, &rows), 0); /* both in the delayed lane */
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);

    assert_int_equal(promote(db, now, 100), 1);
    assert_int_equal(promote(db, now, 100), 0); /* nothing left to do */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT `delayed` FROM task WHERE task_id = 1"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT `delayed` FROM task WHERE task_id = 2"), 1);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(run_claim(db->conn, sql, &rows), 1);
    assert_int_equal(rows[0].id, 1);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);
    free(sql);

    /* An hour later the second one is promoted and claimable too. */
    assert_int_equal(promote(db, now + HOUR_MS, 100), 1);
    sql = claim_text(types, now + HOUR_MS, 10, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(run_claim(db->conn, sql, &rows), 2);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);
    free(sql);
}

static void test_demote_sweep(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    int64_t now = tp_testdb_now_ms();
    const char *types[] = {"job", NULL};
    struct claimed *rows;
    char *sql;
    int i;

    /* id 1 ready; ids 2..6 a producer's future rows; id 7 finished with a future
     * run_after (must stay where it is). */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type) VALUES ('job')"), 1);
    for (i = 0; i < 5; i++)
        assert_int_equal(tp_testdb_exec(db,
                                        "INSERT INTO task (task_type, run_after) VALUES "
                                        "('job', %lld)",
                                        (long long)(now + HOUR_MS + i)),
                         1);
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_type, run_after, task_state) "
                                    "VALUES ('job', %lld, 2)",
                                    (long long)(now + HOUR_MS)),
                     1);

    /* Before any sweep the claim already skips the future rows (run_after condition). */
    sql = claim_text(types, now, 10, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(run_claim(db->conn, sql, &rows), 1);
    assert_int_equal(rows[0].id, 1);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);

    /* The sweep works in bounded steps. */
    assert_int_equal(demote(db, now, 2), 2);
    assert_int_equal(demote(db, now, 2), 2);
    assert_int_equal(demote(db, now, 2), 1);
    assert_int_equal(demote(db, now, 2), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(task_id ORDER BY task_id) "
                                             "= '2,3,4,5,6' FROM task WHERE `delayed` = 1"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT `delayed` FROM task WHERE task_id = 7"), 0);

    /* Once their time has come they are promoted back and claimed in id order. */
    assert_int_equal(promote(db, now + HOUR_MS + 2, 100), 3);
    free(sql);
    sql = claim_text(types, now + HOUR_MS + 2, 10, NULL, NULL);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(run_claim(db->conn, sql, &rows), 4);
    assert_int_equal(rows[0].id, 1);
    assert_int_equal(rows[1].id, 2);
    assert_int_equal(rows[3].id, 4);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    free(rows);
    free(sql);
}

/* ---- the claim on 100,000 rows ---- */

static const char *const big_types[] = {"resize", "thumb", NULL};

static void test_big_table_shape(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;

    assert_int_equal(count_rows(db), BIG_ROWS);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE `delayed` = 1"),
                     BIG_FUTURE + BIG_THUMB);
    assert_int_equal(tp_testdb_query_u64(db,
                                         "SELECT COUNT(*) FROM task WHERE task_state = 0 "
                                         "AND `delayed` = 0 AND task_type = 'resize' AND "
                                         "run_after <= %lld",
                                         (long long)st->big_now_ms),
                     BIG_READY);
}

static void test_claim_plan_uses_claim_idx_without_filesort(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    char *sql = claim_text(big_types, st->big_now_ms, CLAIM_N, NULL, NULL);
    char *explain;
    MYSQL_RES *res;
    MYSQL_ROW row;
    unsigned nrows = 0, bad = 0;

    /* Traditional EXPLAIN: one row per UNION part (plus a UNION RESULT row on servers
     * that materialise the union), each reading claim_idx. */
    explain = malloc(strlen(sql) + 32);
    assert_non_null(explain);
    sprintf(explain, "EXPLAIN %s", sql);
    assert_int_equal(mysql_query(db->conn, explain), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    MYSQL_FIELD *fields = mysql_fetch_fields(res);
    unsigned nf = mysql_num_fields(res), key_col = nf, extra_col = nf, table_col = nf, i;
    for (i = 0; i < nf; i++) {
        if (strcmp(fields[i].name, "key") == 0)
            key_col = i;
        else if (strcmp(fields[i].name, "Extra") == 0)
            extra_col = i;
        else if (strcmp(fields[i].name, "table") == 0)
            table_col = i;
    }
    assert_true(key_col < nf && extra_col < nf && table_col < nf);
    while ((row = mysql_fetch_row(res)) != NULL) {
        const char *extra = row[extra_col] ? row[extra_col] : "";

        printf("# EXPLAIN: table=%s key=%s Extra=%s\n", row[table_col] ? row[table_col] : "",
               row[key_col] ? row[key_col] : "NULL", extra);
        if (strstr(extra, "filesort") || strstr(extra, "temporary"))
            bad++;
        if (row[table_col] && strcmp(row[table_col], "task") == 0) {
            if (row[key_col] == NULL || strcmp(row[key_col], "claim_idx") != 0)
                bad++;
            nrows++;
        }
    }
    mysql_free_result(res);
    if (bad)
        printf("# the claim: %s\n", sql);
    assert_int_equal(bad, 0);
    assert_int_equal(nrows, 2);

    /* EXPLAIN FORMAT=JSON: no filesort node anywhere, claim_idx in both parts. */
    sprintf(explain, "EXPLAIN FORMAT=JSON %s", sql);
    assert_int_equal(mysql_query(db->conn, explain), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    const char *json = row[0];
    assert_null(strstr(json, "filesort"));
    const char *k1 = strstr(json, "\"key\": \"claim_idx\"");
    assert_non_null(k1);
    assert_non_null(strstr(k1 + 1, "\"key\": \"claim_idx\""));
    mysql_free_result(res);
    free(explain);
    free(sql);
}

static void test_claim_reads_few_index_entries(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    char *sql = claim_text(big_types, st->big_now_ms, CLAIM_N, NULL, NULL);
    uint64_t *want;
    struct claimed *rows;
    uint64_t before, after;
    long n, i;

    assert_int_equal(expected_order(db, "resize", st->big_now_ms, CLAIM_N, &want), CLAIM_N);

    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    before = index_reads(db->conn);
    n = run_claim(db->conn, sql, &rows);
    after = index_reads(db->conn);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);

    printf("# claim of %d on %d rows: %" PRIu64 " index entries read\n", CLAIM_N, BIG_ROWS,
           after - before);
    assert_int_equal(n, CLAIM_N);
    assert_true(after - before <= 4 * CLAIM_N);
    /* Dispatch order: priority descending, then task_id; only ready 'resize' rows. */
    for (i = 0; i < n; i++) {
        assert_int_equal(rows[i].id, want[i]);
        assert_string_equal(rows[i].type, "resize");
        if (i > 0) {
            assert_true(rows[i - 1].priority > rows[i].priority ||
                        (rows[i - 1].priority == rows[i].priority && rows[i - 1].id < rows[i].id));
        }
    }
    assert_int_equal(rows[0].priority, 2);
    free(rows);
    free(want);
    free(sql);
}

static void test_claim_skips_locked_rows(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    MYSQL *other = tp_testdb_connect(db);
    char *sql = claim_text(big_types, st->big_now_ms, CLAIM_N, NULL, NULL);
    char lock_sql[512];
    uint64_t *want, *locked;
    uint64_t waits_before, waits_after, reads_before, reads_after;
    struct claimed *rows;
    long n, i;

    assert_non_null(other);
    assert_int_equal(expected_order(db, "resize", st->big_now_ms, LOCKED_N + CLAIM_N, &want),
                     LOCKED_N + CLAIM_N);

    /* Another transaction holds the first 100 ready rows. */
    assert_int_equal(tp_testdb_exec_conn(other, "START TRANSACTION"), 0);
    snprintf(lock_sql, sizeof lock_sql,
             "SELECT task_id FROM task WHERE claim_lane = 0 AND `delayed` = 0 AND "
             "task_type = 'resize' AND run_after <= %lld ORDER BY task_priority DESC, "
             "task_id LIMIT %d FOR UPDATE",
             (long long)st->big_now_ms, LOCKED_N);
    assert_int_equal(query_ids(other, lock_sql, &locked), LOCKED_N);
    assert_memory_equal(locked, want, LOCKED_N * sizeof *want);

    /* A wait would show in Innodb_row_lock_waits, or fail after 2 s with error 1205. */
    assert_int_equal(tp_testdb_exec(db, "SET SESSION innodb_lock_wait_timeout = 2"), 0);
    assert_int_equal(
        tp_testdb_status(db->conn, TP_TESTDB_GLOBAL, "Innodb_row_lock_waits", &waits_before), 0);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    reads_before = index_reads(db->conn);
    n = run_claim(db->conn, sql, &rows);
    reads_after = index_reads(db->conn);
    assert_int_equal(
        tp_testdb_status(db->conn, TP_TESTDB_GLOBAL, "Innodb_row_lock_waits", &waits_after), 0);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    assert_int_equal(tp_testdb_exec_conn(other, "ROLLBACK"), 0);

    printf("# claim of %d past %d locked rows: %" PRIu64 " index entries read\n", CLAIM_N, LOCKED_N,
           reads_after - reads_before);
    assert_int_equal(n, CLAIM_N);
    assert_int_equal(waits_after, waits_before);
    assert_true(reads_after - reads_before <= 4 * (LOCKED_N + CLAIM_N));
    /* The claim returns the next rows in dispatch order, none of the locked ones. */
    for (i = 0; i < n; i++)
        assert_int_equal(rows[i].id, want[LOCKED_N + i]);

    free(rows);
    free(locked);
    free(want);
    free(sql);
    mysql_close(other);
}

/* Two claims at once on two connections never return the same row. */
static void test_concurrent_claims_disjoint(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    MYSQL *other = tp_testdb_connect(db);
    char *sql = claim_text(big_types, st->big_now_ms, CLAIM_N, NULL, NULL);
    struct claimed *a, *b;
    long na, nb, i, j;

    assert_non_null(other);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(tp_testdb_exec_conn(other, "START TRANSACTION"), 0);
    na = run_claim(db->conn, sql, &a);
    nb = run_claim(other, sql, &b);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    assert_int_equal(tp_testdb_exec_conn(other, "ROLLBACK"), 0);
    assert_int_equal(na, CLAIM_N);
    assert_int_equal(nb, CLAIM_N);
    for (i = 0; i < na; i++)
        for (j = 0; j < nb; j++)
            assert_int_not_equal(a[i].id, b[j].id);
    assert_true(b[0].id != a[0].id);
    free(a);
    free(b);
    free(sql);
    mysql_close(other);
}

/* EXPLAINs sql (one statement) and checks every part reads group_idx, covering, with no
 * filesort, but the keyless rows' read, which reads claim_idx, covering too, with no
 * filesort (version 12: its lane 0 holds only keyless rows); returns the number of
 * group_idx parts. */
static int explain_group_idx(tp_testdb *db, const char *sql)
{
    struct tp_sb b = {0};
    MYSQL_RES *res;
    MYSQL_ROW row;
    int parts = 0;

    tp_sb_printf(&b, "EXPLAIN %s", sql);
    assert_int_equal(mysql_query(db->conn, b.s), 0);
    tp_sb_free(&b);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    while ((row = mysql_fetch_row(res)) != NULL) {
        if (row[2] == NULL) /* the union's result */
            continue;
        printf("# fair row %s %s: key=%s Extra=%s\n", row[1] ? row[1] : "", row[2],
               row[5] ? row[5] : "NULL", row[9] ? row[9] : "");
        if (row[5] != NULL && strcmp(row[5], "claim_idx") == 0) {
            assert_non_null(row[9]);
            assert_non_null(strstr(row[9], "Using index"));
            assert_null(strstr(row[9], "filesort"));
            continue;
        }
        printf("# fair part %d: key=%s Extra=%s\n", parts, row[5] ? row[5] : "NULL",
               row[9] ? row[9] : "");
        assert_non_null(row[5]);
        assert_string_equal(row[5], "group_idx");
        assert_non_null(row[9]);
        assert_non_null(strstr(row[9], "Using index"));
        assert_null(strstr(row[9], "filesort"));
        parts++;
    }
    mysql_free_result(res);
    return parts;
}

/* The fair claim's read (db_claim_fair.c): without a cursor one part (B) per type, then
 * with one two (A after the cursor's key, B from the start), every part a covering read
 * of group_idx in its ORDER BY order; a key with most of the rows is passed with one
 * seek: A after it returns the other keys' rows first. */
static void test_fair_read_plan(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->small;
    const char *const one[] = {"fair"};
    size_t cap = dsp_fair_sql_bound(one, 1);
    char *sql = malloc(cap);
    dsp_fair *f = dsp_fair_new();
    uint64_t ids[4];
    uint8_t prios[4];
    bool more;
    MYSQL_RES *res;
    MYSQL_ROW row;

    assert_non_null(sql);
    assert_non_null(f);
    for (int i = 0; i < 5; i++)
        assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, group_key) SELECT 'fair', 'big'"
                                            " FROM task LIMIT 200"),
                         tp_testdb_query_u64(db, "SELECT LEAST(200, COUNT(*)) FROM task"));
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, group_key) VALUES ('fair', 'small'),"
                                        " ('fair', 'tiny')"),
                     2);
    int64_t now = tp_testdb_now_ms() + 1000;
    assert_true(dsp_fair_sql(f, sql, cap, one, 1, now, 4, NULL) > 0);
    assert_int_equal(explain_group_idx(db, sql), 1);
    /* Feed the read to the rotation: the first claim starts at the first key. */
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        assert_int_equal(dsp_fair_add(f, 0, strtoull(row[0], NULL, 10), (uint8_t)atoi(row[2]), row[3],
                                      len[3], row[3] == NULL, (unsigned)atoi(row[4])),
                         0);
    }
    mysql_free_result(res);
    assert_int_equal(dsp_fair_pick(f, 0, 4, ids, prios, &more), 4);
    /* Now with the cursor: A and B, and A starts after 'big'. */
    assert_true(dsp_fair_sql(f, sql, cap, one, 1, now, 4, NULL) > 0);
    assert_int_equal(explain_group_idx(db, sql), 2);
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    assert_string_equal(row[3], "small"); /* past the backlog of 'big' at once */
    assert_string_equal(row[4], "0");
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        assert_int_equal(dsp_fair_add_text(f, 0, row[0], len[0], row[2], len[2], row[3], len[3], row[4], len[4]),
                         0); /* as the claim thread reads them */
    }
    mysql_free_result(res);
    /* The text form takes digits only, within bounds. */
    assert_int_equal(dsp_fair_add_text(f, 0, "18446744073709551615", 20, "255", 3, NULL, 0, "1", 1), 0);
    assert_int_equal(dsp_fair_add_text(f, 0, "18446744073709551616", 20, "1", 1, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "012345678901234567890", 21, "1", 1, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "12a", 3, "1", 1, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "-1", 2, "1", 1, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "", 0, "1", 1, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, NULL, 0, "1", 1, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "7", 1, "256", 3, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "7", 1, " 1", 2, NULL, 0, "0", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "7", 1, "1", 1, NULL, 0, "3", 1), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "7", 1, "1", 1, NULL, 0, NULL, 0), -1);
    assert_int_equal(dsp_fair_add_text(f, 0, "7", 1, "1", 1, "kk", 2, "1", 1), 0);
    /* A too long key from the table is refused, not stored. */
    char k[DSP_FAIR_KEY_MAX + 1];
    memset(k, 'k', sizeof k);
    assert_int_equal(dsp_fair_add(f, 0, 1, 1, k, sizeof k, false, 0), -1);
    assert_int_equal(dsp_fair_add(f, 0, 1, 1, k, 1, false, 3), -1);
    /* Keyless rows of a keyed type: group_idx has none of them (group_lane NULL); the
     * third read (claim_idx) brings them, and they are the first key of the round. */
    dsp_fair *g = dsp_fair_new();
    const char *const two[] = {"fair2"};
    char *sql2 = malloc(dsp_fair_sql_bound(two, 1));
    assert_non_null(g);
    assert_non_null(sql2);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, group_key) VALUES ('fair2', NULL),"
                                        " ('fair2', NULL), ('fair2', NULL), ('fair2', 'a'), ('fair2', 'a'),"
                                        " ('fair2', 'b'), ('fair2', 'b')"),
                     7);
    uint64_t first = tp_testdb_query_u64(db, "SELECT MIN(task_id) FROM task WHERE task_type = 'fair2'"
                                             " AND group_key IS NULL");
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task FORCE INDEX (group_idx) WHERE"
                                             " group_lane = 0 AND task_type = 'fair2'"),
                     4);
    assert_true(dsp_fair_sql(g, sql2, dsp_fair_sql_bound(two, 1), two, 1, now, 4, NULL) > 0);
    assert_non_null(strstr(sql2, "FORCE INDEX (claim_idx)"));
    assert_int_equal(explain_group_idx(db, sql2), 1);
    assert_int_equal(mysql_query(db->conn, sql2), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        assert_int_equal(dsp_fair_add_text(g, 0, row[0], len[0], row[2], len[2], row[3], len[3], row[4], len[4]),
                         0);
    }
    mysql_free_result(res);
    assert_int_equal(dsp_fair_nrows(g), 7); /* 3 keyless (the window of 4 holds them), 4 keyed */
    assert_int_equal(dsp_fair_pick(g, 0, 4, ids, prios, &more), 4);
    /* Round 1: NULL, a, b; round 2: NULL. */
    assert_int_equal(ids[0], first);
    assert_int_equal(ids[1], tp_testdb_query_u64(db, "SELECT MIN(task_id) FROM task WHERE task_type ="
                                                     " 'fair2' AND group_key = 'a'"));
    assert_int_equal(ids[2], tp_testdb_query_u64(db, "SELECT MIN(task_id) FROM task WHERE task_type ="
                                                     " 'fair2' AND group_key = 'b'"));
    assert_int_equal(ids[3], tp_testdb_query_u64(db, "SELECT MIN(task_id) FROM task WHERE task_type ="
                                                     " 'fair2' AND group_key IS NULL AND task_id > %" PRIu64,
                                                 first));
    assert_int_equal(tp_testdb_exec(db, "DELETE FROM task WHERE task_type = 'fair2'"), 7);
    dsp_fair_free(g);
    free(sql2);
    uint64_t nfair = tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type = 'fair'");
    assert_true(nfair > 2);
    assert_int_equal(tp_testdb_exec(db, "DELETE FROM task WHERE task_type = 'fair'"), (int64_t)nfair);
    dsp_fair_free(f);
    free(sql);
}

/* taskpushd's claim: the candidates are a covering read of claim_idx in dispatch order,
 * locking nothing; the lock read by primary key skips a row another transaction holds
 * and one no longer NEW. */
static void test_claim_candidates_then_lock(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    const char *const one[] = {"resize"};
    size_t cap = dsp_claim_sql_select_bound(one, 1) + 32;
    char *sql = malloc(cap);
    uint64_t *want, *cand, *locked, *rest;
    dsp_strbuf lock = {0};
    MYSQL *other = tp_testdb_connect(db);
    MYSQL_RES *res;
    MYSQL_ROW row;
    long nc, nl, i;

    assert_non_null(sql);
    assert_non_null(other);
    memcpy(sql, "EXPLAIN ", 8);
    assert_true(dsp_claim_sql_candidates(sql + 8, cap - 8, one, 1, st->big_now_ms, CLAIM_N, NULL,
                                         NULL, NULL) > 0);
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    /* id, select_type, table, type, possible_keys, key, key_len, ref, rows, Extra */
    printf("# candidates: key=%s Extra=%s\n", row[5] ? row[5] : "NULL", row[9] ? row[9] : "");
    assert_string_equal(row[5], "claim_idx");
    assert_non_null(strstr(row[9], "Using index"));
    assert_null(strstr(row[9], "filesort"));
    mysql_free_result(res);

    assert_int_equal(expected_order(db, "resize", st->big_now_ms, CLAIM_N, &want), CLAIM_N);
    nc = query_ids(db->conn, sql + 8, &cand);
    assert_int_equal(nc, CLAIM_N);
    assert_memory_equal(cand, want, CLAIM_N * sizeof *want);

    /* Another transaction holds the first; the second is no longer NEW. */
    assert_int_equal(tp_testdb_exec_conn(other, "START TRANSACTION"), 0);
    assert_true(tp_testdb_exec_conn(other, "SELECT task_id FROM task WHERE task_id = %" PRIu64
                                                " FOR UPDATE", want[0]) >= 0);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE task SET task_state = 3 WHERE task_id = %" PRIu64,
                                    want[1]),
                     1);
    dsp_strbuf cand_csv = {0};
    dsp_db_sql_id_csv(&cand_csv, cand, (size_t)nc);
    dsp_db_sql_claim_lock(&lock, NULL, st->big_now_ms, cand_csv.p, cand_csv.len);
    dsp_strbuf_free(&cand_csv);
    assert_false(lock.oom);
    nl = query_ids(db->conn, lock.p, &locked);
    assert_int_equal(nl, CLAIM_N - 2);
    for (i = 0; i < nl; i++)
        assert_true(locked[i] != want[0] && locked[i] != want[1]);
    /* The locks are taken: the other connection skips every row locked here, and gets
     * only the one it holds itself. */
    nl = query_ids(other, lock.p, &rest);
    assert_int_equal(nl, 1);
    assert_int_equal(rest[0], want[0]);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    assert_int_equal(tp_testdb_exec_conn(other, "ROLLBACK"), 0);

    free(rest);
    free(locked);
    free(cand);
    free(want);
    dsp_strbuf_free(&lock);
    free(sql);
    mysql_close(other);
}

/* A claim that found its candidates locked reads on after the last one it tried
 * (dsp_claim_sql_candidates_after): the next rows in dispatch order, across a priority
 * boundary, from claim_idx as a range with no filesort, reading about as many index
 * entries as rows returned. */
static void test_claim_candidates_after(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    const char *const one[] = {"resize"};
    size_t cap = dsp_claim_sql_select_bound(one, 1) + 32;
    char *sql = malloc(cap);
    uint64_t *want, *got, before, after, p;
    MYSQL_RES *res;
    MYSQL_ROW row;
    long n;

    assert_non_null(sql);
    assert_int_equal(expected_order(db, "resize", st->big_now_ms, 2 * CLAIM_N, &want), 2 * CLAIM_N);
    p = tp_testdb_query_u64(db, "SELECT task_priority FROM task WHERE task_id = %" PRIu64,
                            want[CLAIM_N - 1]);
    assert_true(p <= 2);
    uint8_t prio = (uint8_t)p;
    memcpy(sql, "EXPLAIN ", 8);
    assert_true(dsp_claim_sql_candidates_after(sql + 8, cap - 8, one, 1, st->big_now_ms, CLAIM_N,
                                               &prio, &want[CLAIM_N - 1], NULL, NULL, NULL) > 0);
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    printf("# candidates after (%u, %" PRIu64 "): type=%s key=%s Extra=%s\n", (unsigned)prio,
           want[CLAIM_N - 1], row[3] ? row[3] : "NULL", row[5] ? row[5] : "NULL",
           row[9] ? row[9] : "");
    assert_string_equal(row[5], "claim_idx");
    assert_null(strstr(row[9], "filesort"));
    mysql_free_result(res);

    before = index_reads(db->conn);
    n = query_ids(db->conn, sql + 8, &got);
    after = index_reads(db->conn);
    printf("# %ld candidates after a position: %" PRIu64 " index entries read\n", n,
           after - before);
    assert_int_equal(n, CLAIM_N);
    assert_memory_equal(got, want + CLAIM_N, CLAIM_N * sizeof *want);
    assert_true(after - before <= 4 * CLAIM_N);
    free(got);
    free(want);
    free(sql);
}

/* The sweeps read delay_idx as a range, not the table. */
static void test_sweep_plans(void **ctx)
{
    struct state *st = *ctx;
    tp_testdb *db = &st->big;
    char sql[256], explain[300];
    MYSQL_RES *res;
    MYSQL_ROW row;
    int k;

    for (k = 0; k < 2; k++) {
        if (k == 0)
            assert_true(dsp_claim_sql_promote(sql, sizeof sql, st->big_now_ms, 1000) > 0);
        else
            assert_true(dsp_claim_sql_demote(sql, sizeof sql, st->big_now_ms, 1000) > 0);
        snprintf(explain, sizeof explain, "EXPLAIN FORMAT=JSON %s", sql);
        assert_int_equal(mysql_query(db->conn, explain), 0);
        res = mysql_store_result(db->conn);
        assert_non_null(res);
        row = mysql_fetch_row(res);
        assert_non_null(row);
        assert_non_null(strstr(row[0], "\"key\": \"delay_idx\""));
        assert_null(strstr(row[0], "\"access_type\": \"ALL\""));
        mysql_free_result(res);
    }
    /* With nothing to move, a sweep reads next to nothing. */
    uint64_t before = index_reads(db->conn), after;
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(promote(db, st->big_now_ms, 1000), 0);
    after = index_reads(db->conn);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    printf("# empty promote sweep: %" PRIu64 " index entries read\n", after - before);
    assert_true(after - before <= 4);
}

int main(void)
{
#define SMALL(f) cmocka_unit_test_setup(f, small_setup)
    const struct CMUnitTest tests[] = {
        SMALL(test_producer_insert_defaults),
        SMALL(test_payload_only_insert),
        SMALL(test_payload_binary_safe),
        SMALL(test_check_rejects_bad_priority_and_state),
        SMALL(test_check_holds_under_insert_ignore),
        SMALL(test_dedup_key),
        SMALL(test_task_type_is_binary),
        SMALL(test_task_type_trailing_space),
        SMALL(test_schema_rerun_keeps_rows),
        SMALL(test_schema_version_and_indexes),
        SMALL(test_epoch_strictly_increases),
        cmocka_unit_test(test_claim_sql_text),
        SMALL(test_claim_quotes_types),
        SMALL(test_claim_union_of_types),
        SMALL(test_promote_sweep),
        SMALL(test_demote_sweep),
        cmocka_unit_test(test_big_table_shape),
        cmocka_unit_test(test_claim_plan_uses_claim_idx_without_filesort),
        cmocka_unit_test(test_fair_read_plan),
        cmocka_unit_test(test_claim_reads_few_index_entries),
        cmocka_unit_test(test_claim_skips_locked_rows),
        cmocka_unit_test(test_concurrent_claims_disjoint),
        cmocka_unit_test(test_claim_candidates_then_lock),
        cmocka_unit_test(test_claim_candidates_after),
        cmocka_unit_test(test_sweep_plans),
    };
#undef SMALL
    return cmocka_run_group_tests_name("schema", tests, group_setup, group_teardown);
}
