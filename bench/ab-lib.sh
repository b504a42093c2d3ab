# ab-lib.sh: what the A/B scripts of bench/ (deps-ab.sh, group-keys-ab.sh) share, sourced
# by them: their numeric arguments checked, the build made, and a private MariaDB
# (scripts/tp-mariadb) in a temporary directory that goes when the script ends.

# ab_positive SCRIPT VALUE...: exit 2 naming the first VALUE that is not a positive number.
ab_positive() {
  local script=$1 v
  shift
  for v in "$@"; do
    if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
      echo "$script: '$v' is not a positive number" >&2
      exit 2
    fi
  done
}

# ab_setup TAG: sets root and build (TASKPUSH_BUILD_DIR, default ROOT/build), enters root,
# builds taskpush-bench and taskpushd, starts a private MariaDB in $work (the
# TASKPUSH_TEST_MYSQL_* environment) and sets out to bench/results/DATE-HHMMSS-HOST-TAG.jsonl.
ab_setup() {
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  build=${TASKPUSH_BUILD_DIR:-$root/build}
  cd "$root"
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" >/dev/null
  fi
  ninja -C "$build" -j2 bench/taskpush-bench dispatcher/taskpushd >/dev/null
  work=$(mktemp -d "${TMPDIR:-/tmp}/taskpush-$1.XXXXXX")
  trap ab_cleanup EXIT
  eval "$(scripts/tp-mariadb start "$work/db")" >/dev/null
  out="bench/results/$(date -u +%Y-%m-%d-%H%M%S)-$(hostname -s)-$1.jsonl"
  mkdir -p bench/results
}

ab_cleanup() {
  scripts/tp-mariadb stop "$work/db" >/dev/null 2>&1 || true
  rm -rf "$work"
}
