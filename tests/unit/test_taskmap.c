/* Unit tests of the task_id -> task map (dispatcher/common/taskmap.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "taskmap.h"

static void *val(uint64_t k)
{
    return (void *)(uintptr_t)(k * 2 + 1); /* never NULL */
}

static void test_get_on_empty_map(void **state)
{
    (void)state;
    dsp_taskmap m;
    assert_int_equal(dsp_taskmap_init(&m, 4), 0);
    assert_null(dsp_taskmap_get(&m, 42));
    assert_null(dsp_taskmap_del(&m, 42));
    dsp_taskmap_free(&m);
}

static void test_put_get_replace(void **state)
{
    (void)state;
    dsp_taskmap m;
    assert_int_equal(dsp_taskmap_init(&m, 4), 0);
    assert_int_equal(dsp_taskmap_put(&m, 7, val(7)), 0);
    assert_ptr_equal(dsp_taskmap_get(&m, 7), val(7));
    assert_int_equal(dsp_taskmap_put(&m, 7, val(8)), 0);
    assert_ptr_equal(dsp_taskmap_get(&m, 7), val(8));
    assert_int_equal(m.count, 1);
    dsp_taskmap_free(&m);
}

static void test_grows_and_keeps_everything(void **state)
{
    (void)state;
    dsp_taskmap m;
    assert_int_equal(dsp_taskmap_init(&m, 1), 0);
    for (uint64_t k = 1; k <= 100000; k++)
        assert_int_equal(dsp_taskmap_put(&m, k, val(k)), 0);
    assert_int_equal(m.count, 100000);
    for (uint64_t k = 1; k <= 100000; k++)
        assert_ptr_equal(dsp_taskmap_get(&m, k), val(k));
    assert_null(dsp_taskmap_get(&m, 100001));
    dsp_taskmap_free(&m);
}

/* Deleting must not break the probe chains of the keys left behind. */
static void test_churn_against_reference(void **state)
{
    (void)state;
    enum { KEYS = 5000, OPS = 200000 };
    dsp_taskmap m;
    assert_int_equal(dsp_taskmap_init(&m, 16), 0);
    unsigned char *present = calloc(KEYS, 1);
    assert_non_null(present);
    uint64_t x = 88172645463325252ULL;
    size_t count = 0;
    for (int i = 0; i < OPS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t k = x % KEYS;
        if (x & (1ULL << 40)) {
            if (!present[k])
                count++;
            present[k] = 1;
            assert_int_equal(dsp_taskmap_put(&m, k * 1000003ULL, val(k)), 0);
        } else {
            void *got = dsp_taskmap_del(&m, k * 1000003ULL);
            assert_ptr_equal(got, present[k] ? val(k) : NULL);
            if (present[k])
                count--;
            present[k] = 0;
        }
    }
    assert_int_equal(m.count, count);
    for (uint64_t k = 0; k < KEYS; k++)
        assert_ptr_equal(dsp_taskmap_get(&m, k * 1000003ULL), present[k] ? val(k) : NULL);
    free(present);
    dsp_taskmap_free(&m);
}

static void test_extreme_keys(void **state)
{
    (void)state;
    dsp_taskmap m;
    assert_int_equal(dsp_taskmap_init(&m, 4), 0);
    assert_int_equal(dsp_taskmap_put(&m, 0, val(0)), 0);
    assert_int_equal(dsp_taskmap_put(&m, UINT64_MAX, val(3)), 0);
    assert_ptr_equal(dsp_taskmap_get(&m, 0), val(0));
    assert_ptr_equal(dsp_taskmap_get(&m, UINT64_MAX), val(3));
    assert_ptr_equal(dsp_taskmap_del(&m, 0), val(0));
    assert_null(dsp_taskmap_get(&m, 0));
    assert_ptr_equal(dsp_taskmap_get(&m, UINT64_MAX), val(3));
    dsp_taskmap_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_on_empty_map),
        cmocka_unit_test(test_put_get_replace),
        cmocka_unit_test(test_grows_and_keeps_everything),
        cmocka_unit_test(test_churn_against_reference),
        cmocka_unit_test(test_extreme_keys),
    };
    return cmocka_run_group_tests_name("taskmap", tests, NULL, NULL);
}
