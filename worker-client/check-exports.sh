#!/bin/sh
# check-exports.sh LIBRARY SYMFILE: fails when the dynamic symbols LIBRARY
# defines differ from the committed list SYMFILE (one name per line, sorted).
# Update SYMFILE in the same change that adds or removes a public function.
set -u
lib=${1:?usage: check-exports.sh LIBRARY SYMFILE}
list=${2:?usage: check-exports.sh LIBRARY SYMFILE}
actual=$(nm -D --defined-only "$lib" | awk 'NF >= 3 && $2 != "A" { sub(/@.*/, "", $3); print $3 }' | LC_ALL=C sort -u) || exit 1
expected=$(grep -v '^#' "$list" | LC_ALL=C sort -u)
if [ "$actual" != "$expected" ]; then
  echo "exported symbols of $lib differ from $list:"
  printf '%s\n' "$expected" >"${TMPDIR:-/tmp}/tp-exports-expected.$$"
  printf '%s\n' "$actual" | diff -u "${TMPDIR:-/tmp}/tp-exports-expected.$$" - 
  rm -f "${TMPDIR:-/tmp}/tp-exports-expected.$$"
  exit 1
fi
echo "$(printf '%s\n' "$actual" | wc -l) exported symbols match $list"
