/* Allocation failure in the codec (proto/) and the SQL builders (dispatcher/db/db_claim_sql.c,
 * dispatcher/db/db_sql.c): for every N, the Nth allocation of a call fails, until the call
 * makes no more allocations than N - 1; each run must end with the builder's failure
 * flag set (never a statement that looks whole) and nothing left allocated.
 *
 * The seam is the link: this executable alone is linked with -Wl,--wrap=malloc (and
 * calloc, realloc, free; see tests/unit/meson.build), so the daemon's code is the code
 * tested, unchanged. The wrappers count only while a case has armed them; the counters
 * below are this test program's own. Under the ASan build LeakSanitizer checks the same
 * at exit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "db_claim_sql.h"
#include "db_sql.h"
#include "proto.h"

/* ---- the seam ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);

static struct {
    bool armed;
    unsigned calls;   /* allocations asked for while armed */
    unsigned fail_at; /* the one to fail (1-based); 0: none */
    bool failed;      /* it was failed */
    long live;        /* blocks allocated while armed and not yet freed */
} seam;

/* Whether this allocation is the one to fail. */
static bool seam_fail(void)
{
    if (!seam.armed)
        return false;
    seam.calls++;
    if (seam.calls == seam.fail_at) {
        seam.failed = true;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n)
{
    if (seam_fail())
        return NULL;
    void *p = __real_malloc(n);
    if (p && seam.armed)
        seam.live++;
    return p;
}

void *__wrap_calloc(size_t k, size_t n)
{
    if (seam_fail())
        return NULL;
    void *p = __real_calloc(k, n);
    if (p && seam.armed)
        seam.live++;
    return p;
}

void *__wrap_realloc(void *old, size_t n)
{
    if (seam_fail())
        return NULL;
    void *p = __real_realloc(old, n);
    if (p && old == NULL && seam.armed)
        seam.live++;
    return p;
}

void __wrap_free(void *p)
{
    if (p && seam.armed)
        seam.live--;
    __real_free(p);
}

static void seam_arm(unsigned fail_at)
{
    memset(&seam, 0, sizeof seam);
    seam.fail_at = fail_at;
    seam.armed = true;
}

static void seam_disarm(void)
{
    seam.armed = false;
}

/* ---- db_sql: every builder that appends to a dsp_strbuf ---- */

enum { NROWS = 300 };

struct rows {
    dsp_db_sql_row row[NROWS];
    uint64_t ids[NROWS];
    uint8_t skip[NROWS];
    uint8_t data[NROWS][40];
};

static void rows_fill(struct rows *r)
{
    for (size_t i = 0; i < NROWS; i++) {
        r->ids[i] = 1000 + i;
        r->skip[i] = (uint8_t)(i % 3 == 0);
        memset(r->data[i], 'a' + (int)(i % 26), sizeof r->data[i]);
        r->row[i] = (dsp_db_sql_row){.task_id = r->ids[i],
                                     .attempts = (uint32_t)(i % 5),
                                     .run_after_ms = (int64_t)i * 7,
                                     .data = r->data[i],
                                     .len = i % sizeof r->data[i]};
    }
}

/* As a claim does: its ids formatted once, then the mark (5) or the task_claim row (9)
 * built from that text; a failure of either allocation shows as b->oom, as the claim
 * thread treats it. */
static void claim_csv_then(dsp_strbuf *b, const struct rows *r, int which)
{
    dsp_strbuf csv = {0};
    dsp_db_sql_id_csv(&csv, r->ids, NROWS);
    if (csv.oom)
        b->oom = true;
    else if (which == 5)
        dsp_db_sql_claim_mark(b, NULL, 9, 1, csv.p, csv.len);
    else
        dsp_db_sql_claim_log_insert(b, NULL, 9, 1, "", csv.p, csv.len);
    dsp_strbuf_free(&csv);
}

/* Builder number `which` into b; false when there is no such builder. */
static bool build(int which, dsp_strbuf *b, const struct rows *r)
{
    switch (which) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4: /* each write kind, a two-level CASE over NROWS rows */
        (void)dsp_db_sql_write(b, NULL, which, 9, 123456789, r->row, NROWS);
        return true;
    case 5:
        claim_csv_then(b, r, 5);
        return true;
    case 6:
        dsp_db_sql_release_ids(b, NULL, 9, 1, r->ids, NROWS);
        return true;
    case 7:
        dsp_db_sql_lock_free(b, NULL, 9, r->row, r->skip, NROWS);
        return true;
    case 8:
        dsp_db_sql_still_ours(b, NULL, 9, r->row, NULL, NROWS);
        return true;
    case 9:
        dsp_db_sql_recover_ids(b, NULL, 9, 1, r->ids, NROWS, NULL);
        claim_csv_then(b, r, 9);
        return true;
    case 10:
        dsp_db_sql_stats_counts(b, NULL, 1, NULL);
        dsp_db_sql_stats_successful(b, NULL, DSP_DB_SQL_SUCCESSFUL_CAP, NULL);
        return true;
    case 11:
        for (int i = 0; i < 40; i++)
            dsp_db_sql_stats_oldest_part(b, NULL, i == 0, "a type name", 11, i % 3, 1, i % 2 == 1);
        dsp_db_sql_stats_oldest_end(b);
        return true;
    case 12:
        dsp_db_sql_retention(b, NULL, 3, false, 1, 100, NULL);
        dsp_db_sql_requeue_failed(b, NULL, "a type name", 1, 100, NULL);
        return true;
    }
    return false;
}

static void db_sql_builders_survive_every_failure(void **state)
{
    (void)state;
    struct rows *r = calloc(1, sizeof *r);
    assert_non_null(r);
    rows_fill(r);
    for (int which = 0;; which++) {
        /* The text with no failure, to compare with. */
        dsp_strbuf want = {0};
        if (!build(which, &want, r))
            break;
        assert_false(want.oom);

        unsigned runs = 0;
        for (unsigned n = 1;; n++) {
            dsp_strbuf b = {0};
            seam_arm(n);
            build(which, &b, r);
            bool failed = seam.failed, oom = b.oom;
            dsp_strbuf_free(&b);
            seam_disarm();
            /* A failed allocation always shows as oom: a statement missing a part must
             * never be sent. */
            assert_int_equal(oom, failed);
            assert_int_equal(seam.live, 0);
            runs++;
            if (!failed)
                break; /* fewer than n allocations: the call went through */
        }
        assert_true(runs >= 2); /* each builder allocates at least once */

        /* And the run in which nothing failed gives the same text. */
        dsp_strbuf b = {0};
        seam_arm(0);
        build(which, &b, r);
        seam_disarm();
        assert_false(b.oom);
        assert_int_equal(b.len, want.len);
        assert_memory_equal(b.p, want.p, want.len);
        dsp_strbuf_free(&b);
        dsp_strbuf_free(&want);
    }
    free(r);
}

/* dsp_strbuf_reserve keeps the old text when growing fails. */
static void strbuf_keeps_text_when_growth_fails(void **state)
{
    (void)state;
    dsp_strbuf b = {0};
    dsp_strbuf_puts(&b, "kept");
    seam_arm(1);
    assert_false(dsp_strbuf_reserve(&b, 10000));
    seam_disarm();
    assert_true(seam.failed);
    assert_true(b.oom);
    assert_string_equal(b.p, "kept");
    dsp_strbuf_reset(&b);
    dsp_strbuf_puts(&b, "again");
    assert_string_equal(b.p, "again");
    dsp_strbuf_free(&b);
}

/* ---- code that must not allocate at all ---- */

/* The claim builders write into the caller's buffer: armed to fail the first
 * allocation, they still give their text, and no allocation was asked for. */
static void claim_sql_does_not_allocate(void **state)
{
    (void)state;
    const char *types[] = {"resize", "thumb", "a' OR 1=1"};
    char buf[4096];
    seam_arm(1);
    int a = dsp_claim_sql_select(buf, sizeof buf, types, 3, 1, 10, NULL, NULL);
    int b = dsp_claim_sql_promote(buf, sizeof buf, 1, 10);
    int c = dsp_claim_sql_demote(buf, sizeof buf, 1, 10);
    size_t bound = dsp_claim_sql_select_bound(types, 3);
    seam_disarm();
    assert_true(a > 0 && b > 0 && c > 0 && bound > (size_t)a);
    assert_int_equal(seam.calls, 0);
}

/* The codec encodes and decodes in the caller's memory: every message kind round-trips
 * with allocation armed to fail, and none is asked for. */
static void codec_does_not_allocate(void **state)
{
    (void)state;
    static uint8_t buf[PROTO_MAX_HEAD + 4096];
    proto_msg m, out;

    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = 8;
    m.u.hello.name.ptr = (const uint8_t *)"w";
    m.u.hello.name.len = 1;
    m.u.hello.ntypes = 2;
    m.u.hello.types[0].ptr = (const uint8_t *)"a";
    m.u.hello.types[0].len = 1;
    m.u.hello.types[1].ptr = (const uint8_t *)"bb";
    m.u.hello.types[1].len = 2;

    seam_arm(1);
    size_t n = proto_msg_encode(&m, buf, sizeof buf);
    uint32_t body = 0;
    int chk = n > 0 ? proto_frame_check(buf, n, PROTO_MAX_BODY_DEFAULT, &body) : -100;
    int dec = chk == PROTO_OK ? proto_msg_decode(buf + PROTO_LEN_PREFIX, body, &out) : -100;
    size_t size = proto_msg_size(&m);
    seam_disarm();

    assert_true(n > 0);
    assert_int_equal(size, n);
    assert_int_equal(chk, PROTO_OK);
    assert_int_equal(dec, PROTO_OK);
    assert_int_equal(out.type, PROTO_HELLO);
    assert_int_equal(out.u.hello.ntypes, 2);
    assert_memory_equal(out.u.hello.types[1].ptr, "bb", 2);
    assert_int_equal(seam.calls, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(db_sql_builders_survive_every_failure),
        cmocka_unit_test(strbuf_keeps_text_when_growth_fails),
        cmocka_unit_test(claim_sql_does_not_allocate),
        cmocka_unit_test(codec_does_not_allocate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
