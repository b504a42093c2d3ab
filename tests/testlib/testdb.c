/* testdb: see testdb.h. */
#include "testdb.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef TP_TESTDB_SCHEMA_SQL
#error "TP_TESTDB_SCHEMA_SQL must be defined by the build (path of sql/schema.sql)"
#endif

/* Statements longer than this are a bug in the test, not something to support. */
#define TESTDB_SQL_MAX (1024 * 1024)

/* Connect/read/write timeouts: a hung server fails the test instead of hanging it. */
#define TESTDB_TIMEOUT_S 60u

const char *tp_testdb_schema_path(void)
{
    const char *p = getenv("TASKPUSH_SCHEMA_SQL");

    return p && *p ? p : TP_TESTDB_SCHEMA_SQL;
}

unsigned tp_testdb_schema_version(void)
{
    static const char needle[] = "('schema_version', ";
    char buf[65536];
    unsigned v = 0;
    FILE *f = fopen(tp_testdb_schema_path(), "r");

    while (f && v == 0 && fgets(buf, sizeof buf, f) != NULL) {
        const char *p = strstr(buf, needle);
        if (p && strncmp(buf, "INSERT", 6) == 0)
            v = (unsigned)strtoul(p + sizeof needle - 1, NULL, 10);
    }
    if (f)
        fclose(f);
    return v;
}

int64_t tp_testdb_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int copy_env(const char *name, char *dst, size_t cap, int required)
{
    const char *v = getenv(name);

    if (v == NULL || *v == '\0') {
        if (required) {
            fprintf(stderr,
                    "testdb: %s is not set. Start a test server first:\n"
                    "    eval \"$(scripts/tp-mariadb start /tmp/tpdb)\"\n"
                    "and run the tests from that shell.\n",
                    name);
            return -1;
        }
        dst[0] = '\0';
        return 0;
    }
    if (strlen(v) >= cap) {
        fprintf(stderr, "testdb: %s is too long\n", name);
        return -1;
    }
    strcpy(dst, v);
    return 0;
}

static int read_env(tp_testdb *db)
{
    char port[16];
    char *end;
    unsigned long p;

    if (copy_env("TASKPUSH_TEST_MYSQL_HOST", db->host, sizeof db->host, 1) < 0 ||
        copy_env("TASKPUSH_TEST_MYSQL_PORT", port, sizeof port, 1) < 0 ||
        copy_env("TASKPUSH_TEST_MYSQL_USER", db->user, sizeof db->user, 1) < 0 ||
        copy_env("TASKPUSH_TEST_MYSQL_PASSWORD", db->password, sizeof db->password, 0) < 0)
        return -1;
    errno = 0;
    p = strtoul(port, &end, 10);
    if (errno != 0 || *end != '\0' || p == 0 || p > 65535) {
        fprintf(stderr, "testdb: TASKPUSH_TEST_MYSQL_PORT=%s is not a port\n", port);
        return -1;
    }
    db->port = (unsigned)p;
    return 0;
}

/* Connects over TCP as the test user, to database dbname (NULL: none). */
static MYSQL *connect_to(const tp_testdb *db, const char *dbname)
{
    MYSQL *conn = mysql_init(NULL);
    unsigned timeout = TESTDB_TIMEOUT_S;
    unsigned protocol = MYSQL_PROTOCOL_TCP;

    if (conn == NULL) {
        fprintf(stderr, "testdb: mysql_init failed\n");
        return NULL;
    }
    mysql_options(conn, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(conn, MYSQL_OPT_READ_TIMEOUT, &timeout);
    mysql_options(conn, MYSQL_OPT_WRITE_TIMEOUT, &timeout);
    mysql_options(conn, MYSQL_OPT_PROTOCOL, &protocol);
    mysql_options(conn, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (mysql_real_connect(conn, db->host, db->user, db->password[0] ? db->password : NULL, dbname,
                           db->port, NULL, CLIENT_MULTI_STATEMENTS) == NULL) {
        fprintf(stderr, "testdb: cannot connect to %s@%s:%u/%s: %s\n", db->user, db->host, db->port,
                dbname ? dbname : "", mysql_error(conn));
        mysql_close(conn);
        return NULL;
    }
    return conn;
}

MYSQL *tp_testdb_connect(const tp_testdb *db)
{
    return connect_to(db, db->name);
}

/* Runs sql (possibly several statements) and drains every result. */
static int run_multi(MYSQL *conn, const char *sql, size_t len, const char *what)
{
    int status;
    int n = 1;

    if (mysql_real_query(conn, sql, (unsigned long)len) != 0) {
        fprintf(stderr, "testdb: %s: statement 1 failed: %s\n", what, mysql_error(conn));
        return -1;
    }
    do {
        MYSQL_RES *res = mysql_store_result(conn);

        if (res)
            mysql_free_result(res);
        else if (mysql_field_count(conn) != 0) {
            fprintf(stderr, "testdb: %s: reading result %d failed: %s\n", what, n,
                    mysql_error(conn));
            return -1;
        }
        status = mysql_next_result(conn);
        n++;
        if (status > 0) {
            fprintf(stderr, "testdb: %s: statement %d failed: %s\n", what, n, mysql_error(conn));
            return -1;
        }
    } while (status == 0);
    return 0;
}

int tp_testdb_load_file(MYSQL *conn, const char *path)
{
    FILE *f = NULL;
    char *text = NULL;
    long size;
    int ret = -1;

    f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "testdb: cannot open %s: %s\n", path, strerror(errno));
        goto done;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "testdb: cannot size %s\n", path);
        goto done;
    }
    text = malloc((size_t)size + 1);
    if (text == NULL || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "testdb: cannot read %s\n", path);
        goto done;
    }
    text[size] = '\0';
    ret = run_multi(conn, text, (size_t)size, path);
done:
    free(text);
    if (f)
        fclose(f);
    return ret;
}

int tp_testdb_create(const char *tag, tp_testdb *out)
{
    MYSQL *admin = NULL;
    size_t i, n;
    int ret = -1;

    memset(out, 0, sizeof *out);
    if (read_env(out) < 0)
        goto done;

    n = (size_t)snprintf(out->name, sizeof out->name, "tp_");
    for (i = 0; tag && tag[i] && n < 40; i++, n++)
        out->name[n] = isalnum((unsigned char)tag[i]) ? tag[i] : '_';
    snprintf(out->name + n, sizeof out->name - n, "_%ld", (long)getpid());

    admin = connect_to(out, NULL);
    if (admin == NULL)
        goto done;
    if (tp_testdb_exec_conn(admin, "DROP DATABASE IF EXISTS `%s`", out->name) < 0 ||
        tp_testdb_exec_conn(admin, "CREATE DATABASE `%s` CHARACTER SET utf8mb4", out->name) < 0)
        goto done;

    out->conn = connect_to(out, out->name);
    if (out->conn == NULL)
        goto drop;
    if (tp_testdb_load_file(out->conn, tp_testdb_schema_path()) < 0)
        goto drop;
    snprintf(out->url, sizeof out->url, "mysql://%s@%s:%u/%s", out->user, out->host, out->port,
             out->name);
    ret = 0;
    goto done;

drop:
    if (out->conn) {
        mysql_close(out->conn);
        out->conn = NULL;
    }
    (void)tp_testdb_exec_conn(admin, "DROP DATABASE IF EXISTS `%s`", out->name);
done:
    if (admin)
        mysql_close(admin);
    if (ret < 0)
        out->name[0] = '\0';
    return ret;
}

void tp_testdb_drop(tp_testdb *db)
{
    MYSQL *admin;

    if (db->name[0] == '\0')
        goto done;
    if (getenv("TASKPUSH_TEST_KEEP_DB") && *getenv("TASKPUSH_TEST_KEEP_DB")) {
        fprintf(stderr, "testdb: keeping database %s (TASKPUSH_TEST_KEEP_DB)\n", db->name);
        goto done;
    }
    if (db->conn == NULL ||
        tp_testdb_exec_conn(db->conn, "DROP DATABASE IF EXISTS `%s`", db->name) < 0) {
        /* The test may have broken its connection (a server restart): use a new one. */
        admin = connect_to(db, NULL);
        if (admin) {
            (void)tp_testdb_exec_conn(admin, "DROP DATABASE IF EXISTS `%s`", db->name);
            mysql_close(admin);
        }
    }
done:
    if (db->conn)
        mysql_close(db->conn);
    db->conn = NULL;
    db->name[0] = '\0';
}

/* Formats into a malloc'ed string; caller frees. NULL on failure. */
static char *vformat(const char *fmt, va_list ap, int *len)
{
    va_list ap2;
    char *s;
    int n;

    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0 || n > TESTDB_SQL_MAX) {
        fprintf(stderr, "testdb: cannot format statement \"%.80s\"\n", fmt);
        return NULL;
    }
    s = malloc((size_t)n + 1);
    if (s == NULL)
        return NULL;
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    *len = n;
    return s;
}

static int64_t vexec(MYSQL *conn, const char *fmt, va_list ap)
{
    char *sql;
    int len;
    int64_t ret = -1;
    MYSQL_RES *res;

    sql = vformat(fmt, ap, &len);
    if (sql == NULL)
        return -1;
    if (mysql_real_query(conn, sql, (unsigned long)len) != 0) {
        fprintf(stderr, "testdb: %.300s%s\n  failed: %s (errno %u)\n", sql, len > 300 ? "..." : "",
                mysql_error(conn), mysql_errno(conn));
        goto done;
    }
    res = mysql_store_result(conn);
    if (res) {
        mysql_free_result(res);
        ret = 0;
    } else if (mysql_field_count(conn) != 0) {
        fprintf(stderr, "testdb: %.300s\n  reading the result failed: %s\n", sql,
                mysql_error(conn));
        goto done;
    } else {
        ret = (int64_t)mysql_affected_rows(conn);
    }
done:
    free(sql);
    return ret;
}

int64_t tp_testdb_exec(tp_testdb *db, const char *fmt, ...)
{
    va_list ap;
    int64_t r;

    va_start(ap, fmt);
    r = vexec(db->conn, fmt, ap);
    va_end(ap);
    return r;
}

int64_t tp_testdb_exec_conn(MYSQL *conn, const char *fmt, ...)
{
    va_list ap;
    int64_t r;

    va_start(ap, fmt);
    r = vexec(conn, fmt, ap);
    va_end(ap);
    return r;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (s == NULL || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static uint64_t vquery_u64(MYSQL *conn, const char *fmt, va_list ap)
{
    char *sql;
    int len;
    uint64_t ret = TP_TESTDB_U64_ERR;
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;

    sql = vformat(fmt, ap, &len);
    if (sql == NULL)
        return ret;
    if (mysql_real_query(conn, sql, (unsigned long)len) != 0) {
        fprintf(stderr, "testdb: %.300s\n  failed: %s\n", sql, mysql_error(conn));
        goto done;
    }
    res = mysql_store_result(conn);
    if (res == NULL) {
        fprintf(stderr, "testdb: %.300s\n  returned no result set: %s\n", sql, mysql_error(conn));
        goto done;
    }
    row = mysql_fetch_row(res);
    if (row == NULL || mysql_num_fields(res) < 1) {
        fprintf(stderr, "testdb: %.300s\n  returned no row\n", sql);
        goto done;
    }
    if (parse_u64(row[0], &ret) < 0) {
        fprintf(stderr, "testdb: %.300s\n  returned %s, not an unsigned number\n", sql,
                row[0] ? row[0] : "NULL");
        ret = TP_TESTDB_U64_ERR;
    }
done:
    if (res)
        mysql_free_result(res);
    free(sql);
    return ret;
}

uint64_t tp_testdb_query_u64(tp_testdb *db, const char *fmt, ...)
{
    va_list ap;
    uint64_t r;

    va_start(ap, fmt);
    r = vquery_u64(db->conn, fmt, ap);
    va_end(ap);
    return r;
}

uint64_t tp_testdb_query_u64_conn(MYSQL *conn, const char *fmt, ...)
{
    va_list ap;
    uint64_t r;

    va_start(ap, fmt);
    r = vquery_u64(conn, fmt, ap);
    va_end(ap);
    return r;
}

int tp_testdb_status(MYSQL *conn, tp_testdb_scope scope, const char *name, uint64_t *out)
{
    char sql[256];
    char escaped[2 * 64 + 1];
    size_t len = strlen(name);
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int ret = -1;

    if (len > 64) {
        fprintf(stderr, "testdb: status name %s is too long\n", name);
        return -1;
    }
    mysql_real_escape_string(conn, escaped, name, (unsigned long)len);
    snprintf(sql, sizeof sql, "SHOW %s STATUS WHERE Variable_name = '%s'",
             scope == TP_TESTDB_GLOBAL ? "GLOBAL" : "SESSION", escaped);
    if (mysql_query(conn, sql) != 0) {
        fprintf(stderr, "testdb: %s\n  failed: %s\n", sql, mysql_error(conn));
        return -1;
    }
    res = mysql_store_result(conn);
    if (res == NULL) {
        fprintf(stderr, "testdb: %s\n  returned no result set: %s\n", sql, mysql_error(conn));
        return -1;
    }
    row = mysql_fetch_row(res);
    if (row == NULL || mysql_num_fields(res) < 2)
        goto done; /* no such counter on this server */
    if (parse_u64(row[1], out) < 0) {
        fprintf(stderr, "testdb: status %s = %s is not a counter\n", name,
                row[1] ? row[1] : "NULL");
        goto done;
    }
    ret = 0;
done:
    mysql_free_result(res);
    return ret;
}
