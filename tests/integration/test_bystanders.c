/* test_bystanders: a standby taking over kills the old leader's database connections and
 * nobody else's (docs/architecture.md, "Standby and leadership"). Bystanders are sessions
 * of the same database user as taskpushd, on the same database: some idle, one running a
 * long SELECT SLEEP (a KILL QUERY on it would make SLEEP return 1, a KILL CONNECTION
 * would fail it).
 *
 * Cases:
 *   frozen_leader_only   one server: SIGSTOP of the leader; the standby leads, the
 *                        leader's connections are gone, every bystander is untouched
 *   same_second_servers  two private servers started in the same second (as a cluster's
 *                        nodes, containers or a restore are): a leader on server A
 *                        records its lease; the row, as a copy of A's database would
 *                        carry it, is put on server B, where bystanders hold the very
 *                        connection ids the row names; a taskpushd on B takes the lease
 *                        over and kills nobody (the rule of before trusted ids whose
 *                        server start times agreed within 2 s, and killed them)
 *
 * Real components only: taskpushd of the build tree, servers from scripts/tp-mariadb.
 */
#include <errno.h>
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
#include "testdb.h"

#define WAIT_MS 30000
#define SLEEP_S 10      /* the bystander's long statement: outlasts a takeover */
#define NBYSTANDERS 4   /* idle ones, besides the sleeper */
#define MAX_OPEN 64     /* connections opened on server B to reach the recorded ids */
#define NSLOT 5         /* the connections a lease records (claim, write, lease, stats, helper) */

struct sleeper {
    MYSQL *m;
    pthread_t thr;
    bool started;
    long long result; /* SLEEP's answer: 0 slept through, 1 interrupted; -1 error */
    unsigned err;
};

static void *sleeper_main(void *arg)
{
    struct sleeper *s = arg;
    char sql[64];
    MYSQL_RES *res;
    MYSQL_ROW row;

    s->result = -1;
    snprintf(sql, sizeof sql, "SELECT SLEEP(%d)", SLEEP_S);
    if (mysql_query(s->m, sql) != 0) {
        s->err = mysql_errno(s->m);
        return NULL;
    }
    if ((res = mysql_store_result(s->m)) != NULL) {
        if ((row = mysql_fetch_row(res)) != NULL && row[0])
            s->result = atoll(row[0]);
        mysql_free_result(res);
    } else {
        s->err = mysql_errno(s->m);
    }
    return NULL;
}

static void sleeper_start(struct sleeper *s, MYSQL *m)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    assert_int_equal(pthread_create(&s->thr, NULL, sleeper_main, s), 0);
    s->started = true;
}

/* Joins the sleeper and asserts that its statement ran to its end. */
static void sleeper_check(struct sleeper *s)
{
    pthread_join(s->thr, NULL);
    s->started = false;
    if (s->result != 0)
        fail_msg("the bystander's SELECT SLEEP(%d) was %s (result %lld, error %u)", SLEEP_S,
                 s->result == 1 ? "interrupted by a KILL QUERY" : "killed", s->result, s->err);
}

/* A session still open and the same one: its id unchanged (no reconnect is set). */
static void assert_alive(MYSQL *m, uint64_t id)
{
    uint64_t now = tp_testdb_query_u64_conn(m, "SELECT CONNECTION_ID()");
    if (now != id)
        fail_msg("bystander session %" PRIu64 " was killed (%s)", id, mysql_error(m));
}

/* The ids of the sessions that hold holder's connection locks on conn's server. */
static int holder_sessions(MYSQL *conn, uint64_t holder, uint64_t *ids)
{
    int n = 0;
    for (int slot = 0; slot < NSLOT; slot++) {
        uint64_t id = tp_testdb_query_u64_conn(
            conn, "SELECT IFNULL(IS_USED_LOCK('taskpush-conn/%016" PRIx64 "/%d'), 0)", holder, slot);
        if (id != 0 && id != TP_TESTDB_U64_ERR)
            ids[n++] = id;
    }
    return n;
}

static uint64_t processlist_has(MYSQL *conn, uint64_t id)
{
    return tp_testdb_query_u64_conn(conn, "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                                          " WHERE ID = %" PRIu64, id);
}

struct server {
    char dir[64];
    unsigned port;
    char user[128];
};

static int run_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    printf("# $ %s\n", cmd);
    int rc = system(cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static const char *const env_vars[4] = {"TASKPUSH_TEST_MYSQL_HOST", "TASKPUSH_TEST_MYSQL_PORT",
                                        "TASKPUSH_TEST_MYSQL_SOCKET", "TASKPUSH_TEST_MYSQL_USER"};

/* What a case started, for the teardown: its daemons; case 2's servers and the
 * environment they replace. */
struct two {
    tp_daemon d[2];
    struct server sv[2];
    char saved[4][256];
};

static int two_setup(void **state)
{
    struct two *t = calloc(1, sizeof *t);
    if (t == NULL)
        return -1;
    for (int i = 0; i < 4; i++)
        if (getenv(env_vars[i]))
            snprintf(t->saved[i], sizeof t->saved[i], "%s", getenv(env_vars[i]));
    *state = t;
    return 0;
}

/* Stops the servers however the case ended, and gives the environment back. */
static int two_teardown(void **state)
{
    struct two *t = *state;
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    for (int i = 0; i < 2; i++)
        if (t->d[i].pid > 0) {
            kill(t->d[i].pid, SIGCONT);
            tp_daemon_stop(&t->d[i], SIGKILL, 5000);
        }
    for (int i = 0; i < 2 && root; i++)
        if (t->sv[i].dir[0])
            run_sh("%s/scripts/tp-mariadb stop %s >/dev/null 2>&1; rm -rf %s %s.env", root,
                   t->sv[i].dir, t->sv[i].dir, t->sv[i].dir);
    for (int i = 0; i < 4; i++)
        setenv(env_vars[i], t->saved[i], 1);
    free(t);
    return 0;
}

/* ==== 1. one server: the frozen leader's connections, nobody else's ==== */

static void test_frozen_leader_only(void **state)
{
    struct two *t = *state;
    tp_testdb db;
    tp_daemon *leader = &t->d[0], *standby = &t->d[1];
    MYSQL *by[NBYSTANDERS + 1];
    uint64_t by_id[NBYSTANDERS + 1], old_ids[NSLOT], holder;
    struct sleeper sl;
    int nold;

    assert_int_equal(tp_testdb_create("bystand1", &db), 0);
    assert_int_equal(tp_daemon_start(leader, db.url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(leader, WAIT_MS), 0);
    assert_int_equal(tp_daemon_start(standby, db.url, NULL), 0);
    for (int i = 0; i <= NBYSTANDERS; i++) {
        by[i] = tp_testdb_connect(&db);
        assert_non_null(by[i]);
        by_id[i] = tp_testdb_query_u64_conn(by[i], "SELECT CONNECTION_ID()");
    }
    sleeper_start(&sl, by[NBYSTANDERS]);

    holder = tp_testdb_query_u64(&db, "SELECT holder FROM taskpush_meta WHERE name = 'lease'");
    assert_true(holder != 0 && holder != TP_TESTDB_U64_ERR);
    nold = holder_sessions(db.conn, holder, old_ids);
    printf("# the leader (holder %" PRIu64 ") holds %d connection lock(s)\n", holder, nold);
    assert_true(nold >= 3); /* claim, lease and stats at least; write and helper on use */

    assert_int_equal(kill(leader->pid, SIGSTOP), 0);
    assert_int_equal(tp_daemon_wait_leader(standby, WAIT_MS), 0);
    for (int i = 0; i < nold; i++) {
        long long until = tp_mono_ms() + WAIT_MS;
        while (processlist_has(db.conn, old_ids[i]) != 0 && tp_mono_ms() < until)
            tp_sleep_ms(50);
        assert_int_equal(processlist_has(db.conn, old_ids[i]), 0);
    }
    assert_true(tp_daemon_log_count(standby, "killed the old leader's database connections") >= 1);
    for (int i = 0; i < NBYSTANDERS; i++)
        assert_alive(by[i], by_id[i]);
    sleeper_check(&sl);
    assert_alive(by[NBYSTANDERS], by_id[NBYSTANDERS]);

    tp_daemon_stop(leader, SIGKILL, 5000);
    assert_int_equal(tp_daemon_stop(standby, SIGTERM, 15000), 0);
    for (int i = 0; i <= NBYSTANDERS; i++)
        mysql_close(by[i]);
    tp_testdb_drop(&db);
}

/* ==== 2. two servers started in the same second ==== */

/* Reads VAR from the "export VAR=value" lines tp-mariadb printed into path. */
static void env_value(const char *path, const char *var, char *out, size_t cap)
{
    char line[512], want[128];
    FILE *f = fopen(path, "r");
    out[0] = '\0';
    if (f == NULL)
        return;
    snprintf(want, sizeof want, "export %s=", var);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, want, strlen(want)) == 0) {
            snprintf(out, cap, "%s", line + strlen(want));
            out[strcspn(out, "\r\n")] = '\0';
        }
    }
    fclose(f);
}

/* Points the TASKPUSH_TEST_MYSQL_* environment (tp_testdb) at s. */
static void use_server(const struct server *s)
{
    char port[16], sock[128];
    snprintf(port, sizeof port, "%u", s->port);
    snprintf(sock, sizeof sock, "%s/mysqld.sock", s->dir);
    setenv("TASKPUSH_TEST_MYSQL_HOST", "127.0.0.1", 1);
    setenv("TASKPUSH_TEST_MYSQL_PORT", port, 1);
    setenv("TASKPUSH_TEST_MYSQL_SOCKET", sock, 1);
    setenv("TASKPUSH_TEST_MYSQL_USER", s->user, 1);
}

/* When the server of conn started, s since 1970, as taskpushd reads it. */
static int64_t boot_of(MYSQL *conn)
{
    return (int64_t)tp_testdb_query_u64_conn(
        conn, "SELECT UNIX_TIMESTAMP() - VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
              " WHERE VARIABLE_NAME = 'UPTIME'");
}

static void test_same_second_servers(void **state)
{
    struct two *t = *state;
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    struct server *sv = t->sv;
    tp_daemon *leader = &t->d[0], *standby = &t->d[1];
    tp_testdb dba, dbb;
    MYSQL *open_b[MAX_OPEN];
    uint64_t open_id[MAX_OPEN], holder, recorded[NSLOT];
    int nopen = 0, nrec = 0, covered = 0, sleeper_at = -1;
    int64_t boot_a, boot_b, boot_rec = -1;
    char conns[256], path[160], portbuf[32];
    struct sleeper sl;

    assert_non_null(root);

    /* Each server made and started (a second try if the machine is too busy for the
     * first), then both restarted together until their start times agree (as taskpushd
     * reads them: whole seconds), at most four times. */
    for (int i = 0; i < 2; i++) {
        snprintf(sv[i].dir, sizeof sv[i].dir, "/tmp/tp-bystanders-%c-%d", 'a' + i, (int)getpid());
        int rc = -1;
        for (int attempt = 0; attempt < 2 && rc != 0; attempt++) {
            run_sh("rm -rf %s", sv[i].dir);
            rc = run_sh("%s/scripts/tp-mariadb start %s >%s.env", root, sv[i].dir, sv[i].dir);
        }
        assert_int_equal(rc, 0);
        snprintf(path, sizeof path, "%s.env", sv[i].dir);
        env_value(path, "TASKPUSH_TEST_MYSQL_PORT", portbuf, sizeof portbuf);
        sv[i].port = (unsigned)atoi(portbuf);
        env_value(path, "TASKPUSH_TEST_MYSQL_USER", sv[i].user, sizeof sv[i].user);
        assert_true(sv[i].port > 0);
    }
    for (int tries = 0;; tries++) {
        assert_int_equal(run_sh("(%s/scripts/tp-mariadb restart %s >/dev/null || echo A failed) & "
                                "(%s/scripts/tp-mariadb restart %s >/dev/null || echo B failed) & wait",
                                root, sv[0].dir, root, sv[1].dir),
                         0);
        use_server(&sv[0]);
        assert_int_equal(tp_testdb_create("bystA", &dba), 0);
        use_server(&sv[1]);
        assert_int_equal(tp_testdb_create("bystB", &dbb), 0);
        boot_a = boot_of(dba.conn);
        boot_b = boot_of(dbb.conn);
        printf("# server A started at %" PRId64 ", server B at %" PRId64 "\n", boot_a, boot_b);
        if (boot_a == boot_b || tries == 3)
            break;
        tp_testdb_drop(&dba);
        tp_testdb_drop(&dbb);
    }
    assert_true(boot_a - boot_b <= 1 && boot_b - boot_a <= 1);

    /* A leader on A; its lease row as A holds it. */
    assert_int_equal(tp_daemon_start(leader, dba.url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(leader, WAIT_MS), 0);
    tp_sleep_ms(600); /* a renewal records every connection */
    {
        MYSQL_RES *res;
        MYSQL_ROW row;
        assert_int_equal(mysql_query(dba.conn, "SELECT holder, conns FROM taskpush_meta WHERE name = 'lease'"), 0);
        res = mysql_store_result(dba.conn);
        assert_non_null(res);
        row = mysql_fetch_row(res);
        assert_non_null(row);
        holder = strtoull(row[0], NULL, 10);
        snprintf(conns, sizeof conns, "%s", row[1] ? row[1] : "");
        mysql_free_result(res);
    }
    tp_daemon_stop(leader, SIGKILL, 5000);
    printf("# the leader on A recorded holder %" PRIu64 ", conns '%s'\n", holder, conns);
    {
        char *p = conns, *end;
        boot_rec = strtoll(p, &end, 10);
        for (p = end; nrec < NSLOT; p = end) {
            unsigned long long id = strtoull(p, &end, 10);
            if (end == p)
                break;
            if (id)
                recorded[nrec++] = id;
        }
    }
    assert_true(nrec >= 3);
    /* The rule of before would have trusted these ids on B: the starts agree within 2 s. */
    assert_true(boot_rec - boot_b <= 2 && boot_b - boot_rec <= 2);

    /* Bystanders on B, as many as it takes to hold the recorded ids. */
    use_server(&sv[1]);
    while (nopen < MAX_OPEN) {
        uint64_t maxrec = 0;
        for (int i = 0; i < nrec; i++)
            maxrec = recorded[i] > maxrec ? recorded[i] : maxrec;
        open_b[nopen] = tp_testdb_connect(&dbb);
        assert_non_null(open_b[nopen]);
        open_id[nopen] = tp_testdb_query_u64_conn(open_b[nopen], "SELECT CONNECTION_ID()");
        for (int i = 0; i < nrec; i++)
            if (recorded[i] == open_id[nopen]) {
                covered++;
                if (sleeper_at < 0 && i == 0)
                    sleeper_at = nopen; /* the recorded claim connection's id: the sleeper */
            }
        nopen++;
        if (open_id[nopen - 1] >= maxrec)
            break;
    }
    printf("# %d bystander session(s) on B, %d of them with an id the row records\n", nopen, covered);
    assert_true(covered >= 1);
    if (sleeper_at < 0)
        sleeper_at = nopen - 1;
    sleeper_start(&sl, open_b[sleeper_at]);

    /* The row as a copy of A's database carries it, expired; a taskpushd on B takes over. */
    assert_true(tp_testdb_exec(&dbb, "UPDATE taskpush_meta SET holder = %" PRIu64
                                     ", expires_ms = 1, conns = '%s' WHERE name = 'lease'",
                               holder, conns) == 1);
    assert_int_equal(tp_daemon_start(standby, dbb.url, NULL), 0);
    assert_int_equal(tp_daemon_wait_leader(standby, WAIT_MS), 0);
    assert_true(tp_daemon_log_count(standby, "took the table's lease from holder") >= 1);
    assert_int_equal(tp_daemon_log_count(standby, "killed the old leader's database connections"), 0);
    for (int i = 0; i < nopen; i++)
        if (i != sleeper_at)
            assert_alive(open_b[i], open_id[i]);
    sleeper_check(&sl);
    assert_alive(open_b[sleeper_at], open_id[sleeper_at]);

    assert_int_equal(tp_daemon_stop(standby, SIGTERM, 15000), 0);
    for (int i = 0; i < nopen; i++)
        mysql_close(open_b[i]);
    tp_testdb_drop(&dbb);
    use_server(&sv[0]);
    tp_testdb_drop(&dba);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_frozen_leader_only, two_setup, two_teardown),
        cmocka_unit_test_setup_teardown(test_same_second_servers, two_setup, two_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
