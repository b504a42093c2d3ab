"""taskpush.worker: a worker that takes tasks from taskpushd and runs handlers.

Owns the Worker (handlers per task type, each with its own threads; the
reconnect loop over several addresses with backoff; STOP and SIGTERM; in
protocol version 3 the inventory carried across a lost dispatcher: deliveries
that keep running and outcomes kept until CONFIRMed), the Task a handler
receives, and the outcomes a handler can give (return a result, or raise Fail,
PermanentFailure or RetryAfter).
"""
from __future__ import annotations

import logging
import os
import queue
import random
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import proto
from .inventory import Outcomes, holding_frames, outcome_limit
from .session import (Address, AuthRefused, Backoff, ConnectError, HelloSpec, NotLeader, Session,
                      TLSOptions, format_address, open_negotiated, parse_addresses)
from .submit import Bytes, Receipt, SubmitTracker, make_task

# The pause before the next address of a round (this to twice this), and the cap of
# the backoff's exponent for a round that met a standby (min_ms * 2^3), as libtaskpush.
_NEXT_HOST_S = 0.02
_NOT_LEADER_MAX_FAILURES = 3

MAX_ERROR_LEN = 65535  # err_msg is a TEXT column
MAX_CAPACITY = 65536
_DONE_HEAD = 22


class Fail(Exception):
    """Raised by a handler: a failed attempt, retried with the dispatcher's
    backoff while the task has attempts left (DONE FAIL_RETRY)."""


class PermanentFailure(Fail):
    """Raised by a handler: the task fails for good, never retried (FAIL_PERM)."""


class RetryAfter(Fail):
    """Raised by a handler: retry after delay_ms (RETRY_AFTER)."""

    def __init__(self, delay_ms: int, message: str = "") -> None:
        super().__init__(message)
        if not 0 <= delay_ms <= 0xFFFFFFFF:
            raise ValueError("delay_ms must fit a u32")
        self.delay_ms = delay_ms


DeliveryKey = Tuple[int, int, int]


class Task:
    """One delivery, passed to a handler. (id, epoch, attempt) names it; a
    redelivery has a larger attempt, a later dispatcher a larger epoch."""

    def __init__(self, msg: proto.Task, session: Session, worker: "Worker") -> None:
        self.id: int = msg.task_id
        self.epoch: int = msg.epoch
        self.attempt: int = msg.attempt
        self.timeout_ms: int = msg.timeout_ms  # the lease as sent (0: none)
        self.priority: int = msg.priority       # 0 low, 1 normal, 2 high
        self.type: str = msg.type.decode("utf-8", "replace")
        self.payload: bytes = msg.payload
        self._session = session  # the connection that delivered it
        # Version 3: the delivery outlives its connection and is declared to the next.
        self._inventory = session.version >= 3
        self._abandoned = False  # the worker forgot it: its outcome goes nowhere (under the lock)
        self._worker = worker
        self._cancelled = threading.Event()
        self._deadline = time.monotonic() + msg.timeout_ms / 1000.0 if msg.timeout_ms else None

    @property
    def key(self) -> DeliveryKey:
        return (self.id, self.epoch, self.attempt)

    @property
    def cancelled(self) -> bool:
        """True once the delivery was abandoned: the dispatcher sent CANCEL (its
        lease expired, an operator cancelled it, or a new dispatcher would not
        adopt it), the connection was lost (protocol versions 1 and 2 only: in
        version 3 the task keeps running and is declared to the next
        dispatcher), or the worker is stopping at once. The handler should give
        up early; its outcome is then ignored or dropped."""
        return self._cancelled.is_set() or (not self._inventory and self._session.closed)

    def wait_cancelled(self, timeout_s: float) -> bool:
        """Sleeps up to timeout_s, waking early on cancellation; returns cancelled."""
        self._cancelled.wait(timeout_s)
        return self.cancelled

    def remaining_ms(self) -> float:
        """Milliseconds before the lease ends (this host's clock, moved by
        extend()); infinity for a task without a lease."""
        if self._deadline is None:
            return float("inf")
        return (self._deadline - time.monotonic()) * 1000.0

    def extend(self, ms: int) -> bool:
        """Asks the dispatcher to end the lease ms from now (EXTEND). False when
        the delivery was cancelled or its connection lost: give up then. In
        protocol version 3, while no dispatcher is connected, nothing is sent
        and the answer is True: the next dispatcher adopts the delivery."""
        if not 1 <= ms <= 0xFFFFFFFF:
            raise ValueError("extend ms must be 1 .. 2^32-1")
        if self.cancelled:
            return False
        s = self._worker._route(self)
        sent = s is not None and s.send(proto.Extend(self.id, self.epoch, self.attempt, ms))
        if not sent and not self._inventory:
            return False
        self._deadline = time.monotonic() + ms / 1000.0
        if sent:
            self._worker._count("extends_sent")
        return True

    @property
    def progress_supported(self) -> bool:
        """Whether progress() reaches the dispatcher: the task came in a session
        of protocol version 4 or later."""
        return self._session.version >= 4

    def progress(self, permille: int, msg: Optional[str] = None) -> bool:
        """Reports how far the handler is (PROGRESS, protocol version 4):
        permille 0 .. 1000 (1000 = done) and an optional text of at most 256
        bytes of UTF-8. `taskpushctl show`, the admin port's /task and the
        dashboard show the latest report; the dispatcher writes it to the table
        at most once a second. Never blocks: a report not yet written to the
        socket is replaced by a newer one. Returns True when queued; False when
        nothing was sent: the dispatcher speaks an older version
        (progress_supported is False), or the delivery was cancelled or its
        connection lost. ValueError for a value or text out of bounds."""
        if not 0 <= permille <= proto.PROGRESS_MAX:
            raise ValueError("progress permille must be 0 .. 1000")
        text = (msg or "").encode("utf-8")
        if not proto.progress_message_ok(text):
            raise ValueError("progress msg must be at most 256 bytes of UTF-8 without NUL")
        if not self.progress_supported or self.cancelled:
            return False
        s = self._worker._route(self)
        if s is None or s.version < 4:
            return False
        return s.send_latest(("progress", self.key),
                             proto.Progress(self.id, self.epoch, self.attempt, permille, text))

    def submit(self, type: str, payload: Bytes = b"", priority: int = 1,
               dedup_key: Optional[Bytes] = None, delay_ms: int = 0, max_attempts: int = 0,
               timeout_ms: int = 0, wait: bool = False, wait_timeout_s: Optional[float] = None,
               group_key: Optional[Bytes] = None) -> Receipt:
        """Submits a new task on this worker's connection (protocol version 2 or later)."""
        return self._worker.submit(type, payload, priority, dedup_key, delay_ms, max_attempts,
                                   timeout_ms, wait, wait_timeout_s, group_key=group_key)

    def _cancel(self) -> None:
        self._cancelled.set()


Handler = Callable[[Task], Union[None, bytes, str]]


@dataclass
class _TypeSlot:
    name: str
    fn: Handler
    concurrency: int
    queue: "queue.Queue[Optional[Task]]" = field(default_factory=queue.Queue)
    threads: List[threading.Thread] = field(default_factory=list)


def _done_for(key: DeliveryKey, outcome: int, data: bytes, delay_ms: int, max_body: int) -> proto.Done:
    """The DONE of an outcome, made to fit a dispatcher's max_body: a result too
    large becomes a permanent failure saying so, an error text is cut. Applied
    again to a DONE that fits, it changes nothing."""
    room = max_body - _DONE_HEAD
    if outcome == proto.SUCCESS and len(data) > room:
        outcome, data = proto.FAIL_PERM, (f"result of {len(data)} bytes exceeds the "
                                          f"dispatcher's limit of {room}").encode()
    elif outcome != proto.SUCCESS:
        data = _cut(data, min(MAX_ERROR_LEN, max(room, 0)))
    return proto.Done(key[0], key[1], key[2], outcome, delay_ms, data)


def _refit(d: proto.Done, max_body: int) -> proto.Done:
    return _done_for((d.task_id, d.epoch, d.attempt), d.outcome, d.data, d.retry_after_ms, max_body)


def _cut(text: bytes, limit: int) -> bytes:
    """Cuts text to limit bytes at a UTF-8 character boundary."""
    if len(text) <= limit:
        return text
    end = limit
    while end > 0 and (text[end] & 0xC0) == 0x80:
        end -= 1
    return text[:end]


class Worker:
    """Takes tasks of the registered types from a dispatcher and runs them.

        w = Worker("127.0.0.1:7070", token="s3cret")

        @w.handler("resize", concurrency=4)
        def resize(task: Task) -> bytes:
            return b"done"

        w.install_signal_handlers()   # SIGTERM, SIGINT: finish, then exit
        w.run()

    The HELLO's capacity (the dispatcher's credit) is the sum of the handlers'
    concurrency; each type runs on as many threads as its concurrency.

    In a protocol version 3 session the worker keeps running what it holds when
    the dispatcher goes away, keeps every outcome until the dispatcher CONFIRMs
    it, and on the next connection declares the deliveries still running
    (HOLDING) and sends the unconfirmed outcomes again."""

    def __init__(self, addresses: Union[str, Sequence[str]], name: Optional[str] = None,
                 token: Optional[str] = None, tls: Union[None, bool, TLSOptions] = None,
                 reconnect_min_ms: int = 100, reconnect_max_ms: int = 5000,
                 connect_timeout_ms: int = 5000, logger: Optional[logging.Logger] = None,
                 protocol_version: int = proto.PROTO_VERSION) -> None:
        self._addresses: List[Address] = parse_addresses(addresses)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._token = token or ""
        if len(self._token.encode()) > proto.MAX_TOKEN_LEN:
            raise ValueError(f"token longer than {proto.MAX_TOKEN_LEN} bytes")
        opts = TLSOptions() if tls is True else (tls or None)
        self._tls = opts.context() if isinstance(opts, TLSOptions) else None
        self._backoff = Backoff(reconnect_min_ms, reconnect_max_ms)
        if connect_timeout_ms < 1:
            raise ValueError("connect_timeout_ms must be >= 1")
        self._connect_timeout_s = connect_timeout_ms / 1000.0
        if protocol_version not in (1, 2, 3, 4):
            raise ValueError("protocol_version is 1, 2, 3 or 4")
        self._version = protocol_version
        self.log = logger or logging.getLogger("taskpush.worker")
        self._types: Dict[str, _TypeSlot] = {}
        self._lock = threading.Lock()
        self._held: Dict[DeliveryKey, Task] = {}
        self._outcomes = Outcomes(outcome_limit(0), self.log)  # sized again by run()
        self._session: Optional[Session] = None
        self._tracker = SubmitTracker()
        self._stop_level = 0  # 1: graceful, 2: at once (plain int: set from a signal handler)
        self._running = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.stats: Dict[str, int] = {k: 0 for k in (
            "connect_attempts", "connections", "disconnects", "tasks_received", "tasks_completed",
            "tasks_dropped", "cancels_received", "extends_sent", "deliveries_declared",
            "outcomes_resent", "outcomes_confirmed", "outcomes_forgotten")}

    # ---- setup ----

    def add_handler(self, type: str, fn: Handler, concurrency: int = 1) -> None:
        """Registers the handler of one task type, run on concurrency threads."""
        if self._running:
            raise RuntimeError("add handlers before run()")
        raw = type.encode()
        if not 1 <= len(raw) <= proto.MAX_TYPE_LEN:
            raise ValueError(f"task type of 1 to {proto.MAX_TYPE_LEN} bytes")
        if type in self._types:
            raise ValueError(f"a handler for {type!r} is already registered")
        if len(self._types) >= proto.MAX_TYPES:
            raise ValueError(f"at most {proto.MAX_TYPES} task types")
        if concurrency < 1 or sum(t.concurrency for t in self._types.values()) + concurrency > MAX_CAPACITY:
            raise ValueError(f"concurrency >= 1, and at most {MAX_CAPACITY} in all")
        self._types[type] = _TypeSlot(type, fn, concurrency)

    def handler(self, type: str, concurrency: int = 1) -> Callable[[Handler], Handler]:
        """Decorator form of add_handler."""
        def register(fn: Handler) -> Handler:
            self.add_handler(type, fn, concurrency)
            return fn
        return register

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully (a second one: at once).
        Call from the main thread."""
        def on_signal(signum: int, frame: Any) -> None:
            self.stop()
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    # ---- control, from any thread or a signal handler ----

    def stop(self) -> None:
        """The first call stops gracefully: STOP to the dispatcher, running and
        queued tasks finish, their outcomes are sent, then the connection
        closes and run() returns. A second call stops at once: the connection
        closes, held tasks are marked cancelled and their outcomes dropped."""
        self._stop_level = min(self._stop_level + 1, 2)
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        s = self._session
        if s is not None:
            if self._stop_level >= 2:
                s.abort()
            else:
                s.wake()

    def submit(self, type: str, payload: Bytes = b"", priority: int = 1,
               dedup_key: Optional[Bytes] = None, delay_ms: int = 0, max_attempts: int = 0,
               timeout_ms: int = 0, wait: bool = False, wait_timeout_s: Optional[float] = None,
               group_key: Optional[Bytes] = None) -> Receipt:
        """Submits a task on the current connection (needs protocol version 2 or later);
        raises taskpush.Unavailable when not connected."""
        t = make_task(type, payload, priority, dedup_key, delay_ms, max_attempts, timeout_ms, group_key)
        return self._tracker.submit(self._session, [t], wait, wait_timeout_s)[0]

    @property
    def connected_version(self) -> int:
        """The protocol version of the current session, 0 when not connected."""
        s = self._session
        return s.version if s is not None and not s.closed else 0

    def held(self) -> int:
        """Deliveries received and not yet answered (running or queued)."""
        with self._lock:
            return len(self._held)

    def unconfirmed(self) -> int:
        """Outcomes kept until the dispatcher confirms them (version 3)."""
        with self._lock:
            return len(self._outcomes)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    # ---- run ----

    def run(self) -> None:
        """Runs until stop(): connects, takes tasks, reconnects with backoff.
        Returns once every handler thread has ended."""
        if not self._types:
            raise RuntimeError("register a handler first")
        if self._running:
            raise RuntimeError("already running")
        self._running = True
        capacity = sum(t.concurrency for t in self._types.values())
        with self._lock:
            self._outcomes = Outcomes(outcome_limit(capacity), self.log)
        for slot in self._types.values():
            for i in range(slot.concurrency):
                t = threading.Thread(target=self._handler_loop, args=(slot,),
                                     name=f"taskpush-{slot.name}-{i}", daemon=True)
                t.start()
                slot.threads.append(t)
        try:
            self._connect_loop()
        finally:
            if self._stop_level >= 2:  # also what runs between two connections
                self._abandon(lambda t: True)
            for slot in self._types.values():
                for _ in slot.threads:
                    slot.queue.put(None)
            for slot in self._types.values():
                for t in slot.threads:
                    t.join()
                slot.threads.clear()
            self._running = False
            self.log.info("worker %s stopped", self.name)

    def _connect_loop(self) -> None:
        # Like libtaskpush: a host that fails or does not lead (NOT_LEADER) is left for
        # the next after a short pause; the backoff comes once all failed in a row.
        idx = 0
        misses = 0  # hosts in a row that failed or did not lead
        standby = False  # one of them answered NOT_LEADER: a leader is expected soon
        versions: Dict[Address, int] = {}
        n = len(self._addresses)
        while self._stop_level == 0:
            addr = self._addresses[idx % n]
            s, not_leader = self._connect(addr, versions)
            standby = standby or not_leader
            if s is not None:
                misses, standby = 0, False
                self._backoff.reset()
                reason = self._serve(s)
                self.log.info("connection to %s ended: %s", format_address(addr), reason)
                if self._stop_level > 0:
                    break
                standby = s.error_code == proto.ERR_NOT_LEADER
                if n == 1:
                    # The same address after a short delay, so a restarted dispatcher
                    # is found again quickly.
                    if self._sleep(self._backoff.next_s()):
                        break
                    continue
                # With several, the one that went away likely leads no more.
            if not_leader or (s is not None and standby):
                self.log.info("%s does not lead; trying %s", format_address(addr),
                              format_address(self._addresses[(idx + 1) % n]))
            idx += 1
            misses += 1
            if misses < n:
                delay = random.uniform(_NEXT_HOST_S, 2 * _NEXT_HOST_S)
            else:
                if standby:
                    self._backoff.cap(_NOT_LEADER_MAX_FAILURES)
                delay = self._backoff.next_s()
                misses, standby = 0, False
            if self._sleep(delay):
                break

    def _connect(self, addr: Address,
                 versions: Dict[Address, int]) -> Tuple[Optional[Session], bool]:
        """Returns the session, or None and whether the dispatcher said NOT_LEADER."""
        capacity = sum(t.concurrency for t in self._types.values())
        hello = HelloSpec(self.name, self._token, capacity, list(self._types))
        try:
            # An older dispatcher is spoken to in its version from then on.
            s = open_negotiated(addr, hello, versions, self._version, 1, self._tls, self._connect_timeout_s,
                                self.log, lambda: self._count("connect_attempts"))
        except AuthRefused as e:
            self.log.error("%s", e)
            return None, False
        except NotLeader as e:
            self.log.info("%s", e)
            return None, True
        except ConnectError as e:
            self.log.warning("%s", e)
            return None, False
        self._count("connections")
        self.log.info("connected to %s (protocol %d, heartbeat %d ms, %s)", format_address(addr),
                      s.version, s.welcome.heartbeat_ms, s.welcome.server.decode("utf-8", "replace"))
        return s, False

    def _sleep(self, seconds: float) -> bool:
        """Waits, waking early for stop(); True when stopping."""
        end = time.monotonic() + seconds
        while self._stop_level == 0:
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                select.select([self._wake_r], [], [], left)
                while os.read(self._wake_r, 64):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        return True

    def _serve(self, s: Session) -> str:
        tracker = SubmitTracker()
        st: Dict[str, Any] = {"stop_sent": False, "peer_stop": False, "settle_by": None}
        self._tracker = tracker
        self._take_over(s)

        def on_frame(m: proto.Message) -> None:
            if isinstance(m, proto.Task):
                self._on_task(m, s)
            elif isinstance(m, proto.Cancel):
                with self._lock:
                    t = self._held.get((m.task_id, m.epoch, m.attempt))
                if t is not None:
                    self._count("cancels_received")
                    self.log.info("task %d (attempt %d) cancelled by the dispatcher", t.id, t.attempt)
                    t._cancel()
            elif isinstance(m, proto.Confirm) and s.version >= 3:
                with self._lock:
                    self.stats["outcomes_confirmed"] += self._outcomes.confirm(m.deliveries)
            elif isinstance(m, proto.Stop):
                st["peer_stop"] = True
            elif tracker.on_frame(m) or isinstance(m, proto.Heartbeat):
                pass
            else:
                raise proto.Unexpected(f"unexpected {type(m).__name__} from the dispatcher")

        def on_tick() -> Optional[str]:
            if self._stop_level >= 2:
                return "stopping at once"
            if self._stop_level == 1 and not st["stop_sent"]:
                st["stop_sent"] = True
                s.send(proto.Stop())
            if st["peer_stop"] and self.held() == 0 and not self._settling(s, st):
                return "stopped, nothing held" if st["stop_sent"] else "the dispatcher sent STOP"
            return None

        try:
            return s.serve(on_frame, on_tick)
        finally:
            tracker.lost()
            self._count("disconnects")
            with self._lock:
                if self._session is s:
                    self._session = None
            # Version 3 deliveries outlive the connection; older ones go back to the dispatcher.
            at_once = self._stop_level >= 2
            self._abandon(lambda t: at_once or (not t._inventory and t._session is s))
            n = self.held()
            if n:
                self.log.info("%d deliveries keep running; they are declared to the next dispatcher", n)

    def _settling(self, s: Session, st: Dict[str, Any]) -> bool:
        """Whether a closing version 3 session still waits for CONFIRMs (up to
        10 heartbeats, at least 2 s): a confirmed outcome is one a failover
        cannot lose."""
        if s.version < 3 or self.unconfirmed() == 0:
            return False
        now = time.monotonic()
        settle_by = st["settle_by"]
        if settle_by is None:
            settle_by = st["settle_by"] = now + max(2.0, 10 * s.heartbeat_s)
        if now < float(settle_by):
            return True
        self.log.warning("closing with %d outcomes unconfirmed; the next connection sends them again",
                         self.unconfirmed())
        return False

    def _take_over(self, s: Session) -> None:
        """Makes s the current session. In version 3 it first declares the
        deliveries still held from earlier connections and not cancelled
        (HOLDING), and sends again the outcomes not yet confirmed, all queued
        before any other frame can be; an older version cannot take them, so
        they are abandoned."""
        gone: List[Task] = []
        with self._lock:
            self._session = s
            # One its dispatcher cancelled is not declared (as libtaskpush): it would be refused.
            keys = [k for k, t in self._held.items() if not t._cancelled.is_set()]
            pending = self._outcomes.pending()
            if s.version >= 3:
                for h in holding_frames(keys):
                    s.send(h)
                for d in pending:
                    s.send(_refit(d, s.max_body))
                self.stats["deliveries_declared"] += len(keys)
                self.stats["outcomes_resent"] += len(pending)
            else:
                gone = self._abandon_locked(lambda t: True)
                self._outcomes.clear()
        for t in gone:
            t._cancel()
        if s.version >= 3 and (keys or pending):
            self.log.info("%s: declared %d running deliveries, sent %d unconfirmed outcomes again",
                          format_address(s.address), len(keys), len(pending))
        elif keys or pending:
            self.log.warning("%s speaks protocol version %d, which cannot adopt deliveries: %d running "
                             "and %d finished ones are abandoned", format_address(s.address), s.version,
                             len(keys), len(pending))

    def _abandon(self, which: Callable[[Task], bool]) -> None:
        """Forgets the held deliveries which selects: marked cancelled, their
        outcomes dropped. Stopping at once, the kept outcomes go too."""
        with self._lock:
            gone = self._abandon_locked(which)
            if self._stop_level >= 2:
                self._outcomes.clear()
        for t in gone:
            t._cancel()

    def _abandon_locked(self, which: Callable[[Task], bool]) -> List[Task]:
        gone = [t for t in self._held.values() if which(t)]
        for t in gone:
            t._abandoned = True
            del self._held[t.key]
        return gone

    def _route(self, t: Task) -> Optional[Session]:
        """The session a frame about t goes on: its own in versions 1 and 2; in
        version 3 the current one, None between connections."""
        if not t._inventory:
            return t._session
        with self._lock:
            s = self._session
        return s if s is not None and s.version >= 3 else None

    def _on_task(self, m: proto.Task, s: Session) -> None:
        self._count("tasks_received")
        t = Task(m, s, self)
        slot = self._types.get(t.type)
        with self._lock:
            self._held[t.key] = t
        if slot is None:  # the dispatcher only sends registered types; answer anyway
            self._finish(t, proto.FAIL_PERM, b"no handler for this task type", 0)
            return
        slot.queue.put(t)

    # ---- handler threads ----

    def _handler_loop(self, slot: _TypeSlot) -> None:
        while True:
            t = slot.queue.get()
            if t is None:
                return
            # Abandoned, or a version 1/2 delivery whose connection is gone (the
            # dispatcher redelivers it): not run.
            if t._abandoned or (not t._inventory and t._session.closed):
                self._drop(t)
                continue
            outcome, data, delay = self._call(slot, t)
            self._finish(t, outcome, data, delay)

    def _call(self, slot: _TypeSlot, t: Task) -> Tuple[int, bytes, int]:
        try:
            r = slot.fn(t)
        except RetryAfter as e:
            return proto.RETRY_AFTER, str(e).encode(), e.delay_ms
        except PermanentFailure as e:
            return proto.FAIL_PERM, str(e).encode(), 0
        except Fail as e:
            return proto.FAIL_RETRY, str(e).encode(), 0
        except Exception as e:  # a handler's bug is a failed attempt, logged
            self.log.exception("handler of %s failed on task %d", slot.name, t.id)
            return proto.FAIL_RETRY, f"{type(e).__name__}: {e}".encode(), 0
        if r is None:
            return proto.SUCCESS, b"", 0
        if isinstance(r, str):
            return proto.SUCCESS, r.encode(), 0
        if isinstance(r, (bytes, bytearray, memoryview)):
            return proto.SUCCESS, bytes(r), 0
        return proto.FAIL_PERM, f"handler returned {type(r).__name__}, not bytes or str".encode(), 0

    def _finish(self, t: Task, outcome: int, data: bytes, delay_ms: int) -> None:
        d = _done_for(t.key, outcome, data, delay_ms, t._session.max_body)
        if not t._inventory:
            sent = t._session.send(d)
            with self._lock:
                self._held.pop(t.key, None)
                self.stats["tasks_completed" if sent else "tasks_dropped"] += 1
            t._session.wake()  # a stopping loop checks whether anything is still held
            return
        # Version 3: kept until confirmed. Keeping it and reading the current
        # session under one lock means either _take_over sends it again or the
        # session read here had its HOLDING queued already.
        with self._lock:
            self._held.pop(t.key, None)
            if t._abandoned:
                self.stats["tasks_dropped"] += 1
                return
            self._outcomes.keep(d)
            self.stats["tasks_completed"] += 1
            self.stats["outcomes_forgotten"] = self._outcomes.evicted
            s = self._session
        if s is not None and s.version >= 3:
            s.send(_refit(d, s.max_body))  # also wakes a stopping loop to look at held()

    def _drop(self, t: Task) -> None:
        with self._lock:
            self._held.pop(t.key, None)
            self.stats["tasks_dropped"] += 1
