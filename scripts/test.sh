#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what is missing, builds
# three trees (gcc; gcc with ASan+UBSan; clang with libFuzzer), starts a private
# MariaDB, runs every suite in both gcc builds plus a short fuzz run, stops the
# database, and ends with one line "N passed, N failed". The list of every case
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

scripts/install-deps.sh --test || { echo "test.sh: could not install dependencies" >&2; echo "0 passed, 1 failed"; exit 1; }

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

db_dir="$work/mariadb"
cleanup() {
  scripts/tp-mariadb stop "$db_dir" >/dev/null 2>&1 || true
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

if step mariadb-start scripts/tp-mariadb start "$db_dir" >"$work/db.env"; then
  set -a; . "$work/db.env"; set +a
fi

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
for dir in "${built[@]}"; do
  mult=1
  [ "$dir" = build-asan ] && mult=3
  echo "== meson test ($dir)"
  meson test -C "$dir" --print-errorlogs --timeout-multiplier $mult --num-processes 2 \
    >"$work/test-$dir.log" 2>&1
  grep -E '^ *[0-9]+/[0-9]+ ' "$work/test-$dir.log" || tail -n 40 "$work/test-$dir.log"
  grep -A40 -E '^=+ [0-9]+/[0-9]+ =+$' "$work/test-$dir.log" | head -n 200
  logs+=("$dir/meson-logs/testlog.json")
done

if [ $quick -eq 0 ] && [ -x build-fuzz/tests/fuzz/fuzz_frame ]; then
  # NAME:RUNS:MAX_LEN:CORPUS, a few seconds each (admin and hello run a server per
  # input). On a copy of the corpus: libFuzzer adds what it finds to it. A crash leaves
  # its input in the repository's root as crash-<sha1>, for build/tests/fuzz/fuzz_NAME_replay.
  for spec in frame:200000:4096:corpus config:50000:8192:corpus-config \
              dburl:50000:1024:corpus-dburl admin:20000:4096:corpus-admin \
              hello:20000:20000:corpus-hello; do
    IFS=: read -r name runs max_len corpus <<<"$spec"
    echo "== fuzz run ($name)"
    cp -r "tests/fuzz/$corpus" "$work/fuzz-$name"
    step "fuzz-$name" "build-fuzz/tests/fuzz/fuzz_$name" -runs="$runs" -max_len="$max_len" -seed=1 \
      "$work/fuzz-$name" >"$work/fuzz-$name.log" 2>&1 || tail -n 40 "$work/fuzz-$name.log"
    grep -E "^Done [0-9]+ runs" "$work/fuzz-$name.log" || true
  done
fi

step mariadb-stop scripts/tp-mariadb stop "$db_dir" >/dev/null

echo "== summary"
python3 scripts/test-summary.py --cases test-cases.txt "${logs[@]}" "$steps"
