/* utf8: see utf8.h. */
#include "utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..len), or 0 when none starts there. */
static size_t utf8_seq(const uint8_t *s, size_t len)
{
    uint8_t c = s[0];
    uint8_t lo = 0x80, hi = 0xBF;
    size_t n, i;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else
        return 0;
    if (len < n)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

size_t dsp_utf8_valid_prefix(const uint8_t *in, size_t len)
{
    size_t i = 0, n;

    while (i < len) {
        /* A run of ASCII first: the usual error text. */
        if (in[i] < 0x80) {
            i++;
            continue;
        }
        n = utf8_seq(in + i, len - i);
        if (n == 0)
            break;
        i += n;
    }
    return i;
}

size_t dsp_utf8_sanitize(const uint8_t *in, size_t len, uint8_t *out, size_t cap)
{
    static const uint8_t repl[3] = {0xEF, 0xBF, 0xBD};
    size_t i = 0, o = 0, n;

    while (i < len) {
        n = utf8_seq(in + i, len - i);
        if (n == 0) {
            if (cap - o < sizeof repl)
                break;
            memcpy(out + o, repl, sizeof repl);
            o += sizeof repl;
            i++;
            continue;
        }
        if (cap - o < n)
            break;
        memcpy(out + o, in + i, n);
        o += n;
        i += n;
    }
    return o;
}

size_t dsp_utf8_cut(const uint8_t *s, size_t len, size_t cap)
{
    size_t n;

    if (len <= cap)
        return len;
    n = cap;
    /* Back off continuation bytes: s[n] must start a character. */
    while (n > 0 && (s[n] & 0xC0) == 0x80)
        n--;
    return n;
}

/* A copy of s (malloc'd; NULL when out of memory) with each byte that is not valid
 * UTF-8 replaced by U+FFFD: a worker's name is whatever its HELLO said, and JSON
 * (jansson refuses such a string) and the Prometheus format want UTF-8. */
char *dsp_utf8_copy(const char *s)
{
    size_t n = strlen(s);
    char *out = n < SIZE_MAX / 3 ? malloc(3 * n + 1) : NULL;
    if (out)
        out[dsp_utf8_sanitize((const uint8_t *)s, n, (uint8_t *)out, 3 * n)] = '\0';
    return out;
}
