/* utf8: checking, repairing and cutting UTF-8 text that came from outside (a
 * worker's HELLO and results, the table's rows) before it goes into SQL, JSON or the
 * Prometheus format, all of which want valid UTF-8. Pure: no I/O, no global state. */
#ifndef TASKPUSH_DSP_UTF8_H
#define TASKPUSH_DSP_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the longest prefix of in[0..len) that is valid UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
size_t dsp_utf8_valid_prefix(const uint8_t *in, size_t len);

/* Copies in[0..len) to out as valid UTF-8: each byte that does not start a valid
 * sequence becomes U+FFFD (EF BF BD). Stops before the first character that would not
 * fit in cap bytes. Returns the bytes written. 3 * len bytes always suffice. */
size_t dsp_utf8_sanitize(const uint8_t *in, size_t len, uint8_t *out, size_t cap);

/* Length of the longest prefix of the valid UTF-8 text s[0..len) that is at most cap
 * bytes and ends on a character boundary. */
size_t dsp_utf8_cut(const uint8_t *s, size_t len, size_t cap);

/* A copy of the C string s (malloc'd; NULL when out of memory) with each byte that is
 * not valid UTF-8 replaced by U+FFFD. */
char *dsp_utf8_copy(const char *s);

#endif
