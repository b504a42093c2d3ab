package dev.taskpush.wire;

import static dev.taskpush.TapRunner.check;

import dev.taskpush.TapRunner.TestContext;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.stream.Stream;

/**
 * The codec: the golden frames of tests/data/frames (tests/conformance/README.md), valid ones
 * decoded and encoded back byte for byte, invalid ones refused, as by the C codec
 * (tests/unit/test_proto.c), the Python one and the Go one; and the bounds of hostile input.
 */
public final class WireTest {
    private WireTest() {}

    static Path framesDir(String kind) {
        String root = System.getenv("TASKPUSH_SOURCE_ROOT");
        if (root == null || root.isEmpty()) root = "../..";
        return Path.of(root, "tests", "data", "frames", kind);
    }

    record Golden(String name, byte[] data) {}

    static List<Golden> load(String kind, int atLeast) throws IOException {
        List<Golden> out = new ArrayList<>();
        try (Stream<Path> s = Files.list(framesDir(kind))) {
            for (Path p : s.filter(p -> p.toString().endsWith(".bin")).sorted().toList())
                out.add(new Golden(p.getFileName().toString(), Files.readAllBytes(p)));
        }
        check(out.size() >= atLeast, out.size() + " golden frames in " + framesDir(kind) + ", expected " + atLeast);
        return out;
    }

    static String head(byte[] b) {
        return HexFormat.of().formatHex(b, 0, Math.min(b.length, 64));
    }

    public static void testGoldenValidRoundTrip(TestContext t) throws IOException {
        List<String> bad = new ArrayList<>();
        for (Golden g : load("valid", 20)) {
            Wire.Status st = Wire.check(g.data(), g.data().length, Wire.MAX_BODY_DEFAULT);
            if (st != Wire.Status.OK || Wire.prefix(g.data()) + 4 != g.data().length) {
                bad.add(g.name() + ": " + st);
                continue;
            }
            try {
                byte[] out = Wire.encode(Wire.decode(Arrays.copyOfRange(g.data(), 4, g.data().length)));
                if (!Arrays.equals(out, g.data())) bad.add(g.name() + ": re-encoded " + head(out) + " want " + head(g.data()));
            } catch (BadFrameException e) {
                bad.add(g.name() + ": " + e.getMessage());
            }
        }
        check(bad.isEmpty(), String.join("\n", bad));
    }

    public static void testGoldenInvalidRefused(TestContext t) throws IOException {
        List<String> bad = new ArrayList<>();
        for (Golden g : load("invalid", 30)) {
            Wire.Status st = Wire.check(g.data(), g.data().length, Wire.MAX_BODY_DEFAULT);
            switch (st) {
                case OK -> {
                    int n = (int) Wire.prefix(g.data());
                    try {
                        Wire.Message m = Wire.decode(Arrays.copyOfRange(g.data(), 4, 4 + n));
                        bad.add(g.name() + " decoded as " + m);
                    } catch (BadFrameException expected) {
                        // refused
                    }
                }
                case BAD, TOO_BIG -> {
                    try {
                        new FrameReader(new ByteArrayInputStream(g.data()), Wire.MAX_BODY_DEFAULT).readBody();
                        bad.add(g.name() + ": the reader took it");
                    } catch (BadFrameException expected) {
                        // refused from the prefix
                    }
                }
                default -> bad.add(g.name() + ": " + st + ": not a whole frame");
            }
        }
        check(bad.isEmpty(), String.join("\n", bad));
    }

    /** Reads one byte per call, as a slow socket would. */
    static final class OneByte extends InputStream {
        final InputStream in;
        OneByte(InputStream in) { this.in = in; }
        @Override public int read() throws IOException { return in.read(); }
        @Override public int read(byte[] b, int off, int len) throws IOException {
            return len == 0 ? 0 : in.read(b, off, 1);
        }
    }

    public static void testGoldenStreamOneByteReads(TestContext t) throws IOException {
        List<Golden> gs = load("valid", 20);
        ByteArrayOutputStream all = new ByteArrayOutputStream();
        for (Golden g : gs) all.write(g.data());
        FrameReader r = new FrameReader(new OneByte(new ByteArrayInputStream(all.toByteArray())), Wire.MAX_BODY_DEFAULT);
        for (Golden g : gs) {
            byte[] body = r.readBody();
            check(body != null && Arrays.equals(body, Arrays.copyOfRange(g.data(), 4, g.data().length)), g.name());
        }
        check(r.readBody() == null, "a frame after the last one");
    }

    static Wire.Message golden(String name) throws IOException {
        byte[] b = Files.readAllBytes(framesDir("valid").resolve(name));
        return Wire.decode(Arrays.copyOfRange(b, 4, b.length));
    }

    public static void testGoldenFields(TestContext t) throws IOException {
        Wire.Task k = (Wire.Task) golden("task_small.bin");
        check(k.delivery().taskId() == 0x0102030405060708L && k.delivery().epoch() == 3 && k.delivery().attempt() == 1
                && k.timeoutMs() == 30000 && k.priority() == 1
                && new String(k.taskType(), StandardCharsets.UTF_8).equals("resize")
                && new String(k.payload(), StandardCharsets.UTF_8).startsWith("{\"w\":"), "task_small: " + k);
        check(((Wire.Confirm) golden("confirm_max.bin")).deliveries().size() == Wire.MAX_CONFIRM, "confirm_max");
        check(((Wire.Submit) golden("submit_1000.bin")).tasks().size() == Wire.MAX_SUBMIT_TASKS, "submit_1000");
        Wire.Welcome w = (Wire.Welcome) golden("welcome.bin");
        check(w.version() >= 1 && w.heartbeatMs() > 0, "welcome: " + w);
    }

    static void refusedToEncode(Wire.Message m, String what) {
        try {
            Wire.encode(m);
            throw new AssertionError("encoded " + what);
        } catch (BadFrameException expected) {
            // refused
        }
    }

    static final byte[] NONE = new byte[0];

    static byte[] bytes(String s) { return s.getBytes(StandardCharsets.UTF_8); }

    /** The encoder refuses what a decoder would refuse: each bound, one case each. */
    public static void testEncodeBounds(TestContext t) throws IOException {
        Wire.Delivery d = new Wire.Delivery(1, 1, 1);
        refusedToEncode(new Wire.Hello(3, 1, NONE, NONE, List.of()), "a worker with no type");
        refusedToEncode(new Wire.Hello(1, 0, NONE, NONE, List.of()), "a producer in version 1");
        refusedToEncode(new Wire.Hello(3, 0, NONE, NONE, List.of(bytes("a"))), "capacity 0 with a type");
        List<byte[]> many = new ArrayList<>();
        for (int i = 0; i <= Wire.MAX_TYPES; i++) many.add(bytes("t" + i));
        refusedToEncode(new Wire.Hello(3, 1, NONE, NONE, many), "65 types");
        refusedToEncode(new Wire.Hello(3, 1, new byte[257], NONE, List.of(bytes("a"))), "a 257-byte name");
        refusedToEncode(new Wire.Hello(3, 1, NONE, new byte[1025], List.of(bytes("a"))), "a 1025-byte token");
        refusedToEncode(new Wire.Hello(3, 1, NONE, NONE, List.of(NONE)), "an empty type");
        refusedToEncode(new Wire.Hello(3, 1, NONE, NONE, List.of(new byte[257])), "a 257-byte type");
        refusedToEncode(new Wire.Task(d, 0, 3, bytes("a"), NONE), "priority 3");
        refusedToEncode(new Wire.Done(d, 4, 0, NONE), "outcome 4");
        refusedToEncode(new Wire.Done(d, 0, 0, new byte[Wire.MAX_BODY_DEFAULT]), "a body over the limit");
        refusedToEncode(new Wire.Extend(d, 1L << 32), "extend 2^32 ms");
        refusedToEncode(new Wire.Confirm(List.of()), "an empty CONFIRM");
        List<Wire.Delivery> ds = new ArrayList<>();
        for (int i = 0; i <= Wire.MAX_CONFIRM; i++) ds.add(d);
        refusedToEncode(new Wire.Holding(ds), "1025 HOLDING entries");
        Wire.SubmitTask ok = new Wire.SubmitTask(1, 0, 0, 0, bytes("a"), NONE, NONE, NONE);
        refusedToEncode(new Wire.Submit(1, 0, List.of()), "no task");
        refusedToEncode(new Wire.Submit(1, 0x08, List.of(ok)), "flag 0x08");
        refusedToEncode(new Wire.Submit(1, 0, List.of(new Wire.SubmitTask(1, 0, 0, 0, bytes("a"), NONE, NONE, NONE, new long[] {7}))), "after ids without their flag");
        refusedToEncode(new Wire.Submit(1, Wire.SUBMIT_AFTER, List.of(new Wire.SubmitTask(1, 0, 0, 0, bytes("a"), NONE, NONE, NONE, new long[0x10000]))), "65536 after ids");
        refusedToEncode(new Wire.Submit(1, 0, List.of(new Wire.SubmitTask(1, 1001, 0, 0, bytes("a"), NONE, NONE, NONE))), "1001 attempts");
        refusedToEncode(new Wire.Submit(1, 0, List.of(new Wire.SubmitTask(1, 0, 0, 0, bytes("a"), new byte[192], NONE, NONE))), "a 192-byte dedup key");
        refusedToEncode(new Wire.Submit(1, 0, List.of(new Wire.SubmitTask(1, 0, 0, 0, bytes("a"), NONE, NONE, bytes("g")))), "a group key without its flag");
        refusedToEncode(new Wire.Submitted(1, 0, List.of(), NONE), "OK with no result");
        refusedToEncode(new Wire.Submitted(1, 1, List.of(new Wire.SubmitResult(0, 1)), NONE), "INVALID with a result");
        refusedToEncode(new Wire.Outcome(1, 1, 1, NONE), "outcome state 1");
        refusedToEncode(new Wire.Progress(d, 1001, NONE), "1001 permille");
        refusedToEncode(new Wire.Progress(d, 1, new byte[] {'a', 0}), "a NUL in a progress message");
        // And what is in bounds round-trips, at each bound.
        for (Wire.Message m : List.of(
                new Wire.Hello(3, 0xFFFFFFFFL, new byte[256], new byte[1024], List.of(new byte[256])),
                new Wire.Hello(2, 0, NONE, NONE, List.of()),
                new Wire.Task(new Wire.Delivery(-1, -1, -1), 0xFFFFFFFFL, 2, bytes("t"), new byte[] {0, (byte) 0xFF}),
                new Wire.Extend(d, 0xFFFFFFFFL), new Wire.Holding(ds.subList(0, Wire.MAX_CONFIRM)),
                new Wire.Progress(d, 1000, bytes("héllo")))) {
            byte[] f = Wire.encode(m);
            check(Arrays.equals(Wire.encode(Wire.decode(Arrays.copyOfRange(f, 4, f.length))), f), "round trip of " + m);
        }
        Wire.Task back = (Wire.Task) Wire.decode(Arrays.copyOfRange(
                Wire.encode(new Wire.Task(new Wire.Delivery(-1, -1, -1), 1, 0, bytes("t"), NONE)), 4, 4 + 1 + 16 + 4 + 1 + 3));
        check(Long.toUnsignedString(back.delivery().taskId()).equals("18446744073709551615")
                && Integer.toUnsignedLong(back.delivery().attempt()) == 0xFFFFFFFFL, "unsigned fields: " + back);
    }

    /** Hostile counts and lengths: refused before anything of that size is allocated or read. */
    public static void testHostileCounts(TestContext t) throws IOException {
        // SUBMIT claiming 1000 tasks in a 10-byte body.
        byte[] submit = {0x20, 0, 0, 0, 1, 0, 0x03, (byte) 0xE8, 0, 0};
        expectBad(submit, "1000 tasks in a short body");
        // SUBMITTED claiming 1000 results in 10 bytes.
        expectBad(new byte[] {0x21, 0, 0, 0, 1, 0, 0, 0x03, (byte) 0xE8, 0}, "1000 results in a short body");
        // CONFIRM of 65535 entries.
        expectBad(new byte[] {0x14, (byte) 0xFF, (byte) 0xFF}, "65535 confirms");
        // A string length past the end.
        expectBad(new byte[] {0x02, 0, 3, 0, 0, 0, 1, 0, 0, 0, 1, (byte) 0xFF, (byte) 0xFF}, "a server name past the end");
        // The reader: a 4 GB prefix is refused without reading on; "HTTP" kept.
        byte[] http = bytes("HTTP/1.0 400 Bad Request\r\n");
        try {
            new FrameReader(new ByteArrayInputStream(http), 65536).readBody();
            throw new AssertionError("an HTTP answer read as a frame");
        } catch (FrameReader.TooBigException e) {
            check(new String(e.prefix(), StandardCharsets.US_ASCII).equals("HTTP"), "prefix kept");
        }
        try {
            new FrameReader(new ByteArrayInputStream(new byte[] {0, 0, 0, 5, 3}), 100).readBody();
            throw new AssertionError("a cut frame read");
        } catch (java.io.EOFException expected) {
            // cut inside a frame
        }
    }

    static void expectBad(byte[] body, String what) {
        try {
            Wire.decode(body);
            throw new AssertionError("decoded " + what);
        } catch (BadFrameException expected) {
            // refused
        }
    }
}
