/* strbuf: a growing text buffer, for SQL statements (db/) and the admin port's
 * answers alike. Pure: no I/O, no global state. */
#ifndef TASKPUSH_DSP_STRBUF_H
#define TASKPUSH_DSP_STRBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growing text buffer. `oom` sticks once an allocation failed; the text is then
 * incomplete and must not be sent. */
typedef struct dsp_strbuf {
    char *p;
    size_t len;
    size_t cap;
    bool oom;
} dsp_strbuf;

void dsp_strbuf_free(dsp_strbuf *b);
void dsp_strbuf_reset(dsp_strbuf *b); /* empties it, keeps the memory */
bool dsp_strbuf_reserve(dsp_strbuf *b, size_t extra);
void dsp_strbuf_put(dsp_strbuf *b, const char *s, size_t n);
void dsp_strbuf_puts(dsp_strbuf *b, const char *s);
void dsp_strbuf_printf(dsp_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* prefix, then v in decimal: the per-row lists of the claim and the writes, where
 * vsnprintf was a third of the claim thread's instructions. */
void dsp_strbuf_put_u64(dsp_strbuf *b, const char *prefix, uint64_t v);
void dsp_strbuf_put_i64(dsp_strbuf *b, const char *prefix, int64_t v);
/* Appends X'hex' (with prefix "_utf8mb4 " when utf8mb4), or NULL when len is 0. */
void dsp_strbuf_put_hex(dsp_strbuf *b, const uint8_t *data, size_t len, bool utf8mb4);

#endif
