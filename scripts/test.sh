#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what is missing, builds
# three trees (gcc; gcc with ASan+UBSan; clang with libFuzzer), runs every suite
# in both gcc builds at the same time, each against a private MariaDB of its own
# (tests change server-wide settings such as the general log, so two suites never
# share a server), then a short fuzz run, stops the databases, and ends with one
# line "N passed, N failed". TASKPUSH_TEST_SERIAL=1 runs the two suites one after
# the other instead (slower; for a machine too loaded to run both). The list of every case
# by name goes to test-cases.txt in the repository's root (format in
# scripts/test-summary.py; compare two runs with scripts/compare-cases.sh).
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    gcc build only (no sanitizer build, no fuzz run)
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
  *) echo "test.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

{ scripts/install-deps.sh --test && scripts/install-deps.sh --peer; } || { echo "test.sh: could not install dependencies" >&2; echo "0 passed, 1 failed"; exit 1; }

work=$(mktemp -d /tmp/taskpush-test.XXXXXX)
steps="$work/steps.txt"   # results of steps that are not meson tests
: >"$steps"
logs=()

step() { # step NAME COMMAND...: run a command, record it as one result
  local name=$1; shift
  if "$@"; then echo "$name ok" >>"$steps"; return 0; fi
  echo "$name fail" >>"$steps"; return 1
}

setup_build() { # setup_build DIR [meson options...]
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$work/setup-$dir.log" 2>&1 || { cat "$work/setup-$dir.log" >&2; return 1; }
  fi
  ninja -C "$dir" >"$work/ninja-$dir.log" 2>&1 || { tail -n 60 "$work/ninja-$dir.log" >&2; return 1; }
}

cleanup() {
  local d
  for d in "$work"/mariadb-*; do
    [ -d "$d" ] && scripts/tp-mariadb stop "$d" >/dev/null 2>&1
  done
  rm -rf "$work"
}
trap cleanup EXIT

built=()
step build-gcc setup_build build && built+=(build)
if [ $quick -eq 0 ]; then
  step build-asan setup_build build-asan -Db_sanitize=address,undefined \
    -Dc_args=-fno-sanitize-recover=all -Db_lundef=false && built+=(build-asan)
  CC=clang step build-fuzz setup_build build-fuzz -Dfuzz=true -Dtests=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false
fi

start_databases() { # one server per build, so that the suites can run side by side
  local dir
  for dir in "${built[@]}"; do
    scripts/tp-mariadb start "$work/mariadb-$dir" >"$work/db-$dir.env" || return 1
  done
}
step mariadb-start start_databases

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
run_suite() { # run_suite DIR: every meson test of one build, against its own server
  local dir=$1 mult=1
  [ "$dir" = build-asan ] && mult=3
  (
    set -a; [ -f "$work/db-$dir.env" ] && . "$work/db-$dir.env"; set +a
    meson test -C "$dir" --print-errorlogs --timeout-multiplier $mult --num-processes 2 \
      >"$work/test-$dir.log" 2>&1
  )
}
pids=()
for dir in "${built[@]}"; do
  echo "== meson test ($dir) started $(date -u +%H:%M:%S)"
  if [ "${TASKPUSH_TEST_SERIAL:-0}" = 1 ]; then run_suite "$dir"; else run_suite "$dir" & pids+=($!); fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
for dir in "${built[@]}"; do
  echo "== meson test ($dir) results"
  grep -E '^ *[0-9]+/[0-9]+ ' "$work/test-$dir.log" || tail -n 40 "$work/test-$dir.log"
  grep -A40 -E '^=+ [0-9]+/[0-9]+ =+$' "$work/test-$dir.log" | head -n 200
  logs+=("$dir/meson-logs/testlog.json")
done
echo "== suites done $(date -u +%H:%M:%S)"

if [ $quick -eq 0 ] && [ -x build-fuzz/tests/fuzz/fuzz_frame ]; then
  # NAME:RUNS:MAX_LEN:CORPUS, a few seconds each (admin and hello run a server per
  # input). On a copy of the corpus: libFuzzer adds what it finds to it. A crash leaves
  # its input in the repository's root as crash-<sha1>, for build/tests/fuzz/fuzz_NAME_replay.
  for spec in frame:200000:4096:corpus config:50000:8192:corpus-config \
              dburl:50000:1024:corpus-dburl admin:20000:4096:corpus-admin \
              hello:20000:20000:corpus-hello binlog:200000:4096:corpus-binlog; do
    IFS=: read -r name runs max_len corpus <<<"$spec"
    echo "== fuzz run ($name)"
    cp -r "tests/fuzz/$corpus" "$work/fuzz-$name"
    step "fuzz-$name" "build-fuzz/tests/fuzz/fuzz_$name" -runs="$runs" -max_len="$max_len" -seed=1 \
      "$work/fuzz-$name" >"$work/fuzz-$name.log" 2>&1 || tail -n 40 "$work/fuzz-$name.log"
    grep -E "^Done [0-9]+ runs" "$work/fuzz-$name.log" || true
  done
fi

stop_databases() {
  local dir rc=0
  for dir in "${built[@]}"; do
    scripts/tp-mariadb stop "$work/mariadb-$dir" >/dev/null || rc=1
  done
  return $rc
}
step mariadb-stop stop_databases

echo "== summary"
python3 scripts/test-summary.py --cases test-cases.txt "${logs[@]}" "$steps"
