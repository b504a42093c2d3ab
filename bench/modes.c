/* modes.c: the modes beyond the drain (--mode stream|latency|connections|backlog|mixed|soak):
 * runs the one asked for, prints its JSON lines as results come and a Markdown table
 * at the end, and holds what the modes share: the raised descriptor limit, waiting
 * for workers to connect, and the exactly-once check of a partial drain (backlog).
 * The drain mode itself stays in bench.c. */
#include "bench.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The connections mode holds thousands of sockets, and taskpushd inherits the limit:
 * the soft limit goes as far as the hard one allows. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

void bench_mode_emit(json_t *line)
{
    char *s = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(line);
    fflush(stdout);
}

void bench_mode_row(json_t *rows, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    json_array_append_new(rows, json_string(buf));
}

void bench_mode_server_figures(json_t *j, const bench_run *r, uint64_t n)
{
    double per = n ? 1.0 / (double)n : 0;
    json_object_set_new(j, "statements_per_task", json_real((double)r->statements * per));
    json_object_set_new(j, "handler_reads_per_task", json_real((double)r->handler_reads * per));
    json_object_set_new(j, "row_lock_waits", json_integer((json_int_t)r->lock_waits));
    json_object_set_new(j, "mariadbd_cpu_s_per_1000",
                        r->db_cpu_s >= 0 ? json_real(r->db_cpu_s * 1000 * per) : json_null());
    json_object_set_new(j, "taskpushd_cpu_s_per_1000",
                        r->tpd_cpu_s >= 0 ? json_real(r->tpd_cpu_s * 1000 * per) : json_null());
}

int bench_wait_workers(const bench_daemon *dp, long long want, double timeout_s)
{
    for (double end = bench_now() + timeout_s; bench_now() < end; bench_sleep_ms(20)) {
        json_t *s = bench_http_json(dp->admin, "/stats");
        long long n = bench_json_int(s, "workers");
        json_decref(s);
        if (n >= want)
            return 0;
    }
    return -1;
}

static bool tally_has(const bench_tally *t, uint64_t id)
{
    if (id == 0 || id > t->n)
        return false;
    uint64_t word = atomic_load_explicit(&t->seen[(id - 1) / 64], memory_order_relaxed);
    return (word >> ((id - 1) % 64)) & 1u;
}

/* Exactly-once for a drain stopped part way (backlog): the table still holds its
 * rows, each NEW or SUCCESSFUL; as many SUCCESSFUL as handler runs, each claimed
 * once, and every SUCCESSFUL id one the handlers ran. */
int bench_verify_subset(bench_ctx *ctx, uint64_t rows, char *why, size_t cap)
{
    bench_tally *t = &ctx->tally;
    uint64_t calls = atomic_load(&t->calls), v[4] = {0, 0, 0, 0};

    if (atomic_load(&t->failed)) {
        snprintf(why, cap, "the mode failed: %s", t->why);
        return -1;
    }
    if (atomic_load(&t->dups) || atomic_load(&t->strays)) {
        snprintf(why, cap, "%" PRIu64 " rows ran more than once, %" PRIu64 " unknown ids ran",
                 atomic_load(&t->dups), atomic_load(&t->strays));
        return -1;
    }
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*), COALESCE(SUM(task_state = 0), 0), COALESCE(SUM(task_state = 2), 0),"
             " COALESCE(SUM(task_state = 2 AND attempts = 1), 0) FROM %s",
             ctx->o->db.table);
    if (mysql_query(ctx->admin, sql) != 0) {
        snprintf(why, cap, "verification query failed: %s", mysql_error(ctx->admin));
        return -1;
    }
    MYSQL_RES *res = mysql_store_result(ctx->admin);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
    for (unsigned i = 0; row && i < 4 && i < mysql_num_fields(res); i++)
        v[i] = row[i] ? strtoull(row[i], NULL, 10) : 0;
    if (res)
        mysql_free_result(res);
    if (v[0] != rows || v[1] + v[2] != rows) {
        snprintf(why, cap, "table holds %" PRIu64 " rows, %" PRIu64 " NEW and %" PRIu64
                 " SUCCESSFUL, expected %" PRIu64 " NEW or SUCCESSFUL", v[0], v[1], v[2], rows);
        return -1;
    }
    if (v[2] != calls || v[3] != v[2]) {
        snprintf(why, cap, "%" PRIu64 " SUCCESSFUL rows (%" PRIu64 " claimed once) for %" PRIu64
                 " handler runs", v[2], v[3], calls);
        return -1;
    }
    /* Streamed: the slice may be large, and only the ids are needed. */
    snprintf(sql, sizeof sql, "SELECT task_id FROM %s WHERE task_state = 2", ctx->o->db.table);
    if (mysql_query(ctx->admin, sql) != 0 ||
        (res = mysql_use_result(ctx->admin)) == NULL) {
        snprintf(why, cap, "verification query failed: %s", mysql_error(ctx->admin));
        return -1;
    }
    uint64_t unseen = 0;
    while ((row = mysql_fetch_row(res)) != NULL)
        unseen += row[0] == NULL || !tally_has(t, strtoull(row[0], NULL, 10));
    mysql_free_result(res);
    if (unseen) {
        snprintf(why, cap, "%" PRIu64 " SUCCESSFUL rows no handler ran", unseen);
        return -1;
    }
    return 0;
}

static const char *const table_head[] = {
    [BENCH_MODE_STREAM] =
        "| producer | rows per INSERT or submit | producers | workers | producers alone, rows/s | "
        "producers with taskpush, rows/s | ratio | completed, tasks/s | row-lock waits | tail s | "
        "target ratio >= 0.95, 0 waits | verified |\n|---|---|---|---|---|---|---|---|---|---|---|---|",
    [BENCH_MODE_LATENCY] =
        "| producer | --wake | --poll-ms | tasks | p50 ms | p99 ms | p99.9 ms | max ms | "
        "from insert_time: p50 | p99 | p99.9 | from sent: max | idle statements/s | "
        "statements/s under load | load inserts/s | target: poll p99 <= poll-ms + 5; "
        "binlog insert_time p50 <= 10, p99 <= 30 | verified |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    [BENCH_MODE_CONNECTIONS] =
        "| idle workers | active | N | tasks/s | RSS idle-connected | peak RSS | "
        "target < 100 MB | verified |\n|---|---|---|---|---|---|---|---|",
    [BENCH_MODE_BACKLOG] =
        "| waiting rows | load s | RSS waiting | peak RSS | slice | tasks/s | target < 32 MiB | "
        "verified |\n|---|---|---|---|---|---|---|---|",
    [BENCH_MODE_MIXED] =
        "| case | payload B | producers | workers | tasks/s | ÷ drain | ack p99 ms: sql-1 | "
        "sql-100 | submit-1 | submit-100 | enqueue to start p50 / p99 / p99.9 ms | "
        "statements/task | mariadbd µs/task | taskpushd µs/task | peak RSS kB | target | "
        "verified |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    [BENCH_MODE_SOAK] =
        "| payload B | peak tasks/s | paced at | tasks/s | s | samples | start p99 ms min–max | "
        "RSS kB min–max | flat | verified |\n|---|---|---|---|---|---|---|---|---|---|",
};

int bench_modes_main(bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    json_t *rows = json_array();
    int failed;

    if (rows == NULL)
        return 1;
    raise_fd_limit();
    switch (o->mode) {
    case BENCH_MODE_STREAM: failed = bench_mode_stream(ctx, rows); break;
    case BENCH_MODE_LATENCY: failed = bench_mode_latency(ctx, rows); break;
    case BENCH_MODE_CONNECTIONS: failed = bench_mode_connections(ctx, rows); break;
    case BENCH_MODE_BACKLOG: failed = bench_mode_backlog(ctx, rows); break;
    case BENCH_MODE_MIXED: failed = bench_mode_mixed(ctx, rows); break;
    case BENCH_MODE_SOAK: failed = bench_mode_soak(ctx, rows); break;
    default: failed = 1; break;
    }
    if (!o->json_only) {
        printf("\n%s\n", table_head[o->mode]);
        size_t i;
        json_t *r;
        json_array_foreach(rows, i, r)
            printf("%s\n", json_string_value(r));
    }
    json_decref(rows);
    return failed;
}
