/* test_migrate: schema upgrades with the real `taskpushd --migrate` against a real MariaDB.
 *
 * A version 1 database is built from tests/data/schema-v1.sql (sql/schema.sql as it was
 * at version 1), filled with rows in every state, some of them breaking the checks that
 * version 2 adds, and upgraded by the real binary. Every taskpushd run is bounded
 * (killed after RUN_LIMIT_MS, which fails the case); nothing asserts on time.
 * Needs a server from scripts/tp-mariadb; without one every case fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <regex.h>
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "db_claim_sql.h"
#include "daemon.h"
#include "testdb.h"

#define RUN_LIMIT_MS 60000 /* a taskpushd run that takes longer fails the case */
#define OUT_MAX 16384

/* MariaDB's ER_CONSTRAINT_FAILED and MySQL's ER_CHECK_CONSTRAINT_VIOLATED. */
#define ERR_CHECK_MARIADB 4025u
#define ERR_CHECK_MYSQL 3819u

#define NORMAL_ROWS 240

struct fx {
    tp_testdb db;
    tp_testdb db2; /* a second database, where a case needs one */
    tp_daemon d;
};

/* ---- running taskpushd ---- */

/* Runs taskpushd with the NULL-terminated args, stdout and stderr both into out (at
 * most OUT_MAX bytes, NUL-terminated). Returns its exit code, 128 + signal, or -1. */
static int run_taskpushd(const char *const *args, char *out)
{
    char path[256], *argv[32];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    static int serial;
    int argc = 0, status = 0, fd;
    pid_t pid, r;
    long long end;
    ssize_t n;

    out[0] = '\0';
    snprintf(path, sizeof path, "%s/test-migrate-%d-%d.out", tmp, (int)getpid(), serial++);
    argv[argc++] = (char *)tp_build_path("dispatcher/taskpushd");
    for (int i = 0; args[i] && argc < 31; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    for (end = tp_mono_ms() + RUN_LIMIT_MS;;) {
        r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 || tp_mono_ms() >= end) {
            fprintf(stderr, "taskpushd did not exit within %d ms; killed\n", RUN_LIMIT_MS);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            status = -1;
            break;
        }
        tp_sleep_ms(10);
    }
    fd = open(path, O_RDONLY);
    if (fd >= 0) {
        n = read(fd, out, OUT_MAX - 1);
        out[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    unlink(path);
    printf("# taskpushd");
    for (int i = 0; args[i]; i++)
        printf(" %s", args[i]);
    printf(" -> %d\n", status < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    for (char *line = out, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        printf("#   %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
        if (!nl)
            break;
    }
    if (status < 0)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int migrate(tp_testdb *db, char *out)
{
    const char *const args[] = {"--db", db->url, "--migrate", NULL};
    return run_taskpushd(args, out);
}

/* taskpushd in its normal mode, which is expected to exit by itself. */
static int serve(tp_testdb *db, char *out)
{
    const char *const args[] = {"--db", db->url, "--listen", "127.0.0.1:0", "--admin",
                                "127.0.0.1:0", NULL};
    return run_taskpushd(args, out);
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* ---- databases ---- */

static const char *v1_schema_path(void)
{
    static char path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/tests/data/schema-v1.sql", root ? root : ".");
    return path;
}

/* Replaces the fresh (current) schema tp_testdb_create loaded with version 1. */
static void make_v1(tp_testdb *db)
{
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE IF EXISTS task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(tp_testdb_load_file(db->conn, v1_schema_path()), 0);
    assert_int_equal(tp_testdb_query_u64(db, DSP_CLAIM_SQL_SCHEMA_VERSION), 1);
}

static uint64_t version(tp_testdb *db)
{
    return tp_testdb_query_u64(db, DSP_CLAIM_SQL_SCHEMA_VERSION);
}

/* A fingerprint of every column of the rows matching where (64 bits of an MD5 over the
 * rows in task_id order), so that "unchanged" is checked for all columns at once. */
/* The version this build knows, as text (the messages name it). */
#define KNOWN_STR2(v) #v
#define KNOWN_STR(v) KNOWN_STR2(v)
#define KNOWN_TEXT KNOWN_STR(DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN)

static uint64_t fingerprint(tp_testdb *db, const char *where)
{
    assert_int_equal(tp_testdb_exec(db, "SET SESSION group_concat_max_len = 1073741824"), 0);
    return tp_testdb_query_u64(
        db,
        "SELECT CONV(LEFT(MD5(CONCAT(COUNT(*), ':', IFNULL(GROUP_CONCAT(CONCAT_WS(',', task_id,"
        " HEX(task_type), task_state, task_priority, IFNULL(HEX(payload), '-'), insert_time,"
        " last_update_time, attempts, max_attempts, run_after, IFNULL(timeout_ms, '-'),"
        " IFNULL(HEX(dedup_key), '-'), IFNULL(HEX(err_msg), '-'), IFNULL(HEX(result), '-'),"
        " epoch, `delayed`) ORDER BY task_id SEPARATOR ';'), ''))), 15), 16, 10)"
        " FROM task WHERE %s",
        where);
}

/* Inserts one row with the given columns and values; returns its task_id. */
static uint64_t ins(tp_testdb *db, const char *cols, const char *vals)
{
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (%s) VALUES (%s)", cols, vals), 1);
    return (uint64_t)mysql_insert_id(db->conn);
}

/* Rows in every state, lane and shape that version 1 and version 2 both accept,
 * including the edges of the new checks (max_attempts 1 and 1000, timeout_ms 1). */
static void insert_normal_rows(tp_testdb *db)
{
    const int64_t now = tp_testdb_now_ms();

    for (int i = 0; i < NORMAL_ROWS; i++) {
        char vals[1024];
        int state = i % 4;
        bool future = state == 0 && i % 8 == 0;
        static const char *const types[] = {"resize", "thumb", "R\xc3\xa9sum\xc3\xa9", "a b",
                                            "default"};
        snprintf(vals, sizeof vals,
                 "'%s', %d, %d, %s, %" PRId64 ", %" PRId64 ", %d, %d, %" PRId64 ", %s, %s, %s,"
                 " %s, %u, %d",
                 types[i % 5], state, i % 3,
                 i % 6 == 0 ? "NULL" : i % 6 == 1 ? "X'00FF0A0D27225C'" : "'{\"n\":1}'",
                 now - 100000 + i, now - 50000 + i, i % 4, i % 11 == 0 ? 1000 : 1 + i % 5,
                 future ? now + 3600000 : i % 9 == 0 ? now - 1000 : (int64_t)0,
                 i % 5 == 0 ? "NULL" : i % 5 == 1 ? "1" : "30000",
                 i % 3 == 0 ? "CONCAT('key-', UUID())" : "NULL",
                 state == 3 ? "'boom: \xe2\x9c\x97'" : "NULL",
                 state == 2 ? "X'000102'" : "NULL", state == 1 ? 7u : 0u, future ? 1 : 0);
        ins(db,
            "task_type, task_state, task_priority, payload, insert_time, last_update_time,"
            " attempts, max_attempts, run_after, timeout_ms, dedup_key, err_msg, result, epoch,"
            " `delayed`",
            vals);
    }
}

/* The rows version 2 refuses, and what the migration makes of them. */
struct bad_rows {
    uint64_t max0, maxneg, maxbig, attneg, tmoneg, tmo0, runneg, multi;
    uint64_t type_new, type_proc, type_done, type_failed;
    char ids[512]; /* "id,id,..." for IN (...) */
};

static void insert_bad_rows(tp_testdb *db, struct bad_rows *b)
{
    const char *cols = "task_type, task_state, attempts, max_attempts, timeout_ms, run_after,"
                       " payload, err_msg, result, epoch, `delayed`, dedup_key";

    b->max0 = ins(db, cols, "'resize', 0, 0, 0, NULL, 0, 'p-max0', NULL, NULL, 0, 0, 'd-max0'");
    b->maxneg = ins(db, cols, "'resize', 3, 2, -3, 500, 0, NULL, 'e', NULL, 0, 0, NULL");
    b->maxbig = ins(db, cols, "'thumb', 0, 7, 5000, NULL, 0, 'p', NULL, NULL, 0, 0, NULL");
    b->attneg = ins(db, cols, "'thumb', 2, -2, 3, NULL, 0, 'p', NULL, 'ok', 0, 0, NULL");
    b->tmoneg = ins(db, cols, "'resize', 0, 0, 3, -5, 0, 'p', NULL, NULL, 0, 0, NULL");
    b->tmo0 = ins(db, cols, "'resize', 1, 1, 3, 0, 0, 'p', NULL, NULL, 7, 0, NULL");
    b->runneg = ins(db, cols, "'resize', 0, 0, 3, NULL, -1, 'p', NULL, NULL, 0, 0, NULL");
    b->multi = ins(db, cols, "'resize', 0, -1, 0, -1, -5, 'p', NULL, NULL, 0, 0, NULL");
    b->type_new = ins(db, cols, "'', 0, 0, 3, NULL, 0, 'p-empty', NULL, NULL, 0, 0, 'd-empty'");
    b->type_proc = ins(db, cols, "'', 1, 1, 3, NULL, 0, 'p', NULL, NULL, 7, 0, NULL");
    b->type_done = ins(db, cols, "'', 2, 1, 3, NULL, 0, 'p', NULL, 'r', 7, 0, NULL");
    b->type_failed = ins(db, cols, "'', 3, 3, 3, NULL, 0, 'p', 'old error', NULL, 7, 0, NULL");
    snprintf(b->ids, sizeof b->ids,
             "%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
             ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64,
             b->max0, b->maxneg, b->maxbig, b->attneg, b->tmoneg, b->tmo0, b->runneg, b->multi,
             b->type_new, b->type_proc, b->type_done, b->type_failed);
}

/* 1 when task id matches the condition cond (SQL over its columns). */
static uint64_t row_is(tp_testdb *db, uint64_t id, const char *cond)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64 " AND (%s)",
                               id, cond);
}

#define ASSERT_ROW(db, id, cond) assert_int_equal(row_is((db), (id), (cond)), 1)

static void assert_check_error(unsigned err)
{
    if (err != ERR_CHECK_MARIADB && err != ERR_CHECK_MYSQL)
        fail_msg("expected a CHECK constraint error, got %u", err);
}

/* Runs sql; returns the rows it inserted, or 0 after a CHECK constraint error (MariaDB
 * answers a single-row INSERT IGNORE that breaks a CHECK with the error, MySQL with a
 * warning; either way the row is not stored). Any other error fails the case. */
static uint64_t insert_checked(MYSQL *conn, const char *sql)
{
    MYSQL_RES *res;

    if (mysql_query(conn, sql) != 0) {
        assert_check_error(mysql_errno(conn));
        return 0;
    }
    res = mysql_store_result(conn);
    if (res)
        mysql_free_result(res);
    return (uint64_t)mysql_affected_rows(conn);
}

/* The checks of version 2 refuse each bad value, under INSERT IGNORE too, and accept the
 * edges. */
static void assert_v2_checks(tp_testdb *db)
{
    static const char *const bad[][2] = {
        {"max_attempts", "0"},  {"max_attempts", "-1"}, {"max_attempts", "1001"},
        {"attempts", "-1"},     {"timeout_ms", "0"},    {"timeout_ms", "-5"},
        {"run_after", "-1"},    {"task_type", "''"},
    };
    uint64_t before = tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task");
    char sql[160];

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(sql, sizeof sql, "INSERT IGNORE INTO task (%s) VALUES (%s)", bad[i][0], bad[i][1]);
        assert_int_equal(insert_checked(db->conn, sql), 0);
        assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task"), before);
        snprintf(sql, sizeof sql, "INSERT INTO task (%s) VALUES (%s)", bad[i][0], bad[i][1]);
        assert_int_not_equal(mysql_query(db->conn, sql), 0);
        assert_check_error(mysql_errno(db->conn));
    }
    /* Multi-row INSERT IGNORE: the good row goes in, the bad ones do not. */
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(insert_checked(db->conn, "INSERT IGNORE INTO task (max_attempts, run_after,"
                                              " payload) VALUES (0, 0, 'bad1'), (3, 0, 'good'),"
                                              " (3, -1, 'bad2')"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE payload LIKE 'bad%%'"),
                     0);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
    assert_int_equal(tp_testdb_exec(db, "START TRANSACTION"), 0);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (max_attempts, timeout_ms, attempts,"
                                        " run_after, task_type) VALUES (1000, 1, 0, 0, 'x'),"
                                        " (1, 2147483647, 1000, 0, 'y')"),
                     2);
    assert_int_equal(tp_testdb_exec(db, "ROLLBACK"), 0);
}

/* ---- fixture ---- */

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    /* --db must come from the arguments only. */
    unsetenv("TASKPUSH_DB");
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->d.pid > 0)
        tp_daemon_stop(&fx->d, SIGKILL, 5000);
    tp_testdb_drop(&fx->db);
    tp_testdb_drop(&fx->db2);
    free(fx);
    return 0;
}

/* ---- cases ---- */

/* (a) and (b): a version 1 database with rows is upgraded; the rows version 2 refuses are
 * repaired as 002-row-value-checks.sql documents, every other row is unchanged, the new
 * checks hold, a second --migrate is a no-op, and taskpushd then leads the table. */
static void test_migrate_v1_with_rows(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    struct bad_rows b;
    char out[OUT_MAX], where[600], cond[640];
    uint64_t good_before, bad_rest_before, all_after, rows_before, done_update_before;

    assert_int_equal(tp_testdb_create("migrate_rows", db), 0);
    make_v1(db);
    insert_normal_rows(db);
    insert_bad_rows(db, &b);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 7 WHERE name = 'epoch'"),
                     1);
    rows_before = tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task");
    assert_int_equal(rows_before, NORMAL_ROWS + 12);
    snprintf(where, sizeof where, "task_id NOT IN (%s)", b.ids);
    good_before = fingerprint(db, where);
    assert_int_not_equal(good_before, TP_TESTDB_U64_ERR);
    /* The columns no repair touches, of the repaired rows. */
    const char *rest = "SELECT CONV(LEFT(MD5(GROUP_CONCAT(CONCAT_WS(',', task_id, task_priority,"
                       " IFNULL(HEX(payload), '-'), insert_time, IFNULL(HEX(dedup_key), '-'),"
                       " IFNULL(HEX(result), '-'), epoch) ORDER BY task_id)), 15), 16, 10)"
                       " FROM task WHERE task_id IN (%s)";
    bad_rest_before = tp_testdb_query_u64(db, rest, b.ids);
    done_update_before = tp_testdb_query_u64(db, "SELECT last_update_time FROM task WHERE task_id = %"
                                             PRIu64, b.type_done);

    assert_int_equal(migrate(db, out), 0);
    assert_int_equal(count_lines_with(out, "schema 1 -> 2: row value checks\n"), 1);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = 'epoch'"),
                     7);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task"), rows_before);
    assert_int_equal(fingerprint(db, where), good_before);
    assert_int_equal(tp_testdb_query_u64(db, rest, b.ids), bad_rest_before);

    /* Each repair, and nothing else changed on that row. */
    ASSERT_ROW(db, b.max0, "max_attempts = 1 AND attempts = 0 AND task_state = 0 AND"
                           " timeout_ms IS NULL AND task_type = 'resize'");
    ASSERT_ROW(db, b.maxneg, "max_attempts = 1 AND attempts = 2 AND task_state = 3 AND"
                             " timeout_ms = 500 AND err_msg = 'e'");
    ASSERT_ROW(db, b.maxbig, "max_attempts = 1000 AND attempts = 7 AND task_state = 0");
    ASSERT_ROW(db, b.attneg, "attempts = 0 AND max_attempts = 3 AND task_state = 2");
    ASSERT_ROW(db, b.tmoneg, "timeout_ms IS NULL AND task_state = 0 AND max_attempts = 3");
    ASSERT_ROW(db, b.tmo0, "timeout_ms IS NULL AND task_state = 1 AND attempts = 1");
    ASSERT_ROW(db, b.runneg, "run_after = 0 AND `delayed` = 0 AND task_state = 0");
    ASSERT_ROW(db, b.multi, "attempts = 0 AND max_attempts = 1 AND timeout_ms IS NULL AND"
                            " run_after = 0 AND task_state = 0");
    /* An empty type: 'default'; an unfinished row FAILED with the reason, a finished one
     * otherwise untouched. */
    ASSERT_ROW(db, b.type_new, "task_type = 'default' AND task_state = 3 AND `delayed` = 0 AND"
                               " attempts = 0 AND err_msg LIKE 'schema migration 2: task_type"
                               " was empty%'");
    ASSERT_ROW(db, b.type_proc, "task_type = 'default' AND task_state = 3 AND attempts = 1 AND"
                                " err_msg LIKE 'schema migration 2:%'");
    ASSERT_ROW(db, b.type_done, "task_type = 'default' AND task_state = 2 AND err_msg IS NULL");
    assert_int_equal(tp_testdb_query_u64(db, "SELECT last_update_time FROM task WHERE task_id = %"
                                         PRIu64, b.type_done),
                     done_update_before);
    ASSERT_ROW(db, b.type_failed, "task_type = 'default' AND task_state = 3 AND"
                                  " err_msg = 'old error'");
    snprintf(cond, sizeof cond, "task_id IN (%s) AND err_msg LIKE 'schema migration 2%%'", b.ids);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE %s", cond), 2);

    assert_v2_checks(db);

    /* Version 5: every row the old dispatcher left PROCESSING is listed in task_claim
     * under its epoch, so that the first version 5 leader recovers it. */
    uint64_t processing = tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_state = 1");
    assert_true(processing > 0 && processing != TP_TESTDB_U64_ERR);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task t WHERE task_state = 1 AND"
                                             " NOT EXISTS (SELECT 1 FROM task_claim c WHERE c.epoch ="
                                             " t.epoch AND c.task_ids = CAST(t.task_id AS CHAR))"),
                     0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task_claim"), processing);

    /* (b) Again: nothing to do, nothing changed. */
    all_after = fingerprint(db, "1");
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
    assert_int_equal(count_lines_with(out, "->"), 0);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(fingerprint(db, "1"), all_after);

    /* The upgraded database is one taskpushd runs on, and it recovers those rows (after
     * --adopt-grace-ms) and their lists. */
    assert_int_equal(tp_daemon_start(&fx->d, db->url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, 20000), 0);
    for (int i = 0; i < 200 && tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task_claim") != 0; i++)
        usleep(50 * 1000);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task_claim"), 0);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_state = 1"), 0);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, 20000), 0);
}

/* The migration file run by hand twice (as its header allows) ends where --migrate does. */
static void test_migration_file_rerun_by_hand(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    uint64_t after_first;

    snprintf(path, sizeof path, "%s/sql/migrations/002-row-value-checks.sql", root ? root : ".");
    assert_int_equal(tp_testdb_create("migrate_hand", db), 0);
    make_v1(db);
    ins(db, "task_type, max_attempts, timeout_ms", "'a', 0, -1");
    assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
    assert_int_equal(version(db), 2);
    after_first = fingerprint(db, "1");
    assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
    assert_int_equal(version(db), 2);
    assert_int_equal(fingerprint(db, "1"), after_first);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema."
                                             "CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA ="
                                             " DATABASE()"),
                     8);
    assert_v2_checks(db);

    /* Then 003 by hand, twice: the lease row and its columns, version 3, the epoch kept. */
    snprintf(path, sizeof path, "%s/sql/migrations/003-leadership-lease.sql", root ? root : ".");
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 5 WHERE name = 'epoch'"), 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
        assert_int_equal(version(db), 3);
    }
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM taskpush_meta WHERE name = 'lease'"
                                             " AND value = 0 AND holder = 0 AND expires_ms = 0"
                                             " AND conns = ''"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = 'epoch'"), 5);
}

/* Some of the new constraints added by hand: the migration stops with the server's
 * message and the version stays 1. */
static void test_migrate_stops_on_partial_constraints(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];

    assert_int_equal(tp_testdb_create("migrate_partial", db), 0);
    make_v1(db);
    assert_int_equal(tp_testdb_exec(db, "ALTER TABLE task ADD CONSTRAINT run_after_min CHECK"
                                        " (run_after >= 0)"),
                     0);
    assert_int_equal(migrate(db, out), 1);
    assert_non_null(strstr(out, "schema 1 -> 2 (row value checks) failed"));
    assert_non_null(strstr(out, "drop its partly added constraints"));
    assert_non_null(strstr(out, "stays at version 1"));
    assert_int_equal(version(db), 1);

    assert_int_equal(tp_testdb_exec(db, "ALTER TABLE task DROP CONSTRAINT run_after_min"), 0);
    assert_int_equal(migrate(db, out), 0);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
}

/* (c) taskpushd on a version 1 database: exits 1, names --migrate, touches nothing. */
static void test_old_schema_refused(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];
    uint64_t before;

    assert_int_equal(tp_testdb_create("migrate_old", db), 0);
    make_v1(db);
    ins(db, "task_type, task_state, epoch, attempts", "'a', 1, 3, 1");
    ins(db, "task_type", "'a'");
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 3 WHERE name = 'epoch'"),
                     1);
    before = fingerprint(db, "1");

    assert_int_equal(serve(db, out), 1);
    assert_non_null(strstr(out, "schema version 1 is older than this taskpushd (" KNOWN_TEXT ")"));
    assert_non_null(strstr(out, "taskpushd --db ... --migrate"));
    /* It never led: no epoch taken, the PROCESSING row not recovered. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name = 'epoch'"),
                     3);
    assert_int_equal(fingerprint(db, "1"), before);
    assert_int_equal(version(db), 1);
}

/* (d) A version newer than this build: both modes exit 1 saying so. */
static void test_newer_schema_refused(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];

    assert_int_equal(tp_testdb_create("migrate_new", db), 0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 99 WHERE name ="
                                        " 'schema_version'"),
                     1);
    assert_int_equal(serve(db, out), 1);
    assert_non_null(strstr(out, "schema version 99 is newer than this taskpushd knows (" KNOWN_TEXT "):"
                                " upgrade taskpushd"));
    assert_int_equal(migrate(db, out), 1);
    assert_non_null(strstr(out, "schema version 99 is newer than this taskpushd knows (" KNOWN_TEXT ")"));
    assert_int_equal(version(db), 99);
}

/* SHOW CREATE TABLE of name on db, with the AUTO_INCREMENT=N table option removed.
 * Returns malloc'ed text (caller frees). */
static char *create_table(tp_testdb *db, const char *name)
{
    char sql[128];
    MYSQL_RES *res;
    MYSQL_ROW row;
    char *text;
    regex_t re;
    regmatch_t m;

    snprintf(sql, sizeof sql, "SHOW CREATE TABLE %s", name);
    assert_int_equal(mysql_query(db->conn, sql), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    text = strdup(row[1]);
    mysql_free_result(res);
    assert_non_null(text);
    assert_int_equal(regcomp(&re, " AUTO_INCREMENT=[0-9]+", REG_EXTENDED), 0);
    if (regexec(&re, text, 1, &m, 0) == 0)
        memmove(text + m.rm_so, text + m.rm_eo, strlen(text + m.rm_eo) + 1);
    regfree(&re);
    return text;
}

/* (e) A migrated version 1 database and a fresh one are the same tables. */
static void test_migrated_equals_fresh(void **state)
{
    struct fx *fx = *state;
    char out[OUT_MAX];
    static const char *const tables[] = {"task", "taskpush_meta", "task_schedule", "task_claim"};

    assert_int_equal(tp_testdb_create("migrate_eq_old", &fx->db), 0);
    assert_int_equal(tp_testdb_create("migrate_eq_new", &fx->db2), 0);
    make_v1(&fx->db);
    ins(&fx->db, "task_type", "'a'");
    assert_int_equal(migrate(&fx->db, out), 0);
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char *a = create_table(&fx->db, tables[i]), *b = create_table(&fx->db2, tables[i]);
        if (strcmp(a, b) != 0)
            fprintf(stderr, "migrated:\n%s\nfresh:\n%s\n", a, b);
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    assert_v2_checks(&fx->db2);
}

/* --migrate refuses while the table's leadership lock is held: by any connection, and by
 * a real leading taskpushd (the same lock name as db.c's). */
static void test_migrate_refuses_while_led(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];
    MYSQL *holder;

    assert_int_equal(tp_testdb_create("migrate_led", db), 0);
    make_v1(db);
    ins(db, "task_type, max_attempts", "'a', 0");
    holder = tp_testdb_connect(db);
    assert_non_null(holder);
    assert_int_equal(tp_testdb_query_u64_conn(holder, "SELECT GET_LOCK('taskpush.%s', 0)", db->name),
                     1);
    assert_int_equal(migrate(db, out), 1);
    assert_non_null(strstr(out, "a taskpushd leads database"));
    assert_non_null(strstr(out, "nothing was changed"));
    assert_int_equal(version(db), 1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT max_attempts FROM task"), 0);
    assert_int_equal(tp_testdb_query_u64_conn(holder, "SELECT RELEASE_LOCK('taskpush.%s')", db->name),
                     1);
    mysql_close(holder);
    assert_int_equal(migrate(db, out), 0);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);

    /* A real leader. */
    assert_int_equal(tp_daemon_start(&fx->d, db->url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, 20000), 0);
    assert_int_equal(migrate(db, out), 1);
    assert_non_null(strstr(out, "a taskpushd leads database"));
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, 20000), 0);
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
}

/* No schema at all: --migrate creates the current one (issue 31; it used to say to load
 * sql/schema.sql), as sql/schema.sql would; a task table without a version: it refuses
 * and changes nothing; bad flags exit 2. */
static void test_migrate_without_schema_and_bad_flags(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];

    assert_int_equal(tp_testdb_create("migrate_empty", db), 0);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "created schema version"));
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables"
                                             " WHERE table_schema = DATABASE()"),
                     7);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
    /* Only some of the seven, without a version: refused, nothing changed. */
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta"), 0);
    assert_int_equal(migrate(db, out), 1);
    assert_non_null(strstr(out, "cannot tell what they hold"));
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables"
                                             " WHERE table_schema = DATABASE()"),
                     5);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);

    make_v1(db);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE taskpush_meta"), 0);
    assert_int_equal(migrate(db, out), 1);
    assert_non_null(strstr(out, "no schema version"));
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables"
                                             " WHERE table_schema = DATABASE()"),
                     1);

    const char *const extra[] = {"--db", db->url, "--migrate=yes", NULL};
    assert_int_equal(run_taskpushd(extra, out), 2);
    const char *const nodb[] = {"--migrate", NULL};
    assert_int_equal(run_taskpushd(nodb, out), 2);
    assert_non_null(strstr(out, "--db URL is required"));
    /* An unreachable server: a database error, exit 1 with the client's message. */
    const char *const down[] = {"--db", "mysql://nobody@127.0.0.1:1/nodb", "--migrate", NULL};
    assert_int_equal(run_taskpushd(down, out), 1);
    assert_non_null(strstr(out, "cannot connect to database nodb"));
}

/* Replaces the fresh schema with version 11: claim_lane the state of every row, keyed
 * or not (version 12 makes it NULL for a keyed row unless FAILED). */
static void make_v11(tp_testdb *db)
{
    assert_int_equal(tp_testdb_exec(db, "ALTER TABLE task MODIFY COLUMN claim_lane TINYINT AS"
                                        " (IF(task_state = 2, 1, task_state)) VIRTUAL"),
                     0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 11 WHERE name = 'schema_version'"), 1);
}

/* Replaces the fresh schema with version 8: without the task_setting of version 9, the
 * task_dep of version 10 and the task_progress of version 11. */
static void make_v8(tp_testdb *db)
{
    make_v11(db);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task_setting, task_dep, task_progress"), 0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 8 WHERE name = 'schema_version'"), 1);
}

/* Replaces the fresh schema with version 7: version 8 without the group_key, group_lane
 * and group_idx of version 8. */
static void make_v7(tp_testdb *db)
{
    make_v8(db);
    assert_int_equal(tp_testdb_exec(db, "ALTER TABLE task DROP INDEX group_idx, DROP COLUMN group_lane,"
                                            " DROP COLUMN group_key"), 0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 7 WHERE name = 'schema_version'"), 1);
}

/* Replaces the fresh schema with version 6: version 7 without the failed_at and
 * failed_idx of version 7. */
static void make_v6(tp_testdb *db)
{
    make_v7(db);
    assert_int_equal(tp_testdb_exec(db, "ALTER TABLE task DROP INDEX failed_idx, DROP COLUMN failed_at"), 0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 6 WHERE name = 'schema_version'"), 1);
}

/* Replaces the fresh schema with version 5: version 6 without the attempts_max of
 * version 6. */
static void make_v5(tp_testdb *db)
{
    make_v6(db);
    assert_int_equal(tp_testdb_exec(db, "ALTER TABLE task DROP CONSTRAINT IF EXISTS attempts_max"), 0);
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 5 WHERE name = 'schema_version'"), 1);
}

/* A version 5 database with attempts out of version 6's range (2147483647 NEW, 5000
 * FAILED, 1001 PROCESSING) is upgraded: those are clamped to 1000, every other row is
 * unchanged, the migration never fails on them, the new check holds (1001 refused, 1000
 * accepted), and a second run is a no-op. */
static void test_migrate_v5_attempts(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];
    uint64_t huge, big, proc, before, after;
    MYSQL_RES *res;

    assert_int_equal(tp_testdb_create("migrate_v5_att", db), 0);
    make_v5(db);
    for (int i = 0; i < 20; i++)
        ins(db, "task_type, attempts, max_attempts", i % 2 ? "'a', 1000, 1000" : "'a', 2, 3");
    huge = ins(db, "task_type, attempts, max_attempts", "'a', 2147483647, 3");
    big = ins(db, "task_type, task_state, attempts, err_msg", "'a', 3, 5000, 'e'");
    proc = ins(db, "task_type, task_state, attempts, epoch", "'a', 1, 1001, 4");
    before = fingerprint(db, "attempts <= 1000");
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "schema 5 -> 6"));
    assert_non_null(strstr(out, "schema 6 -> 7"));
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    ASSERT_ROW(db, huge, "attempts = 1000 AND task_state = 0 AND max_attempts = 3");
    ASSERT_ROW(db, big, "attempts = 1000 AND task_state = 3 AND err_msg = 'e'");
    ASSERT_ROW(db, proc, "attempts = 1000 AND task_state = 1 AND epoch = 4");
    assert_int_equal(fingerprint(db, "task_id NOT IN (SELECT task_id FROM task WHERE attempts = 1000"
                                     " AND max_attempts <> 1000)"),
                     before);
    /* The check: 1001 refused (INSERT IGNORE too), 1000 accepted. */
    assert_int_equal(insert_checked(db->conn, "INSERT IGNORE INTO task (attempts) VALUES (1001)"), 0);
    assert_int_not_equal(mysql_query(db->conn, "UPDATE task SET attempts = attempts + 1 WHERE attempts = 1000 LIMIT 1"), 0);
    assert_check_error(mysql_errno(db->conn));
    assert_int_equal(insert_checked(db->conn, "INSERT INTO task (attempts, max_attempts) VALUES (1000, 1000)"), 1);
    after = fingerprint(db, "1");
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
    /* By hand, twice more: the same. */
    char path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/sql/migrations/006-attempts-max.sql", root ? root : ".");
    assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(fingerprint(db, "1"), after);
    assert_int_equal(mysql_query(db->conn, "SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS"
                                           " WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_NAME ="
                                           " 'attempts_max'"),
                     0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    assert_string_equal(mysql_fetch_row(res)[0], "1");
    mysql_free_result(res);
}

/* A version 6 database with FAILED rows (and rows in the other states) is upgraded:
 * failed_at is the last_update_time of the FAILED rows and NULL elsewhere, the newest
 * failure of a type is found through failed_idx (EXPLAIN), the rows are unchanged, and
 * the file run again by hand changes nothing. */
static void test_migrate_v6_failed_at(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    uint64_t before, after, old_fail, new_fail;

    assert_int_equal(tp_testdb_create("migrate_v6_fat", db), 0);
    make_v6(db);
    for (int i = 0; i < 30; i++)
        ins(db, "task_type, task_state, last_update_time", i % 3 == 0 ? "'a', 0, 5" : i % 3 == 1 ? "'a', 2, 6" : "'b', 1, 7");
    new_fail = ins(db, "task_type, task_state, last_update_time, err_msg", "'a', 3, 2000, 'new'");
    old_fail = ins(db, "task_type, task_state, last_update_time, err_msg", "'a', 3, 1000, 'old'");
    before = fingerprint(db, "1");
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "schema 6 -> 7"));
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(fingerprint(db, "1"), before);
    ASSERT_ROW(db, old_fail, "failed_at = 1000");
    ASSERT_ROW(db, new_fail, "failed_at = 2000");
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE failed_at IS NOT NULL"), 2);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_id FROM task FORCE INDEX (failed_idx) WHERE"
                                             " task_type = 'a' AND failed_at IS NOT NULL ORDER BY"
                                             " failed_at DESC LIMIT 1"),
                     new_fail);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.statistics WHERE"
                                             " table_schema = DATABASE() AND table_name = 'task' AND"
                                             " index_name = 'failed_idx'"),
                     2);
    after = fingerprint(db, "1");
    snprintf(path, sizeof path, "%s/sql/migrations/007-failed-at.sql", root ? root : ".");
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
        assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
        assert_int_equal(fingerprint(db, "1"), after);
    }
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
}

/* A version 7 database with rows in every state is upgraded: every row gets group_key
 * and group_lane NULL and is otherwise unchanged, group_idx exists with its 7 parts
 * (those of sql/schema.sql) and serves the
 * claim's read (EXPLAIN names it), a key can be written, and the file run again by hand
 * changes nothing. */
static void test_migrate_v7_group_key(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    uint64_t before, after, id;

    assert_int_equal(tp_testdb_create("migrate_v7_grp", db), 0);
    make_v7(db);
    for (int i = 0; i < 30; i++)
        ins(db, "task_type, task_state", i % 3 == 0 ? "'a', 0" : i % 3 == 1 ? "'a', 2" : "'b', 1");
    before = fingerprint(db, "1");
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "schema 7 -> 8"));
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(fingerprint(db, "1"), before);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE group_key IS NULL"), 30);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.statistics WHERE"
                                             " table_schema = DATABASE() AND table_name = 'task' AND"
                                             " index_name = 'group_idx'"),
                     7);
    /* As sql/schema.sql: keyless rows sit under group_lane NULL (they never move in it). */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(column_name ORDER BY seq_in_index) ="
                                             " 'group_lane,delayed,task_type,task_priority,group_key,"
                                             "task_id,run_after' FROM information_schema.statistics"
                                             " WHERE table_schema = DATABASE() AND table_name = 'task'"
                                             " AND index_name = 'group_idx'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE group_lane IS NULL"), 30);
    id = ins(db, "task_type, group_key", "'a', 'k1'");
    ASSERT_ROW(db, id, "group_key = 'k1'");
    assert_int_equal(tp_testdb_query_u64(db, "SELECT task_id FROM task FORCE INDEX (group_idx) WHERE"
                                             " group_lane = 0 AND `delayed` = 0 AND task_type = 'a'"
                                             " AND task_priority = 1 AND group_key > 'k' ORDER BY"
                                             " group_key, task_id LIMIT 1"),
                     id);
    after = fingerprint(db, "1");
    snprintf(path, sizeof path, "%s/sql/migrations/008-group-key.sql", root ? root : ".");
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
        assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
        assert_int_equal(fingerprint(db, "1"), after);
    }
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
}

/* A version 8 database is upgraded: task_setting exists, empty, takes a row, its
 * checks hold, and the file run again by hand changes nothing (the row stays). */
static void test_migrate_v8_settings(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");

    assert_int_equal(tp_testdb_create("migrate_v8_set", db), 0);
    make_v8(db);
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "schema 8 -> 9"));
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task_setting"), 0);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task_setting (task_type, has_limit, concurrency)"
                                        " VALUES ('t', 1, 5)"),
                     1);
    assert_int_not_equal(mysql_query(db->conn, "INSERT INTO task_setting (task_type, concurrency)"
                                               " VALUES ('u', 1000001)"),
                         0);
    assert_check_error(mysql_errno(db->conn));
    snprintf(path, sizeof path, "%s/sql/migrations/009-runtime-settings.sql", root ? root : ".");
    assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT concurrency FROM task_setting WHERE task_type = 't'"), 5);
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
}

/* A version 11 database with rows in every state, with and without a key, is upgraded:
 * the rows are unchanged, claim_lane is NULL for the keyed ones but FAILED (lane 3) and
 * the state's lane for the others, claim_idx keeps its parts, and the file run again by
 * hand changes nothing. */
static void test_migrate_v11_keyed_lane(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], path[1024];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    uint64_t before;

    assert_int_equal(tp_testdb_create("migrate_v11_lane", db), 0);
    make_v11(db);
    for (int st = 0; st < 4; st++) {
        char vals[64];
        snprintf(vals, sizeof vals, "'a', %d, NULL", st);
        ins(db, "task_type, task_state, group_key", vals);
        snprintf(vals, sizeof vals, "'a', %d, 'k'", st);
        ins(db, "task_type, task_state, group_key", vals);
    }
    /* Version 11: the keyed rows sit in claim_idx's lanes like the others. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE claim_lane IS NULL"), 0);
    before = fingerprint(db, "1");
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "schema 11 -> 12"));
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(fingerprint(db, "1"), before);
    /* NEW 0, PROCESSING 1, SUCCESSFUL 1, FAILED 3 without a key (digit k: state k's lane);
     * with one, only FAILED has a lane (3), the others NULL. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT SUM(claim_lane * POW(10, task_state)) FROM task"
                                             " WHERE group_key IS NULL"),
                     3110);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT SUM(claim_lane * POW(10, task_state)) FROM task"
                                             " WHERE group_key IS NOT NULL"),
                     3000);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE claim_lane IS NULL"), 3);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT GROUP_CONCAT(column_name ORDER BY seq_in_index) ="
                                             " 'claim_lane,delayed,task_type,task_priority,task_id,"
                                             "run_after' FROM information_schema.statistics"
                                             " WHERE table_schema = DATABASE() AND table_name = 'task'"
                                             " AND index_name = 'claim_idx'"),
                     1);
    /* A claim of the keyed NEW row moves it in group_idx only: its claim_lane stays NULL. */
    assert_int_equal(tp_testdb_exec(db, "UPDATE task SET task_state = 1 WHERE group_key = 'k' AND"
                                        " task_state = 0"),
                     1);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE claim_lane IS NULL"), 3);
    before = fingerprint(db, "1");
    snprintf(path, sizeof path, "%s/sql/migrations/012-keyed-claim-lane.sql", root ? root : ".");
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
        assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
        assert_int_equal(fingerprint(db, "1"), before);
    }
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
}

/* Builds version 4 from version 1 with the migrations 002 to 004 run by hand. */
static void make_v4(tp_testdb *db)
{
    static const char *const files[] = {"002-row-value-checks.sql", "003-leadership-lease.sql",
                                        "004-task-schedule.sql"};
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    char path[1024];

    make_v1(db);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/sql/migrations/%s", root ? root : ".", files[i]);
        assert_int_equal(tp_testdb_load_file(db->conn, path), 0);
    }
    assert_int_equal(version(db), 4);
}

/* A fingerprint of many rows (fingerprint's text would pass max_allowed_packet): the sum
 * of each row's CRC32 over every column, with the count. */
static uint64_t big_fingerprint(tp_testdb *db)
{
    uint64_t v = tp_testdb_query_u64(
        db, "SELECT COUNT(*) * 4294967296 + SUM(CRC32(CONCAT_WS(',', task_id, HEX(task_type), task_state,"
            " task_priority, IFNULL(HEX(payload), '-'), insert_time, last_update_time, attempts,"
            " max_attempts, run_after, IFNULL(timeout_ms, '-'), IFNULL(HEX(dedup_key), '-'),"
            " IFNULL(HEX(err_msg), '-'), IFNULL(HEX(result), '-'), epoch, `delayed`))) FROM task");
    assert_true(v != TP_TESTDB_U64_ERR);
    return v;
}

/* The id of a connection of db running an ALTER TABLE of task, 0 when none. */
static uint64_t alter_running(tp_testdb *db)
{
    uint64_t id = tp_testdb_query_u64(db, "SELECT IFNULL(MAX(ID), 0) FROM information_schema.PROCESSLIST"
                                          " WHERE DB = DATABASE() AND INFO LIKE 'ALTER TABLE task%%'");
    assert_true(id != TP_TESTDB_U64_ERR);
    return id;
}

/* kill -9 of --migrate while the server runs its ALTER: the server goes on with the rest
 * of that migration's text. A --migrate run at once after it waits for those statements
 * (it says so), then upgrades what is left; the schema ends current, every row intact. */
static void test_migrate_killed_then_rerun(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], path[256];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    uint64_t rows, before, killed_conn;
    long long end;
    int status;
    pid_t pid;

    assert_int_equal(tp_testdb_create("migrate_killed", db), 0);
    make_v4(db);
    /* Enough rows that rebuilding claim_idx (migration 5) takes a while. */
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, task_state, task_priority, payload,"
                                        " epoch) SELECT CONCAT('t', seq %% 7), seq %% 4, seq %% 3,"
                                        " REPEAT('p', seq %% 50), IF(seq %% 4 = 1, 3, 0) FROM seq_1_to_4000"),
                     4000);
    for (int i = 0; i < 7; i++)
        assert_true(tp_testdb_exec(db, "INSERT INTO task (task_type, task_state, task_priority, payload,"
                                       " epoch) SELECT task_type, task_state, task_priority, payload, epoch"
                                       " FROM task") > 0);
    rows = tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task");
    assert_int_equal(rows, 4000u << 7);
    before = big_fingerprint(db);

    snprintf(path, sizeof path, "%s/test-migrate-killed-%d.out", tmp, (int)getpid());
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(tp_build_path("dispatcher/taskpushd"), "taskpushd", "--db", db->url, "--migrate",
              (char *)NULL);
        _exit(127);
    }
    for (end = tp_mono_ms() + RUN_LIMIT_MS; (killed_conn = alter_running(db)) == 0; tp_sleep_ms(2)) {
        if (waitpid(pid, &status, WNOHANG) == pid || tp_mono_ms() > end) {
            kill(pid, SIGKILL);
            unlink(path);
            fail_msg("the migration's ALTER TABLE was never seen running");
        }
    }
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    unlink(path);
    bool still = alter_running(db) == killed_conn;
    printf("# killed --migrate during its ALTER (connection %" PRIu64 "); still running after the"
           " kill: %s\n",
           killed_conn, still ? "yes" : "no");

    assert_int_equal(migrate(db, out), 0);
    if (still)
        assert_non_null(strstr(out, "waiting for the statements of an earlier --migrate"));
    assert_int_equal(version(db), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task"), rows);
    assert_int_equal(big_fingerprint(db), before);
    /* Every row of migration 5's list is there: one per PROCESSING row. */
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task_claim"),
                     tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_state = 1"));
    assert_int_equal(migrate(db, out), 0);
    assert_non_null(strstr(out, "nothing to do"));
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, fx_setup, fx_teardown)
    const struct CMUnitTest tests[] = {
        T(test_migrate_v1_with_rows),
        T(test_migration_file_rerun_by_hand),
        T(test_migrate_stops_on_partial_constraints),
        T(test_old_schema_refused),
        T(test_newer_schema_refused),
        T(test_migrated_equals_fresh),
        T(test_migrate_refuses_while_led),
        T(test_migrate_without_schema_and_bad_flags),
        T(test_migrate_v5_attempts),
        T(test_migrate_v6_failed_at),
        T(test_migrate_v7_group_key),
        T(test_migrate_v8_settings),
        T(test_migrate_v11_keyed_lane),
        T(test_migrate_killed_then_rerun),
    };
#undef T
    return cmocka_run_group_tests_name("migrate", tests, NULL, NULL);
}
