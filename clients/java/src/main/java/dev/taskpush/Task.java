package dev.taskpush;

import dev.taskpush.wire.Wire;
import java.time.Duration;

/**
 * One delivery given to a handler. (id, epoch, attempt) names it: a redelivery has a larger
 * attempt, a later dispatcher a larger epoch. The numbers are unsigned on the wire; an id
 * above 2^63-1 reads negative here (use {@link Long#toUnsignedString}).
 */
public final class Task {
    private final Worker worker;
    final Wire.Delivery key;
    private final String type;
    private final byte[] payload;
    private final Priority priority;
    private final Duration lease;
    final Session origin; // the connection that delivered it
    final boolean inventory; // version 3: it outlives its connection

    private final Object lock = new Object();
    private volatile boolean cancelled;
    private Thread runner; // the thread running the handler, interrupted by a cancel
    private long deadlineNanos; // 0: no lease
    volatile boolean abandoned; // forgotten by the worker: its outcome goes nowhere (under the worker's lock)

    /** type: the task's type as a string, the handler's name for it when registered (no decoding per task). */
    Task(Worker worker, Wire.Task t, Session origin, String type) {
        this.worker = worker;
        this.key = t.delivery();
        this.type = type;
        this.payload = t.payload();
        this.priority = Priority.fromWire(t.priority());
        this.lease = t.timeoutMs() == 0 ? Duration.ZERO : Duration.ofMillis(t.timeoutMs());
        this.origin = origin;
        this.inventory = origin.version >= 3;
        if (t.timeoutMs() > 0) deadlineNanos = System.nanoTime() + lease.toNanos();
    }

    public long id() { return key.taskId(); }
    public long epoch() { return Integer.toUnsignedLong(key.epoch()); }
    public long attempt() { return Integer.toUnsignedLong(key.attempt()); }
    public String type() { return type; }
    /** The payload (the array itself: no copy is made). */
    public byte[] payload() { return payload; }
    public Priority priority() { return priority; }
    /** The TASK's timeout_ms: finish or {@link #extend} within it (zero: none). */
    public Duration lease() { return lease; }

    /** True once the dispatcher cancelled the delivery or the worker stopped at once. */
    public boolean isCancelled() { return cancelled; }

    /**
     * Asks the dispatcher to end the lease d from now (EXTEND). In protocol version 3, while no
     * dispatcher is connected, nothing is sent: the next dispatcher adopts the delivery.
     *
     * @throws TaskGoneException once the delivery was cancelled, or (versions 1, 2) its connection lost
     */
    public void extend(Duration d) throws TaskGoneException {
        long ms = d.toMillis();
        if (ms < 1 || ms > 0xFFFFFFFFL) throw new IllegalArgumentException("extend by " + d + " (1 ms to 2^32-1 ms)");
        if (cancelled) throw new TaskGoneException("the delivery was cancelled");
        Session s = worker.route(this);
        boolean sent = s != null && s.send(new Wire.Extend(key, ms));
        if (!sent && !inventory) throw new TaskGoneException("the connection that delivered the task is gone");
        synchronized (lock) {
            deadlineNanos = System.nanoTime() + d.toNanos();
        }
        if (sent) worker.stats.extendsSent.incrementAndGet();
    }

    /** The time before the lease ends, by this host's clock and the last extend; a large value without a lease. */
    public Duration remaining() {
        synchronized (lock) {
            if (deadlineNanos == 0) return Duration.ofNanos(Long.MAX_VALUE);
            return Duration.ofNanos(deadlineNanos - System.nanoTime());
        }
    }

    /** Sets the flag the handler sees and interrupts its thread, if it runs. */
    void cancel() {
        synchronized (lock) {
            cancelled = true;
            if (runner != null) runner.interrupt();
        }
    }

    void running(Thread t) {
        synchronized (lock) {
            runner = t;
            if (t != null && cancelled) t.interrupt();
        }
    }

    @Override public String toString() { return type + " " + key; }
}
