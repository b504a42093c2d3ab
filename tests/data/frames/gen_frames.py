#!/usr/bin/env python3
"""Writes the golden frames of the taskpush wire format, and the fuzz seed corpus.

    tests/data/frames/valid/<case>.bin     one well-formed frame each
    tests/data/frames/invalid/<case>.bin   one frame each that a peer must refuse
                                           (TOO_BIG or BAD with PROTO_MAX_BODY_DEFAULT)
    tests/fuzz/corpus/seed-<case>.bin      the valid frames, plus multi-frame streams

The encoder below is written from proto/PROTOCOL.md, independently of
proto/proto.c, so that the C codec is checked against a second reading of the
specification. Output is deterministic: run it again and nothing changes.
Standard library only.

Usage: gen_frames.py           rewrite every file (stale .bin files are removed)
       gen_frames.py --check   exit 1 if a committed file differs from what it would write
"""
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent
VALID_DIR = HERE / "valid"
INVALID_DIR = HERE / "invalid"
CORPUS_DIR = HERE.parent.parent / "fuzz" / "corpus"

# Mirrors of proto.h.
VERSION = 4
VERSION_3 = 3
VERSION_1 = 1
VERSION_2 = 2
MAX_BODY_DEFAULT = (1 << 24) - 1 + 4096
FUZZ_MAX_BODY = 1 << 20  # the max_body of tests/fuzz/fuzz_frame.c

HELLO, WELCOME, HEARTBEAT, ERROR, STOP = 0x01, 0x02, 0x03, 0x04, 0x05
TASK, DONE, EXTEND, CANCEL = 0x10, 0x11, 0x12, 0x13
CONFIRM, HOLDING = 0x14, 0x15
PROGRESS = 0x16
MAX_PROGRESS_MSG = 256
MAX_CONFIRM = 1024
SUBMIT, SUBMITTED, OUTCOME = 0x20, 0x21, 0x22
WAIT = 0x01
GROUP_KEY = 0x02  # each entry ends with a str16 group_key
AFTER = 0x04  # each entry ends with a u16 count and that many u64 task ids
S_OK, S_INVALID, S_UNAVAILABLE = 0, 1, 2
INSERTED, DUPLICATE = 0, 1
SUCCESSFUL, FAILED = 2, 3
SUCCESS, FAIL_PERM, FAIL_RETRY, RETRY_AFTER = 0, 1, 2, 3
ERR_VERSION, ERR_SHUTDOWN = 2, 5


def frame(body):
    """Prefixes a body with its 4-byte big-endian length."""
    return struct.pack(">I", len(body)) + body


def string(b):
    """A u16 length and the bytes."""
    return struct.pack(">H", len(b)) + b


def hello(version, capacity, name, token, types, ntypes=None):
    body = struct.pack(">BHI", HELLO, version, capacity) + string(name) + string(token)
    body += struct.pack(">H", len(types) if ntypes is None else ntypes)
    for t in types:
        body += string(t)
    return body


def welcome(version, heartbeat_ms, max_body, server):
    return struct.pack(">BHII", WELCOME, version, heartbeat_ms, max_body) + string(server)


def error(code, message):
    return struct.pack(">BH", ERROR, code) + message


def task(task_id, epoch, attempt, timeout_ms, priority, ttype, payload):
    return (struct.pack(">BQIIIB", TASK, task_id, epoch, attempt, timeout_ms, priority)
            + string(ttype) + payload)


def done(task_id, epoch, attempt, outcome, retry_after_ms, data):
    return struct.pack(">BQIIBI", DONE, task_id, epoch, attempt, outcome, retry_after_ms) + data


def progress(task_id, epoch, attempt, permille, message, msg_len=None):
    return (struct.pack(">BQIIHH", PROGRESS, task_id, epoch, attempt, permille,
                        len(message) if msg_len is None else msg_len) + message)


def extend(task_id, epoch, attempt, extend_ms):
    return struct.pack(">BQIII", EXTEND, task_id, epoch, attempt, extend_ms)


def cancel(task_id, epoch, attempt):
    return struct.pack(">BQII", CANCEL, task_id, epoch, attempt)


def dlv_list(ftype, deliveries, n=None):
    """CONFIRM or HOLDING: u16 n, then n x (u64 task_id, u32 epoch, u32 attempt)."""
    body = struct.pack(">BH", ftype, len(deliveries) if n is None else n)
    for task_id, epoch, attempt in deliveries:
        body += struct.pack(">QII", task_id, epoch, attempt)
    return body


def entry(ttype, payload=b"", priority=1, max_attempts=0, delay_ms=0, timeout_ms=0,
          dedup_key=b"", payload_len=None, group_key=None, after=None, nafter=None):
    """One SUBMIT task entry (PROTOCOL.md 5.10); group_key only under GROUP_KEY, after
    (task ids; nafter the count written, when not theirs) only under AFTER."""
    plen = len(payload) if payload_len is None else payload_len
    tail = b""
    if after is not None:
        tail = struct.pack(">H", len(after) if nafter is None else nafter) + b"".join(
            struct.pack(">Q", i) for i in after)
    return (struct.pack(">BHII", priority, max_attempts, delay_ms, timeout_ms)
            + string(ttype) + string(dedup_key) + struct.pack(">I", plen) + payload
            + (b"" if group_key is None else string(group_key)) + tail)


def submit(request_id, flags, entries, ntasks=None):
    n = len(entries) if ntasks is None else ntasks
    return struct.pack(">BIBH", SUBMIT, request_id, flags, n) + b"".join(entries)


def submitted(request_id, status, results, message=b"", n=None):
    body = struct.pack(">BIHH", SUBMITTED, request_id, status, len(results) if n is None else n)
    for result, task_id in results:
        body += struct.pack(">BQ", result, task_id)
    return body + message


def outcome(request_id, task_id, state, data):
    return struct.pack(">BIQB", OUTCOME, request_id, task_id, state) + data


BINARY = bytes(range(256)) + b"\x00\xff" * 8 + b"\x00"

# Bodies of the valid cases. tests/unit/test_proto.c checks some field values:
# keep the two in step.
VALID = {
    "hello_minimal": hello(VERSION, 1, b"w", b"", [b"echo"]),
    "hello_full": hello(VERSION, 64, b"worker-07.example", b"s3cret-token",
                        [b"resize", b"thumbnail", b"email.send"]),
    "hello_max_bounds": hello(VERSION, 0xFFFFFFFF, b"n" * 256, b"k" * 1024,
                              [b"%02d" % i + b"t" * 254 for i in range(64)]),
    "welcome": welcome(VERSION, 5000, MAX_BODY_DEFAULT, b"taskpushd 0.1.0"),
    "welcome_empty_server": welcome(VERSION, 1, 1, b""),
    "heartbeat": bytes([HEARTBEAT]),
    "stop": bytes([STOP]),
    "error_version": error(ERR_VERSION, b"protocol version 2 not supported"),
    "error_empty": error(ERR_SHUTDOWN, b""),
    "task_small": task(0x0102030405060708, 3, 1, 30000, 1, b"resize",
                       b'{"w":640,"h":480}'),
    "task_empty_payload": task(1, 1, 2, 1000, 0, b"noop", b""),
    "task_binary_payload": task(42, 7, 3, 60000, 2, b"blob", BINARY),
    "task_max_fields": task(0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 2,
                            b"x" * 256, b"\xff"),
    "done_success": done(0x0102030405060708, 3, 1, SUCCESS, 0, b'{"ok":true}'),
    "done_fail_perm": done(9, 1, 1, FAIL_PERM, 0, b"bad input"),
    "done_fail_retry_empty": done(10, 2, 5, FAIL_RETRY, 0, b""),
    "done_retry_after": done(11, 4, 2, RETRY_AFTER, 15000, b"rate limited"),
    "done_binary": done(12, 1, 1, SUCCESS, 0, BINARY),
    "extend": extend(0x0102030405060708, 3, 1, 45000),
    "cancel": cancel(0x0102030405060708, 3, 1),
    "hello_v1": hello(VERSION_1, 4, b"old-worker", b"", [b"echo"]),
    "hello_producer": hello(VERSION, 0, b"producer", b"tok", []),
    "submit_one": submit(7, 0, [entry(b"resize", b'{"w":640}')]),
    "submit_full": submit(0xA1B2C3D4, WAIT, [
        entry(b"email.send", b"hello", priority=2, max_attempts=5, delay_ms=1500,
              timeout_ms=30000, dedup_key=b"mail-42"),
        entry(b"noop", b"", priority=0),
        entry(b"blob", BINARY, dedup_key=b"\x00\xff binary key"),
    ]),
    "submit_max_fields": submit(0xFFFFFFFF, WAIT, [
        entry(b"t" * 256, b"\xff", priority=2, max_attempts=1000, delay_ms=0xFFFFFFFF,
              timeout_ms=0xFFFFFFFF, dedup_key=b"k" * 191)]),
    "submit_1000": submit(1, 0, [entry(b"n", b"%d" % i) for i in range(1000)]),
    "submit_group_key": submit(9, WAIT | GROUP_KEY, [entry(b"crawl", b"u", group_key=b"host-a"),
                                                     entry(b"crawl", b"v", group_key=b""),
                                                     entry(b"crawl", b"w", group_key=b"g" * 191)]),
    "submit_after": submit(10, GROUP_KEY | AFTER, [entry(b"report", b"r", group_key=b"k", after=[17, 18]),
                                                   entry(b"report", b"s", group_key=b"", after=[])]),
    "submitted_ok": submitted(0xA1B2C3D4, S_OK, [(INSERTED, 101), (INSERTED, 102),
                                                 (DUPLICATE, 55)]),
    "submitted_duplicate_unknown": submitted(3, S_OK, [(DUPLICATE, 0)]),
    "submitted_invalid": submitted(7, S_INVALID, [], b"a task type may not end with a space"),
    "submitted_unavailable": submitted(8, S_UNAVAILABLE, [], b"not leading the table"),
    "outcome_successful": outcome(0xA1B2C3D4, 101, SUCCESSFUL, b'{"sent":true}'),
    "outcome_failed": outcome(9, 0xFFFFFFFFFFFFFFFF, FAILED, b"permanent: bad address"),
    "outcome_empty": outcome(0, 1, SUCCESSFUL, b""),
    "hello_v2": hello(VERSION_2, 4, b"v2-worker", b"", [b"echo"]),
    "confirm_one": dlv_list(CONFIRM, [(0x0102030405060708, 3, 1)]),
    "confirm_several": dlv_list(CONFIRM, [(101, 7, 1), (102, 7, 2), (0xFFFFFFFFFFFFFFFF,
                                                                    0xFFFFFFFF, 0xFFFFFFFF)]),
    "confirm_max": dlv_list(CONFIRM, [(i + 1, 9, 1) for i in range(MAX_CONFIRM)]),
    "holding_one": dlv_list(HOLDING, [(42, 5, 2)]),
    "holding_several": dlv_list(HOLDING, [(1, 1, 1), (2, 4, 3), (3, 0, 0)]),
    "holding_max": dlv_list(HOLDING, [(i * 3, 2, 1) for i in range(MAX_CONFIRM)]),
    "hello_v3": hello(VERSION_3, 4, b"v3-worker", b"", [b"echo"]),
    "progress_empty": progress(0x0102030405060708, 3, 1, 0, b""),
    "progress_message": progress(42, 7, 2, 375, b"page 3 of 8"),
    "progress_max": progress(0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 1000,
                             "\u00e9".encode() * (MAX_PROGRESS_MSG // 2)),
    "progress_utf8": progress(5, 1, 1, 999, "\u2713 \U0001F600 \u00fcber".encode()),
}

# Whole frames (prefix included) of the invalid cases.
INVALID = {
    "zero_length": struct.pack(">I", 0),
    "oversize_prefix": struct.pack(">I", MAX_BODY_DEFAULT + 1),
    "oversize_ffffffff": struct.pack(">I", 0xFFFFFFFF) + bytes([TASK]) + b"\0" * 7,
    "unknown_type": frame(b"\x7f"),
    "unknown_type_zero": frame(b"\x00\x00\x00"),
    "heartbeat_trailing": frame(bytes([HEARTBEAT, 0])),
    "stop_trailing": frame(bytes([STOP, 0xFF])),
    "task_truncated": frame(VALID["task_small"][:20]),
    "task_type_past_end": frame(task(1, 1, 1, 1000, 0, b"abcdefghij", b"")[:24 + 3]),
    "task_bad_priority": frame(task(1, 1, 1, 1000, 3, b"noop", b"x")),
    "task_empty_type": frame(task(1, 1, 1, 1000, 0, b"", b"payload")),
    "task_type_too_long": frame(task(1, 1, 1, 1000, 0, b"x" * 257, b"")),
    "hello_zero_types": frame(hello(VERSION, 1, b"w", b"", [])),
    "hello_too_many_types": frame(hello(VERSION, 1, b"w", b"", [b"t%d" % i for i in range(65)])),
    "hello_ntypes_past_end": frame(hello(VERSION, 1, b"w", b"", [b"echo"], ntypes=2)),
    "hello_zero_capacity": frame(hello(VERSION, 0, b"w", b"", [b"echo"])),
    "hello_empty_type": frame(hello(VERSION, 1, b"w", b"", [b"echo", b""])),
    "hello_name_too_long": frame(hello(VERSION, 1, b"n" * 257, b"", [b"echo"])),
    "hello_token_too_long": frame(hello(VERSION, 1, b"w", b"k" * 1025, [b"echo"])),
    "hello_trailing_byte": frame(hello(VERSION, 1, b"w", b"", [b"echo"]) + b"\0"),
    "hello_truncated": frame(hello(VERSION, 1, b"w", b"", [b"echo"])[:8]),
    "welcome_trailing": frame(VALID["welcome"] + b"!"),
    "welcome_truncated": frame(VALID["welcome"][:-1]),
    "error_truncated": frame(bytes([ERROR, 0])),
    "done_bad_outcome": frame(done(1, 1, 1, 4, 0, b"")),
    "done_truncated": frame(done(1, 1, 1, SUCCESS, 0, b"")[:21]),
    "extend_trailing": frame(VALID["extend"] + b"\0"),
    "extend_truncated": frame(VALID["extend"][:-1]),
    "cancel_trailing": frame(VALID["cancel"] + b"\0"),
    "cancel_truncated": frame(VALID["cancel"][:-1]),
    "hello_v1_producer": frame(hello(VERSION_1, 0, b"p", b"", [])),
    "hello_producer_capacity": frame(hello(VERSION, 1, b"p", b"", [])),
    "submit_zero_tasks": frame(submit(1, 0, [])),
    "submit_1001_tasks": frame(submit(1, 0, [entry(b"n")] * 1001)),
    "submit_ntasks_past_end": frame(submit(1, 0, [entry(b"n")], ntasks=2)),
    "submit_flags_bit": frame(submit(1, 0x08, [entry(b"n")])),
    "submit_after_missing": frame(submit(1, AFTER, [entry(b"n")])),
    "submit_after_short": frame(submit(1, AFTER, [entry(b"n", after=[1, 2], nafter=3)])),
    "submit_group_key_missing": frame(submit(1, GROUP_KEY, [entry(b"n")])),
    "submit_group_key_too_long": frame(submit(1, GROUP_KEY, [entry(b"n", group_key=b"g" * 192)])),
    "submit_flags_high": frame(submit(1, 0x81, [entry(b"n")])),
    "submit_bad_priority": frame(submit(1, 0, [entry(b"n", priority=3)])),
    "submit_max_attempts_1001": frame(submit(1, 0, [entry(b"n", max_attempts=1001)])),
    "submit_empty_type": frame(submit(1, 0, [entry(b"")])),
    "submit_type_too_long": frame(submit(1, 0, [entry(b"t" * 257)])),
    "submit_dedup_too_long": frame(submit(1, 0, [entry(b"n", dedup_key=b"k" * 192)])),
    "submit_payload_past_end": frame(submit(1, 0, [entry(b"n", b"abc", payload_len=4)])),
    "submit_payload_over_max": frame(submit(1, 0, [entry(b"n", b"", payload_len=1 << 24)])),
    "submit_trailing_byte": frame(submit(1, 0, [entry(b"n", b"x")]) + b"\0"),
    "submit_truncated": frame(submit(1, 0, [entry(b"n")])[:7]),
    "submitted_bad_status": frame(submitted(1, 3, [])),
    "submitted_n_with_error": frame(submitted(1, S_INVALID, [(INSERTED, 1)])),
    "submitted_ok_zero": frame(submitted(1, S_OK, [])),
    "submitted_bad_result": frame(submitted(1, S_OK, [(2, 1)])),
    "submitted_n_past_end": frame(submitted(1, S_OK, [(INSERTED, 1)], n=2)),
    "submitted_truncated": frame(submitted(1, S_OK, [])[:8]),
    "outcome_bad_state": frame(outcome(1, 1, 1, b"")),
    "outcome_state_new": frame(outcome(1, 1, 0, b"x")),
    "outcome_truncated": frame(outcome(1, 1, SUCCESSFUL, b"")[:13]),
    "confirm_zero": frame(dlv_list(CONFIRM, [])),
    "confirm_1025": frame(dlv_list(CONFIRM, [(i, 1, 1) for i in range(MAX_CONFIRM + 1)])),
    "confirm_trailing_byte": frame(dlv_list(CONFIRM, [(1, 1, 1)]) + b"\0"),
    "confirm_short": frame(dlv_list(CONFIRM, [(1, 1, 1), (2, 1, 1)])[:-1]),
    "confirm_n_past_end": frame(dlv_list(CONFIRM, [(1, 1, 1)], n=2)),
    "confirm_truncated": frame(bytes([CONFIRM, 0])),
    "holding_zero": frame(dlv_list(HOLDING, [])),
    "holding_1025": frame(dlv_list(HOLDING, [(i, 1, 1) for i in range(MAX_CONFIRM + 1)])),
    "holding_trailing_byte": frame(dlv_list(HOLDING, [(1, 1, 1)]) + b"\xff"),
    "holding_short": frame(dlv_list(HOLDING, [(1, 1, 1)])[:-4]),
    "holding_n_past_end": frame(dlv_list(HOLDING, [(1, 1, 1)] * 3, n=4)),
    "holding_truncated": frame(bytes([HOLDING])),
    "progress_1001": frame(progress(1, 1, 1, 1001, b"")),
    "progress_ffff": frame(progress(1, 1, 1, 0xFFFF, b"x")),
    "progress_message_257": frame(progress(1, 1, 1, 10, b"m" * (MAX_PROGRESS_MSG + 1))),
    "progress_not_utf8": frame(progress(1, 1, 1, 10, b"\xc3\x28")),
    "progress_overlong": frame(progress(1, 1, 1, 10, b"\xc0\xaf")),
    "progress_surrogate": frame(progress(1, 1, 1, 10, b"\xed\xa0\x80")),
    "progress_above_10ffff": frame(progress(1, 1, 1, 10, b"\xf4\x90\x80\x80")),
    "progress_cut_sequence": frame(progress(1, 1, 1, 10, b"ab\xe2\x82")),
    "progress_nul": frame(progress(1, 1, 1, 10, b"a\x00b")),
    "progress_len_past_end": frame(progress(1, 1, 1, 10, b"abc", msg_len=4)),
    "progress_trailing_byte": frame(progress(1, 1, 1, 10, b"abc", msg_len=2)),
    "progress_truncated": frame(progress(1, 1, 1, 10, b"")[:19]),
}


def corpus():
    """Seeds for the fuzzer: each valid frame, and streams of several frames."""
    v = {name: frame(body) for name, body in VALID.items()}
    seeds = {"seed-" + name: data for name, data in v.items()}
    seeds["stream-handshake"] = v["hello_full"] + v["welcome"]
    seeds["stream-tasks"] = v["task_small"] + v["task_binary_payload"] + v["task_empty_payload"]
    seeds["stream-worker"] = (v["done_success"] + v["extend"] + v["heartbeat"]
                              + v["done_retry_after"] + v["stop"])
    seeds["stream-dispatcher"] = (v["welcome"] + v["task_small"] + v["cancel"] + v["heartbeat"]
                                  + v["stop"] + v["error_empty"])
    seeds["stream-producer"] = (v["hello_producer"] + v["submit_full"] + v["heartbeat"]
                                + v["submit_one"])
    seeds["stream-submit-answers"] = (v["welcome"] + v["submitted_ok"] + v["outcome_successful"]
                                      + v["submitted_unavailable"] + v["outcome_failed"])
    seeds["stream-inventory"] = (v["welcome"] + v["holding_several"] + v["done_success"]
                                 + v["confirm_several"] + v["cancel"] + v["heartbeat"])
    seeds["stream-progress"] = (v["hello_full"] + v["progress_message"] + v["extend"]
                                + v["progress_utf8"] + v["done_success"])
    seeds["stream-partial"] = v["task_small"] + v["done_success"][:10]
    seeds["stream-bad-middle"] = v["heartbeat"] + INVALID["unknown_type"] + v["heartbeat"]
    seeds["stream-too-big"] = v["heartbeat"] + struct.pack(">I", FUZZ_MAX_BODY + 1) + b"\x10"
    return seeds


def outputs():
    """Every file the script owns: {path: bytes}."""
    files = {}
    for name, body in VALID.items():
        files[VALID_DIR / (name + ".bin")] = frame(body)
    for name, data in INVALID.items():
        files[INVALID_DIR / (name + ".bin")] = data
    for name, data in corpus().items():
        files[CORPUS_DIR / (name + ".bin")] = data
    return files


def main(argv):
    check = argv[1:] == ["--check"]
    if argv[1:] and not check:
        print(__doc__, file=sys.stderr)
        return 2
    files = outputs()
    dirs = (VALID_DIR, INVALID_DIR, CORPUS_DIR)
    stale = [p for d in dirs if d.is_dir() for p in sorted(d.glob("*.bin")) if p not in files]
    if check:
        bad = [p for p, data in files.items() if not p.is_file() or p.read_bytes() != data]
        for p in bad + stale:
            print(f"gen_frames: {p} is out of date", file=sys.stderr)
        return 1 if bad or stale else 0
    for p in stale:
        p.unlink()
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    for p, data in sorted(files.items()):
        p.write_bytes(data)
    print(f"gen_frames: wrote {len(VALID)} valid, {len(INVALID)} invalid, "
          f"{len(files) - len(VALID) - len(INVALID)} corpus files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
