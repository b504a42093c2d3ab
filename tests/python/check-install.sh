#!/usr/bin/env bash
# check-install.sh SOURCE_ROOT: python/ compiles, and installs without network into a
# venv (--system-site-packages, pip --no-build-isolation with Debian's
# python3-setuptools), where the installed package imports and works. Prints TAP.
set -uo pipefail
root=$1
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
work=$(mktemp -d /tmp/tp-py-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
n=0
failed=0
check() { # check NAME COMMAND...: one TAP line
  local name=$1; shift
  n=$((n + 1))
  if "$@" >"$work/out" 2>&1; then echo "ok $n - $name"; else
    failed=1; echo "not ok $n - $name"; sed 's/^/# /' "$work/out" | tail -n 30; fi
}
# py_compile with its output in $work: the checkout gets no __pycache__.
check "py_compile python/taskpush/*.py" "$py" -c '
import pathlib, py_compile, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
    py_compile.compile(str(f), cfile=sys.argv[2] + "/" + f.name + "c", doraise=True)
' "$root/python/taskpush" "$work"
# pip builds in its source directory: build a copy so the checkout stays clean.
cp -r "$root/python" "$work/src"
check "venv --system-site-packages" "$py" -m venv --system-site-packages "$work/v"
check "pip install --no-build-isolation --no-index" env PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$work/v/bin/pip" install --no-build-isolation --no-index --no-deps "$work/src"
check "installed package imports from the venv, with py.typed" bash -c '
  cd / && "$1/v/bin/python" -c "
import pathlib, taskpush, taskpush.proto as p
f = pathlib.Path(taskpush.__file__)
assert str(f).startswith(\"$1/v/\"), f
assert (f.parent / \"py.typed\").is_file()
m = p.Task(1, 2, 3, 4, 1, b\"t\", b\"x\")
assert p.decode(p.encode(m)[4:]) == m
"' _ "$work"
echo "1..$n"
exit $failed
