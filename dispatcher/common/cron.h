/* cron.h: the arithmetic of periodic tasks (docs/producers.md, "Periodic tasks"):
 * five-field cron expressions in UTC, the next due time of an interval or a cron
 * schedule, and which due times a round inserts under the 'skip' and 'catch-up' rules.
 * Pure: no clock, no I/O, no allocation; db_schedule.c runs it against the table. */
#ifndef TASKPUSH_DSP_CRON_H
#define TASKPUSH_DSP_CRON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSP_CRON_MAX_LEN 128 /* the column's width: a longer text is refused */

/* Which values of each field match: bit v set for value v. */
typedef struct dsp_cron {
    uint64_t minute;       /* 0-59 */
    uint32_t hour;         /* 0-23 */
    uint32_t dom;          /* 1-31 */
    uint16_t month;        /* 1-12 */
    uint8_t dow;           /* 0-6, Sunday 0 (7 is read as 0) */
    bool dom_any, dow_any; /* the field was "*" (cron's day rule: either matches when
                            * both are restricted) */
} dsp_cron;

/* Parses "minute hour day-of-month month day-of-week": each field a list of "*", "N" or
 * "N-M", each optionally "/STEP" (1 to the field's span); names (jan, mon) are not taken.
 * Returns 0, or -1 with why (a static string) when given. */
int dsp_cron_parse(const char *text, dsp_cron *out, const char **why);

/* The first minute strictly after after_ms (ms since 1970, UTC) that c matches, in ms;
 * -1 when none within DSP_CRON_HORIZON_DAYS (such as "0 0 30 2 *"). Bounded work. */
#define DSP_CRON_HORIZON_DAYS (366 * 8 + 2)
int64_t dsp_cron_next(const dsp_cron *c, int64_t after_ms);

/* A schedule's rule of time: every interval_ms (> 0; due times are its multiples since
 * 1970, so that every dispatcher computes the same ones), or a cron expression. */
typedef struct dsp_sched_rule {
    int64_t interval_ms; /* 0: cron */
    dsp_cron cron;
} dsp_sched_rule;

/* The first due time strictly after t; -1 when none (a cron that never matches). */
int64_t dsp_sched_next(const dsp_sched_rule *r, int64_t t);

/* What one round does with a schedule whose next_run is due (next_run <= now): the due
 * times to insert, ascending, into out[0..*n) (at most cap), and the next_run to store
 * (> now, or -1 when the rule never matches again). Under 'skip' (catch_up false) only
 * the latest due time at or before now is inserted, the earlier missed ones are skipped;
 * under 'catch-up' every due time from next_run to now, but at most max_catch_up (and
 * cap) of them, the latest ones. next_run 0 (a new schedule) inserts nothing and sets
 * the first due time after now. */
void dsp_sched_due(const dsp_sched_rule *r, int64_t next_run, int64_t now, bool catch_up, uint32_t max_catch_up,
                   int64_t *out, size_t cap, size_t *n, int64_t *next_out);

#endif
