-- Migration 2 (schema_version 1 -> 2): row value checks.
--
-- Producers write the task table directly, so the dispatcher treats every value in it as
-- hostile. Version 2 lets the server refuse the values no task can mean, even under
-- INSERT IGNORE (the row is not stored: an error, or a warning when other rows go in):
--     attempts >= 0
--     max_attempts BETWEEN 1 AND 1000
--     timeout_ms IS NULL OR timeout_ms > 0
--     run_after >= 0
--     task_type <> ''
-- Why 1000 attempts at most: with the default retry backoff (doubling up to 5 minutes)
-- 1000 attempts already keep a task retrying for about 3.5 days; a larger limit is a
-- mistake or a wish for "forever", which taskpush does not offer. The bound also keeps
-- attempts (an INT the dispatcher increments) far from overflowing.
--
-- Rows that break a check are repaired first (ALTER TABLE ... ADD CONSTRAINT fails on
-- them). Every repair but the last two keeps what taskpushd already did with the value:
--     attempts < 0          -> 0     (taskpushd read it as 0)
--     max_attempts < 1      -> 1     (taskpushd ran such a task once)
--     timeout_ms <= 0       -> NULL  (taskpushd used its --task-timeout-ms)
--     run_after < 0         -> 0     (due at once either way)
--     max_attempts > 1000   -> 1000  (the new limit)
--     task_type ''          -> 'default'; a NEW or PROCESSING row with an empty type
--                              also becomes FAILED with an err_msg saying so. No worker
--                              can register an empty type, so such a task could never
--                              run; making it FAILED rather than handing it to the
--                              'default' workers means nothing runs that nobody asked
--                              for. Set its task_type and `taskpushctl retry ID` it.
-- Nothing else changes: not the other columns of a repaired row (but task_state, err_msg,
-- `delayed` and last_update_time of a row made FAILED), nor any other row.
--
-- Applied by `taskpushd --db URL --migrate` (which embeds this file; stop every taskpushd
-- on the database first, --migrate refuses while one leads it). It may also be run by
-- hand (mariadb DBNAME < sql/migrations/002-row-value-checks.sql) on a version 1 database.
-- Safe to re-run: the repairs find nothing the second time, the constraints are only added
-- when none of them exists yet (it stops with an error, changing nothing more, when only
-- some do), and the version moves only from 1 to 2.
-- Adding the constraints rebuilds the table (one copy, all five at once), and producers'
-- INSERTs wait while it runs: on a large table, run it at a quiet time.
--
-- Portable to MySQL >= 8.0.16: MySQL has no ADD CONSTRAINT IF NOT EXISTS (MariaDB has), so
-- the ALTER is prepared only when information_schema.CHECK_CONSTRAINTS (both servers have
-- its CONSTRAINT_SCHEMA and CONSTRAINT_NAME columns; constraint names are per schema in
-- MySQL) has none of the five names.

UPDATE task SET attempts = 0 WHERE attempts < 0;
UPDATE task SET max_attempts = 1 WHERE max_attempts < 1;
UPDATE task SET max_attempts = 1000 WHERE max_attempts > 1000;
UPDATE task SET timeout_ms = NULL WHERE timeout_ms <= 0;
UPDATE task SET run_after = 0 WHERE run_after < 0;
UPDATE task
   SET task_state = 3, `delayed` = 0,
       err_msg = 'schema migration 2: task_type was empty, which no worker can register; set task_type and retry the task',
       last_update_time = UNIX_TIMESTAMP(NOW(3)) * 1000
 WHERE task_type = '' AND task_state IN (0, 1);
UPDATE task SET task_type = 'default' WHERE task_type = '';

SET @taskpush_m2_found = (SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS
                           WHERE CONSTRAINT_SCHEMA = DATABASE()
                             AND CONSTRAINT_NAME IN ('attempts_min', 'max_attempts_range',
                                                     'timeout_ms_positive', 'run_after_min',
                                                     'task_type_not_empty'));
-- One ALTER adds all five (atomically), so finding some but not all means someone added
-- them by hand: stop with an error rather than record version 2 without them. Reading a
-- table that cannot exist is an error both servers raise from a prepared statement, and
-- its name tells the operator what to do.
SET @taskpush_m2 = CASE @taskpush_m2_found
    WHEN 0 THEN
    'ALTER TABLE task
        ADD CONSTRAINT attempts_min CHECK (attempts >= 0),
        ADD CONSTRAINT max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
        ADD CONSTRAINT timeout_ms_positive CHECK (timeout_ms IS NULL OR timeout_ms > 0),
        ADD CONSTRAINT run_after_min CHECK (run_after >= 0),
        ADD CONSTRAINT task_type_not_empty CHECK (task_type <> '''')'
    WHEN 5 THEN 'DO 0'
    ELSE 'SELECT * FROM `migration 2: drop its partly added constraints, then rerun`'
END;
PREPARE taskpush_m2 FROM @taskpush_m2;
EXECUTE taskpush_m2;
DEALLOCATE PREPARE taskpush_m2;
SET @taskpush_m2 = NULL, @taskpush_m2_found = NULL;

UPDATE taskpush_meta SET value = 2 WHERE name = 'schema_version' AND value = 1;
