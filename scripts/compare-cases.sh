#!/usr/bin/env bash
# compare-cases.sh BEFORE AFTER: the test cases that BEFORE lists and AFTER does not.
#
# BEFORE and AFTER are case lists written by `scripts/test-summary.py --cases`
# (scripts/test.sh leaves one in test-cases.txt). A case is its first three fields
# (build, suite/test, case name); its result is ignored, so a case that now fails
# is not "missing" (the "N passed, N failed" line says that). A name listed twice
# must be listed twice in AFTER too. Prints each missing case; exit 1 if any, 0 if
# none, 2 on a usage error. A renamed case shows up here and needs explaining.
set -euo pipefail
if [ $# -ne 2 ] || [ ! -r "$1" ] || [ ! -r "$2" ]; then
  echo "usage: $0 BEFORE AFTER (two files from test-summary.py --cases)" >&2
  exit 2
fi
export LC_ALL=C  # comm needs both inputs sorted the same way
missing=$(comm -23 <(cut -f1-3 "$1" | sort) <(cut -f1-3 "$2" | sort))
if [ -n "$missing" ]; then
  printf '%s\n' "$missing"
  echo "compare-cases: $(printf '%s\n' "$missing" | wc -l) case(s) of $1 missing from $2" >&2
  exit 1
fi
echo "compare-cases: all $(wc -l <"$1") case(s) of $1 are in $2" >&2
