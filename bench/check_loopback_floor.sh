#!/usr/bin/env bash
# loopback-floor runs, moves round trips both ways and reports a CPU figure; a bad
# argument exits 2 (bench/README.md, "Other tools"). No timing is asserted.
set -u
floor=${1:?usage: check_loopback_floor.sh PATH-TO-loopback-floor}
fail=0

out=$("$floor" 8 4 1 2 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: 'loopback-floor 8 4 1 2' exited $rc: $out"; fail=1
elif ! [[ "$out" =~ :\ ([1-9][0-9]*)\ round\ trips ]]; then
  echo "FAIL: no round trips reported: $out"; fail=1
elif ! [[ "$out" =~ both\ [0-9]+\.[0-9]+ ]]; then
  echo "FAIL: no CPU a task reported: $out"; fail=1
else
  echo "ok: $out" | head -1
fi

out=$("$floor" 4 256 1 1 20000 2>&1); rc=$?
if [ $rc -ne 0 ] || ! [[ "$out" =~ :\ ([1-9][0-9]*)\ round\ trips ]]; then
  echo "FAIL: paced run 'loopback-floor 4 256 1 1 20000' exited $rc: $out"; fail=1
else
  trips=${BASH_REMATCH[1]}
  # Paced at 20,000 tasks/s for 1 s: about 78 trips of 256 tasks, never thousands.
  if [ "$trips" -gt 1000 ]; then
    echo "FAIL: paced to 20,000 tasks/s, it made $trips round trips of 256"; fail=1
  else
    echo "ok: paced, $trips round trips"
  fi
fi

for bad in "0" "x" "5000" "8 0" "8 4 0"; do
  # shellcheck disable=SC2086
  "$floor" $bad >/dev/null 2>&1; rc=$?
  if [ $rc -ne 2 ]; then
    echo "FAIL: 'loopback-floor $bad' exited $rc, not 2"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "ok: bad arguments exit 2"
exit $fail
