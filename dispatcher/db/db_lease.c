/* db_lease: the lease thread (see db_internal.h for what it shares). It owns the table's
 * leadership lease, the row 'lease' of taskpush_meta (sql/schema.sql): taking it over
 * when it has expired (and KILLing the old holder's connections), renewing it every
 * lease_renew_ms on a connection of its own, giving it up on this process's monotonic
 * clock when a renewal did not come in time, and giving it back at stop. It also owns
 * the gate (dsp_dbi_lease_gate) the claim and write threads pass before they act as the
 * leader.
 *
 * Why a lease beside GET_LOCK: the lock lives as long as its connection, so a frozen
 * leader (SIGSTOP, a paused VM) whose connection stays open would keep the table for
 * ever. The lease expires on the database's clock; a standby that finds it expired KILLs
 * the old holder's connections (which also frees the lock and whatever rows they held),
 * takes it in one compare-and-swap UPDATE, and only then does its claim thread take
 * GET_LOCK and a new epoch.
 *
 * Which connections are the old holder's: each connection the lease records holds a lock
 * named after its process's holder id (63 random bits) and its slot, taken right after it
 * connects. A standby asks its own server who holds the old holder's names
 * (IS_USED_LOCK): the answer is a connection of that process on this server, or none.
 * Connection ids alone are not enough: they are per server and start again at each
 * start, and two servers started in the same second (a cluster, containers, a restore)
 * hand out the same ids, so ids recorded on one server name bystanders on the other. The lease row is written by single autocommit statements of this
 * thread, and by the fencing write (dsp_dbi_lease_fence) at the end of each claim
 * transaction, which holds its lock only from that write to the claim's COMMIT.
 *
 * The leader's side: a renewal sent at monotonic time t that the database accepted
 * makes the lease valid here until t + lease_ms. The database set expires_ms = its now +
 * lease_ms at the statement, no earlier than t, so this process stops acting as leader
 * before any standby may take over (clocks that run at the same rate assumed).
 */
#include "db_internal.h"

#include <mysql.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define LEASE_RW_TIMEOUT_S 2u  /* the lease connection only runs short statements */
#define BOOT_SLACK_S 2         /* two readings of the server's start time agree within this */
#define CONN_LOCK_WAIT_S 1     /* under LEASE_RW_TIMEOUT_S */
#define ER_NO_SUCH_THREAD_ 1094
#define ER_KILL_DENIED_ 1095
#define ER_BAD_FIELD_ 1054
#define COL_MAX 136            /* a column read back: conns is at most 128 bytes */

/* The database's clock in ms since 1970 (the lease connection's time zone is UTC, so
 * UNIX_TIMESTAMP(NOW(3)) is exact across daylight-saving changes). */
#define DB_NOW_MS "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

static const char *const slot_names[LEASE_NCONN] = {"claim", "write", "lease", "stats",
                                                     "claim helper"};

struct lease_ctx {
    dsp_db *db;
    struct dbconn c;
    uint64_t holder;     /* drawn at start, never 0 */
    int64_t lease_ms, renew_ms;
    int64_t boot_s;      /* the server's start as the lease connection read it */
    bool row_logged;     /* a missing row or column was logged */
    bool took;           /* the lease was ours at some point: give it back at stop */
    int64_t expires_in;  /* as last read while another held it: try again then */
    bool wait_logged;    /* "waiting" was logged since the lease was last free */
    bool mixed_logged;   /* mixed_check's refusal was logged */
    bool row_made;       /* a shard's lease row exists (INSERT IGNOREd once) */
};

/* The lease's length and renewal: the flags', else the defaults for the server the lease
 * connection reached (db.h). Set at each connect, so that every taskpushd of a cluster
 * given no flags agrees. The row's expires_ms carries each holder's own length, so a
 * standby with other flags still waits for the holder's real expiry. */
static void lease_timing(struct lease_ctx *x)
{
    dsp_db *db = x->db;
    bool flags = db->opts.lease_ms > 0 || db->opts.lease_renew_ms > 0;

    if (!flags && x->c.galera) {
        x->lease_ms = DSP_LEASE_MS_GALERA;
        x->renew_ms = DSP_LEASE_RENEW_MS_GALERA;
    } else {
        x->lease_ms = db->opts.lease_ms > 0 ? db->opts.lease_ms : DSP_LEASE_MS_DEFAULT;
        x->renew_ms = db->opts.lease_renew_ms > 0 ? db->opts.lease_renew_ms : DSP_LEASE_RENEW_MS_DEFAULT;
    }
    pthread_mutex_lock(&db->mu);
    db->lease.length_ms = x->lease_ms;
    db->lease.renew_ms = x->renew_ms;
    db->lease.galera = x->c.galera;
    pthread_mutex_unlock(&db->mu);
}

/* ---- shared state ---- */

/* The lock a recorded connection of holder takes for its slot (hex digits only: safe
 * between quotes). */
static void conn_lock_name(uint64_t holder, int slot, char *out, size_t cap)
{
    snprintf(out, cap, "taskpush-conn/%016" PRIx64 "/%d", holder, slot);
}

/* A holder id nobody else draws: the kernel's random bits, else time, pid and an address. */
static uint64_t holder_draw(const void *salt)
{
    uint64_t h = 0;

    if (getrandom(&h, sizeof h, GRND_NONBLOCK) != (ssize_t)sizeof h)
        h = ((uint64_t)dsp_wall_ms() << 20) ^ ((uint64_t)getpid() << 4) ^
            ((uint64_t)(uintptr_t)salt * 0xD6E8FEB86659FD93ULL);
    h &= INT64_MAX; /* the holder column is signed */
    return h ? h : 1;
}

int dsp_dbi_lease_init(dsp_db *db)
{
    pthread_condattr_t ca;
    int rc = -1;

    /* Drawn before any thread connects, never changed: read without the mutex. */
    db->lease.holder = holder_draw(db);

    if (pthread_condattr_init(&ca) != 0)
        return -1;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&db->lease.cv, &ca) == 0 ? 0 : -1;
    pthread_condattr_destroy(&ca);
    return rc;
}

void dsp_dbi_lease_destroy(dsp_db *db)
{
    pthread_cond_destroy(&db->lease.cv);
}

static int slot_of(const char *who)
{
    for (int i = 0; who && i < LEASE_NCONN; i++)
        if (strcmp(who, slot_names[i]) == 0)
            return i;
    return -1;
}

/* Takes c's lock (conn_lock_name). Held already: by an earlier connection of this process
 * in the same slot that the server has not seen close yet (nobody else uses the name),
 * which is ended first. Not taken even so: logged, and c goes on without it (a standby
 * could then not end c; the lease's gate still fences it). 0, or -1 on a connection
 * error. */
static int conn_lock_take(struct dbconn *c, int slot)
{
    char name[48], sql[128];
    uint64_t got = 0, id = 0;
    bool isnull = false;

    conn_lock_name(c->db->lease.holder, slot, name, sizeof name);
    snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s', 0)", name);
    if (dsp_dbi_query_u64(c, sql, &got, &isnull, 0) != 0)
        return -1;
    if (got == 1 && !isnull)
        return 0;
    snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK('%s')", name);
    if (dsp_dbi_query_u64(c, sql, &id, &isnull, 0) != 0)
        return -1;
    if (!isnull && id != 0 && id != (uint64_t)mysql_thread_id(c->m)) {
        snprintf(sql, sizeof sql, "KILL CONNECTION %" PRIu64, id);
        atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
        if (mysql_real_query(c->m, sql, (unsigned long)strlen(sql)) == 0)
            log_info(c->db->log, "%s connection: ended connection %" PRIu64
                                 ", this process's earlier one", c->who, id);
    }
    snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s', %d)", name, CONN_LOCK_WAIT_S);
    if (dsp_dbi_query_u64(c, sql, &got, &isnull, 0) != 0)
        return -1;
    if (got != 1 || isnull)
        log_warn(c->db->log, "%s connection: another session holds its lock %s; a standby"
                             " taking over could not end this connection", c->who, name);
    return 0;
}

int dsp_dbi_lease_conn_opened(struct dbconn *c)
{
    dsp_db *db = c->db;
    int i = slot_of(c->who);

    if (i < 0)
        return 0;
    if (conn_lock_take(c, i) < 0)
        return -1;
    pthread_mutex_lock(&db->mu);
    db->lease.conn[i] = (uint64_t)mysql_thread_id(c->m);
    if (db->lease.held && i != LEASE_CONN_LEASE) {
        db->lease.renew_now = true;
        pthread_cond_signal(&db->lease.cv);
    }
    pthread_mutex_unlock(&db->mu);
    return 0;
}

int dsp_dbi_lease_gate(dsp_db *db, int slot, uint64_t conn_id, uint64_t gen, uint32_t epoch)
{
    int rc = 0;

    pthread_mutex_lock(&db->mu);
    if (!db->lease.held || dsp_now_ms() >= db->lease.valid_until || (gen && gen != db->lease.gen))
        rc = -1;
    else if (epoch && (!atomic_load(&db->leader) || atomic_load(&db->epoch) != epoch))
        rc = -1;
    else if (slot >= 0 && slot < LEASE_NCONN && db->lease.recorded[slot] != conn_id) {
        rc = 1;
        db->lease.renew_now = true;
        pthread_cond_signal(&db->lease.cv);
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

uint64_t dsp_dbi_lease_gen(dsp_db *db)
{
    uint64_t g;
    pthread_mutex_lock(&db->mu);
    g = db->lease.held ? db->lease.gen : 0;
    pthread_mutex_unlock(&db->mu);
    return g;
}

void dsp_dbi_lease_want(dsp_db *db, bool want)
{
    pthread_mutex_lock(&db->mu);
    if (db->lease.wanted != want) {
        db->lease.wanted = want;
        db->lease.renew_now = true; /* try at once */
        pthread_cond_signal(&db->lease.cv);
    }
    pthread_mutex_unlock(&db->mu);
}

void dsp_dbi_leadership_end(dsp_db *db)
{
    struct msg *m = NULL;

    pthread_mutex_lock(&db->mu);
    db->accepting = false;
    /* Whoever ends it first tells the loop, once. */
    if (atomic_exchange(&db->leader, false) && (m = dsp_dbi_msg_new(MSG_LEADER_LOST)) != NULL)
        dsp_dbi_post_locked(db, m);
    pthread_cond_broadcast(&db->claim_cv);
    pthread_mutex_unlock(&db->mu);
    if (m)
        dsp_dbi_wake_loop(db);
}

/* Gives the lease up on this side (why for the log); the row is left as it is: it
 * expires, or this thread takes it again. */
static void lease_give_up(dsp_db *db, const char *why)
{
    bool was;

    pthread_mutex_lock(&db->mu);
    was = db->lease.held;
    db->lease.held = false;
    memset(db->lease.recorded, 0, sizeof db->lease.recorded);
    pthread_cond_broadcast(&db->claim_cv);
    pthread_cond_broadcast(&db->write_cv);
    pthread_cond_signal(&db->lease.cv);
    pthread_mutex_unlock(&db->mu);
    if (was) {
        log_error(db->log, "gave up the table's lease: %s; not leading", why);
        dsp_dbi_leadership_end(db);
    }
}

/* The fencing write (docs/replication.md, Galera): the lease row changes with every
 * claim transaction, so that on Galera a claim of a deposed dispatcher fails
 * certification against the takeover's write of the same row, and on one server it
 * reads the row's latest version under a lock. Bit 32 of value flips (the epoch is in the
 * low 32 bits; 0 until the first renewal as leader wrote it): an UPDATE that changes
 * nothing would put no key in the write set. */
int dsp_dbi_lease_fence(dsp_db *db, struct dbconn *c, uint32_t epoch)
{
    char sql[256 + DSP_TABLE_IDENT_CAP];
    uint64_t n;

    snprintf(sql, sizeof sql,
             "UPDATE %s SET value = (value ^ 4294967296) | %" PRIu32 " WHERE name = '%s'"
             " AND holder = %" PRIu64 " AND (value & 4294967295) IN (0, %" PRIu32 ")",
             db->names.meta, epoch, db->lease_row, db->lease.holder, epoch);
    if (dsp_dbi_exec(c, sql, strlen(sql), &n) < 0)
        return -1;
    return n == 1 ? 1 : 0;
}

void dsp_dbi_lease_deposed(dsp_db *db)
{
    atomic_fetch_add_explicit(&db->claims_fenced, 1, memory_order_relaxed);
    lease_give_up(db, "a claim found the lease row no longer ours (db.claims_fenced_total)");
}

void dsp_db_lease_check(dsp_db *db)
{
    int64_t late = -1;

    if (db == NULL)
        return;
    pthread_mutex_lock(&db->mu);
    if (db->lease.held && dsp_now_ms() >= db->lease.valid_until)
        late = dsp_now_ms() - db->lease.valid_until + db->lease.length_ms;
    pthread_mutex_unlock(&db->mu);
    if (late >= 0) {
        char why[96];
        snprintf(why, sizeof why, "not renewed for %" PRId64 " ms", late);
        lease_give_up(db, why);
    }
}

bool dsp_db_lease_valid(dsp_db *db)
{
    bool ok;

    if (db == NULL)
        return true; /* an offline server: nothing to say */
    pthread_mutex_lock(&db->mu);
    ok = db->lease.held && dsp_now_ms() < db->lease.valid_until;
    pthread_mutex_unlock(&db->mu);
    return ok;
}

/* ---- statements ---- */

/* Runs sql and copies the first row's first ncols columns (NULL: empty) into out, each at
 * most cap bytes with its NUL. 0: a row; 1: no row; -1: error (logged unless quiet). */
static int query_row(struct dbconn *c, const char *sql, char (*out)[COL_MAX], unsigned ncols,
                     unsigned quiet)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 1;

    atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)strlen(sql)) != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        if (c->err != quiet)
            log_warn(c->db->log, "lease connection: %s (error %u) in: %.160s",
                     c->err ? mysql_error(c->m) : "no result", c->err, sql);
        return -1;
    }
    if ((row = mysql_fetch_row(res)) != NULL && mysql_num_fields(res) >= ncols) {
        unsigned long *len = mysql_fetch_lengths(res);
        rc = 0;
        for (unsigned i = 0; i < ncols; i++) {
            size_t n = row[i] ? len[i] : 0;
            if (n > COL_MAX - 1)
                n = COL_MAX - 1; /* conns fits: VARCHAR(128) */
            memcpy(out[i], row[i] ? row[i] : "", n);
            out[i][n] = '\0';
        }
    }
    mysql_free_result(res);
    return rc;
}

/* A decimal number of the table or the server, or -1 when it is not one. */
static int64_t parse_i64(const char *s)
{
    char *end;
    long long v;

    if (*s == '\0')
        return -1;
    v = strtoll(s, &end, 10);
    return *end == '\0' && v >= 0 ? (int64_t)v : -1;
}

/* Reads when the server started (its clock less its uptime): connection ids start again
 * after a restart, so an id recorded before one names somebody else. */
static int read_boot(struct lease_ctx *x)
{
    char v[2][COL_MAX], now[1][COL_MAX];
    int64_t up, t;

    if (query_row(&x->c, "SHOW GLOBAL STATUS LIKE 'Uptime'", v, 2, 0) != 0 ||
        query_row(&x->c, "SELECT UNIX_TIMESTAMP()", now, 1, 0) != 0)
        return -1;
    up = parse_i64(v[1]);
    t = parse_i64(now[0]);
    x->boot_s = up >= 0 && t >= up ? t - up : 0;
    return 0;
}

static int lease_connect(struct lease_ctx *x)
{
    if (dsp_dbi_conn_open(&x->c, true, false) < 0)
        return -1;
    if (dsp_dbi_exec_str(&x->c, "SET SESSION time_zone = '+00:00'") < 0 || read_boot(x) < 0) {
        dsp_dbi_conn_close(&x->c);
        return -1;
    }
    lease_timing(x);
    return 0;
}

/* The conns column: the server's start, then the id of each connection. */
static void conns_text(struct lease_ctx *x, const uint64_t *ids, char *out, size_t cap)
{
    _Static_assert(LEASE_NCONN == 5, "conns_text writes five ids");
    snprintf(out, cap, "%" PRId64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64,
             x->boot_s, ids[0], ids[1], ids[2], ids[3], ids[4]);
}

/* Parses conns (the table's text: hostile): the server's start, then connection ids.
 * Returns how many numbers were read into v (a bad one is -1). */
static int conns_parse(const char *conns, int64_t *v, int cap)
{
    const char *p = conns;
    int n = 0;

    while (n < cap && *p) {
        char *end;
        unsigned long long u;
        while (*p == ' ')
            p++;
        if (*p < '0' || *p > '9')
            break;
        u = strtoull(p, &end, 10);
        v[n++] = u > INT64_MAX ? -1 : (int64_t)u;
        p = end;
    }
    return n;
}

/* The ids to end on this server: the sessions holding old's connection locks. A holder
 * from before those locks (an older taskpushd) holds none; then only the session holding
 * the table's leadership lock, and only when it is the claim connection old recorded on a
 * server that started when this one did. Returns how many ids were put in out. */
static int old_sessions(struct lease_ctx *x, uint64_t old, const char *conns, int64_t *out)
{
    dsp_db *db = x->db;
    char sql[512], row[LEASE_NCONN][COL_MAX], name[48], lrow[1][COL_MAX];
    int64_t v[1 + LEASE_NCONN];
    size_t sl;
    int n = 0, nv;

    sl = (size_t)snprintf(sql, sizeof sql, "SELECT ");
    for (int i = 0; i < LEASE_NCONN; i++) {
        conn_lock_name(old, i, name, sizeof name);
        sl += (size_t)snprintf(sql + sl, sizeof sql - sl, "%sIS_USED_LOCK('%s')", i ? ", " : "", name);
    }
    if (sl >= sizeof sql || query_row(&x->c, sql, row, LEASE_NCONN, 0) != 0)
        return 0;
    for (int i = 0; i < LEASE_NCONN; i++) {
        int64_t id = parse_i64(row[i]);
        if (id > 0)
            out[n++] = id;
    }
    if (n > 0)
        return n;

    nv = conns_parse(conns, v, 1 + LEASE_NCONN);
    if (nv < 2 || v[0] < 0 || v[0] < x->boot_s - BOOT_SLACK_S || v[0] > x->boot_s + BOOT_SLACK_S ||
        v[1] <= 0)
        return 0;
    if (query_row(&x->c, db->used_lock_sql.p, lrow, 1, 0) != 0 || parse_i64(lrow[0]) != v[1])
        return 0;
    out[0] = v[1];
    return 1;
}

/* KILLs the old holder's connections on this server (old_sessions), never one of ours. */
static void kill_old(struct lease_ctx *x, uint64_t old, const char *conns)
{
    dsp_db *db = x->db;
    int64_t ids[LEASE_NCONN];
    uint64_t mine[LEASE_NCONN];
    char sql[64], killed[128] = "";
    size_t kl = 0;
    int n;

    pthread_mutex_lock(&db->mu);
    memcpy(mine, db->lease.conn, sizeof mine);
    pthread_mutex_unlock(&db->mu);
    /* Every round trip here delays the takeover (the claim thread waits for the lease,
     * which waits for these KILLs): one statement finds them all. */
    n = old_sessions(x, old, conns, ids);
    if (n == 0) {
        log_info(db->log, "no connection of the old holder on this server: nothing to kill");
        return;
    }
    for (int i = 0; i < n; i++) {
        bool ours = false;
        for (int k = 0; k < LEASE_NCONN; k++)
            ours |= mine[k] == (uint64_t)ids[i];
        if (ours)
            continue;
        snprintf(sql, sizeof sql, "KILL CONNECTION %" PRId64, ids[i]);
        atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
        if (mysql_real_query(x->c.m, sql, (unsigned long)strlen(sql)) != 0) {
            unsigned e = mysql_errno(x->c.m);
            if (e == ER_NO_SUCH_THREAD_)
                continue;
            log_error(db->log,
                      "cannot KILL connection %" PRId64 " of the old leader: %s (error %u);"
                      " give taskpushd's database user CONNECTION ADMIN (MariaDB: CONNECTION"
                      " ADMIN or SUPER), or run every taskpushd of the table as the same user",
                      ids[i], mysql_error(x->c.m), e);
            continue;
        }
        kl += (size_t)snprintf(killed + kl, sizeof killed - kl, "%s%" PRId64, kl ? ", " : "", ids[i]);
        if (kl >= sizeof killed)
            kl = sizeof killed - 1;
    }
    if (kl)
        log_info(db->log, "killed the old leader's database connections %s", killed);
}

/* A shard's lease row is made the first time a dispatcher of the shard runs (the
 * migrations only know 'lease'); the name is [A-Za-z0-9_.-] (shard.c). 0 or -1. */
static int shard_row_make(struct lease_ctx *x)
{
    char sql[128 + DSP_TABLE_IDENT_CAP];
    uint64_t n;

    if (x->db->in == NULL || x->row_made)
        return 0;
    snprintf(sql, sizeof sql, "INSERT IGNORE INTO %s (name, value) VALUES ('%s', 0)",
             x->db->names.meta, x->db->lease_row);
    if (dsp_dbi_exec(&x->c, sql, strlen(sql), &n) < 0)
        return -1;
    x->row_made = true;
    return 0;
}

/* An unsharded dispatcher and a shard must not lead one table together: the unsharded
 * one claims, recovers and sweeps every type. Each checks, after taking its own lease,
 * that no lease of the other kind is live; of two that take theirs at the same time at
 * least one sees the other's (each writes, then reads), and gives its lease back.
 * 0: alone; 1: the other kind leads (logged); -1: connection error. */
static void lease_release(struct lease_ctx *x);

static int mixed_check(struct lease_ctx *x)
{
    char sql[256 + DSP_TABLE_IDENT_CAP], row[1][COL_MAX];

    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM %s WHERE %s AND holder <> 0 AND expires_ms >= " DB_NOW_MS,
             x->db->names.meta, x->db->in ? "name = 'lease'" : "name LIKE 'lease:%'");
    if (query_row(&x->c, sql, row, 1, 0) != 0)
        return -1;
    if (strcmp(row[0], "0") == 0) {
        x->mixed_logged = false;
        return 0;
    }
    if (!x->mixed_logged)
        log_error(x->db->log, "refusing the lease: %s leads this table; sharded (--types) and"
                          " unsharded dispatchers must not share a table",
              x->db->in ? "an unsharded taskpushd" : "a sharded taskpushd (--types)");
    return 1;
}

/* Takes the lease when it is free, expired or ours. 1: taken; 0: another holds it;
 * -1: connection error. */
static int lease_acquire(struct lease_ctx *x)
{
    dsp_db *db = x->db;
    char row[4][COL_MAX], conns[128], sql[512 + DSP_TABLE_IDENT_CAP];
    uint64_t ids[LEASE_NCONN], old, found;
    int64_t exp, now, t0;
    int rc;

    if (shard_row_make(x) < 0)
        return -1;
    snprintf(sql, sizeof sql,
             "SELECT holder, expires_ms, conns, " DB_NOW_MS " FROM %s WHERE name = '%s'",
             db->names.meta, db->lease_row);
    rc = query_row(&x->c, sql, row, 4, ER_BAD_FIELD_);
    if (rc < 0 && x->c.err != ER_BAD_FIELD_)
        return -1;
    if (rc != 0) {
        if (!x->row_logged)
            log_warn(db->log, "%s has no lease row; run taskpushd --migrate", db->names.meta);
        x->row_logged = true;
        return 0;
    }
    old = strtoull(row[0], NULL, 10);
    exp = parse_i64(row[1]);
    now = parse_i64(row[3]);
    if (old != 0 && old != x->holder && exp >= now && now >= 0) {
        x->expires_in = exp - now;
        if (!x->wait_logged)
            log_info(db->log, "another taskpushd holds the table's lease; waiting");
        x->wait_logged = true;
        return 0;
    }
    x->wait_logged = false;
    /* The expired holder's sessions end before the swap, not after: a holder frozen in
     * the middle of a claim still holds that claim's lock on the lease row (each claim
     * writes it, a fence), and the swap would wait behind it for ever. Its lease ran out
     * on its own clock no later than on the database's, so it acts no more either way;
     * a standby that then loses the swap to another has ended only a deposed holder's
     * sessions. */
    if (old != 0 && old != x->holder)
        kill_old(x, old, row[2]);

    pthread_mutex_lock(&db->mu);
    memcpy(ids, db->lease.conn, sizeof ids);
    pthread_mutex_unlock(&db->mu);
    conns_text(x, ids, conns, sizeof conns);
    /* Compare-and-swap on what was read: nobody renewed or took it in between. */
    snprintf(sql, sizeof sql,
             "UPDATE %s SET holder = %" PRIu64 ", expires_ms = " DB_NOW_MS " + %" PRId64
             ", value = 0, conns = '%s' WHERE name = '%s' AND holder = %" PRIu64
             " AND expires_ms = %s",
             db->names.meta, x->holder, x->lease_ms, conns, db->lease_row, old,
             exp >= 0 ? row[1] : "expires_ms");
    t0 = dsp_now_ms();
    if (dsp_dbi_exec(&x->c, sql, strlen(sql), &found) < 0)
        return -1;
    if (found != 1)
        return 0;
    x->took = true;
    if ((rc = mixed_check(x)) != 0) {
        lease_release(x);
        return rc < 0 ? -1 : 0;
    }
    if (old != 0 && old != x->holder) {
        log_info(db->log, "took the table's lease from holder %" PRIu64 " (it expired %" PRId64
                          " ms before)", old, now - exp);
    } else {
        log_info(db->log, "took the table's lease");
    }
    pthread_mutex_lock(&db->mu);
    db->lease.held = true;
    db->lease.gen++;
    db->lease.valid_until = t0 + x->lease_ms;
    memcpy(db->lease.recorded, ids, sizeof ids);
    pthread_cond_broadcast(&db->claim_cv);
    pthread_mutex_unlock(&db->mu);
    return 1;
}

/* Renews the lease, recording the connections and the epoch. 0: renewed (or nothing to
 * do); -1: connection error. Losing the row to another holder gives the lease up. */
static int lease_renew(struct lease_ctx *x)
{
    dsp_db *db = x->db;
    char conns[128], sql[384 + DSP_TABLE_IDENT_CAP];
    uint64_t ids[LEASE_NCONN], found;
    uint32_t epoch = atomic_load(&db->leader) ? atomic_load(&db->epoch) : 0;
    int64_t t0;

    pthread_mutex_lock(&db->mu);
    memcpy(ids, db->lease.conn, sizeof ids);
    db->lease.renew_now = false;
    pthread_mutex_unlock(&db->mu);
    conns_text(x, ids, conns, sizeof conns);
    snprintf(sql, sizeof sql,
             "UPDATE %s SET expires_ms = " DB_NOW_MS " + %" PRId64 ", value = %" PRIu32
             ", conns = '%s' WHERE name = '%s' AND holder = %" PRIu64,
             db->names.meta, x->lease_ms, epoch, conns, db->lease_row, x->holder);
    t0 = dsp_now_ms();
    if (dsp_dbi_exec(&x->c, sql, strlen(sql), &found) < 0)
        return -1;
    if (found != 1) {
        lease_give_up(db, "another dispatcher holds it");
        return 0;
    }
    pthread_mutex_lock(&db->mu);
    if (db->lease.held) { /* not given up meanwhile (the loop's check) */
        db->lease.valid_until = t0 + x->lease_ms;
        if (memcmp(db->lease.recorded, ids, sizeof ids) != 0) {
            memcpy(db->lease.recorded, ids, sizeof ids);
            /* A connection waiting to be recorded may act now. */
            pthread_cond_broadcast(&db->claim_cv);
            pthread_cond_broadcast(&db->write_cv);
        }
    }
    pthread_mutex_unlock(&db->mu);
    return 0;
}

/* At stop: the lease goes back at once, so that a standby need not wait for it to
 * expire. */
static void lease_release(struct lease_ctx *x)
{
    char sql[160 + DSP_TABLE_IDENT_CAP];
    uint64_t n;

    if (x->c.m == NULL || !x->took)
        return;
    snprintf(sql, sizeof sql,
             "UPDATE %s SET holder = 0, expires_ms = 0, value = 0, conns = ''"
             " WHERE name = '%s' AND holder = %" PRIu64,
             x->db->names.meta, x->db->lease_row, x->holder);
    if (dsp_dbi_exec(&x->c, sql, strlen(sql), &n) == 0 && n == 1)
        log_debug(x->db->log, "gave the table's lease back");
}

/* One pass: connect, renew or try to take the lease. Returns the wait before the next. */
static int64_t lease_step(struct lease_ctx *x)
{
    dsp_db *db = x->db;
    bool held, want;
    int rc = 0;

    if (dsp_dbi_conn_stale(&x->c))
        dsp_dbi_conn_close(&x->c); /* off to the server in use */
    if (x->c.m == NULL && lease_connect(x) < 0)
        return dsp_dbi_backoff_next(&x->c);
    pthread_mutex_lock(&db->mu);
    held = db->lease.held;
    want = db->lease.wanted && !db->stop_claims && !db->lease.stop;
    pthread_mutex_unlock(&db->mu);
    x->expires_in = INT64_MAX;
    if (held)
        rc = lease_renew(x);
    else if (want)
        rc = lease_acquire(x) < 0 ? -1 : 0;
    if (rc < 0) {
        int64_t b = dsp_dbi_backoff_next(&x->c);
        dsp_dbi_conn_close(&x->c);
        return b < x->renew_ms ? b : x->renew_ms; /* a standby must not wait long */
    }
    /* A standby looks again just after the holder's lease would expire. */
    return x->expires_in < x->renew_ms ? x->expires_in + 1 : x->renew_ms;
}

void *dsp_dbi_lease_main(void *arg)
{
    dsp_db *db = arg;
    struct lease_ctx x;

    memset(&x, 0, sizeof x);
    x.db = db;
    x.c.db = db;
    x.c.who = "lease";
    x.c.client_flag = CLIENT_FOUND_ROWS; /* a renewal that changes nothing still matched */
    x.c.rw_timeout_s = LEASE_RW_TIMEOUT_S;
    x.c.rng = (uint64_t)dsp_now_us() * 0xD6E8FEB86659FD93ULL ^ (uint64_t)(uintptr_t)&x;
    if (x.c.rng == 0)
        x.c.rng = 1;
    x.lease_ms = db->opts.lease_ms > 0 ? db->opts.lease_ms : DSP_LEASE_MS_DEFAULT;
    x.renew_ms = db->opts.lease_renew_ms > 0 ? db->opts.lease_renew_ms : DSP_LEASE_RENEW_MS_DEFAULT;
    x.holder = db->lease.holder;
    mysql_thread_init();

    pthread_mutex_lock(&db->mu);
    while (!db->lease.stop) {
        int64_t wait, until;
        pthread_mutex_unlock(&db->mu);
        dsp_db_lease_check(db); /* past valid_until: give it up before anything else */
        wait = lease_step(&x);
        pthread_mutex_lock(&db->mu);
        until = dsp_now_ms() + wait;
        if (db->lease.held && db->lease.valid_until < until)
            until = db->lease.valid_until;
        while (!db->lease.stop && !db->lease.renew_now && dsp_now_ms() < until)
            cond_wait_until(&db->lease.cv, &db->mu, until);
        db->lease.renew_now = false;
    }
    db->lease.held = false;
    pthread_mutex_unlock(&db->mu);

    lease_release(&x);
    dsp_dbi_conn_close(&x.c);
    mysql_thread_end();
    return NULL;
}
