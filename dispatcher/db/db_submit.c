/* db_submit: the submit thread and the waited-for tasks (see db_internal.h for what it
 * shares). It owns the queue of submissions (dsp_db_submit), their insertion, and the
 * table of tasks whose submitter asked for an OUTCOME (filled here before COMMIT, read
 * by the write thread's hook dsp_dbi_submit_notify, emptied by dsp_db_submit_forget).
 *
 * The thread has a connection of its own (autocommit off, READ COMMITTED), never the
 * claim connection: a submission never waits behind a claim, nor a claim behind an
 * insert. It takes every queued submission (up to SUBMIT_BATCH_ROWS rows; first, the
 * gather at submit_main may wait a little for more) and inserts them in one transaction,
 * with as few multi-row statements as max_allowed_packet allows (a batch with no
 * dedup_key, dependency, OUTCOME wait or large payload: one autocommit statement
 * instead, insert_autocommit):
 *
 *     INSERT IGNORE INTO task (...) VALUES (...), (...) RETURNING task_id, dedup_key
 *
 * A payload of DSP_DB_RESULT_PARAM_MIN bytes or more goes in as '' and is then set by an
 * UPDATE of its own whose parameter is the payload (dsp_dbi_exec_blob), in the same
 * transaction, before COMMIT: no hex copy of it (twice its size) in the INSERT, and a
 * payload may be as large as max_allowed_packet (the hex text stopped at half of it).
 * A payload larger than that is answered INVALID with the limit.
 *
 * IGNORE turns a dedup_key already present into a skipped row, and RETURNING (MariaDB
 * 10.5 and later) names the rows that went in, so the ids need no LAST_INSERT_ID()
 * arithmetic (which breaks as soon as one row is skipped). Each returned row is matched
 * to its task by dedup_key; the rows without a key, which cannot be skipped, take the
 * returned ids without a key in ascending order (AUTO_INCREMENT hands them out in the
 * order of the VALUES). A task whose key was not returned is a duplicate: one
 * SELECT ... WHERE dedup_key IN (...) in the same transaction finds the existing ids.
 * Then COMMIT, and only then the answers go to the loop, which sends SUBMITTED.
 *
 * MySQL 8 has no INSERT ... RETURNING. On a connection of MySQL's dialect
 * (--sql-dialect, dsp_dbi_conn_open) the batch takes insert_mysql instead, still one
 * transaction of multi-row statements and no reliance on consecutive AUTO_INCREMENT
 * values (innodb_autoinc_lock_mode = 2, MySQL 8's default, interleaves the ids of
 * concurrent inserts; auto_increment_increment may be above 1):
 *   1. SELECT task_id, dedup_key ... WHERE dedup_key IN (the batch's keys) LOCK IN SHARE
 *      MODE: the keys already present (duplicates), locked so that none is deleted
 *      (retention) before COMMIT;
 *   2. INSERT IGNORE ... VALUES of every other task, each key once; a task without a key
 *      gets a provisional one ("taskpush:pending:<random>:<n>"), so that every row
 *      inserted can be found by its key;
 *   3. the INSERTs' affected rows must equal the rows sent: fewer means a key appeared
 *      between 1 and 2 (another producer), and the batch is rolled back and run again;
 *   4. SELECT task_id, dedup_key ... WHERE dedup_key IN (the keys inserted): the ids;
 *   5. UPDATE ... SET dedup_key = NULL WHERE task_id IN (the provisional rows), which
 *      nobody else ever saw: READ COMMITTED readers do not see the uncommitted keys.
 * Measured against RETURNING in docs/journal/bench.md ("SUBMIT in MySQL's dialect").
 *
 * A failed statement rolls the whole transaction back and answers every submission of
 * the batch UNAVAILABLE (nothing committed, safe to resend); so does a dispatcher that
 * does not lead the table, or a database that cannot be reached (no wait for it: the
 * next connect is tried after a backoff, and submissions meanwhile are answered at once).
 */
#include "db_internal.h"

#include "proto.h"

#include <mysql.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows per transaction at most: one SUBMIT frame never exceeds it (1000). */
#define SUBMIT_BATCH_ROWS 2000

/* insert_mysql: runs of a batch that another producer's insert of one of its keys
 * disturbed, before the batch is answered UNAVAILABLE (safe to resend). */
#define MYSQL_BATCH_TRIES 3

/* A statement's bytes beyond its rows, and one row's beyond its hex fields. */
#define INSERT_FIXED 400u
#define ROW_FIXED 176u

/* One waited-for task. */
struct waiter {
    uint64_t task_id;
    uint64_t conn_id;
    uint32_t request_id;
    struct waiter *next;
};

struct dsp_submitter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thr;
    bool thread_ok;
    bool stop;
    dsp_submit_req *head, **tail; /* the queue */
    size_t nqueued;               /* requests in it */
    size_t gather_want;           /* the thread waits for this many queued; 0: not gathering */

    struct waiter **buckets;      /* by task_id; nbuckets is a power of two */
    size_t nbuckets, nwaiters;
    _Atomic size_t nwaiters_hint; /* lets the write thread skip the lock when 0 */
};

/* A returned or looked-up row: its key (copied) and id. */
struct krow {
    uint8_t *key;
    size_t len;
    uint64_t id;
    bool used;
};

struct sub_ctx {
    dsp_db *db;
    struct dbconn c;
    int64_t next_connect;
    dsp_strbuf sql;
    struct krow *keyed;   /* rows returned with a key, then sorted */
    size_t nkeyed, keyed_cap;
    struct krow *found;   /* rows of the duplicate lookup, sorted */
    size_t nfound, found_cap;
    uint64_t *plain;      /* ids returned without a key */
    size_t nplain, plain_cap;
    char insert_head[160 + DSP_TABLE_IDENT_CAP]; /* INSERT_HEAD_FMT with the table's name */
    bool autocommit;      /* the session's autocommit, as last set (off at connect) */
    uint64_t pending_tag; /* insert_mysql: the random part of this run's provisional keys */
};

void dsp_submit_req_free(dsp_submit_req *req)
{
    if (req == NULL)
        return;
    free(req->items);
    free(req->body);
    free(req);
}

static void answer(dsp_submit_req *r, uint16_t status, const char *why)
{
    r->status = status;
    snprintf(r->message, sizeof r->message, "%s", why);
}

/* ---- the waiters (under s->mu) ---- */

static size_t bucket_of(const struct dsp_submitter *s, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ULL) >> 20) & (s->nbuckets - 1);
}

static int waiters_grow(struct dsp_submitter *s)
{
    size_t nb = s->nbuckets ? s->nbuckets * 2 : 1024;
    struct waiter **b = calloc(nb, sizeof *b);
    struct waiter **old = s->buckets;
    size_t onb = s->nbuckets;

    if (b == NULL)
        return -1;
    s->buckets = b;
    s->nbuckets = nb;
    for (size_t i = 0; i < onb; i++) {
        for (struct waiter *w = old[i], *next; w; w = next) {
            size_t k = bucket_of(s, w->task_id);
            next = w->next;
            w->next = b[k];
            b[k] = w;
        }
    }
    free(old);
    return 0;
}

static int waiter_add(struct dsp_submitter *s, uint64_t task_id, uint64_t conn_id, uint32_t request_id)
{
    struct waiter *w;
    size_t k;

    if (s->nwaiters >= s->nbuckets && waiters_grow(s) < 0)
        return -1;
    if ((w = malloc(sizeof *w)) == NULL)
        return -1;
    w->task_id = task_id;
    w->conn_id = conn_id;
    w->request_id = request_id;
    k = bucket_of(s, task_id);
    w->next = s->buckets[k];
    s->buckets[k] = w;
    s->nwaiters++;
    atomic_store(&s->nwaiters_hint, s->nwaiters);
    return 0;
}

/* Removes the waiter of task_id and returns it (caller frees), or NULL. */
static struct waiter *waiter_take(struct dsp_submitter *s, uint64_t task_id)
{
    if (s->nbuckets == 0)
        return NULL;
    for (struct waiter **pw = &s->buckets[bucket_of(s, task_id)]; *pw; pw = &(*pw)->next) {
        struct waiter *w = *pw;
        if (w->task_id == task_id) {
            *pw = w->next;
            s->nwaiters--;
            atomic_store(&s->nwaiters_hint, s->nwaiters);
            return w;
        }
    }
    return NULL;
}

void dsp_db_submit_forget(dsp_db *db, uint64_t conn_id)
{
    struct dsp_submitter *s = db ? db->sub : NULL;

    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nbuckets && s->nwaiters > 0; i++) {
        for (struct waiter **pw = &s->buckets[i]; *pw;) {
            struct waiter *w = *pw;
            if (w->conn_id == conn_id) {
                *pw = w->next;
                free(w);
                s->nwaiters--;
            } else {
                pw = &w->next;
            }
        }
    }
    atomic_store(&s->nwaiters_hint, s->nwaiters);
    pthread_mutex_unlock(&s->mu);
}

void dsp_dbi_submit_notify(dsp_db *db, struct wentry *batch, const uint8_t *written, size_t n)
{
    struct dsp_submitter *s = db->sub;
    struct msg *head = NULL, **tail = &head;

    if (s == NULL || atomic_load(&s->nwaiters_hint) == 0)
        return;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n && s->nwaiters > 0; i++) {
        dsp_outcome *o = &batch[i].o;
        struct waiter *w;
        struct msg *m;
        if (!written[i] || (o->kind != DSP_WRITE_SUCCEEDED && o->kind != DSP_WRITE_FAILED) ||
            (w = waiter_take(s, o->task_id)) == NULL)
            continue;
        m = dsp_dbi_msg_new(MSG_OUTCOME);
        if (m != NULL && (m->outcome = calloc(1, sizeof *m->outcome)) != NULL) {
            m->outcome->conn_id = w->conn_id;
            m->outcome->request_id = w->request_id;
            m->outcome->task_id = o->task_id;
            m->outcome->state = o->kind == DSP_WRITE_SUCCEEDED ? PROTO_STATE_SUCCESSFUL : PROTO_STATE_FAILED;
            m->outcome->data = o->data; /* taken: the batch would free it next */
            m->outcome->len = o->data ? o->len : 0;
            o->data = NULL;
            *tail = m;
            tail = &m->next;
        } else {
            free(m);
            log_warn(db->log, "out of memory: the OUTCOME of task %" PRIu64 " is not sent", o->task_id);
        }
        free(w);
    }
    pthread_mutex_unlock(&s->mu);
    for (struct msg *m = head, *next; m; m = next) {
        next = m->next;
        dsp_dbi_post(db, m);
    }
}

void dsp_dbi_submit_notify_failed(dsp_db *db, uint64_t task_id, const char *text)
{
    struct dsp_submitter *s = db->sub;
    struct waiter *w;
    struct msg *m;

    if (s == NULL || atomic_load(&s->nwaiters_hint) == 0)
        return;
    pthread_mutex_lock(&s->mu);
    w = s->nwaiters > 0 ? waiter_take(s, task_id) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (w == NULL)
        return;
    m = dsp_dbi_msg_new(MSG_OUTCOME);
    if (m != NULL && (m->outcome = calloc(1, sizeof *m->outcome)) != NULL &&
        (m->outcome->data = (uint8_t *)strdup(text)) != NULL) {
        m->outcome->conn_id = w->conn_id;
        m->outcome->request_id = w->request_id;
        m->outcome->task_id = task_id;
        m->outcome->state = PROTO_STATE_FAILED;
        m->outcome->len = strlen(text);
        dsp_dbi_post(db, m);
    } else {
        if (m)
            free(m->outcome);
        free(m);
        log_warn(db->log, "out of memory: the OUTCOME of task %" PRIu64 " is not sent", task_id);
    }
    free(w);
}

/* ---- messages ---- */

void dsp_dbi_submit_deliver(dsp_db *db, struct msg *m)
{
    const dsp_db_callbacks *cb = &db->opts.cb;

    if (m->kind == MSG_SUBMITTED) {
        dsp_submit_req *r = m->sreq;
        m->sreq = NULL; /* the callee owns it */
        if (cb->on_submitted)
            cb->on_submitted(db->opts.cb_arg, r);
        else
            dsp_submit_req_free(r);
    } else if (m->kind == MSG_OUTCOME && m->outcome && cb->on_outcome) {
        cb->on_outcome(db->opts.cb_arg, m->outcome);
    }
}

void dsp_dbi_submit_msg_free(struct msg *m)
{
    dsp_submit_req_free(m->sreq);
    if (m->outcome) {
        free(m->outcome->data);
        free(m->outcome);
    }
}

static void post_answer(dsp_db *db, dsp_submit_req *r)
{
    struct msg *m = dsp_dbi_msg_new(MSG_SUBMITTED);

    if (m == NULL) {
        /* The connection then never hears back: it stays paused until it closes. */
        log_error(db->log, "out of memory: submission %u is not answered", (unsigned)r->request_id);
        dsp_submit_req_free(r);
        return;
    }
    m->sreq = r;
    dsp_dbi_post(db, m);
}

/* ---- the API ---- */

int dsp_db_submit(dsp_db *db, dsp_submit_req *req)
{
    struct dsp_submitter *s = db ? db->sub : NULL;
    int rc = -1;

    if (s == NULL || req == NULL)
        return -1;
    pthread_mutex_lock(&s->mu);
    if (!s->stop && s->thread_ok) {
        req->next = NULL;
        *s->tail = req;
        s->tail = &req->next;
        /* A gathering thread wakes once, when its count is reached (or at its deadline). */
        if (++s->nqueued == 1 || s->gather_want == 0 || s->nqueued >= s->gather_want)
            pthread_cond_signal(&s->cv);
        rc = 0;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc == 0)
        atomic_fetch_add_explicit(&db->submit_requests, 1, memory_order_relaxed);
    return rc;
}

/* ---- the transaction ---- */

static int krow_cmp(const void *pa, const void *pb)
{
    const struct krow *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->key, b->key, n) : 0;
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int u64_cmp(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

static struct krow *krow_find(struct krow *rows, size_t n, const uint8_t *key, size_t len)
{
    struct krow probe = {(uint8_t *)key, len, 0, false};
    return n ? bsearch(&probe, rows, n, sizeof *rows, krow_cmp) : NULL;
}

static void krows_clear(struct krow *rows, size_t *n)
{
    for (size_t i = 0; i < *n; i++)
        free(rows[i].key);
    *n = 0;
}

static int krow_push(struct krow **rows, size_t *n, size_t *cap, const char *key, size_t len, uint64_t id)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        struct krow *r = realloc(*rows, nc * sizeof *r);
        if (r == NULL)
            return -1;
        *rows = r;
        *cap = nc;
    }
    uint8_t *k = malloc(len ? len : 1);
    if (k == NULL)
        return -1;
    if (len)
        memcpy(k, key, len);
    (*rows)[(*n)++] = (struct krow){k, len, id, false};
    return 0;
}

/* Its payload is set afterwards by set_large_payloads, not written in the INSERT. */
static bool payload_is_large(const dsp_submit_item *it)
{
    return it->payload_len >= DSP_DB_RESULT_PARAM_MIN;
}

/* The most a row of it adds to an INSERT (hex doubles the bytes). */
static size_t row_cost(const dsp_submit_item *it)
{
    return ROW_FIXED +
           2 * (it->type_len + it->key_len + it->group_key_len +
                (payload_is_large(it) ? 0 : it->payload_len));
}

/* The largest payload the table takes from c: a parameter may be as large as the
 * session's max_allowed_packet; the column holds 16 MiB - 1. */
static size_t payload_cap(const struct dbconn *c)
{
    return c->max_packet && c->max_packet < DSP_DB_RESULT_MAX ? c->max_packet : DSP_DB_RESULT_MAX;
}

static void put_row(dsp_strbuf *b, const dsp_submit_item *it, int64_t now)
{
    dsp_strbuf_puts(b, "(");
    dsp_strbuf_put_hex(b, it->type, it->type_len, true);
    dsp_strbuf_printf(b, ",%u,", (unsigned)it->priority);
    if (it->payload_len > 0 && !payload_is_large(it))
        dsp_strbuf_put_hex(b, it->payload, it->payload_len, false);
    else
        dsp_strbuf_puts(b, "''"); /* an empty payload, as given: not NULL */
    if (it->max_attempts)
        dsp_strbuf_printf(b, ",%u,", (unsigned)it->max_attempts);
    else
        dsp_strbuf_puts(b, ",DEFAULT,");
    /* `delayed` 2: waiting for its dependencies (db_deps.c releases it). */
    dsp_strbuf_printf(b, "%" PRId64 ",%d,", now + (int64_t)it->delay_ms,
                      it->nafter > 0 ? 2 : it->delay_ms > 0 ? 1 : 0);
    if (it->timeout_ms)
        dsp_strbuf_printf(b, "%u,", (unsigned)it->timeout_ms);
    else
        dsp_strbuf_puts(b, "NULL,");
    dsp_strbuf_put_hex(b, it->key, it->key_len, false);
    dsp_strbuf_puts(b, ",");
    dsp_strbuf_put_hex(b, it->group_key, it->group_key_len, false);
    dsp_strbuf_puts(b, ")");
}

/* Runs the INSERT in x->sql and collects the rows it returns. Returns 0 or -1. */
static int run_insert(struct sub_ctx *x)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    atomic_fetch_add_explicit(&x->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
        (res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(x->db->log, "submit connection: %s (error %u)", mysql_error(x->c.m), x->c.err);
        return -1;
    }
    int rc = 0;
    while (rc == 0 && (row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        uint64_t id = row[0] ? strtoull(row[0], NULL, 10) : 0;
        if (row[1] != NULL) {
            rc = krow_push(&x->keyed, &x->nkeyed, &x->keyed_cap, row[1], len[1], id);
        } else {
            if (x->nplain == x->plain_cap) {
                size_t nc = x->plain_cap ? x->plain_cap * 2 : 256;
                uint64_t *p = realloc(x->plain, nc * sizeof *p);
                if (p == NULL) {
                    rc = -1;
                    break;
                }
                x->plain = p;
                x->plain_cap = nc;
            }
            x->plain[x->nplain++] = id;
        }
    }
    mysql_free_result(res);
    return rc;
}

/* Runs the SELECT in x->sql (a lookup by dedup_key) and adds its rows to rows. */
static int run_key_query(struct sub_ctx *x, struct krow **rows, size_t *n, size_t *cap)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 0;

    atomic_fetch_add_explicit(&x->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
        (res = mysql_store_result(x->c.m)) == NULL) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(x->db->log, "submit connection: %s (error %u)", mysql_error(x->c.m), x->c.err);
        return -1;
    }
    while (rc == 0 && (row = mysql_fetch_row(res)) != NULL) {
        unsigned long *len = mysql_fetch_lengths(res);
        if (row[0] && row[1])
            rc = krow_push(rows, n, cap, row[1], len[1], strtoull(row[0], NULL, 10));
    }
    mysql_free_result(res);
    return rc;
}

static const char INSERT_HEAD_FMT[] =
    "INSERT IGNORE INTO %s (task_type, task_priority, payload, max_attempts, run_after,"
    " `delayed`, timeout_ms, dedup_key, group_key) VALUES ";
static const char INSERT_TAIL[] = " RETURNING task_id, dedup_key";

/* Inserts every item of the live requests, statement by statement. Returns 0 or -1. */
static int insert_all(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq, int64_t now)
{
    size_t limit = x->c.stmt_limit, rows = 0;

    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (rows > 0 && x->sql.len + row_cost(it) + sizeof INSERT_TAIL > limit) {
                dsp_strbuf_puts(&x->sql, INSERT_TAIL);
                if (x->sql.oom || run_insert(x) < 0)
                    return -1;
                dsp_strbuf_reset(&x->sql);
                rows = 0;
            }
            dsp_strbuf_puts(&x->sql, rows ? "," : x->insert_head);
            put_row(&x->sql, it, now);
            if (it->group_key_len)
                atomic_fetch_add_explicit(&x->db->keyed_submits, 1, memory_order_relaxed);
            rows++;
        }
    }
    if (rows > 0) {
        dsp_strbuf_puts(&x->sql, INSERT_TAIL);
        if (x->sql.oom || run_insert(x) < 0)
            return -1;
    }
    return 0;
}

/* Sets the payload of each inserted task whose payload the INSERT left out (after
 * match_results, before COMMIT: nobody else sees the row meanwhile). Returns 0 or -1. */
static int set_large_payloads(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            uint64_t affected = 0;
            if (!payload_is_large(it) || it->result != PROTO_SUBMIT_INSERTED)
                continue;
            dsp_strbuf_reset(&x->sql);
            dsp_strbuf_printf(&x->sql, "UPDATE %s FORCE INDEX (PRIMARY) SET payload = ?",
                              x->db->names.task);
            dsp_strbuf_put_u64(&x->sql, " WHERE task_id = ", it->task_id);
            if (x->sql.oom ||
                dsp_dbi_exec_blob(&x->c, x->sql.p, x->sql.len, it->payload, it->payload_len, &affected) < 0)
                return -1;
            if (affected != 1) {
                log_error(x->db->log, "submit: the payload of task %" PRIu64 " found no row", it->task_id);
                return -1;
            }
        }
    }
    return 0;
}

/* Looks up the keys of the items not inserted (duplicates). Returns 0 or -1. */
static int lookup_duplicates(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    size_t limit = x->c.stmt_limit, nkeys = 0;

    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (it->key_len == 0 || krow_find(x->keyed, x->nkeyed, it->key, it->key_len))
                continue;
            if (nkeys > 0 && x->sql.len + 2 * it->key_len + 8 > limit) {
                dsp_strbuf_puts(&x->sql, ")");
                if (x->sql.oom || run_key_query(x, &x->found, &x->nfound, &x->found_cap) < 0)
                    return -1;
                dsp_strbuf_reset(&x->sql);
                nkeys = 0;
            }
            if (nkeys)
                dsp_strbuf_puts(&x->sql, ",");
            else
                dsp_strbuf_printf(&x->sql, "SELECT task_id, dedup_key FROM %s WHERE dedup_key IN (",
                                  x->db->names.task);
            dsp_strbuf_put_hex(&x->sql, it->key, it->key_len, false);
            nkeys++;
        }
    }
    if (nkeys > 0) {
        dsp_strbuf_puts(&x->sql, ")");
        if (x->sql.oom || run_key_query(x, &x->found, &x->nfound, &x->found_cap) < 0)
            return -1;
    }
    if (x->nfound > 1)
        qsort(x->found, x->nfound, sizeof *x->found, krow_cmp);
    return 0;
}

/* Gives each item its result from what the statements returned. Returns 0, or -1
 * when the rows returned do not match the items (then nothing is committed). */
static int match_results(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    size_t next_plain = 0;

    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            dsp_submit_item *it = &reqs[r]->items[i];
            struct krow *k;
            if (it->key_len == 0) {
                if (next_plain >= x->nplain)
                    return -1;
                it->result = PROTO_SUBMIT_INSERTED;
                it->task_id = x->plain[next_plain++];
            } else if ((k = krow_find(x->keyed, x->nkeyed, it->key, it->key_len)) != NULL) {
                /* The first task with this key inserted it; the others are duplicates of it. */
                it->result = k->used ? PROTO_SUBMIT_DUPLICATE : PROTO_SUBMIT_INSERTED;
                it->task_id = k->id;
                k->used = true;
            } else {
                k = krow_find(x->found, x->nfound, it->key, it->key_len);
                it->result = PROTO_SUBMIT_DUPLICATE;
                it->task_id = k ? k->id : 0; /* gone meanwhile (retention): unknown */
            }
        }
    }
    return next_plain == x->nplain ? 0 : -1;
}

/* MariaDB, a batch that batch_fits_autocommit: one INSERT ... RETURNING task_id on the
 * session in autocommit, so the statement is the transaction (one statement a batch,
 * not INSERT and COMMIT). Plain INSERT, not IGNORE: with no dedup_key nothing is to be
 * skipped, and any error fails the whole statement, nothing inserted. The ids come from
 * RETURNING as in the transaction (ascending, in the order of the VALUES), never from
 * LAST_INSERT_ID() arithmetic: innodb_autoinc_lock_mode 2 or an auto_increment_increment
 * above 1 (Galera) would break that. Returns 0 (committed, every item answered), -1
 * (nothing committed) or -2 (committed, but the rows returned do not match the items:
 * cannot happen with a plain INSERT; logged). */
static int insert_autocommit(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq, int64_t now)
{
    size_t rows = 0;

    krows_clear(x->keyed, &x->nkeyed);
    krows_clear(x->found, &x->nfound);
    x->nplain = 0;
    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            /* x->insert_head without " IGNORE" (INSERT_HEAD_FMT starts "INSERT IGNORE "). */
            if (rows == 0) {
                dsp_strbuf_puts(&x->sql, "INSERT");
                dsp_strbuf_puts(&x->sql, x->insert_head + strlen("INSERT IGNORE"));
            } else {
                dsp_strbuf_puts(&x->sql, ",");
            }
            put_row(&x->sql, it, now);
            if (it->group_key_len)
                atomic_fetch_add_explicit(&x->db->keyed_submits, 1, memory_order_relaxed);
            rows++;
        }
    }
    dsp_strbuf_puts(&x->sql, INSERT_TAIL);
    if (x->sql.oom || run_insert(x) < 0)
        return -1;
    if (x->nplain > 1)
        qsort(x->plain, x->nplain, sizeof *x->plain, u64_cmp);
    if (x->nkeyed != 0 || x->nplain != rows || match_results(x, reqs, nreq) < 0) {
        log_error(x->db->log, "submit: an autocommit INSERT of %zu rows returned %zu ids; the rows are"
                  " committed but cannot be matched to their tasks", rows, x->nplain + x->nkeyed);
        return -2;
    }
    return 0;
}

/* MariaDB: INSERT IGNORE ... RETURNING, then the duplicates' ids. Returns 0 or -1. */
static int insert_mariadb(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq, int64_t now)
{
    krows_clear(x->keyed, &x->nkeyed);
    krows_clear(x->found, &x->nfound);
    x->nplain = 0;
    if (insert_all(x, reqs, nreq, now) < 0)
        return -1;
    if (x->nkeyed > 1)
        qsort(x->keyed, x->nkeyed, sizeof *x->keyed, krow_cmp);
    if (x->nplain > 1)
        qsort(x->plain, x->nplain, sizeof *x->plain, u64_cmp);
    if (lookup_duplicates(x, reqs, nreq) < 0)
        return -1;
    if (match_results(x, reqs, nreq) < 0) {
        log_error(x->db->log, "submit: the rows inserted do not match the submissions; rolled back");
        return -1;
    }
    return 0;
}

/* ---- MySQL's dialect: no RETURNING (the steps are in the comment at the top) ---- */

/* With the table's name (--table). */
static const char MYSQL_LOOKUP_HEAD_FMT[] = "SELECT task_id, dedup_key FROM %s WHERE dedup_key IN (";
static const char MYSQL_LOCK_TAIL[] = ") LOCK IN SHARE MODE";

/* xorshift64*: the provisional keys' random part, new at each run. */
static uint64_t next_tag(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* The provisional key of the n-th task of the batch without a key of its own. */
static size_t pending_key(const struct sub_ctx *x, size_t n, char *out, size_t cap)
{
    int len = snprintf(out, cap, "taskpush:pending:%016" PRIx64 ":%zu", x->pending_tag, n);
    return len < 0 ? 0 : (size_t)len < cap ? (size_t)len : cap - 1;
}

/* Adds one key to the lookup being built in x->sql, sending it first when the key would
 * not fit (tail: what ends the statement). Returns 0 or -1. */
static int lookup_add(struct sub_ctx *x, const uint8_t *key, size_t len, size_t *nkeys, const char *tail,
                      struct krow **rows, size_t *n, size_t *cap)
{
    if (*nkeys > 0 && x->sql.len + 2 * len + 32 + strlen(tail) > x->c.stmt_limit) {
        dsp_strbuf_puts(&x->sql, tail);
        if (x->sql.oom || run_key_query(x, rows, n, cap) < 0)
            return -1;
        dsp_strbuf_reset(&x->sql);
        *nkeys = 0;
    }
    if (*nkeys)
        dsp_strbuf_puts(&x->sql, ",");
    else
        dsp_strbuf_printf(&x->sql, MYSQL_LOOKUP_HEAD_FMT, x->db->names.task);
    dsp_strbuf_put_hex(&x->sql, key, len, false);
    (*nkeys)++;
    return 0;
}

static int lookup_end(struct sub_ctx *x, size_t nkeys, const char *tail, struct krow **rows, size_t *n,
                      size_t *cap)
{
    if (nkeys > 0) {
        dsp_strbuf_puts(&x->sql, tail);
        if (x->sql.oom || run_key_query(x, rows, n, cap) < 0)
            return -1;
    }
    if (*n > 1)
        qsort(*rows, *n, sizeof **rows, krow_cmp);
    return 0;
}

/* Sends the INSERT in x->sql and adds its affected rows to *affected. */
static int run_plain_insert(struct sub_ctx *x, uint64_t *affected)
{
    uint64_t a = 0;

    if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &a) < 0)
        return -1;
    *affected += a;
    return 0;
}

/* One run of steps 1 to 5. Returns 0 (every item answered), 1 (a key appeared meanwhile:
 * roll back and run again) or -1. */
static int insert_mysql_once(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq, int64_t now)
{
    size_t nkeys = 0, sent = 0, rows = 0, npending = 0;
    uint64_t affected = 0;
    char pk[64];

    krows_clear(x->keyed, &x->nkeyed);
    krows_clear(x->found, &x->nfound);
    x->pending_tag = next_tag(&x->c.rng);

    /* 1. The keys already present, locked. */
    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++)
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (it->key_len > 0 &&
                lookup_add(x, it->key, it->key_len, &nkeys, MYSQL_LOCK_TAIL, &x->found, &x->nfound,
                           &x->found_cap) < 0)
                return -1;
        }
    if (lookup_end(x, nkeys, MYSQL_LOCK_TAIL, &x->found, &x->nfound, &x->found_cap) < 0)
        return -1;

    /* 2. Every other task, each key once (x->keyed collects the keys sent, ids unknown). */
    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            dsp_submit_item it = reqs[r]->items[i];
            if (it.key_len > 0) {
                if (krow_find(x->found, x->nfound, it.key, it.key_len))
                    continue; /* a key twice in the batch goes twice: IGNORE skips the second */
            } else {
                it.key = (const uint8_t *)pk;
                it.key_len = pending_key(x, npending++, pk, sizeof pk);
            }
            if (krow_push(&x->keyed, &x->nkeyed, &x->keyed_cap, (const char *)it.key, it.key_len, 0) < 0)
                return -1;
            if (rows > 0 && x->sql.len + row_cost(&it) > x->c.stmt_limit) {
                if (run_plain_insert(x, &affected) < 0)
                    return -1;
                dsp_strbuf_reset(&x->sql);
                rows = 0;
            }
            dsp_strbuf_puts(&x->sql, rows ? "," : x->insert_head);
            put_row(&x->sql, &it, now);
            if (it.group_key_len)
                atomic_fetch_add_explicit(&x->db->keyed_submits, 1, memory_order_relaxed);
            rows++;
        }
    }
    if (rows > 0 && run_plain_insert(x, &affected) < 0)
        return -1;
    if (x->nkeyed > 1)
        qsort(x->keyed, x->nkeyed, sizeof *x->keyed, krow_cmp);
    sent = 0; /* the distinct keys sent */
    for (size_t k = 0; k < x->nkeyed; k++)
        sent += k == 0 || krow_cmp(&x->keyed[k - 1], &x->keyed[k]) != 0;

    /* 3. Every distinct key sent went in, or another producer's row took one of them. */
    if (affected != sent) {
        log_info(x->db->log, "submit: %" PRIu64 " of %zu rows went in (a key was inserted meanwhile by"
                 " another producer); the batch is rolled back and run again", affected, sent);
        return 1;
    }

    /* 4. The ids of the rows inserted. */
    struct krow *ids = NULL;
    size_t nids = 0, ids_cap = 0;
    int rc = 0;
    nkeys = 0;
    dsp_strbuf_reset(&x->sql);
    for (size_t k = 0; k < x->nkeyed && rc == 0; k++)
        if (k == 0 || krow_cmp(&x->keyed[k - 1], &x->keyed[k]) != 0)
            rc = lookup_add(x, x->keyed[k].key, x->keyed[k].len, &nkeys, ")", &ids, &nids, &ids_cap);
    if (rc == 0)
        rc = lookup_end(x, nkeys, ")", &ids, &nids, &ids_cap);
    if (rc == 0 && nids != sent) {
        log_error(x->db->log, "submit: %zu of the %zu rows inserted were found again; rolled back", nids, sent);
        rc = -1;
    }
    krows_clear(x->keyed, &x->nkeyed);
    if (rc == 0) { /* x->keyed takes the ids, sorted by key */
        struct krow *t = x->keyed;
        size_t tc = x->keyed_cap;
        x->keyed = ids;
        x->nkeyed = nids;
        x->keyed_cap = ids_cap;
        ids = t;
        ids_cap = tc;
        nids = 0;
    }
    krows_clear(ids, &nids);
    free(ids);
    if (rc < 0)
        return -1;

    /* The answers; then 5., the provisional keys back to NULL. */
    size_t npend = 0, nclear = 0;
    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            dsp_submit_item *it = &reqs[r]->items[i];
            struct krow *k;
            if (it->key_len == 0) {
                size_t len = pending_key(x, npend++, pk, sizeof pk);
                if ((k = krow_find(x->keyed, x->nkeyed, (const uint8_t *)pk, len)) == NULL)
                    return -1;
                it->result = PROTO_SUBMIT_INSERTED;
                it->task_id = k->id;
                if (nclear++ == 0)
                    dsp_strbuf_printf(&x->sql, "UPDATE %s SET dedup_key = NULL WHERE task_id IN (",
                                      x->db->names.task);
                dsp_strbuf_put_u64(&x->sql, nclear > 1 ? ", " : "", k->id);
            } else if ((k = krow_find(x->found, x->nfound, it->key, it->key_len)) != NULL) {
                it->result = PROTO_SUBMIT_DUPLICATE;
                it->task_id = k->id;
            } else if ((k = krow_find(x->keyed, x->nkeyed, it->key, it->key_len)) != NULL) {
                /* The first task with this key inserted it; the others are duplicates of it. */
                it->result = k->used ? PROTO_SUBMIT_DUPLICATE : PROTO_SUBMIT_INSERTED;
                it->task_id = k->id;
                k->used = true;
            } else {
                return -1;
            }
        }
    }
    if (nclear > 0) {
        uint64_t cleared = 0;
        dsp_strbuf_puts(&x->sql, ")");
        if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, &cleared) < 0)
            return -1;
        if (cleared != nclear) {
            log_error(x->db->log, "submit: %" PRIu64 " of %zu provisional keys cleared; rolled back", cleared,
                      nclear);
            return -1;
        }
    }
    return 0;
}

/* MySQL: insert_mysql_once, run again (after a rollback) while another producer's insert
 * of one of the batch's keys disturbed it. Returns 0 or -1. */
static int insert_mysql(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq, int64_t now)
{
    for (int t = 0; t < MYSQL_BATCH_TRIES; t++) {
        int rc = insert_mysql_once(x, reqs, nreq, now);
        if (rc <= 0)
            return rc;
        if (mysql_rollback(x->c.m) != 0) {
            x->c.err = mysql_errno(x->c.m);
            return -1;
        }
    }
    log_warn(x->db->log, "submit: the batch's keys kept appearing meanwhile (%d runs); answered UNAVAILABLE",
             MYSQL_BATCH_TRIES);
    return -1;
}

/* Registers the waiters of the WAIT requests (before COMMIT, so that no outcome can
 * be written before its waiter exists). Returns 0 or -1. */
static int add_waiters(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    struct dsp_submitter *s = x->db->sub;
    int rc = 0;

    pthread_mutex_lock(&s->mu);
    for (size_t r = 0; r < nreq && rc == 0; r++)
        for (size_t i = 0; reqs[r] && reqs[r]->wait && i < reqs[r]->nitems && rc == 0; i++)
            if (reqs[r]->items[i].result == PROTO_SUBMIT_INSERTED)
                rc = waiter_add(s, reqs[r]->items[i].task_id, reqs[r]->conn_id, reqs[r]->request_id);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void drop_waiters(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    struct dsp_submitter *s = x->db->sub;

    pthread_mutex_lock(&s->mu);
    for (size_t r = 0; r < nreq; r++)
        for (size_t i = 0; reqs[r] && reqs[r]->wait && i < reqs[r]->nitems; i++)
            free(waiter_take(s, reqs[r]->items[i].task_id));
    pthread_mutex_unlock(&s->mu);
}

/* Opens the connection when it is down and its backoff has passed. Returns 0 or -1. */
static int ensure_conn(struct sub_ctx *x)
{
    if (dsp_dbi_conn_stale(&x->c))
        dsp_dbi_conn_close(&x->c); /* off to the server in use */
    if (x->c.m != NULL)
        return 0;
    if (dsp_now_ms() < x->next_connect)
        return -1;
    if (dsp_dbi_conn_open(&x->c, false, true) < 0) {
        x->next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&x->c);
        return -1;
    }
    x->autocommit = false;
    return 0;
}

/* Sets the session's autocommit when it is not already so (a statement, "SET
 * autocommit=N", only when a batch of the other path comes). Returns 0 or -1. */
static int set_autocommit(struct sub_ctx *x, bool on)
{
    if (x->autocommit == on)
        return 0;
    atomic_fetch_add_explicit(&x->db->statements, 1, memory_order_relaxed);
    if (mysql_autocommit(x->c.m, on) != 0) {
        x->c.err = mysql_errno(x->c.m);
        log_warn(x->db->log, "submit connection: %s (error %u)", mysql_error(x->c.m), x->c.err);
        return -1;
    }
    x->autocommit = on;
    return 0;
}

/* Whether the live requests of the batch may go in as ONE autocommit INSERT ... RETURNING
 * (MariaDB): no dedup_key (a duplicate's id is read in the same transaction, under the
 * lock INSERT IGNORE took on it), no dependency (checked and inserted with the rows), no
 * OUTCOME wait (its waiter is registered before the rows can be seen), no payload set by
 * an UPDATE of its own, and every row in one statement (two autocommit statements
 * would make a batch half committed). MySQL's dialect has no RETURNING: always the
 * transaction. So on a Galera node: an autocommit statement that fails certification
 * may be run again by the server (wsrep_retry_autocommit) after its RETURNING rows went
 * out, which nobody checked here; a transaction's failed COMMIT is a plain rollback. */
static bool batch_fits_autocommit(const struct sub_ctx *x, dsp_submit_req *const *reqs, size_t nreq)
{
    size_t len = INSERT_FIXED;

    if (x->c.mysql || x->c.galera)
        return false;
    for (size_t r = 0; r < nreq; r++) {
        if (reqs[r] == NULL)
            continue;
        if (reqs[r]->wait)
            return false;
        for (size_t i = 0; i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (it->key_len > 0 || it->nafter > 0 || payload_is_large(it))
                return false;
            len += row_cost(it);
        }
    }
    return len <= x->c.stmt_limit;
}

static uint64_t after_id(const dsp_submit_item *it, size_t k)
{
    const uint8_t *p = it->after + k * 8;
    uint64_t v = 0;
    for (int b = 0; b < 8; b++)
        v = (v << 8) | p[b];
    return v;
}

static int id_cmp(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a < b ? -1 : a > b;
}

/* Whether every task q's items wait for exists: 0 yes, 1 no (why set: the first
 * missing one), -1 a database error. A new task's own id does not exist before it is
 * inserted, so a task naming itself is refused here too. */
static int check_parents(struct sub_ctx *x, const dsp_submit_req *q, char *why, size_t cap)
{
    size_t n = 0, k = 0, nfound = 0;
    uint64_t *ids, *found;
    int rc = -1;

    for (size_t i = 0; i < q->nitems; i++)
        n += q->items[i].nafter;
    if (n == 0)
        return 0;
    ids = malloc(n * sizeof *ids);
    found = malloc(n * sizeof *found);
    if (ids == NULL || found == NULL)
        goto done;
    for (size_t i = 0; i < q->nitems; i++)
        for (size_t j = 0; j < q->items[i].nafter; j++)
            ids[k++] = after_id(&q->items[i], j);
    qsort(ids, n, sizeof *ids, id_cmp);
    k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || ids[i] != ids[k - 1])
            ids[k++] = ids[i];
    for (size_t s = 0; s < k; s += 1000) {
        size_t m = k - s < 1000 ? k - s : 1000;
        MYSQL_RES *res;
        MYSQL_ROW row;
        dsp_strbuf_reset(&x->sql);
        dsp_strbuf_printf(&x->sql, "SELECT task_id FROM %s WHERE task_id IN (", x->db->names.task);
        for (size_t i = 0; i < m; i++)
            dsp_strbuf_put_u64(&x->sql, i ? "," : "", ids[s + i]);
        dsp_strbuf_puts(&x->sql, ")");
        atomic_fetch_add_explicit(&x->db->statements, 1, memory_order_relaxed);
        if (x->sql.oom || mysql_real_query(x->c.m, x->sql.p, (unsigned long)x->sql.len) != 0 ||
            (res = mysql_store_result(x->c.m)) == NULL) {
            x->c.err = x->sql.oom ? 0 : mysql_errno(x->c.m);
            goto done;
        }
        while ((row = mysql_fetch_row(res)) != NULL && nfound < n)
            if (row[0])
                found[nfound++] = strtoull(row[0], NULL, 10);
        mysql_free_result(res);
    }
    qsort(found, nfound, sizeof *found, id_cmp);
    rc = 0;
    for (size_t i = 0; i < q->nitems && rc == 0; i++)
        for (size_t j = 0; j < q->items[i].nafter; j++) {
            uint64_t id = after_id(&q->items[i], j);
            if (nfound == 0 || bsearch(&id, found, nfound, sizeof *found, id_cmp) == NULL) {
                snprintf(why, cap, "task %zu: waits for task %" PRIu64 ", which does not exist", i, id);
                rc = 1;
                break;
            }
        }
done:
    free(ids);
    free(found);
    return rc;
}

/* Inserts the dependency rows of the inserted items that wait (before COMMIT: the
 * task and its rows become visible together). 0 or -1. */
static int insert_deps(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    size_t rows = 0;

    dsp_strbuf_reset(&x->sql);
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (it->nafter == 0 || it->result != PROTO_SUBMIT_INSERTED)
                continue;
            for (size_t j = 0; j < it->nafter; j++) {
                if (rows == 0)
                    dsp_strbuf_printf(&x->sql, "INSERT IGNORE INTO %s (task_id, parent_id) VALUES ",
                                      x->db->names.dep);
                dsp_strbuf_put_u64(&x->sql, rows ? ",(" : "(", it->task_id);
                dsp_strbuf_put_u64(&x->sql, ",", after_id(it, j));
                dsp_strbuf_puts(&x->sql, ")");
                if (++rows == 5000) {
                    if (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, NULL) < 0)
                        return -1;
                    dsp_strbuf_reset(&x->sql);
                    rows = 0;
                }
            }
        }
    }
    if (rows > 0 && (x->sql.oom || dsp_dbi_exec(&x->c, x->sql.p, x->sql.len, NULL) < 0))
        return -1;
    return 0;
}

/* After COMMIT: the waiting tasks just inserted whose dependencies all ended already
 * (the parents' writes found no dependant then) are settled now. */
static void settle_waiting(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;

    for (size_t r = 0; r < nreq; r++)
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (it->nafter == 0 || it->result != PROTO_SUBMIT_INSERTED)
                continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                uint64_t *p = realloc(ids, nc * sizeof *p);
                if (p == NULL)
                    goto done; /* the sweep settles them */
                ids = p;
                cap = nc;
            }
            ids[n++] = it->task_id;
        }
    if (n == 0)
        goto done;
    atomic_store(&x->db->deps_seen, true);
    dsp_dbi_deps_rows_exist(x->db);
    for (unsigned tries = 1;; tries++) {
        x->c.err = 0;
        if (dsp_dbi_deps_settle(x->db, &x->c, &x->sql, ids, n) == 0 && dsp_dbi_exec_str(&x->c, "COMMIT") == 0)
            break;
        /* A deadlock or Galera's certification undid the transaction: it runs again whole
         * (its writes are guarded). A lock wait timeout came after a long wait: the sweep. */
        if (x->c.m && x->c.err == ER_LOCK_DEADLOCK_ && tries < DSP_DBI_CONFLICT_TRIES &&
            dsp_dbi_conflict_retry(&x->c, tries) == 0)
            continue;
        log_warn(x->db->log, "submit: settling %zu waiting task(s) failed; the sweep does it", n);
        if (x->c.m && mysql_rollback(x->c.m) != 0)
            dsp_dbi_conn_close(&x->c);
        break;
    }
done:
    free(ids);
}

/* Inserts the batch reqs[0..nreq) in one transaction and fills every answer. */
static void run_batch(struct sub_ctx *x, dsp_submit_req **reqs, size_t nreq)
{
    dsp_db *db = x->db;
    const char *why = NULL;
    size_t live = 0, inserted = 0, dups = 0;
    int64_t now = dsp_wall_ms(), due = INT64_MAX;

    if (!atomic_load(&db->leader))
        why = "this dispatcher does not lead the table; try another or again later";
    else if (ensure_conn(x) < 0)
        why = "the database cannot be reached; try again later";
    for (size_t r = 0; r < nreq; r++) {
        dsp_submit_req *q = reqs[r];
        q->status = PROTO_SUBMIT_OK;
        if (why) {
            answer(q, PROTO_SUBMIT_UNAVAILABLE, why);
            reqs[r] = NULL;
            continue;
        }
        for (size_t i = 0; i < q->nitems; i++) {
            char text[160];
            if (q->items[i].payload_len > payload_cap(&x->c)) {
                snprintf(text, sizeof text,
                         "task %zu: payload of %zu bytes exceeds the database's max_allowed_packet of %zu", i,
                         q->items[i].payload_len, payload_cap(&x->c));
                answer(q, PROTO_SUBMIT_INVALID, text);
                reqs[r] = NULL;
                break;
            }
            if (INSERT_FIXED + row_cost(&q->items[i]) > x->c.stmt_limit) {
                snprintf(text, sizeof text, "task %zu is larger than the database accepts (max_allowed_packet)", i);
                answer(q, PROTO_SUBMIT_INVALID, text);
                reqs[r] = NULL;
                break;
            }
        }
        if (reqs[r]) {
            char text[160];
            int pc = check_parents(x, q, text, sizeof text);
            if (pc != 0) {
                answer(q, pc > 0 ? PROTO_SUBMIT_INVALID : PROTO_SUBMIT_UNAVAILABLE,
                       pc > 0 ? text : "the database refused the dependency check; nothing was committed");
                reqs[r] = NULL;
            }
        }
        live += reqs[r] != NULL;
    }
    if (live == 0)
        goto answers;
    if (batch_fits_autocommit(x, reqs, nreq)) {
        int rc = set_autocommit(x, true) < 0 ? -1 : insert_autocommit(x, reqs, nreq, now);
        if (rc == -1)
            goto failed;
        if (rc == -2) {
            for (size_t r = 0; r < nreq; r++)
                if (reqs[r])
                    answer(reqs[r], PROTO_SUBMIT_UNAVAILABLE,
                           "the database's answer to the insert did not match the tasks sent;"
                           " the tasks may have been committed");
            goto answers;
        }
        atomic_fetch_add_explicit(&db->submit_autocommit_batches, 1, memory_order_relaxed);
        goto committed;
    }
    if (set_autocommit(x, false) < 0)
        goto failed;
    if ((x->c.mysql ? insert_mysql(x, reqs, nreq, now) : insert_mariadb(x, reqs, nreq, now)) < 0)
        goto failed;
    if (set_large_payloads(x, reqs, nreq) < 0 || insert_deps(x, reqs, nreq) < 0)
        goto failed;
    if (add_waiters(x, reqs, nreq) < 0) {
        drop_waiters(x, reqs, nreq);
        goto failed;
    }
    if (dsp_dbi_exec_str(&x->c, "COMMIT") < 0) {
        drop_waiters(x, reqs, nreq);
        goto failed;
    }
committed:
    for (size_t r = 0; r < nreq; r++) {
        for (size_t i = 0; reqs[r] && i < reqs[r]->nitems; i++) {
            const dsp_submit_item *it = &reqs[r]->items[i];
            if (it->result == PROTO_SUBMIT_INSERTED) {
                inserted++;
                if (it->nafter == 0 && it->delay_ms > 0 && now + (int64_t)it->delay_ms < due)
                    due = now + (int64_t)it->delay_ms;
            } else {
                dups++;
            }
        }
    }
    atomic_fetch_add_explicit(&db->submitted_rows, inserted, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->submit_duplicates, dups, memory_order_relaxed);
    atomic_fetch_add_explicit(&db->submit_batches, 1, memory_order_relaxed);
    if (due != INT64_MAX) {
        /* Rows in the delayed lane: the claim thread promotes them when due. */
        pthread_mutex_lock(&db->mu);
        if (due < db->retry_due_ms) {
            db->retry_due_ms = due;
            pthread_cond_signal(&db->claim_cv);
        }
        pthread_mutex_unlock(&db->mu);
    }
    settle_waiting(x, reqs, nreq);
    goto answers;
failed:
    if (x->c.m != NULL && mysql_rollback(x->c.m) != 0) {
        dsp_dbi_conn_close(&x->c);
        x->next_connect = dsp_now_ms() + dsp_dbi_backoff_next(&x->c);
    } else if (x->c.m != NULL && dsp_dbi_error_is_transient(x->c.err) &&
               !dsp_dbi_error_is_conflict(x->c.err)) {
        dsp_dbi_conn_close(&x->c); /* a conflict rolled back leaves the connection fine */
    }
    for (size_t r = 0; r < nreq; r++)
        if (reqs[r])
            answer(reqs[r], PROTO_SUBMIT_UNAVAILABLE, "the database refused the insert; nothing was committed");
answers:
    return;
}

/* The gather: after a batch, the submit thread waits for the producers it just served
 * to come back before the next INSERT, when fewer are queued than the connections of the
 * last two batches (one-task producers that wait for each answer otherwise settle into
 * two cohorts, each batch half of them: twice the statements), but never longer than the
 * last batch's statement took (what the early half would have waited behind the other
 * half's statement anyway), nor GATHER_MAX_US. A lone producer (its connection the only
 * one) is never held: its next request reaches the count at once. */
#define GATHER_MAX_US 2000

static int u64_cmp_conn(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

/* Distinct values of ids[0..n) (sorts them). */
static size_t distinct_u64(uint64_t *ids, size_t n)
{
    size_t d = 0;
    qsort(ids, n, sizeof *ids, u64_cmp_conn);
    for (size_t i = 0; i < n; i++)
        d += i == 0 || ids[i] != ids[i - 1];
    return d;
}

static void cond_wait_until_us(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_us)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(until_us / 1000000);
    ts.tv_nsec = (long)(until_us % 1000000) * 1000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static void *submit_main(void *arg)
{
    dsp_db *db = arg;
    struct dsp_submitter *s = db->sub;
    struct sub_ctx x;
    dsp_submit_req *batch[SUBMIT_BATCH_ROWS];
    dsp_submit_req *all[SUBMIT_BATCH_ROWS];
    /* The gather's memory: the connections of the last two batches, and the last's time. */
    uint64_t conns[2 * SUBMIT_BATCH_ROWS];
    size_t nprev = 0, want = 0;
    int64_t last_us = 0;

    memset(&x, 0, sizeof x);
    x.db = db;
    snprintf(x.insert_head, sizeof x.insert_head, INSERT_HEAD_FMT, db->names.task);
    x.c.db = db;
    x.c.who = "submit";
    x.c.rng = (uint64_t)dsp_now_us() * 0x94D049BB133111EBULL ^ (uint64_t)(uintptr_t)&x;
    if (x.c.rng == 0)
        x.c.rng = 1;
    mysql_thread_init();
    pthread_mutex_lock(&s->mu);
    for (;;) {
        size_t n = 0, rows = 0;
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop)
            break;
        if (s->nqueued < want && last_us > 0) {
            int64_t g0 = dsp_now_us(), until = g0 + (last_us < GATHER_MAX_US ? last_us : GATHER_MAX_US);
            s->gather_want = want;
            while (!s->stop && s->nqueued < want && dsp_now_us() < until)
                cond_wait_until_us(&s->cv, &s->mu, until);
            s->gather_want = 0;
            atomic_fetch_add_explicit(&db->submit_gather_us_total, (uint64_t)(dsp_now_us() - g0),
                                      memory_order_relaxed);
            if (s->stop)
                break;
        }
        while (s->head && n < SUBMIT_BATCH_ROWS && (n == 0 || rows + s->head->nitems <= SUBMIT_BATCH_ROWS)) {
            dsp_submit_req *r = s->head;
            s->head = r->next;
            if (s->head == NULL)
                s->tail = &s->head;
            s->nqueued--;
            rows += r->nitems;
            batch[n] = all[n] = r;
            n++;
        }
        pthread_mutex_unlock(&s->mu);
        /* This batch's connections after the last's: the union is the next count. */
        for (size_t i = 0; i < n; i++)
            conns[nprev + i] = all[i]->conn_id;
        int64_t t0 = dsp_now_us();
        run_batch(&x, batch, n);
        last_us = dsp_now_us() - t0;
        atomic_fetch_add_explicit(&db->submit_us_total, (uint64_t)last_us, memory_order_relaxed);
        want = distinct_u64(conns, nprev + n);
        for (size_t i = 0; i < n; i++)
            conns[i] = all[i]->conn_id;
        nprev = n;
        for (size_t i = 0; i < n; i++)
            post_answer(db, all[i]);
        pthread_mutex_lock(&s->mu);
    }
    while (s->head) {
        dsp_submit_req *r = s->head;
        s->head = r->next;
        s->nqueued--;
        answer(r, PROTO_SUBMIT_UNAVAILABLE, "the dispatcher is shutting down");
        post_answer(db, r);
    }
    s->tail = &s->head;
    pthread_mutex_unlock(&s->mu);
    dsp_dbi_conn_close(&x.c);
    krows_clear(x.keyed, &x.nkeyed);
    krows_clear(x.found, &x.nfound);
    free(x.keyed);
    free(x.found);
    free(x.plain);
    dsp_strbuf_free(&x.sql);
    mysql_thread_end();
    return NULL;
}

int dsp_dbi_submit_start(dsp_db *db)
{
    struct dsp_submitter *s = calloc(1, sizeof *s);

    if (s == NULL)
        return -1;
    s->tail = &s->head;
    atomic_init(&s->nwaiters_hint, 0);
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return -1;
    }
    /* The gather's deadline is on the monotonic clock (dsp_now_us). */
    pthread_condattr_t ca;
    int cv_rc = pthread_condattr_init(&ca);
    if (cv_rc == 0) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        cv_rc = pthread_cond_init(&s->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (cv_rc != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return -1;
    }
    db->sub = s;
    if (pthread_create(&s->thr, NULL, submit_main, db) != 0)
        return -1;
    s->thread_ok = true;
    return 0;
}

void dsp_dbi_submit_stop(dsp_db *db)
{
    struct dsp_submitter *s = db->sub;

    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_ok)
        pthread_join(s->thr, NULL);
    s->thread_ok = false;
}

void dsp_dbi_submit_free(dsp_db *db)
{
    struct dsp_submitter *s = db->sub;

    if (s == NULL)
        return;
    dsp_dbi_submit_stop(db);
    while (s->head) {
        dsp_submit_req *r = s->head;
        s->head = r->next;
        dsp_submit_req_free(r);
    }
    for (size_t i = 0; i < s->nbuckets; i++)
        for (struct waiter *w = s->buckets[i], *next; w; w = next) {
            next = w->next;
            free(w);
        }
    free(s->buckets);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    db->sub = NULL;
}
