"""taskpush.session: one connection to a dispatcher, from connect to close.

Owns the socket: the TCP connect (and TLS), the HELLO/WELCOME handshake with the
fall-back from version 4 to 3, 2 and 1 (open_negotiated), and an I/O loop
(Session.serve) that reads frames, writes what other threads queued, sends
heartbeats and declares the dispatcher lost after 3 silent heartbeat intervals. Only the thread in
serve() touches the socket; other threads call send(), which queues the frame
and wakes the loop through a pipe, so TLS never sees two threads at once.
"""
from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import proto

Address = Tuple[str, int]

_READ_CHUNK = 256 * 1024
_WRITE_CHUNK = 256 * 1024
_READ_BUDGET = 4 * _READ_CHUNK  # per loop turn
_HANDSHAKE_MAX_BODY = 65536  # a WELCOME or an ERROR; no TASK comes before WELCOME


class ConnectError(Exception):
    """A connect or handshake that failed; the caller backs off and retries."""


class VersionRefused(ConnectError):
    """The dispatcher answered HELLO with ERROR VERSION."""


class AuthRefused(ConnectError):
    """The dispatcher answered HELLO with ERROR AUTH (a missing or wrong token)."""


class NotLeader(ConnectError):
    """The dispatcher answered HELLO with ERROR NOT_LEADER: a standby."""


def parse_addresses(spec: Union[str, Sequence[str]]) -> List[Address]:
    """"HOST:PORT[,HOST:PORT...]" (IPv6 as "[::1]:7070"), or a list of them."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: List[Address] = []
    for item in items:
        item = item.strip()
        if item.startswith("["):
            host, sep, port = item[1:].partition("]:")
        else:
            host, sep, port = item.rpartition(":")
            if ":" in host:
                raise ValueError(f"address {item!r}: an IPv6 address goes in brackets, [::1]:7070")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"address {item!r} is not HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no address given")
    return out


def format_address(a: Address) -> str:
    return f"[{a[0]}]:{a[1]}" if ":" in a[0] else f"{a[0]}:{a[1]}"


@dataclass
class TLSOptions:
    """TLS to a `taskpushd --tls-cert`: ca is the PEM of the CAs trusted for the
    dispatcher's certificate (None: the system's); cert/key the client
    certificate presented to `taskpushd --tls-ca`."""
    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


@dataclass
class HelloSpec:
    """What a connection says in its HELLO."""
    name: str
    token: str
    capacity: int
    types: List[str]


class Session:
    """One established session (after WELCOME). Frames go out with send(),
    come in through the on_frame callback of serve()."""

    def __init__(self, sock: socket.socket, welcome: proto.Welcome, version: int,
                 address: Address, log: logging.Logger) -> None:
        self.sock = sock
        self.welcome = welcome
        self.version = version  # the version of this session: 1 .. 4
        self.address = address
        self.log = log
        self.heartbeat_s = max(welcome.heartbeat_ms, 1) / 1000.0
        self.max_body = welcome.max_body
        self._lock = threading.Lock()
        self._queue: List[bytes] = []
        # Frames of which only the latest per key goes out (PROGRESS of a task),
        # written before the queue of each wake-up.
        self._latest: Dict[object, bytes] = {}
        self._closed = False
        self._abort = False
        # A socket pair, not a pipe: once closed, its objects refuse writes instead
        # of writing into whatever file reuses the descriptor number.
        self._rpipe, self._wpipe = socket.socketpair()
        self._rpipe.setblocking(False)
        self._wpipe.setblocking(False)
        self.close_reason = ""
        self.error_code = 0  # the code of the ERROR that ended the session, if one did

    # ---- any thread ----

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, m: proto.Message) -> bool:
        """Queues m for the I/O loop; False when the session is gone."""
        data = proto.encode(m)
        with self._lock:
            if self._closed:
                return False
            self._queue.append(data)
        self.wake()
        return True

    def send_latest(self, key: object, m: proto.Message) -> bool:
        """Queues m for the I/O loop in place of a frame of the same key not yet
        written (only the latest goes out); False when the session is gone."""
        data = proto.encode(m)
        with self._lock:
            if self._closed:
                return False
            pending = key in self._latest
            self._latest[key] = data
        if not pending:
            self.wake()
        return True

    def abort(self) -> None:
        """Makes serve() close at once, without writing what is queued.
        Safe from a signal handler (a flag and a write to the wake-up socket)."""
        self._abort = True
        self.wake()

    def wake(self) -> None:
        try:
            self._wpipe.send(b"x")
        except OSError:  # full (a wake-up is pending already) or closed
            pass

    # ---- the I/O thread ----

    def serve(self, on_frame: Callable[[proto.Message], None],
              on_tick: Callable[[], Optional[str]]) -> str:
        """Runs the loop until the connection ends; returns why. on_tick runs
        after every wake-up and returns a reason to close cleanly (all written),
        or None to go on."""
        sel = selectors.DefaultSelector()
        sock = self.sock
        sock.setblocking(False)
        fb = proto.FrameBuffer(proto.MAX_BODY_DEFAULT)
        out = bytearray()
        last_recv = last_send = time.monotonic()
        want_write = False
        more_to_read = False
        closing: Optional[str] = None
        sel.register(self._rpipe, selectors.EVENT_READ)
        sel.register(sock, selectors.EVENT_READ)
        reason = ""
        try:
            while True:
                now = time.monotonic()
                if not out and now - last_send >= self.heartbeat_s:
                    out += proto.encode(proto.Heartbeat())
                with self._lock:
                    for d in self._latest.values():
                        out += d
                    self._latest.clear()
                    for d in self._queue:
                        out += d
                    self._queue.clear()
                if out:
                    sent, want_write = self._write(out)
                    if sent:
                        del out[:sent]
                        last_send = time.monotonic()
                if closing is not None and not out:
                    reason = closing
                    break
                # A heartbeat is due only when nothing waits to be written (else a
                # blocked write would make this loop spin).
                beat_at = last_send + self.heartbeat_s if not out else float("inf")
                timeout = min(beat_at, last_recv + 3 * self.heartbeat_s) - time.monotonic()
                if more_to_read:
                    timeout = 0.0
                ev = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
                sel.modify(sock, ev)
                ready = sel.select(max(timeout, 0.0))
                for key, _ in ready:
                    if key.fileobj == self._rpipe:
                        self._drain_pipe()
                if self._abort:
                    reason = "closed at once"
                    break
                got, more_to_read = self._read(fb)
                if got is None:
                    reason = "connection closed by the dispatcher"
                    break
                if got:
                    last_recv = time.monotonic()
                elif time.monotonic() - last_recv >= 3 * self.heartbeat_s:
                    # Judged after a read, so a loop that woke late does not miss bytes
                    # that did arrive.
                    reason = f"dispatcher silent for {3 * self.heartbeat_s * 1000:.0f} ms"
                    self.log.warning("%s: %s; closing", format_address(self.address), reason)
                    break
                while True:
                    body = fb.next_body()
                    if body is None:
                        break
                    m = proto.decode(body)
                    if isinstance(m, proto.Error):
                        self.error_code = m.code
                        reason = f"ERROR {m.code}: {m.message.decode('utf-8', 'replace')}"
                        return reason
                    on_frame(m)
                if closing is None:
                    closing = on_tick()
        except proto.BadFrame as e:
            reason = f"bad frame from the dispatcher: {e}"
            self._send_error_now(proto.ERR_UNEXPECTED if isinstance(e, proto.Unexpected)
                                 else proto.ERR_BAD_FRAME, str(e))
            self.log.warning("%s: %s", format_address(self.address), reason)
        except (OSError, ssl.SSLError) as e:
            reason = f"connection lost: {e}"
        finally:
            sel.close()
            self._shutdown(reason)
        return reason

    def _write(self, out: bytearray) -> Tuple[int, bool]:
        """Writes what the socket takes now: (bytes sent, wait for writable)."""
        total = 0
        while total < len(out):
            chunk = bytes(out[total:total + _WRITE_CHUNK])
            try:
                n = self.sock.send(chunk)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return total, True
            if n <= 0:
                return total, True
            total += n
        return total, False

    def _read(self, fb: proto.FrameBuffer) -> Tuple[Optional[int], bool]:
        """Reads what is there, up to _READ_BUDGET bytes so that frames are
        handled between reads: (bytes read, or None at end of stream; whether
        more may be waiting, which select cannot see for TLS's own buffer)."""
        total = 0
        while total < _READ_BUDGET:
            try:
                data = self.sock.recv(_READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return total, False
            if not data:
                return None, False
            fb.feed(data)
            total += len(data)
        return total, True

    def _drain_pipe(self) -> None:
        try:
            while self._rpipe.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _send_error_now(self, code: int, text: str) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(1.0)
            self.sock.sendall(proto.encode(proto.Error(code, text.encode()[:200])))
        except (OSError, ssl.SSLError):
            pass

    def _shutdown(self, reason: str) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()
        self.close_reason = reason
        try:
            self.sock.close()
        except OSError:
            pass
        self._rpipe.close()
        self._wpipe.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        d = sock.recv(n - len(buf))
        if not d:
            raise ConnectError("connection closed during the handshake")
        buf += d
    return bytes(buf)


def open_session(address: Address, hello: HelloSpec, version: int, tls: Optional[ssl.SSLContext],
                 timeout_s: float, log: logging.Logger) -> Session:
    """Connects, sends HELLO of the given version and waits for WELCOME, all
    within timeout_s. Raises ConnectError (VersionRefused, AuthRefused)."""
    host, port = address
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as e:
        raise ConnectError(f"connect to {format_address(address)}: {e}") from e
    sock: socket.socket = raw
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.wrap_socket(raw, server_hostname=host)
        m = proto.Hello(version, hello.capacity, hello.name.encode()[:proto.MAX_NAME_LEN],
                        hello.token.encode(), [t.encode() for t in hello.types])
        sock.sendall(proto.encode(m))
        head = _recv_exact(sock, proto.LEN_PREFIX)
        st, n = proto.frame_check(head, _HANDSHAKE_MAX_BODY)
        if st not in (proto.OK, proto.NEED_MORE):
            if head == b"HTTP":  # "HTTP/1.x 400 ...": an HTTP server, as length > 1 GB
                raise ConnectError(f"{format_address(address)}: an HTTP server answered: this is not "
                                   "a dispatcher's worker port (taskpushd's admin port?); workers "
                                   "connect to taskpushd --listen")
            raise ConnectError(f"{format_address(address)}: bad frame in answer to HELLO")
        answer = proto.decode(_recv_exact(sock, n))
        if isinstance(answer, proto.Error):
            text = answer.message.decode("utf-8", "replace")
            if answer.code == proto.ERR_VERSION:
                raise VersionRefused(f"{format_address(address)} refused version {version}: {text}")
            if answer.code == proto.ERR_AUTH:
                raise AuthRefused(f"{format_address(address)} refused the token: {text}")
            if answer.code == proto.ERR_NOT_LEADER:
                raise NotLeader(f"{format_address(address)} does not lead: {text}")
            raise ConnectError(f"{format_address(address)} answered ERROR {answer.code}: {text}")
        if not isinstance(answer, proto.Welcome):
            raise ConnectError(f"{format_address(address)} answered HELLO with "
                               f"{type(answer).__name__}")
        if answer.version != version:
            sock.sendall(proto.encode(proto.Error(proto.ERR_VERSION, b"unexpected WELCOME version")))
            raise ConnectError(f"{format_address(address)} answered version {answer.version}")
        sock.settimeout(None)
        return Session(sock, answer, version, address, log)
    except (OSError, ssl.SSLError, proto.BadFrame) as e:
        sock.close()
        raise ConnectError(f"{format_address(address)}: {e}") from e
    except ConnectError:
        sock.close()
        raise


_VERSION_LOSS = {2: "no inventory across a failover", 1: "no submit"}


def open_negotiated(address: Address, hello: HelloSpec, versions: Dict[Address, int], first: int,
                    lowest: int, tls: Optional[ssl.SSLContext], timeout_s: float, log: logging.Logger,
                    on_attempt: Callable[[], None] = lambda: None) -> Session:
    """open_session from versions.get(address, first) down to lowest: a
    dispatcher that answers ERROR VERSION (an older one) is asked again one
    version lower, and versions remembers what it speaks. Raises as
    open_session; VersionRefused once lowest was refused too."""
    version = versions.get(address, first)
    while True:
        on_attempt()
        try:
            return open_session(address, hello, version, tls, timeout_s, log)
        except VersionRefused:
            if version <= lowest:
                raise
        version -= 1
        versions[address] = version
        log.info("%s refused protocol version %d; falling back to %d (%s)", format_address(address),
                 version + 1, version, _VERSION_LOSS.get(version, "older"))


class Backoff:
    """Exponential reconnect delays with jitter: each delay is drawn between half
    and all of min_ms * 2^failures, capped at max_ms."""

    def __init__(self, min_ms: int, max_ms: int) -> None:
        if min_ms < 1 or max_ms < min_ms:
            raise ValueError("reconnect delays need 1 <= min_ms <= max_ms")
        self.min_ms, self.max_ms = min_ms, max_ms
        self.failures = 0

    def next_s(self) -> float:
        import random
        ceiling = min(self.max_ms, self.min_ms * (1 << min(self.failures, 30)))
        self.failures += 1
        return random.uniform(ceiling / 2, ceiling) / 1000.0

    def reset(self) -> None:
        self.failures = 0

    def cap(self, failures: int) -> None:
        """Keeps the next delay at most min_ms * 2^failures."""
        self.failures = min(self.failures, failures)
