/* dispatch.h: scheduling: the per-type queues of buffered tasks, the workers and
 * free slots ("room") of each type, the in-flight accounting and the leases of the
 * deliveries, dispatch passes, claim pacing, and the picker that chooses the worker
 * for the next task.
 *
 * The picker is a pure function over an array of slot counts, so that the policy is
 * unit tested without sockets. Credit-based flow control lives here too: a worker
 * is eligible only while in_flight < capacity and it accepts tasks. */
#ifndef TASKPUSH_DSP_DISPATCH_H
#define TASKPUSH_DSP_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

typedef struct dsp_sched_slots {
    uint32_t in_flight; /* deliveries not yet answered, cancelled ones included */
    uint32_t capacity;  /* from HELLO */
    bool accepting;     /* false after STOP either way, or before WELCOME */
} dsp_sched_slots;

static inline bool dsp_sched_has_room(const dsp_sched_slots *s)
{
    return s->accepting && s->in_flight < s->capacity;
}

/* Picks one of ws[0..n) with room, or returns -1.
 * round-robin: the first with room at or after *cursor;
 * least-loaded: the lowest in_flight/capacity, ties going to the first at or
 * after *cursor. Either way *cursor moves just past the pick, so equal workers
 * take turns. O(n). */
int dsp_sched_pick(int policy, dsp_sched_slots *const *ws, size_t n, size_t *cursor);

/* Least-loaded over many workers: a min-heap of indices into ws by in_flight/capacity,
 * ties in rotation order from the cursor at build time. Built once per dispatch pass
 * (O(n)), then each pick costs O(log n) instead of dsp_sched_pick's O(n): a pass handing
 * out T tasks to K workers costs O(K + T log K). Valid while only the picks change
 * loads (each pick's in_flight may grow before the next pick; nothing else may change);
 * the owner rebuilds it otherwise (gen is the owner's to compare). */
typedef struct dsp_ll_entry {
    uint32_t idx;  /* the worker's index in ws */
    uint32_t rank; /* its place in the round-robin order from the cursor: the tie-break */
} dsp_ll_entry;
typedef struct dsp_ll_heap {
    dsp_ll_entry *e;
    size_t n, cap;
    uint64_t gen;
} dsp_ll_heap;
/* Returns 0, or -1 when out of memory (h unchanged: use dsp_sched_pick). */
int dsp_ll_build(dsp_ll_heap *h, dsp_sched_slots *const *ws, size_t n, size_t cursor);
/* As dsp_sched_pick(DSP_SCHED_LEAST_LOADED, ...) over the heap built from ws. */
int dsp_ll_pick(dsp_ll_heap *h, dsp_sched_slots *const *ws, size_t *cursor);

/* The rate limit of a type (--type-limit T:rate=R): a token bucket in thousandths of a
 * task, refilled by R per second on the loop's monotonic clock and holding at most one
 * second's worth (at least one task), so that any one second sees at most R + burst
 * starts. Integers only: the same clock readings always give the same answer. */
typedef struct dsp_bucket {
    uint64_t milli;  /* thousandths of a start available */
    int64_t last_ms; /* when last refilled; 0: never (starts full) */
} dsp_bucket;
/* Refills b for rate (1..DSP_LIMIT_MAX) up to now_ms; a clock going back adds nothing. */
void dsp_bucket_refill(dsp_bucket *b, uint32_t rate, int64_t now_ms);
/* Refills, then takes one start when one is there. */
bool dsp_bucket_take(dsp_bucket *b, uint32_t rate, int64_t now_ms);
/* Refills, then tells whether a start is there without taking it. */
bool dsp_bucket_ready(dsp_bucket *b, uint32_t rate, int64_t now_ms);

typedef struct dsp_server dsp_server;
typedef struct dsp_conn dsp_conn;
typedef struct dsp_type dsp_type;
typedef struct dsp_task dsp_task;

/* The per-type queues: one FIFO list per priority (LOW 0, NORMAL 1, HIGH 2; a larger
 * value from the table counts as HIGH), each in ascending seq. A type's next task is the
 * head of its highest non-empty list, so a HIGH task claimed after a thousand NORMAL
 * ones still goes out next (docs/taskpushd.md, "Priorities and the buffer"). */
#define DSP_PRIORITIES 3
/* t joins the tail of its priority's list: O(1), except a task taken back from a worker,
 * which goes back to its place by seq among the few taken back before it (at the head). */
void dsp_dispatch_enqueue(dsp_server *srv, dsp_type *ty, dsp_task *t);
/* Takes ty's next task (highest priority, then lowest seq); ty must have one. O(1). */
dsp_task *dsp_dispatch_dequeue(dsp_server *srv, dsp_type *ty);
/* ty's next task without taking it, or NULL when none is buffered. O(1). */
dsp_task *dsp_dispatch_peek(const dsp_type *ty);
/* Takes t out of its type's queue, wherever it is (an operator's cancel). O(1). */
void dsp_dispatch_unlink(dsp_server *srv, dsp_task *t);

/* Per-key limits (groups.c, --group-limit). */
/* Whether t may start now under its type's per-key limit. */
bool dsp_groups_allows(const dsp_type *ty, const dsp_task *t);
/* ty's next task that may start under the per-key limit (dsp_dispatch_peek without
 * one), or NULL. Walks past the tasks of keys at their limit: at most the buffer. */
dsp_task *dsp_groups_peek(const dsp_type *ty);
/* A delivery of t starts / ends: counted per key while ty has a per-key limit. */
void dsp_groups_add(dsp_type *ty, dsp_task *t);
void dsp_groups_del(dsp_type *ty, dsp_task *t);
/* Sets ty's per-key limit (0: none) and counts the deliveries in flight afresh. */
void dsp_groups_set(dsp_type *ty, uint32_t max_per_group);
void dsp_groups_free(dsp_type *ty);

/* How much is claimed ahead of the workers (docs/taskpushd.md, "Priorities and the
 * buffer"): per type, and for the whole dispatcher, an EWMA of the deliveries answered
 * per second; a claim asks for the free slots plus what that rate finishes in
 * --prefetch-ms and two claims' round trips (so that what is buffered when a claim is
 * asked outlasts it), at least DSP_AHEAD_FLOOR (a cold start still claims a batch) and
 * at most --prefetch, less what is buffered. Were the ahead to run out while a claim is
 * out, the workers would idle, the rate fall, and the ahead with it: the round trips and
 * a rate that falls slower than it rises keep that from feeding on itself. */
#define DSP_AHEAD_FLOOR 32
#define DSP_PACE_SAMPLE_MS 10       /* shortest interval folded into the average */
#define DSP_PACE_TAU_UP_MS 250      /* a rising rate: an interval this long replaces it */
#define DSP_PACE_TAU_DOWN_MS 1000   /* a falling one, more slowly */
typedef struct dsp_pace {
    double per_s;     /* completions per second, averaged */
    uint64_t count;   /* completions since since_ms, not yet folded in */
    int64_t since_ms; /* 0: never read */
} dsp_pace;
static inline void dsp_pace_note(dsp_pace *p)
{
    p->count++;
}
/* The average at now_ms, folding in the completions counted since the last fold once
 * DSP_PACE_SAMPLE_MS have passed. */
double dsp_pace_rate(dsp_pace *p, int64_t now_ms);
/* Tasks to hold ahead of the free slots: per_s * horizon_ms, within [min(least,
 * prefetch), prefetch]; prefetch itself when horizon_ms <= 0 (pacing off), 0 when
 * prefetch <= 0. Any per_s (NaN, infinite, negative) gives a value in that range. */
uint64_t dsp_claim_ahead(double per_s, int64_t horizon_ms, uint64_t least, int64_t prefetch);
/* What a claim may ask for: room + ahead - held, 0 when held covers it, at most cap.
 * Unsigned and saturating: no capacity a peer announces can wrap it. */
uint64_t dsp_claim_budget(uint64_t room, uint64_t ahead, uint64_t held, uint64_t cap);

/* Workers and room. The room (free slots of accepting workers, per type and in all)
 * is kept here, and only here. */
/* c was welcomed: its types get it as a worker, its free slots join the room. */
void dsp_dispatch_worker_joined(dsp_server *srv, dsp_conn *c);
/* Takes back its deliveries; with refund, their attempt is not counted (a worker
 * dropped for timing out every delivery is judged not to have run them). */
void dsp_dispatch_worker_left(dsp_server *srv, dsp_conn *c, bool refund);
/* c takes no more tasks (STOP either way, a drain): its free slots leave the room. */
void dsp_dispatch_worker_stop(dsp_server *srv, dsp_conn *c);

/* A delivery still running after this long gets its attempt written to the table
 * (DSP_WRITE_DELIVERED), so that a restart after kill -9 charges it. Shorter tasks are
 * charged by their outcome's write alone: a record costs a row update, and most tasks
 * end well within this. A kill -9 within this long of a delivery leaves it uncharged. */
#define DSP_DELIVERY_RECORD_MS 1000

/* In-flight accounting: the only code that changes a worker's slots.in_flight, the
 * room and srv->sched.ninflight (a dispatch pass and inventory.c's adoptions begin
 * deliveries; conn.c, inventory.c and server.c end them). */
/* A delivery of t to c begins: t joins c's in-flight list and takes a slot. */
void dsp_dispatch_inflight_add(dsp_conn *c, dsp_task *t);
enum dsp_slot {
    DSP_SLOT_KEEP,      /* cancelled: the slot stays taken until the worker answers */
    DSP_SLOT_GIVE_BACK, /* the slot is free again (a cancel that could not be recorded) */
    DSP_SLOT_FREE,      /* the worker answered: the slot is free, a dispatch pass follows */
};
/* A delivery ends: t (NULL: none, a cancelled delivery was answered) leaves c's
 * in-flight list, and its slot goes as slot says. */
void dsp_dispatch_inflight_del(dsp_conn *c, dsp_task *t, enum dsp_slot slot);

/* A slot of c taken (take) or given back without a task: a declared delivery waiting for
 * its adoption (inventory.c). */
void dsp_dispatch_slot_reserve(dsp_conn *c, bool take);

/* Leases: every current delivery is in srv->sched.leases, keyed by when the housekeeping
 * tick must look at it next (its attempt's record, or its lease's end). */
/* The delivery the tick must look at by now_ms (the earliest first), or NULL. */
dsp_task *dsp_dispatch_lease_due(dsp_server *srv, int64_t now_ms);
/* The tick looked at t, still in flight: it is due again at at_ms (> now_ms). */
void dsp_dispatch_lease_defer(dsp_server *srv, dsp_task *t, int64_t at_ms);

/* No task is dispatched any more (shutting down, or drained from the admin port). */
bool dsp_dispatch_stopped(const dsp_server *srv);
/* One dispatch pass: buffered tasks to workers with room, in dispatch order. */
void dsp_dispatch_run(dsp_server *srv);
/* c's DONEs were just read: while tasks of its types are buffered and no other worker
 * of theirs has a free slot (so any scheduler would choose c), c gets them now, in
 * dispatch order, rather than in the pass at the end of this loop iteration. When many
 * workers answer in one iteration and fewer tasks are buffered than their free slots,
 * the first to answer are filled, in one write each, instead of every one getting a
 * share in a write of its own (docs/journal/bench.md, "Refills as DONEs are read
 * (2026-11-27)"). */
void dsp_dispatch_refill(dsp_server *srv, dsp_conn *c);
/* Claims. The claim pacing (srv->claim: when the next claim may be asked, the one
 * outstanding) is written here only; the other files tell it what happened through the
 * dsp_claim_pacing_* calls below. */
/* Rows were just committed ready (a SUBMIT): claims now rather than at the next poll,
 * and once more after a claim already running, whose answer may predate them. */
void dsp_dispatch_claim_now(dsp_server *srv);
/* The binary log's doorbell (dsp_db_callbacks.on_wake): claims now (due_wall_ms 0, or
 * past), retrying a claim that found nothing WAKE_RETRIES times WAKE_RETRY_MS apart, or
 * at due_wall_ms (ms since 1970). */
void dsp_dispatch_on_wake(void *arg, int64_t due_wall_ms);
/* Asks the database thread for the next claim when room and pacing allow. */
void dsp_dispatch_claim_maybe(dsp_server *srv);
/* Creates srv->claim.timer (0, or -1 when out of memory); _free frees it. */
int dsp_claim_pacing_init(dsp_server *srv) __attribute__((warn_unused_result));
void dsp_claim_pacing_free(dsp_server *srv);
/* The outstanding claim was answered at now_ms (server.c's on_claim): it is outstanding
 * no more, and its round trip joins the average the ahead covers. */
void dsp_claim_pacing_answered(dsp_server *srv, int64_t now_ms);
/* The claim failed: the next one waits --poll-ms. */
void dsp_claim_pacing_failed(dsp_server *srv, int64_t now_ms);
/* The claim's got tasks are held: the next claim goes at once when it was full (got all
 * it asked for, or more rows are there) or rows were committed ready while it ran, else
 * after --poll-ms. */
void dsp_claim_pacing_claimed(dsp_server *srv, int64_t now_ms, size_t got, bool more);
/* Rows may be ready now (leadership taken, FAILED rows requeued, a resume, an operator's
 * task operation): the next claim need not wait for the poll. */
void dsp_claim_pacing_hasten(dsp_server *srv);

#endif
