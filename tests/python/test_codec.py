"""test_codec: the Python codec against the golden frames of tests/data/frames.

Cases:
  valid_roundtrip     every file of valid/ is one whole frame that decodes, and
                      encodes back byte for byte
  invalid_rejected    every file of invalid/ is TOO_BIG or BAD (prefix or body)
  stream_split        the valid frames concatenated and fed one byte at a time come
                      out as the same bodies, in order
  fields              field values of a few golden frames (as tests/unit/test_proto.c),
                      CONFIRM and HOLDING (version 3) among them
  encoder_refuses     an encoder refuses what a decoder refuses
  readme_examples     every ```python block of python/README.md compiles
  submit_layout       SUBMIT, SUBMITTED and OUTCOME (protocol version 2) encode to the
                      bytes of the agreed layout, written out by hand here, and back
  inventory_layout    CONFIRM and HOLDING (protocol version 3) encode to the bytes of
                      the agreed layout, written out by hand, and back; 1 and 1024
                      entries pass, 0 and 1025 entries, a short entry and a byte after
                      the last entry are BadFrame in both directions
  outcomes_bound      the kept outcomes of a worker (taskpush.inventory) drop the oldest
                      past their limit, with a WARNING log record naming it; CONFIRM
                      forgets only what it names; HOLDING frames split at 1024 entries
  backoff             reconnect delays double from the minimum, stay within [ceiling/2,
                      ceiling] (jitter), stop growing at the maximum, and restart on reset
  addresses           HOST:PORT lists (IPv6 in brackets) parse; bad ones are refused
"""
import logging
import pathlib
import struct
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tplib  # noqa: E402

from taskpush import inventory, proto, session  # noqa: E402

FRAMES = tplib.SOURCE_ROOT / "tests" / "data" / "frames"


def files(kind: str) -> list:
    return sorted((FRAMES / kind).glob("*.bin"))


class Codec(unittest.TestCase):
    def test_valid_roundtrip(self) -> None:
        fs = files("valid")
        self.assertGreaterEqual(len(fs), 20, "golden frames missing")
        for f in fs:
            with self.subTest(frame=f.name):
                data = f.read_bytes()
                st, n = proto.frame_check(data, proto.MAX_BODY_DEFAULT)
                self.assertEqual(st, proto.OK)
                self.assertEqual(proto.LEN_PREFIX + n, len(data))
                m = proto.decode(data[proto.LEN_PREFIX:])
                self.assertEqual(proto.encode(m), data)
                self.assertEqual(proto.decode(proto.encode_body(m)), m)

    def test_invalid_rejected(self) -> None:
        fs = files("invalid")
        self.assertGreaterEqual(len(fs), 30, "golden frames missing")
        for f in fs:
            with self.subTest(frame=f.name):
                data = f.read_bytes()
                st, n = proto.frame_check(data, proto.MAX_BODY_DEFAULT)
                if st == proto.OK:
                    with self.assertRaises(proto.BadFrame):
                        proto.decode(data[proto.LEN_PREFIX:proto.LEN_PREFIX + n])
                else:
                    self.assertIn(st, (proto.BAD, proto.TOO_BIG))
                    fb = proto.FrameBuffer()
                    fb.feed(data)
                    with self.assertRaises(proto.BadFrame):
                        fb.next_body()

    def test_stream_split(self) -> None:
        datas = [f.read_bytes() for f in files("valid")]
        fb = proto.FrameBuffer()
        got = []
        for byte in b"".join(datas):
            fb.feed(bytes([byte]))
            body = fb.next_body()
            if body is not None:
                got.append(body)
        self.assertIsNone(fb.next_body())
        self.assertEqual(got, [d[proto.LEN_PREFIX:] for d in datas])

    def test_fields(self) -> None:
        t = proto.decode((FRAMES / "valid" / "task_small.bin").read_bytes()[4:])
        self.assertEqual(t, proto.Task(0x0102030405060708, 3, 1, 30000, 1, b"resize", b'{"w":640,"h":480}'))
        d = proto.decode((FRAMES / "valid" / "done_retry_after.bin").read_bytes()[4:])
        self.assertEqual(d, proto.Done(11, 4, 2, proto.RETRY_AFTER, 15000, b"rate limited"))
        h = proto.decode((FRAMES / "valid" / "hello_max_bounds.bin").read_bytes()[4:])
        assert isinstance(h, proto.Hello)
        self.assertEqual((h.capacity, len(h.types), len(h.name), len(h.token)), (0xFFFFFFFF, 64, 256, 1024))
        c = proto.decode((FRAMES / "valid" / "confirm_several.bin").read_bytes()[4:])
        self.assertEqual(c, proto.Confirm([(101, 7, 1), (102, 7, 2), (2**64 - 1, 2**32 - 1, 2**32 - 1)]))
        self.assertEqual(proto.decode((FRAMES / "valid" / "holding_one.bin").read_bytes()[4:]),
                         proto.Holding([(42, 5, 2)]))
        m = proto.decode((FRAMES / "valid" / "holding_max.bin").read_bytes()[4:])
        assert isinstance(m, proto.Holding)
        self.assertEqual(len(m.deliveries), proto.MAX_CONFIRM)
        w = proto.decode((FRAMES / "valid" / "welcome.bin").read_bytes()[4:])
        self.assertEqual(w, proto.Welcome(w.version, 5000, proto.MAX_BODY_DEFAULT, b"taskpushd 0.1.0"))
        g = proto.decode((FRAMES / "valid" / "submit_group_key.bin").read_bytes()[4:])
        assert isinstance(g, proto.Submit)
        self.assertEqual(g.flags, proto.SUBMIT_FLAG_WAIT | proto.SUBMIT_FLAG_GROUP_KEY)
        self.assertEqual([t.group_key for t in g.tasks], [b"host-a", b"", b"g" * 191])

    def test_encoder_refuses(self) -> None:
        bad = [
            proto.Hello(1, 0, b"w", b"", [b"echo"]),           # capacity 0
            proto.Hello(1, 1, b"w", b"", []),                  # no type in version 1
            proto.Hello(2, 1, b"w", b"", []),                  # producer-only needs capacity 0
            proto.Hello(1, 1, b"w", b"", [b""]),               # empty type
            proto.Hello(1, 1, b"n" * 257, b"", [b"t"]),
            proto.Hello(1, 1, b"w", b"k" * 1025, [b"t"]),
            proto.Hello(1, 1, b"w", b"", [b"t%d" % i for i in range(65)]),
            proto.Task(1, 1, 1, 1, 3, b"t", b""),              # priority 3
            proto.Task(1, 1, 1, 1, 0, b"x" * 257, b""),
            proto.Task(1 << 64, 1, 1, 1, 0, b"t", b""),        # id beyond u64
            proto.Done(1, 1, 1, 4, 0, b""),                    # outcome 4
            proto.Welcome(1, 1, 1, b"s" * 257),
            proto.Submit(1, 8, [proto.SubmitTask(b"t")]),      # unknown flag
            proto.Submit(1, proto.SUBMIT_FLAG_AFTER, [proto.SubmitTask(b"t", after=[1 << 64])]),  # id beyond u64
            proto.Submit(1, proto.SUBMIT_FLAG_GROUP_KEY, [proto.SubmitTask(b"t", group_key=b"g" * 192)]),
            proto.Submit(1, 0, []),
            proto.Submit(1, 0, [proto.SubmitTask(b"t")] * 1001),
            proto.Submit(1, 0, [proto.SubmitTask(b"t", priority=3)]),
            proto.Submit(1, 0, [proto.SubmitTask(b"t", max_attempts=1001)]),
            proto.Submit(1, 0, [proto.SubmitTask(b"t", dedup_key=b"k" * 192)]),
            proto.Submit(1, 0, [proto.SubmitTask(b"")]),
            proto.Submitted(1, proto.SUBMITTED_INVALID, [proto.SubmitResult(0, 1)]),
            proto.Submitted(1, 0, [proto.SubmitResult(2, 1)]),
            proto.Submitted(1, proto.SUBMITTED_OK, []),        # OK answers every entry
            proto.Submitted(1, 3, []),                         # unknown status
            proto.Outcome(1, 1, 1, b""),                       # state PROCESSING
            proto.Confirm([]),                                 # 1 .. 1024 entries
            proto.Holding([]),
            proto.Confirm([(1, 1, 1)] * 1025),
            proto.Holding([(1, 1, 1)] * 1025),
            proto.Confirm([(1 << 64, 1, 1)]),
            proto.Holding([(1, 1 << 32, 1)]),
            proto.Holding([(1, 1, -1)]),
        ]
        for m in bad:
            with self.subTest(msg=repr(m)[:80]):
                with self.assertRaises(proto.BadFrame):
                    proto.encode(m)
        # A producer-only HELLO is valid in version 2 only.
        self.assertEqual(proto.decode(proto.encode_body(proto.Hello(2, 0, b"p", b"", []))),
                         proto.Hello(2, 0, b"p", b"", []))

    def test_readme_examples(self) -> None:
        text = (tplib.SOURCE_ROOT / "python" / "README.md").read_text()
        blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
        self.assertGreaterEqual(len(blocks), 2)
        for i, b in enumerate(blocks):
            compile(b, f"python/README.md block {i + 1}", "exec")

    def test_submit_layout(self) -> None:
        sub = proto.Submit(0x01020304, proto.SUBMIT_FLAG_WAIT, [
            proto.SubmitTask(b"crawl", b"http://a/", 2, 5, 1500, 30000, b"http://a/"),
            proto.SubmitTask(b"x", b"", 0, 0, 0, 0, b""),
        ])
        want = (bytes([0x20]) + bytes.fromhex("01020304") + b"\x01" + b"\x00\x02"
                + b"\x02" + b"\x00\x05" + struct.pack(">I", 1500) + struct.pack(">I", 30000)
                + b"\x00\x05crawl" + b"\x00\x09http://a/" + b"\x00\x00\x00\x09http://a/"
                + b"\x00" + b"\x00\x00" + b"\x00" * 8 + b"\x00\x01x" + b"\x00\x00" + b"\x00" * 4)
        self.assertEqual(proto.encode_body(sub), want)
        self.assertEqual(proto.decode(want), sub)
        self.assertRaises(proto.BadFrame, proto.decode, want + b"\x00")
        self.assertRaises(proto.BadFrame, proto.decode, want[:-1])

        ok = proto.Submitted(7, proto.SUBMITTED_OK, [proto.SubmitResult(0, 42), proto.SubmitResult(1, 9)])
        want = (bytes([0x21]) + b"\x00\x00\x00\x07" + b"\x00\x00" + b"\x00\x02"
                + b"\x00" + (42).to_bytes(8, "big") + b"\x01" + (9).to_bytes(8, "big"))
        self.assertEqual(proto.encode_body(ok), want)
        self.assertEqual(proto.decode(want), ok)
        self.assertRaises(proto.BadFrame, proto.decode, want[:-1])
        inval = proto.Submitted(8, proto.SUBMITTED_INVALID, [], b"bad type")
        self.assertEqual(proto.encode_body(inval), b"\x21\x00\x00\x00\x08\x00\x01\x00\x00bad type")
        self.assertEqual(proto.decode(proto.encode_body(inval)), inval)

        out = proto.Outcome(7, 42, proto.STATE_FAILED, b"boom")
        want = b"\x22\x00\x00\x00\x07" + (42).to_bytes(8, "big") + b"\x03boom"
        self.assertEqual(proto.encode_body(out), want)
        self.assertEqual(proto.decode(want), out)
        self.assertRaises(proto.BadFrame, proto.decode, want[:13])


    def test_inventory_layout(self) -> None:
        entries = [(0x0102030405060708, 3, 1), (9, 0xFFFFFFFF, 7)]
        raw = b"".join(struct.pack(">QII", *e) for e in entries)
        for t, cls in ((0x14, proto.Confirm), (0x15, proto.Holding)):
            with self.subTest(frame=cls.__name__):
                want = bytes([t]) + b"\x00\x02" + raw
                m = cls(entries)
                self.assertEqual(proto.encode_body(m), want)
                self.assertEqual(proto.decode(want), m)
                self.assertEqual(proto.encode(m), struct.pack(">I", 3 + 32) + want)
                for bad in (want[:-1], want + b"\x00", bytes([t]) + b"\x00\x00",
                            bytes([t]) + b"\x04\x01" + raw * 513, bytes([t]) + b"\x00"):
                    self.assertRaises(proto.BadFrame, proto.decode, bad)
                full = cls([(i, i, i) for i in range(1024)])
                self.assertEqual(proto.decode(proto.encode_body(full)), full)
                self.assertEqual(len(proto.encode_body(full)), 3 + 16 * 1024)
        self.assertEqual(proto.type_name(proto.CONFIRM), "CONFIRM")
        self.assertEqual(proto.type_name(proto.HOLDING), "HOLDING")


class Pieces(unittest.TestCase):
    def test_backoff(self) -> None:
        b = session.Backoff(100, 1000)
        for ceiling in (100, 200, 400, 800, 1000, 1000, 1000):
            d = b.next_s() * 1000
            self.assertTrue(ceiling / 2 <= d <= ceiling, (d, ceiling))
        b.reset()
        self.assertLessEqual(b.next_s(), 0.1)
        draws = {session.Backoff(100, 1000).next_s() for _ in range(50)}
        self.assertGreater(len(draws), 1, "no jitter")
        self.assertRaises(ValueError, session.Backoff, 0, 10)
        self.assertRaises(ValueError, session.Backoff, 10, 5)

    def test_outcomes_bound(self) -> None:
        log = logging.getLogger("test.outcomes")
        kept = inventory.Outcomes(3, log)
        dones = [proto.Done(i, 5, 1, proto.SUCCESS, 0, b"r%d" % i) for i in range(1, 6)]
        for d in dones[:3]:
            kept.keep(d)
        with self.assertLogs(log, logging.WARNING) as cm:
            kept.keep(dones[3])
            kept.keep(dones[4])
        self.assertEqual(len(cm.records), 2)
        self.assertIn("task 1 (epoch 5, attempt 1)", cm.output[0])
        self.assertEqual(kept.pending(), dones[2:])
        self.assertEqual(kept.evicted, 2)
        kept.keep(dones[2])  # a DONE made again (same delivery) moves to the end, no copy
        self.assertEqual(kept.pending(), [dones[3], dones[4], dones[2]])
        self.assertEqual(kept.confirm([(4, 5, 1), (4, 5, 1), (3, 5, 2), (99, 5, 1)]), 1)
        self.assertEqual(kept.pending(), [dones[4], dones[2]])
        self.assertEqual(inventory.outcome_limit(8), 4 * 8 + 1024)
        self.assertRaises(ValueError, inventory.Outcomes, 0, log)
        keys = [(i, 1, 1) for i in range(2049)]
        frames = inventory.holding_frames(keys)
        self.assertEqual([len(f.deliveries) for f in frames], [1024, 1024, 1])
        self.assertEqual([k for f in frames for k in f.deliveries], keys)
        self.assertEqual(inventory.holding_frames([]), [])

    def test_addresses(self) -> None:
        self.assertEqual(session.parse_addresses("127.0.0.1:7070, [::1]:7071,host.example:1"),
                         [("127.0.0.1", 7070), ("::1", 7071), ("host.example", 1)])
        self.assertEqual(session.parse_addresses(["a:1"]), [("a", 1)])
        for bad in ("", "a", "a:", ":1", "a:0", "a:65536", "a:x", "::1:7070", "[::1]7070", "http://a:1"):
            with self.subTest(address=bad):
                self.assertRaises(ValueError, session.parse_addresses, bad)


if __name__ == "__main__":
    tplib.tap_main("test_codec")
