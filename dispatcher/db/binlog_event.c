/* binlog_event: see binlog_event.h. Every read goes through struct rd, whose cursor never
 * passes its end: a short or lying event fails the parse, it never reads out of bounds. */
#include "binlog_event.h"

#include <ctype.h>
#include <string.h>

/* Column types (the server's enum_field_types). */
enum {
    T_DECIMAL = 0, T_TINY = 1, T_SHORT = 2, T_LONG = 3, T_FLOAT = 4, T_DOUBLE = 5, T_NULL = 6,
    T_TIMESTAMP = 7, T_LONGLONG = 8, T_INT24 = 9, T_DATE = 10, T_TIME = 11, T_DATETIME = 12,
    T_YEAR = 13, T_NEWDATE = 14, T_VARCHAR = 15, T_BIT = 16, T_TIMESTAMP2 = 17,
    T_DATETIME2 = 18, T_TIME2 = 19, T_JSON = 245, T_NEWDECIMAL = 246, T_ENUM = 247, T_SET = 248,
    T_TINY_BLOB = 249, T_MEDIUM_BLOB = 250, T_LONG_BLOB = 251, T_BLOB = 252,
    T_VAR_STRING = 253, T_STRING = 254, T_GEOMETRY = 255,
};

/* The statement text searched for the table's name: it follows INSERT INTO at once, so
 * a long VALUES list is never scanned. */
#define QUERY_SCAN_MAX 512u

struct rd {
    const uint8_t *p;
    size_t left;
};

static int take(struct rd *r, size_t n, const uint8_t **out)
{
    if (n > r->left)
        return -1;
    if (out)
        *out = r->p;
    r->p += n;
    r->left -= n;
    return 0;
}

static int uint_le(struct rd *r, size_t n, uint64_t *v)
{
    const uint8_t *b;
    if (n > 8 || take(r, n, &b) < 0)
        return -1;
    *v = 0;
    for (size_t i = 0; i < n; i++)
        *v |= (uint64_t)b[i] << (8 * i);
    return 0;
}

/* A length-encoded integer; 251 (NULL) is not valid where counts are expected. */
static int packed(struct rd *r, uint64_t *v)
{
    uint64_t first;
    if (uint_le(r, 1, &first) < 0)
        return -1;
    if (first < 251) {
        *v = first;
        return 0;
    }
    if (first == 252)
        return uint_le(r, 2, v);
    if (first == 253)
        return uint_le(r, 3, v);
    if (first == 254)
        return uint_le(r, 8, v);
    return -1;
}

int dsp_binlog_header_parse(const uint8_t *ev, size_t len, dsp_binlog_header *h)
{
    struct rd r = {ev, len};
    uint64_t v[6];
    static const size_t w[6] = {4, 1, 4, 4, 4, 2};

    if (ev == NULL || len < DSP_BINLOG_HEADER_LEN)
        return -1;
    for (int i = 0; i < 6; i++)
        if (uint_le(&r, w[i], &v[i]) < 0)
            return -1;
    h->timestamp = (uint32_t)v[0];
    h->type = (uint8_t)v[1];
    h->server_id = (uint32_t)v[2];
    h->event_size = (uint32_t)v[3];
    h->log_pos = (uint32_t)v[4];
    h->flags = (uint16_t)v[5];
    return h->event_size == len ? 0 : -1;
}

/* Metadata bytes a column type carries in TABLE_MAP; -1 for a type not read here. */
static int meta_len(uint8_t type)
{
    switch (type) {
    case T_FLOAT: case T_DOUBLE: case T_TINY_BLOB: case T_MEDIUM_BLOB: case T_LONG_BLOB:
    case T_BLOB: case T_GEOMETRY: case T_JSON: case T_TIMESTAMP2: case T_DATETIME2: case T_TIME2:
        return 1;
    case T_VARCHAR: case T_VAR_STRING: case T_BIT: case T_NEWDECIMAL: case T_STRING: case T_ENUM:
    case T_SET:
        return 2;
    case T_TINY: case T_SHORT: case T_LONG: case T_NULL: case T_TIMESTAMP: case T_LONGLONG:
    case T_INT24: case T_DATE: case T_TIME: case T_DATETIME: case T_YEAR: case T_NEWDATE:
        return 0;
    default:
        return -1; /* DECIMAL (pre-5.0), MariaDB's compressed columns, MySQL's arrays */
    }
}

int dsp_binlog_table_map_parse(const uint8_t *body, size_t len, dsp_binlog_table *t)
{
    struct rd r = {body, len};
    uint64_t id, flags, n, ncols, mlen;
    const uint8_t *s, *types, *meta;

    memset(t, 0, sizeof *t);
    if (body == NULL || uint_le(&r, 6, &id) < 0 || uint_le(&r, 2, &flags) < 0)
        return -1;
    t->table_id = id;
    /* Database and table: a length byte, the name, a NUL. */
    for (int i = 0; i < 2; i++) {
        char *dst = i == 0 ? t->db : t->table;
        if (uint_le(&r, 1, &n) < 0 || n > DSP_BINLOG_NAME_MAX || take(&r, n, &s) < 0 ||
            take(&r, 1, NULL) < 0)
            return -1;
        memcpy(dst, s, n);
        dst[n] = '\0';
        if (memchr(dst, '\0', n) != NULL)
            return -1;
    }
    if (packed(&r, &ncols) < 0 || ncols == 0 || ncols > 4096 || take(&r, ncols, &types) < 0)
        return -1;
    t->ncols = (uint32_t)ncols;
    if (packed(&r, &mlen) < 0 || take(&r, mlen, &meta) < 0)
        return -1;
    if (ncols > DSP_BINLOG_COLS_MAX)
        return 0; /* not the task table's shape: its rows are not read */
    size_t m = 0;
    for (size_t i = 0; i < ncols; i++) {
        int ml = meta_len(types[i]);
        t->types[i] = types[i];
        if (ml < 0 || m + (size_t)ml > mlen)
            return 0; /* types unknown: cols_known stays false */
        if (ml == 1)
            t->meta[i] = meta[m];
        else if (ml == 2 && (types[i] == T_VARCHAR || types[i] == T_VAR_STRING))
            t->meta[i] = (uint16_t)(meta[m] | meta[m + 1] << 8); /* the maximum length */
        else if (ml == 2)
            t->meta[i] = (uint16_t)(meta[m] << 8 | meta[m + 1]);
        m += (size_t)ml;
    }
    t->cols_known = true;
    return 0;
}

bool dsp_binlog_is_rows(uint8_t type)
{
    return (type >= DSP_BINLOG_WRITE_ROWS_V1 && type <= DSP_BINLOG_DELETE_ROWS_V1) ||
           (type >= DSP_BINLOG_WRITE_ROWS && type <= DSP_BINLOG_DELETE_ROWS) ||
           type == DSP_BINLOG_PARTIAL_UPDATE_ROWS ||
           (type >= DSP_BINLOG_WRITE_ROWS_COMPRESSED_V1 && type <= DSP_BINLOG_DELETE_ROWS_COMPRESSED);
}

int dsp_binlog_rows_table_id(const uint8_t *body, size_t len, uint64_t *table_id)
{
    struct rd r = {body, len};
    return body == NULL ? -1 : uint_le(&r, 6, table_id);
}

/* Skips one value of column i; an integer column's value goes to *ival (ok set). */
static int value_skip(struct rd *r, uint8_t type, uint16_t meta, int64_t *ival, bool *is_int)
{
    static const uint8_t dig2bytes[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
    uint64_t v, n;
    size_t size;

    *is_int = false;
    switch (type) {
    case T_TINY: case T_SHORT: case T_INT24: case T_LONG: case T_LONGLONG:
        size = type == T_TINY ? 1 : type == T_SHORT ? 2 : type == T_INT24 ? 3 : type == T_LONG ? 4 : 8;
        if (uint_le(r, size, &v) < 0)
            return -1;
        if (size < 8 && (v >> (8 * size - 1)) & 1) /* sign-extend */
            v |= ~(uint64_t)0 << (8 * size);
        *ival = (int64_t)v;
        *is_int = true;
        return 0;
    case T_NULL:
        return 0;
    case T_YEAR:
        return take(r, 1, NULL);
    case T_FLOAT: case T_TIMESTAMP:
        return take(r, 4, NULL);
    case T_DOUBLE: case T_DATETIME:
        return take(r, 8, NULL);
    case T_DATE: case T_NEWDATE: case T_TIME:
        return take(r, 3, NULL);
    case T_TIMESTAMP2: case T_DATETIME2: case T_TIME2:
        if (meta > 6)
            return -1;
        size = (type == T_TIMESTAMP2 ? 4 : type == T_DATETIME2 ? 5 : 3) + (meta + 1u) / 2;
        return take(r, size, NULL);
    case T_VARCHAR: case T_VAR_STRING:
        if (uint_le(r, meta > 255 ? 2 : 1, &n) < 0)
            return -1;
        return take(r, n, NULL);
    case T_TINY_BLOB: case T_MEDIUM_BLOB: case T_LONG_BLOB: case T_BLOB: case T_GEOMETRY: case T_JSON:
        if (meta < 1 || meta > 4 || uint_le(r, meta, &n) < 0)
            return -1;
        return take(r, n, NULL);
    case T_BIT:
        return take(r, (meta & 0xff) + ((meta >> 8) ? 1u : 0u), NULL);
    case T_NEWDECIMAL: {
        unsigned prec = meta >> 8, scale = meta & 0xff;
        if (prec == 0 || prec > 65 || scale > 30 || scale > prec)
            return -1;
        unsigned intg = prec - scale;
        size = (intg / 9) * 4 + dig2bytes[intg % 9] + (scale / 9) * 4 + dig2bytes[scale % 9];
        return take(r, size, NULL);
    }
    case T_ENUM: case T_SET:
        return take(r, meta & 0xff, NULL);
    case T_STRING: {
        unsigned b0 = meta >> 8, b1 = meta & 0xff, real, max_len;
        if ((b0 & 0x30) != 0x30) { /* CHAR longer than 255: two bits of the length here */
            max_len = b1 | (((b0 & 0x30) ^ 0x30) << 4);
            real = b0 | 0x30;
        } else {
            max_len = b1;
            real = b0;
        }
        if (real == T_ENUM || real == T_SET)
            return take(r, b1, NULL);
        if (uint_le(r, max_len > 255 ? 2 : 1, &n) < 0)
            return -1;
        return take(r, n, NULL);
    }
    default:
        return -1;
    }
}

static bool bit_set(const uint8_t *bits, size_t i)
{
    return (bits[i / 8] >> (i % 8)) & 1;
}

/* Reads one row image over the present columns; *state and *run_after are set when
 * present and not NULL (have_* say). */
static int image_read(struct rd *r, const dsp_binlog_table *t, const uint8_t *present,
                      size_t npresent, const dsp_binlog_task_cols *cols, bool *have_state,
                      int64_t *state, bool *have_run_after, int64_t *run_after)
{
    const uint8_t *nulls;
    size_t k = 0;

    *have_state = *have_run_after = false;
    if (take(r, (npresent + 7) / 8, &nulls) < 0)
        return -1;
    for (size_t i = 0; i < t->ncols; i++) {
        int64_t v = 0;
        bool is_int;
        if (!bit_set(present, i))
            continue;
        if (bit_set(nulls, k++))
            continue;
        if (value_skip(r, t->types[i], t->meta[i], &v, &is_int) < 0)
            return -1;
        if (i == cols->state || i == cols->run_after) {
            if (!is_int)
                return -1; /* not taskpush's table after all */
            if (i == cols->state) {
                *have_state = true;
                *state = v;
            } else {
                *have_run_after = true;
                *run_after = v;
            }
        }
    }
    return 0;
}

static size_t popcount(const uint8_t *bits, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += bit_set(bits, i);
    return c;
}

int dsp_binlog_rows_scan(uint8_t type, const uint8_t *body, size_t len, const dsp_binlog_table *t,
                         const dsp_binlog_task_cols *cols, dsp_binlog_rows *out)
{
    struct rd r = {body, len};
    uint64_t id, flags, extra, ncols;
    const uint8_t *present, *present_after;
    bool update = type == DSP_BINLOG_UPDATE_ROWS_V1 || type == DSP_BINLOG_UPDATE_ROWS;
    bool v2 = type >= DSP_BINLOG_WRITE_ROWS && type <= DSP_BINLOG_DELETE_ROWS;

    memset(out, 0, sizeof *out);
    out->earliest_due = DSP_BINLOG_DUE_NONE;
    if (type == DSP_BINLOG_DELETE_ROWS_V1 || type == DSP_BINLOG_DELETE_ROWS ||
        type == DSP_BINLOG_DELETE_ROWS_COMPRESSED_V1 || type == DSP_BINLOG_DELETE_ROWS_COMPRESSED)
        return 0; /* a deleted row is nothing to claim */
    if (!update && type != DSP_BINLOG_WRITE_ROWS_V1 && type != DSP_BINLOG_WRITE_ROWS)
        return -1; /* compressed or partial: not read */
    if (body == NULL || t == NULL || cols == NULL || !t->cols_known || t->ncols != cols->ncols ||
        cols->state >= t->ncols || cols->run_after >= t->ncols)
        return -1;
    if (uint_le(&r, 6, &id) < 0 || id != t->table_id || uint_le(&r, 2, &flags) < 0)
        return -1;
    if (v2 && (uint_le(&r, 2, &extra) < 0 || extra < 2 || take(&r, extra - 2, NULL) < 0))
        return -1;
    if (packed(&r, &ncols) < 0 || ncols != t->ncols)
        return -1;
    if (take(&r, (ncols + 7) / 8, &present) < 0)
        return -1;
    present_after = present;
    if (update && take(&r, (ncols + 7) / 8, &present_after) < 0)
        return -1;
    size_t np = popcount(present, ncols), npa = popcount(present_after, ncols);

    /* Each image takes at least its null bitmap's byte (ncols >= 1), so the loop ends
     * within len iterations. */
    while (r.left > 0) {
        bool hs, hr;
        int64_t st = -1, ra = 0;
        if (update && image_read(&r, t, present, np, cols, &hs, &st, &hr, &ra) < 0)
            return -1; /* the before image: read past */
        if (image_read(&r, t, present_after, npa, cols, &hs, &st, &hr, &ra) < 0)
            return -1;
        if (np == 0 && npa == 0)
            return -1; /* no columns at all: nothing bounds the loop */
        out->rows++;
        if (!hs)
            return -1; /* task_state not logged (binlog_row_image MINIMAL): wake at once */
        if (st != 0)
            continue;
        out->new_rows++;
        int64_t due = hr && ra > 0 ? ra : 0;
        if (due < out->earliest_due)
            out->earliest_due = due;
    }
    return 0;
}

/* Skips spaces and C-style comments (a client may prefix a statement with one). */
static size_t skip_blank(const char *s, size_t n, size_t i)
{
    for (;;) {
        while (i < n && isspace((unsigned char)s[i]))
            i++;
        if (i + 1 < n && s[i] == '/' && s[i + 1] == '*') {
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (s[j] == '*' && s[j + 1] == '/') {
                    end = s + j;
                    break;
                }
            if (end == NULL)
                return n;
            i = (size_t)(end - s) + 2;
            continue;
        }
        return i;
    }
}

static bool word_is(const char *s, size_t n, size_t i, const char *w)
{
    size_t l = strlen(w);
    if (i + l > n || strncasecmp(s + i, w, l) != 0)
        return false;
    return i + l == n || !(isalnum((unsigned char)s[i + l]) || s[i + l] == '_' || s[i + l] == '$');
}

static bool ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '$';
}

int dsp_binlog_query_kind(const uint8_t *body, size_t len, const char *table)
{
    struct rd r = {body, len};
    uint64_t thread_id, exec_time, dblen, err, status_len;
    const uint8_t *stmt;

    if (body == NULL || uint_le(&r, 4, &thread_id) < 0 || uint_le(&r, 4, &exec_time) < 0 ||
        uint_le(&r, 1, &dblen) < 0 || uint_le(&r, 2, &err) < 0 || uint_le(&r, 2, &status_len) < 0 ||
        take(&r, status_len, NULL) < 0 || take(&r, dblen + 1, NULL) < 0)
        return DSP_BINLOG_Q_OTHER;
    stmt = r.p;
    const char *s = (const char *)stmt;
    size_t n = r.left < QUERY_SCAN_MAX ? r.left : QUERY_SCAN_MAX;
    size_t i = skip_blank(s, n, 0);

    if (word_is(s, n, i, "BEGIN"))
        return DSP_BINLOG_Q_BEGIN;
    if (word_is(s, n, i, "COMMIT"))
        return DSP_BINLOG_Q_COMMIT;
    if (!word_is(s, n, i, "INSERT") && !word_is(s, n, i, "REPLACE"))
        return DSP_BINLOG_Q_OTHER;
    size_t tl = table ? strlen(table) : 0;
    if (tl == 0)
        return DSP_BINLOG_Q_OTHER;
    /* The table's name as a whole identifier: `task`, task, db.task, `db`.`task`. */
    for (size_t j = i; j + tl <= n; j++) {
        if (strncasecmp(s + j, table, tl) != 0)
            continue;
        bool before_ok = j == 0 || !ident_char(s[j - 1]);
        bool after_ok = j + tl == n || !ident_char(s[j + tl]);
        if (before_ok && after_ok)
            return DSP_BINLOG_Q_TASK_WRITE;
    }
    return DSP_BINLOG_Q_OTHER;
}
