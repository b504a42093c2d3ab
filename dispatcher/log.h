/* log.h: levelled logging to stderr, one line per event.
 *
 * The level is checked before anything is formatted, so a debug line on the
 * hot path costs one comparison when debug is off. Each line carries the
 * time, the level and file:line func, like beanstalkd's twarn. */
#ifndef TASKPUSH_DSP_LOG_H
#define TASKPUSH_DSP_LOG_H

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

#define log_error(log, ...) dsp_log_at(log, DSP_LOG_ERROR, __VA_ARGS__)
#define log_warn(log, ...) dsp_log_at(log, DSP_LOG_WARN, __VA_ARGS__)
#define log_info(log, ...) dsp_log_at(log, DSP_LOG_INFO, __VA_ARGS__)
#define log_debug(log, ...) dsp_log_at(log, DSP_LOG_DEBUG, __VA_ARGS__)

#endif
