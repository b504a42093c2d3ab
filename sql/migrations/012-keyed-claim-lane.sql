-- Migration 12 (schema_version 11 -> 12): a claim of a keyed row moves one index entry.
--
-- Until version 11 claim_lane was the state of every row, keyed or not, so the claim of
-- a keyed row (NEW -> PROCESSING) moved its entry in claim_idx and its entry in
-- group_idx (group_lane 0 -> 1): at K=64 with 1,000 keys the mark cost 2.5 us a row more
-- than a keyless one (docs/journal/bench.md, "Fair share at K=64 with 1,000 keys").
-- Version 12 makes claim_lane NULL for a row with a group_key unless it is FAILED:
--   - a keyed row sits under claim_lane NULL while NEW, PROCESSING or SUCCESSFUL, so its
--     claim and its success move no entry of claim_idx; group_idx (group_lane, unchanged)
--     is where its state is read;
--   - FAILED rows stay in claim_lane 3 keyed or not, so GET /failed, POST /retry-failed
--     and retention find them in one place (a failure of a keyed row moves both entries:
--     failures are rare);
--   - claim_lane 0 now holds exactly the NEW rows without a key, so the fair claim reads
--     the keyless rows of a keyed type from claim_idx alone (docs/taskpushd.md).
-- A query for NEW rows of any key reads claim_lane = 0 and group_lane = 0
-- (docs/schema.md).
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/012-keyed-claim-lane.sql)
-- on a version 11 database. Safe to re-run: the ALTER runs only while claim_lane's
-- expression does not name group_key (read from information_schema.COLUMNS), and the
-- version moves only from 11 to 12. A task table that is not taskpush's never gets here
-- (--migrate refuses it first, docs/adopting.md). Changing the expression of an indexed
-- virtual column rebuilds the table: on a large table it takes a while, and writes wait.

SET @taskpush_m12_done = (SELECT COUNT(*) FROM information_schema.COLUMNS
                           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task'
                             AND COLUMN_NAME = 'claim_lane'
                             AND GENERATION_EXPRESSION LIKE '%group_key%');
SET @taskpush_m12 = IF(@taskpush_m12_done = 0,
    'ALTER TABLE task
        MODIFY COLUMN claim_lane TINYINT AS (IF(group_key IS NULL OR task_state = 3, IF(task_state = 2, 1, task_state), NULL)) VIRTUAL',
    'DO 0');
PREPARE taskpush_m12 FROM @taskpush_m12;
EXECUTE taskpush_m12;
DEALLOCATE PREPARE taskpush_m12;
SET @taskpush_m12 = NULL, @taskpush_m12_done = NULL;

UPDATE taskpush_meta SET value = 12 WHERE name = 'schema_version' AND value = 11;
