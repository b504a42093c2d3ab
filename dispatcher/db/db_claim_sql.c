/* db_claim_sql: see db_claim_sql.h. */
#include "db_claim_sql.h"

#include "tables.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* An append cursor over the caller's buffer; `bad` sticks once anything did not fit. */
struct sqlbuf {
    char *buf;
    size_t cap;
    size_t len;
    int bad;
};

static void sqlbuf_put(struct sqlbuf *b, const char *s, size_t n)
{
    if (b->bad)
        return;
    if (b->cap - b->len <= n) { /* keep one byte for the NUL */
        b->bad = 1;
        return;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
}

static void sqlbuf_puts(struct sqlbuf *b, const char *s)
{
    sqlbuf_put(b, s, strlen(s));
}

static void sqlbuf_printf(struct sqlbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sqlbuf_printf(struct sqlbuf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->bad)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len) {
        b->bad = 1;
        return;
    }
    b->len += (size_t)n;
}

/* Terminates the text; returns its length or -1 (leaving "" when possible). */
static int sqlbuf_finish(struct sqlbuf *b)
{
    if (b->cap == 0)
        return -1;
    if (b->bad || b->len > INT_MAX) {
        b->buf[0] = '\0';
        return -1;
    }
    b->buf[b->len] = '\0';
    return (int)b->len;
}

int dsp_claim_sql_quote_hex(void *ctx, char *to, size_t cap, const char *from, size_t len)
{
    static const char digits[] = "0123456789ABCDEF";
    static const char head[] = "_utf8mb4 X'";
    size_t need = sizeof head - 1 + 2 * len + 1;
    size_t i, o;

    (void)ctx;
    if (need > cap || need > INT_MAX)
        return -1;
    memcpy(to, head, sizeof head - 1);
    o = sizeof head - 1;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)from[i];
        to[o++] = digits[c >> 4];
        to[o++] = digits[c & 15];
    }
    to[o++] = '\'';
    return (int)o;
}

size_t dsp_claim_sql_select_bound(const char *const *types, size_t ntypes)
{
    /* One part without its type literal, with the longest numbers: 20 digits for now_ms
     * and 10 for the limit, and its probe of group_idx (the literal again). Counted
     * generously; the test checks it holds. */
    static const size_t part_fixed = 700 + DSP_CLAIM_SQL_AFTER_MAX + 2 * DSP_TABLE_NAME_MAX;
    size_t total = 1, i;

    for (i = 0; i < ntypes; i++) {
        size_t len = types[i] ? strlen(types[i]) : 0;
        total += part_fixed + 2 * DSP_CLAIM_SQL_LITERAL_MAX(len);
    }
    return total;
}

/* Appends the quoted literal of s[0..len) straight into the buffer (one byte stays for
 * the NUL); false (b->bad set) when it does not fit or the quoting failed. */
static bool sqlbuf_literal(struct sqlbuf *b, dsp_claim_sql_quote_fn quote, void *quote_ctx,
                           const char *s, size_t len)
{
    if (b->bad)
        return false;
    int q = quote(quote_ctx, b->buf + b->len, b->cap - b->len - 1, s, len);
    if (q < 0 || (size_t)q >= b->cap - b->len) {
        b->bad = 1;
        return false;
    }
    b->len += (size_t)q;
    return true;
}

/* The UNION ALL of one part per type, each selecting `columns` and ending with `tail`
 * after its LIMIT (dsp_claim_sql_select and dsp_claim_sql_candidates); with probe_keyed,
 * each part is followed by the type's first ready keyed row from group_idx. */
static int claim_union(char *buf, size_t cap, const char *columns, const char *tail,
                       const char *const *types, size_t ntypes, int64_t now_ms, unsigned limit,
                       const uint8_t *after_prio, const uint64_t *after_id, bool probe_keyed,
                       dsp_claim_sql_quote_fn quote, void *quote_ctx, const dsp_table_names *t)
{
    struct sqlbuf b = {buf, cap, 0, 0};
    size_t i;

    if (buf == NULL)
        return -1;
    if (ntypes == 0 || types == NULL || limit == 0 || now_ms < 0)
        b.bad = 1;
    if (quote == NULL)
        quote = dsp_claim_sql_quote_hex;

    for (i = 0; i < ntypes && !b.bad; i++) {
        size_t tlen;

        if (types[i] == NULL || (tlen = strlen(types[i])) > DSP_CLAIM_SQL_TYPE_MAX_BYTES) {
            b.bad = 1;
            break;
        }
        if (i > 0)
            sqlbuf_puts(&b, " UNION ALL ");
        sqlbuf_printf(&b,
                      "(SELECT %s FROM %s FORCE INDEX (claim_idx)"
                      " WHERE claim_lane = 0 AND `delayed` = 0 AND task_type = ",
                      columns, t ? t->task : DSP_TABLE_NAME_DEFAULT);
        if (!sqlbuf_literal(&b, quote, quote_ctx, types[i], tlen))
            break;
        if (after_prio != NULL && after_id != NULL)
            sqlbuf_printf(&b,
                          " AND (task_priority < %u OR (task_priority = %u AND task_id > %" PRIu64
                          "))",
                          (unsigned)after_prio[i], (unsigned)after_prio[i], after_id[i]);
        sqlbuf_printf(&b,
                      " AND run_after <= %" PRId64
                      " ORDER BY task_priority DESC, task_id LIMIT %u%s)",
                      now_ms, limit, tail);
        if (!probe_keyed || b.bad)
            continue;
        /* Since version 12 claim_idx's lane 0 holds only keyless rows: a keyed row of a
         * type the claim thread does not know as keyed (inserted by SQL) is found here,
         * one index dive, and its claim marks the type keyed (db_claim.c). */
        sqlbuf_printf(&b,
                      " UNION ALL (SELECT %s FROM %s FORCE INDEX (group_idx)"
                      " WHERE group_lane = 0 AND `delayed` = 0 AND task_type = ",
                      columns, t ? t->task : DSP_TABLE_NAME_DEFAULT);
        if (!sqlbuf_literal(&b, quote, quote_ctx, types[i], tlen))
            break;
        sqlbuf_printf(&b,
                      " AND run_after <= %" PRId64
                      " ORDER BY task_priority DESC, group_key, task_id LIMIT 1)",
                      now_ms);
    }
    return sqlbuf_finish(&b);
}

int dsp_claim_sql_select(char *buf, size_t cap, const char *const *types, size_t ntypes,
                         int64_t now_ms, unsigned limit, dsp_claim_sql_quote_fn quote,
                         void *quote_ctx)
{
    return claim_union(buf, cap, DSP_CLAIM_SQL_COLUMNS, " FOR UPDATE SKIP LOCKED", types, ntypes,
                       now_ms, limit, NULL, NULL, false, quote, quote_ctx, NULL);
}

int dsp_claim_sql_candidates(char *buf, size_t cap, const char *const *types, size_t ntypes,
                             int64_t now_ms, unsigned limit, dsp_claim_sql_quote_fn quote,
                             void *quote_ctx, const dsp_table_names *t)
{
    return claim_union(buf, cap, DSP_CLAIM_SQL_CAND_COLUMNS, "", types, ntypes, now_ms, limit, NULL,
                       NULL, true, quote, quote_ctx, t);
}

int dsp_claim_sql_candidates_after(char *buf, size_t cap, const char *const *types, size_t ntypes,
                                   int64_t now_ms, unsigned limit, const uint8_t *after_prio,
                                   const uint64_t *after_id, dsp_claim_sql_quote_fn quote,
                                   void *quote_ctx, const dsp_table_names *t)
{
    if (after_prio == NULL || after_id == NULL) {
        if (buf != NULL && cap > 0)
            buf[0] = '\0';
        return -1;
    }
    return claim_union(buf, cap, DSP_CLAIM_SQL_CAND_COLUMNS, "", types, ntypes, now_ms, limit,
                       after_prio, after_id, false, quote, quote_ctx, t);
}

int dsp_claim_sql_promote(char *buf, size_t cap, int64_t now_ms, unsigned limit)
{
    return dsp_claim_sql_promote_in(buf, cap, now_ms, limit, NULL, NULL);
}

int dsp_claim_sql_demote(char *buf, size_t cap, int64_t now_ms, unsigned limit)
{
    return dsp_claim_sql_demote_in(buf, cap, now_ms, limit, NULL, NULL);
}

int dsp_claim_sql_promote_in(char *buf, size_t cap, int64_t now_ms, unsigned limit, const char *in,
                             const dsp_table_names *t)
{
    struct sqlbuf b = {buf, cap, 0, 0};

    if (buf == NULL)
        return -1;
    if (limit == 0 || now_ms < 0)
        b.bad = 1;
    sqlbuf_printf(&b,
                  "UPDATE %s FORCE INDEX (delay_idx) SET `delayed` = 0"
                  " WHERE `delayed` = 1 AND run_after <= %" PRId64 "%s LIMIT %u",
                  t ? t->task : DSP_TABLE_NAME_DEFAULT, now_ms, in ? in : "", limit);
    return sqlbuf_finish(&b);
}

int dsp_claim_sql_demote_in(char *buf, size_t cap, int64_t now_ms, unsigned limit, const char *in,
                            const dsp_table_names *t)
{
    struct sqlbuf b = {buf, cap, 0, 0};

    if (buf == NULL)
        return -1;
    if (limit == 0 || now_ms < 0)
        b.bad = 1;
    sqlbuf_printf(&b,
                  "UPDATE %s FORCE INDEX (delay_idx) SET `delayed` = 1"
                  " WHERE `delayed` = 0 AND task_state = 0"
                  " AND run_after > %" PRId64 "%s LIMIT %u",
                  t ? t->task : DSP_TABLE_NAME_DEFAULT, now_ms, in ? in : "", limit);
    return sqlbuf_finish(&b);
}
