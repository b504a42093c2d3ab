/* Unit tests of the worker picker (dispatcher/dispatch.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config.h"
#include "dispatch.h"

#define N 4

static dsp_sched_slots slots[N];
static dsp_sched_slots *ptrs[N];

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < N; i++) {
        slots[i] = (dsp_sched_slots){.in_flight = 0, .capacity = 4, .accepting = true};
        ptrs[i] = &slots[i];
    }
    return 0;
}

static void test_empty_set_picks_nothing(void **state)
{
    (void)state;
    size_t cursor = 0;
    assert_int_equal(dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, 0, &cursor), -1);
    assert_int_equal(dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, 0, &cursor), -1);
}

static void test_round_robin_rotates_over_equal_workers(void **state)
{
    (void)state;
    size_t cursor = 0;
    int counts[N] = {0};
    for (int i = 0; i < 400; i++) {
        int p = dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, N, &cursor);
        assert_in_range(p, 0, N - 1);
        counts[p]++;
        /* the task completes at once: the slot is free again */
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(counts[i], 100);
}

static void test_round_robin_alternates_even_when_loads_differ(void **state)
{
    (void)state;
    slots[0].in_flight = 3; /* busy, one slot left */
    size_t cursor = 0;
    assert_int_equal(dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, 2, &cursor), 0);
    assert_int_equal(dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, 2, &cursor), 1);
    assert_int_equal(dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, 2, &cursor), 0);
}

static void test_least_loaded_prefers_idle_worker(void **state)
{
    (void)state;
    slots[0].in_flight = 3;
    size_t cursor = 0;
    for (int i = 0; i < 3; i++) {
        int p = dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, 2, &cursor);
        assert_int_equal(p, 1);
        slots[p].in_flight++;
    }
    /* now 3/4 against 3/4: a tie, and the rotation moves on */
    int p = dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, 2, &cursor);
    assert_int_equal(p, 0);
}

static void test_least_loaded_compares_ratios_not_counts(void **state)
{
    (void)state;
    slots[0] = (dsp_sched_slots){.in_flight = 2, .capacity = 16, .accepting = true}; /* 1/8 */
    slots[1] = (dsp_sched_slots){.in_flight = 1, .capacity = 2, .accepting = true};  /* 1/2 */
    size_t cursor = 1;
    assert_int_equal(dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, 2, &cursor), 0);
}

static void test_full_workers_are_never_picked(void **state)
{
    (void)state;
    for (int i = 0; i < N; i++)
        slots[i].in_flight = slots[i].capacity;
    size_t cursor = 0;
    assert_int_equal(dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, N, &cursor), -1);
    assert_int_equal(dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, N, &cursor), -1);
    slots[2].in_flight--;
    assert_int_equal(dsp_sched_pick(DSP_SCHED_ROUND_ROBIN, ptrs, N, &cursor), 2);
    assert_int_equal(dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, N, &cursor), 2);
}

static void test_workers_not_accepting_are_skipped(void **state)
{
    (void)state;
    slots[0].accepting = false;
    slots[1].accepting = false;
    size_t cursor = 0;
    for (int i = 0; i < 10; i++) {
        int p = dsp_sched_pick(i % 2 ? DSP_SCHED_LEAST_LOADED : DSP_SCHED_ROUND_ROBIN, ptrs, N, &cursor);
        assert_true(p == 2 || p == 3);
    }
}

static void test_credit_never_exceeds_capacity(void **state)
{
    (void)state;
    size_t cursor = 0;
    int picked = 0;
    for (;;) {
        int p = dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, N, &cursor);
        if (p < 0)
            break;
        slots[p].in_flight++;
        picked++;
        assert_true(slots[p].in_flight <= slots[p].capacity);
    }
    assert_int_equal(picked, N * 4);
}

static void test_least_loaded_spreads_evenly(void **state)
{
    (void)state;
    size_t cursor = 0;
    for (int i = 0; i < 8; i++) {
        int p = dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ptrs, N, &cursor);
        slots[p].in_flight++;
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(slots[i].in_flight, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_empty_set_picks_nothing, setup),
        cmocka_unit_test_setup(test_round_robin_rotates_over_equal_workers, setup),
        cmocka_unit_test_setup(test_round_robin_alternates_even_when_loads_differ, setup),
        cmocka_unit_test_setup(test_least_loaded_prefers_idle_worker, setup),
        cmocka_unit_test_setup(test_least_loaded_compares_ratios_not_counts, setup),
        cmocka_unit_test_setup(test_full_workers_are_never_picked, setup),
        cmocka_unit_test_setup(test_workers_not_accepting_are_skipped, setup),
        cmocka_unit_test_setup(test_credit_never_exceeds_capacity, setup),
        cmocka_unit_test_setup(test_least_loaded_spreads_evenly, setup),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
