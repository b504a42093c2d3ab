/* proto.c: the taskpush wire codec (see proto.h for the contract and
 * PROTOCOL.md for the format).
 *
 * Every integer is big-endian. The decoders check each length against the
 * bytes that are really there before reading them, and the encoders refuse
 * exactly what the decoders refuse, so that encode -> decode always gives the
 * message back. TASK and DONE are on the hot path: their code is straight-line
 * loads and stores at fixed offsets, with no per-field loop.
 */
#include "proto.h"

#include <stdint.h>
#include <string.h>

/* Body layouts: offsets from the first body byte (the type). */
#define OFF_TYPE 0

#define HELLO_FIXED 9 /* type, u16 version, u32 capacity, u16 name_len */
#define HELLO_OFF_VERSION 1
#define HELLO_OFF_CAPACITY 3
#define HELLO_OFF_NAME_LEN 7

#define WELCOME_FIXED 13 /* type, u16 version, u32 heartbeat, u32 max_body, u16 len */
#define WELCOME_OFF_VERSION 1
#define WELCOME_OFF_HEARTBEAT 3
#define WELCOME_OFF_MAX_BODY 7
#define WELCOME_OFF_SERVER_LEN 11

#define ERROR_FIXED 3 /* type, u16 code; the message is the rest */
#define ERROR_OFF_CODE 1

/* TASK, DONE, EXTEND and CANCEL all start with the delivery name. */
#define DLV_OFF_TASK_ID 1
#define DLV_OFF_EPOCH 9
#define DLV_OFF_ATTEMPT 13
#define DLV_FIXED 17 /* type, u64 task_id, u32 epoch, u32 attempt */

#define TASK_OFF_TIMEOUT 17
#define TASK_OFF_PRIORITY 21
#define TASK_OFF_TYPE_LEN 22
#define TASK_FIXED 24 /* ... u32 timeout_ms, u8 priority, u16 type_len */
#define TASK_PRIORITY_MAX 2

#define DONE_OFF_OUTCOME 17
#define DONE_OFF_RETRY_AFTER 18
#define DONE_FIXED 22 /* ... u8 outcome, u32 retry_after_ms; the data is the rest */

#define EXTEND_OFF_EXTEND_MS 17
#define EXTEND_BODY 21 /* ... u32 extend_ms */

#define PROGRESS_OFF_PERMILLE 17
#define PROGRESS_OFF_MSG_LEN 19
#define PROGRESS_FIXED 21 /* ... u16 permille, u16 message_len; then the message */

#define CANCEL_BODY DLV_FIXED
#define BARE_BODY 1 /* HEARTBEAT, STOP: the type byte alone */

#define SUBMIT_OFF_REQUEST 1
#define SUBMIT_OFF_FLAGS 5
#define SUBMIT_OFF_NTASKS 6
#define SUBMIT_FIXED 8 /* type, u32 request_id, u8 flags, u16 ntasks; then the entries */

#define SUBMITTED_OFF_REQUEST 1
#define SUBMITTED_OFF_STATUS 5
#define SUBMITTED_OFF_N 7
#define SUBMITTED_FIXED 9 /* type, u32 request_id, u16 status, u16 n; results; message */

#define OUTCOME_OFF_REQUEST 1
#define OUTCOME_OFF_TASK_ID 5
#define OUTCOME_OFF_STATE 13
#define OUTCOME_FIXED 14 /* type, u32 request_id, u64 task_id, u8 state; the data is the rest */

#define LIST_OFF_N 1
#define LIST_FIXED 3 /* CONFIRM, HOLDING: type, u16 n; then n deliveries of 16 bytes */

#define STR_HEAD 2 /* the u16 length before a bounded string */
#define BLOB_HEAD 4 /* the u32 length before a payload */

/* ---- big-endian loads and stores ---- */

static inline uint16_t load16(const uint8_t *p)
{
    return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t load32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t load64(const uint8_t *p)
{
    return (uint64_t)load32(p) << 32 | load32(p + 4);
}

static inline void store16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void store32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void store64(uint8_t *p, uint64_t v)
{
    store32(p, (uint32_t)(v >> 32));
    store32(p + 4, (uint32_t)v);
}

/* copy_bytes copies b to p; memcpy must not see a NULL pointer, even for 0 bytes. */
static inline void copy_bytes(uint8_t *p, proto_bytes b)
{
    if (b.len > 0)
        memcpy(p, b.ptr, b.len);
}

/* ---- framing ---- */

int proto_frame_check(const uint8_t *buf, size_t len, uint32_t max_body, uint32_t *body_len)
{
    int rc = PROTO_NEED_MORE;
    uint32_t n;

    if (len < PROTO_LEN_PREFIX)
        goto done;
    n = load32(buf);
    if (body_len != NULL)
        *body_len = n; /* also on TOO_BIG, so that the caller can log it */
    if (n == 0)
        rc = PROTO_BAD;
    else if (n > max_body)
        rc = PROTO_TOO_BIG;
    else if (len - PROTO_LEN_PREFIX >= n)
        rc = PROTO_OK;
done:
    return rc;
}

/* ---- decoding ---- */

/* take_str reads a u16 length and that many bytes at *off, at most max of them,
 * and advances *off. Returns PROTO_OK or PROTO_BAD. */
static int take_str(const uint8_t *b, size_t n, size_t *off, size_t max, proto_bytes *out)
{
    int rc = PROTO_BAD;
    size_t len;

    if (n - *off < STR_HEAD)
        goto done;
    len = load16(b + *off);
    if (len > max || n - *off - STR_HEAD < len)
        goto done;
    out->ptr = b + *off + STR_HEAD;
    out->len = len;
    *off += STR_HEAD + len;
    rc = PROTO_OK;
done:
    return rc;
}

/* A worker registers 1 .. 64 types with capacity >= 1; from version 2 on, a producer
 * registers none with capacity 0. */
static int hello_counts_ok(const proto_hello *h)
{
    if (h->ntypes == 0)
        return h->version >= 2 && h->capacity == 0;
    return h->capacity > 0;
}

static int decode_hello(const uint8_t *b, size_t n, proto_hello *h)
{
    int rc = PROTO_BAD;
    size_t off = HELLO_OFF_NAME_LEN;

    if (n < HELLO_FIXED)
        goto done;
    h->version = load16(b + HELLO_OFF_VERSION);
    h->capacity = load32(b + HELLO_OFF_CAPACITY);
    if (take_str(b, n, &off, PROTO_MAX_NAME_LEN, &h->name) != PROTO_OK ||
        take_str(b, n, &off, PROTO_MAX_TOKEN_LEN, &h->token) != PROTO_OK)
        goto done;
    if (n - off < 2)
        goto done;
    h->ntypes = load16(b + off);
    off += 2;
    if (h->ntypes > PROTO_MAX_TYPES || !hello_counts_ok(h))
        goto done;
    for (uint16_t i = 0; i < h->ntypes; i++) {
        if (take_str(b, n, &off, PROTO_MAX_TYPE_LEN, &h->types[i]) != PROTO_OK ||
            h->types[i].len == 0)
            goto done;
    }
    if (off == n)
        rc = PROTO_OK;
done:
    return rc;
}

static int decode_welcome(const uint8_t *b, size_t n, proto_welcome *w)
{
    int rc = PROTO_BAD;
    size_t off = WELCOME_OFF_SERVER_LEN;

    if (n < WELCOME_FIXED)
        goto done;
    w->version = load16(b + WELCOME_OFF_VERSION);
    w->heartbeat_ms = load32(b + WELCOME_OFF_HEARTBEAT);
    w->max_body = load32(b + WELCOME_OFF_MAX_BODY);
    if (take_str(b, n, &off, PROTO_MAX_NAME_LEN, &w->server) == PROTO_OK && off == n)
        rc = PROTO_OK;
done:
    return rc;
}

static int decode_error(const uint8_t *b, size_t n, proto_error *e)
{
    int rc = PROTO_BAD;

    if (n < ERROR_FIXED)
        goto done;
    e->code = load16(b + ERROR_OFF_CODE);
    e->message.ptr = b + ERROR_FIXED;
    e->message.len = n - ERROR_FIXED;
    rc = PROTO_OK;
done:
    return rc;
}

static int decode_task(const uint8_t *b, size_t n, proto_task *t)
{
    int rc = PROTO_BAD;
    size_t tlen;

    if (n < TASK_FIXED)
        goto done;
    tlen = load16(b + TASK_OFF_TYPE_LEN);
    if (b[TASK_OFF_PRIORITY] > TASK_PRIORITY_MAX || tlen == 0 || tlen > PROTO_MAX_TYPE_LEN ||
        n - TASK_FIXED < tlen)
        goto done;
    t->task_id = load64(b + DLV_OFF_TASK_ID);
    t->epoch = load32(b + DLV_OFF_EPOCH);
    t->attempt = load32(b + DLV_OFF_ATTEMPT);
    t->timeout_ms = load32(b + TASK_OFF_TIMEOUT);
    t->priority = b[TASK_OFF_PRIORITY];
    t->type.ptr = b + TASK_FIXED;
    t->type.len = tlen;
    t->payload.ptr = b + TASK_FIXED + tlen;
    t->payload.len = n - TASK_FIXED - tlen;
    rc = PROTO_OK;
done:
    return rc;
}

static int decode_done(const uint8_t *b, size_t n, proto_done *d)
{
    int rc = PROTO_BAD;

    if (n < DONE_FIXED || b[DONE_OFF_OUTCOME] > PROTO_OUTCOME_MAX)
        goto done;
    d->task_id = load64(b + DLV_OFF_TASK_ID);
    d->epoch = load32(b + DLV_OFF_EPOCH);
    d->attempt = load32(b + DLV_OFF_ATTEMPT);
    d->outcome = b[DONE_OFF_OUTCOME];
    d->retry_after_ms = load32(b + DONE_OFF_RETRY_AFTER);
    d->data.ptr = b + DONE_FIXED;
    d->data.len = n - DONE_FIXED;
    rc = PROTO_OK;
done:
    return rc;
}

static int decode_extend(const uint8_t *b, size_t n, proto_extend *x)
{
    int rc = PROTO_BAD;

    if (n != EXTEND_BODY)
        goto done;
    x->task_id = load64(b + DLV_OFF_TASK_ID);
    x->epoch = load32(b + DLV_OFF_EPOCH);
    x->attempt = load32(b + DLV_OFF_ATTEMPT);
    x->extend_ms = load32(b + EXTEND_OFF_EXTEND_MS);
    rc = PROTO_OK;
done:
    return rc;
}

int proto_utf8_valid(proto_bytes b)
{
    size_t i = 0;

    while (i < b.len) {
        uint8_t c = b.ptr[i];
        size_t n;
        uint32_t cp, min;

        if (c == 0)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0)
            n = 1, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0)
            n = 2, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0)
            n = 3, cp = c & 0x07, min = 0x10000;
        else
            return 0;
        if (b.len - i - 1 < n)
            return 0;
        for (size_t k = 1; k <= n; k++) {
            if ((b.ptr[i + k] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (b.ptr[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += n + 1;
    }
    return 1;
}

/* decode_progress: the message length must match the bytes left exactly. */
static int decode_progress(const uint8_t *b, size_t n, proto_progress *p)
{
    int rc = PROTO_BAD;

    if (n < PROGRESS_FIXED)
        goto done;
    p->task_id = load64(b + DLV_OFF_TASK_ID);
    p->epoch = load32(b + DLV_OFF_EPOCH);
    p->attempt = load32(b + DLV_OFF_ATTEMPT);
    p->permille = load16(b + PROGRESS_OFF_PERMILLE);
    p->message.len = load16(b + PROGRESS_OFF_MSG_LEN);
    p->message.ptr = b + PROGRESS_FIXED;
    if (p->permille > PROTO_PROGRESS_MAX || p->message.len > PROTO_MAX_PROGRESS_MSG ||
        n - PROGRESS_FIXED != p->message.len || !proto_utf8_valid(p->message))
        goto done;
    rc = PROTO_OK;
done:
    return rc;
}

static int decode_cancel(const uint8_t *b, size_t n, proto_cancel *c)
{
    int rc = PROTO_BAD;

    if (n != CANCEL_BODY)
        goto done;
    c->task_id = load64(b + DLV_OFF_TASK_ID);
    c->epoch = load32(b + DLV_OFF_EPOCH);
    c->attempt = load32(b + DLV_OFF_ATTEMPT);
    rc = PROTO_OK;
done:
    return rc;
}

/* take_entry reads one SUBMIT task at *off of b[0..n) and advances *off. */
static int take_entry(const uint8_t *b, size_t n, size_t *off, uint8_t flags, proto_submit_task *t)
{
    int rc = PROTO_BAD;
    size_t o = *off;
    uint32_t plen;

    if (n - o < 11)
        goto done;
    t->priority = b[o];
    t->max_attempts = load16(b + o + 1);
    t->delay_ms = load32(b + o + 3);
    t->timeout_ms = load32(b + o + 7);
    o += 11;
    if (t->priority > TASK_PRIORITY_MAX || t->max_attempts > PROTO_MAX_ATTEMPTS)
        goto done;
    if (take_str(b, n, &o, PROTO_MAX_TYPE_LEN, &t->type) != PROTO_OK || t->type.len == 0 ||
        take_str(b, n, &o, PROTO_MAX_DEDUP_KEY_LEN, &t->dedup_key) != PROTO_OK || n - o < BLOB_HEAD)
        goto done;
    plen = load32(b + o);
    o += BLOB_HEAD;
    if (plen > PROTO_MAX_PAYLOAD_LEN || n - o < plen)
        goto done;
    t->payload.ptr = b + o;
    t->payload.len = plen;
    o += plen;
    t->group_key.ptr = NULL;
    t->group_key.len = 0;
    if ((flags & PROTO_SUBMIT_GROUP_KEY) &&
        take_str(b, n, &o, PROTO_MAX_GROUP_KEY_LEN, &t->group_key) != PROTO_OK)
        goto done;
    t->nafter = 0;
    t->after = NULL;
    t->after_wire.ptr = NULL;
    t->after_wire.len = 0;
    if (flags & PROTO_SUBMIT_AFTER) {
        if (n - o < PROTO_SUBMIT_AFTER_FIXED)
            goto done;
        t->nafter = load16(b + o);
        o += PROTO_SUBMIT_AFTER_FIXED;
        if ((n - o) / PROTO_SUBMIT_AFTER_ID < t->nafter)
            goto done;
        t->after_wire.ptr = b + o;
        t->after_wire.len = (size_t)t->nafter * PROTO_SUBMIT_AFTER_ID;
        o += t->after_wire.len;
    }
    *off = o;
    rc = PROTO_OK;
done:
    return rc;
}

int proto_submit_next(proto_bytes *cursor, proto_submit_task *out)
{
    return proto_submit_next_flags(cursor, 0, out);
}

int proto_submit_next_flags(proto_bytes *cursor, uint8_t flags, proto_submit_task *out)
{
    size_t off = 0;

    if (cursor == NULL || cursor->ptr == NULL || out == NULL ||
        take_entry(cursor->ptr, cursor->len, &off, flags, out) != PROTO_OK)
        return PROTO_BAD;
    cursor->ptr += off;
    cursor->len -= off;
    return PROTO_OK;
}

static int decode_submit(const uint8_t *b, size_t n, proto_submit *s)
{
    int rc = PROTO_BAD;
    size_t off = SUBMIT_FIXED;
    proto_submit_task t;

    if (n < SUBMIT_FIXED)
        goto done;
    s->request_id = load32(b + SUBMIT_OFF_REQUEST);
    s->flags = b[SUBMIT_OFF_FLAGS];
    s->ntasks = load16(b + SUBMIT_OFF_NTASKS);
    if ((s->flags & ~PROTO_SUBMIT_FLAGS_KNOWN) != 0 || s->ntasks == 0 ||
        s->ntasks > PROTO_MAX_SUBMIT_TASKS)
        goto done;
    for (uint16_t i = 0; i < s->ntasks; i++)
        if (take_entry(b, n, &off, s->flags, &t) != PROTO_OK)
            goto done;
    if (off != n)
        goto done;
    s->tasks = NULL;
    s->entries.ptr = b + SUBMIT_FIXED;
    s->entries.len = n - SUBMIT_FIXED;
    rc = PROTO_OK;
done:
    return rc;
}

uint64_t proto_after_id(const proto_submit_task *t, uint16_t i)
{
    if (t->after)
        return t->after[i];
    return load64(t->after_wire.ptr + (size_t)i * PROTO_SUBMIT_AFTER_ID);
}

void proto_submitted_result(const proto_submitted *s, uint16_t i, proto_submit_res *out)
{
    const uint8_t *p = s->entries.ptr + (size_t)i * PROTO_SUBMITTED_ENTRY;

    out->result = p[0];
    out->task_id = load64(p + 1);
}

static int decode_submitted(const uint8_t *b, size_t n, proto_submitted *s)
{
    int rc = PROTO_BAD;
    size_t rlen;

    if (n < SUBMITTED_FIXED)
        goto done;
    s->request_id = load32(b + SUBMITTED_OFF_REQUEST);
    s->status = load16(b + SUBMITTED_OFF_STATUS);
    s->n = load16(b + SUBMITTED_OFF_N);
    rlen = (size_t)s->n * PROTO_SUBMITTED_ENTRY;
    if (s->status > PROTO_SUBMIT_STATUS_MAX || s->n > PROTO_MAX_SUBMIT_TASKS ||
        (s->status != PROTO_SUBMIT_OK && s->n != 0) || (s->status == PROTO_SUBMIT_OK && s->n == 0) ||
        n - SUBMITTED_FIXED < rlen)
        goto done;
    for (size_t i = 0; i < s->n; i++)
        if (b[SUBMITTED_FIXED + i * PROTO_SUBMITTED_ENTRY] > PROTO_SUBMIT_DUPLICATE)
            goto done;
    s->results = NULL;
    s->entries.ptr = b + SUBMITTED_FIXED;
    s->entries.len = rlen;
    s->message.ptr = b + SUBMITTED_FIXED + rlen;
    s->message.len = n - SUBMITTED_FIXED - rlen;
    rc = PROTO_OK;
done:
    return rc;
}

static int decode_outcome(const uint8_t *b, size_t n, proto_outcome_msg *o)
{
    int rc = PROTO_BAD;

    if (n < OUTCOME_FIXED || (b[OUTCOME_OFF_STATE] != PROTO_STATE_SUCCESSFUL &&
                              b[OUTCOME_OFF_STATE] != PROTO_STATE_FAILED))
        goto done;
    o->request_id = load32(b + OUTCOME_OFF_REQUEST);
    o->task_id = load64(b + OUTCOME_OFF_TASK_ID);
    o->state = b[OUTCOME_OFF_STATE];
    o->data.ptr = b + OUTCOME_FIXED;
    o->data.len = n - OUTCOME_FIXED;
    rc = PROTO_OK;
done:
    return rc;
}

void proto_dlv_at(const proto_dlv_list *l, uint16_t i, proto_dlv *out)
{
    const uint8_t *p;

    if (l->items != NULL) {
        *out = l->items[i];
        return;
    }
    p = l->entries.ptr + (size_t)i * PROTO_DLV_ENTRY;
    out->task_id = load64(p);
    out->epoch = load32(p + 8);
    out->attempt = load32(p + 12);
}

void proto_dlv_put(uint8_t *out, const proto_dlv *d)
{
    store64(out, d->task_id);
    store32(out + 8, d->epoch);
    store32(out + 12, d->attempt);
}

/* decode_list reads a CONFIRM or HOLDING: exactly n entries, 1 <= n <= the bound. */
static int decode_list(const uint8_t *b, size_t n, proto_dlv_list *l)
{
    int rc = PROTO_BAD;

    if (n < LIST_FIXED)
        goto done;
    l->n = load16(b + LIST_OFF_N);
    if (l->n == 0 || l->n > PROTO_MAX_CONFIRM ||
        n - LIST_FIXED != (size_t)l->n * PROTO_DLV_ENTRY)
        goto done;
    l->items = NULL;
    l->entries.ptr = b + LIST_FIXED;
    l->entries.len = n - LIST_FIXED;
    rc = PROTO_OK;
done:
    return rc;
}

int proto_msg_decode(const uint8_t *body, size_t body_len, proto_msg *out)
{
    int rc = PROTO_BAD;

    if (body == NULL || body_len == 0)
        goto done;
    out->type = body[OFF_TYPE];
    switch (out->type) {
    case PROTO_TASK:
        rc = decode_task(body, body_len, &out->u.task);
        break;
    case PROTO_DONE:
        rc = decode_done(body, body_len, &out->u.done);
        break;
    case PROTO_EXTEND:
        rc = decode_extend(body, body_len, &out->u.extend);
        break;
    case PROTO_CANCEL:
        rc = decode_cancel(body, body_len, &out->u.cancel);
        break;
    case PROTO_PROGRESS:
        rc = decode_progress(body, body_len, &out->u.progress);
        break;
    case PROTO_HEARTBEAT:
    case PROTO_STOP:
        rc = body_len == BARE_BODY ? PROTO_OK : PROTO_BAD;
        break;
    case PROTO_HELLO:
        rc = decode_hello(body, body_len, &out->u.hello);
        break;
    case PROTO_WELCOME:
        rc = decode_welcome(body, body_len, &out->u.welcome);
        break;
    case PROTO_ERROR:
        rc = decode_error(body, body_len, &out->u.error);
        break;
    case PROTO_SUBMIT:
        rc = decode_submit(body, body_len, &out->u.submit);
        break;
    case PROTO_SUBMITTED:
        rc = decode_submitted(body, body_len, &out->u.submitted);
        break;
    case PROTO_OUTCOME:
        rc = decode_outcome(body, body_len, &out->u.outcome);
        break;
    case PROTO_CONFIRM:
        rc = decode_list(body, body_len, &out->u.confirm);
        break;
    case PROTO_HOLDING:
        rc = decode_list(body, body_len, &out->u.holding);
        break;
    default:
        break;
    }
done:
    return rc;
}

/* ---- encoding ---- */

/* bytes_ok: a field the encoder may copy (a NULL pointer only with no bytes). */
static inline int bytes_ok(proto_bytes b, size_t min, size_t max)
{
    return b.len >= min && b.len <= max && (b.ptr != NULL || b.len == 0);
}

/* hello_head returns the body size of h, or 0 when the decoder would refuse it. */
static size_t hello_head(const proto_hello *h)
{
    size_t n = 0;
    size_t size;

    if (h->ntypes > PROTO_MAX_TYPES || !hello_counts_ok(h) ||
        !bytes_ok(h->name, 0, PROTO_MAX_NAME_LEN) || !bytes_ok(h->token, 0, PROTO_MAX_TOKEN_LEN))
        goto done;
    size = HELLO_FIXED + h->name.len + STR_HEAD + h->token.len + 2;
    for (uint16_t i = 0; i < h->ntypes; i++) {
        if (!bytes_ok(h->types[i], 1, PROTO_MAX_TYPE_LEN))
            goto done;
        size += STR_HEAD + h->types[i].len;
    }
    n = size;
done:
    return n;
}

/* raw_entries_ok: e holds exactly n valid SUBMIT entries (a decoded SUBMIT). */
static int raw_entries_ok(proto_bytes e, uint16_t n, uint8_t flags)
{
    size_t off = 0;
    proto_submit_task t;

    if (e.ptr == NULL)
        return 0;
    for (uint16_t i = 0; i < n; i++)
        if (take_entry(e.ptr, e.len, &off, flags, &t) != PROTO_OK)
            return 0;
    return off == e.len;
}

/* submit_head returns the body size of s, or 0 when the decoder would refuse it.
 * Without `tasks`, the `entries` of a decoded SUBMIT are written back as they are. */
static size_t submit_head(const proto_submit *s)
{
    size_t size = SUBMIT_FIXED;

    if ((s->flags & ~PROTO_SUBMIT_FLAGS_KNOWN) != 0 || s->ntasks == 0 ||
        s->ntasks > PROTO_MAX_SUBMIT_TASKS)
        return 0;
    if (s->tasks == NULL)
        return raw_entries_ok(s->entries, s->ntasks, s->flags) ? size + s->entries.len : 0;
    for (uint16_t i = 0; i < s->ntasks; i++) {
        const proto_submit_task *t = &s->tasks[i];
        if (t->priority > TASK_PRIORITY_MAX || t->max_attempts > PROTO_MAX_ATTEMPTS ||
            !bytes_ok(t->type, 1, PROTO_MAX_TYPE_LEN) ||
            !bytes_ok(t->dedup_key, 0, PROTO_MAX_DEDUP_KEY_LEN) ||
            !bytes_ok(t->payload, 0, PROTO_MAX_PAYLOAD_LEN))
            return 0;
        size += PROTO_SUBMIT_ENTRY_FIXED + t->type.len + t->dedup_key.len + t->payload.len;
        if (s->flags & PROTO_SUBMIT_GROUP_KEY) {
            if (!bytes_ok(t->group_key, 0, PROTO_MAX_GROUP_KEY_LEN))
                return 0;
            size += PROTO_SUBMIT_GROUP_KEY_FIXED + t->group_key.len;
        }
        if (s->flags & PROTO_SUBMIT_AFTER) {
            if (t->nafter > 0 && t->after == NULL)
                return 0;
            size += PROTO_SUBMIT_AFTER_FIXED + (size_t)t->nafter * PROTO_SUBMIT_AFTER_ID;
        }
    }
    /* at most 1000 * (19 + 256 + 191 + 2 + 65535 * 8 + 2^24): no overflow of a 64-bit size_t */
    return size;
}

/* submitted_head: the same for SUBMITTED, without its message. Without `results`, the
 * `entries` of a decoded SUBMITTED are written back as they are. */
static size_t submitted_head(const proto_submitted *s)
{
    size_t rlen = (size_t)s->n * PROTO_SUBMITTED_ENTRY;

    if (s->status > PROTO_SUBMIT_STATUS_MAX || s->n > PROTO_MAX_SUBMIT_TASKS ||
        (s->status != PROTO_SUBMIT_OK && s->n != 0) || (s->status == PROTO_SUBMIT_OK && s->n == 0))
        return 0;
    if (s->results == NULL && s->n > 0) {
        if (s->entries.ptr == NULL || s->entries.len != rlen)
            return 0;
        for (size_t i = 0; i < rlen; i += PROTO_SUBMITTED_ENTRY)
            if (s->entries.ptr[i] > PROTO_SUBMIT_DUPLICATE)
                return 0;
    }
    for (uint16_t i = 0; s->results != NULL && i < s->n; i++)
        if (s->results[i].result > PROTO_SUBMIT_DUPLICATE)
            return 0;
    return SUBMITTED_FIXED + rlen;
}

/* list_head: the body size of a CONFIRM or HOLDING, or 0 when the decoder would refuse it. */
static size_t list_head(const proto_dlv_list *l)
{
    size_t len = (size_t)l->n * PROTO_DLV_ENTRY;

    if (l->n == 0 || l->n > PROTO_MAX_CONFIRM)
        return 0;
    if (l->items == NULL && (l->entries.ptr == NULL || l->entries.len != len))
        return 0;
    return LIST_FIXED + len;
}

/* msg_layout sizes m: *head gets the body bytes before the trailing opaque
 * field, *tail that field (empty for types without one). Returns 0 when m
 * cannot be encoded (the decoder would refuse it, or the body would not fit
 * the u32 prefix or a size_t), else 1. */
static int msg_layout(const proto_msg *m, size_t *head, proto_bytes *tail)
{
    int ok = 0;
    size_t h = 0;
    proto_bytes t = {NULL, 0};

    switch (m->type) {
    case PROTO_TASK:
        if (m->u.task.priority > TASK_PRIORITY_MAX ||
            !bytes_ok(m->u.task.type, 1, PROTO_MAX_TYPE_LEN))
            goto done;
        h = TASK_FIXED + m->u.task.type.len;
        t = m->u.task.payload;
        break;
    case PROTO_DONE:
        if (m->u.done.outcome > PROTO_OUTCOME_MAX)
            goto done;
        h = DONE_FIXED;
        t = m->u.done.data;
        break;
    case PROTO_EXTEND:
        h = EXTEND_BODY;
        break;
    case PROTO_CANCEL:
        h = CANCEL_BODY;
        break;
    case PROTO_PROGRESS:
        if (m->u.progress.permille > PROTO_PROGRESS_MAX ||
            !bytes_ok(m->u.progress.message, 0, PROTO_MAX_PROGRESS_MSG) ||
            !proto_utf8_valid(m->u.progress.message))
            goto done;
        h = PROGRESS_FIXED + m->u.progress.message.len;
        break;
    case PROTO_HEARTBEAT:
    case PROTO_STOP:
        h = BARE_BODY;
        break;
    case PROTO_HELLO:
        h = hello_head(&m->u.hello);
        if (h == 0)
            goto done;
        break;
    case PROTO_WELCOME:
        if (!bytes_ok(m->u.welcome.server, 0, PROTO_MAX_NAME_LEN))
            goto done;
        h = WELCOME_FIXED + m->u.welcome.server.len;
        break;
    case PROTO_ERROR:
        h = ERROR_FIXED;
        t = m->u.error.message;
        break;
    case PROTO_SUBMIT:
        h = submit_head(&m->u.submit);
        if (h == 0)
            goto done;
        break;
    case PROTO_SUBMITTED:
        h = submitted_head(&m->u.submitted);
        if (h == 0)
            goto done;
        t = m->u.submitted.message;
        break;
    case PROTO_OUTCOME:
        if (m->u.outcome.state != PROTO_STATE_SUCCESSFUL && m->u.outcome.state != PROTO_STATE_FAILED)
            goto done;
        h = OUTCOME_FIXED;
        t = m->u.outcome.data;
        break;
    case PROTO_CONFIRM:
    case PROTO_HOLDING:
        h = list_head(m->type == PROTO_CONFIRM ? &m->u.confirm : &m->u.holding);
        if (h == 0)
            goto done;
        break;
    default:
        goto done;
    }
    if (h > (size_t)UINT32_MAX || !bytes_ok(t, 0, (size_t)UINT32_MAX - h) || h + t.len > SIZE_MAX - PROTO_LEN_PREFIX)
        goto done;
    *head = h;
    *tail = t;
    ok = 1;
done:
    return ok;
}

/* put_str writes b with its u16 length at p and returns the byte after it. */
static uint8_t *put_str(uint8_t *p, proto_bytes b)
{
    store16(p, (uint16_t)b.len);
    copy_bytes(p + STR_HEAD, b);
    return p + STR_HEAD + b.len;
}

/* write_submit writes the entries of a SUBMIT at p. */
static void write_submit(uint8_t *p, const proto_submit *s)
{
    for (uint16_t i = 0; i < s->ntasks; i++) {
        const proto_submit_task *t = &s->tasks[i];
        p[0] = t->priority;
        store16(p + 1, t->max_attempts);
        store32(p + 3, t->delay_ms);
        store32(p + 7, t->timeout_ms);
        p = put_str(p + 11, t->type);
        p = put_str(p, t->dedup_key);
        store32(p, (uint32_t)t->payload.len);
        copy_bytes(p + BLOB_HEAD, t->payload);
        p += BLOB_HEAD + t->payload.len;
        if (s->flags & PROTO_SUBMIT_GROUP_KEY)
            p = put_str(p, t->group_key);
        if (s->flags & PROTO_SUBMIT_AFTER) {
            store16(p, t->nafter);
            p += PROTO_SUBMIT_AFTER_FIXED;
            for (uint16_t k = 0; k < t->nafter; k++, p += PROTO_SUBMIT_AFTER_ID)
                store64(p, t->after[k]);
        }
    }
}

/* write_head writes the prefix (announcing body_len) and the head of m, which
 * msg_layout has accepted; out has room for the prefix and the head. */
static void write_head(const proto_msg *m, uint8_t *out, size_t body_len)
{
    uint8_t *b = out + PROTO_LEN_PREFIX;

    store32(out, (uint32_t)body_len);
    b[OFF_TYPE] = m->type;
    switch (m->type) {
    case PROTO_TASK:
        store64(b + DLV_OFF_TASK_ID, m->u.task.task_id);
        store32(b + DLV_OFF_EPOCH, m->u.task.epoch);
        store32(b + DLV_OFF_ATTEMPT, m->u.task.attempt);
        store32(b + TASK_OFF_TIMEOUT, m->u.task.timeout_ms);
        b[TASK_OFF_PRIORITY] = m->u.task.priority;
        store16(b + TASK_OFF_TYPE_LEN, (uint16_t)m->u.task.type.len);
        copy_bytes(b + TASK_FIXED, m->u.task.type);
        break;
    case PROTO_DONE:
        store64(b + DLV_OFF_TASK_ID, m->u.done.task_id);
        store32(b + DLV_OFF_EPOCH, m->u.done.epoch);
        store32(b + DLV_OFF_ATTEMPT, m->u.done.attempt);
        b[DONE_OFF_OUTCOME] = m->u.done.outcome;
        store32(b + DONE_OFF_RETRY_AFTER, m->u.done.retry_after_ms);
        break;
    case PROTO_EXTEND:
        store64(b + DLV_OFF_TASK_ID, m->u.extend.task_id);
        store32(b + DLV_OFF_EPOCH, m->u.extend.epoch);
        store32(b + DLV_OFF_ATTEMPT, m->u.extend.attempt);
        store32(b + EXTEND_OFF_EXTEND_MS, m->u.extend.extend_ms);
        break;
    case PROTO_CANCEL:
        store64(b + DLV_OFF_TASK_ID, m->u.cancel.task_id);
        store32(b + DLV_OFF_EPOCH, m->u.cancel.epoch);
        store32(b + DLV_OFF_ATTEMPT, m->u.cancel.attempt);
        break;
    case PROTO_PROGRESS:
        store64(b + DLV_OFF_TASK_ID, m->u.progress.task_id);
        store32(b + DLV_OFF_EPOCH, m->u.progress.epoch);
        store32(b + DLV_OFF_ATTEMPT, m->u.progress.attempt);
        store16(b + PROGRESS_OFF_PERMILLE, m->u.progress.permille);
        store16(b + PROGRESS_OFF_MSG_LEN, (uint16_t)m->u.progress.message.len);
        copy_bytes(b + PROGRESS_FIXED, m->u.progress.message);
        break;
    case PROTO_HELLO: {
        const proto_hello *h = &m->u.hello;
        uint8_t *p;

        store16(b + HELLO_OFF_VERSION, h->version);
        store32(b + HELLO_OFF_CAPACITY, h->capacity);
        p = put_str(b + HELLO_OFF_NAME_LEN, h->name);
        p = put_str(p, h->token);
        store16(p, h->ntypes);
        p += 2;
        for (uint16_t i = 0; i < h->ntypes; i++)
            p = put_str(p, h->types[i]);
        break;
    }
    case PROTO_WELCOME:
        store16(b + WELCOME_OFF_VERSION, m->u.welcome.version);
        store32(b + WELCOME_OFF_HEARTBEAT, m->u.welcome.heartbeat_ms);
        store32(b + WELCOME_OFF_MAX_BODY, m->u.welcome.max_body);
        put_str(b + WELCOME_OFF_SERVER_LEN, m->u.welcome.server);
        break;
    case PROTO_ERROR:
        store16(b + ERROR_OFF_CODE, m->u.error.code);
        break;
    case PROTO_SUBMIT:
        store32(b + SUBMIT_OFF_REQUEST, m->u.submit.request_id);
        b[SUBMIT_OFF_FLAGS] = m->u.submit.flags;
        store16(b + SUBMIT_OFF_NTASKS, m->u.submit.ntasks);
        if (m->u.submit.tasks != NULL)
            write_submit(b + SUBMIT_FIXED, &m->u.submit);
        else
            copy_bytes(b + SUBMIT_FIXED, m->u.submit.entries);
        break;
    case PROTO_SUBMITTED: {
        const proto_submitted *s = &m->u.submitted;
        store32(b + SUBMITTED_OFF_REQUEST, s->request_id);
        store16(b + SUBMITTED_OFF_STATUS, s->status);
        store16(b + SUBMITTED_OFF_N, s->n);
        if (s->results == NULL)
            copy_bytes(b + SUBMITTED_FIXED, s->entries);
        for (uint16_t i = 0; s->results != NULL && i < s->n; i++) {
            uint8_t *p = b + SUBMITTED_FIXED + (size_t)i * PROTO_SUBMITTED_ENTRY;
            p[0] = s->results[i].result;
            store64(p + 1, s->results[i].task_id);
        }
        break;
    }
    case PROTO_OUTCOME:
        store32(b + OUTCOME_OFF_REQUEST, m->u.outcome.request_id);
        store64(b + OUTCOME_OFF_TASK_ID, m->u.outcome.task_id);
        b[OUTCOME_OFF_STATE] = m->u.outcome.state;
        break;
    case PROTO_CONFIRM:
    case PROTO_HOLDING: {
        const proto_dlv_list *l = m->type == PROTO_CONFIRM ? &m->u.confirm : &m->u.holding;
        store16(b + LIST_OFF_N, l->n);
        if (l->items == NULL)
            copy_bytes(b + LIST_FIXED, l->entries);
        for (uint16_t i = 0; l->items != NULL && i < l->n; i++)
            proto_dlv_put(b + LIST_FIXED + (size_t)i * PROTO_DLV_ENTRY, &l->items[i]);
        break;
    }
    default: /* HEARTBEAT, STOP: the type byte alone */
        break;
    }
}

size_t proto_msg_size(const proto_msg *m)
{
    size_t head;
    proto_bytes tail;

    return msg_layout(m, &head, &tail) ? PROTO_LEN_PREFIX + head + tail.len : 0;
}

size_t proto_msg_encode_head(const proto_msg *m, uint8_t *out, size_t cap)
{
    size_t n = 0;
    size_t head;
    proto_bytes tail;

    if (!msg_layout(m, &head, &tail) || cap < PROTO_LEN_PREFIX + head)
        goto done;
    write_head(m, out, head + tail.len);
    n = PROTO_LEN_PREFIX + head;
done:
    return n;
}

size_t proto_msg_encode(const proto_msg *m, uint8_t *out, size_t cap)
{
    size_t n = 0;
    size_t head;
    proto_bytes tail;

    if (!msg_layout(m, &head, &tail) || cap < PROTO_LEN_PREFIX + head ||
        cap - PROTO_LEN_PREFIX - head < tail.len)
        goto done;
    write_head(m, out, head + tail.len);
    copy_bytes(out + PROTO_LEN_PREFIX + head, tail);
    n = PROTO_LEN_PREFIX + head + tail.len;
done:
    return n;
}

/* ---- names for logs ---- */

static const char *const type_names[] = {
    [PROTO_HELLO] = "HELLO", [PROTO_WELCOME] = "WELCOME", [PROTO_HEARTBEAT] = "HEARTBEAT",
    [PROTO_ERROR] = "ERROR", [PROTO_STOP] = "STOP",       [PROTO_TASK] = "TASK",
    [PROTO_DONE] = "DONE",   [PROTO_EXTEND] = "EXTEND",   [PROTO_CANCEL] = "CANCEL",
    [PROTO_SUBMIT] = "SUBMIT", [PROTO_SUBMITTED] = "SUBMITTED", [PROTO_OUTCOME] = "OUTCOME",
    [PROTO_CONFIRM] = "CONFIRM", [PROTO_HOLDING] = "HOLDING", [PROTO_PROGRESS] = "PROGRESS",
};

/* Indexed by status - PROTO_BAD, the lowest status. */
static const char *const status_texts[] = {
    [PROTO_BAD - PROTO_BAD] = "BAD",
    [PROTO_TOO_BIG - PROTO_BAD] = "TOO_BIG",
    [PROTO_OK - PROTO_BAD] = "OK",
    [PROTO_NEED_MORE - PROTO_BAD] = "NEED_MORE",
};

static const char *const outcome_names[] = {
    [PROTO_OUTCOME_SUCCESS] = "SUCCESS",
    [PROTO_OUTCOME_FAIL_PERM] = "FAIL_PERM",
    [PROTO_OUTCOME_FAIL_RETRY] = "FAIL_RETRY",
    [PROTO_OUTCOME_RETRY_AFTER] = "RETRY_AFTER",
};

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* name_at returns table[i], or "UNKNOWN" for a hole or an index beyond it. */
static const char *name_at(const char *const *table, size_t n, long long i)
{
    return i >= 0 && (unsigned long long)i < n && table[i] != NULL ? table[i] : "UNKNOWN";
}

const char *proto_type_name(uint8_t type)
{
    return name_at(type_names, NELEMS(type_names), type);
}

const char *proto_status_text(int status)
{
    return name_at(status_texts, NELEMS(status_texts), (long long)status - PROTO_BAD);
}

const char *proto_outcome_name(uint8_t outcome)
{
    return name_at(outcome_names, NELEMS(outcome_names), outcome);
}

int proto_looks_like_http_request(const uint8_t *p, size_t n)
{
    if (n < PROTO_LEN_PREFIX)
        return 0;
    for (size_t i = 0; i < 3; i++)
        if (p[i] < 'A' || p[i] > 'Z')
            return 0;
    return (p[3] >= 'A' && p[3] <= 'Z') || p[3] == ' ';
}

int proto_looks_like_http_response(const uint8_t *p, size_t n)
{
    return n >= 5 && memcmp(p, "HTTP/", 5) == 0;
}

int proto_looks_like_hello(const uint8_t *p, size_t n)
{
    if (n < PROTO_LEN_PREFIX + 1)
        return 0;
    uint32_t len = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    return len >= 1 && len <= PROTO_MAX_HEAD && p[PROTO_LEN_PREFIX] == PROTO_HELLO;
}
