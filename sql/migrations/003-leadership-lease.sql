-- Migration 3 (schema_version 2 -> 3): the leadership lease.
--
-- Until version 2 a table's leader was whoever held GET_LOCK('taskpush.<DBNAME>'), a lock
-- that lives as long as the connection holding it: a leader that froze (SIGSTOP, a paused
-- VM) with its connection open kept the table for ever. Version 3 adds a lease that
-- expires: one row of taskpush_meta, name 'lease', and three columns the other rows
-- leave at their defaults:
--     value       the epoch the holder leads with (0 while it has none yet)
--     holder      a random number the holding taskpushd drew at start; 0: nobody
--     expires_ms  when the lease ends, in ms since 1970 on the database's clock
--     conns       the holder's database connections: "B C W L S" (B: when the server
--                 started, in s since 1970; then the connection ids of its claim, write,
--                 lease and stats threads), so that a standby taking over can KILL them
-- The holder renews the lease every few hundred ms with one UPDATE of that row; a standby
-- takes it over once expires_ms has passed (docs/architecture.md, "Standby and
-- leadership").
--
-- Applied by `taskpushd --db URL --migrate` (stop every taskpushd on the database first).
-- It may also be run by hand (mariadb DBNAME < sql/migrations/003-leadership-lease.sql)
-- on a version 2 database. Safe to re-run: the columns are added only when none of them
-- exists yet (it stops with an error when only some do), the row is INSERT IGNOREd, and
-- the version moves only from 2 to 3. taskpush_meta has three rows: the ALTER is instant.
--
-- Portable to MySQL >= 8.0.16: MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB has), so
-- the ALTER is prepared only when information_schema.COLUMNS has none of the three.

SET @taskpush_m3_found = (SELECT COUNT(*) FROM information_schema.COLUMNS
                           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'taskpush_meta'
                             AND COLUMN_NAME IN ('holder', 'expires_ms', 'conns'));
SET @taskpush_m3 = CASE @taskpush_m3_found
    WHEN 0 THEN
    'ALTER TABLE taskpush_meta
        ADD COLUMN holder BIGINT UNSIGNED NOT NULL DEFAULT 0,
        ADD COLUMN expires_ms BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN conns VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '''''
    WHEN 3 THEN 'DO 0'
    ELSE 'SELECT * FROM `migration 3: drop its partly added columns, then rerun`'
END;
PREPARE taskpush_m3 FROM @taskpush_m3;
EXECUTE taskpush_m3;
DEALLOCATE PREPARE taskpush_m3;
SET @taskpush_m3 = NULL, @taskpush_m3_found = NULL;

INSERT IGNORE INTO taskpush_meta (name, value) VALUES ('lease', 0);

UPDATE taskpush_meta SET value = 3 WHERE name = 'schema_version' AND value = 2;
