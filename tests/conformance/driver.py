#!/usr/bin/env python3
"""driver: the conformance scenarios of tests/conformance/README.md, the same list
against each client's conformance worker, so that the clients cannot drift.

    driver.py CLIENT SOURCE_ROOT BUILD_ROOT [SCENARIO ...]

CLIENT is c, python, go or java. The driver builds the client's worker when it needs
building (go build, javac), starts the build's taskpushd on a database of its own on
the private MariaDB of scripts/tp-mariadb (the TASKPUSH_TEST_MYSQL_* environment, as
every integration test), and runs each scenario (all by default, or the numbers
given) with worker processes of that client. It asserts from the table, the worker's
event lines and taskpushd's admin port, and prints one TAP line per scenario; nothing
skips. Every wait is a bounded poll on a condition.

The workers share one command line, one language of payload instructions and one
set of event lines (README.md, "The conformance worker").
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import tplib  # noqa: E402

WAIT_S = 60.0  # the bound of every wait (ASan runs under a timeout multiplier)
# 500 ms heartbeats: a peer is lost after 1.5 s of silence, room for a JVM or an ASan build
# starved on 2 shared cores (at 200 ms a Java worker under load declared a live dispatcher
# silent).
HEARTBEAT_MS = 500
DAEMON_FLAGS = ["--heartbeat-ms", str(HEARTBEAT_MS), "--retry-backoff-ms", "50", "--retry-backoff-max-ms", "200",
                "--poll-ms", "20", "--shutdown-grace-ms", "3000", "--orphan-grace-ms", "200",
                "--adopt-grace-ms", "5000",  # a slow worker still declares its tasks in time (9)
                # a leadership lease of 3 s, not 1: a starved dispatcher renewed it too late
                "--lease-ms", "3000"]


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    tplib.wait_for(cond, what, timeout_s)


def go_env(build: pathlib.Path, src: pathlib.Path) -> Dict[str, str]:
    """As go_test_tap.py: the caches in the build tree, nothing downloaded."""
    state = build / "clients-go"
    env = dict(os.environ)
    env.update({"GOCACHE": str(state / "cache"), "GOPATH": str(state / "gopath"), "GOENV": "off",
                "GOFLAGS": "", "GOPROXY": "off", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
                "TASKPUSH_SOURCE_ROOT": str(src), "TASKPUSH_BUILD_ROOT": str(build)})
    return env


def build_worker(client: str, src: pathlib.Path, build: pathlib.Path) -> List[str]:
    """The command that starts the client's conformance worker (building it first)."""
    if client == "c":
        exe = build / "tests" / "conformance" / "tp-conformance-worker"
        if not exe.exists():
            raise RuntimeError(f"{exe} is not built (ninja builds it)")
        return [str(exe)]
    if client == "python":
        return [sys.executable, str(src / "tests" / "conformance" / "worker.py")]
    if client == "go":
        go = shutil.which("go")
        if go is None:
            raise RuntimeError("go is not installed (scripts/install-deps.sh --test installs golang-go)")
        exe = build / "clients-go" / "tp-conformance-worker"
        r = subprocess.run([go, "build", "-o", str(exe), "./cmd/tp-conformance-worker"], cwd=src / "clients" / "go",
                           env=go_env(build, src), capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"go build failed:\n{r.stdout}{r.stderr}")
        return [str(exe)]
    if client == "java":
        if shutil.which("javac") is None or shutil.which("java") is None:
            raise RuntimeError("javac is not installed (scripts/install-deps.sh --test installs "
                               "openjdk-17-jdk-headless)")
        out = build / "clients-java-conformance"
        r = subprocess.run(["sh", str(src / "clients" / "java" / "build.sh"), str(out)], capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"clients/java/build.sh failed:\n{r.stdout}{r.stderr}")
        worker_classes = out / "conformance-classes"
        worker_classes.mkdir(exist_ok=True)
        r = subprocess.run(["javac", "--release", "17", "-Xlint:all", "-Werror", "-encoding", "UTF-8",
                            "-cp", str(out / "classes"), "-d", str(worker_classes),
                            str(src / "clients" / "java" / "conformance" / "ConformanceWorker.java")],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"javac ConformanceWorker.java failed:\n{r.stdout}{r.stderr}")
        # Small heaps: the gcc and the ASan builds' suites share 2 cores.
        return ["java", "-Xss512k", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                "-cp", f"{out / 'classes'}:{worker_classes}", "ConformanceWorker"]
    raise RuntimeError(f"unknown client {client!r} (c, python, go or java)")


class WorkerProc:
    """One conformance worker process: its event lines as they come (stdout), its
    diagnostics in a file (stderr)."""

    def __init__(self, cmd: Sequence[str], args: Sequence[str], tmp: pathlib.Path, tag: str) -> None:
        self.err_path = tmp / f"{tag}.stderr"
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(list(cmd) + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.err)
        self.lines: List[str] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self.cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()

    def snapshot(self) -> List[str]:
        with self.cond:
            return list(self.lines)

    def words(self, first: str) -> List[List[str]]:
        return [line.split(" ") for line in self.snapshot() if line.split(" ", 1)[0] == first]

    def wait_line(self, pred: Callable[[List[str]], bool], what: str, timeout_s: float = WAIT_S) -> None:
        end = time.monotonic() + timeout_s
        with self.cond:
            while not pred(self.lines):
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for the worker: {what}")
                if self.proc.poll() is not None and not self.reader.is_alive():
                    raise AssertionError(f"the worker exited ({self.proc.returncode}) before {what}")
                self.cond.wait(min(left, 0.1))

    def count(self, first: str) -> int:
        return len(self.words(first))

    def last_value(self, first: str) -> int:
        w = self.words(first)
        return int(w[-1][1]) if w else 0

    def wait_exit(self, timeout_s: float, late: str) -> int:
        """The exit status once the process ended; killed and AssertionError(late) after timeout_s."""
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(late)
        self.reader.join(10)
        return rc

    def terminate(self, timeout_s: float = WAIT_S) -> int:
        """SIGTERM (a graceful drain) and the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s, f"the worker did not exit within {timeout_s:.0f} s of SIGTERM")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)

    def stderr_tail(self) -> str:
        self.err.flush()
        try:
            return "\n".join(self.err_path.read_text(errors="replace").splitlines()[-40:])
        except OSError:
            return ""


class Run:
    """One client's run: its database, its dispatcher, its workers."""

    def __init__(self, client: str, cmd: List[str]) -> None:
        self.client, self.cmd = client, cmd
        self.db = tplib.TestDB(f"conf_{client}")
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"tp_conf_{client}_"))
        self.d = tplib.Daemon(self.db.url, DAEMON_FLAGS)
        self.daemons: List[tplib.Daemon] = [self.d]
        self.workers: List[WorkerProc] = []
        self.serial = 0

    def daemon(self, extra: Sequence[str] = (), lead: bool = True, admin_ca: Optional[str] = None) -> tplib.Daemon:
        d = tplib.Daemon(self.db.url, DAEMON_FLAGS + list(extra), admin_ca=admin_ca, lead=lead)
        self.daemons.append(d)
        return d

    def worker(self, ttype: str, concurrency: int = 1, addr: Optional[str] = None,
               extra: Sequence[str] = ()) -> WorkerProc:
        self.serial += 1
        args = ["--addr", addr or self.d.listen, "--type", ttype, "--concurrency", str(concurrency)] + list(extra)
        w = WorkerProc(self.cmd, args, self.tmp, f"w{self.serial}")
        self.workers.append(w)
        return w

    def submit(self, ttype: str, payload: str, extra: Sequence[str] = ()) -> List[str]:
        """A producer run of the worker (--submit): its event lines once it exited."""
        self.serial += 1
        w = WorkerProc(self.cmd, ["--addr", self.d.listen, "--submit", ttype, "--payload", payload] + list(extra),
                       self.tmp, f"s{self.serial}")
        self.workers.append(w)
        rc = w.wait_exit(WAIT_S, f"the submitting worker did not exit within {WAIT_S:.0f} s")
        if rc != 0:
            raise AssertionError(f"the submitting worker exited {rc}:\n{w.stderr_tail()}")
        return w.snapshot()

    # ---- the table ----

    def rows(self, sql: str) -> List[List[str]]:
        return self.db.rows(sql)

    def count(self, where: str) -> int:
        return int(self.db.value(f"SELECT COUNT(*) FROM task WHERE {where}"))

    def wait_rows(self, where: str, n: int, what: str, timeout_s: float = WAIT_S) -> None:
        wait_for(lambda: self.count(where) == n, f"{n} rows {what} ({where})", timeout_s)

    def insert(self, ttype: str, payloads: Sequence[str], cols: str = "", vals: str = "") -> None:
        self.db.insert_tasks(ttype, payloads, cols, vals)

    def ids(self, where: str) -> List[int]:
        return [int(r[0]) for r in self.rows(f"SELECT task_id FROM task WHERE {where} ORDER BY task_id")]

    def wait_workers(self, d: tplib.Daemon, n: int) -> None:
        wait_for(lambda: d.json("/stats").get("workers") == n, f"the dispatcher to hold {n} workers")

    def finish(self, w: WorkerProc) -> None:
        """SIGTERM, a clean exit, its closing line."""
        rc = w.terminate()
        if rc != 0:
            raise AssertionError(f"the worker exited {rc} after SIGTERM:\n{w.stderr_tail()}")
        last = w.snapshot()[-1:] or [""]
        if not last[0].startswith("exit "):
            raise AssertionError(f"the worker's last line is {last[0]!r}, not 'exit ...'")

    def diagnostics(self) -> str:
        out = []
        for w in self.workers:
            args = w.proc.args if isinstance(w.proc.args, list) else []
            out.append(f"---- worker {' '.join(str(a) for a in args[len(self.cmd):])}")
            out.append("events: " + " | ".join(w.snapshot()[-30:]))
            out.extend(w.stderr_tail().splitlines()[-25:])
        for d in self.daemons:
            lines = d.log_text().splitlines()
            out.append(f"---- {d.log_path}: its warnings and errors, then its last lines")
            out.extend([x for x in lines if " info " not in x][-20:] + lines[-25:])
        return "\n".join(out)

    def end_scenario(self) -> None:
        for w in self.workers:
            w.kill()
            w.err.close()
        self.workers.clear()
        for d in self.daemons[1:]:
            d.close()
        del self.daemons[1:]
        if self.d.proc is None or self.d.proc.poll() is not None:
            self.d.start(listen=self.d.listen)
        self.wait_workers(self.d, 0)

    def close(self) -> None:
        for d in self.daemons:
            d.close()
        self.db.drop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def starts(w: WorkerProc) -> List[Tuple[int, int, int, int, str, int]]:
    """(id, attempt, epoch, priority, type, ms) of each `start` line."""
    return [(int(x[1]), int(x[2]), int(x[3]), int(x[4]), x[5], int(x[6])) for x in w.words("start")]


# ---- the scenarios (README.md's numbers) ----

def s02_drain_exactly_once(r: Run) -> None:
    n = 60
    for prio in (0, 1, 2):
        r.insert("drain", [f"ok r{prio}-{i}" for i in range(n // 3)], ", task_priority", f", {prio}")
    w = r.worker("drain", 4)
    r.wait_rows("task_type = 'drain' AND task_state = 2", n, "SUCCESSFUL")
    r.finish(w)
    rows = {int(t): (int(a), res, int(e), int(p)) for t, a, res, e, p in
            r.rows("SELECT task_id, attempts, result, epoch, task_priority FROM task WHERE task_type = 'drain'")}
    payloads = {int(t): p for t, p in r.rows("SELECT task_id, payload FROM task WHERE task_type = 'drain'")}
    seen = starts(w)
    assert sorted(s[0] for s in seen) == sorted(rows), "each task ran exactly once"
    for tid, attempt, epoch, prio, ttype, _ in seen:
        a, res, e, p = rows[tid]
        assert a == 1 and attempt == 1, f"task {tid}: attempt {attempt}, row attempts {a}"
        assert res == payloads[tid].split(" ")[1], f"task {tid}: result {res!r}"
        assert (epoch, prio, ttype) == (e, p, "drain"), f"task {tid}: saw {(epoch, prio, ttype)}, row {(e, p)}"
    assert r.count("task_type = 'drain' AND epoch = 0") == 0


def s03_every_outcome(r: Run) -> None:
    r.insert("oc", ["ok yes"])
    r.insert("oc", ["fail-permanent nope"], ", max_attempts", ", 3")
    r.insert("oc", ["fail again"], ", max_attempts", ", 2")
    r.insert("oc", ["crash"], ", max_attempts", ", 2")
    r.insert("oc", ["retry-after 1500"], ", max_attempts", ", 3")
    w = r.worker("oc", 2)
    wait_for(lambda: r.count("task_type = 'oc' AND task_state IN (2, 3)") == 5, "every task to end")
    got = {p.split(" ")[0]: (int(s), int(a), res, err) for p, s, a, res, err in
           r.rows("SELECT payload, task_state, attempts, IFNULL(result, '-'), IFNULL(err_msg, '-') "
                  "FROM task WHERE task_type = 'oc'")}
    assert got["ok"][:3] == (2, 1, "yes"), f"success: {got['ok']}"
    assert got["fail-permanent"][:2] == (3, 1) and "nope" in got["fail-permanent"][3], \
        f"permanent failure: {got['fail-permanent']}"
    assert got["fail"][:2] == (3, 2) and "again" in got["fail"][3], f"failed attempts: {got['fail']}"
    assert got["crash"][:2] == (3, 2) and got["crash"][3] not in ("", "-"), f"crash: {got['crash']}"
    assert got["retry-after"][:3] == (2, 2, "after"), f"retry-after: {got['retry-after']}"
    (tid,) = r.ids("task_type = 'oc' AND payload LIKE 'retry-after%'")
    r.finish(w)
    end1 = [int(x[3]) for x in w.words("end") if int(x[1]) == tid and x[2] == "retry-after"]
    start2 = [s[5] for s in starts(w) if s[0] == tid and s[1] == 2]
    assert len(end1) == 1 and len(start2) == 1, f"retry-after deliveries: {end1} {start2}"
    assert start2[0] - end1[0] >= 1500, f"delivered again {start2[0] - end1[0]} ms after RETRY_AFTER 1500"


def s04_concurrency_bound(r: Run) -> None:
    r.insert("cc", ["sleep 150"] * 24)
    w = r.worker("cc", 3)
    r.wait_rows("task_type = 'cc' AND task_state = 2", 24, "SUCCESSFUL")
    r.finish(w)
    running, most = 0, 0
    for line in w.snapshot():
        if line.startswith("start "):
            running += 1
            most = max(most, running)
        elif line.startswith("end "):
            running -= 1
    print(f"# at most {most} handlers at once (concurrency 3)")
    assert most <= 3, f"{most} handlers at once with concurrency 3"
    assert most >= 2, f"never more than {most} handler at once: the capacity of 3 was not used"


def s05_extend(r: Run) -> None:
    r.insert("ext", ["sleep 2500 extend"], ", timeout_ms", ", 800")
    w = r.worker("ext", 1)
    r.wait_rows("task_type = 'ext' AND task_state = 2", 1, "SUCCESSFUL")
    r.finish(w)
    assert r.rows("SELECT attempts, result FROM task WHERE task_type = 'ext'") == [["1", "slept"]]
    assert w.count("cancelled") == 0 and w.count("start") == 1, w.snapshot()


def s06_cancel(r: Run) -> None:
    r.insert("cn", ["wait-cancel"])
    (tid,) = r.ids("task_type = 'cn'")
    w = r.worker("cn", 1)
    w.wait_line(lambda ls: any(x.startswith(f"start {tid} ") for x in ls), "the task to start")
    answer = r.d.http("POST", f"/cancel?id={tid}")
    assert b'"running"' in answer, answer
    r.wait_rows(f"task_id = {tid} AND task_state = 3 AND err_msg = 'cancelled'", 1, "FAILED 'cancelled'")
    w.wait_line(lambda ls: f"cancelled {tid}" in ls, "the handler to see the cancel")
    r.insert("cn", ["ok after"])
    r.wait_rows("task_type = 'cn' AND task_state = 2 AND result = 'after'", 1, "the next task SUCCESSFUL")
    r.finish(w)


def s07_heartbeats(r: Run) -> None:
    w = r.worker("hb", 1)
    w.wait_line(lambda ls: "connections 1" in ls, "the worker to connect")
    r.wait_workers(r.d, 1)
    time.sleep(10 * HEARTBEAT_MS / 1000)  # the scenario itself: 10 intervals idle (a silent peer is lost after 3)
    r.insert("hb", ["ok alive"])
    r.wait_rows("task_type = 'hb' AND task_state = 2", 1, "SUCCESSFUL")
    r.finish(w)
    last = w.snapshot()[-1]
    assert last.startswith("exit connections=1 "), f"one connection throughout: {last}"
    assert w.count("disconnects") == 0 or w.snapshot().index("disconnects 1") > w.snapshot().index(
        "connections 1"), w.snapshot()
    assert "connections 2" not in w.snapshot(), w.snapshot()


def s08_sigstop(r: Run) -> None:
    w = r.worker("st", 1, extra=["--reconnect-max-ms", "300"])
    r.insert("st", ["ok before"])
    r.wait_rows("task_type = 'st' AND task_state = 2", 1, "SUCCESSFUL")
    assert r.d.proc is not None
    r.d.proc.send_signal(signal.SIGSTOP)
    try:
        w.wait_line(lambda ls: "disconnects 1" in ls, "the worker to declare the frozen dispatcher lost")
    finally:
        r.d.proc.send_signal(signal.SIGCONT)
    w.wait_line(lambda ls: "connections 2" in ls, "the worker to connect again")
    r.insert("st", ["ok after1", "ok after2"])
    r.wait_rows("task_type = 'st' AND task_state = 2", 3, "SUCCESSFUL after SIGCONT")
    r.finish(w)


def s09_kill_restart(r: Run) -> None:
    r.insert("kr", ["sleep 1000", "sleep 5000"])
    w = r.worker("kr", 2, extra=["--reconnect-max-ms", "300"])
    w.wait_line(lambda ls: sum(x.startswith("start ") for x in ls) == 2, "both tasks to start")
    listen = r.d.listen
    r.d.stop(signal.SIGKILL)
    w.wait_line(lambda ls: "disconnects 1" in ls, "the worker to see the dispatcher gone")
    w.wait_line(lambda ls: any(x.startswith("end ") for x in ls), "the short task to end while no dispatcher runs")
    r.d.start(listen=listen)
    r.wait_rows("task_type = 'kr' AND task_state = 2", 2, "SUCCESSFUL (an outcome sent again, a task adopted)")
    r.insert("kr", ["ok later"])
    r.wait_rows("task_type = 'kr' AND task_state = 2", 3, "SUCCESSFUL after the restart")
    r.finish(w)
    assert r.rows("SELECT attempts FROM task WHERE task_type = 'kr'") == [["1"]] * 3, "each ran at attempt 1"
    assert sorted(s[0] for s in starts(w)) == r.ids("task_type = 'kr'"), f"each ran once: {starts(w)}"
    assert w.count("cancelled") == 0


def s10_two_addresses(r: Run) -> None:
    r.insert("two", [f"ok t{i}" for i in range(20)])
    w = r.worker("two", 2, addr=f"127.0.0.1:{tplib.free_port()},{r.d.listen}")
    r.wait_rows("task_type = 'two' AND task_state = 2", 20, "SUCCESSFUL")
    r.finish(w)
    assert w.last_value("connections") == 1, w.snapshot()


def s11_standby(r: Run) -> None:
    standby = r.daemon(lead=False)
    assert standby.json("/stats")["leader"] is False
    r.insert("sb", [f"ok s{i}" for i in range(20)])
    # Any backoff would be 30 s or more (each client draws between half the ceiling and the
    # ceiling): only a move at once drains within 25 s of the worker's start.
    w = r.worker("sb", 2, addr=f"{standby.listen},{r.d.listen}",
                 extra=["--reconnect-min-ms", "60000", "--reconnect-max-ms", "60000"])
    w.wait_line(lambda ls: "ready" in ls, "the worker to start")
    r.wait_rows("task_type = 'sb' AND task_state = 2", 20, "SUCCESSFUL", timeout_s=25)
    assert standby.json("/stats")["workers"] == 0
    r.finish(w)
    assert w.last_value("connections") == 1, w.snapshot()


def s12_tls(r: Run) -> None:
    certs = tplib.make_certs()
    try:
        (certs / "token").write_text("conformance-secret\n")
        d = r.daemon(["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                      "--tls-ca", str(certs / "ca.pem"), "--token-file", str(certs / "token")],
                     lead=False, admin_ca=str(certs / "ca.pem"))
        # The second dispatcher of the database: the shared one leads; stop it for this one.
        r.d.stop(signal.SIGTERM)
        wait_for(lambda: d.json("/stats").get("leader") is True, "the TLS dispatcher to lead")
        tls = ["--tls-ca", str(certs / "ca.pem")]
        client = ["--tls-cert", str(certs / "client.pem"), "--tls-key", str(certs / "client.key")]
        big = 3 * 1024 * 1024
        r.insert("tls", ["ok secure", f"big {big} " + "p" * big])
        bad = [r.worker("tls", 1, addr=d.listen, extra=tls + ["--token", "conformance-secret"]),
               r.worker("tls", 1, addr=d.listen, extra=tls + client + ["--token", "wrong"])]
        good = r.worker("tls", 1, addr=d.listen, extra=tls + client + ["--token", "conformance-secret"])
        r.wait_rows("task_type = 'tls' AND task_state = 2", 2, "SUCCESSFUL over TLS")
        assert r.rows("SELECT LENGTH(result) FROM task WHERE task_type = 'tls' ORDER BY task_id") == \
            [["6"], [str(big)]]
        for w in bad:
            w.wait_line(lambda ls: "ready" in ls, "the refused worker to start")
        time.sleep(1.0)  # the refused workers keep trying; none may get a session
        for w in bad:
            assert w.count("connections") == 0 and w.count("start") == 0, w.snapshot()
            r.finish(w)
        r.finish(good)
        assert good.last_value("connections") >= 1
        assert d.json("/stats")["workers"] == 0
    finally:
        shutil.rmtree(certs, ignore_errors=True)


def s13_submit(r: Run) -> None:
    lines = r.submit("sub", "ok one", ["--dedup", "key-1"])
    assert len(lines) == 1 and lines[0].startswith("submitted ") and lines[0].endswith(" new"), lines
    tid = int(lines[0].split(" ")[1])
    # The acknowledgement comes after the commit: the row is there already.
    assert r.rows(f"SELECT task_type, payload, dedup_key FROM task WHERE task_id = {tid}") == \
        [["sub", "ok one", "key-1"]], f"row {tid} after the acknowledgement"
    again = r.submit("sub", "ok two", ["--dedup", "key-1"])
    assert again == [f"submitted {tid} duplicate"], again
    assert r.count("task_type = 'sub'") == 1
    invalid = r.submit("x" * 65, "ok bad")
    assert len(invalid) == 1 and invalid[0].startswith("refused "), invalid
    assert r.count("task_type LIKE 'xxxx%'") == 0
    w = r.worker("sub", 1)
    waited = r.submit("sub", "ok waited", ["--wait"])
    assert len(waited) == 2 and waited[0].startswith("submitted ") and waited[0].endswith(" new"), waited
    wid = int(waited[0].split(" ")[1])
    assert waited[1] == f"outcome {wid} successful waited", waited
    r.wait_rows("task_type = 'sub' AND task_state = 2", 2, "SUCCESSFUL")
    r.finish(w)


def s14_graceful_drain(r: Run) -> None:
    r.insert("gd", ["sleep 1000"] * 12)
    w = r.worker("gd", 3)
    w.wait_line(lambda ls: sum(x.startswith("start ") for x in ls) >= 3, "three tasks to start")
    r.finish(w)
    started = {s[0] for s in starts(w)}
    ended = {int(x[1]) for x in w.words("end")}
    assert len(started) >= 3 and started == ended, f"started {sorted(started)}, ended {sorted(ended)}"
    r.wait_rows("task_type = 'gd' AND task_state = 2", len(started), "SUCCESSFUL (outcomes written)")
    done = set(r.ids("task_type = 'gd' AND task_state = 2 AND attempts = 1"))
    assert done == started, f"SUCCESSFUL {sorted(done)}, started {sorted(started)}"
    assert r.count("task_type = 'gd' AND task_state <> 2 AND attempts <> 0") == 0, "nothing more was taken"


class SlowProxy:
    """A TCP relay between one worker and the dispatcher that passes the dispatcher's bytes
    on at rate bytes a second, in small pieces: a big frame then takes seconds to arrive
    while bytes keep coming (the worker's bytes go through at once)."""

    def __init__(self, target: str, rate: int) -> None:
        host, port = target.rsplit(":", 1)
        self.target, self.rate = (host, int(port)), rate
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.address = f"127.0.0.1:{self.srv.getsockname()[1]}"
        self.socks: List[socket.socket] = [self.srv]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
                u = socket.create_connection(self.target)
            except OSError:
                return
            self.socks += [c, u]
            threading.Thread(target=self._pipe, args=(c, u, 0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, self.rate), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, rate: int) -> None:
        piece = 4096
        try:
            while True:
                data = src.recv(piece if rate else 65536)
                if not data:
                    break
                dst.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        for x in (src, dst):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for x in self.socks:
            x.close()


def s15_slow_big_frame(r: Run) -> None:
    size, rate = 1024 * 1024, 256 * 1024
    proxy = SlowProxy(r.d.listen, rate)
    try:
        r.insert("slow", ["ok small", "big 10 " + "p" * size])
        w = r.worker("slow", 1, addr=proxy.address)
        # 1 MB at 256 KB/s: 4 s with no whole frame, 8 heartbeat intervals where a silent
        # peer is lost after 3, but bytes all along: the dispatcher is not silent.
        wait_for(lambda: r.count("task_type = 'slow' AND task_state = 2") == 2 or "connections 2" in w.snapshot(),
                 "both tasks SUCCESSFUL through the slow relay, or a second connection")
        assert "connections 2" not in w.snapshot(), \
            f"the worker left the dispatcher while its bytes were arriving: {w.snapshot()}"
        r.finish(w)
        assert r.rows("SELECT task_state, attempts FROM task WHERE task_type = 'slow'") == [["2", "1"]] * 2, \
            "each SUCCESSFUL, delivered once"
        assert w.snapshot()[-1].startswith("exit connections=1 "), w.snapshot()[-1]
    finally:
        proxy.close()


SCENARIOS: List[Tuple[int, str, Callable[[Run], None]]] = [
    (2, "exactly-once drain", s02_drain_exactly_once),
    (3, "every outcome", s03_every_outcome),
    (4, "concurrency bound", s04_concurrency_bound),
    (5, "EXTEND", s05_extend),
    (6, "CANCEL", s06_cancel),
    (7, "heartbeats", s07_heartbeats),
    (8, "SIGSTOP", s08_sigstop),
    (9, "SIGKILL and restart", s09_kill_restart),
    (10, "two addresses, one dead", s10_two_addresses),
    (11, "a standby answering NOT_LEADER", s11_standby),
    (12, "TLS with a client certificate and a token", s12_tls),
    (13, "SUBMIT commit-before-ack", s13_submit),
    (14, "graceful drain", s14_graceful_drain),
    (15, "a big frame arriving slower than 3 heartbeats", s15_slow_big_frame),
]


def main(argv: List[str]) -> int:
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    client, src, build = argv[1], pathlib.Path(argv[2]).resolve(), pathlib.Path(argv[3]).resolve()
    only = {int(a) for a in argv[4:]}
    os.environ.setdefault("TASKPUSH_SOURCE_ROOT", str(src))
    os.environ.setdefault("TASKPUSH_BUILD_ROOT", str(build))
    chosen = [s for s in SCENARIOS if not only or s[0] in only]
    n = 0
    try:
        t0 = time.monotonic()
        cmd = build_worker(client, src, build)
        print(f"# {client}: worker {' '.join(cmd)} (built in {time.monotonic() - t0:.1f} s)", flush=True)
        run = Run(client, cmd)
    except Exception as e:  # noqa: BLE001 - every scenario fails with the reason
        for num, name, _ in chosen:
            n += 1
            print(f"not ok {n} - {client} {num:02d} {name}", flush=True)
            for line in str(e).splitlines():
                print(f"# {line}")
        print(f"1..{n}")
        return 1
    failed = 0
    try:
        for num, name, fn in chosen:
            n += 1
            t0 = time.monotonic()
            try:
                fn(run)
                ok, detail = True, ""
            except Exception:  # noqa: BLE001 - an assertion or an error: the scenario failed
                ok, detail = False, traceback.format_exc() + run.diagnostics()
            took = time.monotonic() - t0
            try:
                run.end_scenario()
            except Exception:  # noqa: BLE001
                ok, detail = False, detail + traceback.format_exc()
            failed += 0 if ok else 1
            print(f"{'ok' if ok else 'not ok'} {n} - {client} {num:02d} {name} ({took:.1f} s)", flush=True)
            for line in detail.splitlines():
                print(f"# {line}", flush=True)
    finally:
        run.close()
    print(f"1..{n}", flush=True)
    return 1 if failed or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
