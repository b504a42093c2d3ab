#!/usr/bin/env bash
# callgrind.sh: the instructions taskpushd spends per task, a regression figure that the
# machine's load does not move (valgrind counts instructions, not time). Runs two drains
# of no-op tasks (taskpush-ll, K=16 of capacity 16 unless told) with taskpushd under
# `valgrind --tool=callgrind` on a private MariaDB, and prints for each thread and in all
#   (Ir(N2) - Ir(N1)) / (N2 - N1)
# the instructions one more task costs, with start-up, shutdown and the idle ticks of
# the two runs cancelling out (the longer run idles a few seconds more; that is about
# 100 instructions a task).
#   bench/callgrind.sh                    N1 = 10000, N2 = 30000, K = 16, capacity 16
#   bench/callgrind.sh 20000 60000 256 4  N1, N2, K workers of capacity C
#   bench/callgrind.sh 10000 30000 256 4 workers
#                                         the other side: the bench process under
#                                         callgrind (its worker threads on libtaskpush,
#                                         summed), taskpushd not
# CALLGRIND_BENCH_ARGS="--group-keys 1000" adds arguments to taskpush-bench (word-split).
# Needs valgrind (apt-get install valgrind). Takes under a minute. CALLGRIND_KEEP=1 keeps
# the profiles (one file per thread) for callgrind_annotate.
set -euo pipefail
n1=${1:-10000}
n2=${2:-30000}
k=${3:-16}
cap=${4:-16}
side=${5:-taskpushd}
case $side in
  taskpushd | workers) ;;
  *) echo "callgrind.sh: the fifth argument is taskpushd or workers, not '$side'" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TASKPUSH_BUILD_DIR:-$root/build}
cd "$root"
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 2; }
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" >/dev/null
fi
ninja -C "$build" -j2 bench/taskpush-bench dispatcher/taskpushd >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/taskpush-callgrind.XXXXXX")
cleanup() {
  scripts/tp-mariadb stop "$work/db" >/dev/null 2>&1 || true
  if [ -n "${CALLGRIND_KEEP:-}" ]; then
    echo "callgrind.sh: the profiles are in $work (callgrind_annotate FILE)"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
eval "$(scripts/tp-mariadb start "$work/db")"

# taskpush-bench starts whatever --taskpushd names, with taskpushd's arguments.
cat >"$work/taskpushd" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --separate-threads=yes --dump-instr=no \\
  --callgrind-out-file="$work/out.\$CG_RUN.%p" -q "$build/dispatcher/taskpushd" "\$@"
EOF
chmod +x "$work/taskpushd"

for n in "$n1" "$n2"; do
  if [ "$side" = workers ]; then
    valgrind --tool=callgrind --separate-threads=yes --dump-instr=no \
      --callgrind-out-file="$work/out.$n.%p" -q "$build/bench/taskpush-bench" --design taskpush-ll \
      --k "$k" --capacity "$cap" --n "$n" --repeat 1 --taskpushd "$build/dispatcher/taskpushd" \
      --json-only >"$work/bench.$n.json"
  else
    # shellcheck disable=SC2086
    CG_RUN=$n "$build/bench/taskpush-bench" --design taskpush-ll --k "$k" --capacity "$cap" --n "$n" \
      --repeat 1 --taskpushd "$work/taskpushd" --json-only ${CALLGRIND_BENCH_ARGS:-} >"$work/bench.$n.json"
  fi
  grep -q '"verified":true' "$work/bench.$n.json" || {
    echo "callgrind.sh: the drain of $n tasks failed verification" >&2
    cat "$work/bench.$n.json" >&2
    exit 1
  }
done

python3 - "$work" "$n1" "$n2" "$k" "$cap" "$side" <<'EOF'
import glob, os, re, sys
work, n1, n2, k, cap, side = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                              sys.argv[5], sys.argv[6])

# A thread is named by the start function of taskpushd's that appears in its file.
STARTS = [("dsp_dbi_claim_main", "claim"), ("half_main", "claim helper"),
          ("dsp_dbi_write_main", "write"), ("dsp_dbi_lease_main", "lease"),
          ("dsp_dbi_stats_main", "stats"), ("dsp_dbi_sched_main", "schedule"),
          ("submit_main", "submit")]
if side == "workers":
    # The bench's threads: its K workers share a few threads (worker_main, summed).
    STARTS = [("worker_main", "workers (libtaskpush)")]

def per_thread(n):
    """{thread name: instructions} of the run of n tasks (one file per thread)."""
    out = {}
    for path in glob.glob(os.path.join(work, "out.%d.*" % n)):
        m = re.search(r"-(\d+)$", path)
        total, name = 0, None
        with open(path) as f:
            for line in f:
                if name is None and line.startswith(("fn=", "cfn=")):
                    for fn, label in STARTS:
                        if re.match(r"c?fn=\(\d+\) %s$" % fn, line.strip()):
                            name = label
                if line.startswith("totals:") or line.startswith("summary:"):
                    total = int(line.split()[1])
        if name is None:
            first = "bench" if side == "workers" else "event loop"
            name = first if m is None or int(m.group(1)) == 1 else "thread %s" % m.group(1)
        out[name] = out.get(name, 0) + total
    return out

a, b = per_thread(n1), per_thread(n2)
print("%s instructions per task (callgrind, taskpush-ll K=%s of capacity %s, N = %d and %d)"
      % ("the bench's" if side == "workers" else "taskpushd", k, cap, n1, n2))
print("| thread | Ir, N=%d | Ir, N=%d | Ir per task |" % (n1, n2))
print("|---|---|---|---|")
for t in sorted(set(a) | set(b), key=lambda t: -(b.get(t, 0) - a.get(t, 0))):
    ia, ib = a.get(t, 0), b.get(t, 0)
    print("| %s | %d | %d | %.0f |" % (t, ia, ib, (ib - ia) / (n2 - n1)))
ta, tb = sum(a.values()), sum(b.values())
print("| all | %d | %d | %.0f |" % (ta, tb, (tb - ta) / (n2 - n1)))
EOF
