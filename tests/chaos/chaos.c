/* chaos: a long fault run against the real taskpushd, real worker processes and the
 * private MariaDB of scripts/tp-mariadb, ending with figures and a verdict.
 *
 *   chaos [--short] [--tasks N] [--dispatcher-kills N] [--worker-kills N] [--db-restarts N]
 *         [--no-partition] [--attack N] [--hostile KINDS] [--types K] [--workers W]
 *         [--rate R] [--deadline-s S] [--seed S] [--keep] [--attack-rounds R]
 *
 * Two phases, one taskpushd (--heartbeat-ms 200) on a fresh database:
 *
 *   attack  W honest workers drain a steady supply of tasks; completions per second are
 *           measured in quiet windows and in R windows of N hostile connections
 *           (chaos_net.h's mix) between them, with taskpushd's RSS and /healthz polled
 *           every 200 ms. Printed, not asserted.
 *   faults  N more tasks over K types, while a smaller hostile mix keeps running: kill -9
 *           of taskpushd (restarted on the same worker port), kill -9 of worker processes
 *           (restarted), MariaDB restarts (the last one a kill -9 of mariadbd), and one
 *           worker, which talks through chaos_net.h's proxy, partitioned for longer than
 *           three heartbeats and healed. The tasks come in bursts of R a second (1000);
 *           the events fire at fixed fractions of the tasks fed, shortly after a burst,
 *           one at a time, and each restart waits for the first completion after it.
 *
 * Each worker appends "TASK_ID ATTEMPT EPOCH PID START_MS" to its log before running a
 * delivery (chaos_worker.c). A trigger on the task table records every row that becomes
 * SUCCESSFUL in chaos_audit, so "SUCCESSFUL twice" is counted by the server.
 *
 * Exit status 1 (the reasons listed at the end) when: a task is lost (a row not
 * SUCCESSFUL or FAILED, a missing row, or a row SUCCESSFUL that no worker ran), a row
 * became SUCCESSFUL twice, a row is left PROCESSING, the run misses its deadline,
 * taskpushd exits on its own, the attempts charged exceed the executions by more than
 * the killed and partitioned workers could hold, or the duplicates after a dispatcher kill
 * exceed what was in flight plus the outcomes not yet written at that moment (both read
 * from /stats just before the kill, plus the deliveries that began after that read). Timing
 * figures are printed, never asserted: the machine is shared and noisy. Status 2: bad
 * arguments or a setup that failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <mysql.h>

#include "chaos_net.h"
#include "daemon.h"
#include "testdb.h"

#ifndef CHAOS_SOURCE_ROOT
#error "CHAOS_SOURCE_ROOT must be defined by the build"
#endif

#define MAX_WORKERS 32
#define MAX_TYPES 16
#define MAX_EVENTS 256
#define HEARTBEAT_MS 200
#define TICK_MS 50
#define INSERT_CHUNK 1000
#define ATTACK_BACKLOG 3000    /* ready rows kept in the table during the attack phase */
#define RECOVERY_WAIT_MS 60000 /* longest wait for the first completion after a restart */
#define STOP_WAIT_MS 15000

#define MAX_TPD_ARGS 4

typedef struct chaos_opts {
    long tasks;
    int dkills, wkills, dbrestarts;
    bool partition;
    int attack;
    unsigned kinds;
    int types, workers;
    int deadline_s;
    int rate;
    int before_s, during_s, after_s, rounds;
    unsigned seed;
    bool keep;
    const char *tpd_args[MAX_TPD_ARGS]; /* --taskpushd-arg, e.g. to compare a limit's setting */
    int ntpd_args;
} chaos_opts;

typedef struct wproc {
    pid_t pid;
    unsigned cap;
    bool proxied;
    char log[600];
    char err[600];
} wproc;

/* One event of the fault phase and what was measured around it. */
enum ev_kind { EV_DKILL, EV_WKILL, EV_DB, EV_PARTITION };

typedef struct event {
    int kind;
    double at;              /* fraction of the progress at which it fires */
    bool done;
    long long t_ms;         /* since the start of the run */
    long long in_flight;    /* /stats queue.in_flight just before */
    long long pending;      /* /stats db.pending_writes just before */
    long long buffered;     /* /stats queue.buffered just before */
    long long worker_in_flight; /* EV_WKILL, EV_PARTITION: that worker's, from /workers */
    uint32_t epoch;         /* EV_DKILL: the epoch that ended */
    pid_t pid;              /* EV_WKILL, EV_PARTITION: the worker process */
    unsigned cap;
    bool kill9;             /* EV_DB: kill -9 of mariadbd, else a clean restart */
    long long down_ms;      /* kill to leader again / DB up again / partition length */
    long long first_ms;     /* from back up to the first completion (-1: none seen) */
    long long noticed_ms;   /* EV_PARTITION: until taskpushd dropped the worker (-1: never) */
    long long dups;         /* duplicate executions attributed to it */
    long long read_ms;      /* EV_DKILL: monotonic time just before /stats was read */
    long long late;         /* EV_DKILL: executions of its epoch that began after that read */
    long long read_kill_ms; /* EV_DKILL: from that read to the SIGKILL */
    long long mono_from, mono_to; /* EV_WKILL: the SIGKILL; EV_PARTITION: the hold (monotonic) */
} event;

typedef struct exec_line {
    uint64_t id;
    uint32_t attempt, epoch;
    pid_t pid;
    long long start_ms; /* CLOCK_MONOTONIC, shared by every process of the machine */
} exec_line;

#define ATTACK_MAX_ROUNDS 10

typedef struct attack_figures {
    bool ran;
    /* Completions per second in the quiet windows q[0..rounds] and the attacked windows
     * a[0..rounds-1], interleaved q0 a0 q1 a1 ... The honest rate drifts by 5-10 % over
     * 20 s on this machine (the database slows as rows pile up, and recovers), so each
     * attacked window is compared with the quiet windows on either side of it. */
    int rounds;
    double q[ATTACK_MAX_ROUNDS + 1], a[ATTACK_MAX_ROUNDS];
    double before, during, after; /* q[0], mean of a[], q[rounds] */
    double during_vs_quiet;       /* mean over i of a[i] / ((q[i] + q[i+1]) / 2) */
    long rss_base_kb, rss_peak_kb, rss_after_kb;
    /* RSS splits into the heap and stacks (RssAnon) and mapped library pages (RssFile):
     * the attack runs code paths (error replies, TLS refusals) whose library pages stay
     * resident after it, which is not memory the daemon holds. */
    long anon_base_kb, anon_after_kb, file_base_kb, file_after_kb;
    double cpu_before, cpu_during, cpu_after; /* taskpushd's CPU, % of one core */
    int health_polls, health_fail_during, health_fail_total;
    chaos_hostile_stats st;
} attack_figures;

struct chaos {
    chaos_opts o;
    tp_testdb db;
    MYSQL *conn; /* the suite's own connection; reopened after a MariaDB restart */
    bool have_db;
    tp_daemon d;
    bool daemon_started;
    char listen[128];
    char proxy_addr[128];
    char workdir[256];
    char mysql_dir[512];
    char tp_mariadb[1024];
    chaos_proxy *proxy;
    chaos_hostile *bg;
    chaos_hostile_stats bg_st;
    wproc w[MAX_WORKERS];
    event ev[MAX_EVENTS];
    int nev;
    uint64_t rng;
    long long t0, deadline;
    long long inserted;
    bool feeding;           /* the fault phase's bursts are on */
    long fed;               /* tasks of the fault phase inserted so far */
    long long next_burst, last_burst;
    int unplanned_daemon_exits, worker_self_exits;
    attack_figures atk;
    int nfail;
    char fail_text[8192];
    size_t fail_len;
    long long log_bytes;
};

/* ---- small helpers ---- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static long long since(const struct chaos *c)
{
    return tp_mono_ms() - c->t0;
}

static void note(const struct chaos *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(const struct chaos *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "# [%7.1f s] %s\n", (double)since(c) / 1000.0, msg);
}

/* Records a reason for exit status 1 (printed at the end, and at once on stderr). */
static void fail(struct chaos *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(struct chaos *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->nfail++;
    note(c, "FAILURE: %s", msg);
    if (c->fail_len < sizeof c->fail_text - 2) {
        int n = snprintf(c->fail_text + c->fail_len, sizeof c->fail_text - c->fail_len, "  - %s\n", msg);
        if (n > 0)
            c->fail_len += (size_t)n;
        if (c->fail_len >= sizeof c->fail_text)
            c->fail_len = sizeof c->fail_text - 1;
    }
}

static uint64_t rnd(struct chaos *c)
{
    uint64_t x = c->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static bool past_deadline(const struct chaos *c)
{
    return tp_mono_ms() >= c->deadline;
}

/* ---- the suite's own database connection ---- */

/* Connects quietly (the server may be restarting): NULL on failure. */
static MYSQL *db_open(const tp_testdb *db)
{
    MYSQL *m = mysql_init(NULL);
    unsigned timeout = 30, protocol = MYSQL_PROTOCOL_TCP;
    if (m == NULL)
        return NULL;
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &timeout);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &timeout);
    mysql_options(m, MYSQL_OPT_PROTOCOL, &protocol);
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (mysql_real_connect(m, db->host, db->user, db->password[0] ? db->password : NULL, db->name, db->port,
                           NULL, 0) == NULL) {
        mysql_close(m);
        return NULL;
    }
    return m;
}

/* Runs sql on the suite's connection, reconnecting once when it broke. Returns 0 or -1
 * (quietly: the caller decides whether a failure matters). */
static int db_query(struct chaos *c, const char *sql)
{
    for (int round = 0; round < 2; round++) {
        if (c->conn == NULL && (c->conn = db_open(&c->db)) == NULL)
            return -1;
        if (mysql_query(c->conn, sql) == 0)
            return 0;
        unsigned e = mysql_errno(c->conn);
        if (e != 2006 && e != 2013 && e != 2002 && e != 2003 && e != 1927 && e != 1053)
            return -1; /* not a lost connection: retrying will not help */
        mysql_close(c->conn);
        c->conn = NULL;
    }
    return -1;
}

/* The first column of the first row as a number; -1 on any failure. */
static long long db_num(struct chaos *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static long long db_num(struct chaos *c, const char *fmt, ...)
{
    char sql[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    if (db_query(c, sql) < 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(c->conn);
    if (res == NULL)
        return -1;
    MYSQL_ROW row = mysql_fetch_row(res);
    long long v = row && row[0] ? strtoll(row[0], NULL, 10) : -1;
    mysql_free_result(res);
    return v;
}

/* Completions so far: the audit table's last id (gaps from rolled-back writes make it
 * run a little ahead of the exact count; fine for progress and rates). */
static long long completions(struct chaos *c)
{
    return db_num(c, "SELECT COALESCE(MAX(audit_id), 0) FROM chaos_audit");
}

static int insert_tasks(struct chaos *c, long n)
{
    size_t cap = 128 + (size_t)INSERT_CHUNK * 48;
    char *sql = malloc(cap);
    if (sql == NULL)
        return -1;
    for (long done = 0; done < n;) {
        long chunk = n - done < INSERT_CHUNK ? n - done : INSERT_CHUNK;
        size_t len = (size_t)snprintf(sql, cap, "INSERT INTO task (task_type, payload) VALUES ");
        for (long k = 0; k < chunk; k++)
            len += (size_t)snprintf(sql + len, cap - len, "%s('chaos_t%lld', 'p')", k ? "," : "",
                                    (c->inserted + k) % c->o.types);
        if (db_query(c, sql) < 0) {
            /* The server may be restarting: try the same chunk again, within the deadline. */
            if (past_deadline(c)) {
                free(sql);
                return -1;
            }
            sleep_ms(200);
            continue;
        }
        c->inserted += chunk;
        done += chunk;
    }
    free(sql);
    return 0;
}

/* The audit table and its trigger, then a self-check that a multi-row UPDATE fires it
 * per row (the dispatcher writes outcomes in multi-row UPDATEs). */
static int audit_setup(struct chaos *c)
{
    static const char *const ddl[] = {
        "CREATE TABLE chaos_audit ("
        " audit_id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,"
        " task_id BIGINT UNSIGNED NOT NULL, epoch INT UNSIGNED NOT NULL, attempts INT NOT NULL,"
        " KEY (task_id)) ENGINE = InnoDB",
        "CREATE TRIGGER chaos_audit_success AFTER UPDATE ON task FOR EACH ROW"
        " INSERT INTO chaos_audit (task_id, epoch, attempts)"
        " SELECT NEW.task_id, NEW.epoch, NEW.attempts FROM DUAL"
        " WHERE NEW.task_state = 2 AND OLD.task_state <> 2",
        "INSERT INTO task (task_type) VALUES ('chaos_selfcheck'), ('chaos_selfcheck'), ('chaos_selfcheck')",
        "UPDATE task SET task_state = 2 WHERE task_type = 'chaos_selfcheck'",
        "UPDATE task SET task_state = 2, attempts = 1 WHERE task_type = 'chaos_selfcheck'",
    };
    for (size_t i = 0; i < sizeof ddl / sizeof ddl[0]; i++)
        if (db_query(c, ddl[i]) < 0) {
            fprintf(stderr, "chaos: %s\n  failed: %s\n", ddl[i], c->conn ? mysql_error(c->conn) : "no connection");
            return -1;
        }
    long long n = db_num(c, "SELECT COUNT(*) FROM chaos_audit");
    if (n != 3) {
        fprintf(stderr, "chaos: the audit trigger recorded %lld rows for a 3-row UPDATE, want 3\n", n);
        return -1;
    }
    if (db_query(c, "DELETE FROM task WHERE task_type = 'chaos_selfcheck'") < 0 ||
        db_query(c, "DELETE FROM chaos_audit") < 0)
        return -1;
    return 0;
}

/* ---- processes ---- */

/* VmRSS of pid in kB; -1 when unavailable. */
static long rss_kb(pid_t pid)
{
    return procfs_status_kb(pid, "VmRSS");
}

/* Waits for pid (a child) at most ms, then SIGKILLs it. Returns the exit code or 128 + signal. */
static int wait_child(pid_t pid, int ms)
{
    int status = 0;
    long long end = tp_mono_ms() + ms;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0)
            return -1;
        if (tp_mono_ms() >= end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        sleep_ms(10);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int worker_start(struct chaos *c, int i)
{
    wproc *w = &c->w[i];
    char cap[16], types[MAX_TYPES * 12] = "", name[32];
    size_t len = 0;
    for (int t = 0; t < c->o.types; t++)
        len += (size_t)snprintf(types + len, sizeof types - len, "%schaos_t%d", t ? "," : "", t);
    snprintf(cap, sizeof cap, "%u", w->cap);
    snprintf(name, sizeof name, "chaos-w%d", i);
    char path[1024];
    snprintf(path, sizeof path, "%s", tp_build_path("tests/chaos/chaos_worker"));
    const char *argv[] = {path,    "--connect",  w->proxied ? c->proxy_addr : c->listen, "--types", types,
                          "--capacity", cap, "--log", w->log, "--name", name, NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(w->err, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(path, (char *const *)argv);
        _exit(127);
    }
    w->pid = pid;
    return 0;
}

static int daemon_start(struct chaos *c)
{
    const char *extra[5 + MAX_TPD_ARGS] = {"--heartbeat-ms", "200", "--listen",
                                           c->listen[0] ? c->listen : "127.0.0.1:0"};
    for (int i = 0; i < c->o.ntpd_args; i++)
        extra[4 + i] = c->o.tpd_args[i];
    if (tp_daemon_start(&c->d, c->db.url, extra) != 0)
        return -1;
    c->daemon_started = true;
    if (tp_daemon_wait_leader(&c->d, 30000) != 0) {
        fprintf(stderr, "chaos: taskpushd did not become leader within 30 s\n");
        return -1;
    }
    if (c->listen[0] == '\0')
        snprintf(c->listen, sizeof c->listen, "%s", c->d.listen);
    else if (strcmp(c->listen, c->d.listen) != 0) {
        fprintf(stderr, "chaos: taskpushd listens on %s, not %s\n", c->d.listen, c->listen);
        return -1;
    }
    return 0;
}

/* The last lines of the daemon's log, for a failure. */
static void daemon_log_tail(const struct chaos *c, int lines)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "tail -n %d '%s' >&2", lines, c->d.log_path);
    if (system(cmd) != 0)
        fprintf(stderr, "chaos: cannot show %s\n", c->d.log_path);
}

/* Notices processes that ended on their own: taskpushd (a failure; restarted so the
 * run can go on) and workers (counted; restarted). */
static void reap(struct chaos *c)
{
    int status;
    if (c->d.pid > 0 && waitpid(c->d.pid, &status, WNOHANG) == c->d.pid) {
        c->d.pid = 0;
        c->unplanned_daemon_exits++;
        fail(c, "taskpushd exited on its own (%s %d)", WIFEXITED(status) ? "exit" : "signal",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        daemon_log_tail(c, 30);
        if (daemon_start(c) != 0)
            fail(c, "taskpushd could not be restarted");
    }
    for (int i = 0; i < c->o.workers; i++)
        if (c->w[i].pid > 0 && waitpid(c->w[i].pid, &status, WNOHANG) == c->w[i].pid) {
            c->worker_self_exits++;
            note(c, "worker %d (pid %d) exited on its own (status %d); restarting it", i, (int)c->w[i].pid,
                 status);
            c->w[i].pid = 0;
            worker_start(c, i);
        }
}

/* The fault phase's supply: a burst of R tasks once a second while feeding is on. */
static void feed_tick(struct chaos *c)
{
    long long now = tp_mono_ms();
    if (!c->feeding || c->fed >= c->o.tasks || now < c->next_burst)
        return;
    long n = c->o.tasks - c->fed < c->o.rate ? c->o.tasks - c->fed : c->o.rate;
    if (insert_tasks(c, n) != 0)
        return; /* past the deadline: the caller notices */
    c->fed += n;
    c->last_burst = now;
    c->next_burst = now + 1000;
}

static void tick(struct chaos *c)
{
    reap(c);
    feed_tick(c);
    sleep_ms(TICK_MS);
}

/* Runs scripts/tp-mariadb restart on the suite's server. Returns 0 or -1. */
static int mariadb_restart(struct chaos *c)
{
    char logpath[600];
    snprintf(logpath, sizeof logpath, "%s/mariadb-restart.log", c->workdir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(c->tp_mariadb, c->tp_mariadb, "restart", c->mysql_dir, (char *)NULL);
        _exit(127);
    }
    int rc = wait_child(pid, 180000);
    if (rc != 0)
        fprintf(stderr, "chaos: tp-mariadb restart exited %d (see %s)\n", rc, logpath);
    return rc == 0 ? 0 : -1;
}

static pid_t mariadb_pid(struct chaos *c)
{
    char path[600], buf[32] = "";
    snprintf(path, sizeof path, "%s/mysqld.pid", c->mysql_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    if (fgets(buf, sizeof buf, f) == NULL)
        buf[0] = '\0';
    fclose(f);
    long v = strtol(buf, NULL, 10);
    return v > 1 && v < INT_MAX ? (pid_t)v : -1;
}

/* ---- reading taskpushd ---- */

/* queue.in_flight, db.pending_writes, queue.buffered and the epoch, from one /stats. */
static void read_stats(struct chaos *c, event *e)
{
    json_t *s = tp_daemon_json(&c->d, "/stats");
    e->in_flight = tp_json_int_at(s, "queue.in_flight");
    e->pending = tp_json_int_at(s, "db.pending_writes");
    e->buffered = tp_json_int_at(s, "queue.buffered");
    long long ep = tp_json_int_at(s, "epoch");
    e->epoch = ep > 0 ? (uint32_t)ep : 0;
    json_decref(s);
}

/* The in_flight of the worker named chaos-w<i>-<pid> in /workers; -1 when it is not there. */
static long long worker_in_flight(struct chaos *c, int i)
{
    char name[64];
    snprintf(name, sizeof name, "chaos-w%d-%d", i, (int)c->w[i].pid);
    json_t *a = tp_daemon_json(&c->d, "/workers");
    long long v = -1;
    size_t k;
    json_t *w;
    if (json_is_array(a))
        json_array_foreach(a, k, w)
        {
            const char *n = json_string_value(json_object_get(w, "name"));
            if (n && strcmp(n, name) == 0)
                v = json_integer_value(json_object_get(w, "in_flight"));
        }
    json_decref(a);
    return v;
}

/* Milliseconds from now until the audit table grows past `from`; -1 when it does not
 * within the wait, or when no row is left to complete. */
static long long wait_first_completion(struct chaos *c, long long from)
{
    long long t = tp_mono_ms(), end = t + RECOVERY_WAIT_MS, next_check = 0;
    while (tp_mono_ms() < end && !past_deadline(c)) {
        long long n = completions(c);
        if (n > from)
            return tp_mono_ms() - t;
        if (tp_mono_ms() >= next_check) {
            next_check = tp_mono_ms() + 500;
            if (c->fed >= c->o.tasks && db_num(c, "SELECT COUNT(*) FROM task WHERE task_state IN (0, 1)") == 0)
                return -1;
        }
        tick(c);
    }
    return -1;
}

/* ---- the attack phase ---- */

/* Keeps ATTACK_BACKLOG ready rows in the table. */
static void feed(struct chaos *c)
{
    long long ready = db_num(c, "SELECT COUNT(*) FROM task WHERE task_state = 0");
    if (ready >= 0 && ready < ATTACK_BACKLOG)
        insert_tasks(c, ATTACK_BACKLOG);
}

/* One window of the attack phase: feeds, samples RSS and /healthz every 200 ms.
 * Returns completions per second over the window; *cpu gets taskpushd's CPU use over
 * it in % of one core. */
static double attack_window(struct chaos *c, int seconds, bool during, double *cpu)
{
    attack_figures *a = &c->atk;
    double cpu0 = procfs_cpu_seconds(c->d.pid);
    long long start = completions(c), t = tp_mono_ms(), end = t + (long long)seconds * 1000, next = 0;
    while (tp_mono_ms() < end && !past_deadline(c)) {
        if (tp_mono_ms() >= next) {
            next = tp_mono_ms() + 200;
            feed(c);
            long kb = c->d.pid > 0 ? rss_kb(c->d.pid) : -1;
            if (kb > a->rss_peak_kb)
                a->rss_peak_kb = kb;
            int st = tp_http_request(c->d.admin, "GET", "/healthz", NULL);
            a->health_polls++;
            if (st != 200) {
                a->health_fail_total++;
                a->health_fail_during += during;
            }
        }
        tick(c);
    }
    long long n = completions(c);
    double cpu1 = procfs_cpu_seconds(c->d.pid);
    double secs = (double)(tp_mono_ms() - t) / 1000.0;
    *cpu = cpu0 >= 0 && cpu1 >= cpu0 && secs > 0 ? 100.0 * (cpu1 - cpu0) / secs : -1;
    return n >= start && start >= 0 && secs > 0 ? (double)(n - start) / secs : -1;
}

static void hostile_stats_add(chaos_hostile_stats *sum, const chaos_hostile_stats *st)
{
    sum->connects += st->connects;
    sum->refused += st->refused;
    sum->closed_by_peer += st->closed_by_peer;
    sum->big_bytes += st->big_bytes;
    if (st->open_peak > sum->open_peak)
        sum->open_peak = st->open_peak;
    for (int k = 0; k < CHAOS_NKINDS; k++)
        sum->per_kind[k] += st->per_kind[k];
}

static void attack_phase(struct chaos *c)
{
    attack_figures *a = &c->atk;
    a->ran = true;
    a->rounds = c->o.rounds;
    note(c, "attack phase: warming up");
    /* Warm up: the workers are connected and tasks complete. */
    long long base = completions(c);
    while (!past_deadline(c) && completions(c) < base + 200) {
        feed(c);
        tick(c);
    }
    a->q[0] = a->before = attack_window(c, c->o.before_s, false, &a->cpu_before);
    a->rss_base_kb = rss_kb(c->d.pid);
    a->rss_peak_kb = a->rss_base_kb;
    a->anon_base_kb = procfs_status_kb(c->d.pid, "RssAnon");
    a->file_base_kb = procfs_status_kb(c->d.pid, "RssFile");
    note(c, "attack phase: %.0f completions/s before; %d hostile connections in %d round%s of %d s", a->before,
         c->o.attack, a->rounds, a->rounds == 1 ? "" : "s", c->o.during_s);
    double cpu_sum = 0, during_sum = 0, ratio_sum = 0;
    for (int r = 0; r < a->rounds; r++) {
        chaos_hostile *h = chaos_hostile_start(c->listen, c->o.kinds, (unsigned)c->o.attack, c->o.seed + (unsigned)r);
        if (h == NULL) {
            fail(c, "the hostile connections could not be started");
            return;
        }
        double cpu;
        a->a[r] = attack_window(c, c->o.during_s, true, &cpu);
        cpu_sum += cpu;
        unsigned open = chaos_hostile_open(h);
        chaos_hostile_stats st;
        chaos_hostile_stop(h, &st);
        hostile_stats_add(&a->st, &st);
        a->q[r + 1] = attack_window(c, c->o.after_s, false, &a->cpu_after);
        during_sum += a->a[r];
        if (a->q[r] > 0 && a->q[r + 1] > 0)
            ratio_sum += a->a[r] / ((a->q[r] + a->q[r + 1]) / 2);
        note(c, "attack phase: round %d: %.0f completions/s during (%u hostile connections open at the end, %u at"
                " the peak), %.0f after",
             r + 1, a->a[r], open, st.open_peak, a->q[r + 1]);
    }
    a->during = during_sum / a->rounds;
    a->during_vs_quiet = ratio_sum / a->rounds;
    a->cpu_during = cpu_sum / a->rounds;
    a->after = a->q[a->rounds];
    a->rss_after_kb = rss_kb(c->d.pid);
    a->anon_after_kb = procfs_status_kb(c->d.pid, "RssAnon");
    a->file_after_kb = procfs_status_kb(c->d.pid, "RssFile");
    note(c, "attack phase: %.0f completions/s after; RSS %ld -> peak %ld -> %ld kB", a->after, a->rss_base_kb,
         a->rss_peak_kb, a->rss_after_kb);
}

/* ---- the fault phase ---- */

static void ev_dkill(struct chaos *c, event *e)
{
    e->read_ms = tp_mono_ms();
    read_stats(c, e);
    long long t = tp_mono_ms();
    e->read_kill_ms = t - e->read_ms;
    int rc = tp_daemon_stop(&c->d, SIGKILL, 10000);
    if (rc != 128 + SIGKILL)
        fail(c, "taskpushd was already gone at the kill (status %d)", rc);
    long long before = completions(c);
    if (daemon_start(c) != 0) {
        fail(c, "taskpushd did not come back after kill -9");
        return;
    }
    e->down_ms = tp_mono_ms() - t;
    e->first_ms = wait_first_completion(c, before < 0 ? 0 : before);
    note(c, "kill -9 of taskpushd (epoch %u, in flight %lld, pending writes %lld, buffered %lld): leader again"
            " after %lld ms, first completion %lld ms later",
         (unsigned)e->epoch, e->in_flight, e->pending, e->buffered, e->down_ms, e->first_ms);
}

static void ev_wkill(struct chaos *c, event *e)
{
    int lo = c->o.partition ? 1 : 0;
    int i = lo + (int)(rnd(c) % (uint64_t)(c->o.workers - lo));
    wproc *w = &c->w[i];
    read_stats(c, e);
    e->worker_in_flight = worker_in_flight(c, i);
    e->pid = w->pid;
    e->cap = w->cap;
    e->mono_from = e->mono_to = tp_mono_ms();
    kill(w->pid, SIGKILL);
    wait_child(w->pid, 10000);
    w->pid = 0;
    /* Back after a short random pause, as a supervisor would restart it. */
    sleep_ms((int)(rnd(c) % 300));
    if (worker_start(c, i) != 0)
        fail(c, "worker %d could not be restarted", i);
    note(c, "kill -9 of worker %d (pid %d, capacity %u, holding %lld)", i, (int)e->pid, e->cap,
         e->worker_in_flight);
}

static void ev_db(struct chaos *c, event *e)
{
    read_stats(c, e);
    long long before = completions(c);
    long long t = tp_mono_ms();
    if (e->kill9) {
        pid_t pid = mariadb_pid(c);
        if (pid <= 0 || kill(pid, SIGKILL) != 0) {
            fail(c, "cannot kill -9 mariadbd (pid file in %s)", c->mysql_dir);
            return;
        }
        for (long long end = tp_mono_ms() + 30000; tp_mono_ms() < end && kill(pid, 0) == 0;)
            sleep_ms(20);
    }
    if (c->conn) {
        mysql_close(c->conn);
        c->conn = NULL;
    }
    if (mariadb_restart(c) != 0) {
        fail(c, "MariaDB did not come back (tp-mariadb restart %s)", c->mysql_dir);
        return;
    }
    e->down_ms = tp_mono_ms() - t;
    e->first_ms = wait_first_completion(c, before < 0 ? 0 : before);
    note(c, "MariaDB %s (pending writes before %lld): up again after %lld ms, first completion %lld ms later",
         e->kill9 ? "kill -9 and restart" : "restart", e->pending, e->down_ms, e->first_ms);
}

static void ev_partition(struct chaos *c, event *e)
{
    wproc *w = &c->w[0];
    read_stats(c, e);
    e->worker_in_flight = worker_in_flight(c, 0);
    e->pid = w->pid;
    e->cap = w->cap;
    e->noticed_ms = -1;
    long long t = tp_mono_ms(), min_hold = 6 * HEARTBEAT_MS;
    e->mono_from = t;
    chaos_proxy_hold(c->proxy, true);
    /* At least six heartbeats, and until taskpushd has dropped the worker (at most 10 s). */
    while (tp_mono_ms() - t < 10000) {
        if (e->noticed_ms < 0 && worker_in_flight(c, 0) < 0)
            e->noticed_ms = tp_mono_ms() - t;
        if (tp_mono_ms() - t >= min_hold && e->noticed_ms >= 0)
            break;
        tick(c);
    }
    chaos_proxy_hold(c->proxy, false);
    e->mono_to = tp_mono_ms();
    e->down_ms = e->mono_to - t;
    note(c, "partition of worker 0 (pid %d, holding %lld): %lld ms, taskpushd dropped it after %lld ms",
         (int)e->pid, e->worker_in_flight, e->down_ms, e->noticed_ms);
}

static int cmp_event(const void *a, const void *b)
{
    const event *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

static void add_events(struct chaos *c, int kind, int n, double offset)
{
    for (int j = 0; j < n && c->nev < MAX_EVENTS; j++) {
        event *e = &c->ev[c->nev++];
        memset(e, 0, sizeof *e);
        e->kind = kind;
        e->at = 0.05 + 0.8 * ((double)j + offset) / (double)n;
        e->kill9 = kind == EV_DB && j == n - 1;
        e->first_ms = e->noticed_ms = -1;
    }
}

static void fault_phase(struct chaos *c)
{
    add_events(c, EV_DKILL, c->o.dkills, 0.5);
    add_events(c, EV_WKILL, c->o.wkills, 0.3);
    add_events(c, EV_DB, c->o.dbrestarts, 0.7);
    if (c->o.partition)
        add_events(c, EV_PARTITION, 1, 0.55);
    qsort(c->ev, (size_t)c->nev, sizeof c->ev[0], cmp_event);

    if (c->o.attack > 0) {
        unsigned slots = (unsigned)(c->o.attack / 10 > CHAOS_NKINDS ? c->o.attack / 10 : CHAOS_NKINDS);
        c->bg = chaos_hostile_start(c->listen, c->o.kinds, slots, c->o.seed + 1);
        note(c, "fault phase: %u hostile connections run throughout", slots);
    }
    /* Tasks arrive in bursts of R once a second rather than all at once: at full speed
     * the workers finish faster than the results are written and the events would land
     * on an idle system; at a trickle nothing would be in flight when they fire. An event
     * fires 0..50 ms after a burst, once deliveries are in flight, at most one per burst,
     * once its fraction of the tasks has been fed. */
    long long ev_at = -1, last_event = 0;
    note(c, "fault phase: %ld tasks in bursts of %d a second, %d events", c->o.tasks, c->o.rate, c->nev);
    c->feeding = true;
    c->next_burst = tp_mono_ms();
    int next = 0;
    long long next_check = 0;
    for (;;) {
        if (past_deadline(c)) {
            long long n0 = db_num(c, "SELECT COUNT(*) FROM task WHERE task_state = 0");
            long long n1 = db_num(c, "SELECT COUNT(*) FROM task WHERE task_state = 1");
            fail(c, "deadline (%d s) passed with %lld rows NEW and %lld PROCESSING, %ld of %ld tasks fed,"
                    " %d of %d events run",
                 c->o.deadline_s, n0, n1, c->fed, c->o.tasks, next, c->nev);
            c->feeding = false;
            return;
        }
        long long now = tp_mono_ms();
        if (ev_at < 0 && next < c->nev && (double)c->fed / (double)c->o.tasks >= c->ev[next].at &&
            (c->last_burst > last_event || c->fed >= c->o.tasks))
            ev_at = (c->fed < c->o.tasks ? c->last_burst : now) + (long long)(rnd(c) % 50);
        if (ev_at >= 0 && now >= ev_at) {
            /* The workers finish a burst in a fraction of a second: strike while they
             * hold deliveries (polled; at most 1 s). */
            for (long long end = tp_mono_ms() + 1000;
                 tp_mono_ms() < end && tp_daemon_stat(&c->d, "queue.in_flight") <= 0;)
                sleep_ms(2);
            event *e = &c->ev[next++];
            e->t_ms = since(c);
            switch (e->kind) {
            case EV_DKILL:
                ev_dkill(c, e);
                break;
            case EV_WKILL:
                ev_wkill(c, e);
                break;
            case EV_DB:
                ev_db(c, e);
                break;
            default:
                ev_partition(c, e);
                break;
            }
            e->done = true;
            ev_at = -1;
            last_event = tp_mono_ms();
            continue;
        }
        if (c->fed == c->o.tasks && next >= c->nev && tp_mono_ms() >= next_check) {
            next_check = tp_mono_ms() + 500;
            if (db_num(c, "SELECT COUNT(*) FROM task WHERE task_state IN (0, 1)") == 0)
                break;
        }
        tick(c);
    }
    c->feeding = false;
    if (next < c->nev)
        fail(c, "only %d of %d events ran", next, c->nev);
    note(c, "fault phase: every row is final");
}

/* ---- the verdict ---- */

static int cmp_exec(const void *a, const void *b)
{
    const exec_line *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    if (x->epoch != y->epoch)
        return x->epoch < y->epoch ? -1 : 1;
    return x->attempt < y->attempt ? -1 : x->attempt > y->attempt;
}

/* Appends the lines of one worker log. Returns 0 or -1 (malformed line, no memory). */
static int read_log(const char *path, exec_line **v, size_t *n, size_t *cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errno == ENOENT ? 0 : -1;
    unsigned long long id;
    unsigned attempt, epoch;
    int pid, got;
    long long start;
    while ((got = fscanf(f, "%llu %u %u %d %lld", &id, &attempt, &epoch, &pid, &start)) == 5) {
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 65536;
            exec_line *nv = realloc(*v, nc * sizeof *nv);
            if (nv == NULL) {
                fclose(f);
                return -1;
            }
            *v = nv;
            *cap = nc;
        }
        (*v)[(*n)++] = (exec_line){id, attempt, epoch, (pid_t)pid, start};
    }
    bool eof = feof(f);
    fclose(f);
    return eof ? 0 : -1;
}

typedef struct verdict {
    long long rows, missing, not_final, processing, failed, succ_no_exec, lost;
    long long audit_twice, audit_distinct, successful;
    long long executions, attempts, slack;
    long long dups_total, dups_other_epoch, dups_unexplained, dups_partition;
} verdict;

static event *event_for_epoch(struct chaos *c, uint32_t epoch)
{
    for (int i = 0; i < c->nev; i++)
        if (c->ev[i].kind == EV_DKILL && c->ev[i].done && c->ev[i].epoch == epoch)
            return &c->ev[i];
    return NULL;
}

/* The worker kill or partition that explains a repeated run of an execution that began
 * at start_ms on pid: that pid was killed, or partitioned, within RERUN_WINDOW_MS after
 * it began. (A pid that was killed late in the run also ran tasks long before; those
 * are not the kill's.) */
#define RERUN_WINDOW_MS 2000

static event *event_for_pid(struct chaos *c, pid_t pid, long long start_ms)
{
    for (int i = 0; i < c->nev; i++) {
        event *e = &c->ev[i];
        if ((e->kind == EV_WKILL || e->kind == EV_PARTITION) && e->done && e->pid == pid &&
            start_ms <= e->mono_to && start_ms >= e->mono_from - RERUN_WINDOW_MS)
            return e;
    }
    return NULL;
}

static int judge(struct chaos *c, verdict *v)
{
    memset(v, 0, sizeof *v);
    exec_line *ex = NULL;
    size_t nex = 0, capex = 0;
    for (int i = 0; i < c->o.workers; i++)
        if (read_log(c->w[i].log, &ex, &nex, &capex) < 0) {
            fail(c, "worker log %s is unreadable or malformed", c->w[i].log);
            free(ex);
            return -1;
        }
    qsort(ex, nex, sizeof *ex, cmp_exec);
    v->executions = (long long)nex;

    if (db_query(c, "SELECT task_id, task_state, attempts FROM task ORDER BY task_id") < 0) {
        fail(c, "cannot read the task table");
        free(ex);
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(c->conn);
    if (res == NULL) {
        fail(c, "cannot read the task table");
        free(ex);
        return -1;
    }
    MYSQL_ROW row;
    size_t e = 0;
    while ((row = mysql_fetch_row(res)) != NULL) {
        uint64_t id = strtoull(row[0], NULL, 10);
        int state = atoi(row[1]);
        long long attempts = strtoll(row[2], NULL, 10);
        v->rows++;
        v->attempts += attempts;
        v->not_final += state != 2 && state != 3;
        v->processing += state == 1;
        v->failed += state == 3;
        v->successful += state == 2;
        while (e < nex && ex[e].id < id)
            e++; /* executions of a row that is gone: cannot happen, the rows are never deleted */
        size_t first = e;
        for (; e < nex && ex[e].id == id; e++) {
            event *late = event_for_epoch(c, ex[e].epoch);
            if (late && ex[e].start_ms >= late->read_ms)
                late->late++;
            if (e == first)
                continue;
            const exec_line *p = &ex[e - 1], *q = &ex[e];
            v->dups_total++;
            if (q->epoch != p->epoch) {
                event *k = event_for_epoch(c, p->epoch);
                if (k)
                    k->dups++;
                else
                    v->dups_other_epoch++;
            } else {
                event *k = event_for_pid(c, p->pid, p->start_ms);
                if (k)
                    k->dups++;
                else
                    v->dups_unexplained++;
                v->dups_partition += k && k->kind == EV_PARTITION;
            }
        }
        if (state == 2 && e == first)
            v->succ_no_exec++;
    }
    mysql_free_result(res);
    free(ex);

    v->missing = c->inserted - v->rows;
    v->lost = v->not_final + (v->missing > 0 ? v->missing : 0) + v->succ_no_exec;
    v->audit_twice = db_num(c, "SELECT COUNT(*) FROM (SELECT task_id FROM chaos_audit GROUP BY task_id"
                               " HAVING COUNT(*) > 1) t");
    v->audit_distinct = db_num(c, "SELECT COUNT(DISTINCT task_id) FROM chaos_audit");
    for (int i = 0; i < c->nev; i++)
        if (c->ev[i].done && (c->ev[i].kind == EV_WKILL || c->ev[i].kind == EV_PARTITION))
            v->slack += c->ev[i].cap;

    if (v->lost > 0)
        fail(c, "%lld tasks lost (%lld rows not SUCCESSFUL/FAILED, %lld missing, %lld SUCCESSFUL but never run)",
             v->lost, v->not_final, v->missing, v->succ_no_exec);
    if (v->audit_twice != 0)
        fail(c, "%lld rows became SUCCESSFUL more than once (audit trigger)", v->audit_twice);
    if (v->audit_distinct != v->successful)
        fail(c, "the audit saw %lld rows become SUCCESSFUL, the table has %lld", v->audit_distinct, v->successful);
    if (v->processing != 0)
        fail(c, "%lld rows left PROCESSING", v->processing);
    if (v->attempts - v->executions > v->slack)
        fail(c, "attempts charged (%lld) exceed executions (%lld) by %lld, more than the killed and partitioned"
                " workers could hold (%lld): attempts charged for tasks never delivered",
             v->attempts, v->executions, v->attempts - v->executions, v->slack);
    for (int i = 0; i < c->nev; i++) {
        event *k = &c->ev[i];
        /* What was in flight at the kill: in flight at the read, plus the deliveries that
         * began between the read and the kill (the worker logs carry start times). */
        if (k->kind == EV_DKILL && k->done && k->dups > k->in_flight + k->pending + k->late)
            fail(c, "kill -9 of taskpushd at %.1f s (epoch %u): %lld duplicate executions, more than in flight"
                    " (%lld, and %lld begun after that was read) plus outcomes not yet written (%lld)",
                 (double)k->t_ms / 1000.0, (unsigned)k->epoch, k->dups, k->in_flight, k->late, k->pending);
    }
    return 0;
}

static const char *ev_name(int kind)
{
    static const char *const names[] = {"dispatcher kill -9", "worker kill -9", "MariaDB restart", "partition"};
    return kind >= 0 && kind <= EV_PARTITION ? names[kind] : "?";
}

static void report(struct chaos *c, const verdict *v, long long elapsed_ms)
{
    const attack_figures *a = &c->atk;
    printf("\n==== chaos figures (%s, seed %u, %.1f s) ====\n", c->o.tasks >= 100000 ? "long run" : "run",
           c->o.seed, (double)elapsed_ms / 1000.0);
    printf("tasks inserted                 %lld (%ld in the fault phase, %d types, %d workers)\n", c->inserted,
           c->o.tasks, c->o.types, c->o.workers);
    printf("tasks lost                     %lld\n", v->lost);
    printf("rows SUCCESSFUL more than once %lld (audit trigger)\n", v->audit_twice);
    printf("rows left PROCESSING           %lld\n", v->processing);
    printf("rows FAILED                    %lld (every handler succeeds: each is honest work not done)\n",
           v->failed);
    if (v->failed > 0 &&
        db_query(c, "SELECT err_msg, COUNT(*) FROM task WHERE task_state = 3 GROUP BY err_msg"
                    " ORDER BY 2 DESC LIMIT 5") == 0) {
        MYSQL_RES *res = mysql_store_result(c->conn);
        MYSQL_ROW row;
        while (res && (row = mysql_fetch_row(res)) != NULL)
            printf("  %8s x %.200s\n", row[1] ? row[1] : "?", row[0] ? row[0] : "(no message)");
        if (res)
            mysql_free_result(res);
    }
    printf("attempts charged / executions  %lld / %lld (difference %lld, allowed %lld)\n", v->attempts,
           v->executions, v->attempts - v->executions, v->slack);
    printf("duplicate executions           %lld (other epoch changes %lld; in one epoch with no kill or partition"
           " of that worker around it, e.g. a worker taskpushd dropped: %lld)\n",
           v->dups_total, v->dups_other_epoch, v->dups_unexplained);
    printf("taskpushd exits on its own     %d; worker exits on their own %d\n", c->unplanned_daemon_exits,
           c->worker_self_exits);
    printf("events:\n");
    for (int i = 0; i < c->nev; i++) {
        const event *e = &c->ev[i];
        if (!e->done)
            continue;
        printf("  %7.1f s  %-20s", (double)e->t_ms / 1000.0, e->kind == EV_DB && e->kill9 ? "MariaDB kill -9" : ev_name(e->kind));
        switch (e->kind) {
        case EV_DKILL:
            printf(" epoch %u: dups %lld vs in flight %lld (+%lld begun after the read, %lld ms before the"
                   " kill) + pending writes %lld (buffered %lld); back %lld ms, first completion +%lld ms\n",
                   (unsigned)e->epoch, e->dups, e->in_flight, e->late, e->read_kill_ms, e->pending, e->buffered,
                   e->down_ms, e->first_ms);
            break;
        case EV_WKILL:
            printf(" pid %d cap %u: dups %lld vs it held %lld (all in flight %lld)\n", (int)e->pid, e->cap,
                   e->dups, e->worker_in_flight, e->in_flight);
            break;
        case EV_DB:
            printf(" pending writes %lld: down %lld ms, first completion +%lld ms\n", e->pending, e->down_ms,
                   e->first_ms);
            break;
        default:
            printf(" pid %d cap %u held %lld: %lld ms, dropped after %lld ms, dups %lld\n", (int)e->pid, e->cap,
                   e->worker_in_flight, e->down_ms, e->noticed_ms, e->dups);
            break;
        }
    }
    if (a->ran) {
        printf("attack phase (%d hostile connections, peak open %u, %" PRIu64 " connects, %" PRIu64
               " closed by taskpushd):\n",
               c->o.attack, a->st.open_peak, a->st.connects, a->st.closed_by_peer);
        printf("  honest completions/s         before %.0f, during %.0f (%.0f %%), after %.0f (%.0f %%)\n",
               a->before, a->during, a->before > 0 ? 100.0 * a->during / a->before : 0, a->after,
               a->before > 0 ? 100.0 * a->after / a->before : 0);
        printf("  during vs the quiet windows  %.0f %% (each attacked window over the mean of the quiet ones"
               " beside it)\n",
               100.0 * a->during_vs_quiet);
        printf("  windows (quiet, attacked)    %.0f", a->q[0]);
        for (int r = 0; r < a->rounds; r++)
            printf(" [%.0f] %.0f", a->a[r], a->q[r + 1]);
        printf("\n");
        printf("  taskpushd RSS                baseline %ld kB, peak %ld kB, after %ld kB\n", a->rss_base_kb,
               a->rss_peak_kb, a->rss_after_kb);
        printf("    of which anonymous         baseline %ld kB, after %ld kB (heap and stacks)\n", a->anon_base_kb,
               a->anon_after_kb);
        printf("    of which file-backed       baseline %ld kB, after %ld kB (library pages mapped in)\n",
               a->file_base_kb, a->file_after_kb);
        printf("  taskpushd CPU (%% of a core)  before %.0f, during %.0f, after %.0f\n", a->cpu_before,
               a->cpu_during, a->cpu_after);
        printf("  /healthz                     %d polls, %d failed during the attack, %d failed in all\n",
               a->health_polls, a->health_fail_during, a->health_fail_total);
    }

    json_t *evs = json_array();
    for (int i = 0; i < c->nev; i++) {
        const event *e = &c->ev[i];
        if (e->done)
            json_array_append_new(
                evs, json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "kind",
                               ev_name(e->kind), "kill9", e->kill9, "t_ms", (json_int_t)e->t_ms, "epoch",
                               (json_int_t)e->epoch, "in_flight", (json_int_t)e->in_flight, "pending_writes",
                               (json_int_t)e->pending, "buffered", (json_int_t)e->buffered, "worker_in_flight",
                               (json_int_t)e->worker_in_flight, "capacity", (json_int_t)e->cap, "down_ms",
                               (json_int_t)e->down_ms, "first_completion_ms", (json_int_t)e->first_ms,
                               "noticed_ms", (json_int_t)e->noticed_ms, "dups", (json_int_t)e->dups,
                               "begun_after_read", (json_int_t)e->late, "read_to_kill_ms",
                               (json_int_t)e->read_kill_ms));
    }
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:o}", "inserted",
                          (json_int_t)c->inserted, "lost", (json_int_t)v->lost, "successful_twice",
                          (json_int_t)v->audit_twice, "left_processing", (json_int_t)v->processing, "failed",
                          (json_int_t)v->failed, "attempts", (json_int_t)v->attempts, "executions",
                          (json_int_t)v->executions, "attempts_slack", (json_int_t)v->slack, "dups",
                          (json_int_t)v->dups_total, "dups_unexplained", (json_int_t)v->dups_unexplained,
                          "dups_other_epoch", (json_int_t)v->dups_other_epoch, "elapsed_ms",
                          (json_int_t)elapsed_ms, "daemon_exits", c->unplanned_daemon_exits, "events", evs);
    if (o && a->ran)
        json_object_set_new(
            o, "attack",
            json_pack("{s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:i, s:i, s:i, s:I}", "connections", c->o.attack,
                      "open_peak", (int)a->st.open_peak, "before_per_s", a->before, "during_per_s", a->during,
                      "after_per_s", a->after, "rss_base_kb", (json_int_t)a->rss_base_kb, "rss_peak_kb",
                      (json_int_t)a->rss_peak_kb, "rss_after_kb", (json_int_t)a->rss_after_kb, "healthz_polls",
                      a->health_polls, "healthz_fail_during", a->health_fail_during, "healthz_fail",
                      a->health_fail_total, "connects", (json_int_t)a->st.connects));
    json_t *atk = o ? json_object_get(o, "attack") : NULL;
    if (atk) {
        json_object_set_new(atk, "rounds", json_integer(a->rounds));
        json_object_set_new(atk, "rss_anon_base_kb", json_integer(a->anon_base_kb));
        json_object_set_new(atk, "rss_anon_after_kb", json_integer(a->anon_after_kb));
        json_object_set_new(atk, "rss_file_base_kb", json_integer(a->file_base_kb));
        json_object_set_new(atk, "rss_file_after_kb", json_integer(a->file_after_kb));
        json_object_set_new(atk, "during_vs_quiet", json_real(a->during_vs_quiet));
        json_object_set_new(atk, "cpu_before_pct", json_real(a->cpu_before));
        json_object_set_new(atk, "cpu_during_pct", json_real(a->cpu_during));
        json_object_set_new(atk, "cpu_after_pct", json_real(a->cpu_after));
    }
    if (o) {
        json_object_set_new(o, "failures", json_integer(c->nfail));
        char *line = json_dumps(o, JSON_COMPACT);
        if (line)
            printf("CHAOS_JSON %s\n", line);
        free(line);
        json_decref(o);
    }
    printf("verdict: %s\n", c->nfail ? "FAIL" : "PASS");
    if (c->nfail)
        printf("%s", c->fail_text);
    fflush(stdout);
}

/* ---- setup and main ---- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int usage(FILE *f, int rc)
{
    fprintf(f,
            "usage: chaos [--short] [--tasks N] [--dispatcher-kills N] [--worker-kills N] [--db-restarts N]\n"
            "             [--no-partition] [--attack N] [--hostile KIND,...|all] [--types K] [--workers W]\n"
            "             [--rate R] [--deadline-s S] [--seed S] [--keep] [--attack-rounds R]\n"
            "             [--taskpushd-arg A]... (up to 4: one more argument for taskpushd each)\n"
            "Needs the environment of `eval \"$(scripts/tp-mariadb start DIR)\"`. Hostile kinds:");
    for (int k = 0; k < CHAOS_NKINDS; k++)
        fprintf(f, " %s", chaos_kind_name(k));
    fprintf(f, "\n");
    return rc;
}

static long parse_num(const char *s, long lo, long hi, bool *ok)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        *ok = false;
    return v;
}

static int parse_args(int argc, char **argv, chaos_opts *o)
{
    enum { O_SHORT = 1, O_TASKS, O_DK, O_WK, O_DB, O_NOPART, O_PART, O_ATTACK, O_HOSTILE, O_TYPES,
           O_WORKERS, O_DEADLINE, O_SEED, O_RATE, O_KEEP, O_ROUNDS, O_TPD_ARG, O_HELP };
    static const struct option longopts[] = {
        {"short", no_argument, NULL, O_SHORT},
        {"tasks", required_argument, NULL, O_TASKS},
        {"dispatcher-kills", required_argument, NULL, O_DK},
        {"worker-kills", required_argument, NULL, O_WK},
        {"db-restarts", required_argument, NULL, O_DB},
        {"partition", no_argument, NULL, O_PART},
        {"no-partition", no_argument, NULL, O_NOPART},
        {"attack", required_argument, NULL, O_ATTACK},
        {"hostile", required_argument, NULL, O_HOSTILE},
        {"types", required_argument, NULL, O_TYPES},
        {"workers", required_argument, NULL, O_WORKERS},
        {"deadline-s", required_argument, NULL, O_DEADLINE},
        {"seed", required_argument, NULL, O_SEED},
        {"rate", required_argument, NULL, O_RATE},
        {"keep", no_argument, NULL, O_KEEP},
        {"attack-rounds", required_argument, NULL, O_ROUNDS},
        {"taskpushd-arg", required_argument, NULL, O_TPD_ARG},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    /* The long run by default; --short first, wherever it is, so other flags refine it. */
    *o = (chaos_opts){.tasks = 100000, .dkills = 5, .wkills = 20, .dbrestarts = 2, .partition = true,
                      .attack = 1000, .kinds = CHAOS_ALL_KINDS, .types = 4, .workers = 8, .deadline_s = 600,
                      .rate = 1000,
                      .before_s = 5, .during_s = 5, .after_s = 5, .rounds = 3, .seed = 1};
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--short") == 0) {
            o->tasks = 10000;
            o->dkills = 2;
            o->wkills = 3;
            o->dbrestarts = 1;
            o->attack = 100;
            o->deadline_s = 180;
            o->before_s = 3;
            o->during_s = 5;
            o->after_s = 3;
            o->rounds = 1;
        }
    bool ok = true;
    int opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case O_SHORT:
            break;
        case O_TASKS:
            o->tasks = parse_num(optarg, 1, 10000000, &ok);
            break;
        case O_DK:
            o->dkills = (int)parse_num(optarg, 0, 50, &ok);
            break;
        case O_WK:
            o->wkills = (int)parse_num(optarg, 0, 100, &ok);
            break;
        case O_DB:
            o->dbrestarts = (int)parse_num(optarg, 0, 20, &ok);
            break;
        case O_PART:
            o->partition = true;
            break;
        case O_NOPART:
            o->partition = false;
            break;
        case O_ATTACK:
            o->attack = (int)parse_num(optarg, 0, 4000, &ok);
            break;
        case O_HOSTILE:
            if (chaos_kinds_parse(optarg, &o->kinds) < 0)
                ok = false;
            break;
        case O_TYPES:
            o->types = (int)parse_num(optarg, 1, MAX_TYPES, &ok);
            break;
        case O_WORKERS:
            o->workers = (int)parse_num(optarg, 2, MAX_WORKERS, &ok);
            break;
        case O_DEADLINE:
            o->deadline_s = (int)parse_num(optarg, 10, 86400, &ok);
            break;
        case O_SEED:
            o->seed = (unsigned)parse_num(optarg, 0, INT_MAX, &ok);
            break;
        case O_RATE:
            o->rate = (int)parse_num(optarg, 20, 1000000, &ok);
            break;
        case O_ROUNDS:
            o->rounds = (int)parse_num(optarg, 1, ATTACK_MAX_ROUNDS, &ok);
            break;
        case O_KEEP:
            o->keep = true;
            break;
        case O_TPD_ARG:
            if (o->ntpd_args == MAX_TPD_ARGS || !*optarg)
                ok = false;
            else
                o->tpd_args[o->ntpd_args++] = optarg;
            break;
        case O_HELP:
            exit(usage(stdout, 0));
        default:
            ok = false;
        }
    }
    if (!ok || optind != argc)
        return usage(stderr, -1);
    return 0;
}

/* TASKPUSH_BUILD_ROOT (set by meson test) or, run by hand, two levels above this program. */
static void find_build_root(void)
{
    if (getenv("TASKPUSH_BUILD_ROOT"))
        return;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(exe, '/');
        if (slash == NULL)
            return;
        *slash = '\0';
    }
    setenv("TASKPUSH_BUILD_ROOT", exe, 1);
}

static int setup(struct chaos *c)
{
    const char *dir = getenv("TASKPUSH_TEST_MYSQL_DIR");
    if (dir == NULL || *dir == '\0') {
        fprintf(stderr, "chaos: TASKPUSH_TEST_MYSQL_DIR is not set; start the server with\n"
                        "    eval \"$(scripts/tp-mariadb start /tmp/tpdb)\"\n");
        return -1;
    }
    snprintf(c->mysql_dir, sizeof c->mysql_dir, "%s", dir);
    const char *src = getenv("TASKPUSH_SOURCE_ROOT");
    snprintf(c->tp_mariadb, sizeof c->tp_mariadb, "%s/scripts/tp-mariadb", src && *src ? src : CHAOS_SOURCE_ROOT);
    if (access(c->tp_mariadb, X_OK) != 0) {
        fprintf(stderr, "chaos: %s is not executable\n", c->tp_mariadb);
        return -1;
    }
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(c->workdir, sizeof c->workdir, "%s/chaos-XXXXXX", tmp);
    if (mkdtemp(c->workdir) == NULL) {
        fprintf(stderr, "chaos: mkdtemp %s: %s\n", c->workdir, strerror(errno));
        return -1;
    }
    /* tp_daemon_start puts taskpushd's logs under TMPDIR: keep them with the run's files. */
    setenv("TMPDIR", c->workdir, 1);

    if (tp_testdb_create("chaos", &c->db) != 0)
        return -1;
    c->have_db = true;
    if (audit_setup(c) != 0)
        return -1;
    if (daemon_start(c) != 0)
        return -1;
    if (c->o.partition) {
        c->proxy = chaos_proxy_start(c->listen, c->proxy_addr, sizeof c->proxy_addr);
        if (c->proxy == NULL)
            return -1;
    }
    for (int i = 0; i < c->o.workers; i++) {
        wproc *w = &c->w[i];
        w->cap = 4 + (unsigned)(rnd(c) % 13);
        w->proxied = c->o.partition && i == 0;
        snprintf(w->log, sizeof w->log, "%s/w%d.log", c->workdir, i);
        snprintf(w->err, sizeof w->err, "%s/w%d.err", c->workdir, i);
        if (worker_start(c, i) != 0)
            return -1;
    }
    for (long long end = tp_mono_ms() + 30000; tp_daemon_stat(&c->d, "workers") < c->o.workers;) {
        if (tp_mono_ms() >= end) {
            fprintf(stderr, "chaos: the %d workers did not all connect within 30 s\n", c->o.workers);
            return -1;
        }
        sleep_ms(50);
    }
    note(c, "taskpushd pid %d on %s (admin %s), %d workers%s, database %s, files in %s", (int)c->d.pid, c->listen,
         c->d.admin, c->o.workers, c->o.partition ? " (worker 0 through the partition proxy)" : "", c->db.name,
         c->workdir);
    return 0;
}

static void teardown(struct chaos *c)
{
    chaos_hostile_stop(c->bg, &c->bg_st);
    c->bg = NULL;
    for (int i = 0; i < c->o.workers; i++)
        if (c->w[i].pid > 0) {
            kill(c->w[i].pid, SIGTERM);
            if (wait_child(c->w[i].pid, STOP_WAIT_MS) != 0)
                note(c, "worker %d did not stop cleanly", i);
            c->w[i].pid = 0;
        }
    chaos_proxy_stop(c->proxy);
    c->proxy = NULL;
    if (c->d.pid > 0) {
        int rc = tp_daemon_stop(&c->d, SIGTERM, STOP_WAIT_MS);
        if (rc != 0)
            fail(c, "taskpushd did not stop cleanly on SIGTERM (status %d)", rc);
    }
}

int main(int argc, char **argv)
{
    struct chaos *c = calloc(1, sizeof *c);
    if (c == NULL)
        return 2;
    if (parse_args(argc, argv, &c->o) < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    find_build_root();
    /* Room for the hostile connections (taskpushd inherits the limit). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    c->rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)c->o.seed * 0x100000001B3ULL + 1);
    c->t0 = tp_mono_ms();
    c->deadline = c->t0 + (long long)c->o.deadline_s * 1000;
    fprintf(stderr,
            "# chaos: %ld tasks, %d dispatcher kills, %d worker kills, %d MariaDB restarts, partition %s,"
            " %d hostile connections, %d types, %d workers, deadline %d s, seed %u\n",
            c->o.tasks, c->o.dkills, c->o.wkills, c->o.dbrestarts, c->o.partition ? "on" : "off", c->o.attack,
            c->o.types, c->o.workers, c->o.deadline_s, c->o.seed);

    int rc = 2;
    if (setup(c) != 0) {
        fprintf(stderr, "chaos: setup failed\n");
        teardown(c);
        goto done;
    }
    if (c->o.attack > 0)
        attack_phase(c);
    fault_phase(c);
    teardown(c);
    verdict v;
    if (c->conn == NULL)
        c->conn = db_open(&c->db);
    judge(c, &v);
    struct stat sb;
    if (stat(c->d.log_path, &sb) == 0)
        c->log_bytes = sb.st_size;
    report(c, &v, since(c));
    rc = c->nfail ? 1 : 0;
done:
    if (c->conn)
        mysql_close(c->conn);
    if (rc != 0 || c->o.keep) {
        fprintf(stderr, "# chaos: files kept in %s, database %s kept\n", c->workdir, c->db.name);
        setenv("TASKPUSH_TEST_KEEP_DB", "1", 1);
    }
    if (c->have_db) {
        /* Its connection died with a MariaDB restart: a fresh one drops the database. */
        if (c->db.conn)
            mysql_close(c->db.conn);
        c->db.conn = db_open(&c->db);
        tp_testdb_drop(&c->db);
    }
    if (rc == 0 && !c->o.keep && c->workdir[0])
        nftw(c->workdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(c);
    return rc;
}
