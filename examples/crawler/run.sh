#!/usr/bin/env bash
# run.sh: crawls every page reachable from START_URL on its host, with taskpush's task
# table as the frontier (examples/crawler/README.md).
#
#   examples/crawler/run.sh [--db URL] [--workers N] [--threads N] [--timeout S]
#                           [--attempts N] [--table NAME] START_URL
#
# Owns the setup around crawl.py: the build of taskpushd when the checkout has none
# (meson setup + ninja), and a private MariaDB (scripts/tp-mariadb, in a temporary
# directory removed at the end) when no --db is given. crawl.py does the rest and
# prints `crawled N pages` last. Exit status: 0 crawl finished, 1 failure, 2 bad usage.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ left in the checkout

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${TASKPUSH_BUILD_ROOT:-$root/build}

usage() {
  echo "usage: $0 [--db URL] [--workers N] [--threads N] [--timeout S] [--attempts N] [--table NAME] START_URL" >&2
  exit 2
}

db=
pass=()
while [ $# -gt 0 ]; do
  case $1 in
  --db)
    [ $# -ge 2 ] || usage
    db=$2
    shift 2
    ;;
  --db=*)
    db=${1#--db=}
    shift
    ;;
  --workers | --threads | --timeout | --attempts | --table)
    [ $# -ge 2 ] || usage
    pass+=("$1" "$2")
    shift 2
    ;;
  --workers=* | --threads=* | --timeout=* | --attempts=* | --table=*)
    pass+=("$1")
    shift
    ;;
  -h | --help)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  -*) usage ;;
  *) break ;;
  esac
done
[ $# -eq 1 ] || usage
start_url=$1
db_arg=()
[ -n "$db" ] && db_arg=(--db "$db")
# Bad flags and a bad START_URL exit 2 here, before a build or a database start.
python3 "$here/crawl.py" --check "${db_arg[@]}" "${pass[@]}" -- "$start_url"

if [ ! -x "$build/dispatcher/taskpushd" ]; then
  echo "crawl: building taskpushd in $build" >&2
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" >&2
  fi
  ninja -C "$build" -j2 dispatcher/taskpushd >&2 # -j2: kind to a shared machine
fi

dbdir=
cleanup() {
  if [ -n "$dbdir" ]; then
    "$root/scripts/tp-mariadb" stop "$dbdir" >/dev/null 2>&1 || true
    rm -rf "$dbdir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "$db" ]; then
  # A short path: the server's unix socket lives in it (108 bytes at most).
  dbdir=$(mktemp -d /tmp/tp-crawl-db.XXXXXX)
  env_lines=$("$root/scripts/tp-mariadb" start "$dbdir" --database crawl)
  db=$(printf '%s\n' "$env_lines" | sed -n 's/^export TASKPUSH_DB=//p')
  [ -n "$db" ] || {
    echo "crawl: the private MariaDB gave no URL" >&2
    exit 1
  }
fi

export TASKPUSH_BUILD_ROOT=$build
python3 "$here/crawl.py" --db "$db" "${pass[@]}" -- "$start_url"
