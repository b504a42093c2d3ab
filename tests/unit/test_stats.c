/* Unit tests of dispatcher/stats.c: the /stats object and the /metrics text built
 * from a snapshot, and the snapshot taken from an offline server (no socket, no
 * database). Every counter of every X-macro of stats.h gets a distinct value and
 * must show up in both views with it, so that a counter added to a list and
 * forgotten by a view (or shown under another's value) fails here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "config.h"
#include "db.h"
#include "server.h"
#include "stats.h"

#define COUNT_ONE(...) +1
#define NTASK (0 DSP_TASK_COUNTERS(COUNT_ONE))
#define NCONN (0 DSP_CONN_COUNTERS(COUNT_ONE))
#define NDB (0 DSP_DB_COUNTERS(COUNT_ONE))

typedef struct fixture {
    dsp_config cfg;
    dsp_stats_snapshot snap;
    json_t *json;   /* dsp_stats_json(&snap) */
    char *metrics;  /* dsp_stats_metrics(&snap), NUL-terminated */
} fixture;

static void load_config(dsp_config *cfg)
{
    char *argv[] = {"taskpushd", "--db", "mysql://u@localhost/stats", "--log-level", "error"};
    char err[256] = "";
    FILE *out = fopen("/dev/null", "w");
    assert_non_null(out);
    assert_int_equal(dsp_config_load(cfg, 5, argv, out, err, sizeof err), DSP_CONFIG_OK);
    fclose(out);
}

/* Gives every counter and histogram a value of its own: counters from 1001 up,
 * the database's from 5001 up (times 7, so that a divided one shows a fraction). */
static void fill_distinct(dsp_stats_snapshot *s, const dsp_config *cfg)
{
    memset(s, 0, sizeof *s);
    uint64_t v = 1001;
#define X(name, help) s->tasks.name = v++;
    DSP_TASK_COUNTERS(X)
#undef X
#define X(name, help) s->conns.name = v++;
    DSP_CONN_COUNTERS(X)
#undef X
    v = 5001;
#define X(field, key, metric, divisor, help) s->db.field = 7 * v++;
    DSP_DB_COUNTERS(X)
#undef X
    v = 9001;
#define X(field, name, help)                                                                  \
    for (int i = 0; i <= DSP_HIST_NBOUNDS; i++)                                              \
        s->hist.field.buckets[i] = 1;                                                         \
    s->hist.field.count = v++;                                                                \
    s->hist.field.sum_ms = 2500;
    DSP_HISTOGRAMS(X)
#undef X
    s->cfg = cfg;
    s->scheduler = "least-loaded";
    s->uptime_ms = 12345;
    s->wall_ms = 1700000000000;
    s->epoch = 17;
    s->nconns = 21;
    s->nworkers = 19;
    s->ntypes = 23;
    s->nbuffered = 29;
    s->ninflight = 31;
    s->pending_writes = 37;
    s->pending_write_bytes = 4242;
    s->db_connected = true;
}

static void build_views(fixture *fx)
{
    fx->json = dsp_stats_json(&fx->snap);
    assert_non_null(fx->json);
    struct evbuffer *out = evbuffer_new();
    assert_non_null(out);
    dsp_stats_metrics(&fx->snap, out);
    size_t n = evbuffer_get_length(out);
    fx->metrics = malloc(n + 1);
    assert_non_null(fx->metrics);
    assert_int_equal(evbuffer_remove(out, fx->metrics, n), (int)n);
    fx->metrics[n] = '\0';
    evbuffer_free(out);
}

static int setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    load_config(&fx->cfg);
    fill_distinct(&fx->snap, &fx->cfg);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture *fx = *state;
    json_decref(fx->json);
    free(fx->metrics);
    free(fx->snap.table); /* the tests' own allocations; the rest is borrowed */
    dsp_config_free(&fx->cfg);
    free(fx);
    return 0;
}

static void assert_member(const json_t *obj, const char *key, uint64_t want)
{
    const json_t *j = json_object_get(obj, key);
    if (!json_is_integer(j))
        fail_msg("no integer \"%s\" in /stats", key);
    if ((uint64_t)json_integer_value(j) != want)
        fail_msg("/stats shows \"%s\": %lld, not %llu", key, (long long)json_integer_value(j),
                 (unsigned long long)want);
}

/* text holds the whole line "line\n". */
static void assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    fail_msg("/metrics has no line \"%s\"", line);
}

/* One family: its HELP and TYPE lines, and a sample line "taskpush_NAME VALUE". */
static void assert_family(const char *text, const char *name, const char *type, const char *help,
                          const char *value)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP taskpush_%s %s\n# TYPE taskpush_%s %s", name, help, name, type);
    assert_non_null(strstr(text, line));
    if (value) {
        snprintf(line, sizeof line, "taskpush_%s %s", name, value);
        assert_line(text, line);
    }
}

static void test_every_counter_in_stats(void **state)
{
    fixture *fx = *state;
    build_views(fx);
    const json_t *tasks = json_object_get(fx->json, "tasks");
    const json_t *conns = json_object_get(fx->json, "connections");
    const json_t *db = json_object_get(fx->json, "db");
#define X(name, help) assert_member(tasks, #name, fx->snap.tasks.name);
    DSP_TASK_COUNTERS(X)
#undef X
#define X(name, help) assert_member(conns, #name, fx->snap.conns.name);
    DSP_CONN_COUNTERS(X)
#undef X
#define X(field, key, metric, divisor, help) assert_member(db, key, fx->snap.db.field);
    DSP_DB_COUNTERS(X)
#undef X
    /* Nothing else but the gauges that sit beside the counters. */
    assert_int_equal(json_object_size(tasks), NTASK);
    assert_int_equal(json_object_size(conns), NCONN + 1);
    assert_member(conns, "open", 21);
    assert_int_equal(json_object_size(db), NDB + 6);
    assert_member(db, "pending_writes", 37);
    assert_member(db, "pending_write_bytes", 4242);
    /* The lease in use (0 before a connection) and whether the server is a Galera node. */
    assert_member(db, "lease_ms", 0);
    assert_member(db, "lease_renew_ms", 0);
    assert_true(json_is_false(json_object_get(db, "galera")));
    /* The dialect in use, a name (the fixture's snapshot has none yet: "auto"). */
    assert_string_equal(json_string_value(json_object_get(db, "sql_dialect")),
                        fx->snap.sql_dialect ? fx->snap.sql_dialect : "auto");
}

static void test_every_counter_in_metrics(void **state)
{
    fixture *fx = *state;
    build_views(fx);
    char name[128], value[64];
#define X(field, help)                                                                        \
    snprintf(value, sizeof value, "%llu", (unsigned long long)fx->snap.tasks.field);          \
    assert_family(fx->metrics, #field, "counter", help, value);
    DSP_TASK_COUNTERS(X)
#undef X
#define X(field, help)                                                                        \
    snprintf(value, sizeof value, "%llu", (unsigned long long)fx->snap.conns.field);          \
    assert_family(fx->metrics, "connections_" #field, "counter", help, value);
    DSP_CONN_COUNTERS(X)
#undef X
#define X(field, key, metric, divisor, help)                                                  \
    if ((divisor) == 1)                                                                       \
        snprintf(value, sizeof value, "%llu", (unsigned long long)fx->snap.db.field);         \
    else                                                                                      \
        snprintf(value, sizeof value, "%.9g", (double)fx->snap.db.field / (double)(divisor)); \
    assert_family(fx->metrics, metric, "counter", help, value);
    DSP_DB_COUNTERS(X)
#undef X
#define X(field, metric, help)                                                                \
    assert_family(fx->metrics, metric, "histogram", help, NULL);                              \
    snprintf(name, sizeof name, "taskpush_%s_count %llu", metric,                             \
             (unsigned long long)fx->snap.hist.field.count);                                  \
    assert_line(fx->metrics, name);                                                           \
    snprintf(name, sizeof name, "taskpush_%s_bucket{le=\"+Inf\"} %d", metric, DSP_HIST_NBOUNDS + 1); \
    assert_line(fx->metrics, name);                                                           \
    snprintf(name, sizeof name, "taskpush_%s_sum 2.5", metric);                               \
    assert_line(fx->metrics, name);
    DSP_HISTOGRAMS(X)
#undef X
}

/* The top-level keys in their documented order (docs/admin.md), and the gauges. */
static void test_stats_shape(void **state)
{
    fixture *fx = *state;
    fx->snap.leader = true;
    fx->snap.draining = true;
    fx->snap.dispatched_per_s[2] = 0.5;
    build_views(fx);
    static const char *const keys[] = {"uptime_s", "db_connected", "leader", "epoch", "scheduler",
                                       "workers", "draining", "tasks", "queue", "connections", "db",
                                       "settings", "shutting_down", "wake", "health", "types", "paused", "rates",
                                       "table", "last_requeue", "by_type", "by_type_cut", "limits",
                                       "task_table"};
    size_t i = 0;
    const char *key;
    json_t *val;
    json_object_foreach(fx->json, key, val) {
        assert_true(i < sizeof keys / sizeof keys[0]);
        assert_string_equal(key, keys[i++]);
    }
    assert_int_equal(i, sizeof keys / sizeof keys[0]);
    /* --table's name: "task" by default ("table" is the object of the table's figures). */
    assert_string_equal(json_string_value(json_object_get(fx->json, "task_table")), "task");
    assert_member(fx->json, "uptime_s", 12);
    json_t *h = json_object_get(fx->json, "health"); /* /healthz's answer: ok, or why not */
    assert_true(json_is_boolean(json_object_get(h, "ok")));
    assert_non_null(json_object_get(h, "reason"));
    assert_member(fx->json, "epoch", 17);
    assert_member(fx->json, "workers", 19);
    assert_member(fx->json, "types", 23);
    assert_member(json_object_get(fx->json, "queue"), "buffered", 29);
    assert_member(json_object_get(fx->json, "queue"), "in_flight", 31);
    assert_true(json_is_true(json_object_get(fx->json, "draining")));
    assert_true(json_is_false(json_object_get(fx->json, "shutting_down")));
    /* wake: {mode, reason} and the follower's counters (--wake, docs/admin.md). */
    json_t *w = json_object_get(fx->json, "wake");
    assert_string_equal(json_string_value(json_object_get(w, "mode")), "poll");
    assert_true(json_is_string(json_object_get(w, "reason")));
    assert_true(json_is_integer(json_object_get(w, "wakes_total")));
    assert_true(json_is_integer(json_object_get(w, "events_total")));
    assert_string_equal(json_string_value(json_object_get(fx->json, "scheduler")), "least-loaded");
    assert_string_equal(json_string_value(json_object_get(json_object_get(fx->json, "settings"), "db")),
                        "mysql://u@localhost/stats");
    json_t *d = json_object_get(json_object_get(fx->json, "rates"), "dispatched_per_s");
    assert_true(json_real_value(json_object_get(d, "60s")) == 0.5);
    assert_true(json_is_null(json_object_get(fx->json, "table")));
    assert_true(json_is_null(json_object_get(fx->json, "last_requeue")));

    assert_family(fx->metrics, "connections_open", "gauge", "open connections on the worker port", "21");
    assert_family(fx->metrics, "workers", "gauge", "connected workers (past HELLO)", "19");
    assert_family(fx->metrics, "queue_in_flight", "gauge", "tasks delivered and not yet done", "31");
    assert_family(fx->metrics, "epoch", "gauge", "the fencing epoch of this dispatcher", "17");
    assert_family(fx->metrics, "uptime_seconds", "gauge", "seconds since start", "12.345");
    assert_family(fx->metrics, "draining", "gauge", "1 while draining", "1");
    assert_family(fx->metrics, "db_pending_writes", "gauge",
                  "outcomes not yet written (in the loop's outbox, queued or being written)", "37");
    assert_family(fx->metrics, "db_pending_write_bytes", "gauge",
                  "result and error bytes of the outcomes not yet written", "4242");
    /* No table figures: no table family beyond what a missing table allows. */
    assert_null(strstr(fx->metrics, "taskpush_table_"));
}

/* The lists: paused types, workers (names made UTF-8 and escaped), table figures. */
static void test_lists_and_table(void **state)
{
    fixture *fx = *state;
    const char *paused[2] = {"resize", "mail"};
    /* Two connections of one name, one of another, and the totals of ones that left: one
     * series per name, its connections summed and its closed ones' tasks added. */
    char long_name[301];
    memset(long_name, 'x', 300);
    long_name[300] = '\0';
    dsp_stats_worker workers[4] = {
        {.name = "w\"1\\", .conn_id = 4, .capacity = 8, .in_flight = 3, .completed_total = 99},
        {.name = "bad\xff", .conn_id = 6, .capacity = 2, .in_flight = 0, .completed_total = 1},
        {.name = "w\"1\\", .conn_id = 9, .capacity = 4, .in_flight = 1, .completed_total = 10},
        {.name = long_name, .conn_id = 11, .capacity = 1},
    };
    dsp_worker_total gone[2] = {{.label = "w\"1\\", .completed = 1000}, {.label = "gone", .completed = 5}};
    fx->snap.paused_types = paused;
    fx->snap.npaused_types = 2;
    fx->snap.workers = workers;
    fx->snap.nworker_rows = 4;
    fx->snap.worker_totals = gone;
    fx->snap.nworker_totals = 2;
    fx->snap.last_requeue.id = 3;
    strcpy(fx->snap.last_requeue.type, "mail");
    fx->snap.last_requeue.done = true;
    fx->snap.last_requeue.rows = 40;
    dsp_table_stats *ts = calloc(1, sizeof *ts);
    assert_non_null(ts);
    ts->valid = true;
    ts->refreshed_wall_ms = fx->snap.wall_ms - 1500;
    ts->by_state[2] = 77;
    ts->ntypes = 1;
    strcpy(ts->types[0].type, "mail");
    ts->types[0].failed = 40;
    ts->types[0].oldest_ready_age_ms = 2000;
    ts->oldest_ready_age_ms = 2000;
    dsp_stats_type held[1] = {{.name = "mail\xff", .workers = 2, .buffered = 5, .in_flight = 3, .paused = true,
                               .answered_ok = 9, .answered_failed = 4}};
    fx->snap.held_types = held;
    fx->snap.nheld_types = 1;
    fx->snap.table = ts;
    build_views(fx);

    char *text = json_dumps(json_object_get(fx->json, "paused"), JSON_COMPACT);
    assert_non_null(text);
    assert_string_equal(text, "{\"all\":false,\"types\":[\"resize\",\"mail\"]}");
    free(text);
    json_t *rq = json_object_get(fx->json, "last_requeue");
    assert_member(rq, "request_id", 3);
    assert_member(rq, "rows", 40);
    assert_string_equal(json_string_value(json_object_get(rq, "state")), "done");
    json_t *table = json_object_get(fx->json, "table");
    assert_member(table, "age_ms", 1500);
    assert_member(json_object_get(table, "by_state"), "successful", 77);
    assert_member(json_array_get(json_object_get(table, "types"), 0), "failed", 40);
    assert_member(json_array_get(json_object_get(table, "types"), 0), "oldest_ready_age_ms", 2000);
    text = json_dumps(json_object_get(fx->json, "by_type"), JSON_COMPACT);
    assert_non_null(text);
    assert_string_equal(text, "[{\"type\":\"mail\xef\xbf\xbd\",\"workers\":2,\"buffered\":5,"
                              "\"in_flight\":3,\"paused\":true,\"limit_concurrency\":0,\"limit_rate\":0,"
                              "\"limit_per_group\":0,"
                              "\"answered_ok_total\":9,\"answered_failed_total\":4}]");
    free(text);

    assert_line(fx->metrics, "taskpush_worker_connections{worker=\"w\\\"1\\\\\"} 2");
    assert_line(fx->metrics, "taskpush_worker_capacity{worker=\"w\\\"1\\\\\"} 12");
    assert_line(fx->metrics, "taskpush_worker_in_flight{worker=\"w\\\"1\\\\\"} 4");
    assert_line(fx->metrics, "taskpush_worker_completed_total{worker=\"w\\\"1\\\\\"} 1109");
    assert_line(fx->metrics, "taskpush_worker_completed_total{worker=\"bad\xef\xbf\xbd\"} 1");
    assert_line(fx->metrics, "taskpush_worker_connections{worker=\"gone\"} 0");
    assert_line(fx->metrics, "taskpush_worker_completed_total{worker=\"gone\"} 5");
    char want[300];
    snprintf(want, sizeof want, "taskpush_worker_capacity{worker=\"%.128s\"} 1", long_name);
    assert_line(fx->metrics, want);
    assert_null(strstr(fx->metrics, "conn="));
    snprintf(want, sizeof want, "taskpush_build_info{version=\"%s\"} 1", TASKPUSH_VERSION);
    assert_line(fx->metrics, want);
    assert_line(fx->metrics, "taskpush_table_stats_age_seconds 1.5");
    assert_line(fx->metrics, "taskpush_table_tasks{state=\"successful\"} 77");
    assert_line(fx->metrics, "taskpush_table_type_tasks{type=\"mail\",state=\"failed\"} 40");
    assert_line(fx->metrics, "taskpush_queue_lag_seconds 2");
    /* The snapshot's lists were the test's: nothing to free but the table. */
    fx->snap.paused_types = NULL;
    fx->snap.workers = NULL;
    fx->snap.held_types = NULL;
}

/* dsp_stats_snapshot_fill copies every counter from the server (here an offline
 * one: no database, so the database's figures are zero and the table not valid). */
static void test_fill_from_server(void **state)
{
    fixture *fx = *state;
    dsp_server *srv = malloc(sizeof *srv);
    assert_non_null(srv);
    assert_int_equal(dsp_server_init_offline(srv, &fx->cfg), 0);
    uint64_t v = 101;
#define X(name, help) srv->stats.tasks.name = v++;
    DSP_TASK_COUNTERS(X)
#undef X
#define X(name, help) srv->stats.conns.name = v++;
    DSP_CONN_COUNTERS(X)
#undef X
    srv->stats.hist.exec.count = 5;
    srv->lead.epoch = 9;
    srv->control.admin_draining = true;
    assert_null(dsp_server_pause(srv, "resize"));
    srv->control.last_requeue.id = 2;
    strcpy(srv->control.last_requeue.type, "resize");

    dsp_stats_snapshot snap;
    dsp_stats_snapshot_fill(&snap, srv);
#define X(name, help) assert_int_equal(snap.tasks.name, srv->stats.tasks.name);
    DSP_TASK_COUNTERS(X)
#undef X
#define X(name, help) assert_int_equal(snap.conns.name, srv->stats.conns.name);
    DSP_CONN_COUNTERS(X)
#undef X
#define X(field, key, metric, divisor, help) assert_int_equal(snap.db.field, 0);
    DSP_DB_COUNTERS(X)
#undef X
    assert_int_equal(snap.hist.exec.count, 5);
    assert_int_equal(snap.epoch, 9);
    assert_true(snap.draining);
    assert_false(snap.shutting_down);
    assert_ptr_equal(snap.cfg, &fx->cfg);
    assert_true(snap.uptime_ms >= 0);
    assert_int_equal(snap.npaused_types, 1);
    assert_string_equal(snap.paused_types[0], "resize");
    assert_int_equal(snap.nworker_rows, 0);
    assert_int_equal(snap.nheld_types, 1); /* the paused type */
    assert_string_equal(snap.held_types[0].name, "resize");
    assert_true(snap.held_types[0].paused);
    assert_int_equal(snap.held_types[0].workers + snap.held_types[0].in_flight, 0);
    assert_int_equal(snap.last_requeue.id, 2);
    assert_string_equal(snap.last_requeue.type, "resize");
    assert_non_null(snap.table);
    assert_false(snap.table->valid);

    json_t *j = dsp_stats_json(&snap);
    assert_non_null(j);
    assert_member(json_object_get(j, "tasks"), "claimed_total", 101);
    json_decref(j);
    dsp_stats_snapshot_clear(&snap);
    assert_null(snap.table);
    dsp_server_free(srv);
    free(srv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_counter_in_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_counter_in_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lists_and_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_from_server, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
