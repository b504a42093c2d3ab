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

--cases FILE also writes every case to FILE, one line each, sorted (byte order):
  BUILD<TAB>SUITE/TEST<TAB>CASE<TAB>ok|fail|skip
BUILD is the build directory's name (build, build-asan), or "step" for a line of
a plain result file; SUITE/TEST comes from meson's "PROJECT:SUITE / TEST". CASE
is a TAP case's text after "ok N" without the number, the " - " and what follows
an unescaped "#" (a SKIP or TODO directive, or the reason a failing case gives:
a case keeps its name when it fails); "-" for a non-TAP test, and for a TAP test
that reported no case. The list holds no timings or counts, so that the lists of
two runs compare with diff, comm or scripts/compare-cases.sh.
"""
import argparse
import json
import re
import sys

PLAN = re.compile(r"^1\.\.(\d+)")
CASE = re.compile(r"^(not ok|ok)\b(.*)")
# What --cases keeps of a case line: the description, without the number and without
# what follows an unescaped "#" (a directive, or the reason a failing case gives).
CASE_NAME = re.compile(r"^\s*\d*\s*(?:-\s+)?((?:[^#\\]|\\.)*?)\s*(?:#.*)?$")


def case_name(rest):
    """The name of a TAP case from what follows "ok"/"not ok" on its line."""
    name = CASE_NAME.match(rest).group(1)
    return " ".join(name.split()) or "-"  # no tab or newline inside a field


def count_tap(stdout, cases=None):
    """Counts a TAP output's cases; appends (name, ok|fail|skip) to cases if given."""
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
        skip = "# SKIP" in m.group(2)
        if m.group(1) == "ok" and not skip:
            passed += 1
        else:
            failed += 1
            failures.append(line.strip())
        if cases is not None:
            status = "skip" if skip else "ok" if m.group(1) == "ok" else "fail"
            cases.append((case_name(m.group(2)), status))
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


def main(paths, cases_path=None):
    passed = failed = 0
    rows = []  # (build, suite/test, case, status) for --cases
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if path.endswith(".json"):
            for line in text.splitlines():
                if not line.strip():
                    continue
                t = json.loads(line)
                build = path.split('/')[-3] if path.count('/') >= 2 else path
                name = f"{build}:{t['name']}"
                ok = t["result"] in ("OK", "EXPECTEDFAIL")
                tap = t.get("protocol") == "tap" or PLAN.search(t.get("stdout") or "")
                test = test_id(t["name"])
                if tap:
                    cases = []
                    p, fl, failures = count_tap(t.get("stdout") or "", cases)
                    rows.extend((build, test, c, st) for c, st in cases)
                    if not cases:
                        rows.append((build, test, "-", "fail"))
                    if not ok and fl == 0:
                        fl, failures = 1, [f"{t['result']} (exit {t.get('returncode')})"]
                    if p + fl == 0:
                        fl, failures = 1, ["reported no case"]
                else:
                    p, fl = (1, 0) if ok else (0, 1)
                    failures = [] if ok else [f"{t['result']} (exit {t.get('returncode')})"]
                    status = "skip" if t["result"] == "SKIP" else "ok" if ok else "fail"
                    rows.append((build, test, "-", status))
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
                rows.append(("step", " ".join(parts[:-1]), "-",
                             "ok" if parts[-1] == "ok" else "fail"))
    if cases_path:
        with open(cases_path, "w", encoding="utf-8") as f:
            f.writelines("\t".join(r) + "\n" for r in sorted(rows))
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


def test_id(name):
    """SUITE/TEST from meson's "PROJECT:SUITE / TEST" (its testlog names a test so)."""
    suite, sep, test = name.partition(" / ")
    return f"{suite.split(':', 1)[-1]}/{test}" if sep else name


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", metavar="FILE", help="write the sorted list of cases to FILE")
    ap.add_argument("paths", nargs="*", help="testlog.json files and plain result files")
    args = ap.parse_args()
    sys.exit(main(args.paths, args.cases))
