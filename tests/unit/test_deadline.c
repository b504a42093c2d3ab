/* Unit tests of the deadline heap (dispatcher/deadline.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "deadline.h"

typedef struct item {
    int id;
    int64_t at_ms;
    dsp_deadline_node node;
} item;

#define ITEM_OF(n) ((item *)((char *)(n) - offsetof(item, node)))

/* A fixed-seed generator: the same sequence on every run. */
static uint32_t next_rand(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*state >> 33);
}

/* Every slot's node points back at it, and no parent is later than its child. */
static void check_heap(const dsp_deadline_heap *h)
{
    for (size_t i = 0; i < h->n; i++) {
        assert_int_equal(h->slots[i].node->index, i);
        assert_int_equal(h->slots[i].at_ms, ITEM_OF(h->slots[i].node)->at_ms);
        if (i > 0)
            assert_true(h->slots[(i - 1) / 2].at_ms <= h->slots[i].at_ms);
    }
}

/* Takes the earliest item out and returns it (NULL when empty). */
static item *pop(dsp_deadline_heap *h)
{
    int64_t at;
    dsp_deadline_node *n = dsp_deadline_peek(h, &at);
    if (!n)
        return NULL;
    item *it = ITEM_OF(n);
    assert_int_equal(at, it->at_ms);
    dsp_deadline_remove(h, n);
    assert_false(dsp_deadline_queued(n));
    return it;
}

static void add(dsp_deadline_heap *h, item *it, int64_t at)
{
    it->at_ms = at;
    assert_int_equal(dsp_deadline_insert(h, &it->node, at), 0);
    assert_true(dsp_deadline_queued(&it->node));
}

static void test_pops_in_deadline_order(void **state)
{
    (void)state;
    static const int64_t keys[] = {50, 10, 90, 10, 70, 30, -5, 1000, 0, 30, 20};
    enum { N = sizeof keys / sizeof keys[0] };
    item items[N];
    dsp_deadline_heap h;
    dsp_deadline_init(&h);
    int64_t at;
    assert_null(dsp_deadline_peek(&h, &at));
    for (int i = 0; i < N; i++) {
        items[i].id = i;
        dsp_deadline_node_init(&items[i].node);
        add(&h, &items[i], keys[i]);
        check_heap(&h);
    }
    assert_int_equal(h.n, N);
    int64_t last = INT64_MIN;
    for (int i = 0; i < N; i++) {
        item *it = pop(&h);
        assert_non_null(it);
        assert_true(it->at_ms >= last);
        last = it->at_ms;
        check_heap(&h);
    }
    assert_null(pop(&h));
    dsp_deadline_free(&h);
}

static void test_remove_from_the_middle(void **state)
{
    (void)state;
    enum { N = 32 };
    item items[N];
    dsp_deadline_heap h;
    dsp_deadline_init(&h);
    for (int i = 0; i < N; i++) {
        items[i].id = i;
        dsp_deadline_node_init(&items[i].node);
        add(&h, &items[i], (int64_t)((i * 7) % N)); /* a permutation of 0..N-1 */
    }
    /* Remove every third item wherever it sits, then the rest come out in order. */
    for (int i = 0; i < N; i += 3) {
        dsp_deadline_remove(&h, &items[i].node);
        assert_false(dsp_deadline_queued(&items[i].node));
        check_heap(&h);
    }
    dsp_deadline_remove(&h, &items[0].node); /* a second removal does nothing */
    size_t left = h.n;
    assert_int_equal(left, N - (N + 2) / 3);
    int64_t last = INT64_MIN;
    for (item *it; (it = pop(&h));) {
        assert_true(it->id % 3 != 0);
        assert_true(it->at_ms > last);
        last = it->at_ms;
        left--;
    }
    assert_int_equal(left, 0);
    dsp_deadline_free(&h);
}

static void test_update_moves_both_ways(void **state)
{
    (void)state;
    enum { N = 16 };
    item items[N];
    dsp_deadline_heap h;
    dsp_deadline_init(&h);
    for (int i = 0; i < N; i++) {
        items[i].id = i;
        dsp_deadline_node_init(&items[i].node);
        add(&h, &items[i], 100 + 10 * i);
    }
    int64_t at;
    /* The latest becomes the earliest. */
    items[N - 1].at_ms = 5;
    dsp_deadline_update(&h, &items[N - 1].node, 5);
    check_heap(&h);
    assert_ptr_equal(dsp_deadline_peek(&h, &at), &items[N - 1].node);
    assert_int_equal(at, 5);
    /* The earliest becomes the latest: the next one takes its place. */
    items[N - 1].at_ms = 10000;
    dsp_deadline_update(&h, &items[N - 1].node, 10000);
    check_heap(&h);
    assert_ptr_equal(dsp_deadline_peek(&h, &at), &items[0].node);
    /* A move in the middle, and an update to the same deadline. */
    items[7].at_ms = 101;
    dsp_deadline_update(&h, &items[7].node, 101);
    dsp_deadline_update(&h, &items[3].node, items[3].at_ms);
    check_heap(&h);
    assert_ptr_equal(pop(&h), &items[0]);
    assert_ptr_equal(pop(&h), &items[7]);
    assert_ptr_equal(pop(&h), &items[1]);
    dsp_deadline_free(&h);
}

/* Random inserts, removals and updates, each checked against a scan of all items. */
static void test_random_ops_match_a_scan(void **state)
{
    (void)state;
    enum { N = 500, OPS = 20000 };
    item *items = calloc(N, sizeof *items);
    assert_non_null(items);
    dsp_deadline_heap h;
    dsp_deadline_init(&h);
    for (int i = 0; i < N; i++) {
        items[i].id = i;
        dsp_deadline_node_init(&items[i].node);
    }
    uint64_t seed = 42;
    size_t queued = 0;
    for (int op = 0; op < OPS; op++) {
        item *it = &items[next_rand(&seed) % N];
        int64_t at = (int64_t)(next_rand(&seed) % 1000); /* many ties */
        uint32_t what = next_rand(&seed) % 4;
        if (!dsp_deadline_queued(&it->node)) {
            add(&h, it, at);
            queued++;
        } else if (what == 0) {
            dsp_deadline_remove(&h, &it->node);
            queued--;
        } else if (what == 1) {
            assert_non_null(pop(&h));
            queued--;
        } else {
            it->at_ms = at;
            dsp_deadline_update(&h, &it->node, at);
        }
        assert_int_equal(h.n, queued);
        /* The brute-force minimum among the queued items. */
        int64_t min = INT64_MAX;
        for (int i = 0; i < N; i++)
            if (dsp_deadline_queued(&items[i].node) && items[i].at_ms < min)
                min = items[i].at_ms;
        int64_t top;
        dsp_deadline_node *n = dsp_deadline_peek(&h, &top);
        if (queued == 0) {
            assert_null(n);
        } else {
            assert_non_null(n);
            assert_int_equal(top, min);
            assert_int_equal(ITEM_OF(n)->at_ms, min);
        }
        if (op % 97 == 0)
            check_heap(&h);
    }
    check_heap(&h);
    dsp_deadline_free(&h);
    free(items);
}

/* A realloc that fails once the test says so. */
static int realloc_fails;
static void *failing_realloc(void *ptr, size_t size)
{
    return realloc_fails ? NULL : realloc(ptr, size);
}

static void test_growth_and_allocation_failure(void **state)
{
    (void)state;
    enum { N = 300 };
    item items[N];
    dsp_deadline_heap h;
    dsp_deadline_init(&h);
    h.realloc_fn = failing_realloc;
    realloc_fails = 0;
    for (int i = 0; i < N; i++) {
        items[i].id = i;
        dsp_deadline_node_init(&items[i].node);
    }
    /* Grows past its first capacity. */
    size_t i = 0;
    while (h.n < h.cap || h.cap == 0)
        add(&h, &items[i], (int64_t)(N - i)), i++;
    size_t full = h.n, cap = h.cap;
    assert_true(full > 0);
    /* Full, and the allocator fails: the insert fails and changes nothing. */
    realloc_fails = 1;
    assert_int_equal(dsp_deadline_insert(&h, &items[i].node, -1), -1);
    assert_false(dsp_deadline_queued(&items[i].node));
    assert_int_equal(dsp_deadline_reserve(&h, cap + 1), -1);
    assert_int_equal(h.n, full);
    assert_int_equal(h.cap, cap);
    check_heap(&h);
    /* A reservation within the capacity needs no allocation. */
    assert_int_equal(dsp_deadline_reserve(&h, cap), 0);
    /* Removal and update still work while allocation fails. */
    dsp_deadline_remove(&h, &items[0].node);
    items[1].at_ms = -7;
    dsp_deadline_update(&h, &items[1].node, -7);
    check_heap(&h);
    add(&h, &items[0], 3); /* the freed slot is reused */
    /* Memory is back: growth goes on. */
    realloc_fails = 0;
    for (; i < N; i++)
        add(&h, &items[i], (int64_t)(N - i));
    assert_int_equal(h.n, N);
    assert_true(h.cap > cap);
    check_heap(&h);
    assert_ptr_equal(pop(&h), &items[1]);
    size_t count = 1;
    int64_t last = -7;
    for (item *it; (it = pop(&h)); count++) {
        assert_true(it->at_ms >= last);
        last = it->at_ms;
    }
    assert_int_equal(count, N);
    dsp_deadline_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pops_in_deadline_order),
        cmocka_unit_test(test_remove_from_the_middle),
        cmocka_unit_test(test_update_moves_both_ways),
        cmocka_unit_test(test_random_ops_match_a_scan),
        cmocka_unit_test(test_growth_and_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
