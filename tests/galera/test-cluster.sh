#!/usr/bin/env bash
# test-cluster: taskpushd on a private three-node Galera cluster (scripts/tp-galera):
# the cluster forms, taskpushd --migrate makes the schema through node 1, taskpushd given
# the three nodes leads on node 1 and drains tasks INSERTed on node 2 to a
# taskpush-worker, every row is SUCCESSFUL as node 3 reads it (wsrep_sync_wait); node 1
# killed with -9 mid-drain: taskpushd moves to node 2 and every task still ends
# SUCCESSFUL, each executed (the worker's records), the ones run twice printed; node 3
# killed with -9 and started again rejoins (IST) with every row; certification conflicts
# with a producer on node 3 retried (db.cert_retries_total), no task run twice; the lease
# row taken on node 3 behind taskpushd's back: no claim on node 2 after it. The nodes
# write a ROW binary log with log_slave_updates (tp-galera --binlog): taskpushd (--wake
# auto) follows node 1's and is woken by the rows inserted on node 2, then node 2's after
# the move. TAP output.
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

if ! out=$("$root/scripts/tp-galera" start "$cluster" --binlog 2>"$work/start.log"); then
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
db_all="mysql://$TASKPUSH_TEST_GALERA_USER@$TASKPUSH_TEST_GALERA_NODES/tp"
records="$work/executed.txt"
: >"$records"

check "three nodes in the primary component" \
  test "$(sql 1 "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)" = 3
sql 1 "CREATE DATABASE tp"
check "taskpushd --migrate makes the schema through node 1" \
  "$taskpushd" --db "$db" --migrate
check "the schema is on node 3" \
  test "$(sql 3 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'tp' AND TABLE_NAME = 'task'")" = 1

"$taskpushd" --db "$db_all" --listen 127.0.0.1:0 --admin 127.0.0.1:0 --poll-ms 20 \
  --ready-file "$work/ready.json" 2>"$work/taskpushd.log" &
pids+=($!)
for _ in $(seq 1 300); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
ready() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$work/ready.json" "$1" 2>/dev/null; }
listen=$(ready listen)
admin=$(ready admin)
stat() { # stat KEY: db.KEY of /stats
  python3 -c 'import json,sys,urllib.request
print(json.load(urllib.request.urlopen("http://%s/stats" % sys.argv[1], timeout=5))["db"].get(sys.argv[2]))' "$admin" "$1" 2>/dev/null
}
wake() { # wake KEY: wake.KEY of /stats
  python3 -c 'import json,sys,urllib.request
print(json.load(urllib.request.urlopen("http://%s/stats" % sys.argv[1], timeout=5))["wake"].get(sys.argv[2]))' "$admin" "$1" 2>/dev/null
}
wait_wake_binlog() { # until /stats wake.mode is binlog (at most 30 s)
  for _ in $(seq 1 300); do [ "$(wake mode)" = binlog ] && return 0; sleep 0.1; done
  echo "# wake: $(wake mode): $(wake reason)"
  return 1
}
check "taskpushd is up on node 1" test -n "$listen"
"$worker" --connect "$listen" --type t --exec "cat >/dev/null; echo \$TASKPUSH_TASK_ID >>$records" --concurrency 8 2>"$work/worker.log" &
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

check "taskpushd uses node 1 (/stats db.node_port)" test "$(stat node_port)" = "${nodes[0]#*:}"
check "taskpushd follows node 1's binary log (/stats wake.mode binlog)" wait_wake_binlog
echo "# wake: $(wake reason); $(wake wakes_total) wakes"
check "the rows inserted on node 2 woke it through node 1's log (wake.wakes_total >= 1)" \
  test "$(wake wakes_total)" -ge 1

# Node 1, the one taskpushd uses, killed with -9 while it drains a backlog.
more=3000
values=$(python3 -c "print(','.join(\"('t','p')\" for _ in range($more)))")
sql 2 "INSERT INTO tp.task (task_type, payload) VALUES $values"
for _ in $(seq 1 600); do
  [ "$(wc -l <"$records")" -ge $((tasks + 300)) ] && break
  sleep 0.05
done
"$root/scripts/tp-galera" node "$cluster" 1 kill
t0=$(date +%s%N)
total=$((tasks + more))
done_rows=0
for _ in $(seq 1 1200); do
  done_rows=$(sql 2 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task WHERE task_state = 2")
  [ "$done_rows" = "$total" ] && break
  sleep 0.1
done
echo "# all SUCCESSFUL $(( ($(date +%s%N) - t0) / 1000000 )) ms after the kill of node 1"
check "after the kill -9 of node 1 all $total tasks SUCCESSFUL (got $done_rows)" test "$done_rows" = "$total"
check "taskpushd moved to node 2 (/stats db.node_port, node_moves_total)" \
  test "$(stat node_port)" = "${nodes[1]#*:}" -a "$(stat node_moves_total)" -ge 1
check "after the move it follows node 2's binary log (/stats wake.mode binlog)" wait_wake_binlog
echo "# wake: $(wake reason)"
executed=$(sort -u "$records" | wc -l)
twice=$(( $(wc -l <"$records") - executed ))
echo "# $executed distinct tasks executed, $twice executions were repeats"
check "every task was executed" test "$executed" = "$total"
check "repeats no more than a worker's slots and a result batch (<= 200)" test "$twice" -le 200
grep -E "moving to|took the table|leading the table" "$work/taskpushd.log" | sed 's/^/# taskpushd: /' | head -n 10

# Node 1 back (two nodes of three left: one more death would cost the quorum).
check "node 1 killed with -9 starts again and rejoins" \
  "$root/scripts/tp-galera" node "$cluster" 1 start 2>>"$work/start.log"

"$root/scripts/tp-galera" node "$cluster" 3 kill
sql 2 "INSERT INTO tp.task (task_type, payload) VALUES ('t', 'after')"
check "node 3 killed with -9 starts again and rejoins" \
  "$root/scripts/tp-galera" node "$cluster" 3 start 2>>"$work/start.log"
check "node 3 has every row after the rejoin" \
  test "$(sql 3 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task")" = $((total + 1))
check "node 3 caught up by IST, not a full copy" grep -q "IST received" "$cluster/node3/mysqld.err"
# Certification conflicts: a producer on node 3 keeps updating the oldest NEW and
# PROCESSING rows (their payload, a new value each time: an UPDATE that changes nothing
# is not certified) while taskpushd, on node 2, claims them and writes their results; a
# transaction that loses fails with 1213 and taskpushd runs it again on the same
# connection (db.cert_retries_total). A claim's tasks reach the worker only after its
# COMMIT, so no task of the burst runs twice.
status_sum() { # status_sum NODE: certification failures and brute-force aborts so far
  sql "$1" "SHOW STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')" |
    awk '{s += $2} END {print s + 0}'
}
conflicts0=$(( $(status_sum 2) + $(status_sum 3) ))
retries0=$(stat cert_retries_total)
reconnects0=$(stat reconnects_total)
: >"$records"
# Bursts of 1,000 rows, each drained, until taskpushd lost a conflict (at most 3).
burst=1000
inserted=0
t0=$(date +%s%N)
for round in 1 2 3; do
  values=$(python3 -c "print(','.join(\"('t','p')\" for _ in range($burst)))")
  sql 3 "INSERT INTO tp.task (task_type, payload) VALUES $values"
  inserted=$((inserted + burst))
  for i in $(seq 1 300); do
    sql 3 "UPDATE tp.task SET payload = 'q$round.$i' WHERE task_state IN (0, 1) ORDER BY task_id LIMIT 20" 2>/dev/null || true
    [ "$(wc -l <"$records")" -ge "$inserted" ] && break
  done
  for _ in $(seq 1 1200); do
    done_rows=$(sql 2 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task WHERE task_state = 2")
    [ "$done_rows" = "$((total + 1 + inserted))" ] && break
    sleep 0.1
  done
  [ $(( $(stat cert_retries_total) - retries0 )) -ge 1 ] && break
done
burst=$inserted
total=$((total + 1 + burst))
conflicts=$(( $(status_sum 2) + $(status_sum 3) - conflicts0 ))
retries=$(( $(stat cert_retries_total) - retries0 ))
reconnects=$(( $(stat reconnects_total) - reconnects0 ))
executed=$(sort -u "$records" | wc -l)
twice=$(( $(wc -l <"$records") - executed ))
echo "# $round burst(s), $burst rows drained in $(( ($(date +%s%N) - t0) / 1000000 )) ms; certification failures and aborts: $conflicts; taskpushd's transactions run again (db.cert_retries_total): $retries; reconnects: $reconnects; $executed tasks executed, $twice repeats"
grep -cE "error 1213" "$work/taskpushd.log" | sed 's/^/# taskpushd log lines naming error 1213: /'
# Who certifies first is a race: some runs see taskpushd lose (and retry), others only
# the producer; the rounds above make the first likelier. What must hold either way:
# conflicts happened, and none cost taskpushd a reconnect (the drop path it took before).
check "certification conflicts happened ($conflicts; db.cert_retries_total +$retries)" test "$conflicts" -ge 1
check "no conflict cost taskpushd a reconnect (db.reconnects_total +$reconnects)" test "$reconnects" -eq 0
check "with a producer updating NEW rows on another node every task SUCCESSFUL (got $done_rows of $total)" \
  test "$done_rows" = "$total"
check "every task of the burst executed ($executed of $((burst + 1)))" test "$executed" -ge "$burst"
check "no task of the burst ran twice ($twice repeats)" test "$twice" -eq 0

# Fencing across nodes: on node 3, one transaction gives the lease row to another holder
# (for 10 minutes) behind taskpushd's back and inserts three tasks. taskpushd, on node 2,
# must claim none of them: its next claim's fencing write of the lease row either reads
# the new holder, or conflicts with node 3's write at certification and then reads it
# on the retry (db.claims_fenced_total); or its lease renewal sees the row first. Either
# way it stops leading, and the rows stay NEW.
leader() { python3 -c 'import json,sys,urllib.request
print(json.load(urllib.request.urlopen("http://%s/stats" % sys.argv[1], timeout=5))["leader"])' "$admin" 2>/dev/null; }
fenced0=$(stat claims_fenced_total)
executed0=$(wc -l <"$records")
sql 3 "START TRANSACTION;
  UPDATE tp.taskpush_meta SET holder = 4242, expires_ms = UNIX_TIMESTAMP(NOW(3)) * 1000 + 600000 WHERE name = 'lease';
  INSERT INTO tp.task (task_type, payload) VALUES ('t', 'fenced'), ('t', 'fenced'), ('t', 'fenced');
  COMMIT"
for _ in $(seq 1 300); do
  [ "$(leader)" = False ] && break
  sleep 0.1
done
sleep 0.5 # a claim that got past the fence would have marked its rows by now
fenced=$(( $(stat claims_fenced_total) - fenced0 ))
echo "# lease row taken on node 3: db.claims_fenced_total +$fenced"
grep -E "lease row is no longer|gave up the table's lease" "$work/taskpushd.log" | tail -n 2 | sed 's/^/# taskpushd: /'
check "taskpushd on node 2 stopped leading" test "$(leader)" = False
check "the three rows stay NEW, never claimed" \
  test "$(sql 2 "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task WHERE payload = 'fenced' AND task_state = 0 AND attempts = 0")" = 3
check "no task ran after the lease row changed hands" test "$(wc -l <"$records")" = "$executed0"

if [ $fails -gt 0 ]; then
  tail -n 20 "$work/taskpushd.log" | sed 's/^/# taskpushd: /'
fi
echo "1..$n"
[ $fails -eq 0 ]
