#!/usr/bin/env bash
# Fails when a program's --help prints a --flag that its page in docs/ does not
# name, so that a new flag cannot ship undocumented.
# Usage: check-docs.sh SOURCE_ROOT PROGRAM PAGE [PROGRAM PAGE]...
#   PROGRAM: a built executable; PAGE: its page, relative to SOURCE_ROOT.
set -u
root=${1:?usage: check-docs.sh SOURCE_ROOT PROGRAM PAGE [PROGRAM PAGE]...}
shift
if [ $# -eq 0 ] || [ $(($# % 2)) -ne 0 ]; then
  echo "usage: check-docs.sh SOURCE_ROOT PROGRAM PAGE [PROGRAM PAGE]..." >&2
  exit 2
fi
status=0
while [ $# -ge 2 ]; do
  prog=$1 page=$root/$2
  shift 2
  name=$(basename "$prog")
  if [ ! -r "$page" ]; then
    echo "$name: its page $page is missing"
    status=1
    continue
  fi
  if ! help=$("$prog" --help 2>&1); then
    echo "$name --help failed:"
    echo "$help"
    status=1
    continue
  fi
  flags=$(printf '%s\n' "$help" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
  if [ -z "$flags" ]; then
    echo "$name --help printed no --flag at all"
    status=1
    continue
  fi
  n=0 missing=0
  for flag in $flags; do
    n=$((n + 1))
    # The flag as a whole word: --tls must not pass on the strength of --tls-ca.
    if ! grep -qE -- "${flag}([^a-z0-9-]|\$)" "$page"; then
      echo "$name: $flag is in --help but not in ${page#"$root"/}"
      missing=$((missing + 1))
    fi
  done
  if [ "$missing" -eq 0 ]; then
    echo "$name: all $n flags of --help are in ${page#"$root"/}"
  else
    status=1
  fi
done
exit $status
