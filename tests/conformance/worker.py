#!/usr/bin/env python3
"""The conformance worker of the Python package (python/): the command line, the
payload instructions and the event lines of tests/conformance/README.md, the same
as the C, Go and Java conformance workers. tests/conformance/driver.py runs it.

    worker.py --addr A[,B] --type T --concurrency N [--token T] [--tls-ca F
              [--tls-cert F --tls-key F]] [--reconnect-min-ms MS --reconnect-max-ms MS]
    worker.py --addr A [--token T] [--tls-*] --submit TYPE --payload P [--dedup K] [--wait]
"""
import argparse
import os
import pathlib
import sys
import threading
import time
from typing import Any, Dict, Optional

sys.path.insert(0, str(pathlib.Path(os.environ.get("TASKPUSH_SOURCE_ROOT",
                                                   pathlib.Path(__file__).resolve().parents[2])) / "python"))
import taskpush  # noqa: E402

_out = threading.Lock()


def emit(line: str) -> None:
    """One event line, whole, at once (handlers print from several threads)."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def handle(task: taskpush.Task) -> bytes:
    words = task.payload.split(b" ", 2)
    op = words[0].decode(errors="replace")
    arg = words[1].decode(errors="replace") if len(words) > 1 else ""
    emit(f"start {task.id} {task.attempt} {task.epoch} {task.priority} {task.type} {now_ms()}")
    outcome = "ok"
    try:
        if op == "ok":
            return arg.encode()
        if op == "fail":
            outcome = "fail"
            raise taskpush.Fail(arg)
        if op == "fail-permanent":
            outcome = "fail-permanent"
            raise taskpush.PermanentFailure(arg)
        if op == "retry-after":
            if task.attempt == 1:
                outcome = "retry-after"
                raise taskpush.RetryAfter(int(arg), "later")
            return b"after"
        if op == "crash":
            outcome = "crash"
            raise ValueError("conformance crash")
        if op == "big":
            return b"r" * int(arg)
        if op == "sleep" or op == "wait-cancel":
            total_ms = int(arg) if op == "sleep" else 60000
            extend_ms = task.timeout_ms if len(words) > 2 and words[2].startswith(b"extend") else 0
            end = time.monotonic() + total_ms / 1000.0
            while time.monotonic() < end:
                step = min(end - time.monotonic(), extend_ms / 4000.0 if extend_ms else 0.05)
                if task.wait_cancelled(max(step, 0.0)):
                    emit(f"cancelled {task.id}")
                    outcome = "cancelled"
                    raise taskpush.Fail("cancelled")
                if extend_ms and not task.extend(extend_ms):
                    outcome = "gone"
                    raise taskpush.Fail("gone")
            if op == "wait-cancel":
                outcome = "not-cancelled"
                raise taskpush.Fail("never cancelled")
            return b"slept"
        outcome = "unknown"
        raise taskpush.PermanentFailure(f"unknown instruction {op!r}")
    finally:
        emit(f"end {task.id} {outcome} {now_ms()}")


def watch_stats(stats: Dict[str, int], stop: threading.Event) -> None:
    """Prints `connections N` and `disconnects N` as the worker's counters move."""
    seen = {"connections": 0, "disconnects": 0}
    while not stop.wait(0.02):
        for k in seen:
            if stats[k] != seen[k]:
                seen[k] = stats[k]
                emit(f"{k} {seen[k]}")


def submit_mode(a: argparse.Namespace, tls: Any) -> int:
    with taskpush.Client(a.addr, token=a.token, tls=tls) as c:
        try:
            r = c.submit(a.submit, a.payload.encode(), dedup_key=a.dedup, wait=a.wait, wait_timeout_s=120)
        except taskpush.SubmitError as e:
            emit(f"refused {e}")
            return 0
        emit(f"submitted {r.task_id} {'duplicate' if r.duplicate else 'new'}")
        if a.wait and r.outcome is not None:
            state = "successful" if r.outcome.succeeded else "failed"
            emit(f"outcome {r.outcome.task_id} {state} {r.outcome.data.decode(errors='replace')}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--type")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--token")
    p.add_argument("--tls-ca")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--reconnect-min-ms", type=int, default=50)
    p.add_argument("--reconnect-max-ms", type=int, default=500)
    p.add_argument("--submit")
    p.add_argument("--payload", default="")
    p.add_argument("--dedup")
    p.add_argument("--wait", action="store_true")
    a = p.parse_args()
    tls: Optional[taskpush.TLSOptions] = None
    if a.tls_ca:
        tls = taskpush.TLSOptions(ca=a.tls_ca, cert=a.tls_cert, key=a.tls_key)
    if a.submit is not None:
        return submit_mode(a, tls)
    w = taskpush.Worker(a.addr, name="conformance-python", token=a.token, tls=tls,
                        reconnect_min_ms=a.reconnect_min_ms, reconnect_max_ms=a.reconnect_max_ms)
    w.add_handler(a.type, handle, concurrency=a.concurrency)
    w.install_signal_handlers()
    stop = threading.Event()
    watcher = threading.Thread(target=watch_stats, args=(w.stats, stop), daemon=True)
    watcher.start()
    emit("ready")
    w.run()
    stop.set()
    watcher.join()
    emit(f"exit connections={w.stats['connections']} disconnects={w.stats['disconnects']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
