#!/usr/bin/env bash
# group-keys-ab.sh: the drain with group keys beside the same drain without, in one run
# (issue 35: K=64 with 1,000 keys within 15 % of the keyless drain). On one private
# MariaDB (scripts/tp-mariadb), ROUNDS rounds, each one drain without keys and one with
# --group-keys KEYS (the order alternating, so that a drift of the machine does not always
# fall on one), and prints each round's pair and their ratio, then the median ratio:
# absolute figures move by a third on a shared machine, the ratio within a round holds.
#   bench/group-keys-ab.sh                      7 rounds, K=64, 1,000 keys, N=30,000
#   bench/group-keys-ab.sh 5 64 1000 50000      ROUNDS K KEYS N
#   GROUP_KEYS_AB_ARGS="--taskpushd PATH"       more arguments for every drain (word-split)
# Writes the JSON lines to bench/results/DATE-HHMMSS-HOST-group-keys.jsonl. Exit 1 when a drain
# failed verification.
set -euo pipefail
rounds=${1:-7}
k=${2:-64}
keys=${3:-1000}
n=${4:-30000}
# shellcheck source=bench/ab-lib.sh
. "$(dirname "$0")/ab-lib.sh"
ab_positive group-keys-ab.sh "$rounds" "$k" "$keys" "$n"
ab_setup group-keys
: >"$out"

for r in $(seq "$rounds"); do
  order="0 $keys"
  [ $((r % 2)) = 0 ] && order="$keys 0"
  for g in $order; do
    # shellcheck disable=SC2086
    "$build/bench/taskpush-bench" --design taskpush-ll --k "$k" --n "$n" --repeat 1 \
      --group-keys "$g" --json-only ${GROUP_KEYS_AB_ARGS:-} >"$work/run.$g.json"
    grep -q '"verified":true' "$work/run.$g.json" || {
      echo "group-keys-ab.sh: the drain with --group-keys $g failed verification" >&2
      cat "$work/run.$g.json" >&2
      exit 1
    }
    cat "$work/run.$g.json" >>"$out"
  done
done

python3 - "$out" "$keys" "$(cat /proc/loadavg)" <<'EOF'
import json, statistics, sys
out, keys, load = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = None
pairs, cur = [], {}
for line in open(out):
    d = json.loads(line)
    if d.get("kind") == "settings":
        settings = d
        g = d.get("group_keys", 0)
    elif d.get("kind") == "run":
        cur[g] = d
        if len(cur) == 2:
            pairs.append((cur[0], cur[keys]))
            cur = {}
def f(d, key, fmt):
    v = d.get(key)
    return fmt % v if isinstance(v, (int, float)) else "-"
print(f"{'round':>5}  {'keyless':>9}  {'keyed':>9}  ratio  mariadbd s/1000 (keyless, keyed)  handler reads/task")
ratios = []
for i, (a, b) in enumerate(pairs, 1):
    ratio = b["tasks_per_s"] / a["tasks_per_s"]
    ratios.append(ratio)
    print(f"{i:>5}  {a['tasks_per_s']:>9.0f}  {b['tasks_per_s']:>9.0f}  {ratio:.3f}  "
          f"{f(a, 'mariadbd_cpu_s_per_1000', '%.4f')}, {f(b, 'mariadbd_cpu_s_per_1000', '%.4f')}"
          f"            {f(a, 'handler_reads_per_task', '%.2f')}, {f(b, 'handler_reads_per_task', '%.2f')}")
print(f"median ratio {statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, highest "
      f"{max(ratios):.3f}) over {len(ratios)} rounds; load average at the end: {load}")
print(f"JSON lines: {out}")
EOF
