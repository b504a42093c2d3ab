#!/usr/bin/env bash
# The main job, from a fresh clone: installs what is missing, builds, starts a
# private throwaway MariaDB, loads sql/schema.sql, inserts demo tasks as a
# producer would (plain SQL), and shows the table. Stops the database at exit.
#
#   scripts/demo.sh [--tasks N]      (default 2000)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tasks=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --tasks) tasks=${2:?--tasks needs a number}; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$tasks" in ''|*[!0-9]*) echo "demo.sh: --tasks needs a whole number" >&2; exit 2 ;; esac

scripts/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null

work=$(mktemp -d /tmp/taskpush-demo.XXXXXX)
trap 'scripts/tp-mariadb stop "$work/mariadb" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
eval "$(scripts/tp-mariadb start "$work/mariadb" --database taskpush)"
sql() { mariadb --no-defaults -S "$TASKPUSH_TEST_MYSQL_SOCKET" -u "$TASKPUSH_TEST_MYSQL_USER" taskpush "$@"; }
echo "MariaDB ready at $TASKPUSH_DB"

# A producer needs nothing but SQL: one multi-row INSERT per 500 tasks.
python3 - "$tasks" <<'PY' | sql
import sys
n = int(sys.argv[1]); types = ["resize", "email", "report"]
for start in range(0, n, 500):
    rows = [f"('{types[i % 3]}', {i % 3}, '{{\"n\":{i}}}')" for i in range(start, min(n, start + 500))]
    print("INSERT INTO task (task_type, task_priority, payload) VALUES " + ",".join(rows) + ";")
PY
echo "inserted $tasks demo tasks; the table now holds:"
sql -t -e "SELECT task_type, task_priority, task_state, COUNT(*) AS tasks FROM task GROUP BY 1, 2, 3 ORDER BY 1, 2 DESC"
