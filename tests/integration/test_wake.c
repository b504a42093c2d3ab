/* test_wake: --wake, the binary log as the claim's doorbell (docs/taskpushd.md, "Waking
 * on inserts"; issue 34). A MariaDB of its own with --log-bin --binlog-format=ROW
 * (scripts/tp-mariadb --binlog ROW), taskpushd with --poll-ms 5000, libtaskpush workers
 * on threads of this process, rows inserted by plain SQL:
 *
 *   - ROW, default --wake: /stats wake {"mode": "binlog"}; rows inserted at random
 *     intervals reach a handler far sooner than the poll (loose bounds; bench/ holds the
 *     targets);
 *   - MIXED: auto polls and says why; --wake binlog follows it (INSERTs ring);
 *   - no binary log (the suite's shared server), no privilege (two users): polling, the
 *     reason in /stats;
 *   - FLUSH BINARY LOGS, PURGE BINARY LOGS, a server restart and a leader's kill -9
 *     during a stream of inserts: every task runs, and rows inserted afterwards are
 *     dispatched by the doorbell again;
 *   - a row with a future run_after runs at its due time, not before; a FAILED row put
 *     back to NEW by UPDATE runs at once;
 *   - a semi-sync primary counts the follower as no semi-sync client;
 *   - a raw replica connection taking the follower's server_id during a stream: the server
 *     ends the follower's dump, the follower follows again under another id (/stats
 *     wake.server_id, wake.last_end), every task runs, and the raw replica streams on;
 *   - a flood of inserts (--poll-ms 100): the follower rests (wake.resting, the claims
 *     poll), follows again once the flood ends, and every row runs.
 *
 * Bounds are loose (a row "soon" is within 2 s, against a 5 s poll), never targets.
 */
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
#include <jansson.h>
#include <mysql.h>
#include <mariadb_rpl.h>

#include "daemon.h"
#include "inproc_worker.h"
#include "rows.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 30000
#define SOON_MS 2000  /* a rung row starts within this (the poll alone: 0 .. 5000) */
#define MAX_ROWS 512

/* The server of this test (ROW binary log), shared by its cases. */
static char g_dir[128];
static bool g_server_up;
static char *g_shared_env[5];
static char *g_own_env[5];
static const char *const g_keys[] = {"TASKPUSH_TEST_MYSQL_HOST", "TASKPUSH_TEST_MYSQL_PORT",
                                     "TASKPUSH_TEST_MYSQL_SOCKET", "TASKPUSH_TEST_MYSQL_USER",
                                     "TASKPUSH_TEST_MYSQL_DIR"};

struct start {
    uint64_t id;
    long long wall_ms;
};

struct fx {
    tp_testdb db;
    bool have_db;
    tp_daemon d, d2;
    tp_inproc wp;
    tp_worker *w;
    pthread_mutex_t mu;
    struct start starts[MAX_ROWS];
    size_t nstarts;
    MYSQL *raw;          /* server_id_collision: a replica connection of the test's own */
    MARIADB_RPL *rpl;
    long long raw_sid;   /* the server_id it took (the follower's at the time) */
};

static long long wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void env_use(char **vals)
{
    for (int i = 0; i < 5; i++) {
        if (vals[i])
            setenv(g_keys[i], vals[i], 1);
        else
            unsetenv(g_keys[i]);
    }
}

static void env_save(char **vals)
{
    for (int i = 0; i < 5; i++)
        vals[i] = getenv(g_keys[i]) ? strdup(getenv(g_keys[i])) : NULL;
}

/* Runs scripts/tp-mariadb CMD DIR ARGS; with apply_env its exports become ours. 0 on success. */
static int tp_mariadb(const char *cmd, const char *args, bool apply_env)
{
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    char line[2048];
    snprintf(line, sizeof line, "'%s/scripts/tp-mariadb' %s '%s' %s 2>&1", root ? root : ".", cmd, g_dir,
             args ? args : "");
    FILE *p = popen(line, "r");
    if (!p)
        return -1;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        char *eq;
        if (apply_env && strncmp(line, "export ", 7) == 0 && (eq = strchr(line + 7, '='))) {
            *eq = '\0';
            /* The values are shell-quoted with %q: plain paths and numbers here. */
            setenv(line + 7, eq + 1, 1);
        } else {
            printf("# %s\n", line);
        }
    }
    int st = pclose(p);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int group_setup(void **state)
{
    (void)state;
    env_save(g_shared_env);
    snprintf(g_dir, sizeof g_dir, "/tmp/tpwake-%d", (int)getpid());
    if (tp_mariadb("start", "--binlog ROW", true) != 0) {
        fprintf(stderr, "cannot start a MariaDB with a binary log in %s\n", g_dir);
        env_use(g_shared_env);
        return -1;
    }
    g_server_up = true;
    env_save(g_own_env);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (g_server_up)
        tp_mariadb("stop", NULL, false);
    for (int i = 0; i < 5; i++) {
        free(g_shared_env[i]);
        free(g_own_env[i]);
    }
    return 0;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    pthread_mutex_init(&fx->mu, NULL);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->rpl)
        mariadb_rpl_close(fx->rpl);
    if (fx->raw)
        mysql_close(fx->raw);
    if (fx->w) {
        tp_inproc_halt(&fx->wp);
        tp_worker_free(fx->w);
    }
    if (fx->d.pid > 0)
        tp_daemon_stop(&fx->d, SIGTERM, 15000);
    if (fx->d2.pid > 0)
        tp_daemon_stop(&fx->d2, SIGTERM, 15000);
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    pthread_mutex_destroy(&fx->mu);
    free(fx);
    env_use(g_own_env);
    return 0;
}

/* A database on this test's ROW server (own) or on the suite's shared one. */
static void fx_db(struct fx *fx, const char *tag, bool own)
{
    env_use(own ? g_own_env : g_shared_env);
    assert_int_equal(tp_testdb_create(tag, &fx->db), 0);
    fx->have_db = true;
    env_use(g_own_env);
}

static int handler(tp_task *task, void *arg)
{
    struct fx *fx = arg;
    long long now = wall_ms();
    pthread_mutex_lock(&fx->mu);
    if (fx->nstarts < MAX_ROWS)
        fx->starts[fx->nstarts++] = (struct start){tp_task_id(task), now};
    pthread_mutex_unlock(&fx->mu);
    return 0;
}

static void fx_worker(struct fx *fx, const char *addresses)
{
    fx->w = tp_inproc_start_one(&fx->wp, addresses, "wake", 8, "wake", handler, fx);
    assert_non_null(fx->w);
}

static long long start_of(struct fx *fx, uint64_t id)
{
    long long at = -1;
    pthread_mutex_lock(&fx->mu);
    for (size_t i = 0; i < fx->nstarts; i++)
        if (fx->starts[i].id == id)
            at = fx->starts[i].wall_ms;
    pthread_mutex_unlock(&fx->mu);
    return at;
}

/* /stats wake.mode and wake.reason (reason may be NULL). */
static void wake_of(tp_daemon *d, char *mode, size_t mcap, char *reason, size_t rcap)
{
    json_t *s = tp_daemon_json(d, "/stats");
    json_t *w = s ? json_object_get(s, "wake") : NULL;
    const char *m = json_string_value(json_object_get(w, "mode"));
    const char *r = json_string_value(json_object_get(w, "reason"));
    snprintf(mode, mcap, "%s", m ? m : "");
    if (reason)
        snprintf(reason, rcap, "%s", r ? r : "");
    json_decref(s);
}

static void wait_wake(tp_daemon *d, const char *want_mode, const char *reason_part)
{
    char mode[32], reason[300];
    long long end = tp_mono_ms() + WAIT_MS;
    for (;;) {
        wake_of(d, mode, sizeof mode, reason, sizeof reason);
        if (strcmp(mode, want_mode) == 0 && (!reason_part || strstr(reason, reason_part)))
            break;
        if (tp_mono_ms() > end) {
            tp_daemon_dump_log(d);
            fail_msg("wake is %s (%s), want %s (%s)", mode, reason, want_mode, reason_part ? reason_part : "");
        }
        tp_sleep_ms(50);
    }
    printf("# wake: %s: %s\n", mode, reason);
}

static void fx_daemon(struct fx *fx, tp_daemon *d, const char *url, const char *wake)
{
    const char *args[] = {"--poll-ms", "5000", wake ? "--wake" : NULL, wake, NULL};
    assert_int_equal(tp_daemon_start(d, url ? url : fx->db.url, args), 0);
}

/* Inserts one row of type wake (run_after: 0 or ms since 1970) on conn; its id. */
static uint64_t insert_row(MYSQL *conn, long long run_after)
{
    if (tp_testdb_exec_conn(conn, "INSERT INTO task (task_type, payload, run_after) VALUES ('wake', 'x', %lld)",
                            run_after) != 1)
        return 0;
    return (uint64_t)mysql_insert_id(conn);
}

/* Waits until the row id started; returns its start time (ms since 1970). */
static long long wait_start(struct fx *fx, uint64_t id)
{
    long long end = tp_mono_ms() + WAIT_MS, at;
    while ((at = start_of(fx, id)) < 0) {
        if (tp_mono_ms() > end) {
            tp_daemon_dump_log(&fx->d);
            fail_msg("task %llu never reached a handler", (unsigned long long)id);
        }
        tp_sleep_ms(5);
    }
    return at;
}

static long long insert_time_of(struct fx *fx, uint64_t id)
{
    return (long long)tp_testdb_query_u64(&fx->db, "SELECT insert_time FROM task WHERE task_id = %llu",
                                          (unsigned long long)id);
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* Inserts n rows at random gaps (gap_min..gap_max ms) on a connection of its own, with
 * mid(i) called before row i; waits for all and returns their latencies (insert_time to
 * handler start), sorted, in lat[]; ids[] in insert order. */
static void stream(struct fx *fx, size_t n, int gap_min, int gap_max, void (*mid)(struct fx *, size_t),
                   long long *lat, uint64_t *ids)
{
    MYSQL *c = tp_testdb_connect(&fx->db);
    assert_non_null(c);
    for (size_t i = 0; i < n; i++) {
        if (mid)
            mid(fx, i);
        for (int tries = 0; (ids[i] = insert_row(c, 0)) == 0; tries++) {
            /* The server may be restarting: connect again and retry. */
            assert_true(tries < 300);
            mysql_close(c);
            tp_sleep_ms(100);
            c = tp_testdb_connect(&fx->db);
            while (c == NULL && tries++ < 300) {
                tp_sleep_ms(100);
                c = tp_testdb_connect(&fx->db);
            }
            assert_non_null(c);
        }
        tp_sleep_ms(gap_min + rand() % (gap_max - gap_min + 1));
    }
    mysql_close(c);
    if (fx->db.conn == NULL || mysql_ping(fx->db.conn) != 0) {
        if (fx->db.conn)
            mysql_close(fx->db.conn);
        fx->db.conn = tp_testdb_connect(&fx->db);
        assert_non_null(fx->db.conn);
    }
    for (size_t i = 0; i < n; i++)
        lat[i] = wait_start(fx, ids[i]) - insert_time_of(fx, ids[i]);
}

static void print_lat(const char *what, long long *lat, size_t n)
{
    long long s[MAX_ROWS];
    memcpy(s, lat, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_ll);
    printf("# %s: %zu rows, latency insert_time -> handler: min %lld, p50 %lld, max %lld ms\n", what, n, s[0],
           s[n / 2], s[n - 1]);
}

/* ---- ROW: the doorbell ---- */

static void row_auto(void **state)
{
    struct fx *fx = *state;
    long long lat[20];
    uint64_t ids[20];

    fx_db(fx, "wake_row", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", "ROW");
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300); /* the worker's HELLO */
    stream(fx, 20, 20, 300, NULL, lat, ids);
    print_lat("ROW, --poll-ms 5000", lat, 20);
    qsort(lat, 20, sizeof *lat, cmp_ll);
    /* By polling alone the median would be ~2500 ms. */
    assert_true(lat[10] < 1000);
    assert_true(lat[19] < 5000);
    assert_true(tp_daemon_stat(&fx->d, "wake.wakes_total") >= 20);
    /* taskpushctl's line and /metrics carry it too. */
    char *body = NULL;
    assert_int_equal(tp_http_request(fx->d.admin, "GET", "/metrics", &body), 200);
    assert_non_null(strstr(body, "taskpush_wake_binlog 1"));
    free(body);
}

/* A row with a future run_after starts at its due time, not before; a FAILED row put
 * back to NEW by UPDATE starts at once. */
static void run_after_and_update(void **state)
{
    struct fx *fx = *state;

    fx_db(fx, "wake_due", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", NULL);
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);

    long long due = wall_ms() + 1500;
    uint64_t id = insert_row(fx->db.conn, due);
    assert_true(id > 0);
    long long at = wait_start(fx, id);
    printf("# run_after +1500 ms: started %lld ms after its due time\n", at - due);
    assert_true(at >= due);
    assert_true(at < due + SOON_MS);

    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, task_state, attempts, err_msg) "
                                             "VALUES ('wake', 3, 3, 'failed before')"), 1);
    uint64_t failed = (uint64_t)mysql_insert_id(fx->db.conn);
    tp_sleep_ms(300);
    assert_true(start_of(fx, failed) < 0);
    long long put_back = wall_ms();
    assert_int_equal(tp_testdb_exec(&fx->db, "UPDATE task SET task_state = 0, attempts = 0 WHERE task_id = %llu",
                                    (unsigned long long)failed), 1);
    at = wait_start(fx, failed);
    printf("# UPDATE back to NEW: started %lld ms later\n", at - put_back);
    assert_true(at - put_back < SOON_MS);
}

/* A semi-sync primary: the follower never registers as a semi-sync replica, so the
 * primary counts no semi-sync client and never waits for its acknowledgement; rows are
 * still rung. */
static void semi_sync(void **state)
{
    struct fx *fx = *state;
    uint64_t clients = 0;

    fx_db(fx, "wake_semisync", true);
    assert_true(tp_testdb_exec(&fx->db, "SET GLOBAL rpl_semi_sync_master_timeout = 500") >= 0);
    assert_true(tp_testdb_exec(&fx->db, "SET GLOBAL rpl_semi_sync_master_enabled = ON") >= 0);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", NULL);
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);
    long long lat[6];
    uint64_t ids[6];
    stream(fx, 6, 20, 100, NULL, lat, ids);
    print_lat("semi-sync primary", lat, 6);
    assert_int_equal(tp_testdb_status(fx->db.conn, TP_TESTDB_GLOBAL, "Rpl_semi_sync_master_clients", &clients), 0);
    printf("# Rpl_semi_sync_master_clients while following: %llu\n", (unsigned long long)clients);
    assert_int_equal(clients, 0);
    assert_true(tp_testdb_exec(&fx->db, "SET GLOBAL rpl_semi_sync_master_enabled = OFF") >= 0);
}

/* ---- MIXED, no binary log, no privilege ---- */

static void mixed(void **state)
{
    struct fx *fx = *state;

    fx_db(fx, "wake_mixed", true);
    assert_true(tp_testdb_exec(&fx->db, "SET GLOBAL binlog_format = 'MIXED'") >= 0);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "poll", "MIXED");
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, 15000), 0);
    fx->d.pid = 0;

    /* --wake binlog follows MIXED: an INSERT logged as a statement rings. */
    fx_daemon(fx, &fx->d, NULL, "binlog");
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", "MIXED");
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);
    long long lat[8];
    uint64_t ids[8];
    stream(fx, 8, 20, 200, NULL, lat, ids); /* new sessions: MIXED from here */
    print_lat("MIXED, --wake binlog", lat, 8);
    qsort(lat, 8, sizeof *lat, cmp_ll);
    assert_true(lat[4] < 1000);
    assert_true(tp_testdb_exec(&fx->db, "SET GLOBAL binlog_format = 'ROW'") >= 0);
}

static void no_binlog(void **state)
{
    struct fx *fx = *state;

    fx_db(fx, "wake_nolog", false); /* the suite's server: started without --log-bin */
    if (tp_testdb_query_u64(&fx->db, "SELECT @@log_bin") != 0) {
        printf("# the shared server has a binary log: case not applicable here\n");
        return;
    }
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "poll", "no binary log");
}

/* A user with the table's privileges only, then one that may read the position but
 * not replicate: both poll and say which privilege is missing. */
static void no_privilege(void **state)
{
    struct fx *fx = *state;
    char url[600];

    fx_db(fx, "wake_priv", true);
    static const char *const users[] = {"tpw_table_only", "tpw_monitor"};
    for (int i = 0; i < 2; i++) {
        assert_true(tp_testdb_exec(&fx->db, "DROP USER IF EXISTS '%s'@'127.0.0.1'", users[i]) >= 0);
        assert_true(tp_testdb_exec(&fx->db, "CREATE USER '%s'@'127.0.0.1'", users[i]) >= 0);
        assert_true(tp_testdb_exec(&fx->db, "GRANT ALL ON `%s`.* TO '%s'@'127.0.0.1'", fx->db.name, users[i]) >= 0);
    }
    assert_true(tp_testdb_exec(&fx->db, "GRANT BINLOG MONITOR ON *.* TO 'tpw_monitor'@'127.0.0.1'") >= 0);

    snprintf(url, sizeof url, "mysql://tpw_table_only@%s:%u/%s", fx->db.host, fx->db.port, fx->db.name);
    fx_daemon(fx, &fx->d, url, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "poll", "BINLOG MONITOR");

    snprintf(url, sizeof url, "mysql://tpw_monitor@%s:%u/%s", fx->db.host, fx->db.port, fx->db.name);
    fx_daemon(fx, &fx->d2, url, NULL);
    assert_int_equal(tp_daemon_stop(&fx->d, SIGTERM, 15000), 0);
    fx->d.pid = 0;
    assert_int_equal(tp_daemon_wait_leader(&fx->d2, WAIT_MS), 0);
    wait_wake(&fx->d2, "poll", "REPLICATION SLAVE");
    for (int i = 0; i < 2; i++)
        tp_testdb_exec(&fx->db, "DROP USER IF EXISTS '%s'@'127.0.0.1'", users[i]);
}

/* ---- the stream survives ---- */

static void after_disruption(struct fx *fx, const char *what, long long *lat, size_t n, size_t from)
{
    print_lat(what, lat, n);
    /* Every task ran (stream waited for each); rows well after the disruption are rung. */
    long long tail[MAX_ROWS];
    size_t k = 0;
    for (size_t i = from; i < n; i++)
        tail[k++] = lat[i];
    qsort(tail, k, sizeof *tail, cmp_ll);
    printf("# %s: the last %zu rows: p50 %lld, max %lld ms\n", what, k, tail[k / 2], tail[k - 1]);
    assert_true(tail[k / 2] < 1000);
    (void)fx;
}

static void mid_flush(struct fx *fx, size_t i)
{
    if (i == 5 || i == 10)
        assert_true(tp_testdb_exec(&fx->db, "FLUSH BINARY LOGS") >= 0);
}

static void rotation(void **state)
{
    struct fx *fx = *state;
    long long lat[24];
    uint64_t ids[24];

    fx_db(fx, "wake_rot", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", NULL);
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);
    stream(fx, 24, 30, 120, mid_flush, lat, ids);
    after_disruption(fx, "FLUSH BINARY LOGS twice", lat, 24, 12);
}

static void mid_purge(struct fx *fx, size_t i)
{
    if (i == 6) {
        assert_true(tp_testdb_exec(&fx->db, "FLUSH BINARY LOGS") >= 0);
        char file[256] = "";
        MYSQL_RES *res;
        MYSQL_ROW row;
        assert_int_equal(mysql_query(fx->db.conn, "SHOW MASTER STATUS"), 0);
        res = mysql_store_result(fx->db.conn);
        assert_non_null(res);
        if ((row = mysql_fetch_row(res)) && row[0])
            snprintf(file, sizeof file, "%s", row[0]);
        mysql_free_result(res);
        /* Every file before the new one, the one the follower was reading included
         * (MariaDB keeps a file a reader still holds, with a warning). */
        assert_true(tp_testdb_exec(&fx->db, "PURGE BINARY LOGS TO '%s'", file) >= 0);
    }
}

static void purge(void **state)
{
    struct fx *fx = *state;
    long long lat[20];
    uint64_t ids[20];

    fx_db(fx, "wake_purge", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", NULL);
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);
    stream(fx, 20, 30, 120, mid_purge, lat, ids);
    after_disruption(fx, "PURGE BINARY LOGS", lat, 20, 12);
}

static void mid_restart(struct fx *fx, size_t i)
{
    if (i == 4) {
        mysql_close(fx->db.conn);
        fx->db.conn = NULL;
        assert_int_equal(tp_mariadb("restart", NULL, false), 0);
        fx->db.conn = tp_testdb_connect(&fx->db);
        assert_non_null(fx->db.conn);
        /* The logs the restart left behind go too: the follower starts from the end. */
        assert_true(tp_testdb_exec(&fx->db, "FLUSH BINARY LOGS") >= 0);
        wait_wake(&fx->d, "binlog", NULL);
    }
}

static void restart(void **state)
{
    struct fx *fx = *state;
    long long lat[16];
    uint64_t ids[16];

    fx_db(fx, "wake_restart", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", NULL);
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);
    stream(fx, 16, 30, 150, mid_restart, lat, ids);
    after_disruption(fx, "server restart", lat, 16, 8);
    assert_true(tp_daemon_stat(&fx->d, "wake.reconnects_total") >= 1);
}

/* Two dispatchers: only the leader follows; kill -9 of it, and the standby's doorbell
 * takes over with its leadership. */
static void failover(void **state)
{
    struct fx *fx = *state;
    long long lat[12];
    uint64_t ids[12];
    char addrs[300];

    fx_db(fx, "wake_failover", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    fx_daemon(fx, &fx->d2, NULL, NULL);
    wait_wake(&fx->d, "binlog", NULL);
    wait_wake(&fx->d2, "poll", "not leading");
    snprintf(addrs, sizeof addrs, "%s,%s", fx->d.listen, fx->d2.listen);
    fx_worker(fx, addrs);
    tp_sleep_ms(300);

    assert_true(kill(fx->d.pid, SIGKILL) == 0);
    tp_daemon_stop(&fx->d, 0, 15000);
    fx->d.pid = 0;
    assert_int_equal(tp_daemon_wait_leader(&fx->d2, WAIT_MS), 0);
    wait_wake(&fx->d2, "binlog", NULL);
    /* The worker finds the new leader (its reconnect backoff). */
    assert_true(tp_daemon_wait_stat(&fx->d2, "workers", 1, true, WAIT_MS));
    stream(fx, 12, 30, 150, NULL, lat, ids);
    after_disruption(fx, "after the leader's kill -9", lat, 12, 0);
}

/* ---- a flood: the follower rests ---- */

/* Rows inserted 20 at a time every few ms: the claims keep finding many, so the follower
 * leaves the log (wake.resting, mode poll) and the claims poll; once the flood ends the
 * first sparse claim makes it follow again. Every row runs. */
static void flood_rests(void **state)
{
    struct fx *fx = *state;
    static const char *const args[] = {"--poll-ms", "100", NULL};
    uint64_t inserted = 0;

    fx_db(fx, "wake_flood", true);
    assert_int_equal(tp_daemon_start(&fx->d, fx->db.url, args), 0);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", "following");
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);

    long long end = tp_mono_ms() + WAIT_MS, next_look = 0;
    bool rested = false;
    while (!rested) {
        assert_true(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) SELECT 'wake', 'f'"
                                            " FROM seq_1_to_20") == 20);
        inserted += 20;
        if (tp_mono_ms() >= next_look) {
            rested = tp_daemon_stat(&fx->d, "wake.rests_total") >= 1;
            next_look = tp_mono_ms() + 100;
        }
        if (!rested && tp_mono_ms() > end) {
            tp_daemon_dump_log(&fx->d);
            fail_msg("no rest after %llu rows inserted in a flood", (unsigned long long)inserted);
        }
        tp_sleep_ms(5);
    }
    char mode[32], reason[300];
    wake_of(&fx->d, mode, sizeof mode, reason, sizeof reason);
    printf("# flood of %llu rows: wake %s (%s)\n", (unsigned long long)inserted, mode, reason);
    /* The flood ends: a sparse claim makes the follower follow again, and the rows run. */
    wait_wake(&fx->d, "binlog", "following");
    assert_true(tp_daemon_wait_stat(&fx->d, "tasks.succeeded_total", (long long)inserted, false, 3 * WAIT_MS));
    json_t *st = tp_daemon_json(&fx->d, "/stats");
    assert_true(json_is_false(json_object_get(json_object_get(st, "wake"), "resting")));
    json_decref(st);
    long long lat[6];
    uint64_t ids[6];
    pthread_mutex_lock(&fx->mu); /* the flood's starts filled the record */
    fx->nstarts = 0;
    pthread_mutex_unlock(&fx->mu);
    stream(fx, 6, 30, 100, NULL, lat, ids);
    print_lat("after the flood", lat, 6);
    uint64_t done = 0; /* the last rows' outcomes may still be on their way */
    assert_true(tp_rows_wait(&fx->db, "wake", 2, inserted + 6, WAIT_MS, 50, &done));
}

/* ---- a replica server_id that collides ---- */

/* Opens a replica stream from the log's end as server_id sid on a connection of its own
 * (fx->raw, fx->rpl), with heartbeats each second, and reads up to its
 * FORMAT_DESCRIPTION: the server has taken the dump by then. */
static void raw_replica(struct fx *fx, unsigned long sid)
{
    char file[256] = "";
    unsigned long long pos = 0;
    MYSQL_RES *res;
    MYSQL_ROW row;

    fx->raw = tp_testdb_connect(&fx->db);
    assert_non_null(fx->raw);
    assert_int_equal(mysql_query(fx->raw, "SHOW MASTER STATUS"), 0);
    res = mysql_store_result(fx->raw);
    assert_non_null(res);
    if ((row = mysql_fetch_row(res)) && row[0] && row[1]) {
        snprintf(file, sizeof file, "%s", row[0]);
        pos = strtoull(row[1], NULL, 10);
    }
    mysql_free_result(res);
    assert_true(file[0] != '\0');
    assert_int_equal(mysql_query(fx->raw, "SET @master_heartbeat_period = 1000000000,"
                                          " @master_binlog_checksum = @@global.binlog_checksum"),
                     0);
    fx->rpl = mariadb_rpl_init(fx->raw);
    assert_non_null(fx->rpl);
    assert_int_equal(mariadb_rpl_optionsv(fx->rpl, MARIADB_RPL_FILENAME, file, strlen(file)), 0);
    assert_int_equal(mariadb_rpl_optionsv(fx->rpl, MARIADB_RPL_START, (unsigned long)pos), 0);
    assert_int_equal(mariadb_rpl_optionsv(fx->rpl, MARIADB_RPL_SERVER_ID, sid), 0);
    assert_int_equal(mariadb_rpl_optionsv(fx->rpl, MARIADB_RPL_FLAGS, 0), 0);
    assert_int_equal(mariadb_rpl_open(fx->rpl), 0);
    for (int i = 0;; i++) {
        MARIADB_RPL_EVENT *ev = mariadb_rpl_fetch(fx->rpl, NULL);
        assert_non_null(ev);
        bool fd = ev->event_type == FORMAT_DESCRIPTION_EVENT;
        mariadb_free_rpl_event(ev);
        if (fd)
            break;
        assert_true(i < 16);
    }
    fx->raw_sid = (long long)sid;
}

static void mid_collide(struct fx *fx, size_t i)
{
    if (i != 4)
        return;
    long long sid = tp_daemon_stat(&fx->d, "wake.server_id");
    /* The follower's id is drawn from 0x7A500000 + 0..65535 (db_binlog.c). */
    assert_true(sid >= 2052063232LL && sid <= 2052128767LL);
    raw_replica(fx, (unsigned long)sid);
}

/* A raw replica connection takes the follower's server_id during a stream of inserts:
 * the server ends the older dump of that id (the follower's); the follower follows
 * again under another id, /stats says what happened, and no task is lost. */
static void server_id_collision(void **state)
{
    struct fx *fx = *state;
    long long lat[16];
    uint64_t ids[16];
    char mode[32], reason[300];

    fx_db(fx, "wake_sid", true);
    fx_daemon(fx, &fx->d, NULL, NULL);
    assert_int_equal(tp_daemon_wait_leader(&fx->d, WAIT_MS), 0);
    wait_wake(&fx->d, "binlog", NULL);
    long long reconnects = tp_daemon_stat(&fx->d, "wake.reconnects_total");
    fx_worker(fx, fx->d.listen);
    tp_sleep_ms(300);
    stream(fx, 16, 30, 150, mid_collide, lat, ids);
    assert_true(fx->raw_sid > 0);

    /* The follower's stream ended and it follows again, under another server_id. */
    long long end = tp_mono_ms() + WAIT_MS, sid;
    for (;;) {
        wake_of(&fx->d, mode, sizeof mode, reason, sizeof reason);
        sid = tp_daemon_stat(&fx->d, "wake.server_id");
        if (strcmp(mode, "binlog") == 0 && sid > 0 && sid != fx->raw_sid &&
            tp_daemon_stat(&fx->d, "wake.reconnects_total") > reconnects)
            break;
        if (tp_mono_ms() > end) {
            tp_daemon_dump_log(&fx->d);
            fail_msg("wake %s (%s), server_id %lld (the raw replica's %lld)", mode, reason, sid,
                     fx->raw_sid);
        }
        tp_sleep_ms(50);
    }
    json_t *st = tp_daemon_json(&fx->d, "/stats");
    const char *last_end = json_string_value(json_object_get(json_object_get(st, "wake"), "last_end"));
    char want[64];
    snprintf(want, sizeof want, "server_id %lld", fx->raw_sid);
    assert_non_null(last_end);
    assert_non_null(strstr(last_end, want));
    printf("# server_id %lld taken by a raw replica: the follower follows as %lld; wake.last_end: %s\n",
           fx->raw_sid, sid, last_end);
    json_decref(st);
    after_disruption(fx, "a replica taking the follower's server_id", lat, 16, 8);

    /* The newer dump of that id, the raw replica's, streams on: the rows' commits reach
     * it (heartbeats each second bound each read). */
    assert_int_equal(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) VALUES ('other', 'x')"), 1);
    bool xid = false;
    for (int i = 0; i < 10000 && !xid; i++) {
        MARIADB_RPL_EVENT *ev = mariadb_rpl_fetch(fx->rpl, NULL);
        assert_non_null(ev);
        xid = ev->event_type == XID_EVENT;
        mariadb_free_rpl_event(ev);
    }
    assert_true(xid);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(row_auto, setup, teardown),
        cmocka_unit_test_setup_teardown(run_after_and_update, setup, teardown),
        cmocka_unit_test_setup_teardown(semi_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(no_binlog, setup, teardown),
        cmocka_unit_test_setup_teardown(no_privilege, setup, teardown),
        cmocka_unit_test_setup_teardown(rotation, setup, teardown),
        cmocka_unit_test_setup_teardown(purge, setup, teardown),
        cmocka_unit_test_setup_teardown(failover, setup, teardown),
        cmocka_unit_test_setup_teardown(restart, setup, teardown),
        cmocka_unit_test_setup_teardown(server_id_collision, setup, teardown),
        cmocka_unit_test_setup_teardown(flood_rests, setup, teardown),
    };
    srand((unsigned)getpid());
    if (getenv("TP_TEST_FILTER")) /* one case by name, when working on it */
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
