#!/usr/bin/env bash
# `meson install` into a DESTDIR puts every file in its place: the programs, the shared
# library with its soname, the header and taskpush.pc, the manual pages, the docs, the
# schema and migrations, the example configuration file, the systemd unit and its
# sysusers.d file. Then a program is built against the installed header and library
# with pkg-config alone (worker-client/example_worker.c) and run, and the installed unit
# passes `systemd-analyze verify` (nothing is started) and a security threshold, and so
# does an instance of the worker's template taskpush-worker@.service.
# Usage: test-install.sh BUILD_DIR SOURCE_ROOT SANITIZE PREFIX BINDIR LIBDIR INCLUDEDIR
#                        MANDIR SYSCONFDIR DATADIR DOCDIR UNITDIR SYSUSERSDIR
set -u
if [ $# -ne 13 ]; then
  echo "usage: test-install.sh BUILD_DIR SOURCE_ROOT SANITIZE PREFIX BINDIR LIBDIR INCLUDEDIR MANDIR SYSCONFDIR DATADIR DOCDIR UNITDIR SYSUSERSDIR" >&2
  exit 2
fi
build=$1 src=$2 sanitize=$3 prefix=$4 bindir=$5 libdir=$6 includedir=$7 mandir=$8
sysconfdir=$9 datadir=${10} docdir=${11} unitdir=${12} sysusersdir=${13}
abs() { case $1 in /*) echo "$1" ;; *) echo "$prefix/$1" ;; esac; }
bindir=$(abs "$bindir") libdir=$(abs "$libdir") includedir=$(abs "$includedir")
mandir=$(abs "$mandir") sysconfdir=$(abs "$sysconfdir") datadir=$(abs "$datadir")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest=$work/dest
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

if ! meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$work/install.log" 2>&1; then
  cat "$work/install.log"
  echo "FAIL: meson install"
  exit 1
fi

# What a system install must hold, and of what kind (x: executable file, f: file,
# l: symbolic link).
expect() { # KIND PATH
  local p=$dest$2
  case $1 in
    x) [ -f "$p" ] && [ -x "$p" ] || fail "$2: not an executable file" ;;
    f) [ -f "$p" ] && [ ! -L "$p" ] && [ -s "$p" ] || fail "$2: not a non-empty file" ;;
    l) [ -L "$p" ] && [ -e "$p" ] || fail "$2: not a symbolic link to an installed file" ;;
  esac
}
for p in taskpushd taskpush-worker taskpushctl taskpush-bench taskpush-adopt; do expect x "$bindir/$p"; done
expect f "$libdir/libtaskpush.so.1.4.0"
expect l "$libdir/libtaskpush.so.1"
expect l "$libdir/libtaskpush.so"
expect f "$includedir/taskpush.h"
expect f "$libdir/pkgconfig/taskpush.pc"
expect f "$mandir/man8/taskpushd.8"
expect f "$mandir/man1/taskpush-worker.1"
expect f "$mandir/man1/taskpushctl.1"
expect f "$mandir/man1/taskpush-bench.1"
expect f "$mandir/man7/taskpush.7"
expect f "$mandir/man1/taskpush-adopt.1"
expect f "$sysconfdir/taskpush/taskpushd.conf"
expect f "$unitdir/taskpushd.service"
expect f "$unitdir/taskpush-worker@.service"
expect f "$sysusersdir/taskpush.conf"
expect f "$datadir/taskpush/sql/schema.sql"
for m in "$src"/sql/migrations/*.sql; do expect f "$datadir/taskpush/sql/migrations/$(basename "$m")"; done
for d in "$src"/docs/*.md "$src"/docs/*.png; do expect f "$docdir/$(basename "$d")"; done

soname=$(readelf -d "$dest$libdir/libtaskpush.so.1.4.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libtaskpush.so.1 ] || fail "the library's soname is '$soname', not libtaskpush.so.1"
[ "$(readlink "$dest$libdir/libtaskpush.so.1")" = libtaskpush.so.1.4.0 ] ||
  fail "libtaskpush.so.1 does not point to libtaskpush.so.1.4.0"
grep -qx "ExecStart=$bindir/taskpushd --config $sysconfdir/taskpush/taskpushd.conf" \
  "$dest$unitdir/taskpushd.service" || fail "the unit's ExecStart is not the installed taskpushd with the installed config file"
grep -qx "u taskpush .*" "$dest$sysusersdir/taskpush.conf" || fail "the sysusers.d file makes no user taskpush"
grep -qx "User=taskpush" "$dest$unitdir/taskpushd.service" || fail "the unit does not run as taskpush"
wunit=$dest$unitdir/taskpush-worker@.service
grep -qx "User=taskpush" "$wunit" || fail "the worker's unit does not run as taskpush"
grep -qx "EnvironmentFile=$sysconfdir/taskpush/worker-%i.env" "$wunit" ||
  fail "the worker's unit does not read $sysconfdir/taskpush/worker-%i.env"
grep -q "^ExecStart=$bindir/taskpush-worker .*--exec \${TASKPUSH_EXEC}\$" "$wunit" ||
  fail "the worker's unit does not run the installed taskpush-worker with --exec \${TASKPUSH_EXEC}"
# The same sandbox as taskpushd's: every hardening line of taskpushd.service is there.
grep -A100 '^# Hardening' "$dest$unitdir/taskpushd.service" | grep -E '^[A-Z][A-Za-z]+=' |
  grep -E -v '^(WantedBy)=' | while IFS= read -r line; do
    grep -qxF -- "$line" "$wunit" || echo "$line"
  done >"$work/hardening.missing"
[ -s "$work/hardening.missing" ] && fail "the worker's unit lacks taskpushd's hardening: $(tr '\n' ' ' <"$work/hardening.missing")"

# A worker built against what was installed, found through pkg-config alone: the
# DESTDIR is the sysroot of pkg-config's answer.
export PKG_CONFIG_PATH=$dest$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
if ! flags=$(pkg-config --cflags --libs taskpush 2>&1); then
  fail "pkg-config --cflags --libs taskpush: $flags"
else
  echo "pkg-config --cflags --libs taskpush: $flags"
  san=()
  [ "$sanitize" != none ] && san=(-fsanitize="$sanitize")
  # shellcheck disable=SC2086 # flags are pkg-config's words
  if ! ${CC:-cc} -std=c11 -Wall -Wextra -Werror "${san[@]}" -o "$work/example_worker" \
      "$src/worker-client/example_worker.c" $flags 2>"$work/cc.log"; then
    cat "$work/cc.log"
    fail "example_worker.c does not build against the installed header and library"
  else
    readelf -d "$work/example_worker" | grep -q 'NEEDED.*\[libtaskpush\.so\.1\]' ||
      fail "example_worker does not need libtaskpush.so.1"
    export LD_LIBRARY_PATH=$dest$libdir
    ldd "$work/example_worker" | grep -q "libtaskpush.so.1 => $dest$libdir/libtaskpush.so.1 " ||
      fail "example_worker does not load the installed libtaskpush.so.1: $(ldd "$work/example_worker" | grep taskpush)"
    # A bad address: tp_worker_new (in the library) refuses it, exit 2 with its message.
    out=$("$work/example_worker" 'no-port-here' 2>&1); rc=$?
    [ $rc -eq 2 ] && [ -n "${out#example_worker: }" ] && [ "$out" != "${out#example_worker: }" ] ||
      fail "example_worker with a bad address: exit $rc, '$out' (expected exit 2 and the library's reason)"
    # Nothing listening: it runs, retrying, until SIGTERM stops it cleanly (exit 0).
    "$work/example_worker" 127.0.0.1:1 >"$work/run.log" 2>&1 &
    pid=$!
    sleep 0.5
    kill -TERM $pid
    wait $pid; rc=$?
    [ $rc -eq 0 ] || fail "example_worker against nothing, then SIGTERM: exit $rc: $(cat "$work/run.log")"
    unset LD_LIBRARY_PATH
  fi
fi

# systemd-analyze verify of the installed unit. Its root is the DESTDIR plus a copy
# of this machine's units (the targets it names), so that ExecStart resolves to the
# installed taskpushd; --man=yes with MANPATH checks the installed Documentation= pages.
root=$work/root
cp -a "$dest" "$root"
mkdir -p "$root$unitdir"
cp -rn /lib/systemd/system/. "$root$unitdir/"
out=$(MANPATH=$root$mandir systemd-analyze verify --man=yes --root="$root" "$unitdir/taskpushd.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  fail "systemd-analyze verify taskpushd.service: exit $rc: $out"
else
  echo "systemd-analyze verify taskpushd.service: clean"
fi
# The worker's template, as an instance (systemd checks ExecStart only there) with an
# env file like the one its header describes. Nothing is started.
mkdir -p "$root$sysconfdir/taskpush"
printf '%s\n' TASKPUSH_CONNECT=127.0.0.1:7070 TASKPUSH_TYPES=resize \
  'TASKPUSH_EXEC=cat >/dev/null' >"$root$sysconfdir/taskpush/worker-demo.env"
out=$(MANPATH=$root$mandir systemd-analyze verify --man=yes --root="$root" \
        "$unitdir/taskpush-worker@demo.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
  fail "systemd-analyze verify taskpush-worker@demo.service: exit $rc: $out"
else
  echo "systemd-analyze verify taskpush-worker@demo.service: clean"
fi
# The hardening stays: systemd's exposure score (0-10, lower is safer) at most 2.0.
for u in taskpushd.service taskpush-worker@demo.service; do
  score=$(systemd-analyze security --offline=yes --threshold=20 --root="$root" \
            "$unitdir/$u" 2>&1); rc=$?
  echo "$score" | tail -n 1
  [ $rc -eq 0 ] || fail "systemd-analyze security $u: exposure above 2.0: $(echo "$score" | grep '✗')"
done

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "install into a DESTDIR: every file in place, example worker built with pkg-config and run, units verified"
