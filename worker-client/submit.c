/* submit.c: tp_submit(), the producer side of libtaskpush (SUBMIT, SUBMITTED and OUTCOME,
 * proto/PROTOCOL.md). It owns the submission queue between the callers' threads and the
 * I/O thread, the lists the I/O thread keeps (pending: waiting for a version-2 session;
 * sent: waiting for answers), and how each call ends.
 *
 * Synchronous on purpose: the library's I/O thread owns the socket, and handlers already
 * run on threads of their own, so a blocking call is what a handler (or a producer's
 * thread) can use without a callback API; the caller blocks on a condition variable,
 * never the I/O thread (a call from it is refused with TP_EBUSY).
 */
#include "submit.h"
#include "options.h"
#include "output.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_ID_OFFSET (PROTO_LEN_PREFIX + 1)

int tpi_submit_init(tp_worker *w)
{
    pthread_condattr_t ca;
    int ok;

    w->sub_tail = &w->sub_head;
    w->hello_version = PROTO_VERSION;
    if (pthread_condattr_init(&ca) != 0)
        return -1;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    ok = pthread_cond_init(&w->sub_cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok)
        return -1;
    if (pthread_mutex_init(&w->sub_mu, NULL) != 0) {
        pthread_cond_destroy(&w->sub_cv);
        return -1;
    }
    return 0;
}

static void sub_free(tpi_submit *s)
{
    free(s->frame);
    free(s);
}

/* Frees a list of submissions nobody waits for any more (tp_worker_free). */
static void free_list(tpi_submit *s)
{
    for (tpi_submit *next; s != NULL; s = next) {
        next = s->next;
        sub_free(s);
    }
}

void tpi_submit_destroy(tp_worker *w)
{
    free_list(w->sub_head);
    free_list(w->sub_pending);
    free_list(w->sub_sent);
    pthread_mutex_destroy(&w->sub_mu);
    pthread_cond_destroy(&w->sub_cv);
}

/* finish ends s with rc (why for the caller); under sub_mu. Returns 1 when the I/O
 * thread must free s (the caller is gone). */
static int finish_locked(tp_worker *w, tpi_submit *s, int rc, const char *why)
{
    s->rc = rc;
    snprintf(s->text, sizeof(s->text), "%s", why);
    s->done = 1;
    pthread_cond_broadcast(&w->sub_cv);
    return s->abandoned;
}

static void finish(tp_worker *w, tpi_submit *s, int rc, const char *why)
{
    int free_it;

    pthread_mutex_lock(&w->sub_mu);
    free_it = finish_locked(w, s, rc, why);
    pthread_mutex_unlock(&w->sub_mu);
    if (free_it)
        sub_free(s);
}

static int abandoned(tp_worker *w, tpi_submit *s)
{
    int a;

    pthread_mutex_lock(&w->sub_mu);
    a = s->abandoned;
    pthread_mutex_unlock(&w->sub_mu);
    return a;
}

/* send_one writes s on the current connection; returns 0, or finishes s. */
static void send_one(tp_worker *w, tpi_submit *s)
{
    uint8_t *p = s->frame + REQUEST_ID_OFFSET;

    if (s->frame_len - PROTO_LEN_PREFIX > w->max_body_out) {
        finish(w, s, TP_ETOOBIG, "the SUBMIT frame exceeds the dispatcher's max_body");
        return;
    }
    s->request_id = ++w->next_request_id;
    p[0] = (uint8_t)(s->request_id >> 24);
    p[1] = (uint8_t)(s->request_id >> 16);
    p[2] = (uint8_t)(s->request_id >> 8);
    p[3] = (uint8_t)s->request_id;
    if (tpi_write(w, s->frame, s->frame_len) != 0) {
        finish(w, s, TP_ENOMEM, "cannot queue the SUBMIT frame");
        return;
    }
    w->last_tx_ns = tpi_now_ns();
    s->gen = w->gen;
    s->next = w->sub_sent;
    w->sub_sent = s;
}

void tpi_submit_flush(tp_worker *w)
{
    tpi_submit *q, **tail;
    /* While draining too: a handler still running may submit (its connection stays). */
    int ready = w->established && w->bev != NULL &&
                (w->state == TPI_READY || w->state == TPI_DRAINING);

    pthread_mutex_lock(&w->sub_mu);
    q = w->sub_head;
    w->sub_head = NULL;
    w->sub_tail = &w->sub_head;
    pthread_mutex_unlock(&w->sub_mu);
    /* Append to pending, keeping the callers' order. */
    for (tail = &w->sub_pending; *tail != NULL; tail = &(*tail)->next)
        ;
    *tail = q;
    if (!ready)
        return;
    q = w->sub_pending;
    w->sub_pending = NULL;
    while (q != NULL) {
        tpi_submit *s = q;
        q = s->next;
        if (abandoned(w, s))
            sub_free(s);
        else if (w->session_version < 2)
            finish(w, s, TP_EUNAVAIL, "the dispatcher speaks protocol version 1: it cannot take submissions");
        else
            send_one(w, s);
    }
}

/* Unlinks and returns the sent submission of request_id, or NULL. */
static tpi_submit *sent_find(tp_worker *w, uint32_t request_id, int unlink)
{
    for (tpi_submit **ps = &w->sub_sent; *ps != NULL; ps = &(*ps)->next) {
        tpi_submit *s = *ps;
        if (s->request_id == request_id) {
            if (unlink)
                *ps = s->next;
            return s;
        }
    }
    return NULL;
}

static void sent_unlink(tp_worker *w, tpi_submit *s)
{
    for (tpi_submit **ps = &w->sub_sent; *ps != NULL; ps = &(*ps)->next)
        if (*ps == s) {
            *ps = s->next;
            return;
        }
}

void tpi_submit_on_submitted(tp_worker *w, const proto_submitted *m)
{
    tpi_submit *s = sent_find(w, m->request_id, 0);
    size_t inserted = 0;
    int free_it = 0, keep = 0;
    char why[TP_ERROR_TEXT_LEN];

    if (s == NULL || s->acked) {
        tpi_log(w, TP_LOG_WARN, "SUBMITTED for request %u, which is not waiting for one", m->request_id);
        return;
    }
    /* Off the list before the caller can see it done (and free it). */
    sent_unlink(w, s);
    snprintf(why, sizeof(why), "dispatcher: %.*s", (int)(m->message.len > 150 ? 150 : m->message.len),
             (const char *)m->message.ptr);
    pthread_mutex_lock(&w->sub_mu);
    if (m->status == PROTO_SUBMIT_OK && m->n != s->ntasks) {
        free_it = finish_locked(w, s, TP_EGONE, "the dispatcher answered with another number of tasks");
    } else if (m->status == PROTO_SUBMIT_OK) {
        for (uint16_t i = 0; i < m->n; i++) {
            proto_submit_res r;
            proto_submitted_result(m, i, &r);
            inserted += r.result == PROTO_SUBMIT_INSERTED;
            if (!s->abandoned) {
                s->results[i].task_id = r.task_id;
                s->results[i].duplicate = r.result == PROTO_SUBMIT_DUPLICATE;
            }
        }
        if (s->wait && inserted > 0 && !s->abandoned) {
            s->acked = 1;
            s->outcomes_left = inserted;
            keep = 1;
        } else {
            free_it = finish_locked(w, s, TP_OK, "");
        }
    } else {
        free_it = finish_locked(w, s, m->status == PROTO_SUBMIT_INVALID ? TP_EINVAL : TP_EUNAVAIL, why);
    }
    pthread_mutex_unlock(&w->sub_mu);
    if (keep) { /* waiting for OUTCOMEs: back on the list (the caller is still waiting) */
        s->next = w->sub_sent;
        w->sub_sent = s;
    }
    if (free_it)
        sub_free(s);
}

void tpi_submit_on_outcome(tp_worker *w, const proto_outcome_msg *o)
{
    tpi_submit *s = sent_find(w, o->request_id, 0);
    int free_it = 0, last = 0;

    if (s == NULL || !s->acked)
        return; /* a caller that gave up, or a request from before a reconnect */
    sent_unlink(w, s); /* put back below unless this was the last OUTCOME */
    pthread_mutex_lock(&w->sub_mu);
    for (size_t i = 0; !s->abandoned && i < s->ntasks; i++) {
        tp_submit_result *r = &s->results[i];
        if (r->task_id != o->task_id || r->duplicate || r->state != 0)
            continue;
        r->output = malloc(o->data.len + 1);
        if (r->output != NULL) {
            if (o->data.len > 0)
                memcpy(r->output, o->data.ptr, o->data.len);
            ((char *)r->output)[o->data.len] = '\0';
            r->output_len = o->data.len;
        }
        r->state = o->state;
        break;
    }
    if (s->abandoned || --s->outcomes_left == 0) {
        free_it = finish_locked(w, s, TP_OK, "");
        last = 1;
    }
    pthread_mutex_unlock(&w->sub_mu);
    if (!last) {
        s->next = w->sub_sent;
        w->sub_sent = s;
    }
    if (free_it)
        sub_free(s);
}

void tpi_submit_conn_lost(tp_worker *w)
{
    tpi_submit *s = w->sub_sent;

    w->sub_sent = NULL;
    while (s != NULL) {
        tpi_submit *next = s->next;
        finish(w, s, TP_EGONE,
               s->acked ? "connection lost while waiting for outcomes (they are in the table)"
                        : "connection lost before the answer: the tasks may or may not be committed");
        s = next;
    }
}

void tpi_submit_fail_waiting(tp_worker *w, int rc, const char *why)
{
    tpi_submit *s;

    tpi_submit_flush(w); /* takes the queue into pending without sending (no connection) */
    s = w->sub_pending;
    w->sub_pending = NULL;
    while (s != NULL) {
        tpi_submit *next = s->next;
        finish(w, s, rc, why);
        s = next;
    }
}

void tpi_submit_fail_all(tp_worker *w, const char *why)
{
    tpi_submit_conn_lost(w);
    tpi_submit_fail_waiting(w, TP_EGONE, why);
}

int tpi_submit_unanswered(const tp_worker *w)
{
    for (const tpi_submit *s = w->sub_sent; s != NULL; s = s->next)
        if (!s->acked)
            return 1;
    return 0;
}

/* ---- the public calls ---- */

void tp_submit_task_init(tp_submit_task *t)
{
    if (t == NULL)
        return;
    memset(t, 0, sizeof(*t));
    t->priority = 1;
}

void tp_submit_results_free(tp_submit_result *results, size_t n)
{
    for (size_t i = 0; results != NULL && i < n; i++) {
        free(results[i].output);
        memset(&results[i], 0, sizeof(results[i]));
    }
}

/* check_task returns 0 or TP_EINVAL / TP_ERANGE with the reason in err. */
static int check_task(const tp_submit_task *t, size_t i, proto_submit_task *out, tp_error *err)
{
    size_t tl;

    if (t->type == NULL || (tl = strlen(t->type)) == 0)
        return tpi_error_set(err, TP_EINVAL, "task %zu: no type", i);
    if (tl > TP_MAX_TYPE_LEN || t->dedup_key_len > TP_MAX_DEDUP_KEY_LEN ||
        t->payload_len > TP_MAX_PAYLOAD_LEN || t->max_attempts > TP_MAX_ATTEMPTS)
        return tpi_error_set(err, TP_ERANGE, "task %zu: type, dedup_key, payload or max_attempts too large", i);
    if (t->priority < 0 || t->priority > 2 || t->timeout_ms > INT32_MAX ||
        (t->payload == NULL && t->payload_len > 0) || (t->dedup_key == NULL && t->dedup_key_len > 0))
        return tpi_error_set(err, TP_EINVAL, "task %zu: bad priority, timeout_ms or pointer", i);
    out->priority = (uint8_t)t->priority;
    out->max_attempts = (uint16_t)t->max_attempts;
    out->delay_ms = t->delay_ms;
    out->timeout_ms = t->timeout_ms;
    out->type = (proto_bytes){(const uint8_t *)t->type, tl};
    out->dedup_key = (proto_bytes){t->dedup_key, t->dedup_key_len};
    out->payload = (proto_bytes){t->payload, t->payload_len};
    return 0;
}

/* encode builds the SUBMIT frame of tasks into *s. Returns 0 or a TP_E* code. */
static int encode(tpi_submit *s, const tp_submit_task *tasks, const tp_group_key *keys,
                  const tp_task_after *after, size_t n, unsigned flags, tp_error *err)
{
    int keyed = 0, waits = 0;

    proto_submit_task *pt = calloc(n, sizeof(*pt));
    proto_msg m = {.type = PROTO_SUBMIT};
    int rc = 0;

    if (pt == NULL)
        return tpi_error_set(err, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = check_task(&tasks[i], i, &pt[i], err);
        if (rc == 0 && keys != NULL && keys[i].len > 0) {
            if (keys[i].len > TP_MAX_GROUP_KEY_LEN)
                rc = tpi_error_set(err, TP_ERANGE, "task %zu: group_key of %zu bytes (at most %u)",
                                   i, keys[i].len, TP_MAX_GROUP_KEY_LEN);
            else if (keys[i].key == NULL)
                rc = tpi_error_set(err, TP_EINVAL, "task %zu: group_key NULL with a length", i);
            else {
                pt[i].group_key = (proto_bytes){keys[i].key, keys[i].len};
                keyed = 1;
            }
        }
        if (rc == 0 && after != NULL && after[i].n > 0) {
            if (after[i].n > TP_MAX_AFTER)
                rc = tpi_error_set(err, TP_ERANGE, "task %zu: waits for %zu tasks (at most %u)", i,
                                   after[i].n, TP_MAX_AFTER);
            else if (after[i].ids == NULL)
                rc = tpi_error_set(err, TP_EINVAL, "task %zu: after ids NULL with a count", i);
            else {
                for (size_t k = 0; k < after[i].n && rc == 0; k++)
                    if (after[i].ids[k] == 0)
                        rc = tpi_error_set(err, TP_EINVAL, "task %zu: waits for task 0", i);
                pt[i].after = after[i].ids;
                pt[i].nafter = (uint16_t)after[i].n;
                waits = 1;
            }
        }
    }
    if (rc == 0) {
        /* Without a key the frame is the one of before, which every dispatcher takes. */
        m.u.submit.flags = (uint8_t)(((flags & TP_SUBMIT_WAIT) ? PROTO_SUBMIT_WAIT : 0) |
                                     (keyed ? PROTO_SUBMIT_GROUP_KEY : 0) |
                                     (waits ? PROTO_SUBMIT_AFTER : 0));
        m.u.submit.ntasks = (uint16_t)n;
        m.u.submit.tasks = pt;
        s->frame_len = proto_msg_size(&m);
        s->frame = s->frame_len ? malloc(s->frame_len) : NULL;
        if (s->frame_len == 0)
            rc = tpi_error_set(err, TP_EINVAL, "the tasks cannot be encoded");
        else if (s->frame == NULL)
            rc = tpi_error_set(err, TP_ENOMEM, "out of memory");
        else if (proto_msg_encode(&m, s->frame, s->frame_len) != s->frame_len)
            rc = tpi_error_set(err, TP_EINVAL, "the tasks cannot be encoded");
    }
    free(pt);
    return rc;
}

static void wake_io(tp_worker *w)
{
    uint64_t one = 1;
    ssize_t r;

    do
        r = write(w->wake_fd, &one, sizeof(one));
    while (r < 0 && errno == EINTR);
}

int tp_submit(tp_worker *w, const tp_submit_task *tasks, size_t n, unsigned flags,
              unsigned timeout_ms, tp_submit_result *results, tp_error *err)
{
    return tp_submit_after(w, tasks, NULL, NULL, n, flags, timeout_ms, results, err);
}

int tp_submit_keyed(tp_worker *w, const tp_submit_task *tasks, const tp_group_key *keys, size_t n,
                    unsigned flags, unsigned timeout_ms, tp_submit_result *results, tp_error *err)
{
    return tp_submit_after(w, tasks, keys, NULL, n, flags, timeout_ms, results, err);
}

int tp_submit_after(tp_worker *w, const tp_submit_task *tasks, const tp_group_key *keys,
                    const tp_task_after *after, size_t n, unsigned flags, unsigned timeout_ms,
                    tp_submit_result *results, tp_error *err)
{
    tpi_submit *s;
    struct timespec until;
    int rc, gave_up = 0;

    if (err != NULL) {
        err->code = TP_OK;
        err->text[0] = '\0';
    }
    if (w == NULL || tasks == NULL || results == NULL || n == 0 || timeout_ms == 0 ||
        (flags & ~TP_SUBMIT_WAIT) != 0)
        return tpi_error_set(err, TP_EINVAL, "invalid argument");
    if (n > TP_MAX_SUBMIT_TASKS)
        return tpi_error_set(err, TP_ERANGE, "at most %u tasks per call", TP_MAX_SUBMIT_TASKS);
    if (atomic_load(&w->running) && pthread_equal(pthread_self(), w->io_thread))
        return tpi_error_set(err, TP_EBUSY, "tp_submit on the worker's I/O thread would wait forever");
    memset(results, 0, n * sizeof(*results));
    if ((s = calloc(1, sizeof(*s))) == NULL)
        return tpi_error_set(err, TP_ENOMEM, "out of memory");
    if ((rc = encode(s, tasks, keys, after, n, flags, err)) != 0) {
        sub_free(s);
        return rc;
    }
    s->ntasks = n;
    s->wait = (flags & TP_SUBMIT_WAIT) != 0;
    s->results = results;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->sub_mu);
    *w->sub_tail = s;
    w->sub_tail = &s->next;
    pthread_mutex_unlock(&w->sub_mu);
    wake_io(w);

    pthread_mutex_lock(&w->sub_mu);
    while (!s->done) {
        if (pthread_cond_timedwait(&w->sub_cv, &w->sub_mu, &until) == ETIMEDOUT && !s->done) {
            s->abandoned = 1; /* the I/O thread frees it; it writes no result from now on */
            gave_up = 1;
            break;
        }
    }
    rc = gave_up ? TP_ETIMEDOUT : s->rc;
    if (!gave_up && rc != 0)
        tpi_error_set(err, rc, "%s", s->text);
    pthread_mutex_unlock(&w->sub_mu);
    if (gave_up)
        return tpi_error_set(err, TP_ETIMEDOUT, "no answer within %u ms", timeout_ms);
    sub_free(s);
    return rc;
}
