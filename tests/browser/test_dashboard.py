#!/usr/bin/env python3
"""The admin port's dashboard, end to end, in headless Chromium.

Creates its own database on the private MariaDB of scripts/tp-mariadb (environment
TASKPUSH_TEST_MYSQL_*), loads the schema and a few thousand tasks, starts the real
taskpushd (with an admin token) and real taskpush-worker processes: two that succeed,
one whose tasks fail at once (then stopped): permanently for type "flaky", on their
only attempt for type "brittle"; and none for a type "orphan" with rows waiting. Once the dispatcher has some history, opens http://ADMIN/ in Debian's
Chromium through selenium and checks what the page shows against /history, /stats,
/workers and the table, then acts through the page (pause, resume, retry; a POST
without the token first; retry every FAILED task of a type, through its confirmation)
and checks the outcome in /stats and the table. Writes screenshots to
$TASKPUSH_BUILD_ROOT/dashboard.png, dashboard-at-load.png (taken as soon as the page
has loaded), dashboard-backlog.png (the backlog with its failures and what to do: the
one in docs/) and dashboard-failures.png. Prints TAP.

Needs: chromium, chromium-driver, python3-selenium (scripts/install-deps.sh).
"""
import html
import json
import os
import re
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
NFLAKY = 5         # tasks of type "flaky": their worker fails each at once, permanently
NBRITTLE = 2       # tasks of type "brittle" (max_attempts 1): the same worker fails their only attempt
NFAILED = NFLAKY + NBRITTLE
NORPHAN = 3        # tasks of type "orphan": no worker serves it; group keys tenant-a (2), tenant-b (1)
WORKER_CMD = "sleep 0.02; cat"
# Its error carries markup: the page must show it as text.
FLAKY_CMD = ('if [ "$TASKPUSH_TASK_TYPE" = brittle ]; then echo "brittle: try again" >&2; exit 1; fi; '
             'echo "flaky: cannot open /data/$TASKPUSH_TASK_ID <img src=/x><b>bold</b>" >&2; exit 65')
TOKEN = "dash-admin-token-0123456789"
RED = "rgb(176, 0, 32)"  # #b00020, the page's colour for what is wrong
CHROMIUM = os.environ.get("TASKPUSH_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TASKPUSH_CHROMEDRIVER", "/usr/bin/chromedriver")

CHECKS = [
    "database created, schema and tasks loaded",
    "taskpushd ready; flaky tasks FAILED, their worker stopped; two workers connected",
    "GET / answers the page with its headers; POST / is refused",
    "GET /history holds samples of the flow, oldest first",
    "page loads; its first drawing shows /history's points before any poll",
    "at load (the figures the page came with): not 'connecting…' and dashes; the depth chart says it plots NEW rows",
    "throughput series has >= 3 points, some > 0",
    "latest depth point is buffered + in_flight of the page's lastStats",
    "page's succeeded_total <= a fresh /stats, and close",
    "headline figures show lastStats",
    "FAILED tile equals the table's count of FAILED rows",
    "worker rows are exactly the workers of /workers, with their capacity",
    "/stats by_type adds up; 'orphan' (ready rows, no worker) shows 'no worker' in red, the lag names it",
    "what to do: 'no worker serves orphan: start one with taskpush-worker --connect … --type orphan --exec …'; "
    "paused with ready rows: 'press Resume'",
    "failure rate per type: the answers of /stats by_type; 0 % for a type whose tasks succeed",
    "busiest keys: orphan's tenant-a (2 waiting) before tenant-b (1), as GET /keys says",
    "failures list: each failed task with its error (markup as text), latest failure first; "
    "Retry on the exhausted ones, none on the permanent ones",
    "backlog screenshot written",
    "task view: a task waiting by SQL on an orphan task shows 'waits on 1, 1 pending' and the orphan's id",
    "a POST without the token: the page says 401 and nothing changes",
    "with the token: Pause shows the type paused, its button resumes it",
    "failures screenshot written",
    "Retry puts the failed task back to NEW in the table",
    "retry every FAILED task of a type: a confirmation; Cancel changes nothing; confirmed, they are NEW",
    "the page requested nothing but the admin port",
    "no error in the browser console but the 401 provoked",
    "screenshot written",
    "POST /drain: the page shows the drain",
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
        rows += ["('flaky', 1, '{\"f\":%d}')" % i for i in range(NFLAKY)]
        for k in range(0, len(rows), 1000):
            self.run("INSERT INTO task (task_type, task_priority, payload) VALUES " +
                     ",".join(rows[k:k + 1000]), db=self.name)
        self.run("INSERT INTO task (task_type, task_priority, payload, group_key) VALUES " +
                 ",".join("('orphan', 1, '{\"o\":%d}', '%s')" % (i, "tenant-b" if i == NORPHAN - 1 else "tenant-a")
                          for i in range(NORPHAN)), db=self.name)
        self.run("INSERT INTO task (task_type, max_attempts, payload) VALUES " +
                 ",".join("('brittle', 1, '{\"b\":%d}')" % i for i in range(NBRITTLE)), db=self.name)
        return self.count("task_state = 0")

    def count(self, where):
        return int(self.run("SELECT COUNT(*) FROM task WHERE " + where, db=self.name).strip())

    def drop(self):
        self.run("DROP DATABASE IF EXISTS `%s`" % self.name)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, dict(r.headers), r.read()


def get_json(admin, path):
    return json.loads(http_get("http://%s%s" % (admin, path))[2])


def post(admin, path, token=None):
    """A POST as taskpushctl sends it; returns (status, body)."""
    headers = {"X-Taskpush-Admin": "1"}
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request("http://%s%s" % (admin, path), data=b"", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# How long the page may take to show a change: generous, because the ASan build's
# taskpushd runs beside the other suite on a loaded machine (a bound, not a target).
PAGE_WAIT_S = 30


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


def js(driver, script, *args):
    return driver.execute_script(script, *args)


# The page's state in one read: series, figures, rows of each table.
PAGE_STATE = """
var d = window.taskpushDashboard;
function rows(sel, attr) {
  return Array.prototype.map.call(document.querySelectorAll(sel), function (r) {
    return {key: r.getAttribute(attr), attrs: {paused: r.getAttribute('data-paused'),
            noWorker: r.getAttribute('data-no-worker'), capacity: r.getAttribute('data-capacity')},
            cells: Array.prototype.map.call(r.cells, function (c) { return c.textContent; }),
            colors: Array.prototype.map.call(r.cells, function (c) { return getComputedStyle(c).color; }),
            buttons: Array.prototype.map.call(r.querySelectorAll('button'), function (b) { return b.textContent; })};
  });
}
return {depth: d.depth, stats: d.lastStats, workers: d.lastWorkers, polls: d.polls, errors: d.errors,
        figs: Array.prototype.map.call(document.querySelectorAll('#headline .value'),
          function (e) { return [e.id, e.getAttribute('data-value'), e.textContent]; }),
        workerRows: rows('tr[data-worker-name]', 'data-worker-name'),
        typeRows: rows('#types-body tr', 'data-type'),
        keyRows: rows('#keys-body tr', 'data-key'),
        failureRows: rows('#failures-body tr', 'data-task-id'),
        msg: document.getElementById('action-msg').textContent,
        msgColor: getComputedStyle(document.getElementById('action-msg')).color,
        state: document.getElementById('state').textContent,
        stateAttrs: [document.getElementById('state').getAttribute('data-draining'),
                     document.getElementById('state').getAttribute('data-paused-types')]};
"""


def click(driver, selector, label):
    """Clicks the button labelled label in the row selector, in one script (the rows
    are redrawn every second: a found element may be gone by the time of a click)."""
    return js(driver, """
      var r = document.querySelector(arguments[0]), label = arguments[1];
      var b = r && Array.prototype.find.call(r.querySelectorAll('button'),
                                             function (x) { return x.textContent === label; });
      if (!b) return false;
      b.click();
      return true;""", selector, label)


def row_of(rows, key):
    for r in rows:
        if r["key"] == key:
            return r
    return None


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
        tap.result(n == NTASKS + NFLAKY + NORPHAN + NBRITTLE, "%d NEW tasks in %s" % (n, db.name))

        # 2. taskpushd (with an admin token, table figures every 500 ms) and workers
        ready = os.path.join(tmp, "ready.json")
        dlog = os.path.join(tmp, "taskpushd.log")
        token_file = os.path.join(tmp, "admin-token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(token_file, 0o600)
        daemon = subprocess.Popen(
            [os.path.join(build, "dispatcher", "taskpushd"),
             "--db", "mysql://%s@%s:%s/%s" % (db.user, db.host, db.port, db.name),
             "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--ready-file", ready,
             "--admin-token-file", token_file, "--table-stats-ms", "500"],
            stdout=open(dlog, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            info = wait_for("the ready file", lambda: os.path.exists(ready) and json.load(open(ready)), 30)
        except TimeoutError:
            tap.diag(tail(dlog))
            raise
        admin, listen = info["admin"], info["listen"]
        base = "http://%s/" % admin
        wait_for("leadership", lambda: get_json(admin, "/stats").get("db_connected"), 30)

        def start_worker(name, types, conc, cmd):
            wlog = open(os.path.join(tmp, name + ".log"), "w")
            return subprocess.Popen(
                [os.path.join(build, "worker-client", "taskpush-worker"), "--connect", listen,
                 "--type", types, "--concurrency", str(conc), "--name", name, "--exec", cmd,
                 "--log-level", "warn"],
                stdout=wlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        names = ["dash-worker-a", "dash-worker-b"]
        flaky = start_worker("dash-flaky", "flaky,brittle", 1, FLAKY_CMD)
        workers.append(flaky)
        for name, types, conc in [(names[0], "default,resize", 3), (names[1], "default", 2)]:
            workers.append(start_worker(name, types, conc, WORKER_CMD))
        # Every flaky task FAILED, then its worker goes, so that a retried one stays NEW.
        wait_for("the flaky and brittle tasks to fail", lambda: db.count("task_type IN ('flaky', 'brittle')"
                                                                         " AND task_state = 3") == NFAILED, 30)
        stop_process(flaky)
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
        if b"innerHTML" in body:
            problems.append("the page uses innerHTML")
        # The page carries the figures of the moment, HTML-escaped, in <pre id="tp-first">.
        first_re = re.compile(rb'<pre id="tp-first" hidden>(.*?)</pre>', re.S)
        if first_re.sub(b"", http_get("http://%s/index.html" % admin)[2]) != first_re.sub(b"", body):
            problems.append("/index.html differs from /")
        m = first_re.search(body)
        try:
            first = json.loads(html.unescape(m.group(1).decode())) if m else None
        except ValueError as e:
            first = None
            problems.append("first figures not JSON: %s" % e)
        if not first or not {"stats", "workers", "history"} <= set(first) or b"<" in m.group(1):
            problems.append("first figures %r" % (m.group(1)[:200] if m else None))
        try:
            urllib.request.urlopen(urllib.request.Request(base, data=b"x", method="POST"), timeout=5)
            problems.append("POST / was answered")
        except urllib.error.HTTPError as e:
            if e.code != 405:
                problems.append("POST / gave %d, not 405" % e.code)
        tap.result(not problems, "; ".join(problems))

        # 4. the dispatcher's history: a sample every 5 s; wait for 3 with work done
        def history_ready():
            hs = get_json(admin, "/history")
            s = hs["samples"]
            return hs if len(s) >= 3 and any(x["succeeded"] > 0 for x in s) else None
        hist = wait_for("3 history samples", history_ready, 40, 0.5)
        samples = hist["samples"]
        ts = [x["t"] for x in samples]
        problems = []
        if hist["interval_ms"] != 5000 or hist["capacity"] != 720:
            problems.append("interval %r capacity %r" % (hist["interval_ms"], hist["capacity"]))
        if ts != sorted(ts) or len(set(ts)) != len(ts) or not ts[-1] <= hist["now_ms"]:
            problems.append("times %r, now %r" % (ts, hist["now_ms"]))
        if samples[0]["dt"] != 0 or not all(x["dt"] > 0 for x in samples[1:]):
            problems.append("intervals %r" % [x["dt"] for x in samples])
        if sum(x["succeeded"] for x in samples) > get_json(admin, "/stats")["tasks"]["succeeded_total"]:
            problems.append("more succeeded in the history than since start")
        if max(x["workers"] for x in samples) < 2 or max(x["workers"] for x in samples) > 3:
            problems.append("workers %r" % [x["workers"] for x in samples])
        if samples[-1]["table_failed"] not in (None, NFAILED) or samples[-1]["table_new"] is None:
            problems.append("table figures of the last sample %r" % samples[-1])
        tap.result(not problems, "; ".join(problems) or "%d samples" % len(samples))

        # 5. Chromium: the first drawing, from /history alone
        driver = start_browser(tmp)
        driver.get(base)
        # At once, as a screenshot tool would: the load event has fired, no poll needed.
        at_load = js(driver, """
          var d = window.taskpushDashboard;
          return {atLoad: d.atLoad, ready: d.ready,
                  depthTitle: document.querySelector('#c-depth').parentNode.querySelector('h2').textContent,
                  workerRows: document.querySelectorAll('tr[data-worker-name]').length};""")
        shot0 = os.path.join(build, "dashboard-at-load.png")
        driver.save_screenshot(shot0)
        fp = wait_for("the first drawing", lambda: js(driver, "return window.taskpushDashboard.firstPaint"), 20)
        polls = wait_for("the page to poll", lambda: js(driver,
            "var d = window.taskpushDashboard; return d && d.lastStats && d.lastWorkers ? d.polls : 0"), 20)
        tap.result(driver.title == "taskpushd" and polls >= 1 and fp["polls"] == 0 and
                   fp["samples"] >= len(samples) and fp["drawn"]["throughput"] >= fp["samples"] - 1 and
                   fp["drawn"]["depth"] >= fp["samples"],
                   "title %r, first drawing %r, /history had %d samples" % (driver.title, fp, len(samples)))

        al = at_load["atLoad"] or {}
        tap.result(at_load["ready"] and al.get("up") is True and "connecting" not in al.get("status", "connecting")
                   and "updated" in al.get("status", "") and al.get("dashes") == [] and at_load["workerRows"] == 2
                   and "NEW rows" in at_load["depthTitle"], "at load: %r" % at_load)

        # The backlog still flowing, with its failures listed: the screenshot of docs/,
        # of the whole page (reported below, after the failures list's own check).
        backlog_shot = os.path.join(build, "dashboard-backlog.png")
        try:
            wait_for("the failures listed", lambda: len(js(driver, PAGE_STATE)["failureRows"]) == NFAILED, 15)
            driver.set_window_size(1400, 2100)
            time.sleep(0.5)
            backlog_ok = driver.save_screenshot(backlog_shot)
        except TimeoutError as e:
            backlog_ok = False
            tap.diag(str(e))
        finally:
            driver.set_window_size(1400, 1100)

        # 6. throughput: the history's points and the live ones
        def enough():
            d = js(driver, "return window.taskpushDashboard.throughput")
            return d if len(d) >= 8 and sum(1 for p in d if p[1] > 0) >= 3 else None
        try:
            tp = wait_for("throughput points", enough, 30, 0.5)
        except TimeoutError as e:
            tp = js(driver, "return window.taskpushDashboard.throughput")
            tap.diag(str(e))
        positive = [p for p in tp if p[1] > 0]
        tap.result(len(tp) >= 3 and len(positive) >= 1,
                   "%d points, %d > 0, max %.1f/s" % (len(tp), len(positive), max([p[1] for p in tp] or [0])))

        # The FAILED rows are counted by the table figures (every 500 ms here).
        wait_for("the FAILED tile", lambda: js(driver,
            "return document.getElementById('f-failed').getAttribute('data-value')") == str(NFAILED), 15)
        page = js(driver, PAGE_STATE)
        fresh = get_json(admin, "/stats")
        fresh_workers = get_json(admin, "/workers")

        # 7. depth
        st = page["stats"]
        want = st["queue"]["buffered"] + st["queue"]["in_flight"]
        got = page["depth"][-1][1] if page["depth"] else None
        tap.result(got == want and got >= 0,
                   "latest depth %r, lastStats buffered+in_flight %r (fresh /stats: %r)" %
                   (got, want, fresh["queue"]["buffered"] + fresh["queue"]["in_flight"]))

        # 8. the page's counters against a /stats fetched right after
        ps, fs = st["tasks"]["succeeded_total"], fresh["tasks"]["succeeded_total"]
        rate = max([p[1] for p in tp] or [0])
        tolerance = max(100, int(rate * 5))
        tap.result(ps <= fs and fs - ps <= tolerance,
                   "page %d, fresh %d, tolerance %d" % (ps, fs, tolerance))

        # 9. headline figures
        figs = {i: (v, t) for i, v, t in page["figs"]}
        problems = []
        for fid, want_v in (("f-succeeded", st["tasks"]["succeeded_total"]),
                            ("f-failed", st["table"]["by_state"]["failed"]),
                            ("f-workers", st["workers"])):
            if figs.get(fid, (None,))[0] != str(want_v):
                problems.append("%s shows %r, lastStats %r" % (fid, figs.get(fid), want_v))
        if figs.get("f-db", ("",))[0] != "true" or figs["f-db"][1] != "yes":
            problems.append("f-db %r" % (figs.get("f-db"),))
        tap.result(not problems, "; ".join(problems))

        # 10. FAILED counted by the table, not since start
        table_failed = db.count("task_state = 3")
        tap.result(figs["f-failed"][0] == str(table_failed) == str(NFAILED) and figs["f-failed"][1] == str(NFAILED),
                   "tile %r, table %d" % (figs["f-failed"], table_failed))

        # 11. worker table
        rows = page["workerRows"]
        want_rows = sorted((w["name"], str(w["capacity"])) for w in fresh_workers)
        got_rows = sorted((r["key"], r["attrs"]["capacity"]) for r in rows)
        shown_caps = all(r["cells"][3].replace("\u2009", "") == r["attrs"]["capacity"] for r in rows)
        tap.result(got_rows == want_rows and shown_caps and sorted(names) == [r[0] for r in want_rows],
                   "rows %r, /workers %r" % ([(r["key"], r["cells"]) for r in rows], want_rows))

        # 12. /stats by_type adds up to the queue; type rows; columns: type, ready, delayed, buffered, in flight, failed,
        # failure rate, oldest ready, workers, state, action
        orphan = wait_for("the orphan row", lambda: row_of(js(driver, PAGE_STATE)["typeRows"], "orphan"), PAGE_WAIT_S)
        page = js(driver, PAGE_STATE)
        resize = row_of(page["typeRows"], "resize")
        flaky_row = row_of(page["typeRows"], "flaky")
        problems = []
        fresh = get_json(admin, "/stats")
        for key, total in (("buffered", fresh["queue"]["buffered"]), ("in_flight", fresh["queue"]["in_flight"])):
            if sum(t[key] for t in fresh["by_type"]) != total:
                problems.append("by_type %s %r, queue %d" % (key, fresh["by_type"], total))
        if orphan["cells"][8] != "no worker" or orphan["colors"][8] != RED or orphan["attrs"]["noWorker"] != "true":
            problems.append("orphan %r %r" % (orphan["cells"], orphan["colors"]))
        if orphan["cells"][1] != str(NORPHAN) or orphan["cells"][7] in ("–", ""):
            problems.append("orphan ready/oldest %r" % orphan["cells"])
        if not resize or resize["cells"][8] != "1" or resize["colors"][8] == RED or resize["buttons"] != ["Pause"]:
            problems.append("resize %r" % (resize,))
        if not flaky_row or flaky_row["cells"][5] != str(NFLAKY) or flaky_row["cells"][8] == "no worker":
            problems.append("flaky (no ready row: no alarm) %r" % (flaky_row,))
        # Once the served backlog is gone, the queue lag is the orphan rows', and says so. The
        # bound is loose: on a loaded 2-core machine the backlog took more than 40 s to drain.
        try:
            wait_for("the lag's note", lambda: js(driver,
                "return document.getElementById('f-lag-note').textContent") == "type orphan has no worker", 120, 0.5)
        except TimeoutError as e:
            problems.append(str(e))
        tap.result(not problems, "; ".join(problems))

        # 12b. what to do for the type nobody serves: a command to run, shown on the page
        def orphan_hint():
            hs = js(driver, "return window.taskpushDashboard.hints")
            return [h for h in hs if h["kind"] == "no-worker" and h.get("type") == "orphan"] or None
        problems = []
        try:
            hint = wait_for("the orphan hint", orphan_hint, 10)[0]
        except TimeoutError as e:
            hint = {"text": ""}
            problems.append(str(e))
        shown = js(driver, """
          var li = document.querySelector('#hints-list li[data-hint="no-worker"][data-type="orphan"]');
          return li && !document.getElementById('hints').hidden && li.offsetParent !== null ?
                 [li.textContent, li.querySelectorAll('code').length] : null;""")
        for want in ("no worker serves orphan", "start one with",
                     "taskpush-worker --connect %s --type orphan --exec 'COMMAND'" % listen):
            if want not in hint["text"]:
                problems.append("%r not in %r" % (want, hint["text"]))
        if not shown or shown[0] != hint["text"] or shown[1] != 2:
            problems.append("on the page: %r" % (shown,))
        if any(h["kind"] == "no-worker" and h.get("type") != "orphan" and h.get("type") != "flaky"
               for h in js(driver, "return window.taskpushDashboard.hints")):
            problems.append("a no-worker hint for a type that has workers")
        # A paused type with ready rows: the hint says to resume it, and goes with the pause.
        code, _ = post(admin, "/pause?type=orphan", TOKEN)
        try:
            paused = wait_for("the paused hint", lambda: [h for h in js(driver, "return window.taskpushDashboard.hints")
                                                          if h["kind"] == "paused" and h.get("type") == "orphan"], PAGE_WAIT_S)
            if "press Resume" not in paused[0]["text"]:
                problems.append("paused hint %r" % paused[0]["text"])
        except TimeoutError as e:
            problems.append("POST /pause %d: %s" % (code, e))
        post(admin, "/resume?type=orphan", TOKEN)
        try:
            wait_for("the paused hint gone", lambda: not [h for h in js(driver, "return window.taskpushDashboard.hints")
                                                          if h["kind"] == "paused"], PAGE_WAIT_S)
        except TimeoutError as e:
            problems.append(str(e))
        tap.result(not problems, "; ".join(problems) or hint["text"])

        # 12c. failure rate: the workers' answers per type (by_type), as a share of failures
        problems = []
        bt = {t["type"]: t for t in get_json(admin, "/stats")["by_type"]}
        if "default" not in bt or bt["default"].get("answered_ok_total", 0) <= 0 or \
                bt["default"].get("answered_failed_total") != 0:
            problems.append("/stats by_type default %r" % bt.get("default"))
        # The rate is over the answers the page saw between its polls: a few more default
        # tasks, so that some are answered while it watches however fast the first drained.
        db.run("INSERT INTO task (task_type, payload) VALUES " +
               ",".join("('default', '{\"late\":%d}')" % i for i in range(20)), db=db.name)
        try:
            wait_for("default's failure rate", lambda: (row_of(js(driver, PAGE_STATE)["typeRows"], "default") or
                                                        {"cells": [""] * 7})["cells"][6] == "0 %", PAGE_WAIT_S)
        except TimeoutError as e:
            problems.append(str(e))
        tap.result(not problems, "; ".join(problems))

        # 12d. the busiest keys: the orphan rows wait in the table under two keys
        def keys_shown():
            kr = [r for r in js(driver, PAGE_STATE)["keyRows"] if r["cells"][0] == "orphan"]
            return kr if [(r["key"], r["cells"][4]) for r in kr] == [("tenant-a", "2"), ("tenant-b", "1")] else None
        try:
            kr = wait_for("orphan's keys in the page", keys_shown, PAGE_WAIT_S)
            api = [t for t in get_json(admin, "/keys")["types"] if t["type"] == "orphan"]
            api_keys = [(k["key"], k["waiting"]) for k in api[0]["keys"]] if api else None
            tap.result(api_keys == [("tenant-a", 2), ("tenant-b", 1)], "page %r, /keys %r" % (kr, api_keys))
        except TimeoutError as e:
            tap.result(False, str(e))

        # 13. the failures list
        def failures_listed():
            fr = js(driver, PAGE_STATE)["failureRows"]
            return fr if len(fr) == NFAILED else None
        frows = wait_for("the failures list", failures_listed, 15)
        failed_rows = [line.split("\t") for line in db.run(
            "SELECT task_id, task_type FROM task WHERE task_state = 3 ORDER BY last_update_time DESC, task_id DESC",
            db=db.name).splitlines()]
        ids = [int(r[0]) for r in failed_rows]
        brittle = [int(r[0]) for r in failed_rows if r[1] == "brittle"]
        problems = []
        if [int(r["key"]) for r in frows] != ids:
            problems.append("ids %r, table %r" % ([r["key"] for r in frows], ids))
        for r in frows:
            if int(r["key"]) in brittle:
                if "brittle: try again" not in r["cells"][4] or r["buttons"] != ["Retry"]:
                    problems.append("exhausted row %r" % r)
            elif ("flaky: cannot open /data/%s <img src=/x><b>bold</b>" % r["key"] not in r["cells"][4]
                    or r["buttons"] != [] or "permanent" not in r["cells"][5]):
                problems.append("permanent row %r" % r)
        if len(brittle) != NBRITTLE:
            problems.append("brittle FAILED %r" % brittle)
        markup = js(driver, "return document.querySelectorAll('#failures-body img, #failures-body b').length")
        if markup:
            problems.append("%d elements made of an error's text" % markup)
        tap.result(not problems, "; ".join(problems))

        # 13b. the backlog with its failures, and what to do: the screenshot of docs/ (taken above)
        tap.result(backlog_ok and os.path.getsize(backlog_shot) > 10000, backlog_shot)

        # 13c. the task view: a task that waits (SQL form) on an orphan task, which no
        # worker takes, so it stays waiting
        orphan = int(db.run("SELECT MIN(task_id) FROM task WHERE task_type = 'orphan' AND task_state = 0",
                            db=db.name).strip())
        db.run("START TRANSACTION; INSERT INTO task (task_type, `delayed`) VALUES ('default', 2);"
               " INSERT INTO task_dep (task_id, parent_id) VALUES (LAST_INSERT_ID(), %d); COMMIT;" % orphan,
               db=db.name)
        waiter = int(db.run("SELECT MAX(task_id) FROM task WHERE `delayed` = 2", db=db.name).strip())
        js(driver, "document.getElementById('task-id').value = arguments[0];"
                   " document.querySelector('#task-find button').click();", str(waiter))
        try:
            view = wait_for("the task view", lambda: (lambda t: t if "waits on 1, 1 pending" in t else None)(
                js(driver, "var e = document.getElementById('task-view'); return e.hidden ? '' : e.textContent")),
                PAGE_WAIT_S)
            tap.result(str(orphan) in view and "(waiting)" in view, "task %d: %r" % (waiter, view))
        except TimeoutError as e:
            tap.result(False, "task %d: %s" % (waiter, e))

        # 14. a POST without the token
        js(driver, "window.sessionStorage.removeItem('taskpush.adminToken')")
        click(driver, 'tr[data-type="resize"]', "Pause")
        msg = wait_for("the 401 message", lambda: (lambda p: p if "401" in p["msg"] else None)(js(driver, PAGE_STATE)), PAGE_WAIT_S)
        tap.result("admin token" in msg["msg"] and msg["msgColor"] == RED and
                   get_json(admin, "/stats")["paused"]["types"] == [],
                   "message %r in %s" % (msg["msg"], msg["msgColor"]))

        # 15. with the token: pause, then resume from the row's button
        tok = driver.find_element("id", "token")
        tok.send_keys(TOKEN)
        driver.find_element("id", "token-save").click()
        problems = []
        stored = js(driver, "return [window.sessionStorage.getItem('taskpush.adminToken'), "
                            "window.localStorage.length, document.cookie]")
        if stored != [TOKEN, 0, ""]:
            problems.append("token kept as %r" % (stored,))
        click(driver, 'tr[data-type="resize"]', "Pause")
        p1 = wait_for("resize paused on the page", lambda: (lambda p: p if (row_of(p["typeRows"], "resize") or {})
                      .get("attrs", {}).get("paused") == "true" else None)(js(driver, PAGE_STATE)), PAGE_WAIT_S)
        r1 = row_of(p1["typeRows"], "resize")
        if get_json(admin, "/stats")["paused"]["types"] != ["resize"]:
            problems.append("/stats paused %r" % get_json(admin, "/stats")["paused"])
        if r1["cells"][9] != "paused" or r1["buttons"] != ["Resume"] or "resize" not in p1["state"]:
            problems.append("row %r, state %r" % (r1["cells"], p1["state"]))
        click(driver, 'tr[data-type="resize"]', "Resume")
        wait_for("resize running on the page", lambda: (lambda p: p if (row_of(p["typeRows"], "resize") or {})
                 .get("attrs", {}).get("paused") == "false" else None)(js(driver, PAGE_STATE)), PAGE_WAIT_S)
        if get_json(admin, "/stats")["paused"]["types"] != []:
            problems.append("still paused after Resume: %r" % get_json(admin, "/stats")["paused"])
        tap.result(not problems, "; ".join(problems))

        # 16. the failures, on screen
        js(driver, "document.getElementById('types').scrollIntoView()")
        time.sleep(0.3)
        shot2 = os.path.join(build, "dashboard-failures.png")
        ok = driver.save_screenshot(shot2)
        tap.result(ok and os.path.getsize(shot2) > 10000, shot2)
        js(driver, "window.scrollTo(0, 0)")

        # 17. retry the latest failure that has a Retry (its attempts ran out) from the page
        target = brittle[0]
        click(driver, 'tr[data-task-id="%d"]' % target, "Retry")
        state = wait_for("task %d NEW" % target, lambda: (lambda r: r if r == "0\t0" else None)(
            db.run("SELECT task_state, attempts FROM task WHERE task_id = %d" % target, db=db.name).strip()), PAGE_WAIT_S)
        gone = wait_for("the list without it", lambda: (lambda p: p if row_of(p["failureRows"], str(target)) is None
                        else None)(js(driver, PAGE_STATE)), 15)
        tap.result(state == "0\t0" and "back to NEW" in gone["msg"],
                   "row state, attempts %r; message %r" % (state, gone["msg"]))

        # 17b. retry every FAILED task of type flaky (permanent ones) failed in the last hour
        problems = []
        wait_for("flaky in the retry-all choice", lambda: js(driver,
            "return Array.prototype.map.call(document.getElementById('retry-type').options,"
            " function (o) { return o.value; })").count("flaky") == 1, PAGE_WAIT_S)

        def ask():
            js(driver, "var s = document.getElementById('retry-type'); s.value = 'flaky';"
                       "document.getElementById('retry-since').value = '3600000';"
                       "document.getElementById('retry-all-btn').click();")
            return wait_for("the confirmation", lambda: js(driver,
                "var c = document.getElementById('retry-confirm');"
                "return c.hidden ? null : document.getElementById('retry-confirm-text').textContent"), 5)
        text = ask()
        if "type flaky" not in text or "failed since" not in text or "?" not in text:
            problems.append("confirmation %r" % text)
        js(driver, "document.getElementById('retry-confirm-no').click()")
        time.sleep(0.5)
        if db.count("task_type = 'flaky' AND task_state = 3") != NFLAKY:
            problems.append("Cancel retried something")
        if not js(driver, "return document.getElementById('retry-confirm').hidden"):
            problems.append("the confirmation stays after Cancel")
        ask()
        js(driver, "document.getElementById('retry-confirm-yes').click()")
        try:
            wait_for("the flaky rows NEW", lambda: db.count("task_type = 'flaky' AND task_state = 0 AND attempts = 0")
                     == NFLAKY, PAGE_WAIT_S)
            msg = wait_for("the answer", lambda: (lambda m: m if "flaky back to NEW" in m else None)(
                js(driver, PAGE_STATE)["msg"]), PAGE_WAIT_S)
            if not msg.startswith("%d FAILED task(s) of flaky back to NEW" % NFLAKY):
                problems.append("message %r" % msg)
        except TimeoutError as e:
            problems.append(str(e))
        if db.count("task_type = 'brittle' AND task_state = 3") != NBRITTLE - 1:
            problems.append("another type's rows moved")
        tap.result(not problems, "; ".join(problems))

        # 18. requests only to the admin port
        entries = js(driver,
            "return performance.getEntriesByType('navigation').concat("
            "performance.getEntriesByType('resource')).map(function (e) { return e.name; })")
        foreign = [u for u in entries if urlsplit(u).netloc != admin or urlsplit(u).scheme != "http"]
        paths = sorted(set(urlsplit(u).path for u in entries))
        tap.result(len(entries) >= 3 and not foreign and "/stats" in paths and "/failed" in paths,
                   "%d requests, paths %s, foreign %s" % (len(entries), paths, foreign[:5]))

        # 19. console: the one 401 this test provoked is logged by Chromium; nothing else
        logs = driver.get_log("browser")
        bad = [e for e in logs if e.get("level") in ("SEVERE", "WARNING") and
               not ("/pause" in e.get("message", "") and "401" in e.get("message", ""))]
        page = js(driver, PAGE_STATE)
        tap.result(not bad and not page["errors"], "console: %s; page errors: %s" % (bad[:5], page["errors"]))

        # 20. screenshot while the tasks flow
        shot = os.path.join(build, "dashboard.png")
        ok = driver.save_screenshot(shot)
        tap.result(ok and os.path.getsize(shot) > 10000, shot)

        # 21. drain
        code, _ = post(admin, "/drain", TOKEN)
        drained = wait_for("the drain on the page", lambda: (lambda p: p if p["stateAttrs"][0] == "true"
                           else None)(js(driver, PAGE_STATE)), PAGE_WAIT_S)
        tap.result(code == 200 and "draining" in drained["state"], "POST /drain %d, state %r" % (code, drained["state"]))

        # 22. dispatcher down
        polls_before = js(driver, "return window.taskpushDashboard.polls")
        stop_process(daemon)
        try:
            text = wait_for("'no answer'", lambda: (lambda s: s if "no answer" in s else None)(
                driver.find_element("id", "status").text), 15)
            time.sleep(2.5)
            d = js(driver,
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
