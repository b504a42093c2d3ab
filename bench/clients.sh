#!/usr/bin/env bash
# bench/clients.sh: each client's drain rate with no-op handlers at K workers (64 by
# default), beside libtaskpush's, in one run (issue 37, part 4).
#
#   bench/clients.sh                      # N=100000, K=64, capacity 16, 3 rounds
#   bench/clients.sh --n 50000 --repeat 1
#
# Each round drains N preloaded no-op tasks (priorities 0..2, as taskpush-bench) on the
# same MariaDB, with a fresh table and taskpushd each time:
#   c    libtaskpush: build/bench/taskpush-bench --design taskpush-ll (K workers of
#        capacity C on threads of one process)
#   go   the Go module: clients/go/examples/drainbench (K Workers of capacity C in one
#        process), timed the same way: from the workers' start until the handlers ran
#        N times and taskpushd's /stats shows every outcome written
#   java the Java library: clients/java/examples/DrainBench.java (K Workers of capacity C
#        in one JVM, the jar of clients/java/build.sh), timed as go, after a warm-up of
#        the JVM inside DrainBench (its own stand-in dispatcher, before the clock starts),
#        with -XX:+UseSerialGC -XX:TieredStopAtLevel=1 (bench/README.md says why)
# The Go and Java runs are verified from the table (N rows SUCCESSFUL at attempt 1);
# taskpush-bench verifies its own. Prints one line per run, then the medians, go/c and
# java/c, and writes the
# same to bench/results/DATE-HOST-clients.md. Without the TASKPUSH_TEST_MYSQL_*
# environment it starts a private MariaDB (scripts/tp-mariadb).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TASKPUSH_BUILD:-$root/build}
n=100000 k=64 capacity=16 repeat=3
while [ $# -gt 0 ]; do
  case "$1" in
    --n) n=$2; shift 2 ;;
    --k) k=$2; shift 2 ;;
    --capacity) capacity=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "clients.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
command -v go >/dev/null || { echo "clients.sh: go is missing (scripts/install-deps.sh --test)" >&2; exit 2; }
command -v javac >/dev/null || { echo "clients.sh: javac is missing (scripts/install-deps.sh --test)" >&2; exit 2; }
[ -f "$build/build.ninja" ] || meson setup "$build" >/dev/null
ninja -C "$build" >/dev/null

work=$(mktemp -d /tmp/taskpush-clients.XXXXXX)
tpd_pid=""
own_db=""
cleanup() {
  [ -n "$tpd_pid" ] && kill -9 "$tpd_pid" 2>/dev/null
  [ -n "$own_db" ] && "$root/scripts/tp-mariadb" stop "$work/db" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
if [ -z "${TASKPUSH_TEST_MYSQL_HOST:-}" ]; then
  eval "$("$root/scripts/tp-mariadb" start "$work/db")"
  own_db=1
fi
export GOCACHE="$build/clients-go/cache" GOPATH="$build/clients-go/gopath" GOENV=off GOPROXY=off \
  GOFLAGS= CGO_ENABLED=0
(cd "$root/clients/go" && go build -o "$work/drainbench" ./examples/drainbench)
"$root/clients/java/build.sh" "$work/java"
javac --release 17 -cp "$work/java/taskpush.jar" -d "$work" "$root/clients/java/examples/DrainBench.java"

db=taskpush_clients_$$
pw=${TASKPUSH_TEST_MYSQL_PASSWORD:+:$TASKPUSH_TEST_MYSQL_PASSWORD}
url="mysql://$TASKPUSH_TEST_MYSQL_USER$pw@$TASKPUSH_TEST_MYSQL_HOST:$TASKPUSH_TEST_MYSQL_PORT/$db"
sql() { # sql [DB] < statements
  mariadb --no-defaults --protocol=tcp -h "$TASKPUSH_TEST_MYSQL_HOST" -P "$TASKPUSH_TEST_MYSQL_PORT" \
    -u "$TASKPUSH_TEST_MYSQL_USER" ${TASKPUSH_TEST_MYSQL_PASSWORD:+-p"$TASKPUSH_TEST_MYSQL_PASSWORD"} \
    --batch --skip-column-names "$@"
}
rate_of() { python3 -c 'import json,sys
for line in sys.stdin:
    try: o = json.loads(line)
    except ValueError: continue
    if "tasks_per_s" in o: print(round(o["tasks_per_s"]))'; }

client_round() { # client_round NAME COMMAND... (the command gets ADDR ADMIN N K CAPACITY)
  local name=$1; shift
  sql <<<"DROP DATABASE IF EXISTS \`$db\`; CREATE DATABASE \`$db\` CHARACTER SET utf8mb4"
  sql "$db" <"$root/sql/schema.sql"
  sql "$db" <<<"INSERT INTO task (task_id, task_priority) SELECT seq, seq % 3 FROM seq_1_to_$n"
  rm -f "$work/ready"
  "$build/dispatcher/taskpushd" --db "$url" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
    --ready-file "$work/ready" --scheduler least-loaded >"$work/taskpushd.log" 2>&1 &
  tpd_pid=$!
  local listen="" admin="" i
  for i in $(seq 1 1000); do
    if [ -s "$work/ready" ]; then
      listen=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"])' "$work/ready" 2>/dev/null) || listen=""
      admin=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$work/ready" 2>/dev/null) || admin=""
      if [ -n "$admin" ] && python3 -c 'import json,sys,urllib.request
sys.exit(0 if json.load(urllib.request.urlopen("http://"+sys.argv[1]+"/stats", timeout=5))["leader"] else 1)' "$admin" 2>/dev/null; then
        break
      fi
    fi
    sleep 0.02
  done
  [ -n "$admin" ] || { echo "clients.sh: taskpushd did not start:" >&2; cat "$work/taskpushd.log" >&2; return 1; }
  # A client that fails must not leave this round's taskpushd running (this runs in $(...)).
  "$@" "$listen" "$admin" "$n" "$k" "$capacity" >"$work/$name.json" ||
    { echo "clients.sh: $name failed" >&2; kill -9 "$tpd_pid"; return 1; }
  kill -TERM "$tpd_pid"; wait "$tpd_pid" || true; tpd_pid=""
  local done_rows
  done_rows=$(sql "$db" <<<"SELECT COUNT(*) FROM task WHERE task_state = 2 AND attempts = 1")
  [ "$done_rows" = "$n" ] || { echo "clients.sh: $name: $done_rows of $n rows SUCCESSFUL at attempt 1" >&2; return 1; }
  rate_of <"$work/$name.json"
}
go_drain() { "$work/drainbench" --addr "$1" --admin "$2" --n "$3" --k "$4" --capacity "$5"; }
java_drain() { java -Xss512k -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$work/java/taskpush.jar:$work" DrainBench "$@"; }

c_rates=() go_rates=() java_rates=()
mkdir -p "$root/bench/results"
out="$root/bench/results/$(date -u +%Y-%m-%d-%H%M)-$(hostname -s)-clients.md"
exec > >(tee "$out")
echo "clients.sh: N=$n K=$k capacity=$capacity, $repeat round(s); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(go version), $(java -version 2>&1 | head -1)"
echo
for r in $(seq 1 "$repeat"); do
  c=$("$build/bench/taskpush-bench" --db "$url" --design taskpush-ll --k "$k" --n "$n" \
        --capacity "$capacity" --repeat 1 --json-only | rate_of)
  g=$(client_round go go_drain)
  j=$(client_round java java_drain)
  jcpu=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    try: print(json.loads(line)["cpu_s"])
    except (ValueError, KeyError): pass' "$work/java.json" 2>/dev/null || true)
  echo "round $r: c (libtaskpush) $c tasks/s, go $g tasks/s, java $j tasks/s (JVM CPU ${jcpu:-?} s), load $(cut -d' ' -f1 /proc/loadavg)"
  c_rates+=("$c") go_rates+=("$g") java_rates+=("$j")
done
sql <<<"DROP DATABASE IF EXISTS \`$db\`"
python3 - "${c_rates[*]}" "${go_rates[*]}" "${java_rates[*]}" <<'PY'
import statistics, sys
c, g, j = ([float(x) for x in a.split()] for a in sys.argv[1:4])
mc, mg, mj = statistics.median(c), statistics.median(g), statistics.median(j)
print(f"median: c (libtaskpush) {mc:.0f} tasks/s, go {mg:.0f} tasks/s, java {mj:.0f} tasks/s, "
      f"go/c {mg / mc:.2f}, java/c {mj / mc:.2f}")
PY
