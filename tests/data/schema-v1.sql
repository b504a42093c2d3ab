-- tests/data/schema-v1.sql: sql/schema.sql as it was at schema_version 1 (commit 7ed5546),
-- kept unchanged so that tests/integration/test_migrate.c can build a version 1 database
-- and upgrade it. Never edit it; a later version gets a file of its own.

-- taskpush schema. This is the one file a user runs:
--     mariadb DBNAME < sql/schema.sql
--
-- BUMP RULE: whenever a column, an index, a constraint or the meaning of a value
-- changes, increase 'schema_version' in taskpush_meta below AND add
-- sql/migrations/NNN-short-name.sql (NNN = the new version, zero-padded) that takes a
-- database of the previous version to the new one. taskpushd reads schema_version at
-- startup and refuses to start on a version it does not know.
--
-- Safe to run twice: every statement is CREATE ... IF NOT EXISTS or INSERT IGNORE, so
-- a second run on a table full of rows changes nothing (the epoch counter is not reset).
-- No DELIMITER, no triggers, no procedures: statements end with ';' so that a client
-- with CLIENT_MULTI_STATEMENTS can send the whole file at once.
--
-- Supported servers: MariaDB >= 10.8 and MySQL >= 8.0.13 (expression defaults;
-- descending index parts need MariaDB 10.8 / MySQL 8.0.1, SKIP LOCKED MariaDB 10.6 /
-- MySQL 8.0.1, enforced CHECK constraints MySQL 8.0.16).
--
-- NOTE: `delayed` is a reserved word in both MariaDB and MySQL (INSERT DELAYED): it must
-- always be written with backquotes.

CREATE TABLE IF NOT EXISTS task (
    task_id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    -- Routes the task to the workers that registered this type. Binary collation:
    -- 'Resize' and 'resize' are two types, as they are for the dispatcher's C code.
    task_type        VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
                     DEFAULT 'default',
    -- 0 NEW, 1 PROCESSING, 2 SUCCESSFUL, 3 FAILED.
    task_state       TINYINT NOT NULL DEFAULT 0,
    -- 0 LOW, 1 NORMAL, 2 HIGH. Higher is dispatched first, then lower task_id.
    task_priority    TINYINT NOT NULL DEFAULT 1,
    -- Opaque bytes handed to the worker unchanged.
    payload          MEDIUMBLOB NULL,
    -- Milliseconds since 1970-01-01 UTC.
    insert_time      BIGINT NOT NULL DEFAULT (UNIX_TIMESTAMP(NOW(3)) * 1000),
    last_update_time BIGINT NOT NULL DEFAULT (UNIX_TIMESTAMP(NOW(3)) * 1000),
    -- Deliveries to a worker so far; the task becomes FAILED when a failed attempt
    -- reaches max_attempts.
    attempts         INT NOT NULL DEFAULT 0,
    max_attempts     INT NOT NULL DEFAULT 3,
    -- Not dispatched before this time (ms since the epoch).
    run_after        BIGINT NOT NULL DEFAULT 0,
    -- Execution limit of one attempt in ms; NULL means the dispatcher's default.
    timeout_ms       INT NULL DEFAULT NULL,
    -- Producers' idempotency key (INSERT IGNORE); blocks a re-insert while the row exists.
    dedup_key        VARBINARY(191) NULL DEFAULT NULL,
    -- The last failure message, and the worker's output on success.
    err_msg          TEXT NULL,
    result           MEDIUMBLOB NULL,

    -- Dispatcher bookkeeping; producers leave these alone.
    -- The epoch (fencing token, from taskpush_meta 'epoch') of the dispatcher that
    -- claimed the row last. A dispatcher only writes rows carrying its own epoch.
    epoch            INT UNSIGNED NOT NULL DEFAULT 0,
    -- 1 while a NEW row waits for its run_after (the delayed lane), 0 otherwise. The
    -- dispatcher promotes rows whose run_after has passed and demotes rows a producer
    -- inserted with a future run_after, so the claim scans only ready rows.
    `delayed`        TINYINT NOT NULL DEFAULT 0,

    PRIMARY KEY (task_id),
    -- The claim: equality on (state, lane, type), then exactly the ORDER BY order, so
    -- no filesort and no row of another type or lane in the scanned range. run_after
    -- lets index condition pushdown skip rows not yet demoted.
    KEY claim_idx (task_state, `delayed`, task_type, task_priority DESC, task_id, run_after),
    -- The promote/demote sweeps.
    KEY delay_idx (`delayed`, run_after),
    UNIQUE KEY dedup_key (dedup_key),

    -- utf8mb4_bin pads: in SQL 'resize ' = 'resize', so such a row would be claimed
    -- for workers of 'resize' while naming another type. LIKE does not pad.
    CONSTRAINT task_type_no_trailing_space CHECK (task_type NOT LIKE '% '),
    CONSTRAINT task_priority_range CHECK (task_priority BETWEEN 0 AND 2),
    CONSTRAINT task_state_range CHECK (task_state BETWEEN 0 AND 3)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Named counters of the dispatcher.
--   schema_version: the version of this file (see the bump rule at the top).
--   epoch: the last dispatcher epoch handed out. A starting dispatcher takes the next
--          one with
--          UPDATE taskpush_meta SET value = LAST_INSERT_ID(value + 1) WHERE name = 'epoch'
--          and reads it back with SELECT LAST_INSERT_ID() (or mysql_insert_id()).
CREATE TABLE IF NOT EXISTS taskpush_meta (
    name  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    value BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

INSERT IGNORE INTO taskpush_meta (name, value) VALUES ('schema_version', 1), ('epoch', 0);
