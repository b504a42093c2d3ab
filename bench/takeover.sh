#!/usr/bin/env bash
# takeover.sh: how long a standby takes to lead after the leader freezes (SIGSTOP) or dies
# (kill -9), with real taskpushd processes and the default lease flags (SPEC, Availability:
# within 2 s). Two taskpushd share one table on a private MariaDB (scripts/tp-mariadb);
# a taskpush-worker is connected to both, and tasks keep arriving, so that the leader is
# busy with claims and result writes when it is stopped.
#
#   bench/takeover.sh [--runs N] [--keep]     N SIGSTOP takeovers, then N kill -9 (default 20)
#
# A takeover's time runs from the signal to the first /stats of the standby that says
# leader true (polled every ~10 ms). Prints each time and, per kind, min/p50/p90/max.
# Exit status: 0 when every takeover took at most 2000 ms, 1 otherwise (2: setup failed).
# Builds into build/ when needed. The server and the logs live in a temporary directory,
# removed at the end unless --keep (then its path is printed).
set -euo pipefail

runs=20
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--runs N] [--keep]" >&2; exit 2 ;;
  esac
done
case "$runs" in ''|*[!0-9]*) echo "$0: --runs needs a number" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -d build ] || meson setup build >/dev/null
ninja -C build -j2 dispatcher/taskpushd worker-client/taskpush-worker >/dev/null
tpd=$root/build/dispatcher/taskpushd
tpw=$root/build/worker-client/taskpush-worker
limit_ms=2000

tmp=$(mktemp -d /tmp/tp-takeover.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  [ -n "${feeder:-}" ] && kill "$feeder" 2>/dev/null || true
  scripts/tp-mariadb stop "$tmp/db" >/dev/null 2>&1 || true
  if [ "$keep" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap "{ cleanup; } 2>/dev/null" EXIT

eval "$(scripts/tp-mariadb start "$tmp/db" --database taskpush 2>"$tmp/tp-mariadb.log")" || true
[ -n "${TASKPUSH_TEST_MYSQL_PORT:-}" ] || { echo "$0: the private MariaDB did not start:" >&2; cat "$tmp/tp-mariadb.log" >&2; exit 2; }
mysql_cmd=(mysql --no-defaults -h "$TASKPUSH_TEST_MYSQL_HOST" -P "$TASKPUSH_TEST_MYSQL_PORT"
           -u "$TASKPUSH_TEST_MYSQL_USER" taskpush)

# A free loopback port each (the kernel picks one; a race with another program is unlikely).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -a listen admin
for i in 0 1; do listen[$i]=$(free_port); admin[$i]=$(free_port); done

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# ms into the variable named $1, with no process started (bash 5's EPOCHREALTIME): a fork
# on a busy machine costs tens of ms.
clock() { local t=${EPOCHREALTIME/[.,]/}; printf -v "$1" '%d' $(( t / 1000 )); }

# start I: taskpushd number I (0 or 1), default flags but the ports; its pid in pid[I].
declare -a pid
start() {
  local i=$1
  "$tpd" --db "$TASKPUSH_DB" --listen "127.0.0.1:${listen[$i]}" --admin "127.0.0.1:${admin[$i]}" \
    >>"$tmp/taskpushd-$i.log" 2>&1 &
  pid[$i]=$!
  disown "${pid[$i]}" # no "Killed" notice from this shell at each kill -9
  pids+=("${pid[$i]}")
}

# leader I: 1 when /stats of I says leader true, 0 when false, 2 when it does not answer.
leader() {
  local s
  s=$(curl -s -m 1 "http://127.0.0.1:${admin[$1]}/stats" 2>/dev/null) || { echo 2; return; }
  case "$s" in *'"leader":true'*|*'"leader": true'*) echo 1 ;; *'"leader"'*) echo 0 ;; *) echo 2 ;; esac
}

# wait_state I WANT SECONDS: waits until leader I prints WANT.
wait_state() {
  local end=$(( $(now_ms) + $3 * 1000 ))
  while [ "$(leader "$1")" != "$2" ]; do
    [ "$(now_ms)" -lt "$end" ] || return 1
    sleep 0.05
  done
}

start 0
wait_state 0 1 30 || { echo "taskpushd 0 did not lead" >&2; cat "$tmp/taskpushd-0.log" >&2; exit 2; }
start 1
wait_state 1 0 30 || { echo "taskpushd 1 did not start as a standby" >&2; exit 2; }
"$tpw" --connect "127.0.0.1:${listen[0]},127.0.0.1:${listen[1]}" --type bench --concurrency 8 \
  --exec true >"$tmp/worker.log" 2>&1 &
pids+=($!)
disown $!
# Tasks keep arriving (about 100 a second) for the whole run.
( while :; do
    "${mysql_cmd[@]}" -e "INSERT INTO task (task_type, payload) VALUES $(printf "('bench','x'),%.0s" $(seq 1 19))('bench','x')" \
      2>/dev/null || true
    sleep 0.2
  done ) &
feeder=$!
disown $feeder

declare -a times_stop times_kill
fail=0
lead=0
# one KIND: signals the leader, measures the standby's takeover, brings the old leader
# back as the new standby.
one() {
  local kind=$1 sb=$(( 1 - lead )) t0 t1 ms
  wait_state "$sb" 0 30 || { echo "no standby ready" >&2; exit 2; }
  sleep "0.$(( RANDOM % 10 ))"  # somewhere in the renewal cycle
  local tb
  clock tb
  if [ "$kind" = stop ]; then kill -STOP "${pid[$lead]}"; else kill -9 "${pid[$lead]}"; fi
  # From when the signal has surely been sent: on a busy machine this shell can stall
  # for a second between reading the clock and kill (seen: the "killed" leader still
  # logging 1.3 s after the clock was read).
  clock t0
  while [ "$(leader "$sb")" != 1 ]; do
    clock t1
    if [ $(( t1 - t0 )) -gt 30000 ]; then echo "standby did not lead within 30 s" >&2; exit 2; fi
    sleep 0.01
  done
  clock t1
  ms=$(( t1 - t0 ))
  if [ "$kind" = stop ]; then
    # The frozen one thaws (as after a paused VM) and must become the standby.
    kill -CONT "${pid[$lead]}"
  else
    while kill -0 "${pid[$lead]}" 2>/dev/null; do sleep 0.01; done
    start "$lead"
  fi
  [ "$ms" -le "$limit_ms" ] || fail=1
  printf '%-8s run %2d: %5d ms  (standby: %s)%s%s\n' "$kind" "$2" "$ms" "$(steps "$sb")" \
    "$([ $(( t0 - tb )) -le 50 ] || echo "  [this shell stalled $(( t0 - tb )) ms at the signal]")" \
    "$([ "$ms" -le "$limit_ms" ] || echo '  OVER 2000')"
  if [ "$kind" = stop ]; then times_stop+=("$ms"); else times_kill+=("$ms"); fi
  lead=$sb
}

# steps I: the standby's own account of its last takeover, from its log: how late it took
# the expired lease, and lease -> KILLs done -> leading (ms).
steps() {
  awk '
    function ms(ts) { split(substr(ts, 12, 12), a, ":"); return (a[1] * 3600 + a[2] * 60 + a[3]) * 1000 }
    /took the table.s lease from holder/ { t = ms($1); k = -1; l = -1; match($0, /expired -?[0-9]+ ms/); late = substr($0, RSTART + 8, RLENGTH - 11) }
    /killed the old leader/ { if (t) k = ms($1) - t }
    /leading the table with epoch/ { if (t) l = ms($1) - t }
    END { if (!t) { printf "?"; exit }
          printf "took the lease %s ms after it expired, ", late
          if (k < 0) printf "no old connection to KILL"; else printf "KILLs +%d", k
          printf ", leading +%d", l }
  ' "$tmp/taskpushd-$1.log"
}

dist() { # NAME TIMES...: min/p50/p90/max (nearest rank)
  local name=$1; shift
  local sorted n
  sorted=($(printf '%s\n' "$@" | sort -n))
  n=${#sorted[@]}
  printf '%-8s n=%d min %d p50 %d p90 %d max %d ms\n' "$name" "$n" "${sorted[0]}" \
    "${sorted[$(( (n * 50 + 99) / 100 - 1 ))]}" "${sorted[$(( (n * 90 + 99) / 100 - 1 ))]}" "${sorted[$(( n - 1 ))]}"
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$runs"); do one stop "$r"; done
for r in $(seq 1 "$runs"); do one kill "$r"; done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
dist SIGSTOP "${times_stop[@]}"
dist kill-9 "${times_kill[@]}"
if [ "$fail" = 0 ]; then echo "every takeover within $limit_ms ms"; else echo "FAIL: a takeover took over $limit_ms ms"; fi
exit "$fail"
