/* chaos_worker: an honest libtaskpush worker in a process of its own, for the chaos
 * suite, so that the suite can SIGKILL it at any moment and start it again.
 *
 *   chaos_worker --connect HOST:PORT --types T1,T2,... --capacity N --log FILE [--name NAME]
 *
 * Every delivery first appends one line "TASK_ID ATTEMPT EPOCH PID START_MS\n" to FILE
 * (START_MS: CLOCK_MONOTONIC, which every process of the machine shares) with a single
 * write() on an O_APPEND descriptor (a line is whole or absent even when the
 * process is killed; restarted generations of a worker share the file and differ by
 * PID), then sleeps 0..5 ms (a per-delivery pseudo-random time, no shared state) and
 * succeeds with the result "ok". The dispatcher sees it as "NAME-PID" (so that the suite
 * finds a worker generation in /workers). SIGTERM or SIGINT stops it gracefully (exit 0); a bad
 * argument exits 2, a library error 1.
 */
#include "taskpush.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CW_MAX_TYPES 16
#define CW_MAX_SLEEP_US 5000u

struct cw {
    int fd;
    unsigned pid;
};

static tp_worker *volatile stop_target;

static void on_signal(int sig)
{
    (void)sig;
    if (stop_target != NULL)
        tp_worker_stop(stop_target);
}

/* A 64-bit mix (splitmix64's finaliser): the handler's sleep depends on the delivery,
 * not on a generator shared between handler threads. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static int handler(tp_task *task, void *arg)
{
    struct cw *cw = arg;
    char line[128];
    uint64_t id = tp_task_id(task);
    unsigned attempt = (unsigned)tp_task_attempt(task), epoch = (unsigned)tp_task_epoch(task);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    int n = snprintf(line, sizeof line, "%llu %u %u %u %lld\n", (unsigned long long)id, attempt, epoch,
                     cw->pid, ms);
    if (write(cw->fd, line, (size_t)n) != n)
        return TP_FAIL; /* the suite would miss this run: let it show as a retry */
    uint64_t us = mix64(id * 1000003u + attempt * 7919u + epoch + cw->pid) % (CW_MAX_SLEEP_US + 1);
    struct timespec ts = {0, (long)us * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    if (tp_task_set_result(task, "ok", 2) < 0)
        return TP_FAIL;
    return TP_SUCCESS;
}

static void log_cb(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "chaos_worker[%ld] %d: %s\n", (long)getpid(), level, msg);
}

static int usage(void)
{
    fprintf(stderr, "usage: chaos_worker --connect HOST:PORT --types T1,T2,... --capacity N"
                    " --log FILE [--name NAME]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *connect = NULL, *types = NULL, *logpath = NULL, *name = "chaos-worker";
    char fullname[128];
    unsigned long capacity = 0;
    struct cw cw = {-1, (unsigned)getpid()};
    char *list = NULL;
    tp_worker *w = NULL;
    int rc = 1;

    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            return usage();
        const char *k = argv[i], *v = argv[++i];
        if (strcmp(k, "--connect") == 0)
            connect = v;
        else if (strcmp(k, "--types") == 0)
            types = v;
        else if (strcmp(k, "--capacity") == 0)
            capacity = strtoul(v, NULL, 10);
        else if (strcmp(k, "--log") == 0)
            logpath = v;
        else if (strcmp(k, "--name") == 0 && strlen(v) < 64)
            name = v;
        else
            return usage();
    }
    if (!connect || !types || !logpath || capacity == 0 || capacity > 1024)
        return usage();
    cw.fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (cw.fd < 0) {
        fprintf(stderr, "chaos_worker: %s: %s\n", logpath, strerror(errno));
        return 1;
    }

    tp_worker_options o;
    tp_worker_options_init(&o);
    o.addresses = connect;
    snprintf(fullname, sizeof fullname, "%s-%u", name, cw.pid);
    o.name = fullname;
    o.capacity = (unsigned)capacity;
    o.threads = (unsigned)capacity;
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 500;
    o.log = log_cb;
    o.log_level = TP_LOG_WARN;
    tp_error err;
    w = tp_worker_new(&o, &err);
    if (w == NULL) {
        fprintf(stderr, "chaos_worker: %s\n", err.text);
        goto done;
    }
    list = strdup(types);
    if (list == NULL)
        goto done;
    int ntypes = 0;
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (++ntypes > CW_MAX_TYPES || tp_worker_add_type(w, t, handler, &cw) < 0) {
            fprintf(stderr, "chaos_worker: cannot register type %s\n", t);
            goto done;
        }
    }
    if (ntypes == 0) {
        rc = usage();
        goto done;
    }
    stop_target = w;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    rc = tp_worker_run(w) == 0 ? 0 : 1;
    stop_target = NULL;
done:
    if (w)
        tp_worker_free(w);
    free(list);
    close(cw.fd);
    return rc;
}
