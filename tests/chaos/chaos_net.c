/* chaos_net: see chaos_net.h. */
#include "chaos_net.h"

#include "proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "127.0.0.1:PORT" into *sa; only loopback addresses are accepted. */
static int parse_loopback(const char *hostport, struct sockaddr_in *sa)
{
    const char *colon = strrchr(hostport, ':');
    char host[32];
    if (colon == NULL || (size_t)(colon - hostport) >= sizeof host)
        return -1;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    if (*end != '\0' || port == 0 || port > 65535 || inet_pton(AF_INET, host, &sa->sin_addr) != 1 ||
        (ntohl(sa->sin_addr.s_addr) >> 24) != 127)
        return -1;
    sa->sin_port = htons((uint16_t)port);
    return 0;
}

/* ==== the partition proxy ==== */

#define PROXY_MAX_PAIRS 32
#define PROXY_BUF (256 * 1024)

/* One direction of a pair: bytes read from `from` that `to` has not taken yet. */
struct pipe_dir {
    int from, to;
    uint8_t *buf;
    size_t len;
};

struct pair {
    int down, up; /* the worker's side, the dispatcher's side; -1 when unused */
    struct pipe_dir d[2];
};

struct chaos_proxy {
    pthread_t thr;
    int lfd;
    struct sockaddr_in upstream;
    _Atomic bool hold;
    _Atomic bool stop;
    _Atomic uint64_t accepted;
    struct pair pairs[PROXY_MAX_PAIRS];
};

static void pair_close(struct pair *p)
{
    if (p->down >= 0)
        close(p->down);
    if (p->up >= 0)
        close(p->up);
    free(p->d[0].buf);
    free(p->d[1].buf);
    memset(p, 0, sizeof *p);
    p->down = p->up = -1;
}

/* Moves what it can in one direction. Returns -1 when the pair is finished. */
static int dir_pump(struct pipe_dir *d, bool readable, bool writable)
{
    if (readable && d->len < PROXY_BUF) {
        ssize_t r = recv(d->from, d->buf + d->len, PROXY_BUF - d->len, MSG_DONTWAIT);
        if (r == 0)
            return -1;
        if (r < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (r > 0)
            d->len += (size_t)r;
        writable = true; /* try at once; EAGAIN just leaves it buffered */
    }
    if (writable && d->len > 0) {
        ssize_t w = send(d->to, d->buf, d->len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (w > 0) {
            memmove(d->buf, d->buf + w, d->len - (size_t)w);
            d->len -= (size_t)w;
        }
    }
    return 0;
}

static void proxy_accept(chaos_proxy *p)
{
    int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    atomic_fetch_add(&p->accepted, 1);
    struct pair *slot = NULL;
    for (int i = 0; i < PROXY_MAX_PAIRS && !slot; i++)
        if (p->pairs[i].down < 0)
            slot = &p->pairs[i];
    int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* A blocking connect on loopback: refused at once when taskpushd is down, and the
     * worker then reconnects on its own. */
    if (!slot || up < 0 || connect(up, (struct sockaddr *)&p->upstream, sizeof p->upstream) != 0) {
        if (up >= 0)
            close(up);
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    slot->d[0].buf = malloc(PROXY_BUF);
    slot->d[1].buf = malloc(PROXY_BUF);
    slot->down = fd;
    slot->up = up;
    if (!slot->d[0].buf || !slot->d[1].buf) {
        pair_close(slot);
        return;
    }
    slot->d[0].from = fd;
    slot->d[0].to = up;
    slot->d[1].from = up;
    slot->d[1].to = fd;
}

static void *proxy_main(void *arg)
{
    chaos_proxy *p = arg;
    struct pollfd pfd[1 + 2 * PROXY_MAX_PAIRS];
    int owner[1 + 2 * PROXY_MAX_PAIRS];
    while (!atomic_load(&p->stop)) {
        if (atomic_load(&p->hold)) {
            /* The partition: nothing is read, written, accepted or closed. */
            struct timespec ts = {0, 2 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        int n = 0;
        pfd[n].fd = p->lfd;
        pfd[n].events = POLLIN;
        owner[n++] = -1;
        for (int i = 0; i < PROXY_MAX_PAIRS; i++) {
            struct pair *q = &p->pairs[i];
            if (q->down < 0)
                continue;
            for (int k = 0; k < 2; k++) {
                pfd[n].fd = q->d[k].from;
                pfd[n].events = (short)((q->d[k].len < PROXY_BUF ? POLLIN : 0) |
                                        (q->d[1 - k].len > 0 ? POLLOUT : 0));
                owner[n++] = i;
            }
        }
        if (poll(pfd, (nfds_t)n, 5) <= 0)
            continue;
        if (atomic_load(&p->hold))
            continue;
        if (pfd[0].revents & POLLIN)
            proxy_accept(p);
        for (int j = 1; j < n; j++) {
            struct pair *q = &p->pairs[owner[j]];
            if (q->down < 0 || pfd[j].revents == 0)
                continue;
            int k = pfd[j].fd == q->d[0].from ? 0 : 1;
            bool rd = (pfd[j].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
            bool wr = (pfd[j].revents & POLLOUT) != 0;
            if (dir_pump(&q->d[k], rd, false) < 0 || dir_pump(&q->d[1 - k], false, wr) < 0)
                pair_close(q);
        }
    }
    return NULL;
}

chaos_proxy *chaos_proxy_start(const char *upstream, char *listen_out, size_t cap)
{
    chaos_proxy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->lfd = -1;
    for (int i = 0; i < PROXY_MAX_PAIRS; i++)
        p->pairs[i].down = p->pairs[i].up = -1;
    if (parse_loopback(upstream, &p->upstream) < 0) {
        fprintf(stderr, "chaos proxy: %s is not a loopback HOST:PORT\n", upstream);
        goto fail;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(p->lfd, 64) != 0 ||
        getsockname(p->lfd, (struct sockaddr *)&sa, &len) != 0) {
        fprintf(stderr, "chaos proxy: cannot listen: %s\n", strerror(errno));
        goto fail;
    }
    snprintf(listen_out, cap, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    if (pthread_create(&p->thr, NULL, proxy_main, p) != 0)
        goto fail;
    return p;
fail:
    if (p->lfd >= 0)
        close(p->lfd);
    free(p);
    return NULL;
}

void chaos_proxy_hold(chaos_proxy *p, bool hold)
{
    atomic_store(&p->hold, hold);
}

uint64_t chaos_proxy_accepted(chaos_proxy *p)
{
    return atomic_load(&p->accepted);
}

void chaos_proxy_stop(chaos_proxy *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->hold, false);
    atomic_store(&p->stop, true);
    pthread_join(p->thr, NULL);
    for (int i = 0; i < PROXY_MAX_PAIRS; i++)
        if (p->pairs[i].down >= 0)
            pair_close(&p->pairs[i]);
    close(p->lfd);
    free(p);
}

/* ==== the hostile mix ---- */

#define HOSTILE_MAX_BIG 16              /* 16 MiB senders at once */
#define HOSTILE_BIG_BODY (16u << 20)    /* the frame body announced and sent */
#define HOSTILE_MAX_SLOTS 4096
#define HOSTILE_HEAD_MAX 4096           /* the bytes a slot sends first */

static const char *const kind_names[CHAOS_NKINDS] = {
    "garbage", "len4g", "big", "slowloris", "idle", "cap_neg",
    "cap_max", "types64", "bad_utf8", "nul_type", "flood",
};

const char *chaos_kind_name(int kind)
{
    return kind >= 0 && kind < CHAOS_NKINDS ? kind_names[kind] : NULL;
}

int chaos_kinds_parse(const char *list, unsigned *mask)
{
    if (strcmp(list, "all") == 0) {
        *mask = CHAOS_ALL_KINDS;
        return 0;
    }
    unsigned m = 0;
    const char *p = list;
    while (*p) {
        size_t n = strcspn(p, ",");
        int k;
        for (k = 0; k < CHAOS_NKINDS; k++)
            if (strlen(kind_names[k]) == n && strncmp(kind_names[k], p, n) == 0)
                break;
        if (k == CHAOS_NKINDS) {
            fprintf(stderr, "chaos: unknown hostile kind '%.*s'\n", (int)n, p);
            return -1;
        }
        m |= 1u << k;
        p += n;
        if (*p == ',')
            p++;
    }
    *mask = m;
    return m ? 0 : -1;
}

enum slot_state { SLOT_IDLE = 0, SLOT_CONNECTING, SLOT_SENDING, SLOT_HOLDING };

struct slot {
    int kind;
    int fd;
    int state;
    long long next_ms;    /* SLOT_IDLE: when to connect again */
    uint8_t head[HOSTILE_HEAD_MAX];
    size_t head_len, head_sent;
    uint64_t bulk_left;   /* CHAOS_BIG: body bytes still to send after the head */
};

struct chaos_hostile {
    pthread_t thr;
    struct sockaddr_in target;
    _Atomic bool stop;
    _Atomic unsigned open;
    uint64_t rng;
    unsigned nslots;
    struct slot *slots;
    int ep;               /* epoll: a poll() over a thousand sockets cost more than the attack */
    chaos_hostile_stats st; /* written by the thread only; read after the join */
};

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: plenty for random bytes and delays. */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Encodes a HELLO with the given capacity and types into s->head. */
static void head_hello(struct slot *s, uint32_t capacity, const proto_bytes *types, uint16_t ntypes)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.capacity = capacity;
    m.u.hello.name.ptr = (const uint8_t *)"chaos-hostile";
    m.u.hello.name.len = 13;
    m.u.hello.ntypes = ntypes;
    for (uint16_t i = 0; i < ntypes && i < PROTO_MAX_TYPES; i++)
        m.u.hello.types[i] = types[i];
    s->head_len = proto_msg_encode(&m, s->head, sizeof s->head);
}

/* Fills what the slot sends once connected. */
static void head_build(chaos_hostile *h, struct slot *s)
{
    static const uint8_t idle_type[] = "chaos_hostile";
    static const uint8_t bad_utf8[] = {0xFF, 0xFE};
    static const uint8_t nul_type[] = {'n', 'u', 0, 'l'};
    char names[PROTO_MAX_TYPES][20];
    proto_bytes types[PROTO_MAX_TYPES];
    s->head_len = s->head_sent = 0;
    s->bulk_left = 0;
    switch (s->kind) {
    case CHAOS_GARBAGE:
        for (size_t i = 0; i < 64; i++)
            s->head[i] = (uint8_t)rng_next(&h->rng);
        s->head_len = 64;
        break;
    case CHAOS_LEN4G:
        memset(s->head, 0xFF, 4);
        s->head_len = 4;
        break;
    case CHAOS_BIG:
        s->head[0] = (uint8_t)(HOSTILE_BIG_BODY >> 24);
        s->head[1] = (uint8_t)(HOSTILE_BIG_BODY >> 16);
        s->head[2] = (uint8_t)(HOSTILE_BIG_BODY >> 8);
        s->head[3] = (uint8_t)HOSTILE_BIG_BODY;
        s->head[4] = PROTO_HELLO;
        s->head_len = 5;
        s->bulk_left = HOSTILE_BIG_BODY - 1;
        break;
    case CHAOS_SLOWLORIS:
        s->head[0] = s->head[1] = s->head[2] = 0;
        s->head[3] = 100;
        s->head[4] = PROTO_HELLO;
        memset(s->head + 5, 'x', 5);
        s->head_len = 10;
        break;
    case CHAOS_IDLE:
    case CHAOS_CAP_NEG:
    case CHAOS_CAP_MAX:
        types[0].ptr = idle_type;
        types[0].len = sizeof idle_type - 1;
        head_hello(s, s->kind == CHAOS_IDLE ? 1u : s->kind == CHAOS_CAP_NEG ? 0x80000000u : 0x7fffffffu,
                   types, 1);
        break;
    case CHAOS_TYPES64:
        for (int i = 0; i < PROTO_MAX_TYPES; i++) {
            snprintf(names[i], sizeof names[i], "r%016llx", (unsigned long long)rng_next(&h->rng));
            types[i].ptr = (const uint8_t *)names[i];
            types[i].len = strlen(names[i]);
        }
        head_hello(s, 1, types, PROTO_MAX_TYPES);
        break;
    case CHAOS_BAD_UTF8:
        types[0].ptr = bad_utf8;
        types[0].len = sizeof bad_utf8;
        head_hello(s, 1, types, 1);
        break;
    case CHAOS_NUL_TYPE:
        types[0].ptr = nul_type;
        types[0].len = sizeof nul_type;
        head_hello(s, 1, types, 1);
        break;
    default: /* CHAOS_FLOOD sends nothing */
        break;
    }
}

static void slot_close(chaos_hostile *h, struct slot *s, long long now, bool by_peer)
{
    if (s->fd >= 0) {
        close(s->fd);
        if (s->state != SLOT_CONNECTING)
            atomic_fetch_sub(&h->open, 1);
        if (by_peer)
            h->st.closed_by_peer++;
    }
    s->fd = -1;
    s->state = SLOT_IDLE;
    s->next_ms = now + (s->kind == CHAOS_FLOOD ? 100 : 100 + (long long)(rng_next(&h->rng) % 201));
}

static void slot_connect(chaos_hostile *h, struct slot *s, long long now)
{
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->fd < 0) {
        s->next_ms = now + 200;
        return;
    }
    int r = connect(s->fd, (struct sockaddr *)&h->target, sizeof h->target);
    if (r != 0 && errno != EINPROGRESS) {
        h->st.refused++;
        close(s->fd);
        s->fd = -1;
        s->next_ms = now + 100 + (long long)(rng_next(&h->rng) % 201);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)(s - h->slots)};
    if (epoll_ctl(h->ep, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
        close(s->fd);
        s->fd = -1;
        s->next_ms = now + 200;
        return;
    }
    s->state = SLOT_CONNECTING;
}

/* The connect finished (successfully): count it and start sending. */
static void slot_connected(chaos_hostile *h, struct slot *s, long long now)
{
    h->st.connects++;
    h->st.per_kind[s->kind]++;
    unsigned open = atomic_fetch_add(&h->open, 1) + 1;
    if (open > h->st.open_peak)
        h->st.open_peak = open;
    s->state = SLOT_SENDING;
    if (s->kind == CHAOS_FLOOD) {
        slot_close(h, s, now, false);
        return;
    }
    head_build(h, s);
}

static void slot_send(chaos_hostile *h, struct slot *s, long long now)
{
    static const uint8_t zeros[64 * 1024];
    while (s->head_sent < s->head_len || s->bulk_left > 0) {
        const uint8_t *p;
        size_t n;
        if (s->head_sent < s->head_len) {
            p = s->head + s->head_sent;
            n = s->head_len - s->head_sent;
        } else {
            p = zeros;
            n = s->bulk_left < sizeof zeros ? (size_t)s->bulk_left : sizeof zeros;
        }
        ssize_t w = send(s->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno != EAGAIN && errno != EINTR)
                slot_close(h, s, now, true);
            return;
        }
        if (s->head_sent < s->head_len)
            s->head_sent += (size_t)w;
        else {
            s->bulk_left -= (uint64_t)w;
            h->st.big_bytes += (uint64_t)w;
        }
    }
    s->state = SLOT_HOLDING;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)(s - h->slots)};
    epoll_ctl(h->ep, EPOLL_CTL_MOD, s->fd, &ev);
}

static void *hostile_main(void *arg)
{
    chaos_hostile *h = arg;
    uint8_t sink[16 * 1024];
    /* The attacker shares the dispatcher's two cores here, where a real one would bring
     * its own: run only on CPU time nobody else wants (SCHED_IDLE, else nice 19), so
     * that its own CPU (thousands of connects a second)
     * is not what the honest figures measure. What the attack costs through taskpushd
     * (and the kernel's work for its packets) still shows; taskpushd's CPU is printed. */
    struct sched_param idle = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) != 0)
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    struct epoll_event evs[256];
    while (!atomic_load(&h->stop)) {
        long long now = mono_ms();
        for (unsigned i = 0; i < h->nslots; i++) {
            struct slot *s = &h->slots[i];
            if (s->state == SLOT_IDLE && now >= s->next_ms)
                slot_connect(h, s, now);
        }
        int n = epoll_wait(h->ep, evs, (int)(sizeof evs / sizeof evs[0]), 10);
        if (n <= 0)
            continue;
        now = mono_ms();
        for (int j = 0; j < n; j++) {
            struct slot *s = &h->slots[evs[j].data.u32];
            uint32_t re = evs[j].events;
            /* A slot closed earlier in this batch is only reopened by the scan above. */
            if (s->fd < 0)
                continue;
            if (s->state == SLOT_CONNECTING) {
                int err = 0;
                socklen_t len = sizeof err;
                if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                    h->st.refused++;
                    close(s->fd);
                    s->fd = -1;
                    s->state = SLOT_IDLE;
                    s->next_ms = now + 100 + (long long)(rng_next(&h->rng) % 201);
                    continue;
                }
                slot_connected(h, s, now);
                if (s->fd < 0)
                    continue;
            }
            if (re & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                /* Whatever the dispatcher says (WELCOME, ERROR, heartbeats) is drained;
                 * its close ends the connection. */
                ssize_t r = recv(s->fd, sink, sizeof sink, MSG_DONTWAIT);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    slot_close(h, s, now, true);
                    continue;
                }
            }
            if (s->state == SLOT_SENDING)
                slot_send(h, s, now);
        }
    }
    return NULL;
}

chaos_hostile *chaos_hostile_start(const char *target, unsigned mask, unsigned nslots, unsigned seed)
{
    if (mask == 0 || nslots == 0 || nslots > HOSTILE_MAX_SLOTS)
        return NULL;
    chaos_hostile *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    if (parse_loopback(target, &h->target) < 0) {
        fprintf(stderr, "chaos hostile: %s is not a loopback HOST:PORT\n", target);
        free(h);
        return NULL;
    }
    h->rng = 0x9E3779B97F4A7C15ULL ^ seed;
    h->nslots = nslots;
    h->slots = calloc(nslots, sizeof *h->slots);
    h->ep = epoll_create1(EPOLL_CLOEXEC);
    if (!h->slots || h->ep < 0)
        goto fail;
    int kind = 0;
    unsigned big = 0;
    long long now = mono_ms();
    for (unsigned i = 0; i < nslots; i++) {
        while (!(mask & (1u << kind)))
            kind = (kind + 1) % CHAOS_NKINDS;
        int k = kind;
        kind = (kind + 1) % CHAOS_NKINDS;
        /* The 16 MiB senders are capped (each costs the sender and the machine 16 MiB of
         * copying); their extra slots become slowloris or whatever else is in the mix. */
        if (k == CHAOS_BIG && big >= HOSTILE_MAX_BIG) {
            k = (mask & (1u << CHAOS_SLOWLORIS)) || mask == (1u << CHAOS_BIG) ? CHAOS_SLOWLORIS : -1;
            for (int t = 0; k < 0 && t < CHAOS_NKINDS; t++)
                if (t != CHAOS_BIG && (mask & (1u << t)))
                    k = t;
        }
        big += k == CHAOS_BIG;
        h->slots[i].kind = k;
        h->slots[i].fd = -1;
        /* Spread the first connects over 200 ms rather than one burst. */
        h->slots[i].next_ms = now + (long long)(i * 200u / nslots);
    }
    if (pthread_create(&h->thr, NULL, hostile_main, h) != 0)
        goto fail;
    return h;
fail:
    if (h->ep >= 0)
        close(h->ep);
    free(h->slots);
    free(h);
    return NULL;
}

unsigned chaos_hostile_open(chaos_hostile *h)
{
    return atomic_load(&h->open);
}

void chaos_hostile_stop(chaos_hostile *h, chaos_hostile_stats *out)
{
    if (h == NULL)
        return;
    atomic_store(&h->stop, true);
    pthread_join(h->thr, NULL);
    for (unsigned i = 0; i < h->nslots; i++)
        if (h->slots[i].fd >= 0)
            close(h->slots[i].fd);
    close(h->ep);
    if (out)
        *out = h->st;
    free(h->slots);
    free(h);
}
