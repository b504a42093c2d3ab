/* sb: the tests' growing string (see sb.h). */
#include "sb.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void tp_sb_printf(struct tp_sb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        fprintf(stderr, "tp_sb_printf: bad format %s\n", fmt);
        abort();
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (s == NULL) {
            fprintf(stderr, "tp_sb_printf: out of memory for %zu bytes\n", cap);
            abort();
        }
        b->s = s;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void tp_sb_free(struct tp_sb *b)
{
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}
