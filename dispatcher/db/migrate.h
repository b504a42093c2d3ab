/* migrate: the schema migrations compiled into taskpushd (sql/migrations, embedded by
 * embed.py --migrations), the words taskpushd uses about a schema version it cannot run
 * on, and `taskpushd --migrate`.
 *
 * The version lives in taskpush_meta ('schema_version'); sql/schema.sql creates the
 * latest one (DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN) and states the bump rule.
 */
#ifndef TASKPUSH_DISPATCHER_MIGRATE_H
#define TASKPUSH_DISPATCHER_MIGRATE_H

#include "db.h" /* dsp_db_url */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One file of sql/migrations: takes a database from version - 1 to version. */
typedef struct dsp_migration {
    unsigned version;
    const char *name; /* from the file name: "row value checks" */
    const char *file; /* "002-row-value-checks.sql" */
    const char *sql;  /* the file's text (NUL-terminated), sent as one multi-statement */
    size_t len;
} dsp_migration;

/* In order of version, 2 upwards without a gap (the build checks it); the entry after
 * the last one is all zeros. Generated: migrations.c in the build folder. */
extern const dsp_migration dsp_migrations[];
extern const unsigned dsp_migrations_count;

/* Longest text dsp_schema_version_problem writes. */
#define DSP_SCHEMA_PROBLEM_MAX 256

/* Whether this build can run on schema_version v: 0 when it can (buf untouched); 1 when
 * v is older (--migrate upgrades it) and -1 when it is newer or no version at all, both
 * with the reason for the operator in buf (at most cap bytes, NUL-terminated). */
int dsp_schema_version_problem(uint64_t v, char *buf, size_t cap);

/* taskpushd --migrate: applies every migration above the database's version, in order,
 * each on a connection of its own, while holding the table's leadership lock (it refuses
 * when a taskpushd holds it). Prints one line per migration applied to out, and what
 * went wrong to err. Returns the exit status: 0 (done, or nothing to do) or 1 (database
 * error, a dispatcher leads the table, no schema, or a version it cannot take). */
int dsp_migrate_run(const dsp_db_url *url, FILE *out, FILE *err);

#endif
