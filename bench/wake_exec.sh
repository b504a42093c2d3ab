#!/usr/bin/env bash
# wake_exec.sh: rows inserted by SQL to a `taskpush-worker --exec` handler's start, with
# taskpushd following the binary log (--wake binlog) and polling alone (--poll-ms 100
# and 10); issue 34's targets for the doorbell: p50 <= 10 ms, p99 <= 30 ms.
#
#   bench/wake_exec.sh [ROWS]        (default 300 rows per run; about 1 minute in all)
#
# A private MariaDB with --log-bin --binlog-format=ROW (scripts/tp-mariadb --binlog ROW).
# Per run: taskpushd, one taskpush-worker --exec 'date +%s%3N' of concurrency 4 (the
# handler prints its start, in ms, which becomes the row's result), then ROWS single-row
# autocommit INSERTs from one mariadb client session at random gaps of 5-60 ms
# (DO SLEEP between them). The latency of a row is result - insert_time (both ms, one
# machine's clock): the INSERT's own time to the moment the handler's process ran.
# Idle cost: the server's Questions over 5 s with nothing to do, per second (the
# measuring statement subtracted). Writes bench/results/DATE-HOST-wake-exec.md.
set -euo pipefail

rows=${1:-300}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TASKPUSH_BUILD_DIR:-$root/build}
cd "$root"
ninja -C "$build" -j2 dispatcher/taskpushd worker-client/taskpush-worker >/dev/null

dir=$(mktemp -d "${TMPDIR:-/tmp}/tpwake.XXXXXX")
daemon_pid=""
worker_pid=""
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null || true
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null || true
  scripts/tp-mariadb stop "$dir/db" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
eval "$(scripts/tp-mariadb start "$dir/db" --database taskpush --binlog ROW)"
sql() {
  mariadb --no-defaults --protocol=socket --socket="$TASKPUSH_TEST_MYSQL_SOCKET" -uroot taskpush \
    --batch --skip-column-names -e "$1"
}
questions() { sql "SHOW GLOBAL STATUS LIKE 'Questions'" | awk '{print $2}'; }

mkdir -p bench/results
out=bench/results/$(date -u +%Y-%m-%d-%H%M)-$(hostname -s)-wake-exec.md
{
  echo "# bench/wake_exec.sh, $(date -u +%Y-%m-%d) on $(hostname -s)"
  echo
  echo "Command: \`bench/wake_exec.sh $rows\`; MariaDB $(sql 'SELECT VERSION()'), binlog_format $(sql 'SELECT @@binlog_format')."
  echo "Rows inserted one per autocommit INSERT at random gaps of 5-60 ms; latency = the handler's"
  echo "start (\`date +%s%3N\` in \`taskpush-worker --exec\`) - the row's insert_time."
  echo
  echo "| --wake | --poll-ms | rows | p50 ms | p99 ms | p99.9 ms | max ms | idle statements/s | /stats wake |"
  echo "|---|---|---|---|---|---|---|---|---|"
} >"$out"

for run in "binlog 5000" "poll 100" "poll 10"; do
  read -r wake poll <<<"$run"
  sql "DELETE FROM task"
  rm -f "$dir/ready"
  "$build/dispatcher/taskpushd" --db "$TASKPUSH_DB" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
    --ready-file "$dir/ready" --wake "$wake" --poll-ms "$poll" 2>"$dir/taskpushd-$wake-$poll.log" &
  daemon_pid=$!
  for _ in $(seq 100); do [ -s "$dir/ready" ] && break; sleep 0.1; done
  listen=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"])' "$dir/ready")
  admin=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$dir/ready")
  "$build/worker-client/taskpush-worker" --connect "$listen" --type lat --concurrency 4 \
    --exec 'date +%s%3N' 2>"$dir/worker.log" &
  worker_pid=$!
  mode=""
  for _ in $(seq 100); do
    mode=$(curl -s "http://$admin/stats" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["wake"]["mode"] if s.get("leader") and s.get("workers") else "")' 2>/dev/null || true)
    if [ -n "$mode" ] && { [ "$wake" = poll ] || [ "$mode" = binlog ]; }; then break; fi
    sleep 0.1
  done
  sleep 1
  q0=$(questions)
  sleep 5
  q1=$(questions)
  idle=$(python3 -c "print(f'{($q1 - $q0 - 1) / 5:.1f}')")
  python3 - "$rows" >"$dir/insert.sql" <<'EOF'
import random, sys
random.seed(34)
for i in range(int(sys.argv[1])):
    print("INSERT INTO task (task_type, payload) VALUES ('lat', 'x');")
    print(f"DO SLEEP({random.randint(5, 60) / 1000:.3f});")
EOF
  mariadb --no-defaults --protocol=socket --socket="$TASKPUSH_TEST_MYSQL_SOCKET" -uroot taskpush <"$dir/insert.sql"
  for _ in $(seq 300); do
    [ "$(sql "SELECT COUNT(*) FROM task WHERE task_state <> 2")" = 0 ] && break
    sleep 0.1
  done
  sql "SELECT CAST(result AS SIGNED) - insert_time FROM task WHERE task_state = 2" >"$dir/lat.txt"
  reason=$(curl -s "http://$admin/stats" | python3 -c 'import json,sys; w=json.load(sys.stdin)["wake"]; print(w["mode"] + ": " + w["reason"])')
  python3 - "$dir/lat.txt" "$wake" "$poll" "$idle" "$reason" >>"$out" <<'EOF'
import sys
v = sorted(int(l) for l in open(sys.argv[1]) if l.strip())
pct = lambda p: v[min(len(v) - 1, int(len(v) * p / 100))]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {len(v)} | {pct(50)} | {pct(99)} | {pct(99.9)} | {v[-1]} | {sys.argv[4]} | {sys.argv[5]} |")
EOF
  kill "$worker_pid"; wait "$worker_pid" 2>/dev/null || true; worker_pid=""
  kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null || true; daemon_pid=""
done
cat "$out"
echo "wake_exec.sh: wrote $out"
