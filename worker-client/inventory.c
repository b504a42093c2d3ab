/* inventory.c: what a worker carries across a lost connection in protocol version 3
 * (proto/PROTOCOL.md, section 10): the tasks still running from an earlier connection
 * (the carried list, declared with HOLDING after the next WELCOME) and the outcomes sent
 * and not yet confirmed (the kept list, sent again after a reconnect until a CONFIRM
 * names them). Everything here runs on the I/O thread.
 *
 * A task is on at most one list at a time, held (this connection's deliveries) or
 * carried, through the same held_prev/held_next links.
 */
#include "inventory.h"
#include "options.h"
#include "output.h"

#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>

/* Most unconfirmed outcomes kept: 4 x capacity + 1024 (docs/worker.md). */
static size_t kept_max(const tp_worker *w)
{
    return (size_t)w->opts.capacity * 4 + 1024;
}

static void kept_unlink(tp_worker *w, tpi_kept *k)
{
    if (k->prev != NULL)
        k->prev->next = k->next;
    else
        w->kept_head = k->next;
    if (k->next != NULL)
        k->next->prev = k->prev;
    else
        w->kept_tail = k->prev;
    w->nkept--;
}

/* Every DONE of a version-3 session is kept until its CONFIRM, and a loop pass frees
 * more records of one size than glibc's per-thread cache holds (7), so malloc and free
 * took a fifth of a worker's instructions per task. Records of outcomes up to
 * KEPT_SMALL bytes are made at that size and, once confirmed, reused: as many wait
 * per worker as its capacity, at most KEPT_SPARE_MAX (about 30 KiB). */
enum { KEPT_SMALL = 64, KEPT_SPARE_MAX = 256 };

static size_t kept_spare_max(const tp_worker *w)
{
    return w->opts.capacity < KEPT_SPARE_MAX ? w->opts.capacity : KEPT_SPARE_MAX;
}

static tpi_kept *kept_alloc(tp_worker *w, size_t len)
{
    tpi_kept *k = w->kept_spare;

    if (len > KEPT_SMALL)
        return malloc(sizeof(*k) + len);
    if (k == NULL)
        return malloc(sizeof(*k) + KEPT_SMALL);
    w->kept_spare = k->next;
    w->nkept_spare--;
    return k;
}

static void kept_release(tp_worker *w, tpi_kept *k)
{
    if (k->len > KEPT_SMALL || w->nkept_spare >= kept_spare_max(w)) {
        free(k);
        return;
    }
    k->next = w->kept_spare;
    w->kept_spare = k;
    w->nkept_spare++;
}

static void kept_drop_all(tp_worker *w)
{
    for (tpi_kept *k = w->kept_head, *next; k != NULL; k = next) {
        next = k->next;
        free(k);
    }
    w->kept_head = w->kept_tail = NULL;
    w->nkept = 0;
}

void tpi_inv_keep(tp_worker *w, const proto_done *d)
{
    tpi_kept *k = kept_alloc(w, d->data.len);

    if (k == NULL) {
        tpi_log(w, TP_LOG_ERROR, "no memory to keep the outcome of task %llu until confirmed",
                (unsigned long long)d->task_id);
        return;
    }
    k->task_id = d->task_id;
    k->epoch = d->epoch;
    k->attempt = d->attempt;
    k->outcome = d->outcome;
    k->retry_after_ms = d->retry_after_ms;
    k->len = d->data.len;
    if (d->data.len > 0)
        memcpy(k->data, d->data.ptr, d->data.len);
    k->next = NULL;
    k->prev = w->kept_tail;
    if (w->kept_tail != NULL)
        w->kept_tail->next = k;
    else
        w->kept_head = k;
    w->kept_tail = k;
    w->nkept++;
    if (w->nkept > kept_max(w)) {
        tpi_kept *old = w->kept_head;

        tpi_log(w, TP_LOG_WARN,
                "more than %zu outcomes unconfirmed: forgetting that of task %llu attempt %u",
                kept_max(w), (unsigned long long)old->task_id, old->attempt);
        kept_unlink(w, old);
        kept_release(w, old);
        TPI_COUNT(w, outcomes_forgotten);
    }
}

void tpi_inv_on_confirm(tp_worker *w, const proto_dlv_list *l)
{
    for (uint16_t i = 0; i < l->n; i++) {
        proto_dlv d;

        proto_dlv_at(l, i, &d);
        /* CONFIRMs follow the order of the DONEs, so the match is nearly always first. */
        for (tpi_kept *k = w->kept_head; k != NULL; k = k->next) {
            if (k->task_id == d.task_id && k->epoch == d.epoch && k->attempt == d.attempt) {
                kept_unlink(w, k);
                kept_release(w, k);
                TPI_COUNT(w, outcomes_confirmed);
                break;
            }
        }
    }
}

/* send_kept writes one kept outcome as a DONE. Returns 0 or -1. */
static int send_kept(tp_worker *w, const tpi_kept *k)
{
    proto_msg m = {.type = PROTO_DONE};
    uint8_t head[64];
    size_t n;

    m.u.done.task_id = k->task_id;
    m.u.done.epoch = k->epoch;
    m.u.done.attempt = k->attempt;
    m.u.done.outcome = k->outcome;
    m.u.done.retry_after_ms = k->retry_after_ms;
    m.u.done.data.ptr = k->data;
    m.u.done.data.len = k->len;
    n = proto_msg_encode_head(&m, head, sizeof(head));
    if (n == 0 || tpi_write(w, head, n) != 0 || (k->len > 0 && tpi_write(w, k->data, k->len) != 0))
        return -1;
    return 0;
}

void tpi_inv_carry(tp_worker *w)
{
    tp_task *t = w->held;

    while (t != NULL) {
        tp_task *next = t->held_next;

        t->held = 0;
        t->carried = 1;
        t->held_prev = NULL;
        t->held_next = w->carried;
        if (w->carried != NULL)
            w->carried->held_prev = t;
        w->carried = t;
        w->ncarried++;
        TPI_COUNT(w, tasks_carried);
        t = next;
    }
    w->held = NULL;
}

void tpi_inv_uncarry(tp_worker *w, tp_task *t)
{
    if (!t->carried)
        return;
    if (t->held_prev != NULL)
        t->held_prev->held_next = t->held_next;
    else
        w->carried = t->held_next;
    if (t->held_next != NULL)
        t->held_next->held_prev = t->held_prev;
    t->held_prev = t->held_next = NULL;
    t->carried = 0;
    w->ncarried--;
}

tp_task *tpi_inv_find_carried(tp_worker *w, uint64_t id, uint32_t epoch, uint32_t attempt)
{
    for (tp_task *t = w->carried; t != NULL; t = t->held_next)
        if (t->id == id && t->epoch == epoch && t->attempt == attempt)
            return t;
    return NULL;
}

void tpi_inv_abandon(tp_worker *w)
{
    while (w->carried != NULL) {
        tp_task *t = w->carried;

        atomic_store(&t->cancelled, 1);
        tpi_inv_uncarry(w, t);
    }
    kept_drop_all(w);
}

/* send_holding declares the carried tasks, PROTO_MAX_CONFIRM per frame. Returns 0 or -1. */
static int send_holding(tp_worker *w)
{
    size_t cap = PROTO_LEN_PREFIX + 3 + (size_t)PROTO_MAX_CONFIRM * PROTO_DLV_ENTRY;
    uint8_t *buf = malloc(cap);
    proto_dlv *items = malloc(PROTO_MAX_CONFIRM * sizeof(*items));
    tp_task *t = w->carried;
    int rc = buf != NULL && items != NULL ? 0 : -1;

    while (t != NULL && rc == 0) {
        proto_msg m = {.type = PROTO_HOLDING};
        uint16_t n = 0;
        size_t len;

        for (; t != NULL && n < PROTO_MAX_CONFIRM; t = t->held_next) {
            if (atomic_load(&t->cancelled))
                continue; /* cancelled by its dispatcher: nobody wants it adopted */
            items[n++] = (proto_dlv){t->id, t->epoch, t->attempt};
            t->gen = w->gen; /* its EXTENDs go to this connection now */
        }
        if (n == 0)
            break;
        m.u.holding.n = n;
        m.u.holding.items = items;
        len = proto_msg_encode(&m, buf, cap);
        if (len == 0 || tpi_write(w, buf, len) != 0)
            rc = -1;
    }
    free(items);
    free(buf);
    return rc;
}

int tpi_inv_session_start(tp_worker *w)
{
    size_t resent = 0;

    if (w->session_version < 3) {
        if (w->ncarried > 0 || w->nkept > 0)
            tpi_log(w, TP_LOG_WARN,
                    "dispatcher speaks protocol version %u: cancelling %u carried task(s), "
                    "forgetting %zu unconfirmed outcome(s)",
                    w->session_version, w->ncarried, w->nkept);
        tpi_inv_abandon(w);
        return 0;
    }
    if (w->ncarried > 0) {
        if (send_holding(w) < 0)
            return -1;
        tpi_log(w, TP_LOG_INFO, "declared %u task(s) still running from an earlier connection",
                w->ncarried);
    }
    for (tpi_kept *k = w->kept_head; k != NULL; k = k->next, resent++) {
        if (send_kept(w, k) < 0)
            return -1;
        TPI_COUNT(w, outcomes_resent);
    }
    if (resent > 0) {
        tpi_log(w, TP_LOG_INFO, "sent again %zu unconfirmed outcome(s)", resent);
        w->last_tx_ns = tpi_now_ns();
    }
    return 0;
}

void tpi_inv_free(tp_worker *w)
{
    kept_drop_all(w);
    while (w->kept_spare != NULL) {
        tpi_kept *k = w->kept_spare;

        w->kept_spare = k->next;
        free(k);
    }
    w->nkept_spare = 0;
    w->carried = NULL;
    w->ncarried = 0;
}
