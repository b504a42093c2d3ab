/* rows: task rows for integration tests: inserting N tasks of a type and counting rows
 * by type and state (see docs/schema.md for the task table and its states).
 *
 * Types are written into the SQL as they are: tests pass plain names. Failures print on
 * stderr (testdb.h); the caller asserts on what is returned. */
#ifndef TASKPUSH_TESTS_ROWS_H
#define TASKPUSH_TESTS_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "testdb.h"

/* Inserts n NEW rows of type, 100 to an INSERT. With numbered_payload row k gets the
 * payload "p<k>" (k from 0), else the column's default. Returns 0, or -1 when an INSERT
 * failed. */
int tp_rows_insert(tp_testdb *db, const char *type, int n, bool numbered_payload);

/* Rows of type in state (0 NEW .. 3 FAILED); TP_TESTDB_U64_ERR on error. */
uint64_t tp_rows_count(tp_testdb *db, const char *type, int state);

/* Polls tp_rows_count() every poll_ms until it is want or timeout_ms has passed. Returns
 * whether it got there; *last (when not NULL) is the last count read. */
bool tp_rows_wait(tp_testdb *db, const char *type, int state, uint64_t want, int timeout_ms,
                  int poll_ms, uint64_t *last);

/* The task_state of row id; TP_TESTDB_U64_ERR on error or when there is no such row. */
uint64_t tp_rows_state(tp_testdb *db, uint64_t id);

/* Polls tp_rows_state(id) every 20 ms until it is state or timeout_ms has passed. Returns
 * whether it got there; on a timeout it says on stderr what it last read. */
bool tp_rows_wait_state(tp_testdb *db, uint64_t id, uint64_t state, int timeout_ms);

/* Lists in task_claim every PROCESSING row that no row of it lists yet, as the
 * dispatcher that claimed it would have (docs/schema.md, task_claim): for tests that
 * insert PROCESSING rows by hand to stand for a dispatcher that died. One task_claim row
 * per epoch and thousand ids. Returns 0, or -1 on error. */
int tp_rows_list_processing(tp_testdb *db);

#endif
