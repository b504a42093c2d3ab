#!/usr/bin/env bash
# graphile.sh: taskpush beside graphile-worker, the SQL-backed job queue a team would
# pick instead (PostgreSQL, LISTEN/NOTIFY, SKIP LOCKED), draining the same preloaded
# no-op workload in one run on this machine. Both databases are private servers on
# loopback with their default durability (scripts/tp-mariadb, scripts/tp-postgres), and
# only one of them works at a time: the rounds alternate (taskpush, graphile-worker, ...)
# so that a disturbance of the machine hits both.
#
#   bench/graphile.sh [--rounds R] [--n N] [--k K] [--procs P] [--concurrency C]
#       default: 3 rounds, N=100000; taskpush-ll with K=64 workers; graphile-worker as
#       P=2 processes of C=24 concurrent jobs (its best of 1, 2 and 4 here) with its local queue (500) and batched
#       completion (bench/graphile/drain.mjs says how it is measured and verified)
#   bench/graphile.sh --mixed S    then the mixed workload, S seconds each (default 10; 0: none)
#   bench/graphile.sh --quick      one round of N=20000, no mixed (what the test command runs)
#
# Prints the JSON lines and a table of medians, and writes bench/results/DATE-graphile.md.
# Exit status: 1 when a run failed its exactly-once verification, 2 when a server or
# the peer could not be set up.
set -euo pipefail

rounds=3
n=100000
k=64
procs=2
concurrency=24
results=1
settle_s=10
mixed_s=10
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:-}; shift 2 ;;
    --n) n=${2:-}; shift 2 ;;
    --k) k=${2:-}; shift 2 ;;
    --procs) procs=${2:-}; shift 2 ;;
    --concurrency) concurrency=${2:-}; shift 2 ;;
    --settle) settle_s=${2:-}; shift 2 ;;
    --mixed) mixed_s=${2:-}; shift 2 ;;
    --quick) rounds=1; n=20000; results=0; settle_s=1; mixed_s=0; shift ;;
    *) echo "usage: $0 [--rounds R] [--n N] [--k K] [--procs P] [--concurrency C] [--settle S] [--mixed S] [--quick]" >&2; exit 2 ;;
  esac
done
case "$settle_s$mixed_s" in ''|*[!0-9]*) echo "$0: --settle and --mixed take seconds" >&2; exit 2 ;; esac
for v in "$rounds" "$n" "$k" "$procs" "$concurrency"; do
  case "$v" in ''|*[!0-9]*|0) echo "$0: --rounds, --n, --k, --procs and --concurrency take positive numbers" >&2; exit 2 ;; esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
build=${TASKPUSH_BUILD_DIR:-$root/build}
cd "$root"
scripts/install-deps.sh --peer
[ -f "$build/build.ninja" ] || meson setup "$build" >/dev/null
ninja -C "$build" -j2 dispatcher/taskpushd bench/taskpush-bench >/dev/null
bench=$build/bench/taskpush-bench

# graphile-worker and its dependencies, at the versions of package-lock.json, from npm's
# registry into the build directory (nothing is installed in the tree or system-wide).
peer=$build/graphile-peer
if ! cmp -s bench/graphile/package-lock.json "$peer/package-lock.json" || [ ! -d "$peer/node_modules" ]; then
  rm -rf "$peer"
  mkdir -p "$peer"
  cp bench/graphile/package.json bench/graphile/package-lock.json "$peer/"
  (cd "$peer" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    { echo "$0: npm ci of graphile-worker failed" >&2; exit 2; }
fi
cp bench/graphile/drain.mjs "$peer/"

tmp=$(mktemp -d /tmp/tp-graphile-bench.XXXXXX)
chmod 755 "$tmp" # PostgreSQL runs as nobody when this runs as root
cleanup() {
  scripts/tp-postgres stop "$tmp/pg" >/dev/null 2>&1 || true
  scripts/tp-mariadb stop "$tmp/my" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

scripts/tp-mariadb start "$tmp/my" >"$tmp/my.env" 2>"$tmp/my.log" ||
  { echo "$0: MariaDB did not start:" >&2; cat "$tmp/my.log" >&2; exit 2; }
scripts/tp-postgres start "$tmp/pg" >"$tmp/pg.env" 2>"$tmp/pg.log" ||
  { echo "$0: PostgreSQL did not start:" >&2; cat "$tmp/pg.log" >&2; exit 2; }
my_url=$(. "$tmp/my.env"
         echo "mysql://$TASKPUSH_TEST_MYSQL_USER@$TASKPUSH_TEST_MYSQL_HOST:$TASKPUSH_TEST_MYSQL_PORT/taskpush_bench")
pg_url=$(. "$tmp/pg.env"; echo "$TASKPUSH_PG_URL")

# Each drain leaves its server work to do (InnoDB's purge and page flushing, PostgreSQL's
# autovacuum of the deleted jobs) that would land on the other's run: a pause between.
settle() { sleep "$settle_s"; }

out="$tmp/runs.jsonl"
: >"$out"
failed=0
for r in $(seq 1 "$rounds"); do
  echo "== round $r: taskpush" >&2
  "$bench" --db "$my_url" --design taskpush-ll --k "$k" --n "$n" --repeat 1 --json-only |
    grep '^{' | tee -a "$out" || failed=1
  settle
  echo "== round $r: graphile-worker" >&2
  (cd "$peer" && node drain.mjs --url "$pg_url" --jobs "$n" --procs "$procs" \
    --concurrency "$concurrency") | tee -a "$out" || failed=1
  [ "$r" -lt "$rounds" ] && settle
done
# The mixed workload, once each: 1 KB payloads, producers inserting while the workers run
# (taskpush-bench --mode mixed: 2 producers of each of its four kinds; the peer: 4 adding
# one job a call and 4 adding 100, its one way in being SQL).
if [ "$mixed_s" -gt 0 ]; then
  settle
  echo "== mixed: taskpush" >&2
  "$bench" --db "$my_url" --mode mixed --k "$k" --payload-bytes 1024 --seconds "$mixed_s" \
    --producers 2 --submit-producers 0 --json-only | grep '"case":"mixed"' | tee -a "$out" || failed=1
  settle
  echo "== mixed: graphile-worker" >&2
  (cd "$peer" && node drain.mjs --url "$pg_url" --mixed --seconds "$mixed_s" --payload-bytes 1024 \
    --producers-per-kind 2 --procs "$procs" --concurrency "$concurrency") | tee -a "$out" || failed=1
fi

stamp=$(date -u +%Y-%m-%d-%H%M)
report=/dev/null
if [ "$results" = 1 ]; then
  mkdir -p bench/results
  report=bench/results/$stamp-graphile.md
fi
python3 - "$out" "$report" "$rounds" "$n" "$k" "$procs" "$concurrency" <<'EOF' || failed=1
import json, statistics, sys
path, report, rounds, n, k, procs, conc = sys.argv[1:]
lines_in = [json.loads(l) for l in open(path) if l.startswith("{")]
runs = [r for r in lines_in if r.get("kind") == "run" and r.get("mode", "drain") == "drain"]
mixed = [r for r in lines_in if r.get("case") == "mixed" or r.get("mode") == "mixed"]
by = {}
for r in runs:
    by.setdefault(r["design"], []).append(r)
lines = ["# taskpush beside graphile-worker, no-op drain", "",
         "`bench/graphile.sh --rounds %s --n %s --k %s --procs %s --concurrency %s`: the rounds"
         " alternate on one machine (2 cores shared by the database, the dispatcher or the"
         " peer's processes, and the workers); each drains %s preloaded no-op tasks, verified"
         " exactly once." % (rounds, n, k, procs, conc, n), "",
         "| design | database | workers | runs | tasks/s (median) | each run | commits or statements per task (median) | verified |",
         "|---|---|---|---|---|---|---|---|"]
med = {}
ok = True
for design, label, db, per in (("taskpush-ll", "taskpush", "MariaDB", "statements_per_task"),
                               ("graphile-worker", "graphile-worker 0.17.3", "PostgreSQL", "commits_per_task")):
    rs = by.get(design, [])
    if not rs:
        ok = False
        continue
    rates = [float(r["tasks_per_s"]) for r in rs]
    med[design] = statistics.median(rates)
    verified = all(r.get("verified", True) and int(r.get("done", 0)) == int(n) for r in rs)
    ok = ok and verified and len(rs) == int(rounds)
    workers = k if design == "taskpush-ll" else "%s x %s" % (procs, conc)
    lines.append("| %s | %s | %s | %d | %.0f | %s | %.4f %s | %s |" % (
        label, db, workers, len(rs), med[design], ", ".join("%.0f" % x for x in rates),
        statistics.median(float(r[per]) for r in rs), per.split("_")[0],
        "yes" if verified else "NO"))
if len(med) == 2 and med["graphile-worker"] > 0:
    lines += ["", "taskpush / graphile-worker: %.2f (target >= 1.3)" %
              (med["taskpush-ll"] / med["graphile-worker"])]
if mixed:
    lines += ["", "## Mixed: 1 KB payloads, producers inserting while the workers run", "",
              "| design | producers | inserted/s | completed/s in the window | enqueue to start p50 / p99 ms | verified |",
              "|---|---|---|---|---|---|"]
    for r in mixed:
        if r.get("design") == "graphile-worker":
            label, prod = "graphile-worker 0.17.3", "4 add_job, 4 add_jobs of 100"
            inserted = float(r["n"]) / float(r["seconds_window"])
        else:
            label, prod = "taskpush", "2 each: SQL 1 and 100 rows, SUBMIT 1 and 100 tasks"
            inserted = float(r["inserted_per_s"])
        verified = bool(r.get("verified"))
        ok = ok and verified
        lines.append("| %s | %s | %.0f | %.0f | %.1f / %.1f | %s |" % (
            label, prod, inserted, float(r["tasks_per_s"]), float(r["start_p50_ms"]),
            float(r["start_p99_ms"]), "yes" if verified else "NO"))
text = "\n".join(lines) + "\n"
if report != "/dev/null":
    open(report, "w").write(text)
print(text)
sys.exit(0 if ok else 1)
EOF
[ "$results" = 1 ] && echo "written: $report"
exit "$failed"
