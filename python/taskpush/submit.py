"""taskpush.submit: SUBMIT over a version 2 (or later) session, for a Worker's handlers and
for a producer-only Client (a connection that registers no type).

Owns the request ids, the waiters for SUBMITTED and OUTCOME, and the Client's
own connection and I/O thread.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

from . import proto
from .session import (Address, ConnectError, HelloSpec, Session, TLSOptions, VersionRefused,
                      format_address, open_negotiated, parse_addresses)

Bytes = Union[bytes, str]


class SubmitError(Exception):
    """The dispatcher refused a SUBMIT (status INVALID): nothing was inserted."""


class Unavailable(SubmitError):
    """The dispatcher could not commit (database failure, not leading, or the
    connection was lost before SUBMITTED): nothing acknowledged; safe to send
    again (dedup keys make it idempotent)."""


class _Refused(Unavailable):
    """The dispatcher answered UNAVAILABLE (it does not lead, or its database refused):
    nothing was committed, so the Client may send it to the next address at once."""


class NotSupported(SubmitError):
    """The session speaks protocol version 1, which has no SUBMIT."""


@dataclass
class TaskOutcome:
    """The end of a submitted task, for a submit that waited."""
    task_id: int
    succeeded: bool  # SUCCESSFUL, else FAILED
    data: bytes      # the result, or the err_msg


@dataclass
class Receipt:
    """One submitted task: its id, whether its dedup_key was already present
    (then task_id is the existing row's, 0 if unknown), and its outcome when
    the submit waited (None for a duplicate)."""
    task_id: int
    duplicate: bool
    outcome: Optional[TaskOutcome] = None


def _b(v: Bytes) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def make_task(type: str, payload: Bytes = b"", priority: int = 1, dedup_key: Optional[Bytes] = None,
              delay_ms: int = 0, max_attempts: int = 0, timeout_ms: int = 0,
              group_key: Optional[Bytes] = None, after: Optional[Sequence[int]] = None) -> proto.SubmitTask:
    """One SUBMIT entry; ValueError for a value the protocol cannot carry (a group_key
    longer than 191 bytes, more than 1000 ids in after, an id 0 among them). after: the
    ids of the tasks it waits for (dependencies, docs/producers.md)."""
    ids = [int(i) for i in after] if after is not None else []
    if len(ids) > proto.MAX_AFTER:
        raise ValueError(f"waits for {len(ids)} tasks (at most {proto.MAX_AFTER})")
    if any(i <= 0 for i in ids):
        raise ValueError("a task id in after is 1 or more")
    t = proto.SubmitTask(_b(type), _b(payload), priority, max_attempts, delay_ms, timeout_ms,
                         _b(dedup_key) if dedup_key is not None else b"",
                         _b(group_key) if group_key is not None else b"", ids)
    try:
        proto.encode_body(proto.Submit(0, proto.SUBMIT_FLAG_GROUP_KEY | proto.SUBMIT_FLAG_AFTER, [t]))
    except proto.BadFrame as e:
        raise ValueError(str(e)) from e
    return t


class _Pending:
    def __init__(self, ntasks: int) -> None:
        self.cond = threading.Condition()
        self.ntasks = ntasks
        self.answer: Optional[proto.Submitted] = None
        self.outcomes: Dict[int, TaskOutcome] = {}
        self.lost = False


class SubmitTracker:
    """Request ids and waiters of one session. submit() runs on any thread;
    on_frame() and lost() on the session's I/O thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_id = 1
        self._pending: Dict[int, _Pending] = {}
        self._waiting_task: Dict[int, _Pending] = {}

    def submit(self, session: Optional[Session], tasks: Sequence[proto.SubmitTask], wait: bool,
               timeout_s: Optional[float]) -> List[Receipt]:
        if session is None or session.closed:
            raise Unavailable("not connected to a dispatcher")
        if session.version < 2:
            raise NotSupported("the dispatcher speaks protocol version 1: no SUBMIT")
        if not 1 <= len(tasks) <= proto.MAX_SUBMIT_TASKS:
            raise ValueError(f"1 to {proto.MAX_SUBMIT_TASKS} tasks per submit")
        p = _Pending(len(tasks))
        with self._lock:
            rid = self._next_id
            self._next_id = self._next_id % 0xFFFFFFFF + 1
            self._pending[rid] = p
        # Without a key the frame is the one of before, which every dispatcher takes.
        keyed = any(t.group_key for t in tasks)
        waits = any(t.after for t in tasks)
        msg = proto.Submit(rid, (proto.SUBMIT_FLAG_WAIT if wait else 0) |
                           (proto.SUBMIT_FLAG_GROUP_KEY if keyed else 0) |
                           (proto.SUBMIT_FLAG_AFTER if waits else 0), list(tasks))
        if len(proto.encode_body(msg)) > session.max_body:
            self._forget(rid)
            raise ValueError(f"the submit exceeds the dispatcher's {session.max_body}-byte frame limit")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            if not session.send(msg):
                raise Unavailable("the connection was lost before the submit was sent")
            ans = self._wait(p, deadline, lambda: p.answer is not None)
            assert ans.answer is not None
            if ans.answer.status == proto.SUBMITTED_INVALID:
                raise SubmitError(ans.answer.message.decode("utf-8", "replace"))
            if ans.answer.status != proto.SUBMITTED_OK:
                raise _Refused(ans.answer.message.decode("utf-8", "replace") or "unavailable")
            if len(ans.answer.results) != len(tasks):
                raise SubmitError(f"SUBMITTED has {len(ans.answer.results)} results for {len(tasks)} tasks")
            receipts = [Receipt(r.task_id, r.result == proto.RESULT_DUPLICATE) for r in ans.answer.results]
            if wait:
                inserted = {r.task_id for r in receipts if not r.duplicate}
                self._wait(p, deadline, lambda: inserted <= set(p.outcomes))
                for r in receipts:
                    if not r.duplicate:
                        r.outcome = p.outcomes[r.task_id]
            return receipts
        finally:
            self._forget(rid)

    def _wait(self, p: _Pending, deadline: Optional[float], done: Callable[[], bool]) -> _Pending:
        with p.cond:
            while not done():
                if p.lost:
                    raise Unavailable("the connection to the dispatcher was lost"
                                      + (" (the submit was acknowledged; its outcome is in the table)"
                                         if p.answer is not None else ""))
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no answer from the dispatcher in time")
                p.cond.wait(left)
        return p

    def _forget(self, rid: int) -> None:
        with self._lock:
            p = self._pending.pop(rid, None)
            if p is not None:
                for tid in [t for t, q in self._waiting_task.items() if q is p]:
                    del self._waiting_task[tid]

    def on_frame(self, m: proto.Message) -> bool:
        """Takes SUBMITTED and OUTCOME; False for any other frame."""
        if isinstance(m, proto.Submitted):
            with self._lock:
                p = self._pending.get(m.request_id)
                if p is not None and m.status == proto.SUBMITTED_OK:
                    for r in m.results:
                        if r.result == proto.RESULT_INSERTED:
                            self._waiting_task[r.task_id] = p
            if p is not None:
                with p.cond:
                    p.answer = m
                    p.cond.notify_all()
            return True
        if isinstance(m, proto.Outcome):
            with self._lock:
                p = self._pending.get(m.request_id)
            if p is not None:
                with p.cond:
                    p.outcomes[m.task_id] = TaskOutcome(m.task_id, m.state == proto.STATE_SUCCESSFUL, m.data)
                    p.cond.notify_all()
            return True
        return False

    def lost(self) -> None:
        """The session ended: every waiter fails with Unavailable."""
        with self._lock:
            waiters = list(self._pending.values())
        for p in waiters:
            with p.cond:
                p.lost = True
                p.cond.notify_all()



class Client:
    """A producer-only connection: submits tasks, takes none.

        with Client("127.0.0.1:7070") as c:
            r = c.submit("resize", b'{"w":640}', dedup_key="img-42")
            print(r.task_id, r.duplicate)

    Connects on the first submit (addresses tried in turn) and again after the
    connection is lost. A dispatcher that answers a submit "unavailable" (a standby,
    or one whose database refused: nothing was committed) is left at once for the next
    address, each address once per submit, as libtaskpush does. Heartbeats run on a
    background thread."""

    def __init__(self, addresses: Union[str, Sequence[str]], token: Optional[str] = None,
                 tls: Union[None, bool, TLSOptions] = None, name: str = "taskpush-python-producer",
                 connect_timeout_ms: int = 5000, logger: Optional[logging.Logger] = None) -> None:
        self._addresses: List[Address] = parse_addresses(addresses)
        self._hello = HelloSpec(name, token or "", 0, [])
        opts = TLSOptions() if tls is True else (tls or None)
        self._tls = opts.context() if isinstance(opts, TLSOptions) else None
        self._timeout_s = connect_timeout_ms / 1000.0
        self.log = logger or logging.getLogger("taskpush.client")
        self._lock = threading.Lock()
        self._session: Optional[Session] = None
        self._versions: Dict[Address, int] = {}  # what an older dispatcher speaks (2 at least)
        self._tracker = SubmitTracker()
        self._thread: Optional[threading.Thread] = None
        self._closing = False

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connected(self) -> Session:
        with self._lock:
            if self._closing:
                raise Unavailable("the client is closed")
            if self._session is not None and not self._session.closed:
                return self._session
            errors = []
            for a in self._addresses:
                try:
                    s = open_negotiated(a, self._hello, self._versions, proto.PROTO_VERSION, 2, self._tls,
                                        self._timeout_s, self.log)
                except VersionRefused as e:
                    raise NotSupported(f"{e}: the dispatcher has no SUBMIT (protocol version 1)") from e
                except ConnectError as e:
                    errors.append(str(e))
                    continue
                self.log.info("producer connected to %s", format_address(a))
                self._session = s
                self._tracker = SubmitTracker()
                self._thread = threading.Thread(target=self._serve, args=(s, self._tracker),
                                                name="taskpush-client-io", daemon=True)
                self._thread.start()
                return s
            raise Unavailable("no dispatcher reachable: " + "; ".join(errors))

    def _serve(self, s: Session, tracker: SubmitTracker) -> None:
        def on_frame(m: proto.Message) -> None:
            if not tracker.on_frame(m) and not isinstance(m, (proto.Heartbeat, proto.Stop)):
                raise proto.Unexpected(f"unexpected {type(m).__name__} on a producer connection")

        reason = s.serve(on_frame, lambda: "closed by the client" if self._closing else None)
        tracker.lost()
        self.log.info("producer connection to %s ended: %s", format_address(s.address), reason)

    def submit_many(self, tasks: Sequence[proto.SubmitTask], wait: bool = False,
                    timeout_s: Optional[float] = None) -> List[Receipt]:
        """Submits tasks (from make_task) in one SUBMIT; returns once their rows
        are committed, or with wait once every inserted task has ended."""
        for attempt in range(len(self._addresses)):
            s = self._connected()
            try:
                return self._tracker.submit(s, tasks, wait, timeout_s)
            except _Refused as e:
                if attempt + 1 == len(self._addresses):
                    raise Unavailable(str(e)) from e
                self._leave(s, str(e))
        raise AssertionError("not reached")

    def _leave(self, s: Session, why: str) -> None:
        """Ends the session with s's dispatcher and puts its address last, so that the
        next connect tries the others first."""
        with self._lock:
            if self._session is s:
                self._session = None
            if s.address in self._addresses:
                self._addresses.remove(s.address)
                self._addresses.append(s.address)
        self.log.info("leaving %s: %s", format_address(s.address), why)
        s.abort()

    def submit(self, type: str, payload: Bytes = b"", priority: int = 1,
               dedup_key: Optional[Bytes] = None, delay_ms: int = 0, max_attempts: int = 0,
               timeout_ms: int = 0, wait: bool = False, wait_timeout_s: Optional[float] = None,
               group_key: Optional[Bytes] = None, after: Optional[Sequence[int]] = None) -> Receipt:
        """Submits one task (the equivalent of tp_submit); see Receipt. group_key: fair
        share, within a type and priority keys take turns (tp_submit_keyed). after: ids
        of tasks it waits for: dispatched once all are SUCCESSFUL, FAILED ("dependency
        ...") when one fails (tp_submit_after)."""
        t = make_task(type, payload, priority, dedup_key, delay_ms, max_attempts, timeout_ms, group_key,
                      after)
        return self.submit_many([t], wait, wait_timeout_s)[0]

    def close(self) -> None:
        """Closes the connection after what is queued is written."""
        self._closing = True
        with self._lock:
            s, t = self._session, self._thread
        if s is not None:
            s.wake()
        if t is not None:
            t.join(10)
