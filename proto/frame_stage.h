/* frame_stage.h: the frames one loop pass writes to one connection, gathered to go out
 * in one send. The dispatcher (dispatcher/conn.c) and the worker library
 * (worker-client/output.c) share it, as they share frame_reader.h on the read side.
 *
 * Each side's output still goes through its bufferevent whenever the socket refuses
 * bytes: the caller moves the stage's bytes behind that output itself (its "spill"), and
 * sends the stage directly only while that output is empty, so frames keep their order.
 * An evbuffer_add per frame ran the buffer's callbacks and took a chain at the first add
 * of each pass; the stage is one memcpy per frame and one send per pass.
 */
#ifndef TASKPUSH_FRAME_STAGE_H
#define TASKPUSH_FRAME_STAGE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The most one stage holds: a frame that would take it past this goes through the
 * caller's output (after a spill). */
#define PROTO_STAGE_MAX (64 * 1024)
/* The most a stage keeps between passes of a busy connection (see shrink). */
#define PROTO_STAGE_KEEP (4 * 1024)

typedef struct proto_frame_stage {
    uint8_t *buf;
    size_t len, cap;
} proto_frame_stage;

uint8_t *proto_frame_stage_grow(proto_frame_stage *s, size_t n);

/* Room for n more bytes, or NULL when they would take the stage past PROTO_STAGE_MAX
 * or there is no memory (the stage is unchanged: spill it, then write elsewhere). The
 * caller writes the bytes there and adds n to s->len. Inline: once per frame sent, and
 * the room is nearly always there (cap never exceeds PROTO_STAGE_MAX). */
static inline uint8_t *proto_frame_stage_reserve(proto_frame_stage *s, size_t n)
{
    if (n <= s->cap - s->len)
        return s->buf + s->len;
    return proto_frame_stage_grow(s, n);
}

/* Sends what the socket takes now (MSG_NOSIGNAL) and drops it from the stage. Returns
 * the bytes sent, or -1 with errno (EAGAIN: nothing taken). */
ssize_t proto_frame_stage_send(proto_frame_stage *s, int fd);

/* After a send and a spill (s->len 0): frees the stage unless busy (the connection has
 * deliveries out, so more frames come soon) and it is no larger than PROTO_STAGE_KEEP.
 * Idle connections, 10,000 of them heartbeating, hold none. */
void proto_frame_stage_shrink(proto_frame_stage *s, int busy);

void proto_frame_stage_free(proto_frame_stage *s);

#endif
