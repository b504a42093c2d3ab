#!/usr/bin/env bash
# Builds the Debian packages taskpushd, taskpush-worker, taskpush-bench, libtaskpush1,
# libtaskpush-dev and python3-taskpush with Debian's own tools (debhelper,
# dpkg-buildpackage, pybuild), runs lintian on them, builds the Python library's wheel
# (offline: python3 -m build --no-isolation, with Debian's setuptools and wheel), and
# puts the .deb files and the wheel (with build.log and lintian.txt) in OUTDIR.
#
#   scripts/package.sh OUTDIR            build, lintian, copy the .deb files to OUTDIR
#   scripts/package.sh --no-lintian OUTDIR
#
# It builds in a temporary copy of the work tree (the files git tracks or would track),
# with packaging/debian as its debian/ folder, so the tree itself is left as it was.
# Lintian's tags that remain, each with its reason, are listed in packaging/README.md;
# any tag not listed there fails the script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lintian=1
case "${1:-}" in
  --no-lintian) lintian=0; shift ;;
  -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
esac
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: scripts/package.sh [--no-lintian] OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)

"$root/scripts/install-deps.sh" --package

version=$(sed -n "s/^ *version : '\([^']*\)',/\1/p" "$root/meson.build" | head -n 1)
deb_version=$(cd "$root/packaging" && dpkg-parsechangelog -l debian/changelog -S Version)
if [ "$version" != "$deb_version" ]; then
  echo "package.sh: meson.build says version $version, packaging/debian/changelog $deb_version" >&2
  exit 1
fi

work=$(mktemp -d /tmp/taskpush-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$work/taskpush-$version
mkdir -p "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
  (cd "$root" && xargs -0 cp --parents -t "$src" 2>/dev/null || true)
rm -rf "$src/debian"
cp -a "$root/packaging/debian" "$src/debian"
cp "$root/packaging/taskpush.sysusers" "$src/debian/taskpushd.taskpush.sysusers"
cp "$root/packaging/taskpush.sysusers" "$src/debian/taskpush-worker.sysusers"
# The library's symbols file, from the list the build checks the exports against
# (worker-client/taskpush.sym), each symbol as of this version.
{
  echo "libtaskpush.so.1 libtaskpush1 #MINVER#"
  echo "* Build-Depends-Package: libtaskpush-dev"
  grep -v '^#' "$root/worker-client/taskpush.sym" | grep . | sort |
    sed "s/.*/ &@Base $version/"
} >"$src/debian/libtaskpush1.symbols"

echo "package.sh: building in $src" >&2
# Debian's own programs first: pybuild runs `python3.11 -m build` through PATH, and a
# python3.11 of pyenv or a venv earlier in PATH has neither Debian's build module nor
# its dist-packages.
(cd "$src" && PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH dpkg-buildpackage -b -us -uc -j"${TASKPUSH_PACKAGE_JOBS:-2}") \
  >"$out/build.log" 2>&1 || { tail -n 60 "$out/build.log" >&2; exit 1; }

debs=("$work"/*.deb)
cp "${debs[@]}" "$out/"

# The wheel, from a copy of python/ of its own (the build leaves build/ and *.egg-info
# beside the sources). --no-isolation: the build uses the installed setuptools and
# wheel instead of fetching them from PyPI, so it needs no network. Debian's python3,
# not another python3 first in PATH, which may lack them.
cp -a "$root/python" "$work/wheel-src"
(cd "$work/wheel-src" && /usr/bin/python3 -m build --wheel --no-isolation --outdir "$out" .) \
  >>"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log" >&2; exit 1; }
ls -l "$out"/*.deb "$out"/*.whl >&2

if [ $lintian -eq 1 ]; then
  # Every tag, info and pedantic included; the ones left are explained in
  # packaging/README.md (lines "- `tag`: reason").
  lintian --display-info --pedantic "$work"/*.changes 2>&1 | grep -E '^[EWIPX]: ' >"$out/lintian.txt" || true
  known=$(sed -n 's/^- `\([a-z0-9-]*\)`.*/\1/p' "$root/packaging/README.md")
  unexplained=$(awk '{print $3}' "$out/lintian.txt" | grep -E '^[a-z0-9-]+$' | sort -u |
                grep -vxF -f <(printf '%s\n' "$known") || true)
  cat "$out/lintian.txt" >&2
  if [ -n "$unexplained" ]; then
    echo "package.sh: lintian tags not explained in packaging/README.md: $unexplained" >&2
    exit 1
  fi
  echo "package.sh: lintian: every tag left is explained in packaging/README.md" >&2
fi
