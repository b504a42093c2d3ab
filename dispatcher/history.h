/* history.h: the dispatcher's recent history for the dashboard's charts (GET
 * /history, docs/admin.md): a ring of samples taken on the loop thread every
 * DSP_HISTORY_PERIOD_MS from figures the loop already holds (its counters, its
 * queue, the table figures the stats thread published), never by a query of its
 * own. The ring is one array allocated at start-up and never grown, so its memory
 * is fixed: DSP_HISTORY_SAMPLES * sizeof(dsp_history_sample) bytes. */
#ifndef TASKPUSH_DSP_HISTORY_H
#define TASKPUSH_DSP_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One sample every 5 s, an hour of them. */
#define DSP_HISTORY_PERIOD_MS 5000
#define DSP_HISTORY_SAMPLES 720

/* The counters and gauges a sample is made from, as the loop sees them. */
typedef struct dsp_history_input {
    uint64_t succeeded_total, failed_total, dispatched_total; /* counters since start */
    uint64_t buffered, in_flight, workers;                    /* gauges now */
    bool table_valid; /* the table figures below were read at least once */
    uint64_t table_new, table_ready, table_failed;
    int64_t oldest_ready_age_ms; /* -1: no ready row waits */
} dsp_history_input;

/* Per-interval counts are the counters' growth since the previous sample; gauges are
 * their value when taken. Counts and gauges stop at UINT32_MAX (per 5 s, beyond any
 * real figure). The table figures are -1 while they were never read. */
typedef struct dsp_history_sample {
    int64_t wall_ms;                        /* when taken, ms since 1970 (UTC) */
    uint32_t interval_ms;                   /* since the previous sample; 0 for the first */
    uint32_t succeeded, failed, dispatched; /* during the interval */
    uint32_t buffered, in_flight, workers;
    int64_t table_new, table_ready, table_failed;
    int64_t oldest_ready_age_ms;
} dsp_history_sample;

typedef struct dsp_history {
    dsp_history_sample *ring; /* capacity entries, allocated once */
    size_t capacity;
    size_t head;                                           /* index of the newest sample */
    size_t n;                                              /* samples held, at most capacity */
    int64_t last_mono_ms;                                  /* monotonic time of the newest sample */
    uint64_t last_succeeded, last_failed, last_dispatched; /* the counters then */
} dsp_history;

/* Allocates the ring (capacity >= 1). Returns 0 or -1 (out of memory). */
int dsp_history_init(dsp_history *h, size_t capacity);
void dsp_history_free(dsp_history *h);

/* Whether a sample is due at monotonic time now_ms (none taken yet, or a period since
 * the last). */
bool dsp_history_due(const dsp_history *h, int64_t now_ms);
/* Records a sample taken now (monotonic now_ms, wall clock wall_ms), overwriting the
 * oldest once the ring is full. */
void dsp_history_record(dsp_history *h, int64_t now_ms, int64_t wall_ms,
                        const dsp_history_input *in);
/* The i-th sample held, 0 the oldest; NULL when i >= the count held. */
const dsp_history_sample *dsp_history_at(const dsp_history *h, size_t i);

struct dsp_server;
struct json_t;
/* The loop's tick: takes a sample from srv when one is due. */
void dsp_history_tick(struct dsp_server *srv, int64_t now_ms);
/* The GET /history object (docs/admin.md); a new reference, NULL when out of memory. */
struct json_t *dsp_history_json(const dsp_history *h, int64_t wall_now_ms);
struct evhttp_request;
/* GET /history; arg is the dsp_server. */
void dsp_history_http_cb(struct evhttp_request *req, void *arg);

#endif
