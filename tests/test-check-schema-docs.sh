#!/usr/bin/env bash
# check-schema-docs.py passes on the tree, and fails, naming the file and line, on a copy
# of it with a doc that names an old schema version as the current one (the "now 3"
# docs/taskpushd.md once said), with a migration missing from docs/schema.md's table,
# with --migrate's output naming a migration wrongly, and after a schema bump that the
# docs did not follow.
# Usage: test-check-schema-docs.sh CHECK SOURCE_ROOT
set -u
check=${1:?usage: test-check-schema-docs.sh CHECK SOURCE_ROOT}
src=${2:?usage: test-check-schema-docs.sh CHECK SOURCE_ROOT}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The interpreter itself, once: a python3 on PATH may be a slow wrapper (pyenv's shim).
py=$(python3 -c 'import sys; print(sys.executable)') || { echo "FAIL: no python3"; exit 1; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

fresh() { # a copy of the files the check reads, in $work/t
  rm -rf "$work/t"
  mkdir -p "$work/t/dispatcher/db" "$work/t/sql" "$work/t/packaging" "$work/t/python"
  cp "$src/dispatcher/db/db_claim_sql.h" "$work/t/dispatcher/db/"
  cp -r "$src/sql/migrations" "$work/t/sql/"
  mkdir -p "$work/t/docs" && cp "$src"/docs/*.md "$work/t/docs/"
  cp -r "$src/man" "$src/README.md" "$work/t/"
  cp "$src/packaging/README.md" "$work/t/packaging/"
  cp "$src/python/README.md" "$work/t/python/"
}
expect_fail() { # WHAT GREP-PATTERN: the check fails and its output matches
  local out rc
  out=$("$py" "$check" "$work/t" 2>&1); rc=$?
  if [ $rc -ne 1 ]; then
    fail "$1: exit $rc, expected 1: $out"
  elif ! printf '%s\n' "$out" | grep -qE -- "$2"; then
    fail "$1: the output does not match '$2': $out"
  else
    echo "ok: $1: $(printf '%s\n' "$out" | grep -E -- "$2" | head -n 1)"
  fi
}

current=$(sed -n 's/^#define DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN \([0-9]*\)$/\1/p' "$src/dispatcher/db/db_claim_sql.h")
[ -n "$current" ] || { echo "FAIL: no current version in db_claim_sql.h"; exit 1; }

fresh
out=$("$py" "$check" "$work/t" 2>&1) || fail "the check fails on a copy of the tree: $out"
echo "$out"

fresh
sed -i "s/(now $current)/(now 3)/" "$work/t/docs/taskpushd.md"
grep -q '(now 3)' "$work/t/docs/taskpushd.md" || fail "docs/taskpushd.md has no '(now $current)' to make stale"
expect_fail "docs/taskpushd.md says (now 3)" "^docs/taskpushd\.md:[0-9]+: names schema version 3 as current"

fresh
echo 'Upgrade: `schema version 3 is current: nothing to do`.' >>"$work/t/README.md"
expect_fail "README.md says schema version 3 is current" "^README\.md:[0-9]+: names schema version 3"

fresh
sed -i "/^| $current | \`sql\/migrations\//d" "$work/t/docs/schema.md"
expect_fail "docs/schema.md's table without version $current" "^docs/schema\.md:[0-9]+: the table of versions lacks version $current"

fresh
sed -i "s/^\(    schema $((current - 1)) -> $current: \).*/\1claim lane/" "$work/t/docs/taskpushd.md"
expect_fail "--migrate's output with a wrong name" "^docs/taskpushd\.md:[0-9]+: 'schema $((current - 1)) -> $current: claim lane' is not what --migrate prints"

# A schema bump (the code's side: a new migration, the new version) the docs missed.
fresh
next=$((current + 1))
printf -- '-- a test migration\n' >"$work/t/sql/migrations/$(printf %03d $next)-test-bump.sql"
sed -i "s/^#define DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN $current\$/#define DSP_CLAIM_SQL_SCHEMA_VERSION_KNOWN $next/" \
  "$work/t/dispatcher/db/db_claim_sql.h"
expect_fail "a bump to $next the docs missed" "the table of versions lacks version $next"
expect_fail "a bump to $next the docs missed" "^docs/taskpushd\.md:[0-9]+: names schema version $current as current"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "the schema version lint fails on each stale doc, naming the file and line"
