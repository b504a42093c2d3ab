/* dispatch.c: scheduling, in one place: the per-type priority queues of buffered tasks,
 * the workers and free slots of each type, the in-flight accounting and the lease heap,
 * dispatch passes, claim pacing (the budget: free slots plus what the workers finish in
 * --prefetch-ms), and the picker that chooses a worker (round-robin / least-loaded).
 * Runs on the loop thread. */
#include "dispatch.h"

#include "conn.h"
#include "config.h"
#include "proto.h"
#include "server.h"

#include <event2/event.h>

#include <stddef.h>
#include <stdlib.h>
#include <time.h>

/* A small claim waits this long for more room, so that a burst of DONEs
 * becomes one claim of hundreds of rows rather than many of a few. */
#define GATHER_MS 2

/* Types a claim asks for at most: the types with rows lately come first, idle ones
 * take turns in the rest, so that a claim's statement stays small whatever the number
 * of types workers registered. */
#define CLAIM_MAX_TYPES 64
#define CLAIM_COLD_SLOTS 16 /* of those, kept for types without rows lately */

/* A type had rows lately when a claim returned some, or the table figures (read every
 * --table-stats-ms by the stats thread) showed ready ones, within this long. Idle types
 * (a thousand peers may name 64 each) wait their turn; a type with rows never does. */
#define TYPE_WARM_MS 60000

#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* ---- the picker ---- */

int dsp_sched_pick(int policy, dsp_sched_slots *const *ws, size_t n, size_t *cursor)
{
    if (n == 0)
        return -1;
    size_t start = *cursor % n;
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        const dsp_sched_slots *s = ws[i];
        if (!dsp_sched_has_room(s))
            continue;
        if (policy == DSP_SCHED_ROUND_ROBIN) {
            best = (int)i;
            break;
        }
        if (best < 0) {
            best = (int)i;
            if (s->in_flight == 0)
                break; /* nothing is less loaded than idle */
            continue;
        }
        /* s->in_flight / s->capacity < b->in_flight / b->capacity, without division */
        const dsp_sched_slots *b = ws[best];
        if ((uint64_t)s->in_flight * b->capacity < (uint64_t)b->in_flight * s->capacity)
            best = (int)i;
    }
    if (best >= 0)
        *cursor = (size_t)best + 1;
    return best;
}

/* ---- least-loaded over many workers ---- */

/* The tie-break's rank is computed once per build: comparing (a + n - base) % n at each
 * step took two divisions, the larger part of a pick at K=256. */
static bool ll_less(dsp_sched_slots *const *ws, dsp_ll_entry a, dsp_ll_entry b)
{
    const dsp_sched_slots *sa = ws[a.idx], *sb = ws[b.idx];
    uint64_t la = (uint64_t)sa->in_flight * sb->capacity, lb = (uint64_t)sb->in_flight * sa->capacity;
    if (la != lb)
        return la < lb;
    return a.rank < b.rank;
}

static void ll_sift_down(dsp_ll_heap *h, dsp_sched_slots *const *ws, size_t i)
{
    dsp_ll_entry *x = h->e;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && ll_less(ws, x[l], x[m]))
            m = l;
        if (r < h->n && ll_less(ws, x[r], x[m]))
            m = r;
        if (m == i)
            return;
        dsp_ll_entry tmp = x[i];
        x[i] = x[m];
        x[m] = tmp;
        i = m;
    }
}

int dsp_ll_build(dsp_ll_heap *h, dsp_sched_slots *const *ws, size_t n, size_t cursor)
{
    if (n > UINT32_MAX)
        return -1;
    if (h->cap < n) {
        dsp_ll_entry *e = realloc(h->e, n * sizeof *e);
        if (!e)
            return -1;
        h->e = e;
        h->cap = n;
    }
    size_t base = n ? cursor % n : 0;
    h->n = 0;
    for (size_t i = 0; i < n; i++)
        if (dsp_sched_has_room(ws[i]))
            h->e[h->n++] = (dsp_ll_entry){(uint32_t)i, (uint32_t)(i >= base ? i - base : i + n - base)};
    for (size_t i = h->n / 2; i-- > 0;)
        ll_sift_down(h, ws, i);
    return 0;
}

int dsp_ll_pick(dsp_ll_heap *h, dsp_sched_slots *const *ws, size_t *cursor)
{
    while (h->n > 0) {
        /* The last pick was the root, and its load may have grown since: sifting the
         * root down restores the order (nothing else changed). */
        ll_sift_down(h, ws, 0);
        uint32_t r = h->e[0].idx;
        if (dsp_sched_has_room(ws[r])) {
            *cursor = (size_t)r + 1;
            return (int)r;
        }
        h->e[0] = h->e[--h->n]; /* full: out until the next build */
    }
    return -1;
}

/* ---- the rate limit's token bucket ---- */

static uint64_t bucket_burst(uint32_t rate)
{
    return (uint64_t)(rate ? rate : 1) * 1000;
}

void dsp_bucket_refill(dsp_bucket *b, uint32_t rate, int64_t now_ms)
{
    uint64_t burst = bucket_burst(rate);
    if (b->last_ms == 0 || b->milli > burst) { /* full at first use; a lowered rate cuts it */
        b->milli = burst;
        b->last_ms = now_ms;
        return;
    }
    if (now_ms <= b->last_ms)
        return;
    /* A second refills the whole burst: longer gaps need not be multiplied out. */
    int64_t dt = now_ms - b->last_ms;
    uint64_t add = dt >= 1000 ? burst : (uint64_t)rate * (uint64_t)dt;
    b->milli = burst - b->milli < add ? burst : b->milli + add;
    b->last_ms = now_ms;
}

bool dsp_bucket_ready(dsp_bucket *b, uint32_t rate, int64_t now_ms)
{
    dsp_bucket_refill(b, rate, now_ms);
    return b->milli >= 1000;
}

bool dsp_bucket_take(dsp_bucket *b, uint32_t rate, int64_t now_ms)
{
    if (!dsp_bucket_ready(b, rate, now_ms))
        return false;
    b->milli -= 1000;
    return true;
}

/* The slots ty's concurrency limit leaves (UINT64_MAX: no limit). */
static uint64_t limit_left(const dsp_type *ty)
{
    if (!ty->max_running)
        return UINT64_MAX;
    return ty->running < ty->max_running ? ty->max_running - ty->running : 0;
}

/* Whether ty may start a task now under its limits; one waiting for its rate asks the
 * tick for another pass (its tokens come back with time, not with an event). */
static bool limit_allows(dsp_server *srv, dsp_type *ty, int64_t now_ms)
{
    if (limit_left(ty) == 0)
        return false;
    if (ty->max_rate && !dsp_bucket_ready(&ty->bucket, ty->max_rate, now_ms)) {
        srv->sched.limit_waiting = true;
        return false;
    }
    return true;
}

/* ---- queues ---- */

static void busy_add(dsp_server *srv, dsp_type *ty)
{
    ty->busy_prev = NULL;
    ty->busy_next = srv->sched.busy_types;
    if (srv->sched.busy_types)
        srv->sched.busy_types->busy_prev = ty;
    srv->sched.busy_types = ty;
}

static void busy_remove(dsp_server *srv, dsp_type *ty)
{
    if (ty->busy_prev)
        ty->busy_prev->busy_next = ty->busy_next;
    else
        srv->sched.busy_types = ty->busy_next;
    if (ty->busy_next)
        ty->busy_next->busy_prev = ty->busy_prev;
    ty->busy_prev = ty->busy_next = NULL;
}

/* The list a task waits in: its priority, a larger value from the table as HIGH. */
static unsigned prio_of(const dsp_task *t)
{
    return t->priority < DSP_PRIORITIES ? t->priority : DSP_PRIORITIES - 1;
}

void dsp_dispatch_enqueue(dsp_server *srv, dsp_type *ty, dsp_task *t)
{
    if (ty->nbuffered == 0)
        busy_add(srv, ty);
    unsigned p = prio_of(t);
    /* Keep ascending seq. A claimed task has the highest seq yet: the tail. A task taken
     * back from a worker was claimed before every task of its priority still buffered
     * except those taken back before it, which sit at the head: the walk stops within
     * them. */
    dsp_task *after = ty->tail[p];
    if (after && after->seq > t->seq) {
        after = NULL;
        for (dsp_task *q = ty->head[p]; q && q->seq < t->seq; q = q->next)
            after = q;
    }
    t->prev = after;
    t->next = after ? after->next : ty->head[p];
    if (t->next)
        t->next->prev = t;
    else
        ty->tail[p] = t;
    if (after)
        after->next = t;
    else
        ty->head[p] = t;
    ty->nbuffered++;
}

dsp_task *dsp_dispatch_peek(const dsp_type *ty)
{
    for (unsigned p = DSP_PRIORITIES; p-- > 0;)
        if (ty->head[p])
            return ty->head[p];
    return NULL;
}

void dsp_dispatch_unlink(dsp_server *srv, dsp_task *t)
{
    dsp_type *ty = t->type;
    unsigned p = prio_of(t);
    if (t->prev)
        t->prev->next = t->next;
    else
        ty->head[p] = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        ty->tail[p] = t->prev;
    t->next = t->prev = NULL;
    if (--ty->nbuffered == 0)
        busy_remove(srv, ty);
}

dsp_task *dsp_dispatch_dequeue(dsp_server *srv, dsp_type *ty)
{
    dsp_task *t = dsp_dispatch_peek(ty);
    dsp_dispatch_unlink(srv, t);
    return t;
}

/* No task is dispatched any more: shutting down, or drained from the admin port.
 * Claimed tasks then go back to NEW rather than into a type's queue. */
bool dsp_dispatch_stopped(const dsp_server *srv)
{
    return srv->control.draining || srv->control.admin_draining;
}

/* ---- workers and room ---- */

/* Free slots of an accepting worker: capacity is at most --max-capacity and in_flight
 * never above it, so this is small and never negative. */
static int64_t free_slots(const dsp_conn *c)
{
    return c->slots.in_flight < c->slots.capacity ? (int64_t)c->slots.capacity - (int64_t)c->slots.in_flight
                                                  : 0;
}

static void room_changed(dsp_server *srv, dsp_conn *c, int64_t delta)
{
    srv->sched.room += (uint64_t)delta;
    for (size_t i = 0; i < c->ntypes; i++)
        c->types[i]->room += (uint64_t)delta;
    if (delta > 0)
        dsp_server_kick(srv);
}

/* The room counts a worker's free slots only while it accepts tasks (after WELCOME,
 * until STOP either way). */
static void room_take(dsp_conn *c, int64_t delta)
{
    if (c->slots.accepting && c->state == DSP_CONN_ACTIVE)
        room_changed(c->srv, c, delta);
}

void dsp_dispatch_worker_stop(dsp_server *srv, dsp_conn *c)
{
    if (c->slots.accepting)
        room_changed(srv, c, -free_slots(c));
    c->slots.accepting = false;
}

static void claim_soon_after_join(dsp_server *srv);

void dsp_dispatch_worker_joined(dsp_server *srv, dsp_conn *c)
{
    for (size_t i = 0; i < c->ntypes; i++) {
        dsp_type *ty = c->types[i];
        if (ty->nworkers == ty->cap) {
            size_t cap = ty->cap ? ty->cap * 2 : 4;
            dsp_sched_slots **w = realloc(ty->workers, cap * sizeof *w);
            if (!w) {
                dsp_conn_close(c, PROTO_ERR_SHUTDOWN, "out of memory");
                return;
            }
            ty->workers = w;
            ty->cap = cap;
        }
        ty->workers[ty->nworkers++] = &c->slots;
        ty->orphaned_ms = 0;
    }
    srv->sched.nworkers++;
    srv->sched.gen++;
    if (c->slots.accepting)
        room_changed(srv, c, free_slots(c));
    claim_soon_after_join(srv);
    dsp_server_kick(srv);
}

void dsp_dispatch_worker_left(dsp_server *srv, dsp_conn *c, bool refund)
{
    dsp_dispatch_worker_stop(srv, c);
    for (size_t i = 0; i < c->ntypes; i++) {
        dsp_type *ty = c->types[i];
        for (size_t k = 0; k < ty->nworkers; k++)
            if (ty->workers[k] == &c->slots) {
                ty->workers[k] = ty->workers[--ty->nworkers];
                break;
            }
    }
    srv->sched.nworkers--;
    srv->sched.gen++;
    for (dsp_task *t = c->inflight, *next; t; t = next) {
        next = t->next;
        dsp_dispatch_inflight_del(c, t, DSP_SLOT_KEEP); /* every slot is dropped below */
        if (refund && t->attempts > 0) {
            /* A worker that let every recent delivery time out is judged not to have run
             * these: their attempt is given back (docs/taskpushd.md, Attempts: attempts count deliveries to a
             * worker that could run them). */
            t->attempts--;
            srv->stats.tasks.refunded_total++;
        }
        dsp_server_take_back(srv, t, "worker lost");
    }
    c->slots.in_flight = 0; /* cancelled deliveries' slots too */
    /* Types nobody serves any more: freed now, or once their buffered tasks went back
     * (release_orphans, from the housekeeping tick). */
    for (size_t i = 0; i < c->ntypes; i++)
        dsp_server_type_release_if_unused(srv, c->types[i]);
    /* Marked ACTIVE no more by the caller; make sure a second call is harmless. */
    c->ntypes = 0;
}

/* ---- in-flight accounting ---- */

/* When the tick must first look at a new delivery: at its attempt's record (a
 * millisecond early, since the tick reads two clocks), or at the end of its lease,
 * whichever comes first. */
static int64_t lease_first_look(const dsp_task *t)
{
    int64_t record = (t->delivered_us + DSP_DELIVERY_RECORD_MS * 1000) / 1000 - 1;
    int64_t expired = t->deadline_ms + 1; /* the tick expires a lease when now > deadline */
    return record < expired ? record : expired;
}

void dsp_dispatch_slot_reserve(dsp_conn *c, bool take)
{
    if (take) {
        c->slots.in_flight++;
        room_take(c, -1);
    } else if (c->slots.in_flight > 0) {
        c->slots.in_flight--;
        room_take(c, +1);
    }
}

void dsp_dispatch_inflight_add(dsp_conn *c, dsp_task *t)
{
    /* Cannot fail after the dispatch pass's reservation; without a lease the task
     * would never time out, so say so if it ever does. */
    if (dsp_deadline_insert(&c->srv->sched.leases, &t->lease, lease_first_look(t)) < 0)
        log_error(&c->srv->log, "out of memory: task %llu has no lease", (unsigned long long)t->id);
    t->holder = c;
    t->prev = NULL;
    t->next = c->inflight;
    if (c->inflight)
        c->inflight->prev = t;
    c->inflight = t;
    t->type->running++;
    dsp_groups_add(t->type, t);
    c->slots.in_flight++;
    room_take(c, -1);
    c->srv->sched.ninflight++;
}

void dsp_dispatch_inflight_del(dsp_conn *c, dsp_task *t, enum dsp_slot slot)
{
    if (t) {
        if (t->prev)
            t->prev->next = t->next;
        else
            c->inflight = t->next;
        if (t->next)
            t->next->prev = t->prev;
        t->prev = t->next = NULL;
        t->holder = NULL;
        t->type->running--;
        dsp_groups_del(t->type, t);
        c->srv->sched.ninflight--;
        dsp_deadline_remove(&c->srv->sched.leases, &t->lease);
        if (slot == DSP_SLOT_FREE) { /* answered: the pace of claims follows these */
            dsp_pace_note(&t->type->pace);
            dsp_pace_note(&c->srv->sched.pace);
        }
    }
    if (slot == DSP_SLOT_KEEP)
        return;
    c->slots.in_flight--;
    room_take(c, +1);
    if (slot == DSP_SLOT_FREE)
        dsp_server_kick(c->srv); /* even with no room change: a pass may wait for it */
}

dsp_task *dsp_dispatch_lease_due(dsp_server *srv, int64_t now_ms)
{
    int64_t at;
    dsp_deadline_node *n = dsp_deadline_peek(&srv->sched.leases, &at);
    return n && at <= now_ms ? container_of(n, dsp_task, lease) : NULL;
}

void dsp_dispatch_lease_defer(dsp_server *srv, dsp_task *t, int64_t at_ms)
{
    dsp_deadline_update(&srv->sched.leases, &t->lease, at_ms);
}

/* ---- dispatch ---- */

/* Outcomes handed to the database and not yet written. Each would run again if the
 * daemon died now, so dispatch waits while there are more than --max-unwritten: the
 * duplicates of a crash stay bounded by what is in flight plus that. Their results are
 * held in memory until written, so dispatch also waits while they hold more than
 * --max-unwritten-bytes (16 large results would otherwise pile up by the thousand
 * behind a slow write). */
static bool unwritten_over_limit(const dsp_server *srv)
{
    return (int64_t)(srv->outbox.n + dsp_db_pending_writes(srv->db)) > srv->cfg->max_unwritten ||
           (int64_t)(srv->outbox.bytes + dsp_db_pending_write_bytes(srv->db)) >
               srv->cfg->max_unwritten_bytes;
}

static bool too_many_unwritten(dsp_server *srv)
{
    if (!unwritten_over_limit(srv))
        return false;
    srv->stats.conns.dispatch_throttled_total++;
    return true;
}

/* Dispatch order across types: ty, which has buffered tasks, becomes *best when it may
 * start one now and its next task goes out before *bt, the best head seen so far (NULL:
 * none yet): the higher priority, then the lower seq. */
static void keep_if_first(dsp_server *srv, dsp_type *ty, int64_t now, dsp_type **best,
                          const dsp_task **bt)
{
    if (ty->paused || !limit_allows(srv, ty, now))
        return;
    const dsp_task *h = dsp_groups_peek(ty);
    if (!h) /* every buffered task's key is at its limit (--group-limit) */
        return;
    if (!*bt || prio_of(h) > prio_of(*bt) || (prio_of(h) == prio_of(*bt) && h->seq < (*bt)->seq)) {
        *best = ty;
        *bt = h;
    }
}

/* Least-loaded with many workers goes through the type's heap, rebuilt at each pass
 * (sched.gen moves at each pass, join and leave); a delivery to a worker that also serves
 * other types makes their heaps stale (ll_dirty_others). */
#define LL_HEAP_MIN_WORKERS 8

static int pick_worker(dsp_server *srv, dsp_type *ty)
{
    if (srv->cfg->scheduler != DSP_SCHED_LEAST_LOADED || ty->nworkers < LL_HEAP_MIN_WORKERS)
        return dsp_sched_pick(srv->cfg->scheduler, ty->workers, ty->nworkers, &ty->cursor);
    if (ty->ll.gen != srv->sched.gen) {
        if (dsp_ll_build(&ty->ll, ty->workers, ty->nworkers, ty->cursor) < 0)
            return dsp_sched_pick(srv->cfg->scheduler, ty->workers, ty->nworkers, &ty->cursor);
        ty->ll.gen = srv->sched.gen;
    }
    return dsp_ll_pick(&ty->ll, ty->workers, &ty->cursor);
}

static void ll_dirty_others(dsp_conn *c, const dsp_type *ty)
{
    if (c->ntypes < 2)
        return;
    for (size_t i = 0; i < c->ntypes; i++)
        if (c->types[i] != ty)
            c->types[i]->ll.gen = 0;
}

/* Hands ty's next task to c, which has a free slot: the whole bookkeeping of a delivery
 * (its attempt, epoch and lease's end, the in-flight list, slot and counters) is here, next
 * to the accounting it feeds; conn.c only writes the TASK frame. false (nothing done) when
 * its lease finds no memory. */
static bool deliver_next(dsp_server *srv, dsp_type *ty, dsp_conn *c, int64_t pass_us, int64_t now)
{
    /* The lease's place in the heap, taken before the task leaves its queue. */
    if (dsp_deadline_reserve(&srv->sched.leases, srv->sched.leases.n + 1) < 0) {
        log_error(&srv->log, "out of memory: dispatch waits");
        return false;
    }
    if (ty->max_rate)
        dsp_bucket_take(&ty->bucket, ty->max_rate, now);
    dsp_task *t = dsp_groups_peek(ty); /* keep_if_first found one */
    dsp_dispatch_unlink(srv, t);
    srv->sched.nbuffered--;
    t->delivered_us = pass_us;
    ll_dirty_others(c, ty);
    t->attempts++;
    t->recorded = false;
    t->dlv_epoch = srv->lead.epoch;
    t->deadline_ms = now + t->timeout_ms;
    dsp_dispatch_inflight_add(c, t);
    c->delivered_total++;
    srv->stats.tasks.dispatched_total++;
    dsp_conn_send_task(c, t, now);
    return true;
}

void dsp_dispatch_run(dsp_server *srv)
{
    if (!srv->sched.busy_types || srv->sched.room == 0 || too_many_unwritten(srv))
        return;
    /* One clock read per pass: the deliveries of a pass are microseconds apart. */
    int64_t pass_us = dsp_now_us(), now = pass_us / 1000;
    srv->sched.gen++;
    for (;;) {
        /* The type whose next task comes first, among types with room.
         * Only types with buffered tasks are looked at: a pass costs the same however
         * many idle types workers registered. */
        dsp_type *best = NULL;
        const dsp_task *bt = NULL;
        for (dsp_type *ty = srv->sched.busy_types; ty; ty = ty->busy_next)
            if (ty->room > 0)
                keep_if_first(srv, ty, now, &best, &bt);
        if (!best)
            break;
        int i = pick_worker(srv, best);
        if (i < 0) {
            log_error(&srv->log, "type %s counts room %llu but no worker has a free slot", best->name,
                      (unsigned long long)best->room);
            best->room = 0;
            continue;
        }
        if (!deliver_next(srv, best, container_of(best->workers[i], dsp_conn, slots), pass_us, now))
            break;
    }
}

void dsp_dispatch_refill(dsp_server *srv, dsp_conn *c)
{
    if (srv->sched.nbuffered == 0 || free_slots(c) == 0 || !c->slots.accepting ||
        c->state != DSP_CONN_ACTIVE || dsp_dispatch_stopped(srv) || srv->control.paused_all ||
        unwritten_over_limit(srv))
        return;
    int64_t pass_us = dsp_now_us(), now = pass_us / 1000;
    while (free_slots(c) > 0) {
        dsp_type *best = NULL;
        const dsp_task *bt = NULL;
        for (size_t i = 0; i < c->ntypes; i++)
            if (c->types[i]->nbuffered > 0)
                keep_if_first(srv, c->types[i], now, &best, &bt);
        /* Another worker of that type has room as well: choosing between them is the
         * scheduler's, in the pass at the end of this loop iteration. */
        if (!best || best->room > (uint64_t)free_slots(c) ||
            !deliver_next(srv, best, c, pass_us, now))
            break;
    }
}

/* ---- the claim budget ---- */

double dsp_pace_rate(dsp_pace *p, int64_t now_ms)
{
    if (p->since_ms == 0 || now_ms < p->since_ms) {
        p->since_ms = now_ms;
        p->count = 0;
        return p->per_s;
    }
    int64_t dt = now_ms - p->since_ms;
    if (dt < DSP_PACE_SAMPLE_MS)
        return p->per_s;
    double inst = (double)p->count * 1000.0 / (double)dt;
    int64_t tau = inst > p->per_s ? DSP_PACE_TAU_UP_MS : DSP_PACE_TAU_DOWN_MS;
    double w = dt >= tau ? 1.0 : (double)dt / (double)tau;
    p->per_s += (inst - p->per_s) * w;
    p->count = 0;
    p->since_ms = now_ms;
    return p->per_s;
}

uint64_t dsp_claim_ahead(double per_s, int64_t horizon_ms, uint64_t least, int64_t prefetch)
{
    if (prefetch <= 0)
        return 0;
    uint64_t cap = (uint64_t)prefetch;
    if (horizon_ms <= 0)
        return cap;
    if (least > cap)
        least = cap;
    double x = per_s * ((double)horizon_ms / 1000.0);
    if (!(x > (double)least)) /* NaN and negative rates too */
        return least;
    if (x >= (double)cap) /* before the conversion: a double beyond 2^64 is no integer */
        return cap;
    return (uint64_t)x;
}

uint64_t dsp_claim_budget(uint64_t room, uint64_t ahead, uint64_t held, uint64_t cap)
{
    uint64_t want = room + ahead;
    if (want < room)
        want = UINT64_MAX;
    if (want <= held)
        return 0;
    want -= held;
    return want < cap ? want : cap;
}

/* ---- claims ---- */

static void arm_claim_timer(dsp_server *srv, int64_t at)
{
    int64_t d = at - dsp_now_ms();
    if (d < 0)
        d = 0;
    struct timeval tv = {(time_t)(d / 1000), (suseconds_t)((d % 1000) * 1000)};
    evtimer_add(srv->claim.timer, &tv);
    srv->claim.timer_armed = true;
}

/* A claim asks, per type, for the workers' free slots plus what they finish in
 * --prefetch-ms (the type's ahead), less what is buffered, so that each claim is the
 * next stretch of dispatch order and a row is PROCESSING only briefly before it runs.
 * Starvation is judged per type: tasks buffered for one type cannot feed idle workers
 * of another, and such a type's claim still has a positive want (its room is not yet
 * matched by buffered tasks). */
/* ty's free slots, as far as its concurrency limit lets them be used. */
static uint64_t type_room(const dsp_type *ty)
{
    uint64_t left = limit_left(ty);
    return ty->room < left ? ty->room : left;
}

static bool type_warm(const dsp_type *ty, int64_t now)
{
    return ty->rows_seen_ms > 0 && now - ty->rows_seen_ms < TYPE_WARM_MS;
}

/* New room, maybe new types: claim soon, but at most once per --poll-ms for joins, so
 * that peers joining in a loop cannot keep the claim thread busy. */
static void claim_soon_after_join(dsp_server *srv)
{
    int64_t now = dsp_now_ms();
    if (now - srv->claim.join_ms >= srv->cfg->poll_ms) {
        srv->claim.join_ms = now;
        srv->claim.not_before = 0;
    } else if (srv->claim.not_before > srv->claim.join_ms + srv->cfg->poll_ms) {
        srv->claim.not_before = srv->claim.join_ms + srv->cfg->poll_ms;
    }
}

void dsp_claim_pacing_answered(dsp_server *srv, int64_t now_ms)
{
    srv->claim.outstanding = false;
    double d = (double)(now_ms > srv->claim.sent_ms ? now_ms - srv->claim.sent_ms : 0);
    double *avg = &srv->claim.round_trip_ms;
    *avg = *avg > 0 ? *avg + (d - *avg) / 4 : d;
}

/* The horizon the ahead covers: --prefetch-ms plus two claims' round trips, those
 * counted up to --prefetch-ms / 2 each (a stalled database must not inflate the
 * buffer), so at most twice --prefetch-ms; 0 (no pacing) with --prefetch-ms 0. */
static int64_t ahead_horizon(const dsp_server *srv)
{
    int64_t h = srv->cfg->prefetch_ms;
    if (h <= 0)
        return 0;
    int64_t rt = srv->claim.round_trip_ms < (double)(h / 2) ? (int64_t)srv->claim.round_trip_ms : h / 2;
    return h + 2 * rt;
}

/* What a claim may ask for ty: 0 unless served and not paused. Its ahead is its rate
 * over the horizon, at least DSP_AHEAD_FLOOR, so that a type with no rate yet (a cold
 * start, workers busy with long tasks) still claims a batch. */
static uint64_t type_want(dsp_type *ty, int64_t now, const dsp_server *srv, uint64_t cap)
{
    if (ty->nworkers == 0 || ty->paused)
        return 0;
    uint64_t ahead = dsp_claim_ahead(dsp_pace_rate(&ty->pace, now), ahead_horizon(srv), DSP_AHEAD_FLOOR,
                                     srv->cfg->prefetch);
    /* A limited type claims no more than its limits let start soon: the slots its
     * concurrency leaves, and ahead at most the limit (or one second of its rate). */
    if (ty->max_running && ahead > ty->max_running)
        ahead = ty->max_running;
    if (ty->max_rate && ahead > ty->max_rate)
        ahead = ty->max_rate;
    return dsp_claim_budget(type_room(ty), ahead, ty->nbuffered, cap);
}

void dsp_dispatch_claim_now(dsp_server *srv)
{
    srv->claim.not_before = 0;
    srv->claim.gather_until = 0;
    if (srv->claim.outstanding)
        srv->claim.again = true; /* its answer may predate the rows */
    if (srv->claim.timer_armed) {
        evtimer_del(srv->claim.timer);
        srv->claim.timer_armed = false;
    }
    dsp_dispatch_claim_maybe(srv);
}

void dsp_dispatch_claim_maybe(dsp_server *srv)
{
    if (srv->claim.outstanding || srv->claim.timer_armed || !srv->lead.leading || dsp_dispatch_stopped(srv) ||
        srv->control.paused_all || srv->control.settings_pending)
        return;
    const dsp_config *cfg = srv->cfg;
    /* Tasks buffered for a type nobody serves any more wait for the orphan sweep; they
     * must not hold back claims for the types that do have workers. */
    uint64_t orphaned = 0;
    for (dsp_type *ty = srv->sched.busy_types; ty; ty = ty->busy_next)
        if (ty->nworkers == 0)
            orphaned += ty->nbuffered;
    int64_t now = dsp_now_ms();
    uint64_t ahead = dsp_claim_ahead(dsp_pace_rate(&srv->sched.pace, now), ahead_horizon(srv),
                                     DSP_AHEAD_FLOOR, cfg->prefetch);
    /* --batch bounds the total, so the figures below stay far from any overflow. */
    uint64_t held = srv->sched.nbuffered > orphaned ? srv->sched.nbuffered - orphaned : 0;
    int64_t want = (int64_t)dsp_claim_budget(srv->sched.room, ahead, held, (uint64_t)cfg->batch);
    if (want <= 0)
        return;
    /* The byte budget: no claim while the payloads held reach it; a task's end frees
     * its bytes and kicks a dispatch pass, which comes back here. */
    uint64_t max_bytes = (uint64_t)cfg->max_buffered_bytes;
    if (srv->tasks.payload_bytes >= max_bytes)
        return;
    if (now < srv->claim.not_before) {
        arm_claim_timer(srv, srv->claim.not_before);
        return;
    }
    /* Claim in large batches: while every type still has tasks buffered, wait
     * for half the ahead of room; when some worker would run dry, wait only
     * GATHER_MS for more room to come. */
    int64_t low = (int64_t)(ahead < (uint64_t)cfg->batch ? ahead : (uint64_t)cfg->batch) / 2;
    if (want < low) {
        bool starving = false;
        for (dsp_type *ty = srv->types.list; ty && !starving; ty = ty->next)
            starving = ty->nworkers > 0 && !ty->paused && ty->nbuffered < type_room(ty);
        if (!starving)
            return;
        if (srv->claim.gather_until == 0)
            srv->claim.gather_until = now + GATHER_MS;
        if (now < srv->claim.gather_until) {
            arm_claim_timer(srv, srv->claim.gather_until);
            return;
        }
    }
    srv->claim.gather_until = 0;

    /* At most CLAIM_MAX_TYPES types: the warm ones (rows lately) in turn, in all but
     * CLAIM_COLD_SLOTS places, then the cold ones in turn. Each group has its own
     * rotor, so every type is asked for within a few claims however many there are,
     * and a thousand idle types cannot crowd out the few that have work. */
    const char *names[CLAIM_MAX_TYPES];
    uint32_t limits[CLAIM_MAX_TYPES];
    size_t count[2] = {0, 0}, take[2], start[2], seen[2] = {0, 0}, n = 0;
    for (dsp_type *ty = srv->types.list; ty; ty = ty->next)
        if (type_want(ty, now, srv, (uint64_t)want) > 0)
            count[type_warm(ty, now)]++;
    size_t cold_room = count[0] < CLAIM_COLD_SLOTS ? count[0] : CLAIM_COLD_SLOTS;
    take[1] = count[1] < CLAIM_MAX_TYPES - cold_room ? count[1] : CLAIM_MAX_TYPES - cold_room;
    take[0] = count[0] < CLAIM_MAX_TYPES - take[1] ? count[0] : CLAIM_MAX_TYPES - take[1];
    for (int g = 0; g < 2; g++)
        start[g] = count[g] ? srv->claim.rotor[g] % count[g] : 0;
    for (dsp_type *ty = srv->types.list; ty && n < CLAIM_MAX_TYPES; ty = ty->next) {
        uint64_t lim = type_want(ty, now, srv, (uint64_t)want);
        if (lim == 0)
            continue;
        int g = type_warm(ty, now);
        /* Is this type's index within the group's window [start, start + take)? */
        size_t pos = (seen[g]++ + count[g] - start[g]) % count[g];
        if (pos >= take[g])
            continue;
        names[n] = ty->name;
        limits[n++] = (uint32_t)lim; /* at most want, at most --batch */
    }
    for (int g = 0; g < 2; g++)
        srv->claim.rotor[g] = count[g] ? (start[g] + take[g]) % count[g] : 0;
    dsp_claim_request req = {.ntypes = n, .types = names, .limits = limits, .total = (uint32_t)want,
                              .max_bytes = max_bytes - srv->tasks.payload_bytes};
    if (n > 0 && dsp_db_claim(srv->db, &req) == 0) {
        srv->claim.outstanding = true;
        srv->claim.again = false;
        srv->claim.requested = (uint32_t)want;
        srv->claim.sent_ms = now;
    }
}

/* MariaDB sends a transaction's events before its commit is visible to other sessions
 * (InnoDB commits after the binary log is written), so a claim rung by the log may find
 * nothing: it is tried again this often, this many times, before the poll takes over. */
#define WAKE_RETRY_MS 20
#define WAKE_RETRIES 3
/* A rung claim comes at least a gap after the last claim, WAKE_GAP_MS while claims find
 * a row or none (single inserts: a row waits at most this much more). Once
 * WAKE_FLOOD_CLAIMS claims in a row found several (a flood of inserts, not two rows that
 * happened to come close), the gap doubles at each claim up to --poll-ms: a flood then
 * costs the claims polling would, each taking every row committed by then, not a claim
 * per row. */
#define WAKE_GAP_MS 10
#define WAKE_FLOOD_CLAIMS 4
/* Once WAKE_REST_CLAIMS claims in a row found several rows, the last of them at the
 * widest gap, the doorbell rings for nothing: the follower rests (leaves the log) until a
 * claim finds fewer than 2 rows. Its dump and parsing of every transaction took about
 * 7 % of 1-row producers' rate on 2 shared cores (docs/journal/bench.md). */
#define WAKE_REST_CLAIMS 16

static int64_t wake_gap(const dsp_server *srv)
{
    return srv->claim.wake_gap_ms > WAKE_GAP_MS ? srv->claim.wake_gap_ms : WAKE_GAP_MS;
}

static void wake_claim(dsp_server *srv)
{
    int64_t now = dsp_now_ms(), at = srv->claim.sent_ms + wake_gap(srv);

    srv->claim.wake_retries = WAKE_RETRIES;
    if (!srv->claim.outstanding && now >= at) {
        dsp_dispatch_claim_now(srv);
        return;
    }
    if (at < now)
        at = now;
    /* Coalesced: one claim at `at` (after the running one) takes these rows and the next. */
    if (srv->claim.wake_at == 0 || at < srv->claim.wake_at)
        srv->claim.wake_at = at;
    if (!srv->claim.outstanding && (srv->claim.not_before == 0 || srv->claim.not_before > at)) {
        srv->claim.not_before = at;
        if (srv->claim.timer_armed) {
            evtimer_del(srv->claim.timer);
            srv->claim.timer_armed = false;
        }
        dsp_dispatch_claim_maybe(srv);
    }
}

static void due_arm(dsp_server *srv)
{
    if (srv->claim.ndues == 0 || srv->claim.due_timer == NULL)
        return;
    int64_t wait = srv->claim.dues[0] - dsp_wall_ms();
    struct timeval tv = {0, 0};
    if (wait > 0) {
        tv.tv_sec = (time_t)(wait / 1000);
        tv.tv_usec = (suseconds_t)(wait % 1000) * 1000;
    }
    evtimer_add(srv->claim.due_timer, &tv);
}

static void due_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    int64_t now = dsp_wall_ms();
    size_t k = 0;
    bool due = false;

    for (size_t i = 0; i < srv->claim.ndues; i++) {
        if (srv->claim.dues[i] <= now)
            due = true;
        else
            srv->claim.dues[k++] = srv->claim.dues[i];
    }
    srv->claim.ndues = k;
    if (due)
        wake_claim(srv);
    due_arm(srv);
}

void dsp_dispatch_on_wake(void *arg, int64_t due_wall_ms)
{
    dsp_server *srv = arg;
    size_t i;

    if (due_wall_ms <= dsp_wall_ms()) {
        wake_claim(srv);
        return;
    }
    /* Kept sorted and bounded: past the limit the latest goes (the poll covers it). */
    if (srv->claim.ndues == DSP_WAKE_DUES_MAX) {
        if (due_wall_ms >= srv->claim.dues[DSP_WAKE_DUES_MAX - 1])
            return;
        srv->claim.ndues--;
    }
    for (i = srv->claim.ndues; i > 0 && srv->claim.dues[i - 1] > due_wall_ms; i--)
        srv->claim.dues[i] = srv->claim.dues[i - 1];
    srv->claim.dues[i] = due_wall_ms;
    srv->claim.ndues++;
    if (i == 0)
        due_arm(srv);
}

static void claim_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    srv->claim.timer_armed = false;
    dsp_dispatch_claim_maybe(srv);
}

int dsp_claim_pacing_init(dsp_server *srv)
{
    srv->claim.timer = evtimer_new(srv->base, claim_timer_cb, srv);
    srv->claim.due_timer = evtimer_new(srv->base, due_timer_cb, srv);
    return srv->claim.timer && srv->claim.due_timer ? 0 : -1;
}

void dsp_claim_pacing_free(dsp_server *srv)
{
    if (srv->claim.timer)
        event_free(srv->claim.timer);
    if (srv->claim.due_timer)
        event_free(srv->claim.due_timer);
}

void dsp_claim_pacing_failed(dsp_server *srv, int64_t now_ms)
{
    srv->claim.not_before = now_ms + srv->cfg->poll_ms;
    srv->claim.wake_at = 0;
}

void dsp_claim_pacing_claimed(dsp_server *srv, int64_t now_ms, size_t got, bool more)
{
    bool full = got >= srv->claim.requested || more;
    srv->claim.not_before = full || srv->claim.again ? 0 : now_ms + srv->cfg->poll_ms;
    if (got > 0)
        srv->claim.wake_retries = 0;
    else if (srv->claim.wake_retries > 0 && !srv->claim.again) { /* rung, found nothing yet */
        srv->claim.wake_retries--;
        srv->claim.not_before = now_ms + WAKE_RETRY_MS;
    }
    if (got < 2) { /* single rows: back to the shortest gap */
        srv->claim.wake_flood = 0;
        srv->claim.wake_gap_ms = WAKE_GAP_MS;
        if (srv->claim.wake_resting) {
            srv->claim.wake_resting = false;
            dsp_db_wake_rest(srv->db, false);
        }
    } else if (++srv->claim.wake_flood >= WAKE_FLOOD_CLAIMS) { /* a flood: widen the gap */
        int64_t g = wake_gap(srv) * 2;
        srv->claim.wake_gap_ms = g < srv->cfg->poll_ms ? g : srv->cfg->poll_ms;
        if (!srv->claim.wake_resting && srv->claim.wake_flood >= WAKE_REST_CLAIMS &&
            srv->claim.wake_gap_ms >= srv->cfg->poll_ms) {
            srv->claim.wake_resting = true;
            dsp_db_wake_rest(srv->db, true);
        }
    }
    if (srv->claim.wake_at != 0) { /* rung while it ran */
        if (srv->claim.not_before > srv->claim.wake_at)
            srv->claim.not_before = srv->claim.wake_at;
        srv->claim.wake_at = 0;
    }
    srv->claim.again = false;
}

void dsp_claim_pacing_hasten(dsp_server *srv)
{
    srv->claim.not_before = 0;
}
