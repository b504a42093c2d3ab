/* raw: plain TCP connections for the tests (see raw.h). */
#include "raw.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "proto.h"

int tp_raw_connect(const char *hostport, int rcv_timeout_s)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    if (colon == NULL) {
        fprintf(stderr, "tp_raw_connect: no port in %s\n", hostport);
        return -1;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - hostport), hostport);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "tp_raw_connect: not an IPv4 address: %s\n", host);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("tp_raw_connect");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (rcv_timeout_s > 0) {
        struct timeval tv = {rcv_timeout_s, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

int tp_raw_hello(int fd, const char *name, size_t name_len, const char *type)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = 1;
    m.u.hello.name.ptr = (const uint8_t *)name;
    m.u.hello.name.len = name_len;
    m.u.hello.ntypes = 1;
    m.u.hello.types[0].ptr = (const uint8_t *)type;
    m.u.hello.types[0].len = strlen(type);
    uint8_t buf[1024];
    size_t n = proto_msg_encode(&m, buf, sizeof buf);
    if (n == 0)
        return -1;
    return send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

int tp_raw_send(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

uint8_t *tp_raw_encode(const proto_msg *m, size_t *n)
{
    *n = proto_msg_size(m);
    uint8_t *buf = malloc(*n);
    if (buf != NULL && proto_msg_encode(m, buf, *n) != *n) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

int tp_raw_send_msg(int fd, const proto_msg *m)
{
    size_t n;
    uint8_t *buf = tp_raw_encode(m, &n);
    int rc = buf != NULL ? tp_raw_send(fd, buf, n) : -1;
    free(buf);
    return rc;
}

long tp_raw_read_frame(int fd, uint8_t *buf, size_t cap)
{
    for (;;) {
        uint8_t pre[4];
        size_t got = 0;
        while (got < 4) {
            ssize_t k = recv(fd, pre + got, 4 - got, 0);
            if (k <= 0)
                return -1;
            got += (size_t)k;
        }
        uint32_t n = (uint32_t)pre[0] << 24 | (uint32_t)pre[1] << 16 | (uint32_t)pre[2] << 8 | pre[3];
        if (n == 0 || n > cap)
            return -1;
        got = 0;
        while (got < n) {
            ssize_t k = recv(fd, buf + got, n - got, 0);
            if (k <= 0)
                return -1;
            got += (size_t)k;
        }
        if (buf[0] != PROTO_HEARTBEAT)
            return (long)n;
    }
}
