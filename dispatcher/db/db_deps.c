/* db_deps: task dependencies (schema version 10; docs/producers.md, "Dependencies").
 *
 * A waiting task is a NEW row with `delayed` = 2, which neither the claim (`delayed` = 0)
 * nor the promote sweep (`delayed` = 1) reads: waiting costs no claim anything, however
 * many tasks wait or on how many each waits. Its rows in the dependency table (NAME_dep)
 * name the tasks it waits for, met = 1 once one is seen SUCCESSFUL.
 *
 * Three callers move waiting rows on, each on its own database thread and connection:
 *   - the write thread, after each batch of outcomes (dsp_dbi_deps_parents_ended): the
 *     dependants of the rows it wrote SUCCESSFUL get those rows met, and those left with
 *     none unmet are released (`delayed` = 0, their dependency rows deleted); the
 *     dependants of rows it wrote FAILED end FAILED ("dependency N failed"), and theirs
 *     in turn, DEPS_FAIL_LEVELS levels at once (the sweep goes on past that);
 *   - the submit thread, after committing tasks that wait (dsp_dbi_deps_settle): a
 *     parent may have ended before the COMMIT;
 *   - the stats thread of the leader, every DEPS_SWEEP_MS (dsp_dbi_deps_sweep): reads a
 *     window of the waiting rows with their unmet dependencies and their parents' state
 *     in one statement (so one consistent view), and settles them as above. It catches
 *     what the two others cannot see: rows a producer inserted by SQL, parents that ended
 *     meanwhile, parents that ended another way (cancel, recovery, a claim with no
 *     attempt left), a parent that does not exist, and cycles: a waiting task whose
 *     unmet dependencies all wait, in the window, on tasks of the same kind, can never
 *     run, and ends FAILED with err_msg "dependency cycle".
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

#define DEPS_IDS 1000          /* ids one statement names at most */
#define DEPS_FAIL_LEVELS 64    /* levels of a failure's cascade followed at once */
#define DEPS_FAIL_ROWS 10000u  /* dependants one level of a cascade fails at most */
#define DEPS_DELETE_BATCH 5000u /* dependency rows one DELETE removes */
#define DEPS_DELETE_ROUNDS 200  /* DELETEs per release at most (1,000,000 rows) */
#define DEPS_SETTLE_CHILDREN 16 /* tasks one settle read covers (at most 16,000 rows) */

/* A growable list of ids. */
struct idvec {
    uint64_t *v;
    size_t n, cap;
};

/* One unmet dependency as read: child waits for parent, whose state is pstate (-1: no
 * such row) and `delayed` pdelayed; parent 0: the child has no unmet dependency left. */
struct edge {
    uint64_t child, parent;
    int pstate, pdelayed;
    int64_t run_after; /* the child's (the sweep's cursor) */
};

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

static int edge_cmp(const void *pa, const void *pb)
{
    const struct edge *a = pa, *b = pb;
    if (a->child != b->child)
        return a->child < b->child ? -1 : 1;
    return a->parent < b->parent ? -1 : a->parent > b->parent;
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

static MYSQL_RES *query(struct dbconn *c, const dsp_strbuf *sql)
{
    MYSQL_RES *res;

    atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
    if (sql->oom) {
        c->err = 0;
        log_error(c->db->log, "out of memory building a dependency statement");
        return NULL;
    }
    if (mysql_real_query(c->m, sql->p, (unsigned long)sql->len) != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        log_warn(c->db->log, "%s connection: %s (error %u) in: %.160s", c->who,
                 c->err ? mysql_error(c->m) : "no result", c->err, sql->p);
        return NULL;
    }
    return res;
}

static int exec(struct dbconn *c, const dsp_strbuf *sql, uint64_t *affected)
{
    if (sql->oom) {
        log_error(c->db->log, "out of memory building a dependency statement");
        return -1;
    }
    return dsp_dbi_exec(c, sql->p, sql->len, affected);
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

/* Deletes the dependency rows of the tasks ids (released or failed: no longer read). */
static int drop_rows(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ids, size_t n)
{
    for (size_t s = 0; s < n; s += DEPS_IDS) {
        size_t k = n - s < DEPS_IDS ? n - s : DEPS_IDS;
        for (int round = 0; round < DEPS_DELETE_ROUNDS; round++) {
            uint64_t affected = 0;
            dsp_strbuf_reset(sql);
            dsp_strbuf_printf(sql, "DELETE FROM %s WHERE task_id IN (", db->names.dep);
            put_ids(sql, ids + s, k);
            dsp_strbuf_printf(sql, ") LIMIT %u", DEPS_DELETE_BATCH);
            if (exec(c, sql, &affected) < 0)
                return -1;
            if (affected < DEPS_DELETE_BATCH)
                break;
        }
    }
    return 0;
}

/* Releases the waiting tasks ids (every dependency met): claimable from now on. */
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
    if (drop_rows(db, c, sql, ids, n) < 0)
        return -1;
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

/* The err_msg of d: plain ASCII, so it goes into a statement quoted as it is. */
static void reason(char *out, size_t cap, const struct doomed *d)
{
    if (d->parent == 0)
        snprintf(out, cap, "dependency cycle");
    else
        snprintf(out, cap, "dependency %" PRIu64 " %s", d->parent, d->missing ? "does not exist" : "failed");
}

/* Makes the waiting tasks of v FAILED with their reason; adds the ids to failed.
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
            dsp_strbuf_put_u64(sql, " WHEN ", v[i].id);
            char text[64];
            reason(text, sizeof text, &v[i]);
            dsp_strbuf_printf(sql, " THEN '%s'", text);
        }
        dsp_strbuf_puts(sql, " END WHERE task_id IN (");
        for (size_t i = s; i < s + k; i++)
            dsp_strbuf_put_u64(sql, i > s ? "," : "", v[i].id);
        dsp_strbuf_puts(sql, ") AND task_state = 0 AND `delayed` = 2");
        if (exec(c, sql, &affected) < 0)
            return -1;
        total += affected;
        for (size_t i = s; i < s + k; i++)
            if (idvec_push(failed, v[i].id) < 0)
                return -1;
    }
    atomic_fetch_add_explicit(&db->deps_failed, total, memory_order_relaxed);
    /* Waiting producers hear of it as of any other failure. */
    for (size_t i = 0; i < n; i++) {
        char text[64];
        reason(text, sizeof text, &v[i]);
        dsp_dbi_submit_notify_failed(db, v[i].id, text);
    }
    struct idvec ids = {0};
    for (size_t i = 0; i < n; i++)
        if (idvec_push(&ids, v[i].id) < 0) {
            free(ids.v);
            return -1;
        }
    int rc = drop_rows(db, c, sql, ids.v, ids.n);
    free(ids.v);
    return rc;
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
        qsort(v, nv, sizeof *v, doomed_cmp);
        size_t k = 0;
        for (size_t i = 0; i < nv; i++)
            if (k == 0 || v[i].id != v[k - 1].id)
                v[k++] = v[i];
        nv = k;
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

/* Marks met the pairs (child, parent) of e whose parent is SUCCESSFUL. */
static int mark_met(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const struct edge *e, size_t n)
{
    size_t put = 0;
    uint64_t last = 0;

    dsp_strbuf_reset(sql);
    for (size_t i = 0; i <= n; i++) {
        bool flush = i == n || put >= DEPS_IDS;
        if (flush && put > 0) {
            dsp_strbuf_puts(sql, "))");
            if (exec(c, sql, NULL) < 0)
                return -1;
            dsp_strbuf_reset(sql);
            put = 0;
        }
        if (i == n)
            break;
        if (e[i].parent == 0 || e[i].pstate != 2)
            continue;
        if (put == 0) {
            dsp_strbuf_printf(sql, "UPDATE %s SET met = 1 WHERE (task_id = %" PRIu64 " AND parent_id IN (%" PRIu64,
                              db->names.dep, e[i].child, e[i].parent);
        } else if (e[i].child != last) {
            dsp_strbuf_printf(sql, ")) OR (task_id = %" PRIu64 " AND parent_id IN (%" PRIu64, e[i].child,
                              e[i].parent);
        } else {
            dsp_strbuf_put_u64(sql, ",", e[i].parent);
        }
        last = e[i].child;
        put++;
    }
    return 0;
}

/* Whether id is a stuck candidate still (cand sorted by id; alive[i] for cand[i]). */
static bool cand_stuck(const struct idvec *cand, const uint8_t *alive, uint64_t id)
{
    uint64_t *p = cand->n ? bsearch(&id, cand->v, cand->n, sizeof *cand->v, u64_cmp) : NULL;
    return p != NULL && !alive[p - cand->v];
}

/* Settles the children of e[0..n) (sorted by child, then parent): every unmet
 * dependency of each is in e unless it is cut (its rows may go on past the read).
 * With cycles, the children whose unmet dependencies all wait on stuck children of e
 * end FAILED as a cycle. */
static int settle_edges(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct edge *e, size_t n, uint64_t cut,
                        bool cycles)
{
    struct idvec ready = {0}, cand = {0}, failed = {0};
    struct doomed *doom = NULL;
    size_t ndoom = 0;
    uint8_t *alive = NULL;
    int rc = -1;

    if (mark_met(db, c, sql, e, n) < 0)
        goto done;
    doom = calloc(n ? n : 1, sizeof *doom);
    if (doom == NULL)
        goto done;
    for (size_t s = 0, t; s < n; s = t) {
        bool all_ok = true, all_waiting = true;
        const struct edge *bad = NULL;
        for (t = s; t < n && e[t].child == e[s].child; t++) {
            if (e[t].parent == 0)
                continue;
            if ((e[t].pstate == -1 || e[t].pstate == 3) && (bad == NULL || bad->pstate != -1))
                bad = &e[t];
            if (e[t].pstate != 2)
                all_ok = false;
            if (e[t].pstate != 2 && !(e[t].pstate == 0 && e[t].pdelayed == 2))
                all_waiting = false;
        }
        if (bad) {
            doom[ndoom++] = (struct doomed){e[s].child, bad->parent, bad->pstate == -1};
        } else if (e[s].child == cut) {
            continue;
        } else if (all_ok) {
            if (idvec_push(&ready, e[s].child) < 0)
                goto done;
        } else if (cycles && all_waiting) {
            if (idvec_push(&cand, e[s].child) < 0)
                goto done;
        }
    }
    if (cand.n > 0) {
        /* The largest set of candidates each of whose unmet parents is in the set: none
         * of them can ever be released. Drop, until nothing changes, every candidate one
         * of whose parents is not a candidate still (a chain ends at a running task). */
        alive = calloc(cand.n, 1);
        if (alive == NULL)
            goto done;
        sort_unique(&cand);
        bool changed = true;
        while (changed) {
            changed = false;
            for (size_t i = 0; i < n; i++) {
                if (e[i].parent == 0 || e[i].pstate == 2 || !cand_stuck(&cand, alive, e[i].child) ||
                    cand_stuck(&cand, alive, e[i].parent))
                    continue;
                uint64_t *p = bsearch(&e[i].child, cand.v, cand.n, sizeof *cand.v, u64_cmp);
                alive[p - cand.v] = 1;
                changed = true;
            }
        }
        for (size_t i = 0; i < cand.n; i++)
            if (!alive[i]) {
                log_warn(db->log, "task %" PRIu64 " waits in a dependency cycle: it ends FAILED", cand.v[i]);
                doom[ndoom++] = (struct doomed){cand.v[i], 0, false};
            }
    }
    if (ready.n > 0 && release(db, c, sql, ready.v, ready.n) < 0)
        goto done;
    if (ndoom > 0) {
        qsort(doom, ndoom, sizeof *doom, doomed_cmp);
        if (fail_tasks(db, c, sql, doom, ndoom, &failed) < 0 || fail_cascade(db, c, sql, &failed) < 0)
            goto done;
    }
    rc = 0;
done:
    free(ready.v);
    free(cand.v);
    free(failed.v);
    free(doom);
    free(alive);
    return rc;
}

/* Reads the rows of a settle or sweep query (child, parent, pstate, pdelayed) into e. */
static int read_edges(struct dbconn *c, const dsp_strbuf *sql, struct edge **e, size_t *n, size_t *cap)
{
    MYSQL_RES *res = query(c, sql);
    MYSQL_ROW row;
    int rc = 0;

    if (res == NULL)
        return -1;
    while ((row = mysql_fetch_row(res)) != NULL) {
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            struct edge *p = realloc(*e, nc * sizeof *p);
            if (p == NULL) {
                rc = -1;
                break;
            }
            *e = p;
            *cap = nc;
        }
        (*e)[(*n)++] = (struct edge){field_u64(row[0]), field_u64(row[1]),
                                     row[1] == NULL ? -2 : row[2] == NULL ? -1 : (int)field_u64(row[2]),
                                     row[3] == NULL ? 0 : (int)field_u64(row[3]), 0};
    }
    mysql_free_result(res);
    return rc;
}

int dsp_dbi_deps_settle(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *children, size_t n)
{
    struct edge *e = NULL;
    size_t ne = 0, cap = 0;
    int rc = 0;

    for (size_t s = 0; rc == 0 && s < n; s += DEPS_SETTLE_CHILDREN) {
        size_t k = n - s < DEPS_SETTLE_CHILDREN ? n - s : DEPS_SETTLE_CHILDREN;
        ne = 0;
        dsp_strbuf_reset(sql);
        dsp_strbuf_printf(sql,
                          "SELECT c.task_id, d.parent_id, p.task_state, p.`delayed` FROM %s c"
                          " LEFT JOIN %s d ON d.task_id = c.task_id AND d.met = 0"
                          " LEFT JOIN %s p ON p.task_id = d.parent_id"
                          " WHERE c.task_id IN (",
                          db->names.task, db->names.dep, db->names.task);
        put_ids(sql, children + s, k);
        dsp_strbuf_puts(sql, ") AND c.task_state = 0 AND c.`delayed` = 2");
        rc = read_edges(c, sql, &e, &ne, &cap);
        if (rc == 0 && ne > 0) {
            qsort(e, ne, sizeof *e, edge_cmp);
            rc = settle_edges(db, c, sql, e, ne, 0, false);
        }
    }
    free(e);
    return rc;
}

int dsp_dbi_deps_parents_ended(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, const uint64_t *ok, size_t nok,
                               const uint64_t *failed, size_t nfailed)
{
    struct idvec children = {0}, pending = {0}, ready = {0}, frontier = {0};
    int rc = -1;

    for (size_t s = 0; s < nok; s += DEPS_IDS) {
        size_t k = nok - s < DEPS_IDS ? nok - s : DEPS_IDS;
        children.n = pending.n = ready.n = 0;
        dsp_strbuf_reset(sql);
        dsp_strbuf_printf(sql, "SELECT DISTINCT task_id FROM %s WHERE parent_id IN (", db->names.dep);
        put_ids(sql, ok + s, k);
        dsp_strbuf_puts(sql, ")");
        if (query_ids(c, sql, &children) < 0)
            goto done;
        if (children.n == 0)
            continue; /* the common case: nobody waits for these */
        dsp_strbuf_reset(sql);
        dsp_strbuf_printf(sql,
                          "UPDATE %s d JOIN %s p ON p.task_id = d.parent_id SET d.met = 1"
                          " WHERE d.parent_id IN (",
                          db->names.dep, db->names.task);
        put_ids(sql, ok + s, k);
        dsp_strbuf_puts(sql, ") AND d.met = 0 AND p.task_state = 2");
        if (exec(c, sql, NULL) < 0)
            goto done;
        sort_unique(&children);
        for (size_t cs = 0; cs < children.n; cs += DEPS_IDS) {
            size_t ck = children.n - cs < DEPS_IDS ? children.n - cs : DEPS_IDS;
            /* One seek of dep_pending_idx per child, however many it waits for. */
            dsp_strbuf_reset(sql);
            dsp_strbuf_printf(sql, "SELECT DISTINCT task_id FROM %s WHERE task_id IN (", db->names.dep);
            put_ids(sql, children.v + cs, ck);
            dsp_strbuf_puts(sql, ") AND met = 0");
            if (query_ids(c, sql, &pending) < 0)
                goto done;
        }
        sort_unique(&pending);
        for (size_t i = 0; i < children.n; i++)
            if (!has_id(&pending, children.v[i]) && idvec_push(&ready, children.v[i]) < 0)
                goto done;
        if (ready.n > 0 && release(db, c, sql, ready.v, ready.n) < 0)
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
    free(pending.v);
    free(ready.v);
    free(frontier.v);
    return rc;
}

int dsp_dbi_deps_sweep(dsp_db *db, struct dbconn *c, dsp_strbuf *sql, struct dsp_deps_cursor *cur)
{
    struct edge *e = NULL;
    size_t ne = 0, cap = 0;
    int rc = -1;

    dsp_strbuf_reset(sql);
    /* The window: waiting rows in delay_idx's order (`delayed`, run_after, task_id) from
     * the cursor on, then their unmet dependencies and the parents' state. */
    dsp_strbuf_printf(sql,
                      "SELECT c.task_id, d.parent_id, p.task_state, p.`delayed`, c.run_after FROM"
                      " (SELECT task_id, run_after FROM %s FORCE INDEX (delay_idx) WHERE `delayed` = 2"
                      " AND task_state = 0 AND (run_after > %" PRId64 " OR (run_after = %" PRId64
                      " AND task_id > %" PRIu64 "))%s ORDER BY run_after, task_id LIMIT %u) c"
                      " LEFT JOIN %s d ON d.task_id = c.task_id AND d.met = 0"
                      " LEFT JOIN %s p ON p.task_id = d.parent_id"
                      " ORDER BY c.run_after, c.task_id, d.parent_id LIMIT %u",
                      db->names.task, cur->run_after, cur->run_after, cur->task_id, db->in ? db->in : "",
                      DSP_DEPS_SWEEP_TASKS, db->names.dep, db->names.task, DSP_DEPS_SWEEP_ROWS);
    MYSQL_RES *res = query(c, sql);
    MYSQL_ROW row;
    uint64_t last = 0, cut = 0;
    int64_t last_ra = 0;
    size_t tasks = 0;
    if (res == NULL)
        goto done;
    while ((row = mysql_fetch_row(res)) != NULL) {
        if (ne == cap) {
            size_t nc = cap ? cap * 2 : 256;
            struct edge *p = realloc(e, nc * sizeof *p);
            if (p == NULL) {
                mysql_free_result(res);
                goto done;
            }
            e = p;
            cap = nc;
        }
        uint64_t child = field_u64(row[0]);
        last_ra = row[4] ? strtoll(row[4], NULL, 10) : 0;
        e[ne++] = (struct edge){child, field_u64(row[1]),
                                row[1] == NULL ? -2 : row[2] == NULL ? -1 : (int)field_u64(row[2]),
                                row[3] == NULL ? 0 : (int)field_u64(row[3]), last_ra};
        tasks += child != last || ne == 1;
        last = child;
    }
    mysql_free_result(res);
    if (ne == 0) {
        *cur = (struct dsp_deps_cursor){0, 0}; /* from the start next time */
        rc = 0;
        goto done;
    }
    bool more = true;
    if (ne == DSP_DEPS_SWEEP_ROWS) {
        /* The last task's rows may go on past the read: it is not released nor judged a
         * cycle from them. With other tasks before it, the next window starts at it
         * again; alone (more unmet rows than a window) it is passed, and each sweep
         * marks more of its rows met. */
        size_t k = ne;
        cut = last;
        while (k > 0 && e[k - 1].child == last)
            k--;
        if (k > 0) {
            cur->task_id = e[k - 1].child;
            cur->run_after = e[k - 1].run_after;
        } else {
            cur->task_id = last;
            cur->run_after = last_ra;
        }
    } else if (tasks < DSP_DEPS_SWEEP_TASKS) {
        *cur = (struct dsp_deps_cursor){0, 0}; /* the end: from the start next time */
        more = false;
    } else {
        cur->task_id = last;
        cur->run_after = last_ra;
    }
    qsort(e, ne, sizeof *e, edge_cmp);
    rc = settle_edges(db, c, sql, e, ne, cut, true);
    if (rc == 0 && more)
        rc = 1;
done:
    free(e);
    return rc;
}
