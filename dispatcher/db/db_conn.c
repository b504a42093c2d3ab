/* db_conn: one MySQL connection of a database thread (struct dbconn, db_internal.h):
 * opening it with the session every thread relies on (timeouts, sql_mode, isolation,
 * the statement size the server allows), running a statement and reading a number,
 * sorting the server's errors into transient (reconnect with backoff) and
 * configuration (a wrong --db: give up), and the backoff itself. Each thread owns its
 * connection; nothing here is shared between threads but the counters of dsp_db. */
#include "db_internal.h"

#include <mysql.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Every blocking client call ends within these (seconds): a dead server costs a
 * reconnect, never a thread stuck forever. The read timeout must exceed GET_LOCK's
 * wait and the session's lock wait timeout. */
#define CONNECT_TIMEOUT_S 5u
/* With several servers (--db's list) a server that does not complete the handshake in
 * this long is taken as dead or frozen, and the next one is tried: a frozen node costs
 * its statement's read timeout plus this, not plus 5 s. */
#define LIST_CONNECT_TIMEOUT_S 2u
#define RW_TIMEOUT_S 15u
#define LOCK_WAIT_TIMEOUT_S 10

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

#define STMT_MARGIN 1024u               /* kept free below max_allowed_packet */
#define STMT_CAP (64u * 1024 * 1024)    /* largest statement built, whatever the server allows */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* The next reconnect wait: 100 ms doubling up to 5 s, plus up to a quarter of jitter
 * so that restarted dispatchers and both threads do not knock in step. */
int64_t dsp_dbi_backoff_next(struct dbconn *c)
{
    int64_t base = c->backoff_ms ? c->backoff_ms : BACKOFF_MIN_MS;
    int64_t cap = BACKOFF_MAX_MS * 4 / 5;
    int64_t d;

    if (base > cap)
        base = cap;
    d = base + (int64_t)(rng_next(&c->rng) % (uint64_t)(base / 4 + 1));
    c->backoff_ms = base * 2;
    return d;
}

bool dsp_dbi_error_is_conflict(unsigned e)
{
    return e == ER_LOCK_DEADLOCK_ || e == ER_LOCK_WAIT_TIMEOUT_;
}

#define CONFLICT_PAUSE_MAX_MS 64

int dsp_dbi_conflict_retry(struct dbconn *c, unsigned tries)
{
    int64_t ms = tries >= 7 ? CONFLICT_PAUSE_MAX_MS : (int64_t)1 << (tries ? tries - 1 : 0);
    struct timespec ts;

    /* A deadlock victim was rolled back whole already; a lock wait timeout undid only
     * its statement (innodb_rollback_on_timeout is off by default). */
    if (dsp_dbi_exec_str(c, "ROLLBACK") < 0)
        return -1;
    atomic_fetch_add_explicit(&c->db->cert_retries, 1, memory_order_relaxed);
    log_debug(c->db->log, "%s connection: transaction aborted by a conflict (error %u, try %u of %d); running it again",
              c->who, c->err, tries, DSP_DBI_CONFLICT_TRIES);
    ms += (int64_t)(rng_next(&c->rng) % (uint64_t)(ms / 2 + 1)); /* two retriers out of step */
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
    return 0;
}

/* True when the error says the connection or the server is the problem (reconnect and
 * try again), false for an error about the statement itself. */
bool dsp_dbi_error_is_transient(unsigned e)
{
    if (e >= 2000 && e < 3000) /* client errors: lost connection, timeouts, ... */
        return true;
    switch (e) {
    case ER_CON_COUNT_ERROR_:
    case ER_SERVER_SHUTDOWN_:
    case ER_NO_SUCH_TABLE_:
    case ER_NET_PACKET_TOO_LARGE_:
    case ER_TOO_MANY_USER_CONNECTIONS_:
    case ER_LOCK_WAIT_TIMEOUT_:
    case ER_LOCK_DEADLOCK_:
    case ER_USER_LIMIT_REACHED_:
    case ER_OPTION_PREVENTS_STATEMENT_:
    case ER_QUERY_INTERRUPTED_:
    case ER_READ_ONLY_MODE_:
    case ER_CONNECTION_KILLED_:
    case ER_CLIENT_INTERACTION_TIMEOUT_:
        return true;
    }
    return e >= 1152 && e <= 1161; /* ER_NET_* */
}

bool dsp_dbi_error_is_config(unsigned e)
{
    return e == ER_ACCESS_DENIED_ERROR_ || e == ER_ACCESS_DENIED_NO_PASSWORD_ERROR_ ||
           e == ER_DBACCESS_DENIED_ERROR_ || e == ER_BAD_DB_ERROR_;
}

bool dsp_dbi_streak_loud(unsigned failures)
{
    return failures > 0 && (failures & (failures - 1)) == 0;
}

/* A failed statement's line: at debug when c's owner reports the streak (c->quiet) or
 * when the statement will run again (a conflict, retried). */
static void log_failed(struct dbconn *c, const char *sql, bool retried)
{
    dsp_log_at(c->db->log, c->quiet || retried ? DSP_LOG_DEBUG : DSP_LOG_WARN,
               "%s connection: %s (error %u) in: %.160s", c->who,
               c->err && c->m ? mysql_error(c->m) : "no result", c->err, sql);
}

/* After a failure of try `tries` of a statement on c: true when it is to run again (a
 * conflict on an autocommit connection, tries left). A connection in a transaction is
 * not retried here: the conflict undid the whole transaction, which its owner runs
 * again. A lock wait timeout is retried only where locks are not waited for (the write
 * connection: it came at once); after a wait of LOCK_WAIT_TIMEOUT_S, 8 more would hold
 * the thread for over a minute. */
static bool conflict_again(struct dbconn *c, unsigned tries)
{
    return c->autocommit && dsp_dbi_error_is_conflict(c->err) &&
           (c->err != ER_LOCK_WAIT_TIMEOUT_ || c->no_lock_wait) && tries < DSP_DBI_CONFLICT_TRIES;
}

/* One query whose result is stored; NULL on error (c->err set, not logged). */
static MYSQL_RES *query_once(struct dbconn *c, const char *sql, size_t len)
{
    MYSQL_RES *res;

    atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)len) != 0 || (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        return NULL;
    }
    return res;
}

/* One statement, any result discarded; *affected gets the changed rows. 0, or -1 with
 * c->err set (not logged). */
static int exec_once(struct dbconn *c, const char *sql, size_t len, uint64_t *affected)
{
    atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)len) != 0) {
        c->err = mysql_errno(c->m);
        return -1;
    }
    if (mysql_field_count(c->m) != 0) {
        MYSQL_RES *res = mysql_store_result(c->m);
        if (res == NULL) {
            c->err = mysql_errno(c->m);
            return -1;
        }
        mysql_free_result(res);
        if (affected)
            *affected = 0;
        return 0;
    }
    if (affected) {
        /* (uint64_t): my_ulonglong is not in every client library's header. */
        uint64_t n = (uint64_t)mysql_affected_rows(c->m);
        *affected = n == UINT64_MAX ? 0 : n;
    }
    return 0;
}

MYSQL_RES *dsp_dbi_query(struct dbconn *c, const char *sql, size_t len)
{
    MYSQL_RES *res = query_once(c, sql, len);
    if (res == NULL)
        log_failed(c, sql, false);
    return res;
}

MYSQL_RES *dsp_dbi_query_retry(struct dbconn *c, const char *sql, size_t len)
{
    for (unsigned tries = 1;; tries++) {
        MYSQL_RES *res = query_once(c, sql, len);
        if (res != NULL)
            return res;
        bool again = conflict_again(c, tries);
        log_failed(c, sql, again);
        if (!again || dsp_dbi_conflict_retry(c, tries) < 0)
            return NULL;
    }
}

int dsp_dbi_exec(struct dbconn *c, const char *sql, size_t len, uint64_t *affected)
{
    if (exec_once(c, sql, len, affected) == 0)
        return 0;
    log_failed(c, sql, false);
    return -1;
}

int dsp_dbi_exec_retry(struct dbconn *c, const char *sql, size_t len, uint64_t *affected)
{
    for (unsigned tries = 1;; tries++) {
        if (exec_once(c, sql, len, affected) == 0)
            return 0;
        bool again = conflict_again(c, tries);
        log_failed(c, sql, again);
        if (!again || dsp_dbi_conflict_retry(c, tries) < 0)
            return -1;
    }
}

int dsp_dbi_lock_wait_min(const struct dbconn *c)
{
    /* MySQL's innodb_lock_wait_timeout starts at 1 (it would turn a 0 into 1 with a
     * warning); MariaDB's 0 means no wait. */
    return c->mysql ? 1 : 0;
}

int dsp_dbi_exec_str(struct dbconn *c, const char *sql)
{
    return dsp_dbi_exec(c, sql, strlen(sql), NULL);
}

/* A statement whose one parameter (a result, a payload) is too large for its text:
 * prepared, and the value sent as long data. */
/* Pieces of a parameter sent by dsp_dbi_exec_blob: each is one packet to the server. */
#define BLOB_CHUNK (1024u * 1024)

int dsp_dbi_exec_blob(struct dbconn *c, const char *sql, size_t sql_len, const uint8_t *data,
                      size_t len, uint64_t *affected)
{
    dsp_db *db = c->db;
    MYSQL_STMT *st = mysql_stmt_init(c->m);
    MYSQL_BIND bind;
    unsigned long none = 0; /* the value comes as long data, not from a buffer */
    size_t off, n;
    int rc = -1;

    if (st == NULL) {
        c->err = mysql_errno(c->m) ? mysql_errno(c->m) : 2008; /* CR_OUT_OF_MEMORY */
        log_warn(db->log, "%s connection: no statement handle (error %u)", c->who, c->err);
        return -1;
    }
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_stmt_prepare(st, sql, (unsigned long)sql_len) != 0)
        goto out;
    memset(&bind, 0, sizeof bind);
    bind.buffer_type = MYSQL_TYPE_BLOB;
    bind.length = &none;
    if (mysql_stmt_bind_param(st, &bind) != 0)
        goto out;
    for (off = 0; off < len; off += n) {
        n = len - off < BLOB_CHUNK ? len - off : BLOB_CHUNK;
        if (mysql_stmt_send_long_data(st, 0, (const char *)data + off, (unsigned long)n) != 0)
            goto out;
    }
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_stmt_execute(st) != 0)
        goto out;
    if (affected) {
        uint64_t a = (uint64_t)mysql_stmt_affected_rows(st);
        *affected = a == UINT64_MAX ? 0 : a;
    }
    rc = 0;
out:
    if (rc < 0) {
        c->err = mysql_stmt_errno(st);
        log_warn(db->log, "%s connection: %s (error %u) in: %.160s", c->who, mysql_stmt_error(st),
                 c->err, sql);
    }
    mysql_stmt_close(st);
    return rc;
}

/* Runs a query whose answer is one unsigned number. Returns 0 with *out set (*isnull
 * for SQL NULL), 1 when it returned no row, -1 on error (logged unless quiet_err is
 * that error number). */
int dsp_dbi_query_u64(struct dbconn *c, const char *sql, uint64_t *out, bool *isnull,
                        unsigned quiet_err)
{
    dsp_db *db = c->db;
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 1;

    *out = 0;
    *isnull = false;
    atomic_fetch_add_explicit(&db->statements, 1, memory_order_relaxed);
    if (mysql_real_query(c->m, sql, (unsigned long)strlen(sql)) != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        if (c->err != quiet_err)
            dsp_log_at(db->log, c->quiet ? DSP_LOG_DEBUG : DSP_LOG_WARN, "%s connection: %s (error %u) in: %.160s",
                   c->who, c->err ? mysql_error(c->m) : "no result", c->err, sql);
        return -1;
    }
    if ((row = mysql_fetch_row(res)) != NULL) {
        rc = 0;
        if (row[0] == NULL)
            *isnull = true;
        else
            *out = strtoull(row[0], NULL, 10);
    }
    mysql_free_result(res);
    return rc;
}

static void node_failed(dsp_db *db, unsigned node, const char *why);

/* A statement error after which the server of a list is left for the next one: the
 * node left its cluster's primary component (1047, WSREP not ready). A lost connection
 * or a statement past its read timeout is not enough: while a cluster evicts a dead
 * node every node's commits wait, and leaving one would only hop from node to node. The
 * reconnect tells: a dead node refuses it, a frozen one does not finish the handshake
 * within LIST_CONNECT_TIMEOUT_S, and either moves every connection on. */
static bool error_leaves_node(unsigned e)
{
    return e == 1047; /* ER_UNKNOWN_COM_ERROR: WSREP has not yet prepared node */
}

/* The registry of open connections (dsp_db.open_conns): a connection is in it from its
 * open to its close, so that its socket is valid whenever another thread finds it there. */
static void conn_register(struct dbconn *c, bool add)
{
    dsp_db *db = c->db;

    pthread_mutex_lock(&db->conns_mu);
    for (size_t i = 0; i < DB_OPEN_CONNS_MAX; i++) {
        if (add && db->open_conns[i] == NULL) {
            db->open_conns[i] = c;
            break;
        }
        if (!add && db->open_conns[i] == c)
            db->open_conns[i] = NULL;
    }
    pthread_mutex_unlock(&db->conns_mu);
}

/* Node failed: the connections still open on it, possibly waiting in a statement on a
 * frozen or cut-off server for their whole read timeout, are cut at the socket; each
 * owner sees the connection lost (2013) at once, closes it and reconnects to the node in
 * use. A KILL cannot reach a server that does not answer. */
static void conns_cut(dsp_db *db, unsigned node)
{
    pthread_mutex_lock(&db->conns_mu);
    for (size_t i = 0; i < DB_OPEN_CONNS_MAX; i++) {
        struct dbconn *o = db->open_conns[i];
        if (o != NULL && o->node == node && o->m != NULL) {
            my_socket fd = mysql_get_socket(o->m);
            if (fd >= 0)
                shutdown(fd, SHUT_RDWR);
        }
    }
    pthread_mutex_unlock(&db->conns_mu);
}

void dsp_dbi_conn_close(struct dbconn *c)
{
    if (c->m) {
        unsigned e = mysql_errno(c->m); /* of the last call: 0 after a success */
        conn_register(c, false);
        if (c->db->opts.url->nnodes > 1 && error_leaves_node(e)) {
            char why[320];
            snprintf(why, sizeof why, "failed a statement: %.200s (error %u)", mysql_error(c->m), e);
            node_failed(c->db, c->node, why);
        }
        mysql_close(c->m);
        c->m = NULL;
    }
}

/* The dialect of a new connection m: the one --sql-dialect forces, else MySQL's unless
 * the server's version string names MariaDB (e.g. "10.11.6-MariaDB-0+deb12u1"; MySQL's is
 * "8.4.3"). Logged when it differs from the last connection's (once, normally). */
static int conn_dialect(dsp_db *db, MYSQL *m)
{
    const char *info = mysql_get_server_info(m);
    int forced = db->opts.sql_dialect;
    int d = forced != DSP_SQL_DIALECT_AUTO ? forced
            : info != NULL && strstr(info, "MariaDB") != NULL ? DSP_SQL_DIALECT_MARIADB
                                                              : DSP_SQL_DIALECT_MYSQL;

    if (atomic_exchange(&db->sql_dialect_seen, d) != d)
        log_info(db->log, "SQL dialect: %s (server version %.80s; %s)", dsp_sql_dialect_name(d),
                 info ? info : "unknown", forced != DSP_SQL_DIALECT_AUTO ? "forced by --sql-dialect" : "detected");
    return d;
}

bool dsp_dbi_conn_stale(const struct dbconn *c)
{
    return c->m != NULL && c->db->opts.url->nnodes > 1 && c->node != atomic_load(&c->db->node);
}

/* The server node of --db's list failed (why, for the log): every connection moves to
 * the next one. Only the first of the threads that saw node fail moves it. */
static void node_failed(dsp_db *db, unsigned node, const char *why)
{
    const dsp_db_url *u = db->opts.url;
    unsigned next = (node + 1) % (unsigned)u->nnodes;

    if (!atomic_compare_exchange_strong(&db->node, &node, next))
        return;
    atomic_fetch_add(&db->node_moves, 1);
    conns_cut(db, node);
    log_warn(db->log, "database server %s:%u %s; moving to %s:%u", u->nodes[node].host,
             u->nodes[node].port ? u->nodes[node].port : 3306, why, u->nodes[next].host,
             u->nodes[next].port ? u->nodes[next].port : 3306);
}

/* A Galera node serves only when synced (wsrep_local_state 4: not joining, donating,
 * or out of the primary component); a server without wsrep has no such status.
 * 1: a synced Galera node; 0: no Galera; -1: not synced, or the connection failed. */
static int node_serves(struct dbconn *c, char *why, size_t cap)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    int rc = 0;

    atomic_fetch_add_explicit(&c->db->statements, 1, memory_order_relaxed);
    if (mysql_query(c->m, "SHOW STATUS LIKE 'wsrep_local_state'") != 0 ||
        (res = mysql_store_result(c->m)) == NULL) {
        c->err = mysql_errno(c->m);
        snprintf(why, cap, "failed: %s (error %u)", mysql_error(c->m), c->err);
        return -1;
    }
    if ((row = mysql_fetch_row(res)) != NULL && row[1] != NULL) {
        rc = strcmp(row[1], "4") == 0 ? 1 : -1;
        if (rc < 0)
            snprintf(why, cap, "is not synced with its cluster (wsrep_local_state %.8s)", row[1]);
    }
    mysql_free_result(res);
    return rc;
}

/* Opens the connection and sets the session up; want_packet reads max_allowed_packet
 * into c->stmt_limit. Returns 0 or -1 (logged). */
int dsp_dbi_conn_open(struct dbconn *c, bool autocommit, bool want_packet)
{
    dsp_db *db = c->db;
    const dsp_db_url *u = db->opts.url;
    unsigned int connect_to = u->nnodes > 1 ? LIST_CONNECT_TIMEOUT_S : CONNECT_TIMEOUT_S, rw_to = c->rw_timeout_s ? c->rw_timeout_s : RW_TIMEOUT_S,
                 proto;
    unsigned node = u->nnodes > 1 ? atomic_load(&db->node) % (unsigned)u->nnodes : 0;
    const char *host = u->nnodes ? u->nodes[node].host : u->host;
    unsigned port = 0, node_port = u->nnodes ? u->nodes[node].port : u->port;
    const char *sock = NULL;
    uint64_t packet;
    bool isnull;
    MYSQL *m;

    c->m = NULL;
    if ((m = mysql_init(NULL)) == NULL) {
        log_error(db->log, "%s connection: out of memory", c->who);
        return -1;
    }
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &connect_to);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rw_to);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &rw_to);
    /* Type names and error texts travel as utf8mb4. Automatic reconnection stays off
     * (the default of both client libraries; setting it explicitly prints a
     * deprecation warning with libmysqlclient 8): a silent reconnect would drop the
     * leadership lock and the session settings. We reconnect ourselves. */
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (node_port || u->nnodes > 1) {
        /* A port means TCP, even to localhost; so does a list of servers. */
        proto = MYSQL_PROTOCOL_TCP;
        port = node_port;
        mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    } else if (u->socket) {
        proto = MYSQL_PROTOCOL_SOCKET;
        sock = u->socket;
        mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    }
    if (mysql_real_connect(m, host, u->user, u->password, u->dbname, port, sock, c->client_flag) ==
        NULL) {
        c->err = mysql_errno(m);
        snprintf(c->errtext, sizeof c->errtext, "%s", mysql_error(m));
        /* At the first connect, the claim thread makes a configuration error fatal
         * (db_claim.c): "retrying" would mislead. */
        if (!c->ever_connected && dsp_dbi_error_is_config(c->err))
            log_debug(db->log, "%s connection: %s (error %u)", c->who, mysql_error(m), c->err);
        else if (!c->down_logged)
            log_warn(db->log, "%s connection to %s: %s (error %u); retrying with backoff", c->who,
                     host ? host : "(default)", mysql_error(m), c->err);
        else
            log_debug(db->log, "%s connection: %s (error %u)", c->who, mysql_error(m), c->err);
        c->down_logged = true;
        if (u->nnodes > 1 && !dsp_dbi_error_is_config(c->err)) {
            char why[320];
            snprintf(why, sizeof why, "refused a connection: %.200s (error %u)", mysql_error(m), c->err);
            node_failed(db, node, why);
        }
        mysql_close(m);
        return -1;
    }
    c->m = m;
    c->node = node;
    c->autocommit = autocommit;
    conn_register(c, true);
    {
        char why[320];
        int galera = node_serves(c, why, sizeof why);
        if (galera < 0) {
            if (u->nnodes > 1)
                node_failed(db, node, why);
            else
                log_warn(db->log, "%s connection: database server %s", c->who, why);
            goto fail;
        }
        /* On Galera a read sees what another node committed only after waiting for it:
         * the lease's and the claims' reads (recovery too) must see the latest writes. */
        bool reads_latest = c->who && (strncmp(c->who, "claim", 5) == 0 || strcmp(c->who, "lease") == 0);
        c->galera = galera == 1;
        if (galera == 1 && reads_latest && dsp_dbi_exec_str(c, "SET SESSION wsrep_sync_wait = 1") < 0)
            goto fail;
        /* A transaction whose write set passes these limits fails at commit, whatever
         * the retries: the claims and the result statements stay within them. */
        c->ws_max_rows = 0;
        c->ws_max_bytes = 0;
        if (galera == 1 &&
            (dsp_dbi_query_u64(c, "SELECT @@wsrep_max_ws_rows", &c->ws_max_rows, &isnull, 0) != 0 ||
             dsp_dbi_query_u64(c, "SELECT @@wsrep_max_ws_size", &c->ws_max_bytes, &isnull, 0) != 0))
            goto fail;
    }
    c->mysql = conn_dialect(db, m) == DSP_SQL_DIALECT_MYSQL;

    /* READ COMMITTED, although REPEATABLE READ measured 20-40 % faster for claims on
     * MariaDB 10.11: at REPEATABLE READ the locking claim (FOR UPDATE SKIP LOCKED) takes
     * next-key and gap locks at the end of the range of claim_idx it scanned, which is
     * exactly where producers' INSERTs of new NEW rows land, so producers would wait for
     * the claim's commit. READ COMMITTED takes no gap locks: a claim never makes an
     * INSERT wait, and that is a hard requirement. */
    if (dsp_dbi_exec_str(c, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") < 0)
        goto fail;
    /* A lock wait (rare: recovery against an old dispatcher's last writes) must end as a
     * server error before the client's read timeout drops the connection. */
    {
        char sql[96];
        snprintf(sql, sizeof sql, "SET SESSION innodb_lock_wait_timeout = %d, autocommit = %d",
                 c->no_lock_wait ? dsp_dbi_lock_wait_min(c) : LOCK_WAIT_TIMEOUT_S, autocommit ? 1 : 0);
        if (dsp_dbi_exec_str(c, sql) < 0)
            goto fail;
    }
    /* The writes are the statements that can grow large. */
    c->stmt_limit = STMT_MARGIN;
    c->max_packet = 0;
    if (want_packet) {
        if (dsp_dbi_query_u64(c, "SELECT @@max_allowed_packet", &packet, &isnull, 0) != 0)
            goto fail;
        c->max_packet = packet > SIZE_MAX ? SIZE_MAX : (size_t)packet;
        if (packet > STMT_CAP)
            packet = STMT_CAP;
        c->stmt_limit = packet > 2 * STMT_MARGIN ? (size_t)packet - STMT_MARGIN : STMT_MARGIN;
    }

    if (dsp_dbi_lease_conn_opened(c) < 0) /* recorded in the lease before it acts as leader */
        goto fail;
    if (c->ever_connected) {
        atomic_fetch_add_explicit(&db->reconnects, 1, memory_order_relaxed);
        dsp_log_at(db->log, c->quiet ? DSP_LOG_DEBUG : DSP_LOG_INFO, "%s connection: reconnected", c->who);
    }
    c->ever_connected = true;
    c->down_logged = false;
    c->backoff_ms = 0;
    return 0;

fail:
    dsp_dbi_conn_close(c);
    return -1;
}
