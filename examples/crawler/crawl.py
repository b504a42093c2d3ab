"""crawl: the driver of the crawler example (examples/crawler/README.md), run by run.sh.

Owns one crawl from start to summary: the schema on the database (loaded when
missing), a taskpushd of the build tree on free loopback ports, the worker
processes of crawler.py, the seed, the wait for the end (no `crawl` row NEW or
PROCESSING and nothing in flight in /stats) and the summary, `crawled N pages`.
SQL goes through the mariadb command-line client (no database driver needed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

import crawler  # also puts python/ on sys.path
import taskpush

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


class Database:
    """SQL on the --db URL through the mariadb client."""

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "mysql" or not u.hostname or not u.path.strip("/"):
            raise ValueError(f"not a mysql://USER[:PASSWORD]@HOST[:PORT]/DB URL: {url}")
        self.name = u.path.strip("/")
        if not all(c.isalnum() or c in "_$" for c in self.name):
            raise ValueError(f"bad database name {self.name!r}")
        client = shutil.which("mariadb") or shutil.which("mysql")
        if client is None:
            raise RuntimeError("no mariadb (or mysql) command-line client found")
        self.args = [client, "--no-defaults", "--batch", "--skip-column-names", "--raw",
                     "--default-character-set=utf8mb4", "-u", urllib.parse.unquote(u.username or "")]
        sock = urllib.parse.parse_qs(u.query).get("socket")
        if u.port is not None:
            self.args += ["--protocol=tcp", "-h", u.hostname, "-P", str(u.port)]
        elif sock:
            self.args += ["--protocol=socket", "-S", sock[0]]
        else:
            self.args += ["-h", u.hostname]
        self.env = dict(os.environ)
        password = urllib.parse.unquote(u.password) if u.password else os.environ.get("TASKPUSH_DB_PASSWORD")
        if password:
            self.env["MYSQL_PWD"] = password  # not on the command line, where ps shows it

    def run(self, sql: str, use_db: bool = True) -> List[List[str]]:
        args = self.args + ([self.name] if use_db else [])
        r = subprocess.run(args, input=sql.encode(), capture_output=True, env=self.env, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"SQL failed: {sql[:200]}\n{r.stderr.decode(errors='replace').strip()}")
        return [line.split("\t") for line in r.stdout.decode(errors="replace").splitlines()]

    def value(self, sql: str) -> int:
        rows = self.run(sql)
        return int(rows[0][0]) if rows and rows[0][0] not in ("", "NULL") else 0

    def ensure_schema(self, schema_path: str, table: str, taskpushd: str, url: str) -> None:
        self.run(f"CREATE DATABASE IF NOT EXISTS `{self.name}` CHARACTER SET utf8mb4", use_db=False)
        have = self.value("SELECT COUNT(*) FROM information_schema.tables "
                          f"WHERE table_schema = DATABASE() AND table_name = '{table}'")
        if have:
            return
        if table == "task":
            note(f"loading {schema_path} into {self.name}")
            with open(schema_path) as f:
                self.run(f.read())
            return
        # Another table's schema is sql/schema.sql under its names, which --migrate makes.
        note(f"creating the table {table} in {self.name} (taskpushd --table {table} --migrate)")
        r = subprocess.run([taskpushd, "--db", url, "--table", table, "--migrate"], capture_output=True,
                           timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"taskpushd --migrate failed: {r.stderr.decode(errors='replace').strip()}")


def note(msg: str) -> None:
    print(f"crawl: {msg}", file=sys.stderr, flush=True)


class Daemon:
    """taskpushd on free loopback ports, found through its ready file."""

    def __init__(self, exe: str, db_url: str, workdir: str, extra: List[str]) -> None:
        self.ready = os.path.join(workdir, "taskpushd.ready")
        self.log_path = os.path.join(workdir, "taskpushd.log")
        args = [exe, "--db", db_url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                "--ready-file", self.ready, "--log-level", "warn"] + extra
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        end = time.monotonic() + 30
        while True:
            try:
                with open(self.ready) as f:
                    r = json.load(f)
                self.listen, self.admin = str(r["listen"]), str(r["admin"])
                break
            except (OSError, ValueError, KeyError):
                pass
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"taskpushd did not start:\n{self.log_tail()}")
            time.sleep(0.05)
        while not self.stats().get("leader"):  # a SUBMIT before leadership is UNAVAILABLE
            if self.proc.poll() is not None or time.monotonic() > end:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"taskpushd did not lead the table:\n{self.log_tail()}")
            time.sleep(0.05)

    def stats(self) -> Dict[str, object]:
        try:
            with urllib.request.urlopen(f"http://{self.admin}/stats", timeout=10) as r:
                return dict(json.load(r))
        except (OSError, ValueError):
            return {}

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""


def stop(proc: subprocess.Popen, grace_s: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def finished(db: Database, d: Daemon, table: str) -> bool:
    """True when no crawl row waits or runs and the dispatcher holds nothing."""
    if db.value(f"SELECT COUNT(*) FROM {table} WHERE task_type = '{crawler.TASK_TYPE}' "
                "AND task_state IN (0, 1)"):
        return False
    s = d.stats()
    q, dbs = s.get("queue"), s.get("db")
    return (isinstance(q, dict) and isinstance(dbs, dict) and q.get("in_flight") == 0
            and q.get("buffered") == 0 and dbs.get("pending_writes") == 0)


def main() -> int:
    ap = argparse.ArgumentParser(prog="run.sh", description="crawl every page reachable from START_URL "
                                 "on its host, with taskpush as the frontier")
    ap.add_argument("--db", help="mysql://USER[:PASSWORD]@HOST[:PORT]/DB (required but with --check)")
    ap.add_argument("--check", action="store_true", help="check the arguments only (run.sh, before it "
                    "builds or starts a database)")
    ap.add_argument("--build", default=os.environ.get("TASKPUSH_BUILD_ROOT", os.path.join(ROOT, "build")))
    ap.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    ap.add_argument("--threads", type=int, default=8, help="fetches at once per worker (default 8)")
    ap.add_argument("--timeout", type=float, default=5.0, help="fetch timeout in seconds (default 5)")
    ap.add_argument("--attempts", type=int, default=2, help="attempts of a page (default 2)")
    ap.add_argument("--table", default="task", help="the task table's name, as taskpushd --table (default task)")
    ap.add_argument("start_url")
    a = ap.parse_args()
    if not 1 <= a.workers <= 64 or not 1 <= a.threads <= 256:
        ap.error("--workers 1-64, --threads 1-256")
    if not 0 < a.timeout <= 3600 or not 1 <= a.attempts <= 100:
        ap.error("--timeout 0-3600 s, --attempts 1-100")
    # taskpushd's rule (it would refuse another name, exit 2); the name goes into SQL unquoted.
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,35}", a.table):
        ap.error(f"--table: 1 to 36 of A-Z a-z 0-9 _, not starting with a digit: {a.table!r}")
    start = crawler.normalise(a.start_url)
    if start is None:
        ap.error(f"START_URL must be an http or https URL with a host: {a.start_url}")
    if a.db is None and not a.check:
        ap.error("--db is required")
    try:
        db = Database(a.db) if a.db is not None else None
    except (ValueError, RuntimeError) as e:
        ap.error(str(e))
    if a.check:
        return 0
    assert db is not None
    try:
        return crawl(a, start, db)
    except RuntimeError as e:  # SQL, taskpushd or a worker failed
        note(str(e))
        return 1


def wait_done(db: Database, d: Daemon, workers: List[subprocess.Popen], first_id: int, table: str) -> None:
    """Returns once the crawl is finished (twice in a row: a page's links are rows
    before the page leaves PROCESSING, see README.md); RuntimeError when a process died."""
    last_note = time.monotonic()
    while not (finished(db, d, table) and finished(db, d, table)):
        if d.proc.poll() is not None:
            raise RuntimeError(f"taskpushd exited ({d.proc.returncode}):\n{d.log_tail()}")
        dead = [w for w in workers if w.poll() is not None]
        if dead:
            raise RuntimeError(f"a worker process exited ({dead[0].returncode})")
        if time.monotonic() - last_note > 10:
            last_note = time.monotonic()
            n = db.run(f"SELECT COUNT(*), SUM(task_state IN (0, 1)) FROM {table} WHERE task_id > {first_id} "
                       f"AND task_type = '{crawler.TASK_TYPE}'")[0]
            note(f"{n[0]} pages found, {n[1]} to do")
        time.sleep(0.2)


def crawl(a: argparse.Namespace, start: str, db: Database) -> int:
    taskpushd = os.path.join(a.build, "dispatcher", "taskpushd")
    db.ensure_schema(os.path.join(ROOT, "sql", "schema.sql"), a.table, taskpushd, a.db)
    first_id = db.value(f"SELECT COALESCE(MAX(task_id), 0) FROM {a.table}")
    lease_ms = int(a.timeout * 1000) + 30000
    workdir = tempfile.mkdtemp(prefix="tp-crawl-")
    workers: List[subprocess.Popen] = []
    d: Optional[Daemon] = None
    try:
        # A short first retry: a page that timed out is tried again soon.
        d = Daemon(taskpushd, a.db, workdir,
                   ["--retry-backoff-ms", "500", "--retry-backoff-max-ms", "10000", "--table", a.table])
        wargs = ["--threads", str(a.threads), "--timeout", str(a.timeout), "--attempts", str(a.attempts),
                 "--task-timeout-ms", str(lease_ms)]
        for _ in range(a.workers):
            workers.append(subprocess.Popen([sys.executable, os.path.join(HERE, "crawler.py"), "worker",
                                             d.listen] + wargs, stdin=subprocess.DEVNULL))
        c = crawler.Crawler(d.listen, a.timeout, a.attempts, lease_ms)
        try:
            r = c.client.submit_many([c.task_for(start)], timeout_s=crawler.SUBMIT_WAIT_S)[0]
        except (taskpush.SubmitError, TimeoutError) as e:
            raise RuntimeError(f"submitting the seed failed: {e}") from None
        finally:
            c.client.close()
        if r.duplicate:
            note(f"{start} is in the table already (task {r.task_id}): an earlier crawl; "
                 "only its unfinished pages are crawled")
        note(f"crawling from {start} (dispatcher {d.listen}, admin {d.admin})")
        wait_done(db, d, workers, first_id, a.table)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            stop(w)
        if d is not None:
            stop(d.proc)
        shutil.rmtree(workdir, ignore_errors=True)

    where = f"task_type = '{crawler.TASK_TYPE}' AND task_id > {first_id}"
    failed = db.run(f"SELECT payload, REPLACE(REPLACE(err_msg, '\\n', ' '), '\\t', ' ') FROM {a.table} "
                    f"WHERE {where} AND task_state = 3 ORDER BY task_id")
    for url, msg in failed:
        print(f"failed {url}: {msg}")
    n = db.value(f"SELECT COUNT(*) FROM {a.table} WHERE {where} AND task_state = 2")
    print(f"crawled {n} pages", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
