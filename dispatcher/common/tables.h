/* tables: the names of taskpush's six tables, made once from --table NAME.
 *
 * For NAME = task they are today's: task, taskpush_meta, task_schedule, task_claim,
 * task_setting, task_dep (so nothing changes for an existing database); for another NAME:
 * NAME, NAME_meta, NAME_schedule, NAME_claim, NAME_setting, NAME_dep, so that several queues share one database, each with its own
 * lease and epoch rows (they live in the meta table) and its own leadership lock.
 *
 * NAME is [A-Za-z_][A-Za-z0-9_]*, 1 to DSP_TABLE_NAME_MAX bytes: an identifier that needs
 * no quoting, whose longest derived name fits MySQL's 64 bytes.
 *
 * The CHECK constraints are named after NAME too (NAME_attempts_min, ...): MySQL 8 keeps
 * constraint names per database, not per table, so a second queue's CREATE TABLE would
 * fail with task's names ("Duplicate check constraint name"), and the migrations' test
 * "does attempts_min exist yet" would find another queue's. task keeps its names.
 */
#ifndef TASKPUSH_DSP_TABLES_H
#define TASKPUSH_DSP_TABLES_H

#include "strbuf.h"

#include <stdbool.h>
#include <stddef.h>

/* NAME + '_' + the longest constraint name (DSP_TABLE_CONSTRAINT_MAX) is 64 bytes. */
#define DSP_TABLE_NAME_MAX 36
#define DSP_TABLE_NAME_DEFAULT "task"
/* The longest CHECK constraint name of sql/ (task_type_no_trailing_space). */
#define DSP_TABLE_CONSTRAINT_MAX 27
/* The longest derived name: NAME + "_schedule" or "_progress" (or "taskpush_meta"),
 * with its NUL ("_setting" is shorter). */
#define DSP_TABLE_IDENT_CAP (DSP_TABLE_NAME_MAX + sizeof "_schedule")

typedef struct dsp_table_names {
    char task[DSP_TABLE_IDENT_CAP];     /* NAME */
    char meta[DSP_TABLE_IDENT_CAP];     /* taskpush_meta, or NAME_meta */
    char schedule[DSP_TABLE_IDENT_CAP]; /* NAME_schedule */
    char claim[DSP_TABLE_IDENT_CAP];    /* NAME_claim */
    char setting[DSP_TABLE_IDENT_CAP];  /* NAME_setting (version 9): runtime settings */
    char progress[DSP_TABLE_IDENT_CAP]; /* NAME_progress (version 11): progress of running tasks */
    char dep[DSP_TABLE_IDENT_CAP];      /* NAME_dep (version 10): dependencies */
    bool is_default;                    /* NAME is task: every statement as before */
} dsp_table_names;

/* The names for task (a constant: builders' callers that know no other). */
extern const dsp_table_names dsp_table_names_task;

/* t, or the names for task when t is NULL (the builders' callers that know no other). */
static inline const dsp_table_names *dsp_table_names_or_task(const dsp_table_names *t)
{
    return t ? t : &dsp_table_names_task;
}

/* Whether s[0..len) is a valid NAME. */
bool dsp_table_name_valid(const char *s, size_t len);

/* Fills t from NAME; returns 0, or -1 (t untouched) when NAME is not valid. */
int dsp_table_names_init(dsp_table_names *t, const char *name);

/* The CHECK constraint names of sql/schema.sql and sql/migrations (a unit test reads the
 * files and holds this list to them), NULL-terminated. */
extern const char *const dsp_table_constraint_names[];

/* Appends text[0..len) to out with the six default names (task, taskpush_meta,
 * task_schedule, task_claim, task_setting, task_progress, task_dep) replaced by t's, and each constraint name C of
 * dsp_table_constraint_names by NAME_C, wherever they stand as whole words: a word
 * being a run of [A-Za-z0-9_$], so task_type or `task_id` are never touched. Everything
 * else (comments and quoted text included: information_schema checks compare
 * table_name = 'task' or CONSTRAINT_NAME = 'attempts_max') is copied as it is. For the
 * default names it is a copy. */
void dsp_table_names_subst(dsp_strbuf *out, const dsp_table_names *t, const char *text, size_t len);

#endif
