-- taskpush schema. This is the one file a user runs on a new database:
--     mariadb DBNAME < sql/schema.sql
-- It creates the current version (schema_version 12) directly. On an existing database it
-- changes nothing (see "Safe to run twice"), so it never upgrades one: that is what the
-- migrations do. To upgrade, stop every taskpushd on the database, then run
--     taskpushd --db URL --migrate
-- which applies, in order, each sql/migrations/NNN-*.sql above the database's version
-- (the files are compiled into taskpushd). taskpushd refuses to start on a version older
-- or newer than the one it was built for, and says which command fixes it.
--
-- BUMP RULE: whenever a column, an index, a constraint or the meaning of a value
-- changes, increase 'schema_version' in taskpush_meta below AND add
-- sql/migrations/NNN-short-name.sql (NNN = the new version, zero-padded) that takes a
-- database of the previous version to the new one, AND list it in sql/meson.build.
-- A migration repairs the rows the change would refuse, is safe to re-run, and ends with
--     UPDATE taskpush_meta SET value = N WHERE name = 'schema_version' AND value = N - 1;
-- A migrated database must end up exactly like a fresh one (tests/integration/
-- test_migrate.c compares SHOW CREATE TABLE), so new constraints go after the old ones.
-- The build checks that the migrations are numbered 2..N without gaps, that each one
-- ends with its version UPDATE, and that N is the version below and in db_claim_sql.h.
--
-- Safe to run twice: every statement is CREATE ... IF NOT EXISTS or INSERT IGNORE, so
-- a second run on a table full of rows changes nothing (the epoch counter is not reset).
-- A task table that is not taskpush's stops it before its first CREATE (see below).
-- No DELIMITER, no triggers, no procedures: statements end with ';' so that a client
-- with CLIENT_MULTI_STATEMENTS can send the whole file at once.
--
-- Supported servers: MariaDB >= 10.8 and MySQL >= 8.0.13 (expression defaults;
-- descending index parts need MariaDB 10.8 / MySQL 8.0.1, SKIP LOCKED MariaDB 10.6 /
-- MySQL 8.0.1, enforced CHECK constraints MySQL 8.0.16).
--
-- NOTE: `delayed` is a reserved word in both MariaDB and MySQL (INSERT DELAYED): it must
-- always be written with backquotes.

-- A team's own table named task is never adopted (docs/adopting.md). When this database
-- has a task table without the columns every taskpush schema has, the third statement
-- below fails, so the client stops (exit status 1) before anything is created or
-- stamped, with the message in the error (the server cuts it at about 200 bytes: what to
-- do comes first). It fails by setting sql_notes to the message:
-- the one way for a plain script to raise an error with its own text on both MariaDB and
-- MySQL (SIGNAL needs a procedure). On taskpush's table, of any version, it sets nothing.
SET @taskpush_missing = (SELECT GROUP_CONCAT(n ORDER BY o SEPARATOR ', ') FROM (
    SELECT 0 AS o, 'task_id' AS n UNION ALL SELECT 1, 'task_type'
    UNION ALL SELECT 2, 'task_state' UNION ALL SELECT 3, 'task_priority'
    UNION ALL SELECT 4, 'payload' UNION ALL SELECT 5, 'insert_time'
    UNION ALL SELECT 6, 'last_update_time' UNION ALL SELECT 7, 'attempts'
    UNION ALL SELECT 8, 'max_attempts' UNION ALL SELECT 9, 'run_after'
    UNION ALL SELECT 10, 'timeout_ms' UNION ALL SELECT 11, 'dedup_key'
    UNION ALL SELECT 12, 'err_msg' UNION ALL SELECT 13, 'result'
    UNION ALL SELECT 14, 'epoch' UNION ALL SELECT 15, 'delayed'
  ) w WHERE n NOT IN (SELECT column_name FROM information_schema.columns
                      WHERE table_schema = DATABASE() AND table_name = 'task'));
SET @taskpush_missing = IF(EXISTS (SELECT 1 FROM information_schema.tables
                                   WHERE table_schema = DATABASE() AND table_name = 'task'),
                           @taskpush_missing, NULL);
SET SESSION sql_notes = IF(@taskpush_missing IS NULL, @@session.sql_notes,
    CONCAT('sql/schema.sql changed nothing: the table task of database ', DATABASE(),
           ' is not taskpush''s (see docs/adopting.md), it lacks the columns ',
           @taskpush_missing));

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
    -- Deliveries to a worker so far, 0 to 1000; the task becomes FAILED when a failed
    -- attempt reaches max_attempts (or when it is claimed with none left).
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
    -- Version 10 (sql/migrations/010-task-dependencies.sql): 2 while a NEW row waits
    -- for the tasks task_dep lists for it; the dispatcher sets 0 (or 1) once all are
    -- SUCCESSFUL, and makes the row FAILED when one of them failed.
    `delayed`        TINYINT NOT NULL DEFAULT 0,
    -- Version 5 (sql/migrations/005-claim-lane.sql): task_state, with SUCCESSFUL (2) in
    -- PROCESSING's place (1), so that writing a success changes no indexed value and
    -- moves no entry of claim_idx. Computed by the server; nobody writes it.
    -- Version 12 (sql/migrations/012-keyed-claim-lane.sql): NULL for a row with a
    -- group_key unless it is FAILED, so that claiming or finishing a keyed row moves no
    -- entry of claim_idx (group_idx, through group_lane, has its state): lane 0 holds
    -- the NEW rows without a key, lane 3 every FAILED row.
    claim_lane       TINYINT AS (IF(group_key IS NULL OR task_state = 3, IF(task_state = 2, 1, task_state), NULL)) VIRTUAL,
    -- Version 7 (sql/migrations/007-failed-at.sql): when a FAILED row failed (the
    -- last_update_time that the write making it FAILED set), NULL in any other state.
    -- Computed by the server; nobody writes it.
    failed_at        BIGINT AS (IF(task_state = 3, last_update_time, NULL)) VIRTUAL,
    -- Version 8 (sql/migrations/008-group-key.sql): the task's key for fair share
    -- (docs/schema.md); NULL: none. Within a type and priority, keys take turns.
    group_key        VARBINARY(191) NULL DEFAULT NULL,
    -- Version 8: claim_lane for a row with a key, NULL for one without, so that a
    -- claim or a success of a keyless row moves no entry of group_idx (a table that
    -- uses no keys does not pay for it). Computed by the server; nobody writes it.
    group_lane       TINYINT AS (IF(group_key IS NULL, NULL, IF(task_state = 2, 1, task_state))) VIRTUAL,

    PRIMARY KEY (task_id),
    -- The claim: equality on (claim_lane, delayed, type), then exactly the ORDER BY
    -- order, so no filesort and no row of another type or lane in the scanned range.
    -- run_after lets index condition pushdown skip rows not yet demoted. Lane 1 holds
    -- PROCESSING and SUCCESSFUL rows alike: the PROCESSING ones are found through
    -- task_claim instead.
    KEY claim_idx (claim_lane, `delayed`, task_type, task_priority DESC, task_id, run_after),
    -- The promote/demote sweeps.
    KEY delay_idx (`delayed`, run_after),
    -- The newest failures of a type, and its failures since a time (GET /failed,
    -- POST /retry-failed): a claim or a success leaves failed_at NULL and moves nothing.
    KEY failed_idx (task_type, failed_at),
    -- Fair share (version 8): per type and priority, the ready keyed rows key by key,
    -- so a claim passes a key's backlog with one seek (dispatcher/db/db_claim_fair.c).
    -- Keyless rows sit under group_lane NULL and are read through claim_idx.
    KEY group_idx (group_lane, `delayed`, task_type, task_priority DESC, group_key, task_id, run_after),
    UNIQUE KEY dedup_key (dedup_key),

    -- utf8mb4_bin pads: in SQL 'resize ' = 'resize', so such a row would be claimed
    -- for workers of 'resize' while naming another type. LIKE does not pad.
    CONSTRAINT task_type_no_trailing_space CHECK (task_type NOT LIKE '% '),
    CONSTRAINT task_priority_range CHECK (task_priority BETWEEN 0 AND 2),
    CONSTRAINT task_state_range CHECK (task_state BETWEEN 0 AND 3),
    -- Version 2 (sql/migrations/002-row-value-checks.sql says why, and why 1000).
    CONSTRAINT attempts_min CHECK (attempts >= 0),
    CONSTRAINT max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT timeout_ms_positive CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    CONSTRAINT run_after_min CHECK (run_after >= 0),
    CONSTRAINT task_type_not_empty CHECK (task_type <> ''),
    -- Version 6 (sql/migrations/006-attempts-max.sql): no count the dispatcher writes is
    -- larger (it delivers only while attempts < max_attempts <= 1000).
    CONSTRAINT attempts_max CHECK (attempts <= 1000)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;

-- Named counters of the dispatcher.
--   schema_version: the version of this file (see the bump rule at the top).
--   epoch: the last dispatcher epoch handed out. A starting dispatcher takes the next
--          one with
--          UPDATE taskpush_meta SET value = LAST_INSERT_ID(value + 1) WHERE name = 'epoch'
--          and reads it back with SELECT LAST_INSERT_ID() (or mysql_insert_id()).
--   lease: the table's leadership (version 3, sql/migrations/003-leadership-lease.sql):
--          value the holder's epoch, holder a random number its taskpushd drew (0:
--          nobody), expires_ms the end of the lease on the database's clock (ms since
--          1970), conns "B C W L S": the server's start (s since 1970) and the holder's
--          claim, write, lease and stats connection ids, for a standby to KILL. The
--          other rows leave these three columns at their defaults.
CREATE TABLE IF NOT EXISTS taskpush_meta (
    name  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    value BIGINT UNSIGNED NOT NULL,
    holder BIGINT UNSIGNED NOT NULL DEFAULT 0,
    expires_ms BIGINT NOT NULL DEFAULT 0,
    conns VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

INSERT IGNORE INTO taskpush_meta (name, value) VALUES ('schema_version', 12), ('epoch', 0), ('lease', 0);

-- Periodic tasks (version 4, sql/migrations/004-task-schedule.sql): one row per
-- schedule; the leading taskpushd inserts its due runs into task (docs/schema.md).
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

-- The claims whose rows may still be PROCESSING (version 5, sql/migrations/
-- 005-claim-lane.sql): one row per claim transaction, inserted by that transaction,
-- listing the ids it made PROCESSING under its epoch. The dispatcher deletes the row
-- once every one of them has left PROCESSING (outcome written, or put back to NEW). A
-- leader recovers the rows listed under older epochs (docs/architecture.md, "taskpushd
-- is killed"), since claim_idx no longer tells PROCESSING from SUCCESSFUL. Invariant:
-- every PROCESSING row is listed in a row of its epoch; a listed row may have finished.
CREATE TABLE IF NOT EXISTS task_claim (
    epoch    INT UNSIGNED NOT NULL,
    -- The claim's number within its epoch (the dispatcher counts from 1).
    seq      BIGINT UNSIGNED NOT NULL,
    -- The shard (--shard) whose leader claimed; '' unsharded.
    shard    VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    -- Decimal task ids separated by ',' (at most a claim's --batch of them).
    task_ids MEDIUMTEXT CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    PRIMARY KEY (epoch, seq),
    CONSTRAINT task_claim_ids_not_empty CHECK (task_ids <> '')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

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

-- Dependencies (version 10, sql/migrations/010-task-dependencies.sql): one row per task
-- that a task waits for. A producer inserts the waiting task (task.`delayed` = 2) and its
-- rows here in one transaction (docs/producers.md, "Dependencies"); the dispatcher
-- releases the task once every one of them is SUCCESSFUL. The rows stay while the task
-- does (GET /task shows them); the dispatcher deletes those of tasks no longer in task.
CREATE TABLE IF NOT EXISTS task_dep (
    -- The waiting task (task.task_id).
    task_id   BIGINT UNSIGNED NOT NULL,
    -- A task it waits for (task.task_id); never the task itself.
    parent_id BIGINT UNSIGNED NOT NULL,
    -- A task's dependencies in parent_id order: the dispatcher reads them from the first
    -- one it has not seen SUCCESSFUL yet.
    PRIMARY KEY (task_id, parent_id),
    -- A parent's dependants, when its outcome is written.
    KEY dep_parent_idx (parent_id),
    CONSTRAINT dep_not_self CHECK (task_id <> parent_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Progress of running tasks (version 11, sql/migrations/011-task-progress.sql): the
-- latest report of a worker (PROGRESS, protocol version 4) for a task it runs, one row
-- per task, written by the leading dispatcher at most once a second per task and
-- deleted when the task ends, so that `taskpushctl show`, GET /task and the next leader
-- show it (docs/taskpushd.md, "Progress of running tasks"). A table of taskpush's own:
-- writing it moves nothing in the task table or its indexes.
CREATE TABLE IF NOT EXISTS task_progress (
    task_id     BIGINT UNSIGNED NOT NULL,
    -- The delivery the report is of: the epoch its dispatcher led with, its attempt.
    epoch       INT UNSIGNED NOT NULL DEFAULT 0,
    attempt     INT UNSIGNED NOT NULL DEFAULT 0,
    -- 0 to 1000 (1000: done).
    permille    SMALLINT UNSIGNED NOT NULL DEFAULT 0,
    -- The worker's text, UTF-8 checked by the dispatcher, 0 to 256 bytes.
    message     VARBINARY(256) NOT NULL DEFAULT '',
    -- When the dispatcher received the report (ms since 1970, its clock).
    reported_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id),
    CONSTRAINT progress_permille_range CHECK (permille <= 1000)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
