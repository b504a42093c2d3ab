#!/usr/bin/env bash
# Fails when a program's --help prints a --flag that its manual page does not name: the
# check of tests/check-docs.sh, run on each page with roff's escapes taken out (\- is
# "-", font changes and \& are dropped), so that "\fB\-\-tls\-ca\fR" counts as --tls-ca.
# Usage: check-man.sh CHECK_DOCS PROGRAM MANPAGE [PROGRAM MANPAGE]...
set -u
check_docs=${1:?usage: check-man.sh CHECK_DOCS PROGRAM MANPAGE [PROGRAM MANPAGE]...}
shift
if [ $# -eq 0 ] || [ $(($# % 2)) -ne 0 ]; then
  echo "usage: check-man.sh CHECK_DOCS PROGRAM MANPAGE [PROGRAM MANPAGE]..." >&2
  exit 2
fi
plain=$(mktemp -d)
trap 'rm -rf "$plain"' EXIT
args=()
while [ $# -ge 2 ]; do
  page=$(basename "$2")
  sed -e 's/\\-/-/g' -e 's/\\f\[[A-Z]*\]//g' -e 's/\\f[BIRP]//g' -e 's/\\&//g' "$2" \
    >"$plain/$page" || exit 1
  args+=("$1" "$page")
  shift 2
done
exec "$check_docs" "$plain" "${args[@]}"
