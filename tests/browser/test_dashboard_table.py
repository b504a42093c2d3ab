#!/usr/bin/env python3
"""Two queues' dashboards told apart, in headless Chromium (issue 31, --table NAME).

One database with two queues, jobs and mail (taskpushd --table NAME --migrate each),
and a taskpushd leading each. Both admin ports' pages are opened: each shows its
table's name beside the title and in the page's title (from /stats task_table), and
the two titles differ. Uses tests/python/tplib for the database and the daemons,
and Debian's chromium, chromium-driver and python3-selenium as test_dashboard.py
does. Prints TAP.
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import tplib  # noqa: E402
from test_dashboard import start_browser  # noqa: E402  (also puts selenium on sys.path)

CHECKS = [
    "jobs and mail migrated into one database, a taskpushd leading each",
    "the jobs page names jobs beside its title and in the page's title",
    "the mail page names mail beside its title and in the page's title",
    "the two pages' titles differ",
]


def page_names(driver, admin):
    """The header's table name and the document's title, once the first /stats is in."""
    driver.get("http://%s/" % admin)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        got = driver.execute_script(
            "var e = document.getElementById('task-table');"
            "return [e ? e.textContent : null, e ? e.dataset.table : null, document.title];")
        if got[1]:
            return got
        time.sleep(0.1)
    return got


def main():
    print("1..%d" % len(CHECKS), flush=True)
    results = []
    db = tplib.TestDB("dash_table")
    daemons, driver = [], None
    try:
        for t in ("jobs", "mail"):
            r = subprocess.run([str(tplib.BUILD_ROOT / "dispatcher" / "taskpushd"), "--db", db.url, "--table", t,
                                "--migrate"], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError("--table %s --migrate: %s" % (t, r.stderr))
            daemons.append(tplib.Daemon(db.url, ["--table", t]))
        results.append(all(d.json("/stats").get("leader") for d in daemons))
        with tempfile.TemporaryDirectory() as tmp:
            driver = start_browser(tmp)
            jobs = page_names(driver, daemons[0].admin)
            mail = page_names(driver, daemons[1].admin)
            print("# jobs page %r, mail page %r" % (jobs, mail), flush=True)
            results.append(jobs[1] == "jobs" and "jobs" in jobs[0] and "jobs" in jobs[2])
            results.append(mail[1] == "mail" and "mail" in mail[0] and "mail" in mail[2])
            results.append(jobs[2] != mail[2])
            driver.quit()
            driver = None
    except Exception as e:  # every check not reached fails
        print("# %s: %s" % (type(e).__name__, e), flush=True)
    finally:
        if driver is not None:
            driver.quit()
        for d in daemons:
            d.close()
        db.drop()
    failed = 0
    for i, name in enumerate(CHECKS):
        ok = i < len(results) and results[i]
        failed += not ok
        print("%s %d - %s" % ("ok" if ok else "not ok", i + 1, name), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
