/* frame_reader.h: cutting a byte stream into frames, the one read loop step that the
 * dispatcher (dispatcher/conn.c) and the worker library (worker-client/client.c) share.
 *
 * No sockets, no libevent, no allocation: the caller owns the bytes (an evbuffer, an
 * array) and shows the reader the head of what it has received; the reader says
 * whether a whole frame is there under the caller's size limit, and the caller takes
 * the frame off its buffer itself. A read callback handles a bounded number of frames
 * per turn (the budget) so that one flooding peer cannot starve the loop. The framing
 * rules are those of proto/PROTOCOL.md (every body at least its type byte).
 */
#ifndef TASKPUSH_FRAME_READER_H
#define TASKPUSH_FRAME_READER_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What proto_frame_next found. The values are those of enum proto_status, so that
 * proto_status_text names them ("too big", "bad", ...) in logs as before. */
enum proto_frame_status {
    PROTO_FRAME_WHOLE = PROTO_OK,            /* a whole frame waits: handle it */
    PROTO_FRAME_NEED_MORE = PROTO_NEED_MORE, /* no whole frame yet: wait for bytes */
    PROTO_FRAME_TOO_BIG = PROTO_TOO_BIG,     /* the prefix announces more than the limit */
    PROTO_FRAME_BAD = PROTO_BAD,             /* the prefix announces an empty body */
};

/* One read turn over one stream. */
typedef struct proto_frame_reader {
    uint32_t body_len; /* what the last prefix announced; 0 when none was whole yet */
    unsigned budget;   /* whole frames this turn may still hand out */
} proto_frame_reader;

/* Starts a turn that may handle at most budget frames. */
void proto_frame_reader_init(proto_frame_reader *r, unsigned budget);

/* proto_frame_next looks at the head of the caller's stream: avail bytes are there,
 * of which head holds at least the first min(avail, PROTO_LEN_PREFIX) contiguously.
 * Sets r->body_len from the prefix (also on TOO_BIG and BAD, for the log) and returns
 * PROTO_FRAME_WHOLE when PROTO_LEN_PREFIX + r->body_len bytes are there, NEED_MORE
 * when they are not (or the prefix itself is not), TOO_BIG as soon as the prefix
 * announces a body beyond max_body (the caller's limit, which may change from frame
 * to frame), BAD for a zero body length. TOO_BIG and BAD mean: close the stream. */
int proto_frame_next(proto_frame_reader *r, const uint8_t *head, size_t avail, uint32_t max_body);

/* proto_frame_reader_spent is called before a frame is handled: returns true when
 * this turn has handled its budget already (the caller yields and resumes in a later
 * turn), otherwise counts the frame against the budget and returns false. */
bool proto_frame_reader_spent(proto_frame_reader *r);

/* Bytes the frame last announced takes on the wire, prefix included. */
size_t proto_frame_size(const proto_frame_reader *r);

/* proto_frame_decode decodes the body (without prefix, r->body_len bytes) of the frame
 * proto_frame_next announced, with proto_msg_decode: PROTO_OK or PROTO_BAD. */
int proto_frame_decode(const proto_frame_reader *r, const uint8_t *body, proto_msg *out);

/* The body length the first avail bytes of a stream announce (head as for
 * proto_frame_next), or 0 while the prefix is not whole: how much a half frame
 * still owes, for the timeouts of slow senders. */
uint32_t proto_frame_announced(const uint8_t *head, size_t avail);

#endif
