-- Migration 6 (schema_version 5 -> 6): attempts has an upper bound.
--
-- Until version 5 attempts had only a lower bound (attempts >= 0), so a producer could
-- write 2147483647: the dispatcher's next delivery then wrote 2147483648, which an INT
-- refuses (error 1264), which failed the whole batch of outcomes it was written in (each
-- then written alone) and left that row PROCESSING until a restart. A dispatcher delivers
-- a task only while attempts < max_attempts (at most 1000, version 2), so no count it
-- writes is above 1000; version 6 makes the server refuse a larger one:
--     attempts <= 1000
-- A row with attempts at or above its max_attempts has no attempt left: a version 6
-- dispatcher that claims it makes it FAILED ("no attempt left: ...") rather than
-- delivering it again.
--
-- Rows above the bound are clamped first (ALTER TABLE ... ADD CONSTRAINT fails on
-- them): attempts > 1000 -> 1000. Nothing else changes. Such a row that is NEW (or
-- PROCESSING, recovered to NEW) then ends FAILED at its next claim, as above.
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/006-attempts-max.sql) on a
-- version 5 database. Safe to re-run: the clamp finds nothing the second time, the
-- constraint is added only while information_schema.CHECK_CONSTRAINTS has no
-- attempts_max (MySQL has no ADD CONSTRAINT IF NOT EXISTS), and the version moves only
-- from 5 to 6. Adding the constraint rebuilds the table, and producers' INSERTs wait
-- while it runs: on a large table, run it at a quiet time.

UPDATE task SET attempts = 1000 WHERE attempts > 1000;

SET @taskpush_m6_found = (SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS
                           WHERE CONSTRAINT_SCHEMA = DATABASE()
                             AND CONSTRAINT_NAME = 'attempts_max');
SET @taskpush_m6 = IF(@taskpush_m6_found = 0,
    'ALTER TABLE task ADD CONSTRAINT attempts_max CHECK (attempts <= 1000)',
    'DO 0');
PREPARE taskpush_m6 FROM @taskpush_m6;
EXECUTE taskpush_m6;
DEALLOCATE PREPARE taskpush_m6;
SET @taskpush_m6 = NULL, @taskpush_m6_found = NULL;

UPDATE taskpush_meta SET value = 6 WHERE name = 'schema_version' AND value = 5;
