-- Migration 10 (schema_version 9 -> 10): task dependencies.
--
-- A task may wait for other tasks (docs/producers.md, "Dependencies"): it is dispatched
-- only once every one of them is SUCCESSFUL, and ends FAILED with an err_msg starting
-- 'dependency' when one of them ends FAILED. Version 10 adds:
--   - the table task_dep: one row per (waiting task, task it waits for); sql/schema.sql
--     says what each column means;
--   - the value 2 of task.`delayed`: a NEW row waiting for its dependencies. The claim
--     reads `delayed` = 0 only, the promote sweep `delayed` = 1 only, so a waiting row
--     costs no claim anything; the dispatcher sets it to 0 (or 1 when its run_after is
--     still ahead) once the last of its dependencies is SUCCESSFUL. No column or index of
--     task changes.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/010-task-dependencies.sql)
-- on a version 9 database. Safe to re-run: CREATE TABLE IF NOT EXISTS, and the version
-- moves only from 9 to 10. Instant: a new, empty table.

-- Dependencies (version 10, sql/migrations/010-task-dependencies.sql): one row per task
-- that a task waits for. A producer inserts the waiting task (task.`delayed` = 2) and its
-- rows here in one transaction (docs/producers.md, "Dependencies"); the dispatcher
-- releases the task once every one of them is SUCCESSFUL. The rows stay while the task
-- does (GET /task shows them); the dispatcher deletes those of tasks no longer in task.
CREATE TABLE IF NOT EXISTS task_dep (
    -- The waiting task (task.task_id).
    task_id   BIGINT UNSIGNED NOT NULL,
    -- A task it waits for (task.task_id); never the task itself.
    parent_id BIGINT UNSIGNED NOT NULL,
    -- A task's dependencies in parent_id order: the dispatcher reads them from the first
    -- one it has not seen SUCCESSFUL yet.
    PRIMARY KEY (task_id, parent_id),
    -- A parent's dependants, when its outcome is written.
    KEY dep_parent_idx (parent_id),
    CONSTRAINT dep_not_self CHECK (task_id <> parent_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

UPDATE taskpush_meta SET value = 10 WHERE name = 'schema_version' AND value = 9;
