/* worker_main.c: taskpush-worker, a ready-made worker built on libtaskpush.
 * For each task it runs /bin/sh -c COMMAND with the payload on stdin (see
 * docs/worker.md and usage() below). */
#include "exec.h"
#include "taskpush.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROG "taskpush-worker"

/* Exit codes: mapped here, and only here. */
#define EXIT_OK 0
#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* The command's exit status for "bad input, never retry" (sysexits EX_DATAERR). */
#define EXIT_PERMANENT 65

#define RESULT_MAX (1u << 20) /* stdout kept as the result: 1 MiB */
#define STDERR_TAIL 4096u     /* stderr kept as the error text */
#define MAX_CONCURRENCY 1024u /* = TP_MAX_THREADS */
#define DEFAULT_KILL_GRACE_MS 2000u

/* parse_args: --help or --version was answered, exit 0 */
#define PARSE_DONE (-1)

extern char **environ;

typedef struct wk_config {
    const char *connect;
    const char *types;
    unsigned concurrency;
    const char *name;
    const char *token_file;
    const char *command;
    int log_level;
    unsigned kill_grace_ms;
    int tls;
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
} wk_config;

/* The worker the signal handlers stop: set once before they are installed. */
static tp_worker *volatile signal_target;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " PROG
            " --connect HOST:PORT[,HOST:PORT...] --type T1[,T2...] --exec 'COMMAND'\n"
            "                       [--concurrency N] [--name NAME] [--token-file PATH]\n"
            "                       [--log-level error|warn|info|debug] [--kill-grace-ms N]\n"
            "                       [--tls [--tls-ca PEM] [--tls-cert PEM --tls-key PEM]]\n"
            "\n"
            "Connects to taskpushd and runs /bin/sh -c COMMAND for each task of the given\n"
            "types, with the payload on stdin and TASKPUSH_TASK_ID, TASKPUSH_TASK_TYPE,\n"
            "TASKPUSH_ATTEMPT and TASKPUSH_EPOCH in the environment; a line\n"
            "'progress N [TEXT]' (N 0..1000) on fd TASKPUSH_PROGRESS_FD (3) reports progress.\n"
            "  exit 0          success: stdout (up to 1 MiB) is the result\n"
            "  exit 65         permanent failure (EX_DATAERR): never retried\n"
            "  anything else   failed attempt, retried with backoff; the last 4 KiB of\n"
            "                  stderr is the error text\n"
            "A command still running when its task times out or is cancelled is killed\n"
            "with its whole process group (SIGTERM, then SIGKILL after the grace time).\n"
            "\n"
            "  -c, --connect LIST      dispatchers, tried in turn (required)\n"
            "  -t, --type LIST         task types this worker takes (required)\n"
            "  -e, --exec COMMAND      the shell command run for each task (required)\n"
            "  -n, --concurrency N     tasks run at once, 1..%u (default 1)\n"
            "      --name NAME         name shown by the dispatcher (default HOSTNAME:PID)\n"
            "      --token-file PATH   file holding the dispatcher's secret (else the\n"
            "                          environment variable TASKPUSH_TOKEN)\n"
            "      --log-level LEVEL   error, warn, info or debug (default info)\n"
            "      --kill-grace-ms N   SIGTERM to SIGKILL delay (default %u)\n"
            "      --tls               connect over TLS (taskpushd --tls-cert); the\n"
            "                          dispatcher's certificate must name the HOST of\n"
            "                          --connect and chain to a trusted CA\n"
            "      --tls-ca PEM        the CAs to trust (default: the system's)\n"
            "      --tls-cert PEM      this worker's certificate (for taskpushd --tls-ca)\n"
            "      --tls-key PEM       its private key\n"
            "  -h, --help              this text\n"
            "  -V, --version           the version\n"
            "\n"
            "SIGTERM or SIGINT: stop taking tasks, finish those held, exit 0. A second\n"
            "signal abandons them (the dispatcher redelivers) and exits once the commands\n"
            "are killed.\n",
            MAX_CONCURRENCY, DEFAULT_KILL_GRACE_MS);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry '" PROG " --help' for more information.\n", stderr);
    return EXIT_USAGE;
}

/* log_line writes one line to stderr: time, level, message. One fprintf per
 * line, so lines from different threads do not interleave. */
static void log_line(int level, const char *msg)
{
    struct timespec ts;
    struct tm tm;
    char when[32];

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ " PROG "[%ld] %s: %s\n", when, ts.tv_nsec / 1000000, (long)getpid(),
            level >= 0 && level <= TP_LOG_DEBUG ? level_names[level] : "?", msg);
}

static void on_library_log(void *arg, int level, const char *msg)
{
    (void)arg;
    log_line(level, msg);
}

typedef struct wk_ctx {
    const wk_config *cfg;
} wk_ctx;

static void wk_log(const wk_ctx *ctx, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void wk_log(const wk_ctx *ctx, int level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (level > ctx->cfg->log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    log_line(level, line);
}

static int parse_level(const char *s)
{
    for (int i = 0; i <= TP_LOG_DEBUG; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

/* parse_uint reads a whole decimal number in [min, max]. */
static int parse_uint(const char *s, unsigned min, unsigned max, unsigned *out)
{
    char *end;
    unsigned long v;

    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = (unsigned)v;
    return 0;
}

/* read_token reads the secret from path, without trailing white space. */
static char *read_token(const char *path, char *why, size_t why_len)
{
    char buf[TP_MAX_TOKEN_LEN + 2];
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL) {
        snprintf(why, why_len, "cannot open token file '%s': %s", path, strerror(errno));
        return NULL;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
    if (n == 0 || n > TP_MAX_TOKEN_LEN || strlen(buf) != n) {
        snprintf(why, why_len, "token file '%s' must hold 1 to %u bytes of text", path,
                 TP_MAX_TOKEN_LEN);
        return NULL;
    }
    return strdup(buf);
}

/* ---- running one task ---- */

static int check_task(void *arg, char *why, size_t why_len)
{
    tp_task *t = arg;

    if (tp_task_cancelled(t)) {
        snprintf(why, why_len, "cancelled (lease expired or connection lost); command killed");
        return 1;
    }
    if (tp_task_remaining_ms(t) <= 0) {
        snprintf(why, why_len, "timed out after %" PRIu32 " ms; command killed",
                 tp_task_timeout_ms(t));
        return 1;
    }
    return 0;
}

/* is_task_var: the variables set per task, removed from the inherited environment. */
static int is_task_var(const char *e)
{
    static const char *const names[] = {
        "TASKPUSH_TASK_ID=", "TASKPUSH_TASK_TYPE=", "TASKPUSH_ATTEMPT=", "TASKPUSH_EPOCH=",
        "TASKPUSH_PROGRESS_FD="};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strncmp(e, names[i], strlen(names[i])) == 0)
            return 1;
    return 0;
}

/* set_error_or_log sets the task's error text; on failure the library's own
 * text ("handler ...") is lost, which only costs a less precise err_msg. */
static void set_error(const wk_ctx *ctx, tp_task *t, const char *msg)
{
    if (tp_task_set_error(t, msg) < 0)
        wk_log(ctx, TP_LOG_WARN, "task %" PRIu64 ": cannot store the error text", tp_task_id(t));
}

/* stderr_tail is the kept tail of stderr, without the pieces of a UTF-8
 * character the cut may have left at its start. */
static const char *stderr_tail(const tpw_exec_res *res)
{
    const char *p = res->err != NULL ? res->err : "";
    int skipped = 0;

    if (res->err_len >= STDERR_TAIL)
        while (skipped < 3 && ((unsigned char)*p & 0xC0) == 0x80) {
            p++;
            skipped++;
        }
    return p;
}

/* A "progress N TEXT" line of the command: the task's progress (a text that is not
 * UTF-8, or a dispatcher older than protocol version 4, and it is dropped). */
static void command_progress(void *arg, unsigned permille, const char *text)
{
    tp_task_progress(arg, permille, text[0] ? text : NULL);
}

static int run_task(tp_task *t, void *arg)
{
    const wk_ctx *ctx = arg;
    int outcome = TP_FAIL;
    char id_var[48];
    char type_var[TP_MAX_TYPE_LEN + 32];
    char attempt_var[48];
    char epoch_var[48];
    char **envp = NULL;
    size_t nenv = 0;
    size_t len = 0;
    const void *payload = tp_task_payload(t, &len);
    tpw_exec_req req;
    tpw_exec_res res;
    char text[STDERR_TAIL + 256];
    int rc;

    memset(&res, 0, sizeof(res));
    snprintf(id_var, sizeof(id_var), "TASKPUSH_TASK_ID=%" PRIu64, tp_task_id(t));
    snprintf(type_var, sizeof(type_var), "TASKPUSH_TASK_TYPE=%s", tp_task_type(t));
    snprintf(attempt_var, sizeof(attempt_var), "TASKPUSH_ATTEMPT=%" PRIu32, tp_task_attempt(t));
    snprintf(epoch_var, sizeof(epoch_var), "TASKPUSH_EPOCH=%" PRIu32, tp_task_epoch(t));
    for (char **e = environ; *e != NULL; e++)
        nenv++;
    envp = calloc(nenv + 6, sizeof(*envp));
    if (envp == NULL) {
        set_error(ctx, t, "worker out of memory");
        goto done;
    }
    nenv = 0;
    for (char **e = environ; *e != NULL; e++)
        if (!is_task_var(*e))
            envp[nenv++] = *e;
    envp[nenv++] = id_var;
    envp[nenv++] = type_var;
    envp[nenv++] = attempt_var;
    envp[nenv++] = epoch_var;
    envp[nenv++] = "TASKPUSH_PROGRESS_FD=3"; /* TPW_PROGRESS_FD */
    envp[nenv] = NULL;

    memset(&req, 0, sizeof(req));
    req.command = ctx->cfg->command;
    req.input = payload;
    req.input_len = len;
    req.envp = envp;
    req.out_max = RESULT_MAX;
    req.err_max = STDERR_TAIL;
    req.kill_grace_ms = ctx->cfg->kill_grace_ms;
    req.check_ms = 50;
    req.check = check_task;
    req.check_arg = t;
    req.progress = command_progress;
    req.progress_arg = t;
    rc = tpw_exec_run(&req, &res);
    if (rc < 0) {
        snprintf(text, sizeof(text), "cannot run /bin/sh: %s", strerror(-rc));
        set_error(ctx, t, text);
        wk_log(ctx, TP_LOG_ERROR, "task %" PRIu64 ": %s", tp_task_id(t), text);
        goto done;
    }
    if (res.killed) {
        snprintf(text, sizeof(text), "%s%s%s", res.why, res.err_len > 0 ? "\n" : "",
                 stderr_tail(&res));
        set_error(ctx, t, text);
        wk_log(ctx, TP_LOG_WARN, "task %" PRIu64 " attempt %" PRIu32 ": %s", tp_task_id(t),
               tp_task_attempt(t), res.why);
        goto done;
    }
    if (WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0) {
        if (res.out_truncated)
            wk_log(ctx, TP_LOG_WARN, "task %" PRIu64 ": stdout cut to %u bytes", tp_task_id(t),
                   RESULT_MAX);
        rc = tp_task_set_result(t, res.out, res.out_len);
        if (rc == TP_ENOMEM) {
            set_error(ctx, t, "worker out of memory storing the result");
            goto done;
        }
        /* TP_ETOOBIG: the library turns the success into a permanent failure. */
        outcome = TP_SUCCESS;
        wk_log(ctx, TP_LOG_DEBUG, "task %" PRIu64 " attempt %" PRIu32 ": success in %" PRId64 " ms",
               tp_task_id(t), tp_task_attempt(t), res.elapsed_ms);
        goto done;
    }
    if (res.err_len > 0)
        snprintf(text, sizeof(text), "%s", stderr_tail(&res));
    else if (WIFEXITED(res.status))
        snprintf(text, sizeof(text), "exit status %d", WEXITSTATUS(res.status));
    else if (WIFSIGNALED(res.status))
        snprintf(text, sizeof(text), "killed by signal %d", WTERMSIG(res.status));
    else
        snprintf(text, sizeof(text), "wait status 0x%x", (unsigned)res.status);
    set_error(ctx, t, text);
    if (WIFEXITED(res.status) && WEXITSTATUS(res.status) == EXIT_PERMANENT)
        outcome = TP_FAIL_PERMANENT;
    wk_log(ctx, TP_LOG_WARN, "task %" PRIu64 " attempt %" PRIu32 ": %s (%s) in %" PRId64 " ms",
           tp_task_id(t), tp_task_attempt(t),
           outcome == TP_FAIL_PERMANENT ? "failed for good" : "failed",
           WIFEXITED(res.status) ? "exit status" : "signal", res.elapsed_ms);
done:
    tpw_exec_res_free(&res);
    free(envp);
    return outcome;
}

/* ---- main ---- */

static void on_signal(int sig)
{
    (void)sig;
    if (signal_target != NULL)
        tp_worker_stop(signal_target);
}

/* keep_std_fds makes sure fds 0-2 are open, so pipes never land on them. */
static void keep_std_fds(void)
{
    int fd;

    do
        fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    while (fd >= 0 && fd <= STDERR_FILENO);
    if (fd > STDERR_FILENO)
        close(fd);
}

static int parse_args(int argc, char **argv, wk_config *cfg)
{
    enum { OPT_NAME = 256, OPT_TOKEN_FILE, OPT_LOG_LEVEL, OPT_KILL_GRACE, OPT_TLS, OPT_TLS_CA,
           OPT_TLS_CERT, OPT_TLS_KEY };
    static const struct option longopts[] = {
        {"connect", required_argument, NULL, 'c'},
        {"type", required_argument, NULL, 't'},
        {"exec", required_argument, NULL, 'e'},
        {"concurrency", required_argument, NULL, 'n'},
        {"name", required_argument, NULL, OPT_NAME},
        {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"kill-grace-ms", required_argument, NULL, OPT_KILL_GRACE},
        {"tls", no_argument, NULL, OPT_TLS},
        {"tls-ca", required_argument, NULL, OPT_TLS_CA},
        {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
        {"tls-key", required_argument, NULL, OPT_TLS_KEY},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:t:e:n:hV", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cfg->connect = optarg;
            break;
        case 't':
            cfg->types = optarg;
            break;
        case 'e':
            cfg->command = optarg;
            break;
        case 'n':
            if (parse_uint(optarg, 1, MAX_CONCURRENCY, &cfg->concurrency) < 0)
                return usage_error("--concurrency must be a number from 1 to %u, not '%s'",
                                   MAX_CONCURRENCY, optarg);
            break;
        case OPT_NAME:
            cfg->name = optarg;
            break;
        case OPT_TOKEN_FILE:
            cfg->token_file = optarg;
            break;
        case OPT_LOG_LEVEL:
            cfg->log_level = parse_level(optarg);
            if (cfg->log_level < 0)
                return usage_error("--log-level must be error, warn, info or debug, not '%s'",
                                   optarg);
            break;
        case OPT_KILL_GRACE:
            if (parse_uint(optarg, 0, 3600000, &cfg->kill_grace_ms) < 0)
                return usage_error("--kill-grace-ms must be a number from 0 to 3600000, not '%s'",
                                   optarg);
            break;
        case OPT_TLS:
            cfg->tls = 1;
            break;
        case OPT_TLS_CA:
            cfg->tls_ca = optarg;
            break;
        case OPT_TLS_CERT:
            cfg->tls_cert = optarg;
            break;
        case OPT_TLS_KEY:
            cfg->tls_key = optarg;
            break;
        case 'h':
            usage(stdout);
            return PARSE_DONE;
        case 'V':
            printf(PROG " %s (libtaskpush %s)\n", TASKPUSH_VERSION, tp_version());
            return PARSE_DONE;
        case ':':
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (cfg->connect == NULL)
        return usage_error("--connect is required");
    if (cfg->types == NULL)
        return usage_error("--type is required");
    if (cfg->command == NULL)
        return usage_error("--exec is required");
    if (cfg->command[0] == '\0')
        return usage_error("--exec must not be empty");
    if (!cfg->tls && (cfg->tls_ca != NULL || cfg->tls_cert != NULL || cfg->tls_key != NULL))
        return usage_error("--tls-ca, --tls-cert and --tls-key go with --tls");
    if ((cfg->tls_cert == NULL) != (cfg->tls_key == NULL))
        return usage_error("%s", cfg->tls_cert != NULL ? "--tls-cert needs --tls-key"
                                                       : "--tls-key needs --tls-cert");
    return 0;
}

/* add_types registers run_task for each type of the comma-separated list. */
static int add_types(tp_worker *w, const char *list, wk_ctx *ctx)
{
    char *copy = strdup(list);
    char *save = NULL;
    int rc = EXIT_USAGE;
    int count = 0;

    if (copy == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        return EXIT_RUNTIME;
    }
    if (list[0] == '\0' || list[0] == ',' || list[strlen(list) - 1] == ',' ||
        strstr(list, ",,") != NULL) {
        usage_error("--type has an empty type in '%s'", list);
        goto done;
    }
    for (char *t = strtok_r(copy, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        int e = tp_worker_add_type(w, t, run_task, ctx);

        if (e == TP_EEXIST)
            continue; /* "a,a" means "a" */
        if (e < 0) {
            usage_error("--type '%s': %s (at most %u types of 1 to %u bytes)", t, tp_strerror(e),
                        TP_MAX_TYPES, TP_MAX_TYPE_LEN);
            goto done;
        }
        count++;
    }
    rc = count > 0 ? 0 : usage_error("--type names no type");
done:
    free(copy);
    return rc;
}

int main(int argc, char **argv)
{
    wk_config cfg = {
        .concurrency = 1, .log_level = TP_LOG_INFO, .kill_grace_ms = DEFAULT_KILL_GRACE_MS};
    wk_ctx ctx = {.cfg = &cfg};
    tp_worker_options opts;
    tp_worker *w = NULL;
    tp_error err;
    char *token = NULL;
    char why[256];
    struct sigaction sa;
    int rc;

    rc = parse_args(argc, argv, &cfg);
    if (rc != 0) {
        rc = rc == PARSE_DONE ? EXIT_OK : rc;
        goto done;
    }
    keep_std_fds();
    if (cfg.token_file != NULL) {
        token = read_token(cfg.token_file, why, sizeof(why));
        if (token == NULL) {
            rc = usage_error("%s", why);
            goto done;
        }
    } else if (getenv("TASKPUSH_TOKEN") != NULL && getenv("TASKPUSH_TOKEN")[0] != '\0') {
        token = strdup(getenv("TASKPUSH_TOKEN"));
        if (token == NULL) {
            fprintf(stderr, PROG ": out of memory\n");
            rc = EXIT_RUNTIME;
            goto done;
        }
    }
    unsetenv("TASKPUSH_TOKEN"); /* the commands need not see the secret */

    tp_worker_options_init(&opts);
    opts.addresses = cfg.connect;
    opts.name = cfg.name;
    opts.token = token;
    opts.capacity = cfg.concurrency;
    opts.threads = cfg.concurrency;
    opts.log_level = cfg.log_level;
    opts.log = on_library_log;
    opts.tls = cfg.tls;
    opts.tls_ca_file = cfg.tls_ca;
    opts.tls_cert_file = cfg.tls_cert;
    opts.tls_key_file = cfg.tls_key;
    w = tp_worker_new(&opts, &err);
    if (w == NULL) {
        rc = err.code == TP_EINVAL ? usage_error("%s", err.text) : EXIT_RUNTIME;
        if (rc == EXIT_RUNTIME)
            fprintf(stderr, PROG ": %s\n", err.text);
        goto done;
    }
    rc = add_types(w, cfg.types, &ctx);
    if (rc != 0)
        goto done;

    signal_target = w;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);

    if (tp_worker_run(w) < 0) {
        log_line(TP_LOG_ERROR, "the worker could not run");
        rc = EXIT_RUNTIME;
        goto done;
    }
    rc = EXIT_OK;
done:
    if (signal_target != NULL) {
        sigset_t stop_signals;

        /* Only this thread is left: keep a late signal away from a freed worker. */
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGTERM);
        sigaddset(&stop_signals, SIGINT);
        pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
        signal_target = NULL;
    }
    tp_worker_free(w);
    free(token);
    return rc;
}
