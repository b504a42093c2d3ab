/* db_schedule.c: the schedule thread of periodic tasks (docs/producers.md, "Periodic
 * tasks"). On a connection of its own (not the claim connection: a round never delays a
 * claim), every second it reads task_schedule for GET /schedules, and while this process
 * leads the table (holds the lease, valid on its monotonic clock) it inserts each due
 * run into task with INSERT IGNORE and the dedup_key 'schedule:<name>:<due ms>', then
 * advances next_run with a compare-and-set on its old value. So a run is inserted once
 * however many dispatchers, restarts or takeovers: a second insert of the same due time
 * hits the unique dedup_key, and a stale next_run cannot be written over a newer one.
 * Times are the database's clock (NOW(3)), the same for every dispatcher. */
#include "db_internal.h"

#include "log.h"
#include "cron.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_TICK_MS 100      /* how often leadership and due times are looked at */
#define SCHED_LIST_MS 1000     /* the listing's refresh, and the longest a new schedule waits */
#define SCHED_ROUND_MAX 100    /* schedules handled per round (the earliest due first) */
#define SCHED_RUNS_MAX 1000    /* due runs one schedule inserts per round (catch_up_max's cap) */
#define SCHED_BAD_RETRY_MS 3600000 /* a schedule whose cron is bad or never matches: looked at again */

struct sched_ctx {
    dsp_db *db;
    struct dbconn c;
    dsp_strbuf sql;
    int64_t next_connect;  /* monotonic */
    int64_t next_round;    /* monotonic: the earliest next_run, or SCHED_LIST_MS ahead */
    int64_t next_list;     /* monotonic */
    uint64_t inserted;
    int64_t due[SCHED_RUNS_MAX];
};

static bool sched_stopping(dsp_db *db)
{
    pthread_mutex_lock(&db->mu);
    bool s = db->sched_stop;
    pthread_mutex_unlock(&db->mu);
    return s;
}

static bool leading(dsp_db *db)
{
    return atomic_load(&db->leader) && dsp_db_lease_valid(db);
}

/* A failed statement: a lost connection is closed (reconnected after a backoff). */
static void sched_failed(struct sched_ctx *x)
{
    if (x->c.m && dsp_dbi_error_is_transient(x->c.err)) {
        dsp_dbi_conn_close(&x->c);
        x->next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&x->c);
    }
}

static MYSQL_RES *sched_query(struct sched_ctx *x, const char *sql, size_t len)
{
    MYSQL_RES *res;
    atomic_fetch_add_explicit(&x->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, sql, (unsigned long)len) != 0 || (res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(x->db->log, "schedule connection: %s (error %u) in: %.160s",
                 x->c.err ? mysql_error(x->c.m) : "no result", x->c.err, sql);
        sched_failed(x);
        return NULL;
    }
    return res;
}

static int64_t field_i64(const char *v)
{
    return v ? strtoll(v, NULL, 10) : 0;
}

/* The database's clock in ms since 1970; -1 on error. */
static int64_t db_now_ms(struct sched_ctx *x)
{
    static const char q[] = "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";
    MYSQL_RES *res = sched_query(x, q, sizeof q - 1);
    if (!res)
        return -1;
    MYSQL_ROW row = mysql_fetch_row(res);
    int64_t now = row && row[0] ? field_i64(row[0]) : -1;
    mysql_free_result(res);
    return now;
}

/* Inserts the due runs of schedule id (n > 0 of them, ascending) and moves its next_run
 * from old to next. The INSERT copies type, priority and payload inside the server. */
static void sched_fire(struct sched_ctx *x, uint64_t id, const char *name, int64_t old, int64_t next,
                       size_t n)
{
    dsp_strbuf *b = &x->sql;
    uint64_t rows = 0, moved = 0;
    dsp_strbuf_reset(b);
    dsp_strbuf_printf(
        b,
        "INSERT IGNORE INTO %s (task_type, task_priority, payload, dedup_key, run_after)"
        " SELECT s.task_type, s.task_priority, s.payload,"
        " CONCAT('schedule:', s.name, ':', d.due), d.due FROM %s s JOIN (",
        x->db->names.task, x->db->names.schedule);
    for (size_t i = 0; i < n; i++)
        dsp_strbuf_printf(b, "%sSELECT %" PRId64 " AS due", i ? " UNION ALL " : "", x->due[i]);
    dsp_strbuf_printf(b, ") d WHERE s.schedule_id = %" PRIu64, id);
    if (b->oom || !leading(x->db))
        return;
    if (dsp_dbi_exec(&x->c, b->p, b->len, &rows) < 0) {
        sched_failed(x);
        return;
    }
    x->inserted += rows;
    char upd[160 + DSP_TABLE_IDENT_CAP];
    int ul = snprintf(upd, sizeof upd,
                      "UPDATE %s SET next_run = %" PRId64 " WHERE schedule_id = %" PRIu64
                      " AND next_run = %" PRId64,
                      x->db->names.schedule, next, id, old);
    if (dsp_dbi_exec(&x->c, upd, (size_t)ul, &moved) < 0) {
        sched_failed(x);
        return;
    }
    log_debug(x->db->log, "schedule %s: %" PRIu64 " of %zu due runs inserted, next run %" PRId64 "%s", name,
              rows, n, next, moved ? "" : " (another dispatcher moved it first)");
}

/* Moves a schedule nothing is inserted for: a new one (next_run 0), or one whose cron
 * is bad or never matches again (looked at again in SCHED_BAD_RETRY_MS). */
static void sched_move(struct sched_ctx *x, uint64_t id, int64_t old, int64_t next)
{
    char upd[160 + DSP_TABLE_IDENT_CAP];
    int ul = snprintf(upd, sizeof upd,
                      "UPDATE %s SET next_run = %" PRId64 " WHERE schedule_id = %" PRIu64
                      " AND next_run = %" PRId64,
                      x->db->names.schedule, next, id, old);
    if (dsp_dbi_exec(&x->c, upd, (size_t)ul, NULL) < 0)
        sched_failed(x);
}

/* One schedule row of the round: schedule_id, name, interval_ms, cron, missed,
 * catch_up_max, next_run. */
static void sched_one(struct sched_ctx *x, MYSQL_ROW row, int64_t now)
{
    uint64_t id = strtoull(row[0], NULL, 10);
    const char *name = row[1] ? row[1] : "";
    int64_t next_run = field_i64(row[6]);
    dsp_sched_rule rule = {.interval_ms = row[2] ? field_i64(row[2]) : 0};
    const char *why = NULL;
    if (rule.interval_ms <= 0 && (!row[3] || dsp_cron_parse(row[3], &rule.cron, &why) < 0)) {
        log_warn(x->db->log, "schedule %s: cron '%s': %s; looked at again in an hour (set next_run = 0 after a fix)",
                 name, row[3] ? row[3] : "", why ? why : "neither interval_ms nor cron");
        sched_move(x, id, next_run, now + SCHED_BAD_RETRY_MS);
        return;
    }
    bool catch_up = row[4] && strcmp(row[4], "catch-up") == 0;
    int64_t cmax = field_i64(row[5]);
    uint32_t max_catch_up = cmax < 1 ? 1 : cmax > SCHED_RUNS_MAX ? SCHED_RUNS_MAX : (uint32_t)cmax;
    size_t n;
    int64_t next;
    dsp_sched_due(&rule, next_run, now, catch_up, max_catch_up, x->due, SCHED_RUNS_MAX, &n, &next);
    if (next < 0) {
        log_warn(x->db->log, "schedule %s: its cron matches no time in the next 8 years", name);
        next = now + SCHED_BAD_RETRY_MS;
    }
    if (n == 0)
        sched_move(x, id, next_run, next);
    else
        sched_fire(x, id, name, next_run, next, n);
}

/* The leader's round: the due schedules, the earliest first; then when the next is due. */
static void sched_round(struct sched_ctx *x)
{
    int64_t now = db_now_ms(x);
    if (now < 0)
        return;
    char q[256 + DSP_TABLE_IDENT_CAP];
    int ql = snprintf(q, sizeof q,
                      "SELECT schedule_id, name, interval_ms, cron, missed, catch_up_max, next_run"
                      " FROM %s WHERE next_run <= %" PRId64 " ORDER BY next_run LIMIT %d",
                      x->db->names.schedule, now, SCHED_ROUND_MAX);
    MYSQL_RES *res = sched_query(x, q, (size_t)ql);
    if (!res)
        return;
    size_t handled = 0;
    for (MYSQL_ROW row; (row = mysql_fetch_row(res)) && x->c.m && leading(x->db); handled++)
        if (row[0] && row[6])
            sched_one(x, row, now);
    mysql_free_result(res);
    if (handled == SCHED_ROUND_MAX) {
        x->next_round = 0; /* more are due: the next tick goes on */
        return;
    }
    if (!x->c.m)
        return;
    char qmin[32 + DSP_TABLE_IDENT_CAP];
    snprintf(qmin, sizeof qmin, "SELECT MIN(next_run) FROM %s", x->db->names.schedule);
    uint64_t first = 0;
    bool isnull = false;
    int64_t wait = SCHED_LIST_MS;
    if (dsp_dbi_query_u64(&x->c, qmin, &first, &isnull, 0) == 0 && !isnull && first <= INT64_MAX) {
        int64_t until = (int64_t)first - db_now_ms(x);
        if (until < wait)
            wait = until < 0 ? 0 : until;
    }
    x->next_round = dsp_now_ms() + wait;
}

static void row_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

/* Reads the listing (by name, at most DSP_SCHEDULES_LISTED) and publishes it. */
static void sched_list(struct sched_ctx *x)
{
    char q[256 + DSP_TABLE_IDENT_CAP];
    int ql = snprintf(
        q, sizeof q,
        "SELECT name, task_type, interval_ms, cron, missed, catch_up_max, task_priority, next_run"
        " FROM %s ORDER BY name LIMIT %d",
        x->db->names.schedule, DSP_SCHEDULES_LISTED + 1);
    MYSQL_RES *res = sched_query(x, q, (size_t)ql);
    if (!res)
        return;
    uint64_t rows = (uint64_t)mysql_num_rows(res);
    size_t n = rows > DSP_SCHEDULES_LISTED ? DSP_SCHEDULES_LISTED : (size_t)rows;
    dsp_schedule_list *l = calloc(1, sizeof *l + n * sizeof l->rows[0]);
    if (!l) {
        mysql_free_result(res);
        return;
    }
    MYSQL_ROW row;
    while (l->n < n && (row = mysql_fetch_row(res))) {
        dsp_schedule_row *r = &l->rows[l->n++];
        row_copy(r->name, sizeof r->name, row[0]);
        row_copy(r->type, sizeof r->type, row[1]);
        r->interval_ms = row[2] ? field_i64(row[2]) : 0;
        row_copy(r->cron, sizeof r->cron, row[3]);
        r->catch_up = row[4] && strcmp(row[4], "catch-up") == 0;
        int64_t cmax = field_i64(row[5]), prio = field_i64(row[6]);
        r->catch_up_max = cmax < 0 ? 0 : cmax > UINT32_MAX ? UINT32_MAX : (uint32_t)cmax;
        r->priority = (uint8_t)(prio < 0 ? 0 : prio > 2 ? 2 : prio);
        r->next_run = field_i64(row[7]);
    }
    mysql_free_result(res);
    l->valid = true;
    l->cut = rows > n;
    l->read_wall_ms = dsp_wall_ms();
    l->inserted_total = x->inserted;
    pthread_mutex_lock(&x->db->mu);
    dsp_schedule_list *old = x->db->schedules;
    x->db->schedules = l;
    pthread_mutex_unlock(&x->db->mu);
    free(old);
}

/* One wake-up: connect when due, the leader's round when due, the listing when due. */
static void sched_tick(struct sched_ctx *x)
{
    int64_t now = dsp_now_ms();
    bool lead = leading(x->db);
    bool round = lead && now >= x->next_round, list = now >= x->next_list;
    if (!round && !list)
        return;
    if (dsp_dbi_conn_stale(&x->c))
        dsp_dbi_conn_close(&x->c); /* off to the server in use */
    if (!x->c.m) {
        if (now < x->next_connect)
            return;
        if (dsp_dbi_conn_open(&x->c, true, false) < 0) {
            x->next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&x->c);
            return;
        }
    }
    if (round) {
        x->next_round = now + SCHED_LIST_MS; /* sched_round sets it earlier when due */
        sched_round(x);
    }
    if (list && x->c.m) {
        x->next_list = now + SCHED_LIST_MS;
        sched_list(x);
    }
    if (!lead)
        x->next_round = 0; /* a new leader looks at once */
}

void *dsp_dbi_sched_main(void *arg)
{
    dsp_db *db = arg;
    struct sched_ctx *x = calloc(1, sizeof *x);
    mysql_thread_init();
    if (!x) {
        log_error(db->log, "schedule thread: out of memory; no periodic tasks");
        mysql_thread_end();
        return NULL;
    }
    x->db = db;
    x->c.db = db;
    x->c.who = "schedule";
    x->c.rng = (uint64_t)dsp_now_us() * 0xD1B54A32D192ED03ULL ^ (uint64_t)(uintptr_t)x;
    if (x->c.rng == 0)
        x->c.rng = 1;
    while (!sched_stopping(db)) {
        sched_tick(x);
        pthread_mutex_lock(&db->mu);
        if (!db->sched_stop)
            cond_wait_until(&db->sched_cv, &db->mu, dsp_now_ms() + SCHED_TICK_MS);
        pthread_mutex_unlock(&db->mu);
    }
    dsp_dbi_conn_close(&x->c);
    dsp_strbuf_free(&x->sql);
    free(x);
    mysql_thread_end();
    return NULL;
}

dsp_schedule_list *dsp_db_schedules_get(dsp_db *db)
{
    if (!db)
        return NULL;
    pthread_mutex_lock(&db->mu);
    const dsp_schedule_list *l = db->schedules;
    size_t size = sizeof *l + (l ? l->n * sizeof l->rows[0] : 0);
    dsp_schedule_list *copy = malloc(size);
    if (copy) {
        if (l)
            memcpy(copy, l, size);
        else
            memset(copy, 0, size);
    }
    pthread_mutex_unlock(&db->mu);
    return copy;
}
