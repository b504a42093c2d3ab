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
#   bench/run.sh --modes [FLAGS]               the stream, latency, connections, backlog,
#                                              mixed and soak modes in turn (FLAGS go to
#                                              each, e.g. --quick; soak takes 10 min),
#                                              into bench/results/DATE-HOST-modes.{jsonl,md}
#   bench/run.sh --mode latency --poll-ms 10   one mode
#   bench/run.sh --db-cpus 0 --bench-cpus 1 --design taskpush-rr,ceiling --flat
#                                              mariadbd on CPU 0, the bench (its clients,
#                                              workers and taskpushd) on CPU 1: the
#                                              database on a core of its own, as on a
#                                              machine of its own (bench/README.md)
# --modes, --db-cpus and --bench-cpus come first; the rest goes to taskpush-bench.
set -euo pipefail

modes=""
binlog=none
db_cpus=""
bench_cpus=""
while [ $# -gt 0 ]; do
  case "$1" in
    --modes) modes="stream latency connections backlog mixed soak"; shift ;;
    # The server's binary log (scripts/tp-mariadb --binlog): --wake binlog follows it.
    --binlog) binlog=${2:?--binlog wants ROW, MIXED, STATEMENT or none}; shift 2 ;;
    --db-cpus) db_cpus=${2:?--db-cpus wants a CPU list, e.g. 0}; shift 2 ;;
    --bench-cpus) bench_cpus=${2:?--bench-cpus wants a CPU list, e.g. 1}; shift 2 ;;
    *) break ;;
  esac
done
if { [ -n "$db_cpus" ] && [ -z "$bench_cpus" ]; } || { [ -z "$db_cpus" ] && [ -n "$bench_cpus" ]; }; then
  echo "run.sh: --db-cpus and --bench-cpus go together" >&2
  exit 2
fi
for l in "$db_cpus" "$bench_cpus"; do
  if [ -n "$l" ] && ! [[ "$l" =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]]; then
    echo "run.sh: '$l' is not a CPU list (e.g. 0 or 0-1 or 0,2)" >&2
    exit 2
  fi
done

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
eval "$(scripts/tp-mariadb start "$dbdir" --binlog "$binlog")"
pin=()
if [ -n "$db_cpus" ]; then
  # Every thread of mariadbd, and what it starts later, on db_cpus; the bench and what
  # it starts (taskpushd) on bench_cpus. The settings line names both.
  taskset -a -p -c "$db_cpus" "$(cat "$dbdir/mysqld.pid")" >/dev/null
  pin=(taskset -c "$bench_cpus")
fi

mkdir -p bench/results
out=bench/results/$(date -u +%Y-%m-%d-%H%M)-$(hostname -s)
status=0
if [ -n "$modes" ]; then
  # One bench per mode, each on the same server; the connections mode needs a raised
  # descriptor limit, which the bench sets itself from the hard limit.
  out=$out-modes
  : >"$out.log"
  for m in $modes; do
    "${pin[@]}" "$build/bench/taskpush-bench" --mode "$m" "$@" >>"$out.log" || status=1
  done
  set -- --modes "$@"
else
  "${pin[@]}" "$build/bench/taskpush-bench" "$@" >"$out.log" || status=$?
fi
if [ -n "$db_cpus" ]; then
  set -- --db-cpus "$db_cpus" --bench-cpus "$bench_cpus" "$@"
fi
if [ "$binlog" != none ]; then
  set -- --binlog "$binlog" "$@"
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
# The plot: the drain's tasks/s against K, mixed's results beside the drain, the soak's
# samples over time (bench/plot.py); the other modes print tables only.
if ! grep -qE '"mode":"(drain|mixed|soak)"' "$out.jsonl"; then
  echo "run.sh: wrote $out.jsonl and $out.md (no plot for these modes)"
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
