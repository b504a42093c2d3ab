/* rows: inserting and counting task rows for integration tests (see rows.h). */
#include "rows.h"

#include <inttypes.h>
#include <stdio.h>

#include "wait.h"

int tp_rows_insert(tp_testdb *db, const char *type, int n, bool numbered_payload)
{
    for (int i = 0; i < n; i += 100) {
        char sql[8192];
        size_t used = (size_t)snprintf(sql, sizeof sql, "INSERT INTO task (task_type%s) VALUES ",
                                       numbered_payload ? ", payload" : "");
        for (int k = i; k < n && k < i + 100; k++) {
            if (numbered_payload)
                used += (size_t)snprintf(sql + used, sizeof sql - used, "%s('%s', 'p%d')",
                                         k > i ? "," : "", type, k);
            else
                used += (size_t)snprintf(sql + used, sizeof sql - used, "%s('%s')",
                                         k > i ? "," : "", type);
        }
        if (used >= sizeof sql || tp_testdb_exec(db, "%s", sql) < 0)
            return -1;
    }
    return 0;
}

uint64_t tp_rows_count(tp_testdb *db, const char *type, int state)
{
    return tp_testdb_query_u64(db, "SELECT COUNT(*) FROM task WHERE task_type = '%s' AND task_state = %d",
                               type, state);
}

bool tp_rows_wait(tp_testdb *db, const char *type, int state, uint64_t want, int timeout_ms,
                  int poll_ms, uint64_t *last)
{
    long long end = tp_mono_ms() + timeout_ms;
    uint64_t n;
    bool ok = true;
    while ((n = tp_rows_count(db, type, state)) != want) {
        if (tp_mono_ms() > end) {
            ok = false;
            break;
        }
        tp_sleep_ms(poll_ms);
    }
    if (last)
        *last = n;
    return ok;
}

uint64_t tp_rows_state(tp_testdb *db, uint64_t id)
{
    return tp_testdb_query_u64(db, "SELECT task_state FROM task WHERE task_id = %" PRIu64, id);
}

bool tp_rows_wait_state(tp_testdb *db, uint64_t id, uint64_t state, int timeout_ms)
{
    long long end = tp_mono_ms() + timeout_ms;
    uint64_t got;
    while ((got = tp_rows_state(db, id)) != state) {
        if (tp_mono_ms() > end) {
            fprintf(stderr, "task %" PRIu64 " is in state %" PRIu64 " after %d ms, want %" PRIu64 "\n", id,
                    got, timeout_ms, state);
            return false;
        }
        tp_sleep_ms(20);
    }
    return true;
}

int tp_rows_list_processing(tp_testdb *db)
{
    /* seq: the smallest id of the group, far above what a test's dispatcher counts to. */
    return tp_testdb_exec(db, "INSERT IGNORE INTO task_claim (epoch, seq, shard, task_ids)"
                              " SELECT epoch, (1 << 40) + MIN(task_id), '',"
                              " GROUP_CONCAT(task_id ORDER BY task_id SEPARATOR ',')"
                              " FROM task WHERE task_state = 1 GROUP BY epoch, task_id DIV 1000") < 0
               ? -1
               : 0;
}
