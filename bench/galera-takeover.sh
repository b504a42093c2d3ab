#!/usr/bin/env bash
# galera-takeover.sh: how long dispatch pauses when the node the leader uses is killed
# (-9), frozen (SIGSTOP, 30 s) or cut off from its cluster (gmcast.isolate), with
# Galera's default timeouts (SPEC, Availability: at most 15 s). Each run is one
# tests/galera/test-failover.sh on a fresh three-node cluster (a leader and a standby
# given the node list, two workers given both, bystander sessions on every node), with
# TASKS tasks per fault; a pause is the longest gap between two task starts from the
# fault on (the test's own figure).
#
#   bench/galera-takeover.sh [--runs N] [--tasks T]     (default 3 runs, 20000 tasks)
#
# Prints each pause and, per fault, min/p50/max; writes bench/results/DATE-galera-takeover.md
# (with the test's TAP lines). Exit status: 0 when every run passed the test and every
# pause was at most 15 s, 1 otherwise.
set -euo pipefail

runs=3
tasks=20000
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --tasks) tasks=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--tasks T]" >&2; exit 2 ;;
  esac
done
for v in "$runs" "$tasks"; do
  case "$v" in ''|*[!0-9]*) echo "$0: --runs and --tasks take numbers" >&2; exit 2 ;; esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -d build ] || meson setup build >/dev/null
ninja -C build -j2 dispatcher/taskpushd worker-client/taskpush-worker >/dev/null
limit_ms=15000
tmp=$(mktemp -d /tmp/tp-galera-takeover.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

status=0
for r in $(seq 1 "$runs"); do
  echo "== run $r of $runs ($tasks tasks per fault)" >&2
  if ! TP_FAILOVER_TASKS=$tasks bash tests/galera/test-failover.sh "$root" build/dispatcher/taskpushd \
      build/worker-client/taskpush-worker >"$tmp/run$r.tap" 2>&1; then
    status=1
    grep -E "^not ok" "$tmp/run$r.tap" >&2 || tail -n 20 "$tmp/run$r.tap" >&2
  fi
  grep -E "^# (kill|freeze|cut): dispatch paused" "$tmp/run$r.tap" | sed "s/^/run $r /" | tee -a "$tmp/pauses.txt"
done

stamp=$(date -u +%Y-%m-%d-%H%M)
report=bench/results/$stamp-galera-takeover.md
mkdir -p bench/results
python3 - "$tmp/pauses.txt" "$report" "$runs" "$tasks" "$limit_ms" <<'EOF' || status=1
import re, statistics, sys
path, report, runs, tasks, limit = sys.argv[1:]
by = {}
for line in open(path):
    m = re.search(r"# (kill|freeze|cut): dispatch paused (\d+) ms", line)
    if m:
        by.setdefault(m.group(1), []).append(int(m.group(2)))
lines = ["# Dispatch paused by a fault of the leader's Galera node", "",
         "`bench/galera-takeover.sh --runs %s --tasks %s`: three nodes on loopback, Galera's"
         " default timeouts (evs.suspect_timeout 5 s), taskpushd's Galera lease (5000/1000 ms)."
         " A pause is the longest gap between two task starts from the fault on." % (runs, tasks),
         "", "| fault | runs | min ms | p50 ms | max ms | each |", "|---|---|---|---|---|---|"]
worst = 0
for kind in ("kill", "freeze", "cut"):
    v = by.get(kind, [])
    if not v:
        continue
    worst = max(worst, max(v))
    lines.append("| %s | %d | %d | %d | %d | %s |" % (kind, len(v), min(v), statistics.median(v),
                                                      max(v), ", ".join(map(str, v))))
lines += ["", "Target: at most %s ms (SPEC, Availability)." % limit]
text = "\n".join(lines) + "\n"
open(report, "w").write(text)
print(text)
sys.exit(0 if by and worst <= int(limit) else 1)
EOF
{ echo; echo '```'; cat "$tmp"/run*.tap; echo '```'; } >>"$report"
echo "written: $report"
exit $status
