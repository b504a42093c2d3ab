#include "server.h"

#include "admin_http.h"
#include "conn.h"
#include "utf8.h"
#include "notify.h"
#include "progress.h"
#include "proto.h"
#include "tls.h"

#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The housekeeping tick: lease expiry, heartbeats and drain all run from it. */
#define TICK_MS_MAX 50

/* Connections closed since the last trim that make trim_after_burst run. */
#define TRIM_AFTER_CLOSED 100

/* The listener's back-off after accept() failed for lack of descriptors or memory. */
#define ACCEPT_BACKOFF_MIN_MS 10
#define ACCEPT_BACKOFF_MAX_MS 1000

/* --max-failed-handshakes is enforced per window of this length (a tenth of it each). */
#define FAILED_HANDSHAKE_WINDOW_MS 100

void dsp_server_kick(dsp_server *srv)
{
    /* One pass per loop iteration however many events asked for it. A kick comes with
     * every answered task; the flag spares each one the event base's lock (only the
     * loop thread kicks: the database threads' replies reach it through db.c's queue). */
    if (srv->dispatch_due)
        return;
    srv->dispatch_due = true;
    event_active(srv->dispatch_ev, EV_TIMEOUT, 0);
}

/* ---- task records ---- */

/* Task records come from large blocks, reused last-freed-first, rather than from malloc
 * one by one: thousands a second are made and freed, and malloc would spread them over
 * whatever holes the heap has (after a connection flood, megabytes of holes), keeping
 * those pages resident. A block is held from the first time that many tasks were held
 * at once (claimed or adopted: bounded by the claim budget and the workers' capacities)
 * until the server is freed. */
#define TASK_BLOCK 4096 /* 460 KB: glibc maps a block this large on its own, outside the
                         * heap, and only the records in use are ever touched */

struct dsp_task_block {
    struct dsp_task_block *next;
    dsp_task tasks[TASK_BLOCK];
};

dsp_task *dsp_server_task_new(dsp_server *srv)
{
    if (!srv->tasks.pool) {
        struct dsp_task_block *b = malloc(sizeof *b);
        if (!b)
            return NULL;
        b->next = srv->tasks.blocks;
        srv->tasks.blocks = b;
        for (size_t i = TASK_BLOCK; i-- > 0;) {
            b->tasks[i].progress = NULL; /* task_pool_free frees every record's */
            b->tasks[i].next = srv->tasks.pool;
            srv->tasks.pool = &b->tasks[i];
        }
    }
    dsp_task *t = srv->tasks.pool;
    srv->tasks.pool = t->next;
    /* All but the key's bytes (last, read only up to group_key_len): a keyless task
     * does not pay for zeroing 191 bytes. */
    memset(t, 0, offsetof(dsp_task, group_key));
    return t;
}

void dsp_server_task_put(dsp_server *srv, dsp_task *t)
{
    if (t->progress) {
        dsp_progress_task_gone(srv, t);
        free(t->progress);
        t->progress = NULL;
    }
    t->next = srv->tasks.pool;
    srv->tasks.pool = t;
}

static void task_pool_free(dsp_server *srv)
{
    while (srv->tasks.blocks) {
        struct dsp_task_block *b = srv->tasks.blocks;
        srv->tasks.blocks = b->next;
        for (size_t i = 0; i < TASK_BLOCK; i++)
            free(b->tasks[i].progress); /* of the tasks still held at the end */
        free(b);
    }
    srv->tasks.pool = NULL;
}

/* ---- outcomes ---- */

static void task_free(dsp_server *srv, dsp_task *t)
{
    dsp_taskmap_del(&srv->tasks.map, t->id);
    srv->tasks.payload_bytes -=
        t->payload_len <= srv->tasks.payload_bytes ? t->payload_len : srv->tasks.payload_bytes;
    free(t->payload);
    dsp_server_task_put(srv, t);
}

dsp_outcome *dsp_server_outbox_add(dsp_server *srv, uint64_t task_id, uint8_t kind,
                                   uint32_t attempts, int64_t run_after, const void *data, size_t len)
{
    if (srv->outbox.n == srv->outbox.cap) {
        size_t cap = srv->outbox.cap ? srv->outbox.cap * 2 : 256;
        dsp_outcome *o = realloc(srv->outbox.items, cap * sizeof *o);
        if (!o) {
            /* The row stays PROCESSING under this epoch; the next start recovers it. */
            log_error(&srv->log, "out of memory: outcome of task %llu not written",
                      (unsigned long long)task_id);
            return NULL;
        }
        srv->outbox.items = o;
        srv->outbox.cap = cap;
    }
    dsp_outcome *o = &srv->outbox.items[srv->outbox.n++];
    *o = (dsp_outcome){.task_id = task_id, .kind = kind, .attempts = attempts,
                       .run_after_ms = run_after};
    if (len && (o->data = malloc(len))) {
        memcpy(o->data, data, len);
        o->len = len;
        srv->outbox.bytes += len;
    }
    return o;
}

static dsp_outcome *outbox_push(dsp_server *srv, const dsp_task *t, uint8_t kind, int64_t run_after,
                                const void *data, size_t len)
{
    dsp_outcome *o = dsp_server_outbox_add(srv, t->id, kind, t->attempts, run_after, data, len);
    if (o)
        o->claim_seq = t->claim_seq;
    return o;
}

static void outbox_flush(dsp_server *srv)
{
    if (srv->outbox.n) {
        dsp_db_write(srv->db, srv->outbox.items, srv->outbox.n);
        srv->outbox.n = 0;
        srv->outbox.bytes = 0;
    }
}

static void fail_task(dsp_server *srv, dsp_task *t, const char *why)
{
    char msg[256];
    int n = snprintf(msg, sizeof msg, "%s (attempt %u of %u)", why, (unsigned)t->attempts,
                     (unsigned)t->max_attempts);
    outbox_push(srv, t, DSP_WRITE_FAILED, 0, msg, (size_t)n);
    srv->stats.tasks.failed_total++;
    task_free(srv, t);
}

static void release_task(dsp_server *srv, dsp_task *t);

/* A delivery was lost (worker gone, lease expired): deliver again, or fail the
 * task when that was its last attempt. */
void dsp_server_take_back(dsp_server *srv, dsp_task *t, const char *why)
{
    srv->stats.tasks.requeued_total++;
    if (t->attempts >= t->max_attempts) {
        fail_task(srv, t, why);
        return;
    }
    if (dsp_dispatch_stopped(srv) || t->adopted) { /* an adopted task has no payload here */
        release_task(srv, t);
        return;
    }
    dsp_dispatch_enqueue(srv, t->type, t);
    srv->sched.nbuffered++;
    dsp_server_kick(srv);
}

static int64_t backoff_ms(const dsp_server *srv, uint32_t attempt, uint64_t task_id)
{
    int64_t d = srv->cfg->retry_backoff_ms;
    for (uint32_t i = 1; i < attempt && d < srv->cfg->retry_backoff_max_ms; i++)
        d *= 2;
    if (d > srv->cfg->retry_backoff_max_ms)
        d = srv->cfg->retry_backoff_max_ms;
    /* ±25 % jitter so that tasks failed together do not come back together;
     * derived from the id and attempt, so no shared random state is needed. */
    uint64_t h = (task_id * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)attempt << 32);
    h ^= h >> 29;
    int64_t span = d / 2;
    if (span > 0)
        d = d - d / 4 + (int64_t)(h % (uint64_t)(span + 1));
    return d;
}

int64_t dsp_server_retry_delay_ms(const dsp_server *srv, uint8_t outcome, uint32_t retry_after_ms,
                                  uint32_t attempt, uint64_t task_id)
{
    return outcome == PROTO_OUTCOME_RETRY_AFTER ? (int64_t)retry_after_ms
                                                : backoff_ms(srv, attempt, task_id);
}

void dsp_server_task_done(dsp_server *srv, dsp_conn *c, dsp_task *t, uint8_t outcome,
                          uint32_t retry_after_ms, const uint8_t *data, size_t len)
{
    dsp_outcome *o;

    if (t->delivered_us > 0)
        dsp_hist_add(&srv->stats.hist.exec, (double)(dsp_now_us() - t->delivered_us) / 1000.0);
    char msg[200];
    if (outcome == PROTO_OUTCOME_SUCCESS && len > dsp_db_result_max(srv->db)) {
        /* The table cannot hold it whole: the task fails, saying so, rather than keep a
         * cut result as a success (the write thread checks again against its
         * connection's max_allowed_packet). */
        size_t max = dsp_db_result_max(srv->db);
        int n = snprintf(msg, sizeof msg, "result of %zu bytes exceeds the %s of %zu", len,
                         max < DSP_DB_RESULT_MAX ? "database's max_allowed_packet"
                                                 : "result column's largest value",
                         max);
        log_warn(&srv->log, "task %llu: %s; the task fails", (unsigned long long)t->id, msg);
        outcome = PROTO_OUTCOME_FAIL_PERM;
        data = (const uint8_t *)msg;
        len = n > 0 && (size_t)n < sizeof msg ? (size_t)n : 0;
    }
    /* The type's failure rate (the dashboard); RETRY_AFTER is a "not now", not a failure. */
    if (outcome == PROTO_OUTCOME_SUCCESS)
        t->type->answered_ok++;
    else if (outcome != PROTO_OUTCOME_RETRY_AFTER)
        t->type->answered_failed++;
    switch (outcome) {
    case PROTO_OUTCOME_SUCCESS:
        o = outbox_push(srv, t, DSP_WRITE_SUCCEEDED, 0, data, len);
        srv->stats.tasks.succeeded_total++;
        break;
    case PROTO_OUTCOME_FAIL_PERM:
        o = outbox_push(srv, t, DSP_WRITE_FAILED, 0, data, len);
        srv->stats.tasks.failed_total++;
        break;
    default: /* FAIL_RETRY, RETRY_AFTER */
        if (t->attempts >= t->max_attempts) {
            o = outbox_push(srv, t, DSP_WRITE_FAILED, 0, data, len);
            srv->stats.tasks.failed_total++;
        } else {
            int64_t delay = dsp_server_retry_delay_ms(srv, outcome, retry_after_ms, t->attempts, t->id);
            o = outbox_push(srv, t, DSP_WRITE_RETRY, dsp_wall_ms() + delay, data, len);
            srv->stats.tasks.retried_total++;
        }
        break;
    }
    if (o && c)
        dsp_inv_confirm_later(c, o, t->dlv_epoch, t->attempts);
    task_free(srv, t);
}

static void dispatch_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    srv->dispatch_due = false; /* a kick from here on asks for another pass */
    if (!dsp_dispatch_stopped(srv) && !srv->control.paused_all)
        dsp_dispatch_run(srv);
    outbox_flush(srv);
    dsp_dispatch_claim_maybe(srv);
}

static void release_task(dsp_server *srv, dsp_task *t)
{
    outbox_push(srv, t, DSP_WRITE_RELEASE, 0, NULL, 0);
    srv->stats.tasks.released_total++;
    task_free(srv, t);
}

static void on_claim(void *arg, dsp_claim_reply *reply)
{
    dsp_server *srv = arg;
    int64_t now = dsp_now_ms();
    dsp_claim_pacing_answered(srv, now);
    if (reply->status < 0) {
        dsp_claim_pacing_failed(srv, now);
        dsp_claim_reply_free(reply);
        dsp_server_kick(srv);
        return;
    }
    dsp_hist_add(&srv->stats.hist.claim, (double)reply->duration_us / 1000.0);
    dsp_type **types = calloc(reply->ntypes ? reply->ntypes : 1, sizeof *types);
    for (size_t i = 0; types && i < reply->ntypes; i++)
        types[i] = dsp_server_type_intern(srv, (const uint8_t *)reply->types[i], strlen(reply->types[i]));
    for (size_t i = 0; types && i < reply->ntasks; i++)
        if (reply->tasks[i].type_index < reply->ntypes && types[reply->tasks[i].type_index])
            types[reply->tasks[i].type_index]->rows_seen_ms = now;
    for (size_t i = 0; i < reply->ntasks; i++) {
        dsp_claimed_task *ct = &reply->tasks[i];
        dsp_task *t = dsp_server_task_new(srv);
        dsp_type *ty = types && ct->type_index < reply->ntypes ? types[ct->type_index] : NULL;
        if (!t || !ty || dsp_taskmap_put(&srv->tasks.map, ct->task_id, t) < 0) {
            /* Left PROCESSING under this epoch: recovered at the next start. */
            log_error(&srv->log, "out of memory holding claimed task %llu", (unsigned long long)ct->task_id);
            if (t)
                dsp_server_task_put(srv, t);
            continue;
        }
        t->id = ct->task_id;
        t->claim_seq = ct->claim_seq;
        dsp_deadline_node_init(&t->lease);
        t->seq = srv->sched.next_seq++;
        t->type = ty;
        t->attempts = ct->attempts;
        t->max_attempts = ct->max_attempts ? ct->max_attempts : 1;
        t->timeout_ms = (uint32_t)(ct->timeout_ms > 0 ? ct->timeout_ms : srv->cfg->task_timeout_ms);
        t->priority = ct->priority;
        t->payload = ct->payload;
        t->payload_len = ct->payload_len;
        ct->payload = NULL; /* stolen */
        t->has_group_key = ct->has_group_key;
        t->group_key_len = ct->group_key_len;
        if (ct->group_key_len)
            memcpy(t->group_key, ct->group_key, ct->group_key_len);
        srv->tasks.payload_bytes += t->payload_len;
        srv->stats.tasks.claimed_total++;
        if (dsp_dispatch_stopped(srv) || !srv->lead.leading) {
            release_task(srv, t);
            continue;
        }
        if (t->attempts >= t->max_attempts) {
            /* Written so by someone else (or released after its last delivery): no
             * attempt is left, and delivering it would count past max_attempts. */
            char msg[160];
            int n = snprintf(msg, sizeof msg, "no attempt left: attempts %u of max_attempts %u when claimed",
                             (unsigned)t->attempts, (unsigned)t->max_attempts);
            outbox_push(srv, t, DSP_WRITE_FAILED, 0, msg, (size_t)n);
            srv->stats.tasks.failed_total++;
            task_free(srv, t);
            continue;
        }
        dsp_dispatch_enqueue(srv, ty, t);
        srv->sched.nbuffered++;
    }
    /* A type that lost its workers while the claim ran, and got nothing. */
    for (size_t i = 0; types && i < reply->ntypes; i++)
        if (types[i])
            dsp_server_type_release_if_unused(srv, types[i]);
    free(types);
    dsp_claim_pacing_claimed(srv, now, reply->ntasks, reply->more);
    log_debug(&srv->log, "claimed %zu of %u in %lld us", reply->ntasks, (unsigned)srv->claim.requested,
              (long long)reply->duration_us);
    dsp_claim_reply_free(reply);
    dsp_server_kick(srv);
}

/* ---- database events ---- */

static void on_leader(void *arg, uint32_t epoch)
{
    dsp_server *srv = arg;
    srv->lead.leading = true;
    srv->lead.epoch = epoch;
    dsp_claim_pacing_hasten(srv);
    log_info(&srv->log, "leading the table with epoch %u", (unsigned)epoch);
    /* The runtime settings first: no claim before they are applied (a pause kept in
     * the table holds from the first claim on). */
    srv->control.settings_gen++;
    srv->control.settings_pending = dsp_db_settings_load(srv->db, srv->control.settings_gen) == 0;
    if (!srv->control.settings_pending)
        log_warn(&srv->log, "runtime settings not read (out of memory): the flags' limits hold");
    dsp_server_kick(srv);
}

static void on_settings(void *arg, uint64_t request_id, bool ok, const dsp_setting *v, size_t n)
{
    dsp_server *srv = arg;
    if (request_id != srv->control.settings_gen || !srv->control.settings_pending)
        return; /* an older leadership's read */
    if (ok) {
        dsp_settings_apply(srv, v, n);
        srv->control.settings_read_ms = dsp_wall_ms();
        srv->control.settings_rows = n;
    } else {
        log_warn(&srv->log, "runtime settings could not be read: the flags' and the config file's"
                            " limits hold until the next takeover");
    }
    srv->control.settings_pending = false;
    dsp_claim_pacing_hasten(srv);
    dsp_server_kick(srv);
}

static void forget_all_tasks(dsp_server *srv)
{
    for (dsp_type *ty = srv->types.list; ty; ty = ty->next)
        while (ty->nbuffered > 0) {
            dsp_task *t = dsp_dispatch_dequeue(srv, ty);
            srv->sched.nbuffered--;
            task_free(srv, t);
        }
    for (dsp_conn *c = srv->conns.list; c; c = c->next)
        while (c->inflight) {
            dsp_task *t = c->inflight;
            /* A version-3 worker keeps running it and declares it to the next leader. */
            if (c->version >= 3)
                dsp_dispatch_inflight_del(c, t, DSP_SLOT_GIVE_BACK);
            else
                dsp_conn_cancel(c, t);
            task_free(srv, t);
        }
}

static void on_leader_lost(void *arg)
{
    dsp_server *srv = arg;
    log_error(&srv->log, "no longer leading the table; dropping every claimed task");
    srv->lead.leading = false;
    forget_all_tasks(srv); /* the CANCELs name the deliveries' epoch */
    srv->lead.epoch = 0;        /* /stats: no epoch while not leading */
    /* Workers go on to the new leader; producers stay (their SUBMITs get UNAVAILABLE). */
    for (dsp_conn *c = srv->conns.list, *next; c; c = next) {
        next = c->next;
        if (c->state == DSP_CONN_ACTIVE && c->ntypes > 0)
            dsp_conn_close(c, PROTO_ERR_NOT_LEADER, "this dispatcher no longer leads the table");
    }
}

static void on_written(void *arg, const dsp_write_report *r)
{
    dsp_server *srv = arg;
    if (r->fenced)
        log_warn(&srv->log, "%llu outcome(s) not written: their rows are no longer ours",
                 (unsigned long long)r->fenced);
    if (r->deferred)
        log_warn(&srv->log, "%llu outcome(s) wait: another transaction holds their rows' locks",
                 (unsigned long long)r->deferred);
    srv->stats.tasks.foreign_written_total += r->foreign_written;
    srv->stats.tasks.foreign_ignored_total += r->foreign_ignored;
    if (r->nacks)
        dsp_inv_on_written(srv, r); /* CONFIRMs, adoptions */
    dsp_server_kick(srv); /* dispatch may have waited for these writes (--max-unwritten) */
}

static void on_health(void *arg, bool connected)
{
    dsp_server *srv = arg;
    if (connected != srv->lead.db_connected)
        log_info(&srv->log, "database %s", connected ? "reachable" : "unreachable");
    srv->lead.db_connected = connected;
}

static void on_requeued(void *arg, uint64_t request_id, int64_t rows)
{
    dsp_server *srv = arg;
    log_info(&srv->log, "requeue request %llu: %lld FAILED row(s) back to NEW",
             (unsigned long long)request_id, (long long)rows);
    if (request_id == srv->control.last_requeue.id) {
        srv->control.last_requeue.done = true;
        srv->control.last_requeue.rows = rows;
    }
    if (rows > 0)
        dsp_claim_pacing_hasten(srv);
    dsp_server_kick(srv);
}

static void on_fatal(void *arg, const char *message)
{
    dsp_server *srv = arg;
    log_error(&srv->log, "%s", message);
    outbox_flush(srv);
    srv->exit_code = 1;
    event_base_loopexit(srv->base, NULL);
}

/* ---- housekeeping and drain ---- */

static void finish_drain(dsp_server *srv)
{
    /* Deliveries still out after the grace period go back to NEW; their
     * attempt was used (they were delivered). */
    for (dsp_conn *c = srv->conns.list; c; c = c->next)
        while (c->inflight) {
            dsp_task *t = c->inflight;
            dsp_conn_cancel(c, t);
            release_task(srv, t);
        }
    outbox_flush(srv);
    log_info(&srv->log, "drained: %llu task(s) released back to NEW",
             (unsigned long long)srv->stats.tasks.released_total);
    event_base_loopexit(srv->base, NULL);
}

static void start_drain(dsp_server *srv, const char *why)
{
    if (srv->control.draining)
        return;
    srv->control.draining = true;
    dsp_notify("STOPPING=1");
    srv->control.drain_deadline_ms = dsp_now_ms() + srv->cfg->shutdown_grace_ms;
    log_info(&srv->log, "%s: draining (%llu in flight, grace %lld ms)", why,
             (unsigned long long)srv->sched.ninflight, (long long)srv->cfg->shutdown_grace_ms);
    if (srv->accept.listener)
        evconnlistener_disable(srv->accept.listener);
    for (dsp_conn *c = srv->conns.list; c; c = c->next) {
        if (c->state != DSP_CONN_ACTIVE)
            continue;
        dsp_dispatch_worker_stop(srv, c);
        dsp_conn_send_simple(c, PROTO_STOP);
    }
    for (dsp_type *ty = srv->types.list; ty; ty = ty->next)
        while (ty->nbuffered > 0) {
            dsp_task *t = dsp_dispatch_dequeue(srv, ty);
            srv->sched.nbuffered--;
            release_task(srv, t);
        }
    outbox_flush(srv);
}

/* Buffered tasks of a type whose last worker left more than --orphan-grace-ms ago go
 * back to NEW, uncharged, and the type is freed: another dispatcher or a returning
 * worker takes them from the table. */
static void release_orphans(dsp_server *srv, int64_t now)
{
    bool released = false;
    for (dsp_type *ty = srv->sched.busy_types, *next; ty; ty = next) {
        next = ty->busy_next;
        if (ty->nworkers > 0 || ty->paused)
            continue;
        if (ty->orphaned_ms == 0)
            ty->orphaned_ms = now;
        if (now - ty->orphaned_ms < srv->cfg->orphan_grace_ms)
            continue;
        log_info(&srv->log, "type %s has had no worker for %lld ms: %zu buffered task(s) back to NEW",
                 ty->name, (long long)(now - ty->orphaned_ms), ty->nbuffered);
        while (ty->nbuffered > 0) {
            dsp_task *t = dsp_dispatch_dequeue(srv, ty);
            srv->sched.nbuffered--;
            srv->stats.tasks.orphans_released_total++;
            release_task(srv, t);
        }
        dsp_server_type_release_if_unused(srv, ty);
        released = true;
    }
    if (released)
        dsp_server_kick(srv); /* the claim budget they held is free */
}

/* Marks the types the table figures show ready rows of, so that claims ask for them
 * first (TYPE_WARM_MS) even when the last claims found none. */
static void note_table_types(dsp_server *srv, int64_t now)
{
    if (srv->cfg->table_stats_ms <= 0 || now - srv->tick.table_seen_ms < srv->cfg->table_stats_ms)
        return;
    srv->tick.table_seen_ms = now;
    dsp_table_stats *ts = malloc(sizeof *ts);
    if (!ts)
        return;
    dsp_db_table_stats_get(srv->db, ts);
    for (size_t i = 0; ts->valid && i < ts->ntypes; i++) {
        if (ts->types[i].new_ready == 0)
            continue;
        const uint8_t *name = (const uint8_t *)ts->types[i].type;
        size_t len = strlen(ts->types[i].type);
        dsp_type *ty = dsp_server_type_find(srv, name, len);
        if (ty)
            ty->rows_seen_ms = now;
    }
    free(ts);
}

/* After a burst of connections has gone (an attack, a fleet restart), hands the memory
 * their buffers used back to the system, so that RSS returns to its baseline; glibc
 * keeps freed memory in its arenas otherwise. Runs at most once a second. */
static void trim_after_burst(dsp_server *srv)
{
    /* Counted at each close rather than sampled here: a flood's connections come and go
     * within a second, and their buffers would otherwise stay in the heap. */
    if (srv->tick.closed_since_trim >= TRIM_AFTER_CLOSED) {
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        srv->tick.closed_since_trim = 0;
    }
}

/* Deliveries whose lease has expired are cancelled and taken back; those running past
 * DSP_DELIVERY_RECORD_MS get their attempt written. Only the deliveries due are looked
 * at: the lease heap (dispatch.c) gives them earliest first. */
static void expire_leases(dsp_server *srv, int64_t now)
{
    int64_t now_us_pass = dsp_now_us();
    dsp_task *t;
    while ((t = dsp_dispatch_lease_due(srv, now))) {
        dsp_conn *c = t->holder;
        if (c->state != DSP_CONN_ACTIVE) {
            dsp_dispatch_lease_defer(srv, t, now + 1); /* as the tick did: not yet */
            continue;
        }
        if (now <= t->deadline_ms) {
            if (!t->recorded && now_us_pass - t->delivered_us >= DSP_DELIVERY_RECORD_MS * 1000) {
                t->recorded = true;
                outbox_push(srv, t, DSP_WRITE_DELIVERED, 0, NULL, 0);
                srv->stats.tasks.delivery_records_total++;
            }
            /* Recorded: next due when the lease expires. Not yet (the heap's key is in
             * ms, the record's threshold in us): the next tick looks again. */
            dsp_dispatch_lease_defer(srv, t, t->recorded ? t->deadline_ms + 1 : now + 1);
            continue;
        }
        log_info(&srv->log, "task %llu timed out on %s (attempt %u); cancelling",
                 (unsigned long long)t->id, c->name, (unsigned)t->attempts);
        srv->stats.tasks.timed_out_total++;
        dsp_conn_cancel(c, t);
        dsp_server_take_back(srv, t, "timed out");
        /* When c closes for it, its other deliveries are taken back and leave the heap. */
        (void)dsp_conn_note_timeout(c);
    }
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    int64_t now = dsp_now_ms();
    if (srv->stats.rates.n == 0 || now - srv->tick.rate_sample_ms >= 1000) {
        srv->tick.rate_sample_ms = now;
        trim_after_burst(srv);
        note_table_types(srv, now);
        dsp_rates_push(&srv->stats.rates, now, srv->stats.tasks.dispatched_total,
                       srv->stats.tasks.succeeded_total + srv->stats.tasks.failed_total);
    }
    dsp_db_lease_check(srv->db); /* a leader whose lease ran out steps down now */
    dsp_history_tick(srv, now);
    expire_leases(srv, now);
    for (dsp_conn *c = srv->conns.list, *next; c; c = next) {
        next = c->next;
        dsp_conn_tick(c, now);
    }
    release_orphans(srv, now);
    dsp_progress_flush(srv, now);
    if (srv->sched.limit_waiting) { /* a type waits for its rate's tokens: they came back since */
        srv->sched.limit_waiting = false;
        dsp_server_kick(srv);
    }
    if (srv->control.draining && !srv->claim.outstanding &&
        (srv->sched.ninflight == 0 || now >= srv->control.drain_deadline_ms))
        finish_drain(srv);
    outbox_flush(srv);
}

/* ---- operator requests ---- */

const char *dsp_server_pause(dsp_server *srv, const char *type)
{
    if (!type) {
        srv->control.paused_all = true;
        log_info(&srv->log, "paused: no task is claimed or dispatched until /resume");
        return NULL;
    }
    size_t len = strlen(type);
    if (dsp_utf8_valid_prefix((const uint8_t *)type, len) != len)
        return "a task type must be UTF-8";
    /* A paused type is kept until resumed: the same cap as the types workers register. */
    size_t before = srv->types.n;
    dsp_type *ty = dsp_server_type_intern(srv, (const uint8_t *)type, len);
    if (!ty)
        return "out of memory";
    if (srv->types.n > before && (int64_t)srv->types.n > srv->cfg->max_types) {
        dsp_server_type_release_if_unused(srv, ty);
        return "too many task types on this dispatcher (--max-types)";
    }
    ty->paused = true;
    log_info(&srv->log, "paused type %s", ty->name);
    return NULL;
}

void dsp_server_resume(dsp_server *srv, const char *type)
{
    if (!type) {
        srv->control.paused_all = false;
        for (dsp_type *ty = srv->types.list, *next; ty; ty = next) {
            next = ty->next;
            ty->paused = false;
            dsp_server_type_release_if_unused(srv, ty);
        }
        if (srv->control.admin_draining)
            log_info(&srv->log, "drain ended by /resume");
        srv->control.admin_draining = false;
        log_info(&srv->log, "resumed every type");
    } else {
        for (dsp_type *ty = srv->types.list, *next; ty; ty = next) {
            next = ty->next;
            if (strcmp(ty->name, type) == 0 && ty->paused) {
                ty->paused = false;
                log_info(&srv->log, "resumed type %s", ty->name);
                dsp_server_type_release_if_unused(srv, ty);
            }
        }
    }
    dsp_claim_pacing_hasten(srv);
    dsp_server_kick(srv);
}

void dsp_server_drain(dsp_server *srv)
{
    if (dsp_dispatch_stopped(srv))
        return;
    srv->control.admin_draining = true;
    uint64_t released = 0;
    for (dsp_type *ty = srv->types.list; ty; ty = ty->next)
        while (ty->nbuffered > 0) {
            dsp_task *t = dsp_dispatch_dequeue(srv, ty);
            srv->sched.nbuffered--;
            release_task(srv, t);
            released++;
        }
    outbox_flush(srv);
    log_info(&srv->log, "drain: claims stopped, %llu buffered task(s) released, %llu in flight left to finish",
             (unsigned long long)released, (unsigned long long)srv->sched.ninflight);
}

uint64_t dsp_server_requeue_failed(dsp_server *srv, const char *type)
{
    uint64_t id = ++srv->control.next_request_id;
    if (dsp_db_requeue_failed(srv->db, type, id) < 0)
        return 0;
    srv->control.last_requeue.id = id;
    snprintf(srv->control.last_requeue.type, sizeof srv->control.last_requeue.type, "%s", type ? type : "");
    srv->control.last_requeue.done = false;
    srv->control.last_requeue.rows = 0;
    log_info(&srv->log, "requeue request %llu: FAILED rows%s%s back to NEW", (unsigned long long)id,
             type ? " of type " : "", type ? type : "");
    return id;
}

const char *dsp_server_cancel_held(dsp_server *srv, dsp_task *t)
{
    static const char msg[] = "cancelled";
    const char *was = t->holder ? "running" : "buffered";
    dsp_type *ty = t->type;
    if (t->holder) {
        log_info(&srv->log, "task %llu cancelled by the operator on %s (attempt %u)",
                 (unsigned long long)t->id, t->holder->name, (unsigned)t->attempts);
        dsp_conn_cancel(t->holder, t);
    } else {
        log_info(&srv->log, "task %llu cancelled by the operator while buffered", (unsigned long long)t->id);
        dsp_dispatch_unlink(srv, t);
        srv->sched.nbuffered--;
    }
    outbox_push(srv, t, DSP_WRITE_FAILED, 0, msg, sizeof msg - 1);
    srv->stats.tasks.failed_total++;
    task_free(srv, t);
    dsp_server_type_release_if_unused(srv, ty);
    dsp_server_kick(srv); /* the outbox is flushed by the next pass */
    return was;
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    dsp_server *srv = arg;
    if (sig == SIGHUP) {
        log_info(&srv->log, "SIGHUP: nothing to reload; carrying on");
        return;
    }
    start_drain(srv, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- set-up ---- */

/* A flood of connections that never become sessions (garbage, slowloris, wrong token)
 * costs the kernel's TCP work for every connect even when taskpushd drops them at
 * once, and on a small machine that comes out of the honest workers' share. Past
 * --max-failed-handshakes a second, accepts are rationed to that rate for the next
 * second: the listener pauses until the window ends, new connections wait in the
 * backlog and, once it is full, a flooder's connects stall in SYN retries. Sessions
 * already open are untouched. */
static int64_t handshake_window_now(dsp_server *srv, int64_t now)
{
    int64_t window = now / FAILED_HANDSHAKE_WINDOW_MS;
    if (window != srv->accept.handshake_window) {
        srv->accept.handshake_window = window;
        srv->accept.failed_handshakes = 0;
        srv->accept.accepts_in_window = 0;
    }
    return window;
}

static int64_t handshakes_per_window(const dsp_server *srv)
{
    return (srv->cfg->max_failed_handshakes * FAILED_HANDSHAKE_WINDOW_MS + 999) / 1000;
}

static void pause_accepting_for_window(dsp_server *srv, int64_t window, int64_t now)
{
    evconnlistener_disable(srv->accept.listener);
    int64_t left_ms = (window + 1) * FAILED_HANDSHAKE_WINDOW_MS - now;
    struct timeval tv = {0, (suseconds_t)(left_ms * 1000)};
    evtimer_add(srv->accept.retry_ev, &tv);
}

void dsp_server_handshake_failed(dsp_server *srv)
{
    if (srv->cfg->max_failed_handshakes <= 0 || !srv->accept.listener || srv->control.draining)
        return;
    int64_t now = dsp_now_ms();
    int64_t window = handshake_window_now(srv, now);
    if (++srv->accept.failed_handshakes != handshakes_per_window(srv) + 1)
        return;
    if (srv->accept.flood_until_window < window) {
        srv->stats.conns.handshake_pauses_total++;
        log_limited(&srv->log, &srv->conns.peer_log, now, DSP_LOG_WARN,
                    "more than %" PRId64 " connections a second closed before HELLO; "
                    "accepting at most that many a second",
                    srv->cfg->max_failed_handshakes);
    }
    srv->accept.flood_until_window = window + 1000 / FAILED_HANDSHAKE_WINDOW_MS;
    pause_accepting_for_window(srv, window, now);
}

/* Under a flood, at most a window's ration of accepts, then a pause to the window's end. */
static void ration_accepts(dsp_server *srv)
{
    if (srv->cfg->max_failed_handshakes <= 0 || srv->control.draining)
        return;
    int64_t now = dsp_now_ms();
    int64_t window = handshake_window_now(srv, now);
    if (window <= srv->accept.flood_until_window &&
        ++srv->accept.accepts_in_window >= handshakes_per_window(srv))
        pause_accepting_for_window(srv, window, now);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    (void)l;
    dsp_server *srv = arg;
    srv->accept.backoff_ms = 0;
    if ((int64_t)srv->conns.n >= srv->cfg->max_connections) {
        /* Closed at once: nothing is read, nothing allocated. */
        evutil_closesocket(fd);
        srv->stats.conns.refused_total++;
        log_limited(&srv->log, &srv->conns.peer_log, dsp_now_ms(), DSP_LOG_WARN, "%s",
                    "connection refused: --max-connections reached");
        return;
    }
    ration_accepts(srv);
    dsp_conn_accept(srv, fd, sa, salen);
}

static void accept_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    dsp_server *srv = arg;
    if (srv->accept.listener && !srv->control.draining)
        evconnlistener_enable(srv->accept.listener);
}

static void accept_error_cb(struct evconnlistener *l, void *arg)
{
    dsp_server *srv = arg;
    int err = EVUTIL_SOCKET_ERROR();
    srv->stats.conns.accept_errors_total++;
    log_limited(&srv->log, &srv->conns.peer_log, dsp_now_ms(), DSP_LOG_WARN,
                "accept failed: %s; pausing new connections", evutil_socket_error_to_string(err));
    /* Out of descriptors (EMFILE) the pending connection stays in the backlog and the
     * listener would be woken again at once: stop listening for a while instead of
     * spinning, and keep serving the connections we have. */
    evconnlistener_disable(l);
    srv->accept.backoff_ms = srv->accept.backoff_ms ? srv->accept.backoff_ms * 2 : ACCEPT_BACKOFF_MIN_MS;
    if (srv->accept.backoff_ms > ACCEPT_BACKOFF_MAX_MS)
        srv->accept.backoff_ms = ACCEPT_BACKOFF_MAX_MS;
    struct timeval tv = {0, (suseconds_t)(srv->accept.backoff_ms * 1000)};
    evtimer_add(srv->accept.retry_ev, &tv);
}

static int bind_listener(dsp_server *srv, char *bound, size_t boundlen)
{
    char host[256];
    unsigned port;
    if (dsp_hostport_parse(srv->cfg->listen, host, sizeof host, &port) < 0)
        return -1;
    struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                                    .ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICSERV};
    struct evutil_addrinfo *ai = NULL;
    char portstr[8];
    snprintf(portstr, sizeof portstr, "%u", port);
    int rc = evutil_getaddrinfo(host, portstr, &hints, &ai);
    if (rc != 0) {
        log_error(&srv->log, "--listen %s: %s", srv->cfg->listen, evutil_gai_strerror(rc));
        return -1;
    }
    srv->accept.listener = evconnlistener_new_bind(srv->base, accept_cb, srv,
                                            LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                            ai->ai_addr, (int)ai->ai_addrlen);
    evutil_freeaddrinfo(ai);
    if (!srv->accept.listener) {
        log_error(&srv->log, "--listen %s: %s", srv->cfg->listen, strerror(errno));
        return -1;
    }
    evconnlistener_set_error_cb(srv->accept.listener, accept_error_cb);
#ifdef TCP_DEFER_ACCEPT
    /* A worker speaks first (HELLO, or a TLS ClientHello): the kernel hands over a
     * connection only once its first bytes arrived, so connect-and-close floods and
     * silent connections cost the loop nothing (nginx's "deferred"). */
    int defer_s = (int)((3 * srv->cfg->heartbeat_ms + 999) / 1000);
    setsockopt(evconnlistener_get_fd(srv->accept.listener), IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s,
               sizeof defer_s);
#endif
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evconnlistener_get_fd(srv->accept.listener), (struct sockaddr *)&ss, &sl);
    unsigned real_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                                  : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    dsp_hostport_format(bound, boundlen, host, real_port);
    return 0;
}

/* One WARN line when a port is reachable beyond loopback and nothing authenticates
 * there: workers without --token-file take tasks; admin POSTs without
 * --admin-token-file or --token-file pause, drain and requeue. */
static void warn_open_ports(dsp_server *srv, const char *listen, const char *admin)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    memset(&ss, 0, sizeof ss);
    getsockname(evconnlistener_get_fd(srv->accept.listener), (struct sockaddr *)&ss, &sl);
    bool open_workers = !dsp_addr_is_loopback(&ss) && !srv->cfg->token;
    bool open_admin = !srv->admin.loopback && !srv->cfg->token && !srv->cfg->admin_token;
    /* The worker token protects both ports: it is the one to name when both are open. */
    if (open_workers && open_admin)
        log_warn(&srv->log, "the worker port %s and the admin port %s listen beyond loopback without a token: "
                 "anyone who reaches them can take tasks, pause, drain and requeue; set --token-file",
                 listen, admin);
    else if (open_workers)
        log_warn(&srv->log, "the worker port %s listens beyond loopback without a token: anyone who reaches it "
                 "can take tasks; set --token-file", listen);
    else if (open_admin)
        log_warn(&srv->log, "the admin port %s listens beyond loopback without a token: anyone who reaches it "
                 "can pause, drain and requeue; set --admin-token-file", admin);
}

static int write_ready_file(dsp_server *srv, const char *listen, const char *admin)
{
    const char *path = srv->cfg->ready_file;
    if (!path)
        return 0;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *o = json_pack("{s:i, s:s, s:s}", "pid", (json_int_t)getpid(), "listen", listen, "admin", admin);
    int rc = o ? json_dump_file(o, tmp, JSON_COMPACT) : -1;
    json_decref(o);
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -1;
    if (rc != 0)
        log_error(&srv->log, "--ready-file %s: cannot write it", path);
    return rc;
}

int dsp_server_init_offline(dsp_server *srv, const dsp_config *cfg)
{
    memset(srv, 0, sizeof *srv);
    srv->cfg = cfg;
    srv->log.level = cfg->log_level;
    srv->stats.started_ms = dsp_now_ms();

    if (dsp_taskmap_init(&srv->tasks.map, 4096) < 0 || dsp_taskmap_init(&srv->inv.v3conns, 64) < 0 ||
        dsp_history_init(&srv->stats.history, DSP_HISTORY_SAMPLES) < 0 || dsp_limits_init(srv) < 0)
        return -1;
    dsp_deadline_init(&srv->sched.leases);
    srv->base = event_base_new();
    if (!srv->base) {
        log_error(&srv->log, "cannot create the event base");
        return -1;
    }
    srv->tick.timer = event_new(srv->base, -1, EV_PERSIST, tick_cb, srv);
    srv->dispatch_ev = event_new(srv->base, -1, 0, dispatch_cb, srv);
    srv->conns.flush_ev = event_new(srv->base, -1, 0, dsp_conn_flush_cb, srv);
    srv->inv.confirm_ev = evtimer_new(srv->base, dsp_inv_confirm_cb, srv);
    srv->accept.retry_ev = evtimer_new(srv->base, accept_retry_cb, srv);
    if (dsp_claim_pacing_init(srv) < 0 || !srv->tick.timer || !srv->dispatch_ev || !srv->conns.flush_ev ||
        !srv->inv.confirm_ev || !srv->accept.retry_ev)
        return -1;
    int64_t tick = cfg->heartbeat_ms / 4;
    if (tick > TICK_MS_MAX)
        tick = TICK_MS_MAX;
    if (tick < 5)
        tick = 5;
    struct timeval tv = {0, (suseconds_t)(tick * 1000)};
    event_add(srv->tick.timer, &tv);
    return 0;
}

static void noop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
}

/* libevent allocates a small record for each descriptor number the first time an event
 * is added on it, and keeps it until the base is freed. Left to that, a thousand
 * connections at once (an attack, a fleet reconnecting) create a thousand 32-byte
 * records among their own buffers, and once those are freed the records pin about 400
 * heap pages: RSS stayed 1.6 MB over its baseline after every attack. So the records
 * for every descriptor a connection can get (--max-connections and a margin, within
 * the descriptor limit, at most FD_RECORDS_MAX) are made here, together, by adding and
 * deleting an event on a duplicate of a pipe at each free number: 32 bytes each (320 KB
 * for the default 10,000). */
#define FD_RECORDS_MAX 65536

static void reserve_fd_records(dsp_server *srv)
{
    struct rlimit rl;
    int64_t want = srv->cfg->max_connections + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (int64_t)rl.rlim_cur < want)
        want = (int64_t)rl.rlim_cur;
    if (want > FD_RECORDS_MAX)
        want = FD_RECORDS_MAX;
    int pipe_fds[2];
    if (pipe(pipe_fds) < 0)
        return;
    struct event *ev = event_new(srv->base, -1, 0, noop_cb, NULL);
    for (int from = 0; ev && from < (int)want;) {
        /* The lowest free number from there on: an open descriptor is never replaced,
         * and has its record already if it has events. */
        int fd = fcntl(pipe_fds[0], F_DUPFD_CLOEXEC, from);
        if (fd < 0)
            break;
        if (event_assign(ev, srv->base, fd, EV_READ, noop_cb, NULL) == 0 && event_add(ev, NULL) == 0)
            event_del(ev);
        close(fd);
        from = fd + 1;
    }
    if (ev)
        event_free(ev);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
}

int dsp_server_init(dsp_server *srv, const dsp_config *cfg)
{
    if (dsp_server_init_offline(srv, cfg) < 0)
        return -1;
    static const int signals[3] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        srv->signal_evs[i] = evsignal_new(srv->base, signals[i], signal_cb, srv);
        if (!srv->signal_evs[i] || evsignal_add(srv->signal_evs[i], NULL) < 0)
            return -1;
    }

    reserve_fd_records(srv);

    char listen[300], admin[300], why[512];
    if (cfg->tls_cert && !(srv->tls = dsp_tls_new(cfg->tls_cert, cfg->tls_key, cfg->tls_ca, why, sizeof why))) {
        log_error(&srv->log, "%s", why);
        return -1;
    }
    if (bind_listener(srv, listen, sizeof listen) < 0)
        return -1;
    if (dsp_admin_init(srv, admin, sizeof admin) < 0)
        return -1;
    snprintf(srv->listen_bound, sizeof srv->listen_bound, "%s", listen);
    snprintf(srv->admin_bound, sizeof srv->admin_bound, "%s", admin);
    log_info(&srv->log, "taskpushd %s: workers on %s, admin on %s%s, scheduler %s", TASKPUSH_VERSION,
             listen, admin, srv->tls ? " (both TLS)" : "", dsp_sched_policy_name(cfg->scheduler));
    warn_open_ports(srv, listen, admin);

    dsp_db_options o = {
        .url = &cfg->db_url,
        .log = &srv->log,
        .base = srv->base,
        .result_flush_ms = cfg->result_flush_ms,
        .max_write_batch = 2000,
        .table_stats_ms = cfg->table_stats_ms,
        .claim_split = (uint32_t)cfg->claim_split,
        .retain_succeeded_ms = cfg->retain_finished_ms,
        .retain_failed_ms = cfg->retain_failed_ms,
        .lease_ms = cfg->lease_ms,
        .lease_renew_ms = cfg->lease_renew_ms,
        .adopt_grace_ms = cfg->adopt_grace_ms,
        .orphan_age_ms = cfg->task_timeout_ms,
        .shard = &cfg->shard_spec,
        .table = cfg->table,
        .sql_dialect = cfg->sql_dialect,
        .wake = cfg->wake,
        .cb = {on_leader, on_leader_lost, on_claim, on_written, on_health, on_requeued, on_fatal,
               dsp_admin_taskop_answer, dsp_conn_on_submitted, dsp_conn_on_outcome,
               dsp_dispatch_on_wake, on_settings},
        .cb_arg = srv,
    };
    srv->db = dsp_db_new(&o);
    if (!srv->db || dsp_db_start(srv->db) < 0) {
        log_error(&srv->log, "cannot start the database threads");
        return -1;
    }
    return write_ready_file(srv, listen, admin);
}

int dsp_server_run(dsp_server *srv)
{
    event_base_dispatch(srv->base);
    /* The loop has ended: write what is queued, then let go of the table. */
    dsp_db_stop(srv->db, srv->cfg->shutdown_grace_ms > 5000 ? srv->cfg->shutdown_grace_ms : 5000);
    log_info(&srv->log, "stopped: %llu succeeded, %llu failed, %llu released",
             (unsigned long long)srv->stats.tasks.succeeded_total,
             (unsigned long long)srv->stats.tasks.failed_total,
             (unsigned long long)srv->stats.tasks.released_total);
    return srv->exit_code;
}

void dsp_server_free(dsp_server *srv)
{
    while (srv->conns.list)
        dsp_conn_free(srv->conns.list);
    forget_all_tasks(srv);
    if (srv->db)
        dsp_db_free(srv->db);
    dsp_admin_http_free(srv);
    dsp_stats_worker_totals_free(srv);
    if (srv->accept.listener)
        evconnlistener_free(srv->accept.listener);
    dsp_tls_free(srv->tls);
    for (int i = 0; i < 3; i++)
        if (srv->signal_evs[i])
            event_free(srv->signal_evs[i]);
    dsp_claim_pacing_free(srv);
    if (srv->tick.timer)
        event_free(srv->tick.timer);
    if (srv->dispatch_ev)
        event_free(srv->dispatch_ev);
    if (srv->conns.flush_ev)
        event_free(srv->conns.flush_ev);
    if (srv->inv.confirm_ev)
        event_free(srv->inv.confirm_ev);
    if (srv->accept.retry_ev)
        event_free(srv->accept.retry_ev);
    dsp_server_types_free(srv);
    for (size_t i = 0; i < srv->outbox.n; i++)
        free(srv->outbox.items[i].data);
    free(srv->outbox.items);
    dsp_taskmap_free(&srv->tasks.map);
    task_pool_free(srv);
    dsp_progress_free(srv);
    dsp_taskmap_free(&srv->inv.v3conns);
    dsp_deadline_free(&srv->sched.leases);
    dsp_history_free(&srv->stats.history);
    dsp_limits_free(srv);
    if (srv->base)
        event_base_free(srv->base);
}
