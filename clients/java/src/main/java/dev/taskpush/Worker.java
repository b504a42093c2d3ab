package dev.taskpush;

import dev.taskpush.wire.Wire;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Takes tasks of its registered types from a dispatcher and runs their handlers, each type on
 * up to its concurrency at once (runners on the executor, see Slot); the HELLO's capacity (the
 * dispatcher's credit) is the sum. Made with {@link #builder}, started with {@link #start()} (or run in the
 * caller's thread with {@link #run()}), stopped with {@link #close()}: a graceful drain.
 *
 * <p>In a protocol version 3 session the worker keeps running what it holds when the dispatcher
 * goes away, keeps every outcome until a dispatcher CONFIRMs it, and on the next connection
 * declares the deliveries still running (HOLDING) and sends the unconfirmed outcomes again.
 *
 * <p>No static state: several workers may live in one JVM (one per Spring bean, say).
 */
public final class Worker implements AutoCloseable {
    // The pause before the next address of a round (this to twice this), and the cap of the
    // backoff's exponent after a round that met a standby, as libtaskpush.
    private static final long NEXT_HOST_PAUSE_MS = 20;
    private static final int NOT_LEADER_MAX_EXP = 3;
    private static final int MAX_CAPACITY = 65536;
    private static final int MAX_ERROR_LEN = 65535; // err_msg is a TEXT column

    private final List<Options.Address> addrs;
    final Options opts;
    private final Map<String, Slot> slots;
    private final Slot[] slotList;
    private final int capacity;
    private final Executor executor;
    private final ExecutorService ownExecutor; // when the worker made its executor
    private final ThreadFactory ioThreads;

    private final Object mu = new Object();
    private final Map<Wire.Delivery, Task> held = new HashMap<>();
    private final LinkedHashMap<Wire.Delivery, Wire.Done> kept = new LinkedHashMap<>();
    private final int keptLimit;
    private Session cur;
    private Submitter sub;
    private boolean started;
    private volatile boolean stopping, aborted;
    private volatile boolean draining; // stopping, or a dispatcher sent STOP: each finished task kicks the session loop
    private final CountDownLatch finished = new CountDownLatch(1);
    private final AtomicInteger liveRunners = new AtomicInteger();
    final Counters stats = new Counters();

    /**
     * One task type: its queue and its runners. A runner is one job on the executor that runs
     * the type's queued tasks one after another until the queue is empty; at most concurrency
     * of them run at once. The reader queues what one read brought and then starts a runner
     * (one hand-off for the batch, not one per task); a runner that takes a task and sees more
     * queued starts one more, so that slow handlers still fill the concurrency, one hand-off
     * at a time (waking: a runner started has not taken its first task yet).
     */
    private static final class Slot {
        final String name;
        final Handler fn;
        final int concurrency;
        final byte[] type;
        final ArrayDeque<Task> queue = new ArrayDeque<>(); // under the slot's lock, as the counts
        int limit; // tasks queued at most: the credit and what a new dispatcher refused to adopt
        int runners;
        boolean waking;

        Slot(String name, Handler fn, int concurrency) {
            this.name = name;
            this.type = name.getBytes(StandardCharsets.UTF_8);
            this.fn = fn;
            this.concurrency = concurrency;
        }
    }

    static final class Counters {
        final AtomicLong connectAttempts = new AtomicLong(), connections = new AtomicLong(),
                disconnects = new AtomicLong(), tasksReceived = new AtomicLong(), tasksCompleted = new AtomicLong(),
                tasksDropped = new AtomicLong(), cancelsReceived = new AtomicLong(), extendsSent = new AtomicLong(),
                deliveriesDeclared = new AtomicLong(), outcomesResent = new AtomicLong(),
                outcomesConfirmed = new AtomicLong(), outcomesForgotten = new AtomicLong();
    }

    /** What a worker did so far. */
    public record Stats(long connectAttempts, long connections, long disconnects, long tasksReceived,
                        long tasksCompleted, long tasksDropped, long cancelsReceived, long extendsSent,
                        long deliveriesDeclared, long outcomesResent, long outcomesConfirmed, long outcomesForgotten) {}

    /** Builds a worker for "HOST:PORT[,HOST:PORT...]": a leader and its standbys, tried in turn. */
    public static Builder builder(String addresses) { return new Builder(addresses); }

    public static final class Builder {
        private final List<Options.Address> addrs;
        private Options opts = Options.defaults();
        private final Map<String, Slot> slots = new LinkedHashMap<>();
        private int capacity;
        private Executor executor;
        private ThreadFactory threadFactory;

        private Builder(String addresses) { addrs = Options.parseAddresses(addresses); }

        public Builder options(Options o) { opts = Objects.requireNonNull(o); return this; }

        /** Registers the handler of one task type, run on up to concurrency threads at once. */
        public Builder handle(String taskType, int concurrency, Handler handler) {
            int len = taskType.getBytes(StandardCharsets.UTF_8).length;
            if (len < 1 || len > Wire.MAX_TYPE_LEN) throw new IllegalArgumentException("a task type of 1 to " + Wire.MAX_TYPE_LEN + " bytes");
            if (slots.containsKey(taskType)) throw new IllegalArgumentException("a handler for '" + taskType + "' is already registered");
            if (slots.size() >= Wire.MAX_TYPES) throw new IllegalArgumentException("at most " + Wire.MAX_TYPES + " task types");
            if (concurrency < 1 || capacity + concurrency > MAX_CAPACITY)
                throw new IllegalArgumentException("concurrency >= 1, and at most " + MAX_CAPACITY + " in all");
            slots.put(taskType, new Slot(taskType, Objects.requireNonNull(handler), concurrency));
            capacity += concurrency;
            return this;
        }

        /**
         * Runs the handlers on this executor: each job it is given runs queued tasks of one type
         * until none is left, and at most a type's concurrency of them run at once, so an
         * executor that can run the capacity's worth of jobs at once reaches every type's
         * concurrency (a virtual thread per job fits); the worker does not shut it down.
         * Default: a pool of up to capacity threads from {@link #threadFactory}, made as needed.
         */
        public Builder executor(Executor e) { executor = e; return this; }

        /** Makes the default pool's handler threads (for virtual threads on JDK 21: Thread.ofVirtual().factory()). */
        public Builder threadFactory(ThreadFactory f) { threadFactory = f; return this; }

        public Worker build() {
            if (slots.isEmpty()) throw new IllegalStateException("register a handler first");
            return new Worker(this);
        }
    }

    private Worker(Builder b) {
        addrs = b.addrs;
        opts = b.opts;
        slots = new LinkedHashMap<>(b.slots);
        slotList = slots.values().toArray(new Slot[0]);
        capacity = b.capacity;
        keptLimit = 4 * capacity + 1024; // as libtaskpush: a few capacities' worth, and a failover's backlog
        AtomicInteger n = new AtomicInteger();
        ioThreads = r -> {
            Thread t = new Thread(r, "taskpush-io-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
        if (b.executor != null) {
            executor = b.executor;
            ownExecutor = null;
        } else {
            ThreadFactory f = b.threadFactory;
            if (f == null) {
                AtomicInteger h = new AtomicInteger();
                f = r -> new Thread(r, "taskpush-handler-" + h.incrementAndGet());
            }
            // Up to capacity threads, made when no idle one is there (a worker whose handlers are
            // quick needs a few), idle ones ending after a minute. Runners never outnumber the
            // threads, so a refusal means a thread is between two runners: wait for it.
            ownExecutor = new ThreadPoolExecutor(0, capacity, 60, TimeUnit.SECONDS, new SynchronousQueue<>(), f, (r, pool) -> {
                if (pool.isShutdown()) throw new RejectedExecutionException("the worker stopped");
                try {
                    pool.getQueue().put(r);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new RejectedExecutionException("interrupted", e);
                }
            });
            executor = ownExecutor;
        }
    }

    public Stats stats() {
        Counters s = stats;
        return new Stats(s.connectAttempts.get(), s.connections.get(), s.disconnects.get(), s.tasksReceived.get(),
                s.tasksCompleted.get(), s.tasksDropped.get(), s.cancelsReceived.get(), s.extendsSent.get(),
                s.deliveriesDeclared.get(), s.outcomesResent.get(), s.outcomesConfirmed.get(), s.outcomesForgotten.get());
    }

    /** Deliveries received and not yet answered. */
    public int held() {
        synchronized (mu) {
            return held.size();
        }
    }

    /** Outcomes kept until a dispatcher confirms them. */
    public int unconfirmed() {
        synchronized (mu) {
            return kept.size();
        }
    }

    /** The protocol version of the current session, 0 when not connected. */
    public int connectedVersion() {
        synchronized (mu) {
            return cur == null || cur.isClosed() ? 0 : cur.version;
        }
    }

    /** Starts the worker on a thread of its own and returns. */
    public Worker start() {
        claim();
        Thread t = new Thread(this::runClaimed, "taskpush-worker");
        t.start();
        return this;
    }

    /** Runs the worker in this thread until it is stopped ({@link #shutdown}, {@link #close}, {@link #abort}). */
    public void run() {
        claim();
        runClaimed();
    }

    private void claim() {
        synchronized (mu) {
            if (started) throw new IllegalStateException("a Worker runs once; build a new one");
            started = true;
        }
    }

    /** Begins a graceful drain and returns: STOP to the dispatcher, held tasks finish, outcomes confirmed. */
    public void shutdown() {
        stopping = true;
        draining = true;
        kick();
    }

    /** Waits for the worker to end; true when it ended. */
    public boolean awaitTermination(Duration d) throws InterruptedException {
        return finished.await(d.toNanos(), TimeUnit.NANOSECONDS);
    }

    /**
     * A graceful drain bounded by timeout (zero: unbounded): STOP to the dispatcher, which sends
     * no more; the held tasks finish, their outcomes are sent and (version 3) confirmed; past the
     * timeout the held tasks are cancelled as by {@link #abort}. Returns once every handler returned.
     */
    public void drain(Duration timeout) throws InterruptedException {
        shutdown();
        synchronized (mu) {
            if (!started) {
                finished.countDown();
                shutdownExecutor();
                return;
            }
        }
        if (!timeout.isZero() && !finished.await(timeout.toNanos(), TimeUnit.NANOSECONDS)) {
            opts.log.accept("the drain took longer than " + timeout + "; stopping at once");
            abort();
        }
        finished.await();
    }

    /**
     * {@link #drain} with the options' drain timeout. Interrupted, it stops at once ({@link #abort})
     * and returns with the thread's interrupt flag set.
     */
    @Override
    public void close() {
        try {
            drain(opts.drainTimeout);
        } catch (InterruptedException e) {
            abort();
            Thread.currentThread().interrupt();
        }
    }

    /**
     * Stops at once: the connection closes, every held task is cancelled (flag and interrupt) and
     * its outcome dropped (the dispatcher delivers it again). Returns without waiting.
     */
    public void abort() {
        synchronized (mu) {
            if (aborted) return;
            aborted = true;
        }
        stopping = true;
        // Forgotten before they are cancelled, so that a handler returning now makes no outcome.
        abandon(t -> true);
        Session c;
        synchronized (mu) {
            c = cur;
        }
        if (c != null) c.abort();
        kick();
    }

    private void kick() {
        synchronized (mu) {
            mu.notifyAll();
        }
    }

    /** Sleeps up to ms unless the worker stops; true when it stops. */
    private boolean pause(long ms) {
        long end = System.nanoTime() + ms * 1_000_000L;
        synchronized (mu) {
            while (!stopping && !aborted) {
                long left = (end - System.nanoTime()) / 1_000_000L;
                if (left <= 0) return false;
                try {
                    mu.wait(left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return true;
                }
            }
        }
        return true;
    }

    private void runClaimed() {
        try {
            // Room for every delivery the dispatcher may send, and for the ones a new dispatcher
            // refused to adopt that still run: the reader never blocks.
            for (Slot s : slots.values()) s.limit = 2 * capacity + 16;
            connectLoop();
            // Stopped while no dispatcher was connected: the running tasks still finish.
            synchronized (mu) {
                while (!held.isEmpty() && !aborted) mu.wait(50);
            }
            if (aborted) abandon(t -> true);
            // Every runner has returned (abandoned tasks still queued are dropped by them).
            synchronized (mu) {
                while (liveRunners.get() > 0) mu.wait(50);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            abort();
        } finally {
            shutdownExecutor();
            opts.log.accept("worker " + opts.name + " stopped");
            finished.countDown();
        }
    }

    private void shutdownExecutor() {
        if (ownExecutor != null) ownExecutor.shutdown();
    }

    /** libtaskpush's: a host that fails or does not lead is left for the next after a short pause; the backoff comes once all failed in a row. */
    private void connectLoop() {
        Backoff bo = new Backoff(opts.reconnectMin.toMillis(), opts.reconnectMax.toMillis());
        Map<Options.Address, Integer> versions = new HashMap<>();
        int n = addrs.size();
        int idx = 0, misses = 0;
        boolean standby = false;
        List<byte[]> types = new ArrayList<>();
        for (String t : slots.keySet()) types.add(t.getBytes(StandardCharsets.UTF_8));
        Wire.Hello hello = new Wire.Hello(Wire.VERSION, capacity, opts.name.getBytes(StandardCharsets.UTF_8),
                opts.token.getBytes(StandardCharsets.UTF_8), List.copyOf(types));
        while (!stopping && !aborted) {
            Options.Address addr = addrs.get(idx % n);
            stats.connectAttempts.incrementAndGet();
            Session c = null;
            boolean notLeader = false;
            try {
                c = Session.dialNegotiated(addr, hello, versions, Wire.VERSION_MIN, opts);
            } catch (DispatcherException e) {
                notLeader = e.notLeader();
                opts.log.accept(e.authRefused() ? "ERROR " + e.getMessage() : "cannot connect to " + addr + ": " + e.getMessage());
            } catch (IOException e) {
                opts.log.accept("cannot connect to " + addr + ": " + e.getMessage());
            }
            standby = standby || notLeader;
            if (c != null) {
                misses = 0;
                standby = false;
                bo.reset();
                stats.connections.incrementAndGet();
                opts.log.accept("connected to " + addr + " (protocol " + c.version + ", heartbeat " + c.hbMs + " ms, " + c.server + ")");
                Exception reason = serve(c);
                opts.log.accept("connection to " + addr + " ended: " + (reason == null ? "" : reason.getMessage()));
                if (stopping || aborted) return;
                standby = reason instanceof DispatcherException de && de.notLeader();
                if (n == 1) {
                    // The same address after a short delay: a restarted dispatcher is found again quickly.
                    if (pause(bo.next())) return;
                    continue;
                }
            }
            if (notLeader || (c != null && standby)) opts.log.accept(addr + " does not lead; trying " + addrs.get((idx + 1) % n));
            idx++;
            misses++;
            long delay;
            if (misses < n) {
                delay = NEXT_HOST_PAUSE_MS + ThreadLocalRandom.current().nextLong(NEXT_HOST_PAUSE_MS);
            } else {
                if (standby) bo.capAt(NOT_LEADER_MAX_EXP);
                delay = bo.next();
                misses = 0;
                standby = false;
            }
            if (pause(delay)) return;
        }
    }

    /** Exponential reconnect delays with jitter. */
    private static final class Backoff {
        final long min, max;
        int failures;

        Backoff(long min, long max) { this.min = min; this.max = max; }

        long next() {
            long ceiling = max;
            if (failures < 30 && (min << failures) < max) ceiling = min << failures;
            failures++;
            long half = ceiling / 2;
            return half + ThreadLocalRandom.current().nextLong(ceiling - half + 1);
        }

        void reset() { failures = 0; }

        void capAt(int n) { if (failures > n) failures = n; }
    }

    /** One session: frames in, the drain when the worker stops, until the connection closes. */
    private Exception serve(Session c) {
        Submitter s = new Submitter();
        takeOver(c, s);
        AtomicBoolean peerStop = new AtomicBoolean();
        CompletableFuture<Exception> served = new CompletableFuture<>();
        Session.FrameHandler frames = new Session.FrameHandler() {
            private final List<Slot> fed = new ArrayList<>(); // the slots this read queued tasks for

            @Override public void onFrame(Wire.Message m) throws IOException {
                Worker.this.onFrame(c, s, peerStop, m, fed);
            }

            @Override public void onBatchEnd() {
                for (Slot x : fed) startRunner(x);
                fed.clear();
            }
        };
        ioThreads.newThread(() -> {
            served.complete(c.serve(frames, ioThreads));
            kick();
        }).start();
        boolean stopSent = false, abortDone = false, closing = false;
        long[] settleBy = {0};
        try {
            while (true) {
                if (served.isDone()) return served.join();
                // Kicked by the end of the session, a STOP either way, an abort, and (while
                // stopping) each finished task; the timeout bounds the settling wait.
                synchronized (mu) {
                    if (!served.isDone()) {
                        try {
                            mu.wait(200);
                        } catch (InterruptedException e) {
                            c.abort();
                            return e;
                        }
                    }
                }
                if (served.isDone()) return served.join();
                if (stopping && !stopSent) {
                    stopSent = true;
                    c.send(new Wire.Stop());
                }
                if (aborted && !abortDone) {
                    abortDone = true;
                    c.abort();
                }
                if (!closing && peerStop.get() && held() == 0 && !settling(c, settleBy)) {
                    closing = true;
                    c.closeAfterFlush();
                }
            }
        } finally {
            synchronized (mu) {
                if (cur == c) {
                    cur = null;
                    sub = null;
                }
            }
            stats.disconnects.incrementAndGet();
            // Version 3 deliveries outlive the connection; older ones go back to the dispatcher.
            boolean atOnce = aborted;
            abandon(t -> atOnce || (!t.inventory && t.origin == c));
            int n = held();
            if (n > 0) opts.log.accept(n + " deliveries keep running; they are declared to the next dispatcher");
        }
    }

    /** A closing version 3 session waits for CONFIRMs (up to 10 heartbeats, at least 2 s). */
    private boolean settling(Session c, long[] by) {
        int n = unconfirmed();
        if (c.version < 3 || n == 0) return false;
        if (by[0] == 0) by[0] = System.nanoTime() + Math.max(10 * c.hbMs, 2000) * 1_000_000L;
        if (System.nanoTime() - by[0] < 0) return true;
        opts.log.accept("closing with " + n + " outcomes unconfirmed; the next connection sends them again");
        return false;
    }

    /**
     * Makes c the current session. In version 3 it first declares the deliveries held from earlier
     * connections and not cancelled (HOLDING) and sends again the outcomes not yet confirmed,
     * queued before any other frame; an older version cannot take them, so they are abandoned.
     */
    private void takeOver(Session c, Submitter s) {
        List<Task> gone = new ArrayList<>();
        List<Wire.Delivery> keys = new ArrayList<>();
        int pending;
        synchronized (mu) {
            cur = c;
            sub = s;
            for (Task t : held.values()) if (!t.isCancelled()) keys.add(t.key);
            pending = kept.size();
            if (c.version >= 3) {
                for (int i = 0; i < keys.size(); i += Wire.MAX_CONFIRM)
                    c.send(new Wire.Holding(List.copyOf(keys.subList(i, Math.min(keys.size(), i + Wire.MAX_CONFIRM)))));
                for (Wire.Done d : kept.values()) c.send(fit(d, c.maxBody));
                stats.deliveriesDeclared.addAndGet(keys.size());
                stats.outcomesResent.addAndGet(pending);
            } else {
                gone = abandonLocked(t -> true);
                kept.clear();
            }
        }
        for (Task t : gone) t.cancel();
        if (keys.size() + pending > 0) {
            if (c.version >= 3) {
                opts.log.accept(c.addr + ": declared " + keys.size() + " running deliveries, sent " + pending + " unconfirmed outcomes again");
            } else {
                opts.log.accept(c.addr + " speaks protocol version " + c.version + ", which cannot adopt deliveries: "
                        + keys.size() + " running and " + pending + " finished ones are abandoned");
            }
        }
    }

    private void onFrame(Session c, Submitter s, AtomicBoolean peerStop, Wire.Message m, List<Slot> fed) throws IOException {
        if (m instanceof Wire.Task t) {
            onTask(c, t, fed);
        } else if (m instanceof Wire.Cancel k) {
            Task t;
            synchronized (mu) {
                t = held.get(k.delivery());
            }
            if (t != null) {
                stats.cancelsReceived.incrementAndGet();
                opts.log.accept(t + " cancelled by the dispatcher");
                t.cancel();
            }
        } else if (m instanceof Wire.Confirm k) {
            if (c.version < 3) throw new IOException("unexpected CONFIRM in a session before version 3");
            int n = 0;
            synchronized (mu) {
                for (Wire.Delivery d : k.deliveries()) if (kept.remove(d) != null) n++;
            }
            stats.outcomesConfirmed.addAndGet(n);
        } else if (m instanceof Wire.Stop) {
            peerStop.set(true);
            draining = true;
            kick();
        } else if (!(m instanceof Wire.Heartbeat) && !s.onFrame(m)) {
            throw new IOException("unexpected " + Wire.typeName(m.type()) + " from the dispatcher");
        }
    }

    private void onTask(Session c, Wire.Task v, List<Slot> fed) {
        stats.tasksReceived.incrementAndGet();
        Slot s = slotOf(v.taskType());
        Task t = new Task(this, v, c, s != null ? s.name : new String(v.taskType(), StandardCharsets.UTF_8));
        synchronized (mu) {
            held.put(t.key, t);
        }
        if (s == null) { // the dispatcher sends only registered types; answer anyway
            finish(t, Wire.OUTCOME_FAIL_PERM, bytes("no handler for this task type"), 0);
            return;
        }
        boolean queued;
        synchronized (s) {
            queued = s.queue.size() < s.limit && s.queue.add(t);
        }
        if (!queued) { // more than the credit allows: never block the reader
            finish(t, Wire.OUTCOME_FAIL_RETRY, bytes("the dispatcher sent more tasks than the worker's capacity"), 0);
        } else if (!fed.contains(s)) {
            fed.add(s);
        }
    }

    private Slot slotOf(byte[] type) {
        for (Slot s : slotList) if (java.util.Arrays.equals(s.type, type)) return s;
        return null;
    }

    /** Starts a runner for s unless one is starting, the concurrency is reached, or nothing is queued. */
    private void startRunner(Slot s) {
        synchronized (s) {
            if (s.queue.isEmpty() || s.waking || s.runners >= s.concurrency) return;
            s.runners++;
            s.waking = true;
        }
        liveRunners.incrementAndGet();
        try {
            executor.execute(() -> runQueued(s));
        } catch (RuntimeException e) { // a RejectedExecutionException: the executor was shut down
            List<Task> left = new ArrayList<>();
            synchronized (s) {
                s.runners--;
                s.waking = false;
                if (s.runners == 0) {
                    left.addAll(s.queue);
                    s.queue.clear();
                }
            }
            runnerEnded();
            opts.log.accept("the executor refused a runner of " + s.name + ": " + e + "; " + left.size() + " tasks fail");
            for (Task t : left) finish(t, Wire.OUTCOME_FAIL_RETRY, bytes("the worker's executor refused the task"), 0);
        }
    }

    private void runnerEnded() {
        if (liveRunners.decrementAndGet() == 0 && stopping) kick();
    }

    /** A runner: the queued tasks of s one after another until none is left. */
    private void runQueued(Slot s) {
        boolean first = true, ended = false;
        Session unwritten = null; // the DONEs of the tasks run back to back wait here
        try {
            while (true) {
                Task t;
                boolean more;
                synchronized (s) {
                    if (first) {
                        s.waking = false;
                        first = false;
                    }
                    t = s.queue.poll();
                    if (t == null) {
                        s.runners--;
                        ended = true;
                        return;
                    }
                    more = !s.queue.isEmpty();
                }
                if (more) startRunner(s);
                Session c = runOne(s, t);
                if (unwritten != null && unwritten != c) unwritten.write();
                unwritten = c;
            }
        } finally {
            if (unwritten != null) unwritten.write();
            if (!ended) { // an Error out of the library: the next runner takes the queue
                synchronized (s) {
                    s.runners--;
                    if (first) s.waking = false;
                }
                startRunner(s);
            }
            runnerEnded();
        }
    }

    private static byte[] bytes(String s) { return s.getBytes(StandardCharsets.UTF_8); }

    /** Runs t's handler and answers it; returns the session its DONE waits on to be written, if it does. */
    private Session runOne(Slot s, Task t) {
        boolean gone = t.abandoned; // read again under the lock by finish
        // Abandoned, or a version 1/2 delivery whose connection is gone (delivered again): not run.
        if (gone || (!t.inventory && t.origin.isClosed())) {
            drop(t);
            return null;
        }
        int outcome;
        byte[] data;
        long delay = 0;
        t.running(Thread.currentThread());
        try {
            byte[] r = s.fn.handle(t);
            outcome = Wire.OUTCOME_SUCCESS;
            data = r == null ? new byte[0] : r;
        } catch (PermanentFailure e) {
            outcome = Wire.OUTCOME_FAIL_PERM;
            data = bytes(String.valueOf(e.getMessage()));
        } catch (RetryAfter e) {
            outcome = Wire.OUTCOME_RETRY_AFTER;
            data = bytes(String.valueOf(e.getMessage()));
            delay = Math.max(0, Math.min(0xFFFFFFFFL, e.delay().toMillis()));
        } catch (Throwable e) { // a handler's bug fails the attempt, as a Go panic
            outcome = Wire.OUTCOME_FAIL_RETRY;
            data = bytes(e.getMessage() != null ? e.getMessage() : e.getClass().getName());
            if (!(e instanceof Exception)) opts.log.accept("handler of " + s.name + " threw " + e + " on " + t);
        } finally {
            t.running(null);
            Thread.interrupted(); // a cancel's interrupt ends with its task
        }
        // The DONE waits for the next task's when this runner takes one at once, and the lease
        // outlasts the writer thread's wait (a heartbeat interval) should that handler be slow.
        boolean later;
        synchronized (s) {
            later = !s.queue.isEmpty();
        }
        later = later && (t.lease().isZero() || t.remaining().toMillis() > 3 * t.origin.hbMs);
        return finish(t, outcome, data, delay, later);
    }

    /** The DONE of an outcome made to fit max_body: a result too large fails for good saying so; an error text is cut. */
    static Wire.Done fit(Wire.Done d, long maxBody) {
        long room = Math.max(0, maxBody - Wire.DONE_HEAD);
        int outcome = d.outcome();
        byte[] data = d.data();
        if (outcome == Wire.OUTCOME_SUCCESS && data.length > room) {
            outcome = Wire.OUTCOME_FAIL_PERM;
            data = bytes("result of " + data.length + " bytes exceeds the dispatcher's limit of " + room);
        }
        if (outcome != Wire.OUTCOME_SUCCESS) data = cutUtf8(data, (int) Math.min(MAX_ERROR_LEN, room));
        if (outcome == d.outcome() && data == d.data()) return d;
        return new Wire.Done(d.delivery(), outcome, d.retryAfterMs(), data);
    }

    static byte[] cutUtf8(byte[] b, int limit) {
        if (b.length <= limit) return b;
        int end = limit;
        while (end > 0 && (b[end] & 0xC0) == 0x80) end--;
        return java.util.Arrays.copyOf(b, end);
    }

    private void finish(Task t, int outcome, byte[] data, long delayMs) {
        finish(t, outcome, data, delayMs, false);
    }

    /**
     * Answers t. With later set the DONE is only queued on its session, to leave with the
     * outcomes after it in one write; the session it was queued on is returned (the caller
     * writes it, and the session's writer thread does within a heartbeat interval).
     */
    private Session finish(Task t, int outcome, byte[] data, long delayMs, boolean later) {
        Wire.Done d = new Wire.Done(t.key, outcome, delayMs, data);
        try {
            if (!t.inventory) {
                boolean sent = later ? t.origin.queue(fit(d, t.origin.maxBody)) : t.origin.send(fit(d, t.origin.maxBody));
                synchronized (mu) {
                    held.remove(t.key);
                }
                t.cancel();
                (sent ? stats.tasksCompleted : stats.tasksDropped).incrementAndGet();
                return sent && later ? t.origin : null;
            }
            // Version 3: kept until confirmed. Keeping it and reading the current session under one
            // lock means either takeOver sends it again or the session read here had its HOLDING queued.
            Wire.Done old = null;
            Session c;
            synchronized (mu) {
                held.remove(t.key);
                if (t.abandoned) {
                    stats.tasksDropped.incrementAndGet();
                    return null;
                }
                kept.remove(t.key);
                kept.put(t.key, d);
                if (kept.size() > keptLimit) {
                    Iterator<Map.Entry<Wire.Delivery, Wire.Done>> it = kept.entrySet().iterator();
                    old = it.next().getValue();
                    it.remove();
                }
                c = cur;
            }
            t.cancel();
            stats.tasksCompleted.incrementAndGet();
            if (old != null) {
                stats.outcomesForgotten.incrementAndGet();
                opts.log.accept("more than " + keptLimit + " outcomes wait for CONFIRM; forgetting the oldest, " + old.delivery());
            }
            if (c == null || c.version < 3) return null;
            if (!later) {
                c.send(fit(d, c.maxBody));
                return null;
            }
            return c.queue(fit(d, c.maxBody)) ? c : null;
        } finally {
            if (draining) kick(); // a draining session looks at held again
        }
    }

    private void drop(Task t) {
        synchronized (mu) {
            held.remove(t.key);
        }
        t.cancel();
        stats.tasksDropped.incrementAndGet();
        if (draining) kick();
    }

    /** Forgets the held deliveries which selects: cancelled, outcomes dropped; stopping at once, kept outcomes go too. */
    private void abandon(java.util.function.Predicate<Task> which) {
        List<Task> gone;
        synchronized (mu) {
            gone = abandonLocked(which);
            if (aborted) kept.clear();
        }
        for (Task t : gone) t.cancel();
    }

    private List<Task> abandonLocked(java.util.function.Predicate<Task> which) {
        List<Task> gone = new ArrayList<>();
        for (Iterator<Task> it = held.values().iterator(); it.hasNext(); ) {
            Task t = it.next();
            if (which.test(t)) {
                t.abandoned = true;
                it.remove();
                gone.add(t);
            }
        }
        return gone;
    }

    /** The session a frame about t goes on: its own in versions 1 and 2; in version 3 the current one, null between connections. */
    Session route(Task t) {
        if (!t.inventory) return t.origin;
        synchronized (mu) {
            return cur != null && cur.version >= 3 ? cur : null;
        }
    }

    /** Submits one task on the worker's current connection (protocol version 2 or later); returns once its row is committed. */
    public Receipt submit(NewTask task) throws SubmitException, InterruptedException {
        Session c;
        Submitter s;
        synchronized (mu) {
            c = cur;
            s = sub;
        }
        if (s == null) throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "not connected to a dispatcher");
        return s.submit(c, List.of(task), false).get(0);
    }
}
