/* test_db: dispatcher/db/ (db.h) against a real MariaDB.
 *
 * Each case gets a fresh database (tests/testlib/testdb.h) and runs a real event_base in
 * the test thread; the database threads call back into it. Every wait is bounded and
 * fails the case when its condition never comes; nothing asserts on how long anything
 * took. Needs a server from scripts/tp-mariadb; without one every case fails.
 *
 * TP_TEST_FILTER=pattern runs only the matching cases; TP_TEST_DB_DEBUG=1 shows the
 * module's debug log.
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
#include <time.h>

#include <cmocka.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <mysql.h>

#include "config.h" /* dsp_db_url_parse */
#include "db.h"
#include "db_sql.h"
#include "rows.h"
#include "testdb.h"

#define WAIT_MS 20000 /* the longest any condition is waited for */
#define HOUR_MS ((int64_t)3600000)

struct fx;

/* What one dsp_db told its callbacks. */
struct rec {
    struct fx *fx;
    int nleader;
    uint32_t epochs[8];
    uint64_t older_processing_at_leader; /* rows of older epochs still PROCESSING then */
    int nlost;
    char events[64]; /* 'L' leader, 'X' leader lost, 'F' fatal */
    int nevents;
    int nhealth_up, nhealth_down;
    bool connected;
    int nfatal;
    char fatal[256];
    dsp_claim_reply *reply;
    int nreplies;
    uint64_t written[DSP_WRITE_KINDS];
    uint64_t fenced;
    int nreports;
    int nrequeued;
    uint64_t requeue_id; /* the last on_requeued */
    int64_t requeue_rows;
};

struct fx {
    tp_testdb tdb;
    struct event_base *base;
    struct event *tick;
    dsp_db_url url;
    dsp_log log;
    dsp_db *db[2];
    struct rec rec[2];
    MYSQL *other; /* a second connection of the test, closed by teardown */
    /* The stats thread's options for the next start_db. */
    int64_t table_stats_ms, retain_succeeded_ms, retain_failed_ms;
    bool no_split; /* --claim-split 0 for the next start_db (else 400, the default) */
};

/* ---- helpers ---- */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs the loop once, returning within ~10 ms (the tick); false once past deadline. */
static bool loop_once(struct fx *fx, int64_t deadline)
{
    if (mono_ms() >= deadline)
        return false;
    event_base_loop(fx->base, EVLOOP_ONCE);
    return true;
}

#define WAIT_UNTIL(fx, cond, ms)                                                               \
    do {                                                                                       \
        int64_t dl_ = mono_ms() + (ms);                                                        \
        while (!(cond) && loop_once((fx), dl_))                                                \
            ;                                                                                  \
    } while (0)

/* Runs the loop for ms whatever happens (to check that something does NOT happen). */
static void run_for(struct fx *fx, int64_t ms)
{
    int64_t dl = mono_ms() + ms;
    while (loop_once(fx, dl))
        ;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static void rec_event(struct rec *r, char c)
{
    if (r->nevents < (int)sizeof r->events - 1)
        r->events[r->nevents++] = c;
}

static void cb_leader(void *arg, uint32_t epoch)
{
    struct rec *r = arg;
    if (r->nleader < 8)
        r->epochs[r->nleader] = epoch;
    r->nleader++;
    rec_event(r, 'L');
    r->older_processing_at_leader = tp_testdb_query_u64(
        &r->fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1 AND epoch < %u", epoch);
}

static void cb_leader_lost(void *arg)
{
    struct rec *r = arg;
    r->nlost++;
    rec_event(r, 'X');
}

static void cb_claim(void *arg, dsp_claim_reply *reply)
{
    struct rec *r = arg;
    dsp_claim_reply_free(r->reply);
    r->reply = reply;
    r->nreplies++;
}

static void cb_written(void *arg, const dsp_write_report *rep)
{
    struct rec *r = arg;
    for (int k = 0; k < DSP_WRITE_KINDS; k++)
        r->written[k] += rep->written[k];
    r->fenced += rep->fenced;
    r->nreports++;
}

static void cb_health(void *arg, bool connected)
{
    struct rec *r = arg;
    r->connected = connected;
    if (connected)
        r->nhealth_up++;
    else
        r->nhealth_down++;
}

static void cb_requeued(void *arg, uint64_t request_id, int64_t rows)
{
    struct rec *r = arg;
    r->nrequeued++;
    r->requeue_id = request_id;
    r->requeue_rows = rows;
}

static void cb_fatal(void *arg, const char *message)
{
    struct rec *r = arg;
    r->nfatal++;
    snprintf(r->fatal, sizeof r->fatal, "%s", message);
    rec_event(r, 'F');
}

static uint64_t processed(const struct rec *r)
{
    uint64_t n = r->fenced;
    for (int k = 0; k < DSP_WRITE_KINDS; k++)
        n += r->written[k];
    return n;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof *fx);
    char err[256];
    struct timeval tv = {0, 10000};

    if (fx == NULL)
        return -1;
    if (tp_testdb_create("db", &fx->tdb) < 0)
        goto fail;
    if (dsp_db_url_parse(fx->tdb.url, &fx->url, err, sizeof err) < 0) {
        fprintf(stderr, "url %s: %s\n", fx->tdb.url, err);
        goto fail;
    }
    if (fx->tdb.password[0] && fx->url.password == NULL)
        fx->url.password = strdup(fx->tdb.password);
    fx->log.level = getenv("TP_TEST_DB_DEBUG") ? DSP_LOG_DEBUG : DSP_LOG_WARN;
    fx->base = event_base_new();
    fx->tick = fx->base ? event_new(fx->base, -1, EV_PERSIST, tick_cb, NULL) : NULL;
    if (fx->tick == NULL || event_add(fx->tick, &tv) < 0)
        goto fail;
    for (int i = 0; i < 2; i++)
        fx->rec[i].fx = fx;
    *state = fx;
    return 0;
fail:
    tp_testdb_drop(&fx->tdb);
    free(fx);
    return -1;
}

static int teardown(void **state)
{
    struct fx *fx = *state;

    if (fx->other)
        mysql_close(fx->other); /* its locks would hold DROP DATABASE */
    for (int i = 0; i < 2; i++) {
        if (fx->db[i]) {
            dsp_db_stop(fx->db[i], 2000);
            dsp_db_free(fx->db[i]);
        }
        dsp_claim_reply_free(fx->rec[i].reply);
    }
    if (fx->tick)
        event_free(fx->tick);
    if (fx->base)
        event_base_free(fx->base);
    dsp_db_url_clear(&fx->url);
    tp_testdb_drop(&fx->tdb);
    free(fx);
    return 0;
}

static dsp_db *start_db(struct fx *fx, int i, int64_t flush_ms, size_t batch)
{
    dsp_db_options o = {
        .url = &fx->url,
        .log = &fx->log,
        .base = fx->base,
        .result_flush_ms = flush_ms,
        .max_write_batch = batch,
        .table_stats_ms = fx->table_stats_ms,
        .claim_split = fx->no_split ? 0 : 400,
        .retain_succeeded_ms = fx->retain_succeeded_ms,
        .retain_failed_ms = fx->retain_failed_ms,
        /* The rows these tests leave PROCESSING on purpose (FAR_EPOCH, hostile lists)
         * are orphans to the leader's scan (db_sql.h): a day keeps it off them. */
        .orphan_age_ms = 86400000,
        .cb =
            {
                .on_leader = cb_leader,
                .on_leader_lost = cb_leader_lost,
                .on_claim = cb_claim,
                .on_written = cb_written,
                .on_health = cb_health,
                .on_requeued = cb_requeued,
                .on_fatal = cb_fatal,
            },
        .cb_arg = &fx->rec[i],
    };
    fx->db[i] = dsp_db_new(&o);
    assert_non_null(fx->db[i]);
    assert_int_equal(dsp_db_start(fx->db[i]), 0);
    return fx->db[i];
}

/* Starts db 0 and waits for its leadership; returns the epoch. */
static uint32_t start_leader(struct fx *fx, int64_t flush_ms, size_t batch)
{
    start_db(fx, 0, flush_ms, batch);
    WAIT_UNTIL(fx, fx->rec[0].nleader > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nleader, 1);
    return fx->rec[0].epochs[0];
}

static void stop_db(struct fx *fx, int i)
{
    dsp_db_stop(fx->db[i], 10000);
    dsp_db_free(fx->db[i]);
    fx->db[i] = NULL;
}

/* Inserts one row; returns its task_id. */
static uint64_t ins(struct fx *fx, const char *cols, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static uint64_t ins(struct fx *fx, const char *cols, const char *fmt, ...)
{
    char vals[4096];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(vals, sizeof vals, fmt, ap);
    va_end(ap);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "INSERT INTO task (%s) VALUES (%s)", cols, vals), 1);
    return (uint64_t)mysql_insert_id(fx->tdb.conn);
}

/* Inserts n rows (n <= 100,000) with the given column values. */
static void ins_many(struct fx *fx, unsigned n, const char *cols, const char *vals)
{
    const char *digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3"
                         " UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL"
                         " SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    assert_int_equal(tp_testdb_exec(&fx->tdb,
                                    "INSERT INTO task (%s) SELECT %s FROM %s a, %s b, %s c, %s d,"
                                    " %s e LIMIT %u",
                                    cols, vals, digits, digits, digits, digits, digits, n),
                     (int64_t)n);
}

static uint64_t col_u64(struct fx *fx, uint64_t id, const char *col)
{
    return tp_testdb_query_u64(&fx->tdb, "SELECT %s FROM task WHERE task_id = %" PRIu64, col, id);
}

/* The first column of the first row as text into buf; returns its length, or -1 for
 * NULL, no row or an error. */
static long query_str(struct fx *fx, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static long query_str(struct fx *fx, char *buf, size_t cap, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    MYSQL_RES *res;
    MYSQL_ROW row;
    long n = -1;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    buf[0] = '\0';
    if (mysql_query(fx->tdb.conn, sql) != 0) {
        fprintf(stderr, "query failed: %s\n  %s\n", mysql_error(fx->tdb.conn), sql);
        return -1;
    }
    if ((res = mysql_store_result(fx->tdb.conn)) == NULL)
        return -1;
    if ((row = mysql_fetch_row(res)) != NULL && row[0] != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        n = (long)len[0];
        snprintf(buf, cap, "%.*s", (int)len[0], row[0]);
    }
    mysql_free_result(res);
    return n;
}

static dsp_claim_reply *claim(struct fx *fx, int i, const char *const *types,
                              const uint32_t *limits, size_t n, uint32_t total)
{
    struct rec *r = &fx->rec[i];
    dsp_claim_request req = {.ntypes = n, .types = types, .limits = limits, .total = total};
    int before = r->nreplies;
    dsp_claim_reply *rep;

    if (dsp_db_claim(fx->db[i], &req) != 0)
        return NULL;
    WAIT_UNTIL(fx, r->nreplies > before, WAIT_MS);
    rep = r->reply;
    r->reply = NULL;
    return rep;
}

/* One claim of up to `limit` rows of one type; fails the case unless it worked. */
static dsp_claim_reply *claim1(struct fx *fx, const char *type, uint32_t limit)
{
    const char *types[1] = {type};
    uint32_t limits[1] = {limit};
    dsp_claim_reply *rep = claim(fx, 0, types, limits, 1, limit);
    assert_non_null(rep);
    assert_int_equal(rep->status, 0);
    return rep;
}

static void outcome(dsp_outcome *o, uint64_t id, uint8_t kind, uint32_t attempts,
                    int64_t run_after, const void *data, size_t len)
{
    memset(o, 0, sizeof *o);
    o->task_id = id;
    o->kind = kind;
    o->attempts = attempts;
    o->run_after_ms = run_after;
    if (len) {
        o->data = malloc(len);
        assert_non_null(o->data);
        memcpy(o->data, data, len);
        o->len = len;
    }
}

/* Queues n outcomes on db 0 and waits until the write thread reported all of them. */
static void write_wait(struct fx *fx, dsp_outcome *o, size_t n)
{
    struct rec *r = &fx->rec[0];
    uint64_t target = processed(r) + n;

    dsp_db_write(fx->db[0], o, n);
    WAIT_UNTIL(fx, processed(r) >= target, WAIT_MS);
    assert_int_equal(processed(r), target);
    assert_int_equal(dsp_db_pending_writes(fx->db[0]), 0);
}

static uint64_t lock_holder(struct fx *fx)
{
    return tp_testdb_query_u64(&fx->tdb, "SELECT IFNULL(IS_USED_LOCK('taskpush.%s'), 0)", fx->tdb.name);
}

/* ---- leadership and epochs ---- */

static void test_leader_takes_epoch(void **state)
{
    struct fx *fx = *state;
    dsp_db_counters c;
    uint32_t e = start_leader(fx, 5, 2000);

    assert_true(e >= 1);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT value FROM taskpush_meta WHERE name = 'epoch'"),
                     e);
    WAIT_UNTIL(fx, fx->rec[0].connected, WAIT_MS);
    assert_true(fx->rec[0].connected);
    dsp_db_counters_get(fx->db[0], &c);
    assert_true(c.leader);
    assert_true(c.connected);
    assert_int_equal(c.epoch, e);
    assert_true(c.statements > 0);
    /* The lock is held by one of its connections, not by ours. */
    assert_true(lock_holder(fx) != TP_TESTDB_U64_ERR);
}

static void test_second_dispatcher_waits(void **state)
{
    struct fx *fx = *state;
    uint32_t e1 = start_leader(fx, 5, 2000);

    start_db(fx, 1, 5, 2000);
    WAIT_UNTIL(fx, fx->rec[1].connected, WAIT_MS);
    assert_true(fx->rec[1].connected);
    /* Several of its GET_LOCK tries go by: none may succeed. */
    run_for(fx, 2500);
    assert_int_equal(fx->rec[1].nleader, 0);
    const char *types[1] = {"a"};
    uint32_t limits[1] = {1};
    dsp_claim_request req = {1, types, limits, 1, 0};
    assert_int_equal(dsp_db_claim(fx->db[1], &req), -1);

    stop_db(fx, 0);
    WAIT_UNTIL(fx, fx->rec[1].nleader > 0, WAIT_MS);
    assert_int_equal(fx->rec[1].nleader, 1);
    assert_true(fx->rec[1].epochs[0] > e1);
    assert_int_equal(fx->rec[0].nlost, 0);
}

static void test_unknown_schema_version_is_fatal(void **state)
{
    struct fx *fx = *state;

    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET value = 99"
                                              " WHERE name = 'schema_version'"),
                     1);
    start_db(fx, 0, 5, 2000);
    WAIT_UNTIL(fx, fx->rec[0].nfatal > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nfatal, 1);
    assert_non_null(strstr(fx->rec[0].fatal, "99"));
    run_for(fx, 300);
    assert_int_equal(fx->rec[0].nleader, 0);
}

/* taskpushd --migrate holds the table's lock while it changes the schema: a dispatcher
 * that checked the version before it waited for the lock reads it again once it has the
 * lock, and does not lead on a version it does not know. */
static void test_schema_read_again_after_the_lock(void **state)
{
    struct fx *fx = *state;

    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT GET_LOCK('taskpush.%s', 5)", fx->tdb.name), 1);
    start_db(fx, 0, 5, 2000);
    /* Waiting in GET_LOCK: its first schema check is behind it. */
    WAIT_UNTIL(fx, tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM information_schema.processlist"
                                                 " WHERE db = DATABASE() AND info LIKE"
                                                 " 'SELECT GET_LOCK(%%'") > 0,
               WAIT_MS);
    assert_int_equal(fx->rec[0].nfatal, 0);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET value = 99"
                                              " WHERE name = 'schema_version'"),
                     1);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT RELEASE_LOCK('taskpush.%s')", fx->tdb.name), 1);
    WAIT_UNTIL(fx, fx->rec[0].nfatal > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nfatal, 1);
    assert_non_null(strstr(fx->rec[0].fatal, "newer"));
    run_for(fx, 300);
    assert_int_equal(fx->rec[0].nleader, 0);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT value FROM taskpush_meta WHERE name = 'epoch'"), 0);
}

static void test_missing_schema_is_retried(void **state)
{
    struct fx *fx = *state;

    assert_int_equal(tp_testdb_exec(&fx->tdb, "DROP TABLE taskpush_meta"), 0);
    start_db(fx, 0, 5, 2000);
    WAIT_UNTIL(fx, fx->rec[0].connected, WAIT_MS);
    assert_true(fx->rec[0].connected);
    run_for(fx, 500);
    assert_int_equal(fx->rec[0].nleader, 0);
    assert_int_equal(fx->rec[0].nfatal, 0);
    assert_int_equal(tp_testdb_load_file(fx->tdb.conn, tp_testdb_schema_path()), 0);
    WAIT_UNTIL(fx, fx->rec[0].nleader > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nleader, 1);
    assert_int_equal(fx->rec[0].epochs[0], 1);
}

/* ---- recovery ---- */

static void test_recovery_before_leader(void **state)
{
    struct fx *fx = *state;
    uint64_t a, b, c, d, f;
    char buf[256];

    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET value = 5 WHERE name = 'epoch'"), 1);
    a = ins(fx, "task_state, epoch, attempts, max_attempts, `delayed`, err_msg", "1, 5, 0, 3, 1, 'kept'");
    b = ins(fx, "task_state, epoch, attempts, max_attempts, err_msg", "1, 4, 2, 3, 'old'");
    c = ins(fx, "task_state, epoch, attempts", "2, 5, 1");
    d = ins(fx, "task_state, attempts", "0, 0");
    f = ins(fx, "task_state, epoch, attempts, max_attempts", "1, 5, 7, 3");
    uint64_t g = ins(fx, "task_state, epoch, attempts, max_attempts, err_msg", "1, 5, 3, 3, 'x'");
    assert_int_equal(tp_rows_list_processing(&fx->tdb), 0); /* as their dispatcher did */

    uint32_t e = start_leader(fx, 5, 2000);
    assert_int_equal(e, 6);
    assert_int_equal(fx->rec[0].older_processing_at_leader, 0);

    /* attempts counts the deliveries recorded (outcomes and DSP_WRITE_DELIVERED): a row
     * only claimed keeps its count. */
    assert_int_equal(col_u64(fx, a, "task_state"), 0);
    assert_int_equal(col_u64(fx, a, "attempts"), 0);
    assert_int_equal(col_u64(fx, a, "`delayed`"), 0);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, a) > 0);
    assert_string_equal(buf, "kept");

    /* Below max_attempts: back to NEW with its count. */
    assert_int_equal(col_u64(fx, b, "task_state"), 0);
    assert_int_equal(col_u64(fx, b, "attempts"), 2);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, b) > 0);
    assert_string_equal(buf, "old");

    assert_int_equal(col_u64(fx, c, "task_state"), 2);
    assert_int_equal(col_u64(fx, c, "attempts"), 1);
    assert_int_equal(col_u64(fx, d, "task_state"), 0);
    assert_int_equal(col_u64(fx, d, "attempts"), 0);
    /* Its last allowed delivery was made and its outcome died with the dispatcher: FAILED,
     * as when a worker is lost on the last attempt. */
    assert_int_equal(col_u64(fx, f, "task_state"), 3);
    assert_int_equal(col_u64(fx, f, "attempts"), 7);
    assert_int_equal(col_u64(fx, g, "task_state"), 3);
    assert_int_equal(col_u64(fx, g, "attempts"), 3);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, g) > 0);
    assert_string_equal(buf, "the dispatcher stopped during the last attempt");
}

static void test_recovery_in_batches(void **state)
{
    struct fx *fx = *state;

    ins_many(fx, 12001, "task_state, epoch, attempts, max_attempts", "1, 0, 0, 3");
    assert_int_equal(tp_rows_list_processing(&fx->tdb), 0);
    start_leader(fx, 5, 2000);
    assert_int_equal(fx->rec[0].older_processing_at_leader, 0);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 0"
                                                   " AND attempts = 0"),
                     12001);
}

/* task_claim is read as untrusted: a row that does not list ids is left as it is (and
 * logged), the others are recovered, and the leader goes on. */
static void test_recovery_hostile_lists(void **state)
{
    struct fx *fx = *state;
    static const char *const bad[] = {"abc", "1,,2", "18446744073709551616", ",7", "7,",
                                      "-3", " 7", "0", "7;DROP TABLE task", "123456789012345678901"};
    uint64_t a, b;

    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET value = 5 WHERE name = 'epoch'"), 1);
    a = ins(fx, "task_state, epoch, attempts", "1, 4, 1");
    b = ins(fx, "task_state, epoch, attempts", "1, 4, 1");
    assert_int_equal(tp_testdb_exec(&fx->tdb, "INSERT INTO task_claim (epoch, seq, task_ids)"
                                              " VALUES (4, 1, '%" PRIu64 "')", a), 1);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "INSERT INTO task_claim (epoch, seq, task_ids)"
                                              " VALUES (4, 2, '%" PRIu64 ",x')", b), 1);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tp_testdb_exec(&fx->tdb, "INSERT INTO task_claim (epoch, seq, task_ids)"
                                                  " VALUES (4, %zu, '%s')", 10 + i, bad[i]), 1);

    assert_int_equal(start_leader(fx, 5, 2000), 6);
    assert_int_equal(col_u64(fx, a, "task_state"), 0);
    assert_int_equal(col_u64(fx, a, "attempts"), 1);
    /* Listed only by a row that is not a list: not recovered, as the schema says. */
    assert_int_equal(col_u64(fx, b, "task_state"), 1);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task_claim WHERE seq = 1"), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task_claim"),
                     1 + sizeof bad / sizeof bad[0]);
    /* And it leads: the recovered row is claimed again, and listed under the new epoch. */
    dsp_claim_reply *r = claim1(fx, "default", 10);
    assert_int_equal(r->ntasks, 1);
    assert_int_equal(r->tasks[0].task_id, a);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task_claim WHERE epoch = 6"
                                                   " AND task_ids = '%" PRIu64 "'", a),
                     1);
    dsp_claim_reply_free(r);
}

/* ---- claims ---- */

static void test_claim_order_and_limits(void **state)
{
    struct fx *fx = *state;
    uint64_t a1, a2, a3, a4, a5, b1, b2, b3, c1, ad, af;
    const char *types[2] = {"a", "b"};
    uint32_t limits[2] = {3, 1};
    int64_t now = tp_testdb_now_ms();

    a1 = ins(fx, "task_type, task_priority", "'a', 1");
    a2 = ins(fx, "task_type, task_priority", "'a', 2");
    a3 = ins(fx, "task_type, task_priority", "'a', 0");
    a4 = ins(fx, "task_type, task_priority", "'a', 2");
    a5 = ins(fx, "task_type, task_priority", "'a', 1");
    b1 = ins(fx, "task_type, task_priority", "'b', 2");
    b2 = ins(fx, "task_type, task_priority", "'b', 1");
    b3 = ins(fx, "task_type, task_priority", "'b', 2");
    c1 = ins(fx, "task_type, task_priority", "'c', 2");
    /* Not ready: in the delayed lane, or not due yet. */
    ad = ins(fx, "task_type, task_priority, `delayed`, run_after", "'a', 2, 1, %" PRId64, now + HOUR_MS);
    af = ins(fx, "task_type, task_priority, run_after", "'a', 2, %" PRId64, now + HOUR_MS);

    uint32_t e = start_leader(fx, 5, 2000);

    dsp_claim_reply *rep = claim(fx, 0, types, limits, 2, 4);
    assert_non_null(rep);
    assert_int_equal(rep->status, 0);
    assert_int_equal(rep->ntypes, 2);
    assert_string_equal(rep->types[0], "a");
    assert_string_equal(rep->types[1], "b");
    /* Dispatch order across both types: priority desc, then id; b holds 1 at most,
     * so b3 (priority 2) gives way to a1 (priority 1); the total stops at 4. */
    uint64_t want[4] = {a2, a4, b1, a1};
    uint16_t want_type[4] = {0, 0, 1, 0};
    uint8_t want_prio[4] = {2, 2, 2, 1};
    assert_int_equal(rep->ntasks, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(rep->tasks[i].task_id, want[i]);
        assert_int_equal(rep->tasks[i].type_index, want_type[i]);
        assert_int_equal(rep->tasks[i].priority, want_prio[i]);
        assert_int_equal(rep->tasks[i].attempts, 0);
        assert_int_equal(rep->tasks[i].max_attempts, 3);
        assert_int_equal(rep->tasks[i].timeout_ms, -1);
        assert_int_equal(rep->tasks[i].payload_len, 0);
        assert_null(rep->tasks[i].payload);
    }
    assert_true(rep->duration_us >= 0);
    dsp_claim_reply_free(rep);

    /* Exactly those rows are PROCESSING under our epoch. */
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1"), 4);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT COUNT(*) FROM task WHERE task_state = 1 AND epoch = %u"
                                         " AND task_id IN (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 ")",
                                         e, a1, a2, a4, b1),
                     4);
    uint64_t untouched[7] = {a3, a5, b2, b3, c1, ad, af};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(col_u64(fx, untouched[i], "task_state"), 0);
        assert_int_equal(col_u64(fx, untouched[i], "epoch"), 0);
    }
    assert_int_equal(col_u64(fx, ad, "`delayed`"), 1);

    dsp_db_counters c;
    dsp_db_counters_get(fx->db[0], &c);
    assert_int_equal(c.claims, 1);
    assert_int_equal(c.claimed_rows, 4);
}

static void test_claim_fields_and_binary_payload(void **state)
{
    struct fx *fx = *state;
    uint8_t big[70000];
    char hex[2 * sizeof big + 1];
    uint64_t x, y, z;

    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7 + (i >> 8));
    for (size_t i = 0; i < sizeof big; i++)
        sprintf(hex + 2 * i, "%02X", big[i]);
    x = ins(fx, "task_type, task_priority, payload, attempts, max_attempts, timeout_ms",
            "'t', 2, X'00FF0041FF00', 2, 5, 1234");
    y = ins(fx, "task_type, task_priority, payload", "'t', 1, NULL");
    assert_int_equal(tp_testdb_exec(&fx->tdb, "INSERT INTO task (task_type, payload) VALUES ('t', X'%s')", hex), 1);
    z = (uint64_t)mysql_insert_id(fx->tdb.conn);

    start_leader(fx, 5, 2000);
    dsp_claim_reply *rep = claim1(fx, "t", 10);
    assert_int_equal(rep->ntasks, 3);
    assert_int_equal(rep->tasks[0].task_id, x);
    assert_int_equal(rep->tasks[0].attempts, 2);
    assert_int_equal(rep->tasks[0].max_attempts, 5);
    assert_int_equal(rep->tasks[0].timeout_ms, 1234);
    assert_int_equal(rep->tasks[0].payload_len, 6);
    assert_memory_equal(rep->tasks[0].payload, "\x00\xff\x00\x41\xff\x00", 6);
    assert_int_equal(rep->tasks[1].task_id, y);
    assert_int_equal(rep->tasks[1].payload_len, 0);
    assert_null(rep->tasks[1].payload);
    assert_int_equal(rep->tasks[1].timeout_ms, -1);
    assert_int_equal(rep->tasks[2].task_id, z);
    assert_int_equal(rep->tasks[2].payload_len, sizeof big);
    assert_memory_equal(rep->tasks[2].payload, big, sizeof big);
    dsp_claim_reply_free(rep);
}

static void test_claim_skips_locked_rows(void **state)
{
    struct fx *fx = *state;
    uint64_t ids[5], waits0, waits1;
    MYSQL *other;

    for (int i = 0; i < 5; i++)
        ids[i] = ins(fx, "task_type", "'a'");
    start_leader(fx, 5, 2000);

    other = fx->other = tp_testdb_connect(&fx->tdb);
    assert_non_null(other);
    assert_int_equal(tp_testdb_exec_conn(other, "BEGIN"), 0);
    /* One primary-key lookup per row: on a table this small, IN (...) could scan the
     * table and, at REPEATABLE READ, lock every row. */
    for (int i = 0; i < 2; i++)
        assert_true(tp_testdb_exec_conn(other, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE",
                                        ids[i]) >= 0);
    assert_int_equal(tp_testdb_status(fx->tdb.conn, TP_TESTDB_GLOBAL, "Innodb_row_lock_waits", &waits0), 0);

    dsp_claim_reply *rep = claim1(fx, "a", 10);
    assert_int_equal(rep->ntasks, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rep->tasks[i].task_id, ids[i + 2]);
    dsp_claim_reply_free(rep);
    assert_int_equal(tp_testdb_status(fx->tdb.conn, TP_TESTDB_GLOBAL, "Innodb_row_lock_waits", &waits1), 0);
    assert_int_equal(waits1, waits0);

    assert_int_equal(tp_testdb_exec_conn(other, "ROLLBACK"), 0);
    mysql_close(other);
    fx->other = NULL;
    assert_int_equal(col_u64(fx, ids[0], "task_state"), 0);
    assert_int_equal(col_u64(fx, ids[2], "task_state"), 1);
}

static void test_claim_leaves_padded_type(void **state)
{
    struct fx *fx = *state;
    uint64_t pad, real;

    /* utf8mb4_bin pads, so in SQL 'a ' = 'a'; the schema now refuses such types, a table
     * from before may still hold some. */
    assert_int_equal(tp_testdb_exec(&fx->tdb, "ALTER TABLE task DROP CONSTRAINT IF EXISTS"
                                              " task_type_no_trailing_space"),
                     0);
    pad = ins(fx, "task_type, task_priority", "'a ', 2");
    real = ins(fx, "task_type, task_priority", "'a', 1");
    start_leader(fx, 5, 2000);
    dsp_claim_reply *rep = claim1(fx, "a", 10);
    assert_int_equal(rep->ntasks, 1);
    assert_int_equal(rep->tasks[0].task_id, real);
    dsp_claim_reply_free(rep);
    assert_int_equal(col_u64(fx, pad, "task_state"), 0);
    assert_int_equal(col_u64(fx, pad, "attempts"), 0);
    assert_int_equal(col_u64(fx, real, "task_state"), 1);
}

static void test_claim_rules(void **state)
{
    struct fx *fx = *state;
    const char *types[1] = {"a"};
    uint32_t limits[1] = {5};
    dsp_claim_request req = {1, types, limits, 5, 0};

    start_db(fx, 0, 5, 2000);
    /* Not leader yet (or about to be): either refused, or answered. */
    WAIT_UNTIL(fx, fx->rec[0].nleader > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nleader, 1);

    /* Nothing ready: an empty success. */
    assert_int_equal(dsp_db_claim(fx->db[0], &req), 0);
    /* One outstanding at most. */
    assert_int_equal(dsp_db_claim(fx->db[0], &req), -1);
    WAIT_UNTIL(fx, fx->rec[0].nreplies > 0, WAIT_MS);
    assert_non_null(fx->rec[0].reply);
    assert_int_equal(fx->rec[0].reply->status, 0);
    assert_int_equal(fx->rec[0].reply->ntasks, 0);

    /* A request that asks for nothing is answered without SQL. */
    limits[0] = 0;
    dsp_claim_reply *rep = claim(fx, 0, types, limits, 1, 5);
    assert_non_null(rep);
    assert_int_equal(rep->status, 0);
    assert_int_equal(rep->ntasks, 0);
    dsp_claim_reply_free(rep);
}

/* ---- writes ---- */

static void test_write_succeeded(void **state)
{
    struct fx *fx = *state;
    static const uint8_t result[] = {0x00, 0xFF, 0x01, 'a', 'b', 0x00, 0x80};
    char buf[256];
    dsp_outcome o[2];
    uint64_t x = ins(fx, "task_type", "'a'"), y = ins(fx, "task_type", "'a'");
    int64_t t0 = tp_testdb_now_ms();

    start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    outcome(&o[0], x, DSP_WRITE_SUCCEEDED, 1, 0, result, sizeof result);
    outcome(&o[1], y, DSP_WRITE_SUCCEEDED, 1, 0, NULL, 0);
    write_wait(fx, o, 2);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], 2);
    assert_int_equal(fx->rec[0].fenced, 0);

    assert_int_equal(col_u64(fx, x, "task_state"), 2);
    assert_int_equal(col_u64(fx, x, "attempts"), 1);
    assert_true((int64_t)col_u64(fx, x, "last_update_time") >= t0);
    assert_int_equal(query_str(fx, buf, sizeof buf, "SELECT HEX(result) FROM task WHERE task_id = %" PRIu64, x), 14);
    assert_string_equal(buf, "00FF0161620080");
    assert_int_equal(col_u64(fx, y, "task_state"), 2);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT result IS NULL FROM task WHERE task_id = %" PRIu64, y), 1);
}

static void test_write_failed_retry_release(void **state)
{
    struct fx *fx = *state;
    char buf[256];
    dsp_outcome o[3];
    uint64_t f = ins(fx, "task_type", "'a'"), r = ins(fx, "task_type", "'a'");
    uint64_t l = ins(fx, "task_type, err_msg, attempts", "'a', 'before', 1");
    int64_t later = tp_testdb_now_ms() + HOUR_MS;

    start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    outcome(&o[0], f, DSP_WRITE_FAILED, 3, 0, "boom", 4);
    outcome(&o[1], r, DSP_WRITE_RETRY, 1, later, "again", 5);
    outcome(&o[2], l, DSP_WRITE_RELEASE, 1, 0, NULL, 0);
    write_wait(fx, o, 3);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_FAILED], 1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_RETRY], 1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_RELEASE], 1);

    assert_int_equal(col_u64(fx, f, "task_state"), 3);
    assert_int_equal(col_u64(fx, f, "attempts"), 3);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, f) > 0);
    assert_string_equal(buf, "boom");

    assert_int_equal(col_u64(fx, r, "task_state"), 0);
    assert_int_equal(col_u64(fx, r, "`delayed`"), 1);
    assert_int_equal(col_u64(fx, r, "run_after"), (uint64_t)later);
    assert_int_equal(col_u64(fx, r, "attempts"), 1);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, r) > 0);
    assert_string_equal(buf, "again");

    assert_int_equal(col_u64(fx, l, "task_state"), 0);
    assert_int_equal(col_u64(fx, l, "`delayed`"), 0);
    assert_int_equal(col_u64(fx, l, "attempts"), 1);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, l) > 0);
    assert_string_equal(buf, "before");
}

static void test_write_per_row_values(void **state)
{
    struct fx *fx = *state;
    uint64_t id[7];
    dsp_outcome o[7];
    char buf[256];
    int64_t now = tp_testdb_now_ms();

    for (int i = 0; i < 7; i++)
        id[i] = ins(fx, "task_type", "'a'");
    start_leader(fx, 1000, 2000);
    dsp_claim_reply *rep = claim1(fx, "a", 10);
    assert_int_equal(rep->ntasks, 7);
    dsp_claim_reply_free(rep);
    outcome(&o[0], id[0], DSP_WRITE_SUCCEEDED, 1, 0, "r0", 2);
    outcome(&o[1], id[1], DSP_WRITE_SUCCEEDED, 2, 0, NULL, 0);
    outcome(&o[2], id[2], DSP_WRITE_SUCCEEDED, 1, 0, "r0", 2);
    outcome(&o[3], id[3], DSP_WRITE_SUCCEEDED, 3, 0, "\x00\x01", 2);
    outcome(&o[4], id[4], DSP_WRITE_RETRY, 1, now + HOUR_MS, "e4", 2);
    outcome(&o[5], id[5], DSP_WRITE_RETRY, 2, now + 2 * HOUR_MS, "e5", 2);
    outcome(&o[6], id[6], DSP_WRITE_FAILED, 3, 0, "e6", 2);
    write_wait(fx, o, 7);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], 4);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_RETRY], 2);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_FAILED], 1);

    static const char *const hexres[4] = {"7230", NULL, "7230", "0001"};
    static const unsigned att[7] = {1, 2, 1, 3, 1, 2, 3};
    for (int i = 0; i < 7; i++)
        assert_int_equal(col_u64(fx, id[i], "attempts"), att[i]);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(col_u64(fx, id[i], "task_state"), 2);
        long n = query_str(fx, buf, sizeof buf, "SELECT HEX(result) FROM task WHERE task_id = %" PRIu64, id[i]);
        if (hexres[i]) {
            assert_true(n > 0);
            assert_string_equal(buf, hexres[i]);
        } else {
            assert_int_equal(n, -1);
        }
    }
    assert_int_equal(col_u64(fx, id[4], "run_after"), (uint64_t)(now + HOUR_MS));
    assert_int_equal(col_u64(fx, id[5], "run_after"), (uint64_t)(now + 2 * HOUR_MS));
    assert_true(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, id[5]) > 0);
    assert_string_equal(buf, "e5");
    assert_int_equal(col_u64(fx, id[6], "task_state"), 3);
}

static void test_write_3000_in_few_statements(void **state)
{
    struct fx *fx = *state;
    enum { N = 3000 };
    dsp_outcome *o = calloc(N, sizeof *o);
    uint64_t first, s0;
    dsp_db_counters c0, c1;

    assert_non_null(o);
    ins_many(fx, N, "task_type", "'a'");
    first = tp_testdb_query_u64(&fx->tdb, "SELECT MIN(task_id) FROM task");
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT MAX(task_id) FROM task"), first + N - 1);
    uint32_t e = start_leader(fx, 5, 2000);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE task SET task_state = 1, epoch = %u", e), N);

    /* Start right after a lane sweep, so that at most one more falls in the window. */
    dsp_db_counters_get(fx->db[0], &c0);
    s0 = c0.statements;
    WAIT_UNTIL(fx, (dsp_db_counters_get(fx->db[0], &c0), c0.statements != s0), WAIT_MS);
    run_for(fx, 30);
    dsp_db_counters_get(fx->db[0], &c0);

    long long t0 = mono_ms();
    for (int i = 0; i < N; i++)
        outcome(&o[i], first + (uint64_t)i, DSP_WRITE_SUCCEEDED, 1, 0, NULL, 0);
    write_wait(fx, o, N);
    dsp_db_counters_get(fx->db[0], &c1);
    long long secs = (mono_ms() - t0) / 1000 + 1;
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], N);
    assert_int_equal(fx->rec[0].fenced, 0);
    fprintf(stderr, "3000 outcomes: %" PRIu64 " statement(s), %" PRIu64 " batch(es) in about %lld s\n",
                  c1.statements - c0.statements, c1.write_batches - c0.write_batches, secs);
    /* Two batches of an UPDATE and a COMMIT, and at most one lane sweep; the counter
     * is every thread's, so the dependency sweep's probe and window (the stats thread,
     * once a second) count too when a slow build takes seconds. */
    assert_true(c1.write_batches - c0.write_batches <= 2);
    assert_true(c1.statements - c0.statements <= 5 + 2 * (uint64_t)secs);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 2"
                                                   " AND attempts = 1 AND result IS NULL"),
                     N);
    free(o);
}

static void test_write_distinct_results(void **state)
{
    struct fx *fx = *state;
    enum { N = 1500 };
    dsp_outcome *o = calloc(N, sizeof *o);
    uint64_t first;
    dsp_db_counters c0, c1;
    char res[32];

    assert_non_null(o);
    ins_many(fx, N, "task_type", "'a'");
    first = tp_testdb_query_u64(&fx->tdb, "SELECT MIN(task_id) FROM task");
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT MAX(task_id) FROM task"), first + N - 1);
    uint32_t e = start_leader(fx, 5, 2000);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE task SET task_state = 1, epoch = %u", e), N);

    /* Every row its own result and attempts, queued in descending id order: the
     * statement needs per-row values (a two-level CASE over the sorted rows). */
    for (int i = 0; i < N; i++) {
        uint64_t id = first + (uint64_t)(N - 1 - i);
        int n = snprintf(res, sizeof res, "res-%" PRIu64, id);
        outcome(&o[i], id, DSP_WRITE_SUCCEEDED, 1 + (uint32_t)(id % 3), 0, res, (size_t)n);
    }
    dsp_db_counters_get(fx->db[0], &c0);
    write_wait(fx, o, N);
    dsp_db_counters_get(fx->db[0], &c1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], N);
    assert_int_equal(fx->rec[0].fenced, 0);
    assert_int_equal(c1.write_batches - c0.write_batches, 1);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT COUNT(*) FROM task WHERE task_state = 2"
                                         " AND result = CONCAT('res-', task_id)"
                                         " AND attempts = 1 + task_id %% 3"),
                     N);
    free(o);
}

static void test_write_fenced(void **state)
{
    struct fx *fx = *state;
    dsp_outcome o[3];
    uint64_t ours = ins(fx, "task_type", "'a'");

    uint32_t e = start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    uint64_t theirs = ins(fx, "task_type, task_state, epoch", "'a', 1, %u", e + 7);
    uint64_t fresh = ins(fx, "task_type, task_state, epoch", "'zz', 0, %u", e);

    outcome(&o[0], ours, DSP_WRITE_SUCCEEDED, 1, 0, NULL, 0);
    outcome(&o[1], theirs, DSP_WRITE_SUCCEEDED, 1, 0, NULL, 0);
    outcome(&o[2], fresh, DSP_WRITE_FAILED, 1, 0, "x", 1);
    write_wait(fx, o, 3);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], 1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_FAILED], 0);
    assert_int_equal(fx->rec[0].fenced, 2);
    assert_int_equal(col_u64(fx, ours, "task_state"), 2);
    assert_int_equal(col_u64(fx, theirs, "task_state"), 1);
    assert_int_equal(col_u64(fx, theirs, "attempts"), 0);
    assert_int_equal(col_u64(fx, fresh, "task_state"), 0);
}

static void test_write_invalid_utf8_and_long_text(void **state)
{
    struct fx *fx = *state;
    static const char bad[] = "ab\xff" "cd\xc3(\xed\xa0\x80z";
    size_t longlen = 100000;
    char *longtext = malloc(longlen);
    char buf[512];
    dsp_outcome o[2];
    uint64_t x = ins(fx, "task_type", "'a'"), y = ins(fx, "task_type", "'a'");

    assert_non_null(longtext);
    for (size_t i = 0; i < longlen; i += 2) {
        longtext[i] = (char)0xC3; /* é */
        longtext[i + 1] = (char)0xA9;
    }
    start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    outcome(&o[0], x, DSP_WRITE_FAILED, 1, 0, bad, sizeof bad - 1);
    outcome(&o[1], y, DSP_WRITE_RETRY, 1, 0, longtext, longlen);
    free(longtext);
    write_wait(fx, o, 2);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_FAILED], 1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_RETRY], 1);

    assert_int_equal(col_u64(fx, x, "task_state"), 3);
    assert_true(query_str(fx, buf, sizeof buf, "SELECT HEX(err_msg) FROM task WHERE task_id = %" PRIu64, x) > 0);
    /* Each byte that starts no valid sequence became U+FFFD. */
    assert_string_equal(buf, "6162EFBFBD6364EFBFBD28EFBFBDEFBFBDEFBFBD7A");
    /* Capped at 65,535 bytes, on a character boundary. */
    assert_int_equal(col_u64(fx, y, "LENGTH(err_msg)"), 65534);
    assert_int_equal(col_u64(fx, y, "CHAR_LENGTH(err_msg)"), 32767);
}

static void test_write_survives_lost_connection(void **state)
{
    struct fx *fx = *state;
    dsp_outcome o[1];
    dsp_db_counters c;
    uint64_t x = ins(fx, "task_type", "'a'"), wid;

    start_leader(fx, 5, 2000);
    WAIT_UNTIL(fx, fx->rec[0].connected, WAIT_MS);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    /* The write connection, as the lease records it ("B C W L S", docs/schema.md). */
#define WRITE_CONN_SQL "SELECT SUBSTRING_INDEX(SUBSTRING_INDEX(conns, ' ', 3), ' ', -1) FROM taskpush_meta" \
                       " WHERE name = 'lease'"
    WAIT_UNTIL(fx, (wid = tp_testdb_query_u64(&fx->tdb, WRITE_CONN_SQL)) != 0 && wid != TP_TESTDB_U64_ERR,
               WAIT_MS);
#undef WRITE_CONN_SQL
    assert_true(wid != TP_TESTDB_U64_ERR && wid != 0);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %" PRIu64
                                         " AND DB = '%s'", wid, fx->tdb.name),
                     1);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "KILL CONNECTION %" PRIu64, wid), 0);

    outcome(&o[0], x, DSP_WRITE_SUCCEEDED, 1, 0, "ok", 2);
    write_wait(fx, o, 1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], 1);
    assert_int_equal(col_u64(fx, x, "task_state"), 2);
    dsp_db_counters_get(fx->db[0], &c);
    assert_true(c.reconnects >= 1);
    WAIT_UNTIL(fx, fx->rec[0].connected, WAIT_MS);
    assert_true(fx->rec[0].nhealth_down >= 1);
}

/* The first n ids of type a's ready rows in dispatch order, read by the test. */
static size_t ready_order(struct fx *fx, uint64_t *ids, size_t n)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    size_t k = 0;
    char sql[256];

    snprintf(sql, sizeof sql,
             "SELECT task_id FROM task IGNORE INDEX (claim_idx) WHERE task_state = 0 AND"
             " task_type = 'a' ORDER BY task_priority DESC, task_id LIMIT %zu", n);
    assert_int_equal(mysql_query(fx->tdb.conn, sql), 0);
    res = mysql_store_result(fx->tdb.conn);
    assert_non_null(res);
    while ((row = mysql_fetch_row(res)) != NULL && k < n)
        ids[k++] = strtoull(row[0], NULL, 10);
    mysql_free_result(res);
    return k;
}

static uint64_t db_connections(struct fx *fx)
{
    return tp_testdb_query_u64(&fx->tdb,
                               "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '%s'"
                               " AND ID <> CONNECTION_ID()",
                               fx->tdb.name);
}

/* A large claim is split: the claim helper locks and marks its second half on a
 * connection of its own (opened at the first large claim). The reply is still exactly
 * the head of dispatch order, every row with its payload; and when the epoch moved on
 * behind the dispatcher's back, the helper's fence makes it claim nothing. */
/* The lease row records the claim helper's connection (its last id, db_lease.c): the
 * helper claims only once it is recorded, so that a dispatcher taking over KILLs it. */
static bool helper_recorded(struct fx *fx)
{
    uint64_t id = tp_testdb_query_u64(&fx->tdb,
                                      "SELECT MAX(ID) FROM information_schema.PROCESSLIST"
                                      " WHERE DB = '%s' AND ID <> CONNECTION_ID()",
                                      fx->tdb.name);
    uint64_t rec = tp_testdb_query_u64(&fx->tdb,
                                       "SELECT CAST(SUBSTRING_INDEX(conns, ' ', -1) AS UNSIGNED)"
                                       " FROM taskpush_meta WHERE name = 'lease'");
    return id != TP_TESTDB_U64_ERR && rec == id;
}

static void test_claim_split_with_helper(void **state)
{
    struct fx *fx = *state;
    static uint64_t want[1000];
    char buf[64];
    uint64_t before;
    size_t i;

    ins_many(fx, 3000, "task_type, task_priority, payload",
             "'a', (a.d + b.d * 3 + c.d) % 3, CONCAT('p-', a.d, b.d, c.d, d.d, e.d)");
    uint32_t e = start_leader(fx, 5, 2000);
    before = db_connections(fx);

    /* The first large claim runs whole and wakes the helper, which connects. */
    dsp_claim_reply *rep = claim1(fx, "a", 500);
    assert_int_equal(rep->ntasks, 500);
    dsp_claim_reply_free(rep);
    WAIT_UNTIL(fx, db_connections(fx) == before + 1, WAIT_MS);
    assert_int_equal(db_connections(fx), before + 1);
    WAIT_UNTIL(fx, helper_recorded(fx), WAIT_MS);
    assert_true(helper_recorded(fx));

    assert_int_equal(ready_order(fx, want, 1000), 1000);
    rep = claim1(fx, "a", 1000);
    assert_int_equal(rep->ntasks, 1000);
    for (i = 0; i < 1000; i++) {
        const dsp_claimed_task *t = &rep->tasks[i];
        assert_int_equal(t->task_id, want[i]);
        assert_int_equal(t->max_attempts, 3);
        if (i % 97 == 0 || i == 999) {
            long n = query_str(fx, buf, sizeof buf, "SELECT payload FROM task WHERE task_id = %" PRIu64,
                               t->task_id);
            assert_true(n > 2);
            assert_int_equal(t->payload_len, (size_t)n);
            assert_memory_equal(t->payload, buf, (size_t)n);
        }
    }
    dsp_claim_reply_free(rep);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT COUNT(*) FROM task WHERE task_state = 1 AND epoch = %u", e),
                     1500);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1"), 1500);

    /* Another epoch behind the leader's back: the first half (this connection holds the
     * table's lock) is claimed, the helper's half stays NEW. */
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET value = value + 1"
                                              " WHERE name = 'epoch'"),
                     1);
    assert_int_equal(ready_order(fx, want, 400), 400);
    rep = claim1(fx, "a", 400);
    assert_int_equal(rep->ntasks, 200);
    for (i = 0; i < 200; i++)
        assert_int_equal(rep->tasks[i].task_id, want[i]);
    dsp_claim_reply_free(rep);
    for (i = 200; i < 400; i++)
        assert_int_equal(col_u64(fx, want[i], "task_state"), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1"), 1700);
}

/* The helper's connection is killed between two claims: the next large claim still
 * returns the head of dispatch order (its first half at least), no row is left
 * PROCESSING without having been returned, and the helper reconnects by itself. */
static void test_claim_helper_connection_killed(void **state)
{
    struct fx *fx = *state;
    static uint64_t want[1000];
    uint64_t before, helper, returned = 0;
    size_t i;

    ins_many(fx, 3000, "task_type, task_priority", "'a', (a.d + c.d) % 3");
    uint32_t e = start_leader(fx, 5, 2000);
    before = db_connections(fx);
    dsp_claim_reply *rep = claim1(fx, "a", 500);
    returned += rep->ntasks;
    dsp_claim_reply_free(rep);
    WAIT_UNTIL(fx, db_connections(fx) == before + 1, WAIT_MS);
    assert_int_equal(db_connections(fx), before + 1);
    /* The helper connects last: the newest connection of this database but ours. */
    helper = tp_testdb_query_u64(&fx->tdb,
                                 "SELECT MAX(ID) FROM information_schema.PROCESSLIST WHERE DB = '%s'"
                                 " AND ID <> CONNECTION_ID()",
                                 fx->tdb.name);
    assert_true(helper != TP_TESTDB_U64_ERR);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "KILL CONNECTION %" PRIu64, helper), 0);

    assert_int_equal(ready_order(fx, want, 1000), 1000);
    rep = claim1(fx, "a", 1000);
    assert_true(rep->ntasks >= 500);
    for (i = 0; i < rep->ntasks; i++)
        assert_int_equal(rep->tasks[i].task_id, want[i]);
    returned += rep->ntasks;
    dsp_claim_reply_free(rep);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1"),
                     returned);

    /* Back again: a large claim is whole and in order once more. */
    WAIT_UNTIL(fx, db_connections(fx) == before + 1, WAIT_MS);
    assert_int_equal(db_connections(fx), before + 1);
    WAIT_UNTIL(fx, helper_recorded(fx), WAIT_MS);
    assert_true(helper_recorded(fx));
    assert_int_equal(ready_order(fx, want, 1000), 1000);
    rep = claim1(fx, "a", 1000);
    assert_int_equal(rep->ntasks, 1000);
    for (i = 0; i < 1000; i++)
        assert_int_equal(rep->tasks[i].task_id, want[i]);
    returned += rep->ntasks;
    dsp_claim_reply_free(rep);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT COUNT(*) FROM task WHERE task_state = 1 AND epoch = %u", e),
                     returned);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1"),
                     returned);
}

/* --claim-split 0: a large claim runs whole on the claim connection, in dispatch order,
 * and no helper connection is ever opened. */
static void test_claim_split_off(void **state)
{
    struct fx *fx = *state;
    static uint64_t want[1000];
    uint64_t before;
    size_t i;

    ins_many(fx, 2000, "task_type, task_priority", "'a', (b.d + d.d) % 3");
    fx->no_split = true;
    start_leader(fx, 5, 2000);
    before = db_connections(fx);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(ready_order(fx, want, 1000), 1000);
        dsp_claim_reply *rep = claim1(fx, "a", 1000);
        assert_int_equal(rep->ntasks, 1000);
        for (i = 0; i < 1000; i++)
            assert_int_equal(rep->tasks[i].task_id, want[i]);
        dsp_claim_reply_free(rep);
    }
    run_for(fx, 300);
    assert_int_equal(db_connections(fx), before);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 1"), 2000);
}

/* ---- lanes ---- */

static void test_retry_is_promoted_when_due(void **state)
{
    struct fx *fx = *state;
    dsp_outcome o[1];
    uint64_t x = ins(fx, "task_type", "'a'");
    dsp_claim_reply *rep;

    start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    outcome(&o[0], x, DSP_WRITE_RETRY, 1, tp_testdb_now_ms() + 300, "later", 5);
    write_wait(fx, o, 1);
    assert_int_equal(col_u64(fx, x, "task_state"), 0);

    /* Claims come back empty until the promote sweep moved it to the ready lane. */
    bool got = false;
    int64_t dl = mono_ms() + WAIT_MS;
    while (!got && mono_ms() < dl) {
        rep = claim1(fx, "a", 10);
        got = rep->ntasks == 1 && rep->tasks[0].task_id == x;
        if (got)
            assert_int_equal(rep->tasks[0].attempts, 1);
        dsp_claim_reply_free(rep);
        if (!got)
            run_for(fx, 50);
    }
    assert_true(got);
    assert_int_equal(col_u64(fx, x, "`delayed`"), 0);
    assert_int_equal(col_u64(fx, x, "task_state"), 1);
}

static void test_future_row_is_demoted(void **state)
{
    struct fx *fx = *state;

    start_leader(fx, 5, 2000);
    uint64_t x = ins(fx, "task_type, run_after", "'a', %" PRId64, tp_testdb_now_ms() + HOUR_MS);
    WAIT_UNTIL(fx, col_u64(fx, x, "`delayed`") == 1, WAIT_MS);
    assert_int_equal(col_u64(fx, x, "`delayed`"), 1);
    assert_int_equal(col_u64(fx, x, "task_state"), 0);
}

/* ---- stop, reconnects, lost leadership ---- */

static void test_stop_writes_everything(void **state)
{
    struct fx *fx = *state;
    enum { N = 500 };
    dsp_outcome o[N];
    uint64_t first;

    ins_many(fx, N, "task_type", "'a'");
    first = tp_testdb_query_u64(&fx->tdb, "SELECT MIN(task_id) FROM task");
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT MAX(task_id) FROM task"), first + N - 1);
    /* Outcomes would wait a minute to be batched; stop must not wait for that. */
    uint32_t e = start_leader(fx, 60000, 100000);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE task SET task_state = 1, epoch = %u", e), N);
    for (int i = 0; i < N; i++)
        outcome(&o[i], first + (uint64_t)i, i % 2 ? DSP_WRITE_SUCCEEDED : DSP_WRITE_RELEASE, 1, 0,
                i % 2 ? "r" : NULL, i % 2);
    dsp_db_write(fx->db[0], o, N);
    assert_int_equal(dsp_db_pending_writes(fx->db[0]), N);
    dsp_db_stop(fx->db[0], 10000);
    assert_int_equal(dsp_db_pending_writes(fx->db[0]), 0);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 2"), N / 2);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 0"), N / 2);
    /* The lock is free again. */
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT IS_FREE_LOCK('taskpush.%s')", fx->tdb.name), 1);
    dsp_db_counters c;
    dsp_db_counters_get(fx->db[0], &c);
    assert_false(c.leader);
}

static void test_reconnect_keeps_epoch(void **state)
{
    struct fx *fx = *state;
    uint64_t x = ins(fx, "task_type", "'a'"), y = ins(fx, "task_type", "'a'");
    uint64_t holder, holder2;
    dsp_claim_reply *rep = NULL;
    dsp_db_counters c;

    uint32_t e = start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 1));
    holder = lock_holder(fx);
    assert_true(holder != TP_TESTDB_U64_ERR && holder != 0);
    assert_int_equal(tp_testdb_exec(&fx->tdb, "KILL CONNECTION %" PRIu64, holder), 0);

    /* The claim thread notices at its next statement, reconnects, takes the lock
     * back and finds the epoch unchanged. */
    WAIT_UNTIL(fx, (holder2 = lock_holder(fx)) != 0 && holder2 != TP_TESTDB_U64_ERR && holder2 != holder,
               WAIT_MS);
    assert_true(holder2 != holder && holder2 != 0);
    /* Claims may fail while it reconnects; then they work again. */
    int64_t dl = mono_ms() + WAIT_MS;
    for (;;) {
        const char *types[1] = {"a"};
        uint32_t limits[1] = {1};
        rep = claim(fx, 0, types, limits, 1, 1);
        if ((rep && rep->status == 0) || mono_ms() > dl)
            break;
        dsp_claim_reply_free(rep);
        rep = NULL;
        run_for(fx, 100);
    }
    assert_non_null(rep);
    assert_int_equal(rep->status, 0);
    assert_int_equal(rep->ntasks, 1);
    assert_int_equal(rep->tasks[0].task_id, y);
    dsp_claim_reply_free(rep);
    assert_int_equal(fx->rec[0].nlost, 0);
    assert_int_equal(fx->rec[0].nleader, 1);
    /* The first claim's row is still ours. */
    assert_int_equal(col_u64(fx, x, "task_state"), 1);
    assert_int_equal(col_u64(fx, x, "epoch"), e);
    dsp_db_counters_get(fx->db[0], &c);
    assert_true(c.reconnects >= 1);
    assert_int_equal(c.epoch, e);
}

static void test_leader_lost_when_epoch_moves(void **state)
{
    struct fx *fx = *state;
    uint64_t x = ins(fx, "task_type, max_attempts", "'a', 5");
    uint64_t got = 0;

    uint32_t e = start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 1));
    /* Kill the lock's connection and take the lock before the claim thread is back
     * (it needs a statement to notice, then a backoff); retried if it won the race. */
    for (int attempt = 0; attempt < 3 && got != 1; attempt++) {
        uint64_t holder = lock_holder(fx);
        assert_true(holder != TP_TESTDB_U64_ERR && holder != 0);
        assert_int_equal(tp_testdb_exec(&fx->tdb, "KILL CONNECTION %" PRIu64, holder), 0);
        got = tp_testdb_query_u64(&fx->tdb, "SELECT GET_LOCK('taskpush.%s', 5)", fx->tdb.name);
    }
    assert_int_equal(got, 1);
    /* Another dispatcher takes the table: a new epoch. */
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET value = value + 1 WHERE name = 'epoch'"), 1);
    WAIT_UNTIL(fx, fx->rec[0].nlost > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nlost, 1);
    assert_int_equal(fx->rec[0].nleader, 1);
    /* ... and goes away: ours again, with yet another epoch, after recovery. */
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT RELEASE_LOCK('taskpush.%s')", fx->tdb.name), 1);
    WAIT_UNTIL(fx, fx->rec[0].nleader > 1, WAIT_MS);
    assert_int_equal(fx->rec[0].nleader, 2);
    assert_true(fx->rec[0].epochs[1] > e + 1);
    assert_string_equal(fx->rec[0].events, "LXL");
    assert_int_equal(fx->rec[0].older_processing_at_leader, 0);
    /* The row claimed under the old epoch went back to NEW; it was never delivered (no
     * delivery was recorded), so no attempt is charged. */
    assert_int_equal(col_u64(fx, x, "task_state"), 0);
    assert_int_equal(col_u64(fx, x, "attempts"), 0);
}

/* The lease (db_lease.c): the row names the leader, its epoch and its connections; when
 * another holder takes the row, the leader steps down at its next renewal, claims are
 * refused and outcomes of its epoch are fenced; when that lease expires, it takes the
 * lease back with a new epoch and recovers its old rows. */
static void test_lease_lost_then_taken_back(void **state)
{
    struct fx *fx = *state;
    dsp_outcome o[1];
    dsp_db_counters c;
    uint64_t x = ins(fx, "task_type", "'a'");
    const char *types[1] = {"a"};
    uint32_t limits[1] = {1};
    dsp_claim_request req = {1, types, limits, 1, 0};

    uint32_t e = start_leader(fx, 5, 2000);
    dsp_claim_reply_free(claim1(fx, "a", 10));
    WAIT_UNTIL(fx, tp_testdb_query_u64(&fx->tdb, "SELECT value FROM taskpush_meta WHERE name = 'lease'") == e,
               WAIT_MS);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT value FROM taskpush_meta WHERE name = 'lease'"), e);
    /* The claim connection (the lock's holder) is among the recorded ones. */
    assert_int_equal(tp_testdb_query_u64(&fx->tdb,
                                         "SELECT LOCATE(CONCAT(' ', IS_USED_LOCK('taskpush.%s'), ' '),"
                                         " CONCAT(conns, ' ')) > 0 FROM taskpush_meta WHERE name = 'lease'",
                                         fx->tdb.name),
                     1);

    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE taskpush_meta SET holder = 42, conns = '',"
                                              " expires_ms = UNIX_TIMESTAMP(NOW(3)) * 1000 + 2500"
                                              " WHERE name = 'lease'"),
                     1);
    WAIT_UNTIL(fx, fx->rec[0].nlost > 0, WAIT_MS);
    assert_int_equal(fx->rec[0].nlost, 1);
    dsp_db_counters_get(fx->db[0], &c);
    assert_false(c.leader);
    assert_false(dsp_db_lease_valid(fx->db[0]));
    assert_int_equal(dsp_db_claim(fx->db[0], &req), -1);
    outcome(&o[0], x, DSP_WRITE_SUCCEEDED, 1, 0, "late", 4);
    write_wait(fx, o, 1);
    assert_int_equal(fx->rec[0].fenced, 1);
    assert_int_equal(fx->rec[0].written[DSP_WRITE_SUCCEEDED], 0);
    assert_int_equal(col_u64(fx, x, "task_state"), 1);

    WAIT_UNTIL(fx, fx->rec[0].nleader > 1, WAIT_MS);
    assert_int_equal(fx->rec[0].nleader, 2);
    assert_true(fx->rec[0].epochs[1] > e);
    assert_string_equal(fx->rec[0].events, "LXL");
    assert_int_equal(col_u64(fx, x, "task_state"), 0);
    assert_int_equal(col_u64(fx, x, "attempts"), 0);
    assert_true(dsp_db_lease_valid(fx->db[0]));
}

/* ---- the stats thread: table figures, retention, requeue ---- */

/* An epoch no dispatcher of these tests reaches: PROCESSING rows that recovery leaves. */
#define FAR_EPOCH "4000000000"

static void table_stats(struct fx *fx, dsp_table_stats *st)
{
    dsp_db_table_stats_get(fx->db[0], st);
}

/* Waits for a refresh that began after now (wall ms). */
static void wait_refresh_after(struct fx *fx, dsp_table_stats *st, int64_t after)
{
    WAIT_UNTIL(fx, (table_stats(fx, st), st->valid && st->refreshed_wall_ms > after), WAIT_MS);
    assert_true(st->valid);
    assert_true(st->refreshed_wall_ms > after);
}

static const dsp_table_type_stats *type_of(const dsp_table_stats *st, const char *t)
{
    for (size_t i = 0; i < st->ntypes; i++)
        if (strcmp(st->types[i].type, t) == 0)
            return &st->types[i];
    return NULL;
}

static void test_table_stats_figures(void **state)
{
    struct fx *fx = *state;
    int64_t now = tp_testdb_now_ms();
    const char *cols = "task_type, task_state, task_priority, `delayed`, run_after, insert_time, epoch";
    dsp_table_stats *st = malloc(sizeof *st);
    const dsp_table_type_stats *a, *b;

    assert_non_null(st);
    /* a: the head of (a, NORMAL) became due 60 s ago; a later row of it is older still
     * but not the head, so it does not count. */
    ins(fx, cols, "'a', 0, 1, 0, 0, %" PRId64 ", 0", now - 60000);
    ins(fx, cols, "'a', 0, 1, 0, 0, %" PRId64 ", 0", now - 1000);
    ins(fx, cols, "'a', 0, 1, 0, %" PRId64 ", %" PRId64 ", 0", now - 5000, now - 90000);
    ins(fx, cols, "'a', 0, 2, 0, 0, %" PRId64 ", 0", now - 2000);
    ins(fx, cols, "'a', 0, 2, 0, 0, %" PRId64 ", 0", now - 2000);
    ins(fx, cols, "'a', 0, 0, 0, 0, %" PRId64 ", 0", now - 3000);
    ins(fx, cols, "'a', 0, 1, 1, %" PRId64 ", %" PRId64 ", 0", now + HOUR_MS, now - 600000);
    ins(fx, cols, "'a', 0, 0, 1, %" PRId64 ", %" PRId64 ", 0", now + HOUR_MS, now - 600000);
    ins(fx, cols, "'a', 1, 1, 0, 0, %" PRId64 ", " FAR_EPOCH, now - 600000);
    ins(fx, cols, "'a', 3, 1, 0, 0, %" PRId64 ", 0", now - 600000);
    ins(fx, cols, "'a', 3, 2, 0, 0, %" PRId64 ", 0", now - 600000);
    /* b: due since 10 s ago by run_after, inserted earlier. */
    ins(fx, cols, "'b', 0, 1, 0, %" PRId64 ", %" PRId64 ", 0", now - 10000, now - 300000);
    ins(fx, cols, "'b', 3, 1, 0, 0, %" PRId64 ", 0", now);
    for (int i = 0; i < 4; i++)
        ins(fx, cols, "'b', 2, 1, 0, 0, %" PRId64 ", 0", now);
    for (int i = 0; i < 3; i++)
        ins(fx, cols, "'c', 2, 1, 0, 0, %" PRId64 ", 0", now);
    assert_int_equal(tp_rows_list_processing(&fx->tdb), 0); /* PROCESSING is counted from the lists */

    fx->table_stats_ms = 100;
    start_leader(fx, 5, 100);
    wait_refresh_after(fx, st, now - 1);
    assert_int_equal(st->by_state[0], 9);
    assert_int_equal(st->by_state[1], 1);
    assert_int_equal(st->by_state[2], 7);
    assert_int_equal(st->by_state[3], 3);
    assert_false(st->successful_capped);
    assert_int_equal(st->new_by_priority[0], 2);
    assert_int_equal(st->new_by_priority[1], 5);
    assert_int_equal(st->new_by_priority[2], 2);
    assert_int_equal(st->ntypes, 2); /* c has only SUCCESSFUL rows */
    assert_string_equal(st->types[0].type, "a");
    assert_string_equal(st->types[1].type, "b");
    a = type_of(st, "a");
    b = type_of(st, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->new_ready, 6);
    assert_int_equal(a->new_delayed, 2);
    assert_int_equal(a->processing, 1);
    assert_int_equal(a->failed, 2);
    assert_int_equal(b->new_ready, 1);
    assert_int_equal(b->new_delayed, 0);
    assert_int_equal(b->processing, 0);
    assert_int_equal(b->failed, 1);
    /* The oldest head is (a, NORMAL)'s: due 60 s before now. */
    assert_true(st->oldest_ready_age_ms >= 60000);
    assert_true(st->oldest_ready_age_ms < 60000 + WAIT_MS);
    assert_int_equal(st->retention_deleted_total, 0);
    free(st);
}

static void test_table_stats_refresh_follows_rows(void **state)
{
    struct fx *fx = *state;
    dsp_table_stats *st = malloc(sizeof *st);
    dsp_db_counters c0, c1;
    int64_t t;

    assert_non_null(st);
    fx->table_stats_ms = 50;
    start_leader(fx, 5, 100);
    wait_refresh_after(fx, st, 0);
    assert_int_equal(st->by_state[0] + st->by_state[1] + st->by_state[2] + st->by_state[3], 0);
    assert_int_equal(st->ntypes, 0);
    assert_int_equal(st->oldest_ready_age_ms, -1);

    t = tp_testdb_now_ms();
    ins(fx, "task_type, insert_time", "'x', %" PRId64, t - 30000);
    ins(fx, "task_type, insert_time", "'x', %" PRId64, t - 30000);
    ins(fx, "task_type, task_state", "'y', 3");
    WAIT_UNTIL(fx, (table_stats(fx, st), st->by_state[0] == 2 && st->by_state[3] == 1), WAIT_MS);
    assert_int_equal(st->by_state[0], 2);
    assert_int_equal(st->by_state[3], 1);
    assert_int_equal(st->ntypes, 2);
    assert_int_equal(type_of(st, "x")->new_ready, 2);
    assert_int_equal(type_of(st, "y")->failed, 1);
    assert_true(st->oldest_ready_age_ms >= 30000);

    /* Each refresh is a few statements (3 here: counts, SUCCESSFUL, oldest ready). */
    dsp_db_counters_get(fx->db[0], &c0);
    t = st->refreshed_wall_ms;
    wait_refresh_after(fx, st, t);
    t = st->refreshed_wall_ms;
    wait_refresh_after(fx, st, t);
    dsp_db_counters_get(fx->db[0], &c1);
    assert_true(c1.statements > c0.statements);

    /* The rows go: the figures follow. */
    assert_int_equal(tp_testdb_exec(&fx->tdb, "DELETE FROM task"), 3);
    WAIT_UNTIL(fx, (table_stats(fx, st), st->ntypes == 0), WAIT_MS);
    assert_int_equal(st->ntypes, 0);
    assert_int_equal(st->by_state[0], 0);
    assert_int_equal(st->oldest_ready_age_ms, -1);
    free(st);
}

/* Checks the plan of sql (EXPLAIN): every access to task uses claim_idx or group_idx
 * (or the primary key for one row), none reads the whole table or index, no temporary table or filesort; must_extra (or NULL) is in
 * the Extra of each. Returns the number of plan rows on task. */
static int check_plan(struct fx *fx, const char *sql, const char *must_extra)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    MYSQL_FIELD *f;
    int ctable = -1, ctype = -1, ckey = -1, cextra = -1, n = 0;
    char q[65536];

    snprintf(q, sizeof q, "EXPLAIN %s", sql);
    if (mysql_query(fx->tdb.conn, q) != 0)
        fail_msg("EXPLAIN failed: %s\n  %s", mysql_error(fx->tdb.conn), q);
    res = mysql_store_result(fx->tdb.conn);
    assert_non_null(res);
    f = mysql_fetch_fields(res);
    for (unsigned i = 0; i < mysql_num_fields(res); i++) {
        if (strcmp(f[i].name, "table") == 0)
            ctable = (int)i;
        else if (strcmp(f[i].name, "type") == 0)
            ctype = (int)i;
        else if (strcmp(f[i].name, "key") == 0)
            ckey = (int)i;
        else if (strcmp(f[i].name, "Extra") == 0)
            cextra = (int)i;
    }
    assert_true(ctable >= 0 && ctype >= 0 && ckey >= 0 && cextra >= 0);
    while ((row = mysql_fetch_row(res)) != NULL) {
        const char *extra = row[cextra] ? row[cextra] : "";
        fprintf(stderr, "# plan: table %s type %s key %s extra %s\n", row[ctable] ? row[ctable] : "-",
                row[ctype] ? row[ctype] : "-", row[ckey] ? row[ckey] : "-", extra);
        if (row[ctable] == NULL || strcmp(row[ctable], "task") != 0)
            continue; /* <derived2>, <union2,3>: a handful of rows already read */
        n++;
        assert_non_null(row[ctype]);
        assert_string_not_equal(row[ctype], "ALL");
        assert_string_not_equal(row[ctype], "index");
        assert_non_null(row[ckey]);
        /* group_idx: the keyed rows (version 12: claim_lane NULL for them unless FAILED);
         * PRIMARY: the one row a keyed oldest part looks up. */
        if (strcmp(row[ckey], "PRIMARY") == 0)
            assert_true(strcmp(row[ctype], "const") == 0 || strcmp(row[ctype], "eq_ref") == 0);
        else if (strcmp(row[ckey], "group_idx") != 0)
            assert_string_equal(row[ckey], "claim_idx");
        assert_null(strstr(extra, "filesort"));
        assert_null(strstr(extra, "temporary"));
        if (must_extra)
            assert_non_null(strstr(extra, must_extra));
    }
    mysql_free_result(res);
    return n;
}

static void test_table_stats_plans(void **state)
{
    struct fx *fx = *state;
    int64_t now = tp_testdb_now_ms();
    dsp_strbuf b = {0};
    char vals[512];

    /* 50,000 rows over 5 types, every state, priority and lane. */
    snprintf(vals, sizeof vals,
             "CONCAT('t', (a.d * 7 + b.d) %% 5), (a.d + c.d * 3 + e.d) %% 4, (b.d + d.d) %% 3,"
             " IF((a.d + c.d * 3 + e.d) %% 4 = 0 AND c.d < 3, 1, 0),"
             " IF((a.d + c.d * 3 + e.d) %% 4 = 0 AND c.d < 3, %" PRId64 ", 0), %" PRId64 ", %" PRId64
             ", " FAR_EPOCH,
             now + HOUR_MS, now - 60000, now - 60000);
    ins_many(fx, 50000, "task_type, task_state, task_priority, `delayed`, run_after, insert_time,"
                        " last_update_time, epoch", vals);
    /* A third of them with a key (version 12: in group_idx's lanes, claim_lane NULL but
     * FAILED), in every state: the figures count them too. */
    assert_int_equal(tp_testdb_exec(&fx->tdb, "UPDATE task SET group_key = CONCAT('k', task_id %% 7)"
                                              " WHERE task_id %% 3 = 0"),
                     tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_id %% 3 = 0"));
    assert_int_equal(tp_rows_list_processing(&fx->tdb), 0);
    assert_true(tp_testdb_exec(&fx->tdb, "ANALYZE TABLE task") >= 0);

    dsp_db_sql_stats_counts(&b, NULL, now, NULL);
    assert_false(b.oom);
    assert_int_equal(check_plan(fx, b.p, "Using index"), 2);

    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_successful(&b, NULL, DSP_DB_SQL_SUCCESSFUL_CAP, NULL);
    assert_int_equal(check_plan(fx, b.p, "Using index"), 2);

    dsp_strbuf_reset(&b);
    for (int t = 0; t < 5; t++) {
        char type[8];
        snprintf(type, sizeof type, "t%d", t);
        for (int p = 2; p >= 0; p--)
            dsp_db_sql_stats_oldest_part(&b, NULL, t == 0 && p == 2, type, strlen(type), p, now,
                                         false);
    }
    dsp_db_sql_stats_oldest_end(&b);
    assert_false(b.oom);
    assert_int_equal(check_plan(fx, b.p, NULL), 15);
    /* The keyed part: a range of group_idx and one row by primary key. */
    dsp_strbuf_reset(&b);
    dsp_db_sql_stats_oldest_part(&b, NULL, true, "t1", 2, 1, now, true);
    dsp_db_sql_stats_oldest_end(&b);
    assert_false(b.oom);
    assert_int_equal(check_plan(fx, b.p, NULL), 2);

    dsp_strbuf_reset(&b);
    dsp_db_sql_retention(&b, NULL, 2, false, now - HOUR_MS, 1000, NULL);
    assert_int_equal(check_plan(fx, b.p, NULL), 1);
    dsp_strbuf_reset(&b);
    dsp_db_sql_retention(&b, NULL, 2, true, now - HOUR_MS, 1000, NULL);
    assert_int_equal(check_plan(fx, b.p, NULL), 1);
    dsp_strbuf_reset(&b);
    dsp_db_sql_retention(&b, NULL, 3, false, now - HOUR_MS, 1000, NULL);
    assert_int_equal(check_plan(fx, b.p, NULL), 1);

    dsp_strbuf_reset(&b);
    dsp_db_sql_requeue_failed(&b, NULL, NULL, now, 5000, NULL);
    assert_int_equal(check_plan(fx, b.p, NULL), 1);
    dsp_strbuf_reset(&b);
    dsp_db_sql_requeue_failed(&b, NULL, "t1", now, 5000, NULL);
    assert_int_equal(check_plan(fx, b.p, NULL), 1);
    dsp_strbuf_free(&b);

    /* And the thread's figures agree with plain counts. */
    {
        dsp_table_stats *st = malloc(sizeof *st);
        assert_non_null(st);
        fx->table_stats_ms = 200;
        start_leader(fx, 5, 100);
        wait_refresh_after(fx, st, tp_testdb_now_ms());
        for (int s = 0; s < 4; s++)
            assert_int_equal(st->by_state[s],
                             tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = %d", s));
        assert_int_equal(st->ntypes, 5);
        assert_int_equal(type_of(st, "t3")->new_delayed,
                         tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = 0"
                                                       " AND task_type = 't3' AND run_after > %" PRId64, now));
        assert_true(st->oldest_ready_age_ms >= 60000);
        /* Each type's oldest ready row, and the overall one is the largest of them. */
        int64_t most = -1;
        for (size_t i = 0; i < st->ntypes; i++) {
            assert_true(st->types[i].oldest_ready_age_ms >= 60000);
            if (st->types[i].oldest_ready_age_ms > most)
                most = st->types[i].oldest_ready_age_ms;
        }
        assert_int_equal(most, st->oldest_ready_age_ms);
        free(st);
    }
}

/* The retention test's rows: old and recent rows of every state. */
static void retention_rows(struct fx *fx, int64_t now)
{
    const char *cols = "task_type, task_state, last_update_time, epoch";
    char vals[128];

    snprintf(vals, sizeof vals, "'s', 2, %" PRId64 ", 0", now - 2 * HOUR_MS);
    ins_many(fx, 2500, cols, vals); /* several batches */
    snprintf(vals, sizeof vals, "'f', 3, %" PRId64 ", 0", now - 2 * HOUR_MS);
    ins_many(fx, 1200, cols, vals);
    ins(fx, cols, "'s', 2, %" PRId64 ", 0", now - HOUR_MS / 2);
    ins(fx, cols, "'s', 2, %" PRId64 ", 0", now);
    ins(fx, cols, "'f', 3, %" PRId64 ", 0", now - HOUR_MS / 2);
    ins(fx, cols, "'n', 0, %" PRId64 ", 0", now - 2 * HOUR_MS);
    ins(fx, cols, "'p', 1, %" PRId64 ", " FAR_EPOCH, now - 2 * HOUR_MS);
    assert_int_equal(tp_rows_list_processing(&fx->tdb), 0);
}

static uint64_t count_state(struct fx *fx, int s)
{
    return tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_state = %d", s);
}

static void test_retention_succeeded(void **state)
{
    struct fx *fx = *state;
    dsp_table_stats *st = malloc(sizeof *st);

    assert_non_null(st);
    retention_rows(fx, tp_testdb_now_ms());
    fx->table_stats_ms = 100;
    fx->retain_succeeded_ms = HOUR_MS;
    start_leader(fx, 5, 100);
    WAIT_UNTIL(fx, (table_stats(fx, st), st->retention_deleted_total >= 2500), WAIT_MS);
    run_for(fx, 300); /* more rounds: nothing else goes */
    table_stats(fx, st);
    assert_int_equal(st->retention_deleted_total, 2500);
    assert_int_equal(count_state(fx, 2), 2);
    assert_int_equal(count_state(fx, 3), 1201);
    assert_int_equal(count_state(fx, 0), 1);
    assert_int_equal(count_state(fx, 1), 1);
    /* The figures saw it too. */
    WAIT_UNTIL(fx, (table_stats(fx, st), st->by_state[2] == 2), WAIT_MS);
    assert_int_equal(st->by_state[2], 2);
    free(st);
}

static void test_retention_failed(void **state)
{
    struct fx *fx = *state;
    dsp_table_stats *st = malloc(sizeof *st);

    assert_non_null(st);
    retention_rows(fx, tp_testdb_now_ms());
    fx->table_stats_ms = 0; /* retention alone: it still runs */
    fx->retain_failed_ms = HOUR_MS;
    start_leader(fx, 5, 100);
    WAIT_UNTIL(fx, (table_stats(fx, st), st->retention_deleted_total >= 1200), WAIT_MS);
    run_for(fx, 300);
    table_stats(fx, st);
    assert_int_equal(st->retention_deleted_total, 1200);
    assert_false(st->valid); /* no figures asked for */
    assert_int_equal(count_state(fx, 2), 2502);
    assert_int_equal(count_state(fx, 3), 1);
    assert_int_equal(count_state(fx, 0), 1);
    assert_int_equal(count_state(fx, 1), 1);
    free(st);
}

static void requeue_wait(struct fx *fx, const char *type, uint64_t id, int64_t rows)
{
    struct rec *r = &fx->rec[0];
    int before = r->nrequeued;

    assert_int_equal(dsp_db_requeue_failed(fx->db[0], type, id), 0);
    WAIT_UNTIL(fx, r->nrequeued > before, WAIT_MS);
    assert_int_equal(r->nrequeued, before + 1);
    assert_int_equal(r->requeue_id, id);
    assert_int_equal(r->requeue_rows, rows);
}

static void test_requeue_failed(void **state)
{
    struct fx *fx = *state;
    const char *cols = "task_type, task_state, attempts, max_attempts, `delayed`, run_after, err_msg";
    uint64_t a1, b1, s1, n1;
    int64_t later = tp_testdb_now_ms() + HOUR_MS;

    a1 = ins(fx, cols, "'a', 3, 3, 3, 1, %" PRId64 ", 'boom'", later);
    ins(fx, cols, "'a', 3, 3, 3, 0, 0, 'boom'");
    ins(fx, cols, "'a', 3, 2, 3, 0, 0, NULL");
    b1 = ins(fx, cols, "'b', 3, 3, 3, 0, 0, 'bad'");
    ins(fx, cols, "'b', 3, 3, 3, 0, 0, 'bad'");
    s1 = ins(fx, cols, "'a', 2, 1, 3, 0, 0, NULL");
    n1 = ins(fx, cols, "'a', 0, 2, 3, 0, 0, 'retrying'");
    ins_many(fx, 6000, cols, "'c', 3, 3, 3, 0, 0, 'many'"); /* more than one batch */

    start_leader(fx, 5, 100);
    requeue_wait(fx, "a", 7, 3);
    assert_int_equal(tp_testdb_query_u64(&fx->tdb, "SELECT COUNT(*) FROM task WHERE task_type = 'a'"
                                                   " AND task_state = 0 AND attempts = 0 AND `delayed` = 0"
                                                   " AND run_after = 0"),
                     3);
    {
        char buf[64];
        assert_int_equal(query_str(fx, buf, sizeof buf, "SELECT err_msg FROM task WHERE task_id = %" PRIu64, a1), 4);
        assert_string_equal(buf, "boom");
    }
    assert_int_equal(col_u64(fx, b1, "task_state"), 3);
    assert_int_equal(col_u64(fx, s1, "task_state"), 2);
    assert_int_equal(col_u64(fx, n1, "attempts"), 2); /* NEW rows are not touched */
    assert_int_equal(count_state(fx, 3), 6002);

    requeue_wait(fx, "nosuchtype", 8, 0);
    requeue_wait(fx, NULL, 9, 6002);
    assert_int_equal(count_state(fx, 3), 0);
    assert_int_equal(col_u64(fx, b1, "attempts"), 0);
    assert_int_equal(col_u64(fx, s1, "task_state"), 2);
    requeue_wait(fx, NULL, 10, 0);

    /* After stop, a request is answered -1 at once. */
    dsp_db_stop(fx->db[0], 2000);
    requeue_wait(fx, NULL, 11, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(test_leader_takes_epoch),
        T(test_second_dispatcher_waits),
        T(test_unknown_schema_version_is_fatal),
        T(test_schema_read_again_after_the_lock),
        T(test_missing_schema_is_retried),
        T(test_recovery_before_leader),
        T(test_recovery_in_batches),
        T(test_recovery_hostile_lists),
        T(test_claim_order_and_limits),
        T(test_claim_fields_and_binary_payload),
        T(test_claim_skips_locked_rows),
        T(test_claim_leaves_padded_type),
        T(test_claim_rules),
        T(test_claim_split_with_helper),
        T(test_claim_helper_connection_killed),
        T(test_claim_split_off),
        T(test_write_succeeded),
        T(test_write_failed_retry_release),
        T(test_write_per_row_values),
        T(test_write_3000_in_few_statements),
        T(test_write_distinct_results),
        T(test_write_fenced),
        T(test_write_invalid_utf8_and_long_text),
        T(test_write_survives_lost_connection),
        T(test_retry_is_promoted_when_due),
        T(test_future_row_is_demoted),
        T(test_stop_writes_everything),
        T(test_reconnect_keeps_epoch),
        T(test_leader_lost_when_epoch_moves),
        T(test_lease_lost_then_taken_back),
        T(test_table_stats_figures),
        T(test_table_stats_refresh_follows_rows),
        T(test_table_stats_plans),
        T(test_retention_succeeded),
        T(test_retention_failed),
        T(test_requeue_failed),
#undef T
    };
    int rc;

    if (evthread_use_pthreads() < 0 || mysql_library_init(0, NULL, NULL) != 0) {
        fprintf(stderr, "cannot initialise libevent threads or the MySQL library\n");
        return 1;
    }
    if (getenv("TP_TEST_FILTER"))
        cmocka_set_test_filter(getenv("TP_TEST_FILTER"));
    rc = cmocka_run_group_tests_name("db", tests, NULL, NULL);
    mysql_library_end();
    return rc;
}
