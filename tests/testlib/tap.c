/* tap: see tap.h. */
#include "tap.h"

#include "wait.h"

#include <stdarg.h>
#include <stdio.h>

void tp_diag(const char *fmt, ...)
{
    va_list ap;
    fputs("# ", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

void tp_note(long long t0, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "# [%6lld ms] %s\n", tp_mono_ms() - t0, msg);
}
