/* conn_submit: the loop's side of submissions (SUBMIT frames, protocol version 2). It
 * owns checking each submitted task, the bounds of what one connection may have waiting
 * for the database (pausing its reads beyond them), handing copies to the submit thread
 * (db_submit.c), and sending SUBMITTED and OUTCOME back to the connection that asked,
 * found again by its id since it may have closed meanwhile.
 */
#include "conn.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Answers a submission at once, without the database (nothing inserted). */
static void answer_now(dsp_conn *c, uint32_t request_id, uint16_t status, const char *why)
{
    proto_msg m = {.type = PROTO_SUBMITTED};

    m.u.submitted.request_id = request_id;
    m.u.submitted.status = status;
    m.u.submitted.message.ptr = (const uint8_t *)why;
    m.u.submitted.message.len = strlen(why);
    dsp_conn_send_frame(c, &m);
}

/* Why task i cannot go into the table as it is, or NULL. The decoder checked the
 * bounds of the frame; these are the table's. */
static const char *item_problem(const dsp_submit_item *it)
{
    const char *why = dsp_conn_type_problem(it->type, it->type_len);
    if (why)
        return why;
    if (it->timeout_ms > INT32_MAX)
        return "timeout_ms is at most 2147483647";
    return NULL;
}

/* Why the dependency list of it cannot be taken, written to why, or false. Whether each
 * task exists is the submit thread's check (db_submit.c). */
static bool after_problem(const dsp_submit_item *it, char *why, size_t cap)
{
    if (it->nafter > PROTO_MAX_AFTER) {
        snprintf(why, cap, "waits for %u tasks; at most %d per task (chain them through"
                 " intermediate tasks)", (unsigned)it->nafter, PROTO_MAX_AFTER);
        return true;
    }
    for (size_t k = 0; k < it->nafter; k++) {
        const uint8_t *p = it->after + k * PROTO_SUBMIT_AFTER_ID;
        uint64_t v = 0;
        for (int b = 0; b < 8; b++)
            v = (v << 8) | p[b];
        if (v == 0) {
            snprintf(why, cap, "waits for task 0, which is no task id");
            return true;
        }
    }
    return false;
}

/* Copies the frame and points the items into the copy. NULL when out of memory. */
static dsp_submit_req *req_copy(const dsp_conn *c, const proto_submit *s, const uint8_t *body, size_t len)
{
    dsp_submit_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->body = malloc(len);
    r->items = calloc(s->ntasks, sizeof *r->items);
    if (!r->body || !r->items) {
        dsp_submit_req_free(r);
        return NULL;
    }
    memcpy(r->body, body, len);
    r->body_len = len;
    r->conn_id = c->id;
    r->request_id = s->request_id;
    r->wait = (s->flags & PROTO_SUBMIT_WAIT) != 0;
    r->nitems = s->ntasks;
    /* The same offsets in the copy as in the frame. */
    proto_bytes cur = {r->body + (s->entries.ptr - body), s->entries.len};
    for (size_t i = 0; i < r->nitems; i++) {
        proto_submit_task t;
        if (proto_submit_next_flags(&cur, s->flags, &t) != PROTO_OK) { /* cannot happen: decoded already */
            dsp_submit_req_free(r);
            return NULL;
        }
        r->items[i] = (dsp_submit_item){
            .priority = t.priority, .max_attempts = t.max_attempts, .delay_ms = t.delay_ms,
            .timeout_ms = t.timeout_ms, .type = t.type.ptr, .type_len = t.type.len,
            .key = t.dedup_key.ptr, .key_len = t.dedup_key.len,
            .group_key = t.group_key.ptr, .group_key_len = t.group_key.len,
            .payload = t.payload.ptr, .payload_len = t.payload.len,
            .after = t.after_wire.ptr, .nafter = t.nafter};
    }
    return r;
}

static void pause_if_full(dsp_conn *c)
{
    if (c->submits_pending >= DSP_SUBMIT_CONN_MAX_PENDING ||
        c->submit_bytes_pending >= DSP_SUBMIT_CONN_MAX_BYTES)
        c->submit_paused = true;
}

static void resume_if_room(dsp_conn *c)
{
    if (!c->submit_paused || c->submits_pending >= DSP_SUBMIT_CONN_MAX_PENDING ||
        c->submit_bytes_pending >= DSP_SUBMIT_CONN_MAX_BYTES)
        return;
    c->submit_paused = false;
    c->frame_started_ms = 0;
    if (c->state == DSP_CONN_ACTIVE)
        bufferevent_trigger(c->bev, EV_READ, BEV_OPT_DEFER_CALLBACKS); /* what is buffered */
}

void dsp_conn_submit(dsp_conn *c, const proto_submit *s, const uint8_t *body, size_t len)
{
    dsp_server *srv = c->srv;
    char why[240];

    if (!srv->db || !srv->lead.leading) {
        answer_now(c, s->request_id, PROTO_SUBMIT_UNAVAILABLE,
                   "this dispatcher does not lead the table; try another or again later");
        return;
    }
    if ((s->flags & PROTO_SUBMIT_WAIT) &&
        c->waiting + c->wait_reserved + s->ntasks > DSP_SUBMIT_CONN_MAX_WAITING) {
        answer_now(c, s->request_id, PROTO_SUBMIT_UNAVAILABLE,
                   "too many tasks waited for on this connection; wait for their OUTCOMEs first");
        return;
    }
    dsp_submit_req *r = req_copy(c, s, body, len);
    if (!r) {
        answer_now(c, s->request_id, PROTO_SUBMIT_UNAVAILABLE, "out of memory");
        return;
    }
    for (size_t i = 0; i < r->nitems; i++) {
        const char *p = item_problem(&r->items[i]);
        char dep_why[160];
        if (!p && after_problem(&r->items[i], dep_why, sizeof dep_why))
            p = dep_why;
        if (p) {
            snprintf(why, sizeof why, "task %zu: %s", i, p);
            answer_now(c, s->request_id, PROTO_SUBMIT_INVALID, why);
            dsp_submit_req_free(r);
            return;
        }
    }
    uint64_t ntasks = r->nitems;
    bool wait = r->wait;
    if (dsp_db_submit(srv->db, r) < 0) {
        dsp_submit_req_free(r);
        answer_now(c, s->request_id, PROTO_SUBMIT_UNAVAILABLE, "the dispatcher is shutting down");
        return;
    }
    c->submits_pending++;
    c->submit_bytes_pending += len;
    srv->submit.bytes_held += len; /* until committed (--max-submit-bytes) */
    if (wait)
        c->wait_reserved += ntasks;
    pause_if_full(c);
}

static dsp_conn *conn_by_id(dsp_server *srv, uint64_t id)
{
    for (dsp_conn *c = srv->conns.list; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* Hastens the next claim when a submission made rows ready for types with workers. */
static void claim_soon(dsp_server *srv, const dsp_submit_req *r)
{
    int64_t now = dsp_now_ms();
    bool any = false;

    for (size_t i = 0; i < r->nitems; i++) {
        const dsp_submit_item *it = &r->items[i];
        if (it->result != PROTO_SUBMIT_INSERTED || it->delay_ms > 0 || it->nafter > 0)
            continue; /* not ready yet: a waiting task's release wakes the claim */
        dsp_type *ty = dsp_server_type_find(srv, it->type, it->type_len);
        if (ty && ty->nworkers > 0) {
            ty->rows_seen_ms = now;
            any = true;
        }
    }
    if (any) /* dispatched the moment the rows are committed, not at the next poll */
        dsp_dispatch_claim_now(srv);
}

void dsp_conn_on_submitted(void *arg, dsp_submit_req *r)
{
    dsp_server *srv = arg;
    dsp_conn *c = conn_by_id(srv, r->conn_id);
    uint64_t inserted = 0;

    srv->submit.bytes_held -= r->body_len;
    dsp_conn_submit_budget_freed(srv);
    if (r->status == PROTO_SUBMIT_OK) {
        for (size_t i = 0; i < r->nitems; i++)
            inserted += r->items[i].result == PROTO_SUBMIT_INSERTED;
        claim_soon(srv, r);
    }
    if (!c || c->state == DSP_CONN_CLOSING) {
        /* Gone: its waiters may have been added after it was forgotten. */
        if (r->wait)
            dsp_db_submit_forget(srv->db, r->conn_id);
        dsp_submit_req_free(r);
        return;
    }
    c->submits_pending--;
    c->submit_bytes_pending -= r->body_len;
    if (r->wait) {
        c->wait_reserved -= r->nitems;
        if (r->status == PROTO_SUBMIT_OK)
            c->waiting += inserted;
    }
    proto_msg m = {.type = PROTO_SUBMITTED};
    proto_submit_res *res = NULL;
    m.u.submitted.request_id = r->request_id;
    m.u.submitted.status = r->status;
    if (r->status == PROTO_SUBMIT_OK) {
        res = malloc(r->nitems * sizeof *res);
        if (!res) {
            dsp_conn_close(c, PROTO_ERR_SHUTDOWN, "out of memory");
            dsp_submit_req_free(r);
            return;
        }
        for (size_t i = 0; i < r->nitems; i++)
            res[i] = (proto_submit_res){r->items[i].result, r->items[i].task_id};
        m.u.submitted.n = (uint16_t)r->nitems;
        m.u.submitted.results = res;
    } else {
        m.u.submitted.message.ptr = (const uint8_t *)r->message;
        m.u.submitted.message.len = strlen(r->message);
    }
    dsp_conn_send_frame(c, &m);
    free(res);
    dsp_submit_req_free(r);
    resume_if_room(c);
}

void dsp_conn_on_outcome(void *arg, const dsp_submit_outcome *o)
{
    dsp_server *srv = arg;
    dsp_conn *c = conn_by_id(srv, o->conn_id);

    if (!c || c->state != DSP_CONN_ACTIVE)
        return; /* the outcome is in the table */
    if (c->waiting > 0)
        c->waiting--;
    proto_msg m = {.type = PROTO_OUTCOME};
    m.u.outcome.request_id = o->request_id;
    m.u.outcome.task_id = o->task_id;
    m.u.outcome.state = o->state;
    m.u.outcome.data.ptr = o->data;
    m.u.outcome.data.len = o->len;
    dsp_conn_send_frame(c, &m);
}

void dsp_conn_submit_closed(dsp_conn *c)
{
    if (c->waiting > 0 || c->wait_reserved > 0)
        dsp_db_submit_forget(c->srv->db, c->id);
    c->waiting = c->wait_reserved = 0;
}
