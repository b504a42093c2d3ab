/* test_schedule: the cron parser, next due times, and the due times a round inserts
 * under 'skip' and 'catch-up' (dispatcher/common/cron.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cron.h"

#define MIN 60000LL
#define HOUR 3600000LL
#define DAY 86400000LL

/* ms since 1970 of a UTC date and time, by timegm (an independent calendar). */
static int64_t at(int y, int mo, int d, int h, int mi)
{
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi};
    return (int64_t)timegm(&tm) * 1000;
}

static dsp_cron cron(const char *text)
{
    dsp_cron c;
    const char *why = NULL;
    if (dsp_cron_parse(text, &c, &why) != 0)
        fail_msg("'%s' refused: %s", text, why);
    return c;
}

static void test_cron_parse_fields(void **state)
{
    (void)state;
    dsp_cron c = cron("*/15 0-6/2,23 1,15 * 1-5");
    assert_int_equal(c.minute, (1ULL << 0) | (1ULL << 15) | (1ULL << 30) | (1ULL << 45));
    assert_int_equal(c.hour, (1u << 0) | (1u << 2) | (1u << 4) | (1u << 6) | (1u << 23));
    assert_int_equal(c.dom, (1u << 1) | (1u << 15));
    assert_int_equal(c.month, 0x1ffe); /* 1..12 */
    assert_int_equal(c.dow, 0x3e);     /* Monday..Friday */
    assert_false(c.dom_any);
    assert_false(c.dow_any);
    c = cron("  5/20   *  *  *  7 ");
    assert_int_equal(c.minute, (1ULL << 5) | (1ULL << 25) | (1ULL << 45));
    assert_int_equal(c.dow, 1); /* 7 is Sunday, 0 */
    assert_true(c.dom_any);
    c = cron("59 23 31 12 0,7");
    assert_int_equal(c.dow, 1);
}

static void test_cron_parse_refuses(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *",
        "* * * 0 *", "* * * 13 *", "* * * * 8", "5-1 * * * *", "*/0 * * * *", "*/61 * * * *",
        "1,,2 * * * *", "1, * * * *", ",1 * * * *", "-1 * * * *", "1- * * * *", "a * * * *",
        "* * * jan *", "001 * * * *", "1--2 * * * *", "*/ * * * *", "**/2 * * * *", "1/2/3 * * * *",
        "*,* * * * *x",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsp_cron c;
        const char *why = NULL;
        if (dsp_cron_parse(bad[i], &c, &why) == 0)
            fail_msg("'%s' was accepted", bad[i]);
        assert_non_null(why);
    }
    char longer[DSP_CRON_MAX_LEN + 8];
    memset(longer, ' ', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    memcpy(longer + 100, "* * * * *", 9);
    dsp_cron c;
    assert_int_equal(dsp_cron_parse(longer, &c, NULL), -1);
}

static void test_cron_next(void **state)
{
    (void)state;
    dsp_cron every = cron("* * * * *");
    assert_int_equal(dsp_cron_next(&every, at(2026, 11, 23, 8, 5) + 1), at(2026, 11, 23, 8, 6));
    assert_int_equal(dsp_cron_next(&every, at(2026, 11, 23, 8, 5)), at(2026, 11, 23, 8, 6));
    dsp_cron c = cron("30 2 * * *");
    assert_int_equal(dsp_cron_next(&c, at(2026, 12, 31, 3, 0)), at(2027, 1, 1, 2, 30));
    /* Monday 9:00; 2026-11-23 is a Monday. */
    c = cron("0 9 * * 1");
    assert_int_equal(dsp_cron_next(&c, at(2026, 11, 23, 9, 0)), at(2026, 11, 30, 9, 0));
    assert_int_equal(dsp_cron_next(&c, at(2026, 11, 21, 0, 0)), at(2026, 11, 23, 9, 0));
    /* Both day fields restricted: either matches (the 1st, or a Friday). */
    c = cron("0 0 1 * 5");
    assert_int_equal(dsp_cron_next(&c, at(2026, 11, 23, 0, 0)), at(2026, 11, 27, 0, 0));
    assert_int_equal(dsp_cron_next(&c, at(2026, 11, 27, 0, 0)), at(2026, 12, 1, 0, 0));
    /* February 29th: the next leap year. */
    c = cron("0 12 29 2 *");
    assert_int_equal(dsp_cron_next(&c, at(2026, 3, 1, 0, 0)), at(2028, 2, 29, 12, 0));
    /* Never: -1 after bounded work. */
    c = cron("0 0 30 2 *");
    assert_int_equal(dsp_cron_next(&c, at(2026, 1, 1, 0, 0)), -1);
    /* Against a brute force over minutes for a tangled expression. */
    c = cron("*/7 1-3,22 */3 1,6-8 0,3");
    int64_t t = at(2026, 1, 1, 0, 0), brute = t;
    for (int k = 0; k < 40; k++) {
        int64_t nx = dsp_cron_next(&c, t);
        for (brute = (t / MIN + 1) * MIN;; brute += MIN) {
            time_t s = (time_t)(brute / 1000);
            struct tm tm;
            gmtime_r(&s, &tm);
            bool dom = c.dom >> tm.tm_mday & 1, dow = c.dow >> tm.tm_wday & 1;
            if ((c.minute >> tm.tm_min & 1) && (c.hour >> tm.tm_hour & 1) && (c.month >> (tm.tm_mon + 1) & 1) &&
                (dom || dow))
                break;
        }
        assert_int_equal(nx, brute);
        t = nx;
    }
}

static void test_interval_due_times(void **state)
{
    (void)state;
    dsp_sched_rule r = {.interval_ms = 1000};
    int64_t out[16], next;
    size_t n;
    /* A new schedule: nothing now, the first multiple after now. */
    dsp_sched_due(&r, 0, 5500, true, 100, out, 16, &n, &next);
    assert_int_equal(n, 0);
    assert_int_equal(next, 6000);
    /* Not yet due. */
    dsp_sched_due(&r, 7000, 6999, true, 100, out, 16, &n, &next);
    assert_int_equal(n, 0);
    assert_int_equal(next, 7000);
    /* Due on time: one run. */
    dsp_sched_due(&r, 7000, 7100, false, 100, out, 16, &n, &next);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 7000);
    assert_int_equal(next, 8000);
    /* Missed 7000..10000 (4 runs): catch-up inserts all four, skip the latest only. */
    dsp_sched_due(&r, 7000, 10400, true, 100, out, 16, &n, &next);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(out[i], 7000 + 1000 * (int64_t)i);
    assert_int_equal(next, 11000);
    dsp_sched_due(&r, 7000, 10400, false, 100, out, 16, &n, &next);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 10000);
    assert_int_equal(next, 11000);
    /* Catch-up bounded: the latest 3 of them; and by the room given. */
    dsp_sched_due(&r, 7000, 10400, true, 3, out, 16, &n, &next);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 8000);
    assert_int_equal(out[2], 10000);
    dsp_sched_due(&r, 1000, 1000000000000LL, true, 1000, out, 16, &n, &next);
    assert_int_equal(n, 16);
    assert_int_equal(out[15], 1000000000000LL);
    assert_int_equal(out[0], 1000000000000LL - 15000);
    /* A next_run a producer set off the grid is due itself, then the grid. */
    dsp_sched_due(&r, 7300, 9100, true, 100, out, 16, &n, &next);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 7300);
    assert_int_equal(out[1], 8000);
    assert_int_equal(out[2], 9000);
}

static void test_cron_due_times(void **state)
{
    (void)state;
    dsp_sched_rule r = {.interval_ms = 0, .cron = cron("*/10 * * * *")};
    int64_t out[8], next;
    size_t n;
    int64_t base = at(2026, 11, 23, 8, 0);
    dsp_sched_due(&r, 0, base + 1, true, 100, out, 8, &n, &next);
    assert_int_equal(n, 0);
    assert_int_equal(next, base + 10 * MIN);
    dsp_sched_due(&r, base, base + 35 * MIN, true, 100, out, 8, &n, &next);
    assert_int_equal(n, 4);
    assert_int_equal(out[0], base);
    assert_int_equal(out[3], base + 30 * MIN);
    assert_int_equal(next, base + 40 * MIN);
    dsp_sched_due(&r, base, base + 35 * MIN, false, 100, out, 8, &n, &next);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], base + 30 * MIN);
    /* A year away: at most 31 days back are walked, the latest 8 kept, in order. */
    dsp_sched_due(&r, base, base + 365 * DAY, true, 100, out, 8, &n, &next);
    assert_int_equal(n, 8);
    for (size_t i = 0; i < 8; i++)
        assert_int_equal(out[i], base + 365 * DAY - (int64_t)(7 - i) * 10 * MIN);
    /* A cron that never matches again: next is -1. */
    dsp_sched_rule never = {.cron = cron("0 0 31 2 *")};
    dsp_sched_due(&never, base, base + 1, true, 10, out, 8, &n, &next);
    assert_int_equal(n, 1);
    assert_int_equal(next, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cron_parse_fields),
        cmocka_unit_test(test_cron_parse_refuses),
        cmocka_unit_test(test_cron_next),
        cmocka_unit_test(test_interval_due_times),
        cmocka_unit_test(test_cron_due_times),
    };
    return cmocka_run_group_tests_name("schedule", tests, NULL, NULL);
}
