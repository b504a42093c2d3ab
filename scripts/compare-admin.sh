#!/usr/bin/env bash
# compare-admin.sh: do two taskpushd binaries answer /stats and /metrics with the same
# fields? For a refactor that must not change them (docs/admin.md is the contract).
#
#   scripts/compare-admin.sh [--old-schema SQL] [--new-schema SQL] [--keep]
#                            OLD_TASKPUSHD NEW_TASKPUSHD
#
# Starts a private MariaDB (scripts/tp-mariadb) in a temporary directory; then for each
# binary in turn: a fresh database loaded with the schema (default sql/schema.sql of
# this tree; --old-schema for a binary of an older schema version, e.g.
# `git show OLD:sql/schema.sql >old.sql`), taskpushd on loopback ports, and one fixed
# workload: 200 tasks of types cmp_a and cmp_b inserted by SQL plus one SUBMIT
# (taskpushctl submit), run by two taskpush-worker processes of this tree's build/.
# Every 10th task fails its first attempt (a retry), every 25th fails for good (exit 65).
# Once the table has no NEW or PROCESSING row and the dispatcher no pending write, it
# reads GET /stats and GET /metrics and compares the two runs:
#   /stats    every path with its JSON type (object keys by name, array elements as
#             "[]"; e.g. "tasks.claimed_total integer", "by_type[].type string")
#   /metrics  every sample name with its TYPE, HELP and the sets of label names it has
#   counters  the values that the workload fixes: tasks.{claimed,dispatched,succeeded,
#             failed,retried}_total, and the table's rows per state and their attempts
# Prints each difference ("only OLD:", "only NEW:", "differs:"), then one summary
# line. Exit 0 when all match, 1 on any difference, 2 when a run could not be made.
# --keep leaves the temporary directory (the JSON, the metrics, the logs) and says where.
# Needs build/ (ninja -C build) for the worker and taskpushctl; ~30 s.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
old_schema=$root/sql/schema.sql
new_schema=$root/sql/schema.sql
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --old-schema) old_schema=${2:?}; shift 2 ;;
    --new-schema) new_schema=${2:?}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    -*) echo "compare-admin: unknown option '$1'" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || usage
old_bin=$(realpath "$1"); new_bin=$(realpath "$2")
worker=$root/build/worker-client/taskpush-worker
ctl=$root/build/ctl/taskpushctl
for f in "$old_bin" "$new_bin" "$worker" "$ctl"; do
  [ -x "$f" ] || { echo "compare-admin: $f is not an executable (ninja -C build?)" >&2; exit 2; }
done
for f in "$old_schema" "$new_schema"; do
  [ -r "$f" ] || { echo "compare-admin: cannot read $f" >&2; exit 2; }
done

work=$(mktemp -d /tmp/tp-cmpadm.XXXXXX)
pids=()
stop_all() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  stop_all
  "$root/scripts/tp-mariadb" stop "$work/db" >/dev/null 2>&1 || true
  if [ $keep -eq 1 ]; then echo "compare-admin: files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

eval "$("$root/scripts/tp-mariadb" start "$work/db" 2>"$work/mariadb.log")" ||
  { cat "$work/mariadb.log" >&2; exit 2; }
sql() { # sql DB [mariadb options...]: runs standard input in database DB
  local db=$1; shift
  mariadb --no-defaults -S "$TASKPUSH_TEST_MYSQL_SOCKET" -u "$TASKPUSH_TEST_MYSQL_USER" "$@" "$db"
}

# The command a worker runs: "perm" fails for good, "flaky" fails its first attempt.
cmd='p=$(cat); case "$p" in *perm*) echo "permanent" >&2; exit 65 ;;
  *flaky*) [ "$TASKPUSH_ATTEMPT" -gt 1 ] || { echo "flaky" >&2; exit 1; } ;; esac; printf "%s" "$p"'

run() { # run NAME BINARY SCHEMA: one workload; leaves NAME.stats.json, NAME.metrics, NAME.table
  local name=$1 bin=$2 schema=$3 d=$work/$1 listen admin i
  mkdir -p "$d"
  echo "CREATE DATABASE cmp_$name CHARACTER SET utf8mb4" | sql mysql
  sql "cmp_$name" <"$schema"
  python3 - <<'PY' | sql "cmp_$name"
rows = []
for i in range(200):
    kind = " perm" if i % 25 == 5 else " flaky" if i % 10 == 0 else ""
    rows.append(f"('cmp_{'ab'[i % 2]}', {i % 3}, 'task {i}{kind}')")
print("INSERT INTO task (task_type, task_priority, payload) VALUES " + ",".join(rows) + ";")
PY
  # Fixed settings, so that both runs see the same figures; a type limit fills "limits".
  "$bin" --db "mysql://$TASKPUSH_TEST_MYSQL_USER@127.0.0.1:$TASKPUSH_TEST_MYSQL_PORT/cmp_$name" \
    --listen 127.0.0.1:0 --admin 127.0.0.1:0 --ready-file "$d/ready.json" \
    --retry-backoff-ms 50 --retry-backoff-max-ms 200 --table-stats-ms 200 --adopt-grace-ms 0 \
    --type-limit cmp_b:concurrency=8 --log-level warn 2>"$d/taskpushd.log" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$d/ready.json" ] && break; sleep 0.1; done
  [ -s "$d/ready.json" ] || { echo "compare-admin: $bin did not start:" >&2; tail "$d/taskpushd.log" >&2; return 1; }
  read -r listen admin < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["listen"], r["admin"])' "$d/ready.json")
  for i in 1 2; do
    "$worker" --connect "$listen" --type cmp_a,cmp_b --concurrency 4 --name "cmp-worker-$i" \
      --log-level warn --exec "$cmd" 2>>"$d/workers.log" &
    pids+=($!)
  done
  echo "task submitted" | "$ctl" submit --worker "$listen" --type cmp_a >"$d/submit.out" 2>&1 ||
    { echo "compare-admin: submit failed:" >&2; cat "$d/submit.out" >&2; return 1; }
  # Drained: no NEW or PROCESSING row, nothing waiting to be written, nothing held; then
  # two table-stats periods more, so that the table figures describe the drained table.
  local left
  for _ in $(seq 600); do
    left=$(echo "SELECT COUNT(*) FROM task WHERE task_state IN (0, 1)" | sql "cmp_$name" -N)
    if [ "$left" = 0 ] && python3 - "$admin" <<'PY'
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/stats", timeout=5))
q = s["queue"]
sys.exit(0 if s["db"]["pending_writes"] == 0 and q["buffered"] == 0 and q["in_flight"] == 0 else 1)
PY
    then break; fi
    sleep 0.1
  done
  [ "$left" = 0 ] || { echo "compare-admin: $name: $left tasks still queued after 60 s" >&2; return 1; }
  sleep 0.6
  curl -sf "http://$admin/stats" >"$work/$name.stats.json" &&
    curl -sf "http://$admin/metrics" >"$work/$name.metrics" ||
    { echo "compare-admin: $name: GET /stats or /metrics failed" >&2; return 1; }
  echo "SELECT task_type, task_state, COUNT(*), SUM(attempts) FROM task
        GROUP BY task_type, task_state ORDER BY task_type, task_state" | sql "cmp_$name" -N >"$work/$name.table"
  stop_all
}

run old "$old_bin" "$old_schema" || exit 2
run new "$new_bin" "$new_schema" || exit 2

python3 - "$work" <<'PY'
import json, re, sys

work = sys.argv[1]


def jtype(v):
    if v is None: return "null"
    if isinstance(v, bool): return "boolean"
    if isinstance(v, int): return "integer"
    if isinstance(v, float): return "number"
    if isinstance(v, str): return "string"
    return "array" if isinstance(v, list) else "object"


def flatten(v, path, out):
    """Adds "path type" for v and everything in it; array elements share path[]."""
    out.add(f"{path or '.'} {jtype(v)}")
    if isinstance(v, dict):
        for k, x in v.items():
            flatten(x, f"{path}.{k}" if path else k, out)
    elif isinstance(v, list):
        for x in v:
            flatten(x, f"{path}[]", out)
    return out


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def metric_facts(text):
    """Lines "NAME TYPE t", "NAME HELP text" and "NAME labels {a,b}" (one per label set)."""
    out = set()
    for line in text.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            _, kind, name, *rest = line.split(" ", 3)
            out.add(f"{name} {kind} {rest[0] if rest else ''}")
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if not m:
                out.add(f"unparsed line: {line}")
                continue
            labels = sorted(LABEL.findall(m.group(2) or ""))
            out.add(f"{m.group(1)} labels {{{','.join(labels)}}}")
    return out


def counters(name):
    s = json.load(open(f"{work}/{name}.stats.json"))
    out = {f"tasks.{k}": s["tasks"][k] for k in
           ("claimed_total", "dispatched_total", "succeeded_total", "failed_total", "retried_total")
           if k in s["tasks"]}
    for line in open(f"{work}/{name}.table"):
        ttype, state, n, attempts = line.split("\t")
        out[f"table {ttype} state {state} rows,attempts"] = f"{n},{attempts.strip()}"
    return out


diffs = 0


def compare(what, old, new):
    global diffs
    for x in sorted(old - new):
        print(f"{what}: only OLD: {x}"); diffs += 1
    for x in sorted(new - old):
        print(f"{what}: only NEW: {x}"); diffs += 1
    return len(old | new)


n_stats = compare("/stats", flatten(json.load(open(f"{work}/old.stats.json")), "", set()),
                  flatten(json.load(open(f"{work}/new.stats.json")), "", set()))
n_metrics = compare("/metrics", metric_facts(open(f"{work}/old.metrics").read()),
                    metric_facts(open(f"{work}/new.metrics").read()))
co, cn = counters("old"), counters("new")
for k in sorted(set(co) | set(cn)):
    if co.get(k) != cn.get(k):
        print(f"counters: differs: {k}: OLD {co.get(k)} NEW {cn.get(k)}"); diffs += 1
summary = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in co.items() if k.startswith("tasks."))
print(f"compare-admin: {diffs} difference(s) in {n_stats} /stats paths, {n_metrics} /metrics facts, "
      f"{len(co | cn)} counters (OLD: {summary})", file=sys.stderr)
sys.exit(1 if diffs else 0)
PY
