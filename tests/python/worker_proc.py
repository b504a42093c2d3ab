"""worker_proc: a Python worker in a process of its own, for test_worker's SIGTERM case.

    worker_proc.py ADDRESSES TYPE CONCURRENCY SLEEP_S EVENTS_FILE

Each task appends "start ID" to EVENTS_FILE, sleeps SLEEP_S, appends "end ID" and
succeeds with the result "slept". SIGTERM stops the worker gracefully; the
process exits 0 once run() has returned.
"""
import logging
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import taskpush  # noqa: E402


def main(argv: list) -> int:
    addresses, ttype, concurrency, sleep_s, events = argv[1], argv[2], int(argv[3]), float(argv[4]), argv[5]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s worker_proc %(levelname)s %(message)s")
    lock = threading.Lock()

    def note(line: str) -> None:
        with lock, open(events, "a") as f:
            f.write(line + "\n")

    w = taskpush.Worker(addresses, name="sigterm-proc", reconnect_min_ms=50, reconnect_max_ms=200)

    @w.handler(ttype, concurrency=concurrency)
    def sleepy(task: taskpush.Task) -> bytes:
        note(f"start {task.id}")
        time.sleep(sleep_s)
        note(f"end {task.id}")
        return b"slept"

    w.install_signal_handlers()
    note("ready")
    w.run()
    note("exited")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
