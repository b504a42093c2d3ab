#!/usr/bin/env bash
# The thread boundary, checked on the built objects (docs/architecture.md, "Threads"):
# the database threads (libdsp_db.a, dispatcher/db/) must not refer to any symbol the
# event loop's library defines (libdsp_core.a, dispatcher/), and the shared helpers
# (libdsp_common.a, dispatcher/common/) to neither. A call from a database thread into
# loop code would compile and link inside taskpushd; here it fails the test suite.
#
# Usage: check-thread-boundary.sh LIBDSP_CORE.a LIBDSP_DB.a LIBDSP_COMMON.a
# Prints TAP; one line per offending reference: OBJECT -> SYMBOL (defined in LIB).
set -u
core=$1 db=$2 common=$3
nm=${NM:-nm}

defined() { "$nm" --defined-only -g "$1" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u; }
# "object symbol" for every undefined reference of the library's objects.
undefined() {
  "$nm" -A --undefined-only "$1" 2>/dev/null |
    awk '{n = split($1, p, ":"); print p[n - 1], $NF}' | sort -u
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
defined "$core" >"$work/core"
defined "$db" >"$work/db"
for f in core db; do
  [ -s "$work/$f" ] || { echo "1..0 # cannot read symbols of $f library"; exit 1; }
done

# check NAME LIB FORBIDDEN-LISTS...: TAP line for one library.
n=0 failed=0
check() {
  local what=$1 lib=$2; shift 2
  n=$((n + 1))
  local bad
  bad=$(undefined "$lib" | while read -r obj sym; do
          for list in "$@"; do
            if grep -qxF -- "$sym" "$work/$list"; then
              echo "$obj -> $sym (defined in libdsp_$list.a)"
            fi
          done
        done)
  if [ -z "$bad" ]; then
    echo "ok $n - $what"
  else
    failed=1
    echo "not ok $n - $what"
    echo "$bad" | sed 's/^/# /'
    echo "$bad" | sed 's/^/FAIL /' >&2
  fi
}

echo "1..2"
check "database threads (dispatcher/db) refer to no symbol of the event loop" "$db" core
check "shared helpers (dispatcher/common) refer to neither the loop nor the database threads" "$common" core db
exit $failed
