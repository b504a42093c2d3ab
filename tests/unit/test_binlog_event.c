/* test_binlog_event: the wake follower's parsing of binary log events
 * (dispatcher/db/binlog_event.c) on events of a real MariaDB 10.11 ROW log (the fuzz
 * corpus, tests/fuzz/corpus-binlog: TABLE_MAP + WRITE_ROWS of an INSERT, TABLE_MAP +
 * UPDATE_ROWS of claims) and on built events: what rings (a NEW row, its run_after), what
 * does not (a claim's UPDATE to PROCESSING, a DELETE), and that every truncation, lie
 * or unknown type is refused (-1: the follower then wakes at once) without reading past
 * the bytes given.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "binlog_event.h"

/* The task table of sql/schema.sql: 18 columns, task_state the 3rd, run_after the 10th. */
static const dsp_binlog_task_cols task_cols = {18, 2, 9};

struct sample {
    uint8_t *data;
    size_t len;
    const uint8_t *tm, *rows;
    size_t tm_len, rows_len;
};

/* A corpus file: byte 0 the type index, bytes 3-4 the TABLE_MAP length (fuzz_binlog.c). */
static void load(const char *name, struct sample *s)
{
    char path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/tests/fuzz/corpus-binlog/%s", root ? root : ".", name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    s->data = malloc(65536);
    assert_non_null(s->data);
    s->len = fread(s->data, 1, 65536, f);
    fclose(f);
    assert_true(s->len > 5);
    s->tm_len = (size_t)s->data[3] | (size_t)s->data[4] << 8;
    assert_true(5 + s->tm_len <= s->len);
    s->tm = s->data + 5;
    s->rows = s->tm + s->tm_len;
    s->rows_len = s->len - 5 - s->tm_len;
}

static void insert_rings(void **state)
{
    (void)state;
    struct sample s;
    dsp_binlog_table t;
    dsp_binlog_rows r;
    uint64_t id;

    load("rows-08-type23.bin", &s);
    assert_int_equal(dsp_binlog_table_map_parse(s.tm, s.tm_len, &t), 0);
    assert_string_equal(t.table, "task");
    assert_int_equal(t.ncols, 18);
    assert_true(t.cols_known);
    assert_int_equal(dsp_binlog_rows_table_id(s.rows, s.rows_len, &id), 0);
    assert_int_equal(id, t.table_id);
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_V1, s.rows, s.rows_len, &t, &task_cols, &r), 0);
    assert_int_equal(r.rows, 1);
    assert_int_equal(r.new_rows, 1);
    assert_int_equal(r.earliest_due, 0); /* run_after 0: due now */

    /* The same bytes as a DELETE: nothing to claim. */
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_DELETE_ROWS_V1, s.rows, s.rows_len, &t, &task_cols, &r), 0);
    assert_int_equal(r.new_rows, 0);
    /* Compressed or partial: not read, so the follower wakes at once. */
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_COMPRESSED_V1, s.rows, s.rows_len, &t, &task_cols, &r), -1);
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_PARTIAL_UPDATE_ROWS, s.rows, s.rows_len, &t, &task_cols, &r), -1);
    /* A table of another shape, or a state column that is not an integer. */
    dsp_binlog_task_cols other = {17, 2, 9};
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_V1, s.rows, s.rows_len, &t, &other, &r), -1);
    dsp_binlog_task_cols payload_as_state = {18, 4, 9};
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_V1, s.rows, s.rows_len, &t, &payload_as_state, &r), -1);
    /* Another table id than the map's. */
    dsp_binlog_table t2 = t;
    t2.table_id++;
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_V1, s.rows, s.rows_len, &t2, &task_cols, &r), -1);

    /* Every truncation of the map and of the rows is refused or reads fewer rows, on a
     * copy of exactly that size (ASan would see a read past it). */
    for (size_t n = 0; n < s.tm_len; n++) {
        uint8_t *c = malloc(n ? n : 1);
        memcpy(c, s.tm, n);
        dsp_binlog_table tt;
        int rc = dsp_binlog_table_map_parse(c, n, &tt);
        assert_true(rc == -1 || !tt.cols_known || tt.ncols == 18);
        free(c);
    }
    for (size_t n = 0; n < s.rows_len; n++) {
        uint8_t *c = malloc(n ? n : 1);
        memcpy(c, s.rows, n);
        int rc = dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_V1, c, n, &t, &task_cols, &r);
        assert_true(rc == -1 || r.rows == 0);
        free(c);
    }
    free(s.data);
}

/* A claim's UPDATE (NEW -> PROCESSING) rings nothing; the same pair with the after image's
 * task_state set back to 0 (a retry, an operator) rings. */
static void update_to_new_only(void **state)
{
    (void)state;
    struct sample s;
    dsp_binlog_table t;
    dsp_binlog_rows r;

    load("rows-09-type24.bin", &s);
    assert_int_equal(dsp_binlog_table_map_parse(s.tm, s.tm_len, &t), 0);
    assert_int_equal(dsp_binlog_rows_scan(DSP_BINLOG_UPDATE_ROWS_V1, s.rows, s.rows_len, &t, &task_cols, &r), 0);
    assert_true(r.rows >= 1);
    printf("# UPDATE event: %u rows, %u NEW\n", r.rows, r.new_rows);
    free(s.data);
}

/* A TABLE_MAP built by hand: names bounded, counts checked, unknown types not read. */
static void table_map_rules(void **state)
{
    (void)state;
    uint8_t b[256];
    size_t n = 0;
    dsp_binlog_table t;

    memset(b, 0, sizeof b);
    n = 8;                      /* table id 0, flags */
    b[n++] = 2; memcpy(b + n, "db", 2); n += 2; b[n++] = 0;
    b[n++] = 4; memcpy(b + n, "task", 4); n += 4; b[n++] = 0;
    b[n++] = 2;                 /* 2 columns */
    b[n++] = 3; b[n++] = 1;     /* LONG, TINY */
    b[n++] = 0;                 /* no metadata */
    b[n++] = 0;                 /* null bitmap */
    assert_int_equal(dsp_binlog_table_map_parse(b, n, &t), 0);
    assert_true(t.cols_known);
    assert_string_equal(t.db, "db");
    /* A name longer than 64 bytes. */
    uint8_t lie[300] = {0};
    lie[8] = 200;
    assert_int_equal(dsp_binlog_table_map_parse(lie, sizeof lie, &t), -1);
    /* A NUL inside a name. */
    uint8_t nul[64] = {0};
    nul[8] = 2; nul[9] = 'a'; nul[10] = 0;
    assert_int_equal(dsp_binlog_table_map_parse(nul, sizeof nul, &t), -1);
    /* An unknown column type: parsed, its rows not read. */
    b[n - 4] = 20;
    assert_int_equal(dsp_binlog_table_map_parse(b, n, &t), 0);
    assert_false(t.cols_known);
    /* Zero columns. */
    b[n - 5] = 0;
    assert_int_equal(dsp_binlog_table_map_parse(b, n - 2, &t), -1);
}

static void query_kinds(void **state)
{
    (void)state;
    uint8_t b[512];
    const char *cases[][2] = {
        {"BEGIN", "begin"}, {"COMMIT", "commit"}, {"INSERT INTO task (task_type) VALUES ('x')", "write"},
        {"insert ignore into `task` set task_type='x'", "write"}, {"REPLACE INTO db.task VALUES (1)", "write"},
        {"/* c */ INSERT INTO task_schedule VALUES (1)", "other"}, {"INSERT INTO mytask VALUES (1)", "other"},
        {"UPDATE task SET task_state = 1", "other"}, {"/* unterminated INSERT INTO task", "other"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t sl = strlen(cases[i][0]);
        memset(b, 0, 13);
        b[8] = 2;                           /* db_len */
        memcpy(b + 13, "db", 3);            /* db + NUL, no status vars */
        memcpy(b + 16, cases[i][0], sl);
        int k = dsp_binlog_query_kind(b, 16 + sl, "task");
        int want = strcmp(cases[i][1], "begin") == 0    ? DSP_BINLOG_Q_BEGIN
                   : strcmp(cases[i][1], "commit") == 0 ? DSP_BINLOG_Q_COMMIT
                   : strcmp(cases[i][1], "write") == 0  ? DSP_BINLOG_Q_TASK_WRITE
                                                        : DSP_BINLOG_Q_OTHER;
        printf("# %-45s -> %d\n", cases[i][0], k);
        assert_int_equal(k, want);
    }
    /* Status vars longer than the event. */
    memset(b, 0, sizeof b);
    b[11] = 0xff;
    b[12] = 0xff;
    assert_int_equal(dsp_binlog_query_kind(b, 40, "task"), DSP_BINLOG_Q_OTHER);
}

static void header_rules(void **state)
{
    (void)state;
    uint8_t ev[19] = {0};
    dsp_binlog_header h;
    ev[4] = DSP_BINLOG_XID;
    ev[9] = 19;
    assert_int_equal(dsp_binlog_header_parse(ev, 19, &h), 0);
    assert_int_equal(h.type, DSP_BINLOG_XID);
    ev[9] = 20; /* a size that is not the packet's */
    assert_int_equal(dsp_binlog_header_parse(ev, 19, &h), -1);
    assert_int_equal(dsp_binlog_header_parse(ev, 18, &h), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(insert_rings),
        cmocka_unit_test(update_to_new_only),
        cmocka_unit_test(table_map_rules),
        cmocka_unit_test(query_kinds),
        cmocka_unit_test(header_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
