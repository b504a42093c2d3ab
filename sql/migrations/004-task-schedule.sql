-- Migration 4 (schema_version 3 -> 4): periodic tasks.
--
-- Adds the table task_schedule: one row per schedule (a name, the task each run inserts,
-- an interval or a cron expression, the rule for missed runs, the next due time). The
-- leading taskpushd inserts each due run into task with INSERT IGNORE and the dedup_key
-- 'schedule:<name>:<due ms>', so that two dispatchers or a restart never insert a run
-- twice, then advances next_run (docs/producers.md, "Periodic tasks"; docs/schema.md).
-- The table task is not changed.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/004-task-schedule.sql) on
-- a version 3 database. Safe to re-run: CREATE TABLE IF NOT EXISTS, and the version
-- moves only from 3 to 4.

CREATE TABLE IF NOT EXISTS task_schedule (
    schedule_id   BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    -- Unique; each due run's task gets dedup_key 'schedule:<name>:<due ms>'.
    name          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The task each run inserts: its type, payload and priority, as in task.
    task_type     VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload       MEDIUMBLOB NULL,
    task_priority TINYINT NOT NULL DEFAULT 1,
    -- Exactly one of the two: every interval_ms (due times are its multiples since
    -- 1970), or a cron expression of 5 fields in UTC (minute hour day month weekday).
    interval_ms   BIGINT NULL DEFAULT NULL,
    cron          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL DEFAULT NULL,
    -- Runs missed while no dispatcher led: 'skip' inserts only the latest one,
    -- 'catch-up' each of them, at most catch_up_max (the latest).
    missed        VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'skip',
    catch_up_max  INT NOT NULL DEFAULT 100,
    -- The next due time, ms since 1970; 0: the first due time after the leader sees it.
    -- The leader advances it after inserting the due runs.
    next_run      BIGINT NOT NULL DEFAULT 0,

    PRIMARY KEY (schedule_id),
    UNIQUE KEY name (name),
    KEY next_run_idx (next_run),
    CONSTRAINT schedule_name_not_empty CHECK (name <> ''),
    CONSTRAINT schedule_type_valid CHECK (task_type <> '' AND task_type NOT LIKE '% '),
    CONSTRAINT schedule_priority_range CHECK (task_priority BETWEEN 0 AND 2),
    CONSTRAINT schedule_one_rule CHECK ((interval_ms IS NULL) <> (cron IS NULL)),
    CONSTRAINT schedule_interval_range CHECK (interval_ms IS NULL OR interval_ms BETWEEN 1000 AND 31622400000),
    CONSTRAINT schedule_missed_rule CHECK (missed IN ('skip', 'catch-up')),
    CONSTRAINT schedule_catch_up_max_range CHECK (catch_up_max BETWEEN 1 AND 1000),
    CONSTRAINT schedule_next_run_min CHECK (next_run >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

UPDATE taskpush_meta SET value = 4 WHERE name = 'schema_version' AND value = 3;
