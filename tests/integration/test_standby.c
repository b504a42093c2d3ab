/* test_standby: what a standby taskpushd says on the worker port (proto/PROTOCOL.md,
 * section 7), with raw-protocol peers, a real leader and a real standby on one table.
 *
 *   - a worker's HELLO of version 1, 2 and 3 is answered ERROR NOT_LEADER, and
 *     the standby closes the connection (it holds no worker idle);
 *   - the same HELLOs to the leader are answered WELCOME in their version;
 *   - a producer-only HELLO (version 2, no type) is welcomed by the standby: its
 *     SUBMITs are answered UNAVAILABLE (test_submit), not its HELLO.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "daemon.h"
#include "proto.h"
#include "raw.h"
#include "testdb.h"

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon leader;
    tp_daemon standby;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->standby.pid > 0)
        tp_daemon_stop(&fx->standby, SIGTERM, 15000);
    if (fx->leader.pid > 0)
        tp_daemon_stop(&fx->leader, SIGTERM, 15000);
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

/* Sends a HELLO of the given version with ntypes types ("st") on fd. */
static void send_hello(int fd, uint16_t version, uint16_t ntypes)
{
    proto_msg m = {.type = PROTO_HELLO};
    uint8_t buf[512];
    m.u.hello.version = version;
    m.u.hello.capacity = ntypes ? 1 : 0;
    m.u.hello.name.ptr = (const uint8_t *)"raw";
    m.u.hello.name.len = 3;
    m.u.hello.ntypes = ntypes;
    if (ntypes) {
        m.u.hello.types[0].ptr = (const uint8_t *)"st";
        m.u.hello.types[0].len = 2;
    }
    size_t n = proto_msg_encode(&m, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads the first frame that is not a HEARTBEAT into *m (its bytes in buf); fails the
 * test at EOF or after the socket's receive timeout. */
static void read_frame(int fd, uint8_t *buf, size_t cap, proto_msg *m)
{
    size_t len = 0;
    for (;;) {
        uint32_t body = 0;
        int st = proto_frame_check(buf, len, (uint32_t)(cap - PROTO_LEN_PREFIX), &body);
        if (st == PROTO_OK) {
            assert_int_equal(proto_msg_decode(buf + PROTO_LEN_PREFIX, body, m), PROTO_OK);
            if (m->type != PROTO_HEARTBEAT)
                return;
            size_t used = PROTO_LEN_PREFIX + body;
            memmove(buf, buf + used, len - used);
            len -= used;
            continue;
        }
        assert_int_equal(st, PROTO_NEED_MORE);
        assert_true(len < cap);
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r <= 0)
            fail_msg("the connection ended (%zd) before a frame", r);
        len += (size_t)r;
    }
}

/* After ERROR the sender closes: the next read sees EOF (within the receive timeout). */
static void expect_eof(int fd)
{
    uint8_t b[256];
    ssize_t r;
    while ((r = recv(fd, b, sizeof b, 0)) > 0)
        ;
    assert_int_equal(r, 0);
}

static void hello_to(const tp_daemon *d, uint16_t version, uint16_t ntypes, uint8_t want_type,
                     uint16_t want_code)
{
    uint8_t buf[4096];
    proto_msg m;
    int fd = tp_raw_connect(d->listen, 10);
    assert_true(fd >= 0);
    send_hello(fd, version, ntypes);
    read_frame(fd, buf, sizeof buf, &m);
    assert_int_equal(m.type, want_type);
    if (want_type == PROTO_ERROR) {
        assert_int_equal(m.u.error.code, want_code);
        expect_eof(fd);
    } else {
        assert_int_equal(m.u.welcome.version, version);
    }
    close(fd);
}

static void test_standby_refuses_workers(void **state)
{
    struct fx *fx = *state;

    assert_int_equal(tp_testdb_create("standby", &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_daemon_start(&fx->leader, fx->db.url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->leader, 20000), 0);
    assert_int_equal(tp_daemon_start(&fx->standby, fx->db.url, NULL), 0);
    json_t *st = tp_daemon_json(&fx->standby, "/stats");
    assert_non_null(st);
    assert_true(json_is_false(json_object_get(st, "leader")));
    json_decref(st);

    hello_to(&fx->standby, 1, 1, PROTO_ERROR, PROTO_ERR_NOT_LEADER);
    hello_to(&fx->standby, 2, 1, PROTO_ERROR, PROTO_ERR_NOT_LEADER);
    hello_to(&fx->standby, 3, 1, PROTO_ERROR, PROTO_ERR_NOT_LEADER);
    hello_to(&fx->standby, 2, 0, PROTO_WELCOME, 0); /* a producer stays */
    hello_to(&fx->leader, 1, 1, PROTO_WELCOME, 0);
    hello_to(&fx->leader, 2, 1, PROTO_WELCOME, 0);
    hello_to(&fx->leader, 3, 1, PROTO_WELCOME, 0);
    assert_int_equal(tp_daemon_stat(&fx->standby, "workers"), 0);
    assert_true(tp_daemon_log_count(&fx->standby, "does not lead the table") >= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_standby_refuses_workers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
