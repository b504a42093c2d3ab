/* db_stats: the stats thread (see db_internal.h for what it shares), on a connection of
 * its own that takes no part in leadership: the table figures (dsp_table_stats),
 * retention of old SUCCESSFUL/FAILED rows, the operator's requeue of FAILED rows, and
 * the task-level requests (show, failed, retry, cancel: dsp_taskop).
 */
#include "db_internal.h"

#include <mysql.h>

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the stats thread ---- */

#define RETAIN_BATCH 1000u         /* rows per retention DELETE */
#define RETAIN_BATCHES 20          /* most DELETEs per state per round: figures stay fresh */
#define RETAIN_EVERY_MS 10000      /* least gap between retention rounds that found no more
                                    * to delete (each reads every SUCCESSFUL/FAILED row's
                                    * last_update_time: no index has it) */
#define STATS_REST_FACTOR 10       /* a stats round waits 10 x its own duration at least */
#define REQUEUE_BATCH 5000u        /* rows per requeue UPDATE */
#define FAILED_TYPES_MAX 256u      /* types one GET /failed merges */

/* What the leader's stats thread knows of the table's dependencies, which sets how
 * often it sweeps (stats_deps): an idle table without dependencies costs no statement a
 * second. */
enum deps_mode {
    DEPS_UNKNOWN, /* not leading yet, or just became the leader: look now */
    DEPS_NONE,    /* no dependency row: look again every DSP_DEPS_DISCOVER_MS */
    DEPS_IDLE,    /* dependency rows, no task waiting: sweep every DSP_DEPS_IDLE_MS */
    DEPS_ACTIVE,  /* tasks wait: sweep every DSP_DEPS_SWEEP_MS */
};

struct stats_ctx {
    dsp_db *db;
    struct dbconn c;
    dsp_strbuf sql;
    dsp_table_stats *work;                      /* the figures being read */
    uint8_t lane0[DSP_TABLE_STATS_MAX_TYPES];   /* per type: priorities (bits) in the ready lane */
    uint8_t keyed0[DSP_TABLE_STATS_MAX_TYPES];  /* the same for its rows with a key (group_idx) */
    int64_t next_connect;                       /* monotonic: no connection attempt before */
    int64_t next_retain;                        /* monotonic: no retention round before */
    int64_t next_deps;                          /* monotonic: no dependency sweep before */
    struct dsp_deps_cursor deps_cur;            /* where the next sweep starts */
    unsigned deps_fails;                        /* sweeps failed in a row */
    enum deps_mode deps_mode;                   /* what the sweeps know of the table */
    uint64_t deps_marks;                        /* db->deps_marks as last seen */
    bool deps_waiting_seen;                     /* the table figures counted waiting rows */
    bool types_full_logged;
};

static bool stats_stopping(dsp_db *db)
{
    bool s;
    pthread_mutex_lock(&db->mu);
    s = db->stats_stop;
    pthread_mutex_unlock(&db->mu);
    return s;
}

static void stats_drop(struct stats_ctx *x)
{
    dsp_dbi_conn_close(&x->c);
    x->next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&x->c);
}

/* 0 when connected; -1 while the backoff lasts or the connection failed. With now,
 * tries at once whatever the backoff. */
static int stats_connect(struct stats_ctx *x, bool now)
{
    if (dsp_dbi_conn_stale(&x->c))
        dsp_dbi_conn_close(&x->c); /* off to the server in use */
    if (x->c.m)
        return 0;
    if (!now && dsp_now_ms() < x->next_connect)
        return -1;
    if (dsp_dbi_conn_open(&x->c, true, false) < 0) {
        x->next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&x->c);
        return -1;
    }
    return 0;
}

static uint64_t field_u64(const char *v)
{
    return v ? strtoull(v, NULL, 10) : 0;
}

/* The slot of type t[0..len) in w->types, added when new; -1 when full. */
static int stats_type_slot(struct stats_ctx *x, const char *t, size_t len)
{
    dsp_table_stats *w = x->work;
    size_t i;

    if (len >= sizeof w->types[0].type)
        return -1;
    for (i = 0; i < w->ntypes; i++)
        if (strlen(w->types[i].type) == len && memcmp(w->types[i].type, t, len) == 0)
            return (int)i;
    if (w->ntypes >= DSP_TABLE_STATS_MAX_TYPES) {
        if (!x->types_full_logged)
            log_warn(x->db->log, "more than %d task types have rows; table figures show %d",
                     DSP_TABLE_STATS_MAX_TYPES, DSP_TABLE_STATS_MAX_TYPES);
        x->types_full_logged = true;
        return -1;
    }
    memcpy(w->types[w->ntypes].type, t, len);
    w->types[w->ntypes].type[len] = '\0';
    w->types[w->ntypes].oldest_ready_age_ms = -1;
    x->lane0[w->ntypes] = 0;
    x->keyed0[w->ntypes] = 0;
    return (int)w->ntypes++;
}

static int type_stats_cmp(const void *pa, const void *pb)
{
    const dsp_table_type_stats *a = pa, *b = pb;
    return strcmp(a->type, b->type);
}

static int u64_cmp(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a < b ? -1 : a > b;
}

/* Counts the PROCESSING rows per type among those task_claim lists (each id once, the
 * shard's types only) into the work figures. Returns 0 or -1 (database error). */
static int stats_processing(struct stats_ctx *x)
{
    /* Bounds what one refresh reads: the lists of about a thousand claims. */
    enum { IDS_MAX = 1000000, CHUNK = 5000 };
    dsp_db *db = x->db;
    dsp_table_stats *w = x->work;
    uint64_t *ids = NULL;
    size_t nids = 0, cap = 0, i, u;
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 0;

    char sql[32 + DSP_TABLE_IDENT_CAP];

    snprintf(sql, sizeof sql, "SELECT task_ids FROM %s", x->db->names.claim);
    if ((res = dsp_dbi_query(&x->c, sql, strlen(sql))) == NULL)
        return -1;
    while ((row = mysql_fetch_row(res)) != NULL && nids < IDS_MAX) {
        unsigned long *len = mysql_fetch_lengths(res);
        size_t n = 0, most = row[0] ? len[0] / 2 + 1 : 0; /* "1,2,3": one id per 2 bytes */
        if (most > DSP_CLAIM_IDS_MAX)
            most = DSP_CLAIM_IDS_MAX;
        if (cap - nids < most) {
            size_t ncap = (nids + most) * 2;
            uint64_t *p = realloc(ids, ncap * sizeof *p);
            if (p == NULL)
                break; /* counts what was read */
            ids = p;
            cap = ncap;
        }
        if (most && dsp_claim_ids_parse(row[0], len[0], ids + nids, most, &n) == 0)
            nids += n;
    }
    mysql_free_result(res);
    if (nids > 1)
        qsort(ids, nids, sizeof *ids, u64_cmp);
    for (i = 0, u = 0; i < nids; i++)
        if (u == 0 || ids[u - 1] != ids[i])
            ids[u++] = ids[i];
    for (i = 0; i < u && rc == 0; i += CHUNK) {
        size_t m = u - i < CHUNK ? u - i : CHUNK;
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_stats_processing(&x->sql, &x->db->names, ids + i, m, db->in);
        if (x->sql.oom || (res = dsp_dbi_query(&x->c, x->sql.p, x->sql.len)) == NULL) {
            rc = -1;
            break;
        }
        while ((row = mysql_fetch_row(res)) != NULL) {
            unsigned long *len = mysql_fetch_lengths(res);
            uint64_t rows;
            int slot;
            if (mysql_num_fields(res) != 2 || row[0] == NULL || row[1] == NULL)
                continue;
            rows = field_u64(row[1]);
            w->by_state[1] += rows;
            slot = stats_type_slot(x, row[0], len[0]);
            if (slot >= 0)
                w->types[slot].processing += rows;
        }
        mysql_free_result(res);
    }
    free(ids);
    return rc;
}

/* Reads the figures and publishes them. Returns 0 or -1 (database error). */
/* The types with the most ready rows first. */
static int ready_desc_cmp(const void *pa, const void *pb, void *arg)
{
    const dsp_table_type_stats *types = arg;
    uint64_t a = types[*(const uint16_t *)pa].new_ready, b = types[*(const uint16_t *)pb].new_ready;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* 5. The busiest waiting keys of the types with the most ready rows (GET /keys): one
 * statement, a bounded range of group_idx per type. */
static int stats_keys(struct stats_ctx *x)
{
    dsp_table_stats *w = x->work;
    uint16_t order[DSP_TABLE_STATS_MAX_TYPES];
    size_t n = 0;
    MYSQL_RES *res;
    MYSQL_ROW row;

    for (size_t i = 0; i < w->ntypes; i++)
        if (w->types[i].new_ready > 0)
            order[n++] = (uint16_t)i;
    if (n == 0)
        return 0;
    qsort_r(order, n, sizeof order[0], ready_desc_cmp, w->types);
    if (n > DSP_TABLE_KEYS_TYPES)
        n = DSP_TABLE_KEYS_TYPES;
    dsp_strbuf_reset(&x->sql);
    for (size_t i = 0; i < n; i++) {
        const char *ty = w->types[order[i]].type;
        dsp_db_sql_stats_keys_part(&x->sql, &x->db->names, i == 0, order[i], ty, strlen(ty),
                                   DSP_TABLE_KEYS_SCAN, DSP_TABLE_KEYS_TOP);
    }
    if (x->sql.oom || (res = dsp_dbi_query(&x->c, x->sql.p, x->sql.len)) == NULL)
        return -1;
    while ((row = mysql_fetch_row(res)) != NULL && w->nkeys < DSP_TABLE_KEYS_TYPES * DSP_TABLE_KEYS_TOP) {
        unsigned long *len = mysql_fetch_lengths(res);
        if (mysql_num_fields(res) != 4 || row[0] == NULL || row[1] == NULL || len[1] > 191)
            continue;
        uint64_t slot = field_u64(row[0]);
        if (slot >= w->ntypes)
            continue;
        dsp_table_key_stats *k = &w->keys[w->nkeys++];
        k->type_slot = (uint16_t)slot;
        k->key_len = (uint8_t)len[1];
        memcpy(k->key, row[1], len[1]);
        k->waiting = field_u64(row[2]);
        w->types[slot].keyed_read = field_u64(row[3]);
    }
    mysql_free_result(res);
    return 0;
}

static int stats_refresh(struct stats_ctx *x)
{
    dsp_db *db = x->db;
    dsp_table_stats *w = x->work;
    int64_t t0 = dsp_now_us(), now = dsp_wall_ms();
    MYSQL_RES *res;
    MYSQL_ROW row;
    uint64_t v;
    bool isnull, any = false;
    size_t i;
    int p;

    memset(w, 0, sizeof *w);
    w->oldest_ready_age_ms = -1;

    /* 1. NEW and FAILED per (state, lane, type). */
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_stats_counts(&x->sql, &x->db->names, now, x->db->in);
    if (x->sql.oom || (res = dsp_dbi_query(&x->c, x->sql.p, x->sql.len)) == NULL)
        return -1;
    if (mysql_num_fields(res) != DSP_DB_SQL_COUNTS_NCOLS) {
        log_error(db->log, "table figures: %u columns, expected %d", mysql_num_fields(res),
                  DSP_DB_SQL_COUNTS_NCOLS);
        mysql_free_result(res);
        return -1;
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        uint64_t state = field_u64(row[DSP_DB_SQL_COUNTS_STATE]);
        uint64_t lane = field_u64(row[DSP_DB_SQL_COUNTS_DELAYED]);
        uint64_t rows = field_u64(row[DSP_DB_SQL_COUNTS_ROWS]);
        uint64_t due = field_u64(row[DSP_DB_SQL_COUNTS_DUE]);
        bool keyed = field_u64(row[DSP_DB_SQL_COUNTS_KEYED]) == 1;
        uint64_t pr[3];
        int slot;

        if (state > 3 || row[DSP_DB_SQL_COUNTS_TYPE] == NULL)
            continue;
        for (p = 0; p < 3; p++)
            pr[p] = field_u64(row[DSP_DB_SQL_COUNTS_P0 + p]);
        w->by_state[state] += rows;
        if (state == 0)
            for (p = 0; p < 3; p++)
                w->new_by_priority[p] += pr[p];
        slot = stats_type_slot(x, row[DSP_DB_SQL_COUNTS_TYPE], len[DSP_DB_SQL_COUNTS_TYPE]);
        if (slot < 0)
            continue;
        switch (state) {
        case 0:
            if (lane == 2) { /* waiting for dependencies (db_deps.c): not ready, whenever due */
                w->types[slot].new_delayed += rows;
                if (rows > 0)
                    x->deps_waiting_seen = true;
                break;
            }
            w->types[slot].new_ready += due;
            w->types[slot].new_delayed += rows - (due < rows ? due : rows);
            if (lane == 0)
                for (p = 0; p < 3; p++)
                    if (pr[p]) {
                        if (keyed)
                            x->keyed0[slot] |= (uint8_t)(1u << p);
                        else
                            x->lane0[slot] |= (uint8_t)(1u << p);
                    }
            break;
        case 1:
            w->types[slot].processing += rows;
            break;
        case 3:
            w->types[slot].failed += rows;
            break;
        }
    }
    mysql_free_result(res);

    /* 2. PROCESSING: the rows task_claim lists, read by primary key (claim_idx puts
     * them in one lane with the SUCCESSFUL ones). */
    if (stats_processing(x) < 0)
        return -1;

    /* 3. SUCCESSFUL, up to the cap: lane 1 less the PROCESSING rows. */
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_stats_successful(&x->sql, &x->db->names, DSP_DB_SQL_SUCCESSFUL_CAP, x->db->in);
    if (x->sql.oom || dsp_dbi_query_u64(&x->c, x->sql.p, &v, &isnull, 0) < 0)
        return -1;
    w->successful_capped = v >= DSP_DB_SQL_SUCCESSFUL_CAP;
    w->by_state[2] = v > w->by_state[1] ? v - w->by_state[1] : 0;

    /* 4. The oldest ready row of each type: the head of each (type, priority) of the
     * ready lane. */
    dsp_strbuf_reset(&x->sql);
    for (i = 0; i < w->ntypes; i++)
        for (p = 2; p >= 0; p--)
            for (int keyed = 0; keyed < 2; keyed++)
                if ((keyed ? x->keyed0[i] : x->lane0[i]) & (1u << p)) {
                    dsp_db_sql_stats_oldest_part(&x->sql, &x->db->names, !any, w->types[i].type,
                                                 strlen(w->types[i].type), p, now, keyed);
                    any = true;
                }
    if (any) {
        dsp_db_sql_stats_oldest_end(&x->sql);
        if (x->sql.oom || (res = dsp_dbi_query(&x->c, x->sql.p, x->sql.len)) == NULL)
            return -1;
        while ((row = mysql_fetch_row(res)) != NULL) {
            unsigned long *len = mysql_fetch_lengths(res);
            if (mysql_num_fields(res) != 2 || row[0] == NULL || row[1] == NULL)
                continue;
            int64_t since = strtoll(row[1], NULL, 10);
            int64_t age = now > since ? now - since : 0;
            int slot = stats_type_slot(x, row[0], len[0]);
            if (slot >= 0)
                w->types[slot].oldest_ready_age_ms = age;
            if (age > w->oldest_ready_age_ms)
                w->oldest_ready_age_ms = age;
        }
        mysql_free_result(res);
    }

    qsort(w->types, w->ntypes, sizeof w->types[0], type_stats_cmp);
    if (stats_keys(x) < 0)
        return -1;
    w->valid = true;
    w->refreshed_wall_ms = now;
    w->duration_us = dsp_now_us() - t0;
    pthread_mutex_lock(&db->mu);
    memcpy(db->tstats, w, sizeof *w);
    pthread_mutex_unlock(&db->mu);
    log_debug(db->log,
              "table figures: NEW %" PRIu64 " PROCESSING %" PRIu64 " SUCCESSFUL %" PRIu64
              "%s FAILED %" PRIu64 ", %zu type(s), oldest ready %" PRId64 " ms, in %" PRId64 " us",
              w->by_state[0], w->by_state[1], w->by_state[2], w->successful_capped ? "+" : "",
              w->by_state[3], w->ntypes, w->oldest_ready_age_ms, w->duration_us);
    return 0;
}

/* Deletes SUCCESSFUL and FAILED rows older than their retention, at most RETAIN_BATCHES
 * batches of each per round. Returns 0 when done, 1 when a state has more to delete,
 * -1 on a database error. */
static int stats_retention(struct stats_ctx *x)
{
    dsp_db *db = x->db;
    /* SUCCESSFUL rows without a key (claim_lane 1), with one (group_lane 1: version 12),
     * then FAILED rows (claim_lane 3, keyed or not). */
    static const int states[3] = {2, 2, 3};
    static const bool keyed[3] = {false, true, false};
    int64_t keep[3] = {db->opts.retain_succeeded_ms, db->opts.retain_succeeded_ms,
                       db->opts.retain_failed_ms};
    uint64_t n, total;
    int k, b, more = 0;

    for (k = 0; k < 3; k++) {
        if (keep[k] <= 0)
            continue;
        total = 0;
        for (b = 0; b < RETAIN_BATCHES && !stats_stopping(db); b++) {
            dsp_strbuf_reset(&x->sql);
            dsp_db_sql_retention(&x->sql, &x->db->names, states[k], keyed[k],
                                 dsp_wall_ms() - keep[k], RETAIN_BATCH, db->in);
            if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
                if (total)
                    log_info(db->log, "retention deleted %" PRIu64 " %s row(s)", total,
                             states[k] == 2 ? "SUCCESSFUL" : "FAILED");
                return -1;
            }
            total += n;
            atomic_fetch_add_explicit(&db->retention_deleted, n, memory_order_relaxed);
            if (n < RETAIN_BATCH)
                break;
        }
        if (b == RETAIN_BATCHES)
            more = 1;
        if (total)
            log_info(db->log, "retention deleted %" PRIu64 " %s row(s)", total,
                     states[k] == 2 ? "SUCCESSFUL" : "FAILED");
    }
    return more;
}

static void requeue_answer(dsp_db *db, uint64_t request_id, int64_t rows)
{
    struct msg *m = dsp_dbi_msg_new(MSG_REQUEUED);

    if (m == NULL) {
        log_error(db->log, "out of memory answering requeue request %" PRIu64, request_id);
        return;
    }
    m->request_id = request_id;
    m->rows = rows;
    dsp_dbi_post(db, m);
}

void dsp_dbi_requeue_req_free(struct requeue_req *r)
{
    if (r) {
        free(r->type);
        free(r->prows);
        free(r->pgone);
        free(r);
    }
}

/* Moves the FAILED rows of r back to NEW, in batches, and answers. */
static void stats_requeue(struct stats_ctx *x, struct requeue_req *r)
{
    dsp_db *db = x->db;
    uint64_t n = 0, total = 0;
    int64_t rows = -1;
    bool done = false;

    if (stats_connect(x, true) < 0) {
        log_warn(db->log, "requeue of FAILED rows: no database connection");
        goto out;
    }
    do {
        if (stats_stopping(db))
            break;
        dsp_strbuf_reset(&x->sql);
        dsp_db_sql_requeue_failed(&x->sql, &x->db->names, r->type, dsp_wall_ms(), REQUEUE_BATCH,
                                  db->in);
        if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
            if (!x->sql.oom)
                stats_drop(x);
            break;
        }
        total += n;
        done = n < REQUEUE_BATCH;
    } while (!done);
    if (done)
        rows = (int64_t)total;
    if (total)
        log_info(db->log, "requeued %" PRIu64 " FAILED row(s) of %s%s", total,
                 r->type ? "type " : "every type", r->type ? r->type : "");
    if (rows < 0)
        log_warn(db->log, "requeue of FAILED rows stopped after %" PRIu64 " row(s)", total);
out:
    requeue_answer(db, r->request_id, rows);
    dsp_dbi_requeue_req_free(r);
}

/* ---- runtime settings (the settings table, schema version 9) ---- */

/* Posts the settings read (taken over: freed with the message), or a failure. */
static void settings_answer(dsp_db *db, uint64_t request_id, dsp_setting *v, size_t n, bool ok)
{
    struct msg *m = dsp_dbi_msg_new(MSG_SETTINGS);

    if (m == NULL) {
        log_error(db->log, "out of memory answering the settings read");
        for (size_t i = 0; i < n; i++)
            free(v[i].type);
        free(v);
        return;
    }
    m->request_id = request_id;
    m->rows = ok ? (int64_t)n : -1;
    m->settings = v;
    m->nsettings = n;
    dsp_dbi_post(db, m);
}

/* Upserts r's setting into its type's row. */
static void stats_setting_save(struct stats_ctx *x, struct requeue_req *r)
{
    dsp_db *db = x->db;
    const dsp_setting *s = &r->setting;
    int64_t now = dsp_wall_ms();
    uint64_t n = 0;

    if (stats_connect(x, true) < 0) {
        log_warn(db->log, "runtime setting of type %s not stored: no database connection", r->type);
        goto out;
    }
    dsp_strbuf_reset(&x->sql);
    if (r->what == DSP_SETTING_RESUME_ALL) {
        dsp_strbuf_printf(&x->sql, "UPDATE %s SET paused = 0, updated_ms = %" PRId64 " WHERE paused = 1",
                          db->names.setting, now);
    } else {
        dsp_strbuf_printf(&x->sql, "INSERT INTO %s (task_type, has_limit, concurrency, rate, per_group,"
                                   " paused, updated_ms) VALUES (", db->names.setting);
        if (r->type[0])
            dsp_strbuf_put_hex(&x->sql, (const uint8_t *)r->type, strlen(r->type), false);
        else
            dsp_strbuf_puts(&x->sql, "''");
        if (r->what == DSP_SETTING_LIMITS)
            dsp_strbuf_printf(&x->sql, ", 1, %u, %u, %u, 0, %" PRId64 ") ON DUPLICATE KEY UPDATE"
                                       " has_limit = 1, concurrency = %u, rate = %u, per_group = %u,"
                                       " updated_ms = %" PRId64,
                              s->concurrency, s->rate, s->per_group, now, s->concurrency, s->rate,
                              s->per_group, now);
        else
            dsp_strbuf_printf(&x->sql, ", 0, 0, 0, 0, %d, %" PRId64 ") ON DUPLICATE KEY UPDATE"
                                       " paused = %d, updated_ms = %" PRId64,
                              s->paused ? 1 : 0, now, s->paused ? 1 : 0, now);
    }
    if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
        log_warn(db->log, "runtime setting of type %s not stored (the database refused it)",
                 r->type[0] ? r->type : "(every type)");
        if (!x->sql.oom)
            stats_drop(x);
    }
out:
    dsp_dbi_requeue_req_free(r);
}

/* Deletes the rows of r's ended tasks (one DELETE by primary key), then stores its
 * progress rows (one REPLACE: a task's row is its latest report): in that order, so that
 * a task that ended and was claimed again within the second keeps its new report. A
 * failure loses only this batch: progress is advisory, and the next report of a running
 * task writes its row again. */
static void stats_progress_save(struct stats_ctx *x, struct requeue_req *r)
{
    dsp_db *db = x->db;
    uint64_t n = 0;

    if (stats_connect(x, true) < 0) {
        log_debug(db->log, "progress of %zu task(s) not stored: no database connection", r->nprows);
        goto out;
    }
    if (r->npgone > 0) {
        dsp_strbuf_reset(&x->sql);
        dsp_strbuf_printf(&x->sql, "DELETE FROM %s WHERE task_id IN (", db->names.progress);
        for (size_t i = 0; i < r->npgone; i++)
            dsp_strbuf_printf(&x->sql, "%s%" PRIu64, i ? ", " : "", r->pgone[i]);
        dsp_strbuf_puts(&x->sql, ")");
        if (x->sql.oom || dsp_dbi_exec_retry(&x->c, x->sql.p, x->sql.len, &n) < 0) {
            log_warn(db->log, "progress rows of %zu ended task(s) not deleted", r->npgone);
            if (!x->sql.oom)
                stats_drop(x);
            goto out;
        }
        atomic_fetch_add_explicit(&db->progress_rows_deleted, n, memory_order_relaxed);
    }
    if (r->nprows > 0) {
        dsp_strbuf_reset(&x->sql);
        dsp_strbuf_printf(&x->sql, "REPLACE INTO %s (task_id, epoch, attempt, permille, message, reported_ms)"
                                   " VALUES ", db->names.progress);
        for (size_t i = 0; i < r->nprows; i++) {
            const dsp_progress_row *p = &r->prows[i];
            dsp_strbuf_printf(&x->sql, "%s(%" PRIu64 ", %u, %u, %u, ", i ? ", " : "", p->task_id, p->epoch,
                              p->attempt, (unsigned)p->permille);
            if (p->msg_len == 0)
                dsp_strbuf_puts(&x->sql, "''"); /* put_hex writes NULL for no bytes */
            else
                dsp_strbuf_put_hex(&x->sql, (const uint8_t *)p->msg, p->msg_len, false);
            dsp_strbuf_printf(&x->sql, ", %" PRId64 ")", p->reported_ms);
        }
        if (x->sql.oom || dsp_dbi_exec_retry(&x->c, x->sql.p, x->sql.len, &n) < 0) {
            log_warn(db->log, "progress of %zu task(s) not stored (the database refused it)", r->nprows);
            if (!x->sql.oom)
                stats_drop(x);
            goto out;
        }
        atomic_fetch_add_explicit(&db->progress_rows_written, r->nprows, memory_order_relaxed);
    }
out:
    atomic_fetch_sub(&db->progress_pending, 1);
    dsp_dbi_requeue_req_free(r);
}

/* Reads every row of the settings table (at most DSP_SETTINGS_MAX) and answers. */
static void stats_settings_load(struct stats_ctx *x, struct requeue_req *r)
{
    dsp_db *db = x->db;
    dsp_setting *v = NULL;
    size_t n = 0;
    bool ok = false;
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;

    if (stats_connect(x, true) < 0) {
        log_warn(db->log, "runtime settings not read: no database connection");
        goto out;
    }
    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_printf(&x->sql,
                      "SELECT task_type, has_limit, concurrency, rate, per_group, paused FROM %s"
                      " ORDER BY task_type LIMIT %d",
                      db->names.setting, DSP_SETTINGS_MAX);
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (x->sql.oom || mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
        (res = mysql_store_result(x->c.m)) == NULL || mysql_num_fields(res) != 6) {
        log_warn(db->log, "runtime settings not read: %s", x->c.m ? mysql_error(x->c.m) : "no connection");
        if (!x->sql.oom && res == NULL)
            stats_drop(x);
        goto out;
    }
    if ((v = calloc((size_t)mysql_num_rows(res) + 1, sizeof *v)) == NULL)
        goto out;
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        dsp_setting *s = &v[n];
        /* Every field is hostile: a type of 1 to 256 bytes without a NUL, or '' (every
         * type); numbers as the CHECKs allow. A row that breaks these is skipped. */
        if (!row[0] || len[0] > 256 || memchr(row[0], '\0', len[0]) || !row[1] || !row[2] ||
            !row[3] || !row[4] || !row[5])
            continue;
        unsigned long long c = strtoull(row[2], NULL, 10), rt = strtoull(row[3], NULL, 10),
                           g = strtoull(row[4], NULL, 10);
        if (c > 1000000 || rt > 1000000 || g > 1000000 || (s->type = malloc(len[0] + 1)) == NULL)
            continue;
        memcpy(s->type, row[0], len[0]);
        s->type[len[0]] = '\0';
        s->has_limit = strcmp(row[1], "1") == 0;
        s->concurrency = (uint32_t)c;
        s->rate = (uint32_t)rt;
        s->per_group = (uint32_t)g;
        s->paused = strcmp(row[5], "1") == 0;
        n++;
    }
    ok = mysql_errno(x->c.m) == 0;
out:
    if (res)
        mysql_free_result(res);
    settings_answer(db, r->request_id, v, n, ok);
    dsp_dbi_requeue_req_free(r);
}

/* ---- task-level requests (dsp_taskop) ---- */

static const char *const state_names[4] = {"NEW", "PROCESSING", "SUCCESSFUL", "FAILED"};

static json_t *col_int(const char *v)
{
    return v ? json_integer((json_int_t)strtoll(v, NULL, 10)) : json_null();
}

/* Table text as a JSON string: bytes that are not UTF-8 become U+FFFD. */
static json_t *col_text(const char *v)
{
    if (v == NULL)
        return json_null();
    char *clean = dsp_utf8_copy(v);
    json_t *j = clean ? json_string(clean) : NULL;
    free(clean);
    return j ? j : json_null();
}

static json_t *col_state(const char *v)
{
    uint64_t st = field_u64(v);
    return st < 4 ? json_string(state_names[st]) : json_integer((json_int_t)st);
}

static MYSQL_RES *taskop_query(struct stats_ctx *x)
{
    if (x->sql.oom)
        return NULL;
    MYSQL_RES *res = dsp_dbi_query(&x->c, x->sql.p, x->sql.len);
    if (res == NULL)
        stats_drop(x);
    return res;
}

/* SHOW of a PROCESSING row: the report its dispatcher stored last (the progress table,
 * by primary key), as "progress_stored", when it is of the row's delivery: its attempt,
 * or the next one (a delivery is recorded in the row after a second). A database error
 * leaves it out: the row itself was read. */
static void taskop_show_progress(struct stats_ctx *x, dsp_taskop *op, uint64_t attempts)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_printf(&x->sql, "SELECT permille, message, reported_ms, attempt FROM %s WHERE task_id = %" PRIu64,
                      x->db->names.progress, op->task_id);
    if (x->sql.oom || (res = dsp_dbi_query(&x->c, x->sql.p, x->sql.len)) == NULL)
        return;
    if (mysql_num_fields(res) == 4 && (row = mysql_fetch_row(res)) != NULL && row[0] && row[1] && row[2] && row[3]) {
        unsigned long *len = mysql_fetch_lengths(res);
        uint64_t permille = field_u64(row[0]), attempt = field_u64(row[3]);
        /* The table's bytes are hostile too: a value in range, a text of at most 256 bytes
         * of UTF-8 (col_text replaces what is not). */
        if (permille <= 1000 && len[1] <= DSP_DB_PROGRESS_MSG_MAX && (attempt == attempts || attempt == attempts + 1))
            json_object_set_new(op->answer, "progress_stored",
                                json_pack("{s:I, s:o, s:o}", "permille", (json_int_t)permille, "message",
                                          col_text(row[1]), "at_ms", col_int(row[2])));
    }
    mysql_free_result(res);
}

#define SHOW_DEPS_COUNT_MAX 100000u /* dependency rows one GET /task reads at most */
#define SHOW_DEPS_LIST 20u          /* unfinished dependencies it names */

/* SHOW: the task's dependencies (db_deps.c), when it has rows: "dependencies" {waiting
 * (still not released), total, pending (not SUCCESSFUL yet), pending_ids (the first
 * ones), failed, missing (those of them FAILED, or not in the table)}. Counts stop at
 * SHOW_DEPS_COUNT_MAX rows (total_capped). Left out on a database error. */
static void taskop_show_deps(struct stats_ctx *x, uint64_t task_id, bool waiting, json_t *o)
{
    const dsp_table_names *t = &x->db->names;
    MYSQL_RES *res;
    MYSQL_ROW row;
    uint64_t total = 0, pending = 0;

    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_printf(&x->sql,
                      "SELECT COUNT(*), COALESCE(SUM(p.task_id IS NULL OR p.task_state <> 2), 0) FROM"
                      " (SELECT parent_id FROM %s WHERE task_id = %" PRIu64 " LIMIT %u) d"
                      " LEFT JOIN %s p ON p.task_id = d.parent_id",
                      t->dep, task_id, SHOW_DEPS_COUNT_MAX, t->task);
    if ((res = taskop_query(x)) == NULL)
        return;
    if ((row = mysql_fetch_row(res)) != NULL) {
        total = field_u64(row[0]);
        pending = field_u64(row[1]);
    }
    mysql_free_result(res);
    if (total == 0 && !waiting)
        return;
    json_t *d = json_object(), *ids = json_array(), *failed = json_array(), *missing = json_array();
    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_printf(&x->sql,
                      "SELECT d.parent_id, p.task_state FROM (SELECT parent_id FROM %s WHERE task_id = %" PRIu64
                      " LIMIT %u) d LEFT JOIN %s p ON p.task_id = d.parent_id"
                      " WHERE p.task_id IS NULL OR p.task_state <> 2"
                      " ORDER BY p.task_state = 3 DESC, p.task_id IS NULL DESC, d.parent_id LIMIT %u",
                      t->dep, task_id, SHOW_DEPS_COUNT_MAX, t->task, SHOW_DEPS_LIST);
    if ((res = taskop_query(x)) != NULL) {
        while ((row = mysql_fetch_row(res)) != NULL) {
            json_t *id = json_integer((json_int_t)field_u64(row[0]));
            if (row[1] == NULL)
                json_array_append(missing, id);
            else if (field_u64(row[1]) == 3)
                json_array_append(failed, id);
            json_array_append_new(ids, id);
        }
        mysql_free_result(res);
    }
    json_object_set_new(d, "waiting", json_boolean(waiting));
    json_object_set_new(d, "total", json_integer((json_int_t)total));
    json_object_set_new(d, "total_capped", json_boolean(total >= SHOW_DEPS_COUNT_MAX));
    json_object_set_new(d, "pending", json_integer((json_int_t)pending));
    json_object_set_new(d, "pending_ids", ids);
    json_object_set_new(d, "failed", failed);
    json_object_set_new(d, "missing", missing);
    json_object_set_new(o, "dependencies", d);
}

/* SHOW: the row as an object. */
static void taskop_show(struct stats_ctx *x, dsp_taskop *op)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_task_show(&x->sql, &x->db->names, op->task_id, x->db->in);
    if ((res = taskop_query(x)) == NULL)
        return;
    if (mysql_num_fields(res) != DSP_DB_SQL_SHOW_NCOLS) {
        mysql_free_result(res);
        return;
    }
    if ((row = mysql_fetch_row(res)) == NULL) {
        op->status = DSP_TASKOP_NOT_FOUND;
    } else {
        op->state = (int)field_u64(row[DSP_DB_SQL_SHOW_STATE]);
        op->answer = json_object();
        json_t *o = op->answer;
        json_object_set_new(o, "task_id", col_int(row[DSP_DB_SQL_SHOW_ID]));
        json_object_set_new(o, "type", col_text(row[DSP_DB_SQL_SHOW_TYPE]));
        json_object_set_new(o, "state", col_state(row[DSP_DB_SQL_SHOW_STATE]));
        json_object_set_new(o, "priority", col_int(row[DSP_DB_SQL_SHOW_PRIORITY]));
        json_object_set_new(o, "attempts", col_int(row[DSP_DB_SQL_SHOW_ATTEMPTS]));
        json_object_set_new(o, "max_attempts", col_int(row[DSP_DB_SQL_SHOW_MAX_ATTEMPTS]));
        json_object_set_new(o, "insert_time_ms", col_int(row[DSP_DB_SQL_SHOW_INSERT_TIME]));
        json_object_set_new(o, "last_update_time_ms", col_int(row[DSP_DB_SQL_SHOW_UPDATE_TIME]));
        json_object_set_new(o, "run_after_ms", col_int(row[DSP_DB_SQL_SHOW_RUN_AFTER]));
        json_object_set_new(o, "timeout_ms", col_int(row[DSP_DB_SQL_SHOW_TIMEOUT]));
        json_object_set_new(o, "err_msg", col_text(row[DSP_DB_SQL_SHOW_ERR_MSG]));
        json_object_set_new(o, "result_bytes", col_int(row[DSP_DB_SQL_SHOW_RESULT_LEN]));
        json_object_set_new(o, "payload_bytes", col_int(row[DSP_DB_SQL_SHOW_PAYLOAD_LEN]));
        json_object_set_new(o, "epoch", col_int(row[DSP_DB_SQL_SHOW_EPOCH]));
        uint64_t lane = field_u64(row[DSP_DB_SQL_SHOW_DELAYED]);
        json_object_set_new(o, "delayed", json_boolean(lane == 1));
        op->status = DSP_TASKOP_OK;
        uint64_t attempts = field_u64(row[DSP_DB_SQL_SHOW_ATTEMPTS]);
        mysql_free_result(res);
        res = NULL;
        if (op->state == 1)
            taskop_show_progress(x, op, attempts);
        taskop_show_deps(x, op->task_id, lane == 2, o);
    }
    if (res)
        mysql_free_result(res);
}

/* A task type's bytes as the table holds them (at most 256, checked). */
struct type_name {
    char s[257];
    size_t len;
};

/* FAILED, step 1: the types with FAILED rows, one index dive of claim_idx each per
 * lane, at most max, each once (a FAILED row is in the delayed lane only when written so
 * by hand); each is added to parts as one part. Returns how many types, or -1 on a
 * database error. */
static int failed_types(struct stats_ctx *x, unsigned max, unsigned limit, dsp_strbuf *parts)
{
    struct type_name *names = malloc(max * sizeof *names), cur;
    unsigned n = 0, lane0 = 0;
    bool cut = false;
    MYSQL_RES *res;
    MYSQL_ROW row;

    if (names == NULL) {
        log_warn(x->db->log, "failed list: out of memory");
        return -1;
    }
    for (int lane = 0; lane < 2 && !cut; lane++) {
        bool after = false;
        for (;;) {
            dsp_strbuf_reset(&x->sql);
            dsp_db_sql_failed_next_type(&x->sql, &x->db->names, lane, after ? cur.s : NULL,
                                        after ? cur.len : 0, x->db->in);
            if ((res = taskop_query(x)) == NULL) {
                free(names);
                return -1;
            }
            row = mysql_num_fields(res) == 1 ? mysql_fetch_row(res) : NULL;
            unsigned long *len = row ? mysql_fetch_lengths(res) : NULL;
            bool found = row && row[0] && len[0] < sizeof cur.s;
            if (found) {
                memcpy(cur.s, row[0], len[0]);
                cur.s[len[0]] = '\0';
                cur.len = len[0];
            }
            mysql_free_result(res);
            if (!found)
                break;
            after = true;
            bool dup = false;
            for (unsigned i = 0; i < lane0 && !dup; i++)
                dup = names[i].len == cur.len && memcmp(names[i].s, cur.s, cur.len) == 0;
            if (dup)
                continue;
            if (n == max) {
                cut = true;
                break;
            }
            names[n++] = cur;
        }
        lane0 = n;
    }
    for (unsigned i = 0; i < n; i++)
        dsp_db_sql_failed_part(parts, &x->db->names, parts->len == 0, names[i].s, names[i].len,
                               limit, DSP_TASKOP_ERR_LIST_MAX, x->db->in);
    free(names);
    if (cut)
        log_warn(x->db->log, "failed list: FAILED rows of more than %u types; the list covers %u", max, max);
    return (int)n;
}

/* Whether a FAILED row's failure was permanent: the worker said never retry (FAIL_PERM,
 * or a result too large) before its attempts were used up. Such a row is FAILED with
 * attempts left; one whose attempts ran out, or that an operator cancelled, is not.
 * A permanent failure on the last attempt cannot be told from the attempts running out. */
static bool failure_permanent(const char *attempts, const char *max_attempts, const char *err)
{
    return attempts && max_attempts && field_u64(attempts) < field_u64(max_attempts) &&
           !(err && strcmp(err, "cancelled") == 0);
}

/* FAILED: the latest failures of each type (failed_idx), merged, the latest first. The
 * cost is bounded by the types with FAILED rows (one index dive each, at most
 * FAILED_TYPES_MAX) and limit index entries per type, never by the FAILED rows in all. */
static void taskop_failed(struct stats_ctx *x, dsp_taskop *op)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    dsp_strbuf parts = {0};
    int n = 0;

    if (op->type)
        dsp_db_sql_failed_part(&parts, &x->db->names, true, op->type, strlen(op->type), op->limit,
                               DSP_TASKOP_ERR_LIST_MAX, x->db->in);
    else
        n = failed_types(x, FAILED_TYPES_MAX, op->limit, &parts);
    op->answer = json_array();
    if (n < 0 || parts.len == 0) {
        op->status = n < 0 ? DSP_TASKOP_ERROR : DSP_TASKOP_OK;
        dsp_strbuf_free(&parts);
        return;
    }
    dsp_db_sql_failed_end(&parts, op->limit);
    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_put(&x->sql, parts.p, parts.len);
    if (parts.oom)
        x->sql.oom = true;
    dsp_strbuf_free(&parts);
    if ((res = taskop_query(x)) == NULL)
        return;
    /* last_update_time_ms is kept for the clients of before: it is the same time. */
    while (mysql_num_fields(res) == 7 && (row = mysql_fetch_row(res)) != NULL)
        json_array_append_new(op->answer,
                              json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b}", "task_id",
                                        (json_int_t)field_u64(row[0]), "type", col_text(row[1]),
                                        "priority", col_int(row[2]), "attempts", col_int(row[3]),
                                        "max_attempts", col_int(row[4]), "failed_at_ms",
                                        col_int(row[5]), "last_update_time_ms", col_int(row[5]),
                                        "err_msg", col_text(row[6]), "permanent",
                                        failure_permanent(row[3], row[4], row[6])));
    mysql_free_result(res);
    op->status = DSP_TASKOP_OK;
}

/* RETRY_FAILED: one UPDATE of at most op->limit rows, a range of failed_idx. */
static void taskop_retry_failed(struct stats_ctx *x, dsp_taskop *op)
{
    uint64_t n = 0;

    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_retry_failed_since(&x->sql, &x->db->names, op->type, strlen(op->type), op->since_ms,
                                  dsp_wall_ms(), op->limit, x->db->in);
    if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
        if (!x->sql.oom)
            stats_drop(x);
        return;
    }
    op->rows = n;
    op->status = DSP_TASKOP_OK;
    if (n)
        log_info(x->db->log, "%" PRIu64 " FAILED row(s) of type %s that failed since %" PRId64
                             " back to NEW by the operator", n, op->type, op->since_ms);
}

/* RETRY and CANCEL: one UPDATE by primary key guarded by the state it needs; when it
 * changed nothing, the row's state says why (no row, or another state). */
static void taskop_update(struct stats_ctx *x, dsp_taskop *op)
{
    uint64_t n = 0, v;
    bool isnull;
    int rc;

    dsp_strbuf_reset(&x->sql);
    if (op->kind == DSP_TASKOP_RETRY)
        dsp_db_sql_task_retry(&x->sql, &x->db->names, op->task_id, dsp_wall_ms(), x->db->in);
    else if (op->kind == DSP_TASKOP_CANCEL_ORPHAN)
        dsp_db_sql_task_cancel_orphan(&x->sql, &x->db->names, op->task_id, op->epoch, dsp_wall_ms(),
                                      x->db->in);
    else
        dsp_db_sql_task_cancel(&x->sql, &x->db->names, op->task_id, dsp_wall_ms(), x->db->in);
    if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &n) < 0) {
        if (!x->sql.oom)
            stats_drop(x);
        return;
    }
    if (n > 0) {
        op->status = DSP_TASKOP_OK;
        op->state = op->kind == DSP_TASKOP_RETRY ? 0 : 3;
        log_info(x->db->log, "task %" PRIu64 ": %s by the operator", op->task_id,
                 op->kind == DSP_TASKOP_RETRY    ? "FAILED back to NEW"
                 : op->kind == DSP_TASKOP_CANCEL ? "NEW cancelled"
                                                 : "PROCESSING held by no dispatcher cancelled");
        return;
    }
    dsp_strbuf_reset(&x->sql);
    dsp_db_sql_task_state(&x->sql, &x->db->names, op->task_id, x->db->in);
    if (x->sql.oom || (rc = dsp_dbi_query_u64(&x->c, x->sql.p, &v, &isnull, 0)) < 0) {
        if (!x->sql.oom)
            stats_drop(x);
        return;
    }
    op->status = rc == 1 ? DSP_TASKOP_NOT_FOUND : DSP_TASKOP_CONFLICT;
    op->state = (int)v;
}

static void taskop_post(dsp_db *db, dsp_taskop *op)
{
    struct msg *m = dsp_dbi_msg_new(MSG_TASKOP);

    if (m == NULL) {
        /* The HTTP request stays unanswered until evhttp's timeout closes it. */
        log_error(db->log, "out of memory answering a task request");
        dsp_taskop_free(op);
        return;
    }
    m->op = op;
    dsp_dbi_post(db, m);
}

void dsp_dbi_taskop_fail(dsp_db *db, struct taskop_req *r)
{
    r->op->status = DSP_TASKOP_ERROR;
    taskop_post(db, r->op);
    free(r);
}

static void stats_taskop(struct stats_ctx *x, struct taskop_req *r)
{
    dsp_taskop *op = r->op;

    free(r);
    op->status = DSP_TASKOP_ERROR;
    if (stats_connect(x, true) == 0) {
        switch (op->kind) {
        case DSP_TASKOP_SHOW:
            taskop_show(x, op);
            break;
        case DSP_TASKOP_FAILED:
            taskop_failed(x, op);
            break;
        case DSP_TASKOP_RETRY_FAILED:
            taskop_retry_failed(x, op);
            break;
        default:
            taskop_update(x, op);
            break;
        }
    }
    if (op->status == DSP_TASKOP_ERROR) {
        json_decref(op->answer);
        op->answer = NULL;
    }
    taskop_post(x->db, op);
}

/* Runs x->sql, a SELECT COUNT(*) over at most one row: *any says whether it found one.
 * 0, or -1 when the statement failed. */
static int query_nonzero(struct stats_ctx *x, bool *any)
{
    MYSQL_RES *res = x->sql.oom ? NULL : dsp_dbi_query_retry(&x->c, x->sql.p, x->sql.len);
    if (res == NULL)
        return -1;
    MYSQL_ROW row = mysql_fetch_row(res);
    *any = row && row[0] && strcmp(row[0], "0") != 0;
    mysql_free_result(res);
    return 0;
}

/* One round: the figures (when enabled), then retention (when enabled and due: after
 * the refresh, but at most every RETAIN_EVERY_MS unless the last round left more). */
static void stats_round(struct stats_ctx *x, bool refresh, bool retain)
{
    int rc;

    if (stats_connect(x, false) < 0)
        return;
    if (refresh && stats_refresh(x) < 0) {
        stats_drop(x);
        return;
    }
    if (retain && dsp_now_ms() >= x->next_retain) {
        rc = stats_retention(x);
        x->next_retain = dsp_now_ms() + (rc == 1 ? 0 : RETAIN_EVERY_MS);
        if (rc < 0)
            stats_drop(x);
    }
}

static int stats_deps_sweep(struct stats_ctx *x);
static int stats_deps_discover(struct stats_ctx *x);

/* The leader's sweep of the waiting tasks (db_deps.c): every DSP_DEPS_SWEEP_MS while
 * tasks wait, every DSP_DEPS_IDLE_MS while only dependency rows of tasks that no longer
 * wait remain, and none while the table has no dependency row (one look every
 * DSP_DEPS_DISCOVER_MS for rows a producer inserted by SQL; a SUBMIT with AFTER wakes it
 * at once: dsp_dbi_deps_rows_exist). */
static void stats_deps(struct stats_ctx *x)
{
    dsp_db *db = x->db;
    int64_t now = dsp_now_ms();
    uint64_t marks = atomic_load(&db->deps_marks);
    int rc = 0;

    bool marked = marks != x->deps_marks;

    x->next_deps = now + DSP_DEPS_SWEEP_MS;
    x->deps_marks = marks;
    if (!atomic_load(&db->leader)) {
        x->deps_mode = DEPS_UNKNOWN; /* a new leadership looks again */
        return;
    }
    if (marked)
        x->deps_mode = DEPS_ACTIVE; /* a submission made tasks wait */
    if (stats_connect(x, false) < 0)
        return;
    /* A sweep that fails every second (a dropped index, a revoked privilege) logs its
     * streak's 1st, 2nd, 4th, 8th ... failure, the others at debug, as the claim does. */
    bool was_quiet = x->c.quiet;
    x->c.quiet = !dsp_dbi_streak_loud(x->deps_fails + 1);
    if (x->deps_mode == DEPS_UNKNOWN || x->deps_mode == DEPS_NONE)
        rc = stats_deps_discover(x);
    if (rc == 0 && x->deps_mode != DEPS_NONE)
        rc = stats_deps_sweep(x);
    x->c.quiet = was_quiet;
    if (rc < 0) {
        stats_drop(x);
        if (x->deps_fails < UINT_MAX)
            x->deps_fails++;
        return;
    }
    x->deps_fails = 0;
    if (x->deps_mode == DEPS_NONE)
        x->next_deps = now + DSP_DEPS_DISCOVER_MS;
    else if (x->deps_mode == DEPS_IDLE)
        x->next_deps = now + DSP_DEPS_IDLE_MS;
}

/* Does the table have a dependency row? One read of the dependency table's primary key.
 * None: the write thread skips the dependants' statements (deps_seen) and the sweeps
 * stop (DEPS_NONE). 0 or -1. */
static int stats_deps_discover(struct stats_ctx *x)
{
    dsp_db *db = x->db;
    uint64_t marks = atomic_load(&db->deps_marks);

    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_printf(&x->sql, "SELECT COUNT(*) FROM (SELECT 1 FROM %s LIMIT 1) d", db->names.dep);
    bool any;
    if (query_nonzero(x, &any) < 0)
        return -1;
    if (any) {
        x->deps_mode = DEPS_IDLE; /* the sweep that follows tells whether tasks wait */
        return 0;
    }
    /* Unless a submission made tasks wait meanwhile (it set deps_seen after its rows). */
    x->deps_mode = DEPS_NONE;
    atomic_store(&db->deps_seen, false);
    if (atomic_load(&db->deps_marks) != marks) {
        atomic_store(&db->deps_seen, true);
        x->deps_mode = DEPS_ACTIVE;
    }
    return 0;
}

/* stats_deps's sweep: 0, or -1 when a statement failed (the caller drops the
 * connection). Sets deps_mode to ACTIVE or IDLE by what it found. */
static int stats_deps_sweep(struct stats_ctx *x)
{
    dsp_db *db = x->db;

    atomic_fetch_add_explicit(&db->deps_sweeps, 1, memory_order_relaxed);
    /* Cheap when nothing waits: one probe of delay_idx. */
    dsp_strbuf_reset(&x->sql);
    dsp_strbuf_printf(&x->sql, "SELECT COUNT(*) FROM (SELECT 1 FROM %s FORCE INDEX (delay_idx)"
                      " WHERE `delayed` = 2 LIMIT 1) w", db->names.task);
    bool any;
    if (query_nonzero(x, &any) < 0)
        return -1;
    atomic_store(&db->deps_seen, any);
    x->deps_mode = any ? DEPS_ACTIVE : DEPS_IDLE;
    /* Also with none waiting: the sweep deletes the rows of tasks gone. */
    for (int w = 0; w < DSP_DEPS_SWEEP_WINDOWS; w++) {
        int rc = dsp_dbi_deps_sweep(db, &x->c, &x->sql, &x->deps_cur);
        if (rc < 0)
            return -1;
        if (rc == 0 || stats_stopping(db) || !atomic_load(&db->leader))
            break;
    }
    return 0;
}

void *dsp_dbi_stats_main(void *arg)
{
    dsp_db *db = arg;
    struct stats_ctx x;
    struct requeue_req *r, *pending;
    struct taskop_req *tr, *tpending;
    const dsp_db_options *o = &db->opts;
    bool refresh = o->table_stats_ms > 0;
    bool retain = o->retain_succeeded_ms > 0 || o->retain_failed_ms > 0;
    int64_t period = refresh ? o->table_stats_ms : retain ? RETAIN_EVERY_MS : 0;
    int64_t next_round = period > 0 ? dsp_now_ms() : INT64_MAX;

    memset(&x, 0, sizeof x);
    x.db = db;
    x.c.db = db;
    x.c.who = "stats";
    x.c.rng = (uint64_t)dsp_now_us() * 0x94D049BB133111EBULL ^ (uint64_t)(uintptr_t)&x;
    if (x.c.rng == 0)
        x.c.rng = 1;
    x.work = malloc(sizeof *x.work);
    mysql_thread_init();
    if (x.work == NULL) {
        log_error(db->log, "stats thread: out of memory; no table figures");
        refresh = false;
    }

    pthread_mutex_lock(&db->mu);
    for (;;) {
        int64_t now, at;

        if (db->stats_stop)
            break;
        if ((tr = db->top_head) != NULL) {
            db->top_head = tr->next;
            if (db->top_head == NULL)
                db->top_tail = &db->top_head;
            pthread_mutex_unlock(&db->mu);
            stats_taskop(&x, tr);
            pthread_mutex_lock(&db->mu);
            continue;
        }
        if ((r = db->rq_head) != NULL) {
            db->rq_head = r->next;
            if (db->rq_head == NULL)
                db->rq_tail = &db->rq_head;
            pthread_mutex_unlock(&db->mu);
            if (r->kind == REQ_SETTING_SAVE)
                stats_setting_save(&x, r);
            else if (r->kind == REQ_SETTINGS_LOAD)
                stats_settings_load(&x, r);
            else if (r->kind == REQ_PROGRESS)
                stats_progress_save(&x, r);
            else
                stats_requeue(&x, r);
            pthread_mutex_lock(&db->mu);
            continue;
        }
        now = dsp_now_ms();
        /* A submission made tasks wait: sweep now, not at the idle pace. */
        if (x.deps_mode != DEPS_ACTIVE && atomic_load(&db->deps_marks) != x.deps_marks)
            x.next_deps = now;
        if (now >= x.next_deps) {
            pthread_mutex_unlock(&db->mu);
            stats_deps(&x);
            pthread_mutex_lock(&db->mu);
            continue;
        }
        at = next_round;
        if (at != INT64_MAX && x.c.m == NULL && x.next_connect > at)
            at = x.next_connect;
        if (x.next_deps < at)
            at = x.next_deps;
        if (now >= at) {
            pthread_mutex_unlock(&db->mu);
            stats_round(&x, refresh, retain);
            /* The figures saw waiting rows (a producer's by SQL, say): the sweeps start
             * without a statement of their own. */
            if (x.deps_waiting_seen && x.deps_mode != DEPS_ACTIVE) {
                x.deps_mode = DEPS_ACTIVE;
                x.next_deps = dsp_now_ms();
            }
            x.deps_waiting_seen = false;
            /* The table figures scan the waiting rows' index: with millions waiting a
             * round takes seconds. The next one then waits STATS_REST_FACTOR times as
             * long as this one took, so that the scans use at most a tenth of the
             * database's time however deep the backlog (bench --mode backlog). */
            int64_t spent = dsp_now_ms() - now;
            next_round = now + period;
            if (spent > 0 && spent * STATS_REST_FACTOR > period)
                next_round = now + spent * STATS_REST_FACTOR;
            pthread_mutex_lock(&db->mu);
            continue;
        }
        if (at == INT64_MAX)
            pthread_cond_wait(&db->stats_cv, &db->mu);
        else
            cond_wait_until(&db->stats_cv, &db->mu, at);
    }
    db->stats_exited = true;
    pending = db->rq_head;
    db->rq_head = NULL;
    db->rq_tail = &db->rq_head;
    tpending = db->top_head;
    db->top_head = NULL;
    db->top_tail = &db->top_head;
    pthread_mutex_unlock(&db->mu);

    for (; tpending; tpending = tr) {
        tr = tpending->next;
        dsp_dbi_taskop_fail(db, tpending);
    }
    for (; pending; pending = r) {
        r = pending->next;
        if (pending->kind == REQ_REQUEUE)
            requeue_answer(db, pending->request_id, -1);
        else if (pending->kind == REQ_SETTINGS_LOAD)
            settings_answer(db, pending->request_id, NULL, 0, false);
        dsp_dbi_requeue_req_free(pending);
    }
    dsp_dbi_conn_close(&x.c);
    dsp_strbuf_free(&x.sql);
    free(x.work);
    mysql_thread_end();
    return NULL;
}
