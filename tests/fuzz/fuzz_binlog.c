/* fuzz_binlog.c: libFuzzer target of the binary log parsing of the wake follower
 * (dispatcher/db/binlog_event.c): every byte from the binary log is hostile.
 *
 * The input: byte 0 picks the ROWS event type, bytes 1 and 2 the columns read as
 * task_state and run_after, bytes 3-4 (little-endian) the length L of a TABLE_MAP body
 * that follows, and the rest is a ROWS body of that table. The whole input is also read
 * as an event (common header) and as a QUERY body. Any broken promise calls abort():
 *  - a parsed header says the size it was given;
 *  - a parsed TABLE_MAP has NUL-terminated names of at most 64 bytes and a column count
 *    within 1..4096, its types known only up to DSP_BINLOG_COLS_MAX;
 *  - a scan counts no more NEW rows than rows, and has an earliest due exactly when it
 *    found a NEW row;
 *  - no read outside the input (ASan, and the replayer's copies of exact size).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binlog_event.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(cond) ((cond) ? (void)0 : fail(__LINE__, #cond))

__attribute__((noreturn)) static void fail(int line, const char *what)
{
    fprintf(stderr, "fuzz_binlog.c:%d: check failed: %s\n", line, what);
    abort();
}

static const uint8_t rows_types[] = {
    DSP_BINLOG_WRITE_ROWS_V1, DSP_BINLOG_UPDATE_ROWS_V1, DSP_BINLOG_DELETE_ROWS_V1,
    DSP_BINLOG_WRITE_ROWS, DSP_BINLOG_UPDATE_ROWS, DSP_BINLOG_DELETE_ROWS,
    DSP_BINLOG_PARTIAL_UPDATE_ROWS, DSP_BINLOG_WRITE_ROWS_COMPRESSED_V1,
    DSP_BINLOG_UPDATE_ROWS_COMPRESSED,
};

/* A copy of exactly n bytes, so that a read past the end is caught by ASan. */
static uint8_t *dup_exact(const uint8_t *p, size_t n)
{
    uint8_t *c = calloc(1, n ? n : 1);
    if (c == NULL)
        fail(__LINE__, "out of memory");
    if (n)
        memcpy(c, p, n);
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsp_binlog_header h = {0};
    uint8_t *all = dup_exact(data, size);

    if (dsp_binlog_header_parse(all, size, &h) == 0)
        check(h.event_size == size && size >= DSP_BINLOG_HEADER_LEN);
    int q = dsp_binlog_query_kind(all, size, "task");
    check(q >= DSP_BINLOG_Q_OTHER && q <= DSP_BINLOG_Q_TASK_WRITE);
    free(all);
    if (size < 5)
        return 0;

    uint8_t type = rows_types[data[0] % sizeof rows_types];
    size_t tl = (size_t)data[3] | (size_t)data[4] << 8;
    if (tl > size - 5)
        tl = size - 5;
    uint8_t *tm = dup_exact(data + 5, tl);
    size_t rl = size - 5 - tl;
    uint8_t *rows = dup_exact(data + 5 + tl, rl);
    dsp_binlog_table t = {0};

    if (dsp_binlog_table_map_parse(tm, tl, &t) == 0) {
        check(strlen(t.db) <= DSP_BINLOG_NAME_MAX && strlen(t.table) <= DSP_BINLOG_NAME_MAX);
        check(t.ncols >= 1 && t.ncols <= 4096);
        check(!t.cols_known || t.ncols <= DSP_BINLOG_COLS_MAX);
        dsp_binlog_task_cols cols = {t.ncols, data[1] % t.ncols, data[2] % t.ncols};
        dsp_binlog_rows r = {0};
        uint64_t id = 0;
        if (dsp_binlog_rows_table_id(rows, rl, &id) == 0)
            check(rl >= 6);
        if (dsp_binlog_rows_scan(type, rows, rl, &t, &cols, &r) == 0) {
            check(r.new_rows <= r.rows);
            check((r.new_rows == 0) == (r.earliest_due == DSP_BINLOG_DUE_NONE));
        }
        /* A map that is not the columns' shape is refused. */
        dsp_binlog_task_cols wrong = {t.ncols + 1, 0, 0};
        check(dsp_binlog_rows_scan(DSP_BINLOG_WRITE_ROWS_V1, rows, rl, &t, &wrong, &r) < 0);
    }
    free(tm);
    free(rows);
    return 0;
}
