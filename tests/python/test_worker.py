"""test_worker: the Python Worker against the real taskpushd and MariaDB, over TCP.

Each case has its own database (tplib.TestDB) and taskpushd (tplib.Daemon, with a
200 ms heartbeat and short retry backoff). Waits are bounded polls; nothing
asserts how long something took (one case asserts a lower bound the dispatcher
must respect: a RETRY_AFTER delay).

Cases:
  drain_exactly_once     200 tasks: every row SUCCESSFUL with attempts 1 and the
                         handler's result; the handler ran 200 times, once per id; the
                         id, epoch, attempt, priority and lease it saw are the row's
  outcomes               PermanentFailure -> FAILED after 1 attempt with its text; Fail
                         -> retried, FAILED at max_attempts (2) with its text; an
                         exception -> a failed attempt with "ValueError: ..."; RetryAfter
                         1500 ms -> redelivered no sooner than 1.5 s later, then SUCCESSFUL
  concurrency_bound      two types with concurrency 3 and 2: never more handlers of a
                         type at once than its concurrency; the dispatcher shows
                         capacity 5 (the sum) for the worker
  extend_keeps_lease     a task with an 800 ms lease runs 2.5 s extending every 200 ms:
                         SUCCESSFUL at attempt 1, never cancelled
  cancel_honoured        POST /cancel of a running task: the handler sees cancelled,
                         the row is FAILED 'cancelled', and the worker takes tasks after
  stop_at_once           a second stop() closes at once: the running handler sees
                         cancelled, run() returns, the outcome is dropped and the
                         dispatcher takes the task back (NEW, attempt 1 used)
  dispatcher_stop        taskpushd gets SIGTERM while a task runs: its STOP lets the
                         handler finish, the outcome is written (SUCCESSFUL at attempt 1)
                         before it exits 0, and the worker then tries to reconnect
  reconnect_after_restart the dispatcher is killed (SIGKILL) and started again on the
                         same port: the worker reconnects and drains the new tasks
  idle_heartbeats        an idle worker stays connected over 8 heartbeat intervals (it
                         sends heartbeats, and takes the dispatcher's), then takes a task
  peer_silence           the dispatcher is stopped (SIGSTOP): the worker declares it lost
                         after 3 heartbeats, and after SIGCONT reconnects and drains
  sigterm_clean_shutdown a worker process gets SIGTERM with tasks running: it exits 0,
                         every task it started ended and is SUCCESSFUL at attempt 1,
                         and every other row was never delivered (attempts 0)
  tls_token_client_cert  taskpushd --tls-cert/--tls-key/--tls-ca with a token: a worker
                         with the CA, a client certificate and the token drains (a
                         3 MB payload and result among the tasks); one
                         without a client certificate and one with a wrong token never
                         complete a handshake
  two_addresses_one_dead a dead address first, the dispatcher second: the worker drains
  standby_first          a standby first, the leader second, a 30 s backoff: the standby
                         answers HELLO with NOT_LEADER (open_session raises NotLeader) and
                         holds no worker; the worker goes on to the leader at once (within
                         a wait shorter than any backoff) and drains
  ipv6                   a dispatcher on [::1]: the worker given "[::1]:PORT" drains
  protocol_version       the worker speaks the dispatcher's version: with a version 1
                         taskpushd it falls back after ERROR VERSION (submit refused,
                         Client refused); with a later one, a worker offering each
                         older version (1, 2, ...) gets a session of that version and
                         drains
"""
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from typing import Dict, List, Optional

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tplib  # noqa: E402

import taskpush  # noqa: E402

DAEMON_FLAGS = ["--heartbeat-ms", "200", "--retry-backoff-ms", "50", "--retry-backoff-max-ms", "200",
                "--poll-ms", "20", "--shutdown-grace-ms", "3000", "--orphan-grace-ms", "200"]


def dispatcher_protocol() -> int:
    out = subprocess.run([str(tplib.BUILD_ROOT / "dispatcher" / "taskpushd"), "--version"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.rsplit("protocol", 1)[1].strip(" )\n"))


class Case(unittest.TestCase):
    extra_flags: List[str] = []
    admin_ca: Optional[str] = None

    def setUp(self) -> None:
        self.db = tplib.TestDB(self.id().rsplit(".", 1)[-1])
        self.daemons: List[tplib.Daemon] = []
        self.workers: List[taskpush.Worker] = []
        self.threads: List[threading.Thread] = []
        self.d = self.daemon()

    def daemon(self, extra: Optional[List[str]] = None, listen: str = "127.0.0.1:0",
               lead: bool = True) -> tplib.Daemon:
        d = tplib.Daemon(self.db.url, DAEMON_FLAGS + self.extra_flags + (extra or []), listen, self.admin_ca,
                         lead)
        self.daemons.append(d)
        return d

    def start(self, w: taskpush.Worker) -> taskpush.Worker:
        t = threading.Thread(target=w.run, name="worker-run", daemon=True)
        t.start()
        self.workers.append(w)
        self.threads.append(t)
        return w

    def worker(self, addresses: Optional[str] = None, **kw: object) -> taskpush.Worker:
        kw.setdefault("reconnect_min_ms", 50)
        kw.setdefault("reconnect_max_ms", 200)
        return taskpush.Worker(addresses or self.d.listen, name=self.id().rsplit(".", 1)[-1], **kw)  # type: ignore[arg-type]

    def tearDown(self) -> None:
        for w in self.workers:
            w.stop()
            w.stop()
        for t in self.threads:
            t.join(20)
            if t.is_alive():
                print("# a worker did not stop within 20 s", file=sys.stderr)
        # Python 3.11 reports a failure to the result before tearDown runs.
        result = getattr(getattr(self, "_outcome", None), "result", None)
        ok = result is None or all(t is not self and getattr(t, "test_case", None) is not self
                                   for t, _ in result.failures + result.errors)
        for d in self.daemons:
            if not ok:
                print(f"# ---- {d.log_path} ----\n" + "".join(f"# {line}\n" for line in d.log_text().splitlines()[-60:]),
                      file=sys.stderr)
            d.close()
        self.db.drop()

    def count(self, where: str) -> int:
        return int(self.db.value(f"SELECT COUNT(*) FROM task WHERE {where}"))

    def wait_rows(self, where: str, n: int, what: str, timeout_s: float = tplib.WAIT_S) -> None:
        tplib.wait_for(lambda: self.count(where) >= n, f"{n} rows {what} ({where})", timeout_s, 0.1)


class Worker(Case):
    def test_drain_exactly_once(self) -> None:
        n = 200
        self.db.insert_tasks("echo", [f"p{i}" for i in range(n - 20)])
        self.db.insert_tasks("echo", [f"q{i}" for i in range(20)], ", task_priority, timeout_ms", ", 2, 7000")
        seen: Dict[int, tuple] = {}
        runs = []
        lock = threading.Lock()
        w = self.worker()

        @w.handler("echo", concurrency=4)
        def echo(task: taskpush.Task) -> bytes:
            with lock:
                runs.append(task.id)
                seen[task.id] = (task.epoch, task.attempt, task.priority, task.timeout_ms, task.type)
            return task.payload[::-1]

        self.start(w)
        self.wait_rows("task_state = 2", n, "SUCCESSFUL")
        tplib.wait_for(lambda: len(runs) >= n, "handler runs")
        time.sleep(0.3)  # a duplicate delivery would show up in runs now
        self.assertEqual(len(runs), n)
        self.assertEqual(len(set(runs)), n)
        self.assertEqual(self.count("task_state = 2 AND attempts = 1 AND result = REVERSE(payload)"), n)
        for tid, epoch, prio, timeout in self.db.rows("SELECT task_id, epoch, task_priority, "
                                                      "COALESCE(timeout_ms, 60000) FROM task"):
            self.assertEqual(seen[int(tid)], (int(epoch), 1, int(prio), int(timeout), "echo"))

    def test_outcomes(self) -> None:
        self.db.exec("INSERT INTO task (task_type, payload, max_attempts) VALUES "
                     "('out', 'perm', 3), ('out', 'retry', 2), ('out', 'boom', 1), ('out', 'later', 3)")
        calls: Dict[str, List[float]] = {}
        ends: Dict[str, List[float]] = {}
        lock = threading.Lock()
        w = self.worker()

        @w.handler("out", concurrency=4)
        def out(task: taskpush.Task) -> bytes:
            kind = task.payload.decode()
            with lock:
                calls.setdefault(kind, []).append(time.monotonic())
            try:
                if kind == "perm":
                    raise taskpush.PermanentFailure("bad input")
                if kind == "retry":
                    raise taskpush.Fail(f"flaky {task.attempt}")
                if kind == "boom":
                    raise ValueError("no such thing")
                if task.attempt == 1:
                    raise taskpush.RetryAfter(1500, "later please")
                return b"ok2"
            finally:
                with lock:
                    ends.setdefault(kind, []).append(time.monotonic())

        self.start(w)
        self.wait_rows("task_state IN (2, 3)", 4, "finished")
        rows = {r[0]: r[1:] for r in self.db.rows(
            "SELECT payload, task_state, attempts, COALESCE(err_msg, 'NULL'), COALESCE(result, 'NULL') FROM task")}
        self.assertEqual(rows["perm"], ["3", "1", "bad input", "NULL"])
        self.assertEqual(rows["retry"], ["3", "2", "flaky 2", "NULL"])
        self.assertEqual(rows["boom"][:2], ["3", "1"])
        self.assertIn("ValueError: no such thing", rows["boom"][2])
        self.assertEqual(rows["later"], ["2", "2", "later please", "ok2"])
        self.assertEqual((len(calls["perm"]), len(calls["retry"]), len(calls["later"])), (1, 2, 2))
        self.assertGreaterEqual(calls["later"][1] - ends["later"][0], 1.4,
                                "a RETRY_AFTER 1500 ms task came back too early")

    def test_concurrency_bound(self) -> None:
        self.db.insert_tasks("slow", [str(i) for i in range(24)])
        self.db.insert_tasks("other", [str(i) for i in range(12)])
        now = {"slow": 0, "other": 0}
        peak = {"slow": 0, "other": 0}
        lock = threading.Lock()
        w = self.worker()

        def make(kind: str) -> taskpush.worker.Handler:
            def run(task: taskpush.Task) -> None:
                with lock:
                    now[kind] += 1
                    peak[kind] = max(peak[kind], now[kind])
                time.sleep(0.05)
                with lock:
                    now[kind] -= 1
            return run

        w.add_handler("slow", make("slow"), concurrency=3)
        w.add_handler("other", make("other"), concurrency=2)
        self.start(w)
        tplib.wait_for(lambda: any(x.get("capacity") for x in self.d.json("/workers")), "the worker in /workers")
        caps = [x["capacity"] for x in self.d.json("/workers")]
        self.assertEqual(caps, [5])
        self.wait_rows("task_state = 2", 36, "SUCCESSFUL")
        self.assertLessEqual(peak["slow"], 3)
        self.assertLessEqual(peak["other"], 2)
        self.assertGreaterEqual(min(peak.values()), 1)

    def test_extend_keeps_lease(self) -> None:
        self.db.exec("INSERT INTO task (task_type, payload, timeout_ms, max_attempts) VALUES ('long', 'x', 800, 1)")
        seen = {"cancelled": False, "extends": 0, "lease": 0}
        w = self.worker()

        @w.handler("long")
        def long(task: taskpush.Task) -> bytes:
            seen["lease"] = task.timeout_ms
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                if not task.extend(800):
                    seen["cancelled"] = True
                    break
                seen["extends"] += 1
                if task.wait_cancelled(0.2):
                    seen["cancelled"] = True
                    break
            return b"finished"

        self.start(w)
        self.wait_rows("task_state IN (2, 3)", 1, "finished")
        row = self.db.rows("SELECT task_state, attempts, COALESCE(result, ''), COALESCE(err_msg, '') FROM task")[0]
        self.assertEqual(row, ["2", "1", "finished", ""])
        self.assertEqual(seen["lease"], 800)
        self.assertFalse(seen["cancelled"])
        self.assertGreaterEqual(seen["extends"], 3)
        self.assertEqual(w.stats["extends_sent"], seen["extends"])

    def test_cancel_honoured(self) -> None:
        self.db.insert_tasks("stuck", ["a"])
        started = threading.Event()
        seen = {"cancelled": False}
        w = self.worker()

        @w.handler("stuck")
        def stuck(task: taskpush.Task) -> bytes:
            if task.payload == b"a":
                started.set()
                seen["cancelled"] = task.wait_cancelled(tplib.WAIT_S)
            return b"done"

        self.start(w)
        self.assertTrue(started.wait(tplib.WAIT_S))
        tid = self.db.value("SELECT task_id FROM task")
        self.assertIn(b'"running"', self.d.http("POST", f"/cancel?id={tid}"))
        self.wait_rows("task_state = 3 AND err_msg = 'cancelled'", 1, "FAILED 'cancelled'")
        tplib.wait_for(lambda: seen["cancelled"], "the handler to see the cancel")
        self.db.insert_tasks("stuck", ["b"])  # its slot is free again once the handler answered
        self.wait_rows("task_state = 2 AND payload = 'b'", 1, "SUCCESSFUL")
        self.assertEqual(w.stats["cancels_received"], 1)

    def test_stop_at_once(self) -> None:
        self.db.insert_tasks("hang", ["x"])
        started = threading.Event()
        seen = {"cancelled": False}
        w = self.worker()

        def hang(task: taskpush.Task) -> bytes:
            started.set()
            seen["cancelled"] = task.wait_cancelled(tplib.WAIT_S)
            return b"too late"

        w.add_handler("hang", hang)
        self.start(w)
        self.assertTrue(started.wait(tplib.WAIT_S))
        w.stop()
        w.stop()
        self.threads[-1].join(tplib.WAIT_S)
        self.assertFalse(self.threads[-1].is_alive())
        self.assertTrue(seen["cancelled"])
        self.assertEqual(w.stats["tasks_dropped"], 1)
        self.wait_rows("task_state = 0 AND attempts = 1", 1, "NEW again")
        self.assertEqual(self.count("result IS NOT NULL"), 0)

    def test_dispatcher_stop(self) -> None:
        self.db.insert_tasks("ds", ["x"])
        started = threading.Event()
        w = self.worker()

        def slow(task: taskpush.Task) -> bytes:
            started.set()
            time.sleep(1.0)
            return b"finished"

        w.add_handler("ds", slow)
        self.start(w)
        self.assertTrue(started.wait(tplib.WAIT_S))
        self.assertEqual(self.d.stop(signal.SIGTERM), 0)
        self.assertEqual(self.db.rows("SELECT task_state, attempts, result FROM task"), [["2", "1", "finished"]])
        attempts = w.stats["connect_attempts"]
        tplib.wait_for(lambda: w.stats["connect_attempts"] > attempts, "the worker to try to reconnect")
        self.assertEqual(w.stats["tasks_dropped"], 0)

    def test_reconnect_after_restart(self) -> None:
        port = self.d.listen.rsplit(":", 1)[1]
        self.d.close()
        self.d = self.daemon(listen=f"127.0.0.1:{port}")
        self.db.insert_tasks("rc", [str(i) for i in range(10)])
        w = self.worker()
        w.add_handler("rc", lambda t: b"ok", concurrency=2)
        self.start(w)
        self.wait_rows("task_state = 2", 10, "SUCCESSFUL before the restart")
        self.d.stop(signal.SIGKILL)
        tplib.wait_for(lambda: w.stats["disconnects"] >= 1, "the worker to see the dispatcher gone")
        self.db.insert_tasks("rc", [str(i) for i in range(10, 20)])
        time.sleep(0.3)  # a few failed connects while nothing listens
        self.d.start(listen=f"127.0.0.1:{port}")
        self.wait_rows("task_state = 2", 20, "SUCCESSFUL after the restart")
        self.assertGreaterEqual(w.stats["connections"], 2)
        self.assertGreater(w.stats["connect_attempts"], w.stats["connections"])

    def test_idle_heartbeats(self) -> None:
        w = self.worker()
        w.add_handler("idle", lambda t: b"ok")
        self.start(w)
        tplib.wait_for(lambda: w.stats["connections"] == 1, "the worker to connect")
        time.sleep(1.6)  # 8 intervals of 200 ms: a silent peer is lost after 3
        self.db.insert_tasks("idle", ["1"])
        self.wait_rows("task_state = 2", 1, "SUCCESSFUL")
        self.assertEqual((w.stats["connections"], w.stats["disconnects"]), (1, 0))

    def test_peer_silence(self) -> None:
        self.db.insert_tasks("ps", ["1"])
        w = self.worker(connect_timeout_ms=500)
        w.add_handler("ps", lambda t: b"ok")
        self.start(w)
        self.wait_rows("task_state = 2", 1, "SUCCESSFUL")
        self.d.signal(signal.SIGSTOP)
        try:
            tplib.wait_for(lambda: w.stats["disconnects"] >= 1, "the worker to declare the dispatcher lost")
        finally:
            self.d.signal(signal.SIGCONT)
        self.db.insert_tasks("ps", ["2", "3"])
        self.wait_rows("task_state = 2", 3, "SUCCESSFUL after SIGCONT")
        self.assertGreaterEqual(w.stats["connections"], 2)

    def test_sigterm_clean_shutdown(self) -> None:
        self.db.insert_tasks("term", [str(i) for i in range(12)])
        events = pathlib.Path(self.db.name + ".events").absolute()
        events = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / events.name
        events.write_text("")
        proc = subprocess.Popen([sys.executable, str(pathlib.Path(__file__).with_name("worker_proc.py")),
                                 self.d.listen, "term", "3", "1.0", str(events)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            def lines() -> List[str]:
                return events.read_text().splitlines()
            tplib.wait_for(lambda: sum(x.startswith("start") for x in lines()) >= 3, "three tasks started")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=tplib.WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        got = lines()
        events.unlink()
        self.assertEqual(proc.returncode, 0, err.decode(errors="replace")[-2000:])
        self.assertEqual(out, b"")  # the library never prints
        self.assertEqual(got[-1], "exited")
        started = {x.split()[1] for x in got if x.startswith("start")}
        ended = {x.split()[1] for x in got if x.startswith("end")}
        self.assertGreaterEqual(len(started), 3)
        self.assertEqual(started, ended)
        self.wait_rows("task_state = 2", len(started), "SUCCESSFUL (the outcomes sent before exiting)")
        done = {r[0] for r in self.db.rows("SELECT task_id FROM task WHERE task_state = 2 AND attempts = 1")}
        self.assertEqual(done, started)
        self.assertEqual(self.count("task_state <> 2 AND attempts <> 0"), 0)

    def test_two_addresses_one_dead(self) -> None:
        self.db.insert_tasks("two", [str(i) for i in range(20)])
        w = self.worker(f"127.0.0.1:{tplib.free_port()},{self.d.listen}")
        w.add_handler("two", lambda t: b"ok", concurrency=2)
        self.start(w)
        self.wait_rows("task_state = 2", 20, "SUCCESSFUL")
        self.assertGreaterEqual(w.stats["connect_attempts"], 2)
        self.assertEqual(w.stats["connections"], 1)

    def _log_until(self, address: str, needle: str, bound_s: float) -> List[str]:
        """Runs a worker at address; returns its log lines once one has needle, within
        bound_s (each thing awaited is an answer to the first bytes: immediate when it
        works, a 5 s handshake timeout when not)."""
        lines: List[str] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                lines.append(record.getMessage())

        log = logging.getLogger(f"taskpush.test.{self.id()}")
        log.setLevel(logging.DEBUG)
        log.propagate = False
        log.addHandler(Keep())
        w = self.worker(address, logger=log)
        w.add_handler("t", lambda t: b"", concurrency=1)
        start = time.monotonic()
        self.start(w)
        while not any(needle in line for line in list(lines)) and time.monotonic() - start < bound_s:
            time.sleep(0.02)
        print(f"# after {time.monotonic() - start:.3f} s: {list(lines)[-1:]}")
        self.assertTrue(any(needle in line for line in list(lines)), f"no '{needle}' in {lines}")
        return list(lines)

    def test_admin_port(self) -> None:
        """A worker given the admin port: its log says so within 3 s (issue 32)."""
        lines = self._log_until(self.d.admin, "admin HTTP port", 3.0)
        self.assertTrue(any(self.d.admin in line and "--listen" in line for line in lines))
        tplib.wait_for(lambda: "a worker connected to the admin port" in self.d.log_text(), "taskpushd's log line")

    def test_http_server(self) -> None:
        """Any HTTP server that answers the HELLO is recognised, not taken as a frame."""
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]

        def answer() -> None:
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                with c:
                    c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        try:
            self._log_until(f"127.0.0.1:{port}", "an HTTP server answered", 3.0)
        finally:
            srv.close()

    def test_standby_first(self) -> None:
        standby = self.daemon(lead=False)
        self.assertFalse(standby.json("/stats")["leader"])
        hello = taskpush.session.HelloSpec("probe", "", 1, ["sb"])
        for version in (1, 2):
            with self.assertRaises(taskpush.NotLeader):
                taskpush.session.open_session(taskpush.parse_addresses(standby.listen)[0], hello,
                                              version, None, 5.0, logging.getLogger("probe"))
        self.db.insert_tasks("sb", [str(i) for i in range(20)])
        # Any backoff would be 15 s or more: only an at-once move drains within 10 s.
        w = self.worker(f"{standby.listen},{self.d.listen}", reconnect_min_ms=30000,
                        reconnect_max_ms=30000)
        w.add_handler("sb", lambda t: b"ok", concurrency=2)
        self.start(w)
        self.wait_rows("task_state = 2", 20, "SUCCESSFUL", timeout_s=10)
        self.assertEqual(w.stats["connections"], 1)
        self.assertGreaterEqual(w.stats["connect_attempts"], 2)
        self.assertEqual(standby.json("/stats")["workers"], 0)

    def test_ipv6(self) -> None:
        self.d.close()
        self.d = self.daemon(listen="[::1]:0")
        self.assertTrue(self.d.listen.startswith("[::1]:"), self.d.listen)
        self.db.insert_tasks("v6", [str(i) for i in range(5)])
        w = self.worker(self.d.listen)
        w.add_handler("v6", lambda t: b"ok")
        self.start(w)
        self.wait_rows("task_state = 2", 5, "SUCCESSFUL")

    def test_protocol_version(self) -> None:
        self.db.insert_tasks("pv", ["1", "2"])
        w = self.worker()
        w.add_handler("pv", lambda t: b"ok")
        self.start(w)
        self.wait_rows("task_state = 2", 2, "SUCCESSFUL")
        if dispatcher_protocol() == 1:
            self.assertEqual(w.connected_version, 1)
            with self.assertRaises(taskpush.NotSupported):
                w.submit("pv", b"x")
            with self.assertRaises(taskpush.NotSupported):
                taskpush.submit(self.d.listen, "pv", b"x")
        else:
            top = min(dispatcher_protocol(), taskpush.PROTO_VERSION)
            self.assertEqual(w.connected_version, top)
            for v in range(1, top):
                wv = self.worker(protocol_version=v)
                wv.add_handler(f"pv{v}", lambda t: b"ok")
                self.start(wv)
                self.db.insert_tasks(f"pv{v}", [str(v)])
                self.wait_rows("task_state = 2", 2 + v, f"SUCCESSFUL on a version {v} session")
                self.assertEqual(wv.connected_version, v)


class TLS(Case):
    def setUp(self) -> None:
        self.certs = tplib.make_certs()
        c = self.certs
        (c / "token").write_text("py-s3cret\n")
        self.extra_flags = ["--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server.key"),
                            "--tls-ca", str(c / "ca.pem"), "--token-file", str(c / "token")]
        self.admin_ca = str(c / "ca.pem")
        super().setUp()

    def tearDown(self) -> None:
        super().tearDown()
        shutil.rmtree(self.certs)

    def test_tls_token_client_cert(self) -> None:
        c = self.certs
        self.db.insert_tasks("tls", [str(i) for i in range(20)])
        self.db.exec("INSERT INTO task (task_type, payload) SELECT 'big', CONCAT(REPEAT('ab', 1500000), 'c')")
        good = self.worker(token="py-s3cret", tls=taskpush.TLSOptions(str(c / "ca.pem"), str(c / "client.pem"),
                                                                     str(c / "client.key")))
        good.add_handler("tls", lambda t: b"secure", concurrency=2)
        good.add_handler("big", lambda t: t.payload[::-1])
        no_cert = self.worker(token="py-s3cret", tls=taskpush.TLSOptions(str(c / "ca.pem")))
        no_cert.add_handler("tls", lambda t: b"wrong")
        bad_token = self.worker(token="nope", tls=taskpush.TLSOptions(str(c / "ca.pem"), str(c / "client.pem"),
                                                                      str(c / "client.key")))
        bad_token.add_handler("tls", lambda t: b"wrong")
        for w in (no_cert, bad_token):
            self.start(w)
        tplib.wait_for(lambda: min(no_cert.stats["connect_attempts"], bad_token.stats["connect_attempts"]) >= 3,
                       "refused workers to try three times")
        self.start(good)
        self.wait_rows("task_state = 2 AND result = 'secure'", 20, "SUCCESSFUL by the TLS worker")
        self.wait_rows("task_state = 2 AND LENGTH(result) = 3000001 AND result = REVERSE(payload)", 1,
                       "the 3 MB task SUCCESSFUL with its 3 MB result")
        self.assertEqual(self.count("result = 'wrong'"), 0)
        self.assertEqual(no_cert.stats["connections"], 0)
        self.assertEqual(bad_token.stats["connections"], 0)
        self.assertEqual(good.stats["connections"], 1)
        self.assertNotIn("py-s3cret", self.d.log_text())


if __name__ == "__main__":
    tplib.tap_main("test_worker")
