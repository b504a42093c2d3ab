/* Unit tests of dispatcher/dispatch.c: the worker picker, the per-type priority queues
 * (order, take-backs, unlink) and the claim budget's arithmetic (bounded, saturating). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>
#include <math.h>
#include <cmocka.h>

#include "config.h"
#include "dispatch.h"
#include "server.h"

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

/* ---- the least-loaded heap: the same choices as the scan, in O(log K) ---- */

#define LN 40

/* Random workers (some full, some not accepting), then one pass of picks through the
 * heap until nothing has room: every pick has the lowest in_flight/capacity of all
 * workers with room, and the pass fills every free slot exactly once. */
static void test_ll_heap_picks_least_loaded(void **state)
{
    (void)state;
    static dsp_sched_slots w[LN];
    static dsp_sched_slots *wp[LN];
    unsigned seed = 12345;
    dsp_ll_heap h = {0};
    for (int round = 0; round < 200; round++) {
        uint64_t room = 0;
        for (int i = 0; i < LN; i++) {
            seed = seed * 1103515245u + 12345u;
            uint32_t cap = 1 + (seed >> 16) % 20;
            seed = seed * 1103515245u + 12345u;
            w[i] = (dsp_sched_slots){.capacity = cap, .in_flight = (seed >> 16) % (cap + 1),
                                     .accepting = (seed >> 8) % 7 != 0};
            wp[i] = &w[i];
            if (dsp_sched_has_room(&w[i]))
                room += w[i].capacity - w[i].in_flight;
        }
        size_t cursor = (size_t)round;
        assert_int_equal(dsp_ll_build(&h, wp, LN, cursor), 0);
        uint64_t picks = 0;
        int p;
        while ((p = dsp_ll_pick(&h, wp, &cursor)) >= 0) {
            assert_true(dsp_sched_has_room(&w[p]));
            for (int j = 0; j < LN; j++)
                if (dsp_sched_has_room(&w[j]))
                    assert_true((uint64_t)w[p].in_flight * w[j].capacity <=
                                (uint64_t)w[j].in_flight * w[p].capacity);
            assert_int_equal(cursor, (size_t)p + 1);
            w[p].in_flight++;
            picks++;
        }
        assert_int_equal(picks, room);
    }
    free(h.e);
}

/* Equal idle workers are taken in turn from the cursor, as dsp_sched_pick does. */
static void test_ll_heap_takes_turns(void **state)
{
    (void)state;
    static dsp_sched_slots w[16];
    static dsp_sched_slots *wp[16];
    for (int i = 0; i < 16; i++) {
        w[i] = (dsp_sched_slots){.capacity = 4, .accepting = true};
        wp[i] = &w[i];
    }
    dsp_ll_heap h = {0};
    size_t cursor = 5;
    assert_int_equal(dsp_ll_build(&h, wp, 16, cursor), 0);
    for (int k = 0; k < 32; k++) {
        int p = dsp_ll_pick(&h, wp, &cursor);
        assert_int_equal(p, (5 + k) % 16);
        w[p].in_flight++;
    }
    free(h.e);
}

/* ---- the per-type priority queues ---- */

#define QN 64

static dsp_server qsrv;
static dsp_type qty;
static dsp_task qtasks[QN];

static int qsetup(void **state)
{
    (void)state;
    memset(&qsrv, 0, sizeof qsrv);
    memset(&qty, 0, sizeof qty);
    memset(qtasks, 0, sizeof qtasks);
    return 0;
}

/* Task i with priority prio, claimed as the seq-th task. */
static dsp_task *qtask(int i, uint8_t prio, uint64_t seq)
{
    dsp_task *t = &qtasks[i];
    t->id = (uint64_t)i + 1;
    t->priority = prio;
    t->seq = seq;
    t->type = &qty;
    return t;
}

static void test_queue_high_claimed_later_goes_first(void **state)
{
    (void)state;
    /* A thousand-task buffer in small: NORMAL and LOW first, then one HIGH. */
    uint64_t seq = 0;
    for (int i = 0; i < 40; i++)
        dsp_dispatch_enqueue(&qsrv, &qty, qtask(i, (uint8_t)(i % 2), seq++));
    assert_ptr_equal(qsrv.sched.busy_types, &qty);
    dsp_dispatch_enqueue(&qsrv, &qty, qtask(40, 2, seq++));
    assert_int_equal(qty.nbuffered, 41);
    assert_ptr_equal(dsp_dispatch_peek(&qty), &qtasks[40]);
    assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[40]);
    /* Then every NORMAL in claim order (FIFO), then every LOW. */
    for (int want = 1; want < 40; want += 2)
        assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[want]);
    for (int want = 0; want < 40; want += 2)
        assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[want]);
    assert_int_equal(qty.nbuffered, 0);
    assert_null(dsp_dispatch_peek(&qty));
    assert_null(qsrv.sched.busy_types);
    for (int p = 0; p < DSP_PRIORITIES; p++)
        assert_true(qty.head[p] == NULL && qty.tail[p] == NULL);
}

static void test_queue_priority_from_table_above_high_is_high(void **state)
{
    (void)state;
    dsp_dispatch_enqueue(&qsrv, &qty, qtask(0, 2, 1));
    dsp_dispatch_enqueue(&qsrv, &qty, qtask(1, 255, 2)); /* a hostile column value */
    dsp_dispatch_enqueue(&qsrv, &qty, qtask(2, 1, 3));
    assert_ptr_equal(qty.tail[2], &qtasks[1]);
    assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[0]);
    assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[1]);
    assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[2]);
}

static void test_queue_taken_back_goes_back_in_seq_order(void **state)
{
    (void)state;
    for (int i = 0; i < 6; i++)
        dsp_dispatch_enqueue(&qsrv, &qty, qtask(i, 1, (uint64_t)i + 10));
    /* Delivered: 10, 11, 12; taken back out of order: 12, then 10, then 11. */
    dsp_task *a = dsp_dispatch_dequeue(&qsrv, &qty);
    dsp_task *b = dsp_dispatch_dequeue(&qsrv, &qty);
    dsp_task *c = dsp_dispatch_dequeue(&qsrv, &qty);
    dsp_dispatch_enqueue(&qsrv, &qty, c);
    dsp_dispatch_enqueue(&qsrv, &qty, a);
    dsp_dispatch_enqueue(&qsrv, &qty, b);
    /* A later claim's task goes to the tail. */
    dsp_dispatch_enqueue(&qsrv, &qty, qtask(6, 1, 100));
    uint64_t last = 0;
    for (int i = 0; i < 7; i++) {
        dsp_task *t = dsp_dispatch_dequeue(&qsrv, &qty);
        assert_true(t->seq > last);
        last = t->seq;
    }
    assert_int_equal(last, 100);
    assert_int_equal(qty.nbuffered, 0);
}

static void test_queue_unlink_anywhere(void **state)
{
    (void)state;
    for (int i = 0; i < 9; i++)
        dsp_dispatch_enqueue(&qsrv, &qty, qtask(i, (uint8_t)(i / 3), (uint64_t)i));
    /* The head, a middle and the tail of lists, and a whole list (HIGH: 6, 7, 8). */
    dsp_dispatch_unlink(&qsrv, &qtasks[0]);
    dsp_dispatch_unlink(&qsrv, &qtasks[4]);
    dsp_dispatch_unlink(&qsrv, &qtasks[5]);
    dsp_dispatch_unlink(&qsrv, &qtasks[7]);
    dsp_dispatch_unlink(&qsrv, &qtasks[6]);
    dsp_dispatch_unlink(&qsrv, &qtasks[8]);
    assert_null(qty.head[2]);
    assert_null(qty.tail[2]);
    assert_int_equal(qty.nbuffered, 3);
    assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[3]);
    assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[1]);
    dsp_dispatch_unlink(&qsrv, &qtasks[2]);
    assert_int_equal(qty.nbuffered, 0);
    assert_null(qsrv.sched.busy_types);
    assert_null(dsp_dispatch_peek(&qty));
}

/* Random enqueues, dequeues and unlinks against a plain model: the next task is always
 * the buffered one of highest priority, then lowest seq. */
static void test_queue_matches_model(void **state)
{
    (void)state;
    bool in[QN] = {false};
    uint32_t x = 12345;
    uint64_t seq = 1;
    for (int step = 0; step < 20000; step++) {
        x = x * 1103515245u + 12345u;
        int i = (int)((x >> 16) % QN);
        int op = (int)((x >> 8) % 3);
        if (!in[i] && op < 2) {
            dsp_dispatch_enqueue(&qsrv, &qty, qtask(i, (uint8_t)((x >> 4) % 3), seq++));
            in[i] = true;
        } else if (in[i] && op == 2) {
            dsp_dispatch_unlink(&qsrv, &qtasks[i]);
            in[i] = false;
        } else if (qty.nbuffered > 0) {
            int best = -1;
            for (int k = 0; k < QN; k++)
                if (in[k] && (best < 0 || qtasks[k].priority > qtasks[best].priority ||
                              (qtasks[k].priority == qtasks[best].priority &&
                               qtasks[k].seq < qtasks[best].seq)))
                    best = k;
            assert_ptr_equal(dsp_dispatch_dequeue(&qsrv, &qty), &qtasks[best]);
            in[best] = false;
        }
        size_t n = 0;
        for (int k = 0; k < QN; k++)
            n += in[k];
        assert_int_equal(qty.nbuffered, n);
        assert_true((qsrv.sched.busy_types == &qty) == (n > 0));
    }
}

/* ---- the claim budget ---- */

static void test_budget_is_room_plus_ahead_less_held(void **state)
{
    (void)state;
    assert_int_equal(dsp_claim_budget(4, 40, 10, 1000), 34);
    assert_int_equal(dsp_claim_budget(4, 40, 44, 1000), 0);
    assert_int_equal(dsp_claim_budget(4, 40, 500, 1000), 0); /* more held than wanted */
    assert_int_equal(dsp_claim_budget(4, 40, 0, 10), 10);    /* --batch */
    assert_int_equal(dsp_claim_budget(0, 0, 0, 1000), 0);
    assert_int_equal(dsp_claim_budget(4, 40, 0, 0), 0);
}

static void test_budget_saturates_with_hostile_capacities(void **state)
{
    (void)state;
    /* Room summed over a million workers of capacity 65536, or any wrapped figure: the
     * sum saturates instead of wrapping to a small number, and the cap bounds it. */
    assert_int_equal(dsp_claim_budget(UINT64_MAX, UINT64_MAX, 0, 1000), 1000);
    assert_int_equal(dsp_claim_budget(UINT64_MAX, 1, 5, 10000), 10000);
    assert_int_equal(dsp_claim_budget(UINT64_MAX - 3, 1000, UINT64_MAX, 10000), 0);
    assert_int_equal(dsp_claim_budget(65536ull * 1000000ull, 1000000, 0, UINT64_MAX),
                     65536ull * 1000000ull + 1000000);
    assert_int_equal(dsp_claim_budget(1, UINT64_MAX, UINT64_MAX - 1, UINT64_MAX), 1);
}

static void test_ahead_follows_rate_within_floor_and_prefetch(void **state)
{
    (void)state;
    /* 400 tasks/s over 100 ms: 40. */
    assert_int_equal(dsp_claim_ahead(400.0, 100, 32, 1000), 40);
    /* A cold start: the floor. */
    assert_int_equal(dsp_claim_ahead(0.0, 100, 32, 1000), 32);
    /* 33,000 tasks/s: --prefetch bounds it. */
    assert_int_equal(dsp_claim_ahead(33000.0, 100, 32, 1000), 1000);
    /* --prefetch-ms 0: all of --prefetch; --prefetch 0: nothing ahead. */
    assert_int_equal(dsp_claim_ahead(0.0, 0, 32, 1000), 1000);
    assert_int_equal(dsp_claim_ahead(5000.0, 100, 32, 0), 0);
    assert_int_equal(dsp_claim_ahead(5000.0, 100, 32, -7), 0);
    /* A floor above --prefetch is cut to it. */
    assert_int_equal(dsp_claim_ahead(0.0, 100, 32, 10), 10);
}

static void test_ahead_is_bounded_for_any_rate(void **state)
{
    (void)state;
    const double odd[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0, 1e300, -1e300, 1e-300, DBL_MAX};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        uint64_t a = dsp_claim_ahead(odd[i], 60000, 32, 1000000);
        assert_in_range(a, 32, 1000000);
        a = dsp_claim_ahead(odd[i], INT64_MAX, UINT64_MAX, 1000);
        assert_int_equal(a, 1000);
    }
    assert_int_equal(dsp_claim_ahead(INFINITY, 100, 1, 1000), 1000);
    assert_int_equal(dsp_claim_ahead(NAN, 100, 1, 1000), 1);
}

static void test_pace_averages_completions(void **state)
{
    (void)state;
    dsp_pace p = {0};
    assert_true(dsp_pace_rate(&p, 1000) == 0.0); /* the first read starts the clock */
    for (int i = 0; i < 100; i++)
        dsp_pace_note(&p);
    /* Within DSP_PACE_SAMPLE_MS nothing is folded in. */
    assert_true(dsp_pace_rate(&p, 1000 + DSP_PACE_SAMPLE_MS - 1) == 0.0);
    /* 100 in DSP_PACE_TAU_UP_MS (250 ms): a rising 400/s replaces the average. */
    assert_true(fabs(dsp_pace_rate(&p, 1000 + DSP_PACE_TAU_UP_MS) - 400.0) < 1e-9);
    /* A quarter of the falling time constant with nothing: a quarter of the way to 0. */
    int64_t at = 1000 + DSP_PACE_TAU_UP_MS + DSP_PACE_TAU_DOWN_MS / 4;
    assert_true(fabs(dsp_pace_rate(&p, at) - 300.0) < 1e-9);
    /* 100 in half the rising constant (800/s): half-way up from 300, 550. */
    for (int i = 0; i < 100; i++)
        dsp_pace_note(&p);
    assert_true(fabs(dsp_pace_rate(&p, at + DSP_PACE_TAU_UP_MS / 2) - 550.0) < 1e-9);
    /* A long idle: 0. */
    assert_true(dsp_pace_rate(&p, 1000000) == 0.0);
    /* A clock going back restarts the interval without a negative rate. */
    dsp_pace_note(&p);
    assert_true(dsp_pace_rate(&p, 5) == 0.0);
    assert_int_equal(p.count, 0);
}

/* The rate limit's bucket starts full with one second's worth, refills R a second on the
 * clock given, never beyond that burst, and so lets at most R + burst starts through any
 * one-second window. */
static void test_bucket_burst_then_rate(void **state)
{
    (void)state;
    dsp_bucket b = {0};
    int n = 0;
    while (dsp_bucket_take(&b, 10, 1000))
        n++;
    assert_int_equal(n, 10); /* the burst */
    assert_false(dsp_bucket_ready(&b, 10, 1099));
    assert_true(dsp_bucket_take(&b, 10, 1100)); /* 10/s: one every 100 ms */
    assert_false(dsp_bucket_take(&b, 10, 1150));
    assert_true(dsp_bucket_take(&b, 10, 1200));
    /* A long idle refills only the burst. */
    n = 0;
    while (dsp_bucket_take(&b, 10, 100000))
        n++;
    assert_int_equal(n, 10);
    /* A clock going back adds nothing. */
    assert_false(dsp_bucket_take(&b, 10, 50));
    /* Rate 1: a burst of one. */
    dsp_bucket one = {0};
    assert_true(dsp_bucket_take(&one, 1, 5));
    assert_false(dsp_bucket_take(&one, 1, 999));
    assert_true(dsp_bucket_take(&one, 1, 1005));
}

static void test_bucket_window_bound(void **state)
{
    (void)state;
    /* Take whenever possible every millisecond for 5 s: every 1000 ms window holds at
     * most R + burst = 2 R starts, and the whole run about R a second after the burst. */
    enum { R = 37, T = 5000 };
    static int64_t at[T * R];
    size_t n = 0;
    dsp_bucket b = {0};
    for (int64_t now = 1; now <= T; now++)
        while (n < sizeof at / sizeof at[0] && dsp_bucket_take(&b, R, now))
            at[n++] = now;
    for (size_t i = 0, j = 0; i < n; i++) {
        while (at[i] - at[j] >= 1000)
            j++;
        assert_true(i - j + 1 <= 2 * R);
    }
    assert_in_range(n, R + R * (T - 1) / 1000 - 1, R + R * T / 1000 + 1);
    /* A lowered rate cuts what was stored to its own burst. */
    dsp_bucket c = {0};
    dsp_bucket_refill(&c, 1000, 10);
    size_t k = 0;
    while (dsp_bucket_take(&c, 2, 10))
        k++;
    assert_int_equal(k, 2);
    /* The largest rate over the longest gap does not wrap. */
    dsp_bucket d = {0};
    dsp_bucket_refill(&d, DSP_LIMIT_MAX, 1);
    dsp_bucket_refill(&d, DSP_LIMIT_MAX, INT64_MAX);
    assert_int_equal(d.milli, (uint64_t)DSP_LIMIT_MAX * 1000);
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
        cmocka_unit_test(test_ll_heap_picks_least_loaded),
        cmocka_unit_test(test_ll_heap_takes_turns),
        cmocka_unit_test_setup(test_queue_high_claimed_later_goes_first, qsetup),
        cmocka_unit_test_setup(test_queue_priority_from_table_above_high_is_high, qsetup),
        cmocka_unit_test_setup(test_queue_taken_back_goes_back_in_seq_order, qsetup),
        cmocka_unit_test_setup(test_queue_unlink_anywhere, qsetup),
        cmocka_unit_test_setup(test_queue_matches_model, qsetup),
        cmocka_unit_test(test_budget_is_room_plus_ahead_less_held),
        cmocka_unit_test(test_budget_saturates_with_hostile_capacities),
        cmocka_unit_test(test_ahead_follows_rate_within_floor_and_prefetch),
        cmocka_unit_test(test_ahead_is_bounded_for_any_rate),
        cmocka_unit_test(test_pace_averages_completions),
        cmocka_unit_test(test_bucket_burst_then_rate),
        cmocka_unit_test(test_bucket_window_bound),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
