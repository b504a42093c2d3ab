/* test_frame_reader.c: unit tests of the framing step shared by the dispatcher's and
 * the worker library's read loops (proto/frame_reader.h): frames fed a byte at a
 * time and split at every boundary, coalesced frames, the caller's limit at its edge,
 * the extreme prefixes, bodies that do not decode, and the per-turn budget. And of the
 * send stage both write paths share (proto/frame_stage.h): its bound, a send the
 * socket takes in part, and its memory given back (always when idle). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame_reader.h"
#include "frame_stage.h"
#include "proto.h"

/* The dispatcher's limit before HELLO (dispatcher/conn.c): the largest HELLO body. */
#define HELLO_MAX_BODY ((uint32_t)(PROTO_MAX_HEAD - PROTO_LEN_PREFIX))

static size_t encode(const proto_msg *m, uint8_t *out, size_t cap)
{
    size_t n = proto_msg_encode(m, out, cap);
    assert_true(n > PROTO_LEN_PREFIX);
    return n;
}

static size_t sample_hello(uint8_t *out, size_t cap)
{
    proto_msg m = {.type = PROTO_HELLO};
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = 4;
    m.u.hello.name = (proto_bytes){(const uint8_t *)"w1", 2};
    m.u.hello.ntypes = 1;
    m.u.hello.types[0] = (proto_bytes){(const uint8_t *)"resize", 6};
    return encode(&m, out, cap);
}

static size_t sample_done(uint8_t *out, size_t cap, size_t data_len)
{
    static const uint8_t data[64] = "the result";
    proto_msg m = {.type = PROTO_DONE};
    m.u.done.task_id = 42;
    m.u.done.epoch = 3;
    m.u.done.attempt = 1;
    m.u.done.outcome = PROTO_OUTCOME_SUCCESS;
    m.u.done.data = (proto_bytes){data, data_len};
    return encode(&m, out, cap);
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* A frame fed one byte more at a time: NEED_MORE until its last byte is there. */
static void test_byte_by_byte(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = sample_hello(buf, sizeof buf);
    proto_frame_reader rd;
    proto_frame_reader_init(&rd, 1);
    for (size_t have = 0; have < n; have++) {
        assert_int_equal(proto_frame_next(&rd, buf, have, HELLO_MAX_BODY), PROTO_FRAME_NEED_MORE);
        /* the announced length is known as soon as the prefix is whole */
        assert_int_equal(rd.body_len, have < PROTO_LEN_PREFIX ? 0 : n - PROTO_LEN_PREFIX);
    }
    assert_int_equal(proto_frame_next(&rd, buf, n, HELLO_MAX_BODY), PROTO_FRAME_WHOLE);
    assert_int_equal(proto_frame_size(&rd), n);
    proto_msg m;
    assert_int_equal(proto_frame_decode(&rd, buf + PROTO_LEN_PREFIX, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_HELLO);
    assert_int_equal(m.u.hello.capacity, 4);
}

/* A stream of two frames cut in two at every byte, the first part handled, its rest
 * carried over (as an evbuffer keeps it) and the second part appended: both frames
 * come out whole and decode, whatever the cut. Only the prefix is shown contiguous
 * (as conn.c does with evbuffer_copyout), the rest of the bytes are counted. */
static void test_split_at_every_boundary(void **state)
{
    (void)state;
    uint8_t stream[512];
    size_t n1 = sample_hello(stream, sizeof stream);
    size_t n2 = sample_done(stream + n1, sizeof stream - n1, 10);
    size_t total = n1 + n2;
    for (size_t cut = 0; cut <= total; cut++) {
        uint8_t pending[512];
        size_t len = 0, off = 0;
        int types[2], got = 0;
        proto_frame_reader rd;
        for (int part = 0; part < 2; part++) {
            size_t from = part ? cut : 0, to = part ? total : cut;
            memcpy(pending + len, stream + from, to - from);
            len += to - from;
            proto_frame_reader_init(&rd, 16);
            for (;;) {
                uint8_t prefix[PROTO_LEN_PREFIX] = {0};
                memcpy(prefix, pending + off,
                       len - off < sizeof prefix ? len - off : sizeof prefix);
                int st = proto_frame_next(&rd, prefix, len - off, HELLO_MAX_BODY);
                if (st == PROTO_FRAME_NEED_MORE)
                    break;
                assert_int_equal(st, PROTO_FRAME_WHOLE);
                assert_false(proto_frame_reader_spent(&rd));
                proto_msg m;
                assert_int_equal(proto_frame_decode(&rd, pending + off + PROTO_LEN_PREFIX, &m),
                                 PROTO_OK);
                assert_true(got < 2);
                types[got++] = m.type;
                off += proto_frame_size(&rd);
            }
        }
        assert_int_equal(got, 2);
        assert_int_equal(types[0], PROTO_HELLO);
        assert_int_equal(types[1], PROTO_DONE);
        assert_int_equal(off, total);
    }
}

/* Two frames in one buffer: the reader sees the first, then after it the second. */
static void test_two_frames_in_one_buffer(void **state)
{
    (void)state;
    uint8_t buf[512];
    size_t n1 = sample_done(buf, sizeof buf, 3);
    size_t n2 = sample_hello(buf + n1, sizeof buf - n1);
    proto_frame_reader rd;
    proto_msg m;
    proto_frame_reader_init(&rd, 8);
    assert_int_equal(proto_frame_next(&rd, buf, n1 + n2, PROTO_MAX_BODY_DEFAULT),
                     PROTO_FRAME_WHOLE);
    assert_int_equal(proto_frame_size(&rd), n1);
    assert_int_equal(proto_frame_decode(&rd, buf + PROTO_LEN_PREFIX, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_DONE);
    assert_int_equal(m.u.done.data.len, 3);
    assert_int_equal(proto_frame_next(&rd, buf + n1, n2, PROTO_MAX_BODY_DEFAULT),
                     PROTO_FRAME_WHOLE);
    assert_int_equal(proto_frame_size(&rd), n2);
    assert_int_equal(proto_frame_decode(&rd, buf + n1 + PROTO_LEN_PREFIX, &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_HELLO);
    assert_int_equal(proto_frame_next(&rd, buf + n1 + n2, 0, PROTO_MAX_BODY_DEFAULT),
                     PROTO_FRAME_NEED_MORE);
    assert_int_equal(rd.body_len, 0);
}

/* A body of exactly the limit is read; one byte more is refused on the prefix alone. */
static void test_limit_exact_and_one_over(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = sample_done(buf, sizeof buf, 40);
    uint32_t body = (uint32_t)(n - PROTO_LEN_PREFIX);
    proto_frame_reader rd;
    proto_frame_reader_init(&rd, 1);
    assert_int_equal(proto_frame_next(&rd, buf, n, body), PROTO_FRAME_WHOLE);
    assert_int_equal(rd.body_len, body);
    assert_int_equal(proto_frame_next(&rd, buf, n, body - 1), PROTO_FRAME_TOO_BIG);
    assert_int_equal(rd.body_len, body);
    assert_int_equal(proto_frame_next(&rd, buf, PROTO_LEN_PREFIX, body - 1), PROTO_FRAME_TOO_BIG);

    /* the two limits the programs pass, on a bare prefix */
    const uint32_t limits[] = {HELLO_MAX_BODY, PROTO_MAX_BODY_DEFAULT};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        uint8_t prefix[PROTO_LEN_PREFIX];
        put32(prefix, limits[i]);
        assert_int_equal(proto_frame_next(&rd, prefix, sizeof prefix, limits[i]),
                         PROTO_FRAME_NEED_MORE);
        assert_int_equal(rd.body_len, limits[i]);
        assert_int_equal(proto_frame_size(&rd), (size_t)limits[i] + PROTO_LEN_PREFIX);
        put32(prefix, limits[i] + 1);
        assert_int_equal(proto_frame_next(&rd, prefix, sizeof prefix, limits[i]),
                         PROTO_FRAME_TOO_BIG);
        assert_int_equal(rd.body_len, limits[i] + 1);
    }
}

/* A zero length is BAD (no type byte), whatever follows; 0xFFFFFFFF is TOO_BIG under
 * any limit but the largest, under which it waits without the size wrapping. */
static void test_prefix_zero_and_all_ones(void **state)
{
    (void)state;
    uint8_t buf[16] = {0, 0, 0, 0, PROTO_HEARTBEAT};
    proto_frame_reader rd;
    proto_frame_reader_init(&rd, 1);
    assert_int_equal(proto_frame_next(&rd, buf, PROTO_LEN_PREFIX, PROTO_MAX_BODY_DEFAULT),
                     PROTO_FRAME_BAD);
    assert_int_equal(rd.body_len, 0);
    assert_int_equal(proto_frame_next(&rd, buf, sizeof buf, PROTO_MAX_BODY_DEFAULT),
                     PROTO_FRAME_BAD);
    assert_string_equal(proto_status_text(PROTO_FRAME_BAD), proto_status_text(PROTO_BAD));

    put32(buf, 0xFFFFFFFFu);
    assert_int_equal(proto_frame_next(&rd, buf, sizeof buf, PROTO_MAX_BODY_DEFAULT),
                     PROTO_FRAME_TOO_BIG);
    assert_int_equal(rd.body_len, 0xFFFFFFFFu);
    assert_int_equal(proto_frame_next(&rd, buf, sizeof buf, HELLO_MAX_BODY), PROTO_FRAME_TOO_BIG);
    assert_string_equal(proto_status_text(PROTO_FRAME_TOO_BIG), proto_status_text(PROTO_TOO_BIG));
    assert_int_equal(proto_frame_next(&rd, buf, sizeof buf, UINT32_MAX), PROTO_FRAME_NEED_MORE);
    assert_true(proto_frame_size(&rd) > 0xFFFFFFFFu);
    assert_int_equal(proto_frame_announced(buf, sizeof buf), 0xFFFFFFFFu);
}

/* Whole frames whose bodies do not decode: the framing says WHOLE (the stream stays
 * in step), the decode says BAD. */
static void test_body_fails_to_decode(void **state)
{
    (void)state;
    static const uint8_t unknown_type[] = {0, 0, 0, 1, 0x7f};
    static const uint8_t heartbeat_trailing[] = {0, 0, 0, 2, PROTO_HEARTBEAT, 0};
    static const uint8_t short_done[] = {0, 0, 0, 3, PROTO_DONE, 0, 1};
    const struct {
        const uint8_t *p;
        size_t n;
    } frames[] = {{unknown_type, sizeof unknown_type},
                  {heartbeat_trailing, sizeof heartbeat_trailing},
                  {short_done, sizeof short_done}};
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
        proto_frame_reader rd;
        proto_msg m;
        proto_frame_reader_init(&rd, 1);
        assert_int_equal(proto_frame_next(&rd, frames[i].p, frames[i].n, HELLO_MAX_BODY),
                         PROTO_FRAME_WHOLE);
        assert_int_equal(proto_frame_size(&rd), frames[i].n);
        assert_int_equal(proto_frame_decode(&rd, frames[i].p + PROTO_LEN_PREFIX, &m), PROTO_BAD);
    }
}

/* The budget hands out exactly its count of frames per turn. */
static void test_budget(void **state)
{
    (void)state;
    proto_frame_reader rd;
    proto_frame_reader_init(&rd, 3);
    for (int i = 0; i < 3; i++)
        assert_false(proto_frame_reader_spent(&rd));
    assert_true(proto_frame_reader_spent(&rd));
    assert_true(proto_frame_reader_spent(&rd));
    proto_frame_reader_init(&rd, 0);
    assert_true(proto_frame_reader_spent(&rd));
}

/* What a half frame announces: nothing until its prefix is whole. */
static void test_announced(void **state)
{
    (void)state;
    uint8_t prefix[PROTO_LEN_PREFIX];
    put32(prefix, 0x01020304u);
    for (size_t have = 0; have < PROTO_LEN_PREFIX; have++)
        assert_int_equal(proto_frame_announced(prefix, have), 0);
    assert_int_equal(proto_frame_announced(prefix, PROTO_LEN_PREFIX), 0x01020304u);
    assert_int_equal(proto_frame_announced(prefix, 1000), 0x01020304u);
}

/* The stage holds up to PROTO_STAGE_MAX bytes; a send the socket takes in part leaves
 * the rest, in order, at the stage's start; a stage grown past PROTO_STAGE_KEEP is
 * freed once empty, a smaller one kept. */
static void test_stage(void **state)
{
    (void)state;
    proto_frame_stage st = {0};
    int sv[2], small = 4096;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);

    uint8_t *p = proto_frame_stage_reserve(&st, PROTO_STAGE_MAX);
    assert_non_null(p);
    for (size_t i = 0; i < PROTO_STAGE_MAX; i++)
        p[i] = (uint8_t)(i * 7 + i / 251);
    st.len = PROTO_STAGE_MAX;
    assert_null(proto_frame_stage_reserve(&st, 1)); /* full */

    uint8_t *got = malloc(PROTO_STAGE_MAX);
    assert_non_null(got);
    size_t have = 0;
    for (int round = 0; round < 100000 && have < PROTO_STAGE_MAX; round++) {
        ssize_t n = proto_frame_stage_send(&st, sv[0]);
        assert_true(n > 0 || (n < 0 && errno == EAGAIN));
        ssize_t r = recv(sv[1], got + have, PROTO_STAGE_MAX - have, MSG_DONTWAIT);
        if (r > 0)
            have += (size_t)r;
    }
    assert_int_equal(have, PROTO_STAGE_MAX);
    assert_int_equal(st.len, 0);
    for (size_t i = 0; i < PROTO_STAGE_MAX; i++)
        assert_int_equal(got[i], (uint8_t)(i * 7 + i / 251));
    assert_int_equal(proto_frame_stage_send(&st, sv[0]), 0); /* nothing to send */

    proto_frame_stage_shrink(&st, 1); /* grown past PROTO_STAGE_KEEP: given back */
    assert_null(st.buf);
    assert_int_equal(st.cap, 0);
    assert_null(proto_frame_stage_reserve(&st, PROTO_STAGE_MAX + 1)); /* too large a frame */
    assert_non_null(proto_frame_stage_reserve(&st, 100));
    st.len = 100;
    proto_frame_stage_shrink(&st, 0); /* not empty: kept */
    assert_non_null(st.buf);
    st.len = 0;
    proto_frame_stage_shrink(&st, 1); /* small and busy: kept for the next pass */
    assert_non_null(st.buf);
    proto_frame_stage_shrink(&st, 0); /* idle: given back */
    assert_null(st.buf);
    proto_frame_stage_free(&st);
    assert_null(st.buf);
    free(got);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_split_at_every_boundary),
        cmocka_unit_test(test_two_frames_in_one_buffer),
        cmocka_unit_test(test_limit_exact_and_one_over),
        cmocka_unit_test(test_prefix_zero_and_all_ones),
        cmocka_unit_test(test_body_fails_to_decode),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_announced),
        cmocka_unit_test(test_stage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
