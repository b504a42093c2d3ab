"""test_submit: SUBMIT from Python (protocol version 2) against the real taskpushd
and MariaDB: the producer-only Client and a Worker's handlers.

Needs a taskpushd that speaks protocol version 2 or later (the SUBMIT frames of
proto/PROTOCOL.md); against version 1 every case fails on NotSupported.

Cases:
  commit_before_ack   the dispatcher is stopped (SIGSTOP) the moment submit() returns:
                      another connection (the mariadb client) already finds the row, with
                      the type, payload, priority, max_attempts, timeout_ms and dedup_key sent
  dedup               a second submit with the same dedup_key is DUPLICATE with the first
  group_key           group_key= reaches the row's group_key (none: NULL); 192 bytes is a
                      ValueError before anything is sent
                      row's id, and the table holds one row; in one SUBMIT of 3 entries the
                      repeated key comes back DUPLICATE
  after               after=[A]: the task waits (`delayed` 2) until A succeeds, then runs
                      after it, and waited for (wait=True) gives its result; after= an
                      unknown id is a SubmitError (INVALID); 1001 ids a ValueError
  delay               delay_ms 1500: run_after is 1.5 s after the insert, and the worker
                      receives it no sooner than 1.5 s after the submit returned
  wait                wait=True on a task a worker succeeds with gives the result; on one it
                      fails permanently, FAILED with the error text
  many                one SUBMIT of 300 tasks: 300 distinct ids, all rows NEW then drained
  from_handler        a handler submits two children per task down to depth 4 (waiting
                      for each SUBMITTED): 31 rows, all SUCCESSFUL, every child's
                      dedup_key unique, no duplicate delivery
  invalid             a task type with a trailing space is refused (SubmitError), nothing
                      inserted; a version 1 worker session refuses submit (NotSupported)
  standby_first       Client(standby, leader): the standby answers the submit UNAVAILABLE
                      and the Client sends it to the leader at once: one row, inserted
                      there; a Client given the standby alone raises Unavailable, nothing
                      inserted
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


class Submit(Case):
    def client(self) -> taskpush.Client:
        c = taskpush.Client(self.d.listen, name="py-producer")
        self.addCleanup(c.close)
        return c

    def test_commit_before_ack(self) -> None:
        c = self.client()
        r = c.submit("cba", b"\x00payload\xff", priority=2, dedup_key=b"k-1", max_attempts=7, timeout_ms=4321)
        self.d.signal(signal.SIGSTOP)
        try:
            rows = self.db.rows("SELECT task_id, task_type, HEX(payload), task_priority, max_attempts, "
                                "timeout_ms, dedup_key, task_state FROM task")
        finally:
            self.d.signal(signal.SIGCONT)
        self.assertFalse(r.duplicate)
        self.assertEqual(rows, [[str(r.task_id), "cba", b"\x00payload\xff".hex().upper(), "2", "7", "4321",
                                 "k-1", "0"]])

    def test_standby_first(self) -> None:
        standby = self.daemon(lead=False)
        self.assertFalse(standby.json("/stats")["leader"])
        c = taskpush.Client(f"{standby.listen},{self.d.listen}", name="py-producer")
        self.addCleanup(c.close)
        r = c.submit("sf", b"p", dedup_key="sf-1")
        self.assertFalse(r.duplicate)
        self.assertEqual(self.db.rows("SELECT task_id, dedup_key FROM task"), [[str(r.task_id), "sf-1"]])
        # The next submit stays with the leader.
        self.assertTrue(c.submit("sf", b"p", dedup_key="sf-1").duplicate)
        alone = taskpush.Client(standby.listen, name="py-producer")
        self.addCleanup(alone.close)
        with self.assertRaises(taskpush.Unavailable):
            alone.submit("sf", b"q")
        self.assertEqual(self.count("1"), 1)

    def test_dedup(self) -> None:
        c = self.client()
        a = c.submit("dd", b"first", dedup_key="same")
        b = c.submit("dd", b"second", dedup_key="same")
        self.assertFalse(a.duplicate)
        self.assertTrue(b.duplicate)
        self.assertEqual(b.task_id, a.task_id)
        self.assertEqual(self.db.rows("SELECT task_id, payload FROM task"), [[str(a.task_id), "first"]])
        rs = c.submit_many([taskpush.make_task("dd", b"x", dedup_key="k2"),
                            taskpush.make_task("dd", b"y", dedup_key="same"),
                            taskpush.make_task("dd", b"z")])
        self.assertEqual([r.duplicate for r in rs], [False, True, False])
        self.assertEqual(rs[1].task_id, a.task_id)
        self.assertEqual(self.count("1"), 3)

    def test_group_key(self) -> None:
        c = self.client()
        r = c.submit("gk", b"p", group_key="host-a")
        plain = c.submit("gk", b"q")
        self.assertEqual(self.db.rows("SELECT task_id, group_key FROM task ORDER BY task_id"),
                         [[str(r.task_id), "host-a"], [str(plain.task_id), "NULL"]])
        with self.assertRaises(ValueError):
            c.submit("gk", b"r", group_key=b"k" * 192)
        self.assertEqual(self.count("1"), 2)

    def test_after(self) -> None:
        order: List[bytes] = []
        w = self.worker()
        w.add_handler("dep", lambda t: order.append(t.payload) or b"done " + t.payload)  # type: ignore[func-returns-value]
        c = self.client()
        a = c.submit("dep", b"a")
        b = c.submit_many([taskpush.make_task("dep", b"b", after=[a.task_id])])[0]
        self.assertEqual(self.db.value(f"SELECT `delayed` FROM task WHERE task_id = {b.task_id}"), "2")
        self.start(w)
        self.wait_rows("task_state = 2", 2, "SUCCESSFUL")
        self.assertEqual(order, [b"a", b"b"])
        waited = c.submit("dep", b"c", after=[a.task_id, b.task_id], wait=True, wait_timeout_s=tplib.WAIT_S)
        assert waited.outcome is not None
        self.assertEqual((waited.outcome.succeeded, waited.outcome.data), (True, b"done c"))
        with self.assertRaises(taskpush.SubmitError) as cm:
            c.submit("dep", b"x", after=[a.task_id + 1000000])
        self.assertIn("does not exist", str(cm.exception))
        with self.assertRaises(ValueError):
            taskpush.make_task("dep", b"y", after=list(range(1, 1002)))

    def test_delay(self) -> None:
        got: List[float] = []
        w = self.worker()
        w.add_handler("later", lambda t: got.append(time.monotonic()) or b"ok")  # type: ignore[func-returns-value]
        self.start(w)
        tplib.wait_for(lambda: w.stats["connections"] == 1, "the worker to connect")
        c = self.client()
        r = c.submit("later", b"x", delay_ms=1500)
        t0 = time.monotonic()
        gap = int(self.db.value(f"SELECT run_after - insert_time FROM task WHERE task_id = {r.task_id}"))
        self.assertGreaterEqual(gap, 1400)
        self.assertLess(gap, 1500 + 10000)
        self.wait_rows("task_state = 2", 1, "SUCCESSFUL")
        self.assertEqual(len(got), 1)
        self.assertGreaterEqual(got[0] - t0, 1.4)

    def test_wait(self) -> None:
        w = self.worker()

        @w.handler("waited", concurrency=2)
        def waited(task: taskpush.Task) -> bytes:
            if task.payload == b"bad":
                raise taskpush.PermanentFailure("no good")
            return b"result of " + task.payload

        self.start(w)
        c = self.client()
        ok = c.submit("waited", b"good", wait=True, wait_timeout_s=tplib.WAIT_S)
        bad = c.submit("waited", b"bad", wait=True, wait_timeout_s=tplib.WAIT_S)
        assert ok.outcome is not None and bad.outcome is not None
        self.assertEqual((ok.outcome.task_id, ok.outcome.succeeded, ok.outcome.data), (ok.task_id, True, b"result of good"))
        self.assertEqual((bad.outcome.succeeded, bad.outcome.data), (False, b"no good"))
        self.assertEqual(self.db.rows(f"SELECT task_state, err_msg FROM task WHERE task_id = {bad.task_id}"),
                         [["3", "no good"]])

    def test_many(self) -> None:
        c = self.client()
        rs = c.submit_many([taskpush.make_task("many", b"%d" % i, priority=i % 3) for i in range(300)])
        ids = {r.task_id for r in rs}
        self.assertEqual(len(ids), 300)
        self.assertEqual(self.count(f"task_state = 0 AND task_id IN ({','.join(map(str, ids))})"), 300)
        w = self.worker()
        w.add_handler("many", lambda t: t.payload, concurrency=4)
        self.start(w)
        self.wait_rows("task_state = 2 AND result = payload", 300, "SUCCESSFUL")

    def test_from_handler(self) -> None:
        runs: Dict[str, int] = {}
        receipts: List[taskpush.Receipt] = []
        lock = threading.Lock()
        w = self.worker()

        @w.handler("tree", concurrency=4)
        def tree(task: taskpush.Task) -> bytes:
            path = task.payload.decode()
            with lock:
                runs[path] = runs.get(path, 0) + 1
            if len(path) < 5:  # "r" and 4 generations below it: 1 + 2 + 4 + 8 + 16 rows
                for child in (path + "0", path + "1"):
                    r = task.submit("tree", child, dedup_key="tree:" + child, wait_timeout_s=tplib.WAIT_S)
                    with lock:
                        receipts.append(r)
            return b"ok"

        self.start(w)
        tplib.wait_for(lambda: w.connected_version >= 2, "a version 2 (or later) session")
        self.client().submit("tree", b"r", dedup_key="tree:r")
        self.wait_rows("task_state = 2", 31, "SUCCESSFUL")
        time.sleep(0.3)
        self.assertEqual(self.count("1"), 31)
        self.assertEqual(self.count("dedup_key LIKE 'tree:%'"), 31)
        self.assertEqual(sorted(set(runs.values())), [1])
        ids = {int(r[0]) for r in self.db.rows("SELECT task_id FROM task WHERE payload <> 'r'")}
        self.assertEqual({(r.task_id, r.duplicate) for r in receipts}, {(i, False) for i in ids})

    def test_invalid(self) -> None:
        c = self.client()
        with self.assertRaises(taskpush.SubmitError) as cm:
            c.submit("bad type ", b"x")
        self.assertNotIsInstance(cm.exception, taskpush.Unavailable)
        self.assertEqual(self.count("1"), 0)
        self.assertEqual(c.submit("fine", b"x").duplicate, False)  # the connection goes on
        w1 = self.worker(protocol_version=1)
        w1.add_handler("v1", lambda t: b"ok")
        self.start(w1)
        tplib.wait_for(lambda: w1.connected_version == 1, "a version 1 session")
        with self.assertRaises(taskpush.NotSupported):
            w1.submit("v1", b"x")


if __name__ == "__main__":
    tplib.tap_main("test_submit")
