/* frame_reader.c: the framing step of every read loop (see frame_reader.h). */
#include "frame_reader.h"

void proto_frame_reader_init(proto_frame_reader *r, unsigned budget)
{
    r->body_len = 0;
    r->budget = budget;
}

int proto_frame_next(proto_frame_reader *r, const uint8_t *head, size_t avail, uint32_t max_body)
{
    r->body_len = 0;
    /* proto_frame_check reads only the prefix of head and compares avail with it. */
    return proto_frame_check(head, avail, max_body, &r->body_len);
}

bool proto_frame_reader_spent(proto_frame_reader *r)
{
    if (r->budget == 0)
        return true;
    r->budget--;
    return false;
}

size_t proto_frame_size(const proto_frame_reader *r)
{
    return PROTO_LEN_PREFIX + (size_t)r->body_len;
}

int proto_frame_decode(const proto_frame_reader *r, const uint8_t *body, proto_msg *out)
{
    return proto_msg_decode(body, r->body_len, out);
}

uint32_t proto_frame_announced(const uint8_t *head, size_t avail)
{
    if (avail < PROTO_LEN_PREFIX)
        return 0;
    return (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
}
