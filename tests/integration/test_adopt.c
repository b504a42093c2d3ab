/* test_adopt: a team's own table named task is never adopted (docs/adopting.md, issue 31
 * item 1). The table is the one teams have before taskpush, with their own state codes:
 *
 *   CREATE TABLE task (task_id BIGINT PRIMARY KEY AUTO_INCREMENT, task_state INT NOT NULL,
 *     task_priority INT NOT NULL, insert_time BIGINT NOT NULL, last_update_time BIGINT
 *     NOT NULL, payload TEXT) ENGINE=InnoDB
 *
 * with 1,000 rows. Real components only: the mariadb client, taskpushd of the build tree,
 * the MariaDB that scripts/tp-mariadb started.
 *
 * Cases:
 *   schema_sql_refuses   `mariadb DB < sql/schema.sql` exits non-zero with the message
 *                        (docs/adopting.md, the columns it lacks); nothing created
 *   migrate_refuses      `taskpushd --migrate` exits 1 naming the table and the columns:
 *                        without taskpush_meta, and with it stamped beside the table (as
 *                        the schema.sql of before did; version 6 said "nothing to do",
 *                        version 1 would have ALTERed the team's table)
 *   start_refuses        taskpushd exits 1 naming the table, the columns and indexes
 *   old_schema_kept      a version 1 taskpush schema: schema.sql changes nothing, and
 *                        --migrate still upgrades it
 * Every refusal leaves CHECKSUM TABLE and SHOW CREATE TABLE of the team's table as they
 * were, and creates none of taskpush's tables beside it.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mysql.h>

#include "daemon.h"
#include "db_claim_sql.h" /* DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN */
#include "run.h"
#include "testdb.h"

#define OUT_MAX 16384
#define RUN_LIMIT_MS 60000 /* only so that a hung program fails the test */
#define TEAM_ROWS 1000

#define TEAM_TABLE                                                                              \
    "CREATE TABLE task (task_id BIGINT PRIMARY KEY AUTO_INCREMENT, task_state INT NOT NULL,"   \
    " task_priority INT NOT NULL, insert_time BIGINT NOT NULL, last_update_time BIGINT NOT"   \
    " NULL, payload TEXT) ENGINE=InnoDB"

/* The columns every taskpush schema has that the team's table lacks, as the messages
 * list them (information_schema, in schema order). */
#define TEAM_LACKS "task_type, attempts, max_attempts, run_after, timeout_ms, dedup_key"

struct fx {
    tp_testdb db;
    char show_create[4096];
    uint64_t checksum;
};

/* What must not change: the table's definition and its rows. */
static void fingerprint(tp_testdb *db, char *show_create, size_t cap, uint64_t *checksum)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    assert_int_equal(mysql_query(db->conn, "SHOW CREATE TABLE task"), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    snprintf(show_create, cap, "%s", row[1]);
    mysql_free_result(res);

    assert_int_equal(mysql_query(db->conn, "CHECKSUM TABLE task"), 0);
    res = mysql_store_result(db->conn);
    assert_non_null(res);
    row = mysql_fetch_row(res);
    assert_non_null(row);
    assert_non_null(row[1]);
    *checksum = strtoull(row[1], NULL, 10);
    mysql_free_result(res);
}

static uint64_t tables_in(tp_testdb *db)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM information_schema.tables WHERE"
                                   " table_schema = DATABASE()");
}

/* A database holding only the team's table, with TEAM_ROWS rows. */
static void make_team_db(struct fx *fx, const char *tag)
{
    tp_testdb *db = &fx->db;

    assert_int_equal(tp_testdb_create(tag, db), 0);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(tp_testdb_exec(db, TEAM_TABLE), 0);
    /* 1,000 rows in their codes: NEW=1 PROCESSING=2 SUCCESSFUL=3 FAILED=4, LOW=0..HIGH=2. */
    assert_int_equal(tp_testdb_exec(db,
                                    "INSERT INTO task (task_state, task_priority, insert_time,"
                                    " last_update_time, payload) SELECT 1 + seq %% 4, seq %% 3,"
                                    " 1700000000000 + seq, 1700000000000 + seq, CONCAT('job-', seq)"
                                    " FROM seq_1_to_%d",
                                    TEAM_ROWS),
                     TEAM_ROWS);
    fingerprint(db, fx->show_create, sizeof fx->show_create, &fx->checksum);
    assert_int_equal(tables_in(db), 1);
}

/* The team's table is as it was; beside it only the tables the case put there. */
static void assert_untouched(struct fx *fx, uint64_t tables)
{
    char show_create[4096];
    uint64_t checksum;

    fingerprint(&fx->db, show_create, sizeof show_create, &checksum);
    assert_string_equal(show_create, fx->show_create);
    assert_int_equal(checksum, fx->checksum);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), TEAM_ROWS);
    assert_int_equal(tables_in(&fx->db), tables);
}

static int run_client(tp_testdb *db, const char *file, char *out)
{
    char port[16], password[160];
    const char *argv[12];
    int n = 0;

    snprintf(port, sizeof port, "%u", db->port);
    argv[n++] = "mariadb";
    argv[n++] = "-h";
    argv[n++] = db->host;
    argv[n++] = "-P";
    argv[n++] = port;
    argv[n++] = "-u";
    argv[n++] = db->user;
    if (db->password[0]) {
        snprintf(password, sizeof password, "--password=%s", db->password);
        argv[n++] = password;
    }
    argv[n++] = db->name;
    argv[n] = NULL;
    return tp_run(argv, file, out, OUT_MAX, RUN_LIMIT_MS);
}

static const char *source_path(const char *relative)
{
    static char path[512];
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");

    snprintf(path, sizeof path, "%s/%s", root ? root : ".", relative);
    return path;
}

static int run_migrate(tp_testdb *db, char *out)
{
    const char *argv[] = {tp_build_path("dispatcher/taskpushd"), "--db", db->url, "--migrate", NULL};
    return tp_run(argv, NULL, out, OUT_MAX, RUN_LIMIT_MS);
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    tp_testdb_drop(&fx->db);
    free(fx);
    return 0;
}

static int setup(void **state)
{
    *state = calloc(1, sizeof(struct fx));
    return *state ? 0 : -1;
}

static void test_schema_sql_refuses(void **state)
{
    struct fx *fx = *state;
    char out[OUT_MAX];

    make_team_db(fx, "adopt_schema");
    int rc = run_client(&fx->db, tp_testdb_schema_path(), out);
    assert_true(rc > 0 && rc < 128);
    assert_non_null(strstr(out, "sql/schema.sql changed nothing"));
    assert_non_null(strstr(out, "the table task of database"));
    assert_non_null(strstr(out, "is not taskpush's (see docs/adopting.md)"));
    /* the server cuts the text at about 200 bytes: the first columns are there */
    assert_non_null(strstr(out, "it lacks the columns task_type, attempts"));
    assert_untouched(fx, 1);
    /* and again: the refusal does not depend on what a first run left */
    assert_true(run_client(&fx->db, tp_testdb_schema_path(), out) > 0);
    assert_untouched(fx, 1);
}

static void test_migrate_refuses(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX];

    make_team_db(fx, "adopt_migrate");
    assert_int_equal(run_migrate(db, out), 1);
    assert_non_null(strstr(out, "--migrate refuses: the table task of database"));
    assert_non_null(strstr(out, "is not taskpush's: it lacks the columns " TEAM_LACKS));
    assert_non_null(strstr(out, "taskpush_meta has no schema_version"));
    assert_non_null(strstr(out, "docs/adopting.md"));
    assert_untouched(fx, 1);

    /* taskpush_meta beside it, as the schema.sql of before left it: the current version ... */
    assert_int_equal(tp_testdb_exec(db, "CREATE TABLE taskpush_meta (name VARCHAR(64) PRIMARY KEY,"
                                        " value BIGINT UNSIGNED NOT NULL)"),
                     0);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO taskpush_meta VALUES ('schema_version', %u)",
                                    tp_testdb_schema_version()),
                     1);
    assert_int_equal(run_migrate(db, out), 1);
    assert_non_null(strstr(out, "is not taskpush's: it lacks the columns " TEAM_LACKS));
    assert_null(strstr(out, "nothing to do"));
    assert_untouched(fx, 2);
    /* ... or version 1, where every migration would have run on the team's table */
    assert_int_equal(tp_testdb_exec(db, "UPDATE taskpush_meta SET value = 1"), 1);
    assert_int_equal(run_migrate(db, out), 1);
    assert_non_null(strstr(out, "is not taskpush's"));
    assert_null(strstr(out, "schema 1 -> 2"));
    assert_untouched(fx, 2);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta"), 1);
}

static void test_start_refuses(void **state)
{
    struct fx *fx = *state;
    char out[OUT_MAX];

    make_team_db(fx, "adopt_start");
    const char *argv[] = {tp_build_path("dispatcher/taskpushd"), "--db", fx->db.url, "--listen",
                          "127.0.0.1:0", "--admin", "127.0.0.1:0", NULL};
    assert_int_equal(tp_run(argv, NULL, out, OUT_MAX, RUN_LIMIT_MS), 1);
    assert_non_null(strstr(out, "refusing to start: the table task of database"));
    assert_non_null(strstr(out, "it lacks the columns " TEAM_LACKS));
    assert_non_null(strstr(out, "the indexes claim_idx, delay_idx"));
    assert_non_null(strstr(out, "docs/adopting.md"));
    assert_untouched(fx, 1);
}

static void test_old_schema_kept(void **state)
{
    struct fx *fx = *state;
    tp_testdb *db = &fx->db;
    char out[OUT_MAX], before[4096], after[4096];
    uint64_t sum_before, sum_after;

    assert_int_equal(tp_testdb_create("adopt_v1", db), 0);
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    assert_int_equal(tp_testdb_load_file(db->conn, source_path("tests/data/schema-v1.sql")), 0);
    assert_int_equal(tp_testdb_exec(db, "INSERT INTO task (task_type, payload) SELECT 'v1', seq"
                                        " FROM seq_1_to_100"),
                     100);
    fingerprint(db, before, sizeof before, &sum_before);
    uint64_t tables = tables_in(db);

    assert_int_equal(run_client(db, tp_testdb_schema_path(), out), 0);
    fingerprint(db, after, sizeof after, &sum_after);
    assert_string_equal(after, before);
    assert_int_equal(sum_after, sum_before);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name ="
                                             " 'schema_version'"),
                     1);
    /* schema.sql may add the tables a later version brought; it never changes task */
    assert_true(tables_in(db) >= tables);

    assert_int_equal(run_migrate(db, out), 0);
    assert_non_null(strstr(out, "schema 1 -> 2"));
    assert_int_equal(tp_testdb_query_u64(db, "SELECT value FROM taskpush_meta WHERE name ="
                                             " 'schema_version'"),
                     DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
    assert_int_equal(tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task"), 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_schema_sql_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_schema_kept, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
