/* log.h: levelled logging to stderr, one line per event.
 *
 * The level is checked before anything is formatted, so a debug line on the
 * hot path costs one comparison when debug is off. Each line carries the
 * time, the level and file:line func, like beanstalkd's twarn. */
#ifndef TASKPUSH_DSP_LOG_H
#define TASKPUSH_DSP_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum dsp_log_level { DSP_LOG_ERROR = 0, DSP_LOG_WARN, DSP_LOG_INFO, DSP_LOG_DEBUG };

typedef struct dsp_log {
    int level; /* lines above this level are dropped */
} dsp_log;

/* Parses "error|warn|info|debug"; returns the level or -1. */
int dsp_log_level_parse(const char *name);
const char *dsp_log_level_name(int level);

void dsp_log_write(const dsp_log *log, int level, const char *file, int line, const char *func,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define dsp_log_at(log, lvl, ...)                                                            \
    do {                                                                                     \
        if ((lvl) <= (log)->level)                                                           \
            dsp_log_write((log), (lvl), __FILE__, __LINE__, __func__, __VA_ARGS__);          \
    } while (0)

/* Events a peer can repeat at will (connections, bad frames, refused HELLOs) are
 * logged at most DSP_LOG_BURST times a second; the rest are counted and the count
 * goes into the next line logged, so a flood of bad peers never becomes a flood of
 * log lines, and a handful of ordinary events is logged in full. */
#define DSP_LOG_BURST 10

typedef struct dsp_log_limit {
    int64_t window_ms; /* start of the current second */
    unsigned lines;    /* lines logged in it */
    uint64_t held;     /* events not logged since the last line */
} dsp_log_limit;

/* True when the event may be logged now; *held then gets the events held back
 * since the last line (and the count restarts). */
static inline bool dsp_log_limit_take(dsp_log_limit *l, int64_t now_ms, uint64_t *held)
{
    if (now_ms - l->window_ms >= 1000) {
        l->window_ms = now_ms;
        l->lines = 0;
    }
    if (l->lines >= DSP_LOG_BURST) {
        l->held++;
        return false;
    }
    l->lines++;
    *held = l->held;
    l->held = 0;
    return true;
}

/* Logs at lvl through the limiter lim (now_ms: a monotonic clock), adding how many
 * similar events were held back. */
#define log_limited(log, lim, now_ms, lvl, fmt, ...)                                          \
    do {                                                                                     \
        uint64_t held_;                                                                      \
        if ((lvl) <= (log)->level && dsp_log_limit_take((lim), (now_ms), &held_))            \
            dsp_log_write((log), (lvl), __FILE__, __LINE__, __func__, fmt " (%llu similar not logged)", \
                          __VA_ARGS__, (unsigned long long)held_);                          \
    } while (0)

#define log_error(log, ...) dsp_log_at(log, DSP_LOG_ERROR, __VA_ARGS__)
#define log_warn(log, ...) dsp_log_at(log, DSP_LOG_WARN, __VA_ARGS__)
#define log_info(log, ...) dsp_log_at(log, DSP_LOG_INFO, __VA_ARGS__)
#define log_debug(log, ...) dsp_log_at(log, DSP_LOG_DEBUG, __VA_ARGS__)

#endif
