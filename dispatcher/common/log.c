/* log: see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int dsp_log_level_parse(const char *name)
{
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

const char *dsp_log_level_name(int level)
{
    if (level < 0 || level > DSP_LOG_DEBUG)
        return "?";
    return level_names[level];
}

void dsp_log_write(const dsp_log *log, int level, const char *file, int line, const char *func,
                   const char *fmt, ...)
{
    (void)log;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    /* One fprintf per line: stdio locks the stream, so lines from the loop and
     * the database threads never interleave. */
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s:%d %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            dsp_log_level_name(level), base ? base + 1 : file, line, func, msg);
}
