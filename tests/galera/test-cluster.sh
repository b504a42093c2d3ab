#!/usr/bin/env bash
# test-cluster: taskpushd on a private three-node Galera cluster (scripts/tp-galera):
# the cluster forms, taskpushd --migrate makes the schema through node 1, taskpushd leads
# on node 1 and drains tasks INSERTed on node 2 to a taskpush-worker, every row is
# SUCCESSFUL as node 3 reads it (wsrep_sync_wait), and node 3 killed with -9 and started
# again rejoins (IST) with every row. TAP output.
# Usage: test-cluster.sh SOURCE_ROOT TASKPUSHD TASKPUSH_WORKER
set -u
root=${1:?usage: test-cluster.sh SOURCE_ROOT TASKPUSHD TASKPUSH_WORKER}
taskpushd=${2:?}
worker=${3:?}
tasks=500
work=$(mktemp -d /tmp/tp-galera-test.XXXXXX)
chmod 755 "$work" # the nodes run as nobody when the test runs as root
cluster="$work/c"
pids=()
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $*"; }
check() { # check DESCRIPTION COMMAND...
  local d=$1; shift
  if "$@"; then ok "$d"; else not_ok "$d"; fi
}
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  "$root/scripts/tp-galera" stop "$cluster" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

if ! out=$("$root/scripts/tp-galera" start "$cluster" 2>"$work/start.log"); then
  tail -n 30 "$work/start.log" | sed 's/^/# /'
  echo "1..1"
  echo "not ok 1 - the cluster started"
  exit 1
fi
eval "$out"
IFS=, read -r -a nodes <<<"$TASKPUSH_TEST_GALERA_NODES"
sql() { # sql NODE STATEMENTS: as the test user, on node NODE (1-based), over TCP
  local hp=${nodes[$(($1 - 1))]}
  mariadb --no-defaults -h "${hp%:*}" -P "${hp#*:}" -u "$TASKPUSH_TEST_GALERA_USER" -N -B -e "$2"
}
db="mysql://$TASKPUSH_TEST_GALERA_USER@${nodes[0]}/tp"

check "three nodes in the primary component" \
  test "$(sql 1 "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)" = 3
sql 1 "CREATE DATABASE tp"
check "taskpushd --migrate makes the schema through node 1" \
  "$taskpushd" --db "$db" --migrate
check "the schema is on node 3" \
  test "$(sql 3 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'tp' AND TABLE_NAME = 'task'")" = 1

"$taskpushd" --db "$db" --listen 127.0.0.1:0 --admin 127.0.0.1:0 --poll-ms 20 \
  --ready-file "$work/ready.json" 2>"$work/taskpushd.log" &
pids+=($!)
for _ in $(seq 1 300); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
listen=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"])' "$work/ready.json" 2>/dev/null)
check "taskpushd is up on node 1" test -n "$listen"
"$worker" --connect "$listen" --type t --exec 'cat >/dev/null' --concurrency 8 2>"$work/worker.log" &
pids+=($!)

# The tasks come from node 2, as a producer on another node would insert them.
values=$(python3 -c "print(','.join(\"('t','p')\" for _ in range($tasks)))")
sql 2 "INSERT INTO tp.task (task_type, payload) VALUES $values"
done_rows=0
for _ in $(seq 1 600); do
  done_rows=$(sql 3 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task WHERE task_state = 2")
  [ "$done_rows" = "$tasks" ] && break
  sleep 0.1
done
check "all $tasks tasks SUCCESSFUL as node 3 reads them (got $done_rows)" test "$done_rows" = "$tasks"

"$root/scripts/tp-galera" node "$cluster" 3 kill
sql 1 "INSERT INTO tp.task (task_type, payload) VALUES ('t', 'after')"
check "node 3 killed with -9 starts again and rejoins" \
  "$root/scripts/tp-galera" node "$cluster" 3 start 2>>"$work/start.log"
check "node 3 has every row after the rejoin" \
  test "$(sql 3 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task")" = $((tasks + 1))
check "node 3 caught up by IST, not a full copy" grep -q "IST received" "$cluster/node3/mysqld.err"
if [ $fails -gt 0 ]; then
  tail -n 20 "$work/taskpushd.log" | sed 's/^/# taskpushd: /'
fi
echo "1..$n"
[ $fails -eq 0 ]
