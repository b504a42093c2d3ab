#!/usr/bin/env bash
# scripts/package.sh builds the four Debian packages with debhelper and dpkg-buildpackage,
# lintian-clean but for the tags packaging/README.md explains (package.sh fails
# otherwise); then each package holds what it should (dpkg-deb -c) and depends as it
# should (dpkg-deb -f), and taskpushd's scripts create its user and leave the unit off.
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

holds taskpushd /usr/bin/taskpushd /usr/bin/taskpushctl /usr/bin/taskpush-bench \
  /etc/taskpush/taskpushd.conf /lib/systemd/system/taskpushd.service \
  /usr/lib/sysusers.d/taskpush.conf /usr/share/man/man8/taskpushd.8.gz \
  /usr/share/man/man1/taskpushctl.1.gz /usr/share/man/man1/taskpush-bench.1.gz \
  /usr/share/man/man7/taskpush.7.gz /usr/share/taskpush/sql/schema.sql \
  /usr/share/doc/taskpushd/copyright /usr/share/doc/taskpushd/taskpushd.md.gz
for m in "$root"/sql/migrations/*.sql; do holds taskpushd "/usr/share/taskpush/sql/migrations/$(basename "$m")"; done
holds taskpush-worker /usr/bin/taskpush-worker /usr/share/man/man1/taskpush-worker.1.gz
holds libtaskpush1 "/usr/lib/$arch/libtaskpush.so.1.1.0" "/usr/lib/$arch/libtaskpush.so.1"
holds libtaskpush-dev /usr/include/taskpush.h "/usr/lib/$arch/libtaskpush.so" \
  "/usr/lib/$arch/pkgconfig/taskpush.pc" "/usr/lib/$arch/libtaskpush.a"
holds_not libtaskpush1 '\.(h|pc|a)$|libtaskpush\.so$|/bin/'
holds_not libtaskpush-dev '\.so\.1|/bin/'
holds_not taskpush-worker 'taskpushd|\.so'
holds_not taskpushd 'taskpush-worker|\.so|/include/'

dpkg-deb -f "$(deb taskpush-worker)" Depends | grep -q 'libtaskpush1' ||
  fail "taskpush-worker does not depend on libtaskpush1"
dpkg-deb -f "$(deb libtaskpush-dev)" Depends | grep -qF 'libtaskpush1 (= ' ||
  fail "libtaskpush-dev does not depend on the same version of libtaskpush1"
[ "$(dpkg-deb -f "$(deb libtaskpush1)" Multi-Arch)" = same ] || fail "libtaskpush1 is not Multi-Arch: same"

ctrl=$out/ctrl
dpkg-deb -e "$(deb taskpushd)" "$ctrl"
grep -qx /etc/taskpush/taskpushd.conf "$ctrl/conffiles" || fail "taskpushd.conf is not a conffile"
grep -q 'systemd-sysusers.*taskpush.conf' "$ctrl/postinst" || fail "taskpushd's postinst does not create the user"
# Installed disabled: the only enable is the one that keeps an admin's earlier choice.
enables=$(grep -c 'deb-systemd-helper enable' "$ctrl/postinst")
kept=$(grep -A2 'deb-systemd-helper --quiet was-enabled' "$ctrl/postinst" | grep -c 'deb-systemd-helper enable')
[ "$enables" -eq "$kept" ] || fail "taskpushd's postinst enables the unit on a first install"
grep -q 'deb-systemd-invoke.*start' "$ctrl/postinst" && fail "taskpushd's postinst starts the unit"
mkdir "$ctrl/lib"
dpkg-deb --fsys-tarfile "$(deb libtaskpush1)" | tar -x -C "$ctrl/lib"
soname=$(readelf -d "$ctrl/lib/usr/lib/$arch/libtaskpush.so.1.1.0" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libtaskpush.so.1 ] || fail "libtaskpush1's library has soname '$soname'"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "4 packages built, lintian-clean but for the explained tags, contents and dependencies as expected"
