/* history.c: the dispatcher's recent history (history.h): the ring of samples, the
 * loop-side sampling from figures the dispatcher already holds, and GET /history. */
#include "history.h"

#include "admin_http.h"
#include "db.h"
#include "server.h"

#include <event2/http.h>
#include <jansson.h>

#include <stdlib.h>
#include <string.h>

/* docs/admin.md states the ring's size: 720 samples of 72 bytes, 51,840 bytes. */
_Static_assert(sizeof(dsp_history_sample) == 72, "docs/admin.md gives the size of a sample");

int dsp_history_init(dsp_history *h, size_t capacity)
{
    memset(h, 0, sizeof *h);
    if (capacity == 0)
        return -1;
    h->ring = calloc(capacity, sizeof *h->ring);
    if (!h->ring)
        return -1;
    h->capacity = capacity;
    return 0;
}

void dsp_history_free(dsp_history *h)
{
    free(h->ring);
    memset(h, 0, sizeof *h);
}

bool dsp_history_due(const dsp_history *h, int64_t now_ms)
{
    return h->ring && (h->n == 0 || now_ms - h->last_mono_ms >= DSP_HISTORY_PERIOD_MS);
}

static uint32_t clamp32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* A counter's growth since last; 0 if it went back (it never should). */
static uint32_t growth(uint64_t now, uint64_t last)
{
    return now >= last ? clamp32(now - last) : 0;
}

static int64_t table_figure(bool valid, uint64_t v)
{
    if (!valid)
        return -1;
    return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

void dsp_history_record(dsp_history *h, int64_t now_ms, int64_t wall_ms,
                        const dsp_history_input *in)
{
    if (!h->ring)
        return;
    bool first = h->n == 0;
    dsp_history_sample s = {
        .wall_ms = wall_ms,
        .interval_ms =
            first || now_ms < h->last_mono_ms ? 0 : clamp32((uint64_t)(now_ms - h->last_mono_ms)),
        /* The first sample counts what happened before it: nothing to compare with. */
        .succeeded = first ? 0 : growth(in->succeeded_total, h->last_succeeded),
        .failed = first ? 0 : growth(in->failed_total, h->last_failed),
        .dispatched = first ? 0 : growth(in->dispatched_total, h->last_dispatched),
        .buffered = clamp32(in->buffered),
        .in_flight = clamp32(in->in_flight),
        .workers = clamp32(in->workers),
        .table_new = table_figure(in->table_valid, in->table_new),
        .table_ready = table_figure(in->table_valid, in->table_ready),
        .table_failed = table_figure(in->table_valid, in->table_failed),
        .oldest_ready_age_ms = in->table_valid ? in->oldest_ready_age_ms : -1,
    };
    h->head = first ? 0 : (h->head + 1) % h->capacity;
    h->ring[h->head] = s;
    if (h->n < h->capacity)
        h->n++;
    h->last_mono_ms = now_ms;
    h->last_succeeded = in->succeeded_total;
    h->last_failed = in->failed_total;
    h->last_dispatched = in->dispatched_total;
}

const dsp_history_sample *dsp_history_at(const dsp_history *h, size_t i)
{
    if (i >= h->n)
        return NULL;
    size_t oldest = (h->head + h->capacity + 1 - h->n) % h->capacity;
    return &h->ring[(oldest + i) % h->capacity];
}

/* ---- on the loop ---- */

void dsp_history_tick(dsp_server *srv, int64_t now_ms)
{
    if (!dsp_history_due(&srv->stats.history, now_ms))
        return;
    dsp_history_input in = {
        .succeeded_total = srv->stats.tasks.succeeded_total,
        .failed_total = srv->stats.tasks.failed_total,
        .dispatched_total = srv->stats.tasks.dispatched_total,
        .buffered = srv->sched.nbuffered,
        .in_flight = srv->sched.ninflight,
        .workers = srv->sched.nworkers,
        .oldest_ready_age_ms = -1,
    };
    /* The figures the stats thread published: a copy under its mutex, no query. */
    dsp_table_stats *ts = malloc(sizeof *ts);
    if (ts) {
        dsp_db_table_stats_get(srv->db, ts);
        in.table_valid = ts->valid;
        in.table_new = ts->by_state[0];
        in.table_failed = ts->by_state[3];
        in.oldest_ready_age_ms = ts->oldest_ready_age_ms;
        for (size_t i = 0; i < ts->ntypes && i < DSP_TABLE_STATS_MAX_TYPES; i++)
            in.table_ready += ts->types[i].new_ready;
        free(ts);
    }
    dsp_history_record(&srv->stats.history, now_ms, dsp_wall_ms(), &in);
}

static json_t *table_value(int64_t v)
{
    return v < 0 ? json_null() : json_integer((json_int_t)v);
}

json_t *dsp_history_json(const dsp_history *h, int64_t wall_now_ms)
{
    json_t *samples = json_array();
    json_t *o = json_pack("{s:I, s:I, s:I, s:o}", "now_ms", (json_int_t)wall_now_ms, "interval_ms",
                          (json_int_t)DSP_HISTORY_PERIOD_MS, "capacity", (json_int_t)h->capacity,
                          "samples", samples);
    if (!o)
        return NULL;
    for (size_t i = 0; i < h->n; i++) {
        const dsp_history_sample *s = dsp_history_at(h, i);
        json_t *js =
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "t", (json_int_t)s->wall_ms, "dt",
                      (json_int_t)s->interval_ms, "succeeded", (json_int_t)s->succeeded, "failed",
                      (json_int_t)s->failed, "dispatched", (json_int_t)s->dispatched, "buffered",
                      (json_int_t)s->buffered, "in_flight", (json_int_t)s->in_flight, "workers",
                      (json_int_t)s->workers);
        if (!js || json_array_append_new(samples, js) != 0) {
            json_decref(o);
            return NULL;
        }
        json_object_set_new(js, "table_new", table_value(s->table_new));
        json_object_set_new(js, "table_ready", table_value(s->table_ready));
        json_object_set_new(js, "table_failed", table_value(s->table_failed));
        /* null: figures not read yet; -1: read, and no ready row waits. */
        json_object_set_new(js, "oldest_ready_age_ms",
                            s->table_new < 0 ? json_null()
                                             : json_integer((json_int_t)s->oldest_ready_age_ms));
    }
    return o;
}

/* GET /history (admin_http.c routes it here). */
void dsp_history_http_cb(struct evhttp_request *req, void *arg)
{
    dsp_server *srv = arg;
    if (!dsp_admin_only_get(req))
        return;
    json_t *o = dsp_history_json(&srv->stats.history, dsp_wall_ms());
    if (!o) {
        dsp_admin_send_error(req, HTTP_INTERNAL, "out of memory");
        return;
    }
    dsp_admin_send_json(req, HTTP_OK, o);
}
