package dev.taskpush;

import dev.taskpush.wire.Wire;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A producer-only connection: it submits tasks and takes none (HELLO with capacity 0, protocol
 * version 2 or later). It connects on the first submit (the addresses tried in turn) and again
 * after the connection is lost. Thread-safe; close it when done.
 */
public final class Client implements AutoCloseable {
    private final List<Options.Address> addrs;
    private final Options opts;
    private final Map<Options.Address, Integer> versions = new HashMap<>();
    private Session cur;
    private Submitter sub;
    private int curIdx;
    private boolean closed;
    private final List<Thread> readers = new ArrayList<>();
    private final AtomicInteger threads = new AtomicInteger();

    public Client(String addresses, Options opts) {
        this.addrs = Options.parseAddresses(addresses);
        this.opts = opts;
        if (opts.protocolVersion < 2) throw new IllegalArgumentException("a producer needs protocol version 2 or later");
    }

    public Client(String addresses) { this(addresses, Options.defaults()); }

    private synchronized Object[] connected() throws SubmitException {
        if (closed) throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "the client is closed");
        if (cur != null && !cur.isClosed()) return new Object[] {cur, sub};
        Wire.Hello hello = new Wire.Hello(Wire.VERSION, 0, opts.name.getBytes(StandardCharsets.UTF_8),
                opts.token.getBytes(StandardCharsets.UTF_8), List.of());
        List<String> errs = new ArrayList<>();
        for (int i = 0; i < addrs.size(); i++) {
            int idx = (curIdx + i) % addrs.size();
            Options.Address a = addrs.get(idx);
            Session c;
            try {
                c = Session.dialNegotiated(a, hello, versions, 2, opts);
            } catch (DispatcherException e) {
                if (e.versionRefused()) throw new SubmitException(SubmitException.Kind.NO_SUBMIT, e.getMessage());
                errs.add(e.getMessage());
                continue;
            } catch (IOException e) {
                errs.add(a + ": " + e.getMessage());
                continue;
            }
            opts.log.accept("producer connected to " + a);
            Submitter s = new Submitter();
            cur = c;
            sub = s;
            curIdx = idx;
            Thread t = new Thread(() -> {
                Exception reason = c.serve(m -> {
                    if (m instanceof Wire.Heartbeat || m instanceof Wire.Stop) return;
                    if (!s.onFrame(m)) throw new IOException("unexpected " + Wire.typeName(m.type()) + " on a producer connection");
                }, r -> {
                    Thread w = new Thread(r, "taskpush-client-io-" + threads.incrementAndGet());
                    w.setDaemon(true);
                    return w;
                });
                opts.log.accept("producer connection to " + a + " ended: " + (reason == null ? "" : reason.getMessage()));
            }, "taskpush-client-" + threads.incrementAndGet());
            t.setDaemon(true);
            t.start();
            readers.add(t);
            return new Object[] {c, s};
        }
        throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "no dispatcher reachable: " + errs);
    }

    /**
     * Inserts tasks in one SUBMIT (1 to 1000) and returns once their rows are committed: a
     * receipt per task, in order. A dispatcher that answers UNAVAILABLE (a standby) committed
     * nothing: the submission goes to the next address at once, each address tried once.
     */
    public List<Receipt> submit(NewTask... tasks) throws SubmitException, InterruptedException {
        return submit(List.of(tasks), false);
    }

    /** {@link #submit} that also waits for each inserted task to end: {@link Receipt#outcome()}. */
    public List<Receipt> submitWait(NewTask... tasks) throws SubmitException, InterruptedException {
        return submit(List.of(tasks), true);
    }

    public List<Receipt> submit(List<NewTask> tasks, boolean wait) throws SubmitException, InterruptedException {
        SubmitException last = null;
        for (int i = 0; i < addrs.size(); i++) {
            Object[] cs = connected();
            Session c = (Session) cs[0];
            try {
                return ((Submitter) cs[1]).submit(c, tasks, wait);
            } catch (Submitter.Unavailable e) {
                if (addrs.size() == 1) throw e;
                last = e;
                opts.log.accept(c.addr + " answered UNAVAILABLE (" + e.text + "); trying the next address");
                synchronized (this) {
                    if (cur == c) {
                        cur = null;
                        curIdx = (curIdx + 1) % addrs.size();
                    }
                }
                c.closeAfterFlush();
            }
        }
        throw last;
    }

    /** Closes the connection after what is queued is written. */
    @Override
    public void close() {
        List<Thread> ts;
        synchronized (this) {
            closed = true;
            if (cur != null) cur.closeAfterFlush();
            ts = new ArrayList<>(readers);
        }
        try {
            for (Thread t : ts) t.join(10_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
