-- Migration 8 (schema_version 7 -> 8): fair share between group keys.
--
-- A task may carry a group_key (docs/schema.md): within one type and priority, the
-- dispatcher hands out tasks of different keys in turn, so that one key's backlog does
-- not delay another key's tasks. Version 8 adds:
--   - the column group_key VARBINARY(191) NULL (NULL: no key; those tasks share one
--     turn, the first of each round);
--   - the virtual column group_lane: claim_lane for a row with a key, NULL for one
--     without, so that claiming or finishing a keyless row moves no entry of group_idx
--     (a table that uses no keys pays nothing for the index);
--   - the index group_idx (group_lane, `delayed`, task_type, task_priority DESC,
--     group_key, task_id, run_after): per type and priority, the ready keyed rows key by
--     key (keyless rows are read through claim_idx).
--     A claim reads it from the key after the last one served, so a key of a million
--     rows costs one index seek to pass, never a read of its rows; it covers every
--     column the claim's read of candidates needs.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/008-group-key.sql) on a
-- version 7 database. Safe to re-run: the ALTER runs only while the column is missing
-- (prepared from information_schema.COLUMNS), and the version moves only from 7 to 8.
-- Adding the index reads the whole table; InnoDB does it online (reads and writes go on).

SET @taskpush_m8_found = (SELECT COUNT(*) FROM information_schema.COLUMNS
                           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task'
                             AND COLUMN_NAME = 'group_key');
SET @taskpush_m8 = IF(@taskpush_m8_found = 0,
    'ALTER TABLE task
        ADD COLUMN group_key VARBINARY(191) NULL DEFAULT NULL AFTER failed_at,
        ADD COLUMN group_lane TINYINT AS (IF(group_key IS NULL, NULL, IF(task_state = 2, 1, task_state))) VIRTUAL AFTER group_key,
        ADD KEY group_idx (group_lane, `delayed`, task_type, task_priority DESC, group_key, task_id, run_after)',
    'DO 0');
PREPARE taskpush_m8 FROM @taskpush_m8;
EXECUTE taskpush_m8;
DEALLOCATE PREPARE taskpush_m8;
SET @taskpush_m8 = NULL, @taskpush_m8_found = NULL;

UPDATE taskpush_meta SET value = 8 WHERE name = 'schema_version' AND value = 7;
