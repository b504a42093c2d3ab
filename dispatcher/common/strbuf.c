/* strbuf: see strbuf.h. */
#include "strbuf.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dsp_strbuf_free(dsp_strbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

void dsp_strbuf_reset(dsp_strbuf *b)
{
    b->len = 0;
    b->oom = false;
    if (b->p)
        b->p[0] = '\0';
}

bool dsp_strbuf_reserve(dsp_strbuf *b, size_t extra)
{
    size_t need, cap;
    char *p;

    if (b->oom)
        return false;
    if (extra > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return false;
    }
    need = b->len + extra + 1; /* room for the NUL */
    if (need <= b->cap)
        return true;
    cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void dsp_strbuf_put(dsp_strbuf *b, const char *s, size_t n)
{
    if (!dsp_strbuf_reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void dsp_strbuf_puts(dsp_strbuf *b, const char *s)
{
    dsp_strbuf_put(b, s, strlen(s));
}

void dsp_strbuf_put_u64(dsp_strbuf *b, const char *prefix, uint64_t v)
{
    char digits[20];
    size_t n = 0;
    do {
        digits[sizeof digits - ++n] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    size_t plen = strlen(prefix);
    if (!dsp_strbuf_reserve(b, plen + n))
        return;
    memcpy(b->p + b->len, prefix, plen);
    memcpy(b->p + b->len + plen, digits + sizeof digits - n, n);
    b->len += plen + n;
    b->p[b->len] = '\0';
}

void dsp_strbuf_put_i64(dsp_strbuf *b, const char *prefix, int64_t v)
{
    if (v >= 0) {
        dsp_strbuf_put_u64(b, prefix, (uint64_t)v);
        return;
    }
    dsp_strbuf_puts(b, prefix);
    dsp_strbuf_put_u64(b, "-", (uint64_t)0 - (uint64_t)v);
}

void dsp_strbuf_printf(dsp_strbuf *b, const char *fmt, ...)
{
    char small[128];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        dsp_strbuf_put(b, small, (size_t)n);
        return;
    }
    if (!dsp_strbuf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void dsp_strbuf_put_hex(dsp_strbuf *b, const uint8_t *data, size_t len, bool utf8mb4)
{
    static const char digits[] = "0123456789ABCDEF";
    static const char intro[] = "_utf8mb4 ";
    char *o;
    size_t i;

    if (len == 0) {
        dsp_strbuf_put(b, "NULL", 4);
        return;
    }
    if (len > (SIZE_MAX - 64) / 2 || !dsp_strbuf_reserve(b, sizeof intro + 3 + 2 * len)) {
        b->oom = true;
        return;
    }
    o = b->p + b->len;
    if (utf8mb4) {
        memcpy(o, intro, sizeof intro - 1);
        o += sizeof intro - 1;
    }
    *o++ = 'X';
    *o++ = '\'';
    for (i = 0; i < len; i++) {
        *o++ = digits[data[i] >> 4];
        *o++ = digits[data[i] & 15];
    }
    *o++ = '\'';
    *o = '\0';
    b->len = (size_t)(o - b->p);
}
