#!/usr/bin/env bash
# The README's commands for building its C worker against the build tree, taken from
# the README itself (the ```sh block after the line naming this script), so that the
# doc and the test cannot drift: run as they are in a folder holding `build` (the
# build tree) and `worker-client` (the sources), the program is built with the
# uninstalled taskpush.pc, needs libtaskpush.so.1 from build/worker-client, runs (a
# worker retrying its connection), and exits 0 on SIGTERM.
# Usage: readme-worker.sh SOURCE_ROOT BUILD_ROOT
set -u
src=${1:?usage: readme-worker.sh SOURCE_ROOT BUILD_ROOT}
build=${2:?usage: readme-worker.sh SOURCE_ROOT BUILD_ROOT}
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The block: from the line naming this script to the end of the fenced block after it.
block=$(awk '/tests\/install\/readme-worker\.sh/ { found = 1; next }
             found && /^```sh$/ { inside = 1; next }
             inside && /^```$/ { exit }
             inside { print }' "$src/README.md")
n=$(printf '%s\n' "$block" | grep -c .)
if [ "$n" -lt 2 ]; then
  echo "FAIL: README.md has no \`\`\`sh block after a line naming tests/install/readme-worker.sh"
  exit 1
fi
printf 'the README'"'"'s commands:\n%s\n' "$block"
build_cmds=$(printf '%s\n' "$block" | sed '$d')
run_cmd=$(printf '%s\n' "$block" | tail -n 1)

# Only the README's commands may point at the build tree (meson test sets
# LD_LIBRARY_PATH to it for every test).
unset LD_LIBRARY_PATH PKG_CONFIG_PATH
ln -s "$(cd "$build" && pwd)" "$work/build"
ln -s "$src/worker-client" "$work/worker-client"
cd "$work" || exit 1

# All but the last line: the build, in a shell of its own as a reader would type them.
if ! out=$(bash -euc "$build_cmds" 2>&1); then
  echo "$out"
  fail "the README's build commands failed"
else
  prog=$(printf '%s\n' "$run_cmd" | grep -oE '\./[A-Za-z0-9_-]+' | head -n 1)
  [ -n "$prog" ] && [ -x "$work/$prog" ] || fail "the README's last line runs '$prog', which the build did not make"
  readelf -d "$work/$prog" | grep -q 'NEEDED.*\[libtaskpush\.so\.1\]' || fail "$prog does not need libtaskpush.so.1"
  # The last line as it is (env runs it with its VAR=VALUE words; the background shell
  # is replaced by env, and env by the program, so that $! is the worker's pid).
  eval "exec env $run_cmd" >"$work/run.log" 2>&1 &
  pid=$!
  # Running: it logged (its first attempt to connect), and is still there a moment later.
  for _ in $(seq 1 50); do [ -s "$work/run.log" ] && break; sleep 0.1; done
  sleep 0.5
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"; rc=$?
    pid=""
    fail "the README's run line exited $rc at once: $(cat "$work/run.log")"
  else
    lib=$(grep -m1 libtaskpush "/proc/$pid/maps" | awk '{print $6}')
    [ "$lib" = "$(cd "$build" && pwd)/worker-client/libtaskpush.so.1.4.0" ] ||
      fail "the worker runs with '$lib', not the build tree's libtaskpush"
    kill -TERM "$pid"
    wait "$pid"; rc=$?
    pid=""
    [ $rc -eq 0 ] || fail "the worker exited $rc on SIGTERM: $(cat "$work/run.log")"
    echo "it ran with $lib; its log: $(head -n 2 "$work/run.log" | tr '\n' ' ')"
  fi
fi
# Without the README's PKG_CONFIG_PATH, and nothing installed, the build tree's library
# is not found: what the README's text says.
if (unset PKG_CONFIG_PATH; pkg-config --exists taskpush) 2>/dev/null; then
  echo "note: pkg-config finds an installed taskpush on this machine"
else
  echo "pkg-config taskpush without PKG_CONFIG_PATH: not found, as the README says"
fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "the README's commands build the C worker against the build tree, and it runs"
