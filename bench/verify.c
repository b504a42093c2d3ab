/* verify.c: the exactly-once check of every run. The designs report each row they
 * "ran" (bench_tally_ran: one bit per id, so a second run of the same id is seen);
 * after the drain the table must hold the N preloaded rows, all SUCCESSFUL, each
 * claimed once (attempts = 1), and for taskpush the dispatcher must count N
 * successes. A polling run cut at --poll-seconds must have run each row it did exactly
 * once, and left every other row NEW and never claimed (attempts = 0). bench_sabotage
 * changes a row behind the design's back so that a test can see a failed verification
 * end in a non-zero exit. */
#include "bench.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_tally_init(bench_tally *t, uint64_t n)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->seen = calloc((size_t)(n / 64 + 1), sizeof *t->seen);
    return t->seen ? 0 : -1;
}

void bench_tally_free(bench_tally *t)
{
    free(t->seen);
    t->seen = NULL;
}

void bench_tally_ran(bench_tally *t, uint64_t id)
{
    atomic_fetch_add_explicit(&t->calls, 1, memory_order_relaxed);
    if (id == 0 || id > t->n) {
        atomic_fetch_add_explicit(&t->strays, 1, memory_order_relaxed);
        return;
    }
    uint64_t bit = 1ull << ((id - 1) % 64);
    uint64_t old = atomic_fetch_or_explicit(&t->seen[(id - 1) / 64], bit, memory_order_relaxed);
    if (old & bit)
        atomic_fetch_add_explicit(&t->dups, 1, memory_order_relaxed);
}

void bench_tally_fail(bench_tally *t, const char *fmt, ...)
{
    int expected = 0;
    /* Only the first failure is kept: the others are usually its consequences. */
    if (!atomic_compare_exchange_strong(&t->failed, &expected, 1))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->why, sizeof t->why, fmt, ap);
    va_end(ap);
}

int bench_sabotage(bench_ctx *ctx)
{
    /* FAILED is a state no design writes; one row is enough to break exactly-once. */
    char sql[128];
    snprintf(sql, sizeof sql, "UPDATE %s SET task_state = 3 WHERE task_id = 1", ctx->o->db.table);
    return bench_db_exec(ctx->admin, sql) == 1 ? 0
                                                                                              : -1;
}

/* The table's side: one statement, read after the measured window. done of the n rows
 * were run (n unless the run was cut). */
static int check_table(bench_ctx *ctx, uint64_t n, uint64_t done, char *why, size_t cap)
{
    char sql[320];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*), COALESCE(SUM(task_state = 2), 0),"
             " COALESCE(SUM(task_state = 2 AND attempts = 1), 0),"
             " COALESCE(MIN(task_id), 0), COALESCE(MAX(task_id), 0),"
             " COALESCE(SUM(task_state = 0 AND attempts = 0), 0) FROM %s",
             ctx->o->db.table);
    if (mysql_query(ctx->admin, sql) != 0) {
        snprintf(why, cap, "verification query failed: %s", mysql_error(ctx->admin));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(ctx->admin);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    if (row == NULL || mysql_num_fields(res) != 6) {
        snprintf(why, cap, "verification query returned nothing");
        if (res)
            mysql_free_result(res);
        return -1;
    }
    uint64_t v[6];
    for (int i = 0; i < 6; i++)
        v[i] = row[i] ? strtoull(row[i], NULL, 10) : 0;
    mysql_free_result(res);
    int rc = -1;
    if (v[0] != n || v[3] != 1 || v[4] != n)
        snprintf(why, cap, "table holds %" PRIu64 " rows (ids %" PRIu64 "..%" PRIu64
                           "), expected %" PRIu64, v[0], v[3], v[4], n);
    else if (v[1] != done)
        snprintf(why, cap, "%" PRIu64 " of %" PRIu64 " rows are SUCCESSFUL, %" PRIu64 " ran", v[1],
                 n, done);
    else if (v[2] != done)
        snprintf(why, cap, "%" PRIu64 " rows were claimed other than exactly once (attempts != 1)",
                 done - v[2]);
    else if (v[5] != n - done)
        snprintf(why, cap, "%" PRIu64 " rows were not run but are not NEW and unclaimed",
                 n - done - v[5]);
    else
        rc = 0;
    return rc;
}

void bench_verify(bench_ctx *ctx, bench_run *r)
{
    bench_tally *t = &ctx->tally;
    uint64_t calls = atomic_load(&t->calls), dups = atomic_load(&t->dups);
    uint64_t strays = atomic_load(&t->strays);

    r->verified = false;
    /* A cut run's figures are over the rows it did; the table must agree with them. A
     * deadline that came as the last rows were done cut nothing. */
    r->cut = atomic_load(&t->cut) && calls < r->n;
    r->done = r->cut ? calls : r->n;
    if (atomic_load(&t->failed))
        snprintf(r->why, sizeof r->why, "the design failed: %s", t->why);
    else if (dups || strays)
        snprintf(r->why, sizeof r->why,
                 "%" PRIu64 " rows ran more than once, %" PRIu64 " unknown ids ran", dups, strays);
    else if (r->cut && calls == 0)
        snprintf(r->why, sizeof r->why, "cut at --poll-seconds before a single row ran");
    else if (calls != r->done)
        snprintf(r->why, sizeof r->why, "handlers ran %" PRIu64 " times for %" PRIu64 " rows",
                 calls, r->n);
    else if (r->daemon_succeeded >= 0 &&
             (r->daemon_succeeded != (long long)r->n || r->daemon_failed != 0))
        snprintf(r->why, sizeof r->why,
                 "taskpushd counted %lld succeeded and %lld failed for %" PRIu64 " rows",
                 r->daemon_succeeded, r->daemon_failed, r->n);
    else if (check_table(ctx, r->n, r->done, r->why, sizeof r->why) == 0)
        r->verified = true;
}
