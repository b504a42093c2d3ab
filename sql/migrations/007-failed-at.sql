-- Migration 7 (schema_version 6 -> 7): the time a task failed, indexed.
--
-- Until version 6 `taskpushctl failed`, GET /failed and the dashboard's "Latest
-- failures" listed FAILED rows by task_id, the only order claim_idx gives them: a row
-- inserted (or imported, or retried) long ago that failed a minute ago came after rows
-- that failed days ago, and the failure that just happened could be missing from the
-- list. Version 7 adds:
--   - the virtual column failed_at = last_update_time while the row is FAILED, NULL in
--     any other state (every write that makes a row FAILED sets last_update_time);
--   - the index failed_idx (task_type, failed_at): per type, the FAILED rows by the time
--     they failed, after that type's NULLs, so "the newest failures of type T" and "the
--     FAILED rows of type T since S" are a short range of it. Claiming a row or writing
--     its success keeps failed_at NULL, so neither moves an entry of failed_idx; only
--     becoming FAILED, and leaving it, does.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/007-failed-at.sql) on a
-- version 6 database. Safe to re-run: the ALTER runs only while the column is missing
-- (prepared from information_schema.COLUMNS: MySQL cannot add a column only when it is
-- missing), and the version moves only from 6 to 7.
-- Adding the index reads the whole table; InnoDB does it online (reads and writes go on).

SET @taskpush_m7_found = (SELECT COUNT(*) FROM information_schema.COLUMNS
                           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task'
                             AND COLUMN_NAME = 'failed_at');
SET @taskpush_m7 = IF(@taskpush_m7_found = 0,
    'ALTER TABLE task
        ADD COLUMN failed_at BIGINT AS (IF(task_state = 3, last_update_time, NULL)) VIRTUAL,
        ADD KEY failed_idx (task_type, failed_at)',
    'DO 0');
PREPARE taskpush_m7 FROM @taskpush_m7;
EXECUTE taskpush_m7;
DEALLOCATE PREPARE taskpush_m7;
SET @taskpush_m7 = NULL, @taskpush_m7_found = NULL;

UPDATE taskpush_meta SET value = 7 WHERE name = 'schema_version' AND value = 6;
