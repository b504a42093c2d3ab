#!/usr/bin/env python3
"""Sums test results over meson test logs and extra result files.

Each argument is either a meson testlog.json, or a plain file holding lines
"NAME ok" / "NAME fail" (for steps that are not meson tests, like the fuzz
run). A TAP test counts each "ok"/"not ok" line; cases its plan announced but
that never reported (a crash, a timeout) count as failed, and so does a TAP
test that failed without reporting any failing case. A non-TAP test counts
once. Skips and timeouts count as failed. Prints the failures, each non-TAP
one with the lines of its output that say why (CI keeps only the tail of a run's
output), then the line "N passed, N failed". Exit status 1 when anything failed
or nothing ran.
"""
import json
import re
import sys

PLAN = re.compile(r"^1\.\.(\d+)")
CASE = re.compile(r"^(not ok|ok)\b(.*)")


def count_tap(stdout):
    passed = failed = 0
    planned = None
    failures = []
    for line in stdout.splitlines():
        m = PLAN.match(line)
        if m and planned is None:
            planned = int(m.group(1))
            continue
        m = CASE.match(line)
        if not m:
            continue
        if m.group(1) == "ok" and "# SKIP" not in m.group(2):
            passed += 1
        else:
            failed += 1
            failures.append(line.strip())
    if planned is not None and passed + failed < planned:
        missing = planned - passed - failed
        failed += missing
        failures.append(f"{missing} planned case(s) never reported")
    return passed, failed, failures


def why_lines(t, limit=8):
    """What a failed non-TAP test printed about its failure: its "FAIL" lines (the
    project's checkers print one per failed check), else the last lines it printed."""
    out = ((t.get("stdout") or "") + "\n" + (t.get("stderr") or "")).splitlines()
    lines = [l.strip() for l in out if l.startswith("FAIL")]
    if not lines:
        lines = [l.strip() for l in out if l.strip()][-limit:]
    return [l[:300] for l in lines[:limit]]


def main(paths):
    passed = failed = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if path.endswith(".json"):
            for line in text.splitlines():
                if not line.strip():
                    continue
                t = json.loads(line)
                name = f"{path.split('/')[-3] if path.count('/') >= 2 else path}:{t['name']}"
                ok = t["result"] in ("OK", "EXPECTEDFAIL")
                tap = t.get("protocol") == "tap" or PLAN.search(t.get("stdout") or "")
                if tap:
                    p, fl, failures = count_tap(t.get("stdout") or "")
                    if not ok and fl == 0:
                        fl, failures = 1, [f"{t['result']} (exit {t.get('returncode')})"]
                    if p + fl == 0:
                        fl, failures = 1, ["reported no case"]
                else:
                    p, fl = (1, 0) if ok else (0, 1)
                    failures = [] if ok else [f"{t['result']} (exit {t.get('returncode')})"]
                passed += p
                failed += fl
                for why in failures:
                    print(f"FAILED {name}: {why}")
                if fl and not tap:
                    for line in why_lines(t):
                        print(f"    {line}")
        else:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) < 2:
                    continue
                if parts[-1] == "ok":
                    passed += 1
                else:
                    failed += 1
                    print(f"FAILED {' '.join(parts[:-1])}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
