/* test_tables: taskpushd --table NAME (issue 31, item 2): taskpush's tables named after
 * NAME (NAME, NAME_meta, NAME_schedule, NAME_claim), so that a team's own task table and
 * several queues share one database. Real components only: taskpushd of the build tree
 * (tests/testlib/daemon.h), libtaskpush workers on threads of this process, the MariaDB
 * that scripts/tp-mariadb started.
 *
 * Cases:
 *   beside_team_table  a database holding only a team's own task table (1,000 rows, the
 *                      table of issue 31): --table jobs --migrate creates jobs, jobs_meta,
 *                      jobs_schedule and jobs_claim, each as sql/schema.sql makes task's
 *                      (SHOW CREATE TABLE with the names swapped back); taskpushd --table
 *                      jobs leads (/stats task_table "jobs") and workers drain the rows
 *                      inserted into jobs, each run once; the team's table keeps its
 *                      CHECKSUM TABLE and SHOW CREATE TABLE throughout
 *   two_queues         jobs and mail in one database (beside taskpush's task tables):
 *                      two taskpushd lead at once, each with its own lock, and each
 *                      drains only its own table, although their workers serve the same
 *                      type name; the rows of task stay NEW
 *   bad_names          a bad --table exits 2 with a message, and an abbreviated flag
 *                      (--table-stats) is an unknown option, exit 2; nothing is created
 *   old_schema         schema version 1 made under the name jobs (tests/data/schema-v1.sql
 *                      with the names substituted) is upgraded by --table jobs --migrate,
 *                      its rows kept, its CHECK constraints all added under jobs' names,
 *                      and taskpush's own task tables beside it untouched
 * two_queues and old_schema also hold the CHECK constraint names distinct across the
 * database (MySQL 8 keeps them per database: jobs_attempts_min beside task's attempts_min).
 *
 * On main (before --table) beside_team_table fails at its first step: getopt_long took
 * "--table" for --table-stats-ms and exited 2 ("--table-stats-ms ... jobs").
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "db_claim_sql.h" /* DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN */
#include "inproc_worker.h"
#include "run.h"
#include "strbuf.h"
#include "tables.h"
#include "testdb.h"

#define OUT_MAX 16384
#define RUN_LIMIT_MS 60000   /* only so that a hung program fails the test */
#define DRAIN_LIMIT_MS 60000 /* a loose bound: the rows drain in well under a second */
#define TEAM_ROWS 1000
#define QUEUE_ROWS 300

#define TEAM_TABLE                                                                              \
    "CREATE TABLE task (task_id BIGINT PRIMARY KEY AUTO_INCREMENT, task_state INT NOT NULL,"   \
    " task_priority INT NOT NULL, insert_time BIGINT NOT NULL, last_update_time BIGINT NOT"   \
    " NULL, payload TEXT) ENGINE=InnoDB"

/* What one worker ran: every execution, by the payload's queue prefix. */
struct runs {
    pthread_mutex_t mu;
    const char *expect; /* the prefix every payload must have */
    uint64_t runs;      /* executions */
    uint64_t foreign;   /* executions of a payload without the prefix */
    unsigned char *seen; /* per row number: executions */
    size_t nseen;
    uint64_t twice;     /* rows run more than once */
};

struct fx {
    tp_testdb db;
    tp_daemon d[2];
    bool started[2];
    tp_inproc w[2];
    tp_worker *wk[2];
    struct runs r[2];
    char show_create[4096];
    uint64_t checksum;
};

static void runs_init(struct runs *r, const char *expect, size_t nseen)
{
    pthread_mutex_init(&r->mu, NULL);
    r->expect = expect;
    r->seen = calloc(nseen + 1, 1);
    assert_non_null(r->seen);
    r->nseen = nseen;
}

/* Payload "<queue>-<k>": counts the execution, and whether the row ran before. */
static int on_task(tp_task *task, void *arg)
{
    struct runs *r = arg;
    size_t len = 0, pl = strlen(r->expect);
    const char *p = tp_task_payload(task, &len);
    char num[24];

    pthread_mutex_lock(&r->mu);
    r->runs++;
    if (len <= pl + 1 || len - pl - 1 >= sizeof num || memcmp(p, r->expect, pl) != 0 ||
        p[pl] != '-') {
        r->foreign++;
    } else {
        memcpy(num, p + pl + 1, len - pl - 1);
        num[len - pl - 1] = '\0';
        size_t k = (size_t)strtoul(num, NULL, 10);
        if (k <= r->nseen && r->seen[k]++ > 0)
            r->twice++;
    }
    pthread_mutex_unlock(&r->mu);
    return TP_SUCCESS;
}

static uint64_t runs_of(struct runs *r, uint64_t *foreign, uint64_t *twice)
{
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->runs;
    *foreign = r->foreign;
    *twice = r->twice;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static int setup(void **state)
{
    *state = calloc(1, sizeof(struct fx));
    return *state ? 0 : -1;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i < 2; i++) {
        if (fx->wk[i]) {
            tp_inproc_halt(&fx->w[i]);
            tp_worker_free(fx->wk[i]);
        }
        if (fx->started[i])
            tp_daemon_stop(&fx->d[i], SIGTERM, 20000);
        if (fx->r[i].seen) {
            free(fx->r[i].seen);
            pthread_mutex_destroy(&fx->r[i].mu);
        }
    }
    tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

static int run_taskpushd(const char *const *args, char *out)
{
    const char *argv[16] = {tp_build_path("dispatcher/taskpushd")};
    int n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return tp_run(argv, NULL, out, OUT_MAX, RUN_LIMIT_MS);
}

static int migrate(tp_testdb *db, const char *table, char *out)
{
    const char *const args[] = {"--db", db->url, "--table", table, "--migrate", NULL};
    return run_taskpushd(args, out);
}

/* SHOW CREATE TABLE name into out. */
static void show_create(tp_testdb *db, const char *name, char *out, size_t cap)
{
    char sql[128];
    MYSQL_RES *res;
    MYSQL_ROW row;

    snprintf(sql, sizeof sql, "SHOW CREATE TABLE %s", name);
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    snprintf(out, cap, "%s", row[1]);
    mysql_free_result(res);
}

/* The team's table: its definition and its rows. */
static void fingerprint(tp_testdb *db, char *sc, size_t cap, uint64_t *checksum)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    show_create(db, "task", sc, cap);
    assert_int_equal(mysql_query(db->conn, "CHECKSUM TABLE task"), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    assert_non_null(row[1]);
    *checksum = strtoull(row[1], NULL, 10);
    mysql_free_result(res);
}

static void assert_team_untouched(struct fx *fx)
{
    char sc[4096];
    uint64_t sum;

    fingerprint(&fx->db, sc, sizeof sc, &sum);
    assert_string_equal(sc, fx->show_create);
    assert_int_equal(sum, fx->checksum);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), TEAM_ROWS);
}

static uint64_t tables_in(tp_testdb *db)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables WHERE"
                                   " table_schema = DATABASE()");
}

/* The table `name` made by --migrate is the one sql/schema.sql makes as `fresh` (in the
 * database ref): SHOW CREATE TABLE alike once the names are swapped back. */
static void assert_same_as_fresh(tp_testdb *db, tp_testdb *ref, const dsp_table_names *t,
                                 const char *name, const char *fresh)
{
    char made[8192], want[8192];
    dsp_strbuf back = {0};

    show_create(db, name, made, sizeof made);
    show_create(ref, fresh, want, sizeof want);
    /* task's names to t's in the reference: the same words the substitution rewrote. */
    dsp_table_names_subst(&back, t, want, strlen(want));
    assert_false(back.oom);
    assert_string_equal(made, back.p);
    dsp_strbuf_free(&back);
}

/* Inserts n NEW rows of type into table, payload "<prefix>-<k>" for k = 1..n. */
static void insert_rows(tp_testdb *db, const char *table, const char *type, const char *prefix,
                        int n)
{
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO %s (task_type, payload) SELECT '%s',"
                                    " CONCAT('%s-', seq) FROM seq_1_to_%d",
                                    table, type, prefix, n),
                     n);
}

static uint64_t count_state(tp_testdb *db, const char *table, int state)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM %s WHERE task_state = %d", table, state);
}

/* Waits (loosely bounded) until every row of table is SUCCESSFUL. */
static bool wait_drained(tp_testdb *db, const char *table, uint64_t n)
{
    int64_t until = tp_mono_ms() + DRAIN_LIMIT_MS;
    while (tp_mono_ms() < until) {
        if (count_state(db, table, 2) == n)
            return true;
        tp_sleep_ms(50);
    }
    return false;
}

static void start_daemon(struct fx *fx, int i, const char *table)
{
    const char *const extra[] = {"--table", table, "--poll-ms", "20", "--adopt-grace-ms", "0", NULL};
    if (tp_daemon_start(&fx->d[i], fx->db.url, extra) != 0)
        fail_msg("taskpushd --table %s did not start", table);
    fx->started[i] = true;
    if (tp_daemon_wait_leader(&fx->d[i], 20000) != 0) {
        tp_daemon_dump_log(&fx->d[i]);
        fail_msg("taskpushd --table %s did not lead", table);
    }
}

static void start_worker(struct fx *fx, int i, const char *type, const char *prefix, size_t rows)
{
    runs_init(&fx->r[i], prefix, rows);
    fx->wk[i] = tp_inproc_start_one(&fx->w[i], fx->d[i].listen, prefix, 8, type, on_task, &fx->r[i]);
    assert_non_null(fx->wk[i]);
}

static const char *stat_string(tp_daemon *d, const char *key, char *out, size_t cap)
{
    json_t *j = tp_daemon_json(d, "/stats");
    out[0] = '\0';
    if (j) {
        const char *v = json_string_value(json_object_get(j, key));
        snprintf(out, cap, "%s", v ? v : "");
        json_decref(j);
    }
    return out;
}

static void test_beside_team_table(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db, ref = {0};
    char out[OUT_MAX], name[64];
    dsp_table_names jobs;
    uint64_t foreign, twice;

    assert_int_equal(dsp_table_names_init(&jobs, "jobs"), 0);
    assert_int_equal(tp_testdb_create("tables_team", db), 0);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(tp_testdb_exec(db, TEAM_TABLE), 0);
    /* 1,000 rows in the team's codes: NEW=1 PROCESSING=2 SUCCESSFUL=3 FAILED=4. */
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_state, task_priority, insert_time,"
                                    " last_update_time, payload) SELECT 1 + seq %% 4, seq %% 3,"
                                    " 1700000000000 + seq, 1700000000000 + seq, CONCAT('job-', seq)"
                                    " FROM seq_1_to_%d",
                                    TEAM_ROWS),
                     TEAM_ROWS);
    fingerprint(db, fx->show_create, sizeof fx->show_create, &fx->checksum);

    assert_int_equal(migrate(db, "jobs", out), 0);
    assert_non_null(strstr(out, "created schema version"));
    assert_int_equal(tables_in(db), 8); /* the team's task and jobs' seven */
    assert_team_untouched(fx);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM jobs_meta WHERE name = 'schema_version'"),
                     DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    /* Each table as sql/schema.sql makes task's. */
    assert_int_equal(tp_testdb_create("tables_ref", &ref), 0);
    assert_same_as_fresh(db, &ref, &jobs, "jobs", "task");
    assert_same_as_fresh(db, &ref, &jobs, "jobs_meta", "taskpush_meta");
    assert_same_as_fresh(db, &ref, &jobs, "jobs_schedule", "task_schedule");
    assert_same_as_fresh(db, &ref, &jobs, "jobs_claim", "task_claim");
    assert_same_as_fresh(db, &ref, &jobs, "jobs_progress", "task_progress");
    tp_testdb_drop(&ref);
    /* Run again: nothing to do. */
    assert_int_equal(migrate(db, "jobs", out), 0);
    assert_non_null(strstr(out, "nothing to do"));

    start_daemon(fx, 0, "jobs");
    assert_string_equal(stat_string(&fx->d[0], "task_table", name, sizeof name), "jobs");
    start_worker(fx, 0, "tbl", "jobs", QUEUE_ROWS);
    insert_rows(db, "jobs", "tbl", "jobs", QUEUE_ROWS);
    if (!wait_drained(db, "jobs", QUEUE_ROWS)) {
        tp_daemon_dump_log(&fx->d[0]);
        fail_msg("jobs not drained: %" PRIu64 " SUCCESSFUL", count_state(db, "jobs", 2));
    }
    assert_int_equal(runs_of(&fx->r[0], &foreign, &twice), QUEUE_ROWS);
    assert_int_equal(foreign, 0);
    assert_int_equal(twice, 0);
    /* The leader's lease and epoch are jobs_meta's. */
    assert_true(tp_testdb_query_u64(db, "SELECT value FROM jobs_meta WHERE name = 'epoch'") >= 1);
    assert_true(tp_testdb_query_u64(db, "SELECT holder <> 0 FROM jobs_meta WHERE name = 'lease'") == 1);
    assert_team_untouched(fx);
    assert_int_equal(tables_in(db), 8); /* the team's task and jobs' seven */
}

/* CHECK constraints of table (TABLE_CONSTRAINTS, which both servers have). */
static uint64_t checks_of(tp_testdb *db, const char *table)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.TABLE_CONSTRAINTS WHERE"
                                   " CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_TYPE = 'CHECK'"
                                   " AND TABLE_NAME = '%s'",
                               table);
}

/* MySQL 8 keeps constraint names per database: no two of its tables may share one (a
 * second queue's CREATE TABLE would fail there), and task's keep the names they had. */
static void assert_constraint_names_distinct(tp_testdb *db)
{
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) - COUNT(DISTINCT CONSTRAINT_NAME) FROM"
                                             " information_schema.TABLE_CONSTRAINTS WHERE"
                                             " CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_TYPE"
                                             " = 'CHECK'"),
                     0);
}

static void test_two_queues(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];
    uint64_t foreign, twice;

    /* Beside taskpush's own task tables, which tp_testdb_create loaded. */
    assert_int_equal(tp_testdb_create("tables_two", db), 0);
    assert_int_equal(migrate(db, "jobs", out), 0);
    assert_int_equal(migrate(db, "mail", out), 0);
    assert_int_equal(tables_in(db), 21); /* task's, jobs' and mail's seven */
    /* Each queue's tables have every check (9 + 8 + 1), under names of their own. */
    assert_constraint_names_distinct(db);
    assert_int_equal(checks_of(db, "jobs") + checks_of(db, "jobs_schedule") + checks_of(db, "jobs_claim"),
                     18);
    assert_int_equal(checks_of(db, "mail") + checks_of(db, "mail_schedule") + checks_of(db, "mail_claim"),
                     18);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.TABLE_CONSTRAINTS"
                                             " WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME ="
                                             " 'mail' AND CONSTRAINT_NAME = 'mail_attempts_max'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.TABLE_CONSTRAINTS"
                                             " WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME ="
                                             " 'task' AND CONSTRAINT_NAME = 'attempts_max'"),
                     1);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, payload) SELECT 'same',"
                                        " CONCAT('task-', seq) FROM seq_1_to_50"),
                     50);

    start_daemon(fx, 0, "jobs");
    start_daemon(fx, 1, "mail");
    /* Both lead at once, each with its own lock. */
    assert_int_equal(tp_daemon_stat(&fx->d[0], "epoch") >= 1, 1);
    json_t *a = tp_daemon_json(&fx->d[0], "/stats"), *b = tp_daemon_json(&fx->d[1], "/stats");
    assert_non_null(a);
    assert_non_null(b);
    assert_true(json_is_true(json_object_get(a, "leader")));
    assert_true(json_is_true(json_object_get(b, "leader")));
    json_decref(a);
    json_decref(b);
    assert_true(tp_testdb_query_u64(db, "SELECT IS_USED_LOCK('taskpush/jobs.%s')", db->name) > 0);
    assert_true(tp_testdb_query_u64(db, "SELECT IS_USED_LOCK('taskpush/mail.%s')", db->name) > 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT IS_USED_LOCK('taskpush.%s') IS NULL", db->name), 1);

    /* The same type name on both: a worker sees only its own queue's rows. */
    start_worker(fx, 0, "same", "jobs", QUEUE_ROWS);
    start_worker(fx, 1, "same", "mail", QUEUE_ROWS);
    insert_rows(db, "jobs", "same", "jobs", QUEUE_ROWS);
    insert_rows(db, "mail", "same", "mail", QUEUE_ROWS);
    if (!wait_drained(db, "jobs", QUEUE_ROWS) || !wait_drained(db, "mail", QUEUE_ROWS)) {
        tp_daemon_dump_log(&fx->d[0]);
        tp_daemon_dump_log(&fx->d[1]);
        fail_msg("not drained: jobs %" PRIu64 ", mail %" PRIu64 " SUCCESSFUL", count_state(db, "jobs", 2),
                 count_state(db, "mail", 2));
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(runs_of(&fx->r[i], &foreign, &twice), QUEUE_ROWS);
        assert_int_equal(foreign, 0);
        assert_int_equal(twice, 0);
    }
    /* task has no dispatcher: its rows stay NEW; each queue has its own epochs. */
    assert_int_equal(count_state(db, "task", 0), 50);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = 'epoch'"), 0);
    assert_true(tp_testdb_query_u64(db, "SELECT value FROM jobs_meta WHERE name = 'epoch'") >= 1);
    assert_true(tp_testdb_query_u64(db, "SELECT value FROM mail_meta WHERE name = 'epoch'") >= 1);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "tasks.succeeded_total"), QUEUE_ROWS);
    assert_int_equal(tp_daemon_stat(&fx->d[1], "tasks.succeeded_total"), QUEUE_ROWS);
}

static void test_bad_names(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];
    static const char *const bad[] = {"9jobs", "jobs-x", "jobs;DROP", "",
                                      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};

    assert_int_equal(tp_testdb_create("tables_bad", db), 0);
    uint64_t before = tables_in(db);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(migrate(db, bad[i], out), 2);
        assert_non_null(strstr(out, "--table"));
        const char *const serve[] = {"--db", db->url, "--table", bad[i], "--listen", "127.0.0.1:0",
                                     "--admin", "127.0.0.1:0", NULL};
        assert_int_equal(run_taskpushd(serve, out), 2);
        assert_non_null(strstr(out, "a table name is"));
    }
    /* An abbreviation is no flag: before, "--table-stats 100" set --table-stats-ms. */
    const char *const abbrev[] = {"--db", db->url, "--table-stats", "100", "--migrate", NULL};
    assert_int_equal(run_taskpushd(abbrev, out), 2);
    assert_non_null(strstr(out, "unknown option '--table-stats'"));
    assert_int_equal(tables_in(db), before);
}

static const char *source_path(const char *relative)
{
    static char path[512];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");

    snprintf(path, sizeof path, "%s/%s", root ? root : ".", relative);
    return path;
}

static void test_old_schema(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], path[] = "/tmp/tp-tables-v1-XXXXXX";
    dsp_table_names jobs;
    dsp_strbuf text = {0};
    FILE *f;
    long size;
    char *v1;

    assert_int_equal(dsp_table_names_init(&jobs, "jobs"), 0);
    assert_int_equal(tp_testdb_create("tables_v1", db), 0);
    /* Version 1 under the name jobs: the file's text with the names substituted. */
    f = fopen(source_path("tests/data/schema-v1.sql"), "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    size = ftell(f);
    assert_true(size > 0);
    rewind(f);
    v1 = malloc((size_t)size);
    assert_non_null(v1);
    assert_int_equal(fread(v1, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    dsp_table_names_subst(&text, &jobs, v1, (size_t)size);
    free(v1);
    assert_false(text.oom);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text.p, text.len), (ssize_t)text.len);
    close(fd);
    dsp_strbuf_free(&text);
    assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
    unlink(path);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM jobs_meta WHERE name = 'schema_version'"), 1);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO jobs (task_type, payload) SELECT 'v1',"
                                        " CONCAT('jobs-', seq) FROM seq_1_to_100"),
                     100);
    char task_before[8192], task_after[8192];
    show_create(db, "task", task_before, sizeof task_before);

    assert_int_equal(migrate(db, "jobs", out), 0);
    assert_non_null(strstr(out, "schema 1 -> 2"));
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM jobs_meta WHERE name = 'schema_version'"),
                     DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM jobs"), 100);
    /* The migrations made jobs' later tables under jobs' names, and left task's alone. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables WHERE"
                                             " table_schema = DATABASE() AND table_name IN"
                                             " ('jobs_schedule', 'jobs_claim')"),
                     2);
    show_create(db, "task", task_after, sizeof task_after);
    assert_string_equal(task_after, task_before);
    /* Migrations 2 and 6 added jobs' own checks: their "does it exist yet" test looks for
     * jobs' names, not task's (which it used to find, adding nothing to jobs). */
    assert_int_equal(checks_of(db, "jobs"), 9);
    assert_int_equal(checks_of(db, "jobs_schedule"), 8);
    assert_int_equal(checks_of(db, "jobs_claim"), 1);
    assert_constraint_names_distinct(db);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = 'schema_version'"),
                     DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);

    /* And the upgraded queue serves. */
    start_daemon(fx, 0, "jobs");
    start_worker(fx, 0, "v1", "jobs", 100);
    if (!wait_drained(db, "jobs", 100)) {
        tp_daemon_dump_log(&fx->d[0]);
        fail_msg("jobs not drained after the upgrade");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_beside_team_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_queues, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_schema, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
