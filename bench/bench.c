/* bench.c: taskpush-bench's main(): the flags, the designs table, the interleaved
 * rounds of runs, one JSON line per run and the Markdown table of medians at the
 * end; --mode other than drain hands over to modes.c. Exit status: 0 when every run verified, 1 when one did not (or a run could
 * not be set up), 2 for a bad flag. */
#include "bench.h"
#include "tables.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

const bench_design bench_designs[] = {
    {"cas", bench_drain_poll, true, false, 1, true, false, NULL, false},
    {"cas-backoff", bench_drain_poll, true, false, 1, true, true, NULL, false},
    {"skiplocked-1", bench_drain_poll, true, false, 1, false, false, NULL, false},
    {"skiplocked-10", bench_drain_poll, true, false, 10, false, false, NULL, false},
    {"ceiling", bench_drain_poll, false, true, 1000, false, false, NULL, false},
    {"taskpush-rr", bench_drain_taskpush, false, false, 0, false, false, "round-robin", false},
    {"taskpush-ll", bench_drain_taskpush, false, false, 0, false, false, "least-loaded", false},
    /* taskpush-ll on a preload where 2 % of the rows wait on others (fan-ins of 98 and
     * chains, bench_db_add_deps): what dependencies cost a drain. Opt-in. */
    {"taskpush-deps", bench_drain_taskpush, false, false, 0, false, false, "least-loaded", true},
};
const size_t bench_ndesigns = sizeof bench_designs / sizeof bench_designs[0];

#define DEFAULT_N 200000u
#define DEFAULT_N_POLL 10000u
/* The polling designs crawl at K >= 64 (100-400 tasks/s: a run of 10,000 rows took
 * 30 s to 3 min each); 2,000 rows still take several seconds there. */
#define DEFAULT_N_POLL_LARGE_K 2000u
/* A polling run stops claiming after this long (--poll-seconds): a design that
 * collapses must not hold the comparison for an hour (designs_poll.c). */
#define DEFAULT_POLL_SECONDS 60u
#define QUICK_N 2000u
#define QUICK_N_POLL 400u
/* The modes beyond the drain: full size, and --quick's. */
#define MODE_K 64u
#define QUICK_MODE_K 16u
#define DEFAULT_PRODUCERS 4u
#define QUICK_PRODUCERS 2u
#define DEFAULT_SECONDS 10u
#define QUICK_SECONDS 2u
#define DEFAULT_INTERVAL_MS 20u
#define DEFAULT_CONNECTIONS 10000u
#define QUICK_CONNECTIONS 200u
#define MAX_CONNECTIONS 100000u
#define DEFAULT_BACKLOG 10000000u
#define QUICK_BACKLOG 20000u
/* mixed and soak (mode_mixed.c) */
#define MIXED_SUBMIT_PRODUCERS 64u
#define QUICK_MIXED_SUBMIT_PRODUCERS 8u
#define SOAK_SECONDS 600u
#define QUICK_SOAK_SECONDS 15u
#define MAX_PAYLOAD_BYTES 65536u /* 100 rows of it stay under max_allowed_packet (16 MB) */

static const char *const mode_names[] = {"drain", "stream", "latency", "connections", "backlog",
                                          "mixed", "soak"};

enum { OPT_DB = 1000, OPT_DESIGN, OPT_K, OPT_N, OPT_N_POLL, OPT_REPEAT, OPT_CAPACITY, OPT_FLAT,
       OPT_TASKPUSHD, OPT_QUICK, OPT_JSON_ONLY, OPT_SABOTAGE, OPT_HOLD_ROW, OPT_HELP, OPT_MODE, OPT_PRODUCERS,
       OPT_ROWS_PER_INSERT, OPT_SECONDS, OPT_INTERVAL_MS, OPT_POLL_MS, OPT_WAKE, OPT_LOAD_RATE, OPT_CONNECTIONS,
       OPT_BACKLOG_ROWS, OPT_TASKPUSHD_ARG, OPT_PRODUCER, OPT_WORKER_THREADS, OPT_POLL_SECONDS, OPT_TABLE,
       OPT_GROUP_KEYS, OPT_PAYLOAD_BYTES, OPT_SUBMIT_PRODUCERS };

static const struct option long_opts[] = {
    {"db", required_argument, NULL, OPT_DB},
    {"design", required_argument, NULL, OPT_DESIGN},
    {"k", required_argument, NULL, OPT_K},
    {"n", required_argument, NULL, OPT_N},
    {"n-poll", required_argument, NULL, OPT_N_POLL},
    {"poll-seconds", required_argument, NULL, OPT_POLL_SECONDS},
    {"repeat", required_argument, NULL, OPT_REPEAT},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"flat", no_argument, NULL, OPT_FLAT},
    {"worker-threads", required_argument, NULL, OPT_WORKER_THREADS},
    {"taskpushd", required_argument, NULL, OPT_TASKPUSHD},
    {"quick", no_argument, NULL, OPT_QUICK},
    {"json-only", no_argument, NULL, OPT_JSON_ONLY},
    {"sabotage", no_argument, NULL, OPT_SABOTAGE}, /* hidden: for the verification test */
    {"hold-row", no_argument, NULL, OPT_HOLD_ROW}, /* hidden: for the cut's test */
    {"help", no_argument, NULL, OPT_HELP},
    {"mode", required_argument, NULL, OPT_MODE},
    {"producers", required_argument, NULL, OPT_PRODUCERS},
    {"rows-per-insert", required_argument, NULL, OPT_ROWS_PER_INSERT},
    {"seconds", required_argument, NULL, OPT_SECONDS},
    {"interval-ms", required_argument, NULL, OPT_INTERVAL_MS},
    {"poll-ms", required_argument, NULL, OPT_POLL_MS},
    {"wake", required_argument, NULL, OPT_WAKE},
    {"load-rate", required_argument, NULL, OPT_LOAD_RATE},
    {"connections", required_argument, NULL, OPT_CONNECTIONS},
    {"backlog-rows", required_argument, NULL, OPT_BACKLOG_ROWS},
    {"taskpushd-arg", required_argument, NULL, OPT_TASKPUSHD_ARG},
    {"producer", required_argument, NULL, OPT_PRODUCER},
    {"table", required_argument, NULL, OPT_TABLE},
    {"group-keys", required_argument, NULL, OPT_GROUP_KEYS},
    {"payload-bytes", required_argument, NULL, OPT_PAYLOAD_BYTES},
    {"submit-producers", required_argument, NULL, OPT_SUBMIT_PRODUCERS},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f)
{
    fprintf(f,
        "usage: taskpush-bench [options]\n"
        "Drains N preloaded tasks with each design and prints one JSON line per run\n"
        "and a Markdown table of medians (see bench/README.md).\n"
        "  --db URL          mysql://USER[:PASSWORD]@HOST[:PORT]/DBNAME; DBNAME is a scratch\n"
        "                    database, dropped and re-created for every run (default: the\n"
        "                    TASKPUSH_TEST_MYSQL_* environment of scripts/tp-mariadb, database\n"
        "                    taskpush_bench_PID)\n"
        "  --design LIST     comma-separated, from: cas, cas-backoff, skiplocked-1,\n"
        "                    skiplocked-10, ceiling, taskpush-rr, taskpush-ll (default all\n"
        "                    of these), and taskpush-deps: taskpush-ll where 2 %% of the\n"
        "                    rows wait on others (fan-ins of 98, chains; opt-in)\n"
        "  --k LIST          clients or workers, comma-separated (default 4,16,64,256)\n"
        "  --n N             tasks per run for taskpush and the ceiling (default %u)\n"
        "  --n-poll N        tasks per run for the polling designs (default %u, and %u at\n"
        "                    K >= %u; given, at every K; at most N)\n"
        "  --poll-seconds S  a polling run stops claiming after S s (a claim still running\n"
        "                    2 s later is interrupted) and its figures are over the rows\n"
        "                    it did, marked cut (default %u; 0: never)\n"
        "  --repeat R        interleaved rounds; each figure is the median (default 3)\n"
        "  --capacity C      taskpush: capacity of each worker (default 16)\n"
        "  --flat            taskpush: total capacity %u at every K (capacity %u/K)\n"
        "  --worker-threads T taskpush: threads the K workers share, each running its\n"
        "                    share on one event loop (tp_worker_run_many); 0: one thread\n"
        "                    per worker (default %u)\n"
        "  --taskpushd PATH  the taskpushd to run (default: the one built or installed\n"
        "                    next to taskpush-bench)\n"
        "  --taskpushd-arg A one more argument for every taskpushd started, e.g.\n"
        "                    --taskpushd-arg=--table-stats-ms=60000 (up to %d)\n"
        "  --quick           N=%u (%u polling), K=4,64, repeat 1: a check, not a figure\n"
        "  --table NAME      the task table's name (taskpushd --table NAME): the schema is\n"
        "                    made, seeded, drained and verified under it (default task;\n"
        "                    the taskpush designs and the modes only)\n"
        "  --group-keys N    the drain's rows get N group keys in turn (fair share: the\n"
        "                    claim rotates between them); 0: none (default; MariaDB;\n"
        "                    the taskpush designs only)\n"
        "  --json-only       print only the JSON lines\n"
        "  --help            this text\n"
        "Modes (--mode; the flags above apply to drain unless named below):\n"
        "  --mode M          drain (default), stream, latency, connections, backlog, mixed\n"
        "                    or soak\n"
        "  --k K             stream, connections, backlog, mixed, soak: active workers\n"
        "                    (default %u)\n"
        "  --capacity C      their capacity (default 16)\n"
        "  --n N             connections: tasks drained; backlog: the slice drained\n"
        "                    (default 200000)\n"
        "  --producers P     stream: producer connections; mixed, soak: producers of each\n"
        "                    of the four kinds (default %u)\n"
        "  --producer LIST   stream, latency: sql (INSERT on the producer's own connection)\n"
        "                    and/or submit (tp_submit through taskpushd), one run each\n"
        "                    (default sql,submit)\n"
        "  --rows-per-insert LIST  stream: rows per INSERT or per submit (at most 1000),\n"
        "                    one run each (default 1,10)\n"
        "  --seconds S       stream: each window; latency: inserting (default %u);\n"
        "                    mixed: each window (default %u); soak: the paced window\n"
        "                    (default %u, quick %u)\n"
        "  --payload-bytes LIST  mixed: payload and result bytes, one result each (default\n"
        "                    0,1024,16384; 0: the 20-byte header only; at most %u);\n"
        "                    soak: the first (default 1024); mixed \"none\": the\n"
        "                    submit-only window alone\n"
        "  --submit-producers N  mixed: producers of single-task SUBMITs alone, one result\n"
        "                    (default %u, quick %u; 0: none)\n"
        "  --interval-ms MS  latency: one task every MS (default %u)\n"
        "  --poll-ms LIST    latency: taskpushd --poll-ms, one run each (default 100,10)\n"
        "  --wake LIST       latency: taskpushd --wake (poll, binlog, auto), one run per\n"
        "                    --poll-ms each (default poll; binlog needs a server with a\n"
        "                    binary log: bench/run.sh --binlog ROW)\n"
        "  --load-rate R     latency, sql: after the tasks, R inserts/s for the window\n"
        "                    (quick: 1 s, else 3 s) and the statements/s that costs\n"
        "                    (default 1000; 0: none)\n"
        "  --connections C   connections: idle workers (default %u)\n"
        "  --backlog-rows N  backlog: NEW rows waiting (default %u)\n"
        "  --quick           with a mode: K=%u, P=%u, %u s, %u connections, %u rows, N=%u\n",
        DEFAULT_N, DEFAULT_N_POLL, DEFAULT_N_POLL_LARGE_K, BENCH_LARGE_K, DEFAULT_POLL_SECONDS,
        BENCH_FLAT_SLOTS,
        BENCH_FLAT_SLOTS, BENCH_WORKER_THREADS, BENCH_MAX_TPD_ARGS, QUICK_N,
        QUICK_N_POLL, MODE_K, DEFAULT_PRODUCERS, DEFAULT_SECONDS, DEFAULT_SECONDS, SOAK_SECONDS,
        QUICK_SOAK_SECONDS, MAX_PAYLOAD_BYTES, MIXED_SUBMIT_PRODUCERS, QUICK_MIXED_SUBMIT_PRODUCERS,
        DEFAULT_INTERVAL_MS, DEFAULT_CONNECTIONS,
        DEFAULT_BACKLOG, QUICK_MODE_K, QUICK_PRODUCERS, QUICK_SECONDS, QUICK_CONNECTIONS,
        QUICK_BACKLOG, QUICK_N);
}

static int bad_flag(const char *fmt, const char *arg)
{
    fprintf(stderr, "taskpush-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(taskpush-bench --help lists the flags)\n");
    return 2;
}

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_designs(const char *arg, bench_opts *o)
{
    char buf[256];
    if (strlen(arg) >= sizeof buf)
        return -1;
    strcpy(buf, arg);
    o->ndesigns = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < bench_ndesigns && strcmp(bench_designs[i].name, tok) != 0)
            i++;
        if (i == bench_ndesigns || o->ndesigns == (int)(sizeof o->designs / sizeof o->designs[0]))
            return -1;
        o->designs[o->ndesigns++] = &bench_designs[i];
    }
    return o->ndesigns > 0 ? 0 : -1;
}

/* A comma-separated list of up to BENCH_MAX_LIST numbers in [min, max]. */
static int parse_list(const char *arg, unsigned min, unsigned max, unsigned *out, int *nout)
{
    char buf[256];
    if (strlen(arg) >= sizeof buf)
        return -1;
    strcpy(buf, arg);
    *nout = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (*nout == BENCH_MAX_LIST || parse_u64(tok, min, max, &v) < 0)
            return -1;
        out[(*nout)++] = (unsigned)v;
    }
    return *nout > 0 ? 0 : -1;
}

const char *const bench_producer_names[] = {"sql", "submit"};

/* --producer sql,submit: each at most once, in the order given. */
static int parse_producers(const char *arg, bench_opts *o)
{
    o->nproducer_kinds = 0;
    for (const char *p = arg; *p;) {
        size_t len = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < 2; i++)
            if (strlen(bench_producer_names[i]) == len && strncmp(p, bench_producer_names[i], len) == 0)
                found = i;
        for (int i = 0; found >= 0 && i < o->nproducer_kinds; i++)
            if (o->producer_kinds[i] == (bench_producer)found)
                found = -1;
        if (found < 0 || o->nproducer_kinds == 2)
            return -1;
        o->producer_kinds[o->nproducer_kinds++] = (bench_producer)found;
        p += len;
        if (*p == ',' && *++p == '\0')
            return -1;
    }
    return o->nproducer_kinds > 0 ? 0 : -1;
}

static int parse_mode(const char *arg, bench_opts *o)
{
    for (size_t i = 0; i < sizeof mode_names / sizeof mode_names[0]; i++)
        if (strcmp(arg, mode_names[i]) == 0) {
            o->mode = (bench_mode)i;
            return 0;
        }
    return -1;
}

/* The taskpushd next to this program: the build tree's dispatcher/ or the same bin/. */
static void default_taskpushd(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    snprintf(out, cap, "taskpushd"); /* last resort: $PATH */
    if (len <= 0)
        return;
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return;
    *slash = '\0';
    char cand[PATH_MAX + 64];
    snprintf(cand, sizeof cand, "%s/../dispatcher/taskpushd", self);
    if (access(cand, X_OK) == 0 && strlen(cand) < cap) {
        snprintf(out, cap, "%s", cand);
        return;
    }
    snprintf(cand, sizeof cand, "%s/taskpushd", self);
    if (access(cand, X_OK) == 0 && strlen(cand) < cap)
        snprintf(out, cap, "%s", cand);
}

static int db_from_env(bench_dbconf *c)
{
    const char *host = getenv("TASKPUSH_TEST_MYSQL_HOST");
    const char *port = getenv("TASKPUSH_TEST_MYSQL_PORT");
    const char *user = getenv("TASKPUSH_TEST_MYSQL_USER");
    const char *pw = getenv("TASKPUSH_TEST_MYSQL_PASSWORD");
    uint64_t p;

    memset(c, 0, sizeof *c);
    if (!host || !port || !user || parse_u64(port, 1, 65535, &p) < 0 ||
        strlen(host) >= sizeof c->host || strlen(user) >= sizeof c->user ||
        (pw && strlen(pw) >= sizeof c->password))
        return -1;
    strcpy(c->host, host);
    strcpy(c->user, user);
    if (pw)
        strcpy(c->password, pw);
    c->port = (unsigned)p;
    snprintf(c->dbname, sizeof c->dbname, "taskpush_bench_%d", (int)getpid());
    return 0;
}

/* What was not given on the command line: the full comparison, or --quick's. */
static void apply_defaults(bench_opts *o, bool quick, bool set_k, bool set_n, bool set_np,
                           bool set_r)
{
    if (o->ndesigns == 0)
        for (size_t i = 0; i < bench_ndesigns; i++)
            if (!bench_designs[i].deps)
                o->designs[o->ndesigns++] = &bench_designs[i];
    if (!set_k) {
        static const unsigned def_k[] = {4, 16, 64, 256}, quick_k[] = {4, 64};
        const unsigned *ks = quick ? quick_k : def_k;
        o->nks = quick ? 2 : 4;
        memcpy(o->ks, ks, (size_t)o->nks * sizeof *ks);
    }
    if (!set_n)
        o->n = quick ? QUICK_N : DEFAULT_N;
    if (!set_np)
        o->n_poll = quick ? QUICK_N_POLL : DEFAULT_N_POLL;
    if (o->n_poll > o->n)
        o->n_poll = o->n;
    o->n_poll_large_k = o->n_poll;
    if (!set_np && o->n_poll_large_k > DEFAULT_N_POLL_LARGE_K)
        o->n_poll_large_k = DEFAULT_N_POLL_LARGE_K;
    if (!set_r)
        o->repeat = quick ? 1 : 3;
    o->quick = quick;
}

/* The modes' sizes that were not given. */
static void apply_mode_defaults(bench_opts *o, bool quick, bool set_k, bool set_n)
{
    if (!set_k) {
        o->ks[0] = quick ? QUICK_MODE_K : MODE_K;
        o->nks = 1;
    }
    if (!set_n)
        o->n = quick ? QUICK_N : DEFAULT_N;
    if (o->producers == 0)
        o->producers = quick ? QUICK_PRODUCERS : DEFAULT_PRODUCERS;
    if (o->nrows_per_insert == 0) {
        o->rows_per_insert[0] = 1;
        o->rows_per_insert[1] = 10;
        o->nrows_per_insert = 2;
    }
    if (o->seconds == 0 && o->mode == BENCH_MODE_SOAK)
        o->seconds = quick ? QUICK_SOAK_SECONDS : SOAK_SECONDS;
    if (o->seconds == 0)
        o->seconds = quick ? QUICK_SECONDS : DEFAULT_SECONDS;
    if (o->npayload_bytes == 0 && !o->payload_bytes_none) {
        static const unsigned sizes[] = {0, 1024, 16384};
        o->npayload_bytes = o->mode == BENCH_MODE_SOAK ? 1 : 3;
        memcpy(o->payload_bytes, o->mode == BENCH_MODE_SOAK ? sizes + 1 : sizes,
               (size_t)o->npayload_bytes * sizeof *sizes);
    }
    if (!o->submit_producers_set)
        o->submit_producers = quick ? QUICK_MIXED_SUBMIT_PRODUCERS : MIXED_SUBMIT_PRODUCERS;
    if (o->interval_ms == 0)
        o->interval_ms = DEFAULT_INTERVAL_MS;
    if (o->nproducer_kinds == 0) {
        o->producer_kinds[0] = BENCH_PRODUCER_SQL;
        o->producer_kinds[1] = BENCH_PRODUCER_SUBMIT;
        o->nproducer_kinds = 2;
    }
    if (o->npoll_ms == 0) {
        o->poll_ms[0] = 100;
        o->poll_ms[1] = 10;
        o->npoll_ms = 2;
    }
    if (o->nwake == 0) {
        o->wake[0] = "poll";
        o->nwake = 1;
    }
    if (!o->load_rate_set)
        o->load_rate = 1000;
    if (o->connections == 0)
        o->connections = quick ? QUICK_CONNECTIONS : DEFAULT_CONNECTIONS;
    if (o->backlog_rows == 0)
        o->backlog_rows = quick ? QUICK_BACKLOG : DEFAULT_BACKLOG;
}

/* Parses argv into o. Returns 0, or the exit status (2 for a bad flag, 0 for --help)
 * plus one as a negative number, to keep 0 meaning "go on". */
static int parse_flags(int argc, char **argv, bench_opts *o)
{
    const char *table = NULL;
    unsigned group_keys = 0;
    bool have_db = false, set_n = false, set_np = false, set_k = false, set_r = false;
    bool quick = false;
    uint64_t v;
    char err[160];

    memset(o, 0, sizeof *o);
    o->capacity = 16;
    o->worker_threads = BENCH_WORKER_THREADS;
    o->poll_seconds = DEFAULT_POLL_SECONDS;
    default_taskpushd(o->taskpushd, sizeof o->taskpushd);
    int c;
    while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
        switch (c) {
        case OPT_DB:
            if (bench_parse_url(optarg, &o->db, err, sizeof err) < 0)
                return -bad_flag("%s", err) - 1;
            have_db = true;
            break;
        case OPT_DESIGN:
            if (parse_designs(optarg, o) < 0)
                return -bad_flag("--design: unknown design in '%s'", optarg) - 1;
            break;
        case OPT_K:
            if (parse_list(optarg, 1, BENCH_MAX_K, o->ks, &o->nks) < 0)
                return -bad_flag("--k: want up to 16 numbers 1..4096, got '%s'", optarg) - 1;
            set_k = true;
            break;
        case OPT_N:
        case OPT_N_POLL:
            if (parse_u64(optarg, 1, BENCH_MAX_N, &v) < 0)
                return -bad_flag("--n/--n-poll: want 1..100000000, got '%s'", optarg) - 1;
            *(c == OPT_N ? &o->n : &o->n_poll) = v;
            *(c == OPT_N ? &set_n : &set_np) = true;
            break;
        case OPT_REPEAT:
            if (parse_u64(optarg, 1, 99, &v) < 0)
                return -bad_flag("--repeat: want 1..99, got '%s'", optarg) - 1;
            o->repeat = (unsigned)v;
            set_r = true;
            break;
        case OPT_CAPACITY:
            if (parse_u64(optarg, 1, 65536, &v) < 0)
                return -bad_flag("--capacity: want 1..65536, got '%s'", optarg) - 1;
            o->capacity = (unsigned)v;
            break;
        case OPT_FLAT: o->flat = true; break;
        case OPT_WORKER_THREADS:
            if (parse_u64(optarg, 0, BENCH_MAX_K, &v) < 0)
                return -bad_flag("--worker-threads: want 0..4096, got '%s'", optarg) - 1;
            o->worker_threads = (unsigned)v;
            break;
        case OPT_POLL_SECONDS:
            if (parse_u64(optarg, 0, 86400, &v) < 0)
                return -bad_flag("--poll-seconds: want 0..86400, got '%s'", optarg) - 1;
            o->poll_seconds = (unsigned)v;
            break;
        case OPT_TASKPUSHD:
            if (strlen(optarg) == 0 || strlen(optarg) >= sizeof o->taskpushd)
                return -bad_flag("--taskpushd: bad path '%s'", optarg) - 1;
            strcpy(o->taskpushd, optarg);
            break;
        case OPT_TASKPUSHD_ARG:
            if (o->ntaskpushd_args == BENCH_MAX_TPD_ARGS || optarg[0] == '\0')
                return -bad_flag("--taskpushd-arg: at most 8, none empty ('%s')", optarg) - 1;
            o->taskpushd_args[o->ntaskpushd_args++] = optarg;
            break;
        case OPT_QUICK: quick = true; break;
        case OPT_JSON_ONLY: o->json_only = true; break;
        case OPT_SABOTAGE: o->sabotage = true; break;
        case OPT_HOLD_ROW: o->hold_row = true; break;
        case OPT_HELP: usage(stdout); return -1;
        case OPT_MODE:
            if (parse_mode(optarg, o) < 0)
                return -bad_flag("--mode: want drain, stream, latency, connections, backlog, "
                                 "mixed or soak, got '%s'", optarg) - 1;
            break;
        case OPT_PRODUCERS:
            if (parse_u64(optarg, 1, 1024, &v) < 0)
                return -bad_flag("--producers: want 1..1024, got '%s'", optarg) - 1;
            o->producers = (unsigned)v;
            break;
        case OPT_TABLE:
            if (!dsp_table_name_valid(optarg, strlen(optarg)))
                return -bad_flag("--table: a table name is 1 to 36 bytes of A-Z, a-z, 0-9 and _,"
                                 " not starting with a digit, got '%s'", optarg) - 1;
            table = optarg;
            break;
        case OPT_GROUP_KEYS:
            if (parse_u64(optarg, 0, 1000000, &v) < 0)
                return -bad_flag("--group-keys: want 0..1000000, got '%s'", optarg) - 1;
            group_keys = (unsigned)v;
            break;
        case OPT_PRODUCER:
            if (parse_producers(optarg, o) < 0)
                return -bad_flag("--producer: want sql, submit or sql,submit, got '%s'", optarg) - 1;
            break;
        case OPT_ROWS_PER_INSERT:
            if (parse_list(optarg, 1, 10000, o->rows_per_insert, &o->nrows_per_insert) < 0)
                return -bad_flag("--rows-per-insert: want up to 16 numbers 1..10000, got '%s'",
                                 optarg) - 1;
            break;
        case OPT_SECONDS:
            if (parse_u64(optarg, 1, 3600, &v) < 0)
                return -bad_flag("--seconds: want 1..3600, got '%s'", optarg) - 1;
            o->seconds = (unsigned)v;
            break;
        case OPT_INTERVAL_MS:
            if (parse_u64(optarg, 1, 60000, &v) < 0)
                return -bad_flag("--interval-ms: want 1..60000, got '%s'", optarg) - 1;
            o->interval_ms = (unsigned)v;
            break;
        case OPT_POLL_MS:
            if (parse_list(optarg, 1, 3600000, o->poll_ms, &o->npoll_ms) < 0)
                return -bad_flag("--poll-ms: want up to 16 numbers 1..3600000, got '%s'", optarg) - 1;
            break;
        case OPT_WAKE: {
            static const char *const names[] = {"poll", "binlog", "auto"};
            char copy[64];
            snprintf(copy, sizeof copy, "%s", optarg);
            o->nwake = 0;
            for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                int k = -1;
                for (int i = 0; i < 3; i++)
                    if (strcmp(tok, names[i]) == 0)
                        k = i;
                if (k < 0 || o->nwake >= 3)
                    return -bad_flag("--wake: want a list of poll, binlog, auto, got '%s'", optarg) - 1;
                o->wake[o->nwake++] = names[k];
            }
            break;
        }
        case OPT_LOAD_RATE:
            if (parse_u64(optarg, 0, 100000, &v) < 0)
                return -bad_flag("--load-rate: want 0..100000, got '%s'", optarg) - 1;
            o->load_rate = (unsigned)v;
            o->load_rate_set = true;
            break;
        case OPT_CONNECTIONS:
            if (parse_u64(optarg, 1, MAX_CONNECTIONS, &v) < 0)
                return -bad_flag("--connections: want 1..100000, got '%s'", optarg) - 1;
            o->connections = (unsigned)v;
            break;
        case OPT_BACKLOG_ROWS:
            if (parse_u64(optarg, 1, BENCH_MAX_N, &v) < 0)
                return -bad_flag("--backlog-rows: want 1..100000000, got '%s'", optarg) - 1;
            o->backlog_rows = v;
            break;
        case OPT_PAYLOAD_BYTES:
            /* "none": mixed runs its submit-only window alone (with the drains). */
            o->payload_bytes_none = strcmp(optarg, "none") == 0;
            if (o->payload_bytes_none) {
                o->npayload_bytes = 0;
                break;
            }
            if (parse_list(optarg, 0, MAX_PAYLOAD_BYTES, o->payload_bytes, &o->npayload_bytes) < 0)
                return -bad_flag("--payload-bytes: want up to 16 numbers 0..65536, got '%s'",
                                 optarg) - 1;
            break;
        case OPT_SUBMIT_PRODUCERS:
            if (parse_u64(optarg, 0, 1024, &v) < 0)
                return -bad_flag("--submit-producers: want 0..1024, got '%s'", optarg) - 1;
            o->submit_producers = (unsigned)v;
            o->submit_producers_set = true;
            break;
        default: return -bad_flag("%s", "bad flag") - 1;
        }
    }
    if (optind < argc)
        return -bad_flag("unexpected argument '%s'", argv[optind]) - 1;
    apply_defaults(o, quick, set_k, set_n, set_np, set_r);
    if (o->mode != BENCH_MODE_DRAIN)
        apply_mode_defaults(o, quick, set_k, set_n);
    if (o->payload_bytes_none && (o->mode != BENCH_MODE_MIXED || o->submit_producers == 0))
        return -bad_flag("%s", "--payload-bytes none: only in --mode mixed with --submit-producers above 0") - 1;
    for (int i = 0; i < o->nproducer_kinds; i++)
        for (int j = 0; o->producer_kinds[i] == BENCH_PRODUCER_SUBMIT && j < o->nrows_per_insert; j++)
            if (o->rows_per_insert[j] > TP_MAX_SUBMIT_TASKS)
                return -bad_flag("%s", "--rows-per-insert: a submit carries at most 1000 "
                                       "tasks (--producer sql for more)") - 1;
    if (!have_db && db_from_env(&o->db) < 0)
        return -bad_flag("%s", "no --db and no TASKPUSH_TEST_MYSQL_{HOST,PORT,USER} "
                               "(eval \"$(scripts/tp-mariadb start DIR)\" sets them)") - 1;
    /* After --db, whose parse clears o->db. */
    snprintf(o->db.table, sizeof o->db.table, "%s", table ? table : DSP_TABLE_NAME_DEFAULT);
    o->db.group_keys = group_keys;
    /* The polling designs and the ceiling are the team's own pollers, on task. */
    for (int i = 0; table && o->mode == BENCH_MODE_DRAIN && i < o->ndesigns; i++)
        if (o->designs[i]->drain != bench_drain_taskpush)
            return -bad_flag("--table: only the taskpush designs and the modes take another"
                             " table than task; %s does not (--design taskpush-rr,taskpush-ll)",
                             o->designs[i]->name) - 1;
    /* Their claim reads claim_lane 0, which holds no keyed row (schema version 12). */
    for (int i = 0; group_keys && o->mode == BENCH_MODE_DRAIN && i < o->ndesigns; i++)
        if (o->designs[i]->drain != bench_drain_taskpush)
            return -bad_flag("--group-keys: only the taskpush designs claim keyed rows; %s reads"
                             " claim_lane 0, the rows without a key (--design"
                             " taskpush-rr,taskpush-ll)",
                             o->designs[i]->name) - 1;
    return 0;
}

/* The header: where and with what the figures were taken. */
static void print_header(const bench_opts *o, MYSQL *admin, pid_t db_pid)
{
    struct utsname un;
    char cpu[256] = "unknown", line[512], date[64];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "model name : %255[^\n]", cpu) == 1)
            break;
    if (f)
        fclose(f);
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    if (uname(&un) != 0)
        strcpy(un.nodename, "unknown");

    json_t *h = json_object();
    json_object_set_new(h, "kind", json_string("settings"));
    json_object_set_new(h, "mode", json_string(mode_names[o->mode]));
    json_object_set_new(h, "date", json_string(date));
    json_object_set_new(h, "host", json_string(un.nodename));
    json_object_set_new(h, "cpus", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_set_new(h, "cpu", json_string(cpu));
    /* The CPUs each side may run on (bench/run.sh --db-cpus, --bench-cpus): on a
     * small machine the workers' cost comes out of the database's share unless pinned. */
    char bench_cpus[128] = "unknown", db_cpus[128] = "unknown";
    procfs_status_value(getpid(), "Cpus_allowed_list", bench_cpus, sizeof bench_cpus);
    procfs_status_value(db_pid, "Cpus_allowed_list", db_cpus, sizeof db_cpus);
    json_t *aff = json_object();
    json_object_set_new(aff, "bench", json_string(bench_cpus));
    json_object_set_new(aff, "mariadbd", json_string(db_cpus));
    json_object_set_new(h, "cpus_allowed", aff);
    json_object_set_new(h, "server", bench_db_settings(admin));
    json_object_set_new(h, "table", json_string(o->db.table));
    json_object_set_new(h, "group_keys", json_integer((json_int_t)o->db.group_keys));
    json_object_set_new(h, "n", json_integer((json_int_t)o->n));
    json_object_set_new(h, "n_poll", json_integer((json_int_t)o->n_poll));
    json_object_set_new(h, "n_poll_large_k", json_integer((json_int_t)o->n_poll_large_k));
    json_object_set_new(h, "poll_seconds", json_integer(o->poll_seconds));
    json_object_set_new(h, "repeat", json_integer(o->repeat));
    json_object_set_new(h, "capacity", o->flat ? json_string("flat") : json_integer(o->capacity));
    json_object_set_new(h, "worker_threads", json_integer(o->worker_threads));
    json_object_set_new(h, "taskpushd", json_string(o->taskpushd));
    if (o->mode == BENCH_MODE_STREAM || o->mode == BENCH_MODE_LATENCY) {
        json_t *pk = json_array();
        for (int i = 0; i < o->nproducer_kinds; i++)
            json_array_append_new(pk, json_string(bench_producer_names[o->producer_kinds[i]]));
        json_object_set_new(h, "producers", pk);
    }
    json_t *targs = json_array();
    for (int i = 0; i < o->ntaskpushd_args; i++)
        json_array_append_new(targs, json_string(o->taskpushd_args[i]));
    json_object_set_new(h, "taskpushd_args", targs);
    char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!o->json_only) {
        json_t *sv = json_object_get(h, "server");
        printf("- taskpush-bench %s on %s (%ld cpus, %s)\n", date, un.nodename,
               sysconf(_SC_NPROCESSORS_ONLN), cpu);
        printf("- CPUs allowed: bench and taskpushd %s, mariadbd %s\n", bench_cpus, db_cpus);
        printf("- server %s, innodb_flush_log_at_trx_commit=%s, innodb_buffer_pool_size=%s,"
               " innodb_log_file_size=%s\n",
               json_string_value(json_object_get(sv, "version")),
               json_string_value(json_object_get(sv, "innodb_flush_log_at_trx_commit")),
               json_string_value(json_object_get(sv, "innodb_buffer_pool_size")),
               json_string_value(json_object_get(sv, "innodb_log_file_size")));
    }
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(h);
    fflush(stdout);
}

static json_t *num_or_null(double v, bool known)
{
    return known ? json_real(v) : json_null();
}

/* A run's tasks a second: over the rows done, which is N unless the run was cut. */
static double run_rate(const bench_run *r)
{
    return r->seconds > 0 ? (double)r->done / r->seconds : 0;
}

static void print_run(const bench_run *r)
{
    /* Per task: over the rows done, which is N unless the run was cut. */
    double done = (double)r->done, per_k = r->done ? 1000.0 / done : 0;
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string("run"));
    json_object_set_new(o, "design", json_string(r->design));
    json_object_set_new(o, "k", json_integer(r->k));
    json_object_set_new(o, "n", json_integer((json_int_t)r->n));
    json_object_set_new(o, "done", json_integer((json_int_t)r->done));
    json_object_set_new(o, "cut", json_boolean(r->cut));
    json_object_set_new(o, "capacity", r->capacity ? json_integer(r->capacity) : json_null());
    json_object_set_new(o, "round", json_integer(r->round));
    json_object_set_new(o, "seconds", json_real(r->seconds));
    json_object_set_new(o, "tasks_per_s", json_real(run_rate(r)));
    json_object_set_new(o, "statements_per_task", json_real(done > 0 ? (double)r->statements / done : 0));
    json_object_set_new(o, "row_lock_waits", json_integer((json_int_t)r->lock_waits));
    json_object_set_new(o, "handler_reads_per_task",
                        json_real(done > 0 ? (double)r->handler_reads / done : 0));
    json_object_set_new(o, "cas_misses", json_integer((json_int_t)r->cas_misses));
    json_object_set_new(o, "interrupted", json_integer((json_int_t)r->interrupted));
    json_object_set_new(o, "claim_p50_ms", num_or_null(r->p50_ms, r->has_latency));
    json_object_set_new(o, "claim_p99_ms", num_or_null(r->p99_ms, r->has_latency));
    json_object_set_new(o, "mariadbd_cpu_s_per_1000", num_or_null(r->db_cpu_s * per_k, r->db_cpu_s >= 0));
    json_object_set_new(o, "taskpushd_cpu_s_per_1000",
                        num_or_null(r->tpd_cpu_s * per_k, r->tpd_cpu_s >= 0));
    json_object_set_new(o, "bench_cpu_s_per_1000",
                        num_or_null(r->bench_cpu_s * per_k, r->bench_cpu_s >= 0));
    json_object_set_new(o, "taskpushd_peak_rss_kb",
                        r->tpd_rss_kb >= 0 ? json_integer(r->tpd_rss_kb) : json_null());
    json_object_set_new(o, "verified", json_boolean(r->verified));
    if (!r->verified)
        json_object_set_new(o, "why", json_string(r->why));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(o);
    fflush(stdout);
}

/* One run: fresh table, drain, (sabotage), verify. Fills r. */
static void run_one(bench_ctx *ctx, const bench_design *d, unsigned k, unsigned round, bench_run *r)
{
    const bench_opts *o = ctx->o;
    memset(r, 0, sizeof *r);
    r->design = d->name;
    r->k = d->single ? 1 : k;
    r->n = !d->polling ? o->n : k >= BENCH_LARGE_K ? o->n_poll_large_k : o->n_poll;
    r->done = r->n;
    r->round = round;
    r->db_cpu_s = r->tpd_cpu_s = r->bench_cpu_s = -1;
    r->tpd_rss_kb = -1;
    r->daemon_succeeded = r->daemon_failed = -1;
    if (d->drain == bench_drain_taskpush)
        r->capacity = o->flat ? (BENCH_FLAT_SLOTS / k ? BENCH_FLAT_SLOTS / k : 1) : o->capacity;
    if (bench_tally_init(&ctx->tally, r->n) < 0) {
        snprintf(r->why, sizeof r->why, "out of memory");
        return;
    }
    if (!o->json_only)
        fprintf(stderr, "taskpush-bench: round %u: %s K=%u N=%" PRIu64 "\n", round, d->name, r->k, r->n);
    if (bench_db_reset(&o->db, ctx->admin, r->n) < 0 ||
        (d->deps && bench_db_add_deps(&o->db, ctx->admin, r->n) < 0)) {
        snprintf(r->why, sizeof r->why, "could not prepare the table: %s", mysql_error(ctx->admin));
    } else {
        d->drain(ctx, d, r->k, r);
        if (o->sabotage && bench_sabotage(ctx) < 0)
            fprintf(stderr, "taskpush-bench: --sabotage could not change a row\n");
        bench_verify(ctx, r);
    }
    if (!r->verified)
        fprintf(stderr, "taskpush-bench: %s K=%u: VERIFICATION FAILED: %s\n", d->name, r->k, r->why);
    bench_tally_free(&ctx->tally);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median tasks/s of the verified runs of (design, k); 0 when none. *cut (when not
 * NULL) tells whether one of them was cut at --poll-seconds. */
static double median_rate(const bench_run *runs, size_t nruns, const char *design, unsigned k,
                          bool *cut)
{
    double v[100];
    size_t n = 0;
    if (cut)
        *cut = false;
    for (size_t i = 0; i < nruns && n < 100; i++)
        if (runs[i].verified && strcmp(runs[i].design, design) == 0 && runs[i].k == k &&
            runs[i].seconds > 0) {
            v[n++] = run_rate(&runs[i]);
            if (cut)
                *cut |= runs[i].cut;
        }
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print_table(const bench_opts *o, const bench_run *runs, size_t nruns)
{
    /* With more than one K, the last column is the flatness: the lowest median over the
     * highest, for the designs that run at every K. */
    bool spread = o->nks > 1, any_cut = false;
    printf("\n| design |");
    for (int j = 0; j < o->nks; j++)
        printf(" K=%u |", o->ks[j]);
    printf("%s\n|---|", spread ? " lowest ÷ highest |" : "");
    for (int j = 0; j < o->nks; j++)
        printf("---|");
    printf("%s\n", spread ? "---|" : "");
    for (int i = 0; i < o->ndesigns; i++) {
        const bench_design *d = o->designs[i];
        double lo = 0, hi = 0;
        bool all = true;
        printf("| %s%s |", d->name, d->single ? " (1 connection)" : "");
        for (int j = 0; j < o->nks; j++) {
            bool cut;
            double rate = median_rate(runs, nruns, d->name, d->single ? 1 : o->ks[j], &cut);
            double cas = median_rate(runs, nruns, "cas", o->ks[j], NULL);
            const char *mark = cut ? "*" : "";
            any_cut |= cut;
            if (rate <= 0)
                all = false;
            else {
                lo = lo == 0 || rate < lo ? rate : lo;
                hi = rate > hi ? rate : hi;
            }
            if (d->single && j > 0)
                printf(" |");
            else if (rate <= 0)
                printf(" failed |");
            else if (cas > 0)
                printf(" %.0f%s (%.2f× cas) |", rate, mark, rate / cas);
            else
                printf(" %.0f%s |", rate, mark);
        }
        if (spread && (d->single || !all || hi <= 0))
            printf(" |");
        else if (spread)
            printf(" %.2f |", lo / hi);
        printf("\n");
    }
    /* The ceiling does the same work in every round: how far its rounds lie apart is
     * the machine's own spread in this run, the limit on what a ratio of medians shows. */
    for (int i = 0; i < o->ndesigns; i++) {
        const bench_design *d = o->designs[i];
        double lo = 0, hi = 0;
        unsigned n = 0;
        if (!d->single)
            continue;
        for (size_t r = 0; r < nruns; r++) {
            if (!runs[r].verified || strcmp(runs[r].design, d->name) != 0 || runs[r].seconds <= 0)
                continue;
            double rate = run_rate(&runs[r]);
            lo = n == 0 || rate < lo ? rate : lo;
            hi = rate > hi ? rate : hi;
            n++;
        }
        if (n > 1)
            printf("\n%s, the same work in each of %u rounds: lowest ÷ highest round %.2f "
                   "(%.0f ÷ %.0f), the machine's own spread in this run.\n", d->name, n, lo / hi,
                   lo, hi);
    }
    printf("\nMedian tasks/s of %u round(s), verified runs only; N=%" PRIu64 " (polling designs %"
           PRIu64 ", %" PRIu64 " at K >= %u), taskpush capacity %s.\n", o->repeat, o->n, o->n_poll,
           o->n_poll_large_k, BENCH_LARGE_K,
           o->flat ? "1024/K per worker" : "per worker as --capacity");
    if (any_cut)
        printf("\n\\* A run of this figure was cut at --poll-seconds %u: it stopped claiming after "
               "%u s, its tasks/s are over the rows it did (\"done\" in its JSON line), each "
               "verified exactly-once, the others left NEW and never claimed.\n",
               o->poll_seconds, o->poll_seconds);
}

/* K polling clients need K connections at once (plus the bench's and taskpushd's):
 * say so before the first run fails on a server's default of 151. */
static void warn_connections(const bench_opts *o, MYSQL *admin)
{
    uint64_t max_conn;
    unsigned kmax = 0;
    bool polling = false;
    for (int i = 0; i < o->ndesigns; i++)
        polling |= o->designs[i]->polling;
    for (int j = 0; j < o->nks; j++)
        kmax = o->ks[j] > kmax ? o->ks[j] : kmax;
    if (polling && bench_db_u64(admin, "SELECT @@max_connections", &max_conn) == 0 && kmax + 16 > max_conn)
        fprintf(stderr, "taskpush-bench: warning: the server allows %" PRIu64
                " connections; K=%u polling clients need %u\n", max_conn, kmax, kmax + 16);
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_ctx ctx;
    int rc = parse_flags(argc, argv, &o);
    if (rc < 0)
        return -rc - 1;
    memset(&ctx, 0, sizeof ctx);
    ctx.o = &o;
    if (mysql_library_init(0, NULL, NULL) != 0)
        return 1;
    ctx.admin = bench_db_connect(&o.db, NULL);
    if (ctx.admin == NULL)
        return 1;
    ctx.db_pid = bench_db_pid(ctx.admin);
    if (o.mode == BENCH_MODE_DRAIN)
        warn_connections(&o, ctx.admin);
    print_header(&o, ctx.admin, ctx.db_pid);
    if (o.mode != BENCH_MODE_DRAIN) {
        int failed = bench_modes_main(&ctx);
        bench_db_drop(ctx.admin, &o.db);
        mysql_close(ctx.admin);
        mysql_library_end();
        if (failed)
            fprintf(stderr, "taskpush-bench: %d result(s) failed verification\n", failed);
        return failed ? 1 : 0;
    }

    size_t cap = (size_t)o.repeat * (size_t)o.nks * (size_t)o.ndesigns, nruns = 0;
    bench_run *runs = calloc(cap, sizeof *runs);
    if (runs == NULL)
        return 1;
    int failed = 0;
    /* Rounds outermost: each figure's runs are spread over the whole period. Even
     * rounds go backwards (ABBA), so a drift of the machine or the server over the
     * period (measured: 10 % over 5 rounds) does not always fall on the last K. */
    for (unsigned round = 1; round <= o.repeat; round++) {
        bool backwards = round % 2 == 0;
        int steps = o.nks * o.ndesigns;
        for (int step = 0; step < steps; step++) {
            int pos = backwards ? steps - 1 - step : step;
            int j = pos / o.ndesigns, first_j = backwards ? o.nks - 1 : 0;
            const bench_design *d = o.designs[pos % o.ndesigns];
            if (d->single && j != first_j)
                continue; /* K does not apply: once per round */
            bench_run *r = &runs[nruns++];
            run_one(&ctx, d, o.ks[j], round, r);
            print_run(r);
            failed += !r->verified;
        }
    }
    if (!o.json_only)
        print_table(&o, runs, nruns);
    bench_db_drop(ctx.admin, &o.db);
    mysql_close(ctx.admin);
    free(runs);
    mysql_library_end();
    if (failed)
        fprintf(stderr, "taskpush-bench: %d run(s) failed verification\n", failed);
    return failed ? 1 : 0;
}
