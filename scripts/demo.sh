#!/usr/bin/env bash
# The main job, from a fresh clone: installs what is missing, builds, starts a
# private throwaway MariaDB, inserts demo tasks as a producer would (plain SQL),
# starts taskpushd and a few taskpush-worker processes, shows live progress
# from the admin port while they drain the table, then prints a summary.
# Everything it started is stopped at exit.
#
#   scripts/demo.sh [--tasks N] [--workers N]     (defaults 3000 and 3)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tasks=3000
workers=3
while [ $# -gt 0 ]; do
  case "$1" in
    --tasks) tasks=${2:?--tasks needs a number}; shift 2 ;;
    --workers) workers=${2:?--workers needs a number}; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
for n in "$tasks" "$workers"; do
  case "$n" in ''|*[!0-9]*|0) echo "demo.sh: --tasks and --workers need a whole number > 0" >&2; exit 2 ;; esac
done

scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null

work=$(mktemp -d /tmp/taskpush-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  scripts/tp-mariadb stop "$work/mariadb" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

eval "$(scripts/tp-mariadb start "$work/mariadb" --database taskpush)"
sql() { mariadb --no-defaults -S "$TASKPUSH_TEST_MYSQL_SOCKET" -u "$TASKPUSH_TEST_MYSQL_USER" taskpush "$@"; }
echo "MariaDB ready at $TASKPUSH_DB"

# A producer needs nothing but SQL. Every 50th task fails once on purpose
# (the worker's command exits 1 on its first attempt), to show retries.
python3 - "$tasks" <<'PY' | sql
import sys
n = int(sys.argv[1]); types = ["resize", "email", "report"]
for start in range(0, n, 500):
    rows = [f"('{types[i % 3]}', {i % 3}, 'task {i}{' flaky' if i % 50 == 0 else ''}')"
            for i in range(start, min(n, start + 500))]
    print("INSERT INTO task (task_type, task_priority, payload) VALUES " + ",".join(rows) + ";")
PY
echo "inserted $tasks tasks (3 types, 3 priorities)"

build/dispatcher/taskpushd --db "$TASKPUSH_DB" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
  --ready-file "$work/ready.json" --retry-backoff-ms 200 --log-level warn 2>"$work/taskpushd.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
read -r listen admin < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["listen"], r["admin"])' "$work/ready.json")
echo "taskpushd: workers connect to $listen, admin on http://$admin/stats"

# The command a worker runs per task: upper-cases the payload; a "flaky" task
# fails its first attempt.
cmd='p=$(cat); case "$p" in *flaky*) [ "$TASKPUSH_ATTEMPT" -gt 1 ] || { echo "flaky: first attempt fails" >&2; exit 1; } ;; esac; printf "%s" "$p" | tr a-z A-Z'
for i in $(seq "$workers"); do
  build/worker-client/taskpush-worker --connect "$listen" --type resize,email,report \
    --concurrency 4 --name "demo-worker-$i" --log-level warn --exec "$cmd" 2>>"$work/workers.log" &
  pids+=($!)
done

python3 - "$admin" "$tasks" <<'PY'
import json, sys, time, urllib.request
admin, total = sys.argv[1], int(sys.argv[2])
start = time.time(); last = None; history = []
while True:
    s = json.load(urllib.request.urlopen(f"http://{admin}/stats", timeout=5))
    t = s["tasks"]; done = t["succeeded_total"] + t["failed_total"]
    now = time.time(); history = [(w, d) for w, d in history if now - w <= 1.0] + [(now, done)]
    rate = (done - history[0][1]) / max(now - history[0][0], 1e-3)
    line = (f"\r{done:>7}/{total} done  {t['succeeded_total']:>7} ok  {t['failed_total']:>4} failed  "
            f"{t['retried_total']:>4} retried  {s['queue']['in_flight']:>3} in flight  "
            f"{s['workers']} workers  {rate:8.0f} tasks/s")
    if line != last:
        sys.stdout.write(line); sys.stdout.flush(); last = line
    # done counts outcomes as workers report them; the table has them once
    # the dispatcher's batched writes are flushed (db.pending_writes == 0).
    if (done >= total and s["db"]["pending_writes"] == 0) or now - start > 300:
        print(); break
    time.sleep(0.2)
PY

echo "summary (from the table):"
sql -t -e "SELECT task_type, CASE task_state WHEN 0 THEN 'NEW' WHEN 1 THEN 'PROCESSING'
             WHEN 2 THEN 'SUCCESSFUL' ELSE 'FAILED' END AS state,
           COUNT(*) AS tasks, SUM(attempts) AS attempts
           FROM task GROUP BY task_type, task_state ORDER BY task_type, task_state"
sql -t -e "SELECT task_id, task_type, attempts, result FROM task WHERE payload LIKE '%flaky%' ORDER BY task_id LIMIT 3"
python3 - "$admin" <<'PY'
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/stats", timeout=5))
done = s["tasks"]["succeeded_total"] + s["tasks"]["failed_total"]
print(f"taskpushd issued {s['db']['statements_total']} SQL statements for {done} tasks "
      f"({s['db']['claims_total']} claims, {s['db']['write_batches_total']} result batches); "
      "no worker ever touched the database.")
PY
