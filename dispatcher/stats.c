/* stats.c: what GET /stats and GET /metrics show (docs/admin.md): the /stats
 * JSON object and the Prometheus text, built on the loop thread. */
#include "conn.h"
#include "db_sql.h" /* dsp_utf8_sanitize: worker names are whatever HELLO said */
#include "server.h"
#include "stats.h"

#include <event2/buffer.h>
#include <jansson.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[4] = {"new", "processing", "successful", "failed"};
static const char *const priority_names[3] = {"low", "normal", "high"};

static void add_setting(void *arg, const char *key, const char *val)
{
    json_object_set_new(arg, key, json_string(val));
}

static json_t *rates_json(const dsp_server *srv)
{
    static const unsigned windows[3] = {1, 10, 60};
    static const char *const names[3] = {"1s", "10s", "60s"};
    json_t *d = json_object(), *c = json_object();
    for (int i = 0; i < 3; i++) {
        double dr, cr;
        dsp_rates_get(&srv->rates, windows[i], &dr, &cr);
        json_object_set_new(d, names[i], json_real(dr));
        json_object_set_new(c, names[i], json_real(cr));
    }
    return json_pack("{s:o, s:o}", "dispatched_per_s", d, "completed_per_s", c);
}

static json_t *table_json(const dsp_table_stats *ts)
{
    json_t *states = json_object();
    for (int i = 0; i < 4; i++)
        json_object_set_new(states, state_names[i], json_integer((json_int_t)ts->by_state[i]));
    json_t *prio = json_object();
    for (int i = 0; i < 3; i++)
        json_object_set_new(prio, priority_names[i], json_integer((json_int_t)ts->new_by_priority[i]));
    json_t *types = json_array();
    for (size_t i = 0; i < ts->ntypes && i < DSP_TABLE_STATS_MAX_TYPES; i++) {
        const dsp_table_type_stats *t = &ts->types[i];
        json_array_append_new(types, json_pack("{s:s, s:I, s:I, s:I, s:I}", "type", t->type, "new_ready",
                                               (json_int_t)t->new_ready, "new_delayed",
                                               (json_int_t)t->new_delayed, "processing",
                                               (json_int_t)t->processing, "failed", (json_int_t)t->failed));
    }
    int64_t age = ts->valid ? dsp_wall_ms() - ts->refreshed_wall_ms : -1;
    return json_pack("{s:b, s:I, s:I, s:o, s:b, s:o, s:I, s:o, s:I}", "valid", ts->valid, "age_ms",
                     (json_int_t)age, "refresh_us", (json_int_t)ts->duration_us, "by_state", states,
                     "successful_capped", ts->successful_capped, "new_by_priority", prio,
                     "oldest_ready_age_ms", (json_int_t)ts->oldest_ready_age_ms, "types", types,
                     "retention_deleted_total", (json_int_t)ts->retention_deleted_total);
}

static json_t *paused_json(const dsp_server *srv)
{
    json_t *types = json_array();
    for (const dsp_type *ty = srv->types; ty; ty = ty->next)
        if (ty->paused)
            json_array_append_new(types, json_string(ty->name));
    return json_pack("{s:b, s:o}", "all", srv->paused_all, "types", types);
}

static json_t *requeue_json(const dsp_server *srv)
{
    if (srv->last_requeue.id == 0)
        return json_null();
    json_t *o = json_pack("{s:I, s:s, s:s}", "request_id", (json_int_t)srv->last_requeue.id, "type",
                          srv->last_requeue.type,
                          "state", !srv->last_requeue.done          ? "pending"
                                   : srv->last_requeue.rows < 0 ? "failed"
                                                                : "done");
    if (srv->last_requeue.done && srv->last_requeue.rows >= 0)
        json_object_set_new(o, "rows", json_integer((json_int_t)srv->last_requeue.rows));
    return o;
}

json_t *dsp_stats_json(dsp_server *srv)
{
    json_t *tasks = json_object();
#define X(name, help) json_object_set_new(tasks, #name, json_integer((json_int_t)srv->task_stats.name));
    DSP_TASK_COUNTERS(X)
#undef X
    json_t *conns = json_object();
#define X(name, help) json_object_set_new(conns, #name, json_integer((json_int_t)srv->conn_stats.name));
    DSP_CONN_COUNTERS(X)
#undef X
    json_object_set_new(conns, "open", json_integer((json_int_t)srv->nconns));

    dsp_db_counters dbc;
    dsp_db_counters_get(srv->db, &dbc);
    json_t *db = json_object();
#define X(field, key, metric, divisor, help) json_object_set_new(db, key, json_integer((json_int_t)dbc.field));
    DSP_DB_COUNTERS(X)
#undef X
    json_object_set_new(db, "pending_writes",
                        json_integer((json_int_t)(srv->noutbox + dsp_db_pending_writes(srv->db))));
    json_t *settings = json_object();
    dsp_config_each(srv->cfg, add_setting, settings);

    dsp_table_stats *ts = malloc(sizeof *ts);
    if (ts)
        dsp_db_table_stats_get(srv->db, ts);
    json_t *table = ts ? table_json(ts) : json_null();
    free(ts);

    json_t *o = json_pack("{s:I, s:b, s:b, s:I, s:s, s:I, s:b, s:o, s:{s:I, s:I}, s:o, s:o, s:o}",
                     "uptime_s", (json_int_t)((dsp_now_ms() - srv->started_ms) / 1000),
                     "db_connected", srv->db_connected, "leader", srv->leader, "epoch",
                     (json_int_t)srv->epoch, "scheduler", dsp_sched_policy_name(srv->cfg->scheduler),
                     "workers", (json_int_t)srv->nworkers, "draining", srv->draining, "tasks", tasks,
                     "queue", "buffered", (json_int_t)srv->nbuffered, "in_flight",
                     (json_int_t)srv->ninflight, "connections", conns, "db", db, "settings", settings);
    if (!o) {
        json_decref(table);
        return NULL;
    }
    /* "draining": either kind (POST /drain, or a signal's drain before exit). */
    json_object_set_new(o, "draining", json_boolean(srv->draining || srv->admin_draining));
    json_object_set_new(o, "shutting_down", json_boolean(srv->draining));
    json_object_set_new(o, "types", json_integer((json_int_t)srv->ntypes));
    json_object_set_new(o, "paused", paused_json(srv));
    json_object_set_new(o, "rates", rates_json(srv));
    json_object_set_new(o, "table", table);
    json_object_set_new(o, "last_requeue", requeue_json(srv));
    return o;
}

/* A copy of s (malloc'd; NULL when out of memory) with each byte that is not valid
 * UTF-8 replaced by U+FFFD: a worker's name is whatever its HELLO said, and JSON
 * (jansson refuses such a string) and the Prometheus format want UTF-8. */
char *dsp_stats_utf8_copy(const char *s)
{
    size_t n = strlen(s);
    char *out = n < SIZE_MAX / 3 ? malloc(3 * n + 1) : NULL;
    if (out)
        out[dsp_utf8_sanitize((const uint8_t *)s, n, (uint8_t *)out, 3 * n)] = '\0';
    return out;
}

/* ---- GET /metrics: Prometheus text exposition format 0.0.4 ---- */

static void family(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(out, "# HELP taskpush_%s %s\n# TYPE taskpush_%s %s\n", name, help, name, type);
}

static void gauge(struct evbuffer *out, const char *name, const char *help, double v)
{
    family(out, name, "gauge", help);
    evbuffer_add_printf(out, "taskpush_%s %.9g\n", name, v);
}

static void counter(struct evbuffer *out, const char *name, const char *help, uint64_t v)
{
    family(out, name, "counter", help);
    evbuffer_add_printf(out, "taskpush_%s %llu\n", name, (unsigned long long)v);
}

/* A counter shown as value / divisor (a divisor of 1 prints the integer). */
static void scaled_counter(struct evbuffer *out, const char *name, const char *help, uint64_t v,
                           uint64_t divisor)
{
    if (divisor == 1) {
        counter(out, name, help, v);
        return;
    }
    family(out, name, "counter", help);
    evbuffer_add_printf(out, "taskpush_%s %.9g\n", name, (double)v / (double)divisor);
}

/* A label value with \, " and newline escaped as the format wants. */
static void label_value(struct evbuffer *out, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            evbuffer_add(out, "\\\\", 2);
        else if (*v == '"')
            evbuffer_add(out, "\\\"", 2);
        else if (*v == '\n')
            evbuffer_add(out, "\\n", 2);
        else
            evbuffer_add(out, v, 1);
    }
}

static void histogram(struct evbuffer *out, const char *name, const char *help, const dsp_hist *h)
{
    family(out, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= DSP_HIST_NBOUNDS; i++) {
        cum += h->buckets[i];
        if (i < DSP_HIST_NBOUNDS)
            evbuffer_add_printf(out, "taskpush_%s_bucket{le=\"%g\"} %llu\n", name,
                                dsp_hist_bound_ms(i) / 1000.0, (unsigned long long)cum);
        else
            evbuffer_add_printf(out, "taskpush_%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    evbuffer_add_printf(out, "taskpush_%s_sum %.9g\ntaskpush_%s_count %llu\n", name, h->sum_ms / 1000.0,
                        name, (unsigned long long)h->count);
}

static void metrics_table(struct evbuffer *out, const dsp_table_stats *ts)
{
    gauge(out, "table_stats_valid", "1 once the table-side figures were read at least once",
          ts->valid ? 1 : 0);
    counter(out, "table_retention_deleted_total", "finished rows deleted by retention",
            ts->retention_deleted_total);
    if (!ts->valid)
        return;
    gauge(out, "table_stats_age_seconds", "age of the table-side figures",
          (double)(dsp_wall_ms() - ts->refreshed_wall_ms) / 1000.0);
    family(out, "table_tasks", "gauge", "rows of the task table by state");
    for (int i = 0; i < 4; i++)
        evbuffer_add_printf(out, "taskpush_table_tasks{state=\"%s\"} %llu\n", state_names[i],
                            (unsigned long long)ts->by_state[i]);
    family(out, "table_new_tasks", "gauge", "NEW rows (ready or delayed) by priority");
    for (int i = 0; i < 3; i++)
        evbuffer_add_printf(out, "taskpush_table_new_tasks{priority=\"%s\"} %llu\n", priority_names[i],
                            (unsigned long long)ts->new_by_priority[i]);
    family(out, "table_type_tasks", "gauge", "rows by type and state (NEW split into ready and delayed)");
    for (size_t i = 0; i < ts->ntypes && i < DSP_TABLE_STATS_MAX_TYPES; i++) {
        const dsp_table_type_stats *t = &ts->types[i];
        const uint64_t v[4] = {t->new_ready, t->new_delayed, t->processing, t->failed};
        static const char *const st[4] = {"new_ready", "new_delayed", "processing", "failed"};
        for (int k = 0; k < 4; k++) {
            evbuffer_add_printf(out, "taskpush_table_type_tasks{type=\"");
            label_value(out, t->type);
            evbuffer_add_printf(out, "\",state=\"%s\"} %llu\n", st[k], (unsigned long long)v[k]);
        }
    }
    gauge(out, "queue_lag_seconds", "how long the oldest ready NEW task has waited (0: none waits)",
          ts->oldest_ready_age_ms > 0 ? (double)ts->oldest_ready_age_ms / 1000.0 : 0);
}

void dsp_stats_metrics(dsp_server *srv, struct evbuffer *out)
{
#define X(name, help) counter(out, #name, help, srv->task_stats.name);
    DSP_TASK_COUNTERS(X)
#undef X
#define X(name, help) counter(out, "connections_" #name, help, srv->conn_stats.name);
    DSP_CONN_COUNTERS(X)
#undef X
    gauge(out, "connections_open", "open connections on the worker port", (double)srv->nconns);
    gauge(out, "workers", "connected workers (past HELLO)", (double)srv->nworkers);
    gauge(out, "types", "task types held: registered by a worker, buffered or paused", (double)srv->ntypes);
    gauge(out, "queue_buffered", "claimed tasks waiting in memory for a worker", (double)srv->nbuffered);
    gauge(out, "queue_in_flight", "tasks delivered and not yet done", (double)srv->ninflight);
    gauge(out, "db_connected", "1 while the database is reachable", srv->db_connected ? 1 : 0);
    gauge(out, "leader", "1 while this dispatcher leads the table", srv->leader ? 1 : 0);
    gauge(out, "epoch", "the fencing epoch of this dispatcher", (double)srv->epoch);
    gauge(out, "uptime_seconds", "seconds since start", (double)(dsp_now_ms() - srv->started_ms) / 1000.0);
    gauge(out, "paused", "1 while every type is paused", srv->paused_all ? 1 : 0);
    gauge(out, "draining", "1 while draining", srv->draining || srv->admin_draining ? 1 : 0);

    dsp_db_counters dbc;
    dsp_db_counters_get(srv->db, &dbc);
#define X(field, key, metric, divisor, help) scaled_counter(out, metric, help, dbc.field, divisor);
    DSP_DB_COUNTERS(X)
#undef X
    gauge(out, "db_pending_writes", "outcomes not yet written (in the loop's outbox, queued or being written)",
          (double)(srv->noutbox + dsp_db_pending_writes(srv->db)));

#define X(field, name, help) histogram(out, name, help, &srv->hist.field);
    DSP_HISTOGRAMS(X)
#undef X

    static const char *const wnames[3] = {"worker_capacity", "worker_in_flight", "worker_completed_total"};
    static const char *const wtypes[3] = {"gauge", "gauge", "counter"};
    static const char *const whelp[3] = {"slots a worker offers", "tasks a worker holds",
                                         "tasks a worker finished"};
    for (int k = 0; k < 3; k++) {
        family(out, wnames[k], wtypes[k], whelp[k]);
        for (dsp_conn *c = srv->conns; c; c = c->next) {
            if (c->state != DSP_CONN_ACTIVE)
                continue;
            uint64_t v = k == 0 ? c->slots.capacity : k == 1 ? c->slots.in_flight : c->completed_total;
            evbuffer_add_printf(out, "taskpush_%s{worker=\"", wnames[k]);
            char *name = dsp_stats_utf8_copy(c->name ? c->name : "");
            label_value(out, name ? name : "");
            free(name);
            evbuffer_add_printf(out, "\",conn=\"%llu\"} %llu\n", (unsigned long long)c->id,
                                (unsigned long long)v);
        }
    }

    dsp_table_stats *ts = malloc(sizeof *ts);
    if (ts) {
        dsp_db_table_stats_get(srv->db, ts);
        metrics_table(out, ts);
        free(ts);
    }
}
