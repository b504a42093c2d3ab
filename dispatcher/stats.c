/* stats.c: what GET /stats and GET /metrics show (docs/admin.md). One function
 * copies the figures from the server and the database side into a snapshot on
 * the loop thread; the /stats JSON object and the Prometheus text are built from
 * that snapshot alone. */
#include "conn.h"
#include "utf8.h" /* dsp_utf8_copy: worker names are whatever HELLO said */
#include "server.h"
#include "stats.h"
#include "tables.h"

#include <event2/buffer.h>
#include <jansson.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[4] = {"new", "processing", "successful", "failed"};
static const char *const priority_names[3] = {"low", "normal", "high"};

static const unsigned rate_windows_s[DSP_STATS_RATE_WINDOWS] = {1, 10, 60};

/* ---- the snapshot ---- */

/* The types an operator paused, by name (borrowed). */
static void fill_paused(dsp_stats_snapshot *snap, const dsp_server *srv)
{
    size_t n = 0;
    for (const dsp_type *ty = srv->types.list; ty; ty = ty->next)
        n += ty->paused;
    snap->paused_types = n ? malloc(n * sizeof *snap->paused_types) : NULL;
    if (!snap->paused_types)
        return;
    for (const dsp_type *ty = srv->types.list; ty; ty = ty->next)
        if (ty->paused)
            snap->paused_types[snap->npaused_types++] = ty->name;
}

void dsp_stats_worker_label(const char *name, char *out)
{
    char *u = dsp_utf8_copy(name ? name : "");
    size_t n = u ? strlen(u) : 0;
    if (n > DSP_WORKER_LABEL_MAX) { /* cut before a UTF-8 continuation byte, never inside */
        n = DSP_WORKER_LABEL_MAX;
        while (n > 0 && ((unsigned char)u[n] & 0xC0) == 0x80)
            n--;
    }
    memcpy(out, u ? u : "", n);
    out[n] = '\0';
    free(u);
}

void dsp_stats_worker_left(dsp_server *srv, const char *name, uint64_t completed, int64_t now_ms)
{
    char label[DSP_WORKER_LABEL_MAX + 1];
    dsp_stats_worker_label(name, label);
    dsp_worker_total *t = NULL;
    for (size_t i = 0; i < srv->worker_totals.n && !t; i++)
        if (strcmp(srv->worker_totals.v[i].label, label) == 0)
            t = &srv->worker_totals.v[i];
    if (!t && srv->worker_totals.n < DSP_WORKER_NAMES_MAX) {
        if (!srv->worker_totals.v && !(srv->worker_totals.v = calloc(DSP_WORKER_NAMES_MAX, sizeof *t)))
            return; /* out of memory: the counter restarts, as a reset */
        t = &srv->worker_totals.v[srv->worker_totals.n++];
        *t = (dsp_worker_total){0};
        memcpy(t->label, label, sizeof label);
    } else if (!t) { /* full: the name gone longest makes room (its series ends) */
        t = &srv->worker_totals.v[0];
        for (size_t i = 1; i < srv->worker_totals.n; i++)
            if (srv->worker_totals.v[i].left_ms < t->left_ms)
                t = &srv->worker_totals.v[i];
        *t = (dsp_worker_total){0};
        memcpy(t->label, label, sizeof label);
    }
    t->completed += completed;
    t->left_ms = now_ms;
}

void dsp_stats_worker_totals_free(dsp_server *srv)
{
    free(srv->worker_totals.v);
    srv->worker_totals.v = NULL;
    srv->worker_totals.n = 0;
}

/* The connections past HELLO, in the server's order. */
static void fill_workers(dsp_stats_snapshot *snap, const dsp_server *srv)
{
    size_t n = 0;
    for (const dsp_conn *c = srv->conns.list; c; c = c->next)
        n += c->state == DSP_CONN_ACTIVE;
    snap->workers = n ? malloc(n * sizeof *snap->workers) : NULL;
    if (!snap->workers)
        return;
    for (const dsp_conn *c = srv->conns.list; c; c = c->next) {
        if (c->state != DSP_CONN_ACTIVE)
            continue;
        snap->workers[snap->nworker_rows++] = (dsp_stats_worker){
            .name = c->name ? c->name : "",
            .conn_id = c->id,
            .capacity = c->slots.capacity,
            .in_flight = c->slots.in_flight,
            .completed_total = c->completed_total,
        };
    }
}

static int type_ptr_cmp(const void *a, const void *b)
{
    /* As integers: < between pointers to different objects is undefined. */
    uintptr_t x = (uintptr_t)*(const dsp_type *const *)a;
    uintptr_t y = (uintptr_t)*(const dsp_type *const *)b;
    return x < y ? -1 : x > y;
}

/* The types held, with their workers, buffered and in-flight tasks (the in-flight
 * ones counted over the workers' delivery lists, each type found by bsearch). */
static void fill_types(dsp_stats_snapshot *snap, const dsp_server *srv)
{
    size_t n = srv->types.n < DSP_STATS_TYPES_MAX ? srv->types.n : DSP_STATS_TYPES_MAX;
    snap->held_types = n ? calloc(n, sizeof *snap->held_types) : NULL;
    const dsp_type **by_ptr = n ? malloc(n * sizeof *by_ptr) : NULL;
    if (!snap->held_types || !by_ptr) {
        free(by_ptr);
        return;
    }
    size_t k = 0;
    for (const dsp_type *ty = srv->types.list; ty && k < n; ty = ty->next)
        by_ptr[k++] = ty;
    snap->held_types_cut = k < srv->types.n;
    qsort(by_ptr, k, sizeof *by_ptr, type_ptr_cmp);
    for (size_t i = 0; i < k; i++)
        snap->held_types[i] = (dsp_stats_type){.name = by_ptr[i]->name,
                                               .workers = by_ptr[i]->nworkers,
                                               .buffered = by_ptr[i]->nbuffered,
                                               .paused = by_ptr[i]->paused,
                                               .limit_concurrency = by_ptr[i]->max_running,
                                               .limit_rate = by_ptr[i]->max_rate,
                                               .limit_per_group = by_ptr[i]->max_per_group,
                                               .answered_ok = by_ptr[i]->answered_ok,
                                               .answered_failed = by_ptr[i]->answered_failed};
    for (const dsp_conn *c = srv->conns.list; c; c = c->next)
        for (const dsp_task *t = c->inflight; t; t = t->next) {
            const dsp_type *key = t->type;
            const dsp_type **hit = bsearch(&key, by_ptr, k, sizeof *by_ptr, type_ptr_cmp);
            if (hit)
                snap->held_types[hit - by_ptr].in_flight++;
        }
    snap->nheld_types = k;
    free(by_ptr);
}

bool dsp_stats_health(const dsp_server *srv, char *why, size_t cap)
{
    if (cap == 0)
        return srv->lead.db_connected;
    why[0] = '\0';
    /* The more precise reason first: a failing statement's reconnect is no outage. */
    if (dsp_db_problem(srv->db, why, cap))
        return false;
    if (!srv->lead.db_connected) {
        snprintf(why, cap, "database unreachable");
        return false;
    }
    return true;
}

void dsp_stats_snapshot_fill(dsp_stats_snapshot *snap, const dsp_server *srv)
{
    memset(snap, 0, sizeof *snap);
    snap->uptime_ms = dsp_now_ms() - srv->stats.started_ms;
    snap->cfg = srv->cfg;
    snap->scheduler = dsp_sched_policy_name(srv->cfg->scheduler);
    snap->db_connected = srv->lead.db_connected;
    snap->health_ok = dsp_stats_health(srv, snap->health_reason, sizeof snap->health_reason);
    snap->leader = srv->lead.leading && dsp_db_lease_valid(srv->db);
    snap->epoch = srv->lead.leading && !snap->leader ? 0 : srv->lead.epoch; /* on_leader_lost zeroes it too */
    snap->nconns = srv->conns.n;
    snap->nworkers = srv->sched.nworkers;
    snap->worker_totals = srv->worker_totals.v;
    snap->nworker_totals = srv->worker_totals.n;
    snap->ntypes = srv->types.n;
    snap->nbuffered = srv->sched.nbuffered;
    snap->ninflight = srv->sched.ninflight;
    snap->payload_bytes = srv->tasks.payload_bytes;
    snap->draining = srv->control.draining || srv->control.admin_draining;
    snap->shutting_down = srv->control.draining;
    snap->paused_all = srv->control.paused_all;
    snap->tasks = srv->stats.tasks;
    snap->conns = srv->stats.conns;

    dsp_db_counters dbc;
    dsp_db_counters_get(srv->db, &dbc);
#define X(field, key, metric, divisor, help) snap->db.field = dbc.field;
    DSP_DB_COUNTERS(X)
#undef X
    snap->sql_dialect = dbc.sql_dialect;
    dsp_db_wake_status(srv->db, &snap->wake);
    snap->node_host = dbc.node_host;
    snap->node_port = dbc.node_port;
    snap->galera = dbc.galera;
    snap->lease_ms = dbc.lease_ms;
    snap->lease_renew_ms = dbc.lease_renew_ms;
    snap->pending_writes = srv->outbox.n + dsp_db_pending_writes(srv->db);
    snap->pending_write_bytes = srv->outbox.bytes + dsp_db_pending_write_bytes(srv->db);
    snap->hist = srv->stats.hist;
    for (int i = 0; i < DSP_STATS_RATE_WINDOWS; i++)
        dsp_rates_get(&srv->stats.rates, rate_windows_s[i], &snap->dispatched_per_s[i],
                      &snap->completed_per_s[i]);

    snap->last_requeue = srv->control.last_requeue;

    snap->table = malloc(sizeof *snap->table);
    if (snap->table)
        dsp_db_table_stats_get(srv->db, snap->table);
    /* After the copy: the figures' age is never negative. */
    snap->wall_ms = dsp_wall_ms();
    fill_paused(snap, srv);
    fill_workers(snap, srv);
    fill_types(snap, srv);
    snap->limits = srv->limits.items;
    snap->nlimits = srv->limits.n;
}

void dsp_stats_snapshot_clear(dsp_stats_snapshot *snap)
{
    free(snap->table);
    free(snap->paused_types);
    free(snap->workers);
    free(snap->held_types);
    memset(snap, 0, sizeof *snap);
}

/* ---- GET /stats ---- */

static void add_setting(void *arg, const char *key, const char *val)
{
    json_object_set_new(arg, key, json_string(val));
}

static json_t *rates_json(const dsp_stats_snapshot *snap)
{
    static const char *const names[DSP_STATS_RATE_WINDOWS] = {"1s", "10s", "60s"};
    json_t *d = json_object(), *c = json_object();
    for (int i = 0; i < DSP_STATS_RATE_WINDOWS; i++) {
        json_object_set_new(d, names[i], json_real(snap->dispatched_per_s[i]));
        json_object_set_new(c, names[i], json_real(snap->completed_per_s[i]));
    }
    return json_pack("{s:o, s:o}", "dispatched_per_s", d, "completed_per_s", c);
}

static json_t *table_json(const dsp_table_stats *ts, int64_t wall_ms)
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
        json_array_append_new(types, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "type", t->type, "new_ready",
                                               (json_int_t)t->new_ready, "new_delayed",
                                               (json_int_t)t->new_delayed, "processing",
                                               (json_int_t)t->processing, "failed", (json_int_t)t->failed,
                                               "oldest_ready_age_ms", (json_int_t)t->oldest_ready_age_ms));
    }
    int64_t age = ts->valid ? wall_ms - ts->refreshed_wall_ms : -1;
    return json_pack("{s:b, s:I, s:I, s:o, s:b, s:o, s:I, s:o, s:I, s:I}", "valid", ts->valid, "age_ms",
                     (json_int_t)age, "refresh_us", (json_int_t)ts->duration_us, "by_state", states,
                     "successful_capped", ts->successful_capped, "new_by_priority", prio,
                     "oldest_ready_age_ms", (json_int_t)ts->oldest_ready_age_ms, "types", types,
                     "retention_deleted_total", (json_int_t)ts->retention_deleted_total,
                     "orphans_recovered_total", (json_int_t)ts->orphans_recovered_total);
}

static json_t *paused_json(const dsp_stats_snapshot *snap)
{
    json_t *types = json_array();
    for (size_t i = 0; i < snap->npaused_types; i++)
        json_array_append_new(types, json_string(snap->paused_types[i]));
    return json_pack("{s:b, s:o}", "all", snap->paused_all, "types", types);
}

/* The per-type limits, held types or not (at most --max-types entries). */
static json_t *limits_json(const dsp_stats_snapshot *snap)
{
    json_t *a = json_array();
    for (size_t i = 0; i < snap->nlimits; i++) {
        const dsp_type_limit *l = &snap->limits[i];
        char *name = dsp_utf8_copy(l->type);
        static const char *const sources[] = {"flag", "config", "runtime"};
        json_array_append_new(a, json_pack("{s:s?, s:I, s:I, s:I, s:s}", "type", name, "concurrency",
                                           (json_int_t)l->concurrency, "rate", (json_int_t)l->rate,
                                           "per_group", (json_int_t)l->per_group, "source",
                                           sources[l->source <= DSP_LIMIT_RUNTIME ? l->source : 0]));
        free(name);
    }
    return a;
}

static json_t *held_types_json(const dsp_stats_snapshot *snap)
{
    json_t *a = json_array();
    for (size_t i = 0; i < snap->nheld_types; i++) {
        const dsp_stats_type *t = &snap->held_types[i];
        char *name = dsp_utf8_copy(t->name);
        json_array_append_new(a, json_pack("{s:s?, s:I, s:I, s:I, s:b, s:I, s:I, s:I, s:I, s:I}", "type", name,
                                           "workers", (json_int_t)t->workers, "buffered", (json_int_t)t->buffered,
                                           "in_flight", (json_int_t)t->in_flight, "paused", t->paused,
                                           "limit_concurrency", (json_int_t)t->limit_concurrency,
                                           "limit_rate", (json_int_t)t->limit_rate, "limit_per_group",
                                           (json_int_t)t->limit_per_group, "answered_ok_total",
                                           (json_int_t)t->answered_ok, "answered_failed_total",
                                           (json_int_t)t->answered_failed));
        free(name);
    }
    return a;
}

static json_t *requeue_json(const dsp_stats_snapshot *snap)
{
    if (snap->last_requeue.id == 0)
        return json_null();
    json_t *o = json_pack("{s:I, s:s, s:s}", "request_id", (json_int_t)snap->last_requeue.id, "type",
                          snap->last_requeue.type,
                          "state", !snap->last_requeue.done          ? "pending"
                                   : snap->last_requeue.rows < 0 ? "failed"
                                                                 : "done");
    if (snap->last_requeue.done && snap->last_requeue.rows >= 0)
        json_object_set_new(o, "rows", json_integer((json_int_t)snap->last_requeue.rows));
    return o;
}

json_t *dsp_stats_json(const dsp_stats_snapshot *snap)
{
    json_t *tasks = json_object();
#define X(name, help) json_object_set_new(tasks, #name, json_integer((json_int_t)snap->tasks.name));
    DSP_TASK_COUNTERS(X)
#undef X
    json_t *conns = json_object();
#define X(name, help) json_object_set_new(conns, #name, json_integer((json_int_t)snap->conns.name));
    DSP_CONN_COUNTERS(X)
#undef X
    json_object_set_new(conns, "open", json_integer((json_int_t)snap->nconns));

    json_t *db = json_object();
#define X(field, key, metric, divisor, help) json_object_set_new(db, key, json_integer((json_int_t)snap->db.field));
    DSP_DB_COUNTERS(X)
#undef X
    json_object_set_new(db, "pending_writes", json_integer((json_int_t)snap->pending_writes));
    json_object_set_new(db, "pending_write_bytes", json_integer((json_int_t)snap->pending_write_bytes));
    json_object_set_new(db, "sql_dialect", json_string(snap->sql_dialect ? snap->sql_dialect : "auto"));
    if (snap->node_host) { /* the server of --db in use; its port, 0: the default */
        json_object_set_new(db, "node", json_string(snap->node_host));
        json_object_set_new(db, "node_port", json_integer(snap->node_port));
    }
    json_object_set_new(db, "galera", json_boolean(snap->galera));
    json_object_set_new(db, "lease_ms", json_integer((json_int_t)snap->lease_ms));
    json_object_set_new(db, "lease_renew_ms", json_integer((json_int_t)snap->lease_renew_ms));
    json_t *settings = json_object();
    dsp_config_each(snap->cfg, add_setting, settings);

    json_t *table = snap->table ? table_json(snap->table, snap->wall_ms) : json_null();

    /* "draining": either kind (POST /drain, or a signal's drain before exit). */
    json_t *o = json_pack("{s:I, s:b, s:b, s:I, s:s, s:I, s:b, s:o, s:{s:I, s:I, s:I}, s:o, s:o, s:o}",
                     "uptime_s", (json_int_t)(snap->uptime_ms / 1000),
                     "db_connected", snap->db_connected, "leader", snap->leader, "epoch",
                     (json_int_t)snap->epoch, "scheduler", snap->scheduler,
                     "workers", (json_int_t)snap->nworkers, "draining", snap->draining, "tasks", tasks,
                     "queue", "buffered", (json_int_t)snap->nbuffered, "in_flight",
                     (json_int_t)snap->ninflight, "payload_bytes", (json_int_t)snap->payload_bytes,
                     "connections", conns, "db", db, "settings", settings);
    if (!o) {
        json_decref(table);
        return NULL;
    }
    json_object_set_new(o, "shutting_down", json_boolean(snap->shutting_down));
    json_object_set_new(o, "wake",
                        json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:b, s:I}", "mode",
                                  snap->wake.mode == DSP_WAKE_BINLOG ? "binlog" : "poll", "reason",
                                  snap->wake.reason, "events_total", (json_int_t)snap->wake.events,
                                  "wakes_total", (json_int_t)snap->wake.wakes, "reconnects_total",
                                  (json_int_t)snap->wake.reconnects, "unreadable_total",
                                  (json_int_t)snap->wake.unreadable, "resting", snap->wake.resting,
                                  "rests_total", (json_int_t)snap->wake.rests));
    {
        /* The follower's replica server_id (null while not following) and why its last
         * stream ended (a server's error text: made valid UTF-8; null before any). */
        json_t *w = json_object_get(o, "wake");
        char *end = snap->wake.last_end[0] ? dsp_utf8_copy(snap->wake.last_end) : NULL;
        if (w != NULL) {
            json_object_set_new(w, "server_id", snap->wake.server_id
                                                    ? json_integer((json_int_t)snap->wake.server_id)
                                                    : json_null());
            json_object_set_new(w, "last_end", end ? json_string(end) : json_null());
        }
        free(end);
    }
    {
        /* The reason comes from the database's error texts: made valid UTF-8. */
        char *why = snap->health_ok ? NULL : dsp_utf8_copy(snap->health_reason);
        json_object_set_new(o, "health", json_pack("{s:b, s:o}", "ok", snap->health_ok, "reason",
                                                   why ? json_string(why) : json_null()));
        free(why);
    }
    json_object_set_new(o, "types", json_integer((json_int_t)snap->ntypes));
    json_object_set_new(o, "paused", paused_json(snap));
    json_object_set_new(o, "rates", rates_json(snap));
    json_object_set_new(o, "table", table);
    json_object_set_new(o, "last_requeue", requeue_json(snap));
    json_object_set_new(o, "by_type", held_types_json(snap));
    json_object_set_new(o, "by_type_cut", json_boolean(snap->held_types_cut));
    json_object_set_new(o, "limits", limits_json(snap));
    /* --table: "table" above is the object of the table's figures, so the name has a key
     * of its own. */
    json_object_set_new(o, "task_table",
                        json_string(snap->cfg && snap->cfg->table ? snap->cfg->table
                                                                  : DSP_TABLE_NAME_DEFAULT));
    return o;
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

static void metrics_table(struct evbuffer *out, const dsp_table_stats *ts, int64_t wall_ms)
{
    gauge(out, "table_stats_valid", "1 once the table-side figures were read at least once",
          ts->valid ? 1 : 0);
    counter(out, "table_retention_deleted_total", "finished rows deleted by retention",
            ts->retention_deleted_total);
    counter(out, "table_orphans_recovered_total",
            "PROCESSING rows no dispatcher could hold, put back to NEW", ts->orphans_recovered_total);
    if (!ts->valid)
        return;
    gauge(out, "table_stats_age_seconds", "age of the table-side figures",
          (double)(wall_ms - ts->refreshed_wall_ms) / 1000.0);
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

/* One /metrics worker series: the connections of one label, live and gone. */
typedef struct worker_series {
    char label[DSP_WORKER_LABEL_MAX + 1];
    uint64_t v[4]; /* connections, capacity, in_flight, completed_total */
} worker_series;

static int series_cmp(const void *a, const void *b)
{
    return strcmp(((const worker_series *)a)->label, ((const worker_series *)b)->label);
}

/* The per-worker lines, one family after the other, one series per worker name: its
 * live connections summed, and what its closed ones finished (a counter that goes on
 * across reconnects). Labelled by connection, every reconnect was a new series. */
static void metrics_workers(struct evbuffer *out, const dsp_stats_snapshot *snap)
{
    static const char *const wnames[4] = {"worker_connections", "worker_capacity", "worker_in_flight",
                                          "worker_completed_total"};
    static const char *const wtypes[4] = {"gauge", "gauge", "gauge", "counter"};
    static const char *const whelp[4] = {"connections open under a worker name", "slots a worker offers",
                                         "tasks a worker holds",
                                         "tasks a worker finished, across its reconnects"};
    size_t cap = snap->nworker_rows + snap->nworker_totals, n = 0;
    worker_series *ws = cap ? calloc(cap, sizeof *ws) : NULL;
    for (size_t i = 0; ws && i < snap->nworker_totals; i++) { /* labels are distinct here */
        memcpy(ws[n].label, snap->worker_totals[i].label, sizeof ws[n].label);
        ws[n++].v[3] = snap->worker_totals[i].completed;
    }
    if (ws)
        qsort(ws, n, sizeof *ws, series_cmp);
    size_t ngone = n;
    for (size_t i = 0; ws && i < snap->nworker_rows; i++) {
        const dsp_stats_worker *w = &snap->workers[i];
        worker_series key;
        dsp_stats_worker_label(w->name, key.label);
        worker_series *s = ngone ? bsearch(&key, ws, ngone, sizeof *ws, series_cmp) : NULL;
        for (size_t k = ngone; !s && k < n; k++) /* another live connection of the name */
            if (strcmp(ws[k].label, key.label) == 0)
                s = &ws[k];
        if (!s) {
            s = &ws[n++];
            memcpy(s->label, key.label, sizeof key.label);
        }
        s->v[0]++;
        s->v[1] += w->capacity;
        s->v[2] += w->in_flight;
        s->v[3] += w->completed_total;
    }
    for (int k = 0; k < 4; k++) {
        family(out, wnames[k], wtypes[k], whelp[k]);
        for (size_t i = 0; i < n; i++) {
            evbuffer_add_printf(out, "taskpush_%s{worker=\"", wnames[k]);
            label_value(out, ws[i].label);
            evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)ws[i].v[k]);
        }
    }
    free(ws);
}

void dsp_stats_metrics(const dsp_stats_snapshot *snap, struct evbuffer *out)
{
    family(out, "build_info", "gauge", "1, labelled with the version of taskpushd");
    evbuffer_add_printf(out, "taskpush_build_info{version=\"%s\"} 1\n", TASKPUSH_VERSION);
#define X(name, help) counter(out, #name, help, snap->tasks.name);
    DSP_TASK_COUNTERS(X)
#undef X
#define X(name, help) counter(out, "connections_" #name, help, snap->conns.name);
    DSP_CONN_COUNTERS(X)
#undef X
    gauge(out, "connections_open", "open connections on the worker port", (double)snap->nconns);
    gauge(out, "workers", "connected workers (past HELLO)", (double)snap->nworkers);
    gauge(out, "types", "task types held: registered by a worker, buffered or paused", (double)snap->ntypes);
    gauge(out, "queue_buffered", "claimed tasks waiting in memory for a worker", (double)snap->nbuffered);
    gauge(out, "queue_in_flight", "tasks delivered and not yet done", (double)snap->ninflight);
    gauge(out, "queue_payload_bytes", "payload bytes of the claimed tasks held (--max-buffered-bytes)",
          (double)snap->payload_bytes);
    gauge(out, "db_connected", "1 while the database is reachable", snap->db_connected ? 1 : 0);
    gauge(out, "leader", "1 while this dispatcher leads the table", snap->leader ? 1 : 0);
    gauge(out, "epoch", "the fencing epoch of this dispatcher", (double)snap->epoch);
    gauge(out, "wake_binlog", "1 while the binary log wakes the claim (--wake), 0 while only polling",
          snap->wake.mode == DSP_WAKE_BINLOG ? 1 : 0);
    counter(out, "wake_events_total", "binary log events read by the wake follower", snap->wake.events);
    counter(out, "wake_wakes_total", "transactions in the binary log that made a task row NEW",
            snap->wake.wakes);
    counter(out, "wake_reconnects_total", "sessions of the binary log follower that ended",
            snap->wake.reconnects);
    counter(out, "wake_unreadable_total", "ROWS events of the task table not read (woke at once)",
            snap->wake.unreadable);
    counter(out, "wake_rests_total", "floods of inserts during which the follower left the log",
            snap->wake.rests);
    gauge(out, "uptime_seconds", "seconds since start", (double)snap->uptime_ms / 1000.0);
    gauge(out, "paused", "1 while every type is paused", snap->paused_all ? 1 : 0);
    gauge(out, "draining", "1 while draining", snap->draining ? 1 : 0);

#define X(field, key, metric, divisor, help) scaled_counter(out, metric, help, snap->db.field, divisor);
    DSP_DB_COUNTERS(X)
#undef X
    gauge(out, "db_pending_writes", "outcomes not yet written (in the loop's outbox, queued or being written)",
          (double)snap->pending_writes);
    gauge(out, "db_pending_write_bytes", "result and error bytes of the outcomes not yet written",
          (double)snap->pending_write_bytes);

#define X(field, name, help) histogram(out, name, help, &snap->hist.field);
    DSP_HISTOGRAMS(X)
#undef X

    metrics_workers(out, snap);
    if (snap->table)
        metrics_table(out, snap->table, snap->wall_ms);
}
