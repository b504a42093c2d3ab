/* loopback_floor: what a round trip over loopback TCP costs this machine's kernel, with
 * nothing of taskpush in it. One thread stands for taskpushd: one epoll over CONNS
 * connections, and for each batch of DONEs it reads it writes one batch of TASKS
 * frames back. THREADS threads stand for the bench's workers, each with an epoll over
 * its share of the connections, answering each batch of TASKs with one batch of DONEs.
 * That is the traffic of a flat drain at K = CONNS workers of capacity TASKS: one
 * round trip per TASKS tasks a connection (bench/README.md, "Other tools"; the
 * measurements: docs/journal/bench.md, "The loopback's floor: 256 workers' traffic ...").
 * No parsing, no allocation, no database: the CPU a round trip costs here is the least
 * any dispatcher and its workers can pay on this machine for that traffic.
 *
 * usage: loopback-floor [CONNS [TASKS [SECONDS [THREADS [RATE]]]]]
 *        (default 256 connections, 4 tasks a trip, 3 seconds, 4 threads, no limit)
 * RATE paces the "dispatcher" to that many tasks a second, as the claims pace taskpushd
 * in a drain: below the machine's limit, the threads sleep and wake as taskpush's do.
 * Prints the round trips, the tasks they stand for, and the CPU (user + system) of the
 * "dispatcher" thread and of the "worker" threads, in µs a task. Run it with nothing
 * else running.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Bytes a task takes in each direction: a bench TASK frame (length prefix, kind, id,
 * attempt, timeout, type "default", a short payload) and a DONE frame (prefix, kind,
 * id, outcome). The cost of a segment of this size hardly depends on it. */
enum { TASK_BYTES = 48, DONE_BYTES = 20, MAX_CONNS = 4096, MAX_TASKS = 1024, MAX_THREADS = 64 };

typedef struct side {
    int epfd;
    size_t reply_bytes; /* what this side writes for each batch it reads */
    size_t read_bytes;  /* one whole batch from the other side */
    atomic_bool *stop;
    double rate;    /* tasks a second this side lets through; 0: no limit */
    unsigned tasks; /* tasks a batch */
    uint64_t trips; /* batches answered */
    double cpu_s;   /* this thread's user + system time while it ran */
    int failed;
} side;

static double thread_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A batch is small and the peer sends one at a time, so it arrives whole or in a few
 * pieces; this reads until the whole batch is in (the peer sends nothing more before
 * the answer). 1: nothing there yet; -1: the connection failed. */
static int read_batch(int fd, char *buf, size_t want)
{
    size_t got = 0;
    while (got < want) {
        ssize_t r = read(fd, buf + got, want - got);
        if (r > 0)
            got += (size_t)r;
        else if (r < 0 && errno == EAGAIN && got == 0)
            return 1;
        else if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue; /* the rest is on its way: the peer wrote the batch at once */
        else
            return -1;
    }
    return 0;
}

static int write_all(int fd, const char *buf, size_t len)
{
    size_t put = 0;
    while (put < len) {
        ssize_t w = write(fd, buf + put, len - put);
        if (w > 0)
            put += (size_t)w;
        else if (w < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        else
            return -1;
    }
    return 0;
}

static void *side_main(void *arg)
{
    side *s = arg;
    char *in = malloc(s->read_bytes), *out = calloc(1, s->reply_bytes);
    struct epoll_event evs[256];
    double cpu0 = thread_cpu_s(), t0 = now_s();
    while (in && out && !atomic_load(s->stop)) {
        /* Paced as the claims pace taskpushd: ahead of the rate, it sleeps (and the
         * workers with it), then finds the answers that came in meanwhile. */
        double ahead = s->rate > 0 ? (double)s->trips * s->tasks / s->rate - (now_s() - t0) : 0;
        if (ahead > 0) {
            /* At most 0.1 s at a time, so that the end of the run is seen. */
            struct timespec nap = {.tv_sec = 0, .tv_nsec = (long)((ahead < 0.1 ? ahead : 0.1) * 1e9)};
            nanosleep(&nap, NULL);
            continue;
        }
        int n = epoll_wait(s->epfd, evs, 256, 100);
        if (n < 0 && errno != EINTR) {
            s->failed = 1;
            break;
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            int got = read_batch(fd, in, s->read_bytes);
            if (got == 1)
                continue;
            if (got < 0 || write_all(fd, out, s->reply_bytes) < 0) {
                if (!atomic_load(s->stop))
                    s->failed = 1;
                break;
            }
            s->trips++;
        }
    }
    s->cpu_s = thread_cpu_s() - cpu0;
    free(in);
    free(out);
    return NULL;
}

static unsigned arg_or(int argc, char **argv, int i, unsigned dflt, unsigned lo, unsigned hi)
{
    if (argc <= i)
        return dflt;
    char *end;
    errno = 0;
    unsigned long v = strtoul(argv[i], &end, 10);
    if (errno || *end || end == argv[i] || v < lo || v > hi) {
        fprintf(stderr, "loopback-floor: argument %d: '%s' is not a number from %u to %u\n", i,
                argv[i], lo, hi);
        exit(2);
    }
    return (unsigned)v;
}

static int nodelay_nonblock(int fd)
{
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
                   fcntl(fd, F_SETFL, O_NONBLOCK) < 0
               ? -1
               : 0;
}

static int add_fd(int epfd, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        puts("usage: loopback-floor [CONNS [TASKS [SECONDS [THREADS [RATE]]]]] (default 256 4 3 4 "
             "0)");
        return 0;
    }
    unsigned conns = arg_or(argc, argv, 1, 256, 1, MAX_CONNS);
    unsigned tasks = arg_or(argc, argv, 2, 4, 1, MAX_TASKS);
    unsigned seconds = arg_or(argc, argv, 3, 3, 1, 3600);
    unsigned nthreads = arg_or(argc, argv, 4, 4, 1, MAX_THREADS);
    unsigned rate = arg_or(argc, argv, 5, 0, 0, 100000000);
    if (nthreads > conns)
        nthreads = conns;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * conns + 64) {
        rl.rlim_cur = rl.rlim_max < 2 * conns + 64 ? rl.rlim_max : 2 * conns + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t salen = sizeof sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 4096) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &salen) < 0) {
        perror("loopback-floor: listen");
        return 1;
    }

    atomic_bool stop = false;
    int *server_fds = calloc(conns, sizeof *server_fds),
        *client_fds = calloc(conns, sizeof *client_fds);
    side server = {.epfd = epoll_create1(0),
                   .reply_bytes = (size_t)tasks * TASK_BYTES,
                   .read_bytes = (size_t)tasks * DONE_BYTES,
                   .stop = &stop,
                   .rate = rate,
                   .tasks = tasks};
    side clients[MAX_THREADS];
    if (!server_fds || !client_fds || server.epfd < 0) {
        perror("loopback-floor");
        return 1;
    }
    for (unsigned t = 0; t < nthreads; t++)
        clients[t] = (side){.epfd = epoll_create1(0),
                            .reply_bytes = server.read_bytes,
                            .read_bytes = server.reply_bytes,
                            .stop = &stop};
    for (unsigned i = 0; i < conns; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa) < 0) {
            perror("loopback-floor: connect");
            return 1;
        }
        int s = accept(lfd, NULL, NULL);
        if (s < 0 || nodelay_nonblock(s) < 0 || nodelay_nonblock(c) < 0 ||
            add_fd(server.epfd, s) < 0 || add_fd(clients[i % nthreads].epfd, c) < 0) {
            perror("loopback-floor: accept");
            return 1;
        }
        server_fds[i] = s;
        client_fds[i] = c;
    }

    pthread_t thr[MAX_THREADS + 1];
    if (pthread_create(&thr[0], NULL, side_main, &server) != 0)
        return 1;
    for (unsigned t = 0; t < nthreads; t++)
        if (pthread_create(&thr[t + 1], NULL, side_main, &clients[t]) != 0)
            return 1;
    /* Every connection starts with its slots full: one batch of TASKs each. */
    char *first = calloc(1, server.reply_bytes);
    for (unsigned i = 0; i < conns && first; i++)
        if (write_all(server_fds[i], first, server.reply_bytes) < 0)
            return 1;
    free(first);
    double t0 = now_s();
    struct timespec nap = {.tv_sec = seconds};
    while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
    }
    atomic_store(&stop, true);
    double wall = now_s() - t0;
    for (unsigned t = 0; t <= nthreads; t++)
        pthread_join(thr[t], NULL);

    uint64_t trips = server.trips;
    double worker_cpu = 0;
    int failed = server.failed;
    for (unsigned t = 0; t < nthreads; t++) {
        worker_cpu += clients[t].cpu_s;
        failed |= clients[t].failed;
    }
    if (failed || trips == 0) {
        fprintf(stderr, "loopback-floor: a connection failed\n");
        return 1;
    }
    double n_tasks = (double)trips * tasks;
    printf("connections %u, tasks a trip %u, worker threads %u, %.1f s: %llu round trips, %.0f "
           "tasks/s\n",
           conns, tasks, nthreads, wall, (unsigned long long)trips, n_tasks / wall);
    printf(
        "cpu us a task: dispatcher side %.2f, worker side %.2f, both %.2f (a round trip: %.1f)\n",
        server.cpu_s * 1e6 / n_tasks, worker_cpu * 1e6 / n_tasks,
        (server.cpu_s + worker_cpu) * 1e6 / n_tasks,
        (server.cpu_s + worker_cpu) * 1e6 / (double)trips);
    for (unsigned i = 0; i < conns; i++) {
        close(server_fds[i]);
        close(client_fds[i]);
    }
    free(server_fds);
    free(client_fds);
    close(lfd);
    return 0;
}
