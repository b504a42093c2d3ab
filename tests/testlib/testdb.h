/* testdb: a throwaway database per integration test, on the server that
 * scripts/tp-mariadb started.
 *
 * The server comes from the environment that `eval "$(scripts/tp-mariadb start DIR)"`
 * sets: TASKPUSH_TEST_MYSQL_HOST, TASKPUSH_TEST_MYSQL_PORT, TASKPUSH_TEST_MYSQL_USER
 * (and optionally TASKPUSH_TEST_MYSQL_PASSWORD). Without them tp_testdb_create() fails
 * with a message saying so: a test that needs the database never passes without one.
 *
 * Every function prints what went wrong on stderr (the SQL and the server's error), so
 * a test only has to assert on the return value. Not thread-safe: one test thread.
 */
#ifndef TASKPUSH_TESTS_TESTDB_H
#define TASKPUSH_TESTS_TESTDB_H

#include <stdint.h>

#include <mysql.h>

/* What tp_testdb_query_u64() returns on any failure (and for NULL or no row). */
#define TP_TESTDB_U64_ERR UINT64_MAX

typedef struct tp_testdb {
    MYSQL *conn;   /* connected to the database `name`; owned, closed by tp_testdb_drop */
    char name[65]; /* tp_<tag>_<pid> */
    char url[512]; /* mysql://USER@HOST:PORT/NAME, as taskpushd --db takes it */
    char host[256];
    char user[128];
    char password[128];
    unsigned port;
} tp_testdb;

typedef enum tp_testdb_scope {
    TP_TESTDB_SESSION = 0,
    TP_TESTDB_GLOBAL = 1,
} tp_testdb_scope;

/* Connects to the test server, creates a fresh database named after tag (letters,
 * digits and '_' kept, the rest becomes '_') and the pid, dropping a stale one of the
 * same name, loads sql/schema.sql into it and fills *out. Returns 0, or -1 (message on
 * stderr; *out then needs no tp_testdb_drop). */
int tp_testdb_create(const char *tag, tp_testdb *out);

/* Drops the database and closes out->conn. Safe on a zeroed or already dropped struct.
 * With TASKPUSH_TEST_KEEP_DB set (non-empty) the database is kept for a post-mortem. */
void tp_testdb_drop(tp_testdb *db);

/* Opens another connection to the same database (for a second transaction). Caller
 * closes it with mysql_close(). NULL on failure. */
MYSQL *tp_testdb_connect(const tp_testdb *db);

/* Runs the file at path (statements separated by ';', no DELIMITER) on conn with
 * multi-statements. Returns 0 or -1. */
int tp_testdb_load_file(MYSQL *conn, const char *path);

/* The schema file the build was configured with (sql/schema.sql of the source tree). */
const char *tp_testdb_schema_path(void);
/* The schema_version the file at tp_testdb_schema_path() writes (its INSERT into
 * taskpush_meta), so that a test stamping a version by hand follows the schema; 0 when
 * the file cannot be read or names none. */
unsigned tp_testdb_schema_version(void);

/* Formats and runs one statement on db->conn, discarding any result. Returns the number
 * of affected rows (>= 0), or -1 on error. */
int64_t tp_testdb_exec(tp_testdb *db, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The same on any connection. */
int64_t tp_testdb_exec_conn(MYSQL *conn, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Formats and runs a query on db->conn and returns the first column of its first row as
 * an unsigned number, or TP_TESTDB_U64_ERR on error, no row, NULL or a non-number. */
uint64_t tp_testdb_query_u64(tp_testdb *db, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The same on any connection. */
uint64_t tp_testdb_query_u64_conn(MYSQL *conn, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reads one counter of SHOW SESSION STATUS or SHOW GLOBAL STATUS on conn (for example
 * "Handler_read_next"; reading does not move the Handler_* counters). Returns 0, or -1
 * when the server has no such counter (no message then) or on error. */
int tp_testdb_status(MYSQL *conn, tp_testdb_scope scope, const char *name, uint64_t *out);

/* Milliseconds since the epoch by the local clock (the server shares it). */
int64_t tp_testdb_now_ms(void);

#endif
