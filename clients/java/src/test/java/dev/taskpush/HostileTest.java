package dev.taskpush;

import static dev.taskpush.Harness.has;
import static dev.taskpush.Harness.opts;
import static dev.taskpush.Harness.started;
import static dev.taskpush.Harness.waitFor;
import static dev.taskpush.TapRunner.check;

import dev.taskpush.TapRunner.TestContext;
import dev.taskpush.wire.FrameReader;
import dev.taskpush.wire.Wire;
import java.io.BufferedInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The worker against raw peers on loopback TCP that break the protocol (as the C tests' fake
 * dispatcher and the Go module's hostile_test.go): every byte from the socket is hostile.
 */
public final class HostileTest {
    private HostileTest() {}

    interface Script {
        void run(Socket c, FrameReader r, Wire.Hello hello) throws IOException;
    }

    /** Accepts connections and runs script on each after reading its HELLO; returns HOST:PORT. */
    static String rawPeer(TestContext t, AtomicInteger accepted, Script script) throws IOException {
        ServerSocket l = new ServerSocket(0, 16, InetAddress.getByName("127.0.0.1"));
        t.cleanup(l);
        Thread acceptor = new Thread(() -> {
            while (true) {
                Socket c;
                try {
                    c = l.accept();
                } catch (IOException e) {
                    return;
                }
                accepted.incrementAndGet();
                Thread h = new Thread(() -> {
                    try (c) {
                        c.setSoTimeout((int) Harness.WAIT.toMillis());
                        FrameReader r = new FrameReader(new BufferedInputStream(c.getInputStream()), Wire.MAX_BODY_DEFAULT);
                        if (r.read() instanceof Wire.Hello hello) script.run(c, r, hello);
                    } catch (IOException ignored) {
                        // the worker went away
                    }
                });
                h.setDaemon(true);
                h.start();
            }
        });
        acceptor.setDaemon(true);
        acceptor.start();
        return "127.0.0.1:" + l.getLocalPort();
    }

    static void write(Socket c, Wire.Message m) throws IOException {
        OutputStream os = c.getOutputStream();
        os.write(Wire.encode(m));
        os.flush();
    }

    static Wire.Welcome welcome(int version) {
        return new Wire.Welcome(version, 1000, Wire.MAX_BODY_DEFAULT, "raw".getBytes(StandardCharsets.UTF_8));
    }

    /** Reads until an ERROR frame and returns its code (0 if none came). */
    static int expectError(FrameReader r) {
        try {
            while (true) {
                Wire.Message m = r.read();
                if (m == null) return 0;
                if (m instanceof Wire.ErrorFrame e) return e.code();
            }
        } catch (IOException e) {
            return 0;
        }
    }

    static void drainUntilClosed(FrameReader r) {
        try {
            while (r.read() != null) {
                // discard
            }
        } catch (IOException ignored) {
            // closed
        }
    }

    static Worker runAgainst(TestContext t, String addr, List<String> log) {
        return started(t, Worker.builder(addr).options(opts(t, log).build()).handle("t", 2, task -> null).build());
    }

    public static void testHostileHttpAnswer(TestContext t) throws Exception {
        String addr = rawPeer(t, new AtomicInteger(), (c, r, h) -> {
            c.getOutputStream().write("HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nno\n".getBytes(StandardCharsets.US_ASCII));
        });
        List<String> log = Collections.synchronizedList(new ArrayList<>());
        runAgainst(t, addr, log);
        waitFor("the HTTP answer recognised", () -> has(log, "an HTTP server answered"));
    }

    /**
     * A length prefix over the limit, a zero length, a TASK of priority 3, a HOLDING from the
     * dispatcher: each is answered ERROR (BAD_FRAME or UNEXPECTED) and a close, then the worker
     * connects again.
     */
    public static void testHostileFrames(TestContext t) throws Exception {
        byte[] task = Wire.encode(new Wire.Task(new Wire.Delivery(1, 1, 1), 0, 2, "t".getBytes(StandardCharsets.UTF_8), new byte[0]));
        task[4 + 21] = 3;
        long big = Wire.MAX_BODY_DEFAULT + 1L;
        Object[][] cases = {
            {"too big", new byte[] {(byte) (big >>> 24), (byte) (big >>> 16), (byte) (big >>> 8), (byte) big}, Wire.ERR_BAD_FRAME},
            {"zero length", new byte[] {0, 0, 0, 0}, Wire.ERR_BAD_FRAME},
            {"task priority 3", task, Wire.ERR_BAD_FRAME},
            {"HOLDING from the dispatcher", Wire.encode(new Wire.Holding(List.of(new Wire.Delivery(1, 0, 0)))), Wire.ERR_UNEXPECTED},
        };
        for (Object[] k : cases) {
            BlockingQueue<Integer> codes = new ArrayBlockingQueue<>(16);
            AtomicInteger accepted = new AtomicInteger();
            String addr = rawPeer(t, accepted, (c, r, h) -> {
                write(c, welcome(h.version()));
                c.getOutputStream().write((byte[]) k[1]);
                c.getOutputStream().flush();
                codes.offer(expectError(r));
            });
            List<String> log = Collections.synchronizedList(new ArrayList<>());
            Worker w = runAgainst(t, addr, log);
            Integer got = codes.poll(Harness.WAIT.toSeconds(), TimeUnit.SECONDS);
            check(got != null, k[0] + ": no ERROR from the worker");
            check(got == (int) k[2], k[0] + ": the worker answered ERROR " + got + ", want " + k[2]);
            waitFor(k[0] + ": a second connection", () -> accepted.get() >= 2);
            w.abort();
        }
    }

    /** A WELCOME of a newer version than the HELLO's: the session speaks the worker's (3); one below in its own. */
    public static void testWelcomeVersions(TestContext t) throws Exception {
        for (int[] k : new int[][] {{4, 3}, {2, 2}}) {
            String addr = rawPeer(t, new AtomicInteger(), (c, r, h) -> {
                write(c, welcome(k[0]));
                drainUntilClosed(r);
            });
            Worker w = runAgainst(t, addr, new ArrayList<>());
            waitFor("a session", () -> w.connectedVersion() != 0);
            check(w.connectedVersion() == k[1], "WELCOME " + k[0] + ": session version " + w.connectedVersion() + ", want " + k[1]);
            w.abort();
        }
    }

    /** ERROR VERSION to a HELLO of version 3: the worker asks again in 2 and speaks it. */
    public static void testVersionFallback(TestContext t) throws Exception {
        List<Integer> offered = Collections.synchronizedList(new ArrayList<>());
        String addr = rawPeer(t, new AtomicInteger(), (c, r, h) -> {
            offered.add(h.version());
            if (h.version() > 2) {
                write(c, new Wire.ErrorFrame(Wire.ERR_VERSION, "version 1 or 2".getBytes(StandardCharsets.UTF_8)));
                return;
            }
            write(c, welcome(h.version()));
            drainUntilClosed(r);
        });
        Worker w = runAgainst(t, addr, new ArrayList<>());
        waitFor("a session", () -> w.connectedVersion() != 0);
        check(w.connectedVersion() == 2 && offered.equals(List.of(3, 2)), "offered " + offered + ", session " + w.connectedVersion());
    }

    /** The outcome fitted to max_body: a result too large fails for good saying so; an error text is cut at a UTF-8 boundary. */
    public static void testOutcomeFit(TestContext t) {
        Wire.Delivery d = new Wire.Delivery(1, 1, 1);
        Wire.Done big = Worker.fit(new Wire.Done(d, Wire.OUTCOME_SUCCESS, 0, new byte[100]), 50);
        check(big.outcome() == Wire.OUTCOME_FAIL_PERM && new String(big.data(), StandardCharsets.UTF_8).contains("exceeds"), "a big result: " + big);
        byte[] text = "ééééé".getBytes(StandardCharsets.UTF_8); // 10 bytes, 2 per character
        Wire.Done cut = Worker.fit(new Wire.Done(d, Wire.OUTCOME_FAIL_RETRY, 0, text), Wire.DONE_HEAD + 5);
        check(cut.data().length == 4, "cut at a UTF-8 boundary: " + cut.data().length + " bytes");
        Wire.Done same = new Wire.Done(d, Wire.OUTCOME_SUCCESS, 0, new byte[10]);
        check(Worker.fit(same, Wire.MAX_BODY_DEFAULT) == same, "a result that fits is kept");
        String longName = "é".repeat(200); // 400 bytes
        check(Options.builder().name(longName).build().name().getBytes(StandardCharsets.UTF_8).length == 256, "a long name cut to 256 bytes");
        try {
            Options.builder().token("x".repeat(1025)).build();
            throw new AssertionError("a 1025-byte token accepted");
        } catch (IllegalArgumentException expected) {
            // refused
        }
        List<Options.Address> a = Options.parseAddresses("127.0.0.1:7070, [::1]:7071");
        check(a.size() == 2 && a.get(1).host().equals("::1") && a.get(1).port() == 7071, "addresses " + a);
        for (String bad : new String[] {"nohost", ":7070", "h:0", "h:65536", "h:x", ""}) {
            try {
                Options.parseAddresses(bad);
                throw new AssertionError("address '" + bad + "' accepted");
            } catch (IllegalArgumentException expected) {
                // refused
            }
        }
    }
}
