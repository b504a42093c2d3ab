-- Migration 10 (schema_version 9 -> 10): a PLACEHOLDER on the branch r35-progress.
--
-- Version 10 belongs to the dependencies of issue 35 (branch r35-deps), built beside
-- this branch; this file only keeps the numbers 2..N without a gap (sql/meson.build,
-- dispatcher/embed.py) so that version 11 (011-task-progress.sql) builds and is tested
-- here. At the merge, r35-deps' 010 replaces this file whole.
--
-- Safe to re-run: the version moves only from 9 to 10.

UPDATE taskpush_meta SET value = 10 WHERE name = 'schema_version' AND value = 9;
