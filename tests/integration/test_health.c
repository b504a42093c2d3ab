/* test_health: /healthz means "this dispatcher can do its job" (SPEC, the /healthz row):
 * the database reachable, the schema taskpush's and current, its statements succeeding;
 * a standby healthy while it could take over. Issue 29, item 1.
 *
 * Real components only: MariaDB (scripts/tp-mariadb, see testdb.h) and the taskpushd of
 * the build tree. Waits are bounded polls; nothing asserts on how long something took.
 *
 * Cases:
 *   no_schema            a database with no table: /healthz 503 naming the missing schema,
 *                        /stats health {ok false, reason}; sql/schema.sql loaded: 200
 *   foreign_table        a team's own task table (its shape, then with taskpush_meta beside
 *                        it as the sql/schema.sql of before left it): exit 1, the log
 *                        names the table and what differs; SHOW CREATE TABLE unchanged
 *   failing_statements   the leader running, delay_idx dropped: /healthz 503 with the
 *                        error, reconnects back off (few in 10 s, not one per 100 ms);
 *                        the index back: 200 again
 *   standby_healthy      a leader and a standby on a good schema: both 200, health ok
 */
#include <fcntl.h>
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
#include <jansson.h>
#include <mysql.h>

#include "daemon.h"
#include "testdb.h"

/* Bounds of the polls: only so that a hung daemon fails the test instead of hanging it. */
#define WAIT_MS 60000
#define EXIT_WAIT_MS 30000
/* Reconnects of a claim connection whose statement fails every time, in 10 s: main's
 * code reconnected every 100-200 ms (50+); with the streak's backoff it is a handful. */
#define RECONNECTS_10S_MAX 15
/* Log lines naming the failing index in those ~10-20 s: main's code logged two per retry
 * (~100 in 12 s); the streak's 1st, 2nd, 4th, 8th ... are logged. */
#define LOG_LINES_MAX 15

#define TEAM_TABLE                                                                                 \
    "CREATE TABLE task (task_id BIGINT AUTO_INCREMENT PRIMARY KEY, task_state TINYINT,"           \
    " payload BLOB)"

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d[2];
    char log_path[256];
};

static int fx_setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    unsetenv("TASKPUSH_TOKEN");
    unsetenv("TASKPUSH_ADMIN_TOKEN");
    unsetenv("TASKPUSH_DB");
    if (tp_testdb_create("health", &fx->db) < 0)
        return -1;
    fx->have_db = true;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *fx = *state;
    for (int i = 0; i < 2; i++)
        if (fx->d[i].pid > 0)
            tp_daemon_stop(&fx->d[i], SIGTERM, 15000);
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    if (fx->log_path[0])
        unlink(fx->log_path);
    free(fx);
    return 0;
}

/* Drops every table of the test database (sql/schema.sql's included). */
static void drop_all_tables(struct fx *fx)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    char names[64][70];
    int n = 0;

    tp_testdb_exec(&fx->db, "SET FOREIGN_KEY_CHECKS = 0");
    assert_int_equal(mysql_query(fx->db.conn, "SELECT table_name FROM information_schema.tables"
                                              " WHERE table_schema = DATABASE()"), 0);
    assert_non_null(res = mysql_store_result(fx->db.conn));
    while ((row = mysql_fetch_row(res)) != NULL && n < 64)
        snprintf(names[n++], sizeof names[0], "%s", row[0]);
    mysql_free_result(res);
    for (int i = 0; i < n; i++)
        assert_true(tp_testdb_exec(&fx->db, "DROP TABLE `%s`", names[i]) >= 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM information_schema.tables"
                                                  " WHERE table_schema = DATABASE()"), 0);
}

/* SHOW CREATE TABLE task into out. */
static void show_create(struct fx *fx, char *out, size_t cap)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    assert_int_equal(mysql_query(fx->db.conn, "SHOW CREATE TABLE task"), 0);
    assert_non_null(res = mysql_store_result(fx->db.conn));
    assert_non_null(row = mysql_fetch_row(res));
    snprintf(out, cap, "%s", row[1]);
    mysql_free_result(res);
}

static bool file_has(const char *path, const char *needle)
{
    char buf[32768];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return strstr(buf, needle) != NULL;
}

static void dump(const char *path)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    fprintf(stderr, "---- %s ----\n%s", path, buf);
}

/* Runs taskpushd --db url until it exits (stderr into fx->log_path); its exit code, or
 * -1 when it still ran after EXIT_WAIT_MS (then killed). */
static int run_to_exit(struct fx *fx, const char *url)
{
    const char *argv[] = {tp_build_path("dispatcher/taskpushd"), "--db", url, "--listen", "127.0.0.1:0",
                          "--admin", "127.0.0.1:0", NULL};
    snprintf(fx->log_path, sizeof fx->log_path, "/tmp/tp-health-%d.log", (int)getpid());
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(fx->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(126);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    for (long long end = tp_mono_ms() + EXIT_WAIT_MS; waitpid(pid, &st, WNOHANG) == 0;) {
        if (tp_mono_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        tp_sleep_ms(20);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Polls /healthz of d until its status is want and (when needle) its body holds needle;
 * fails after WAIT_MS, saying what it last got. */
static void wait_healthz(tp_daemon *d, int want, const char *needle, const char *what)
{
    int status = -1;
    char *body = NULL;

    for (long long end = tp_mono_ms() + WAIT_MS;; tp_sleep_ms(50)) {
        free(body);
        body = NULL;
        status = tp_http_request(d->admin, "GET", "/healthz", &body);
        if (status == want && (needle == NULL || (body && strstr(body, needle))))
            break;
        if (tp_mono_ms() > end) {
            tp_daemon_dump_log(d);
            fail_msg("%s: /healthz %d \"%s\" after %d ms, want %d%s%s", what, status, body ? body : "",
                     WAIT_MS, want, needle ? " with " : "", needle ? needle : "");
        }
    }
    fprintf(stderr, "# %s: /healthz %d %s", what, status, body ? body : "\n");
    free(body);
}

/* /stats health of d: asserts ok, and (when needle) that reason holds it. */
static void expect_stats_health(tp_daemon *d, bool ok, const char *needle)
{
    json_t *s = tp_daemon_json(d, "/stats");
    assert_non_null(s);
    json_t *h = json_object_get(s, "health");
    if (!json_is_object(h)) {
        json_decref(s);
        fail_msg("/stats has no object \"health\"");
    }
    assert_int_equal(json_is_true(json_object_get(h, "ok")), ok);
    json_t *r = json_object_get(h, "reason");
    if (ok) {
        assert_true(json_is_null(r));
    } else {
        assert_true(json_is_string(r));
        if (needle && !strstr(json_string_value(r), needle))
            fail_msg("/stats health.reason \"%s\" does not say \"%s\"", json_string_value(r), needle);
    }
    json_decref(s);
}

static void no_schema(void **state)
{
    struct fx *fx = *state;

    drop_all_tables(fx);
    assert_int_equal(tp_daemon_start(&fx->d[0], fx->db.url, NULL), 0);
    wait_healthz(&fx->d[0], 503, "no taskpush schema", "no schema");
    expect_stats_health(&fx->d[0], false, "no taskpush schema");
    /* The schema loaded: healthy, and leading. */
    assert_int_equal(tp_testdb_load_file(fx->db.conn, tp_testdb_schema_path()), 0);
    wait_healthz(&fx->d[0], 200, "ok", "schema loaded");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    expect_stats_health(&fx->d[0], true, NULL);
}

/* taskpushd on the table as it is: exit 1 saying needles, the table unchanged. */
static void expect_refused(struct fx *fx, const char *const *needles)
{
    char before[4096], after[4096];

    show_create(fx, before, sizeof before);
    int rc = run_to_exit(fx, fx->db.url);
    for (size_t i = 0; needles[i]; i++)
        if (!file_has(fx->log_path, needles[i])) {
            dump(fx->log_path);
            fail_msg("the log does not say \"%s\"", needles[i]);
        }
    if (rc != 1) {
        dump(fx->log_path);
        fail_msg("taskpushd on a task table not taskpush's: exit %d, not 1", rc);
    }
    show_create(fx, after, sizeof after);
    assert_string_equal(before, after);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), 1);
}

static void foreign_table(void **state)
{
    struct fx *fx = *state;

    drop_all_tables(fx);
    assert_true(tp_testdb_exec(&fx->db, TEAM_TABLE) >= 0);
    assert_true(tp_testdb_exec(&fx->db, "INSERT INTO task (task_state, payload) VALUES (0, 'x')") >= 0);
    /* The team's table alone: no schema version. */
    const char *no_meta[] = {"refusing to start", "the table task of database", "not taskpush's",
                             "task_type", "claim_idx, delay_idx", "no schema_version", NULL};
    expect_refused(fx, no_meta);
    /* taskpush_meta stamped beside it, as sql/schema.sql did before it refused such a
     * table (test_adopt): a version, but not taskpush's columns and indexes. */
    assert_int_equal(tp_testdb_load_file(fx->db.conn, tp_testdb_schema_path()), -1);
    assert_int_equal(tp_testdb_exec(&fx->db, "CREATE TABLE taskpush_meta (name VARCHAR(64)"
                                             " PRIMARY KEY, value BIGINT UNSIGNED NOT NULL)"),
                     0);
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO taskpush_meta VALUES"
                                             " ('schema_version', %u), ('epoch', 0)",
                                    tp_testdb_schema_version()),
                     2);
    const char *lacks[] = {"refusing to start", "not taskpush's", "task_type", "claim_lane",
                           "claim_idx, delay_idx", NULL};
    expect_refused(fx, lacks);
}

static void failing_statements(void **state)
{
    struct fx *fx = *state;

    assert_int_equal(tp_daemon_start(&fx->d[0], fx->db.url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    wait_healthz(&fx->d[0], 200, "ok", "good schema");
    /* An index the claim thread's statements name, dropped under a running leader. */
    assert_true(tp_testdb_exec(&fx->db, "ALTER TABLE task DROP INDEX delay_idx") >= 0);
    wait_healthz(&fx->d[0], 503, "error 1176", "delay_idx dropped");
    expect_stats_health(&fx->d[0], false, "delay_idx");
    /* The retries back off: a few reconnects in 10 s, not one every 100-200 ms. */
    long long r0 = tp_daemon_stat(&fx->d[0], "db.reconnects_total");
    tp_sleep_ms(10000);
    long long r1 = tp_daemon_stat(&fx->d[0], "db.reconnects_total");
    fprintf(stderr, "# reconnects in 10 s with a statement failing every time: %lld\n", r1 - r0);
    assert_true(r0 >= 0 && r1 >= r0);
    if (r1 - r0 > RECONNECTS_10S_MAX)
        fail_msg("%lld reconnects in 10 s (at most %d expected)", r1 - r0, RECONNECTS_10S_MAX);
    /* And so does the log: repeated identical errors are not one line each. */
    int lines = tp_daemon_log_count(&fx->d[0], "delay_idx");
    fprintf(stderr, "# log lines naming delay_idx so far: %d\n", lines);
    if (lines > LOG_LINES_MAX)
        fail_msg("%d log lines name delay_idx (at most %d expected)", lines, LOG_LINES_MAX);
    wait_healthz(&fx->d[0], 503, "error 1176", "still failing");
    /* Mended: healthy again. */
    assert_true(tp_testdb_exec(&fx->db, "ALTER TABLE task ADD KEY delay_idx (`delayed`, run_after)") >= 0);
    wait_healthz(&fx->d[0], 200, "ok", "delay_idx back");
    expect_stats_health(&fx->d[0], true, NULL);
}

static void standby_healthy(void **state)
{
    struct fx *fx = *state;

    assert_int_equal(tp_daemon_start(&fx->d[0], fx->db.url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    assert_int_equal(tp_daemon_start(&fx->d[1], fx->db.url, NULL), 0);
    /* Past the standby's first re-reads of the schema (every 2 s). */
    for (int i = 0; i < 3; i++) {
        tp_sleep_ms(2000);
        json_t *st = tp_daemon_json(&fx->d[1], "/stats");
        assert_non_null(st);
        assert_true(json_is_false(json_object_get(st, "leader")));
        json_decref(st);
        wait_healthz(&fx->d[1], 200, "ok", "the standby");
        expect_stats_health(&fx->d[1], true, NULL);
        wait_healthz(&fx->d[0], 200, "ok", "the leader");
        expect_stats_health(&fx->d[0], true, NULL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(no_schema, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(foreign_table, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(failing_statements, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(standby_healthy, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
