/* inventory.c: the loop's side of protocol version 3 (proto/PROTOCOL.md, section 10): a
 * worker's HOLDING (each delivery queued for adoption, or refused with CANCEL), the
 * answers of the adoptions, the DONEs of deliveries this dispatcher does not hold
 * (foreign outcomes, written fenced by their own delivery, or only confirmed), and the
 * CONFIRMs due after each write report: queued here until they can ride in a write,
 * sent by conn.c (dsp_conn_send_confirms). The statements themselves run on the write
 * thread (db_write.c); nothing here touches MySQL.
 */
#include "conn.h"
#include "server.h"

#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

static void send_cancel(dsp_conn *c, const proto_dlv *d)
{
    proto_msg m = {.type = PROTO_CANCEL};

    m.u.cancel.task_id = d->task_id;
    m.u.cancel.epoch = d->epoch;
    m.u.cancel.attempt = d->attempt;
    dsp_conn_send_frame(c, &m);
}

static dsp_adopting *adopting_find(dsp_conn *c, uint64_t id, uint32_t epoch, uint32_t attempt)
{
    for (uint32_t i = 0; i < c->nadopting; i++) {
        dsp_adopting *p = &c->adopting[i];
        if (p->task_id == id && p->epoch == epoch && p->attempt == attempt)
            return p;
    }
    return NULL;
}

static bool adopting_has_id(const dsp_conn *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->nadopting; i++)
        if (c->adopting[i].task_id == id)
            return true;
    return false;
}

/* Why d cannot be adopted by c, or NULL. */
static const char *adopt_problem(dsp_conn *c, const proto_dlv *d)
{
    dsp_server *srv = c->srv;

    if (!srv->lead.leading)
        return "not leading";
    if (dsp_dispatch_stopped(srv))
        return "stopping";
    if (d->epoch == srv->lead.epoch) /* ours, and no longer held by anyone: taken back */
        return "a delivery of this epoch that is no longer current";
    if (dsp_taskmap_get(&srv->tasks.map, d->task_id) || adopting_has_id(c, d->task_id))
        return "held here already";
    if (c->slots.in_flight >= c->slots.capacity)
        return "beyond the worker's capacity";
    return NULL;
}

void dsp_inv_holding(dsp_conn *c, const proto_dlv_list *l)
{
    dsp_server *srv = c->srv;
    uint32_t queued = 0, refused = 0;

    for (uint16_t i = 0; i < l->n; i++) {
        proto_dlv d;
        const char *why;
        dsp_outcome *o = NULL;

        proto_dlv_at(l, i, &d);
        why = adopt_problem(c, &d);
        if (!why && c->nadopting == c->adopting_cap) {
            /* At most the capacity (the slots above bound it), which --max-capacity bounds. */
            uint32_t cap = c->adopting_cap ? c->adopting_cap * 2 : 16;
            dsp_adopting *a = realloc(c->adopting, cap * sizeof *a);
            if (a) {
                c->adopting = a;
                c->adopting_cap = cap;
            } else {
                why = "out of memory";
            }
        }
        if (!why && !(o = dsp_server_outbox_add(srv, d.task_id, DSP_WRITE_ADOPT, d.attempt, 0, NULL, 0)))
            why = "out of memory";
        if (why) {
            log_debug(&srv->log, "worker %s declared task %llu (epoch %u, attempt %u): refused, %s",
                      c->name, (unsigned long long)d.task_id, (unsigned)d.epoch, (unsigned)d.attempt, why);
            send_cancel(c, &d);
            srv->stats.tasks.adopt_refused_total++;
            refused++;
            continue;
        }
        o->conn_id = c->id;
        o->dlv_epoch = d.epoch;
        o->dlv_attempt = d.attempt;
        c->adopting[c->nadopting++] = (dsp_adopting){.task_id = d.task_id, .epoch = d.epoch,
                                                     .attempt = d.attempt};
        dsp_dispatch_slot_reserve(c, true);
        queued++;
    }
    log_info(&srv->log, "worker %s declared %u delivery(ies) it still runs: %u to adopt, %u refused",
             c->name, (unsigned)l->n, (unsigned)queued, (unsigned)refused);
    dsp_server_kick(srv); /* the outbox goes to the write thread in the next pass */
}

void dsp_inv_confirm_later(dsp_conn *c, dsp_outcome *o, uint32_t epoch, uint32_t attempt)
{
    if (c->version < 3)
        return;
    o->conn_id = c->id;
    o->dlv_epoch = epoch;
    o->dlv_attempt = attempt;
}

/* A DONE with nothing to write: it is confirmed once the write thread passed it (so never
 * by a dispatcher that lost its leadership meanwhile). */
static void confirm_only(dsp_conn *c, const proto_done *d)
{
    dsp_outcome *o = dsp_server_outbox_add(c->srv, d->task_id, DSP_WRITE_NOTE, d->attempt, 0, NULL, 0);
    if (o)
        dsp_inv_confirm_later(c, o, d->epoch, d->attempt);
}

void dsp_inv_done(dsp_conn *c, const proto_done *d, bool zombie)
{
    dsp_server *srv = c->srv;
    dsp_adopting *p = adopting_find(c, d->task_id, d->epoch, d->attempt);
    uint8_t kind = DSP_WRITE_SUCCEEDED;
    int64_t run_after = 0;
    dsp_outcome *o;

    if (p) { /* finished before its adoption was answered: applied then */
        if (!p->done) {
            p->data = d->data.len ? malloc(d->data.len) : NULL;
            if (p->data || d->data.len == 0) {
                if (d->data.len)
                    memcpy(p->data, d->data.ptr, d->data.len);
                p->len = d->data.len;
                p->outcome = d->outcome;
                p->retry_after_ms = d->retry_after_ms;
                p->done = true;
            }
        }
        return;
    }
    if (c->version < 3)
        return; /* as before version 3: ignored */
    /* A cancelled delivery of c, one of this epoch (taken back), or a task held here in
     * another form: nothing to write, only to confirm. */
    if (zombie || d->epoch == srv->lead.epoch || !srv->lead.leading ||
        dsp_taskmap_get(&srv->tasks.map, d->task_id)) {
        dsp_server_kick(srv);
        confirm_only(c, d);
        return;
    }
    if (d->outcome == PROTO_OUTCOME_FAIL_PERM) {
        kind = DSP_WRITE_FAILED;
    } else if (d->outcome != PROTO_OUTCOME_SUCCESS) {
        kind = DSP_WRITE_RETRY; /* FAILED instead when it was the last attempt (db_write.c) */
        run_after = dsp_wall_ms() +
                    dsp_server_retry_delay_ms(srv, d->outcome, d->retry_after_ms, d->attempt, d->task_id);
    }
    o = dsp_server_outbox_add(srv, d->task_id, kind, d->attempt, run_after, d->data.ptr, d->data.len);
    if (!o)
        return;
    o->foreign = true;
    dsp_inv_confirm_later(c, o, d->epoch, d->attempt);
    dsp_server_kick(srv);
}

/* The row of an adoption nobody can take any more (its worker left, its type cannot be
 * held): back to NEW, with the attempt the adoption recorded. */
static void release_row(dsp_server *srv, const dsp_write_ack *a)
{
    dsp_outcome *o = dsp_server_outbox_add(srv, a->task_id, DSP_WRITE_RELEASE, a->attempt, 0,
                                           NULL, 0);
    if (o) {
        o->claim_seq = a->claim_seq; /* the adoption listed it in task_claim */
        srv->stats.tasks.released_total++;
    }
}

/* adopt_task makes the delivery p of c, whose row is now ours, a task held by c. Returns
 * false when it cannot (the caller releases the row and cancels). */
static bool adopt_task(dsp_conn *c, const dsp_adopting *p, const dsp_write_ack *a)
{
    dsp_server *srv = c->srv;
    dsp_type *ty = dsp_server_type_intern(srv, (const uint8_t *)a->type, strlen(a->type));
    dsp_task *t = dsp_server_task_new(srv);

    if (!ty || !t || dsp_taskmap_get(&srv->tasks.map, p->task_id) ||
        dsp_taskmap_put(&srv->tasks.map, p->task_id, t) < 0) {
        if (t)
            dsp_server_task_put(srv, t);
        if (ty)
            dsp_server_type_release_if_unused(srv, ty);
        return false;
    }
    t->id = p->task_id;
    dsp_deadline_node_init(&t->lease);
    t->seq = srv->sched.next_seq++;
    t->type = ty;
    t->attempts = p->attempt;
    t->max_attempts = a->max_attempts ? a->max_attempts : 1;
    t->timeout_ms = (uint32_t)srv->cfg->task_timeout_ms;
    t->priority = a->priority;
    t->adopted = true;
    t->claim_seq = a->claim_seq;
    t->recorded = true; /* the adoption wrote attempts */
    t->dlv_epoch = p->epoch;
    t->delivered_us = dsp_now_us();
    t->deadline_ms = dsp_now_ms() + t->timeout_ms;
    dsp_dispatch_inflight_add(c, t);
    srv->stats.tasks.adopted_total++;
    if (p->done) {
        dsp_dispatch_inflight_del(c, t, DSP_SLOT_FREE);
        c->completed_total++;
        dsp_server_task_done(srv, c, t, p->outcome, p->retry_after_ms, p->data, p->len);
    }
    return true;
}

static void adopt_answer(dsp_server *srv, dsp_conn *c, const dsp_write_ack *a)
{
    dsp_adopting *pp = c ? adopting_find(c, a->task_id, a->epoch, a->attempt) : NULL;
    dsp_adopting p;
    proto_dlv d = {a->task_id, a->epoch, a->attempt};

    if (!pp) { /* its connection is gone */
        if (a->ok && srv->lead.leading && !dsp_taskmap_get(&srv->tasks.map, a->task_id))
            release_row(srv, a);
        return;
    }
    p = *pp;
    *pp = c->adopting[--c->nadopting];
    dsp_dispatch_slot_reserve(c, false);
    if (a->ok && srv->lead.leading && a->type && c->state == DSP_CONN_ACTIVE && adopt_task(c, &p, a)) {
        free(p.data);
        return;
    }
    /* Adopted but not held (the connection is closing, the type cannot be interned): the
     * row goes back to NEW, unless this dispatcher holds the task in another form. */
    if (a->ok && srv->lead.leading && !dsp_taskmap_get(&srv->tasks.map, a->task_id))
        release_row(srv, a);
    srv->stats.tasks.adopt_refused_total++;
    if (c->state == DSP_CONN_ACTIVE) {
        send_cancel(c, &d);
        if (p.done) { /* its outcome was never applied: confirmed as not applicable */
            proto_done done = {.task_id = p.task_id, .epoch = p.epoch, .attempt = p.attempt};
            confirm_only(c, &done);
        }
    }
    free(p.data);
}

/* A CONFIRM waits, so that it goes out in the same write as the next frames of its
 * connection: sent on its own, it was every second write of taskpushd and every second
 * wake-up of a worker when 256 workers of capacity 4 drained the table (docs/journal/bench.md,
 * "Flatness: 256 workers and their wake-ups").
 * It waits at most CONFIRM_WAIT_MS, and a connection holds at most capacity +
 * CONFIRM_WAIT_SPARE of them: well under the 4 x capacity + 1024 unconfirmed outcomes a
 * worker keeps (docs/protocol.md). */
#define CONFIRM_WAIT_MS 50
#define CONFIRM_WAIT_SPARE 256

static bool confirms_grow(dsp_conn *c, size_t more)
{
    size_t want = (size_t)c->nconfirms + more;
    size_t cap = c->confirms_cap ? c->confirms_cap : 16;

    if (want <= c->confirms_cap)
        return true;
    while (cap < want)
        cap *= 2;
    proto_dlv *p = realloc(c->confirms, cap * sizeof *p);
    if (!p)
        return false;
    c->confirms = p;
    c->confirms_cap = (uint32_t)cap;
    return true;
}

/* Queues the CONFIRMs of acks[0..n) (one connection's, in the order of its DONEs). */
static void queue_confirms(dsp_conn *c, const dsp_write_ack *acks, size_t n)
{
    dsp_server *srv = c->srv;

    if (!confirms_grow(c, n)) {
        dsp_conn_send_confirms(c);
        if (!confirms_grow(c, n)) {
            log_error(&srv->log, "out of memory: worker %s gets no CONFIRM for %zu outcome(s)",
                      c->name, n);
            return; /* it sends them again after its next HELLO */
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!acks[i].adopt)
            c->confirms[c->nconfirms++] =
                (proto_dlv){acks[i].task_id, acks[i].epoch, acks[i].attempt};
    if (c->nconfirms >= c->slots.capacity + CONFIRM_WAIT_SPARE || c->flush_queued) {
        dsp_conn_send_confirms(c); /* too many to wait, or a write of c is due anyway */
        return;
    }
    if (c->nconfirms > 0 && !c->confirm_queued) {
        c->confirm_queued = true;
        c->confirm_next = srv->inv.confirm_head;
        srv->inv.confirm_head = c;
        if (!evtimer_pending(srv->inv.confirm_ev, NULL)) {
            struct timeval tv = {0, CONFIRM_WAIT_MS * 1000};
            evtimer_add(srv->inv.confirm_ev, &tv);
        }
    }
}

void dsp_inv_confirm_cb(evutil_socket_t fd, short what, void *arg)
{
    dsp_server *srv = arg;

    (void)fd;
    (void)what;
    while (srv->inv.confirm_head) {
        dsp_conn *c = srv->inv.confirm_head;

        srv->inv.confirm_head = c->confirm_next;
        c->confirm_queued = false;
        dsp_conn_send_confirms(c);
    }
}

static void confirm_unqueue(dsp_conn *c)
{
    if (!c->confirm_queued)
        return;
    for (dsp_conn **p = &c->srv->inv.confirm_head; *p; p = &(*p)->confirm_next)
        if (*p == c) {
            *p = c->confirm_next;
            break;
        }
    c->confirm_queued = false;
}

void dsp_inv_on_written(dsp_server *srv, const dsp_write_report *r)
{
    size_t i = 0;

    while (i < r->nacks) {
        size_t j = i;
        dsp_conn *c = dsp_taskmap_get(&srv->inv.v3conns, r->acks[i].conn_id);

        while (j < r->nacks && r->acks[j].conn_id == r->acks[i].conn_id)
            j++;
        if (c && c->state == DSP_CONN_ACTIVE)
            queue_confirms(c, r->acks + i, j - i);
        for (size_t k = i; k < j; k++)
            if (r->acks[k].adopt)
                adopt_answer(srv, c, &r->acks[k]);
        i = j;
    }
}

void dsp_inv_conn_joined(dsp_conn *c)
{
    if (c->version >= 3 && dsp_taskmap_put(&c->srv->inv.v3conns, c->id, c) < 0)
        log_error(&c->srv->log, "out of memory: worker %s gets no CONFIRM", c->name);
}

void dsp_inv_conn_freed(dsp_conn *c)
{
    if (c->version >= 3)
        dsp_taskmap_del(&c->srv->inv.v3conns, c->id);
    confirm_unqueue(c);
    free(c->confirms);
    c->confirms = NULL;
    c->nconfirms = c->confirms_cap = 0;
    for (uint32_t i = 0; i < c->nadopting; i++)
        free(c->adopting[i].data);
    free(c->adopting);
    c->adopting = NULL;
    c->nadopting = c->adopting_cap = 0;
}
