/* fuzz_frame.c: libFuzzer target of the frame codec.
 *
 * The input is a byte stream as a peer would send it. Frames are cut with the
 * read loops' frame reader (proto/frame_reader.h), which must agree with
 * proto_frame_check, and decoded with proto_frame_decode until the stream ends or
 * framing fails (TOO_BIG, BAD, or a partial last frame). Each frame that
 * decodes is re-encoded into a heap buffer of exactly proto_msg_size bytes (so
 * that ASan sees any overflow) and must come back byte for byte, then decode
 * again to the same message field by field (CONFIRM and HOLDING by their
 * entries); encode_head + tail must equal encode, and every encoder must refuse a
 * buffer one byte short. The whole
 * input is also decoded as one bare body, so that the decoders are reached
 * without the fuzzer first having to get a length prefix right.
 * Any disagreement calls abort().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame_reader.h"
#include "proto.h"

/* Small enough that the fuzzer reaches TOO_BIG, large enough for every head. */
#define FUZZ_MAX_BODY (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static int bytes_equal(proto_bytes a, proto_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* inside: b lies within buf[0..n). */
static int inside(proto_bytes b, const uint8_t *buf, size_t n)
{
    return b.ptr >= buf && b.ptr <= buf + n && b.len <= (size_t)(buf + n - b.ptr);
}

/* msg_equal compares the fields of the type both messages have. */
static int msg_equal(const proto_msg *a, const proto_msg *b)
{
    int eq = a->type == b->type;

    switch (eq ? a->type : 0) {
    case PROTO_HELLO:
        eq = a->u.hello.version == b->u.hello.version &&
             a->u.hello.capacity == b->u.hello.capacity &&
             bytes_equal(a->u.hello.name, b->u.hello.name) &&
             bytes_equal(a->u.hello.token, b->u.hello.token) &&
             a->u.hello.ntypes == b->u.hello.ntypes;
        for (uint16_t i = 0; eq && i < a->u.hello.ntypes; i++)
            eq = bytes_equal(a->u.hello.types[i], b->u.hello.types[i]);
        break;
    case PROTO_WELCOME:
        eq = a->u.welcome.version == b->u.welcome.version &&
             a->u.welcome.heartbeat_ms == b->u.welcome.heartbeat_ms &&
             a->u.welcome.max_body == b->u.welcome.max_body &&
             bytes_equal(a->u.welcome.server, b->u.welcome.server);
        break;
    case PROTO_ERROR:
        eq = a->u.error.code == b->u.error.code &&
             bytes_equal(a->u.error.message, b->u.error.message);
        break;
    case PROTO_TASK:
        eq = a->u.task.task_id == b->u.task.task_id && a->u.task.epoch == b->u.task.epoch &&
             a->u.task.attempt == b->u.task.attempt &&
             a->u.task.timeout_ms == b->u.task.timeout_ms &&
             a->u.task.priority == b->u.task.priority &&
             bytes_equal(a->u.task.type, b->u.task.type) &&
             bytes_equal(a->u.task.payload, b->u.task.payload);
        break;
    case PROTO_DONE:
        eq = a->u.done.task_id == b->u.done.task_id && a->u.done.epoch == b->u.done.epoch &&
             a->u.done.attempt == b->u.done.attempt && a->u.done.outcome == b->u.done.outcome &&
             a->u.done.retry_after_ms == b->u.done.retry_after_ms &&
             bytes_equal(a->u.done.data, b->u.done.data);
        break;
    case PROTO_EXTEND:
        eq = a->u.extend.task_id == b->u.extend.task_id && a->u.extend.epoch == b->u.extend.epoch &&
             a->u.extend.attempt == b->u.extend.attempt &&
             a->u.extend.extend_ms == b->u.extend.extend_ms;
        break;
    case PROTO_CANCEL:
        eq = a->u.cancel.task_id == b->u.cancel.task_id && a->u.cancel.epoch == b->u.cancel.epoch &&
             a->u.cancel.attempt == b->u.cancel.attempt;
        break;
    case PROTO_PROGRESS:
        eq = a->u.progress.task_id == b->u.progress.task_id && a->u.progress.epoch == b->u.progress.epoch &&
             a->u.progress.attempt == b->u.progress.attempt &&
             a->u.progress.permille == b->u.progress.permille &&
             bytes_equal(a->u.progress.message, b->u.progress.message);
        break;
    case PROTO_SUBMIT:
        /* Both decoded: the entries are the bytes of every task, checked by the decoder. */
        eq = a->u.submit.request_id == b->u.submit.request_id &&
             a->u.submit.flags == b->u.submit.flags && a->u.submit.ntasks == b->u.submit.ntasks &&
             bytes_equal(a->u.submit.entries, b->u.submit.entries);
        break;
    case PROTO_SUBMITTED:
        eq = a->u.submitted.request_id == b->u.submitted.request_id &&
             a->u.submitted.status == b->u.submitted.status && a->u.submitted.n == b->u.submitted.n &&
             bytes_equal(a->u.submitted.entries, b->u.submitted.entries) &&
             bytes_equal(a->u.submitted.message, b->u.submitted.message);
        break;
    case PROTO_OUTCOME:
        eq = a->u.outcome.request_id == b->u.outcome.request_id &&
             a->u.outcome.task_id == b->u.outcome.task_id && a->u.outcome.state == b->u.outcome.state &&
             bytes_equal(a->u.outcome.data, b->u.outcome.data);
        break;
    case PROTO_CONFIRM:
    case PROTO_HOLDING:
        /* Both decoded (the same union layout for either): the entries' bytes. */
        eq = a->u.confirm.n == b->u.confirm.n &&
             bytes_equal(a->u.confirm.entries, b->u.confirm.entries);
        break;
    case PROTO_HEARTBEAT:
    case PROTO_STOP:
        break;
    default:
        eq = 0; /* the decoder must never return OK for an unknown type */
        break;
    }
    return eq;
}

/* tail returns m's trailing opaque field (empty for types without one). */
static proto_bytes tail(const proto_msg *m)
{
    proto_bytes t = {NULL, 0};

    if (m->type == PROTO_TASK)
        t = m->u.task.payload;
    else if (m->type == PROTO_DONE)
        t = m->u.done.data;
    else if (m->type == PROTO_ERROR)
        t = m->u.error.message;
    else if (m->type == PROTO_SUBMITTED)
        t = m->u.submitted.message;
    else if (m->type == PROTO_OUTCOME)
        t = m->u.outcome.data;
    return t;
}

/* check_borrowed: every byte field of m lies inside the body it came from. */
static void check_borrowed(const proto_msg *m, const uint8_t *body, size_t n)
{
    switch (m->type) {
    case PROTO_HELLO:
        check(inside(m->u.hello.name, body, n) && inside(m->u.hello.token, body, n));
        check(m->u.hello.ntypes <= PROTO_MAX_TYPES);
        /* No type only for a version-2 producer, which takes no task. */
        check(m->u.hello.ntypes >= 1 ? m->u.hello.capacity >= 1
                                     : m->u.hello.version >= 2 && m->u.hello.capacity == 0);
        for (uint16_t i = 0; i < m->u.hello.ntypes; i++)
            check(inside(m->u.hello.types[i], body, n));
        break;
    case PROTO_WELCOME:
        check(inside(m->u.welcome.server, body, n));
        break;
    case PROTO_TASK:
        check(inside(m->u.task.type, body, n));
        break;
    case PROTO_SUBMIT: {
        /* Every entry reads back within the body, and exactly ntasks of them. */
        proto_bytes cur = m->u.submit.entries;
        proto_submit_task t;
        check(inside(cur, body, n) && m->u.submit.ntasks >= 1 &&
              m->u.submit.ntasks <= PROTO_MAX_SUBMIT_TASKS);
        for (uint16_t i = 0; i < m->u.submit.ntasks; i++) {
            check(proto_submit_next_flags(&cur, m->u.submit.flags, &t) == PROTO_OK);
            check(inside(t.type, body, n) && inside(t.dedup_key, body, n) &&
                  inside(t.payload, body, n) && (t.group_key.len == 0 || inside(t.group_key, body, n)));
            check(t.type.len >= 1 && t.priority <= 2 && t.dedup_key.len <= PROTO_MAX_DEDUP_KEY_LEN &&
                  t.group_key.len <= PROTO_MAX_GROUP_KEY_LEN);
        }
        check(cur.len == 0);
        break;
    }
    case PROTO_CONFIRM:
    case PROTO_HOLDING:
        check(m->u.confirm.n >= 1 && m->u.confirm.n <= PROTO_MAX_CONFIRM &&
              inside(m->u.confirm.entries, body, n) &&
              m->u.confirm.entries.len == (size_t)m->u.confirm.n * PROTO_DLV_ENTRY);
        break;
    case PROTO_PROGRESS:
        /* Within its bounds, and text the dispatcher may copy and show as it is. */
        check(m->u.progress.permille <= PROTO_PROGRESS_MAX &&
              m->u.progress.message.len <= PROTO_MAX_PROGRESS_MSG &&
              (m->u.progress.message.len == 0 || inside(m->u.progress.message, body, n)) &&
              proto_utf8_valid(m->u.progress.message));
        break;
    case PROTO_SUBMITTED:
        check(m->u.submitted.n == 0 || inside(m->u.submitted.entries, body, n));
        check(m->u.submitted.entries.len == (size_t)m->u.submitted.n * PROTO_SUBMITTED_ENTRY);
        break;
    default:
        break;
    }
    if (m->type == PROTO_TASK || m->type == PROTO_DONE || m->type == PROTO_ERROR ||
        m->type == PROTO_SUBMITTED || m->type == PROTO_OUTCOME)
        check(inside(tail(m), body, n));
}

/* roundtrip re-encodes m, decoded from frame (whole, prefix included). */
static void roundtrip(const proto_msg *m, const uint8_t *frame, size_t frame_len)
{
    size_t size = proto_msg_size(m);
    proto_bytes t = tail(m);
    uint8_t *buf;
    uint8_t *head;
    size_t head_len;
    uint32_t body_len = 0;
    proto_msg again;

    check(size == frame_len);
    buf = malloc(size);
    head = malloc(size - t.len);
    check(buf != NULL && head != NULL);

    check(proto_msg_encode(m, buf, size - 1) == 0);
    check(proto_msg_encode(m, buf, size) == size);
    check(memcmp(buf, frame, size) == 0); /* the encoding is canonical */

    head_len = proto_msg_encode_head(m, head, size - t.len);
    check(head_len == size - t.len);
    check(proto_msg_encode_head(m, head, head_len - 1) == 0);
    check(memcmp(head, buf, head_len) == 0);
    check(t.len == 0 || memcmp(buf + head_len, t.ptr, t.len) == 0);

    check(proto_frame_check(buf, size, FUZZ_MAX_BODY, &body_len) == PROTO_OK);
    check(PROTO_LEN_PREFIX + (size_t)body_len == size);
    check(proto_msg_decode(buf + PROTO_LEN_PREFIX, body_len, &again) == PROTO_OK);
    check(msg_equal(m, &again));
    check_borrowed(&again, buf + PROTO_LEN_PREFIX, body_len);
    free(head);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    proto_frame_reader rd;
    proto_msg m;
    int rc;

    if (data == NULL)
        return 0;
    /* The whole input as one body. */
    rc = proto_msg_decode(data, size, &m);
    check(rc == PROTO_OK || rc == PROTO_BAD);
    if (rc == PROTO_OK)
        check_borrowed(&m, data, size);

    /* The input as a stream of frames, cut as the read loops cut it. */
    proto_frame_reader_init(&rd, 0);
    for (;;) {
        uint32_t body_len = 0;
        const uint8_t *body;

        rc = proto_frame_next(&rd, data + off, size - off, FUZZ_MAX_BODY);
        check(rc == PROTO_FRAME_WHOLE || rc == PROTO_FRAME_NEED_MORE || rc == PROTO_FRAME_TOO_BIG ||
              rc == PROTO_FRAME_BAD);
        check(rc == proto_frame_check(data + off, size - off, FUZZ_MAX_BODY, &body_len));
        check(rd.body_len == proto_frame_announced(data + off, size - off));
        check(rd.body_len == (size - off < PROTO_LEN_PREFIX ? 0 : body_len));
        if (rc != PROTO_FRAME_WHOLE)
            break; /* a peer would wait (NEED_MORE) or close the connection */
        check(body_len >= 1 && body_len <= FUZZ_MAX_BODY &&
              body_len <= size - off - PROTO_LEN_PREFIX);
        /* one byte short of the frame, the reader waits */
        check(proto_frame_next(&rd, data + off, proto_frame_size(&rd) - 1, FUZZ_MAX_BODY) ==
              PROTO_FRAME_NEED_MORE);
        body = data + off + PROTO_LEN_PREFIX;
        rc = proto_frame_decode(&rd, body, &m);
        check(rc == PROTO_OK || rc == PROTO_BAD);
        if (rc == PROTO_OK) {
            check_borrowed(&m, body, body_len);
            roundtrip(&m, data + off, PROTO_LEN_PREFIX + body_len);
        }
        /* The framing is intact even after a BAD body: keep going for coverage. */
        off += PROTO_LEN_PREFIX + body_len;
    }
    return 0;
}
