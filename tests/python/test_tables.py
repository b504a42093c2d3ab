"""test_tables: issue 31's Must show 2 end to end: `taskpushd --table jobs` beside a
team's own table `task`, and every tool on it. Real components: the build tree's
taskpushd, taskpushctl, taskpush-worker and taskpush-bench, the Python library
(python/taskpush), the private MariaDB of scripts/tp-mariadb.

Cases:
  beside_team_table  a database holding only the team's table `task` (its own shape
                     and state codes, 200 rows): --table jobs --migrate creates jobs and
                     its three tables; taskpushd --table jobs leads; rows inserted into
                     jobs are drained by a C worker (taskpush-worker) and a Python worker,
                     and Python SUBMITs land in jobs and run; taskpushctl stats shows
                     the table jobs (text and --json), and workers, health, schedules,
                     failed, show, retry, cancel, requeue-failed, pause, resume, drain
                     and submit act on jobs; the dashboard page and its JSON are served
                     for jobs; a second queue mail (--migrate, its own taskpushd) leads
                     beside it, each /stats naming its table; taskpush-bench --table jobs
                     drains and verifies; the team's table keeps its CHECKSUM TABLE, its
                     SHOW CREATE TABLE and its 200 rows throughout.

Python itself needs no table name (it speaks the protocol): the case shows that a
Worker and a Client work unchanged against --table jobs.
"""
import os
import pathlib
import re
import subprocess
import sys
import threading
import unittest
from typing import List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tplib  # noqa: E402

import taskpush  # noqa: E402

TEAM_ROWS = 200
ROWS = 100  # per worker kind
TEAM_TABLE = ("CREATE TABLE task (task_id BIGINT PRIMARY KEY AUTO_INCREMENT, task_state INT NOT NULL,"
              " task_priority INT NOT NULL, insert_time BIGINT NOT NULL, last_update_time BIGINT NOT NULL,"
              " payload TEXT) ENGINE=InnoDB")
FLAGS = ["--poll-ms", "20", "--table-stats-ms", "200", "--heartbeat-ms", "200"]


def build(*parts: str) -> str:
    return str(tplib.BUILD_ROOT.joinpath(*parts))


class Tables(unittest.TestCase):
    def setUp(self) -> None:
        self.db = tplib.TestDB("tables")
        self.addCleanup(self.db.drop)
        # Only the team's own table: none of taskpush's.
        self.db.exec("DROP TABLE task, taskpush_meta, task_schedule, task_claim, task_setting, task_progress, task_dep; " + TEAM_TABLE)
        self.db.exec("INSERT INTO task (task_state, task_priority, insert_time, last_update_time, payload)"
                     f" SELECT 1 + seq % 4, seq % 3, 1700000000000 + seq, 1700000000000 + seq,"
                     f" CONCAT('team-', seq) FROM seq_1_to_{TEAM_ROWS}")
        self.team = self.team_fingerprint()
        self.procs: List[subprocess.Popen] = []  # type: ignore[type-arg]
        self.daemons: List[tplib.Daemon] = []
        self.workers: List[taskpush.Worker] = []

    def tearDown(self) -> None:
        for w in self.workers:
            w.stop()
        for p in self.procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for d in self.daemons:
            d.close()

    def team_fingerprint(self) -> List[str]:
        return [self.db.rows("SHOW CREATE TABLE task")[0][1], self.db.rows("CHECKSUM TABLE task")[0][1],
                self.db.value("SELECT COUNT(*) FROM task")]

    def migrate(self, table: str) -> str:
        r = subprocess.run([build("dispatcher", "taskpushd"), "--db", self.db.url, "--table", table, "--migrate"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def daemon(self, table: str) -> tplib.Daemon:
        d = tplib.Daemon(self.db.url, FLAGS + ["--table", table])
        self.daemons.append(d)
        return d

    def ctl(self, d: tplib.Daemon, *args: str, stdin: bytes = b"", rc: int = 0) -> str:
        # submit speaks to the worker port (--worker), every other command to the admin port.
        where = [] if "submit" in args else ["--admin", d.admin]
        r = subprocess.run([build("ctl", "taskpushctl")] + where + list(args), input=stdin,
                           capture_output=True, timeout=30)
        out = r.stdout.decode(errors="replace")
        self.assertEqual(r.returncode, rc, f"taskpushctl {' '.join(args)}: {out}{r.stderr.decode(errors='replace')}")
        return out

    def count(self, where: str) -> int:
        return int(self.db.value(f"SELECT COUNT(*) FROM jobs WHERE {where}"))

    def test_beside_team_table(self) -> None:
        out = self.migrate("jobs")
        self.assertIn("created schema version", out)
        self.assertEqual(sorted(r[0] for r in self.db.rows("SHOW TABLES")),
                         ["jobs", "jobs_claim", "jobs_dep", "jobs_meta", "jobs_progress", "jobs_schedule", "jobs_setting", "task"])
        self.assertEqual(self.team_fingerprint(), self.team)

        d = self.daemon("jobs")
        self.assertEqual(d.json("/stats")["task_table"], "jobs")

        # A Python worker (type py) and a C worker (type c) drain what is inserted into jobs.
        seen: List[bytes] = []
        lock = threading.Lock()

        def py(task: taskpush.Task) -> bytes:
            with lock:
                seen.append(task.payload)
            return b"py:" + task.payload

        w = taskpush.Worker(d.listen, name="py-worker", reconnect_min_ms=50, reconnect_max_ms=200)
        w.add_handler("py", py, concurrency=4)
        threading.Thread(target=w.run, name="worker-run", daemon=True).start()
        self.workers.append(w)
        self.procs.append(subprocess.Popen(
            [build("worker-client", "taskpush-worker"), "--connect", d.listen, "--type", "c", "--concurrency", "4",
             "--name", "c-worker", "--exec", "cat", "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        tplib.wait_for(lambda: len(d.json("/workers")) == 2, "both workers to connect")
        self.db.exec(f"INSERT INTO jobs (task_type, payload) SELECT 'py', CONCAT('py-', seq) FROM seq_1_to_{ROWS};"
                     f" INSERT INTO jobs (task_type, payload) SELECT 'c', CONCAT('c-', seq) FROM seq_1_to_{ROWS}")
        # Python SUBMITs: into jobs, run by the Python worker, one waited for.
        with taskpush.Client(d.listen, name="py-producer") as c:
            subs = [c.submit("py", f"sub-{i}".encode()) for i in range(10)]
            waited = c.submit("py", b"sub-waited", wait=True, wait_timeout_s=tplib.WAIT_S)
        assert waited.outcome is not None
        self.assertEqual((waited.outcome.succeeded, waited.outcome.data), (True, b"py:sub-waited"))
        total = 2 * ROWS + 11
        tplib.wait_for(lambda: self.count("task_state = 2") == total, "jobs to drain")
        self.assertEqual(self.count("task_state = 2 AND attempts = 1"), total)
        with lock:
            self.assertEqual(sorted(seen), sorted([f"py-{i}".encode() for i in range(1, ROWS + 1)] +
                                                  [f"sub-{i}".encode() for i in range(10)] + [b"sub-waited"]))
        self.assertEqual(self.count("task_type = 'c' AND result = payload"), ROWS)
        ids = ",".join(str(r.task_id) for r in subs)
        self.assertEqual(self.count(f"task_id IN ({ids}) AND result = CONCAT('py:', payload)"), 10)

        # taskpushctl: every command on jobs.
        # The figures are read every --table-stats-ms: wait for a reading made after the drain.
        tplib.wait_for(lambda: d.json("/stats").get("table", {}).get("by_state", {}).get("successful") == total,
                       "the table figures after the drain")
        stats = self.ctl(d, "stats")
        self.assertRegex(stats, r"(?m)^task table  jobs$")
        self.assertRegex(stats, rf"(?m)^table +0 new .*\n +{total} successful")
        self.assertIn('"task_table":"jobs"', self.ctl(d, "--json", "stats").replace(" ", ""))
        workers = self.ctl(d, "workers")
        self.assertIn("py-worker", workers)
        self.assertIn("c-worker", workers)
        self.assertEqual(self.ctl(d, "health").strip(), "ok")
        self.ctl(d, "schedules")
        # A FAILED row of a type no worker takes: failed, show, retry, cancel, requeue-failed.
        self.db.exec("INSERT INTO jobs (task_type, task_state, payload, err_msg) VALUES ('idle', 3, 'x', 'boom')")
        fid = int(self.db.value("SELECT MAX(task_id) FROM jobs"))
        self.assertRegex(self.ctl(d, "failed"), rf"(?m)^\s*{fid}\b.*boom")
        self.assertIn("FAILED", self.ctl(d, "show", str(fid)))
        self.ctl(d, "retry", str(fid))
        tplib.wait_for(lambda: self.count(f"task_id = {fid} AND task_state = 0") == 1, "the retried row NEW")
        self.ctl(d, "cancel", str(fid))
        tplib.wait_for(lambda: self.count(f"task_id = {fid} AND task_state = 3 AND err_msg = 'cancelled'") == 1,
                       "the cancelled row FAILED")
        self.ctl(d, "--type", "idle", "requeue-failed")
        tplib.wait_for(lambda: self.count(f"task_id = {fid} AND task_state = 0") == 1, "the requeued row NEW")
        self.ctl(d, "pause")
        self.assertTrue(d.json("/stats")["paused"]["all"])
        self.ctl(d, "resume")
        self.assertFalse(d.json("/stats")["paused"]["all"])
        self.ctl(d, "drain")
        self.assertTrue(d.json("/stats")["draining"])
        self.ctl(d, "resume")
        self.assertFalse(d.json("/stats")["draining"])
        out = self.ctl(d, "--worker", d.listen, "submit", "--type", "c", stdin=b"ctl-submitted")
        sid = int(re.search(r"\d+", out).group(0))  # type: ignore[union-attr]
        tplib.wait_for(lambda: self.count(f"task_id = {sid} AND task_state = 2 AND result = 'ctl-submitted'") == 1,
                       "the task taskpushctl submitted to run")

        # The dashboard: its page (which names the table from /stats) and its JSON.
        page = d.http("GET", "/").decode()
        self.assertIn('id="task-table"', page)
        self.assertIn("st.task_table", page)
        self.assertIsInstance(d.json("/history"), (dict, list))

        # A second queue in the same database, with its own leader.
        self.migrate("mail")
        m = self.daemon("mail")
        self.assertEqual((m.json("/stats")["task_table"], m.json("/stats")["leader"]), ("mail", True))
        self.assertEqual((d.json("/stats")["task_table"], d.json("/stats")["leader"]), ("jobs", True))
        self.assertRegex(self.ctl(m, "stats"), r"(?m)^task table  mail$")

        # taskpush-bench on a table named jobs (its own scratch database).
        env = dict(os.environ)
        r = subprocess.run([build("bench", "taskpush-bench"), "--db", self.db.url.rsplit("/", 1)[0] +
                            f"/tp_py_bench_{os.getpid()}", "--table", "jobs", "--quick", "--json-only",
                            "--design", "taskpush-rr", "--k", "4", "--n", "500",
                            "--taskpushd", build("dispatcher", "taskpushd")],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"design":"taskpush-rr"', r.stdout)
        self.assertIn('"verified":true', r.stdout)

        # The team's table, through all of it.
        self.assertEqual(self.team_fingerprint(), self.team)


if __name__ == "__main__":
    tplib.tap_main("__main__")
