/* cron.c: cron expressions, next due times and the due times of a round for
 * periodic tasks (cron.h). Pure functions over ms since 1970 in UTC; every loop
 * is bounded. */
#include "cron.h"

#include <string.h>

#define MINUTE_MS 60000LL
#define DAY_MS 86400000LL
/* A cron schedule catches up (or finds the latest missed run) at most this far back:
 * the walk over its due times stays bounded (44,640 steps for every minute). */
#define CRON_LOOKBACK_MS (31 * DAY_MS)

/* ---- parsing ---- */

/* A number of 1 to 2 digits at *p within [lo, hi]; advances *p. */
static int cron_num(const char **p, int lo, int hi, int *out)
{
    int v = 0, digits = 0;
    while (**p >= '0' && **p <= '9' && digits < 3) {
        v = v * 10 + (**p - '0');
        (*p)++;
        digits++;
    }
    if (digits == 0 || digits > 2 || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* One field: a comma list of "*", "N", "N-M", each with an optional "/STEP". Sets the
 * bits of the values matched in *bits and whether the field was "*" alone. */
static int cron_field(const char *s, size_t len, int lo, int hi, uint64_t *bits, bool *any)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    *bits = 0;
    *any = strcmp(buf, "*") == 0;
    const char *p = buf;
    for (;;) {
        int a = lo, b = hi, step = 1;
        bool single = false;
        if (*p == '*') {
            p++;
        } else {
            if (cron_num(&p, lo, hi, &a) < 0)
                return -1;
            b = a;
            single = *p != '-';
            if (*p == '-') {
                p++;
                if (cron_num(&p, lo, hi, &b) < 0 || b < a)
                    return -1;
            }
        }
        if (*p == '/') {
            p++;
            if (cron_num(&p, 1, hi - lo + 1, &step) < 0)
                return -1;
            if (single) /* "5/10" means 5-hi/10, as in most crons */
                b = hi;
        }
        for (int v = a; v <= b; v += step)
            *bits |= 1ULL << v;
        if (*p == '\0')
            return 0;
        if (*p++ != ',')
            return -1;
    }
}

int dsp_cron_parse(const char *text, dsp_cron *out, const char **why)
{
    static const struct {
        int lo, hi;
    } span[5] = {{0, 59}, {0, 23}, {1, 31}, {1, 12}, {0, 7}};
    const char *dummy;
    if (!why)
        why = &dummy;
    memset(out, 0, sizeof *out);
    if (strlen(text) > DSP_CRON_MAX_LEN) {
        *why = "a cron expression is at most 128 characters";
        return -1;
    }
    uint64_t bits[5];
    bool any[5];
    const char *p = text;
    for (int f = 0; f < 5; f++) {
        p += strspn(p, " \t");
        size_t len = strcspn(p, " \t");
        if (len == 0 || cron_field(p, len, span[f].lo, span[f].hi, &bits[f], &any[f]) < 0) {
            *why = len == 0 ? "a cron expression has 5 fields: minute hour day-of-month month day-of-week"
                            : "a cron field is *, N, N-M or a list of them, each with an optional /STEP, "
                              "within minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-7";
            return -1;
        }
        p += len;
    }
    if (p[strspn(p, " \t")] != '\0') {
        *why = "a cron expression has 5 fields: minute hour day-of-month month day-of-week";
        return -1;
    }
    out->minute = bits[0];
    out->hour = (uint32_t)bits[1];
    out->dom = (uint32_t)bits[2];
    out->month = (uint16_t)bits[3];
    out->dow = (uint8_t)((bits[4] | bits[4] >> 7) & 0x7f); /* 7 is Sunday too */
    out->dom_any = any[2];
    out->dow_any = any[4];
    return 0;
}

/* ---- the calendar (proleptic Gregorian, UTC) ---- */

/* Days since 1970-01-01 of y-m-d (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static bool cron_day_matches(const dsp_cron *c, int dom, int dow)
{
    bool a = c->dom >> dom & 1, b = c->dow >> dow & 1;
    if (c->dom_any || c->dow_any)
        return a && b; /* one of them is "*": it matches every day */
    return a || b;     /* both restricted: either, as cron does */
}

int64_t dsp_cron_next(const dsp_cron *c, int64_t after_ms)
{
    if (after_ms < 0)
        after_ms = -MINUTE_MS;
    /* Whole minutes from the one after after_ms. */
    int64_t t = (after_ms / MINUTE_MS + 1) * MINUTE_MS;
    int64_t end = t + DSP_CRON_HORIZON_DAYS * DAY_MS;
    while (t < end) {
        int64_t day = t / DAY_MS, y;
        int m, d;
        civil_from_days(day, &y, &m, &d);
        if (!(c->month >> m & 1)) { /* the first day of the next month */
            t = days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) * DAY_MS;
            continue;
        }
        int dow = (int)((day % 7 + 11) % 7); /* 1970-01-01 was a Thursday (4) */
        if (!cron_day_matches(c, d, dow)) {
            t = (day + 1) * DAY_MS;
            continue;
        }
        int64_t in_day = t - day * DAY_MS;
        int h = (int)(in_day / 3600000), mi = (int)(in_day % 3600000 / MINUTE_MS);
        if (!(c->hour >> h & 1)) {
            t = day * DAY_MS + (int64_t)(h + 1) * 3600000;
            continue;
        }
        if (!(c->minute >> mi & 1)) {
            t += MINUTE_MS;
            continue;
        }
        return t;
    }
    return -1;
}

/* ---- schedules ---- */

int64_t dsp_sched_next(const dsp_sched_rule *r, int64_t t)
{
    if (r->interval_ms > 0) {
        if (t < 0)
            return 0;
        int64_t k = t / r->interval_ms + 1;
        return k > INT64_MAX / r->interval_ms ? -1 : k * r->interval_ms;
    }
    return dsp_cron_next(&r->cron, t);
}

/* Keeps the latest keep values pushed, in a ring over out[0..keep). */
struct ring {
    int64_t *out;
    size_t keep, n, head; /* n pushed in all (capped at keep), head: the oldest */
};

static void ring_push(struct ring *g, int64_t v)
{
    if (g->n < g->keep) {
        g->out[g->n++] = v;
        return;
    }
    g->out[g->head] = v;
    g->head = (g->head + 1) % g->keep;
}

/* Puts the ring in ascending order from out[0]. */
static void ring_unroll(struct ring *g)
{
    for (size_t k = 0; k < g->head; k++) { /* rotate left by head, one step at a time */
        int64_t first = g->out[0];
        memmove(g->out, g->out + 1, (g->n - 1) * sizeof *g->out);
        g->out[g->n - 1] = first;
    }
    g->head = 0;
}

void dsp_sched_due(const dsp_sched_rule *r, int64_t next_run, int64_t now, bool catch_up, uint32_t max_catch_up,
                   int64_t *out, size_t cap, size_t *n, int64_t *next_out)
{
    *n = 0;
    if (next_run <= 0) {
        *next_out = dsp_sched_next(r, now);
        return;
    }
    if (next_run > now || cap == 0) {
        *next_out = next_run;
        return;
    }
    size_t keep = catch_up ? (max_catch_up < cap ? max_catch_up : cap) : 1;
    if (keep == 0)
        keep = 1;
    *next_out = dsp_sched_next(r, now);
    if (r->interval_ms > 0) {
        /* next_run, then every multiple of the interval after it up to now: arithmetic,
         * however long nobody led. */
        int64_t iv = r->interval_ms;
        int64_t after = now / iv - next_run / iv; /* multiples in (next_run, now] */
        uint64_t count = (uint64_t)after + 1;
        size_t k = count < keep ? (size_t)count : keep;
        int64_t last = after > 0 ? now / iv * iv : next_run;
        for (size_t j = 0; j < k; j++) /* j from the end */
            out[k - 1 - j] = (uint64_t)j == count - 1 ? next_run : last - (int64_t)j * iv;
        *n = k;
        return;
    }
    /* Cron: walk the due times from next_run (or CRON_LOOKBACK_MS back), keeping the
     * latest keep of them. */
    struct ring g = {out, keep, 0, 0};
    int64_t t = next_run;
    if (now - next_run > CRON_LOOKBACK_MS)
        t = dsp_cron_next(&r->cron, now - CRON_LOOKBACK_MS - 1);
    while (t >= 0 && t <= now) {
        ring_push(&g, t);
        t = dsp_cron_next(&r->cron, t);
    }
    ring_unroll(&g);
    *n = g.n;
}
