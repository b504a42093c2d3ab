#!/usr/bin/env bash
# run.sh: the whole comparison from a fresh clone. Builds if needed, starts a private
# MariaDB (scripts/tp-mariadb) in a temporary directory, runs taskpush-bench with the
# arguments given (none: every design at K=4,16,64,256, median of 3), writes
#   bench/results/DATE-HOST.jsonl   the JSON lines (settings, then one per run)
#   bench/results/DATE-HOST.md      the command, the header and the table
#   bench/results/DATE-HOST.png/.svg  tasks/s against K (when python3-matplotlib is there)
# and stops the server. Exits with taskpush-bench's status (1: a run failed verification).
#   bench/run.sh                               the full comparison
#   bench/run.sh --design taskpush-ll --k 64   one design at one K
#   bench/run.sh --modes [FLAGS]               the stream, latency, connections and backlog
#                                              modes in turn (FLAGS go to each, e.g. --quick),
#                                              into bench/results/DATE-HOST-modes.{jsonl,md}
#   bench/run.sh --mode latency --poll-ms 10   one mode
set -euo pipefail

modes=""
if [ "${1:-}" = "--modes" ]; then
  shift
  modes="stream latency connections backlog"
fi

root=$(cd "$(dirname "$0")/.." && pwd)
build=${TASKPUSH_BUILD_DIR:-$root/build}
cd "$root"

# A fresh clone on a bare machine: what building and the plot need (apt-get, as the
# test command does; nothing when everything is there).
scripts/install-deps.sh --bench

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" >/dev/null
fi
ninja -C "$build" -j2 bench/taskpush-bench dispatcher/taskpushd >/dev/null

dbdir=$(mktemp -d "${TMPDIR:-/tmp}/taskpush-bench-db.XXXXXX")
cleanup() {
  scripts/tp-mariadb stop "$dbdir" >/dev/null 2>&1 || true
  rm -rf "$dbdir"
}
trap cleanup EXIT
eval "$(scripts/tp-mariadb start "$dbdir")"

mkdir -p bench/results
out=bench/results/$(date -u +%Y-%m-%d-%H%M)-$(hostname -s)
status=0
if [ -n "$modes" ]; then
  # One bench per mode, each on the same server; the connections mode needs a raised
  # descriptor limit, which the bench sets itself from the hard limit.
  out=$out-modes
  : >"$out.log"
  for m in $modes; do
    "$build/bench/taskpush-bench" --mode "$m" "$@" >>"$out.log" || status=1
  done
  set -- --modes "$@"
else
  "$build/bench/taskpush-bench" "$@" >"$out.log" || status=$?
fi
grep '^{' "$out.log" >"$out.jsonl" || true
{
  echo "# taskpush-bench, $(date -u +%Y-%m-%d) on $(hostname -s)"
  echo
  echo "Command: \`bench/run.sh${*:+ $*}\` (exit status $status)"
  echo
  grep -v '^{' "$out.log" || true
} >"$out.md"
rm -f "$out.log"
cat "$out.md"
# The plot is of the drain's tasks/s against K; the modes print tables only.
if [ -n "$modes" ] || ! grep -q '"mode":"drain"' "$out.jsonl"; then
  echo "run.sh: wrote $out.jsonl and $out.md (no plot for the modes)"
  exit "$status"
fi

# Debian's python3-matplotlib is for /usr/bin/python3, which another python3 on the
# PATH (pyenv, a venv) may hide.
plotter=""
for py in python3 /usr/bin/python3; do
  if "$py" -c 'import matplotlib' 2>/dev/null; then plotter=$py; break; fi
done
if [ -n "$plotter" ]; then
  "$plotter" bench/plot.py "$out.jsonl" "$out"
  echo "run.sh: wrote $out.jsonl, $out.md, $out.png and $out.svg"
else
  echo "run.sh: no plot: python3-matplotlib is not installed (scripts/install-deps.sh --bench)"
  echo "run.sh: wrote $out.jsonl and $out.md"
fi
exit "$status"
