-- Migration 9 (schema_version 8 -> 9): runtime settings kept in the database.
--
-- Until version 8 the limits, per-key limits and pauses an operator set at run time
-- (POST /limit, /pause, /resume) lived in the memory of the dispatcher that took the
-- request: a standby taking over, or the same dispatcher restarted, did not have them.
-- Version 9 adds the table task_setting (one row per task type; sql/schema.sql says
-- what each column means): the dispatchers write it at each such request, and a
-- dispatcher taking the lead reads it and applies it before its first claim.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/009-runtime-settings.sql)
-- on a version 8 database. Safe to re-run: CREATE TABLE IF NOT EXISTS, and the version
-- moves only from 8 to 9. Instant: a new, empty table.

-- Runtime settings (version 9, sql/migrations/009-runtime-settings.sql): what an operator
-- set at run time (POST /limit, /pause, /resume; taskpushctl pause, resume), one row per
-- task type, so that every dispatcher that takes the lead applies it (docs/taskpushd.md,
-- "Runtime settings"). The dispatchers write it; an operator may DELETE a row to go back
-- to the flags and config file at the next takeover.
CREATE TABLE IF NOT EXISTS task_setting (
    -- The type's name, as the workers name it (1 to 256 bytes); '' for every type (a
    -- pause of all types).
    task_type     VARBINARY(256) NOT NULL,
    -- 1 when the limits below were set at run time: they replace the flag's or the
    -- config file's for this type; 0: the limits come from there.
    has_limit     TINYINT NOT NULL DEFAULT 0,
    -- Each 0 to 1000000, 0 no limit (docs/taskpushd.md, "Per-type limits").
    concurrency   INT UNSIGNED NOT NULL DEFAULT 0,
    rate          INT UNSIGNED NOT NULL DEFAULT 0,
    per_group     INT UNSIGNED NOT NULL DEFAULT 0,
    -- 1: paused (neither claimed nor dispatched) until resumed.
    paused        TINYINT NOT NULL DEFAULT 0,
    -- When a dispatcher last wrote the row (ms since 1970, its clock).
    updated_ms    BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (task_type),
    CONSTRAINT setting_limits_range CHECK (concurrency <= 1000000 AND rate <= 1000000
                                           AND per_group <= 1000000),
    CONSTRAINT setting_flags_range CHECK (has_limit IN (0, 1) AND paused IN (0, 1))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

UPDATE taskpush_meta SET value = 9 WHERE name = 'schema_version' AND value = 8;
