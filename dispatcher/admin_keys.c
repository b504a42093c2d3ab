/* admin_keys.c: GET /keys (the busiest group keys of each type: running and buffered
 * from the loop's memory, waiting from the table figures' bounded read of group_idx)
 * and GET /progress (the running deliveries whose workers reported progress), for the
 * dashboard and operators (docs/admin.md). Both are built on the loop thread from what
 * it holds: the deliveries in flight, the buffered tasks, and the last table figures;
 * neither waits for the database. */
#include "admin_http.h"

#include "conn.h"
#include "server.h"
#include "utf8.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS_TOP_DEFAULT 10u
#define KEYS_TOP_MAX 100u
#define PROGRESS_LIMIT_DEFAULT 50u
#define PROGRESS_LIMIT_MAX 1000u

/* One (type, key) of the merge: counts from memory and from the table. */
struct key_row {
    const char *type; /* the type's name: a dsp_type's, or the table figures' */
    size_t type_len;
    const uint8_t *key;
    uint8_t key_len;
    uint64_t running, buffered, waiting;
};

struct key_rows {
    struct key_row *v;
    size_t n, cap;
    bool oom;
};

static int key_row_cmp(const void *pa, const void *pb)
{
    const struct key_row *a = pa, *b = pb;
    size_t n = a->type_len < b->type_len ? a->type_len : b->type_len;
    int c = memcmp(a->type, b->type, n);
    if (c == 0 && a->type_len != b->type_len)
        c = a->type_len < b->type_len ? -1 : 1;
    if (c == 0) {
        n = a->key_len < b->key_len ? a->key_len : b->key_len;
        c = n ? memcmp(a->key, b->key, n) : 0;
        if (c == 0 && a->key_len != b->key_len)
            c = a->key_len < b->key_len ? -1 : 1;
    }
    return c;
}

static void rows_add(struct key_rows *r, const char *type, size_t type_len, const uint8_t *key, uint8_t key_len,
                     uint64_t running, uint64_t buffered, uint64_t waiting)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 256;
        struct key_row *v = realloc(r->v, cap * sizeof *v);
        if (!v) {
            r->oom = true;
            return;
        }
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (struct key_row){type, type_len, key, key_len, running, buffered, waiting};
}

/* A key as JSON: its text when it is UTF-8 without NUL, else "key_hex". */
static void key_json(json_t *o, const uint8_t *key, size_t len)
{
    if (proto_utf8_valid((proto_bytes){key, len})) {
        json_object_set_new(o, "key", json_stringn((const char *)key, len));
        return;
    }
    char hex[2 * 191 + 1];
    for (size_t i = 0; i < len; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
    hex[2 * len] = '\0';
    json_object_set_new(o, "key", json_null());
    json_object_set_new(o, "key_hex", json_string(hex));
}

static uint64_t row_total(const struct key_row *r)
{
    return r->running + r->buffered + r->waiting;
}

static int busiest_first(const void *pa, const void *pb)
{
    uint64_t a = row_total(pa), b = row_total(pb);
    return a < b ? 1 : a > b ? -1 : key_row_cmp(pa, pb);
}

/* The types of rows [s, e) (one type, merged by key) as an entry of "types". */
static json_t *type_json(struct key_row *v, size_t s, size_t e, unsigned top, const dsp_table_stats *ts)
{
    qsort(v + s, e - s, sizeof *v, busiest_first);
    json_t *keys = json_array();
    uint64_t running = 0, buffered = 0;
    for (size_t i = s; i < e; i++) {
        running += v[i].running;
        buffered += v[i].buffered;
        if (i - s >= top)
            continue;
        json_t *k = json_object();
        key_json(k, v[i].key, v[i].key_len);
        json_object_set_new(k, "running", json_integer((json_int_t)v[i].running));
        json_object_set_new(k, "buffered", json_integer((json_int_t)v[i].buffered));
        json_object_set_new(k, "waiting", json_integer((json_int_t)v[i].waiting));
        json_array_append_new(keys, k);
    }
    json_t *o = json_object();
    json_object_set_new(o, "type", json_stringn(v[s].type, v[s].type_len));
    json_object_set_new(o, "keys_total", json_integer((json_int_t)(e - s)));
    json_object_set_new(o, "running", json_integer((json_int_t)running));
    json_object_set_new(o, "buffered", json_integer((json_int_t)buffered));
    /* What the table read of its ready keyed rows: a sample when it stopped at the bound. */
    uint64_t read = 0;
    for (size_t i = 0; ts && ts->valid && i < ts->ntypes; i++)
        if (strlen(ts->types[i].type) == v[s].type_len && memcmp(ts->types[i].type, v[s].type, v[s].type_len) == 0)
            read = ts->types[i].keyed_read;
    json_object_set_new(o, "waiting_rows_read", json_integer((json_int_t)read));
    json_object_set_new(o, "waiting_sampled", json_boolean(read >= DSP_TABLE_KEYS_SCAN));
    json_object_set_new(o, "keys", keys);
    return o;
}

static void add_task(struct key_rows *r, const dsp_task *t, bool running)
{
    if (t->has_group_key && t->type)
        rows_add(r, t->type->name, t->type->len, t->group_key, t->group_key_len, running, !running, 0);
}

json_t *dsp_admin_keys_json(dsp_server *srv, unsigned top)
{
    struct key_rows r = {0};
    dsp_table_stats *ts = malloc(sizeof *ts);
    json_t *out = json_object(), *types = json_array();

    for (dsp_conn *c = srv->conns.list; c; c = c->next)
        for (dsp_task *t = c->inflight; t; t = t->next)
            add_task(&r, t, true);
    for (dsp_type *ty = srv->types.list; ty; ty = ty->next)
        for (unsigned p = 0; p < DSP_PRIORITIES; p++)
            for (dsp_task *t = ty->head[p]; t; t = t->next)
                add_task(&r, t, false);
    if (ts)
        dsp_db_table_stats_get(srv->db, ts);
    for (size_t i = 0; ts && ts->valid && i < ts->nkeys; i++) {
        const dsp_table_key_stats *k = &ts->keys[i];
        const char *name = ts->types[k->type_slot].type;
        rows_add(&r, name, strlen(name), k->key, k->key_len, 0, 0, k->waiting);
    }
    /* One row per (type, key): sort, then sum the runs. */
    if (r.n > 0)
        qsort(r.v, r.n, sizeof *r.v, key_row_cmp);
    size_t m = 0;
    for (size_t i = 0; i < r.n; i++) {
        if (m > 0 && key_row_cmp(&r.v[m - 1], &r.v[i]) == 0) {
            r.v[m - 1].running += r.v[i].running;
            r.v[m - 1].buffered += r.v[i].buffered;
            r.v[m - 1].waiting += r.v[i].waiting;
        } else {
            r.v[m++] = r.v[i];
        }
    }
    for (size_t s = 0, e; s < m; s = e) {
        for (e = s + 1; e < m && r.v[e].type_len == r.v[s].type_len &&
                        memcmp(r.v[e].type, r.v[s].type, r.v[s].type_len) == 0;
             e++)
            ;
        json_array_append_new(types, type_json(r.v, s, e, top, ts));
    }
    json_object_set_new(out, "top", json_integer(top));
    json_object_set_new(out, "waiting_refreshed_ms",
                        ts && ts->valid ? json_integer((json_int_t)ts->refreshed_wall_ms) : json_null());
    json_object_set_new(out, "types", types);
    if (r.oom || !ts)
        json_object_set_new(out, "incomplete", json_true()); /* out of memory: some rows left out */
    free(ts);
    free(r.v);
    return out;
}

/* ?NAME=N, 1 .. max, def when absent; -1 for anything else. */
static long param_count(struct evhttp_request *req, const char *name, unsigned def, unsigned max)
{
    struct evkeyvalq params;
    const char *uri = evhttp_request_get_uri(req), *q = strchr(uri ? uri : "", '?');
    long v = def;
    if (!q)
        return def;
    if (evhttp_parse_query_str(q + 1, &params) < 0)
        return -1;
    const char *s = evhttp_find_header(&params, name);
    if (s) {
        char *end;
        unsigned long long u = strtoull(s, &end, 10);
        v = (*s >= '0' && *s <= '9' && *end == '\0' && u >= 1 && u <= max) ? (long)u : -1;
    }
    evhttp_clear_headers(&params);
    return v;
}

void dsp_admin_keys_cb(struct evhttp_request *req, void *arg)
{
    if (!dsp_admin_only_get(req))
        return;
    long top = param_count(req, "top", KEYS_TOP_DEFAULT, KEYS_TOP_MAX);
    if (top < 0) {
        dsp_admin_send_error(req, HTTP_BADREQUEST, "top must be 1 to 100");
        return;
    }
    dsp_admin_send_json(req, HTTP_OK, dsp_admin_keys_json(arg, (unsigned)top));
}

static int progress_newest_first(const void *pa, const void *pb)
{
    const dsp_task *a = *(dsp_task *const *)pa, *b = *(dsp_task *const *)pb;
    return a->progress->at_ms < b->progress->at_ms ? 1 : a->progress->at_ms > b->progress->at_ms ? -1
         : a->id < b->id ? -1 : a->id > b->id;
}

void dsp_admin_progress_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!dsp_admin_only_get(req))
        return;
    long limit = param_count(req, "limit", PROGRESS_LIMIT_DEFAULT, PROGRESS_LIMIT_MAX);
    if (limit < 0) {
        dsp_admin_send_error(req, HTTP_BADREQUEST, "limit must be 1 to 1000");
        return;
    }
    size_t n = 0, cap = 0;
    dsp_task **v = NULL;
    for (dsp_conn *c = srv->conns.list; c; c = c->next)
        for (dsp_task *t = c->inflight; t; t = t->next) {
            if (!t->progress || t->progress->attempt != t->attempts)
                continue;
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 64;
                dsp_task **nv = realloc(v, nc * sizeof *nv);
                if (!nv)
                    goto full;
                v = nv;
                cap = nc;
            }
            v[n++] = t;
        }
full:
    if (n > 0)
        qsort(v, n, sizeof *v, progress_newest_first);
    json_t *list = json_array();
    for (size_t i = 0; i < n && i < (size_t)limit; i++) {
        json_t *o = json_pack("{s:I, s:s%, s:s?, s:o}", "task_id", (json_int_t)v[i]->id, "type",
                              v[i]->type->name, v[i]->type->len, "worker", (const char *)NULL, "progress",
                              dsp_admin_progress_json(v[i]));
        char *name = v[i]->holder && v[i]->holder->name ? dsp_utf8_copy(v[i]->holder->name) : NULL;
        if (o && name)
            json_object_set_new(o, "worker", json_string(name));
        free(name);
        if (o)
            json_array_append_new(list, o);
    }
    json_t *out = json_pack("{s:I, s:o}", "running_with_progress", (json_int_t)n, "tasks", list);
    free(v);
    dsp_admin_send_json(req, HTTP_OK, out);
}
