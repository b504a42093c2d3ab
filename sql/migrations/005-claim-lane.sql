-- Migration 5 (schema_version 4 -> 5): the claim lane and the claim list.
--
-- Until version 4 claim_idx began with task_state, so writing a task's outcome
-- (PROCESSING -> SUCCESSFUL) moved its entry in claim_idx, and purge then removed the old
-- one: measured, a fifth to a quarter of the server's CPU per task (docs/journal/bench.md,
-- "The result's index move, measured (2026-11-24)"). Version 5:
--   - adds the virtual column claim_lane = task_state with SUCCESSFUL in PROCESSING's
--     place, and makes claim_idx begin with it instead of task_state (delay_idx is
--     dropped and added again only so that the keys keep the order of a fresh schema);
--   - adds the table task_claim: one row per claim transaction listing the ids it made
--     PROCESSING, which is how a new leader finds what an older epoch left PROCESSING
--     now that claim_idx does not tell PROCESSING from SUCCESSFUL;
--   - lists each row a version 4 dispatcher left PROCESSING in a task_claim row of its
--     epoch, so that the first version 5 leader recovers it.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/005-claim-lane.sql) on a
-- version 4 database. Safe to re-run: the ALTER runs only while the column is missing,
-- CREATE TABLE IF NOT EXISTS, INSERT IGNORE, and the version moves only from 4 to 5.
-- The ALTER rebuilds claim_idx: on a large table it takes a while (online: the table
-- stays readable and writable, as for any index added by InnoDB).
--
-- Portable to MySQL >= 8.0.16: MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB has), so
-- the ALTER is prepared only when information_schema.COLUMNS has no claim_lane.

SET @taskpush_m5_found = (SELECT COUNT(*) FROM information_schema.COLUMNS
                           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task'
                             AND COLUMN_NAME = 'claim_lane');
SET @taskpush_m5 = IF(@taskpush_m5_found = 0,
    'ALTER TABLE task
        ADD COLUMN claim_lane TINYINT AS (IF(task_state = 2, 1, task_state)) VIRTUAL,
        DROP INDEX claim_idx,
        DROP INDEX delay_idx,
        ADD KEY claim_idx (claim_lane, `delayed`, task_type, task_priority DESC, task_id, run_after),
        ADD KEY delay_idx (`delayed`, run_after)',
    'DO 0');
PREPARE taskpush_m5 FROM @taskpush_m5;
EXECUTE taskpush_m5;
DEALLOCATE PREPARE taskpush_m5;
SET @taskpush_m5 = NULL, @taskpush_m5_found = NULL;

CREATE TABLE IF NOT EXISTS task_claim (
    epoch    INT UNSIGNED NOT NULL,
    seq      BIGINT UNSIGNED NOT NULL,
    shard    VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    task_ids MEDIUMTEXT CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    PRIMARY KEY (epoch, seq),
    CONSTRAINT task_claim_ids_not_empty CHECK (task_ids <> '')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- A version 4 dispatcher's claims are not listed: one row per PROCESSING row, its seq
-- the task id (a version 5 dispatcher takes a newer epoch, so the two never meet).
INSERT IGNORE INTO task_claim (epoch, seq, shard, task_ids)
    SELECT epoch, task_id, '', CAST(task_id AS CHAR) FROM task WHERE task_state = 1;

UPDATE taskpush_meta SET value = 5 WHERE name = 'schema_version' AND value = 4;
