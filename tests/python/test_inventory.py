"""test_inventory: protocol version 3's inventory, the Python Worker against the real
taskpushd and MariaDB over TCP: a worker keeps running what it holds when its
dispatcher dies, keeps outcomes until CONFIRMed, and declares both to the restarted
dispatcher, which adopts the deliveries instead of running them again.

Each case has its own database and taskpushd (test_worker.Case). The dispatcher is
restarted on the same port with --adopt-grace-ms; waits are bounded polls and
nothing asserts how long something took.

Cases:
  kill_restart_adopts    six long tasks run on one worker; the dispatcher is killed
                         (SIGKILL); three tasks finish while it is down (their outcomes
                         kept, unconfirmed), then it starts again: those three rows are
                         written SUCCESSFUL from the outcomes sent again; the other
                         three are declared (HOLDING) and adopted: still PROCESSING past
                         the adopt grace, then SUCCESSFUL when they finish. Every
                         handler ran exactly once and never saw a cancel, every row
                         has attempts 1 and its result, the new dispatcher's /stats
                         counts 3 adopted and succeeded, and 3 outcomes of the earlier
                         epoch written (each once), and every outcome ends confirmed
  standby_adopts         the same across a failover: a worker given the leader's and a
                         standby's addresses runs four long tasks; the leader is killed
                         (SIGKILL); the standby leads, the worker moves to it and
                         declares the four, which stay PROCESSING past the standby's
                         adopt grace and end SUCCESSFUL there; each ran once, with
                         attempts 1, and the standby's /stats counts 4 adopted
  refused_is_cancelled   a delivery whose row was deleted while the dispatcher was
                         down is declared, refused with CANCEL (the handler sees
                         cancelled; /stats counts 1 refused), while the other one is
                         adopted and ends SUCCESSFUL at attempt 1 with one run; the
                         worker stays connected
  late_worker_refused    a worker that comes back after its dispatcher's successor
                         recovered the row (a leader on another port, with a 500 ms
                         grace, that the worker cannot reach): its declaration is
                         refused with CANCEL (the first run sees cancelled, /stats
                         counts 1 refused), its late outcome is not written, and the
                         task runs again and ends SUCCESSFUL with the second result
  version2_as_before     a worker speaking version 2 offers no inventory: the kill
                         cancels its running task (task.cancelled), the outcome is
                         dropped, and the restarted dispatcher delivers it again
                         (after its grace), which ends SUCCESSFUL: two runs
  stop_waits_confirm     a version 3 worker stopped gracefully returns from run() with
                         every outcome confirmed (none kept) and every row SUCCESSFUL
"""
import pathlib
import signal
import sys
import threading
import time
import unittest
from typing import Dict, List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tplib  # noqa: E402
from test_worker import Case  # noqa: E402

import taskpush  # noqa: E402

GRACE_MS = 3000  # the default; a worker reconnects well within it


class Inventory(Case):
    def restartable(self, grace_ms: int = GRACE_MS) -> str:
        """Replaces the dispatcher of setUp by one on a port kept across restarts."""
        port = self.d.listen.rsplit(":", 1)[1]
        self.d.close()
        self.daemons.remove(self.d)
        self.d = self.daemon(["--adopt-grace-ms", str(grace_ms)], listen=f"127.0.0.1:{port}")
        return f"127.0.0.1:{port}"

    def stat(self, path: str) -> int:
        v = self.d.json("/stats")
        for k in path.split("."):
            v = v[k]
        return int(v)

    def kill(self, w: taskpush.Worker) -> None:
        self.d.stop(signal.SIGKILL)
        tplib.wait_for(lambda: w.stats["disconnects"] >= 1, "the worker to see the dispatcher gone")

    def test_kill_restart_adopts(self) -> None:
        listen = self.restartable()
        self.db.insert_tasks("long", [f"early{i}" for i in range(3)] + [f"late{i}" for i in range(3)])
        runs: Dict[int, int] = {}
        cancelled: List[int] = []
        lock = threading.Lock()
        down, late_go = threading.Event(), threading.Event()
        w = self.worker(listen)

        @w.handler("long", concurrency=6)
        def long(task: taskpush.Task) -> bytes:
            with lock:
                runs[task.id] = runs.get(task.id, 0) + 1
            (down if task.payload.startswith(b"early") else late_go).wait(3 * tplib.WAIT_S)
            if task.cancelled:
                with lock:
                    cancelled.append(task.id)
            return b"done-" + task.payload

        self.start(w)
        tplib.wait_for(lambda: len(runs) == 6, "six tasks running")
        self.assertGreaterEqual(w.connected_version, 3)  # a version with inventory
        self.kill(w)
        down.set()
        tplib.wait_for(lambda: w.unconfirmed() == 3 and w.held() == 3,
                       "three outcomes kept, three tasks still running")
        self.assertEqual(w.stats["tasks_dropped"], 0)

        self.d.start(listen=listen)
        restarted = time.monotonic()
        self.wait_rows("task_state = 2 AND payload LIKE 'early%'", 3, "written from the outcomes sent again")
        tplib.wait_for(lambda: w.stats["deliveries_declared"] == 3, "the three running tasks declared")
        # Past the grace a row that was not adopted would be recovered (NEW, then run again).
        time.sleep(max(0.0, restarted + GRACE_MS / 1000.0 + 1.0 - time.monotonic()))
        self.assertEqual(self.count("task_state = 1 AND payload LIKE 'late%'"), 3)
        late_go.set()
        self.wait_rows("task_state = 2", 6, "SUCCESSFUL")
        tplib.wait_for(lambda: w.unconfirmed() == 0, "every outcome confirmed")
        time.sleep(0.3)  # a second delivery would show up in runs now
        self.assertEqual(sorted(runs.values()), [1] * 6)
        self.assertEqual(cancelled, [])
        self.assertEqual(self.count("task_state = 2 AND attempts = 1 AND result = CONCAT('done-', payload)"), 6)
        # The adopted three end as this dispatcher's own deliveries; the three sent again
        # are outcomes of an earlier epoch's deliveries, each written once.
        self.assertEqual(self.stat("tasks.adopted_total"), 3)
        self.assertEqual(self.stat("tasks.succeeded_total"), 3)
        self.assertEqual(self.stat("tasks.foreign_written_total"), 3)
        self.assertGreaterEqual(w.stats["outcomes_resent"], 3)
        self.assertEqual((w.stats["tasks_dropped"], w.stats["outcomes_forgotten"]), (0, 0))

    def test_standby_adopts(self) -> None:
        standby = self.daemon(["--adopt-grace-ms", str(GRACE_MS)], lead=False)
        self.db.insert_tasks("fo", [f"t{i}" for i in range(4)])
        runs: Dict[int, int] = {}
        lock = threading.Lock()
        go = threading.Event()
        w = self.worker(f"{self.d.listen},{standby.listen}")

        @w.handler("fo", concurrency=4)
        def fo(task: taskpush.Task) -> bytes:
            with lock:
                runs[task.id] = runs.get(task.id, 0) + 1
            go.wait(3 * tplib.WAIT_S)
            return b"cancelled" if task.cancelled else b"ok"

        self.start(w)
        tplib.wait_for(lambda: len(runs) == 4, "four tasks running")
        self.kill(w)
        tplib.wait_for(lambda: bool(standby.json("/stats")["leader"]), "the standby to lead")
        leads = time.monotonic()
        tplib.wait_for(lambda: w.stats["deliveries_declared"] == 4, "the four tasks declared to the standby")
        time.sleep(max(0.0, leads + GRACE_MS / 1000.0 + 1.0 - time.monotonic()))
        self.assertEqual(self.count("task_state = 1"), 4)
        go.set()
        self.wait_rows("task_state = 2 AND attempts = 1 AND result = 'ok'", 4, "SUCCESSFUL")
        tplib.wait_for(lambda: w.unconfirmed() == 0, "every outcome confirmed")
        time.sleep(0.3)
        self.assertEqual(sorted(runs.values()), [1] * 4)
        self.assertEqual(int(standby.json("/stats")["tasks"]["adopted_total"]), 4)
        self.assertGreaterEqual(w.connected_version, 3)  # a version with inventory

    def test_refused_is_cancelled(self) -> None:
        listen = self.restartable()
        self.db.insert_tasks("ref", ["keep", "gone"])
        runs: Dict[bytes, int] = {}
        seen: Dict[bytes, bool] = {}
        lock = threading.Lock()
        go = threading.Event()
        w = self.worker(listen)

        @w.handler("ref", concurrency=2)
        def ref(task: taskpush.Task) -> bytes:
            with lock:
                runs[task.payload] = runs.get(task.payload, 0) + 1
            if task.payload == b"gone":
                seen[task.payload] = task.wait_cancelled(3 * tplib.WAIT_S)
            else:
                go.wait(3 * tplib.WAIT_S)
                seen[task.payload] = task.cancelled
            return b"ok"

        self.start(w)
        tplib.wait_for(lambda: len(runs) == 2, "both tasks running")
        self.kill(w)
        self.db.exec("DELETE FROM task WHERE payload = 'gone'")
        self.d.start(listen=listen)
        tplib.wait_for(lambda: b"gone" in seen, "the refused delivery cancelled")
        self.assertTrue(seen[b"gone"])
        self.assertGreaterEqual(w.stats["cancels_received"], 1)
        self.assertEqual(self.stat("tasks.adopt_refused_total"), 1)
        go.set()
        self.wait_rows("task_state = 2 AND attempts = 1 AND payload = 'keep'", 1, "SUCCESSFUL")
        self.assertFalse(seen[b"keep"])
        self.assertEqual(runs, {b"keep": 1, b"gone": 1})
        self.assertGreaterEqual(w.connected_version, 3)  # a version with inventory
        self.assertEqual(w.stats["connections"], 2)

    def test_late_worker_refused(self) -> None:
        listen = self.restartable(500)
        self.db.insert_tasks("lw", ["x"])
        runs: List[int] = []
        seen: Dict[int, bool] = {}
        w = self.worker(listen)

        @w.handler("lw")
        def lw(task: taskpush.Task) -> bytes:
            runs.append(task.attempt)
            if len(runs) == 1:
                seen[1] = task.wait_cancelled(3 * tplib.WAIT_S)
                return b"first"
            return b"second"

        self.start(w)
        tplib.wait_for(lambda: len(runs) == 1, "the task running")
        self.kill(w)
        away = self.daemon(["--adopt-grace-ms", "500"])  # a port the worker does not know
        self.wait_rows("task_state = 0", 1, "recovered by the leader the worker cannot reach")
        away.stop(signal.SIGTERM)
        self.d.start(listen=listen)
        self.wait_rows("task_state = 2", 1, "SUCCESSFUL")
        self.assertEqual(self.db.value("SELECT result FROM task"), "second")
        self.assertTrue(seen[1])
        self.assertEqual(len(runs), 2, runs)
        self.assertEqual(w.stats["deliveries_declared"], 1)
        self.assertEqual(self.stat("tasks.adopt_refused_total"), 1)

    def test_version2_as_before(self) -> None:
        listen = self.restartable(500)
        self.db.insert_tasks("v2", ["x"])
        runs: List[int] = []  # the attempt of each run
        seen: Dict[int, bool] = {}
        w = self.worker(listen, protocol_version=2)

        @w.handler("v2")
        def v2(task: taskpush.Task) -> bytes:
            runs.append(task.attempt)
            if len(runs) == 1:
                seen[1] = task.wait_cancelled(3 * tplib.WAIT_S)
            else:
                seen[2] = task.cancelled
            return b"ok"

        self.start(w)
        tplib.wait_for(lambda: len(runs) == 1, "the task running")
        self.assertEqual(w.connected_version, 2)
        self.kill(w)
        tplib.wait_for(lambda: 1 in seen, "the handler to see the lost connection")
        self.assertTrue(seen[1])
        tplib.wait_for(lambda: w.stats["tasks_dropped"] == 1, "the outcome dropped")
        self.d.start(listen=listen)
        # A delivery lost within its first second was not recorded in the table yet, so
        # the second run may be attempt 1 again (docs/schema.md, "The attempts column").
        self.wait_rows("task_state = 2 AND result = 'ok'", 1, "SUCCESSFUL after the restart")
        self.assertEqual(len(runs), 2, runs)
        self.assertFalse(seen[2])
        self.assertEqual((w.stats["deliveries_declared"], w.stats["outcomes_resent"]), (0, 0))

    def test_stop_waits_confirm(self) -> None:
        n = 40
        self.db.insert_tasks("sc", [str(i) for i in range(n)])
        w = self.worker()
        w.add_handler("sc", lambda t: b"ok", concurrency=4)
        self.start(w)
        self.wait_rows("task_state = 2", n, "SUCCESSFUL")
        w.stop()
        self.threads[-1].join(tplib.WAIT_S)
        self.assertFalse(self.threads[-1].is_alive())
        self.assertEqual(w.unconfirmed(), 0)
        self.assertEqual(w.stats["outcomes_confirmed"], n)
        self.assertEqual(w.stats["tasks_completed"], n)


if __name__ == "__main__":
    tplib.tap_main("test_inventory")
