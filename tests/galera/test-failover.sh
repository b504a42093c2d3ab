#!/usr/bin/env bash
# test-failover: a leader and a standby taskpushd on a private three-node Galera cluster
# (scripts/tp-galera), each given the three nodes in its own order (the leader starts on
# node 1, the standby on node 2), two taskpush-workers given both dispatchers, and three
# faults of the node the leader uses, each in the middle of a drain:
#   kill    kill -9 of the node (started again afterwards; it rejoins by IST);
#   freeze  SIGSTOP of the node for TP_FAILOVER_FREEZE_S (30) seconds, then SIGCONT;
#   cut     the node cut off from the others (gmcast.isolate=1: its group
#           communication drops every peer; the node leaves the primary component and
#           answers 1047) for 15 s, then joined again.
# Each time: every task SUCCESSFUL, no row set SUCCESSFUL twice (a trigger logs every
# change to SUCCESSFUL), executions beyond one per task no more than what was in flight,
# dispatch resumed (the longest gap between two task starts after the fault, printed;
# the bound here is generous, bench/galera-takeover.sh gives the distribution), and no
# bystander killed or interrupted: sessions of taskpushd's own database user on every
# node, half idle and half in a long SELECT SLEEP (a KILL QUERY would end it), still
# there with the same ids after the round (on a killed node, its own die with it and
# are not counted). TAP output.
# Usage: test-failover.sh SOURCE_ROOT TASKPUSHD TASKPUSH_WORKER
# Environment: TP_FAILOVER_TASKS (1500 per round), TP_FAILOVER_FREEZE_S (30),
# TP_FAILOVER_ROUNDS ("kill freeze cut"), TP_FAILOVER_BOUND_S (45), TP_FAILOVER_LOGS (a
# directory to keep the daemons' and workers' logs and the execution records in).
set -u
root=${1:?usage: test-failover.sh SOURCE_ROOT TASKPUSHD TASKPUSH_WORKER}
taskpushd=${2:?}
worker=${3:?}
tasks=${TP_FAILOVER_TASKS:-1500}
freeze_s=${TP_FAILOVER_FREEZE_S:-30}
rounds=${TP_FAILOVER_ROUNDS:-kill freeze cut}
bound_s=${TP_FAILOVER_BOUND_S:-45}
cut_s=15
in_flight=200 # two workers' slots and buffers, and a result batch, with room to spare
work=$(mktemp -d /tmp/tp-galera-failover.XXXXXX)
chmod 755 "$work" # the nodes run as nobody when the test runs as root
cluster="$work/c"
pids=()
bystander_pids=()
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
  if [ -n "${TP_FAILOVER_LOGS:-}" ]; then
    mkdir -p "$TP_FAILOVER_LOGS"
    cp "$work"/*.log "$records" "$TP_FAILOVER_LOGS"/ 2>/dev/null
    for p in 1 2 3; do cp "$cluster/node$p/mysqld.err" "$TP_FAILOVER_LOGS/node$p.err" 2>/dev/null; done
  fi
  for p in "${pids[@]}" "${bystander_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  "$root/scripts/tp-galera" stop "$cluster" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
now_ms() { echo $(($(date +%s%N) / 1000000)); }

if ! out=$("$root/scripts/tp-galera" start "$cluster" 2>"$work/start.log"); then
  tail -n 30 "$work/start.log" | sed 's/^/# /'
  echo "1..1"
  echo "not ok 1 - the cluster started"
  exit 1
fi
eval "$out"
IFS=, read -r -a nodes <<<"$TASKPUSH_TEST_GALERA_NODES"
user=$TASKPUSH_TEST_GALERA_USER
client() { # client NODE ARGS...: the mariadb client as taskpushd's user on node NODE
  local hp=${nodes[$(($1 - 1))]}
  shift
  mariadb --no-defaults -h "${hp%:*}" -P "${hp#*:}" -u "$user" --connect-timeout=5 "$@"
}
sql() { client "$1" -N -B -e "$2"; }
node_of_port() { # the node (1-based) whose SQL port is $1
  local i
  for i in 1 2 3; do [ "${nodes[$((i - 1))]#*:}" = "$1" ] && { echo "$i"; return; }; done
  echo 0
}
list_from() { # list_from I: the three nodes, node I first
  local i=$1 a b c
  a=${nodes[$((i - 1))]}; b=${nodes[$((i % 3))]}; c=${nodes[$(((i + 1) % 3))]}
  echo "$a,$b,$c"
}

sql 1 "CREATE DATABASE tp"
check "taskpushd --migrate makes the schema" "$taskpushd" --db "mysql://$user@${nodes[0]}/tp" --migrate
# Every change of a row to SUCCESSFUL, logged (only by the node that makes the change;
# the log's rows replicate like any other).
sql 1 "CREATE TABLE tp.succ_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, task_id BIGINT NOT NULL);
       CREATE TRIGGER tp.succ_once AFTER UPDATE ON tp.task FOR EACH ROW
         INSERT INTO tp.succ_log (task_id) SELECT NEW.task_id FROM DUAL
         WHERE NEW.task_state = 2 AND OLD.task_state <> 2"

start_dispatcher() { # start_dispatcher NAME FIRST_NODE
  "$taskpushd" --db "mysql://$user@$(list_from "$2")/tp" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
    --poll-ms 50 --ready-file "$work/$1.json" 2>"$work/$1.log" &
  pids+=($!)
  for _ in $(seq 1 300); do [ -s "$work/$1.json" ] && break; sleep 0.1; done
}
ready() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$work/$1.json" "$2" 2>/dev/null; }
stat() { # stat NAME PATH: a field of NAME's /stats ("leader", "db.node_port", ...)
  python3 -c 'import json,sys,urllib.request
v = json.load(urllib.request.urlopen("http://%s/stats" % sys.argv[1], timeout=3))
for k in sys.argv[2].split("."):
    v = v[k]
print(str(v).lower())' "$(ready "$1" admin)" "$2" 2>/dev/null
}
wait_stat() { # wait_stat NAME PATH VALUE SECONDS
  local i
  for i in $(seq 1 $(($4 * 10))); do
    [ "$(stat "$1" "$2")" = "$3" ] && return 0
    sleep 0.1
  done
  return 1
}

start_dispatcher a 1
check "dispatcher a leads, on node 1" wait_stat a leader true 60
start_dispatcher b 2
check "dispatcher b is a standby, on node 2" \
  test "$(stat b leader)" = false -a "$(stat b db.node_port)" = "${nodes[1]#*:}"
check "on Galera the lease is 5000/1000 ms when no lease flag is given" \
  test "$(stat a db.lease_ms)/$(stat a db.lease_renew_ms)/$(stat a db.galera)" = "5000/1000/true"

records="$work/executed.txt"
: >"$records"
connect="$(ready a listen),$(ready b listen)"
for w in 1 2; do
  "$worker" --connect "$connect" --type t --concurrency 8 --name "w$w" \
    --exec "echo \$TASKPUSH_TASK_ID \$(date +%s%N) >>$records" 2>"$work/worker$w.log" &
  pids+=($!)
done

# Bystanders: per node two idle sessions and two in SELECT SLEEP, as taskpushd's user.
# Each file bystanders/N.K holds "NODE ID KIND PID".
start_bystanders() {
  local i k f pid
  rm -rf "$work/bystanders"; mkdir -p "$work/bystanders"
  bystander_pids=()
  for i in 1 2 3; do
    for k in 1 2 3 4; do
      f="$work/bystanders/$i.$k"
      if [ $k -le 2 ]; then
        (echo "SELECT CONNECTION_ID();"; exec sleep 3600) | client "$i" -N -B -n --skip-reconnect >"$f.out" 2>&1 &
        pid=$!
        echo "idle $pid" >"$f.kind"
      else
        client "$i" -N -B -n --skip-reconnect -e "SELECT CONNECTION_ID(); SELECT SLEEP(3600)" >"$f.out" 2>&1 &
        pid=$!
        echo "sleep $pid" >"$f.kind"
      fi
      bystander_pids+=("$pid")
    done
  done
  for f in "$work"/bystanders/*.kind; do
    for _ in $(seq 1 100); do [ -s "${f%.kind}.out" ] && break; sleep 0.05; done
  done
}
# bystanders_intact SKIP_NODE: every bystander of the other nodes is there, unchanged.
bystanders_intact() {
  local skip=$1 f i kind pid id row bad=0 seen=0
  for f in "$work"/bystanders/*.kind; do
    i=$(basename "$f"); i=${i%%.*}
    [ "$i" = "$skip" ] && continue
    read -r kind pid <"$f"
    id=$(head -n 1 "${f%.kind}.out")
    seen=$((seen + 1))
    row=$(sql "$i" "SELECT COMMAND, IFNULL(INFO, '') FROM information_schema.PROCESSLIST WHERE ID = '$id'" 2>/dev/null)
    case $kind in
      idle) [ -n "$row" ] || { echo "# bystander $id on node $i ($kind) is gone"; bad=1; } ;;
      sleep)
        if ! kill -0 "$pid" 2>/dev/null || ! printf '%s' "$row" | grep -q "SLEEP(3600)"; then
          echo "# bystander $id on node $i ($kind) was interrupted: '$row'"; bad=1
        fi ;;
    esac
  done
  echo "# $seen bystander sessions checked"
  [ $bad -eq 0 ] && [ $seen -ge 8 ]
}
stop_bystanders() {
  local p
  for p in "${bystander_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  pkill -TERM -f "^sleep 3600$" -P $$ 2>/dev/null
  bystander_pids=()
}

done_count() { # SUCCESSFUL rows, read on a node that is up
  local i
  for i in "$@"; do
    sql "$i" "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM tp.task WHERE task_state = 2" 2>/dev/null && return
  done
  echo -1
}
leader_name() {
  local d
  for d in a b; do [ "$(stat $d leader)" = true ] && { echo $d; return; }; done
  echo ""
}

total=0
round_no=1
for round in $rounds; do
  lead=""
  for _ in $(seq 1 600); do lead=$(leader_name); [ -n "$lead" ] && break; sleep 0.1; done
  victim=$(node_of_port "$(stat "$lead" db.node_port)")
  others=()
  for i in 1 2 3; do [ "$i" != "$victim" ] && others+=("$i"); done
  echo "# round $round: $lead leads on node $victim"
  start_bystanders
  sql "${others[0]}" "INSERT INTO tp.task (task_type, payload) SELECT 't', 'p' FROM tp.seq_1_to_$tasks"
  total=$((total + tasks))
  before=$(wc -l <"$records")
  for _ in $(seq 1 1200); do
    [ "$(wc -l <"$records")" -ge $((before + tasks / 5)) ] && break
    sleep 0.05
  done
  t_fault=$(now_ms)
  echo "# fault at $(date -u +%H:%M:%S.%N | cut -c1-12)"
  case $round in
    kill) "$root/scripts/tp-galera" node "$cluster" "$victim" kill ;;
    freeze) "$root/scripts/tp-galera" node "$cluster" "$victim" pause ;;
    cut) sql "$victim" "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'" ;;
  esac
  # The survivors' view in the middle of the fault (a node freezes or is cut for longer).
  if [ "$round" != kill ]; then
    sleep 8
    for i in "${others[@]}"; do
      echo "# node $i 8 s into the fault: $(sql "$i" "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_status', 'wsrep_cluster_size')" 2>&1 | tr '\t\n' '= ')"
    done
  fi
  case $round in
    freeze) sleep $((freeze_s - 8)); "$root/scripts/tp-galera" node "$cluster" "$victim" resume ;;
    cut) sleep $((cut_s - 8)); sql "$victim" "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'" ;;
  esac
  for i in "${others[@]}"; do
    echo "# node $i after the fault: $(sql "$i" "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_status', 'wsrep_cluster_size', 'wsrep_local_state_comment')" 2>&1 | tr '\t\n' '= ')"
  done
  got=-1
  for _ in $(seq 1 1800); do
    got=$(done_count "${others[@]}")
    [ "$got" = "$total" ] && break
    sleep 0.1
  done
  check "$round: all $total tasks SUCCESSFUL (got $got)" test "$got" = "$total"
  # The pause: the longest gap between two task starts from the fault on.
  pause=$(python3 -c 'import sys
t = int(sys.argv[2])
starts = sorted(int(l.split()[1]) // 1000000 for l in open(sys.argv[1]) if len(l.split()) == 2)
prev, gap = t, 0
for s in starts:
    if s >= t:
        gap, prev = max(gap, s - prev), s
print(gap)' "$records" "$t_fault")
  echo "# $round: dispatch paused $pause ms after the fault (longest gap between two task starts)"
  check "$round: dispatch resumed within ${bound_s} s of the fault ($pause ms)" test "$pause" -le $((bound_s * 1000))
  executed=$(cut -d' ' -f1 "$records" | sort -u | wc -l)
  extra=$(($(wc -l <"$records") - executed))
  echo "# $round: $executed distinct tasks executed, $extra executions beyond one per task so far"
  check "$round: every task executed" test "$executed" = "$total"
  check "$round: executions beyond one per task within what was in flight ($extra <= $((in_flight * round_no)))" \
    test "$extra" -le $((in_flight * round_no))
  round_no=$((round_no + 1))
  twice=$(sql "${others[0]}" "SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM (SELECT task_id FROM tp.succ_log GROUP BY task_id HAVING COUNT(*) > 1) AS d")
  check "$round: no row set SUCCESSFUL twice ($twice)" test "$twice" = 0
  # Back to three nodes before the bystanders are read: a cut or frozen node answers
  # again once it has rejoined.
  if [ "$round" = kill ]; then
    check "kill: the killed node starts again and rejoins" \
      "$root/scripts/tp-galera" node "$cluster" "$victim" start 2>>"$work/start.log"
    check "kill: 0 bystanders killed on the other nodes" bystanders_intact "$victim"
  else
    synced=""
    for _ in $(seq 1 600); do
      synced=$("$root/scripts/tp-galera" node "$cluster" "$victim" state 2>/dev/null)
      [ "$synced" = Synced ] && break
      sleep 0.1
    done
    check "$round: node $victim is synced again ($synced)" test "$synced" = Synced
    check "$round: 0 bystanders killed or interrupted on any node" bystanders_intact 0
  fi
  stop_bystanders
  grep -hE "moving to|took the table|gave up the table|killed the old" "$work/a.log" "$work/b.log" |
    tail -n 8 | sed 's/^/# /'
done

if [ $fails -gt 0 ]; then
  for d in a b; do tail -n 15 "$work/$d.log" | sed "s/^/# $d: /"; done
fi
echo "1..$n"
[ $fails -eq 0 ]
