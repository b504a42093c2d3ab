#!/usr/bin/env python3
"""Task.progress (PROGRESS, protocol version 4) against the real taskpushd and the
private MariaDB of scripts/tp-mariadb (TASKPUSH_TEST_MYSQL_*). Prints TAP.

Cases:
  reports        a handler reports 3 times within a second, then more slowly: /task
                 shows the latest value and text each time; after the task ends, none;
                 values and texts out of bounds raise ValueError before anything is sent
  version_3      a worker held to protocol version 3: progress_supported is False and
                 progress() returns False (nothing sent, the session stays up); the
                 task succeeds
"""
import pathlib
import sys
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tplib  # noqa: E402
from test_worker import Case  # noqa: E402

import taskpush  # noqa: E402


class Progress(Case):
    def task_progress(self, task_id: int) -> object:
        return self.d.json(f"/task?id={task_id}").get("progress")

    def wait_progress(self, task_id: int, permille: int, text: str) -> None:
        tplib.wait_for(lambda: (self.task_progress(task_id) or {}).get("permille") == permille
                       and (self.task_progress(task_id) or {}).get("message") == text,
                       f"progress {permille} '{text}' in /task")

    def test_reports(self) -> None:
        self.db.insert_tasks("long", ["x"])
        task_id = int(self.db.value("SELECT MAX(task_id) FROM task"))
        step = threading.Event()
        seen = {"supported": False, "refused": 0, "sent": 0}
        w = self.worker()

        @w.handler("long")
        def long(task: taskpush.Task) -> bytes:
            seen["supported"] = task.progress_supported
            for v, text in ((100, "one"), (200, "two"), (300, "three of ten")):
                seen["sent"] += task.progress(v, text)
            step.wait(tplib.WAIT_S)
            seen["sent"] += task.progress(800, "fast \u00e9tape")
            for bad in ((-1, None), (1001, None), (5, "a" * 257), (5, "nul\0")):
                try:
                    task.progress(*bad)
                except ValueError:
                    seen["refused"] += 1
            step.clear()
            step.wait(tplib.WAIT_S)
            return b"done"

        self.start(w)
        self.wait_progress(task_id, 300, "three of ten")
        step.set()
        self.wait_progress(task_id, 800, "fast \u00e9tape")
        step.set()
        self.wait_rows("task_state = 2", 1, "SUCCESSFUL")
        self.assertIsNone(self.task_progress(task_id))
        self.assertTrue(seen["supported"])
        self.assertEqual(seen["sent"], 4)
        self.assertEqual(seen["refused"], 4)
        self.assertGreaterEqual(self.d.json("/stats")["tasks"]["progress_total"], 2)

    def test_version_3(self) -> None:
        self.db.insert_tasks("old", ["x"])
        seen = {"supported": True, "sent": True}
        w = self.worker(protocol_version=3)

        @w.handler("old")
        def old(task: taskpush.Task) -> bytes:
            seen["supported"] = task.progress_supported
            seen["sent"] = task.progress(500, "half")
            return b"ok"

        self.start(w)
        self.wait_rows("task_state = 2", 1, "SUCCESSFUL")
        self.assertFalse(seen["supported"])
        self.assertFalse(seen["sent"])
        self.assertEqual(w.connected_version, 3)
        self.assertEqual(self.d.json("/stats")["tasks"]["progress_total"], 0)


if __name__ == "__main__":
    tplib.tap_main("test_progress")
