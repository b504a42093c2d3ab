/* designs_poll.c: the designs taskpush replaces, each client a thread with its own
 * connection, all in autocommit unless a transaction is spelled out.
 *
 *   cas, cas-backoff  SELECT the first NEW row, then UPDATE it to PROCESSING only if
 *                     still NEW (a miss: someone else got it; retry, with a 1-10 ms
 *                     sleep for cas-backoff); run; UPDATE to SUCCESSFUL.
 *   skiplocked-B      BEGIN; SELECT B rows FOR UPDATE SKIP LOCKED; UPDATE them to
 *                     PROCESSING; COMMIT; run; one UPDATE to SUCCESSFUL for all B.
 *   ceiling           skiplocked-1000 on one connection: the database's own limit.
 *
 * Every SELECT names the claim index's equality prefix (claim_lane, `delayed`,
 * task_type; claim_lane 0 is NEW, docs/schema.md) and its order, as a poller written for
 * this schema would: without it every claim sorts the NEW rows and every design is ten
 * times slower, and a locking one locks every row it scans. The claim also counts
 * attempts, so that verify.c can check each row was claimed once.
 *
 * A design that collapses (skiplocked-1 at K=256 did 0.1 rows a second at the end of a
 * drain, its 256 clients spinning over the last locked rows) would hold the whole
 * comparison for an hour: past --poll-seconds each client finishes the claim it holds
 * and stops, and the run's figures are over the rows done (verify.c checks those, and
 * that the others were never touched). A claim statement still running CUT_GRACE_S
 * later (one took two more minutes) is interrupted with KILL QUERY ID, by its query id
 * so that nothing else is hit; its transaction rolls back and its rows stay NEW. */
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CLAIM_WHERE                                                                         \
    "FROM task WHERE claim_lane = 0 AND `delayed` = 0 AND task_type = 'default'"          \
    " ORDER BY task_priority DESC, task_id"

/* Deadlock and lock wait timeout: the statement (or transaction) is retried. */
#define ER_LOCK_WAIT 1205
#define ER_DEADLOCK 1213
#define ER_QUERY_INTERRUPTED 1317
#define MAX_RETRIES 20
/* Past the cut, claims still running after this are interrupted, again every second. */
#define CUT_GRACE_S 2.0

/* The claims' statements as the processlist shows them (KILL QUERY ID picks them). */
#define CLAIM_SELECT_LIKE "SELECT task_id FROM task WHERE claim_lane = 0%"
#define CLAIM_UPDATE_LIKE "UPDATE task SET task_state = 1, attempts = attempts + 1 WHERE %"

typedef struct poller {
    bench_ctx *ctx;
    const bench_design *d;
    MYSQL *conn;
    pthread_t thr;
    bench_lat lat;
    uint64_t *ids;     /* the claimed batch */
    char *sql;         /* room for a statement with d->batch ids */
    size_t sqlcap;
    unsigned seed;
    unsigned long conn_id; /* the server's id of conn */
} poller;

int bench_lat_add(bench_lat *l, double us)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        double *v = realloc(l->v, cap * sizeof *v);
        if (v == NULL)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = us;
    return 0;
}

void bench_lat_free(bench_lat *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_lat_pct(bench_lat *l, double p)
{
    if (l->n == 0)
        return 0;
    qsort(l->v, l->n, sizeof *l->v, cmp_double);
    size_t i = (size_t)(p / 100.0 * (double)(l->n - 1) + 0.5);
    return l->v[i < l->n ? i : l->n - 1] / 1000.0;
}

static bool retryable(MYSQL *m)
{
    unsigned e = mysql_errno(m);
    return e == ER_LOCK_WAIT || e == ER_DEADLOCK;
}

static bool out_of_time(poller *p);

/* A claim statement that failed past the cut: interrupted there (or retried into it).
 * The run is cut, not failed. */
static bool stopped_at_cut(poller *p)
{
    if (!out_of_time(p))
        return false;
    if (mysql_errno(p->conn) == ER_QUERY_INTERRUPTED)
        atomic_fetch_add(&p->ctx->tally.interrupted, 1);
    return mysql_errno(p->conn) == ER_QUERY_INTERRUPTED || retryable(p->conn);
}

/* One autocommit statement, retried on a deadlock or lock wait timeout. A claim's stops
 * quietly past the cut; an outcome's always goes on (its row ran). Returns the affected
 * rows, or -1 (the tally says why, unless the claim stopped at the cut). */
static int exec_retry(poller *p, const char *sql, bool claim)
{
    for (int i = 0; i < MAX_RETRIES; i++) {
        int n = bench_db_exec(p->conn, sql);
        if (n >= 0)
            return n;
        if (claim && stopped_at_cut(p))
            return -1;
        if (!retryable(p->conn))
            break;
    }
    bench_tally_fail(&p->ctx->tally, "%s: %s", p->d->name, mysql_error(p->conn));
    return -1;
}

/* Reads up to max ids from the result of sql. Returns how many, or -1. */
static int select_ids(poller *p, const char *sql, uint64_t *ids, unsigned max)
{
    if (mysql_query(p->conn, sql) != 0)
        return -1;
    MYSQL_RES *res = mysql_store_result(p->conn);
    if (res == NULL)
        return -1;
    int n = 0;
    MYSQL_ROW row;
    while ((row = mysql_fetch_row(res)) != NULL && (unsigned)n < max)
        if (row[0] != NULL)
            ids[n++] = strtoull(row[0], NULL, 10);
    mysql_free_result(res);
    return n;
}

/* "UPDATE task SET task_state = S[, attempts...] WHERE task_id IN (ids)" into p->sql. */
static const char *update_in(poller *p, int state, const uint64_t *ids, int n)
{
    size_t len = (size_t)snprintf(p->sql, p->sqlcap, "UPDATE task SET task_state = %d%s WHERE task_id IN (",
                                  state, state == 1 ? ", attempts = attempts + 1" : "");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(p->sql + len, p->sqlcap - len, "%s%" PRIu64, i ? "," : "", ids[i]);
    snprintf(p->sql + len, p->sqlcap - len, ")");
    return p->sql;
}

/* Past the run's deadline: this client takes no new claim, and the run is cut. */
static bool out_of_time(poller *p)
{
    if (p->ctx->poll_deadline <= 0 || bench_now() < p->ctx->poll_deadline)
        return false;
    atomic_store(&p->ctx->tally.cut, 1);
    return true;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* cas and cas-backoff. Returns when the SELECT finds no NEW row. */
static void run_cas(poller *p)
{
    bench_tally *t = &p->ctx->tally;
    char sql[256];
    for (;;) {
        double t0 = bench_now();
        uint64_t id;
        for (;;) {
            if (out_of_time(p))
                return;
            int n = select_ids(p, "SELECT task_id " CLAIM_WHERE " LIMIT 1", &id, 1);
            if (n < 0) {
                if (!stopped_at_cut(p))
                    bench_tally_fail(t, "%s: %s", p->d->name, mysql_error(p->conn));
                return;
            }
            if (n == 0)
                return;
            snprintf(sql, sizeof sql, "UPDATE task SET task_state = 1, attempts = attempts + 1"
                     " WHERE task_id = %" PRIu64 " AND task_state = 0", id);
            int got = exec_retry(p, sql, true);
            if (got < 0)
                return;
            if (got == 1)
                break;
            atomic_fetch_add_explicit(&t->misses, 1, memory_order_relaxed);
            if (p->d->backoff)
                sleep_ms(1 + (unsigned)(rand_r(&p->seed) % 10));
        }
        bench_lat_add(&p->lat, (bench_now() - t0) * 1e6);
        bench_tally_ran(t, id);
        snprintf(sql, sizeof sql, "UPDATE task SET task_state = 2 WHERE task_id = %" PRIu64, id);
        if (exec_retry(p, sql, false) < 0)
            return;
    }
}

/* One SKIP LOCKED claim transaction: the ids in p->ids, their count, or -1. */
static int claim_skiplocked(poller *p)
{
    char sel[256];
    snprintf(sel, sizeof sel, "SELECT task_id " CLAIM_WHERE " LIMIT %u FOR UPDATE SKIP LOCKED",
             p->d->batch);
    for (int attempt = 0; attempt < MAX_RETRIES; attempt++) {
        int n;
        if (bench_db_exec(p->conn, "BEGIN") < 0 ||
            (n = select_ids(p, sel, p->ids, p->d->batch)) < 0 ||
            (n > 0 && bench_db_exec(p->conn, update_in(p, 1, p->ids, n)) != n) ||
            bench_db_exec(p->conn, "COMMIT") < 0) {
            if (stopped_at_cut(p)) {
                bench_db_exec(p->conn, "ROLLBACK");
                return 0;
            }
            bool again = retryable(p->conn);
            if (!again && mysql_errno(p->conn) == 0)
                bench_tally_fail(&p->ctx->tally, "%s: the claim UPDATE missed rows it locked",
                                 p->d->name);
            else if (!again)
                bench_tally_fail(&p->ctx->tally, "%s: %s", p->d->name, mysql_error(p->conn));
            bench_db_exec(p->conn, "ROLLBACK");
            if (!again)
                return -1;
            continue;
        }
        return n;
    }
    bench_tally_fail(&p->ctx->tally, "%s: %d deadlocks in a row", p->d->name, MAX_RETRIES);
    return -1;
}

/* skiplocked-B and ceiling. An empty claim means every NEW row is gone or locked by
 * another claimer, which will take it: this client is done. */
static void run_skiplocked(poller *p)
{
    for (;;) {
        if (out_of_time(p))
            return;
        double t0 = bench_now();
        int n = claim_skiplocked(p);
        if (n <= 0)
            return;
        bench_lat_add(&p->lat, (bench_now() - t0) * 1e6);
        for (int i = 0; i < n; i++)
            bench_tally_ran(&p->ctx->tally, p->ids[i]);
        if (exec_retry(p, update_in(p, 2, p->ids, n), false) < 0)
            return;
    }
}

static void *poller_main(void *arg)
{
    poller *p = arg;
    if (p->d->cas)
        run_cas(p);
    else
        run_skiplocked(p);
    return NULL;
}

/* KILL QUERY ID for each claim statement of these clients still running. MariaDB's
 * syntax; elsewhere it fails and the claims finish as they would. */
static void interrupt_claims(bench_ctx *ctx, const poller *ps, unsigned k)
{
    size_t cap = 256 + (size_t)k * 24, len;
    char *sql = malloc(cap);
    if (sql == NULL)
        return;
    len = (size_t)snprintf(sql, cap, "SELECT QUERY_ID FROM information_schema.PROCESSLIST WHERE ID IN (");
    for (unsigned i = 0; i < k; i++)
        len += (size_t)snprintf(sql + len, cap - len, "%s%lu", i ? "," : "", ps[i].conn_id);
    snprintf(sql + len, cap - len, ") AND (INFO LIKE '%s' OR INFO LIKE '%s')", CLAIM_SELECT_LIKE,
             CLAIM_UPDATE_LIKE);
    MYSQL_RES *res = mysql_query(ctx->admin, sql) == 0 ? mysql_store_result(ctx->admin) : NULL;
    MYSQL_ROW row;
    while (res && (row = mysql_fetch_row(res)) != NULL) {
        char kill[64];
        if (row[0] == NULL)
            continue;
        snprintf(kill, sizeof kill, "KILL QUERY ID %llu", strtoull(row[0], NULL, 10));
        (void)mysql_query(ctx->admin, kill); /* it may have ended meanwhile */
    }
    if (res)
        mysql_free_result(res);
    free(sql);
}

/* --hold-row: the last NEW row in dispatch order, locked until the clients have
 * stopped, so that CAS clients wait on it past the cut (the test of the interruption). */
static MYSQL *hold_row(bench_ctx *ctx)
{
    MYSQL *m = bench_db_connect(&ctx->o->db, ctx->o->db.dbname);
    uint64_t id = 0;
    if (m == NULL)
        return NULL;
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    char sql[128];
    if (bench_db_exec(m, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") >= 0 &&
        mysql_query(m, "SELECT MAX(task_id) FROM task WHERE task_priority = "
                       "(SELECT MIN(task_priority) FROM task)") == 0 &&
        (res = mysql_store_result(m)) != NULL && (row = mysql_fetch_row(res)) != NULL && row[0])
        id = strtoull(row[0], NULL, 10);
    if (res)
        mysql_free_result(res);
    snprintf(sql, sizeof sql, "SELECT task_id FROM task WHERE task_id = %" PRIu64 " FOR UPDATE", id);
    if (id == 0 || bench_db_exec(m, "BEGIN") < 0 || mysql_query(m, sql) != 0 ||
        (res = mysql_store_result(m)) == NULL) {
        bench_tally_fail(&ctx->tally, "--hold-row: %s", mysql_error(m));
        mysql_close(m);
        return NULL;
    }
    mysql_free_result(res);
    return m;
}

static void pollers_free(poller *ps, unsigned k)
{
    for (unsigned i = 0; i < k; i++) {
        if (ps[i].conn)
            mysql_close(ps[i].conn);
        bench_lat_free(&ps[i].lat);
        free(ps[i].ids);
        free(ps[i].sql);
    }
    free(ps);
}

int bench_drain_poll(bench_ctx *ctx, const bench_design *d, unsigned k, bench_run *r)
{
    int rc = -1;
    unsigned started = 0;
    bench_snap a, b;
    bench_lat all = {0};
    MYSQL *held = NULL; /* --hold-row */
    poller *ps = calloc(k, sizeof *ps);
    if (ps == NULL)
        return -1;
    /* Connections are opened before the clock starts: a pool is already open. */
    for (unsigned i = 0; i < k; i++) {
        poller *p = &ps[i];
        p->ctx = ctx;
        p->d = d;
        p->seed = 0x9e3779b9u * (i + 1);
        p->sqlcap = 96 + (size_t)d->batch * 22;
        p->sql = malloc(p->sqlcap);
        p->ids = calloc(d->batch, sizeof *p->ids);
        p->conn = bench_db_connect(&ctx->o->db, ctx->o->db.dbname);
        if (p->sql == NULL || p->ids == NULL || p->conn == NULL)
            goto done;
        p->conn_id = mysql_thread_id(p->conn);
    }
    if (ctx->o->hold_row && (held = hold_row(ctx)) == NULL)
        goto done;
    if (bench_snap_take(ctx, 0, &a) < 0)
        goto done;
    ctx->poll_deadline = d->polling && ctx->o->poll_seconds ? a.t + ctx->o->poll_seconds : 0;
    for (; started < k; started++)
        if (pthread_create(&ps[started].thr, NULL, poller_main, &ps[started]) != 0) {
            bench_tally_fail(&ctx->tally, "cannot start thread %u", started);
            break;
        }
    /* Joined as each ends (the run's time is read right after); past the cut and its
     * grace, the claims still running are interrupted, again every second. */
    double next_kill = ctx->poll_deadline + CUT_GRACE_S;
    for (unsigned i = 0; i < started;) {
        if (ctx->poll_deadline <= 0) {
            pthread_join(ps[i++].thr, NULL);
            continue;
        }
        struct timespec until;
        double wait = next_kill - bench_now();
        clock_gettime(CLOCK_REALTIME, &until);
        if (wait > 0) {
            long long ns = (long long)until.tv_nsec + (long long)(wait * 1e9);
            until.tv_sec += (time_t)(ns / 1000000000);
            until.tv_nsec = (long)(ns % 1000000000);
            if (pthread_timedjoin_np(ps[i].thr, NULL, &until) == 0) {
                i++;
                continue;
            }
        }
        if (bench_now() >= next_kill) {
            interrupt_claims(ctx, ps, started);
            next_kill = bench_now() + 1.0;
        }
    }
    if (held) {
        bench_db_exec(held, "ROLLBACK");
        mysql_close(held);
        held = NULL;
    }
    if (bench_snap_take(ctx, 0, &b) < 0)
        goto done;
    bench_snap_delta(&a, &b, r);
    for (unsigned i = 0; i < k; i++)
        for (size_t j = 0; j < ps[i].lat.n; j++)
            if (bench_lat_add(&all, ps[i].lat.v[j]) < 0)
                goto done;
    r->has_latency = true;
    r->p50_ms = bench_lat_pct(&all, 50);
    r->p99_ms = bench_lat_pct(&all, 99);
    r->cas_misses = atomic_load(&ctx->tally.misses);
    r->interrupted = atomic_load(&ctx->tally.interrupted);
    rc = 0;
done:
    if (held)
        mysql_close(held);
    if (rc < 0 && !atomic_load(&ctx->tally.failed))
        bench_tally_fail(&ctx->tally, "%s: setup failed", d->name);
    bench_lat_free(&all);
    pollers_free(ps, k);
    return rc;
}
