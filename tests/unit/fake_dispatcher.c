/* fake_dispatcher.c: the raw dispatcher end of the client tests (see
 * fake_dispatcher.h): frames through proto.h over a real loopback socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_harness.h"
#include "fake_dispatcher.h"

void fake_listen(fake *f)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    int one = 1;

    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->lfd >= 0);
    setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f->lfd, 16), 0);
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sa, &len), 0);
    f->port = ntohs(sa.sin_port);
}

void fake_addr(const fake *f, char *buf, size_t n)
{
    snprintf(buf, n, "127.0.0.1:%u", f->port);
}

void fake_drop(fake *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    f->in_len = 0;
}

void fake_close(fake *f)
{
    fake_drop(f);
    if (f->lfd >= 0)
        close(f->lfd);
    f->lfd = -1;
    free(f->in);
    free(f->frame);
    f->in = NULL;
    f->frame = NULL;
}

/* fake_accept waits for the worker's next connection; replaces the current one. */
void fake_accept(fake *f)
{
    struct pollfd p = {.fd = f->lfd, .events = POLLIN};

    fake_drop(f);
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
    assert_true(f->fd >= 0);
    f->answered_stop = 0;
}

/* fake_read reads one frame: 1 when *m is filled, 0 on timeout, -1 at EOF. */
int fake_read(fake *f, proto_msg *m, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;

    for (;;) {
        uint32_t blen = 0;
        int rc = f->in_len > 0 ? proto_frame_check(f->in, f->in_len, PROTO_MAX_BODY_DEFAULT, &blen)
                               : PROTO_NEED_MORE;
        struct pollfd p = {.fd = f->fd, .events = POLLIN};
        int64_t left;
        ssize_t n;

        assert_true(rc == PROTO_OK || rc == PROTO_NEED_MORE);
        if (rc == PROTO_OK) {
            free(f->frame);
            f->frame = malloc(blen);
            assert_non_null(f->frame);
            memcpy(f->frame, f->in + PROTO_LEN_PREFIX, blen);
            f->frame_len = blen;
            memmove(f->in, f->in + PROTO_LEN_PREFIX + blen, f->in_len - PROTO_LEN_PREFIX - blen);
            f->in_len -= PROTO_LEN_PREFIX + blen;
            assert_int_equal(proto_msg_decode(f->frame, blen, m), PROTO_OK);
            if (m->type == PROTO_STOP && !f->answered_stop) {
                /* like taskpushd: a worker's STOP is answered with STOP */
                static const uint8_t stop[] = {0, 0, 0, 1, PROTO_STOP};
                assert_int_equal(write(f->fd, stop, sizeof stop), (ssize_t)sizeof stop);
                f->answered_stop = 1;
            }
            return 1;
        }
        left = deadline - now_ms();
        if (left <= 0)
            return 0;
        if (poll(&p, 1, (int)left) == 0)
            return 0;
        if (f->in_cap - f->in_len < 65536) {
            f->in_cap = f->in_cap * 2 + 65536;
            f->in = realloc(f->in, f->in_cap);
            assert_non_null(f->in);
        }
        n = read(f->fd, f->in + f->in_len, f->in_cap - f->in_len);
        if (n <= 0)
            return -1; /* EOF, or a reset */
        f->in_len += (size_t)n;
    }
}

/* fake_next reads the next frame that is not a HEARTBEAT. */
static int fake_next(fake *f, proto_msg *m, int timeout_ms)
{
    int rc;

    do
        rc = fake_read(f, m, timeout_ms);
    while (rc == 1 && m->type == PROTO_HEARTBEAT);
    return rc;
}

/* fake_expect reads the next non-HEARTBEAT frame and checks its type. */
void fake_expect(fake *f, proto_msg *m, uint8_t type)
{
    int rc = fake_next(f, m, WAIT_MS);

    if (rc != 1)
        fail_msg("expected a %s frame, got %s", proto_type_name(type), rc == 0 ? "nothing" : "EOF");
    if (m->type != type)
        fail_msg("expected a %s frame, got %s", proto_type_name(type), proto_type_name(m->type));
}

/* fake_expect_eof skips frames until the worker closes; returns how many
 * frames of type `count_type` went by. */
int fake_expect_eof(fake *f, uint8_t count_type)
{
    proto_msg m;
    int n = 0;
    int rc;

    while ((rc = fake_read(f, &m, WAIT_MS)) == 1)
        if (m.type == count_type)
            n++;
    if (rc != -1)
        fail_msg("the worker did not close the connection");
    return n;
}

void send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;

    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

        if (w < 0 && errno == EINTR)
            continue;
        assert_true(w > 0);
        b += w;
        n -= (size_t)w;
    }
}

void fake_send(fake *f, const proto_msg *m)
{
    size_t size = proto_msg_size(m);
    uint8_t *buf = malloc(size);

    assert_true(size > 0);
    assert_non_null(buf);
    assert_int_equal(proto_msg_encode(m, buf, size), size);
    send_all(f->fd, buf, size);
    free(buf);
}

void fake_send_welcome(fake *f, uint16_t version, uint32_t hb_ms, uint32_t max_body)
{
    proto_msg m = {.type = PROTO_WELCOME};

    m.u.welcome.version = version;
    m.u.welcome.heartbeat_ms = hb_ms;
    m.u.welcome.max_body = max_body;
    m.u.welcome.server.ptr = (const uint8_t *)"fake 1.0";
    m.u.welcome.server.len = 8;
    fake_send(f, &m);
}

/* fake_handshake accepts the next connection, checks HELLO and answers WELCOME
 * (heartbeat hb_ms, 0: none). */
void fake_handshake(fake *f, uint32_t hb_ms, uint32_t max_body)
{
    proto_msg m;

    fake_accept(f);
    fake_expect(f, &m, PROTO_HELLO);
    fake_send_welcome(f, PROTO_VERSION, hb_ms, max_body);
}

void fake_send_task_full(fake *f, uint64_t id, uint32_t epoch, uint32_t attempt,
                         uint32_t timeout_ms, uint8_t prio, const char *type,
                         const void *payload, size_t len)
{
    proto_msg m = {.type = PROTO_TASK};

    m.u.task.task_id = id;
    m.u.task.epoch = epoch;
    m.u.task.attempt = attempt;
    m.u.task.timeout_ms = timeout_ms;
    m.u.task.priority = prio;
    m.u.task.type.ptr = (const uint8_t *)type;
    m.u.task.type.len = strlen(type);
    m.u.task.payload.ptr = payload;
    m.u.task.payload.len = len;
    fake_send(f, &m);
}

void fake_send_task(fake *f, uint64_t id, const char *type, const char *payload)
{
    fake_send_task_full(f, id, 7, 1, 60000, 1, type, payload, strlen(payload));
}

void fake_send_bare(fake *f, uint8_t type)
{
    proto_msg m = {.type = type};

    fake_send(f, &m);
}
