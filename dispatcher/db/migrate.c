/* migrate: see migrate.h.
 *
 * --migrate runs on the main thread before anything else starts, with blocking MySQL
 * calls: one connection holds the table's leadership lock (the one db.c takes) for the
 * whole run, so that no taskpushd can lead the table while its schema changes under it,
 * and each migration gets a fresh connection of its own (its session settings and user
 * variables die with it).
 *
 * A migration's text is one multi-statement query, and the server runs all of it even
 * when the client is gone (kill -9 of --migrate): the lock connection's end frees the
 * leadership lock while the rest of the text still runs. So each migration connection
 * also holds the migration lock ('taskpush-migrate.<dbname>') from before its text until
 * the server ends that connection, i.e. after its last statement; a --migrate waits for
 * that lock to be free before it reads the version, and so never runs a step beside a
 * killed run's leftover (which made a rerun fail with "Duplicate column name").
 */
#include "migrate.h"

#include "db_claim_sql.h"
#include "db.h"

#include <mysql.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CONNECT_TIMEOUT_S 5u
/* The lock connection only runs short statements. */
#define LOCK_CONN_RW_TIMEOUT_S 30u
/* A migration's ALTER TABLE waits for every open transaction on the table (a producer's
 * included), and every later INSERT queues behind the ALTER: give up after this long,
 * leave the database as it was, and let the operator run it again at a quieter time. */
#define MIGRATION_LOCK_WAIT_S 60

#define ER_NO_SUCH_TABLE_ 1146u

/* How long --migrate waits for an earlier run's statements to end (a killed --migrate's
 * ALTER of a large table runs on), in waits of MIGRATION_WAIT_STEP_S. */
#define MIGRATION_WAIT_MAX_S 3600
#define MIGRATION_WAIT_STEP_S 10

/* The migration lock's name: 'taskpush-migrate.<dbname>', cut to the 64 bytes MySQL
 * allows at a UTF-8 boundary (as dsp_db_lock_name cuts). Returns its length, 0 if none. */
static size_t migration_lock_name(const char *dbname, const dsp_table_names *t, char *out,
                                  size_t cap)
{
    size_t n;

    if (cap <= DSP_DB_LOCK_NAME_MAX)
        return 0;
    /* Another table's carries its name, as its leadership lock does (db.h). */
    if (t->is_default)
        snprintf(out, cap, "taskpush-migrate.%s", dbname);
    else
        snprintf(out, cap, "taskpush-migrate/%s.%s", t->task, dbname);
    n = strlen(out);
    if (n > DSP_DB_LOCK_NAME_MAX)
        n = DSP_DB_LOCK_NAME_MAX;
    while (n > 0 && ((unsigned char)out[n] & 0xC0) == 0x80)
        n--; /* not in the middle of a character */
    out[n] = '\0';
    return n;
}

int dsp_schema_version_problem(uint64_t v, char *buf, size_t cap)
{
    const uint64_t known = DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN;

    if (v == known)
        return 0;
    if (v >= 1 && v < known) {
        snprintf(buf, cap,
                 "schema version %" PRIu64 " is older than this taskpushd (%" PRIu64 "): run"
                 " `taskpushd --db ... --migrate` (the same --db) with every taskpushd on it"
                 " stopped",
                 v, known);
        return 1;
    }
    if (v > known)
        snprintf(buf, cap,
                 "schema version %" PRIu64 " is newer than this taskpushd knows (%" PRIu64
                 "): upgrade taskpushd",
                 v, known);
    else
        snprintf(buf, cap,
                 "schema version %" PRIu64 " is not one any taskpushd wrote (this one knows"
                 " 1 to %" PRIu64 ")",
                 v, known);
    return -1;
}

/* The names dsp_schema_missing_sql looks for (sql/schema.sql; tests/data/schema-v1.sql
 * for version 1). */
static const char *const columns_every_version[] = {
    "task_id", "task_type", "task_state", "task_priority", "payload", "insert_time",
    "last_update_time", "attempts", "max_attempts", "run_after", "timeout_ms", "dedup_key",
    "err_msg", "result", "epoch", "delayed"};
static const char *const columns_current[] = {
    "task_id", "task_type", "task_state", "task_priority", "payload", "insert_time",
    "last_update_time", "attempts", "max_attempts", "run_after", "timeout_ms", "dedup_key",
    "err_msg", "result", "epoch", "delayed", "claim_lane", "failed_at"};
static const char *const indexes_current[] = {"claim_idx", "delay_idx", "failed_idx"};

void dsp_schema_missing_sql(dsp_strbuf *b, const dsp_table_names *t, enum dsp_schema_names which)
{
    const char *const *names = which == DSP_SCHEMA_COLUMNS_EVERY_VERSION ? columns_every_version
                               : which == DSP_SCHEMA_COLUMNS_CURRENT    ? columns_current
                                                                        : indexes_current;
    size_t n = which == DSP_SCHEMA_COLUMNS_EVERY_VERSION
                   ? sizeof columns_every_version / sizeof *columns_every_version
               : which == DSP_SCHEMA_COLUMNS_CURRENT ? sizeof columns_current / sizeof *columns_current
                                                     : sizeof indexes_current / sizeof *indexes_current;
    bool index = which == DSP_SCHEMA_INDEXES_CURRENT;

    dsp_strbuf_puts(b, "SELECT GROUP_CONCAT(n ORDER BY o SEPARATOR ', ') FROM (");
    for (size_t i = 0; i < n; i++)
        dsp_strbuf_printf(b, "%sSELECT %zu AS o, '%s' AS n", i ? " UNION ALL " : "", i, names[i]);
    /* The name is [A-Za-z_][A-Za-z0-9_]* (tables.h): no quoting needed. */
    dsp_strbuf_printf(b,
                      ") w WHERE n NOT IN (SELECT %s FROM information_schema.%s WHERE"
                      " table_schema = DATABASE() AND table_name = '%s')",
                      index ? "index_name" : "column_name", index ? "statistics" : "columns",
                      dsp_table_names_or_task(t)->task);
}

void dsp_schema_exists_sql(dsp_strbuf *b, const dsp_table_names *t)
{
    dsp_strbuf_printf(b,
                      "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema ="
                      " DATABASE() AND table_name = '%s'",
                      dsp_table_names_or_task(t)->task);
}

const char *dsp_schema_version_sql(char out[DSP_SCHEMA_SQL_MAX], const dsp_table_names *t)
{
    snprintf(out, DSP_SCHEMA_SQL_MAX, DSP_CLAIM_SQL_SCHEMA_VERSION_FMT,
             dsp_table_names_or_task(t)->meta);
    return out;
}

void dsp_schema_foreign_text(char *out, size_t cap, const dsp_table_names *t, const char *who,
                             const char *dbname, const char *cols, const char *idx,
                             bool have_version)
{
    t = dsp_table_names_or_task(t);
    snprintf(
        out, cap,
        "%s: the table %s of database %.64s is not taskpush's: it lacks%s%.160s%s%.60s"
        " that taskpush needs (sql/schema.sql)%s%s%s; taskpushd changes nothing (docs/adopting.md"
        " moves a table of one's own to taskpush)",
        who, t->task, dbname, cols[0] ? " the columns " : "", cols,
        idx[0] ? (cols[0] ? " and the indexes " : " the indexes ") : "", idx,
        have_version ? "" : ", and ", have_version ? "" : t->meta,
        have_version ? "" : " has no schema_version");
}

/* Runs a query of one row and one text column into out (empty for NULL or no row; cut
 * to cap - 1 bytes). Returns 0 or -1 (mysql_errno(m) says why). */
static int query_text(MYSQL *m, const char *sql, char *out, size_t cap)
{
    MYSQL_RES *res;
    MYSQL_ROW row;

    out[0] = '\0';
    if (mysql_query(m, sql) != 0 || (res = mysql_store_result(m)) == NULL)
        return -1;
    row = mysql_fetch_row(res);
    if (row && mysql_num_fields(res) >= 1 && row[0]) {
        unsigned long n = mysql_fetch_lengths(res)[0];
        if (n >= cap)
            n = (unsigned long)cap - 1;
        memcpy(out, row[0], n);
        out[n] = '\0';
    }
    mysql_free_result(res);
    return 0;
}

static MYSQL *open_conn(const dsp_db_url *u, bool for_migration, FILE *err)
{
    unsigned int connect_to = CONNECT_TIMEOUT_S, rw_to = LOCK_CONN_RW_TIMEOUT_S, proto;
    unsigned port = 0;
    const char *sock = NULL;
    MYSQL *m = mysql_init(NULL);

    if (m == NULL) {
        fprintf(err, "taskpushd: out of memory\n");
        return NULL;
    }
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &connect_to);
    if (!for_migration) { /* an ALTER of a big table may take long: no read timeout */
        mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rw_to);
        mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &rw_to);
    }
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (u->port) { /* a port means TCP, even to localhost (as in db.c) */
        proto = MYSQL_PROTOCOL_TCP;
        port = u->port;
        mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    } else if (u->socket) {
        proto = MYSQL_PROTOCOL_SOCKET;
        sock = u->socket;
        mysql_options(m, MYSQL_OPT_PROTOCOL, &proto);
    }
    if (mysql_real_connect(m, u->host, u->user, u->password, u->dbname, port, sock,
                           for_migration ? CLIENT_MULTI_STATEMENTS : 0) == NULL) {
        fprintf(err, "taskpushd: cannot connect to database %s: %s (error %u)\n", u->dbname,
                mysql_error(m), mysql_errno(m));
        mysql_close(m);
        return NULL;
    }
    return m;
}

/* Runs a query of one row and one numeric column. Returns 0 with *v, 1 when the answer
 * is no row or NULL, -1 on error (mysql_errno(m) says which). */
static int query_u64(MYSQL *m, const char *sql, uint64_t *v)
{
    MYSQL_RES *res;
    MYSQL_ROW row;
    char *end;
    int rc = 1;

    if (mysql_query(m, sql) != 0 || (res = mysql_store_result(m)) == NULL)
        return -1;
    row = mysql_fetch_row(res);
    if (row && mysql_num_fields(res) >= 1 && row[0]) {
        *v = strtoull(row[0], &end, 10);
        rc = *end == '\0' && end != row[0] ? 0 : 1;
    }
    mysql_free_result(res);
    return rc;
}

static void report_sql_error(FILE *err, MYSQL *m, const char *what)
{
    fprintf(err, "taskpushd: %s: %s (error %u)\n", what, mysql_error(m), mysql_errno(m));
}

/* Sends a migration's text (sql, len bytes: its names already the table's) and reads
 * every result. Returns 0, or -1 with the failing statement's number (from 1) in *failed. */
static int run_text(MYSQL *m, const char *sql, size_t len, unsigned *failed)
{
    MYSQL_RES *res;
    unsigned n = 1;
    int st;

    *failed = 1;
    if (mysql_real_query(m, sql, (unsigned long)len) != 0)
        return -1;
    for (;;) {
        res = mysql_store_result(m);
        if (res)
            mysql_free_result(res);
        else if (mysql_field_count(m) != 0)
            break; /* a result set that could not be read */
        st = mysql_next_result(m);
        if (st < 0)
            return 0; /* no more results */
        n++;
        if (st > 0)
            break; /* statement n failed */
    }
    *failed = n;
    return -1;
}

/* Applies one migration on a connection of its own, which holds the migration lock (named
 * by the quoted mlock) until the server ends it, its text naming t's tables (the
 * migrations are written for task's). Returns 0 or -1 (reported). */
static int apply(const dsp_db_url *url, const dsp_table_names *t, const dsp_migration *mig,
                 const char *mlock, FILE *err)
{
    char sql[64 + 2 * DSP_DB_LOCK_NAME_MAX];
    dsp_strbuf text = {0};
    unsigned failed;
    uint64_t got = 0;
    int rc = -1;
    MYSQL *m;

    dsp_table_names_subst(&text, t, mig->sql, mig->len);
    if (text.oom) {
        fprintf(err, "taskpushd: out of memory\n");
        dsp_strbuf_free(&text);
        return -1;
    }
    if ((m = open_conn(url, true, err)) == NULL) {
        dsp_strbuf_free(&text);
        return -1;
    }
    /* A wait: the previous migration's connection may not be ended on the server yet. */
    snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s', %d)", mlock, MIGRATION_WAIT_STEP_S);
    if (query_u64(m, sql, &got) != 0 || got != 1) {
        /* Nobody else can take it while this run holds the leadership lock, but a
         * killed run's leftover can, in theory, still hold it. */
        if (mig->version == 0)
            fprintf(err, "taskpushd: %s: the migration lock is held by another"
                         " connection; nothing was created. Run --migrate again\n",
                    mig->name);
        else
            fprintf(err, "taskpushd: schema %u -> %u: the migration lock is held by another"
                         " connection; nothing more was applied. Run --migrate again\n",
                    mig->version - 1, mig->version);
        mysql_close(m);
        return -1;
    }
    snprintf(sql, sizeof sql, "SET SESSION lock_wait_timeout = %d", MIGRATION_LOCK_WAIT_S);
    if (mysql_query(m, sql) != 0) {
        report_sql_error(err, m, "setting lock_wait_timeout");
    } else if (run_text(m, text.p, text.len, &failed) == 0) {
        rc = 0;
    } else if (mig->version == 0) {
        fprintf(err,
                "taskpushd: %s failed at statement %u of %s: %s (error %u).\n"
                "Fix the cause and run --migrate again: every statement of %s is CREATE ... IF"
                " NOT EXISTS or INSERT IGNORE.\n",
                mig->name, failed, mig->file, mysql_error(m), mysql_errno(m), mig->file);
    } else {
        fprintf(err,
                "taskpushd: schema %u -> %u (%s) failed at statement %u of %s: %s (error %u).\n"
                "The database stays at version %u. Fix the cause and run --migrate again:"
                " a migration is safe to re-run.\n",
                mig->version - 1, mig->version, mig->name, failed, mig->file, mysql_error(m),
                mysql_errno(m), mig->version - 1);
    }
    /* Every result was read (or the text stopped at an error): its statements are over.
     * Were this process killed before, the server would free the lock once the text ends. */
    snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK('%s')", mlock);
    (void)query_u64(m, sql, &got);
    mysql_close(m);
    dsp_strbuf_free(&text);
    return rc;
}

/* Waits, on the lock connection, until no connection holds the migration lock (quoted
 * mlock): a killed --migrate's text may still be running. Returns 0 once free, -1 when it
 * stays held (reported). */
static int wait_migration_lock(MYSQL *lk, const char *mlock, FILE *out, FILE *err)
{
    char sql[64 + 2 * DSP_DB_LOCK_NAME_MAX];
    uint64_t got, holder = 0;
    bool told = false;

    for (int waited = 0;; waited += MIGRATION_WAIT_STEP_S) {
        snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK('%s')", mlock);
        if (query_u64(lk, sql, &holder) == 1)
            return 0; /* NULL: free */
        if (mysql_errno(lk) != 0) {
            report_sql_error(err, lk, "reading the migration lock");
            return -1;
        }
        if (waited >= MIGRATION_WAIT_MAX_S) {
            fprintf(err,
                    "taskpushd: the statements of an earlier --migrate still run on connection"
                    " %" PRIu64 " after %d s (SHOW PROCESSLIST shows them); run --migrate again"
                    " once they ended. Nothing was changed\n",
                    holder, waited);
            return -1;
        }
        if (!told)
            fprintf(out,
                    "waiting for the statements of an earlier --migrate (killed?) still running"
                    " on connection %" PRIu64 " to end\n",
                    holder);
        fflush(out);
        told = true;
        /* Waits on the server for the lock, and lets it go at once. */
        snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s', %d)", mlock, MIGRATION_WAIT_STEP_S);
        if (query_u64(lk, sql, &got) < 0) {
            report_sql_error(err, lk, "waiting for the migration lock");
            return -1;
        }
        if (got == 1) {
            snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK('%s')", mlock);
            if (query_u64(lk, sql, &got) < 0) {
                report_sql_error(err, lk, "releasing the migration lock");
                return -1;
            }
            return 0;
        }
    }
}

/* Reads schema_version on m: 0 with *v; 1 when the database has no version (a message
 * on err says what to do); -1 on error (reported). */
static int read_version(MYSQL *m, const dsp_table_names *t, const char *dbname, uint64_t *v,
                        FILE *err)
{
    char vsql[DSP_SCHEMA_SQL_MAX], what[DSP_TABLE_IDENT_CAP + 16];
    dsp_strbuf q = {0};
    uint64_t ntask = 0;
    int rc = query_u64(m, dsp_schema_version_sql(vsql, t), v);

    if (rc == 0)
        return 0;
    if (rc < 0 && mysql_errno(m) != ER_NO_SUCH_TABLE_) {
        snprintf(what, sizeof what, "reading %s", t->meta);
        report_sql_error(err, m, what);
        return -1;
    }
    dsp_schema_exists_sql(&q, t);
    rc = q.oom ? -1 : query_u64(m, q.p, &ntask);
    dsp_strbuf_free(&q);
    if (rc < 0) {
        report_sql_error(err, m, "reading information_schema.tables");
        return -1;
    }
    if (ntask == 0) {
        /* None of the four: an empty database (for these names), which --migrate creates.
         * Some of the others without a version: made by hand, or half dropped. */
        q = (dsp_strbuf){0};
        dsp_strbuf_printf(&q,
                          "SELECT GROUP_CONCAT(table_name ORDER BY table_name SEPARATOR ', ')"
                          " FROM information_schema.tables WHERE table_schema = DATABASE() AND"
                          " table_name IN ('%s', '%s', '%s')",
                          t->meta, t->schedule, t->claim);
        char some[3 * DSP_TABLE_IDENT_CAP + 8];
        rc = q.oom ? -1 : query_text(m, q.p, some, sizeof some);
        dsp_strbuf_free(&q);
        if (rc < 0) {
            report_sql_error(err, m, "reading information_schema.tables");
            return -1;
        }
        if (some[0] == '\0')
            return 2;
        fprintf(err,
                "taskpushd: database %s has no %s table and no schema version, but has %s:"
                " --migrate cannot tell what they hold; it changed nothing (drop them to"
                " let --migrate create the schema)\n",
                dbname, t->task, some);
    } else
        fprintf(err,
                "taskpushd: database %s has a %s table but no schema version in"
                " %s: it was not made by sql/schema.sql, and --migrate cannot tell"
                " what it holds; it changed nothing\n",
                dbname, t->task, t->meta);
    return 1;
}

/* A task table without the columns every taskpush schema has is a team's own: --migrate
 * would ALTER it (with taskpush_meta stamped beside it by an old sql/schema.sql) or find
 * nothing to do. Returns 0 (no task table, or taskpush's), or 1 after saying why. */
static int refuse_foreign_table(MYSQL *m, const dsp_table_names *t, const char *dbname, FILE *err)
{
    dsp_strbuf sql = {0};
    char cols[256], text[DSP_SCHEMA_FOREIGN_MAX], vsql[DSP_SCHEMA_SQL_MAX];
    uint64_t ntask = 0, v;
    int rc = 1;

    dsp_schema_exists_sql(&sql, t);
    if (sql.oom || query_u64(m, sql.p, &ntask) < 0) {
        report_sql_error(err, m, "reading information_schema.tables");
        dsp_strbuf_free(&sql);
        return 1;
    }
    if (ntask == 0) {
        dsp_strbuf_free(&sql);
        return 0;
    }
    dsp_strbuf_reset(&sql);
    dsp_schema_missing_sql(&sql, t, DSP_SCHEMA_COLUMNS_EVERY_VERSION);
    if (sql.oom) {
        fprintf(err, "taskpushd: out of memory\n");
    } else if (query_text(m, sql.p, cols, sizeof cols) < 0) {
        report_sql_error(err, m, "reading information_schema.columns");
    } else if (cols[0] == '\0') {
        rc = 0;
    } else {
        bool have_version = query_u64(m, dsp_schema_version_sql(vsql, t), &v) == 0;
        dsp_schema_foreign_text(text, sizeof text, t, "--migrate refuses", dbname, cols, "",
                                have_version);
        fprintf(err, "taskpushd: %s\n", text);
    }
    dsp_strbuf_free(&sql);
    return rc;
}

int dsp_migrate_run(const dsp_db_url *url, const char *table, FILE *out, FILE *err)
{
    dsp_table_names names;
    const dsp_table_names *t = &names;
    char vsql[DSP_SCHEMA_SQL_MAX];
    char name[DSP_DB_LOCK_NAME_MAX + 1], quoted[2 * DSP_DB_LOCK_NAME_MAX + 1];
    char sql[3 * DSP_DB_LOCK_NAME_MAX + 64], why[DSP_SCHEMA_PROBLEM_MAX];
    char mname[DSP_DB_LOCK_NAME_MAX + 32], mquoted[2 * DSP_DB_LOCK_NAME_MAX + 1];
    uint64_t v = 0, got, holder;
    bool locked = false;
    int status = 1, rc;
    MYSQL *lk;

    if (dsp_table_names_init(&names, table ? table : DSP_TABLE_NAME_DEFAULT) < 0) {
        fprintf(err, "taskpushd: '%s' is not a table name taskpush takes\n", table);
        return 2;
    }
    if ((lk = open_conn(url, false, err)) == NULL)
        return 1;
    /* GET_LOCK with no wait: a leading taskpushd holds it (a standby is only waiting). */
    if (dsp_db_lock_name(url->dbname, t->task, NULL, name, sizeof name) == 0) {
        fprintf(err, "taskpushd: database name '%s' makes no lock name\n", url->dbname);
        goto done;
    }
    mysql_real_escape_string(lk, quoted, name, (unsigned long)strlen(name));
    snprintf(sql, sizeof sql, "SELECT GET_LOCK('%s', 0)", quoted);
    rc = query_u64(lk, sql, &got);
    if (rc < 0) {
        report_sql_error(err, lk, "taking the table's lock");
        goto done;
    }
    if (rc != 0) { /* GET_LOCK answers NULL on an error of its own */
        fprintf(err, "taskpushd: GET_LOCK('%s', 0) failed; nothing was changed\n", name);
        goto done;
    }
    if (got != 1) {
        snprintf(sql, sizeof sql, "SELECT IS_USED_LOCK('%s')", quoted);
        if (query_u64(lk, sql, &holder) != 0)
            holder = 0;
        fprintf(err,
                "taskpushd: a taskpushd leads database %s (it holds the lock '%s', connection"
                " %" PRIu64 "): stop every taskpushd on it, standbys too, then run --migrate"
                " again; nothing was changed\n",
                url->dbname, name, holder);
        goto done;
    }
    locked = true;

    if (migration_lock_name(url->dbname, t, mname, sizeof mname) == 0) {
        fprintf(err, "taskpushd: database name '%s' makes no lock name\n", url->dbname);
        goto done;
    }
    mysql_real_escape_string(lk, mquoted, mname, (unsigned long)strlen(mname));
    if (wait_migration_lock(lk, mquoted, out, err) < 0)
        goto done;

    if (refuse_foreign_table(lk, t, url->dbname, err) != 0)
        goto done;
    rc = read_version(lk, t, url->dbname, &v, err);
    if (rc == 2) {
        /* sql/schema.sql, named after the table; its first statements are the guard
         * against a foreign table (none here: the table does not exist). */
        const dsp_migration create = {0, "creating the schema", "sql/schema.sql", dsp_schema_sql,
                                      dsp_schema_sql_len};
        if (apply(url, t, &create, mquoted, err) < 0)
            goto done;
        rc = query_u64(lk, dsp_schema_version_sql(vsql, t), &got);
        if (rc != 0 || got != DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN) {
            if (rc < 0)
                report_sql_error(err, lk, "reading schema_version back");
            else
                fprintf(err, "taskpushd: sql/schema.sql ran, but %s holds no schema_version %d\n",
                        t->meta, DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN);
            goto done;
        }
        fprintf(out, "created schema version %d: tables %s, %s, %s, %s, %s, %s, %s\n",
                DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN, t->task, t->meta, t->schedule, t->claim,
                t->setting, t->progress, t->dep);
        status = 0;
        goto done;
    }
    if (rc != 0)
        goto done;
    rc = dsp_schema_version_problem(v, why, sizeof why);
    if (rc == 0) {
        fprintf(out, "schema version %" PRIu64 " is current: nothing to do\n", v);
        status = 0;
        goto done;
    }
    if (rc < 0) {
        fprintf(err, "taskpushd: %s\n", why);
        goto done;
    }
    for (unsigned i = 0; i < dsp_migrations_count; i++) {
        const dsp_migration *mig = &dsp_migrations[i];
        if (mig->version <= v)
            continue;
        if (apply(url, t, mig, mquoted, err) < 0)
            goto done;
        rc = query_u64(lk, dsp_schema_version_sql(vsql, t), &got);
        if (rc < 0) {
            report_sql_error(err, lk, "reading schema_version back");
            goto done;
        }
        if (rc != 0 || got != mig->version) {
            fprintf(err,
                    "taskpushd: %s ran, but schema_version is not %u afterwards: was it"
                    " changed by hand meanwhile? Nothing more was applied\n",
                    mig->file, mig->version);
            goto done;
        }
        fprintf(out, "schema %u -> %u: %s\n", mig->version - 1, mig->version, mig->name);
        fflush(out);
        v = got;
    }
    status = 0;
done:
    if (locked) {
        snprintf(sql, sizeof sql, "SELECT RELEASE_LOCK('%s')", quoted);
        (void)query_u64(lk, sql, &got); /* closing the connection releases it anyway */
    }
    mysql_close(lk);
    return status;
}
