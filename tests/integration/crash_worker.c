/* crash_worker: a libtaskpush worker in a process of its own, for test_faults, so that
 * a test can kill -9 it in the middle of its tasks.
 *
 *   crash_worker --connect HOST:PORT --type T --capacity N --sleep-ms MS --log FILE
 *
 * For every delivery the handler first appends one line "TASK_ID ATTEMPT EPOCH\n" to
 * FILE with a single write() on an O_APPEND descriptor (so a line is either whole or
 * absent, even when the process is killed), then sleeps MS milliseconds and succeeds
 * with the result "ok". Nothing is fsync'ed: the file only has to survive the process,
 * not the machine. SIGTERM or SIGINT stops the worker gracefully (it finishes what it
 * holds) and the process exits 0; a bad argument exits 2, a library error 1.
 */
#include "taskpush.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cw {
    int fd;
    unsigned sleep_ms;
};

static tp_worker *volatile stop_target;

static void on_signal(int sig)
{
    (void)sig;
    if (stop_target != NULL)
        tp_worker_stop(stop_target);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int handler(tp_task *task, void *arg)
{
    struct cw *cw = arg;
    char line[96];
    int n = snprintf(line, sizeof line, "%llu %u %u\n", (unsigned long long)tp_task_id(task),
                     (unsigned)tp_task_attempt(task), (unsigned)tp_task_epoch(task));
    if (write(cw->fd, line, (size_t)n) != n)
        return TP_FAIL; /* the test would miss this run: let it show as a retry */
    sleep_ms(cw->sleep_ms);
    if (tp_task_set_result(task, "ok", 2) < 0)
        return TP_FAIL;
    return TP_SUCCESS;
}

static void log_cb(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "crash_worker[%ld] %d: %s\n", (long)getpid(), level, msg);
}

static int usage(void)
{
    fprintf(stderr, "usage: crash_worker --connect HOST:PORT --type T --capacity N "
                    "--sleep-ms MS --log FILE\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *connect = NULL, *type = NULL, *logpath = NULL;
    unsigned capacity = 1;
    struct cw cw = {-1, 0};

    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            return usage();
        const char *k = argv[i], *v = argv[++i];
        if (strcmp(k, "--connect") == 0)
            connect = v;
        else if (strcmp(k, "--type") == 0)
            type = v;
        else if (strcmp(k, "--capacity") == 0)
            capacity = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(k, "--sleep-ms") == 0)
            cw.sleep_ms = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(k, "--log") == 0)
            logpath = v;
        else
            return usage();
    }
    if (!connect || !type || !logpath || capacity == 0)
        return usage();
    cw.fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (cw.fd < 0) {
        fprintf(stderr, "crash_worker: %s: %s\n", logpath, strerror(errno));
        return 1;
    }

    tp_worker_options o;
    tp_worker_options_init(&o);
    o.addresses = connect;
    o.capacity = capacity;
    o.threads = capacity;
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 500;
    o.log = log_cb;
    o.log_level = TP_LOG_WARN;
    tp_error err;
    tp_worker *w = tp_worker_new(&o, &err);
    if (w == NULL) {
        fprintf(stderr, "crash_worker: %s\n", err.text);
        return 1;
    }
    if (tp_worker_add_type(w, type, handler, &cw) < 0) {
        fprintf(stderr, "crash_worker: cannot register type %s\n", type);
        tp_worker_free(w);
        return 1;
    }
    stop_target = w;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int rc = tp_worker_run(w);
    stop_target = NULL;
    tp_worker_free(w);
    close(cw.fd);
    return rc == 0 ? 0 : 1;
}
