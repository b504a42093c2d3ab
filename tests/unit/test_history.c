/* Unit tests of dispatcher/history.c: the ring of samples behind GET /history. Its
 * bounds (never more than its capacity, the oldest overwritten, the order kept across
 * the wrap), the per-interval counts taken from growing counters, the clamps, and the
 * JSON the page reads; then the sampling of an offline server's tick. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config.h"
#include "history.h"
#include "server.h"

static dsp_history_input input(uint64_t done)
{
    return (dsp_history_input){.succeeded_total = done,
                               .failed_total = done / 10,
                               .dispatched_total = 2 * done,
                               .buffered = 7,
                               .in_flight = 3,
                               .workers = 2,
                               .oldest_ready_age_ms = -1};
}

static void test_bounds_and_wrap(void **state)
{
    (void)state;
    dsp_history h;
    assert_int_equal(dsp_history_init(&h, 0), -1);
    assert_int_equal(dsp_history_init(&h, 5), 0);
    assert_null(dsp_history_at(&h, 0));
    assert_true(dsp_history_due(&h, 0));
    /* 13 samples, 5 s apart, into 5 slots: the last 5 stay, oldest first. */
    for (int i = 0; i < 13; i++) {
        dsp_history_input in = input((uint64_t)i * 100);
        assert_true(dsp_history_due(&h, (int64_t)i * DSP_HISTORY_PERIOD_MS));
        dsp_history_record(&h, (int64_t)i * DSP_HISTORY_PERIOD_MS, 1000000 + i, &in);
        assert_false(
            dsp_history_due(&h, (int64_t)i * DSP_HISTORY_PERIOD_MS + DSP_HISTORY_PERIOD_MS - 1));
        assert_int_equal(h.n, i + 1 < 5 ? i + 1 : 5);
    }
    assert_int_equal(h.capacity, 5);
    for (size_t k = 0; k < 5; k++) {
        const dsp_history_sample *s = dsp_history_at(&h, k);
        assert_non_null(s);
        assert_true(s >= h.ring && s < h.ring + h.capacity);
        assert_int_equal(s->wall_ms, 1000000 + 8 + (int64_t)k);
        assert_int_equal(s->interval_ms, DSP_HISTORY_PERIOD_MS);
        assert_int_equal(s->succeeded, 100);
        assert_int_equal(s->dispatched, 200);
        assert_int_equal(s->buffered, 7);
        assert_int_equal(s->in_flight, 3);
        assert_int_equal(s->workers, 2);
        assert_int_equal(s->table_new, -1); /* the table figures were never read */
    }
    assert_null(dsp_history_at(&h, 5));
    assert_null(dsp_history_at(&h, SIZE_MAX));
    dsp_history_free(&h);
    assert_null(h.ring);
    /* A freed (or never allocated) ring takes nothing. */
    dsp_history_input in = input(1);
    dsp_history_record(&h, 0, 0, &in);
    assert_int_equal(h.n, 0);
    assert_false(dsp_history_due(&h, 0));
}

static void test_counts_and_clamps(void **state)
{
    (void)state;
    dsp_history h;
    assert_int_equal(dsp_history_init(&h, 3), 0);
    dsp_history_input in = input(500);
    dsp_history_record(&h, 100, 1, &in);
    const dsp_history_sample *s = dsp_history_at(&h, 0);
    /* The first sample has nothing to compare with: no counts, no interval. */
    assert_int_equal(s->interval_ms, 0);
    assert_int_equal(s->succeeded, 0);
    assert_int_equal(s->failed, 0);

    in.succeeded_total = 500 + (uint64_t)UINT32_MAX + 10; /* more than a sample holds */
    in.failed_total = 10;                                 /* went back: counted as 0 */
    in.buffered = UINT64_MAX;
    in.table_valid = true;
    in.table_new = 40;
    in.table_ready = 30;
    in.table_failed = UINT64_MAX;
    in.oldest_ready_age_ms = 1234;
    dsp_history_record(&h, 5100, 2, &in);
    s = dsp_history_at(&h, 1);
    assert_int_equal(s->interval_ms, 5000);
    assert_int_equal(s->succeeded, UINT32_MAX);
    assert_int_equal(s->failed, 0);
    assert_int_equal(s->buffered, UINT32_MAX);
    assert_int_equal(s->table_new, 40);
    assert_int_equal(s->table_ready, 30);
    assert_int_equal(s->table_failed, INT64_MAX);
    assert_int_equal(s->oldest_ready_age_ms, 1234);

    /* A clock that went back gives an interval of 0, never a negative one. */
    dsp_history_record(&h, 50, 3, &in);
    assert_int_equal(dsp_history_at(&h, 2)->interval_ms, 0);
    dsp_history_free(&h);
}

static void test_json(void **state)
{
    (void)state;
    dsp_history h;
    assert_int_equal(dsp_history_init(&h, 4), 0);
    json_t *o = dsp_history_json(&h, 42);
    assert_non_null(o);
    assert_int_equal(json_integer_value(json_object_get(o, "now_ms")), 42);
    assert_int_equal(json_integer_value(json_object_get(o, "interval_ms")), DSP_HISTORY_PERIOD_MS);
    assert_int_equal(json_integer_value(json_object_get(o, "capacity")), 4);
    assert_int_equal(json_array_size(json_object_get(o, "samples")), 0);
    json_decref(o);

    for (int i = 0; i < 6; i++) {
        dsp_history_input in = input((uint64_t)i * 10);
        in.table_valid = i >= 3;
        in.table_new = 9;
        in.oldest_ready_age_ms = i == 5 ? 777 : -1;
        dsp_history_record(&h, (int64_t)i * 5000, 100 + i, &in);
    }
    o = dsp_history_json(&h, 200);
    json_t *samples = json_object_get(o, "samples");
    assert_int_equal(json_array_size(samples), 4);
    for (size_t k = 0; k < 4; k++) {
        json_t *js = json_array_get(samples, k);
        assert_int_equal(json_integer_value(json_object_get(js, "t")), 102 + (int)k);
        assert_int_equal(json_integer_value(json_object_get(js, "dt")), 5000);
        assert_int_equal(json_integer_value(json_object_get(js, "succeeded")), 10);
        assert_int_equal(json_integer_value(json_object_get(js, "failed")), 1);
        assert_int_equal(json_integer_value(json_object_get(js, "dispatched")), 20);
        assert_int_equal(json_integer_value(json_object_get(js, "in_flight")), 3);
        assert_int_equal(json_integer_value(json_object_get(js, "workers")), 2);
        json_t *tn = json_object_get(js, "table_new");
        json_t *age = json_object_get(js, "oldest_ready_age_ms");
        if (k == 0) { /* sample 2: figures not read yet */
            assert_true(json_is_null(tn));
            assert_true(json_is_null(age));
        } else {
            assert_int_equal(json_integer_value(tn), 9);
            assert_int_equal(json_integer_value(age), k == 3 ? 777 : -1);
        }
    }
    json_decref(o);
    dsp_history_free(&h);
}

/* The loop's tick on an offline server: a sample at once, the next a period later. */
static void test_server_tick(void **state)
{
    (void)state;
    dsp_config cfg;
    char *argv[] = {"taskpushd", "--db", "mysql://u@localhost/history", "--log-level", "error"};
    char err[256] = "";
    FILE *out = fopen("/dev/null", "w");
    assert_non_null(out);
    assert_int_equal(dsp_config_load(&cfg, 5, argv, out, err, sizeof err), DSP_CONFIG_OK);
    fclose(out);
    dsp_server srv;
    assert_int_equal(dsp_server_init_offline(&srv, &cfg), 0);
    assert_int_equal(srv.stats.history.capacity, DSP_HISTORY_SAMPLES);
    srv.stats.tasks.succeeded_total = 40;
    srv.sched.nbuffered = 11;
    dsp_history_tick(&srv, 1000);
    dsp_history_tick(&srv, 1000 + DSP_HISTORY_PERIOD_MS - 1);
    assert_int_equal(srv.stats.history.n, 1);
    srv.stats.tasks.succeeded_total = 65;
    srv.stats.tasks.failed_total = 5;
    srv.sched.ninflight = 4;
    dsp_history_tick(&srv, 1000 + DSP_HISTORY_PERIOD_MS);
    assert_int_equal(srv.stats.history.n, 2);
    const dsp_history_sample *s = dsp_history_at(&srv.stats.history, 1);
    assert_int_equal(s->succeeded, 25);
    assert_int_equal(s->failed, 5);
    assert_int_equal(s->buffered, 11);
    assert_int_equal(s->in_flight, 4);
    assert_int_equal(s->table_new, -1); /* no database side: no figures */
    assert_true(s->wall_ms > 0);
    dsp_server_free(&srv);
    dsp_config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_and_wrap),
        cmocka_unit_test(test_counts_and_clamps),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_server_tick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
