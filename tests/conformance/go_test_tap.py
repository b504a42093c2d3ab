#!/usr/bin/env python3
"""go_test_tap: runs the Go module's checks (clients/go) and prints TAP.

    go_test_tap.py SOURCE_ROOT BUILD_ROOT

`go vet ./...` is case 1; then every test of `go test -json ./...` (the codec
against the golden frames, the worker and client against the build's real
taskpushd and the private MariaDB of scripts/tp-mariadb's environment) is one
case. A skipped test counts as a failure: run from here nothing may skip. The
Go caches live under BUILD_ROOT/clients-go, so a fresh clone builds as root
without assuming a HOME. A missing `go` fails (scripts/install-deps.sh --test
installs golang-go).
"""
import json
import os
import shutil
import subprocess
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, build = (os.path.abspath(a) for a in sys.argv[1:])
    go = shutil.which("go")
    if go is None:
        print("not ok 1 - go is not installed (scripts/install-deps.sh --test installs golang-go)")
        print("1..1")
        return 1
    state = os.path.join(build, "clients-go")
    env = dict(os.environ)
    env.update({
        "GOCACHE": os.path.join(state, "cache"),
        "GOPATH": os.path.join(state, "gopath"),
        "GOENV": "off",          # no $HOME/.config/go/env
        "GOFLAGS": "",
        "GOPROXY": "off",        # standard library only: nothing to download
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "TASKPUSH_SOURCE_ROOT": src,
        "TASKPUSH_BUILD_ROOT": build,
    })
    module = os.path.join(src, "clients", "go")
    n = 0
    ok_all = True

    def line(ok: bool, name: str, detail: str = "") -> None:
        nonlocal n, ok_all
        n += 1
        ok_all = ok_all and ok
        print(f"{'ok' if ok else 'not ok'} {n} - {name}", flush=True)
        for d in detail.splitlines():
            print(f"# {d}", flush=True)

    vet = subprocess.run([go, "vet", "./..."], cwd=module, env=env, capture_output=True, text=True)
    line(vet.returncode == 0, "go vet ./...", vet.stdout + vet.stderr)

    proc = subprocess.Popen([go, "test", "-json", "-count=1", "-timeout", "300s", "./..."], cwd=module,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    output = {}
    assert proc.stdout is not None
    for raw in proc.stdout:
        try:
            ev = json.loads(raw)
        except ValueError:
            print(f"# {raw.rstrip()}")
            continue
        key = (ev.get("Package", ""), ev.get("Test", ""))
        act = ev.get("Action")
        if act == "output":
            output.setdefault(key, []).append(ev.get("Output", ""))
        elif act in ("pass", "fail", "skip") and key[1]:
            name = f"{key[0]}.{key[1]}"
            detail = "".join(output.pop(key, [])) if act != "pass" else ""
            if act == "skip":
                detail = "skipped: a skip counts as a failure here\n" + detail
            line(act == "pass", name, detail)
        elif act == "fail" and not key[1]:
            line(False, f"{key[0]} (package)", "".join(output.pop(key, [])))
    err = proc.stderr.read() if proc.stderr else ""
    rc = proc.wait()
    if rc != 0 and ok_all:
        line(False, "go test", err)
    elif err.strip():
        for d in err.splitlines():
            print(f"# {d}")
    print(f"1..{n}", flush=True)
    return 0 if ok_all and rc == 0 and n > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
