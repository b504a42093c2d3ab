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
 */
#include <errno.h>
#include <inttypes.h>
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

struct fx {
    tp_testdb db;
    char dir[256];
};

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
    assert_int_equal(tp_testdb_exec(db, "DROP TABLE task, taskpush_meta, task_schedule, task_claim"), 0);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pollers_exactly_once, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
