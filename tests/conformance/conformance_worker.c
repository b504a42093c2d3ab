/* tp-conformance-worker: the conformance worker of libtaskpush (C). The command line,
 * the payload instructions and the event lines are those of tests/conformance/README.md,
 * the same for the Python, Go and Java conformance workers; tests/conformance/driver.py
 * runs it.
 *
 *   tp-conformance-worker --addr A[,B] --type T --concurrency N [--token T]
 *       [--tls-ca F [--tls-cert F --tls-key F]] [--reconnect-min-ms MS --reconnect-max-ms MS]
 *   tp-conformance-worker --addr A [--token T] [--tls-*] --submit TYPE --payload P
 *       [--dedup K] [--wait]
 */
#include <taskpush.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct conformance {
    pthread_mutex_t out_lock; /* one event line at a time on stdout */
    tp_worker *worker;
    atomic_int done;          /* set by main once tp_worker_run() returned */
} conformance;

static void emit(conformance *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(conformance *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&c->out_lock);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    pthread_mutex_unlock(&c->out_lock);
    va_end(ap);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Sleeps total_ms (or until cancelled: returns 1), extending the lease by its own length
 * every quarter of it when extend is set (returns 2 once the delivery is gone). */
static int sleep_task(tp_task *task, long total_ms, int extend)
{
    uint32_t lease = tp_task_timeout_ms(task);
    long step = extend && lease >= 4 ? (long)lease / 4 : 50;
    long long end = now_ms() + total_ms;
    while (now_ms() < end) {
        long left = (long)(end - now_ms());
        sleep_ms(left < step ? (left > 0 ? left : 0) : step);
        if (tp_task_cancelled(task))
            return 1;
        if (extend && lease > 0 && tp_task_extend(task, lease) != TP_OK)
            return 2;
    }
    return 0;
}

static int fail_with(tp_task *task, const char *text, int outcome)
{
    if (tp_task_set_error(task, text) != TP_OK)
        return TP_FAIL;
    return outcome;
}

static int run_instruction(conformance *c, tp_task *task, const char **outcome)
{
    size_t len;
    const char *payload = tp_task_payload(task, &len);
    char op[32] = "";
    const char *sp = memchr(payload, ' ', len);
    size_t oplen = sp ? (size_t)(sp - payload) : len;
    if (oplen < sizeof op) {
        memcpy(op, payload, oplen);
        op[oplen] = '\0';
    }
    const char *arg = sp ? sp + 1 : "";
    size_t arglen = sp ? len - oplen - 1 : 0;
    const char *sp2 = memchr(arg, ' ', arglen);
    size_t word2 = sp2 ? (size_t)(sp2 - arg) : arglen;
    char argword[256];
    snprintf(argword, sizeof argword, "%.*s", (int)(word2 < 255 ? word2 : 255), arg);
    long number = strtol(argword, NULL, 10);

    if (strcmp(op, "ok") == 0) {
        *outcome = "ok";
        return tp_task_set_result(task, argword, strlen(argword)) == TP_OK ? TP_SUCCESS : TP_FAIL;
    }
    if (strcmp(op, "fail") == 0) {
        *outcome = "fail";
        return fail_with(task, argword, TP_FAIL);
    }
    if (strcmp(op, "fail-permanent") == 0) {
        *outcome = "fail-permanent";
        return fail_with(task, argword, TP_FAIL_PERMANENT);
    }
    if (strcmp(op, "retry-after") == 0) {
        if (tp_task_attempt(task) == 1) {
            *outcome = "retry-after";
            tp_task_set_retry_after(task, (uint32_t)number);
            return fail_with(task, "later", TP_RETRY_AFTER);
        }
        *outcome = "ok";
        return tp_task_set_result(task, "after", 5) == TP_OK ? TP_SUCCESS : TP_FAIL;
    }
    if (strcmp(op, "crash") == 0) {
        /* C has no exception: a handler's crash is a return value that is no tp_outcome. */
        *outcome = "crash";
        return 99;
    }
    if (strcmp(op, "big") == 0 && number > 0 && number <= 16 * 1024 * 1024) {
        char *big = malloc((size_t)number);
        if (big == NULL)
            return TP_FAIL;
        memset(big, 'r', (size_t)number);
        int rc = tp_task_set_result(task, big, (size_t)number);
        free(big);
        *outcome = "ok";
        return rc == TP_OK ? TP_SUCCESS : TP_FAIL;
    }
    if (strcmp(op, "sleep") == 0 || strcmp(op, "wait-cancel") == 0) {
        int waiting = strcmp(op, "wait-cancel") == 0;
        int extend = sp2 != NULL && strncmp(sp2 + 1, "extend", 6) == 0;
        int rc = sleep_task(task, waiting ? 60000 : number, extend);
        if (rc == 1) {
            emit(c, "cancelled %" PRIu64, tp_task_id(task));
            *outcome = "cancelled";
            return fail_with(task, "cancelled", TP_FAIL);
        }
        if (rc == 2) {
            *outcome = "gone";
            return fail_with(task, "gone", TP_FAIL);
        }
        if (waiting) {
            *outcome = "not-cancelled";
            return fail_with(task, "never cancelled", TP_FAIL);
        }
        *outcome = "ok";
        return tp_task_set_result(task, "slept", 5) == TP_OK ? TP_SUCCESS : TP_FAIL;
    }
    *outcome = "unknown";
    return fail_with(task, "unknown instruction", TP_FAIL_PERMANENT);
}

static int handle(tp_task *task, void *arg)
{
    conformance *c = arg;
    emit(c, "start %" PRIu64 " %" PRIu32 " %" PRIu32 " %d %s %lld", tp_task_id(task), tp_task_attempt(task),
         tp_task_epoch(task), tp_task_priority(task), tp_task_type(task), now_ms());
    const char *outcome = "ok";
    int rc = run_instruction(c, task, &outcome);
    emit(c, "end %" PRIu64 " %s %lld", tp_task_id(task), outcome, now_ms());
    return rc;
}

/* Prints `connections N` / `disconnects N` as the counters move, and turns SIGTERM and
 * SIGINT (blocked in every thread, taken here) into tp_worker_stop(). */
static void *watch(void *arg)
{
    conformance *c = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    uint64_t connections = 0, disconnects = 0;
    while (!atomic_load(&c->done)) {
        struct timespec wait = {0, 20 * 1000000L};
        if (sigtimedwait(&set, NULL, &wait) > 0)
            tp_worker_stop(c->worker);
        tp_worker_stats st;
        if (tp_worker_get_stats(c->worker, &st, sizeof st) == TP_OK) {
            if (st.connections != connections)
                emit(c, "connections %" PRIu64, connections = st.connections);
            if (st.disconnects != disconnects)
                emit(c, "disconnects %" PRIu64, disconnects = st.disconnects);
        }
    }
    return NULL;
}

static void *run_thread(void *arg)
{
    conformance *c = arg;
    if (tp_worker_run(c->worker) != TP_OK)
        fprintf(stderr, "tp-conformance-worker: tp_worker_run failed\n");
    return NULL;
}

static int submit_mode(conformance *c, const char *type, const char *payload, const char *dedup, int wait)
{
    pthread_t io;
    if (pthread_create(&io, NULL, run_thread, c) != 0)
        return 1;
    tp_submit_task t;
    tp_submit_task_init(&t);
    t.type = type;
    t.payload = payload;
    t.payload_len = strlen(payload);
    if (dedup != NULL) {
        t.dedup_key = dedup;
        t.dedup_key_len = strlen(dedup);
    }
    tp_submit_result res;
    memset(&res, 0, sizeof res);
    tp_error err;
    int rc = tp_submit(c->worker, &t, 1, wait ? TP_SUBMIT_WAIT : 0, 120000, &res, &err);
    if (rc == TP_EINVAL) {
        emit(c, "refused %s", err.text);
    } else if (rc != TP_OK) {
        fprintf(stderr, "tp_submit: %s\n", err.text);
    } else {
        emit(c, "submitted %" PRIu64 " %s", res.task_id, res.duplicate ? "duplicate" : "new");
        if (wait && res.state != 0)
            emit(c, "outcome %" PRIu64 " %s %.*s", res.task_id,
                 res.state == TP_TASK_SUCCESSFUL ? "successful" : "failed", (int)res.output_len,
                 res.output ? (const char *)res.output : "");
    }
    tp_submit_results_free(&res, 1);
    tp_worker_stop(c->worker);
    pthread_join(io, NULL);
    return rc == TP_OK || rc == TP_EINVAL ? 0 : 1;
}

static void log_line(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "[%d] %s\n", level, msg);
}

int main(int argc, char **argv)
{
    enum { O_ADDR = 1, O_TYPE, O_CONC, O_TOKEN, O_CA, O_CERT, O_KEY, O_RMIN, O_RMAX, O_SUBMIT, O_PAYLOAD,
           O_DEDUP, O_WAIT };
    static const struct option longopts[] = {
        {"addr", required_argument, NULL, O_ADDR},
        {"type", required_argument, NULL, O_TYPE},
        {"concurrency", required_argument, NULL, O_CONC},
        {"token", required_argument, NULL, O_TOKEN},
        {"tls-ca", required_argument, NULL, O_CA},
        {"tls-cert", required_argument, NULL, O_CERT},
        {"tls-key", required_argument, NULL, O_KEY},
        {"reconnect-min-ms", required_argument, NULL, O_RMIN},
        {"reconnect-max-ms", required_argument, NULL, O_RMAX},
        {"submit", required_argument, NULL, O_SUBMIT},
        {"payload", required_argument, NULL, O_PAYLOAD},
        {"dedup", required_argument, NULL, O_DEDUP},
        {"wait", no_argument, NULL, O_WAIT},
        {NULL, 0, NULL, 0},
    };
    tp_worker_options opts;
    tp_worker_options_init(&opts);
    opts.name = "conformance-c";
    opts.reconnect_min_ms = 50;
    opts.reconnect_max_ms = 500;
    opts.log = log_line;
    const char *type = NULL, *submit = NULL, *payload = "", *dedup = NULL;
    unsigned concurrency = 1;
    int wait = 0, opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case O_ADDR: opts.addresses = optarg; break;
        case O_TYPE: type = optarg; break;
        case O_CONC: concurrency = (unsigned)strtoul(optarg, NULL, 10); break;
        case O_TOKEN: opts.token = optarg; break;
        case O_CA: opts.tls = 1; opts.tls_ca_file = optarg; break;
        case O_CERT: opts.tls_cert_file = optarg; break;
        case O_KEY: opts.tls_key_file = optarg; break;
        case O_RMIN: opts.reconnect_min_ms = (unsigned)strtoul(optarg, NULL, 10); break;
        case O_RMAX: opts.reconnect_max_ms = (unsigned)strtoul(optarg, NULL, 10); break;
        case O_SUBMIT: submit = optarg; break;
        case O_PAYLOAD: payload = optarg; break;
        case O_DEDUP: dedup = optarg; break;
        case O_WAIT: wait = 1; break;
        default:
            fprintf(stderr, "usage: see tests/conformance/README.md\n");
            return 2;
        }
    }
    if (opts.addresses == NULL || (submit == NULL && type == NULL) || concurrency < 1) {
        fprintf(stderr, "tp-conformance-worker: --addr and --type (or --submit) are required\n");
        return 2;
    }
    if (opts.reconnect_max_ms < opts.reconnect_min_ms)
        opts.reconnect_max_ms = opts.reconnect_min_ms;
    opts.capacity = concurrency;
    opts.threads = submit != NULL ? 1 : concurrency;

    /* Blocked before any thread starts, so that every thread inherits the mask and only
     * the watcher takes the signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    conformance c = {.out_lock = PTHREAD_MUTEX_INITIALIZER, .worker = NULL, .done = 0};
    tp_error err;
    c.worker = tp_worker_new(&opts, &err);
    if (c.worker == NULL) {
        fprintf(stderr, "tp-conformance-worker: %s\n", err.text);
        return 2;
    }
    if (submit != NULL) {
        int rc = submit_mode(&c, submit, payload, dedup, wait);
        tp_worker_free(c.worker);
        return rc;
    }
    if (tp_worker_add_type(c.worker, type, handle, &c) != TP_OK) {
        tp_worker_free(c.worker);
        return 2;
    }
    pthread_t watcher;
    if (pthread_create(&watcher, NULL, watch, &c) != 0) {
        tp_worker_free(c.worker);
        return 1;
    }
    emit(&c, "ready");
    int rc = tp_worker_run(c.worker);
    atomic_store(&c.done, 1);
    pthread_join(watcher, NULL);
    tp_worker_stats st;
    if (tp_worker_get_stats(c.worker, &st, sizeof st) == TP_OK)
        emit(&c, "exit connections=%" PRIu64 " disconnects=%" PRIu64, st.connections, st.disconnects);
    tp_worker_free(c.worker);
    return rc == TP_OK ? 0 : 1;
}
