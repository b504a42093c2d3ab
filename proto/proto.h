/* proto.h: the taskpush wire format, a pure codec over byte buffers.
 *
 * No sockets, no libevent, no allocation: callers accumulate bytes (an evbuffer,
 * a plain array) and ask this module whether a whole frame is there, then decode
 * it into a proto_msg whose byte fields point into the caller's buffer.
 * The format itself is specified in proto/PROTOCOL.md; keep the two in step.
 */
#ifndef TASKPUSH_PROTO_H
#define TASKPUSH_PROTO_H

#include <stddef.h>
#include <stdint.h>

/* Bump when a frame's layout changes; peers exchange it in HELLO / WELCOME.
 * Version 2 adds SUBMIT, SUBMITTED and OUTCOME and producer-only HELLOs (no type,
 * capacity 0); version 3 adds CONFIRM and HOLDING (a worker's inventory across a
 * failover); version 4 adds PROGRESS (a worker's progress of a running task). A
 * dispatcher still accepts older HELLOs and answers each in its own version
 * (PROTOCOL.md, section 8). */
#define PROTO_VERSION 4
#define PROTO_VERSION_MIN 1 /* the oldest version a dispatcher still serves */

/* Every frame is a 4-byte big-endian body length, then the body. */
#define PROTO_LEN_PREFIX 4

/* The largest body a peer must accept by default. A payload or result is a
 * MEDIUMBLOB (at most 2^24 - 1 bytes); the fixed fields and the task type
 * (VARCHAR(64) utf8mb4, at most 256 bytes) fit easily in the extra 4 KiB.
 * Anything larger cannot be a valid task and is refused before allocation. */
#define PROTO_MAX_BODY_DEFAULT ((uint32_t)((1u << 24) - 1 + 4096))

/* Bounds on variable fields, so a decoder never trusts a count blindly. */
#define PROTO_MAX_TYPE_LEN 256   /* bytes of one task type (64 utf8mb4 chars) */
#define PROTO_MAX_TYPES 64       /* task types one worker may register */
#define PROTO_MAX_NAME_LEN 256   /* worker name, server name */
#define PROTO_MAX_TOKEN_LEN 1024 /* shared secret */
#define PROTO_MAX_SUBMIT_TASKS 1000     /* entries of one SUBMIT */
#define PROTO_MAX_DEDUP_KEY_LEN 191     /* bytes of a dedup_key (VARBINARY(191)) */
#define PROTO_MAX_GROUP_KEY_LEN 191     /* bytes of a group_key (VARBINARY(191)) */
/* Task ids one SUBMIT entry waits for (PROTO_SUBMIT_AFTER). The wire's count is a u16:
 * a decoder takes up to 65535, and the dispatcher answers INVALID above this bound. */
#define PROTO_MAX_AFTER 1000
#define PROTO_MAX_PAYLOAD_LEN 16777215u /* a MEDIUMBLOB */
#define PROTO_MAX_ATTEMPTS 1000         /* the table's max_attempts bound */
#define PROTO_MAX_CONFIRM 1024          /* deliveries named by one CONFIRM or HOLDING */
#define PROTO_PROGRESS_MAX 1000         /* a PROGRESS value is permille: 0 .. 1000 */
#define PROTO_MAX_PROGRESS_MSG 256      /* bytes of a PROGRESS message (UTF-8, no NUL) */

/* Results of the decoding functions. Negative values are errors. */
enum proto_status {
    PROTO_OK = 0,
    PROTO_NEED_MORE = 1, /* not a whole frame yet: read more bytes */
    PROTO_TOO_BIG = -1,  /* the length prefix exceeds the caller's maximum */
    PROTO_BAD = -2,      /* malformed frame: the connection must be closed */
};

/* Frame types: the first byte of every body. */
enum proto_type {
    PROTO_HELLO = 0x01,     /* worker -> dispatcher, first frame */
    PROTO_WELCOME = 0x02,   /* dispatcher -> worker, answer to HELLO */
    PROTO_HEARTBEAT = 0x03, /* both ways */
    PROTO_ERROR = 0x04,     /* both ways, sender closes after it */
    PROTO_STOP = 0x05,      /* both ways: send me no more tasks */
    PROTO_TASK = 0x10,      /* dispatcher -> worker: one delivery */
    PROTO_DONE = 0x11,      /* worker -> dispatcher: outcome of a delivery */
    PROTO_EXTEND = 0x12,    /* worker -> dispatcher: extend a delivery's lease */
    PROTO_CANCEL = 0x13,    /* dispatcher -> worker: abandon a delivery */
    PROTO_CONFIRM = 0x14,   /* dispatcher -> worker (version 3): these DONEs are settled */
    PROTO_HOLDING = 0x15,   /* worker -> dispatcher (version 3): deliveries still running */
    PROTO_PROGRESS = 0x16,  /* worker -> dispatcher (version 4): progress of a delivery */
    PROTO_SUBMIT = 0x20,    /* client -> dispatcher (version 2): insert tasks */
    PROTO_SUBMITTED = 0x21, /* dispatcher -> client: answer to SUBMIT, after COMMIT */
    PROTO_OUTCOME = 0x22,   /* dispatcher -> client: final state of a waited-for task */
};

/* SUBMIT flags. */
#define PROTO_SUBMIT_WAIT 0x01 /* send an OUTCOME per inserted task when it ends */
#define PROTO_SUBMIT_GROUP_KEY 0x02 /* each entry ends with a str16 group_key (fair share) */
/* Each entry ends (after its group_key, if any) with a u16 count and that many u64 task
 * ids it waits for (dependencies). */
#define PROTO_SUBMIT_AFTER 0x04
#define PROTO_SUBMIT_FLAGS_KNOWN (PROTO_SUBMIT_WAIT | PROTO_SUBMIT_GROUP_KEY | PROTO_SUBMIT_AFTER)

/* SUBMITTED status. */
enum proto_submit_status {
    PROTO_SUBMIT_OK = 0,          /* every row committed, or a duplicate */
    PROTO_SUBMIT_INVALID = 1,     /* nothing inserted; the message says why */
    PROTO_SUBMIT_UNAVAILABLE = 2, /* nothing committed (database, not leading); resend */
};
#define PROTO_SUBMIT_STATUS_MAX PROTO_SUBMIT_UNAVAILABLE

/* Per-task result in SUBMITTED. */
enum proto_submit_result {
    PROTO_SUBMIT_INSERTED = 0,
    PROTO_SUBMIT_DUPLICATE = 1, /* its dedup_key was present: task_id is that row's, or 0 */
};

/* OUTCOME state: the task_state values of a finished row. */
#define PROTO_STATE_SUCCESSFUL 2
#define PROTO_STATE_FAILED 3

/* Outcome carried by DONE. */
enum proto_outcome {
    PROTO_OUTCOME_SUCCESS = 0,     /* data is the result */
    PROTO_OUTCOME_FAIL_PERM = 1,   /* data is the error; never retried */
    PROTO_OUTCOME_FAIL_RETRY = 2,  /* data is the error; retried with backoff */
    PROTO_OUTCOME_RETRY_AFTER = 3, /* data is the error; retried after retry_after_ms */
};
#define PROTO_OUTCOME_MAX PROTO_OUTCOME_RETRY_AFTER

/* Error codes carried by ERROR. */
enum proto_error_code {
    PROTO_ERR_BAD_FRAME = 1,   /* malformed or oversized frame */
    PROTO_ERR_VERSION = 2,     /* protocol version not supported */
    PROTO_ERR_AUTH = 3,        /* missing or wrong token */
    PROTO_ERR_UNEXPECTED = 4,  /* a valid frame at the wrong time */
    PROTO_ERR_SHUTDOWN = 5,    /* the peer is going away */
    PROTO_ERR_TIMEOUT = 6,     /* the peer stayed silent too long */
    PROTO_ERR_NOT_LEADER = 7,  /* a standby: try the dispatcher that leads */
};

/* A byte string borrowed from the buffer that was decoded (not NUL-terminated). */
typedef struct proto_bytes {
    const uint8_t *ptr;
    size_t len;
} proto_bytes;

typedef struct proto_hello {
    uint16_t version;
    uint32_t capacity; /* most deliveries the worker holds at once, >= 1; 0 for a producer */
    proto_bytes name;
    proto_bytes token; /* empty when none */
    uint16_t ntypes;   /* 1 .. PROTO_MAX_TYPES; 0 (version >= 2, capacity 0): a producer */
    proto_bytes types[PROTO_MAX_TYPES];
} proto_hello;

typedef struct proto_welcome {
    uint16_t version;
    uint32_t heartbeat_ms;
    uint32_t max_body; /* largest body the dispatcher accepts (a DONE with its result) */
    proto_bytes server; /* e.g. "taskpushd 0.1.0" */
} proto_welcome;

typedef struct proto_error {
    uint16_t code; /* enum proto_error_code */
    proto_bytes message;
} proto_error;

/* A delivery is named by (task_id, epoch, attempt): a redelivery of the same task
 * has a larger attempt, a delivery by a later dispatcher a larger epoch. */
typedef struct proto_task {
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;    /* 1 for the first delivery */
    uint32_t timeout_ms; /* the lease; the worker should finish or EXTEND before it */
    uint8_t priority;
    proto_bytes type;
    proto_bytes payload; /* the rest of the frame, unchanged */
} proto_task;

typedef struct proto_done {
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;
    uint8_t outcome; /* enum proto_outcome */
    uint32_t retry_after_ms; /* meaningful with PROTO_OUTCOME_RETRY_AFTER, else 0 */
    proto_bytes data;        /* result or error text: the rest of the frame */
} proto_done;

typedef struct proto_extend {
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;
    uint32_t extend_ms; /* the lease now ends extend_ms after the dispatcher reads this */
} proto_extend;

typedef struct proto_cancel {
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;
} proto_cancel;

/* PROGRESS: how far the worker is with a delivery it holds. */
typedef struct proto_progress {
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;
    uint16_t permille;   /* 0 .. PROTO_PROGRESS_MAX */
    proto_bytes message; /* 0 .. PROTO_MAX_PROGRESS_MSG bytes of UTF-8 without NUL; empty: none */
} proto_progress;

/* One task of a SUBMIT. */
typedef struct proto_submit_task {
    uint8_t priority;      /* 0 .. 2 */
    uint16_t max_attempts; /* 0 (the table's default) .. PROTO_MAX_ATTEMPTS */
    uint32_t delay_ms;     /* run_after = the dispatcher's clock + delay_ms */
    uint32_t timeout_ms;   /* 0: NULL (the dispatcher's default) */
    proto_bytes type;      /* 1 .. PROTO_MAX_TYPE_LEN bytes */
    proto_bytes dedup_key; /* 0 .. PROTO_MAX_DEDUP_KEY_LEN bytes; empty: none */
    proto_bytes payload;   /* 0 .. PROTO_MAX_PAYLOAD_LEN bytes */
    /* 0 .. PROTO_MAX_GROUP_KEY_LEN bytes; empty: none. On the wire only with
     * PROTO_SUBMIT_GROUP_KEY (the encoder ignores it without the flag). */
    proto_bytes group_key;
    /* The task ids it waits for, on the wire only with PROTO_SUBMIT_AFTER: encoding reads
     * after[0 .. nafter) (at most 65535); decoding sets nafter, after_wire to their
     * nafter * 8 big-endian bytes (read them with proto_after_id) and after to NULL. */
    uint16_t nafter;
    const uint64_t *after;
    proto_bytes after_wire;
} proto_submit_task;

/* SUBMIT. Decoding checks every entry and sets `entries` to their bytes (read them
 * with proto_submit_next) and `tasks` to NULL; encoding reads `tasks` (ntasks of
 * them) and ignores `entries`. */
typedef struct proto_submit {
    uint32_t request_id;
    uint8_t flags;   /* PROTO_SUBMIT_WAIT, _GROUP_KEY, _AFTER; other bits are BAD */
    uint16_t ntasks; /* 1 .. PROTO_MAX_SUBMIT_TASKS */
    const proto_submit_task *tasks;
    proto_bytes entries;
} proto_submit;

/* One result of a SUBMITTED. */
typedef struct proto_submit_res {
    uint8_t result;   /* enum proto_submit_result */
    uint64_t task_id;
} proto_submit_res;

/* SUBMITTED. As SUBMIT: decoding fills `entries` (n * 9 bytes, read them with
 * proto_submitted_result), encoding reads `results`. */
typedef struct proto_submitted {
    uint32_t request_id;
    uint16_t status; /* enum proto_submit_status */
    uint16_t n;      /* ntasks when status is OK, else 0 */
    const proto_submit_res *results;
    proto_bytes entries;
    proto_bytes message; /* the rest of the frame */
} proto_submitted;

typedef struct proto_outcome_msg {
    uint32_t request_id;
    uint64_t task_id;
    uint8_t state;    /* PROTO_STATE_SUCCESSFUL or PROTO_STATE_FAILED */
    proto_bytes data; /* result or err_msg: the rest of the frame */
} proto_outcome_msg;

/* One delivery of a CONFIRM or HOLDING list. */
typedef struct proto_dlv {
    uint64_t task_id;
    uint32_t epoch;
    uint32_t attempt;
} proto_dlv;

/* Bytes of one list entry: u64 task_id, u32 epoch, u32 attempt. */
#define PROTO_DLV_ENTRY 16

/* CONFIRM and HOLDING: n (1 .. PROTO_MAX_CONFIRM) deliveries. As SUBMITTED: decoding
 * sets `entries` (n * PROTO_DLV_ENTRY bytes; read them with proto_dlv_at) and `items`
 * to NULL; encoding reads `items`, or copies `entries` when `items` is NULL (a list
 * built in place with proto_dlv_put). */
typedef struct proto_dlv_list {
    uint16_t n;
    const proto_dlv *items;
    proto_bytes entries;
} proto_dlv_list;

typedef struct proto_msg {
    uint8_t type; /* enum proto_type */
    union {
        proto_hello hello;
        proto_welcome welcome;
        proto_error error;
        proto_task task;
        proto_done done;
        proto_extend extend;
        proto_cancel cancel;
        proto_submit submit;
        proto_submitted submitted;
        proto_outcome_msg outcome;
        proto_dlv_list confirm; /* PROTO_CONFIRM */
        proto_dlv_list holding; /* PROTO_HOLDING */
        proto_progress progress;
    } u;
} proto_msg;

/* proto_frame_check looks at the first len bytes of a stream.
 * Returns PROTO_OK when they start with a whole frame, and sets *body_len (the
 * frame occupies PROTO_LEN_PREFIX + *body_len bytes); PROTO_NEED_MORE when more
 * bytes are needed; PROTO_TOO_BIG as soon as the prefix announces a body larger
 * than max_body; PROTO_BAD for a zero-length body (every body has a type byte).
 * It reads at most PROTO_LEN_PREFIX bytes and never allocates. */
int proto_frame_check(const uint8_t *buf, size_t len, uint32_t max_body, uint32_t *body_len);

/* proto_msg_decode parses one body (without its length prefix).
 * Returns PROTO_OK and fills *out, whose proto_bytes point into body (borrowed
 * for as long as body lives), or PROTO_BAD for an unknown type, a field that
 * runs past the end, trailing bytes after fixed-size fields, a count or length
 * beyond its PROTO_MAX_* bound, or a value outside its range. */
int proto_msg_decode(const uint8_t *body, size_t body_len, proto_msg *out);

/* proto_msg_size returns the bytes m takes on the wire, prefix included,
 * or 0 when m cannot be encoded (unknown type, a field beyond its bound). */
size_t proto_msg_size(const proto_msg *m);

/* proto_msg_encode writes m, prefix included, into out[0..cap).
 * Returns the bytes written, or 0 when m cannot be encoded or cap is too small. */
size_t proto_msg_encode(const proto_msg *m, uint8_t *out, size_t cap);

/* proto_msg_encode_head writes everything but m's trailing opaque field (the
 * payload of TASK, the data of DONE and OUTCOME, the message of ERROR and
 * SUBMITTED; other types have none, and a SUBMIT is all head), with a length prefix that counts that field. The caller appends the
 * field itself, e.g. with evbuffer_add, so that large payloads are not copied
 * twice. Returns the bytes written, or 0 as proto_msg_encode. */
size_t proto_msg_encode_head(const proto_msg *m, uint8_t *out, size_t cap);

/* proto_submit_next reads the next task of a decoded SUBMIT from *cursor (start with
 * msg.u.submit.entries) and advances it. Returns PROTO_OK, or PROTO_BAD when nothing
 * valid is left (never for the ntasks entries of a frame proto_msg_decode accepted). */
int proto_submit_next(proto_bytes *cursor, proto_submit_task *out);
/* The same for a SUBMIT whose flags are `flags` (its entries carry a group_key when
 * PROTO_SUBMIT_GROUP_KEY is set); proto_submit_next reads entries without one. */
int proto_submit_next_flags(proto_bytes *cursor, uint8_t flags, proto_submit_task *out);

/* proto_after_id reads id i (< t->nafter) of a decoded SUBMIT entry. */
uint64_t proto_after_id(const proto_submit_task *t, uint16_t i);

/* proto_submitted_result reads result i (< s->n) of a decoded SUBMITTED. */
void proto_submitted_result(const proto_submitted *s, uint16_t i, proto_submit_res *out);

/* proto_dlv_at reads entry i (< l->n) of a list: items[i], or the entries' bytes. */
void proto_dlv_at(const proto_dlv_list *l, uint16_t i, proto_dlv *out);

/* proto_dlv_put writes d as one PROTO_DLV_ENTRY-byte list entry at out, so that a
 * sender can build a CONFIRM's entries where they will be sent from. */
void proto_dlv_put(uint8_t *out, const proto_dlv *d);

/* Bytes of a SUBMITTED result entry, and of a SUBMIT task entry without its strings. */
#define PROTO_SUBMITTED_ENTRY 9
#define PROTO_SUBMIT_ENTRY_FIXED 19
/* What a group_key adds to an entry besides its bytes (PROTO_SUBMIT_GROUP_KEY). */
#define PROTO_SUBMIT_GROUP_KEY_FIXED 2
/* What PROTO_SUBMIT_AFTER adds to an entry: a u16 count, then 8 bytes per id. */
#define PROTO_SUBMIT_AFTER_FIXED 2
#define PROTO_SUBMIT_AFTER_ID 8

/* Largest head any frame can have (HELLO with every bound at its maximum); a SUBMIT,
 * which is all head, aside: size it with proto_msg_size. */
#define PROTO_MAX_HEAD (1 + 2 + 4 + 2 + PROTO_MAX_NAME_LEN + 2 + PROTO_MAX_TOKEN_LEN + 2 + \
                        PROTO_MAX_TYPES * (2 + PROTO_MAX_TYPE_LEN) + PROTO_LEN_PREFIX)

/* proto_utf8_valid: b is well-formed UTF-8 (no overlong form, surrogate or code
 * point above U+10FFFF) and holds no NUL byte. */
int proto_utf8_valid(proto_bytes b);

/* Names for logs: "TASK", "DONE", ...; "UNKNOWN" otherwise. Static strings. */
const char *proto_type_name(uint8_t type);
const char *proto_status_text(int status);
const char *proto_outcome_name(uint8_t outcome);

/* A peer at the wrong port (docs/protocol.md, "A peer at the wrong port"). Each looks
 * at the first n bytes of a stream only (no allocation), and is asked only of bytes
 * that are already refused as a frame, so a valid frame is never taken for one.
 * proto_looks_like_http_request: an HTTP method and a space or letter ("GET ",
 * "POST"), which as a length prefix announces over 1 GB.
 * proto_looks_like_http_response: "HTTP/", an HTTP server's answer.
 * proto_looks_like_hello: a length prefix a HELLO can have and the HELLO type byte. */
int proto_looks_like_http_request(const uint8_t *p, size_t n);
int proto_looks_like_http_response(const uint8_t *p, size_t n);
int proto_looks_like_hello(const uint8_t *p, size_t n);

#endif
