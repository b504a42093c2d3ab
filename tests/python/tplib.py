"""tplib: fixtures of the Python library's tests: a private database on the test
MariaDB, the real taskpushd of the build tree, test certificates, and a TAP
runner so that scripts/test-summary.py counts each case.

The database comes from the environment of scripts/tp-mariadb, as for the C
integration tests (tests/testlib/testdb.c): TASKPUSH_TEST_MYSQL_{HOST,PORT,USER,
PASSWORD}. Without it the tests fail, never skip. SQL runs through the `mariadb`
command-line client (the library itself needs no database driver).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Callable, List, Optional, Sequence

SOURCE_ROOT = pathlib.Path(os.environ.get("TASKPUSH_SOURCE_ROOT", pathlib.Path(__file__).resolve().parents[2]))
BUILD_ROOT = pathlib.Path(os.environ.get("TASKPUSH_BUILD_ROOT", SOURCE_ROOT / "build"))
sys.path.insert(0, str(SOURCE_ROOT / "python"))

WAIT_S = 30.0  # bound of every wait; nothing asserts how long something took


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S, poll_s: float = 0.02) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def free_port() -> int:
    """A port that nothing listens on now (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


class TestDB:
    """A database of its own on the test server, with sql/schema.sql loaded."""

    def __init__(self, tag: str) -> None:
        env = os.environ
        missing = [k for k in ("TASKPUSH_TEST_MYSQL_HOST", "TASKPUSH_TEST_MYSQL_PORT", "TASKPUSH_TEST_MYSQL_USER")
                   if not env.get(k)]
        if missing:
            raise RuntimeError(f"{missing[0]} is not set. Start a test server first:\n"
                               "    eval \"$(scripts/tp-mariadb start /tmp/tpdb)\"")
        self.host, self.port = env["TASKPUSH_TEST_MYSQL_HOST"], env["TASKPUSH_TEST_MYSQL_PORT"]
        self.user, self.password = env["TASKPUSH_TEST_MYSQL_USER"], env.get("TASKPUSH_TEST_MYSQL_PASSWORD", "")
        self.client = shutil.which("mariadb") or shutil.which("mysql")
        if not self.client:
            raise RuntimeError("no mariadb client (scripts/install-deps.sh installs mariadb-client-core)")
        self.name = f"tp_py_{''.join(c if c.isalnum() else '_' for c in tag)[:30]}_{os.getpid()}"
        self._run(f"DROP DATABASE IF EXISTS `{self.name}`; CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4",
                  db=None)
        schema = os.environ.get("TASKPUSH_SCHEMA_SQL") or str(SOURCE_ROOT / "sql" / "schema.sql")
        self._run(pathlib.Path(schema).read_text(), db=self.name)
        pw = f":{self.password}" if self.password else ""
        self.url = f"mysql://{self.user}{pw}@{self.host}:{self.port}/{self.name}"

    def _run(self, sql: str, db: Optional[str]) -> str:
        args = [self.client or "mariadb", "--no-defaults", "--protocol=tcp", "-h", self.host, "-P", self.port,
                "-u", self.user, "--batch", "--skip-column-names", "--raw", "--default-character-set=utf8mb4"]
        if self.password:
            args.append(f"-p{self.password}")
        if db:
            args.append(db)
        r = subprocess.run(args, input=sql.encode(), capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"SQL failed: {sql[:300]}\n{r.stderr.decode(errors='replace')}")
        return r.stdout.decode(errors="replace")

    def rows(self, sql: str) -> List[List[str]]:
        out = self._run(sql, self.name)
        return [line.split("\t") for line in out.splitlines()]

    def value(self, sql: str) -> str:
        r = self.rows(sql)
        if not r:
            raise AssertionError(f"no row from {sql}")
        return r[0][0]

    def exec(self, sql: str) -> None:
        self._run(sql, self.name)

    def insert_tasks(self, ttype: str, payloads: Sequence[str], extra_cols: str = "", extra_vals: str = "") -> None:
        """Inserts one NEW row per payload (text payloads, SQL-quoted here)."""
        vals = ",".join(f"('{ttype}', {self.quote(p)}{extra_vals})" for p in payloads)
        self.exec(f"INSERT INTO task (task_type, payload{extra_cols}) VALUES {vals}")

    @staticmethod
    def quote(s: str) -> str:
        return "'" + s.replace("\\", "\\\\").replace("'", "''") + "'"

    def drop(self) -> None:
        if os.environ.get("TASKPUSH_TEST_KEEP_DB"):
            print(f"# keeping database {self.name}", file=sys.stderr)
            return
        self._run(f"DROP DATABASE IF EXISTS `{self.name}`", db=None)


class Daemon:
    """The build tree's taskpushd on loopback ports, started with a ready file."""

    _serial = 0

    def __init__(self, db_url: str, extra: Sequence[str] = (), listen: str = "127.0.0.1:0",
                 admin_ca: Optional[str] = None, lead: bool = True) -> None:
        Daemon._serial += 1
        tmp = os.environ.get("TMPDIR", "/tmp")
        self.ready_path = f"{tmp}/taskpushd-py-{os.getpid()}-{Daemon._serial}.ready"
        self.log_path = f"{tmp}/taskpushd-py-{os.getpid()}-{Daemon._serial}.log"
        self.db_url, self.extra = db_url, list(extra)
        self.admin_ca = admin_ca  # with --tls-cert the admin port speaks https
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.listen = ""
        self.admin = ""
        self.start(listen, lead)

    def start(self, listen: str = "127.0.0.1:0", lead: bool = True) -> None:
        """Starts taskpushd and waits for its ready file, then (with lead) for it to lead."""
        if os.path.exists(self.ready_path):
            os.unlink(self.ready_path)
        exe = str(BUILD_ROOT / "dispatcher" / "taskpushd")
        args = [exe, "--db", self.db_url, "--listen", listen, "--admin", "127.0.0.1:0",
                "--ready-file", self.ready_path] + self.extra
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            try:
                with open(self.ready_path) as f:
                    ready = json.load(f)
                self.listen, self.admin = ready["listen"], ready["admin"]
                break
            except (OSError, ValueError, KeyError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"taskpushd exited early ({self.proc.returncode}):\n{self.log_text()}")
            time.sleep(0.02)
        else:
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"taskpushd wrote no ready file within 15 s:\n{self.log_text()}")
        # The ready file comes before leadership: a SUBMIT before it is UNAVAILABLE.
        if lead:
            wait_for(self._leads, "taskpushd to lead")

    def _leads(self) -> bool:
        try:
            return bool(self.json("/stats").get("leader"))
        except (OSError, ValueError):
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        if sig == signal.SIGSTOP or sig == signal.SIGCONT:
            raise ValueError("use pause()/resume()")
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def log_text(self) -> str:
        try:
            return pathlib.Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def http(self, method: str, path: str) -> bytes:
        import ssl
        import urllib.request
        scheme = "https" if self.admin_ca else "http"
        ctx = ssl.create_default_context(cafile=self.admin_ca) if self.admin_ca else None
        req = urllib.request.Request(f"{scheme}://{self.admin}{path}", method=method,
                                     headers={"X-Taskpush-Admin": "1"} if method == "POST" else {})
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return bytes(r.read())

    def json(self, path: str) -> Any:
        return json.loads(self.http("GET", path))

    def close(self) -> None:
        self.stop(signal.SIGKILL, 5)
        for p in (self.ready_path, self.log_path):
            try:
                os.unlink(p)
            except OSError:
                pass


def make_certs() -> pathlib.Path:
    """A CA, a server certificate for 127.0.0.1 (an IP subjectAltName) and a client
    certificate signed by the CA, made with the openssl command (as test_tls.c)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="tp_py_tls_"))
    key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    ca_ext = "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
    steps = [
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext",
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext",
        f"openssl req -x509 {key} -keyout ca.key -out ca.pem -days 2 -subj /CN=taskpush-py-ca {ca_ext}",
        f"openssl req {key} -keyout server.key -out server.csr -subj /CN=taskpushd-py",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile server.ext -out server.pem",
        f"openssl req {key} -keyout client.key -out client.csr -subj /CN=py-worker",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile client.ext -out client.pem",
    ]
    for step in steps:
        r = subprocess.run(step, shell=True, cwd=d, capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"making certificates failed at {step}:\n{r.stderr.decode(errors='replace')}")
    return d


class TapResult(unittest.TestResult):
    """Prints one TAP line per case as it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def _line(self, ok: bool, test: unittest.TestCase, detail: str = "") -> None:
        self.n += 1
        print(f"{'ok' if ok else 'not ok'} {self.n} - {test.id()}", flush=True)
        for line in detail.splitlines():
            print(f"# {line}", flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._line(True, test)

    def addFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addFailure(test, err)  # type: ignore[arg-type]
        self._line(False, test, self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: object) -> None:
        super().addError(test, err)  # type: ignore[arg-type]
        self._line(False, test, self.errors[-1][1])

    def addSubTest(self, test: unittest.TestCase, subtest: unittest.TestCase, err: object) -> None:
        super().addSubTest(test, subtest, err)  # type: ignore[arg-type]
        if err is not None:  # the parent then reports no success of its own
            self._line(False, subtest, (self.failures + self.errors)[-1][1])

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._line(False, test, f"skipped ({reason}): a skip counts as a failure here")


def tap_main(module: str) -> None:
    """Runs every case of module and prints TAP; exit 1 when any failed."""
    import logging
    logging.basicConfig(level=os.environ.get("TP_PY_LOG", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s")
    suite = unittest.defaultTestLoader.loadTestsFromName(module)
    result = TapResult()
    suite.run(result)
    print(f"1..{result.n}", flush=True)  # at the end: a failing subtest adds a line
    sys.exit(0 if result.wasSuccessful() and result.n > 0 else 1)
