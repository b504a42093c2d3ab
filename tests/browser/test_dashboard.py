#!/usr/bin/env python3
"""The admin port's dashboard, end to end, in headless Chromium.

Creates its own database on the private MariaDB of scripts/tp-mariadb (environment
TASKPUSH_TEST_MYSQL_*), loads the schema and a few thousand tasks, starts the real
taskpushd and two real taskpush-worker processes, opens http://ADMIN/ in Debian's
Chromium through selenium and checks what the page shows against /stats and
/workers. Writes a screenshot to $TASKPUSH_BUILD_ROOT/dashboard.png. Prints TAP.

Needs: chromium, chromium-driver, python3-selenium (scripts/install-deps.sh).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from urllib.parse import urlsplit

# Debian's python3-selenium lives in the system's dist-packages; another python3
# (pyenv, a venv) that runs this script may not see it.
for _p in ("/usr/lib/python3/dist-packages",):
    if os.path.isdir(_p) and _p not in sys.path:
        sys.path.append(_p)

NTASKS = 3000
WORKER_CMD = "sleep 0.02; cat"
CHROMIUM = os.environ.get("TASKPUSH_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TASKPUSH_CHROMEDRIVER", "/usr/bin/chromedriver")

CHECKS = [
    "database created, schema and tasks loaded",
    "taskpushd ready and both workers connected",
    "GET / answers the page with its headers; POST / is refused",
    "page loads in headless Chromium and starts polling",
    "throughput series has >= 3 points, some > 0",
    "latest depth point is buffered + in_flight of the page's lastStats",
    "page's succeeded_total <= a fresh /stats, and close",
    "headline figures show lastStats",
    "worker rows are exactly the workers of /workers, with their capacity",
    "the page requested nothing but the admin port",
    "no error in the browser console",
    "screenshot written",
    "dispatcher down: page says 'no answer' and keeps polling",
]


class Tap:
    def __init__(self, names):
        self.names = names
        self.n = 0
        self.failed = 0
        print("1..%d" % len(names), flush=True)

    def result(self, ok, detail=""):
        name = self.names[self.n]
        self.n += 1
        self.failed += 0 if ok else 1
        print("%s %d - %s%s" % ("ok" if ok else "not ok", self.n, name,
                                (" # " + detail) if detail and not ok else ""), flush=True)
        if detail and ok:
            self.diag(detail)
        return ok

    def diag(self, text):
        for line in str(text).splitlines():
            print("# " + line, flush=True)

    def rest_failed(self, why):
        while self.n < len(self.names):
            self.result(False, why)


def env(name):
    v = os.environ.get(name)
    if not v:
        raise RuntimeError("%s is not set: start the database with "
                           "eval \"$(scripts/tp-mariadb start DIR)\"" % name)
    return v


class Db:
    def __init__(self):
        self.host = os.environ.get("TASKPUSH_TEST_MYSQL_HOST", "127.0.0.1")
        self.port = env("TASKPUSH_TEST_MYSQL_PORT")
        self.user = env("TASKPUSH_TEST_MYSQL_USER")
        self.client = shutil.which("mariadb") or shutil.which("mysql")
        if not self.client:
            raise RuntimeError("no mariadb client binary")
        self.name = "tp_dashboard_%d" % os.getpid()

    def run(self, sql=None, db=None, stdin=None):
        cmd = [self.client, "--no-defaults", "-h", self.host, "-P", str(self.port), "-u", self.user,
               "--batch", "--skip-column-names"]
        if db:
            cmd.append(db)
        if sql is not None:
            cmd += ["-e", sql]
        p = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("mariadb: %s" % p.stderr.decode(errors="replace").strip())
        return p.stdout.decode()

    def create(self, schema_path, ntasks):
        self.run("DROP DATABASE IF EXISTS `%s`; CREATE DATABASE `%s`" % (self.name, self.name))
        with open(schema_path, "rb") as f:
            self.run(db=self.name, stdin=f.read())
        rows = []
        for i in range(ntasks):
            rows.append("('%s', %d, '{\"n\":%d}')" % ("resize" if i % 3 == 0 else "default", i % 3, i))
        for k in range(0, len(rows), 1000):
            self.run("INSERT INTO task (task_type, task_priority, payload) VALUES " +
                     ",".join(rows[k:k + 1000]), db=self.name)
        return int(self.run("SELECT COUNT(*) FROM task WHERE task_state = 0", db=self.name).strip())

    def drop(self):
        self.run("DROP DATABASE IF EXISTS `%s`" % self.name)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, dict(r.headers), r.read()


def get_json(admin, path):
    return json.loads(http_get("http://%s%s" % (admin, path))[2])


def wait_for(what, fn, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(step)
    raise TimeoutError("timed out after %ss waiting for %s (last: %r)" % (timeout, what, last))


def stop_process(p, sig=signal.SIGTERM, grace=10):
    if p is None or p.poll() is not None:
        return
    p.send_signal(sig)
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def start_browser(tmp):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1400,1100",
              "--user-data-dir=" + os.path.join(tmp, "chromium-profile")):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, log_path=os.path.join(tmp, "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(10)
    return driver


def main():
    build = os.environ.get("TASKPUSH_BUILD_ROOT") or os.getcwd()
    source = os.environ.get("TASKPUSH_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
    tap = Tap(CHECKS)
    tmp = tempfile.mkdtemp(prefix="tp-dashboard-")
    db = None
    created = False
    daemon = None
    workers = []
    driver = None
    try:
        # 1. database
        db = Db()
        n = db.create(os.path.join(source, "sql", "schema.sql"), NTASKS)
        created = True
        tap.result(n == NTASKS, "%d NEW tasks in %s" % (n, db.name))

        # 2. taskpushd and two workers
        ready = os.path.join(tmp, "ready.json")
        dlog = os.path.join(tmp, "taskpushd.log")
        daemon = subprocess.Popen(
            [os.path.join(build, "dispatcher", "taskpushd"),
             "--db", "mysql://%s@%s:%s/%s" % (db.user, db.host, db.port, db.name),
             "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--ready-file", ready],
            stdout=open(dlog, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            info = wait_for("the ready file", lambda: os.path.exists(ready) and json.load(open(ready)), 30)
        except TimeoutError:
            tap.diag(tail(dlog))
            raise
        admin, listen = info["admin"], info["listen"]
        base = "http://%s/" % admin
        wait_for("leadership", lambda: get_json(admin, "/stats").get("db_connected"), 30)

        # The browser first, so that the charts also show the start of the flow.
        driver = start_browser(tmp)

        names = ["dash-worker-a", "dash-worker-b"]
        specs = [(names[0], "default,resize", 3), (names[1], "default", 2)]
        for name, types, conc in specs:
            wlog = open(os.path.join(tmp, name + ".log"), "w")
            workers.append(subprocess.Popen(
                [os.path.join(build, "worker-client", "taskpush-worker"), "--connect", listen,
                 "--type", types, "--concurrency", str(conc), "--name", name, "--exec", WORKER_CMD,
                 "--log-level", "warn"],
                stdout=wlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        wk = wait_for("two workers", lambda: (lambda w: w if len(w) == 2 else None)(get_json(admin, "/workers")), 30)
        tap.result(sorted(w["name"] for w in wk) == sorted(names), "admin %s, workers %s" % (admin, [w["name"] for w in wk]))

        # 3. the page over plain HTTP
        status, headers, body = http_get(base)
        h = {k.lower(): v for k, v in headers.items()}
        csp = h.get("content-security-policy", "")
        problems = []
        if status != 200:
            problems.append("status %d" % status)
        if h.get("content-type", "").replace(" ", "").lower() != "text/html;charset=utf-8":
            problems.append("content-type %r" % h.get("content-type"))
        if "no-store" not in h.get("cache-control", ""):
            problems.append("cache-control %r" % h.get("cache-control"))
        if "default-src 'none'" not in csp or "http" in csp or "*" in csp or "unsafe" in csp:
            problems.append("CSP %r" % csp)
        if b"window.taskpushDashboard" not in body:
            problems.append("not the dashboard page")
        if http_get("http://%s/index.html" % admin)[2] != body:
            problems.append("/index.html differs from /")
        try:
            urllib.request.urlopen(urllib.request.Request(base, data=b"x", method="POST"), timeout=5)
            problems.append("POST / was answered")
        except urllib.error.HTTPError as e:
            if e.code != 405:
                problems.append("POST / gave %d, not 405" % e.code)
        tap.result(not problems, "; ".join(problems))

        # 4. Chromium
        driver.get(base)
        polls = wait_for("the page to poll", lambda: driver.execute_script(
            "var d = window.taskpushDashboard; return d && d.lastStats && d.lastWorkers ? d.polls : 0"), 20)
        tap.result(driver.title == "taskpushd" and polls >= 1, "title %r, polls %r" % (driver.title, polls))

        # 5. throughput: wait (bounded) for several points while the tasks flow
        def enough():
            d = driver.execute_script("return window.taskpushDashboard.throughput")
            return d if len(d) >= 8 and sum(1 for p in d if p[1] > 0) >= 3 else None
        try:
            tp = wait_for("throughput points", enough, 60, 0.5)
        except TimeoutError as e:
            tp = driver.execute_script("return window.taskpushDashboard.throughput")
            tap.diag(str(e))
        positive = [p for p in tp if p[1] > 0]
        tap.result(len(tp) >= 3 and len(positive) >= 1,
                   "%d points, %d > 0, max %.1f/s" % (len(tp), len(positive), max([p[1] for p in tp] or [0])))

        # Read the page's state and /stats and /workers right after.
        page = driver.execute_script(
            "var d = window.taskpushDashboard; return {depth: d.depth, stats: d.lastStats, "
            "workers: d.lastWorkers, polls: d.polls, errors: d.errors, "
            "figs: Array.prototype.map.call(document.querySelectorAll('#headline .value'), "
            "function (e) { return [e.id, e.getAttribute('data-value'), e.textContent]; }), "
            "rows: Array.prototype.map.call(document.querySelectorAll('tr[data-worker-name]'), "
            "function (r) { return [r.getAttribute('data-worker-name'), r.getAttribute('data-capacity'), "
            "r.cells[3].textContent]; })}")
        fresh = get_json(admin, "/stats")
        fresh_workers = get_json(admin, "/workers")

        # 6. depth
        st = page["stats"]
        want = st["queue"]["buffered"] + st["queue"]["in_flight"]
        got = page["depth"][-1][1] if page["depth"] else None
        tap.result(got == want and got >= 0,
                   "latest depth %r, lastStats buffered+in_flight %r (fresh /stats: %r)" %
                   (got, want, fresh["queue"]["buffered"] + fresh["queue"]["in_flight"]))

        # 7. the page's counters against a /stats fetched right after
        ps, fs = st["tasks"]["succeeded_total"], fresh["tasks"]["succeeded_total"]
        rate = max([p[1] for p in tp] or [0])
        tolerance = max(100, int(rate * 5))
        tap.result(ps <= fs and fs - ps <= tolerance,
                   "page %d, fresh %d, tolerance %d" % (ps, fs, tolerance))

        # 8. headline figures
        figs = {i: (v, t) for i, v, t in page["figs"]}
        problems = []
        for fid, want_v in (("f-succeeded", st["tasks"]["succeeded_total"]),
                            ("f-failed", st["tasks"]["failed_total"]),
                            ("f-workers", st["workers"])):
            if figs.get(fid, (None,))[0] != str(want_v):
                problems.append("%s shows %r, lastStats %r" % (fid, figs.get(fid), want_v))
        if figs.get("f-db", ("",))[0] != "true" or figs["f-db"][1] != "yes":
            problems.append("f-db %r" % (figs.get("f-db"),))
        tap.result(not problems, "; ".join(problems))

        # 9. worker table
        rows = page["rows"]
        want_rows = sorted((w["name"], str(w["capacity"])) for w in fresh_workers)
        got_rows = sorted((r[0], r[1]) for r in rows)
        shown_caps = all(r[2].replace("\u2009", "") == r[1] for r in rows)
        tap.result(got_rows == want_rows and shown_caps and sorted(names) == [r[0] for r in want_rows],
                   "rows %r, /workers %r" % (rows, want_rows))

        # 10. requests only to the admin port
        entries = driver.execute_script(
            "return performance.getEntriesByType('navigation').concat("
            "performance.getEntriesByType('resource')).map(function (e) { return e.name; })")
        foreign = [u for u in entries if urlsplit(u).netloc != admin or urlsplit(u).scheme != "http"]
        paths = sorted(set(urlsplit(u).path for u in entries))
        tap.result(len(entries) >= 3 and not foreign,
                   "%d requests, paths %s, foreign %s" % (len(entries), paths, foreign[:5]))

        # 11. console
        logs = driver.get_log("browser")
        bad = [e for e in logs if e.get("level") in ("SEVERE", "WARNING")]
        tap.result(not bad and not page["errors"], "console: %s; page errors: %s" % (bad[:5], page["errors"]))

        # 12. screenshot while the tasks flow
        time.sleep(2)
        shot = os.path.join(build, "dashboard.png")
        ok = driver.save_screenshot(shot)
        tap.result(ok and os.path.getsize(shot) > 10000, shot)

        # 13. dispatcher down
        polls_before = driver.execute_script("return window.taskpushDashboard.polls")
        stop_process(daemon)
        try:
            text = wait_for("'no answer'", lambda: (lambda s: s if "no answer" in s else None)(
                driver.find_element("id", "status").text), 15)
            time.sleep(2.5)
            d = driver.execute_script(
                "var d = window.taskpushDashboard; return {polls: d.polls, up: d.up, failures: d.failures, "
                "db: document.getElementById('f-db').textContent}")
            tap.result(d["polls"] >= polls_before + 2 and not d["up"] and d["failures"] >= 2
                       and d["db"] == "no answer", "status %r, %r" % (text, d))
        except TimeoutError as e:
            tap.result(False, str(e))
    except Exception as e:  # noqa: BLE001 - every unreported check fails
        tap.diag(traceback.format_exc())
        tap.rest_failed("%s: %s" % (type(e).__name__, e))
    finally:
        if driver is not None:
            try:
                driver.quit()
            except Exception:  # noqa: BLE001
                pass
        for w in workers:
            stop_process(w, signal.SIGINT)
            stop_process(w, signal.SIGKILL)
        stop_process(daemon)
        if db is not None and created:
            try:
                db.drop()
            except Exception as e:  # noqa: BLE001
                tap.diag("drop database: %s" % e)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if tap.n == len(CHECKS) and tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
