/* test_cutover: the harness of the cut-over from a team's own queue to taskpush
 * (docs/adopting.md, issue 31 item 3): the team's table, its compare-and-set pollers and
 * its producer (tests/integration/team_queue.c, processes of their own), and the count of
 * executions from their records.
 *
 * Cases:
 *   pollers_exactly_once   the team's table with 2,000 NEW rows, 16 CAS pollers and a
 *                          producer inserting 50 rows/s for 5 s: every row, preloaded or
 *                          produced, is executed exactly once, none is left NEW or
 *                          PROCESSING, the producer saw no error, and the pollers' CAS
 *                          did miss (they raced: the storm taskpush removes)
 *   cutover                the recipe of docs/adopting.md, step by step, with
 *                          scripts/taskpush-adopt: the team's table with
 *                          TASKPUSH_CUTOVER_ROWS rows (default 20,000), 16 CAS pollers and
 *                          a producer at 50 rows/s running throughout; taskpushd --table
 *                          jobs and a libtaskpush worker start; a row is held PROCESSING by
 *                          a poller (the test's own CAS) when the mover starts; the mover
 *                          follows; the pollers stop; the producer's rows keep being
 *                          forwarded; the producer stops; everything drains. Every row is
 *                          executed exactly once, by a poller or a worker (the records of
 *                          both), the held row by its poller only, none is left NEW or
 *                          moved, every team row SUCCESSFUL (written back), the producer
 *                          saw no error
 *   rollback_halfway       the mover runs with pollers and producer still running and a
 *                          worker whose handlers are held; it is stopped and --rollback
 *                          puts back every row taskpush had not started (none left NEW in
 *                          jobs), leaving the ones in flight moved; the handlers are let go
 *                          and --rollback --follow writes their outcomes back; the pollers
 *                          finish everything else: still exactly once
 *   bad_flags              taskpush-adopt refuses bad flags with exit 2 and a message
 *                          naming the flag (PROCESSING as the moved state, a bad or long
 *                          table name, a bad batch, priority map, unknown flag)
 *
 * Without scripts/taskpush-adopt (before issue 31 item 3) the three new cases fail at the
 * mover's start; with the move's CAS removed from the tool (rows inserted into jobs but
 * left NEW in task) cutover fails on rows executed twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "run.h"
#include "rows.h"
#include "testdb.h"
#include "wait.h"

#define TEAM_TABLE                                                                              \
    "CREATE TABLE task (task_id BIGINT PRIMARY KEY AUTO_INCREMENT, task_state INT NOT NULL,"   \
    " task_priority INT NOT NULL, insert_time BIGINT NOT NULL, last_update_time BIGINT NOT"   \
    " NULL, payload TEXT) ENGINE=InnoDB"
#define PRELOAD 2000
#define POLLERS 16
#define PRODUCE_RATE "50"
#define PRODUCE_SECONDS 5
#define DRAIN_WAIT_MS 120000 /* a bound only: a hung poller fails the test */

struct cut;

struct fx {
    tp_testdb db;
    char dir[256];
    struct cut *cut; /* the cut-over cases' processes, ended by teardown after a failure */
};

static void cut_free(struct cut *c);

static const char *team_queue_path(void)
{
    static char path[512];
    const char *b = getenv("TASKPUSH_BUILD_ROOT");
    snprintf(path, sizeof path, "%s/tests/integration/team_queue", b ? b : ".");
    return path;
}

/* Starts team_queue MODE with the database options and extra (NULL-terminated) args,
 * its stdout into out_path. Returns the pid, or -1. */
static pid_t spawn(tp_testdb *db, const char *mode, const char *out_path, const char *const *extra)
{
    char port[16];
    const char *argv[32];
    int n = 0;

    snprintf(port, sizeof port, "%u", db->port);
    argv[n++] = team_queue_path();
    argv[n++] = mode;
    argv[n++] = "--host";
    argv[n++] = db->host;
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--user";
    argv[n++] = db->user;
    if (db->password[0]) {
        argv[n++] = "--password";
        argv[n++] = db->password;
    }
    argv[n++] = "--db";
    argv[n++] = db->name;
    for (int i = 0; extra[i] && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout); /* else the child flushes our buffered TAP lines again */
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(out_path, "w", stdout);
        (void)f;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int stop(pid_t pid)
{
    int status = 0;
    kill(pid, SIGTERM);
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

static uint64_t field(const char *text, const char *name)
{
    const char *p = text ? strstr(text, name) : NULL;
    return p ? strtoull(p + strlen(name), NULL, 10) : UINT64_MAX;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "%s/tp-cutover-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(fx->dir))
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    char cmd[300];
    cut_free(fx->cut);
    tp_testdb_drop(&fx->db);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "# could not remove %s\n", fx->dir);
    free(fx);
    return 0;
}

static void test_pollers_exactly_once(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char exec_log[300], prod_log[300], out[POLLERS + 1][300], name[POLLERS][16], secs[16];
    pid_t pollers[POLLERS], producer;

    assert_int_equal(tp_testdb_create("cutover", db), 0);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(tp_testdb_exec(db, TEAM_TABLE), 0);
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_state, task_priority, insert_time,"
                                    " last_update_time, payload) SELECT 1, seq %% 3, 1700000000000,"
                                    " 1700000000000, CONCAT('pre-', seq) FROM seq_1_to_%d",
                                    PRELOAD),
                     PRELOAD);
    snprintf(exec_log, sizeof exec_log, "%s/executions", fx->dir);
    snprintf(prod_log, sizeof prod_log, "%s/produced", fx->dir);
    snprintf(secs, sizeof secs, "%d", PRODUCE_SECONDS);

    for (int i = 0; i < POLLERS; i++) {
        snprintf(name[i], sizeof name[i], "poller-%d", i);
        snprintf(out[i], sizeof out[i], "%s/poller-%d.out", fx->dir, i);
        const char *extra[] = {"--name", name[i], "--log", exec_log, NULL};
        pollers[i] = spawn(db, "poll", out[i], extra);
        assert_true(pollers[i] > 0);
    }
    snprintf(out[POLLERS], sizeof out[POLLERS], "%s/producer.out", fx->dir);
    const char *pextra[] = {"--rate", PRODUCE_RATE, "--seconds", secs, "--log", prod_log, NULL};
    producer = spawn(db, "produce", out[POLLERS], pextra);
    assert_true(producer > 0);

    /* The producer stops by itself after PRODUCE_SECONDS; then the pollers drain. */
    int status = 0;
    assert_int_equal(waitpid(producer, &status, 0), producer);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    long long end = tp_mono_ms() + DRAIN_WAIT_MS;
    while (tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_state IN (1, 2)") != 0 &&
           tp_mono_ms() < end)
        tp_sleep_ms(200);
    for (int i = 0; i < POLLERS; i++)
        assert_int_equal(stop(pollers[i]), 0);

    char *pout = read_file(out[POLLERS]);
    uint64_t produced = field(pout, "inserted "), perrors = field(pout, " errors ");
    printf("# producer: %s", pout ? pout : "(no output)\n");
    free(pout);
    assert_true(produced != UINT64_MAX && produced > 0);
    assert_int_equal(perrors, 0);

    uint64_t executed = 0, misses = 0, errors = 0;
    for (int i = 0; i < POLLERS; i++) {
        char *s = read_file(out[i]);
        assert_non_null(s);
        executed += field(s, "executed ");
        misses += field(s, " misses ");
        errors += field(s, " errors ");
        free(s);
    }
    printf("# %d pollers: executed %" PRIu64 ", CAS misses %" PRIu64 ", errors %" PRIu64 "\n", POLLERS,
           executed, misses, errors);
    assert_int_equal(errors, 0);

    /* Every row exactly once: the records, loaded into the database, against the table. */
    assert_int_equal(tp_testdb_exec(db, "CREATE TABLE executions (task_id BIGINT NOT NULL,"
                                        " runner VARCHAR(64) NOT NULL)"),
                     0);
    char *log = read_file(exec_log);
    assert_non_null(log);
    uint64_t lines = 0;
    for (char *line = log, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl); /* a record is whole or absent */
        *nl = '\0';
        char *sp = strchr(line, ' ');
        assert_non_null(sp);
        *sp = '\0';
        assert_int_equal(tp_testdb_exec(db, "INSERT INTO executions VALUES (%s, '%s')", line, sp + 1), 1);
        lines++;
    }
    free(log);
    assert_int_equal(lines, executed);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task"), PRELOAD + produced);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_state = 3"),
                     PRELOAD + produced);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM (SELECT task_id FROM executions"
                                             " GROUP BY task_id HAVING COUNT(*) > 1) d"),
                     0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task t WHERE NOT EXISTS (SELECT 1"
                                             " FROM executions e WHERE e.task_id = t.task_id)"),
                     0);
    assert_int_equal(lines, PRELOAD + produced);
    /* The pollers raced for the same rows: the compare-and-set storm of the issue. */
    assert_true(misses > 0);
}


/* ---- The cut-over: taskpushd --table jobs, its worker, and scripts/taskpush-adopt ---- */

#define MOVED_STATE "5"         /* the team's code for "moved": not 1 to 4 */
#define ROWS_DEFAULT 20000      /* issue 31, Must show 3 */
#define ROLLBACK_ROWS_MAX 2000  /* the pollers drain the rollback case's rows themselves */
#define OUT_MAX 16384
#define RUN_LIMIT_MS 120000     /* a bound only, for a hung tool */
#define WORKER_SLOTS 16

/* A libtaskpush worker recording each execution as the pollers do: one whole line
 * "JOBS_TASK_ID NAME\n" per execution with one write() on an O_APPEND descriptor (mapped
 * to the team's task_id through jobs.dedup_key 'legacy:<id>' when counted). */
struct recorder {
    int fd;
    tp_gate *gate; /* NULL: handlers run at once */
    pthread_mutex_t mu;
    uint64_t errors;
};

static int on_task(tp_task *task, void *arg)
{
    struct recorder *r = arg;
    char line[64];

    if (r->gate)
        tp_gate_pass(r->gate);
    int n = snprintf(line, sizeof line, "%" PRIu64 " worker\n", tp_task_id(task));
    if (write(r->fd, line, (size_t)n) != n) {
        pthread_mutex_lock(&r->mu);
        r->errors++;
        pthread_mutex_unlock(&r->mu);
    }
    return TP_SUCCESS;
}

struct cut {
    tp_daemon d;
    bool started;
    tp_inproc w;
    tp_worker *wk;
    struct recorder rec;
    tp_gate gate;
    pid_t pollers[POLLERS], producer, mover;
    char poll_out[POLLERS][300], name[POLLERS][16], prod_out[300], mover_out[300];
    char exec_log[300], worker_log[300], prod_log[300];
};

static unsigned rows_wanted(void)
{
    const char *e = getenv("TASKPUSH_CUTOVER_ROWS");
    long n = e && *e ? strtol(e, NULL, 10) : ROWS_DEFAULT;
    return n >= 100 && n <= 1000000 ? (unsigned)n : ROWS_DEFAULT;
}

static const char *adopt_path(void)
{
    static char path[512];
    const char *s = getenv("TASKPUSH_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/scripts/taskpush-adopt", s ? s : ".");
    return path;
}

/* Runs argv (NULL-terminated) with stdout and stderr into out_path; the password, if any,
 * through MYSQL_PWD. Returns the pid. */
static pid_t spawn_argv(tp_testdb *db, const char *const *argv, const char *out_path)
{
    fflush(stdout); /* else the child flushes our buffered TAP lines again */
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out_path, "w", stdout))
            _exit(127);
        dup2(fileno(stdout), 2);
        if (db->password[0])
            setenv("MYSQL_PWD", db->password, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static pid_t start_mover(struct fx *fx, struct cut *c, const char *const *more)
{
    const char *argv[24] = {adopt_path(), "--db", fx->db.url, "--to", "jobs", "--moved-state",
                            MOVED_STATE};
    int n = 7;
    for (int i = 0; more[i] && n < 23; i++)
        argv[n++] = more[i];
    argv[n] = NULL;
    return spawn_argv(&fx->db, argv, c->mover_out);
}

/* Runs taskpush-adopt to its end with the arguments more; its exit status. */
static int run_adopt(struct fx *fx, const char *const *more, char *out)
{
    const char *argv[24] = {adopt_path(), "--db", fx->db.url, "--to", "jobs", "--moved-state",
                            MOVED_STATE};
    int n = 7;
    for (int i = 0; more[i] && n < 23; i++)
        argv[n++] = more[i];
    argv[n] = NULL;
    if (fx->db.password[0])
        setenv("MYSQL_PWD", fx->db.password, 1);
    return tp_run(argv, NULL, out, OUT_MAX, RUN_LIMIT_MS);
}

static uint64_t q(tp_testdb *db, const char *sql)
{
    return tp_testdb_query_u64(db, "%s", sql);
}

/* Waits (a bound only) until sql counts 0. */
static bool wait_zero(tp_testdb *db, const char *sql, int limit_ms)
{
    long long end = tp_mono_ms() + limit_ms;
    while (tp_mono_ms() < end) {
        if (q(db, sql) == 0)
            return true;
        tp_sleep_ms(100);
    }
    return false;
}

/* The team's table with rows NEW rows, and taskpush's jobs beside it (--migrate). */
static void make_tables(struct fx *fx, struct cut *c, unsigned rows)
{
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];

    assert_int_equal(tp_testdb_create("cutover", db), 0);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(tp_testdb_exec(db, TEAM_TABLE), 0);
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_state, task_priority, insert_time,"
                                    " last_update_time, payload) SELECT 1, seq %% 3, 1700000000000,"
                                    " 1700000000000, CONCAT('pre-', seq) FROM seq_1_to_%u",
                                    rows),
                     rows);
    const char *argv[] = {tp_build_path("dispatcher/taskpushd"), "--db", db->url, "--table", "jobs",
                          "--migrate", NULL};
    assert_int_equal(tp_run(argv, NULL, out, sizeof out, RUN_LIMIT_MS), 0);
    snprintf(c->exec_log, sizeof c->exec_log, "%s/executions", fx->dir);
    snprintf(c->worker_log, sizeof c->worker_log, "%s/worker-executions", fx->dir);
    snprintf(c->prod_log, sizeof c->prod_log, "%s/produced", fx->dir);
    snprintf(c->prod_out, sizeof c->prod_out, "%s/producer.out", fx->dir);
    snprintf(c->mover_out, sizeof c->mover_out, "%s/mover.out", fx->dir);
}

static void start_taskpush(struct fx *fx, struct cut *c, bool gated)
{
    const char *const extra[] = {"--table", "jobs", "--poll-ms", "20", "--adopt-grace-ms", "0", NULL};
    assert_int_equal(tp_daemon_start(&c->d, fx->db.url, extra), 0);
    c->started = true;
    if (tp_daemon_wait_leader(&c->d, 20000) != 0) {
        tp_daemon_dump_log(&c->d);
        fail_msg("taskpushd --table jobs did not lead");
    }
    c->rec.fd = open(c->worker_log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    assert_true(c->rec.fd >= 0);
    pthread_mutex_init(&c->rec.mu, NULL);
    tp_gate_init(&c->gate, !gated);
    c->rec.gate = gated ? &c->gate : NULL;
    c->wk = tp_inproc_start_one(&c->w, c->d.listen, "cutover-worker", gated ? 4 : WORKER_SLOTS,
                                "default", on_task, &c->rec);
    assert_non_null(c->wk);
}

static void stop_taskpush(struct cut *c)
{
    if (c->wk) {
        tp_gate_set(&c->gate, true);
        tp_inproc_halt(&c->w);
        tp_worker_free(c->wk);
        c->wk = NULL;
        close(c->rec.fd);
        pthread_mutex_destroy(&c->rec.mu);
        tp_gate_destroy(&c->gate);
    }
    if (c->started)
        tp_daemon_stop(&c->d, SIGTERM, 20000);
    c->started = false;
}

/* Ends what a failed case left running (a mover --follow has no time bound) and frees c. */
static void cut_free(struct cut *c)
{
    if (!c)
        return;
    pid_t pids[POLLERS + 2];
    int n = 0;
    for (int i = 0; i < POLLERS; i++)
        pids[n++] = c->pollers[i];
    pids[n++] = c->producer;
    pids[n++] = c->mover;
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGTERM);
            waitpid(pids[i], NULL, 0);
        }
    stop_taskpush(c);
    free(c);
}

static void start_team(struct fx *fx, struct cut *c)
{
    for (int i = 0; i < POLLERS; i++) {
        snprintf(c->name[i], sizeof c->name[i], "poller-%d", i);
        snprintf(c->poll_out[i], sizeof c->poll_out[i], "%s/poller-%d.out", fx->dir, i);
        const char *extra[] = {"--name", c->name[i], "--log", c->exec_log, NULL};
        c->pollers[i] = spawn(&fx->db, "poll", c->poll_out[i], extra);
        assert_true(c->pollers[i] > 0);
    }
    const char *pextra[] = {"--rate", PRODUCE_RATE, "--log", c->prod_log, NULL};
    c->producer = spawn(&fx->db, "produce", c->prod_out, pextra);
    assert_true(c->producer > 0);
}

static void stop_pollers(struct cut *c)
{
    for (int i = 0; i < POLLERS; i++)
        if (c->pollers[i] > 0) {
            assert_int_equal(stop(c->pollers[i]), 0);
            c->pollers[i] = 0;
        }
}

/* Stops the producer; asserts it inserted and never saw an error. */
static uint64_t stop_producer(struct cut *c)
{
    assert_int_equal(stop(c->producer), 0);
    c->producer = 0;
    char *pout = read_file(c->prod_out);
    uint64_t produced = field(pout, "inserted "), perrors = field(pout, " errors ");
    printf("# producer: %s", pout ? pout : "(no output)\n");
    free(pout);
    assert_true(produced != UINT64_MAX && produced > 0);
    assert_int_equal(perrors, 0);
    return produced;
}

static void stop_mover(struct cut *c)
{
    assert_int_equal(stop(c->mover), 0);
    c->mover = 0;
    char *s = read_file(c->mover_out);
    const char *last = s ? strstr(s, "taskpush-adopt: moved ") : NULL;
    const char *p = last;
    while (p && (p = strstr(p + 1, "taskpush-adopt: moved ")))
        last = p;
    printf("# mover's last line: %s", last ? last : "(none)\n");
    free(s);
}

/* Loads the records of path ("ID NAME" lines, each whole) into table (task_id, runner),
 * several hundred rows a statement. Returns the lines. */
static uint64_t load_records(tp_testdb *db, const char *path, const char *table)
{
    char *log = read_file(path);
    size_t cap = 1 << 16, len = 0;
    char *sql = malloc(cap);
    uint64_t lines = 0;
    int in_stmt = 0;

    if (!log) /* nobody executed anything there */
        return 0;
    assert_non_null(sql);
    for (char *line = log, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl); /* a record is whole or absent */
        *nl = '\0';
        char *sp = strchr(line, ' ');
        assert_non_null(sp);
        *sp = '\0';
        assert_true(strspn(line, "0123456789") == strlen(line) && strlen(line) < 20);
        assert_true(strlen(sp + 1) < 40 && !strchr(sp + 1, '\''));
        if (in_stmt == 0)
            len = (size_t)snprintf(sql, cap, "INSERT INTO %s VALUES ", table);
        len += (size_t)snprintf(sql + len, cap - len, "%s(%s, '%s')", in_stmt ? "," : "", line, sp + 1);
        lines++;
        if (++in_stmt == 500) {
            assert_int_equal(tp_testdb_exec(db, "%s", sql), in_stmt);
            in_stmt = 0;
        }
    }
    if (in_stmt)
        assert_int_equal(tp_testdb_exec(db, "%s", sql), in_stmt);
    free(sql);
    free(log);
    return lines;
}

/* Every team row executed exactly once by a poller or a worker, none left behind. */
static void assert_exactly_once(tp_testdb *db, struct cut *c, uint64_t rows)
{
    assert_int_equal(tp_testdb_exec(db, "CREATE TABLE executions (task_id BIGINT NOT NULL,"
                                        " runner VARCHAR(64) NOT NULL)"),
                     0);
    assert_int_equal(tp_testdb_exec(db, "CREATE TABLE worker_runs (job_id BIGINT NOT NULL,"
                                        " runner VARCHAR(64) NOT NULL)"),
                     0);
    uint64_t by_pollers = load_records(db, c->exec_log, "executions");
    uint64_t by_workers = load_records(db, c->worker_log, "worker_runs");
    printf("# executions: %" PRIu64 " by the pollers, %" PRIu64 " by taskpush's worker, of %" PRIu64
           " rows\n",
           by_pollers, by_workers, rows);
    assert_int_equal(c->rec.errors, 0);
    /* Every job the worker ran carries the key of a team row. */
    assert_int_equal(q(db, "SELECT COUNT(*) FROM worker_runs w LEFT JOIN jobs j ON j.task_id ="
                           " w.job_id WHERE j.dedup_key IS NULL OR j.dedup_key NOT LIKE 'legacy:%'"),
                     0);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO executions SELECT CAST(SUBSTRING(j.dedup_key, 8)"
                                        " AS UNSIGNED), w.runner FROM worker_runs w JOIN jobs j ON"
                                        " j.task_id = w.job_id"),
                     (int64_t)by_workers);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM task"), rows);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM task WHERE task_state <> 3"), 0);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM (SELECT task_id FROM executions GROUP BY task_id"
                           " HAVING COUNT(*) > 1) d"),
                     0);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM task t WHERE NOT EXISTS (SELECT 1 FROM executions e"
                           " WHERE e.task_id = t.task_id)"),
                     0);
    assert_int_equal(by_pollers + by_workers, rows);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM jobs WHERE task_state <> 2"), 0);
}

static void test_cutover(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    struct cut *c = fx->cut = calloc(1, sizeof *c);
    unsigned rows = rows_wanted();
    long long t0 = tp_mono_ms();

    assert_non_null(c);
    make_tables(fx, c, rows);
    /* Step 1: taskpushd --table jobs and its workers, beside the team's queue at work. */
    start_taskpush(fx, c, false);
    start_team(fx, c);
    tp_sleep_ms(500);

    /* A poller holds a row PROCESSING when the move starts: the test's own CAS, as theirs. */
    uint64_t held = 0;
    for (int tries = 0; tries < 100 && held == 0; tries++) {
        uint64_t id = q(db, "SELECT MAX(task_id) FROM task WHERE task_state = 1");
        assert_true(id != TP_TESTDB_U64_ERR);
        if (tp_testdb_exec(db, "UPDATE task SET task_state = 2 WHERE task_id = %" PRIu64
                               " AND task_state = 1", id) == 1)
            held = id;
    }
    assert_true(held > 0);

    /* Step 2: the mover, following. */
    const char *more[] = {"--follow", "--interval-ms", "100", NULL};
    c->mover = start_mover(fx, c, more);
    assert_true(c->mover > 0);
    assert_true(wait_zero(db, "SELECT COUNT(*) = 0 FROM jobs", 30000));

    /* Step 3: the pollers stop; the producer's rows are forwarded by the mover. */
    stop_pollers(c);
    uint64_t jobs_then = q(db, "SELECT MAX(task_id) FROM jobs");
    tp_sleep_ms(1500);
    assert_true(q(db, "SELECT MAX(task_id) FROM jobs") > jobs_then);

    /* The held row was left to its poller, which ends it as it always did. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM jobs WHERE dedup_key = 'legacy:%" PRIu64 "'",
                                         held),
                     0);
    assert_int_equal(tp_rows_state(db, held), 2);
    int fd = open(c->exec_log, O_WRONLY | O_APPEND);
    char line[64];
    int n = snprintf(line, sizeof line, "%" PRIu64 " held\n", held);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, line, (size_t)n), n);
    close(fd);
    assert_int_equal(tp_testdb_exec(db, "UPDATE task SET task_state = 3 WHERE task_id = %" PRIu64, held), 1);

    /* Step 4: the producer switches over (here: stops); step 5: drain, outcomes written back. */
    uint64_t produced = stop_producer(c);
    assert_true(wait_zero(db, "SELECT COUNT(*) FROM task WHERE task_state <> 3", 120000));
    stop_mover(c);
    stop_taskpush(c);
    printf("# %u rows + %" PRIu64 " produced, cut over in %lld ms\n", rows, produced, tp_mono_ms() - t0);
    assert_exactly_once(db, c, rows + produced);
}

static void test_rollback_halfway(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    struct cut *c = fx->cut = calloc(1, sizeof *c);
    unsigned rows = rows_wanted() < ROLLBACK_ROWS_MAX ? rows_wanted() : ROLLBACK_ROWS_MAX;
    char out[OUT_MAX];

    assert_non_null(c);
    make_tables(fx, c, rows);
    start_taskpush(fx, c, true); /* handlers held: some rows in flight, the rest NEW in jobs */
    start_team(fx, c);
    const char *more[] = {"--follow", "--interval-ms", "100", NULL};
    c->mover = start_mover(fx, c, more);
    assert_true(c->mover > 0);
    long long end = tp_mono_ms() + 30000;
    while (tp_gate_waiting(&c->gate) == 0 && tp_mono_ms() < end)
        tp_sleep_ms(50);
    assert_true(tp_gate_waiting(&c->gate) > 0);
    assert_true(wait_zero(db, "SELECT COUNT(*) = 0 FROM jobs WHERE task_state = 0", 30000));

    /* Halfway: stop the mover, move back what taskpush has not started. */
    stop_mover(c);
    const char *back[] = {"--rollback", NULL};
    assert_int_equal(run_adopt(fx, back, out), 0);
    assert_non_null(strstr(out, "still in jobs"));
    assert_int_equal(q(db, "SELECT COUNT(*) FROM jobs WHERE task_state = 0"), 0);
    uint64_t in_flight = q(db, "SELECT COUNT(*) FROM jobs");
    printf("# after --rollback: %" PRIu64 " rows in flight in jobs\n", in_flight);
    assert_true(in_flight > 0);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM task WHERE task_state = " MOVED_STATE), in_flight);

    /* The rows in flight finish in taskpush; their outcomes are written back. */
    tp_gate_set(&c->gate, true);
    const char *finish[] = {"--rollback", "--follow", "--interval-ms", "100", NULL};
    assert_int_equal(run_adopt(fx, finish, out), 0);
    assert_int_equal(q(db, "SELECT COUNT(*) FROM task WHERE task_state = " MOVED_STATE), 0);

    /* The pollers finish everything else. */
    uint64_t produced = stop_producer(c);
    assert_true(wait_zero(db, "SELECT COUNT(*) FROM task WHERE task_state <> 3", 120000));
    stop_pollers(c);
    stop_taskpush(c);
    assert_exactly_once(db, c, rows + produced);
}

static void test_bad_flags(void **state)
{
    (void)state;
    static const char *const cases[][6] = {
        {"--to", "jobs", NULL},                                   /* no --moved-state */
        {"--to", "jobs", "--moved-state", "2", NULL},             /* PROCESSING */
        {"--to", "bad-name", "--moved-state", "5", NULL},
        {"--to", "a23456789012345678901234567890123456789012345678x", "--moved-state", "5", NULL},
        {"--to", "jobs", "--moved-state", "5", "--batch", "0"},
        {"--to", "jobs", "--moved-state", "5", "--priority-map", "1:7"},
        {"--to", "jobs", "--moved-state", "5", "--time-unit", "h"},
        {"--to", "jobs", "--moved-state", "5", "--bogus", NULL},
        {"--to", "task", "--moved-state", "5", NULL},             /* --from is task */
    };
    static const char *const names[] = {"--moved-state", "--moved-state", "--to", "--to", "--batch",
                                        "--priority-map", "--time-unit", "--bogus", "--from"};
    char out[OUT_MAX];

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[10] = {adopt_path(), "--db", "mysql://u@127.0.0.1:1/d"};
        int n = 3;
        for (int k = 0; k < 6 && cases[i][k]; k++)
            argv[n++] = cases[i][k];
        argv[n] = NULL;
        assert_int_equal(tp_run(argv, NULL, out, sizeof out, RUN_LIMIT_MS), 2);
        if (!strstr(out, names[i]))
            fail_msg("case %zu: no '%s' in: %s", i, names[i], out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pollers_exactly_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cutover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_halfway, setup, teardown),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
