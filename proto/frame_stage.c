#include "frame_stage.h"

_Static_assert((PROTO_STAGE_MAX & (PROTO_STAGE_MAX - 1)) == 0 && PROTO_STAGE_MAX >= 512,
               "the growth by doubling from 512 stops at PROTO_STAGE_MAX");

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Doubling from 512 up to the first power of two that holds len + n <= PROTO_STAGE_MAX
 * (itself a power of two): cap never exceeds PROTO_STAGE_MAX, which the inline fast
 * path relies on. */
uint8_t *proto_frame_stage_grow(proto_frame_stage *s, size_t n)
{
    if (n > PROTO_STAGE_MAX - s->len)
        return NULL;
    size_t cap = s->cap ? s->cap : 512;
    while (cap < s->len + n)
        cap *= 2;
    uint8_t *p = realloc(s->buf, cap);
    if (!p)
        return NULL;
    s->buf = p;
    s->cap = cap;
    return s->buf + s->len;
}

ssize_t proto_frame_stage_send(proto_frame_stage *s, int fd)
{
    if (s->len == 0)
        return 0;
    ssize_t n = send(fd, s->buf, s->len, MSG_NOSIGNAL);
    if (n > 0) {
        if ((size_t)n < s->len)
            memmove(s->buf, s->buf + n, s->len - (size_t)n);
        s->len -= (size_t)n;
    }
    return n;
}

void proto_frame_stage_shrink(proto_frame_stage *s, int busy)
{
    if (s->len == 0 && (!busy || s->cap > PROTO_STAGE_KEEP))
        proto_frame_stage_free(s);
}

void proto_frame_stage_free(proto_frame_stage *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}
