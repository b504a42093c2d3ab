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
#include "strbuf.h"
#include "tables.h"

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
/* sql/schema.sql's text (NUL-terminated), which --migrate runs, with the table names
 * substituted, on a database that has none of the four tables. Generated there too. */
extern const char *const dsp_schema_sql;
extern const size_t dsp_schema_sql_len;

/* Longest text dsp_schema_version_problem writes. */
#define DSP_SCHEMA_PROBLEM_MAX 256

/* Whether this build can run on schema_version v: 0 when it can (buf untouched); 1 when
 * v is older (--migrate upgrades it) and -1 when it is newer or no version at all, both
 * with the reason for the operator in buf (at most cap bytes, NUL-terminated). */
int dsp_schema_version_problem(uint64_t v, char *buf, size_t cap);

/* A team's own table named task is never adopted (docs/adopting.md): taskpushd, --migrate
 * and sql/schema.sql tell it from taskpush's by the columns and indexes taskpush's
 * statements name, as the server's information_schema lists them. */
enum dsp_schema_names {
    DSP_SCHEMA_COLUMNS_EVERY_VERSION, /* columns schema version 1 already had */
    DSP_SCHEMA_COLUMNS_CURRENT,       /* columns this build's statements name */
    DSP_SCHEMA_INDEXES_CURRENT,       /* indexes they name (FORCE INDEX) */
};

/* Appends to b a query whose one answer is those of the names (which) that the table
 * t->task of the current database lacks, comma-separated in schema order, or NULL when
 * none is missing. */
void dsp_schema_missing_sql(dsp_strbuf *b, const dsp_table_names *t, enum dsp_schema_names which);

/* The query whose one answer is how many tables named task the current database has. */
#define DSP_SCHEMA_TASK_EXISTS_SQL                                                              \
    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND"      \
    " table_name = 'task'"
/* The same for t->task (the text above for task). */
void dsp_schema_exists_sql(dsp_strbuf *b, const dsp_table_names *t);

/* The schema version's read for t (DSP_CLAIM_SQL_SCHEMA_VERSION for task), into out;
 * returns out. */
#define DSP_SCHEMA_SQL_MAX 160
const char *dsp_schema_version_sql(char out[DSP_SCHEMA_SQL_MAX], const dsp_table_names *t);

/* Longest text dsp_schema_foreign_text writes. */
#define DSP_SCHEMA_FOREIGN_MAX 768

/* The operator's message about a task table (t->task) that is not taskpush's: who
 * refuses (e.g. "refusing to start"), the database, the columns and indexes it lacks
 * (either may be empty), and whether the meta table had a schema version. */
void dsp_schema_foreign_text(char *out, size_t cap, const dsp_table_names *t, const char *who,
                             const char *dbname, const char *cols, const char *idx,
                             bool have_version);

/* taskpushd --migrate: on a database with none of the four tables (tables.h) creates the
 * current schema (sql/schema.sql's text with the names substituted); else applies every
 * migration above the database's version, in order, each on a connection of its own,
 * while holding the table's leadership lock (it refuses when a taskpushd holds it).
 * Prints one line per migration applied (or the creation) to out, and what went wrong
 * to err. table is --table (NULL: task): the texts are run with its names (tables.h,
 * dsp_table_names_subst). Returns the exit status: 0 (done, or nothing to do), 2 (table
 * is not a valid name) or 1 (database error, a dispatcher leads the table, only some of
 * the four tables and no version, a task table that is not taskpush's, or a version it
 * cannot take). */
int dsp_migrate_run(const dsp_db_url *url, const char *table, FILE *out, FILE *err);

#endif
