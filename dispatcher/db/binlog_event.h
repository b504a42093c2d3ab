/* binlog_event.h: the few binary log events the wake follower (db_binlog.c) reads, parsed
 * from their raw bytes: TABLE_MAP (which table a table id names, and its column types),
 * the ROWS events (the task_state and run_after of each row written), QUERY (BEGIN,
 * COMMIT, and an INSERT naming the task table under MIXED or STATEMENT format).
 *
 * Every byte comes from the server's binary log and is hostile: each count and length is
 * checked against the event's own size before use, and anything this file cannot read
 * (a type it does not know, a compressed event, a truncated image) gives -1, which the
 * follower turns into "wake at once" (a claim too many costs a statement; a task is never
 * lost, polling goes on). Pure code: no MySQL, no threads; tests/fuzz/fuzz_binlog.c runs
 * it on arbitrary bytes. Layouts: MariaDB's "Binary log event" pages and MySQL's
 * libbinlogevents (rows_event.h, table_map's metadata); integers are little-endian.
 */
#ifndef TASKPUSH_DSP_BINLOG_EVENT_H
#define TASKPUSH_DSP_BINLOG_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_BINLOG_HEADER_LEN 19u  /* the common header of every event (v4 format) */
#define DSP_BINLOG_NAME_MAX 64u    /* longest database or table name (identifier limit) */
#define DSP_BINLOG_COLS_MAX 64u    /* most columns of the task table read; the schema has 18 */
#define DSP_BINLOG_DUE_NONE INT64_MAX

/* Event types used here (the server's log_event.h numbers). */
enum {
    DSP_BINLOG_QUERY = 2,
    DSP_BINLOG_ROTATE = 4,
    DSP_BINLOG_XID = 16,
    DSP_BINLOG_TABLE_MAP = 19,
    DSP_BINLOG_WRITE_ROWS_V1 = 23,
    DSP_BINLOG_UPDATE_ROWS_V1 = 24,
    DSP_BINLOG_DELETE_ROWS_V1 = 25,
    DSP_BINLOG_HEARTBEAT = 27,
    DSP_BINLOG_WRITE_ROWS = 30,
    DSP_BINLOG_UPDATE_ROWS = 31,
    DSP_BINLOG_DELETE_ROWS = 32,
    DSP_BINLOG_PARTIAL_UPDATE_ROWS = 39, /* MySQL's partial JSON updates */
    DSP_BINLOG_QUERY_COMPRESSED = 165,   /* MariaDB's log_bin_compress */
    DSP_BINLOG_WRITE_ROWS_COMPRESSED_V1 = 166,
    DSP_BINLOG_UPDATE_ROWS_COMPRESSED_V1 = 167,
    DSP_BINLOG_DELETE_ROWS_COMPRESSED_V1 = 168,
    DSP_BINLOG_WRITE_ROWS_COMPRESSED = 169,
    DSP_BINLOG_UPDATE_ROWS_COMPRESSED = 170,
    DSP_BINLOG_DELETE_ROWS_COMPRESSED = 171,
};

/* The common header. */
typedef struct dsp_binlog_header {
    uint32_t timestamp;
    uint8_t type;
    uint32_t server_id;
    uint32_t event_size; /* header, body and checksum */
    uint32_t log_pos;
    uint16_t flags;
} dsp_binlog_header;

/* What a TABLE_MAP event says. Column types are kept only up to DSP_BINLOG_COLS_MAX
 * (cols_known false beyond): enough for taskpush's table. */
typedef struct dsp_binlog_table {
    uint64_t table_id;
    char db[DSP_BINLOG_NAME_MAX + 1];
    char table[DSP_BINLOG_NAME_MAX + 1];
    uint32_t ncols;
    bool cols_known;
    uint8_t types[DSP_BINLOG_COLS_MAX];
    uint16_t meta[DSP_BINLOG_COLS_MAX];
} dsp_binlog_table;

/* The task table's columns the follower reads (0-based, from information_schema). */
typedef struct dsp_binlog_task_cols {
    uint32_t ncols;      /* the table's column count: a map with another count is not read */
    uint32_t state;      /* task_state */
    uint32_t run_after;  /* run_after */
} dsp_binlog_task_cols;

/* What the rows of one ROWS event mean for the claim. */
typedef struct dsp_binlog_rows {
    uint32_t rows;       /* row images read (an UPDATE's pair counts once) */
    uint32_t new_rows;   /* rows now NEW: inserted, or updated to NEW */
    int64_t earliest_due; /* least run_after of those (ms since 1970), DSP_BINLOG_DUE_NONE */
} dsp_binlog_rows;

enum dsp_binlog_query_kind {
    DSP_BINLOG_Q_OTHER = 0,
    DSP_BINLOG_Q_BEGIN,
    DSP_BINLOG_Q_COMMIT,
    DSP_BINLOG_Q_TASK_WRITE, /* INSERT or REPLACE naming the task table */
};

/* Reads the common header of ev[0..len); 0, or -1 when len is too short or event_size
 * disagrees with len. */
int dsp_binlog_header_parse(const uint8_t *ev, size_t len, dsp_binlog_header *h);

/* Parses a TABLE_MAP body (after the common header, before the checksum). 0 or -1. */
int dsp_binlog_table_map_parse(const uint8_t *body, size_t len, dsp_binlog_table *t);

/* The table id of a ROWS event body; 0 or -1. */
int dsp_binlog_rows_table_id(const uint8_t *body, size_t len, uint64_t *table_id);

/* Reads every row of a WRITE or UPDATE ROWS body (type: the event type, v1 or v2) of the
 * table t maps, with the task table's columns cols. DELETE events give no new rows.
 * 0, or -1 when the event cannot be read (compressed, a column type this file does not
 * know, a map that is not the task table's shape, truncated): the caller wakes at once. */
int dsp_binlog_rows_scan(uint8_t type, const uint8_t *body, size_t len, const dsp_binlog_table *t,
                         const dsp_binlog_task_cols *cols, dsp_binlog_rows *out);

/* Classifies a QUERY body: BEGIN, COMMIT, an INSERT/REPLACE naming table (a whole word,
 * case-insensitive, maybe `quoted` or db.table), or other. Malformed: OTHER. */
int dsp_binlog_query_kind(const uint8_t *body, size_t len, const char *table);

/* True for the ROWS event types (v1, v2, compressed, partial). */
bool dsp_binlog_is_rows(uint8_t type);

#endif
