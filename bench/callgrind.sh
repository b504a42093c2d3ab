#!/usr/bin/env bash
# callgrind.sh: the instructions taskpushd spends per task, a regression figure that the
# machine's load does not move (valgrind counts instructions, not time). Runs two drains
# of no-op tasks (taskpush-ll, K=16, capacity 16) with taskpushd under
# `valgrind --tool=callgrind` on a private MariaDB, and prints for each thread and in all
#   (Ir(N2) - Ir(N1)) / (N2 - N1)
# the instructions one more task costs, with start-up, shutdown and the idle ticks of
# the two runs cancelling out (the longer run idles a few seconds more; that is about
# 100 instructions a task).
#   bench/callgrind.sh              N1 = 10000, N2 = 30000
#   bench/callgrind.sh 20000 60000
# Needs valgrind (apt-get install valgrind). Takes about two minutes.
set -euo pipefail
n1=${1:-10000}
n2=${2:-30000}
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
  rm -rf "$work"
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
  CG_RUN=$n "$build/bench/taskpush-bench" --design taskpush-ll --k 16 --capacity 16 --n "$n" \
    --repeat 1 --taskpushd "$work/taskpushd" --json-only >"$work/bench.$n.json"
  grep -q '"verified":true' "$work/bench.$n.json" || {
    echo "callgrind.sh: the drain of $n tasks failed verification" >&2
    cat "$work/bench.$n.json" >&2
    exit 1
  }
done

python3 - "$work" "$n1" "$n2" <<'EOF'
import glob, os, re, sys
work, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def per_thread(n):
    """{thread number: instructions} of the run of n tasks (one file per thread)."""
    out = {}
    for path in glob.glob(os.path.join(work, "out.%d.*" % n)):
        m = re.search(r"-(\d+)$", path)
        with open(path) as f:
            for line in f:
                if line.startswith("totals:") or line.startswith("summary:"):
                    out[int(m.group(1)) if m else 1] = int(line.split()[1])
                    break
    return out

a, b = per_thread(n1), per_thread(n2)
# Threads start in the same order in both runs: 1 is the event loop, then the database
# threads as dispatcher/db.c starts them.
print("taskpushd instructions per task (callgrind, taskpush-ll K=16, N = %d and %d)" % (n1, n2))
print("| thread | Ir, N=%d | Ir, N=%d | Ir per task |" % (n1, n2))
print("|---|---|---|---|")
for t in sorted(set(a) | set(b)):
    ia, ib = a.get(t, 0), b.get(t, 0)
    print("| %d%s | %d | %d | %.0f |" % (t, " (event loop)" if t == 1 else "", ia, ib, (ib - ia) / (n2 - n1)))
ta, tb = sum(a.values()), sum(b.values())
print("| all | %d | %d | %.0f |" % (ta, tb, (tb - ta) / (n2 - n1)))
EOF
