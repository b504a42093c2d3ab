#!/usr/bin/env bash
# deps-ab.sh: the drain with dependencies beside the same drain without, in one run
# (issue 35, Must-show 5: K=64 with dependencies within 15 % of the plain drain). On one
# private MariaDB (scripts/tp-mariadb), one taskpush-bench run of ROUNDS rounds, each one
# taskpush-ll drain and one taskpush-deps drain (fan-ins of 98 and chains, bench/README.md;
# the bench alternates their order, ABBA), and prints each round's pair, their ratio and
# what the dependencies cost (statements and handler reads a task, mariadbd and taskpushd
# CPU a task), then the median ratio: absolute figures move by a third on a shared
# machine, the ratio within a round holds.
#   bench/deps-ab.sh                      7 rounds, K=64, N=200,000
#   bench/deps-ab.sh 5 64 100000          ROUNDS K N
#   DEPS_AB_ARGS="--taskpushd PATH"       more arguments for taskpush-bench (word-split)
# Writes the JSON lines to bench/results/DATE-HHMMSS-HOST-deps.jsonl. Exit 1 when a drain
# failed verification. On a shared machine wrap it: flock /work/bench.lock bench/deps-ab.sh
set -euo pipefail
rounds=${1:-7}
k=${2:-64}
n=${3:-200000}
# shellcheck source=bench/ab-lib.sh
. "$(dirname "$0")/ab-lib.sh"
ab_positive deps-ab.sh "$rounds" "$k" "$n"
ab_setup deps
load_before=$(cat /proc/loadavg)
rc=0
# shellcheck disable=SC2086
"$build/bench/taskpush-bench" --design taskpush-ll,taskpush-deps --k "$k" --n "$n" --repeat "$rounds" \
  --json-only ${DEPS_AB_ARGS:-} >"$out" || rc=$?

python3 - "$out" "$load_before" "$(cat /proc/loadavg)" <<'PY'
import json, statistics, sys
out, before, after = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for line in open(out):
    d = json.loads(line)
    if d.get("kind") == "run":
        runs.setdefault(d["round"], {})[d["design"]] = d
def f(d, key, fmt, scale=1):
    v = d.get(key)
    return fmt % (v * scale) if isinstance(v, (int, float)) else "-"
def ms(d, key):
    return f(d, key, "%.1f", 1000)
print(f"{'round':>5}  {'plain':>8}  {'deps':>8}  ratio  statements/task  handler reads/task  "
      "mariadbd ms/1000  taskpushd ms/1000   (plain, deps)")
ratios, bad = [], 0
for r in sorted(runs):
    a, b = runs[r].get("taskpush-ll"), runs[r].get("taskpush-deps")
    if not a or not b:
        continue
    if not (a.get("verified") and b.get("verified")):
        bad += 1
        print(f"{r:>5}  a drain failed verification")
        continue
    ratio = b["tasks_per_s"] / a["tasks_per_s"]
    ratios.append(ratio)
    print(f"{r:>5}  {a['tasks_per_s']:>8.0f}  {b['tasks_per_s']:>8.0f}  {ratio:.3f}  "
          f"{f(a, 'statements_per_task', '%.4f')}, {f(b, 'statements_per_task', '%.4f')}  "
          f"{f(a, 'handler_reads_per_task', '%.1f')}, {f(b, 'handler_reads_per_task', '%.1f')}  "
          f"{ms(a, 'mariadbd_cpu_s_per_1000')}, {ms(b, 'mariadbd_cpu_s_per_1000')}  "
          f"{ms(a, 'taskpushd_cpu_s_per_1000')}, {ms(b, 'taskpushd_cpu_s_per_1000')}")
if ratios:
    print(f"median ratio {statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, highest "
          f"{max(ratios):.3f}) over {len(ratios)} rounds")
print(f"load average before: {before}; after: {after}")
print(f"JSON lines: {out}")
sys.exit(1 if bad else 0)
PY
exit "$rc"
