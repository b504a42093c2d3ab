/* tap: see tap.h. */
#include "tap.h"

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
