"""taskpush.proto: the wire codec, a pure function of bytes (no sockets).

Owns the frame layouts of proto/PROTOCOL.md (version 1, version 2's SUBMIT,
SUBMITTED and OUTCOME, version 3's CONFIRM and HOLDING, version 4's PROGRESS)
with the same bounds
as proto/proto.c: a decoder refuses what the C decoder refuses, an encoder
refuses what a decoder would refuse, and one message has exactly one byte
sequence, so decode then encode gives back the frame byte for byte.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple, Union

PROTO_VERSION = 4  # what this library speaks first; it can fall back to 3, 2, then 1
LEN_PREFIX = 4
MAX_BODY_DEFAULT = (1 << 24) - 1 + 4096
MAX_TYPE_LEN = 256
MAX_TYPES = 64
MAX_NAME_LEN = 256
MAX_TOKEN_LEN = 1024
MAX_SUBMIT_TASKS = 1000
MAX_DEDUP_KEY_LEN = 191
MAX_PAYLOAD_LEN = (1 << 24) - 1
MAX_ATTEMPTS_LIMIT = 1000
MAX_CONFIRM = 1024  # entries of one CONFIRM or HOLDING
PROGRESS_MAX = 1000  # a PROGRESS value is permille
MAX_PROGRESS_MSG = 256  # bytes of a PROGRESS message: UTF-8 without NUL

HELLO, WELCOME, HEARTBEAT, ERROR, STOP = 0x01, 0x02, 0x03, 0x04, 0x05
TASK, DONE, EXTEND, CANCEL = 0x10, 0x11, 0x12, 0x13
CONFIRM, HOLDING = 0x14, 0x15
PROGRESS = 0x16
SUBMIT, SUBMITTED, OUTCOME = 0x20, 0x21, 0x22

SUCCESS, FAIL_PERM, FAIL_RETRY, RETRY_AFTER = 0, 1, 2, 3
OUTCOME_MAX = RETRY_AFTER
PRIORITY_MAX = 2

ERR_BAD_FRAME, ERR_VERSION, ERR_AUTH, ERR_UNEXPECTED, ERR_SHUTDOWN, ERR_TIMEOUT = 1, 2, 3, 4, 5, 6
ERR_NOT_LEADER = 7  # a standby; a client given several addresses tries the next

SUBMIT_FLAG_WAIT = 0x01
SUBMIT_FLAG_GROUP_KEY = 0x02  # each entry ends with a str16 group_key
SUBMIT_FLAG_AFTER = 0x04  # each entry ends with a u16 count and that many u64 task ids
SUBMIT_FLAGS_KNOWN = SUBMIT_FLAG_WAIT | SUBMIT_FLAG_GROUP_KEY | SUBMIT_FLAG_AFTER
MAX_GROUP_KEY_LEN = 191
MAX_AFTER = 1000  # task ids one task may wait for (the dispatcher refuses more)
SUBMITTED_OK, SUBMITTED_INVALID, SUBMITTED_UNAVAILABLE = 0, 1, 2
RESULT_INSERTED, RESULT_DUPLICATE = 0, 1
STATE_SUCCESSFUL, STATE_FAILED = 2, 3

# proto_frame_check results
OK, NEED_MORE, TOO_BIG, BAD = 0, 1, -1, -2

TYPE_NAMES = {HELLO: "HELLO", WELCOME: "WELCOME", HEARTBEAT: "HEARTBEAT", ERROR: "ERROR",
              STOP: "STOP", TASK: "TASK", DONE: "DONE", EXTEND: "EXTEND", CANCEL: "CANCEL",
              CONFIRM: "CONFIRM", HOLDING: "HOLDING", PROGRESS: "PROGRESS", SUBMIT: "SUBMIT", SUBMITTED: "SUBMITTED",
              OUTCOME: "OUTCOME"}


class BadFrame(ValueError):
    """A body that does not match its type's layout (PROTO_BAD), or a message
    that cannot be encoded."""


class Unexpected(BadFrame):
    """A valid frame at the wrong time or from the wrong side (ERR_UNEXPECTED)."""


@dataclass
class Hello:
    version: int
    capacity: int
    name: bytes
    token: bytes
    types: List[bytes]


@dataclass
class Welcome:
    version: int
    heartbeat_ms: int
    max_body: int
    server: bytes


@dataclass
class Heartbeat:
    pass


@dataclass
class Stop:
    pass


@dataclass
class Error:
    code: int
    message: bytes


@dataclass
class Task:
    task_id: int
    epoch: int
    attempt: int
    timeout_ms: int
    priority: int
    type: bytes
    payload: bytes


@dataclass
class Done:
    task_id: int
    epoch: int
    attempt: int
    outcome: int
    retry_after_ms: int
    data: bytes


@dataclass
class Extend:
    task_id: int
    epoch: int
    attempt: int
    extend_ms: int


@dataclass
class Progress:
    task_id: int
    epoch: int
    attempt: int
    permille: int  # 0 .. PROGRESS_MAX
    message: bytes  # 0 .. MAX_PROGRESS_MSG bytes of UTF-8 without NUL; empty: none


def progress_message_ok(b: bytes) -> bool:
    """A PROGRESS message: at most MAX_PROGRESS_MSG bytes of UTF-8 without NUL
    (Python's decoder refuses overlong forms and surrogates, as proto.c does)."""
    if len(b) > MAX_PROGRESS_MSG or b"\0" in b:
        return False
    try:
        b.decode("utf-8", "strict")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class Cancel:
    task_id: int
    epoch: int
    attempt: int


Delivery = Tuple[int, int, int]  # (task_id, epoch, attempt)


@dataclass
class Confirm:
    """Version 3, dispatcher -> worker: the DONEs of these deliveries are settled."""
    deliveries: List[Delivery]


@dataclass
class Holding:
    """Version 3, worker -> dispatcher: deliveries of an earlier connection still running."""
    deliveries: List[Delivery]


@dataclass
class SubmitTask:
    """One task entry of a SUBMIT."""
    type: bytes
    payload: bytes = b""
    priority: int = 1
    max_attempts: int = 0  # 0: the table's default
    delay_ms: int = 0
    timeout_ms: int = 0    # 0: the dispatcher's default
    dedup_key: bytes = b""  # empty: none
    group_key: bytes = b""  # empty: none; on the wire only under SUBMIT_FLAG_GROUP_KEY
    after: List[int] = field(default_factory=list)  # task ids it waits for; under SUBMIT_FLAG_AFTER


@dataclass
class Submit:
    request_id: int
    flags: int
    tasks: List[SubmitTask]


@dataclass
class SubmitResult:
    result: int  # RESULT_INSERTED or RESULT_DUPLICATE
    task_id: int


@dataclass
class Submitted:
    request_id: int
    status: int
    results: List[SubmitResult] = field(default_factory=list)
    message: bytes = b""


@dataclass
class Outcome:
    request_id: int
    task_id: int
    state: int
    data: bytes


Message = Union[Hello, Welcome, Heartbeat, Stop, Error, Task, Done, Extend, Cancel,
                Confirm, Holding, Progress, Submit, Submitted, Outcome]


def frame_check(buf: Union[bytes, bytearray, memoryview], max_body: int) -> Tuple[int, int]:
    """Looks at the start of a stream: (OK, body_len) when a whole frame is
    there, (NEED_MORE, n), (TOO_BIG, n) from the prefix alone, or (BAD, 0) for
    a zero length."""
    if len(buf) < LEN_PREFIX:
        return NEED_MORE, 0
    n = int.from_bytes(buf[:LEN_PREFIX], "big")
    if n == 0:
        return BAD, 0
    if n > max_body:
        return TOO_BIG, n
    if len(buf) - LEN_PREFIX >= n:
        return OK, n
    return NEED_MORE, n


class _Reader:
    """Bounds-checked reads over one body; every overrun is BadFrame."""

    def __init__(self, body: bytes, off: int = 1) -> None:
        self.b = body
        self.off = off

    def take(self, n: int) -> bytes:
        if len(self.b) - self.off < n:
            raise BadFrame("field runs past the end of the body")
        v = self.b[self.off:self.off + n]
        self.off += n
        return v

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def str16(self, lo: int, hi: int, what: str) -> bytes:
        n = self.u16()
        if n < lo or n > hi:
            raise BadFrame(f"{what}: length {n} outside {lo}..{hi}")
        return self.take(n)

    def rest(self) -> bytes:
        v = self.b[self.off:]
        self.off = len(self.b)
        return v

    def end(self) -> None:
        if self.off != len(self.b):
            raise BadFrame("bytes after the last field")


def _hello_counts_ok(version: int, capacity: int, ntypes: int) -> bool:
    # Version 2 allows a producer-only HELLO: no type and no capacity.
    if version >= 2 and ntypes == 0:
        return capacity == 0
    return capacity >= 1 and 1 <= ntypes <= MAX_TYPES


def _dec_hello(r: _Reader) -> Hello:
    version, capacity = r.u16(), r.u32()
    name = r.str16(0, MAX_NAME_LEN, "name")
    token = r.str16(0, MAX_TOKEN_LEN, "token")
    ntypes = r.u16()
    if not _hello_counts_ok(version, capacity, ntypes):
        raise BadFrame(f"HELLO capacity {capacity} with {ntypes} types")
    types = [r.str16(1, MAX_TYPE_LEN, "type") for _ in range(ntypes)]
    r.end()
    return Hello(version, capacity, name, token, types)


def _dec_submit(r: _Reader) -> Submit:
    request_id, flags, ntasks = r.u32(), r.u8(), r.u16()
    if flags & ~SUBMIT_FLAGS_KNOWN:
        raise BadFrame(f"SUBMIT flags 0x{flags:02x}")
    if not 1 <= ntasks <= MAX_SUBMIT_TASKS:
        raise BadFrame(f"SUBMIT ntasks {ntasks}")
    tasks = []
    for _ in range(ntasks):
        prio, attempts, delay, timeout = r.u8(), r.u16(), r.u32(), r.u32()
        if prio > PRIORITY_MAX or attempts > MAX_ATTEMPTS_LIMIT:
            raise BadFrame(f"SUBMIT priority {prio} or max_attempts {attempts}")
        ttype = r.str16(1, MAX_TYPE_LEN, "type")
        key = r.str16(0, MAX_DEDUP_KEY_LEN, "dedup_key")
        plen = r.u32()
        if plen > MAX_PAYLOAD_LEN:
            raise BadFrame(f"SUBMIT payload of {plen} bytes")
        payload = r.take(plen)
        group = r.str16(0, MAX_GROUP_KEY_LEN, "group_key") if flags & SUBMIT_FLAG_GROUP_KEY else b""
        after = [r.u64() for _ in range(r.u16())] if flags & SUBMIT_FLAG_AFTER else []
        tasks.append(SubmitTask(ttype, payload, prio, attempts, delay, timeout, key, group, after))
    r.end()
    return Submit(request_id, flags, tasks)


def _submitted_counts_ok(status: int, n: int) -> bool:
    # OK answers every entry (so at least one); a refusal answers none.
    if status == SUBMITTED_OK:
        return 1 <= n <= MAX_SUBMIT_TASKS
    return status <= SUBMITTED_UNAVAILABLE and n == 0


def _dec_submitted(r: _Reader) -> Submitted:
    request_id, status, n = r.u32(), r.u16(), r.u16()
    if not _submitted_counts_ok(status, n):
        raise BadFrame(f"SUBMITTED status {status} with {n} results")
    results = []
    for _ in range(n):
        res, tid = r.u8(), r.u64()
        if res > RESULT_DUPLICATE:
            raise BadFrame(f"SUBMITTED result {res}")
        results.append(SubmitResult(res, tid))
    return Submitted(request_id, status, results, r.rest())


def _dec_deliveries(r: _Reader, what: str) -> List[Delivery]:
    n = r.u16()
    if not 1 <= n <= MAX_CONFIRM:
        raise BadFrame(f"{what} count {n} outside 1..{MAX_CONFIRM}")
    out = [(r.u64(), r.u32(), r.u32()) for _ in range(n)]
    r.end()
    return out


def decode(body: bytes) -> Message:
    """Parses one body (without its prefix); BadFrame when it is malformed."""
    body = bytes(body)
    if not body:
        raise BadFrame("empty body")
    t = body[0]
    r = _Reader(body)
    msg: Message
    if t == HELLO:
        msg = _dec_hello(r)
    elif t == WELCOME:
        version, hb, max_body = r.u16(), r.u32(), r.u32()
        msg = Welcome(version, hb, max_body, r.str16(0, MAX_NAME_LEN, "server"))
        r.end()
    elif t in (HEARTBEAT, STOP):
        r.end()
        msg = Heartbeat() if t == HEARTBEAT else Stop()
    elif t == ERROR:
        msg = Error(r.u16(), r.rest())
    elif t == TASK:
        tid, epoch, attempt, timeout, prio = r.u64(), r.u32(), r.u32(), r.u32(), r.u8()
        if prio > PRIORITY_MAX:
            raise BadFrame(f"TASK priority {prio}")
        msg = Task(tid, epoch, attempt, timeout, prio, r.str16(1, MAX_TYPE_LEN, "type"), r.rest())
    elif t == DONE:
        tid, epoch, attempt, outcome = r.u64(), r.u32(), r.u32(), r.u8()
        if outcome > OUTCOME_MAX:
            raise BadFrame(f"DONE outcome {outcome}")
        msg = Done(tid, epoch, attempt, outcome, r.u32(), r.rest())
    elif t == EXTEND:
        msg = Extend(r.u64(), r.u32(), r.u32(), r.u32())
        r.end()
    elif t == CANCEL:
        msg = Cancel(r.u64(), r.u32(), r.u32())
        r.end()
    elif t == PROGRESS:
        tid, epoch, attempt, permille = r.u64(), r.u32(), r.u32(), r.u16()
        if permille > PROGRESS_MAX:
            raise BadFrame(f"PROGRESS permille {permille}")
        text = r.str16(0, MAX_PROGRESS_MSG, "message")
        r.end()
        if not progress_message_ok(text):
            raise BadFrame("PROGRESS message is not UTF-8 without NUL")
        msg = Progress(tid, epoch, attempt, permille, text)
    elif t == CONFIRM:
        msg = Confirm(_dec_deliveries(r, "CONFIRM"))
    elif t == HOLDING:
        msg = Holding(_dec_deliveries(r, "HOLDING"))
    elif t == SUBMIT:
        msg = _dec_submit(r)
    elif t == SUBMITTED:
        msg = _dec_submitted(r)
    elif t == OUTCOME:
        rid, tid, state = r.u32(), r.u64(), r.u8()
        if state not in (STATE_SUCCESSFUL, STATE_FAILED):
            raise BadFrame(f"OUTCOME state {state}")
        msg = Outcome(rid, tid, state, r.rest())
    else:
        raise BadFrame(f"unknown frame type 0x{t:02x}")
    return msg


def _u(v: int, bits: int, what: str) -> int:
    if not 0 <= v < (1 << bits):
        raise BadFrame(f"{what} {v} does not fit u{bits}")
    return v


def _s16(b: bytes, lo: int, hi: int, what: str) -> bytes:
    if not lo <= len(b) <= hi:
        raise BadFrame(f"{what}: length {len(b)} outside {lo}..{hi}")
    return struct.pack(">H", len(b)) + bytes(b)


def _enc_hello(m: Hello) -> bytes:
    if not _hello_counts_ok(m.version, m.capacity, len(m.types)):
        raise BadFrame(f"HELLO capacity {m.capacity} with {len(m.types)} types")
    out = [struct.pack(">BHI", HELLO, _u(m.version, 16, "version"), _u(m.capacity, 32, "capacity")),
           _s16(m.name, 0, MAX_NAME_LEN, "name"), _s16(m.token, 0, MAX_TOKEN_LEN, "token"),
           struct.pack(">H", len(m.types))]
    out += [_s16(t, 1, MAX_TYPE_LEN, "type") for t in m.types]
    return b"".join(out)


def _enc_submit(m: Submit) -> bytes:
    if m.flags & ~SUBMIT_FLAGS_KNOWN or not 1 <= len(m.tasks) <= MAX_SUBMIT_TASKS:
        raise BadFrame(f"SUBMIT flags {m.flags} with {len(m.tasks)} tasks")
    out = [struct.pack(">BIBH", SUBMIT, _u(m.request_id, 32, "request_id"), _u(m.flags, 8, "flags"),
                       len(m.tasks))]
    for t in m.tasks:
        if t.priority not in range(PRIORITY_MAX + 1) or t.max_attempts not in range(MAX_ATTEMPTS_LIMIT + 1):
            raise BadFrame(f"SUBMIT priority {t.priority} or max_attempts {t.max_attempts}")
        if len(t.payload) > MAX_PAYLOAD_LEN:
            raise BadFrame(f"SUBMIT payload of {len(t.payload)} bytes")
        out.append(struct.pack(">BHII", t.priority, t.max_attempts, _u(t.delay_ms, 32, "delay_ms"),
                               _u(t.timeout_ms, 32, "timeout_ms")))
        out += [_s16(t.type, 1, MAX_TYPE_LEN, "type"), _s16(t.dedup_key, 0, MAX_DEDUP_KEY_LEN, "dedup_key"),
                struct.pack(">I", len(t.payload)), bytes(t.payload)]
        if m.flags & SUBMIT_FLAG_GROUP_KEY:
            out.append(_s16(t.group_key, 0, MAX_GROUP_KEY_LEN, "group_key"))
        if m.flags & SUBMIT_FLAG_AFTER:
            out.append(struct.pack(">H", _u(len(t.after), 16, "after count")))
            out += [struct.pack(">Q", _u(i, 64, "after id")) for i in t.after]
    return b"".join(out)


def _enc_submitted(m: Submitted) -> bytes:
    n = len(m.results)
    if not _submitted_counts_ok(m.status, n):
        raise BadFrame(f"SUBMITTED status {m.status} with {n} results")
    out = [struct.pack(">BIHH", SUBMITTED, _u(m.request_id, 32, "request_id"), _u(m.status, 16, "status"), n)]
    for res in m.results:
        if res.result > RESULT_DUPLICATE or res.result < 0:
            raise BadFrame(f"SUBMITTED result {res.result}")
        out.append(struct.pack(">BQ", res.result, _u(res.task_id, 64, "task_id")))
    out.append(bytes(m.message))
    return b"".join(out)


def _enc_deliveries(t: int, ds: List[Delivery]) -> bytes:
    if not 1 <= len(ds) <= MAX_CONFIRM:
        raise BadFrame(f"{type_name(t)} count {len(ds)} outside 1..{MAX_CONFIRM}")
    out = [struct.pack(">BH", t, len(ds))]
    for tid, epoch, attempt in ds:
        out.append(struct.pack(">QII", _u(tid, 64, "task_id"), _u(epoch, 32, "epoch"), _u(attempt, 32, "attempt")))
    return b"".join(out)


def encode_body(m: Message) -> bytes:
    """The body of m (no prefix); BadFrame when a decoder would refuse it."""
    if isinstance(m, Hello):
        return _enc_hello(m)
    if isinstance(m, Welcome):
        return (struct.pack(">BHII", WELCOME, _u(m.version, 16, "version"), _u(m.heartbeat_ms, 32, "heartbeat_ms"),
                            _u(m.max_body, 32, "max_body")) + _s16(m.server, 0, MAX_NAME_LEN, "server"))
    if isinstance(m, Heartbeat):
        return bytes([HEARTBEAT])
    if isinstance(m, Stop):
        return bytes([STOP])
    if isinstance(m, Error):
        return struct.pack(">BH", ERROR, _u(m.code, 16, "code")) + bytes(m.message)
    if isinstance(m, Task):
        if m.priority not in range(PRIORITY_MAX + 1):
            raise BadFrame(f"TASK priority {m.priority}")
        return (struct.pack(">BQIIIB", TASK, _u(m.task_id, 64, "task_id"), _u(m.epoch, 32, "epoch"),
                            _u(m.attempt, 32, "attempt"), _u(m.timeout_ms, 32, "timeout_ms"), m.priority)
                + _s16(m.type, 1, MAX_TYPE_LEN, "type") + bytes(m.payload))
    if isinstance(m, Done):
        if m.outcome not in range(OUTCOME_MAX + 1):
            raise BadFrame(f"DONE outcome {m.outcome}")
        return (struct.pack(">BQIIBI", DONE, _u(m.task_id, 64, "task_id"), _u(m.epoch, 32, "epoch"),
                            _u(m.attempt, 32, "attempt"), m.outcome, _u(m.retry_after_ms, 32, "retry_after_ms"))
                + bytes(m.data))
    if isinstance(m, Extend):
        return struct.pack(">BQIII", EXTEND, _u(m.task_id, 64, "task_id"), _u(m.epoch, 32, "epoch"),
                           _u(m.attempt, 32, "attempt"), _u(m.extend_ms, 32, "extend_ms"))
    if isinstance(m, Cancel):
        return struct.pack(">BQII", CANCEL, _u(m.task_id, 64, "task_id"), _u(m.epoch, 32, "epoch"),
                           _u(m.attempt, 32, "attempt"))
    if isinstance(m, Progress):
        if m.permille not in range(PROGRESS_MAX + 1) or not progress_message_ok(bytes(m.message)):
            raise BadFrame(f"PROGRESS permille {m.permille} or its message")
        return (struct.pack(">BQIIH", PROGRESS, _u(m.task_id, 64, "task_id"), _u(m.epoch, 32, "epoch"),
                            _u(m.attempt, 32, "attempt"), m.permille)
                + _s16(m.message, 0, MAX_PROGRESS_MSG, "message"))
    if isinstance(m, Confirm):
        return _enc_deliveries(CONFIRM, m.deliveries)
    if isinstance(m, Holding):
        return _enc_deliveries(HOLDING, m.deliveries)
    if isinstance(m, Submit):
        return _enc_submit(m)
    if isinstance(m, Submitted):
        return _enc_submitted(m)
    if isinstance(m, Outcome):
        if m.state not in (STATE_SUCCESSFUL, STATE_FAILED):
            raise BadFrame(f"OUTCOME state {m.state}")
        return (struct.pack(">BIQB", OUTCOME, _u(m.request_id, 32, "request_id"), _u(m.task_id, 64, "task_id"),
                            m.state) + bytes(m.data))
    raise BadFrame(f"cannot encode {type(m).__name__}")


def encode(m: Message) -> bytes:
    """The whole frame of m, prefix included; BadFrame when it cannot be encoded."""
    body = encode_body(m)
    if len(body) > 0xFFFFFFFF:
        raise BadFrame("body does not fit the u32 prefix")
    return struct.pack(">I", len(body)) + body


def type_name(t: int) -> str:
    return TYPE_NAMES.get(t, "UNKNOWN")


class FrameBuffer:
    """Accumulates stream bytes and hands out whole bodies, checking each prefix
    against max_body before any of the body is buffered."""

    def __init__(self, max_body: int = MAX_BODY_DEFAULT) -> None:
        self.max_body = max_body
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_body(self) -> Optional[bytes]:
        """The next whole body, None when more bytes are needed; BadFrame for a
        zero or oversized prefix (the connection must be closed)."""
        st, n = frame_check(self._buf, self.max_body)
        if st == NEED_MORE:
            return None
        if st == BAD:
            raise BadFrame("zero-length frame")
        if st == TOO_BIG:
            raise BadFrame(f"frame of {n} bytes exceeds {self.max_body}")
        body = bytes(self._buf[LEN_PREFIX:LEN_PREFIX + n])
        del self._buf[:LEN_PREFIX + n]
        return body
