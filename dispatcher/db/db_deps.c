/* db_deps: task dependencies (schema version 10; docs/producers.md, "Dependencies").
 *
 * A waiting task is a NEW row with `delayed` = 2, which neither the claim (`delayed` = 0)
 * nor the promote sweep (`delayed` = 1) reads: waiting costs no claim anything, however
 * many tasks wait or on how many each waits. Its rows in the dependency table (NAME_dep,
 * primary key (task_id, parent_id)) name the tasks it waits for; they are never written
 * again, only deleted once the task itself is gone (retention), so a parent's success
 * costs no write per dependency.
 *
 * Whether a waiting task can run is one probe: its first dependency, in parent_id order,
 * that is not SUCCESSFUL (check_children: one UNION ALL of "ORDER BY parent_id LIMIT 1"
 * parts). None: released (`delayed` = 0). Missing or FAILED: the task ends FAILED. Else it
 * waits, and the probe's start for that task moves to that parent (struct
 * dsp_deps_progress, in memory): SUCCESSFUL is final, so what lies before it is never read
 * again. A fan-in of F parents finishing one by one then costs O(F) reads in all, not
 * O(F^2).
 *
 * Three callers, each on its own database thread and connection:
 *   - the write thread, after each batch of outcomes (dsp_dbi_deps_parents_ended): the
 *     waiting dependants of the rows it wrote SUCCESSFUL are probed; those of the rows it
 *     wrote FAILED end FAILED ("dependency N failed"), and theirs in turn,
 *     DEPS_FAIL_LEVELS levels at once (the sweep goes on past that);
 *   - the submit thread, after committing tasks that wait (dsp_dbi_deps_settle): a
 *     parent may have ended before the COMMIT;
 *   - the stats thread of the leader, every DSP_DEPS_SWEEP_MS while tasks wait (none on
 *     a table without dependency rows: db_stats.c, stats_deps) (dsp_dbi_deps_sweep): a
 *     window of the waiting rows, probed as above, and their dependencies FAILED or
 *     missing (the first DEPS_SWEEP_FAIL_ROWS rows of the window), so what the two others
 *     cannot see is caught: rows a producer inserted by SQL, parents that ended meanwhile
 *     or another way (cancel, recovery, a claim with no attempt left), a parent that does
 *     not exist, and cycles: following each task's first unfinished parent from task to
 *     waiting task within the window (one statement: one consistent view) and coming back
 *     to one already passed means none of them can ever run; they end FAILED with err_msg
 *     "dependency cycle", and the tasks behind them "dependency N failed". Then the rows of
 *     tasks no longer in the table are deleted, a window at a time.
 * Every write is guarded by the row's state (task_state = 0 AND `delayed` = 2), so two
 * of them meeting on a row do no harm. Statements name at most DEPS_IDS ids.
 */
#include "db_internal.h"

#include "proto.h"

#include <mysql.h>

#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEPS_IDS 1000           /* ids one statement names at most */
#define DEPS_PROBES 200         /* tasks one probe statement covers */
#define DEPS_FAIL_LEVELS 64     /* levels of a failure's cascade followed at once */
#define DEPS_FAIL_ROWS 10000u   /* dependants one level of a cascade fails at most */
#define DEPS_SWEEP_FAIL_ROWS 20000u /* dependency rows a sweep reads for FAILED parents */
#define DEPS_SWEEP_FULL_EVERY 10 /* sweeps between two such reads (they read every row of
                                  * the window; the probes read from where they stopped) */
#define DEPS_CLEAN_TASKS 256u   /* tasks whose rows one sweep checks for deletion */
#define DEPS_DELETE_BATCH 5000u /* dependency rows one DELETE removes */
#define DEPS_DELETE_ROUNDS 20   /* DELETEs per sweep at most */
#define DEPS_PROGRESS_MAX 262144u /* probe starts kept; past it they are forgotten (re-read) */

/* A growable list of ids. */
struct idvec {
    uint64_t *v;
    size_t n, cap;
};

/* What a probe found for a waiting task: parent 0 when every dependency is SUCCESSFUL,
 * else its first one that is not, with that row's state (-1: no such task) and
 * `delayed`. */
struct probe {
    uint64_t child, parent;
    int pstate, pdelayed;
};

/* The probes' starts: task -> the parent_id its next probe starts at. Shared by the
 * write, submit and stats threads. */
struct dsp_deps_progress {
    pthread_mutex_t mu;
    dsp_taskmap m;
    bool ok;
};

int dsp_dbi_deps_init(dsp_db *db)
{
    struct dsp_deps_progress *p = calloc(1, sizeof *p);
    if (p == NULL || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return -1;
    }
    p->ok = dsp_taskmap_init(&p->m, 1024) == 0;
    db->deps = p;
    return 0;
}

void dsp_dbi_deps_free(dsp_db *db)
{
    struct dsp_deps_progress *p = db->deps;
    if (p == NULL)
        return;
    if (p->ok)
        dsp_taskmap_free(&p->m);
    pthread_mutex_destroy(&p->mu);
    free(p);
    db->deps = NULL;
}

void dsp_dbi_deps_rows_exist(dsp_db *db)
{
    atomic_fetch_add(&db->deps_marks, 1);
    pthread_mutex_lock(&db->mu);
    pthread_cond_signal(&db->stats_cv);
    pthread_mutex_unlock(&db->mu);
}

static uint64_t progress_get(dsp_db *db, uint64_t child)
{
    struct dsp_deps_progress *p = db->deps;
    uint64_t v = 0;
    if (p == NULL)
        return 0;
    pthread_mutex_lock(&p->mu);
    if (p->ok)
        v = (uint64_t)(uintptr_t)dsp_taskmap_get(&p->m, child);
    pthread_mutex_unlock(&p->mu);
    return v;
}

/* parent 0: forget the task (released or failed). */
static void progress_set(dsp_db *db, uint64_t child, uint64_t parent)
{
    struct dsp_deps_progress *p = db->deps;
    if (p == NULL || sizeof(uintptr_t) < sizeof(uint64_t))
        return;
    pthread_mutex_lock(&p->mu);
    if (p->ok && parent == 0) {
        (void)dsp_taskmap_del(&p->m, child);
    } else if (p->ok) {
        if (p->m.count >= DEPS_PROGRESS_MAX) {
            /* Bounded memory: start over; the probes read from the first parent again. */
            dsp_taskmap_free(&p->m);
            p->ok = dsp_taskmap_init(&p->m, 1024) == 0;
        }
        if (p->ok && dsp_taskmap_put(&p->m, child, (void *)(uintptr_t)parent) != 0)
            (void)dsp_taskmap_del(&p->m, child);
    }
    pthread_mutex_unlock(&p->mu);
}

static int idvec_push(struct idvec *x, uint64_t id)
{
    if (x->n == x->cap) {
        size_t nc = x->cap ? x->cap * 2 : 64;
        uint64_t *p = realloc(x->v, nc * sizeof *p);
        if (p == NULL)
            return -1;
        x->v = p;
        x->cap = nc;
    }
    x->v[x->n++] = id;
    return 0;
}

static int u64_cmp(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a < b ? -1 : a > b;
}

static void sort_unique(struct idvec *x)
{
    size_t k = 0;
    if (x->n < 2)
        return;
    qsort(x->v, x->n, sizeof *x->v, u64_cmp);
    for (size_t i = 0; i < x->n; i++)
        if (k == 0 || x->v[i] != x->v[k - 1])
            x->v[k++] = x->v[i];
    x->n = k;
}

static bool has_id(const struct idvec *x, uint64_t id)
{
    return x->n > 0 && bsearch(&id, x->v, x->n, sizeof *x->v, u64_cmp) != NULL;
}

static void put_ids(dsp_strbuf *b, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dsp_strbuf_put_u64(b, i ? "," : "", ids[i]);
}

static uint64_t field_u64(const char *v)
{
    return v ? strtoull(v, NULL, 10) : 0;
}

/* Every statement here runs alone (autocommit: the write and the stats thread) or in the
 * submit thread's transaction, which runs again whole: a conflict (Galera's
 * certification, a deadlock) is retried as the result writes are (db_conn.c). */
static MYSQL_RES *query(struct dbconn *c, const dsp_strbuf *sql)
{
    if (sql->oom) {
        c->err = 0;
        log_error(c->db->log, "out of memory building a dependency statement");
        return NULL;
    }
    return dsp_dbi_query_retry(c, sql->p, sql->len);
}

static int exec(struct dbconn *c, const dsp_strbuf *sql, uint64_t *affected)
{
    if (sql->oom) {
        c->err = 0;
        log_error(c->db->log, "out of memory building a dependency statement");
        return -1;
    }
    return dsp_dbi_exec_retry(c, sql->p, sql->len, affected);
}

/* Adds column 0 of every row of the query in sql to out. 0 or -1. */
static int query_ids(struct dbconn *c, const dsp_strbuf *sql, struct idvec *out)
{
    MYSQL_RES *res = query(c, sql);
    MYSQL_ROW row;
    int rc = 0;

    if (res == NULL)
        return -1;
    while (rc == 0 && (row = mysql_fetch_row(res)) != NULL)
        if (row[0])
            rc = idvec_push(out, field_u64(row[0]));
    mysql_free_result(res);
    return rc;
}

static void wake_claims(dsp_db *db)
{
    struct msg *m = dsp_dbi_msg_new(MSG_WAKE);
    if (m)
        dsp_dbi_post(db, m); /* rows 0: claim now */
}

/* Releases the waiting tasks ids (every dependency SUCCESSFUL): claimable from now on. */
static int release(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ids, size_t n)
{
    uint64_t total = 0;

    for (size_t s = 0; s < n; s += DEPS_IDS) {
        size_t k = n - s < DEPS_IDS ? n - s : DEPS_IDS;
        uint64_t affected = 0;
        dsp_strbuf_reset(sql);
        /* `delayed` 0 even when run_after is ahead: the demote sweep moves it then. */
        dsp_strbuf_printf(sql, "UPDATE %s SET `delayed` = 0 WHERE task_id IN (", db->names.task);
        put_ids(sql, ids + s, k);
        dsp_strbuf_puts(sql, ") AND task_state = 0 AND `delayed` = 2");
        if (exec(c, sql, &affected) < 0)
            return -1;
        total += affected;
    }
    for (size_t i = 0; i < n; i++)
        progress_set(db, ids[i], 0);
    if (total > 0) {
        atomic_fetch_add_explicit(&db->deps_released, total, memory_order_relaxed);
        wake_claims(db);
    }
    return 0;
}

/* One task to fail, and why. */
struct doomed {
    uint64_t id;
    uint64_t parent; /* 0: a cycle */
    bool missing;    /* the parent does not exist */
};

static int doomed_cmp(const void *pa, const void *pb)
{
    const struct doomed *a = pa, *b = pb;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Sorts v by id and keeps the first of each id; returns the new count. */
static size_t doomed_unique(struct doomed *v, size_t n)
{
    size_t k = 0;
    qsort(v, n, sizeof *v, doomed_cmp);
    for (size_t i = 0; i < n; i++)
        if (k == 0 || v[i].id != v[k - 1].id)
            v[k++] = v[i];
    return k;
}

/* The err_msg of d: plain ASCII, so it goes into a statement quoted as it is. */
static void reason(char *out, size_t cap, const struct doomed *d)
{
    if (d->parent == 0)
        snprintf(out, cap, "dependency cycle");
    else
        snprintf(out, cap, "dependency %" PRIu64 " %s", d->parent, d->missing ? "does not exist" : "failed");
}

/* Makes the waiting tasks of v FAILED with their reason; adds their ids to failed.
 * v is sorted and unique by id. */
static int fail_tasks(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const struct doomed *v, size_t n,
                      struct idvec *failed)
{
    int64_t now = dsp_wall_ms();
    uint64_t total = 0;

    for (size_t s = 0; s < n; s += DEPS_IDS) {
        size_t k = n - s < DEPS_IDS ? n - s : DEPS_IDS;
        uint64_t affected = 0;
        dsp_strbuf_reset(sql);
        dsp_strbuf_printf(sql,
                          "UPDATE %s SET task_state = 3, `delayed` = 0, last_update_time = %" PRId64
                          ", err_msg = CASE task_id",
                          db->names.task, now);
        for (size_t i = s; i < s + k; i++) {
            char text[64];
            reason(text, sizeof text, &v[i]);
            dsp_strbuf_put_u64(sql, " WHEN ", v[i].id);
            dsp_strbuf_printf(sql, " THEN '%s'", text);
        }
        dsp_strbuf_puts(sql, " END WHERE task_id IN (");
        for (size_t i = s; i < s + k; i++)
            dsp_strbuf_put_u64(sql, i > s ? "," : "", v[i].id);
        dsp_strbuf_puts(sql, ") AND task_state = 0 AND `delayed` = 2");
        if (exec(c, sql, &affected) < 0)
            return -1;
        total += affected;
    }
    atomic_fetch_add_explicit(&db->deps_failed, total, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        char text[64];
        progress_set(db, v[i].id, 0);
        if (idvec_push(failed, v[i].id) < 0)
            return -1;
        /* Waiting producers hear of it as of any other failure. */
        reason(text, sizeof text, &v[i]);
        dsp_dbi_submit_notify_failed(db, v[i].id, text);
    }
    return 0;
}

/* The waiting dependants of the FAILED tasks in frontier end FAILED, and theirs, at most
 * DEPS_FAIL_LEVELS levels (the sweep finds the rest). frontier is consumed. */
static int fail_cascade(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct idvec *frontier)
{
    struct idvec next = {0};
    struct doomed *v = NULL;
    size_t nv = 0, cap = 0;
    int rc = 0;

    for (int level = 0; rc == 0 && level < DEPS_FAIL_LEVELS && frontier->n > 0; level++) {
        sort_unique(frontier);
        nv = 0;
        for (size_t s = 0; rc == 0 && s < frontier->n && nv < DEPS_FAIL_ROWS; s += DEPS_IDS) {
            size_t k = frontier->n - s < DEPS_IDS ? frontier->n - s : DEPS_IDS;
            dsp_strbuf_reset(sql);
            /* The parent must be FAILED: a row of the frontier that another writer
             * released meanwhile fails nobody. */
            dsp_strbuf_printf(sql,
                              "SELECT d.task_id, MIN(d.parent_id) FROM %s d"
                              " JOIN %s c ON c.task_id = d.task_id AND c.task_state = 0 AND c.`delayed` = 2"
                              " JOIN %s p ON p.task_id = d.parent_id AND p.task_state = 3"
                              " WHERE d.parent_id IN (",
                              db->names.dep, db->names.task, db->names.task);
            put_ids(sql, frontier->v + s, k);
            dsp_strbuf_printf(sql, ") GROUP BY d.task_id LIMIT %u", DEPS_FAIL_ROWS);
            MYSQL_RES *res = query(c, sql);
            MYSQL_ROW row;
            if (res == NULL) {
                rc = -1;
                break;
            }
            while ((row = mysql_fetch_row(res)) != NULL) {
                if (nv == cap) {
                    size_t nc = cap ? cap * 2 : 64;
                    struct doomed *p = realloc(v, nc * sizeof *p);
                    if (p == NULL) {
                        rc = -1;
                        break;
                    }
                    v = p;
                    cap = nc;
                }
                v[nv++] = (struct doomed){field_u64(row[0]), field_u64(row[1]), false};
            }
            mysql_free_result(res);
        }
        if (rc < 0 || nv == 0)
            break;
        nv = doomed_unique(v, nv);
        next.n = 0;
        rc = fail_tasks(db, c, sql, v, nv, &next);
        struct idvec t = *frontier;
        *frontier = next;
        next = t;
    }
    free(next.v);
    free(v);
    return rc;
}

/* Probes the waiting tasks ids[0..n) in one statement: out[i] for ids[i]. Tasks that
 * are no longer waiting come back with parent 0 too (the release's guard skips them). */
static int probe(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ids, size_t n,
                 struct probe *out)
{
    dsp_strbuf_reset(sql);
    for (size_t i = 0; i < n; i++) {
        out[i] = (struct probe){ids[i], 0, 0, 0};
        dsp_strbuf_printf(sql,
                          "%s(SELECT d.task_id, d.parent_id, p.task_state, p.`delayed` FROM %s d"
                          " LEFT JOIN %s p ON p.task_id = d.parent_id WHERE d.task_id = %" PRIu64
                          " AND d.parent_id >= %" PRIu64 " AND (p.task_id IS NULL OR p.task_state <> 2)"
                          " ORDER BY d.parent_id LIMIT 1)",
                          i ? " UNION ALL " : "", db->names.dep, db->names.task, ids[i],
                          progress_get(db, ids[i]));
    }
    MYSQL_RES *res = query(c, sql);
    MYSQL_ROW row;
    if (res == NULL)
        return -1;
    while ((row = mysql_fetch_row(res)) != NULL) {
        uint64_t child = field_u64(row[0]);
        for (size_t i = 0; i < n; i++)
            if (out[i].child == child) {
                out[i].parent = field_u64(row[1]);
                out[i].pstate = row[2] ? (int)field_u64(row[2]) : -1;
                out[i].pdelayed = row[3] ? (int)field_u64(row[3]) : 0;
                break;
            }
    }
    mysql_free_result(res);
    return 0;
}

/* Index of the probe of child in p[0..n) (sorted by child), or n. */
static size_t probe_find(const struct probe *p, size_t n, uint64_t child)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p[mid].child < child)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && p[lo].child == child ? lo : n;
}

static int probe_cmp(const void *pa, const void *pb)
{
    const struct probe *a = pa, *b = pb;
    return a->child < b->child ? -1 : a->child > b->child;
}

/* Acts on probes p[0..n): releases, fails (with extra[0..nextra): tasks with a FAILED or
 * missing dependency the probes may not have reached), remembers where the others wait;
 * with cycles, p is one consistent view and the tasks whose first unfinished parents lead
 * back to themselves through waiting tasks of p end FAILED as a cycle. */
static int settle_probes(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct probe *p, size_t n,
                         const struct doomed *extra, size_t nextra, bool cycles)
{
    struct idvec ready = {0}, failed = {0};
    struct doomed *doom = calloc(n + nextra + 1, sizeof *doom);
    uint8_t *mark = cycles ? calloc(n + 1, 1) : NULL;
    size_t ndoom = 0;
    int rc = -1;

    if (doom == NULL || (cycles && mark == NULL))
        goto done;
    qsort(p, n, sizeof *p, probe_cmp);
    for (size_t i = 0; i < nextra; i++)
        doom[ndoom++] = extra[i];
    for (size_t i = 0; i < n; i++) {
        if (p[i].parent == 0) {
            if (idvec_push(&ready, p[i].child) < 0)
                goto done;
        } else if (p[i].pstate == -1 || p[i].pstate == 3) {
            doom[ndoom++] = (struct doomed){p[i].child, p[i].parent, p[i].pstate == -1};
        } else {
            progress_set(db, p[i].child, p[i].parent);
        }
    }
    if (cycles) {
        /* Each task points at its first unfinished parent: a walk from a task through
         * waiting tasks of p either leaves p (it may run some day), or comes back to a
         * task of this walk (a cycle: none of them can), or meets a task an earlier walk
         * judged. mark: 0 unseen, 1 on this walk, 2 may run, 3 stuck. */
        for (size_t s = 0; s < n; s++) {
            size_t i = s;
            int verdict = 2;
            while (i < n && mark[i] == 0) {
                mark[i] = 1;
                if (p[i].parent == 0 || p[i].pstate != 0 || p[i].pdelayed != 2)
                    break;
                i = probe_find(p, n, p[i].parent);
            }
            if (i < n && mark[i] == 1 && p[i].parent != 0 && p[i].pstate == 0 && p[i].pdelayed == 2 &&
                probe_find(p, n, p[i].parent) < n)
                verdict = 3; /* back on this walk: a cycle */
            else if (i < n && mark[i] == 3)
                verdict = 3; /* into a known cycle */
            for (size_t j = s; j < n && mark[j] == 1;) {
                mark[j] = (uint8_t)verdict;
                if (p[j].parent == 0)
                    break;
                j = probe_find(p, n, p[j].parent);
            }
        }
        for (size_t i = 0; i < n; i++)
            if (mark[i] == 3) {
                log_warn(db->log, "task %" PRIu64 " waits in a dependency cycle: it ends FAILED", p[i].child);
                doom[ndoom++] = (struct doomed){p[i].child, 0, false};
            }
    }
    if (ready.n > 0 && release(db, c, sql, ready.v, ready.n) < 0)
        goto done;
    if (ndoom > 0) {
        ndoom = doomed_unique(doom, ndoom);
        if (fail_tasks(db, c, sql, doom, ndoom, &failed) < 0 || fail_cascade(db, c, sql, &failed) < 0)
            goto done;
    }
    rc = 0;
done:
    free(ready.v);
    free(failed.v);
    free(doom);
    free(mark);
    return rc;
}

/* Probes and settles the waiting tasks ids[0..n), DEPS_PROBES a statement. */
static int check_tasks(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ids, size_t n)
{
    struct probe p[DEPS_PROBES];
    for (size_t s = 0; s < n; s += DEPS_PROBES) {
        size_t k = n - s < DEPS_PROBES ? n - s : DEPS_PROBES;
        if (probe(db, c, sql, ids + s, k, p) < 0 || settle_probes(db, c, sql, p, k, NULL, 0, false) < 0)
            return -1;
    }
    return 0;
}

int dsp_dbi_deps_settle(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *children, size_t n)
{
    return check_tasks(db, c, sql, children, n);
}

int dsp_dbi_deps_parents_ended(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ok, size_t nok,
                               const uint64_t *failed, size_t nfailed)
{
    struct idvec children = {0}, frontier = {0};
    int rc = -1;

    for (size_t s = 0; s < nok; s += DEPS_IDS) {
        size_t k = nok - s < DEPS_IDS ? nok - s : DEPS_IDS;
        dsp_strbuf_reset(sql);
        /* Their dependants: one dive of dep_parent_idx a row, no row of task read, no
         * temporary table (duplicates go below). A dependant that no longer waits is
         * probed for nothing: its release is guarded; and a task is released only after
         * its last parent ended, so that is rare. */
        dsp_strbuf_printf(sql, "SELECT task_id FROM %s WHERE parent_id IN (", db->names.dep);
        put_ids(sql, ok + s, k);
        dsp_strbuf_puts(sql, ")");
        if (query_ids(c, sql, &children) < 0)
            goto done;
    }
    sort_unique(&children);
    if (children.n > 0) {
        /* A dependant whose last probe stopped at a parent not among these still waits
         * for that one: only the others are probed (a SUCCESSFUL row is written in a
         * batch of this thread, whose end probes that parent's dependants). */
        struct idvec done_ok = {0};
        size_t k = 0;
        for (size_t i = 0; i < nok; i++)
            if (idvec_push(&done_ok, ok[i]) < 0) {
                free(done_ok.v);
                goto done;
            }
        sort_unique(&done_ok);
        for (size_t i = 0; i < children.n; i++) {
            uint64_t at = progress_get(db, children.v[i]);
            if (at == 0 || has_id(&done_ok, at))
                children.v[k++] = children.v[i];
        }
        children.n = k;
        free(done_ok.v);
        if (children.n > 0 && check_tasks(db, c, sql, children.v, children.n) < 0)
            goto done;
    }
    for (size_t i = 0; i < nfailed; i++)
        if (idvec_push(&frontier, failed[i]) < 0)
            goto done;
    if (frontier.n > 0 && fail_cascade(db, c, sql, &frontier) < 0)
        goto done;
    rc = 0;
done:
    free(children.v);
    free(frontier.v);
    return rc;
}

/* The sweep's clean-up: the dependency rows of tasks no longer in the table (deleted by
 * retention or by hand), DEPS_CLEAN_TASKS tasks a sweep from cur->clean_after on. */
static int clean(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct dsp_deps_cursor *cur)
{
    struct idvec owners = {0}, present = {0}, gone = {0};
    int rc = -1;

    dsp_strbuf_reset(sql);
    dsp_strbuf_printf(sql, "SELECT DISTINCT task_id FROM %s WHERE task_id > %" PRIu64 " ORDER BY task_id LIMIT %u",
                      db->names.dep, cur->clean_after, DEPS_CLEAN_TASKS);
    if (query_ids(c, sql, &owners) < 0)
        goto done;
    cur->clean_after = owners.n < DEPS_CLEAN_TASKS ? 0 : owners.v[owners.n - 1];
    if (owners.n == 0) {
        rc = 0;
        goto done;
    }
    dsp_strbuf_reset(sql);
    dsp_strbuf_printf(sql, "SELECT task_id FROM %s WHERE task_id IN (", db->names.task);
    put_ids(sql, owners.v, owners.n);
    dsp_strbuf_puts(sql, ")");
    if (query_ids(c, sql, &present) < 0)
        goto done;
    sort_unique(&present);
    for (size_t i = 0; i < owners.n; i++)
        if (!has_id(&present, owners.v[i]) && idvec_push(&gone, owners.v[i]) < 0)
            goto done;
    for (int round = 0; gone.n > 0 && round < DEPS_DELETE_ROUNDS; round++) {
        uint64_t affected = 0;
        dsp_strbuf_reset(sql);
        dsp_strbuf_printf(sql, "DELETE FROM %s WHERE task_id IN (", db->names.dep);
        put_ids(sql, gone.v, gone.n);
        dsp_strbuf_printf(sql, ") LIMIT %u", DEPS_DELETE_BATCH);
        if (exec(c, sql, &affected) < 0)
            goto done;
        if (affected < DEPS_DELETE_BATCH)
            break;
    }
    rc = 0;
done:
    free(owners.v);
    free(present.v);
    free(gone.v);
    return rc;
}

int dsp_dbi_deps_sweep(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct dsp_deps_cursor *cur)
{
    struct idvec win = {0};
    struct probe *p = NULL;
    struct doomed *extra = NULL;
    size_t nextra = 0, cap = 0;
    int64_t last_ra = 0;
    int rc = -1;

    /* The window: waiting rows in delay_idx's order (`delayed`, run_after, task_id). */
    dsp_strbuf_reset(sql);
    dsp_strbuf_printf(sql,
                      "SELECT task_id, run_after FROM %s FORCE INDEX (delay_idx) WHERE `delayed` = 2"
                      " AND task_state = 0 AND (run_after > %" PRId64 " OR (run_after = %" PRId64
                      " AND task_id > %" PRIu64 "))%s ORDER BY run_after, task_id LIMIT %u",
                      db->names.task, cur->run_after, cur->run_after, cur->task_id, db->in ? db->in : "",
                      DSP_DEPS_SWEEP_TASKS);
    MYSQL_RES *res = query(c, sql);
    MYSQL_ROW row;
    if (res == NULL)
        goto done;
    while ((row = mysql_fetch_row(res)) != NULL) {
        if (idvec_push(&win, field_u64(row[0])) < 0) {
            mysql_free_result(res);
            goto done;
        }
        last_ra = row[1] ? strtoll(row[1], NULL, 10) : 0;
    }
    mysql_free_result(res);
    bool more = win.n == DSP_DEPS_SWEEP_TASKS;
    if (more)
        *cur = (struct dsp_deps_cursor){last_ra, win.v[win.n - 1], cur->clean_after, cur->passes};
    else
        *cur = (struct dsp_deps_cursor){0, 0, cur->clean_after, cur->passes}; /* from the first next time */
    if (win.n > 0 && cur->passes++ % DEPS_SWEEP_FULL_EVERY == 0) {
        /* Dependencies FAILED or missing, wherever they stand in a task's order. */
        dsp_strbuf_reset(sql);
        dsp_strbuf_printf(sql,
                          "SELECT d.task_id, d.parent_id, p.task_state FROM (SELECT task_id, parent_id FROM %s"
                          " WHERE task_id IN (",
                          db->names.dep);
        put_ids(sql, win.v, win.n);
        dsp_strbuf_printf(sql,
                          ") LIMIT %u) d LEFT JOIN %s p ON p.task_id = d.parent_id"
                          " WHERE p.task_id IS NULL OR p.task_state = 3",
                          DEPS_SWEEP_FAIL_ROWS, db->names.task);
        if ((res = query(c, sql)) == NULL)
            goto done;
        while ((row = mysql_fetch_row(res)) != NULL) {
            if (nextra == cap) {
                size_t nc = cap ? cap * 2 : 16;
                struct doomed *x = realloc(extra, nc * sizeof *x);
                if (x == NULL) {
                    mysql_free_result(res);
                    goto done;
                }
                extra = x;
                cap = nc;
            }
            extra[nextra++] = (struct doomed){field_u64(row[0]), field_u64(row[1]), row[2] == NULL};
        }
        mysql_free_result(res);
    }
    if (win.n > 0) {
        /* The window's probes in one statement: one view for the cycle check. */
        p = calloc(win.n, sizeof *p);
        if (p == NULL || probe(db, c, sql, win.v, win.n, p) < 0 ||
            settle_probes(db, c, sql, p, win.n, extra, nextra, true) < 0)
            goto done;
    }
    if (clean(db, c, sql, cur) < 0)
        goto done;
    rc = more ? 1 : 0;
done:
    free(win.v);
    free(p);
    free(extra);
    return rc;
}
