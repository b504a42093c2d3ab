#!/usr/bin/env python3
"""taskpushd as its systemd unit runs it, on the private MariaDB (TASKPUSH_TEST_MYSQL_*).

The shipped example configuration (packaging/taskpushd.conf), with every line that shows
a built-in default uncommented, is loaded by the real taskpushd; /stats must show each of
those values, so the file cannot advertise a default the daemon does not have. The
database user is given exactly the privileges of the README's GRANT (read from
README.md) and its password only through TASKPUSH_DB_PASSWORD, as the unit's
EnvironmentFile does: taskpushd must lead the table, a task must run through
taskpush-worker to SUCCESSFUL, and no statement may be denied. With libsystemd, the
daemon must send READY=1 on NOTIFY_SOCKET once its ports accept connections, and
STOPPING=1 on SIGTERM before it exits 0.

Usage: test-service.py TASKPUSHD TASKPUSH_WORKER TASKPUSHCTL EXAMPLE_CONF HAVE_NOTIFY(0|1)
"""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

NO_DEFAULT = {"db", "token-file", "admin-token-file", "tls-cert", "tls-key", "tls-ca", "type-limit", "group-limit", "types",
              "shard"}
# Flags that are no setting of a service: actions, and the ready file (for scripts).
NOT_IN_FILE = {"help", "version", "migrate", "config", "ready-file"}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def wait_for(what, pred, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out waiting for " + what)


class Admin:
    """The test's all-privileges login, through the mariadb client."""

    def __init__(self):
        try:
            self.host = os.environ["TASKPUSH_TEST_MYSQL_HOST"]
            self.port = os.environ["TASKPUSH_TEST_MYSQL_PORT"]
            self.user = os.environ["TASKPUSH_TEST_MYSQL_USER"]
        except KeyError as e:
            fail(f"{e.args[0]} is not set: start scripts/tp-mariadb first")
        self.client = shutil.which("mariadb") or shutil.which("mysql")
        if not self.client:
            fail("no mariadb client")

    def run(self, sql, db=None, stdin=None):
        cmd = [self.client, "--protocol=TCP", "-h", self.host, "-P", self.port, "-u", self.user,
               "-N", "-B"] + ([db] if db else []) + ([] if stdin else ["-e", sql])
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"mariadb: {sql or 'script'}: {p.stderr.strip()}")
        return p.stdout


def readme_grant(root):
    """The privileges of the README's GRANT for the daemon's user."""
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*GRANT (.+) ON taskpush\.\* TO 'taskpush'@'[^']*';\s*$", line)
            if m:
                return m.group(1)
    fail("README.md has no line GRANT ... ON taskpush.* TO 'taskpush'@'HOST';")


def example_defaults(path, taskpushd):
    """The KEY = VALUE pairs of the '#KEY = VALUE' lines that show a default. Every
    setting of taskpushd --help must have its line (the file lists them all)."""
    pairs, keys = {}, set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"#([a-z][a-z0-9-]*) = (\S+)\s*$", line)
            if m:
                keys.add(m.group(1))
                if m.group(1) not in NO_DEFAULT:
                    pairs[m.group(1)] = m.group(2)
    helptext = subprocess.run([taskpushd, "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"--([a-z][a-z0-9-]*)", helptext)) - NOT_IN_FILE
    if not flags or flags - keys:
        fail(f"{path} has no '#KEY = VALUE' line for {sorted(flags - keys)} of taskpushd --help")
    return pairs


def recv_state(sock, timeout_s):
    sock.settimeout(timeout_s)
    try:
        return sock.recv(4096).decode()
    except socket.timeout:
        return None


def ctl(ctl_bin, admin_addr, *args):
    return subprocess.run([ctl_bin, "--admin", admin_addr, *args], capture_output=True, text=True)


def main():
    if len(sys.argv) != 6:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    taskpushd, worker_bin, ctl_bin, conf_path, have_notify = sys.argv[1:]
    have_notify = have_notify == "1"
    root = os.environ.get("TASKPUSH_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
    admin = Admin()
    privileges = readme_grant(root)
    defaults = example_defaults(conf_path, taskpushd)

    tag = f"{os.getpid()}"
    db, user, password = f"tp_install_{tag}", f"tp_least_{tag}", secrets.token_hex(12)
    work = tempfile.mkdtemp(prefix="tp-install-")
    proc = worker = None
    try:
        admin.run(f"DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
        with open(os.path.join(root, "sql", "schema.sql"), encoding="utf-8") as f:
            admin.run(None, db=db, stdin=f.read())
        admin.run(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'; "
                  f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                  f"GRANT {privileges} ON `{db}`.* TO '{user}'@'127.0.0.1'")

        conf = os.path.join(work, "taskpushd.conf")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(f"db = mysql://{user}@127.0.0.1:{admin.port}/{db}\n")
            f.writelines(f"{k} = {v}\n" for k, v in defaults.items())
        notify_path = os.path.join(work, "notify")
        nsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        nsock.bind(notify_path)
        ready = os.path.join(work, "ready.json")
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, TASKPUSH_DB_PASSWORD=password)
        env.pop("TASKPUSH_DB", None)
        log_path = os.path.join(work, "taskpushd.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([taskpushd, "--config", conf, "--listen", "127.0.0.1:0",
                                     "--admin", "127.0.0.1:0", "--ready-file", ready],
                                    env=env, stdout=log, stderr=log)

        if have_notify:
            state = recv_state(nsock, 30)
            if state is None or "READY=1" not in state.split("\n"):
                fail(f"no READY=1 on NOTIFY_SOCKET (got {state!r})")
            if not os.path.exists(ready):
                fail("READY=1 came before the ready file was written")
        else:
            wait_for("the ready file", lambda: os.path.exists(ready), 30)
        with open(ready, encoding="utf-8") as f:
            addrs = json.load(f)
        lhost, lport = addrs["listen"].rsplit(":", 1)
        socket.create_connection((lhost, int(lport)), timeout=5).close()
        print(f"taskpushd ready on {addrs['listen']}, admin {addrs['admin']}"
              + (" (READY=1 received)" if have_notify else ""))

        def leading():
            r = ctl(ctl_bin, addrs["admin"], "--json", "stats")
            st = json.loads(r.stdout) if r.returncode == 0 else {}
            return st if st.get("leader") else None

        stats = wait_for("taskpushd to lead the table with the README's GRANT", leading, 30)
        if ctl(ctl_bin, addrs["admin"], "health").returncode != 0:
            fail("taskpushctl health: not healthy while leading")
        settings = stats["settings"]
        for k, v in defaults.items():
            if k in ("listen", "admin"):  # the flags above put them on free ports
                continue
            want = "0" if v == "keep" else v
            if str(settings.get(k)) != want:
                fail(f"the example file says the default of {k} is {v}; taskpushd has {settings.get(k)!r}")
        print(f"{len(defaults)} defaults of the example file are taskpushd's")

        admin.run("INSERT INTO task (task_type, payload) VALUES ('install-check', 'abc')", db=db)
        worker = subprocess.Popen([worker_bin, "--connect", addrs["listen"], "--type", "install-check",
                                   "--exec", "tr a-z A-Z"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_for("the task to be SUCCESSFUL",
                 lambda: admin.run("SELECT task_state, result FROM task", db=db).strip() == "2\tABC", 30)
        worker.send_signal(signal.SIGTERM)
        if worker.wait(timeout=30) != 0:
            fail("taskpush-worker did not exit 0 on SIGTERM")
        worker = None
        print("a task ran to SUCCESSFUL under the README's GRANT")

        proc.send_signal(signal.SIGTERM)
        if have_notify:
            state = recv_state(nsock, 30)
            if state is None or "STOPPING=1" not in state.split("\n"):
                fail(f"no STOPPING=1 on NOTIFY_SOCKET after SIGTERM (got {state!r})")
        rc = proc.wait(timeout=60)
        proc = None
        if rc != 0:
            fail(f"taskpushd exited {rc} after SIGTERM")
        with open(log_path, encoding="utf-8") as f:
            log_text = f.read()
        if re.search(r"denied|error \d+|MySQL error", log_text, re.I):
            fail("taskpushd logged a database error under the README's GRANT:\n" + log_text)
        print("SIGTERM: " + ("STOPPING=1, " if have_notify else "") + "exit 0, no statement denied")
    finally:
        for p in (worker, proc):
            if p is not None:
                p.kill()
                p.wait()
        admin.run(f"DROP DATABASE IF EXISTS `{db}`; DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
