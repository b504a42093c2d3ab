/* test_dialect: `taskpushd --sql-dialect mysql` sends only SQL that MySQL >= 8.0.13
 * accepts. No MySQL server can be installed here, so the MySQL path runs on the tests'
 * MariaDB with the server's general log on (log_output = TABLE), and every statement the
 * daemon's connections sent is read back from mysql.general_log and checked for
 * MariaDB-only syntax (mariadb_only below: RETURNING, KILL QUERY ID, SET STATEMENT,
 * sequences, ...). Each case runs taskpushd as a database user of its own, so that the
 * log's rows are told apart by user_host from those of the test and of other tests.
 *
 * Cases:
 *   checker_self_test     the checker flags each MariaDB-only form and passes the
 *                         daemon's MySQL forms (no database)
 *   mysql_submit_recovery a leader and a standby in MySQL's dialect: /stats and the log
 *                         say mysql; SUBMIT of 1000 tasks without a key (each id names
 *                         its row), dedup keys (a key present, a key twice in one call,
 *                         a key inserted by another transaction while SUBMIT waits), a
 *                         64 KiB payload; then kill -9 of the leader with tasks in
 *                         flight: the standby recovers the rows and another worker runs
 *                         them; then a restarted daemon takes over from the frozen
 *                         (SIGSTOP) new leader by KILL CONNECTION; the log holds no
 *                         MariaDB-only statement (and does hold the INSERTs, the lookups
 *                         and the KILL)
 *   mysql_migrate_v1      `--sql-dialect mysql --migrate` of a version 1 schema
 *                         (tests/data/schema-v1.sql) to the current one, then a daemon
 *                         leads it and takes a SUBMIT; the log is clean
 *   auto_mode_flagged     the same checker on a default (auto: MariaDB) daemon's log
 *                         flags INSERT ... RETURNING: what the MySQL cases would fail on
 *                         without --sql-dialect mysql
 *
 * The MySQL cases also run under MySQL 8's default sql_mode (ONLY_FULL_GROUP_BY and the
 * zero-date modes, which MariaDB's default lacks). The general log and sql_mode are
 * server-wide settings: each case sets them with the previous values saved and puts them
 * back at the end. Waits are bounded polling; nothing
 * asserts on how long anything took. */
#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <mysql.h>

#include "daemon.h"
#include "db_claim_sql.h" /* DSP_CLAIM_SQL_SCHEMA_VERSION(_KNOWN) */
#include "inproc_worker.h"
#include "run.h"
#include "taskpush.h"
#include "testdb.h"

#define WAIT_MS 30000
#define SUBMIT_TIMEOUT_MS 20000
#define MANY 1000
#define HOLD 3

/* ---- the checker ---- */

/* The statement's words, upper case, with the insides of '...', "..." and `...` blanked
 * (a payload or an error text is no syntax) and runs of blanks made one space. */
static char *normalise(const char *sql)
{
    size_t n = strlen(sql), o = 0;
    char *out = malloc(n + 3), q = 0;
    if (out == NULL)
        return NULL;
    out[o++] = ' ';
    for (size_t i = 0; i < n; i++) {
        char c = sql[i];
        if (q) {
            if (c == '\\' && q != '`' && i + 1 < n) {
                i++;
                continue;
            }
            if (c == q) {
                if (i + 1 < n && sql[i + 1] == q) { /* doubled quote inside */
                    i++;
                    continue;
                }
                q = 0;
                out[o++] = c;
            }
            continue;
        }
        if (c == '\'' || c == '"' || c == '`') {
            q = c;
            out[o++] = c;
            continue;
        }
        if (isspace((unsigned char)c)) {
            if (out[o - 1] != ' ')
                out[o++] = ' ';
            continue;
        }
        out[o++] = (char)toupper((unsigned char)c);
    }
    if (out[o - 1] != ' ')
        out[o++] = ' ';
    out[o] = '\0';
    return out;
}

/* Whether word (a phrase; ' ' stands for one blank) appears in s as whole words. */
static bool has_words(const char *s, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = s; (p = strstr(p, word)) != NULL; p++) {
        /* A boundary is needed only where the phrase begins or ends with a word character. */
        bool wfirst = isalnum((unsigned char)word[0]) || word[0] == '_';
        bool wlast = isalnum((unsigned char)word[wl - 1]) || word[wl - 1] == '_';
        bool left = !wfirst || p == s || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        bool right = !wlast || !(isalnum((unsigned char)p[wl]) || p[wl] == '_');
        if (left && right)
            return true;
    }
    return false;
}

/* SEQ_<n>_TO_<m>: MariaDB's sequence engine tables. */
static bool has_seq_table(const char *s)
{
    for (const char *p = s; (p = strstr(p, "SEQ_")) != NULL; p++) {
        const char *q = p + 4;
        if (p > s && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
            continue;
        if (!isdigit((unsigned char)*q))
            continue;
        while (isdigit((unsigned char)*q))
            q++;
        if (strncmp(q, "_TO_", 4) == 0 && isdigit((unsigned char)q[4]))
            return true;
    }
    return false;
}

/* " WAIT <digits>": MariaDB's lock wait clause of DDL and LOCK TABLES. */
static bool has_wait_n(const char *s)
{
    for (const char *p = s; (p = strstr(p, " WAIT ")) != NULL; p++)
        if (isdigit((unsigned char)p[6]))
            return true;
    return false;
}

/* The MariaDB-only forms (or forms MySQL >= 8.0.13 refuses or would change) that a
 * statement sent in MySQL's dialect must not have. */
static const struct {
    const char *words;
    const char *why;
} forbidden[] = {
    {"RETURNING", "INSERT/DELETE/REPLACE ... RETURNING is MariaDB's"},
    {"KILL QUERY ID", "KILL QUERY ID is MariaDB's"},
    {"KILL HARD", "KILL HARD/SOFT is MariaDB's"},
    {"KILL SOFT", "KILL HARD/SOFT is MariaDB's"},
    {"KILL USER", "KILL USER is MariaDB's"},
    {"KILL CONNECTION USER", "KILL USER is MariaDB's"},
    {"SET STATEMENT", "SET STATEMENT ... FOR is MariaDB's"},
    {"NEXTVAL", "sequences are MariaDB's"},
    {"LASTVAL", "sequences are MariaDB's"},
    {"SETVAL", "sequences are MariaDB's"},
    {"NEXT VALUE FOR", "sequences are MariaDB's"},
    {"PREVIOUS VALUE FOR", "sequences are MariaDB's"},
    {"SEQUENCE", "sequences are MariaDB's"},
    {"CREATE OR REPLACE", "CREATE OR REPLACE is MariaDB's"},
    {"ADD COLUMN IF NOT EXISTS", "ADD ... IF NOT EXISTS is MariaDB's"},
    {"ADD INDEX IF NOT EXISTS", "ADD ... IF NOT EXISTS is MariaDB's"},
    {"ADD KEY IF NOT EXISTS", "ADD ... IF NOT EXISTS is MariaDB's"},
    {"ADD UNIQUE KEY IF NOT EXISTS", "ADD ... IF NOT EXISTS is MariaDB's"},
    {"ADD CONSTRAINT IF NOT EXISTS", "ADD ... IF NOT EXISTS is MariaDB's"},
    {"CREATE INDEX IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS is MariaDB's"},
    {"DROP COLUMN IF EXISTS", "DROP ... IF EXISTS inside ALTER is MariaDB's"},
    {"DROP INDEX IF EXISTS", "DROP ... IF EXISTS inside ALTER is MariaDB's"},
    {"DROP KEY IF EXISTS", "DROP ... IF EXISTS inside ALTER is MariaDB's"},
    {"DROP CONSTRAINT IF EXISTS", "DROP ... IF EXISTS inside ALTER is MariaDB's"},
    {"MODIFY COLUMN IF EXISTS", "MODIFY ... IF EXISTS is MariaDB's"},
    {"NOWAIT", "ALTER/LOCK ... NOWAIT is MariaDB's (the daemon needs no NOWAIT)"},
    {"MAX_STATEMENT_TIME", "max_statement_time is MariaDB's"},
    {"IDLE_TRANSACTION_TIMEOUT", "idle_transaction_timeout is MariaDB's"},
    {"INNODB_LOCK_WAIT_TIMEOUT = 0", "MySQL's innodb_lock_wait_timeout starts at 1"},
    {"INNODB_LOCK_WAIT_TIMEOUT=0", "MySQL's innodb_lock_wait_timeout starts at 1"},
    {"= VALUES(", "VALUES() in ON DUPLICATE KEY UPDATE is deprecated in MySQL 8.0.20"},
    {"=VALUES(", "VALUES() in ON DUPLICATE KEY UPDATE is deprecated in MySQL 8.0.20"},
    {"PERSISTENT", "generated columns are STORED in MySQL, PERSISTENT is MariaDB's"},
    {"SYSTEM VERSIONING", "system-versioned tables are MariaDB's"},
    {"FOR SYSTEM_TIME", "system-versioned tables are MariaDB's"},
    {"ROWS EXAMINED", "LIMIT ROWS EXAMINED is MariaDB's"},
    {"FETCH FIRST", "OFFSET ... FETCH is MariaDB's"},
    {"FETCH NEXT", "OFFSET ... FETCH is MariaDB's"},
    {"INTERSECT", "INTERSECT needs MySQL 8.0.31"},
    {"EXCEPT", "EXCEPT needs MySQL 8.0.31"},
    {"COLUMN_CREATE", "dynamic columns are MariaDB's"},
    {"COLUMN_GET", "dynamic columns are MariaDB's"},
    {"JSON_DETAILED", "JSON_DETAILED is MariaDB's"},
    {"JSON_LOOSE", "JSON_LOOSE is MariaDB's"},
    {"JSON_COMPACT", "JSON_COMPACT is MariaDB's"},
    {"JSON_EXISTS", "JSON_EXISTS is MariaDB's"},
    {"JSON_QUERY", "JSON_QUERY is MariaDB's"},
    {"SFORMAT", "SFORMAT is MariaDB's"},
    {"NATURAL_SORT_KEY", "NATURAL_SORT_KEY is MariaDB's"},
    {"SYS_GUID", "SYS_GUID is MariaDB's"},
    {"ROWNUM", "ROWNUM is MariaDB's"},
    {"TO_CHAR", "TO_CHAR is MariaDB's"},
    {"ADD_MONTHS", "ADD_MONTHS is MariaDB's"},
    {"DECODE_ORACLE", "DECODE_ORACLE is MariaDB's"},
    {"ENGINE = ARIA", "the Aria engine is MariaDB's"},
    {"ENGINE=ARIA", "the Aria engine is MariaDB's"},
    {"SHOW EXPLAIN", "SHOW EXPLAIN is MariaDB's"},
    {"SHOW ALL SLAVES", "SHOW ALL SLAVES is MariaDB's"},
    {"SQL_MODE = ORACLE", "sql_mode ORACLE is MariaDB's"},
};

/* Returns the reason when the statement has a MariaDB-only form, else NULL. */
static const char *mariadb_only(const char *sql)
{
    static char why[160];
    char *s = normalise(sql);
    const char *r = NULL;
    if (s == NULL)
        return "out of memory";
    for (size_t i = 0; r == NULL && i < sizeof forbidden / sizeof forbidden[0]; i++)
        if (has_words(s, forbidden[i].words)) {
            snprintf(why, sizeof why, "%s (%s)", forbidden[i].why, forbidden[i].words);
            r = why;
        }
    if (r == NULL && has_seq_table(s))
        r = "seq_N_to_M tables are MariaDB's sequence engine";
    if (r == NULL && has_wait_n(s))
        r = "WAIT n is MariaDB's";
    free(s);
    return r;
}

static void checker_self_test(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "INSERT IGNORE INTO task (task_type) VALUES (0x61) RETURNING task_id, dedup_key",
        "KILL QUERY ID 42",
        "kill hard connection 7",
        "SET STATEMENT max_statement_time=1 FOR SELECT 1",
        "SELECT NEXTVAL(s)",
        "SELECT NEXT VALUE FOR s",
        "CREATE SEQUENCE s",
        "SELECT seq FROM seq_1_to_100",
        "ALTER TABLE task ADD COLUMN IF NOT EXISTS x INT",
        "ALTER TABLE task ADD CONSTRAINT IF NOT EXISTS c CHECK (x > 0)",
        "ALTER TABLE task DROP INDEX IF EXISTS i",
        "CREATE OR REPLACE TABLE t (a INT)",
        "SET SESSION innodb_lock_wait_timeout = 0, autocommit = 1",
        "INSERT INTO m (name, value) VALUES ('epoch', 3) ON DUPLICATE KEY UPDATE value = VALUES(value)",
        "ALTER TABLE task WAIT 5 ADD INDEX i (a)",
        "SET SESSION max_statement_time = 5",
        "DELETE FROM task WHERE task_id = 1 RETURNING task_id",
    };
    static const char *const good[] = {
        "INSERT IGNORE INTO task (task_type, task_priority, payload, max_attempts, run_after, `delayed`,"
        " timeout_ms, dedup_key) VALUES (_utf8mb4 0x61,1,'',DEFAULT,1,0,NULL,0x6B)",
        "SELECT task_id, dedup_key FROM task WHERE dedup_key IN (0x6B) LOCK IN SHARE MODE",
        "UPDATE task SET task_state = 3, err_msg = 'RETURNING the sequence NEXTVAL' WHERE task_id = 1",
        "KILL CONNECTION 42",
        "SET SESSION innodb_lock_wait_timeout = 1, autocommit = 1",
        "SET SESSION innodb_lock_wait_timeout = 10, autocommit = 0",
        "INSERT INTO taskpush_meta (name, value) VALUES ('epoch', 3) ON DUPLICATE KEY UPDATE value = 3",
        "SELECT `returning` FROM t",
        "SELECT task_id FROM task FORCE INDEX (PRIMARY) WHERE task_id IN (1) FOR UPDATE SKIP LOCKED",
        "CREATE TABLE IF NOT EXISTS task_claim (epoch INT UNSIGNED NOT NULL)",
        "SELECT GET_LOCK(_utf8mb4 0x7461736B70757368, 1)",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (mariadb_only(bad[i]) == NULL)
            fprintf(stderr, "not flagged: %s\n", bad[i]);
        assert_non_null(mariadb_only(bad[i]));
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        const char *why = mariadb_only(good[i]);
        if (why != NULL)
            fprintf(stderr, "flagged (%s): %s\n", why, good[i]);
        assert_null(why);
    }
}

/* ---- the general log ---- */

struct glog {
    MYSQL *conn; /* the test's own connection (user of tp-mariadb, ALL PRIVILEGES) */
    char old_output[64];
    uint64_t old_on;
    bool on;
    char old_sql_mode[512];
    bool sql_mode_set;
};

/* MySQL 8's default sql_mode (MariaDB's lacks ONLY_FULL_GROUP_BY and the zero-date
 * modes): the MySQL cases run with it, for the connections opened meanwhile. */
static const char MYSQL8_SQL_MODE[] = "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                                      "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION";

static void sql_mode_mysql(struct glog *g)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    assert_int_equal(mysql_query(g->conn, "SELECT @@global.sql_mode"), 0);
    assert_non_null(res = mysql_store_result(g->conn));
    assert_non_null(row = mysql_fetch_row(res));
    snprintf(g->old_sql_mode, sizeof g->old_sql_mode, "%s", row[0] ? row[0] : "");
    mysql_free_result(res);
    assert_true(tp_testdb_exec_conn(g->conn, "SET GLOBAL sql_mode = '%s'", MYSQL8_SQL_MODE) >= 0);
    g->sql_mode_set = true;
}

static int64_t exec_conn(MYSQL *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int64_t exec_conn(MYSQL *c, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    return tp_testdb_exec_conn(c, "%s", sql);
}

static void glog_on(struct glog *g, MYSQL *conn)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    g->conn = conn;
    assert_int_equal(mysql_query(conn, "SELECT @@global.log_output, @@global.general_log"), 0);
    assert_non_null(res = mysql_store_result(conn));
    assert_non_null(row = mysql_fetch_row(res));
    snprintf(g->old_output, sizeof g->old_output, "%s", row[0] ? row[0] : "FILE");
    g->old_on = row[1] ? strtoull(row[1], NULL, 10) : 0;
    mysql_free_result(res);
    /* TABLE beside what was set (a FILE log keeps being written). */
    if (strstr(g->old_output, "TABLE") == NULL) {
        bool none = strcmp(g->old_output, "NONE") == 0;
        assert_true(exec_conn(conn, "SET GLOBAL log_output = '%s%s'", none ? "" : g->old_output,
                              none ? "TABLE" : ",TABLE") >= 0);
    }
    assert_true(exec_conn(conn, "SET GLOBAL general_log = 1") >= 0);
    g->on = true;
}

static void glog_off(struct glog *g)
{
    if (g->sql_mode_set) {
        tp_testdb_exec_conn(g->conn, "SET GLOBAL sql_mode = '%s'", g->old_sql_mode);
        g->sql_mode_set = false;
    }
    if (!g->on)
        return;
    exec_conn(g->conn, "SET GLOBAL general_log = %" PRIu64, g->old_on);
    exec_conn(g->conn, "SET GLOBAL log_output = '%s'", g->old_output);
    g->on = false;
}

/* Checks every statement user sent (Query, Prepare, Execute rows of mysql.general_log):
 * returns how many have a MariaDB-only form (each printed), and counts in *total the
 * statements and in found[i] those containing needles[i] (plain substrings). */
static int glog_check(struct glog *g, const char *user, size_t *total, const char *const *needles,
                      size_t *found)
{
    char sql[512];
    MYSQL_RES *res;
    MYSQL_ROW row;
    int bad = 0;

    *total = 0;
    for (size_t i = 0; needles && needles[i]; i++)
        found[i] = 0;
    snprintf(sql, sizeof sql,
             "SELECT command_type, CONVERT(argument USING utf8mb4) FROM mysql.general_log"
             " WHERE user_host LIKE '%s[%%' AND command_type IN ('Query', 'Prepare', 'Execute')"
             " ORDER BY event_time",
             user);
    assert_int_equal(mysql_query(g->conn, sql), 0);
    assert_non_null(res = mysql_use_result(g->conn));
    while ((row = mysql_fetch_row(res)) != NULL) {
        const char *stmt = row[1] ? row[1] : "";
        const char *why = mariadb_only(stmt);
        (*total)++;
        if (why != NULL) {
            if (bad < 20)
                printf("# MariaDB-only: %s\n#   in: %.300s\n", why, stmt);
            bad++;
        }
        for (size_t i = 0; needles && needles[i]; i++)
            found[i] += strstr(stmt, needles[i]) != NULL;
    }
    mysql_free_result(res);
    printf("# %zu statements of %s checked, %d MariaDB-only\n", *total, user, bad);
    return bad;
}

/* ---- fixture ---- */

struct fx {
    tp_testdb db, db2;
    bool have_db, have_db2;
    char user[32];
    bool have_user;
    char url[512], url2[512];
    tp_daemon d[2];
    bool have_d[2];
    tp_worker *w[3];
    tp_inproc run[3];
    tp_gate gate;
    bool have_gate;
    struct glog log;
};

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;
    if (fx->have_gate)
        tp_gate_set(&fx->gate, true);
    for (int i = 0; i < 3; i++)
        if (fx->w[i]) {
            tp_inproc_halt(&fx->run[i]);
            tp_worker_free(fx->w[i]);
        }
    for (int i = 0; i < 2; i++)
        if (fx->have_d[i] && fx->d[i].pid > 0)
            tp_daemon_stop(&fx->d[i], SIGTERM, 15000);
    if (fx->have_db)
        glog_off(&fx->log);
    if (fx->have_user && fx->have_db) {
        exec_conn(fx->db.conn, "DROP USER IF EXISTS '%s'@'127.0.0.1'", fx->user);
    }
    if (fx->have_db2)
        tp_testdb_drop(&fx->db2);
    if (fx->have_db)
        tp_testdb_drop(&fx->db);
    if (fx->have_gate)
        tp_gate_destroy(&fx->gate);
    free(fx);
    return 0;
}

/* A database user for the daemon alone (its statements are the log's rows of that
 * user), with every privilege on the test's database; url gets the daemon's --db. */
static void make_user(struct fx *fx, const char *tag)
{
    snprintf(fx->user, sizeof fx->user, "tpd_%s_%d", tag, (int)getpid());
    exec_conn(fx->db.conn, "DROP USER IF EXISTS '%s'@'127.0.0.1'", fx->user);
    assert_true(exec_conn(fx->db.conn, "CREATE USER '%s'@'127.0.0.1'", fx->user) >= 0);
    fx->have_user = true;
    assert_true(exec_conn(fx->db.conn, "GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'127.0.0.1'", fx->db.name,
                          fx->user) >= 0);
    snprintf(fx->url, sizeof fx->url, "mysql://%s@127.0.0.1:%u/%s", fx->user, fx->db.port, fx->db.name);
}

static void start_daemon(struct fx *fx, int i, const char *dialect)
{
    const char *const args[] = {"--sql-dialect", dialect, "--poll-ms", "50", "--heartbeat-ms", "500",
                                "--adopt-grace-ms", "0", "--lease-ms", "1000", "--lease-renew-ms", "200",
                                NULL};
    assert_int_equal(tp_daemon_start(&fx->d[i], fx->url, args), 0);
    fx->have_d[i] = true;
}

static tp_worker *worker(struct fx *fx, int i, const char *addr, unsigned threads, const char *type,
                         tp_handler fn, void *arg)
{
    tp_worker_options o;
    tp_error err;
    tp_worker_options_init(&o);
    o.addresses = addr;
    o.capacity = threads ? threads : 1;
    o.threads = threads;
    o.reconnect_min_ms = 20;
    o.reconnect_max_ms = 200;
    tp_worker *w = tp_worker_new(&o, &err);
    assert_non_null(w);
    if (type)
        assert_int_equal(tp_worker_add_type(w, type, fn, arg), 0);
    fx->w[i] = w;
    assert_int_equal(tp_inproc_start(&fx->run[i], w), 0);
    return w;
}

static tp_submit_task task_of(const char *type, const char *payload, const char *key)
{
    tp_submit_task t;
    tp_submit_task_init(&t);
    t.type = type;
    t.payload = payload;
    t.payload_len = strlen(payload);
    if (key) {
        t.dedup_key = key;
        t.dedup_key_len = strlen(key);
    }
    return t;
}

static bool wait_u64(tp_testdb *db, uint64_t want, const char *sql)
{
    long long until = tp_mono_ms() + WAIT_MS;
    while (tp_mono_ms() < until) {
        if (tp_testdb_query_u64(db, "%s", sql) == want)
            return true;
        tp_sleep_ms(20);
    }
    fprintf(stderr, "not %" PRIu64 " within %d ms: %s (now %" PRIu64 ")\n", want, WAIT_MS, sql,
            tp_testdb_query_u64(db, "%s", sql));
    return false;
}

static void expect_dialect(tp_daemon *d, const char *want)
{
    json_t *st = tp_daemon_json(d, "/stats");
    assert_non_null(st);
    json_t *db = json_object_get(st, "db");
    const char *got = json_string_value(json_object_get(db, "sql_dialect"));
    printf("# /stats db.sql_dialect = %s\n", got ? got : "(absent)");
    assert_non_null(got);
    assert_string_equal(got, want);
    json_decref(st);
}

/* ---- handlers ---- */

static _Atomic int ran_hold;

static int h_hold(tp_task *t, void *arg)
{
    (void)t;
    tp_gate_pass(arg); /* held: the task stays in flight on the leader that is killed */
    return 0;
}

static int h_run(tp_task *t, void *arg)
{
    (void)t;
    (void)arg;
    atomic_fetch_add(&ran_hold, 1);
    return 0;
}

/* A transaction of another producer holding a key uncommitted while a SUBMIT of the
 * same key runs: the SUBMIT waits for it, then answers DUPLICATE with its id. */
struct bg_submit {
    tp_worker *p;
    tp_submit_task t;
    tp_submit_result r;
    int rc;
};

static void *bg_submit_main(void *arg)
{
    struct bg_submit *b = arg;
    tp_error err;
    b->rc = tp_submit(b->p, &b->t, 1, 0, SUBMIT_TIMEOUT_MS, &b->r, &err);
    return NULL;
}

/* ---- mysql_submit_recovery ---- */

static void mysql_submit_recovery(void **state)
{
    struct fx *fx = *state;
    tp_submit_result r[MANY];
    tp_error err;
    char sql[512];

    assert_int_equal(tp_testdb_create("dialect_mysql", &fx->db), 0);
    fx->have_db = true;
    make_user(fx, "my");
    glog_on(&fx->log, fx->db.conn);
    sql_mode_mysql(&fx->log);

    start_daemon(fx, 0, "mysql");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    start_daemon(fx, 1, "mysql");
    expect_dialect(&fx->d[0], "mysql");
    expect_dialect(&fx->d[1], "mysql");
    assert_int_equal(tp_daemon_log_count(&fx->d[0], "SQL dialect: mysql"), 1);
    tp_worker *p = worker(fx, 0, fx->d[0].listen, 0, NULL, NULL, NULL); /* producer only */

    /* 1000 tasks without a key: each id names the row of its own task. */
    static tp_submit_task many[MANY];
    static char payloads[MANY][16];
    for (int i = 0; i < MANY; i++) {
        snprintf(payloads[i], sizeof payloads[i], "p%d", i);
        many[i] = task_of(i % 2 ? "odd" : "even", payloads[i], NULL);
    }
    assert_int_equal(tp_submit(p, many, MANY, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(r[i].duplicate, 0);
        assert_int_equal(tp_testdb_query_u64(&fx->db,
                                             "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                             " AND payload = 'p%d' AND task_type = '%s' AND dedup_key IS NULL",
                                             r[i].task_id, i, i % 2 ? "odd" : "even"),
                         1);
    }
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), MANY);

    /* A key: inserted, then a duplicate with the same id. */
    tp_submit_task t = task_of("mail", "hello", "mail-42");
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    uint64_t id42 = r[0].task_id;
    assert_true(id42 > 0);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(r[0].duplicate, 1);
    assert_true(r[0].task_id == id42);

    /* A new key twice in one call, a key present, and a task without a key. */
    tp_submit_task four[4] = {task_of("mail", "a", "fresh"), task_of("mail", "b", "fresh"),
                              task_of("mail", "c", "mail-42"), task_of("mail", "d", NULL)};
    assert_int_equal(tp_submit(p, four, 4, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(r[1].duplicate, 1);
    assert_true(r[1].task_id == r[0].task_id);
    assert_int_equal(r[2].duplicate, 1);
    assert_true(r[2].task_id == id42);
    assert_int_equal(r[3].duplicate, 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND dedup_key = 'fresh' AND payload = 'a'", r[0].task_id), 1);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE task_id = %" PRIu64
                                                  " AND dedup_key IS NULL AND payload = 'd'", r[3].task_id), 1);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE dedup_key = 'mail-42'"), 1);
    /* No provisional key outlives its transaction. */
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE dedup_key LIKE 'taskpush:%%'"),
                     0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), MANY + 3);

    /* Another producer's uncommitted row with the key: SUBMIT waits for it. */
    MYSQL *other = tp_testdb_connect(&fx->db);
    assert_non_null(other);
    assert_true(exec_conn(other, "START TRANSACTION") >= 0);
    assert_int_equal(exec_conn(other, "INSERT INTO task (task_type, payload, dedup_key) VALUES ('mail', 'x', 'ext')"),
                     1);
    uint64_t ext_id = tp_testdb_query_u64_conn(other, "SELECT LAST_INSERT_ID()");
    struct bg_submit bg = {.p = p, .t = task_of("mail", "y", "ext"), .rc = -99};
    pthread_t thr;
    assert_int_equal(pthread_create(&thr, NULL, bg_submit_main, &bg), 0);
    tp_sleep_ms(300); /* the SUBMIT reaches the row lock (if not, it finds the row committed) */
    assert_true(exec_conn(other, "COMMIT") >= 0);
    pthread_join(thr, NULL);
    mysql_close(other);
    assert_int_equal(bg.rc, 0);
    assert_int_equal(bg.r.duplicate, 1);
    assert_true(bg.r.task_id == ext_id);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task WHERE dedup_key = 'ext'"), 1);

    /* A 64 KiB payload: inserted as '' and set by a prepared UPDATE of its own. */
    static char big[65 * 1024 + 1];
    memset(big, 'z', sizeof big - 1);
    tp_submit_task tb = task_of("mail", big, NULL);
    assert_int_equal(tp_submit(p, &tb, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT LENGTH(payload) FROM task WHERE task_id = %" PRIu64,
                                         r[0].task_id),
                     sizeof big - 1);
    assert_int_equal(tp_daemon_stat(&fx->d[0], "db.submit_duplicates_total"), 4);

    /* kill -9 of the leader with tasks in flight; the standby recovers them. */
    tp_gate_init(&fx->gate, false);
    fx->have_gate = true;
    worker(fx, 1, fx->d[0].listen, HOLD, "hold", h_hold, &fx->gate);
    static tp_submit_task holds[HOLD];
    for (int i = 0; i < HOLD; i++)
        holds[i] = task_of("hold", "h", NULL);
    assert_int_equal(tp_submit(p, holds, HOLD, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM task WHERE task_type = 'hold' AND task_state = 1");
    assert_true(wait_u64(&fx->db, HOLD, sql));
    long long t0 = tp_mono_ms();
    assert_int_equal(tp_daemon_stop(&fx->d[0], SIGKILL, 5000), 128 + SIGKILL);
    fx->have_d[0] = false;
    assert_int_equal(tp_daemon_wait_leader(&fx->d[1], WAIT_MS), 0);
    printf("# standby leads %lld ms after the kill -9\n", tp_mono_ms() - t0);
    worker(fx, 2, fx->d[1].listen, 2, "hold", h_run, NULL);
    assert_true(wait_u64(&fx->db, HOLD, "SELECT COUNT(*) FROM task WHERE task_type = 'hold' AND task_state = 2"));
    assert_true(atomic_load(&ran_hold) >= HOLD);
    assert_true(tp_daemon_log_count(&fx->d[1], "recovered 3 row(s) left PROCESSING") >= 1);
    expect_dialect(&fx->d[1], "mysql");
    tp_gate_set(&fx->gate, true);

    /* A dead leader's connections are gone with it; a frozen one's are not: a restarted
     * daemon takes over from the frozen leader by KILL CONNECTION (the lease's path). */
    start_daemon(fx, 0, "mysql");
    kill(fx->d[1].pid, SIGSTOP);
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    assert_true(tp_daemon_log_count(&fx->d[0], "killed the old leader's database connections") >= 1);
    assert_int_equal(tp_daemon_stop(&fx->d[1], SIGKILL, 5000), 128 + SIGKILL);
    fx->have_d[1] = false;
    assert_int_equal(tp_daemon_stop(&fx->d[0], SIGTERM, 15000), 0);
    fx->have_d[0] = false;

    /* Every statement both daemons sent. */
    static const char *const needles[] = {"INSERT IGNORE INTO task", "LOCK IN SHARE MODE",
                                          "SET dedup_key = NULL", "KILL CONNECTION",
                                          "innodb_lock_wait_timeout = 1", NULL};
    size_t total, found[5];
    int bad = glog_check(&fx->log, fx->user, &total, needles, found);
    glog_off(&fx->log);
    for (int i = 0; needles[i]; i++)
        printf("# statements with '%s': %zu\n", needles[i], found[i]);
    assert_true(total > 100);
    for (int i = 0; needles[i]; i++)
        assert_true(found[i] > 0);
    assert_int_equal(bad, 0);
}

/* ---- mysql_migrate_v1 ---- */

static void mysql_migrate_v1(void **state)
{
    struct fx *fx = *state;
    char out[8192], path[1024];
    tp_submit_result r[1];
    tp_error err;

    assert_int_equal(tp_testdb_create("dialect_migrate", &fx->db), 0);
    fx->have_db = true;
    assert_int_equal(tp_testdb_exec(&fx->db, "DROP TABLE IF EXISTS task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep"), 0);
    const char *root = getenv("TASKPUSH_SOURCE_ROOT");
    snprintf(path, sizeof path, "%s/tests/data/schema-v1.sql", root ? root : ".");
    assert_int_equal(tp_testdb_load_file(fx->db.conn, path), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, DSP_CLAIM_SQL_SCHEMA_VERSION), 1);
    assert_true(tp_testdb_exec(&fx->db, "INSERT INTO task (task_type, payload) VALUES ('old', 'o1'), ('old', 'o2')") == 2);
    make_user(fx, "mig");
    glog_on(&fx->log, fx->db.conn);
    sql_mode_mysql(&fx->log);

    const char *const argv[] = {tp_build_path("dispatcher/taskpushd"), "--db", fx->url, "--sql-dialect", "mysql",
                                "--migrate", NULL};
    assert_int_equal(tp_run(argv, NULL, out, sizeof out, 60000), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, DSP_CLAIM_SQL_SCHEMA_VERSION), DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);

    start_daemon(fx, 0, "mysql");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    tp_worker *p = worker(fx, 0, fx->d[0].listen, 0, NULL, NULL, NULL);
    tp_submit_task t = task_of("old", "new", "k");
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(tp_testdb_query_u64(&fx->db, "SELECT COUNT(*) FROM task"), 3);
    assert_int_equal(tp_daemon_stop(&fx->d[0], SIGTERM, 15000), 0);
    fx->have_d[0] = false;

    static const char *const needles[] = {"ALTER TABLE task", "INSERT IGNORE INTO task", NULL};
    size_t total, found[2];
    int bad = glog_check(&fx->log, fx->user, &total, needles, found);
    glog_off(&fx->log);
    assert_true(found[0] > 0); /* the migrations' text was sent and checked */
    assert_true(found[1] > 0);
    assert_int_equal(bad, 0);
}

/* ---- auto_mode_flagged ---- */

static void auto_mode_flagged(void **state)
{
    struct fx *fx = *state;
    tp_submit_result r[1];
    tp_error err;

    assert_int_equal(tp_testdb_create("dialect_auto", &fx->db), 0);
    fx->have_db = true;
    make_user(fx, "auto");
    glog_on(&fx->log, fx->db.conn);
    start_daemon(fx, 0, "auto");
    assert_int_equal(tp_daemon_wait_leader(&fx->d[0], WAIT_MS), 0);
    expect_dialect(&fx->d[0], "mariadb");
    assert_int_equal(tp_daemon_log_count(&fx->d[0], "SQL dialect: mariadb"), 1);
    tp_worker *p = worker(fx, 0, fx->d[0].listen, 0, NULL, NULL, NULL);
    tp_submit_task t = task_of("mail", "hello", "k");
    assert_int_equal(tp_submit(p, &t, 1, 0, SUBMIT_TIMEOUT_MS, r, &err), 0);
    assert_int_equal(tp_daemon_stop(&fx->d[0], SIGTERM, 15000), 0);
    fx->have_d[0] = false;

    static const char *const needles[] = {"RETURNING task_id, dedup_key", NULL};
    size_t total, found[1];
    int bad = glog_check(&fx->log, fx->user, &total, needles, found);
    glog_off(&fx->log);
    /* MariaDB's dialect: the checker the MySQL cases pass finds RETURNING here. */
    assert_true(found[0] > 0);
    assert_true(bad >= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(checker_self_test),
        cmocka_unit_test_setup_teardown(mysql_submit_recovery, setup, teardown),
        cmocka_unit_test_setup_teardown(mysql_migrate_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(auto_mode_flagged, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
