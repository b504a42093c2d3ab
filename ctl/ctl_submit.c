/* ctl_submit: `taskpushctl submit`, which inserts one task through the dispatcher's
 * worker port (a producer-only libtaskpush client: no database credentials needed):
 *
 *   taskpushctl [--worker HOST:PORT] [--token-file PATH] [--tls [--tls-ca PEM]]
 *               [--admin HOST:PORT (accepted, unused)] submit --type T [--priority P] [--dedup-key K] [--group-key K] [--delay-ms N]
 *               [--after ID[,ID...]] [--max-attempts N] [--timeout-ms N] [--wait] [--wait-ms N] < payload
 *
 * The payload is standard input, byte for byte (at most 16 MiB - 1). Prints the new
 * task's id, or "duplicate ID" when its dedup key is already present; with --wait, then
 * the task's final state and its result or error text. Exit status: 0 inserted (with
 * --wait: SUCCESSFUL) or duplicate, 1 refused, unavailable, no answer or (with --wait)
 * FAILED, 2 a bad command line.
 */
#include "ctl_submit.h"

#include "taskpush.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_WAIT_MS 30000u

typedef struct submit_args {
    const char *worker, *token_file, *tls_ca, *type, *key, *group_key;
    bool tls, wait;
    uint64_t after[TP_MAX_AFTER]; /* --after: the tasks it waits for */
    size_t nafter;
    unsigned long long priority, delay_ms, max_attempts, timeout_ms, wait_ms;
} submit_args;

static int bad(const char *fmt, const char *what)
{
    fprintf(stderr, "taskpushctl submit: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\nTry 'taskpushctl --help'.\n");
    return 2;
}

/* Parses --after's list ID[,ID...] (each 1 .. 2^63 - 1, at most TP_MAX_AFTER in all,
 * repeated options adding up) into a. 0, or 2 with the reason printed. */
static int parse_after(const char *s, submit_args *a)
{
    const char *p = s;
    if (!*p)
        return bad("%s", "--after needs task ids: ID[,ID...]");
    while (*p) {
        size_t len = strcspn(p, ",");
        char digits[24];
        char *end = NULL;
        unsigned long long v;
        if (len == 0 || len > 19 || strspn(p, "0123456789") < len)
            return bad("--after '%s': task ids, decimal, separated by ','", s);
        memcpy(digits, p, len);
        digits[len] = '\0';
        errno = 0;
        v = strtoull(digits, &end, 10);
        if (errno || v == 0 || v > INT64_MAX)
            return bad("--after '%s': a task id is 1 to 9223372036854775807", s);
        if (a->nafter == TP_MAX_AFTER)
            return bad("--after '%s': at most 1000 task ids per task", s);
        a->after[a->nafter++] = v;
        p += len;
        if (*p == ',' && *++p == '\0')
            return bad("--after '%s': a trailing ','", s);
    }
    return 0;
}

/* Parses a decimal number of at most max; returns 0 or -1. */
static int number(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    if (!s || !*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 12)
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return errno || *out > max ? -1 : 0;
}

static int parse(int argc, char **argv, submit_args *a)
{
    static const struct option longopts[] = {
        {"worker", required_argument, NULL, 'w'},    {"token-file", required_argument, NULL, 'k'},
        {"tls", no_argument, NULL, 's'},             {"tls-ca", required_argument, NULL, 'C'},
        {"type", required_argument, NULL, 't'},      {"priority", required_argument, NULL, 'p'},
        {"dedup-key", required_argument, NULL, 'd'}, {"delay-ms", required_argument, NULL, 'D'},
        {"max-attempts", required_argument, NULL, 'm'},
        {"timeout-ms", required_argument, NULL, 'T'}, {"wait", no_argument, NULL, 'W'},
        {"wait-ms", required_argument, NULL, 'M'},   {"group-key", required_argument, NULL, 'g'},
        {"after", required_argument, NULL, 'A'},
        /* The general options, taken before or after the command as by the others:
         * submit goes to --worker, so they change nothing here. */
        {"admin", required_argument, NULL, 'a'},     {"admin-token-file", required_argument, NULL, 'a'},
        {NULL, 0, NULL, 0},
    };
    int c, ncmd = 0;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        switch (c) {
        case 'w': a->worker = optarg; break;
        case 'k': a->token_file = optarg; break;
        case 's': a->tls = true; break;
        case 'C': a->tls_ca = optarg; break;
        case 't': a->type = optarg; break;
        case 'd': a->key = optarg; break;
        case 'g': a->group_key = optarg; break;
        case 'A':
            if (parse_after(optarg, a) != 0)
                return 2;
            break;
        case 'W': a->wait = true; break;
        case 'a': break;
        case 'p':
            if (number(optarg, 2, &a->priority) < 0)
                return bad("--priority '%s': 0 (low), 1 (normal) or 2 (high)", optarg);
            break;
        case 'D':
            if (number(optarg, UINT32_MAX, &a->delay_ms) < 0)
                return bad("--delay-ms '%s': 0 to 4294967295", optarg);
            break;
        case 'm':
            if (number(optarg, TP_MAX_ATTEMPTS, &a->max_attempts) < 0 || a->max_attempts == 0)
                return bad("--max-attempts '%s': 1 to 1000", optarg);
            break;
        case 'T':
            if (number(optarg, INT32_MAX, &a->timeout_ms) < 0 || a->timeout_ms == 0)
                return bad("--timeout-ms '%s': 1 to 2147483647", optarg);
            break;
        case 'M':
            if (number(optarg, 86400000, &a->wait_ms) < 0 || a->wait_ms == 0)
                return bad("--wait-ms '%s': 1 to 86400000", optarg);
            break;
        case ':':
            return bad("option '%s' needs a value", argv[optind - 1]);
        default:
            return bad("unknown option '%s'", argv[optind - 1]);
        }
    }
    for (int i = optind; i < argc; i++)
        ncmd += strcmp(argv[i], "submit") == 0 ? 1 : 100;
    if (ncmd != 1)
        return bad("%s", "usage: submit --type T [--priority P] [--dedup-key K] [--group-key K] [--delay-ms N] [--after ID[,ID...]] < payload");
    if (!a->type || !*a->type || strlen(a->type) > TP_MAX_TYPE_LEN)
        return bad("%s", "--type T is required, 1 to 256 bytes");
    if (a->key && (!*a->key || strlen(a->key) > TP_MAX_DEDUP_KEY_LEN))
        return bad("%s", "--dedup-key must be 1 to 191 bytes");
    if (a->group_key && (!*a->group_key || strlen(a->group_key) > TP_MAX_GROUP_KEY_LEN))
        return bad("%s", "--group-key must be 1 to 191 bytes");
    if (a->tls_ca && !a->tls)
        return bad("%s", "--tls-ca goes with --tls");
    return 0;
}

/* Reads standard input whole, at most TP_MAX_PAYLOAD_LEN bytes. NULL on failure (said). */
static char *read_payload(size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *b = cap > TP_MAX_PAYLOAD_LEN ? NULL : realloc(buf, cap * 2);
            if (!b) {
                fprintf(stderr, "taskpushctl submit: the payload is larger than %u bytes\n", TP_MAX_PAYLOAD_LEN);
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, stdin);
        n += k;
        if (k == 0)
            break;
    }
    if (buf && (ferror(stdin) || n > TP_MAX_PAYLOAD_LEN)) {
        fprintf(stderr, "taskpushctl submit: %s\n", ferror(stdin) ? "cannot read standard input"
                                                                : "the payload is larger than 16777215 bytes");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static char *read_first_line(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[2048];
    if (!f) {
        fprintf(stderr, "taskpushctl submit: --token-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    return strdup(buf);
}

static void *run_thread(void *arg)
{
    if (tp_worker_run(arg) < 0)
        tp_worker_stop(arg);
    return NULL;
}

/* Where libtaskpush's log goes: errors and warnings only, on stderr. */
static void log_line(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    fprintf(stderr, "taskpushctl submit: %s\n", msg);
}

int ctl_submit_main(int argc, char **argv)
{
    submit_args a = {.priority = 1, .wait_ms = DEFAULT_WAIT_MS};
    int rc = parse(argc, argv, &a);
    if (rc)
        return rc;
    if (!a.worker)
        a.worker = getenv("TASKPUSH_WORKER") ? getenv("TASKPUSH_WORKER") : "127.0.0.1:7070";
    char *token = a.token_file ? read_first_line(a.token_file) : NULL;
    if (a.token_file && !token)
        return 1;
    size_t plen = 0;
    char *payload = read_payload(&plen);
    if (!payload) {
        free(token);
        return 1;
    }
    tp_worker_options o;
    tp_worker_options_init(&o);
    o.addresses = a.worker;
    o.name = "taskpushctl";
    o.token = token;
    o.tls = a.tls;
    o.tls_ca_file = a.tls_ca;
    o.log = log_line;
    o.log_level = TP_LOG_ERROR;
    /* One round over the addresses: a refused connection or the wrong port is said at
     * once, not after --wait-ms (the reason is in the error: "Connection refused"). */
    o.submit_give_up_rounds = 1;
    tp_error err;
    tp_worker *w = tp_worker_new(&o, &err);
    free(token);
    if (!w) {
        fprintf(stderr, "taskpushctl submit: --worker %s: %s\n", a.worker, err.text);
        free(payload);
        return 2;
    }
    pthread_t thr;
    if (pthread_create(&thr, NULL, run_thread, w) != 0) {
        fprintf(stderr, "taskpushctl submit: cannot start a thread\n");
        tp_worker_free(w);
        free(payload);
        return 1;
    }
    tp_submit_task t;
    tp_submit_task_init(&t);
    t.type = a.type;
    t.payload = payload;
    t.payload_len = plen;
    t.dedup_key = a.key;
    t.dedup_key_len = a.key ? strlen(a.key) : 0;
    t.priority = (int)a.priority;
    t.delay_ms = (uint32_t)a.delay_ms;
    t.max_attempts = (unsigned)a.max_attempts;
    t.timeout_ms = (uint32_t)a.timeout_ms;
    tp_submit_result r;
    tp_group_key gk = {a.group_key, a.group_key ? strlen(a.group_key) : 0};
    tp_task_after after = {a.after, a.nafter};
    int src = tp_submit_after(w, &t, &gk, a.nafter ? &after : NULL, 1, a.wait ? TP_SUBMIT_WAIT : 0,
                              (unsigned)a.wait_ms, &r, &err);
    rc = 1;
    if (src != 0) {
        fprintf(stderr, "taskpushctl submit: %s: %s\n", tp_strerror(src), err.text);
        if (src == TP_ETIMEDOUT && r.task_id)
            printf("%" PRIu64 "\n", r.task_id); /* inserted; its outcome did not come in time */
    } else if (r.duplicate) {
        printf("duplicate %" PRIu64 "\n", r.task_id);
        rc = 0;
    } else {
        printf("%" PRIu64 "\n", r.task_id);
        rc = 0;
        if (a.wait) {
            printf("%s\n", r.state == TP_TASK_SUCCESSFUL ? "SUCCESSFUL" : "FAILED");
            if (r.output_len)
                fwrite(r.output, 1, r.output_len, stdout);
            if (r.output_len)
                printf("\n");
            rc = r.state == TP_TASK_SUCCESSFUL ? 0 : 1;
        }
    }
    tp_submit_results_free(&r, 1);
    tp_worker_stop(w);
    pthread_join(thr, NULL);
    tp_worker_free(w);
    free(payload);
    fflush(stdout);
    return rc;
}
