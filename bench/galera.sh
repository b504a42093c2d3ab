#!/usr/bin/env bash
# galera.sh: the drain rate of taskpush on a three-node Galera cluster beside one
# MariaDB server, in one run on this machine (docs/replication.md, "What it costs").
# Both are private servers on loopback (scripts/tp-galera, scripts/tp-mariadb) with the
# same settings; taskpushd runs on node 1 of the cluster, so every claim and every
# result batch is certified by all three nodes before it commits. The rounds alternate
# (cluster, one server, cluster, ...) so that a disturbance of the machine hits both.
#
#   bench/galera.sh [--rounds R] [--n N] [--k K]    (default 3 rounds, N=100000, K=64)
#
# Prints taskpush-bench's JSON lines and a table of medians, and writes
# bench/results/DATE-galera.md. Exit status: taskpush-bench's (1: a run failed its
# exactly-once verification), 2 when a server did not start.
set -euo pipefail

rounds=3
n=100000
k=64
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --k) k=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds R] [--n N] [--k K]" >&2; exit 2 ;;
  esac
done
for v in "$rounds" "$n" "$k"; do
  case "$v" in ''|*[!0-9]*) echo "$0: --rounds, --n and --k take numbers" >&2; exit 2 ;; esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -d build ] || meson setup build >/dev/null
ninja -C build -j2 dispatcher/taskpushd bench/taskpush-bench >/dev/null
bench=$root/build/bench/taskpush-bench

tmp=$(mktemp -d /tmp/tp-galera-bench.XXXXXX)
chmod 755 "$tmp" # the nodes run as nobody when this runs as root
cleanup() {
  scripts/tp-galera stop "$tmp/c" >/dev/null 2>&1 || true
  scripts/tp-mariadb stop "$tmp/one" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

scripts/tp-galera start "$tmp/c" >"$tmp/galera.env" 2>"$tmp/galera.log" ||
  { echo "$0: the cluster did not start:" >&2; tail -n 20 "$tmp/galera.log" >&2; exit 2; }
scripts/tp-mariadb start "$tmp/one" >"$tmp/one.env" 2>"$tmp/one.log" ||
  { echo "$0: the server did not start:" >&2; cat "$tmp/one.log" >&2; exit 2; }
galera_url=$(. "$tmp/galera.env"; IFS=, read -r -a nodes <<<"$TASKPUSH_TEST_GALERA_NODES"
             echo "mysql://$TASKPUSH_TEST_GALERA_USER@${nodes[0]}/taskpush_bench")
one_url=$(. "$tmp/one.env"
          echo "mysql://$TASKPUSH_TEST_MYSQL_USER@$TASKPUSH_TEST_MYSQL_HOST:$TASKPUSH_TEST_MYSQL_PORT/taskpush_bench")

out="$tmp/runs.jsonl"
: >"$out"
for r in $(seq 1 "$rounds"); do
  for setup in galera one; do
    url=$galera_url
    [ "$setup" = one ] && url=$one_url
    echo "== round $r: $setup" >&2
    "$bench" --db "$url" --design taskpush-ll --k "$k" --n "$n" --repeat 1 --json-only |
      sed "s/^{/{\"setup\": \"$setup\", /" | tee -a "$out"
  done
done

stamp=$(date -u +%Y-%m-%d-%H%M)
mkdir -p bench/results
report=bench/results/$stamp-galera.md
python3 - "$out" "$report" "$rounds" "$n" "$k" <<'EOF'
import json, statistics, sys
path, report, rounds, n, k = sys.argv[1:]
runs = [r for r in (json.loads(l) for l in open(path) if l.startswith("{")) if r.get("kind") == "run"]
def rate(r):
    return float(r["tasks_per_s"])
by = {}
for r in runs:
    by.setdefault(r["setup"], []).append(r)
lines = ["# taskpush on a three-node Galera cluster beside one server", "",
         "`bench/galera.sh --rounds %s --n %s --k %s`: taskpush-ll, no-op workers, the rounds"
         " alternating on one machine (2 cores shared by every node, taskpushd and the"
         " workers)." % (rounds, n, k), "",
         "| setup | runs | tasks/s (median) | each run | statements/task (median) |",
         "|---|---|---|---|---|"]
med = {}
for setup in ("galera", "one"):
    rs = by.get(setup, [])
    if not rs:
        continue
    rates = [rate(r) for r in rs]
    med[setup] = statistics.median(rates)
    spt = [float(r["statements_per_task"]) for r in rs if "statements_per_task" in r]
    lines.append("| %s | %d | %.0f | %s | %s |" % (
        "3-node Galera" if setup == "galera" else "one server", len(rs), med[setup],
        ", ".join("%.0f" % x for x in rates),
        "%.4f" % statistics.median(spt) if spt else "-"))
if "galera" in med and "one" in med and med["one"] > 0:
    lines += ["", "Galera / one server: %.2f" % (med["galera"] / med["one"])]
text = "\n".join(lines) + "\n"
open(report, "w").write(text)
print(text)
EOF
echo "written: $report"
