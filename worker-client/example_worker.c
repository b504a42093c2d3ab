/* A complete worker on libtaskpush: takes tasks of type "greet" and answers
 * "hello, <payload>". Built with the project (and shown in README.md), so the
 * example always compiles against the current header.
 *
 *   example_worker 127.0.0.1:7070
 */
#include <taskpush.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

static tp_worker *worker; /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    tp_worker_stop(worker); /* async-signal-safe: finish held tasks, then return */
}

static void log_line(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "[%d] %s\n", level, msg);
}

static int greet(tp_task *task, void *arg)
{
    (void)arg;
    size_t len;
    const char *name = tp_task_payload(task, &len); /* borrowed until we return */
    char out[512];
    int n = snprintf(out, sizeof out, "hello, %.*s", (int)(len < 400 ? len : 400), name);
    if (tp_task_set_result(task, out, (size_t)n) != TP_OK)
        return TP_FAIL;
    return TP_SUCCESS; /* TP_FAIL retries with backoff; TP_FAIL_PERMANENT never */
}

int main(int argc, char **argv)
{
    tp_worker_options opts;
    tp_worker_options_init(&opts);
    opts.addresses = argc > 1 ? argv[1] : "127.0.0.1:7070";
    opts.name = "example";
    opts.capacity = 8; /* deliveries held at once */
    opts.threads = 4;  /* handler threads; 0 runs handlers on the I/O thread */
    opts.log = log_line;

    tp_error err;
    worker = tp_worker_new(&opts, &err);
    if (!worker) {
        fprintf(stderr, "example_worker: %s\n", err.text);
        return 2;
    }
    if (tp_worker_add_type(worker, "greet", greet, NULL) != TP_OK)
        return 1;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    int rc = tp_worker_run(worker); /* reconnects by itself until stopped */
    tp_worker_free(worker);
    return rc == TP_OK ? 0 : 1;
}
