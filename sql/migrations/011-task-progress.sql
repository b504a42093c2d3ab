-- Migration 11 (schema_version 10 -> 11): progress of running tasks.
--
-- A worker of protocol version 4 reports how far it is with a task (PROGRESS: a value
-- 0 to 1000 and a short text). The leading dispatcher keeps the latest report in
-- memory and writes it to the table task_progress at most once a second per task,
-- deleting the row when the task ends, so that `taskpushctl show`, GET /task and a
-- dispatcher that takes the lead show it (docs/taskpushd.md, "Progress of running
-- tasks"). A table of its own rather than columns of task: a report writes no row of
-- task (no lock the outcome writes wait for, no row event for the binary log's
-- followers to read) and the migration is instant on a table of any size.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/011-task-progress.sql) on
-- a version 10 database. Safe to re-run: CREATE TABLE IF NOT EXISTS, and the version
-- moves only from 10 to 11. Instant: a new, empty table.

-- sql/schema.sql says what each column means.
CREATE TABLE IF NOT EXISTS task_progress (
    task_id     BIGINT UNSIGNED NOT NULL,
    epoch       INT UNSIGNED NOT NULL DEFAULT 0,
    attempt     INT UNSIGNED NOT NULL DEFAULT 0,
    permille    SMALLINT UNSIGNED NOT NULL DEFAULT 0,
    message     VARBINARY(256) NOT NULL DEFAULT '',
    reported_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id),
    CONSTRAINT progress_permille_range CHECK (permille <= 1000)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

UPDATE taskpush_meta SET value = 11 WHERE name = 'schema_version' AND value = 10;
