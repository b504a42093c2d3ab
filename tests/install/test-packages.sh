#!/usr/bin/env bash
# scripts/package.sh builds the six Debian packages with debhelper and dpkg-buildpackage,
# lintian-clean but for the tags packaging/README.md explains (package.sh fails
# otherwise), and the Python library's wheel; then each package holds what it should
# (dpkg-deb -c) and depends as it should (dpkg-deb -f, -I): no database server pulled
# onto a dispatcher host, the bench in a package of its own, the worker's template unit
# in the worker's package (systemd-analyze verify of an instance: nothing is started),
# the Python library importable from its .deb and from the wheel; and the maintainer
# scripts create the user and leave the units off.
# Usage: test-packages.sh SOURCE_ROOT
set -u
root=${1:?usage: test-packages.sh SOURCE_ROOT}
out=$(mktemp -d /tmp/taskpush-debs.XXXXXX)
trap 'rm -rf "$out"' EXIT
if ! "$root/scripts/package.sh" "$out" >"$out/package.log" 2>&1; then
  tail -n 60 "$out/package.log"
  echo "FAIL: scripts/package.sh"
  exit 1
fi
grep 'package.sh: lintian' "$out/package.log"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

deb() { # the .deb of package $1
  local f=("$out/$1"_*.deb)
  [ -f "${f[0]}" ] || { fail "no package $1"; echo /dev/null; return; }
  echo "${f[0]}"
}
holds() { # PACKAGE PATH...: each path is in the package (a file, or a link with ->)
  local pkg=$1 list
  shift
  list=$(dpkg-deb -c "$(deb "$pkg")" | awk '{print $6}' | sed 's,^\./,/,')
  for p in "$@"; do
    printf '%s\n' "$list" | grep -qxF "$p" || fail "$pkg does not hold $p"
  done
}
holds_not() { # PACKAGE REGEX: no path of the package matches
  local hit
  hit=$(dpkg-deb -c "$(deb "$1")" | awk '{print $6}' | grep -E "$2")
  [ -z "$hit" ] || fail "$1 holds $hit"
}

holds taskpushd /usr/bin/taskpushd /usr/bin/taskpushctl /usr/bin/taskpush-adopt \
  /usr/share/man/man1/taskpush-adopt.1.gz /etc/taskpush/taskpushd.conf /lib/systemd/system/taskpushd.service \
  /usr/lib/sysusers.d/taskpush.conf /usr/share/man/man8/taskpushd.8.gz \
  /usr/share/man/man1/taskpushctl.1.gz \
  /usr/share/man/man7/taskpush.7.gz /usr/share/taskpush/sql/schema.sql \
  /usr/share/doc/taskpushd/copyright /usr/share/doc/taskpushd/taskpushd.md.gz
for m in "$root"/sql/migrations/*.sql; do holds taskpushd "/usr/share/taskpush/sql/migrations/$(basename "$m")"; done
holds taskpush-worker /usr/bin/taskpush-worker /usr/share/man/man1/taskpush-worker.1.gz \
  "/lib/systemd/system/taskpush-worker@.service" /usr/lib/sysusers.d/taskpush-worker.conf
holds taskpush-bench /usr/bin/taskpush-bench /usr/share/man/man1/taskpush-bench.1.gz
pydir=/usr/lib/python3/dist-packages
holds python3-taskpush $pydir/taskpush/py.typed $pydir/taskpush-0.1.0.dist-info/METADATA
for m in "$root"/python/taskpush/*.py; do holds python3-taskpush "$pydir/taskpush/$(basename "$m")"; done
holds libtaskpush1 "/usr/lib/$arch/libtaskpush.so.1.4.0" "/usr/lib/$arch/libtaskpush.so.1"
holds libtaskpush-dev /usr/include/taskpush.h "/usr/lib/$arch/libtaskpush.so" \
  "/usr/lib/$arch/pkgconfig/taskpush.pc" "/usr/lib/$arch/libtaskpush.a"
holds_not libtaskpush1 '\.(h|pc|a)$|libtaskpush\.so$|/bin/'
holds_not libtaskpush-dev '\.so\.1|/bin/'
holds_not taskpush-worker 'bin/taskpushd|bin/taskpushctl|bin/taskpush-bench|taskpushd\.service|\.so'
holds_not taskpushd 'taskpush-worker|taskpush-bench|\.so|/include/|python'
holds_not taskpush-bench 'bin/taskpushd|bin/taskpush-worker|\.service|\.so'
holds_not python3-taskpush '/bin/|\.so|\.service'

dpkg-deb -f "$(deb taskpush-worker)" Depends | grep -q 'libtaskpush1' ||
  fail "taskpush-worker does not depend on libtaskpush1"
dpkg-deb -f "$(deb libtaskpush-dev)" Depends | grep -qF 'libtaskpush1 (= ' ||
  fail "libtaskpush-dev does not depend on the same version of libtaskpush1"
[ "$(dpkg-deb -f "$(deb libtaskpush1)" Multi-Arch)" = same ] || fail "libtaskpush1 is not Multi-Arch: same"
# A dispatcher host talks to a database elsewhere: a server is at most suggested
# (dpkg-deb -I shows the whole control file).
info=$(dpkg-deb -I "$(deb taskpushd)")
printf '%s\n' "$info" | grep -E '^ (Pre-)?(Depends|Recommends):' | grep -E 'mysql-server|mariadb-server' &&
  fail "taskpushd depends on or recommends a database server"
printf '%s\n' "$info" | grep -q '^ Suggests:.*default-mysql-server' ||
  fail "taskpushd does not suggest default-mysql-server"
dpkg-deb -f "$(deb taskpush-bench)" Depends | grep -qF 'taskpushd (= ' ||
  fail "taskpush-bench does not depend on the same version of taskpushd (it starts it)"
dpkg-deb -f "$(deb taskpushd)" Depends Recommends | grep -q 'taskpush-bench' &&
  fail "taskpushd pulls taskpush-bench in"
dpkg-deb -f "$(deb python3-taskpush)" Depends | grep -q 'python3' ||
  fail "python3-taskpush does not depend on python3"
[ "$(dpkg-deb -f "$(deb python3-taskpush)" Architecture)" = all ] || fail "python3-taskpush is not Architecture: all"

ctrl=$out/ctrl
dpkg-deb -e "$(deb taskpushd)" "$ctrl"
grep -qx /etc/taskpush/taskpushd.conf "$ctrl/conffiles" || fail "taskpushd.conf is not a conffile"
grep -q 'systemd-sysusers.*taskpush.conf' "$ctrl/postinst" || fail "taskpushd's postinst does not create the user"
# Installed disabled: the only enable is the one that keeps an admin's earlier choice.
enables=$(grep -c 'deb-systemd-helper enable' "$ctrl/postinst")
kept=$(grep -A2 'deb-systemd-helper --quiet was-enabled' "$ctrl/postinst" | grep -c 'deb-systemd-helper enable')
[ "$enables" -eq "$kept" ] || fail "taskpushd's postinst enables the unit on a first install"
grep -q 'deb-systemd-invoke.*start' "$ctrl/postinst" && fail "taskpushd's postinst starts the unit"
# The worker's package: its postinst creates the same user (its own sysusers.d file, the
# same line, so either package may be installed alone) and neither enables nor starts
# anything.
wctrl=$out/wctrl
dpkg-deb -e "$(deb taskpush-worker)" "$wctrl"
grep -q 'systemd-sysusers.*taskpush-worker.conf' "$wctrl/postinst" || fail "taskpush-worker's postinst does not create the user"
grep -qE 'deb-systemd-(helper enable|invoke)' "$wctrl/postinst" && fail "taskpush-worker's postinst enables or starts a unit"
mkdir "$ctrl/lib"
dpkg-deb --fsys-tarfile "$(deb libtaskpush1)" | tar -x -C "$ctrl/lib"
soname=$(readelf -d "$ctrl/lib/usr/lib/$arch/libtaskpush.so.1.4.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libtaskpush.so.1 ] || fail "libtaskpush1's library has soname '$soname'"

# The packaged template, as an instance with an env file, in a root made of the
# worker's and the library's packages and this machine's units: systemd-analyze verify
# says nothing (it starts nothing).
sroot=$out/sroot
mkdir -p "$sroot"
for p in taskpush-worker libtaskpush1; do dpkg-deb --fsys-tarfile "$(deb "$p")" | tar -x -C "$sroot"; done
cmp -s <(grep '^u ' "$sroot/usr/lib/sysusers.d/taskpush-worker.conf") <(grep '^u ' "$root/packaging/taskpush.sysusers") ||
  fail "taskpush-worker's sysusers.d line differs from taskpushd's"
cp -rn /lib/systemd/system/. "$sroot/lib/systemd/system/"
mkdir -p "$sroot/etc/taskpush"
printf '%s\n' TASKPUSH_CONNECT=10.0.0.5:7070 TASKPUSH_TYPES=resize 'TASKPUSH_EXEC=cat >/dev/null' \
  >"$sroot/etc/taskpush/worker-demo.env"
grep -qx 'EnvironmentFile=/etc/taskpush/worker-%i.env' "$sroot/lib/systemd/system/taskpush-worker@.service" ||
  fail "the packaged worker unit does not read /etc/taskpush/worker-%i.env"
grep -q '^ExecStart=/usr/bin/taskpush-worker ' "$sroot/lib/systemd/system/taskpush-worker@.service" ||
  fail "the packaged worker unit does not run /usr/bin/taskpush-worker"
vout=$(systemd-analyze verify --man=no --root="$sroot" /lib/systemd/system/taskpush-worker@demo.service 2>&1)
rc=$?
[ $rc -eq 0 ] && [ -z "$vout" ] || fail "systemd-analyze verify of the packaged taskpush-worker@demo.service: exit $rc: $vout"

# The Python library: from its .deb's files and from the wheel (a zip on PYTHONPATH),
# Debian's python3 imports the version the sources say.
want=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$root/python/taskpush/__init__.py")
mkdir "$out/py"
dpkg-deb --fsys-tarfile "$(deb python3-taskpush)" | tar -x -C "$out/py"
got=$(cd / && PYTHONPATH=$out/py$pydir /usr/bin/python3 -c 'import taskpush; print(taskpush.__version__, taskpush.__file__)' 2>&1)
[ "${got%% *}" = "$want" ] && [ "${got#*"$out/py$pydir/taskpush/"}" != "$got" ] ||
  fail "python3-taskpush: import taskpush gives '$got', not $want from the package's files"
whl=("$out"/taskpush-"$want"-py3-none-any.whl)
if [ ! -f "${whl[0]}" ]; then
  fail "no wheel taskpush-$want-py3-none-any.whl"
else
  got=$(cd / && PYTHONPATH=${whl[0]} /usr/bin/python3 -c 'import taskpush; print(taskpush.__version__, taskpush.__file__)' 2>&1)
  [ "${got%% *}" = "$want" ] && [ "${got#*"${whl[0]}"}" != "$got" ] ||
    fail "the wheel: import taskpush gives '$got'"
  list=$(/usr/bin/python3 -m zipfile -l "${whl[0]}")
  printf '%s\n' "$list" | grep -q '^taskpush/py.typed ' || fail "the wheel lacks taskpush/py.typed"
fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "6 packages and the wheel built, lintian-clean but for the explained tags, contents and dependencies as expected, the worker unit verified"
