/* Unit tests of the SQL text builders (dispatcher/db/db_claim_sql.c and dispatcher/db/db_sql.c),
 * without a database: the exact statements for representative inputs, hostile type
 * names, the bounds the callers size their buffers by, and the growing text buffer.
 * What the statements do on MariaDB is tested in tests/integration (test_schema, test_db). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db_claim_sql.h"
#include "db_sql.h"
#include "migrate.h"
#include "shard.h"
#include "tables.h"

/* The claim's part for one type, as db_claim_sql.h documents it. */
#define PART(lit, now, limit)                                                                      \
    "(SELECT " DSP_CLAIM_SQL_COLUMNS " FROM task FORCE INDEX (claim_idx) WHERE claim_lane = 0 "   \
    "AND `delayed` = 0 AND task_type = " lit " AND run_after <= " now " ORDER BY task_priority "   \
    "DESC, task_id LIMIT " limit " FOR UPDATE SKIP LOCKED)"

/* Non-overlapping occurrences of needle. By hand rather than with strstr: under ASan
 * each strstr measures the rest of the text, which made this quadratic on the
 * megabytes of the longest statements. */
static size_t count_of(const char *text, const char *needle)
{
    size_t n = 0, tl = strlen(text), nl = strlen(needle);
    for (size_t i = 0; i + nl <= tl; i++)
        if (text[i] == needle[0] && memcmp(text + i, needle, nl) == 0) {
            n++;
            i += nl - 1;
        }
    return n;
}

/* ---- claim_sql ---- */

static void claim_one_type(void **state)
{
    (void)state;
    const char *types[] = {"resize"};
    char buf[1024];
    int n = dsp_claim_sql_select(buf, sizeof buf, types, 1, 1000, 5, NULL, NULL);
    assert_string_equal(buf, PART("_utf8mb4 X'726573697A65'", "1000", "5"));
    assert_int_equal(n, (int)strlen(buf));
}

/* The candidates: the same parts, covering columns, no lock. */
static void claim_candidates(void **state)
{
    (void)state;
    const char *types[] = {"a", "b"};
    char buf[2048];
    int n = dsp_claim_sql_candidates(buf, sizeof buf, types, 2, 1000, 7, NULL, NULL, NULL);
#define CAND(lit)                                                                                  \
    "(SELECT task_id, task_type, task_priority FROM task FORCE INDEX (claim_idx) WHERE "          \
    "claim_lane = 0 AND `delayed` = 0 AND task_type = " lit " AND run_after <= 1000 ORDER BY "    \
    "task_priority DESC, task_id LIMIT 7) UNION ALL (SELECT task_id, task_type, task_priority "   \
    "FROM task FORCE INDEX (group_idx) WHERE group_lane = 0 AND `delayed` = 0 AND task_type = "   \
    lit " AND run_after <= 1000 ORDER BY task_priority DESC, group_key, task_id LIMIT 1)"
    /* Each type's keyless rows, then its first keyed row (version 12: not in claim_idx's
     * lane 0), which makes the claim thread take the fair read for the type. */
    assert_string_equal(buf, CAND("_utf8mb4 X'61'") " UNION ALL " CAND("_utf8mb4 X'62'"));
#undef CAND
    assert_int_equal(n, (int)strlen(buf));
    assert_null(strstr(buf, "FOR UPDATE"));
    /* Never longer than the locking claim: the same bound serves. */
    assert_true((size_t)n < dsp_claim_sql_select_bound(types, 2));
    assert_int_equal(dsp_claim_sql_candidates(buf, sizeof buf, types, 0, 1, 1, NULL, NULL, NULL),
                     -1);
    assert_int_equal(dsp_claim_sql_candidates(buf, sizeof buf, types, 1, 1, 0, NULL, NULL, NULL),
                     -1);
    assert_int_equal(dsp_claim_sql_candidates(buf, (size_t)n, types, 2, 1000, 7, NULL, NULL, NULL),
                     -1);
    assert_string_equal(buf, "");
}

/* The candidates after a position (a claim reading past locked rows): each part with
 * its own position; the bound holds with the longest numbers and names. */
static void claim_candidates_after(void **state)
{
    (void)state;
    const char *types[] = {"a", "b"};
    const uint8_t prio[] = {1, 0};
    const uint64_t id[] = {100, 7};
    char buf[2048];
    int n = dsp_claim_sql_candidates_after(buf, sizeof buf, types, 2, 1000, 16, prio, id, NULL,
                                           NULL, NULL);
#define CAND(lit, after)                                                                           \
    "(SELECT task_id, task_type, task_priority FROM task FORCE INDEX (claim_idx) WHERE "          \
    "claim_lane = 0 AND `delayed` = 0 AND task_type = " lit after " AND run_after <= 1000 ORDER " \
    "BY task_priority DESC, task_id LIMIT 16)"
    assert_string_equal(buf, CAND("_utf8mb4 X'61'", " AND (task_priority < 1 OR (task_priority = 1"
                                                    " AND task_id > 100))")
                             " UNION ALL "
                             CAND("_utf8mb4 X'62'", " AND (task_priority < 0 OR (task_priority = 0"
                                                    " AND task_id > 7))"));
#undef CAND
    assert_int_equal(n, (int)strlen(buf));
    assert_int_equal(dsp_claim_sql_candidates_after(buf, sizeof buf, types, 2, 1000, 16, NULL, id,
                                                    NULL, NULL, NULL),
                     -1);
    assert_int_equal(dsp_claim_sql_candidates_after(buf, (size_t)n, types, 2, 1000, 16, prio, id,
                                                    NULL, NULL, NULL),
                     -1);
    assert_string_equal(buf, "");

    char name[DSP_CLAIM_SQL_TYPE_MAX_BYTES + 1];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    const char *longest[] = {name, name, name};
    const uint8_t pmax[] = {255, 255, 255};
    const uint64_t imax[] = {UINT64_MAX, UINT64_MAX, UINT64_MAX};
    size_t cap = dsp_claim_sql_select_bound(longest, 3);
    char *big = malloc(cap);
    assert_non_null(big);
    n = dsp_claim_sql_candidates_after(big, cap, longest, 3, INT64_MAX, 4294967295u, pmax, imax,
                                       NULL, NULL, NULL);
    assert_true(n > 0 && (size_t)n < cap);
    free(big);
}

static void claim_two_types(void **state)
{
    (void)state;
    const char *types[] = {"a", "b"};
    char buf[2048];
    int n = dsp_claim_sql_select(buf, sizeof buf, types, 2, 0, 4294967295u, NULL, NULL);
    assert_string_equal(buf, PART("_utf8mb4 X'61'", "0", "4294967295") " UNION ALL "
                                 PART("_utf8mb4 X'62'", "0", "4294967295"));
    assert_int_equal(n, (int)strlen(buf));
}

/* The text between "task_type = " and " AND run_after" of part i, decoded from hex. */
static void literal_of_part(const char *sql, int part, char *out, size_t cap)
{
    const char *p = sql;
    for (int i = 0; i <= part; i++) {
        p = strstr(p, "task_type = ");
        assert_non_null(p);
        p += strlen("task_type = ");
    }
    const char *end = strstr(p, " AND run_after");
    assert_non_null(end);
    assert_memory_equal(p, "_utf8mb4 X'", 11);
    p += 11;
    assert_true(end[-1] == '\'');
    size_t hex = (size_t)(end - 1 - p), o = 0;
    assert_true(hex % 2 == 0 && hex / 2 < cap);
    for (size_t i = 0; i < hex; i += 2) {
        unsigned v;
        assert_true(strchr("0123456789ABCDEF", p[i]) && strchr("0123456789ABCDEF", p[i + 1]));
        assert_int_equal(sscanf(p + i, "%2X", &v), 1);
        out[o++] = (char)v;
    }
    out[o] = '\0';
}

static void claim_hostile_types(void **state)
{
    (void)state;
    const char *types[] = {"a' OR 1=1 -- ", "\\'; DROP TABLE task; --", "`x`", "\"q\"",
                           "\xff\xfe\xc0\x80", "%s%n", " UNION ALL (SELECT 1)"};
    size_t nt = sizeof types / sizeof types[0];
    size_t cap = dsp_claim_sql_select_bound(types, nt);
    char *buf = malloc(cap);
    assert_non_null(buf);
    int n = dsp_claim_sql_select(buf, cap, types, nt, 7, 3, NULL, NULL);
    assert_true(n > 0 && (size_t)n < cap);
    /* Every byte of a name is in hex: the only quotes are the literals' own. */
    assert_int_equal(count_of(buf, "'"), 2 * nt);
    assert_int_equal(count_of(buf, "UNION ALL"), nt - 1);
    assert_null(strchr(buf, '\\'));
    assert_null(strchr(buf, '"'));
    assert_null(strstr(buf, "DROP"));
    for (size_t i = 0; i < nt; i++) {
        char got[64];
        literal_of_part(buf, (int)i, got, sizeof got);
        assert_string_equal(got, types[i]);
    }
    free(buf);
}

static void claim_refuses_bad_arguments(void **state)
{
    (void)state;
    char name[DSP_CLAIM_SQL_TYPE_MAX_BYTES + 2];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0'; /* one byte too long */
    const char *ok[] = {"a"}, *with_null[] = {"a", NULL}, *too_long[] = {name};
    char buf[4096];

    memcpy(buf, "junk", 5);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, ok, 0, 1, 1, NULL, NULL), -1);
    assert_string_equal(buf, "");
    memcpy(buf, "junk", 5);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, ok, 1, 1, 0, NULL, NULL), -1);
    assert_string_equal(buf, "");
    memcpy(buf, "junk", 5);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, ok, 1, -1, 1, NULL, NULL), -1);
    assert_string_equal(buf, "");
    memcpy(buf, "junk", 5);
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, with_null, 2, 1, 1, NULL, NULL), -1);
    assert_string_equal(buf, "");
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, too_long, 1, 1, 1, NULL, NULL), -1);
    assert_string_equal(buf, "");
    assert_int_equal(dsp_claim_sql_select(buf, sizeof buf, NULL, 1, 1, 1, NULL, NULL), -1);
    assert_int_equal(dsp_claim_sql_select(NULL, sizeof buf, ok, 1, 1, 1, NULL, NULL), -1);
    assert_int_equal(dsp_claim_sql_select(buf, 0, ok, 1, 1, 1, NULL, NULL), -1);

    /* The longest name the table holds is accepted. */
    name[DSP_CLAIM_SQL_TYPE_MAX_BYTES] = '\0';
    assert_true(dsp_claim_sql_select(buf, sizeof buf, too_long, 1, 1, 1, NULL, NULL) > 0);
}

/* Every buffer one byte short fails with ""; the exact size (text + NUL) works. */
static void claim_exact_buffer_size(void **state)
{
    (void)state;
    const char *types[] = {"thumb", "resize"};
    char full[2048], buf[2048];
    int n = dsp_claim_sql_select(full, sizeof full, types, 2, INT64_MAX, UINT_MAX, NULL, NULL);
    assert_true(n > 0);
    assert_non_null(strstr(full, "run_after <= 9223372036854775807 "));
    for (size_t cap = 1; cap <= (size_t)n; cap++) {
        memset(buf, 'x', sizeof buf);
        assert_int_equal(dsp_claim_sql_select(buf, cap, types, 2, INT64_MAX, UINT_MAX, NULL, NULL), -1);
        assert_string_equal(buf, "");
    }
    assert_int_equal(dsp_claim_sql_select(buf, (size_t)n + 1, types, 2, INT64_MAX, UINT_MAX, NULL, NULL),
                     n);
    assert_string_equal(buf, full);
}

/* A quote function that uses all DSP_CLAIM_SQL_LITERAL_MAX(len) bytes it may. */
static int quote_widest(void *ctx, char *to, size_t cap, const char *from, size_t len)
{
    size_t need = DSP_CLAIM_SQL_LITERAL_MAX(len);
    (void)from;
    (void)ctx;
    if (need > cap)
        return -1;
    memset(to, '0', need);
    to[0] = '\'';
    to[need - 1] = '\'';
    return (int)need;
}

/* The most types a claim can name (--max-types at its default, each of the longest
 * name) with the longest numbers: the bound holds, with the widest quote too. */
static void claim_most_types_within_bound(void **state)
{
    (void)state;
    enum { NT = 10000 };
    const char **types = calloc(NT, sizeof *types);
    char *names = malloc((size_t)NT * (DSP_CLAIM_SQL_TYPE_MAX_BYTES + 1));
    assert_non_null(types);
    assert_non_null(names);
    for (size_t i = 0; i < NT; i++) {
        char *s = names + i * (DSP_CLAIM_SQL_TYPE_MAX_BYTES + 1);
        memset(s, 'a' + (int)(i % 26), DSP_CLAIM_SQL_TYPE_MAX_BYTES);
        s[DSP_CLAIM_SQL_TYPE_MAX_BYTES] = '\0';
        types[i] = s;
    }
    size_t cap = dsp_claim_sql_select_bound(types, NT);
    char *buf = malloc(cap);
    assert_non_null(buf);
    int n = dsp_claim_sql_select(buf, cap, types, NT, INT64_MAX, UINT_MAX, NULL, NULL);
    assert_true(n > 0 && (size_t)n < cap);
    assert_int_equal(count_of(buf, " UNION ALL "), NT - 1);
    n = dsp_claim_sql_select(buf, cap, types, NT, INT64_MAX, UINT_MAX, quote_widest, NULL);
    assert_true(n > 0 && (size_t)n < cap);
    free(buf);
    free(names);
    free(types);
}

static void claim_quote_hex(void **state)
{
    (void)state;
    char buf[64];
    assert_int_equal(dsp_claim_sql_quote_hex(NULL, buf, sizeof buf, "a\x00'", 3), 18);
    assert_memory_equal(buf, "_utf8mb4 X'610027'", 18);
    /* It needs 11 + 2 * len + 1 bytes, no NUL. */
    assert_int_equal(dsp_claim_sql_quote_hex(NULL, buf, 14, "a", 1), 14);
    assert_int_equal(dsp_claim_sql_quote_hex(NULL, buf, 13, "a", 1), -1);
    assert_int_equal(dsp_claim_sql_quote_hex(NULL, buf, 12, "", 0), 12);
    assert_memory_equal(buf, "_utf8mb4 X''", 12);
}

static void claim_sweeps(void **state)
{
    (void)state;
    char buf[256];
    assert_true(dsp_claim_sql_promote(buf, sizeof buf, 1700000000000, 500) > 0);
    assert_string_equal(buf, "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 0 WHERE `delayed` = 1"
                             " AND run_after <= 1700000000000 LIMIT 500");
    assert_true(dsp_claim_sql_demote(buf, sizeof buf, 1700000000000, 500) > 0);
    assert_string_equal(buf, "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 1 WHERE `delayed` = 0"
                             " AND task_state = 0 AND run_after > 1700000000000 LIMIT 500");
    assert_int_equal(dsp_claim_sql_promote(buf, sizeof buf, 1, 0), -1);
    assert_string_equal(buf, "");
    assert_int_equal(dsp_claim_sql_demote(buf, sizeof buf, -1, 1), -1);
    assert_string_equal(buf, "");
    assert_int_equal(dsp_claim_sql_promote(buf, 20, 1, 1), -1);
    assert_int_equal(dsp_claim_sql_demote(NULL, 20, 1, 1), -1);
}

/* ---- db_sql: the write statements ---- */

/* Whether a kind writes a data column (result or err_msg), as db_sql.h lists them. */
static bool kind_has_data(int kind)
{
    return kind != DSP_WRITE_RELEASE && kind != DSP_WRITE_DELIVERED;
}

#define WRITE_TAIL(ids, epoch) " WHERE task_id IN (" ids ") AND task_state = 1 AND epoch = " epoch

static void write_one_value_per_column(void **state)
{
    (void)state;
    dsp_db_sql_row rows[3] = {{.task_id = 11, .attempts = 1},
                              {.task_id = 12, .attempts = 1},
                              {.task_id = 13, .attempts = 1}};
    dsp_strbuf b = {0};
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_SUCCEEDED, 7, 5000, rows, 3));
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 2, result = NULL,"
                             " attempts = 1, last_update_time = 5000" WRITE_TAIL("11, 12, 13", "7"));
    dsp_strbuf_reset(&b);
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_RELEASE, 7, 5000, rows, 3));
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 0, `delayed` = 0,"
                             " attempts = 1, last_update_time = 5000" WRITE_TAIL("11, 12, 13", "7"));
    dsp_strbuf_reset(&b);
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_DELIVERED, 4294967295u, 5000, rows, 1));
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 1,"
                             " attempts = 1, last_update_time = 5000" WRITE_TAIL("11", "4294967295"));
    assert_false(b.oom);
    dsp_strbuf_free(&b);
}

static void write_values_that_differ(void **state)
{
    (void)state;
    dsp_db_sql_row rows[2] = {
        {.task_id = 1, .attempts = 1, .run_after_ms = 100, .data = (const uint8_t *)"e'", .len = 2},
        {.task_id = 2, .attempts = 2, .run_after_ms = 200, .data = NULL, .len = 0}};
    dsp_strbuf b = {0};
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_RETRY, 3, 9, rows, 2));
    assert_string_equal(b.p,
                        "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 0, `delayed` = 1,"
                        " run_after = CASE task_id WHEN 1 THEN 100 WHEN 2 THEN 200 END,"
                        " err_msg = CASE task_id WHEN 1 THEN _utf8mb4 X'6527' WHEN 2 THEN NULL END,"
                        " attempts = CASE task_id WHEN 1 THEN 1 WHEN 2 THEN 2 END,"
                        " last_update_time = 9" WRITE_TAIL("1, 2", "3"));
    dsp_strbuf_reset(&b);
    /* A result is bytes: no character set introducer. */
    rows[1] = rows[0];
    rows[1].task_id = 2;
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_SUCCEEDED, 3, 9, rows, 2));
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 2, result = X'6527',"
                             " attempts = 1, last_update_time = 9" WRITE_TAIL("1, 2", "3"));
    dsp_strbuf_reset(&b);
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_FAILED, 3, 9, rows, 1));
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 3,"
                             " err_msg = _utf8mb4 X'6527', attempts = 1, last_update_time = 9"
                             WRITE_TAIL("1", "3"));
    dsp_strbuf_free(&b);
}

static void write_refuses_nothing_and_bad_kinds(void **state)
{
    (void)state;
    dsp_db_sql_row row = {.task_id = 1, .attempts = 1};
    dsp_strbuf b = {0};
    assert_false(dsp_db_sql_write(&b, NULL, DSP_WRITE_SUCCEEDED, 1, 1, &row, 0));
    assert_false(dsp_db_sql_write(&b, NULL, -1, 1, 1, &row, 1));
    assert_false(dsp_db_sql_write(&b, NULL, DSP_WRITE_KINDS, 1, 1, &row, 1));
    assert_int_equal(b.len, 0);
    assert_null(b.p);
}

/* A large result is the statement's one parameter, never in its text. */
static void write_result_param(void **state)
{
    (void)state;
    static const uint8_t data[4] = {'a', 'b', 'c', 'd'};
    dsp_db_sql_row row = {.task_id = 18446744073709551615u, .attempts = 4294967295u, .data = data, .len = 4};
    dsp_strbuf b = {0};
    dsp_db_sql_write_result_param(&b, NULL, 4294967295u, -5, &row);
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 2, result = ?,"
                             " attempts = 4294967295, last_update_time = -5 WHERE task_id IN"
                             " (18446744073709551615) AND task_state = 1 AND epoch = 4294967295");
    dsp_strbuf_free(&b);
}

/* Beyond DSP_DB_SQL_FLAT_CASE_MAX sorted rows the CASE has two levels of about sqrt(n)
 * groups; unsorted rows keep one flat CASE. */
static void write_two_level_case(void **state)
{
    (void)state;
    enum { N = 100 };
    dsp_db_sql_row rows[N];
    dsp_strbuf b = {0};
    for (size_t i = 0; i < N; i++)
        rows[i] = (dsp_db_sql_row){.task_id = i + 1, .attempts = (uint32_t)i};
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_RELEASE, 1, 1, rows, N));
    assert_non_null(strstr(b.p, " attempts = CASE WHEN task_id <= 10 THEN CASE task_id WHEN 1 THEN 0 "));
    assert_int_equal(count_of(b.p, "WHEN task_id <= "), 9);
    assert_int_equal(count_of(b.p, " ELSE CASE task_id WHEN 91 THEN 90 "), 1);
    assert_int_equal(count_of(b.p, " THEN "), 9 + N);
    dsp_strbuf_reset(&b);

    rows[0].task_id = 1000; /* no longer sorted */
    assert_true(dsp_db_sql_write(&b, NULL, DSP_WRITE_RELEASE, 1, 1, rows, N));
    assert_non_null(strstr(b.p, " attempts = CASE task_id WHEN 1000 THEN 0 WHEN 2 THEN 1 "));
    assert_int_equal(count_of(b.p, "WHEN task_id <= "), 0);
    assert_int_equal(count_of(b.p, " THEN "), N);

    /* Exactly DSP_DB_SQL_FLAT_CASE_MAX sorted rows: still flat. */
    rows[0].task_id = 1;
    dsp_strbuf_reset(&b);
    assert_true(
        dsp_db_sql_write(&b, NULL, DSP_WRITE_RELEASE, 1, 1, rows, DSP_DB_SQL_FLAT_CASE_MAX));
    assert_int_equal(count_of(b.p, "WHEN task_id <= "), 0);
    dsp_strbuf_reset(&b);
    assert_true(
        dsp_db_sql_write(&b, NULL, DSP_WRITE_RELEASE, 1, 1, rows, DSP_DB_SQL_FLAT_CASE_MAX + 1));
    assert_true(count_of(b.p, "WHEN task_id <= ") > 0);
    dsp_strbuf_free(&b);
}

/* The longest batch (--batch at its most, 10,000 rows) of every kind, every column
 * different, the largest numbers: the statement stays within the fixed part plus the
 * sum of dsp_db_sql_write_row_cost(), which the write thread sizes statements by. */
static void write_longest_batch_within_cost(void **state)
{
    (void)state;
    enum { N = 10000 };
    static const uint8_t text[] = "an error text of some length, differing by row";
    dsp_db_sql_row *rows = calloc(N, sizeof *rows);
    assert_non_null(rows);
    for (size_t i = 0; i < N; i++) {
        rows[i].task_id = UINT64_MAX - N + i;
        rows[i].attempts = UINT32_MAX - (uint32_t)i;
        rows[i].run_after_ms = INT64_MIN + (int64_t)i;
        rows[i].data = text;
        rows[i].len = i % (sizeof text);
    }
    for (int kind = 0; kind < DSP_WRITE_KINDS; kind++) {
        for (int sorted = 0; sorted < 2; sorted++) {
            if (!sorted) { /* swap the first two: one flat CASE of N arms */
                dsp_db_sql_row t = rows[0];
                rows[0] = rows[1];
                rows[1] = t;
            }
            dsp_strbuf b = {0};
            size_t cost = DSP_DB_SQL_WRITE_FIXED;
            for (size_t i = 0; i < N; i++)
                cost += dsp_db_sql_write_row_cost(kind, &rows[i]);
            assert_true(dsp_db_sql_write(&b, NULL, kind, UINT32_MAX, INT64_MAX, rows, N));
            assert_false(b.oom);
            assert_int_equal(strlen(b.p), b.len);
            assert_true(b.len <= cost);
            assert_int_equal(count_of(b.p, " THEN "),
                             (size_t)N * (kind == DSP_WRITE_RETRY ? 3 : kind_has_data(kind) ? 2 : 1) +
                                 (sorted ? 99 * (kind == DSP_WRITE_RETRY ? 3 : kind_has_data(kind) ? 2 : 1)
                                         : 0));
            assert_non_null(strstr(b.p, " AND task_state = 1 AND epoch = 4294967295"));
            dsp_strbuf_free(&b);
            if (!sorted) {
                dsp_db_sql_row t = rows[0];
                rows[0] = rows[1];
                rows[1] = t;
            }
        }
    }
    free(rows);
}

/* ---- db_sql: the other statements ---- */

static void claim_mark_and_release(void **state)
{
    (void)state;
    const uint64_t ids[] = {5, 3, UINT64_MAX};
    dsp_strbuf b = {0}, csv = {0};
    dsp_db_sql_id_csv(&csv, ids, 3);
    assert_string_equal(csv.p, "5,3,18446744073709551615");
    dsp_db_sql_claim_mark(&b, NULL, 2, 77, csv.p, csv.len);
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 1, epoch = 2,"
                             " last_update_time = 77 WHERE task_id IN (5,3,18446744073709551615)");
    dsp_strbuf_reset(&b);
    dsp_db_sql_claim_lock(&b, NULL, 77, csv.p, csv.len);
    assert_string_equal(b.p, "SELECT task_id, attempts, max_attempts, timeout_ms, payload, group_key FROM task"
                             " FORCE INDEX (PRIMARY) WHERE task_id IN (5,3,18446744073709551615)"
                             " AND task_state = 0 AND `delayed` = 0 AND run_after <= 77"
                             " FOR UPDATE SKIP LOCKED");
    dsp_strbuf_free(&csv);
    dsp_strbuf_reset(&b);
    dsp_db_sql_release_ids(&b, NULL, 2, 77, ids, 1);
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = 0,"
                             " last_update_time = 77" WRITE_TAIL("5", "2"));
    dsp_strbuf_free(&b);
}

static void lock_free_and_still_ours(void **state)
{
    (void)state;
    dsp_db_sql_row rows[3] = {{.task_id = 1}, {.task_id = 2}, {.task_id = 3}};
    const uint8_t skip[3] = {1, 0, 0};
    dsp_strbuf b = {0};
    dsp_db_sql_lock_free(&b, NULL, 9, rows, skip, 3);
    assert_string_equal(b.p, "SELECT task_id FROM task FORCE INDEX (PRIMARY) WHERE task_id IN (2, 3)"
                             " AND task_state = 1 AND epoch = 9 FOR UPDATE SKIP LOCKED");
    dsp_strbuf_reset(&b);
    dsp_db_sql_still_ours(&b, NULL, 9, rows, NULL, 3);
    assert_string_equal(b.p, "SELECT task_id FROM task FORCE INDEX (PRIMARY) WHERE task_id IN"
                             " (1, 2, 3) AND task_state = 1 AND epoch = 9");
    dsp_strbuf_free(&b);
}

/* The inventory's statements: the adoption of a declared delivery, and a foreign
 * outcome's fence (the attempt, or one less for a delivery not yet recorded). */
static void inventory_statements(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_db_sql_row row = {.task_id = 42, .attempts = 3};
    dsp_db_sql_adopt(&b, NULL, 9, 555, 42, 7, 3, NULL);
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET epoch = 9, attempts = 3,"
                             " last_update_time = 555 WHERE task_id = 42 AND task_state = 1"
                             " AND epoch = 7 AND attempts IN (2, 3)");
    dsp_strbuf_reset(&b);
    dsp_db_sql_adopt(&b, NULL, 9, 555, 42, 7, 0, " AND task_type IN ('a')");
    assert_non_null(strstr(b.p, " AND epoch = 7 AND attempts = 0 AND task_type IN ('a')"));
    dsp_strbuf_reset(&b);
    dsp_db_sql_adopted_row(&b, NULL, 9, 42, 3);
    assert_string_equal(b.p, "SELECT task_type, max_attempts, task_priority FROM task FORCE INDEX"
                             " (PRIMARY) WHERE task_id = 42 AND task_state = 1 AND epoch = 9"
                             " AND attempts = 3");
    dsp_strbuf_reset(&b);
    dsp_db_sql_write(&b, NULL, DSP_WRITE_RETRY, 7, 1, &row, 1);
    dsp_db_sql_foreign_fence(&b, 3, 0);
    assert_non_null(strstr(b.p, " AND task_state = 1 AND epoch = 7 AND attempts IN (2, 3)"
                                " AND max_attempts > 3"));
    assert_int_equal(b.p[b.len - 1], '3');
    dsp_strbuf_reset(&b);
    dsp_db_sql_write(&b, NULL, DSP_WRITE_FAILED, 7, 1, &row, 1);
    dsp_db_sql_foreign_fence(&b, 3, 1);
    assert_non_null(strstr(b.p, " AND attempts IN (2, 3) AND max_attempts <= 3"));
    dsp_strbuf_free(&b);
}

/* task_claim.task_ids comes from the table: only what a dispatcher writes parses. */
static void claim_ids_parse(void **state)
{
    (void)state;
    uint64_t ids[4];
    size_t n = 99;
    static const char *const bad[] = {"", ",", "1,", ",1", "1,,2", " 1", "1 ", "+1", "-1", "0",
                                      "1,0", "0x10", "18446744073709551616",
                                      "000000000000000000001", "1;2", "1\n"};

    assert_int_equal(dsp_claim_ids_parse("7", 1, ids, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 7);
    assert_int_equal(dsp_claim_ids_parse("18446744073709551615,1,42", 25, ids, 4, &n), 0);
    assert_int_equal(n, 3);
    assert_true(ids[0] == UINT64_MAX && ids[1] == 1 && ids[2] == 42);
    /* The length given is what counts, not a NUL. */
    assert_int_equal(dsp_claim_ids_parse("12,34", 2, ids, 4, &n), 0);
    assert_true(n == 1 && ids[0] == 12);
    /* More than cap ids. */
    assert_int_equal(dsp_claim_ids_parse("1,2,3,4,5", 9, ids, 4, &n), -1);
    assert_int_equal(n, 0);
    assert_int_equal(dsp_claim_ids_parse(NULL, 0, ids, 4, &n), -1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = 99;
        if (dsp_claim_ids_parse(bad[i], strlen(bad[i]), ids, 4, &n) != -1)
            fail_msg("parsed \"%s\"", bad[i]);
        assert_int_equal(n, 0);
    }
}

static void recover_and_stats(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    uint64_t ids[3] = {7, 9, 12}, seqs[2] = {5, 6};
    dsp_db_sql_recover_ids(&b, NULL, 4, 123, ids, 3, NULL);
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (PRIMARY) SET task_state = IF(attempts >="
                             " max_attempts, 3, 0), `delayed` = 0, err_msg = IF(attempts >= max_attempts,"
                             " 'the dispatcher stopped during the last attempt', err_msg),"
                             " last_update_time = 123 WHERE task_id IN (7, 9, 12)"
                             " AND task_state = 1 AND epoch = 4");
    dsp_strbuf_reset(&b);
    dsp_db_sql_claim_log_probe(&b, NULL, 4, "");
    assert_string_equal(b.p, "SELECT seq FROM task_claim WHERE epoch < 4 AND shard = '' LIMIT 1");
    dsp_strbuf_reset(&b);
    dsp_db_sql_claim_log_next(&b, NULL, 9, NULL, 4, 17);
    assert_string_equal(b.p, "SELECT epoch, seq, task_ids FROM task_claim WHERE epoch < 9"
                             " AND (epoch > 4 OR (epoch = 4 AND seq > 17))"
                             " ORDER BY epoch, seq LIMIT 1 FOR UPDATE");
    dsp_strbuf_reset(&b);
    dsp_strbuf csv = {0};
    dsp_db_sql_id_csv(&csv, ids, 3);
    dsp_db_sql_claim_log_insert(&b, NULL, 9, 3, "video", csv.p, csv.len);
    assert_string_equal(b.p, "INSERT INTO task_claim (epoch, seq, shard, task_ids)"
                             " VALUES (9, 3, 'video', '7,9,12')");
    /* What the claim writes, recovery reads back. */
    uint64_t back[4];
    size_t nback = 0;
    assert_int_equal(dsp_claim_ids_parse(csv.p, csv.len, back, 4, &nback), 0);
    assert_int_equal(nback, 3);
    assert_memory_equal(back, ids, sizeof ids);
    dsp_strbuf_free(&csv);
    dsp_strbuf_reset(&b);
    dsp_db_sql_claim_log_delete(&b, NULL, 9, seqs, 2);
    assert_string_equal(b.p, "DELETE FROM task_claim WHERE epoch = 9 AND seq IN (5, 6)");
    dsp_strbuf_reset(&b);
    dsp_db_sql_still_processing(&b, NULL, 4, ids, 2);
    assert_string_equal(b.p, "SELECT COUNT(*) FROM task FORCE INDEX (PRIMARY)"
                             " WHERE task_id IN (7, 9) AND task_state = 1 AND epoch = 4");
    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_counts(&b, NULL, 55, NULL);
    assert_string_equal(b.p, "SELECT claim_lane, `delayed`, task_type, COUNT(*), SUM(run_after <= 55),"
                             " SUM(task_priority = 0), SUM(task_priority = 1), SUM(task_priority = 2), 0"
                             " FROM task FORCE INDEX (claim_idx) WHERE claim_lane IN (0, 3)"
                             " GROUP BY claim_lane, `delayed`, task_type"
                             " UNION ALL SELECT group_lane, `delayed`, task_type, COUNT(*), SUM(run_after <= 55),"
                             " SUM(task_priority = 0), SUM(task_priority = 1), SUM(task_priority = 2), 1"
                             " FROM task FORCE INDEX (group_idx) WHERE group_lane = 0"
                             " GROUP BY group_lane, `delayed`, task_type");
    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_successful(&b, NULL, DSP_DB_SQL_SUCCESSFUL_CAP, NULL);
    assert_string_equal(b.p, "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM task FORCE INDEX (claim_idx)"
                             " WHERE claim_lane = 1 LIMIT 1000000) x) + (SELECT COUNT(*) FROM (SELECT 1"
                             " FROM task FORCE INDEX (group_idx) WHERE group_lane = 1 LIMIT 1000000) y)");
    dsp_strbuf_free(&b);
}

#define OLDEST(lit, prio)                                                                          \
    "(SELECT task_type t, GREATEST(insert_time, run_after) g FROM task FORCE INDEX (claim_idx) WHERE " \
    "claim_lane = 0 AND `delayed` = 0 AND task_type = " lit " AND task_priority = " prio          \
    " AND run_after <= 8 ORDER BY task_id LIMIT 1)"

static void stats_oldest(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_db_sql_stats_oldest_part(&b, NULL, true, "a'", 2, 2, 8, false);
    dsp_db_sql_stats_oldest_part(&b, NULL, false, "", 0, 0, 8, false);
    dsp_db_sql_stats_oldest_part(&b, NULL, false, "k", 1, 1, 8, true);
    dsp_db_sql_stats_oldest_end(&b);
    /* The keyed part: the smallest id among the first rows of group_idx, then its row. */
    assert_string_equal(b.p, "SELECT t, MIN(g) FROM (" OLDEST("_utf8mb4 X'6127'", "2") " UNION ALL "
                             OLDEST("''", "0") " UNION ALL (SELECT task_type t, GREATEST(insert_time,"
                             " run_after) g FROM task FORCE INDEX (PRIMARY) WHERE task_id = (SELECT"
                             " MIN(task_id) FROM (SELECT task_id FROM task FORCE INDEX (group_idx)"
                             " WHERE group_lane = 0 AND `delayed` = 0 AND task_type = _utf8mb4 X'6B'"
                             " AND task_priority = 1 AND run_after <= 8 LIMIT 1024) s))) u GROUP BY t");
    dsp_strbuf_free(&b);
}

static void retention_and_requeue(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_db_sql_retention(&b, NULL, 2, false, 1000, 500, NULL);
    assert_string_equal(b.p, "DELETE FROM task WHERE claim_lane = 1 AND task_state = 2 AND last_update_time < 1000 LIMIT 500");
    dsp_strbuf_reset(&b);
    /* SUCCESSFUL rows with a key: claim_lane NULL (version 12), group_lane 1. */
    dsp_db_sql_retention(&b, NULL, 2, true, 1000, 500, NULL);
    assert_string_equal(b.p, "DELETE FROM task WHERE group_lane = 1 AND task_state = 2 AND last_update_time < 1000 LIMIT 500");
    dsp_strbuf_reset(&b);
    dsp_db_sql_retention(&b, NULL, 3, false, -5, 1, NULL);
    assert_string_equal(b.p, "DELETE FROM task WHERE claim_lane = 3 AND task_state = 3 AND last_update_time < -5 LIMIT 1");
    dsp_strbuf_reset(&b);
    for (int s = -1; s < 5; s++)
        if (s != 2 && s != 3)
            dsp_db_sql_retention(&b, NULL, s, false, 1, 1, NULL);
    dsp_db_sql_retention(&b, NULL, 3, true, 1, 1, NULL); /* FAILED rows are all in claim_lane 3 */
    assert_int_equal(b.len, 0);

#define REQUEUE_HEAD                                                                               \
    "UPDATE task FORCE INDEX (claim_idx) SET task_state = 0, attempts = 0, `delayed` ="          \
    " IF(EXISTS (SELECT 1 FROM task_dep d WHERE d.task_id = task.task_id), 2, 0),"                 \
    " run_after = 0, last_update_time = 6 WHERE claim_lane = 3"
    dsp_db_sql_requeue_failed(&b, NULL, NULL, 6, 100, NULL);
    assert_string_equal(b.p, REQUEUE_HEAD " LIMIT 100");
    dsp_strbuf_reset(&b);
    dsp_db_sql_requeue_failed(&b, NULL, "", 6, 100, NULL);
    assert_string_equal(b.p, REQUEUE_HEAD " AND task_type = '' LIMIT 100");
    dsp_strbuf_reset(&b);
    dsp_db_sql_requeue_failed(&b, NULL, "x' OR '1'='1", 6, 100, NULL);
    assert_string_equal(b.p, REQUEUE_HEAD " AND task_type = _utf8mb4 X'7827204F52202731273D2731' LIMIT 100");
    dsp_strbuf_free(&b);
}

/* The task-level requests: by primary key, or claim_idx ranges with a LIMIT; a type
 * only as a hex literal. */
static void task_requests(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_db_sql_task_show(&b, NULL, 18446744073709551615ULL, NULL);
    assert_non_null(strstr(b.p, " FROM task WHERE task_id = 18446744073709551615"));
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_state(&b, NULL, 7, NULL);
    assert_string_equal(b.p, "SELECT task_state FROM task WHERE task_id = 7");
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_retry(&b, NULL, 7, 1000, NULL);
    assert_string_equal(b.p, "UPDATE task SET task_state = 0, attempts = 0, err_msg = NULL, `delayed` ="
                             " IF(EXISTS (SELECT 1 FROM task_dep d WHERE d.task_id = task.task_id), 2, 0),"
                             " run_after = 1000, last_update_time = 1000 WHERE task_id = 7 AND task_state = 3");
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_cancel(&b, NULL, 7, 1000, NULL);
    assert_string_equal(b.p, "UPDATE task SET task_state = 3, err_msg = 'cancelled', `delayed` = 0,"
                             " last_update_time = 1000 WHERE task_id = 7 AND task_state = 0");
    dsp_strbuf_reset(&b);
    {
        /* attempts written never passes the schema's CHECK (attempts_max). */
        const dsp_db_sql_row r = {.task_id = 5, .attempts = 2147483648u};
        dsp_db_sql_write(&b, NULL, DSP_WRITE_DELIVERED, 3, 1000, &r, 1);
        assert_non_null(strstr(b.p, "attempts = 1000"));
        assert_null(strstr(b.p, "2147483648"));
        dsp_strbuf_reset(&b);
    }
    /* Orphans: an epoch older than the leader's or above the counter; never its own. */
    dsp_db_sql_task_cancel_orphan(&b, NULL, 7, 9, 1000, NULL);
    assert_string_equal(b.p, "UPDATE task SET task_state = 3, err_msg = 'cancelled', `delayed` = 0,"
                             " last_update_time = 1000 WHERE task_id = 7 AND task_state = 1 AND (epoch < 9"
                             " OR epoch > (SELECT value FROM taskpush_meta WHERE name = 'epoch'))");
    dsp_strbuf_reset(&b);
    dsp_db_sql_orphan_range(&b, NULL, 10, 5000);
    assert_string_equal(b.p, "SELECT COUNT(*), MAX(task_id) FROM (SELECT task_id FROM task FORCE INDEX"
                             " (PRIMARY) WHERE task_id > 10 ORDER BY task_id LIMIT 5000) s");
    dsp_strbuf_reset(&b);
    {
        const dsp_db_sql_orphan o = {.epoch = 9, .counter = 12, .older_than_ms = 500, .in = NULL};
        const uint64_t oids[2] = {11, 13};
        dsp_db_sql_orphan_select(&b, NULL, &o, 10, 20, 5000, NULL, 0);
        assert_string_equal(b.p, "SELECT task_id FROM task FORCE INDEX (PRIMARY) WHERE task_id > 10 AND"
                                 " task_id <= 20 AND task_state = 1 AND (epoch < 9 OR epoch > 12) AND"
                                 " last_update_time < 500 LIMIT 5000");
        dsp_strbuf_reset(&b);
        dsp_db_sql_orphan_select(&b, NULL, &o, 0, 0, 0, oids, 2);
        assert_string_equal(b.p, "SELECT task_id FROM task FORCE INDEX (PRIMARY) WHERE task_id IN (11, 13)"
                                 " AND task_state = 1 AND (epoch < 9 OR epoch > 12) AND last_update_time < 500"
                                 " FOR UPDATE SKIP LOCKED");
        dsp_strbuf_reset(&b);
        dsp_db_sql_orphan_recover(&b, NULL, &o, 1000, oids, 2);
        assert_non_null(strstr(b.p, " WHERE task_id IN (11, 13) AND task_state = 1 AND (epoch < 9 OR epoch > 12)"
                                    " AND last_update_time < 500"));
        dsp_strbuf_reset(&b);
    }
    dsp_db_sql_failed_next_type(&b, NULL, 0, NULL, 0, NULL);
    assert_string_equal(b.p, "SELECT MIN(task_type) FROM task FORCE INDEX (claim_idx)"
                             " WHERE claim_lane = 3 AND `delayed` = 0");
    dsp_strbuf_reset(&b);
    dsp_db_sql_failed_next_type(&b, NULL, 1, "x'", 2, NULL);
    assert_string_equal(b.p, "SELECT MIN(task_type) FROM task FORCE INDEX (claim_idx)"
                             " WHERE claim_lane = 3 AND `delayed` = 1 AND task_type > _utf8mb4 X'7827'");
    dsp_strbuf_reset(&b);
    dsp_db_sql_failed_part(&b, NULL, true, "a", 1, 20, 1000, NULL);
    dsp_db_sql_failed_part(&b, NULL, false, "", 0, 20, 1000, NULL);
    dsp_db_sql_failed_end(&b, 20);
    assert_string_equal(
        b.p, "SELECT * FROM ((SELECT task_id, task_type, task_priority, attempts, max_attempts,"
             " failed_at, LEFT(err_msg, 1000) FROM task FORCE INDEX (failed_idx)"
             " WHERE task_type = _utf8mb4 X'61' AND failed_at IS NOT NULL"
             " ORDER BY failed_at DESC, task_id DESC LIMIT 20) UNION ALL (SELECT task_id, task_type,"
             " task_priority, attempts, max_attempts, failed_at, LEFT(err_msg, 1000) FROM task FORCE"
             " INDEX (failed_idx) WHERE task_type = '' AND failed_at IS NOT NULL"
             " ORDER BY failed_at DESC, task_id DESC LIMIT 20)) u ORDER BY failed_at DESC, task_id DESC"
             " LIMIT 20");
    dsp_strbuf_reset(&b);
    dsp_db_sql_retry_failed_since(&b, NULL, "a", 1, 1000, 2000, 50, NULL);
    assert_string_equal(b.p, "UPDATE task FORCE INDEX (failed_idx) SET task_state = 0, attempts = 0,"
                             " err_msg = NULL, `delayed` = IF(EXISTS (SELECT 1 FROM task_dep d WHERE"
                             " d.task_id = task.task_id), 2, 0), run_after = 2000, last_update_time = 2000"
                             " WHERE task_type = _utf8mb4 X'61' AND failed_at >= 1000"
                             " ORDER BY failed_at DESC, task_id DESC LIMIT 50");
    dsp_strbuf_free(&b);
}

/* ---- shards: the type filter every statement on task rows carries (--types) ---- */

#define IN_AB " AND task_type IN (_utf8mb4 X'61', _utf8mb4 X'6227')"

static void shard_type_filter(void **state)
{
    (void)state;
    const char *types[] = {"a", "b'", ""};
    dsp_strbuf b = {0}, in = {0};

    dsp_db_sql_type_in(&in, types, 0);
    assert_int_equal(in.len, 0);
    dsp_db_sql_type_in(&in, types, 3);
    assert_string_equal(in.p, " AND task_type IN (_utf8mb4 X'61', _utf8mb4 X'6227', '')");
    dsp_strbuf_reset(&in);
    dsp_db_sql_type_in(&in, types, 2);
    assert_string_equal(in.p, IN_AB);

    /* The filter goes into the WHERE, before any LIMIT, of each statement. */
    uint64_t ids[2] = {3, 5};
    dsp_db_sql_recover_ids(&b, NULL, 4, 123, ids, 2, in.p);
    assert_non_null(strstr(b.p, " WHERE task_id IN (3, 5) AND task_state = 1 AND epoch = 4" IN_AB));
    assert_int_equal(b.p[b.len - 1], ')');
    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_processing(&b, NULL, ids, 2, in.p);
    assert_string_equal(b.p, "SELECT task_type, COUNT(*) FROM task FORCE INDEX (PRIMARY)"
                             " WHERE task_id IN (3, 5) AND task_state = 1" IN_AB " GROUP BY task_type");
    dsp_strbuf_reset(&b);
    dsp_db_sql_retention(&b, NULL, 2, false, 1000, 500, in.p);
    assert_string_equal(b.p, "DELETE FROM task WHERE claim_lane = 1 AND task_state = 2"
                             " AND last_update_time < 1000" IN_AB " LIMIT 500");
    dsp_strbuf_reset(&b);
    dsp_db_sql_requeue_failed(&b, NULL, "a", 6, 100, in.p);
    assert_string_equal(b.p, REQUEUE_HEAD " AND task_type = _utf8mb4 X'61'" IN_AB " LIMIT 100");
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_show(&b, NULL, 9, in.p);
    assert_non_null(strstr(b.p, " FROM task WHERE task_id = 9" IN_AB));
    assert_int_equal(b.p[b.len - 1], ')');
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_state(&b, NULL, 7, in.p);
    assert_string_equal(b.p, "SELECT task_state FROM task WHERE task_id = 7" IN_AB);
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_retry(&b, NULL, 7, 1000, in.p);
    assert_non_null(strstr(b.p, " WHERE task_id = 7 AND task_state = 3" IN_AB));
    dsp_strbuf_reset(&b);
    dsp_db_sql_task_cancel(&b, NULL, 7, 1000, in.p);
    assert_non_null(strstr(b.p, " WHERE task_id = 7 AND task_state = 0" IN_AB));
    dsp_strbuf_reset(&b);
    dsp_db_sql_failed_next_type(&b, NULL, 1, "x", 1, in.p);
    assert_string_equal(b.p, "SELECT MIN(task_type) FROM task FORCE INDEX (claim_idx) WHERE"
                             " claim_lane = 3 AND `delayed` = 1 AND task_type > _utf8mb4 X'78'" IN_AB);
    dsp_strbuf_reset(&b);
    dsp_db_sql_failed_part(&b, NULL, true, "a", 1, 20, 1000, in.p);
    assert_non_null(strstr(b.p, "task_type = _utf8mb4 X'61'" IN_AB " AND failed_at IS NOT NULL ORDER BY"));
    dsp_strbuf_reset(&b);
    dsp_db_sql_retry_failed_since(&b, NULL, "a", 1, 1000, 2000, 50, in.p);
    assert_non_null(strstr(b.p, "task_type = _utf8mb4 X'61'" IN_AB " AND failed_at >= 1000 ORDER BY"));
    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_counts(&b, NULL, 55, in.p);
    assert_non_null(strstr(b.p, " WHERE claim_lane IN (0, 3)" IN_AB
                                " GROUP BY claim_lane, `delayed`, task_type"));
    assert_non_null(strstr(b.p, " WHERE group_lane = 0" IN_AB " GROUP BY group_lane, `delayed`, task_type"));
    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_successful(&b, NULL, 10, in.p);
    assert_string_equal(b.p, "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM task FORCE INDEX (claim_idx)"
                             " WHERE claim_lane = 1" IN_AB " LIMIT 10) x) + (SELECT COUNT(*) FROM"
                             " (SELECT 1 FROM task FORCE INDEX (group_idx) WHERE group_lane = 1" IN_AB
                             " LIMIT 10) y)");
    dsp_strbuf_free(&b);

    /* The lane sweeps; too small a buffer for the filter fails whole. */
    char buf[512];
    assert_true(dsp_claim_sql_promote_in(buf, sizeof buf, 5, 10, in.p, NULL) > 0);
    assert_string_equal(buf, "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 0 WHERE `delayed` = 1"
                             " AND run_after <= 5" IN_AB " LIMIT 10");
    assert_true(dsp_claim_sql_demote_in(buf, sizeof buf, 5, 10, in.p, NULL) > 0);
    assert_string_equal(buf, "UPDATE task FORCE INDEX (delay_idx) SET `delayed` = 1 WHERE `delayed` = 0"
                             " AND task_state = 0 AND run_after > 5" IN_AB " LIMIT 10");
    assert_int_equal(dsp_claim_sql_demote_in(buf, 120, 5, 10, in.p, NULL), -1);
    /* NULL: exactly the unsharded statement. */
    char plain[256];
    assert_true(dsp_claim_sql_promote_in(buf, sizeof buf, 5, 10, NULL, NULL) > 0);
    assert_true(dsp_claim_sql_promote(plain, sizeof plain, 5, 10) > 0);
    assert_string_equal(buf, plain);
    dsp_strbuf_free(&in);
}

/* --types and --shard: trimmed, sorted, distinct, bounded, named. */
static void shard_parse(void **state)
{
    (void)state;
    dsp_shard s, t;
    char err[160];

    assert_int_equal(dsp_shard_parse(&s, NULL, NULL, 100, err, sizeof err), 0);
    assert_int_equal(s.ntypes, 0);
    assert_true(dsp_shard_has(&s, (const uint8_t *)"any", 3));
    assert_int_equal(dsp_shard_parse(&s, NULL, "x", 100, err, sizeof err), -1);

    assert_int_equal(dsp_shard_parse(&s, " b ,a,b,\xc3\xa9", NULL, 100, err, sizeof err), 0);
    assert_int_equal(s.ntypes, 3);
    assert_string_equal(s.types[0], "a");
    assert_string_equal(s.types[1], "b");
    assert_string_equal(s.types[2], "\xc3\xa9");
    assert_true(dsp_shard_has(&s, (const uint8_t *)"b", 1));
    assert_true(dsp_shard_has(&s, (const uint8_t *)"\xc3\xa9", 2));
    assert_false(dsp_shard_has(&s, (const uint8_t *)"c", 1));
    assert_false(dsp_shard_has(&s, (const uint8_t *)"bb", 2));
    assert_false(dsp_shard_has(&s, (const uint8_t *)"", 0));
    assert_int_equal(strlen(s.name), 17);
    assert_int_equal(s.name[0], 't');
    /* The same set in another order: the same name; another set: another. */
    assert_int_equal(dsp_shard_parse(&t, "\xc3\xa9,a,b", NULL, 100, err, sizeof err), 0);
    assert_string_equal(s.name, t.name);
    dsp_shard_free(&t);
    assert_int_equal(dsp_shard_parse(&t, "a,b", NULL, 100, err, sizeof err), 0);
    assert_string_not_equal(s.name, t.name);
    dsp_shard_free(&t);
    dsp_shard_free(&s);

    assert_int_equal(dsp_shard_parse(&s, "a,b", "beta-1.x_Y", 100, err, sizeof err), 0);
    assert_string_equal(s.name, "beta-1.x_Y");
    dsp_shard_free(&s);

    /* Refused: empty items, bad UTF-8, 65 characters, a bad name, too many. */
    const char *bad[] = {"", "a,,b", "a,", " , ", "\xff", "a,\xc3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dsp_shard_parse(&s, bad[i], NULL, 100, err, sizeof err), -1);
        assert_int_equal(s.ntypes, 0);
        assert_non_null(strstr(err, "--types"));
    }
    char long_type[70];
    memset(long_type, 'x', 65);
    long_type[65] = '\0';
    assert_int_equal(dsp_shard_parse(&s, long_type, NULL, 100, err, sizeof err), -1);
    long_type[64] = '\0';
    assert_int_equal(dsp_shard_parse(&s, long_type, NULL, 100, err, sizeof err), 0);
    dsp_shard_free(&s);
    assert_int_equal(dsp_shard_parse(&s, "a", "has space", 100, err, sizeof err), -1);
    assert_int_equal(dsp_shard_parse(&s, "a", "", 100, err, sizeof err), -1);
    assert_int_equal(dsp_shard_parse(&s, "a", "abcdefghijklmnopqrstuvwxyz0123456", 100, err, sizeof err), -1);
    assert_int_equal(dsp_shard_parse(&s, "a,b,c", NULL, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "too many"));
    assert_int_equal(dsp_shard_parse(&s, "a,b,a", NULL, 3, err, sizeof err), 0);
    assert_int_equal(s.ntypes, 2);
    dsp_shard_free(&s);
    /* DSP_SHARD_TYPES_MAX whatever --max-types says. */
    size_t n = DSP_SHARD_TYPES_MAX + 1, len = 0;
    char *many = malloc(n * 8);
    assert_non_null(many);
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(many + len, "%s%zu", i ? "," : "", i);
    assert_int_equal(dsp_shard_parse(&s, many, NULL, 100000, err, sizeof err), -1);
    many[strlen(many) - 4] = '\0'; /* drop the last item: DSP_SHARD_TYPES_MAX */
    assert_int_equal(dsp_shard_parse(&s, many, NULL, 100000, err, sizeof err), 0);
    assert_int_equal(s.ntypes, DSP_SHARD_TYPES_MAX);
    dsp_shard_free(&s);
    free(many);
}

/* ---- the text buffer ---- */

static void strbuf_grows_and_keeps_text(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    char want[5000];
    for (size_t i = 0; i < sizeof want - 1; i++) {
        want[i] = (char)('a' + i % 26);
        dsp_strbuf_put(&b, &want[i], 1);
        assert_true(b.cap > b.len);
        assert_int_equal(b.cap & (b.cap - 1), 0); /* 256, doubled */
    }
    want[sizeof want - 1] = '\0';
    assert_int_equal(b.len, sizeof want - 1);
    assert_string_equal(b.p, want);
    assert_int_equal(b.cap, 8192);

    /* printf longer than its 128-byte stack buffer. */
    dsp_strbuf_reset(&b);
    assert_int_equal(b.cap, 8192); /* reset keeps the memory */
    assert_string_equal(b.p, "");
    dsp_strbuf_printf(&b, "%s|%0300d|%s", "head", 7, "tail");
    assert_int_equal(b.len, 4 + 1 + 300 + 1 + 4);
    assert_memory_equal(b.p + 5 + 299, "7|tail", 7);
    dsp_strbuf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.cap, 0);

    /* A first reserve takes 256 bytes, or the next power of two above the need. */
    assert_true(dsp_strbuf_reserve(&b, 1));
    assert_int_equal(b.cap, 256);
    assert_true(dsp_strbuf_reserve(&b, 256));
    assert_int_equal(b.cap, 512);
    dsp_strbuf_free(&b);
}

static void strbuf_oom_sticks(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_strbuf_puts(&b, "abc");
    assert_false(dsp_strbuf_reserve(&b, SIZE_MAX - 2));
    assert_true(b.oom);
    dsp_strbuf_puts(&b, "def");
    dsp_strbuf_printf(&b, "%d", 1);
    dsp_strbuf_put_hex(&b, (const uint8_t *)"x", 1, true);
    assert_int_equal(b.len, 3);
    assert_string_equal(b.p, "abc");
    assert_false(dsp_strbuf_reserve(&b, 1));
    dsp_strbuf_reset(&b); /* clears it */
    assert_false(b.oom);
    dsp_strbuf_put_hex(&b, (const uint8_t *)"x", SIZE_MAX / 2, false); /* too long to double */
    assert_true(b.oom);
    dsp_strbuf_free(&b);
}

static void strbuf_hex(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_strbuf_put_hex(&b, NULL, 0, true);
    dsp_strbuf_puts(&b, " ");
    dsp_strbuf_put_hex(&b, (const uint8_t *)"\x00\xff", 2, false);
    dsp_strbuf_puts(&b, " ");
    dsp_strbuf_put_hex(&b, (const uint8_t *)"\x00\xff", 2, true);
    assert_string_equal(b.p, "NULL X'00FF' _utf8mb4 X'00FF'");
    dsp_strbuf_free(&b);
}

/* ---- UTF-8 repair of outcome texts ---- */

static void utf8_helpers(void **state)
{
    (void)state;
    const uint8_t good[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";   /* a é € 😀 */
    const uint8_t bad[] = "a\xc0\xaf" "b\xed\xa0\x80" "c\xf4\x90\x80\x80"; /* overlong, surrogate, >U+10FFFF */
    uint8_t out[64];

    assert_int_equal(dsp_utf8_valid_prefix(good, sizeof good - 1), sizeof good - 1);
    assert_int_equal(dsp_utf8_valid_prefix(bad, sizeof bad - 1), 1);
    assert_int_equal(dsp_utf8_valid_prefix(good, 2), 1); /* a cut sequence is not valid */

    size_t n = dsp_utf8_sanitize(bad, sizeof bad - 1, out, sizeof out);
    assert_int_equal(n, dsp_utf8_valid_prefix(out, n));
    assert_int_equal(n, 3 + 9 * 3); /* a, b, c and nine U+FFFD */
    assert_memory_equal(out, "a\xef\xbf\xbd", 4);
    /* Stops before a character that does not fit. */
    assert_int_equal(dsp_utf8_sanitize(bad, sizeof bad - 1, out, 3), 1);

    assert_int_equal(dsp_utf8_cut(good, sizeof good - 1, 100), sizeof good - 1);
    assert_int_equal(dsp_utf8_cut(good, sizeof good - 1, 2), 1);
    assert_int_equal(dsp_utf8_cut(good, sizeof good - 1, 3), 3);
    assert_int_equal(dsp_utf8_cut(good, sizeof good - 1, 9), 6);
}

/* The decimal appends that replaced vsnprintf in the per-row lists: every edge value
 * reads back as snprintf writes it. */
static void strbuf_integers(void **state)
{
    (void)state;
    static const uint64_t us[] = {0, 9, 10, 99, 1000000007, UINT32_MAX, (uint64_t)INT64_MAX, UINT64_MAX};
    static const int64_t is[] = {0, -1, 42, -1000000007, INT64_MAX, INT64_MIN};
    char want[64];
    dsp_strbuf b = {0};
    for (size_t i = 0; i < sizeof us / sizeof us[0]; i++) {
        dsp_strbuf_reset(&b);
        dsp_strbuf_put_u64(&b, ", ", us[i]);
        snprintf(want, sizeof want, ", %llu", (unsigned long long)us[i]);
        assert_string_equal(b.p, want);
    }
    for (size_t i = 0; i < sizeof is / sizeof is[0]; i++) {
        dsp_strbuf_reset(&b);
        dsp_strbuf_put_i64(&b, "x=", is[i]);
        snprintf(want, sizeof want, "x=%lld", (long long)is[i]);
        assert_string_equal(b.p, want);
    }
    dsp_strbuf_free(&b);
}

/* ---- another table's names (--table) ---- */

static void table_names_valid(void **state)
{
    (void)state;
    dsp_table_names t;
    char longest[DSP_TABLE_NAME_MAX + 2];

    assert_true(dsp_table_name_valid("jobs", 4));
    assert_true(dsp_table_name_valid("_q9", 3));
    assert_false(dsp_table_name_valid("", 0));
    assert_false(dsp_table_name_valid("9jobs", 5));
    assert_false(dsp_table_name_valid("jobs-x", 6));
    assert_false(dsp_table_name_valid("jo`bs", 5));
    assert_false(dsp_table_name_valid("jo bs", 5));
    assert_false(dsp_table_name_valid("t\xc3\xa4sk", 5));
    memset(longest, 'a', sizeof longest);
    assert_true(dsp_table_name_valid(longest, DSP_TABLE_NAME_MAX));
    assert_false(dsp_table_name_valid(longest, DSP_TABLE_NAME_MAX + 1));
    longest[DSP_TABLE_NAME_MAX] = '\0';
    assert_int_equal(dsp_table_names_init(&t, longest), 0);
    assert_true(strlen(t.schedule) <= 64); /* MySQL's longest identifier */
    assert_int_equal(dsp_table_names_init(&t, "a;DROP"), -1);
    assert_int_equal(dsp_table_names_init(&t, NULL), -1);

    assert_int_equal(dsp_table_names_init(&t, "task"), 0);
    assert_true(t.is_default);
    assert_string_equal(t.meta, "taskpush_meta");
    assert_string_equal(t.schedule, "task_schedule");
    assert_string_equal(t.claim, "task_claim");
    assert_int_equal(dsp_table_names_init(&t, "jobs"), 0);
    assert_false(t.is_default);
    assert_string_equal(t.task, "jobs");
    assert_string_equal(t.meta, "jobs_meta");
    assert_string_equal(t.schedule, "jobs_schedule");
    assert_string_equal(t.claim, "jobs_claim");
}

static void table_names_subst(void **state)
{
    (void)state;
    dsp_table_names t;
    dsp_strbuf b = {0};
    static const char text[] =
        "CREATE TABLE IF NOT EXISTS task (task_id BIGINT, task_type VARCHAR(64));\n"
        "-- task_claim lists a claim's task ids; taskpush_meta.schema_version\n"
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'task';\n"
        "UPDATE `task` SET mytask = task.task_state, task$x = 1, task2 = 0 FROM task_schedule";

    assert_int_equal(dsp_table_names_init(&t, "jobs"), 0);
    dsp_table_names_subst(&b, &t, text, sizeof text - 1);
    assert_false(b.oom);
    assert_string_equal(
        b.p,
        "CREATE TABLE IF NOT EXISTS jobs (task_id BIGINT, task_type VARCHAR(64));\n"
        "-- jobs_claim lists a claim's jobs ids; jobs_meta.schema_version\n"
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 'jobs';\n"
        "UPDATE `jobs` SET mytask = jobs.task_state, task$x = 1, task2 = 0 FROM jobs_schedule");
    /* Comments and quoted text are rewritten too (information_schema's table_name = 'task'):
     * whole words, never part of one. For task the text is copied as it is. */
    dsp_strbuf_reset(&b);
    dsp_table_names_subst(&b, &dsp_table_names_task, text, sizeof text - 1);
    assert_string_equal(b.p, text);
    /* A name at either end, and nothing but a name. */
    dsp_strbuf_reset(&b);
    dsp_table_names_subst(&b, &t, "task", 4);
    assert_string_equal(b.p, "jobs");
    dsp_strbuf_reset(&b);
    dsp_table_names_subst(&b, &t, "", 0);
    assert_true(b.p == NULL || b.p[0] == '\0');
    dsp_strbuf_free(&b);
}

/* The CHECK constraints are named after another table (MySQL 8 keeps their names per
 * database): NAME_C for each of task's names C, whole words only; task keeps them. */
static void table_names_constraints(void **state)
{
    (void)state;
    dsp_table_names t;
    dsp_strbuf b = {0};
    static const char text[] =
        "CONSTRAINT attempts_min CHECK (attempts >= 0),\n"
        "CONSTRAINT_NAME IN ('attempts_min', 'task_claim_ids_not_empty') x_attempts_min\n"
        "CONSTRAINT schedule_catch_up_max_range CHECK (catch_up_max BETWEEN 1 AND 1000)";
    char longest[DSP_TABLE_NAME_MAX + 1];

    assert_int_equal(dsp_table_names_init(&t, "jobs"), 0);
    dsp_table_names_subst(&b, &t, text, sizeof text - 1);
    assert_false(b.oom);
    assert_string_equal(b.p, "CONSTRAINT jobs_attempts_min CHECK (attempts >= 0),\n"
                             "CONSTRAINT_NAME IN ('jobs_attempts_min', 'jobs_task_claim_ids_not_empty')"
                             " x_attempts_min\n"
                             "CONSTRAINT jobs_schedule_catch_up_max_range CHECK (catch_up_max"
                             " BETWEEN 1 AND 1000)");
    dsp_strbuf_reset(&b);
    dsp_table_names_subst(&b, &dsp_table_names_task, text, sizeof text - 1);
    assert_string_equal(b.p, text);
    /* The longest NAME with the longest constraint fits MySQL's 64 bytes. */
    memset(longest, 'z', DSP_TABLE_NAME_MAX);
    longest[DSP_TABLE_NAME_MAX] = '\0';
    assert_int_equal(dsp_table_names_init(&t, longest), 0);
    for (const char *const *c = dsp_table_constraint_names; *c; c++) {
        assert_true(strlen(*c) <= DSP_TABLE_CONSTRAINT_MAX);
        dsp_strbuf_reset(&b);
        dsp_table_names_subst(&b, &t, *c, strlen(*c));
        assert_true(b.len <= 64);
    }
    dsp_strbuf_free(&b);
}

/* The list holds every CONSTRAINT name of sql/schema.sql and sql/migrations (a new one
 * not listed would keep task's name on another table: a clash on MySQL 8), and no other. */
static void table_constraints_listed(void **state)
{
    (void)state;
    static const char *const files[] = {
        "sql/schema.sql", "sql/migrations/002-row-value-checks.sql",
        "sql/migrations/004-task-schedule.sql", "sql/migrations/005-claim-lane.sql",
        "sql/migrations/006-attempts-max.sql", "tests/data/schema-v1.sql"};
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    bool seen[64] = {false};
    size_t nlisted = 0;
    char path[1024], line[1024];

    while (dsp_table_constraint_names[nlisted])
        nlisted++;
    assert_true(nlisted <= 64);
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        snprintf(path, sizeof path, "%s/%s", root ? root : ".", files[f]);
        FILE *in = fopen(path, "r");
        if (in == NULL)
            fail_msg("cannot read %s", path);
        while (fgets(line, sizeof line, in)) {
            const char *p = line;
            char name[128], *comment = strstr(line, "--");
            if (comment)
                *comment = '\0'; /* "ADD CONSTRAINT fails" in prose names nothing */
            while ((p = strstr(p, "CONSTRAINT ")) != NULL) {
                p += strlen("CONSTRAINT ");
                if (sscanf(p, "%127[A-Za-z0-9_]", name) != 1)
                    continue;
                size_t k = 0;
                while (k < nlisted && strcmp(dsp_table_constraint_names[k], name) != 0)
                    k++;
                if (k == nlisted)
                    fail_msg("%s names the constraint %s, which tables.c does not list", files[f],
                             name);
                seen[k] = true;
            }
        }
        fclose(in);
    }
    for (size_t k = 0; k < nlisted; k++)
        if (!seen[k])
            fail_msg("tables.c lists %s, which sql/ does not name", dsp_table_constraint_names[k]);
}

/* Every builder's text for another table is task's with the four names substituted
 * (and for task, t NULL and &dsp_table_names_task give the same text). */
#define BOTH(call)                                                                                 \
    do {                                                                                           \
        dsp_strbuf a_ = {0}, j_ = {0}, s_ = {0}, d_ = {0};                                         \
        {                                                                                          \
            dsp_strbuf *b = &a_;                                                                   \
            const dsp_table_names *t = NULL;                                                       \
            call;                                                                                  \
        }                                                                                          \
        {                                                                                          \
            dsp_strbuf *b = &d_;                                                                   \
            const dsp_table_names *t = &dsp_table_names_task;                                      \
            call;                                                                                  \
        }                                                                                          \
        {                                                                                          \
            dsp_strbuf *b = &j_;                                                                   \
            const dsp_table_names *t = &jobs;                                                      \
            call;                                                                                  \
        }                                                                                          \
        assert_non_null(a_.p);                                                                     \
        assert_string_equal(a_.p, d_.p);                                                           \
        dsp_table_names_subst(&s_, &jobs, a_.p, a_.len);                                           \
        assert_string_equal(j_.p, s_.p);                                                           \
        assert_null(strstr(j_.p, " task ")); /* never task's table left */                         \
        assert_null(strstr(j_.p, "taskpush_meta"));                                                \
        assert_null(strstr(j_.p, "task_claim"));                                                   \
        dsp_strbuf_free(&a_);                                                                      \
        dsp_strbuf_free(&j_);                                                                      \
        dsp_strbuf_free(&s_);                                                                      \
        dsp_strbuf_free(&d_);                                                                      \
    } while (0)

static void builders_name_the_table(void **state)
{
    (void)state;
    dsp_table_names jobs;
    const uint64_t ids[] = {3, 5};
    const dsp_db_sql_row rows[2] = {{.task_id = 3, .attempts = 1}, {.task_id = 5, .attempts = 2}};
    const dsp_db_sql_orphan o = {.epoch = 4, .counter = 9, .older_than_ms = 77, .in = NULL};
    const char *types[] = {"a", "b"};
    const uint8_t prio[] = {1, 2};
    const uint64_t after[] = {10, 20};
    char buf[4096];

    assert_int_equal(dsp_table_names_init(&jobs, "jobs"), 0);
    for (int k = 0; k < DSP_WRITE_KINDS; k++)
        BOTH(dsp_db_sql_write(b, t, k, 7, 100, rows, 2));
    BOTH(dsp_db_sql_write_result_param(b, t, 7, 100, &rows[0]));
    BOTH(dsp_db_sql_claim_lock(b, t, 100, "3,5", 3));
    BOTH(dsp_db_sql_claim_mark(b, t, 7, 100, "3,5", 3));
    BOTH(dsp_db_sql_release_ids(b, t, 7, 100, ids, 2));
    BOTH(dsp_db_sql_lock_free(b, t, 7, rows, NULL, 2));
    BOTH(dsp_db_sql_still_ours(b, t, 7, rows, NULL, 2));
    BOTH(dsp_db_sql_recover_ids(b, t, 6, 100, ids, 2, " AND task_type IN ('a')"));
    BOTH(dsp_db_sql_orphan_range(b, t, 0, 1000));
    BOTH(dsp_db_sql_orphan_select(b, t, &o, 0, 50, 100, NULL, 0));
    BOTH(dsp_db_sql_orphan_select(b, t, &o, 0, 0, 0, ids, 2));
    BOTH(dsp_db_sql_orphan_recover(b, t, &o, 100, ids, 2));
    BOTH(dsp_db_sql_claim_log_insert(b, t, 7, 1, "video", "3,5", 3));
    BOTH(dsp_db_sql_claim_log_delete(b, t, 7, ids, 2));
    BOTH(dsp_db_sql_claim_log_next(b, t, 7, NULL, 0, 0));
    BOTH(dsp_db_sql_claim_log_probe(b, t, 7, "video"));
    BOTH(dsp_db_sql_still_processing(b, t, 6, ids, 2));
    BOTH(dsp_db_sql_adopt(b, t, 7, 100, 3, 6, 1, NULL));
    BOTH(dsp_db_sql_adopted_row(b, t, 7, 3, 1));
    BOTH(dsp_db_sql_stats_counts(b, t, 100, NULL));
    BOTH(dsp_db_sql_stats_processing(b, t, ids, 2, NULL));
    BOTH(dsp_db_sql_stats_successful(b, t, 1000, NULL));
    BOTH(dsp_db_sql_stats_oldest_part(b, t, true, "a", 1, 2, 100, false));
    BOTH(dsp_db_sql_stats_oldest_part(b, t, true, "a", 1, 2, 100, true));
    BOTH(dsp_db_sql_retention(b, t, 2, false, 100, 1000, NULL));
    BOTH(dsp_db_sql_retention(b, t, 2, true, 100, 1000, NULL));
    BOTH(dsp_db_sql_requeue_failed(b, t, "a", 100, 1000, NULL));
    BOTH(dsp_db_sql_task_show(b, t, 3, NULL));
    BOTH(dsp_db_sql_task_state(b, t, 3, NULL));
    BOTH(dsp_db_sql_failed_next_type(b, t, 0, "a", 1, NULL));
    BOTH(dsp_db_sql_failed_part(b, t, true, "a", 1, 20, 1000, NULL));
    BOTH(dsp_db_sql_retry_failed_since(b, t, "a", 1, 1000, 2000, 50, NULL));
    BOTH(dsp_db_sql_task_retry(b, t, 3, 100, NULL));
    BOTH(dsp_db_sql_task_cancel(b, t, 3, 100, NULL));
    BOTH(dsp_db_sql_task_cancel_orphan(b, t, 3, 7, 100, NULL));

    /* The shard named task keeps its name: only identifiers are the table's. */
    {
        dsp_strbuf b = {0};
        dsp_db_sql_claim_log_insert(&b, &jobs, 7, 1, "task", "3,5", 3);
        assert_string_equal(
            b.p,
            "INSERT INTO jobs_claim (epoch, seq, shard, task_ids) VALUES (7, 1, 'task', '3,5')");
        dsp_strbuf_reset(&b);
        dsp_db_sql_task_cancel_orphan(&b, &jobs, 3, 7, 100, NULL);
        assert_non_null(strstr(b.p, "UPDATE jobs SET"));
        assert_non_null(strstr(b.p, "(SELECT value FROM jobs_meta WHERE name = 'epoch')"));
        dsp_strbuf_free(&b);
    }

    /* The claim's builders. */
    assert_true(dsp_claim_sql_candidates(buf, sizeof buf, types, 2, 1000, 7, NULL, NULL, &jobs) >
                0);
    assert_int_equal(count_of(buf, " FROM jobs FORCE INDEX (claim_idx)"), 2);
    assert_int_equal(count_of(buf, " task "), 0);
    assert_true(dsp_claim_sql_candidates_after(buf, sizeof buf, types, 2, 1000, 7, prio, after,
                                               NULL, NULL, &jobs) > 0);
    assert_int_equal(count_of(buf, " FROM jobs FORCE INDEX (claim_idx)"), 2);
    assert_true(dsp_claim_sql_promote_in(buf, sizeof buf, 5, 10, NULL, &jobs) > 0);
    assert_string_equal(buf, "UPDATE jobs FORCE INDEX (delay_idx) SET `delayed` = 0"
                             " WHERE `delayed` = 1 AND run_after <= 5 LIMIT 10");
    assert_true(dsp_claim_sql_demote_in(buf, sizeof buf, 5, 10, NULL, &jobs) > 0);
    assert_string_equal(buf, "UPDATE jobs FORCE INDEX (delay_idx) SET `delayed` = 1"
                             " WHERE `delayed` = 0 AND task_state = 0 AND run_after > 5 LIMIT 10");
}

/* The longest name still fits the bound the claim's buffer is sized by. */
static void claim_bound_holds_longest_table(void **state)
{
    (void)state;
    dsp_table_names t;
    char name[DSP_TABLE_NAME_MAX + 1];
    const char *types[] = {"x"};
    uint8_t prio[] = {2};
    uint64_t after[] = {UINT64_MAX};
    size_t cap = dsp_claim_sql_select_bound(types, 1);
    char *buf = malloc(cap);

    memset(name, 'q', DSP_TABLE_NAME_MAX);
    name[DSP_TABLE_NAME_MAX] = '\0';
    assert_int_equal(dsp_table_names_init(&t, name), 0);
    assert_non_null(buf);
    assert_true(dsp_claim_sql_candidates_after(buf, cap, types, 1, INT64_MAX, UINT_MAX, prio, after,
                                               NULL, NULL, &t) > 0);
    free(buf);
}

/* The schema checks at start and in --migrate name the table: task's text as it was. */
static void schema_checks_name_the_table(void **state)
{
    (void)state;
    dsp_table_names jobs;
    dsp_strbuf b = {0};
    char v[DSP_SCHEMA_SQL_MAX];

    assert_int_equal(dsp_table_names_init(&jobs, "jobs"), 0);
    dsp_schema_exists_sql(&b, NULL);
    assert_string_equal(b.p, DSP_SCHEMA_TASK_EXISTS_SQL);
    dsp_strbuf_reset(&b);
    dsp_schema_exists_sql(&b, &jobs);
    assert_non_null(strstr(b.p, "table_name = 'jobs'"));
    assert_string_equal(dsp_schema_version_sql(v, NULL), DSP_CLAIM_SQL_SCHEMA_VERSION);
    assert_string_equal(dsp_schema_version_sql(v, &jobs),
                        "SELECT value FROM jobs_meta WHERE name = 'schema_version'");
    for (int w = DSP_SCHEMA_COLUMNS_EVERY_VERSION; w <= DSP_SCHEMA_INDEXES_CURRENT; w++) {
        dsp_strbuf_reset(&b);
        dsp_schema_missing_sql(&b, NULL, (enum dsp_schema_names)w);
        assert_non_null(strstr(b.p, "table_name = 'task')"));
        dsp_strbuf_reset(&b);
        dsp_schema_missing_sql(&b, &jobs, (enum dsp_schema_names)w);
        assert_non_null(strstr(b.p, "table_name = 'jobs')"));
    }
    char text[DSP_SCHEMA_FOREIGN_MAX];
    dsp_schema_foreign_text(text, sizeof text, &jobs, "refusing to start", "db", "task_type", "", false);
    assert_non_null(strstr(text, "the table jobs of database db"));
    assert_non_null(strstr(text, "jobs_meta has no schema_version"));
    dsp_schema_foreign_text(text, sizeof text, NULL, "refusing to start", "db", "task_type", "", false);
    assert_non_null(strstr(text, "the table task of database db"));
    assert_non_null(strstr(text, "taskpush_meta has no schema_version"));
    dsp_strbuf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strbuf_integers),
        cmocka_unit_test(claim_one_type),
        cmocka_unit_test(task_requests),
        cmocka_unit_test(claim_two_types),
        cmocka_unit_test(claim_candidates),
        cmocka_unit_test(claim_candidates_after),
        cmocka_unit_test(claim_hostile_types),
        cmocka_unit_test(claim_refuses_bad_arguments),
        cmocka_unit_test(claim_exact_buffer_size),
        cmocka_unit_test(claim_most_types_within_bound),
        cmocka_unit_test(claim_quote_hex),
        cmocka_unit_test(claim_sweeps),
        cmocka_unit_test(write_one_value_per_column),
        cmocka_unit_test(write_values_that_differ),
        cmocka_unit_test(write_refuses_nothing_and_bad_kinds),
        cmocka_unit_test(write_result_param),
        cmocka_unit_test(write_two_level_case),
        cmocka_unit_test(write_longest_batch_within_cost),
        cmocka_unit_test(claim_mark_and_release),
        cmocka_unit_test(lock_free_and_still_ours),
        cmocka_unit_test(claim_ids_parse),
        cmocka_unit_test(recover_and_stats),
        cmocka_unit_test(stats_oldest),
        cmocka_unit_test(retention_and_requeue),
        cmocka_unit_test(shard_type_filter),
        cmocka_unit_test(shard_parse),
        cmocka_unit_test(strbuf_grows_and_keeps_text),
        cmocka_unit_test(strbuf_oom_sticks),
        cmocka_unit_test(strbuf_hex),
        cmocka_unit_test(utf8_helpers),
        cmocka_unit_test(inventory_statements),
        cmocka_unit_test(table_names_valid),
        cmocka_unit_test(table_names_subst),
        cmocka_unit_test(table_names_constraints),
        cmocka_unit_test(table_constraints_listed),
        cmocka_unit_test(builders_name_the_table),
        cmocka_unit_test(claim_bound_holds_longest_table),
        cmocka_unit_test(schema_checks_name_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
