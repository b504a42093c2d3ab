/* test_proto.c: unit tests of the wire codec (proto/proto.h).
 *
 * Every frame type is encoded, framed and decoded back; the framing is fed in
 * pieces and in coalesced streams; every bound of the format is probed on both
 * sides (the decoder refuses it, the encoder returns 0); and the golden frames
 * of tests/data/frames/{valid,invalid} (found through TASKPUSH_SOURCE_ROOT) are
 * checked against the codec.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Bytes that a C string would lose: NULs, 0xFF, high bit set. */
static const uint8_t binary[] = {0x00, 0xff, 'a', 0x00, 0x00, 0xff, 0x80, 0x7f, 0x01, 0x00};

static uint8_t big_name[PROTO_MAX_NAME_LEN + 1];
static uint8_t big_token[PROTO_MAX_TOKEN_LEN + 1];
static uint8_t big_type[PROTO_MAX_TYPE_LEN + 1];

static proto_bytes bytes_of(const char *s)
{
    return (proto_bytes){(const uint8_t *)s, strlen(s)};
}

static proto_bytes bytes_n(const uint8_t *p, size_t n)
{
    return (proto_bytes){p, n};
}

/* ---- sample messages ---- */

static proto_msg sample_hello(void)
{
    proto_msg m = {.type = PROTO_HELLO};

    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = 8;
    m.u.hello.name = bytes_of("worker-1");
    m.u.hello.token = bytes_of("secret");
    m.u.hello.ntypes = 3;
    m.u.hello.types[0] = bytes_of("resize");
    m.u.hello.types[1] = bytes_of("email.send");
    m.u.hello.types[2] = bytes_n(binary, sizeof(binary));
    return m;
}

static proto_msg sample_hello_max(void)
{
    proto_msg m = {.type = PROTO_HELLO};

    m.u.hello.version = UINT16_MAX;
    m.u.hello.capacity = UINT32_MAX;
    m.u.hello.name = bytes_n(big_name, PROTO_MAX_NAME_LEN);
    m.u.hello.token = bytes_n(big_token, PROTO_MAX_TOKEN_LEN);
    m.u.hello.ntypes = PROTO_MAX_TYPES;
    for (size_t i = 0; i < PROTO_MAX_TYPES; i++)
        m.u.hello.types[i] = bytes_n(big_type + i, PROTO_MAX_TYPE_LEN - i);
    return m;
}

static proto_msg sample_welcome(void)
{
    proto_msg m = {.type = PROTO_WELCOME};

    m.u.welcome.version = PROTO_VERSION;
    m.u.welcome.heartbeat_ms = 5000;
    m.u.welcome.max_body = PROTO_MAX_BODY_DEFAULT;
    m.u.welcome.server = bytes_of("taskpushd 0.1.0");
    return m;
}

static proto_msg sample_bare(uint8_t type)
{
    return (proto_msg){.type = type};
}

static proto_msg sample_error(void)
{
    proto_msg m = {.type = PROTO_ERROR};

    m.u.error.code = PROTO_ERR_AUTH;
    m.u.error.message = bytes_of("wrong token");
    return m;
}

static proto_msg sample_task(void)
{
    proto_msg m = {.type = PROTO_TASK};

    m.u.task.task_id = UINT64_C(0x0102030405060708);
    m.u.task.epoch = 0x0a0b0c0d;
    m.u.task.attempt = 2;
    m.u.task.timeout_ms = 30000;
    m.u.task.priority = 2;
    m.u.task.type = bytes_of("resize");
    m.u.task.payload = bytes_n(binary, sizeof(binary));
    return m;
}

static proto_msg sample_done(uint8_t outcome)
{
    proto_msg m = {.type = PROTO_DONE};

    m.u.done.task_id = UINT64_MAX - 1;
    m.u.done.epoch = 7;
    m.u.done.attempt = 1;
    m.u.done.outcome = outcome;
    m.u.done.retry_after_ms = outcome == PROTO_OUTCOME_RETRY_AFTER ? 15000 : 0;
    m.u.done.data = bytes_of("{\"ok\":true}");
    return m;
}

static proto_msg sample_extend(void)
{
    proto_msg m = {.type = PROTO_EXTEND};

    m.u.extend.task_id = 99;
    m.u.extend.epoch = UINT32_MAX;
    m.u.extend.attempt = 3;
    m.u.extend.extend_ms = 60000;
    return m;
}

static proto_msg sample_cancel(void)
{
    proto_msg m = {.type = PROTO_CANCEL};

    m.u.cancel.task_id = 1;
    m.u.cancel.epoch = 2;
    m.u.cancel.attempt = 3;
    return m;
}

static const proto_submit_task submit_tasks[] = {
    {.priority = 2, .max_attempts = 5, .delay_ms = 1500, .timeout_ms = 30000,
     .type = {(const uint8_t *)"email.send", 10}, .dedup_key = {(const uint8_t *)"mail-42", 7},
     .payload = {(const uint8_t *)"hello", 5}},
    {.priority = 0, .type = {(const uint8_t *)"noop", 4}},
    {.priority = 1, .max_attempts = PROTO_MAX_ATTEMPTS, .delay_ms = UINT32_MAX,
     .timeout_ms = UINT32_MAX, .type = {(const uint8_t *)"blob", 4},
     .dedup_key = {binary, sizeof(binary)}, .payload = {binary, sizeof(binary)}},
};

static proto_msg sample_submit(void)
{
    proto_msg m = {.type = PROTO_SUBMIT};

    m.u.submit.request_id = 0xA1B2C3D4;
    m.u.submit.flags = PROTO_SUBMIT_WAIT;
    m.u.submit.ntasks = NELEMS(submit_tasks);
    m.u.submit.tasks = submit_tasks;
    return m;
}

static const proto_submit_res submit_results[] = {
    {PROTO_SUBMIT_INSERTED, 101}, {PROTO_SUBMIT_DUPLICATE, 55}, {PROTO_SUBMIT_INSERTED, UINT64_MAX}};

static proto_msg sample_submitted(uint16_t status)
{
    proto_msg m = {.type = PROTO_SUBMITTED};

    m.u.submitted.request_id = 77;
    m.u.submitted.status = status;
    if (status == PROTO_SUBMIT_OK) {
        m.u.submitted.n = NELEMS(submit_results);
        m.u.submitted.results = submit_results;
    } else {
        m.u.submitted.message = bytes_of("not leading the table");
    }
    return m;
}

static proto_msg sample_outcome(uint8_t state)
{
    proto_msg m = {.type = PROTO_OUTCOME};

    m.u.outcome.request_id = 77;
    m.u.outcome.task_id = UINT64_C(0x0102030405060708);
    m.u.outcome.state = state;
    m.u.outcome.data = bytes_n(binary, sizeof(binary));
    return m;
}

static const proto_dlv sample_dlvs[] = {
    {UINT64_C(0x0102030405060708), 3, 1}, {101, 7, 2}, {UINT64_MAX, UINT32_MAX, UINT32_MAX}};

/* sample_list: a CONFIRM or HOLDING of the three deliveries above. */
static proto_msg sample_list(uint8_t type)
{
    proto_msg m = {.type = type};
    proto_dlv_list *l = type == PROTO_CONFIRM ? &m.u.confirm : &m.u.holding;

    l->n = NELEMS(sample_dlvs);
    l->items = sample_dlvs;
    return m;
}

/* all_samples fills out with one message of every type (and a few variants). */
static size_t all_samples(proto_msg *out)
{
    size_t n = 0;

    out[n++] = sample_hello();
    out[n++] = sample_hello_max();
    out[n++] = sample_welcome();
    out[n++] = sample_bare(PROTO_HEARTBEAT);
    out[n++] = sample_error();
    out[n++] = sample_bare(PROTO_STOP);
    out[n++] = sample_task();
    out[n++] = sample_done(PROTO_OUTCOME_SUCCESS);
    out[n++] = sample_done(PROTO_OUTCOME_RETRY_AFTER);
    out[n++] = sample_extend();
    out[n++] = sample_cancel();
    out[n++] = sample_submit();
    out[n++] = sample_submitted(PROTO_SUBMIT_OK);
    out[n++] = sample_outcome(PROTO_STATE_FAILED);
    out[n++] = sample_list(PROTO_CONFIRM);
    out[n++] = sample_list(PROTO_HOLDING);
    return n;
}

#define MAX_SAMPLES 24
static proto_msg samples[MAX_SAMPLES];

/* The trailing opaque field of m (empty for types without one). */
static size_t tail_len(const proto_msg *m)
{
    switch (m->type) {
    case PROTO_TASK:
        return m->u.task.payload.len;
    case PROTO_DONE:
        return m->u.done.data.len;
    case PROTO_ERROR:
        return m->u.error.message.len;
    case PROTO_SUBMITTED:
        return m->u.submitted.message.len;
    case PROTO_OUTCOME:
        return m->u.outcome.data.len;
    default:
        return 0;
    }
}

static const uint8_t *tail_ptr(const proto_msg *m)
{
    switch (m->type) {
    case PROTO_TASK:
        return m->u.task.payload.ptr;
    case PROTO_DONE:
        return m->u.done.data.ptr;
    case PROTO_ERROR:
        return m->u.error.message.ptr;
    case PROTO_SUBMITTED:
        return m->u.submitted.message.ptr;
    case PROTO_OUTCOME:
        return m->u.outcome.data.ptr;
    default:
        return NULL;
    }
}

/* ---- comparison ---- */

static void assert_bytes_equal(proto_bytes a, proto_bytes b)
{
    assert_int_equal(a.len, b.len);
    if (a.len > 0)
        assert_memory_equal(a.ptr, b.ptr, a.len);
}

/* assert_borrowed: b lies inside buf[0..n). */
static void assert_borrowed(proto_bytes b, const uint8_t *buf, size_t n)
{
    assert_non_null(b.ptr);
    assert_true(b.ptr >= buf && b.ptr <= buf + n);
    assert_true(b.len <= (size_t)(buf + n - b.ptr));
}

/* The i-th task of s, from its tasks (a message built here) or its entries (decoded). */
static proto_submit_task submit_at(const proto_submit *s, uint16_t i)
{
    proto_submit_task t;
    proto_bytes cur = s->entries;

    if (s->tasks != NULL)
        return s->tasks[i];
    for (uint16_t k = 0; k <= i; k++)
        assert_int_equal(proto_submit_next(&cur, &t), PROTO_OK);
    return t;
}

static proto_submit_res submitted_at(const proto_submitted *s, uint16_t i)
{
    proto_submit_res r;

    if (s->results != NULL)
        return s->results[i];
    proto_submitted_result(s, i, &r);
    return r;
}

static void assert_submit_equal(const proto_submit *a, const proto_submit *b)
{
    assert_int_equal(a->request_id, b->request_id);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->ntasks, b->ntasks);
    for (uint16_t i = 0; i < a->ntasks; i++) {
        proto_submit_task x = submit_at(a, i), y = submit_at(b, i);
        assert_int_equal(x.priority, y.priority);
        assert_int_equal(x.max_attempts, y.max_attempts);
        assert_int_equal(x.delay_ms, y.delay_ms);
        assert_int_equal(x.timeout_ms, y.timeout_ms);
        assert_bytes_equal(x.type, y.type);
        assert_bytes_equal(x.dedup_key, y.dedup_key);
        assert_bytes_equal(x.payload, y.payload);
    }
}

static void assert_msg_equal(const proto_msg *a, const proto_msg *b)
{
    assert_int_equal(a->type, b->type);
    switch (a->type) {
    case PROTO_HELLO:
        assert_int_equal(a->u.hello.version, b->u.hello.version);
        assert_int_equal(a->u.hello.capacity, b->u.hello.capacity);
        assert_bytes_equal(a->u.hello.name, b->u.hello.name);
        assert_bytes_equal(a->u.hello.token, b->u.hello.token);
        assert_int_equal(a->u.hello.ntypes, b->u.hello.ntypes);
        for (size_t i = 0; i < a->u.hello.ntypes; i++)
            assert_bytes_equal(a->u.hello.types[i], b->u.hello.types[i]);
        break;
    case PROTO_WELCOME:
        assert_int_equal(a->u.welcome.version, b->u.welcome.version);
        assert_int_equal(a->u.welcome.heartbeat_ms, b->u.welcome.heartbeat_ms);
        assert_int_equal(a->u.welcome.max_body, b->u.welcome.max_body);
        assert_bytes_equal(a->u.welcome.server, b->u.welcome.server);
        break;
    case PROTO_ERROR:
        assert_int_equal(a->u.error.code, b->u.error.code);
        assert_bytes_equal(a->u.error.message, b->u.error.message);
        break;
    case PROTO_TASK:
        assert_true(a->u.task.task_id == b->u.task.task_id);
        assert_int_equal(a->u.task.epoch, b->u.task.epoch);
        assert_int_equal(a->u.task.attempt, b->u.task.attempt);
        assert_int_equal(a->u.task.timeout_ms, b->u.task.timeout_ms);
        assert_int_equal(a->u.task.priority, b->u.task.priority);
        assert_bytes_equal(a->u.task.type, b->u.task.type);
        assert_bytes_equal(a->u.task.payload, b->u.task.payload);
        break;
    case PROTO_DONE:
        assert_true(a->u.done.task_id == b->u.done.task_id);
        assert_int_equal(a->u.done.epoch, b->u.done.epoch);
        assert_int_equal(a->u.done.attempt, b->u.done.attempt);
        assert_int_equal(a->u.done.outcome, b->u.done.outcome);
        assert_int_equal(a->u.done.retry_after_ms, b->u.done.retry_after_ms);
        assert_bytes_equal(a->u.done.data, b->u.done.data);
        break;
    case PROTO_EXTEND:
        assert_true(a->u.extend.task_id == b->u.extend.task_id);
        assert_int_equal(a->u.extend.epoch, b->u.extend.epoch);
        assert_int_equal(a->u.extend.attempt, b->u.extend.attempt);
        assert_int_equal(a->u.extend.extend_ms, b->u.extend.extend_ms);
        break;
    case PROTO_CANCEL:
        assert_true(a->u.cancel.task_id == b->u.cancel.task_id);
        assert_int_equal(a->u.cancel.epoch, b->u.cancel.epoch);
        assert_int_equal(a->u.cancel.attempt, b->u.cancel.attempt);
        break;
    case PROTO_SUBMIT:
        assert_submit_equal(&a->u.submit, &b->u.submit);
        break;
    case PROTO_SUBMITTED:
        assert_int_equal(a->u.submitted.request_id, b->u.submitted.request_id);
        assert_int_equal(a->u.submitted.status, b->u.submitted.status);
        assert_int_equal(a->u.submitted.n, b->u.submitted.n);
        for (uint16_t i = 0; i < a->u.submitted.n; i++) {
            proto_submit_res ra = submitted_at(&a->u.submitted, i);
            proto_submit_res rb = submitted_at(&b->u.submitted, i);
            assert_int_equal(ra.result, rb.result);
            assert_true(ra.task_id == rb.task_id);
        }
        assert_bytes_equal(a->u.submitted.message, b->u.submitted.message);
        break;
    case PROTO_CONFIRM:
    case PROTO_HOLDING: {
        const proto_dlv_list *la = a->type == PROTO_CONFIRM ? &a->u.confirm : &a->u.holding;
        const proto_dlv_list *lb = b->type == PROTO_CONFIRM ? &b->u.confirm : &b->u.holding;
        assert_int_equal(la->n, lb->n);
        for (uint16_t i = 0; i < la->n; i++) {
            proto_dlv x, y;
            proto_dlv_at(la, i, &x);
            proto_dlv_at(lb, i, &y);
            assert_true(x.task_id == y.task_id);
            assert_int_equal(x.epoch, y.epoch);
            assert_int_equal(x.attempt, y.attempt);
        }
        break;
    }
    case PROTO_OUTCOME:
        assert_int_equal(a->u.outcome.request_id, b->u.outcome.request_id);
        assert_true(a->u.outcome.task_id == b->u.outcome.task_id);
        assert_int_equal(a->u.outcome.state, b->u.outcome.state);
        assert_bytes_equal(a->u.outcome.data, b->u.outcome.data);
        break;
    default: /* HEARTBEAT, STOP: nothing but the type */
        break;
    }
}

/* assert_msg_borrows: every byte field of m (decoded from buf) points into buf. */
static void assert_msg_borrows(const proto_msg *m, const uint8_t *buf, size_t n)
{
    switch (m->type) {
    case PROTO_HELLO:
        assert_borrowed(m->u.hello.name, buf, n);
        assert_borrowed(m->u.hello.token, buf, n);
        for (size_t i = 0; i < m->u.hello.ntypes; i++)
            assert_borrowed(m->u.hello.types[i], buf, n);
        break;
    case PROTO_WELCOME:
        assert_borrowed(m->u.welcome.server, buf, n);
        break;
    case PROTO_ERROR:
        assert_borrowed(m->u.error.message, buf, n);
        break;
    case PROTO_TASK:
        assert_borrowed(m->u.task.type, buf, n);
        assert_borrowed(m->u.task.payload, buf, n);
        break;
    case PROTO_DONE:
        assert_borrowed(m->u.done.data, buf, n);
        break;
    case PROTO_SUBMIT:
        assert_borrowed(m->u.submit.entries, buf, n);
        break;
    case PROTO_SUBMITTED:
        assert_borrowed(m->u.submitted.message, buf, n);
        if (m->u.submitted.n > 0)
            assert_borrowed(m->u.submitted.entries, buf, n);
        break;
    case PROTO_OUTCOME:
        assert_borrowed(m->u.outcome.data, buf, n);
        break;
    default:
        break;
    }
}

/* ---- helpers ---- */

/* encode_new encodes m into a heap buffer of exactly its size; caller frees. */
static uint8_t *encode_new(const proto_msg *m, size_t *size)
{
    size_t n = proto_msg_size(m);
    uint8_t *buf;

    assert_true(n > PROTO_LEN_PREFIX);
    buf = malloc(n);
    assert_non_null(buf);
    assert_int_equal(proto_msg_encode(m, buf, n), n);
    *size = n;
    return buf;
}

/* roundtrip: encode, frame_check, decode, compare, and the frame is canonical. */
static void roundtrip(const proto_msg *m)
{
    size_t n;
    uint8_t *buf = encode_new(m, &n);
    uint32_t body_len = 0;
    proto_msg back;
    uint8_t *again;

    assert_int_equal(proto_frame_check(buf, n, PROTO_MAX_BODY_DEFAULT, &body_len), PROTO_OK);
    assert_int_equal(body_len, n - PROTO_LEN_PREFIX);
    assert_int_equal(buf[PROTO_LEN_PREFIX], m->type);
    assert_int_equal(proto_msg_decode(buf + PROTO_LEN_PREFIX, body_len, &back), PROTO_OK);
    assert_msg_equal(m, &back);
    assert_msg_borrows(&back, buf, n);
    again = malloc(n);
    assert_non_null(again);
    assert_int_equal(proto_msg_encode(&back, again, n), n);
    assert_memory_equal(buf, again, n);
    free(again);
    free(buf);
}

/* decode_frame decodes a whole frame (prefix included) of n bytes. */
static int decode_frame(const uint8_t *frame, size_t n, proto_msg *out)
{
    uint32_t body_len = 0;
    int rc = proto_frame_check(frame, n, PROTO_MAX_BODY_DEFAULT, &body_len);

    if (rc == PROTO_OK) {
        assert_int_equal(PROTO_LEN_PREFIX + body_len, n);
        rc = proto_msg_decode(frame + PROTO_LEN_PREFIX, body_len, out);
    }
    return rc;
}

/* decode_patched encodes m, sets body[at] = v, and decodes the result. */
static int decode_patched(const proto_msg *m, size_t at, uint8_t v)
{
    size_t n;
    uint8_t *buf = encode_new(m, &n);
    proto_msg out;
    int rc;

    assert_true(PROTO_LEN_PREFIX + at < n);
    buf[PROTO_LEN_PREFIX + at] = v;
    rc = proto_msg_decode(buf + PROTO_LEN_PREFIX, n - PROTO_LEN_PREFIX, &out);
    free(buf);
    return rc;
}

/* decode_with_extra encodes m, appends one byte to the body, and decodes it. */
static int decode_with_extra(const proto_msg *m, uint8_t extra)
{
    size_t n;
    uint8_t *buf = encode_new(m, &n);
    uint8_t *longer = malloc(n + 1);
    proto_msg out;
    int rc;

    assert_non_null(longer);
    memcpy(longer, buf, n);
    longer[n] = extra;
    rc = proto_msg_decode(longer + PROTO_LEN_PREFIX, n + 1 - PROTO_LEN_PREFIX, &out);
    free(longer);
    free(buf);
    return rc;
}

/* ---- round trips ---- */

static void test_roundtrip_hello(void **state)
{
    proto_msg m = sample_hello();

    roundtrip(&m);
    m.u.hello.token = bytes_n(NULL, 0); /* no token */
    m.u.hello.ntypes = 1;
    roundtrip(&m);
}

static void test_roundtrip_hello_max_bounds(void **state)
{
    proto_msg m = sample_hello_max();
    uint8_t *head = malloc(PROTO_MAX_HEAD);

    roundtrip(&m);
    /* This HELLO is the largest head there is: PROTO_MAX_HEAD is exact. */
    assert_non_null(head);
    for (size_t i = 0; i < PROTO_MAX_TYPES; i++)
        m.u.hello.types[i] = bytes_n(big_type, PROTO_MAX_TYPE_LEN);
    assert_int_equal(proto_msg_size(&m), PROTO_MAX_HEAD);
    assert_int_equal(proto_msg_encode_head(&m, head, PROTO_MAX_HEAD), PROTO_MAX_HEAD);
    roundtrip(&m);
    free(head);
}

static void test_roundtrip_welcome(void **state)
{
    proto_msg m = sample_welcome();

    roundtrip(&m);
    m.u.welcome.server = bytes_n(NULL, 0);
    m.u.welcome.heartbeat_ms = UINT32_MAX;
    roundtrip(&m);
}

static void test_roundtrip_heartbeat_stop(void **state)
{
    proto_msg hb = sample_bare(PROTO_HEARTBEAT);
    proto_msg stop = sample_bare(PROTO_STOP);
    uint8_t buf[8];

    roundtrip(&hb);
    roundtrip(&stop);
    assert_int_equal(proto_msg_encode(&hb, buf, sizeof(buf)), 5);
    assert_memory_equal(buf, "\x00\x00\x00\x01\x03", 5);
    assert_int_equal(proto_msg_encode(&stop, buf, sizeof(buf)), 5);
    assert_memory_equal(buf, "\x00\x00\x00\x01\x05", 5);
}

static void test_roundtrip_error(void **state)
{
    proto_msg m = sample_error();

    roundtrip(&m);
    m.u.error.message = bytes_n(NULL, 0);
    m.u.error.code = PROTO_ERR_TIMEOUT;
    roundtrip(&m);
    assert_int_equal(proto_msg_size(&m), PROTO_LEN_PREFIX + 3);
}

static void test_roundtrip_task(void **state)
{
    proto_msg m = sample_task();

    roundtrip(&m);
    m.u.task.payload = bytes_n(NULL, 0);
    m.u.task.priority = 0;
    roundtrip(&m);
    m.u.task.type = bytes_n(big_type, PROTO_MAX_TYPE_LEN);
    m.u.task.task_id = UINT64_MAX;
    roundtrip(&m);
}

static void test_roundtrip_done_every_outcome(void **state)
{
    for (uint8_t o = 0; o <= PROTO_OUTCOME_MAX; o++) {
        proto_msg m = sample_done(o);

        roundtrip(&m);
        m.u.done.data = bytes_n(NULL, 0);
        roundtrip(&m);
    }
}

static void test_roundtrip_extend_cancel(void **state)
{
    proto_msg x = sample_extend();
    proto_msg c = sample_cancel();

    roundtrip(&x);
    roundtrip(&c);
    assert_int_equal(proto_msg_size(&x), PROTO_LEN_PREFIX + 21);
    assert_int_equal(proto_msg_size(&c), PROTO_LEN_PREFIX + 17);
}

static void test_binary_fields_survive(void **state)
{
    uint8_t all[512];
    proto_msg t = sample_task();
    proto_msg d = sample_done(PROTO_OUTCOME_FAIL_PERM);
    proto_msg e = sample_error();

    for (size_t i = 0; i < sizeof(all); i++)
        all[i] = (uint8_t)(i % 2 ? 0xff - i : 0); /* NULs, 0xFF and everything else */
    t.u.task.payload = bytes_n(all, sizeof(all));
    t.u.task.type = bytes_n(binary, sizeof(binary));
    d.u.done.data = bytes_n(all, sizeof(all));
    e.u.error.message = bytes_n(binary, sizeof(binary));
    roundtrip(&t);
    roundtrip(&d);
    roundtrip(&e);
}

/* ---- encode_head ---- */

static void test_head_plus_tail_equals_encode(void **state)
{
    size_t ns = all_samples(samples);

    for (size_t i = 0; i < ns; i++) {
        const proto_msg *m = &samples[i];
        size_t n;
        uint8_t *full = encode_new(m, &n);
        uint8_t *joined = malloc(n);
        size_t head;

        assert_non_null(joined);
        head = proto_msg_encode_head(m, joined, n);
        assert_int_equal(head + tail_len(m), n);
        if (tail_len(m) > 0)
            memcpy(joined + head, tail_ptr(m), tail_len(m));
        assert_memory_equal(full, joined, n);
        free(joined);
        free(full);
    }
}

static void test_head_prefix_counts_tail(void **state)
{
    proto_msg m = sample_task();
    uint8_t buf[128];
    uint32_t body_len = 0;
    size_t head;

    m.u.task.payload = bytes_n(binary, 100000); /* never read by encode_head */
    head = proto_msg_encode_head(&m, buf, sizeof(buf));
    assert_int_equal(head, PROTO_LEN_PREFIX + 24 + 6);
    assert_int_equal(proto_frame_check(buf, head, PROTO_MAX_BODY_DEFAULT, &body_len),
                     PROTO_NEED_MORE);
    assert_int_equal(body_len, 24 + 6 + 100000);
    /* The head alone is enough room for encode_head, not for encode. */
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf)), 0);
}

/* ---- framing ---- */

static void test_frame_check_needs_prefix(void **state)
{
    const uint8_t p[4] = {0, 0, 0, 1};
    uint32_t body_len = 12345;

    assert_int_equal(proto_frame_check(NULL, 0, PROTO_MAX_BODY_DEFAULT, &body_len),
                     PROTO_NEED_MORE);
    for (size_t n = 0; n < PROTO_LEN_PREFIX; n++)
        assert_int_equal(proto_frame_check(p, n, PROTO_MAX_BODY_DEFAULT, &body_len),
                         PROTO_NEED_MORE);
    assert_int_equal(proto_frame_check(p, 4, PROTO_MAX_BODY_DEFAULT, NULL), PROTO_NEED_MORE);
}

static void test_byte_at_a_time(void **state)
{
    size_t ns = all_samples(samples);

    for (size_t i = 0; i < ns; i++) {
        size_t n;
        uint8_t *frame = encode_new(&samples[i], &n);
        uint32_t body_len = 0;
        proto_msg out;

        for (size_t have = 0; have < n; have++) {
            /* A copy of exactly `have` bytes, so that ASan sees any over-read. */
            uint8_t *part = malloc(have ? have : 1);

            assert_non_null(part);
            memcpy(part, frame, have);
            assert_int_equal(proto_frame_check(part, have, PROTO_MAX_BODY_DEFAULT, &body_len),
                             PROTO_NEED_MORE);
            free(part);
        }
        assert_int_equal(proto_frame_check(frame, n, PROTO_MAX_BODY_DEFAULT, &body_len), PROTO_OK);
        assert_int_equal(body_len, n - PROTO_LEN_PREFIX);
        assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, body_len, &out), PROTO_OK);
        assert_msg_equal(&samples[i], &out);
        free(frame);
    }
}

/* decode_stream decodes every whole frame of buf in order into out[], and
 * returns how many; *used gets the bytes they took. */
static size_t decode_stream(const uint8_t *buf, size_t len, proto_msg *out, size_t max,
                            size_t *used)
{
    size_t off = 0;
    size_t count = 0;
    uint32_t body_len;

    while (count < max &&
           proto_frame_check(buf + off, len - off, PROTO_MAX_BODY_DEFAULT, &body_len) == PROTO_OK) {
        assert_int_equal(proto_msg_decode(buf + off + PROTO_LEN_PREFIX, body_len, &out[count]),
                         PROTO_OK);
        off += PROTO_LEN_PREFIX + body_len;
        count++;
    }
    *used = off;
    return count;
}

static void test_two_frames_coalesced(void **state)
{
    proto_msg in[2] = {sample_task(), sample_bare(PROTO_HEARTBEAT)};
    proto_msg out[4];
    uint8_t buf[256];
    size_t n = 0;
    size_t used;

    for (size_t i = 0; i < NELEMS(in); i++)
        n += proto_msg_encode(&in[i], buf + n, sizeof(buf) - n);
    assert_int_equal(decode_stream(buf, n, out, NELEMS(out), &used), 2);
    assert_int_equal(used, n);
    for (size_t i = 0; i < NELEMS(in); i++)
        assert_msg_equal(&in[i], &out[i]);
}

static void test_three_frames_coalesced_and_partial(void **state)
{
    proto_msg in[4] = {sample_done(PROTO_OUTCOME_SUCCESS), sample_extend(), sample_welcome(),
                       sample_cancel()};
    proto_msg out[4];
    uint8_t buf[512];
    size_t n = 0;
    size_t used;
    size_t last;

    for (size_t i = 0; i < NELEMS(in); i++)
        n += proto_msg_encode(&in[i], buf + n, sizeof(buf) - n);
    last = proto_msg_size(&in[3]);
    /* Three whole frames and all but the last byte of a fourth. */
    assert_int_equal(decode_stream(buf, n - 1, out, NELEMS(out), &used), 3);
    assert_int_equal(used, n - last);
    for (size_t i = 0; i < 3; i++)
        assert_msg_equal(&in[i], &out[i]);
    /* The rest arrives: the fourth decodes from where the third ended. */
    assert_int_equal(decode_stream(buf + used, n - used, out, NELEMS(out), &used), 1);
    assert_msg_equal(&in[3], &out[0]);
}

static void test_zero_prefix_bad(void **state)
{
    const uint8_t z[8] = {0, 0, 0, 0, PROTO_HEARTBEAT};
    uint32_t body_len;

    assert_int_equal(proto_frame_check(z, 4, PROTO_MAX_BODY_DEFAULT, &body_len), PROTO_BAD);
    assert_int_equal(proto_frame_check(z, sizeof(z), PROTO_MAX_BODY_DEFAULT, &body_len), PROTO_BAD);
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void test_prefix_over_max_too_big(void **state)
{
    uint8_t p[4];
    uint32_t max = PROTO_MAX_BODY_DEFAULT;
    uint32_t body_len = 0;

    /* Decided from the 4 prefix bytes alone. */
    put_be32(p, max + 1);
    assert_int_equal(proto_frame_check(p, sizeof(p), max, &body_len), PROTO_TOO_BIG);
    assert_int_equal(body_len, max + 1);
    /* max_body itself is allowed: wait for the body. */
    put_be32(p, max);
    assert_int_equal(proto_frame_check(p, sizeof(p), max, &body_len), PROTO_NEED_MORE);
    assert_int_equal(body_len, max);
    /* A small caller limit. */
    assert_int_equal(proto_frame_check((const uint8_t *)"\0\0\0\x11", 4, 16, NULL), PROTO_TOO_BIG);
    assert_int_equal(proto_frame_check((const uint8_t *)"\0\0\0\x10", 4, 16, NULL),
                     PROTO_NEED_MORE);
}

static void test_prefix_ffffffff_too_big(void **state)
{
    const uint8_t p[4] = {0xff, 0xff, 0xff, 0xff};
    uint32_t body_len = 0;

    assert_int_equal(proto_frame_check(p, sizeof(p), PROTO_MAX_BODY_DEFAULT, &body_len),
                     PROTO_TOO_BIG);
    assert_int_equal(body_len, UINT32_MAX);
    /* Even a caller accepting everything but the top value. */
    assert_int_equal(proto_frame_check(p, sizeof(p), UINT32_MAX - 1, NULL), PROTO_TOO_BIG);
    assert_int_equal(proto_frame_check(p, sizeof(p), UINT32_MAX, NULL), PROTO_NEED_MORE);
}

/* ---- malformed bodies ---- */

static void test_truncated_bodies_bad(void **state)
{
    size_t ns = all_samples(samples);

    for (size_t i = 0; i < ns; i++) {
        const proto_msg *m = &samples[i];
        size_t n;
        uint8_t *frame = encode_new(m, &n);
        size_t body = n - PROTO_LEN_PREFIX;
        size_t head = body - tail_len(m);

        /* Every cut inside the head is BAD, on a buffer of exactly that size. */
        for (size_t cut = 0; cut < head; cut++) {
            uint8_t *part = malloc(cut ? cut : 1);
            proto_msg out;

            assert_non_null(part);
            memcpy(part, frame + PROTO_LEN_PREFIX, cut);
            if (proto_msg_decode(part, cut, &out) != PROTO_BAD)
                fail_msg("%s cut to %zu of %zu bytes was not BAD", proto_type_name(m->type), cut,
                         body);
            free(part);
        }
        /* A cut inside the trailing field only shortens it. */
        for (size_t cut = head; cut < body; cut++) {
            proto_msg out;

            assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, cut, &out), PROTO_OK);
            assert_int_equal(tail_len(&out), cut - head);
        }
        free(frame);
    }
}

static void test_decode_empty_body_bad(void **state)
{
    proto_msg out;
    uint8_t *end = malloc(1);

    assert_non_null(end);
    end[0] = PROTO_HEARTBEAT;
    assert_int_equal(proto_msg_decode(NULL, 0, &out), PROTO_BAD);
    /* An empty body at the very end of a buffer: not a byte may be read. */
    assert_int_equal(proto_msg_decode(end + 1, 0, &out), PROTO_BAD);
    assert_int_equal(proto_msg_decode(end, 1, &out), PROTO_OK);
    free(end);
}

static void test_trailing_bytes_on_fixed_frames_bad(void **state)
{
    proto_msg fixed[] = {sample_hello(),          sample_welcome(), sample_bare(PROTO_HEARTBEAT),
                         sample_bare(PROTO_STOP), sample_extend(),  sample_cancel(),
                         sample_list(PROTO_CONFIRM), sample_list(PROTO_HOLDING)};

    for (size_t i = 0; i < NELEMS(fixed); i++) {
        assert_int_equal(decode_with_extra(&fixed[i], 0x00), PROTO_BAD);
        assert_int_equal(decode_with_extra(&fixed[i], 0xff), PROTO_BAD);
    }
}

static void test_trailing_bytes_on_tail_frames_ok(void **state)
{
    proto_msg open[] = {sample_error(), sample_task(), sample_done(PROTO_OUTCOME_SUCCESS)};

    for (size_t i = 0; i < NELEMS(open); i++)
        assert_int_equal(decode_with_extra(&open[i], 0x00), PROTO_OK);
}

static void test_unknown_types_bad(void **state)
{
    static const uint8_t known[] = {PROTO_HELLO, PROTO_WELCOME, PROTO_HEARTBEAT,
                                    PROTO_ERROR, PROTO_STOP,    PROTO_TASK,
                                    PROTO_DONE,  PROTO_EXTEND,  PROTO_CANCEL,
                                    PROTO_SUBMIT, PROTO_SUBMITTED, PROTO_OUTCOME,
                                    PROTO_CONFIRM, PROTO_HOLDING, PROTO_PROGRESS};
    uint8_t body[64] = {0};
    uint8_t out[64];
    int nknown = 0;

    for (int t = 0; t < 256; t++) {
        proto_msg m = {.type = (uint8_t)t};
        proto_msg dec;
        int is_known = memchr(known, t, sizeof(known)) != NULL;

        body[0] = (uint8_t)t;
        if (is_known) {
            nknown++;
            assert_string_not_equal(proto_type_name((uint8_t)t), "UNKNOWN");
            continue;
        }
        assert_int_equal(proto_msg_decode(body, 1, &dec), PROTO_BAD);
        assert_int_equal(proto_msg_decode(body, sizeof(body), &dec), PROTO_BAD);
        assert_int_equal(proto_msg_size(&m), 0);
        assert_int_equal(proto_msg_encode(&m, out, sizeof(out)), 0);
        assert_int_equal(proto_msg_encode_head(&m, out, sizeof(out)), 0);
        assert_string_equal(proto_type_name((uint8_t)t), "UNKNOWN");
    }
    assert_int_equal(nknown, NELEMS(known));
}

static void test_task_priority_range(void **state)
{
    proto_msg m = sample_task();
    uint8_t buf[128];

    for (int p = 0; p < 256; p++)
        assert_int_equal(decode_patched(&m, 21, (uint8_t)p), p <= 2 ? PROTO_OK : PROTO_BAD);
    m.u.task.priority = 3;
    assert_int_equal(proto_msg_size(&m), 0);
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf)), 0);
    assert_int_equal(proto_msg_encode_head(&m, buf, sizeof(buf)), 0);
}

static void test_done_outcome_range(void **state)
{
    proto_msg m = sample_done(PROTO_OUTCOME_SUCCESS);
    uint8_t buf[128];

    for (int o = 0; o < 256; o++)
        assert_int_equal(decode_patched(&m, 17, (uint8_t)o),
                         o <= PROTO_OUTCOME_MAX ? PROTO_OK : PROTO_BAD);
    m.u.done.outcome = PROTO_OUTCOME_MAX + 1;
    assert_int_equal(proto_msg_size(&m), 0);
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf)), 0);
    assert_int_equal(proto_msg_encode_head(&m, buf, sizeof(buf)), 0);
}

static void test_hello_capacity_zero_bad(void **state)
{
    proto_msg m = sample_hello();
    uint8_t buf[256];

    /* capacity is the u32 at body offset 3; make it 0, then 1. */
    m.u.hello.capacity = 0x100;
    assert_int_equal(decode_patched(&m, 5, 0), PROTO_BAD);
    assert_int_equal(decode_patched(&m, 6, 1), PROTO_OK);
    m.u.hello.capacity = 0;
    assert_int_equal(proto_msg_size(&m), 0);
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf)), 0);
}

static void test_hello_ntypes_bounds(void **state)
{
    proto_msg m = sample_hello_max();
    uint8_t buf[64];
    size_t n;
    uint8_t *frame;
    proto_msg out;
    /* ntypes follows name and token: offset 9 + name + 2 + token. */
    size_t at = 9 + PROTO_MAX_NAME_LEN + 2 + PROTO_MAX_TOKEN_LEN;

    m.u.hello.ntypes = 0;
    assert_int_equal(proto_msg_size(&m), 0);
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf)), 0);
    m.u.hello.ntypes = PROTO_MAX_TYPES + 1;
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.hello.ntypes = PROTO_MAX_TYPES;
    assert_int_not_equal(proto_msg_size(&m), 0);

    frame = encode_new(&m, &n);
    frame[PROTO_LEN_PREFIX + at] = 0;
    frame[PROTO_LEN_PREFIX + at + 1] = 0;
    assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, n - PROTO_LEN_PREFIX, &out),
                     PROTO_BAD);
    frame[PROTO_LEN_PREFIX + at + 1] = PROTO_MAX_TYPES + 1;
    assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, n - PROTO_LEN_PREFIX, &out),
                     PROTO_BAD);
    frame[PROTO_LEN_PREFIX + at + 1] = PROTO_MAX_TYPES - 1; /* one type left over */
    assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, n - PROTO_LEN_PREFIX, &out),
                     PROTO_BAD);
    frame[PROTO_LEN_PREFIX + at + 1] = PROTO_MAX_TYPES;
    assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, n - PROTO_LEN_PREFIX, &out),
                     PROTO_OK);
    free(frame);
}

static void test_hello_string_bounds(void **state)
{
    proto_msg m = sample_hello();

    m.u.hello.name = bytes_n(big_name, PROTO_MAX_NAME_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.hello.name = bytes_n(big_name, PROTO_MAX_NAME_LEN);
    roundtrip(&m);
    m.u.hello.token = bytes_n(big_token, PROTO_MAX_TOKEN_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.hello.token = bytes_n(big_token, PROTO_MAX_TOKEN_LEN);
    roundtrip(&m);
    m.u.hello.types[1] = bytes_n(big_type, PROTO_MAX_TYPE_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.hello.types[1] = bytes_n(big_type, 0);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.hello.types[1] = bytes_n(big_type, PROTO_MAX_TYPE_LEN);
    roundtrip(&m);
}

static void test_hello_bounds_decoder_side(void **state)
{
    /* HELLO v1, capacity 1, then a name length of 257 (with the bytes there). */
    uint8_t body[9 + 257 + 2 + 2 + 2 + 1] = {PROTO_HELLO, 0, 1, 0, 0, 0, 1, 0x01, 0x01};
    size_t after_name = 9 + 257;
    proto_msg out;

    body[after_name + 3] = 1; /* ntypes 1 */
    body[after_name + 5] = 1; /* type length 1 */
    body[after_name + 6] = 'x';
    assert_int_equal(proto_msg_decode(body, sizeof(body), &out), PROTO_BAD);
    /* Same bytes read as a 256-byte name: misaligned, ntypes reads 0. */
    body[8] = 0x00;
    assert_int_equal(proto_msg_decode(body, sizeof(body), &out), PROTO_BAD);
    /* A 256-byte name whose last byte is dropped from the frame: OK. */
    memmove(body + 9 + 256, body + 9 + 257, sizeof(body) - 9 - 257);
    assert_int_equal(proto_msg_decode(body, sizeof(body) - 1, &out), PROTO_OK);
    assert_int_equal(out.u.hello.name.len, 256);
    assert_int_equal(out.u.hello.ntypes, 1);
    assert_memory_equal(out.u.hello.types[0].ptr, "x", 1);
}

static void test_hello_type_past_end_bad(void **state)
{
    proto_msg m = sample_hello();
    size_t n;
    uint8_t *frame = encode_new(&m, &n);
    proto_msg out;

    /* The last type claims one byte more than the body holds. */
    frame[n - sizeof(binary) - 1] = sizeof(binary) + 1;
    assert_int_equal(proto_msg_decode(frame + PROTO_LEN_PREFIX, n - PROTO_LEN_PREFIX, &out),
                     PROTO_BAD);
    free(frame);
}

static void test_welcome_server_bounds(void **state)
{
    proto_msg m = sample_welcome();

    m.u.welcome.server = bytes_n(big_name, PROTO_MAX_NAME_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.welcome.server = bytes_n(big_name, PROTO_MAX_NAME_LEN);
    roundtrip(&m);
    assert_int_equal(decode_patched(&m, 11, 0x02), PROTO_BAD); /* server_len 256 -> 512 */
}

static void test_task_type_bounds(void **state)
{
    proto_msg m = sample_task();

    m.u.task.type = bytes_n(big_type, 0);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.task.type = bytes_n(big_type, PROTO_MAX_TYPE_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.task.type = bytes_n(big_type, PROTO_MAX_TYPE_LEN);
    roundtrip(&m);
    /* Decoder side: type_len (u16 at 22) of 0 and of 257. */
    m.u.task.type = bytes_of("resize");
    assert_int_equal(decode_patched(&m, 23, 0), PROTO_BAD);
    m.u.task.type = bytes_n(big_type, 1);
    assert_int_equal(decode_patched(&m, 22, 1), PROTO_BAD); /* 0x0101 = 257 */
}

static void test_encoder_rejects_null_bytes(void **state)
{
    proto_msg t = sample_task();
    proto_msg d = sample_done(PROTO_OUTCOME_SUCCESS);
    proto_msg h = sample_hello();

    t.u.task.payload = bytes_n(NULL, 3);
    d.u.done.data = bytes_n(NULL, 1);
    h.u.hello.name = bytes_n(NULL, 2);
    assert_int_equal(proto_msg_size(&t), 0);
    assert_int_equal(proto_msg_size(&d), 0);
    assert_int_equal(proto_msg_size(&h), 0);
}

static void test_encoder_rejects_body_over_u32(void **state)
{
    proto_msg t = sample_task();
    proto_msg e = sample_error();
    uint8_t buf[64];

    /* Lengths only: the encoder must refuse before reading a byte. */
    t.u.task.payload = bytes_n(binary, (size_t)UINT32_MAX);
    e.u.error.message = bytes_n(binary, (size_t)UINT32_MAX - 2);
    assert_int_equal(proto_msg_size(&t), 0);
    assert_int_equal(proto_msg_encode_head(&t, buf, sizeof(buf)), 0);
    assert_int_equal(proto_msg_size(&e), 0);
    e.u.error.message.len = (size_t)UINT32_MAX - 3; /* the largest body: 3 + that */
    assert_int_equal(proto_msg_size(&e), (size_t)UINT32_MAX + PROTO_LEN_PREFIX);
}

static void test_encoders_cap_one_short(void **state)
{
    size_t ns = all_samples(samples);
    static uint8_t buf[PROTO_MAX_HEAD + 64];

    for (size_t i = 0; i < ns; i++) {
        const proto_msg *m = &samples[i];
        size_t size = proto_msg_size(m);
        size_t head = size - tail_len(m);

        assert_true(size <= sizeof(buf));
        memset(buf, 0xa5, sizeof(buf));
        assert_int_equal(proto_msg_encode(m, buf, size - 1), 0);
        assert_int_equal(proto_msg_encode(m, buf, 0), 0);
        assert_int_equal(proto_msg_encode_head(m, buf, head - 1), 0);
        assert_int_equal(proto_msg_encode_head(m, buf, 0), 0);
        for (size_t j = 0; j < sizeof(buf); j++)
            assert_int_equal(buf[j], 0xa5); /* nothing written on refusal */
        assert_int_equal(proto_msg_encode(m, buf, size), size);
        assert_int_equal(proto_msg_encode_head(m, buf, head), head);
    }
}

/* ---- exact bytes ---- */

static void test_task_bytes_big_endian(void **state)
{
    static const uint8_t frame[] = {
        0x00, 0x00, 0x00, 0x1f,                         /* body length 31 */
        0x10,                                           /* TASK */
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, /* task_id */
        0x0a, 0x0b, 0x0c, 0x0d,                         /* epoch */
        0x00, 0x00, 0x00, 0x02,                         /* attempt */
        0x00, 0x00, 0x75, 0x30,                         /* timeout_ms 30000 */
        0x02,                                           /* priority */
        0x00, 0x04, 'e',  'c',  'h',  'o',              /* type */
        0x00, 0xff, 0x00,                               /* payload */
    };
    proto_msg m;
    uint8_t out[sizeof(frame)];

    assert_int_equal(decode_frame(frame, sizeof(frame), &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_TASK);
    assert_true(m.u.task.task_id == UINT64_C(0x0102030405060708));
    assert_int_equal(m.u.task.epoch, 0x0a0b0c0d);
    assert_int_equal(m.u.task.attempt, 2);
    assert_int_equal(m.u.task.timeout_ms, 30000);
    assert_int_equal(m.u.task.priority, 2);
    assert_int_equal(m.u.task.type.len, 4);
    assert_memory_equal(m.u.task.type.ptr, "echo", 4);
    assert_int_equal(m.u.task.payload.len, 3);
    assert_ptr_equal(m.u.task.payload.ptr, frame + sizeof(frame) - 3);
    assert_int_equal(proto_msg_encode(&m, out, sizeof(out)), sizeof(frame));
    assert_memory_equal(out, frame, sizeof(frame));
}

static void test_done_extend_cancel_bytes(void **state)
{
    static const uint8_t done[] = {
        0x00, 0x00, 0x00, 0x18,                         /* body length 24 */
        0x11,                                           /* DONE */
        0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88, /* task_id */
        0x00, 0x00, 0x00, 0x03,                         /* epoch */
        0x00, 0x00, 0x00, 0x05,                         /* attempt */
        0x03,                                           /* outcome RETRY_AFTER */
        0x00, 0x00, 0x3a, 0x98,                         /* retry_after_ms 15000 */
        'n',  'o',                                      /* data */
    };
    static const uint8_t extend[] = {
        0x00, 0x00, 0x00, 0x15,                         /* body length 21 */
        0x12,                                           /* EXTEND */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, /* task_id 42 */
        0x00, 0x00, 0x00, 0x01,                         /* epoch */
        0x00, 0x00, 0x00, 0x01,                         /* attempt */
        0x00, 0x00, 0xea, 0x60,                         /* extend_ms 60000 */
    };
    static const uint8_t cancel[] = {
        0x00, 0x00, 0x00, 0x11,                         /* body length 17 */
        0x13,                                           /* CANCEL */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, /* task_id 42 */
        0x00, 0x00, 0x00, 0x01,                         /* epoch */
        0x00, 0x00, 0x00, 0x01,                         /* attempt */
    };
    const uint8_t *frames[] = {done, extend, cancel};
    const size_t sizes[] = {sizeof(done), sizeof(extend), sizeof(cancel)};
    uint8_t out[64];
    proto_msg m;

    assert_int_equal(decode_frame(done, sizeof(done), &m), PROTO_OK);
    assert_true(m.u.done.task_id == UINT64_C(0xffeeddccbbaa9988));
    assert_int_equal(m.u.done.epoch, 3);
    assert_int_equal(m.u.done.attempt, 5);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_RETRY_AFTER);
    assert_int_equal(m.u.done.retry_after_ms, 15000);
    assert_bytes_equal(m.u.done.data, bytes_of("no"));
    assert_int_equal(decode_frame(extend, sizeof(extend), &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_EXTEND);
    assert_true(m.u.extend.task_id == 42);
    assert_int_equal(m.u.extend.epoch, 1);
    assert_int_equal(m.u.extend.attempt, 1);
    assert_int_equal(m.u.extend.extend_ms, 60000);
    assert_int_equal(decode_frame(cancel, sizeof(cancel), &m), PROTO_OK);
    assert_int_equal(m.type, PROTO_CANCEL);
    assert_true(m.u.cancel.task_id == 42);
    assert_int_equal(m.u.cancel.epoch, 1);
    assert_int_equal(m.u.cancel.attempt, 1);
    /* And the encoder writes exactly these bytes back. */
    for (size_t i = 0; i < NELEMS(frames); i++) {
        assert_int_equal(decode_frame(frames[i], sizes[i], &m), PROTO_OK);
        assert_int_equal(proto_msg_encode(&m, out, sizeof(out)), sizes[i]);
        assert_memory_equal(out, frames[i], sizes[i]);
    }
}

static void test_hello_version_not_judged(void **state)
{
    /* The decoder accepts any version: answering ERROR PROTO_ERR_VERSION is the
     * dispatcher's decision, and it needs the decoded HELLO to make it. */
    proto_msg m = sample_hello();

    m.u.hello.version = PROTO_VERSION + 1;
    roundtrip(&m);
    m.u.hello.version = 0;
    roundtrip(&m);
}

static void test_names(void **state)
{
    assert_string_equal(proto_type_name(PROTO_HELLO), "HELLO");
    assert_string_equal(proto_type_name(PROTO_WELCOME), "WELCOME");
    assert_string_equal(proto_type_name(PROTO_HEARTBEAT), "HEARTBEAT");
    assert_string_equal(proto_type_name(PROTO_ERROR), "ERROR");
    assert_string_equal(proto_type_name(PROTO_STOP), "STOP");
    assert_string_equal(proto_type_name(PROTO_TASK), "TASK");
    assert_string_equal(proto_type_name(PROTO_DONE), "DONE");
    assert_string_equal(proto_type_name(PROTO_EXTEND), "EXTEND");
    assert_string_equal(proto_type_name(PROTO_CANCEL), "CANCEL");
    assert_string_equal(proto_type_name(PROTO_SUBMIT), "SUBMIT");
    assert_string_equal(proto_type_name(PROTO_SUBMITTED), "SUBMITTED");
    assert_string_equal(proto_type_name(PROTO_OUTCOME), "OUTCOME");
    assert_string_equal(proto_type_name(PROTO_CONFIRM), "CONFIRM");
    assert_string_equal(proto_type_name(PROTO_HOLDING), "HOLDING");
    assert_string_equal(proto_type_name(0), "UNKNOWN");
    assert_string_equal(proto_type_name(0xff), "UNKNOWN");
    assert_string_equal(proto_status_text(PROTO_OK), "OK");
    assert_string_equal(proto_status_text(PROTO_NEED_MORE), "NEED_MORE");
    assert_string_equal(proto_status_text(PROTO_TOO_BIG), "TOO_BIG");
    assert_string_equal(proto_status_text(PROTO_BAD), "BAD");
    assert_string_equal(proto_status_text(-3), "UNKNOWN");
    assert_string_equal(proto_status_text(2), "UNKNOWN");
    assert_string_equal(proto_status_text(-2147483647 - 1), "UNKNOWN");
    assert_string_equal(proto_outcome_name(PROTO_OUTCOME_SUCCESS), "SUCCESS");
    assert_string_equal(proto_outcome_name(PROTO_OUTCOME_FAIL_PERM), "FAIL_PERM");
    assert_string_equal(proto_outcome_name(PROTO_OUTCOME_FAIL_RETRY), "FAIL_RETRY");
    assert_string_equal(proto_outcome_name(PROTO_OUTCOME_RETRY_AFTER), "RETRY_AFTER");
    assert_string_equal(proto_outcome_name(PROTO_OUTCOME_MAX + 1), "UNKNOWN");
}

/* ---- version 2: producers, SUBMIT, SUBMITTED, OUTCOME ---- */

static void test_roundtrip_submit_frames(void **state)
{
    proto_msg m = sample_submit();

    roundtrip(&m);
    m.u.submit.flags = 0;
    m.u.submit.ntasks = 1;
    roundtrip(&m);
    m = sample_submitted(PROTO_SUBMIT_OK);
    roundtrip(&m);
    m = sample_submitted(PROTO_SUBMIT_INVALID);
    roundtrip(&m);
    m = sample_submitted(PROTO_SUBMIT_UNAVAILABLE);
    roundtrip(&m);
    m = sample_outcome(PROTO_STATE_SUCCESSFUL);
    roundtrip(&m);
    m.u.outcome.data = bytes_n(NULL, 0);
    roundtrip(&m);
}

static void test_hello_producer_rules(void **state)
{
    proto_msg m = sample_hello();
    uint8_t buf[256];

    m.u.hello.ntypes = 0;
    m.u.hello.capacity = 0;
    m.u.hello.version = 2;
    roundtrip(&m); /* a version-2 producer */
    m.u.hello.version = 1;
    assert_int_equal(proto_msg_size(&m), 0); /* version 1 has no producers */
    m.u.hello.version = 2;
    m.u.hello.capacity = 1;
    assert_int_equal(proto_msg_size(&m), 0); /* a producer takes no task */
    assert_int_equal(proto_msg_encode(&m, buf, sizeof(buf)), 0);
    m = sample_hello();
    m.u.hello.capacity = 0;
    m.u.hello.version = 2;
    assert_int_equal(proto_msg_size(&m), 0); /* a worker needs capacity */
}

static void test_submit_bounds(void **state)
{
    proto_submit_task many[PROTO_MAX_SUBMIT_TASKS + 1];
    proto_submit_task t = submit_tasks[1];
    proto_msg m = {.type = PROTO_SUBMIT};
    uint8_t big_key[PROTO_MAX_DEDUP_KEY_LEN + 1];

    memset(big_key, 'k', sizeof(big_key));
    for (size_t i = 0; i < NELEMS(many); i++)
        many[i] = t;
    m.u.submit.tasks = many;
    m.u.submit.ntasks = PROTO_MAX_SUBMIT_TASKS;
    roundtrip(&m);
    m.u.submit.ntasks = PROTO_MAX_SUBMIT_TASKS + 1;
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.submit.ntasks = 0;
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.submit.ntasks = 1;
    m.u.submit.flags = 0x08; /* not a known flag */
    assert_int_equal(proto_msg_size(&m), 0);
    m.u.submit.flags = 0;
    many[0].priority = 3;
    assert_int_equal(proto_msg_size(&m), 0);
    many[0].priority = 2;
    many[0].max_attempts = PROTO_MAX_ATTEMPTS + 1;
    assert_int_equal(proto_msg_size(&m), 0);
    many[0].max_attempts = PROTO_MAX_ATTEMPTS;
    many[0].dedup_key = bytes_n(big_key, PROTO_MAX_DEDUP_KEY_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    many[0].dedup_key = bytes_n(big_key, PROTO_MAX_DEDUP_KEY_LEN);
    roundtrip(&m);
    many[0].type = bytes_n(NULL, 0);
    assert_int_equal(proto_msg_size(&m), 0);
    many[0].type = bytes_n(big_type, PROTO_MAX_TYPE_LEN + 1);
    assert_int_equal(proto_msg_size(&m), 0);
    many[0].type = bytes_n(big_type, PROTO_MAX_TYPE_LEN);
    roundtrip(&m);
    many[0].payload = bytes_n(binary, PROTO_MAX_PAYLOAD_LEN + 1u); /* never read: refused first */
    assert_int_equal(proto_msg_size(&m), 0);
}

static void test_submit_decoder_side(void **state)
{
    proto_msg m = sample_submit();
    size_t n;
    uint8_t *frame = encode_new(&m, &n);
    proto_msg out;
    uint8_t *body = frame + PROTO_LEN_PREFIX;
    size_t blen = n - PROTO_LEN_PREFIX;

    /* Every strict prefix of the body is BAD: no field may run past the end. */
    for (size_t k = 1; k < blen; k++)
        assert_int_equal(proto_msg_decode(body, k, &out), PROTO_BAD);
    assert_int_equal(proto_msg_decode(body, blen, &out), PROTO_OK);
    assert_null(out.u.submit.tasks);
    assert_int_equal(decode_with_extra(&m, 0), PROTO_BAD);
    /* flags at 5, ntasks at 6..7, the first entry's priority at 8, max_attempts at 9. */
    for (int bit = 1; bit < 8; bit++)
        assert_int_equal(decode_patched(&m, 5, (uint8_t)(1u << bit | 1u)), PROTO_BAD);
    assert_int_equal(decode_patched(&m, 7, 0), PROTO_BAD);  /* ntasks 0 */
    assert_int_equal(decode_patched(&m, 7, 4), PROTO_BAD);  /* one more than there is */
    assert_int_equal(decode_patched(&m, 7, 2), PROTO_BAD);  /* one entry left over */
    assert_int_equal(decode_patched(&m, 8, 3), PROTO_BAD);  /* priority */
    assert_int_equal(decode_patched(&m, 9, 0x04), PROTO_BAD); /* max_attempts 1029 */
    free(frame);

    /* The cursor refuses to read past the entries. */
    proto_bytes none = {NULL, 0};
    proto_submit_task t;
    assert_int_equal(proto_submit_next(&none, &t), PROTO_BAD);
}

static void test_submitted_outcome_decoder_side(void **state)
{
    proto_msg m = sample_submitted(PROTO_SUBMIT_OK);
    proto_msg out;

    /* status at 5..6, n at 7..8, the first result byte at 9. */
    assert_int_equal(decode_patched(&m, 6, 3), PROTO_BAD);
    assert_int_equal(decode_patched(&m, 6, PROTO_SUBMIT_INVALID), PROTO_BAD); /* n != 0 */
    assert_int_equal(decode_patched(&m, 8, 0), PROTO_BAD);                    /* OK with n 0 */
    assert_int_equal(decode_patched(&m, 8, 200), PROTO_BAD);                  /* past the end */
    assert_int_equal(decode_patched(&m, 9, 2), PROTO_BAD);
    assert_int_equal(decode_patched(&m, 8, 2), PROTO_OK); /* the third result becomes message */
    assert_int_equal(decode_with_extra(&m, 'x'), PROTO_OK);
    m = sample_outcome(PROTO_STATE_SUCCESSFUL);
    for (int st = 0; st < 256; st++)
        assert_int_equal(decode_patched(&m, 13, (uint8_t)st),
                         st == PROTO_STATE_SUCCESSFUL || st == PROTO_STATE_FAILED ? PROTO_OK : PROTO_BAD);
    m.u.outcome.state = 1;
    assert_int_equal(proto_msg_size(&m), 0);
    static const uint8_t short_body[] = {PROTO_OUTCOME, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1};
    assert_int_equal(proto_msg_decode(short_body, sizeof(short_body), &out), PROTO_BAD);
}

/* ---- version 3: CONFIRM and HOLDING ---- */

static proto_dlv many_dlvs[PROTO_MAX_CONFIRM + 1];

static void test_list_bounds(void **state)
{
    static const uint8_t types[] = {PROTO_CONFIRM, PROTO_HOLDING};

    for (size_t k = 0; k < NELEMS(types); k++) {
        proto_msg m = sample_list(types[k]);
        proto_dlv_list *l = types[k] == PROTO_CONFIRM ? &m.u.confirm : &m.u.holding;

        for (size_t i = 0; i < NELEMS(many_dlvs); i++)
            many_dlvs[i] = (proto_dlv){i + 1, 2, 1};
        l->items = many_dlvs;
        l->n = PROTO_MAX_CONFIRM;
        assert_int_equal(proto_msg_size(&m), PROTO_LEN_PREFIX + 3 + 16 * PROTO_MAX_CONFIRM);
        roundtrip(&m);
        l->n = PROTO_MAX_CONFIRM + 1;
        assert_int_equal(proto_msg_size(&m), 0);
        l->n = 0;
        assert_int_equal(proto_msg_size(&m), 0);
        /* Without items, entries must hold exactly n deliveries. */
        l->items = NULL;
        l->n = 1;
        l->entries = bytes_n(binary, sizeof(binary));
        assert_int_equal(proto_msg_size(&m), 0);
        l->entries = bytes_n(NULL, 16);
        assert_int_equal(proto_msg_size(&m), 0);
    }
}

static void test_list_decoder_side(void **state)
{
    proto_msg m = sample_list(PROTO_HOLDING);
    proto_msg out;
    static const uint8_t zero[] = {PROTO_CONFIRM, 0, 0};
    static const uint8_t over[] = {PROTO_HOLDING, 0x04, 0x01};

    /* n at 1..2: one fewer leaves 16 bytes over, one more runs past the end. */
    assert_int_equal(decode_patched(&m, 2, 2), PROTO_BAD);
    assert_int_equal(decode_patched(&m, 2, 4), PROTO_BAD);
    assert_int_equal(decode_patched(&m, 2, 3), PROTO_OK);
    assert_int_equal(proto_msg_decode(zero, sizeof(zero), &out), PROTO_BAD);
    assert_int_equal(proto_msg_decode(over, sizeof(over), &out), PROTO_BAD);
}

static void test_list_bytes(void **state)
{
    proto_msg m = sample_list(PROTO_CONFIRM);
    uint8_t buf[64];
    size_t n = proto_msg_encode(&m, buf, sizeof(buf));
    static const uint8_t head[] = {0, 0, 0, 51, PROTO_CONFIRM, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8,
                                   0, 0, 0, 3, 0, 0, 0, 1};
    uint8_t put[PROTO_DLV_ENTRY];

    assert_int_equal(n, 4 + 3 + 3 * 16);
    assert_memory_equal(buf, head, sizeof(head));
    proto_dlv_put(put, &sample_dlvs[1]);
    assert_memory_equal(put, buf + 4 + 3 + 16, sizeof(put));
}

/* ---- golden frames (tests/data/frames) ---- */

#define MAX_GOLDEN 128
#define PATH_LEN 1024

typedef struct golden_file {
    char name[256];
    uint8_t *data; /* caller frees */
    size_t len;
} golden_file;

static int cmp_golden(const void *a, const void *b)
{
    return strcmp(((const golden_file *)a)->name, ((const golden_file *)b)->name);
}

static void golden_path(char *out, size_t cap, const char *sub, const char *name)
{
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");

    if (root == NULL || root[0] == '\0')
        fail_msg("TASKPUSH_SOURCE_ROOT is not set (run through meson test)");
    if (snprintf(out, cap, "%s/tests/data/frames/%s%s%s", root, sub, name ? "/" : "",
                 name ? name : "") >= (int)cap)
        fail_msg("path too long");
}

/* read_file reads path whole into a heap buffer; caller frees. */
static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *data = NULL;
    long size = -1;

    if (f == NULL)
        fail_msg("cannot open %s", path);
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        fail_msg("cannot size %s", path);
    data = malloc(size > 0 ? (size_t)size : 1);
    assert_non_null(data);
    if (fread(data, 1, (size_t)size, f) != (size_t)size)
        fail_msg("cannot read %s", path);
    fclose(f);
    *len = (size_t)size;
    return data;
}

/* load_golden reads every *.bin of tests/data/frames/<sub>, sorted by name. */
static size_t load_golden(const char *sub, golden_file *files)
{
    char dir[PATH_LEN];
    char path[PATH_LEN];
    DIR *d;
    struct dirent *e;
    size_t n = 0;

    golden_path(dir, sizeof(dir), sub, NULL);
    d = opendir(dir);
    if (d == NULL)
        fail_msg("cannot open %s", dir);
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);

        if (len < 5 || strcmp(e->d_name + len - 4, ".bin") != 0)
            continue;
        assert_true(n < MAX_GOLDEN && len < sizeof(files[n].name));
        memcpy(files[n].name, e->d_name, len + 1);
        golden_path(path, sizeof(path), sub, e->d_name);
        files[n].data = read_file(path, &files[n].len);
        n++;
    }
    closedir(d);
    qsort(files, n, sizeof(files[0]), cmp_golden);
    return n;
}

static void free_golden(golden_file *files, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(files[i].data);
}

static golden_file golden[MAX_GOLDEN];

static void test_golden_valid_frames(void **state)
{
    size_t n = load_golden("valid", golden);
    uint8_t *again;

    assert_true(n >= 12);
    for (size_t i = 0; i < n; i++) {
        const golden_file *g = &golden[i];
        proto_msg m;
        int rc = decode_frame(g->data, g->len, &m);

        if (rc != PROTO_OK)
            fail_msg("valid/%s: %s", g->name, proto_status_text(rc));
        if (proto_msg_size(&m) != g->len)
            fail_msg("valid/%s: size %zu, file %zu", g->name, proto_msg_size(&m), g->len);
        again = malloc(g->len);
        assert_non_null(again);
        if (proto_msg_encode(&m, again, g->len) != g->len || memcmp(again, g->data, g->len))
            fail_msg("valid/%s: re-encoding differs", g->name);
        free(again);
    }
    free_golden(golden, n);
}

/* The wrong-port tests (docs/protocol.md, "A peer at the wrong port"): an HTTP method
 * as a length is beyond any limit before HELLO; no valid frame of the golden set looks
 * like an HTTP request or answer, and only HELLO looks like a HELLO. */
static void test_wrong_port_detection(void **state)
{
    (void)state;
    static const char *const methods[] = {"GET ", "POST", "HEAD", "PUT ", "DELETE", "OPTIONS", "PATCH"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        const uint8_t *p = (const uint8_t *)methods[i];
        uint32_t body_len;
        assert_true(proto_looks_like_http_request(p, 4));
        assert_int_equal(proto_frame_check(p, 4, PROTO_MAX_HEAD, &body_len), PROTO_TOO_BIG);
    }
    assert_false(proto_looks_like_http_request((const uint8_t *)"GET", 3));
    assert_false(proto_looks_like_http_request((const uint8_t *)"get ", 4));
    assert_false(proto_looks_like_http_request((const uint8_t *)"\0\0\0\x10", 4));
    assert_true(proto_looks_like_http_response((const uint8_t *)"HTTP/1.1 400", 12));
    assert_false(proto_looks_like_http_response((const uint8_t *)"HTTP", 4));
    assert_false(proto_looks_like_http_response((const uint8_t *)"HTTPS", 5));
    const uint8_t big_hello[5] = {0, 0, 0xff, 0xff, PROTO_HELLO};
    const uint8_t short_hello[4] = {0, 0, 0, 20};
    const uint8_t zero_len[5] = {0, 0, 0, 0, PROTO_HELLO};
    assert_false(proto_looks_like_hello(big_hello, 5));
    assert_false(proto_looks_like_hello(short_hello, 4));
    assert_false(proto_looks_like_hello(zero_len, 5));

    size_t n = load_golden("valid", golden);
    size_t hellos = 0;
    for (size_t i = 0; i < n; i++) {
        const golden_file *g = &golden[i];
        assert_false(proto_looks_like_http_request(g->data, g->len));
        assert_false(proto_looks_like_http_response(g->data, g->len));
        bool hello = g->len > PROTO_LEN_PREFIX && g->data[PROTO_LEN_PREFIX] == PROTO_HELLO;
        hellos += hello;
        if (proto_looks_like_hello(g->data, g->len) != hello)
            fail_msg("valid/%s: taken for a HELLO: %d", g->name, !hello);
    }
    assert_true(hellos >= 1);
    free_golden(golden, n);
}

static void test_golden_invalid_frames(void **state)
{
    size_t n = load_golden("invalid", golden);

    assert_true(n >= 12);
    for (size_t i = 0; i < n; i++) {
        const golden_file *g = &golden[i];
        uint32_t body_len = 0;
        proto_msg m;
        int rc = proto_frame_check(g->data, g->len, PROTO_MAX_BODY_DEFAULT, &body_len);

        /* A whole frame, or a refusal from the prefix alone: never NEED_MORE. */
        if (rc == PROTO_OK) {
            if (PROTO_LEN_PREFIX + body_len != g->len)
                fail_msg("invalid/%s: %zu bytes for a frame of %u", g->name, g->len,
                         (unsigned)(PROTO_LEN_PREFIX + body_len));
            rc = proto_msg_decode(g->data + PROTO_LEN_PREFIX, body_len, &m);
        }
        if (rc != PROTO_BAD && rc != PROTO_TOO_BIG)
            fail_msg("invalid/%s: %s, expected BAD or TOO_BIG", g->name, proto_status_text(rc));
    }
    free_golden(golden, n);
}

/* decode_golden decodes valid/<name>.bin into *m; returns the file bytes (caller frees). */
static uint8_t *decode_golden(const char *name, proto_msg *m)
{
    char path[PATH_LEN];
    size_t len;
    uint8_t *data;

    golden_path(path, sizeof(path), "valid", name);
    data = read_file(path, &len);
    assert_int_equal(decode_frame(data, len, m), PROTO_OK);
    return data;
}

/* The values written by tests/data/frames/gen_frames.py. */
static void test_golden_values(void **state)
{
    proto_msg m;
    uint8_t *data;

    data = decode_golden("task_small.bin", &m);
    assert_int_equal(m.type, PROTO_TASK);
    assert_true(m.u.task.task_id == UINT64_C(0x0102030405060708));
    assert_int_equal(m.u.task.epoch, 3);
    assert_int_equal(m.u.task.attempt, 1);
    assert_int_equal(m.u.task.timeout_ms, 30000);
    assert_int_equal(m.u.task.priority, 1);
    assert_bytes_equal(m.u.task.type, bytes_of("resize"));
    assert_bytes_equal(m.u.task.payload, bytes_of("{\"w\":640,\"h\":480}"));
    free(data);

    data = decode_golden("done_retry_after.bin", &m);
    assert_int_equal(m.type, PROTO_DONE);
    assert_true(m.u.done.task_id == 11);
    assert_int_equal(m.u.done.epoch, 4);
    assert_int_equal(m.u.done.attempt, 2);
    assert_int_equal(m.u.done.outcome, PROTO_OUTCOME_RETRY_AFTER);
    assert_int_equal(m.u.done.retry_after_ms, 15000);
    assert_bytes_equal(m.u.done.data, bytes_of("rate limited"));
    free(data);

    data = decode_golden("hello_full.bin", &m);
    assert_int_equal(m.type, PROTO_HELLO);
    assert_int_equal(m.u.hello.version, PROTO_VERSION);
    assert_int_equal(m.u.hello.capacity, 64);
    assert_bytes_equal(m.u.hello.name, bytes_of("worker-07.example"));
    assert_bytes_equal(m.u.hello.token, bytes_of("s3cret-token"));
    assert_int_equal(m.u.hello.ntypes, 3);
    assert_bytes_equal(m.u.hello.types[0], bytes_of("resize"));
    assert_bytes_equal(m.u.hello.types[1], bytes_of("thumbnail"));
    assert_bytes_equal(m.u.hello.types[2], bytes_of("email.send"));
    free(data);

    data = decode_golden("welcome.bin", &m);
    assert_int_equal(m.type, PROTO_WELCOME);
    assert_int_equal(m.u.welcome.heartbeat_ms, 5000);
    assert_int_equal(m.u.welcome.max_body, PROTO_MAX_BODY_DEFAULT);
    assert_bytes_equal(m.u.welcome.server, bytes_of("taskpushd 0.1.0"));
    free(data);

    data = decode_golden("error_version.bin", &m);
    assert_int_equal(m.type, PROTO_ERROR);
    assert_int_equal(m.u.error.code, PROTO_ERR_VERSION);
    assert_bytes_equal(m.u.error.message, bytes_of("protocol version 2 not supported"));
    free(data);

    data = decode_golden("submit_full.bin", &m);
    assert_int_equal(m.type, PROTO_SUBMIT);
    assert_int_equal(m.u.submit.request_id, 0xA1B2C3D4);
    assert_int_equal(m.u.submit.flags, PROTO_SUBMIT_WAIT);
    assert_int_equal(m.u.submit.ntasks, 3);
    {
        proto_bytes cur = m.u.submit.entries;
        proto_submit_task t;
        assert_int_equal(proto_submit_next(&cur, &t), PROTO_OK);
        assert_int_equal(t.priority, 2);
        assert_int_equal(t.max_attempts, 5);
        assert_int_equal(t.delay_ms, 1500);
        assert_int_equal(t.timeout_ms, 30000);
        assert_bytes_equal(t.type, bytes_of("email.send"));
        assert_bytes_equal(t.dedup_key, bytes_of("mail-42"));
        assert_bytes_equal(t.payload, bytes_of("hello"));
        assert_int_equal(proto_submit_next(&cur, &t), PROTO_OK);
        assert_bytes_equal(t.type, bytes_of("noop"));
        assert_int_equal(t.dedup_key.len, 0);
        assert_int_equal(proto_submit_next(&cur, &t), PROTO_OK);
        assert_int_equal(t.payload.len, 256 + 16 + 1);
        assert_int_equal(cur.len, 0);
        assert_int_equal(proto_submit_next(&cur, &t), PROTO_BAD);
    }
    free(data);

    /* The group keys (PROTO_SUBMIT_GROUP_KEY): one per entry, after the payload; empty
     * is none, 191 bytes the most. Read without the flag, the entries do not parse. */
    data = decode_golden("submit_group_key.bin", &m);
    assert_int_equal(m.type, PROTO_SUBMIT);
    assert_int_equal(m.u.submit.flags, PROTO_SUBMIT_WAIT | PROTO_SUBMIT_GROUP_KEY);
    assert_int_equal(m.u.submit.ntasks, 3);
    {
        proto_bytes cur = m.u.submit.entries, plain = m.u.submit.entries;
        proto_submit_task t;
        assert_int_equal(proto_submit_next_flags(&cur, m.u.submit.flags, &t), PROTO_OK);
        assert_bytes_equal(t.type, bytes_of("crawl"));
        assert_bytes_equal(t.payload, bytes_of("u"));
        assert_bytes_equal(t.group_key, bytes_of("host-a"));
        assert_int_equal(proto_submit_next_flags(&cur, m.u.submit.flags, &t), PROTO_OK);
        assert_int_equal(t.group_key.len, 0);
        assert_int_equal(proto_submit_next_flags(&cur, m.u.submit.flags, &t), PROTO_OK);
        assert_int_equal(t.group_key.len, PROTO_MAX_GROUP_KEY_LEN);
        assert_int_equal(cur.len, 0);
        assert_int_equal(proto_submit_next(&plain, &t), PROTO_OK);
        assert_int_equal(t.group_key.len, 0);
        assert_int_equal(proto_submit_next(&plain, &t), PROTO_BAD); /* "host-a" is no entry */
    }
    /* Encoded again from the decoded entries, and from tasks: the same bytes. */
    {
        proto_submit_task tasks[1] = {{.priority = 1, .type = bytes_of("crawl"),
                                       .group_key = bytes_of("host-a")}};
        proto_msg e = {.type = PROTO_SUBMIT};
        e.u.submit.flags = PROTO_SUBMIT_GROUP_KEY;
        e.u.submit.ntasks = 1;
        e.u.submit.tasks = tasks;
        roundtrip(&e);
        tasks[0].group_key.len = PROTO_MAX_GROUP_KEY_LEN + 1;
        assert_int_equal(proto_msg_size(&e), 0);
        e.u.submit.flags = 0; /* not sent without the flag: its length does not matter */
        assert_int_not_equal(proto_msg_size(&e), 0);
    }
    free(data);

    data = decode_golden("submitted_ok.bin", &m);
    assert_int_equal(m.type, PROTO_SUBMITTED);
    assert_int_equal(m.u.submitted.status, PROTO_SUBMIT_OK);
    assert_int_equal(m.u.submitted.n, 3);
    {
        proto_submit_res r;
        proto_submitted_result(&m.u.submitted, 2, &r);
        assert_int_equal(r.result, PROTO_SUBMIT_DUPLICATE);
        assert_true(r.task_id == 55);
    }
    assert_int_equal(m.u.submitted.message.len, 0);
    free(data);

    data = decode_golden("outcome_failed.bin", &m);
    assert_int_equal(m.type, PROTO_OUTCOME);
    assert_int_equal(m.u.outcome.request_id, 9);
    assert_true(m.u.outcome.task_id == UINT64_MAX);
    assert_int_equal(m.u.outcome.state, PROTO_STATE_FAILED);
    assert_bytes_equal(m.u.outcome.data, bytes_of("permanent: bad address"));
    free(data);

    data = decode_golden("hello_v1.bin", &m);
    assert_int_equal(m.u.hello.version, 1);
    free(data);
    data = decode_golden("hello_producer.bin", &m);
    assert_int_equal(m.u.hello.ntypes, 0);
    assert_int_equal(m.u.hello.capacity, 0);
    free(data);

    data = decode_golden("hello_v2.bin", &m);
    assert_int_equal(m.u.hello.version, 2);
    free(data);
    data = decode_golden("confirm_several.bin", &m);
    assert_int_equal(m.type, PROTO_CONFIRM);
    assert_int_equal(m.u.confirm.n, 3);
    {
        proto_dlv d;
        proto_dlv_at(&m.u.confirm, 1, &d);
        assert_true(d.task_id == 102);
        assert_int_equal(d.epoch, 7);
        assert_int_equal(d.attempt, 2);
        proto_dlv_at(&m.u.confirm, 2, &d);
        assert_true(d.task_id == UINT64_MAX);
        assert_int_equal(d.attempt, UINT32_MAX);
    }
    free(data);
    data = decode_golden("holding_max.bin", &m);
    assert_int_equal(m.type, PROTO_HOLDING);
    assert_int_equal(m.u.holding.n, PROTO_MAX_CONFIRM);
    free(data);

    data = decode_golden("task_binary_payload.bin", &m);
    assert_int_equal(m.u.task.payload.len, 256 + 16 + 1);
    for (size_t i = 0; i < 256; i++)
        assert_int_equal(m.u.task.payload.ptr[i], i);
    free(data);
}

static int setup_big_fields(void **state)
{
    for (size_t i = 0; i < sizeof(big_name); i++)
        big_name[i] = (uint8_t)('a' + i % 26);
    for (size_t i = 0; i < sizeof(big_token); i++)
        big_token[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < sizeof(big_type); i++)
        big_type[i] = (uint8_t)(0xff - i);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_hello),
        cmocka_unit_test(test_roundtrip_hello_max_bounds),
        cmocka_unit_test(test_roundtrip_welcome),
        cmocka_unit_test(test_roundtrip_heartbeat_stop),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_roundtrip_task),
        cmocka_unit_test(test_roundtrip_done_every_outcome),
        cmocka_unit_test(test_roundtrip_extend_cancel),
        cmocka_unit_test(test_binary_fields_survive),
        cmocka_unit_test(test_head_plus_tail_equals_encode),
        cmocka_unit_test(test_head_prefix_counts_tail),
        cmocka_unit_test(test_frame_check_needs_prefix),
        cmocka_unit_test(test_byte_at_a_time),
        cmocka_unit_test(test_two_frames_coalesced),
        cmocka_unit_test(test_three_frames_coalesced_and_partial),
        cmocka_unit_test(test_zero_prefix_bad),
        cmocka_unit_test(test_prefix_over_max_too_big),
        cmocka_unit_test(test_prefix_ffffffff_too_big),
        cmocka_unit_test(test_truncated_bodies_bad),
        cmocka_unit_test(test_decode_empty_body_bad),
        cmocka_unit_test(test_trailing_bytes_on_fixed_frames_bad),
        cmocka_unit_test(test_trailing_bytes_on_tail_frames_ok),
        cmocka_unit_test(test_unknown_types_bad),
        cmocka_unit_test(test_task_priority_range),
        cmocka_unit_test(test_done_outcome_range),
        cmocka_unit_test(test_hello_capacity_zero_bad),
        cmocka_unit_test(test_hello_ntypes_bounds),
        cmocka_unit_test(test_hello_string_bounds),
        cmocka_unit_test(test_hello_bounds_decoder_side),
        cmocka_unit_test(test_hello_type_past_end_bad),
        cmocka_unit_test(test_welcome_server_bounds),
        cmocka_unit_test(test_task_type_bounds),
        cmocka_unit_test(test_encoder_rejects_null_bytes),
        cmocka_unit_test(test_encoder_rejects_body_over_u32),
        cmocka_unit_test(test_encoders_cap_one_short),
        cmocka_unit_test(test_task_bytes_big_endian),
        cmocka_unit_test(test_done_extend_cancel_bytes),
        cmocka_unit_test(test_hello_version_not_judged),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_roundtrip_submit_frames),
        cmocka_unit_test(test_hello_producer_rules),
        cmocka_unit_test(test_submit_bounds),
        cmocka_unit_test(test_submit_decoder_side),
        cmocka_unit_test(test_submitted_outcome_decoder_side),
        cmocka_unit_test(test_list_bounds),
        cmocka_unit_test(test_list_decoder_side),
        cmocka_unit_test(test_list_bytes),
        cmocka_unit_test(test_golden_valid_frames),
        cmocka_unit_test(test_wrong_port_detection),
        cmocka_unit_test(test_golden_invalid_frames),
        cmocka_unit_test(test_golden_values),
    };

    return cmocka_run_group_tests(tests, setup_big_fields, NULL);
}
