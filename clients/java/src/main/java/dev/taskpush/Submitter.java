package dev.taskpush;

import dev.taskpush.wire.Wire;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;

/** The request ids of one session: each SUBMIT waits for its SUBMITTED and, with WAIT, an OUTCOME per inserted task. */
final class Submitter {
    private long next = 1;
    private final Map<Long, BlockingQueue<Wire.Message>> pending = new HashMap<>();

    /** Takes SUBMITTED and OUTCOME; false for any other frame. Never blocks: extras from a confused peer are dropped. */
    boolean onFrame(Wire.Message m) {
        long id;
        if (m instanceof Wire.Submitted s) id = s.requestId();
        else if (m instanceof Wire.Outcome o) id = o.requestId();
        else return false;
        BlockingQueue<Wire.Message> q;
        synchronized (this) {
            q = pending.get(id);
        }
        if (q != null) q.offer(m);
        return true;
    }

    private static byte[] utf8(String s) { return s.getBytes(StandardCharsets.UTF_8); }

    static Wire.SubmitTask entry(NewTask t) throws SubmitException {
        long delay = t.delay.toMillis(), timeout = t.timeout.toMillis();
        if (delay < 0 || delay > 0xFFFFFFFFL || timeout < 0 || timeout > 0xFFFFFFFFL || t.maxAttempts < 0
                || t.maxAttempts > Wire.MAX_ATTEMPTS)
            throw new SubmitException(SubmitException.Kind.INVALID, "delay, timeout or max attempts out of range");
        return new Wire.SubmitTask(t.priority.wire(), t.maxAttempts, delay, timeout, utf8(t.type), utf8(t.dedupKey),
                t.payload, utf8(t.groupKey));
    }

    List<Receipt> submit(Session c, List<NewTask> tasks, boolean wait) throws SubmitException, InterruptedException {
        if (c == null || c.isClosed()) throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "not connected to a dispatcher");
        if (c.version < 2) throw new SubmitException(SubmitException.Kind.NO_SUBMIT, "the dispatcher speaks protocol version 1: no SUBMIT");
        if (tasks.isEmpty() || tasks.size() > Wire.MAX_SUBMIT_TASKS)
            throw new SubmitException(SubmitException.Kind.INVALID, "1 to " + Wire.MAX_SUBMIT_TASKS + " tasks per submit");
        List<Wire.SubmitTask> entries = new ArrayList<>(tasks.size());
        int flags = wait ? Wire.SUBMIT_WAIT : 0;
        for (NewTask t : tasks) {
            Wire.SubmitTask e = entry(t);
            // Without a key the frame is the one every dispatcher takes.
            if (e.groupKey().length > 0) flags |= Wire.SUBMIT_GROUP_KEY;
            entries.add(e);
        }
        BlockingQueue<Wire.Message> q = new ArrayBlockingQueue<>(tasks.size() + 1);
        long id;
        synchronized (this) {
            id = next;
            next = next % 0xFFFFFFFFL + 1;
            pending.put(id, q);
        }
        try {
            Wire.Submit msg = new Wire.Submit(id, flags, entries);
            byte[] frame;
            try {
                frame = Wire.encode(msg);
            } catch (dev.taskpush.wire.BadFrameException e) {
                throw new SubmitException(SubmitException.Kind.INVALID, e.getMessage());
            }
            if (frame.length - Wire.LEN_PREFIX > c.maxBody)
                throw new SubmitException(SubmitException.Kind.INVALID, "the submit exceeds the dispatcher's " + c.maxBody + "-byte frame limit");
            if (!c.send(msg)) throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "the connection was lost before the submit was sent");
            Wire.Submitted ans = null;
            while (ans == null) {
                Wire.Message m = next(q, c, false);
                if (m instanceof Wire.Submitted s) ans = s;
            }
            String text = new String(ans.message(), StandardCharsets.UTF_8);
            if (ans.status() == Wire.STATUS_INVALID) throw new SubmitException(SubmitException.Kind.INVALID, "submit refused: " + text);
            if (ans.status() == Wire.STATUS_UNAVAILABLE) throw new Unavailable(text);
            if (ans.results().size() != tasks.size())
                throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "SUBMITTED has " + ans.results().size() + " results for " + tasks.size() + " tasks");
            Receipt[] out = new Receipt[tasks.size()];
            Map<Long, Integer> waiting = new HashMap<>();
            for (int i = 0; i < out.length; i++) {
                Wire.SubmitResult r = ans.results().get(i);
                out[i] = new Receipt(r.taskId(), r.result() == Wire.RESULT_DUPLICATE, null);
                if (wait && !out[i].duplicate()) waiting.put(r.taskId(), i);
            }
            while (!waiting.isEmpty()) {
                if (next(q, c, true) instanceof Wire.Outcome o) {
                    Integer i = waiting.remove(o.taskId());
                    if (i != null) out[i] = new Receipt(out[i].taskId(), false, new Receipt.Outcome(o.state() == Wire.STATE_SUCCESSFUL, o.data()));
                }
            }
            return List.of(out);
        } finally {
            synchronized (this) {
                pending.remove(id);
            }
        }
    }

    private static Wire.Message next(BlockingQueue<Wire.Message> q, Session c, boolean acked)
            throws SubmitException, InterruptedException {
        while (true) {
            Wire.Message m = q.poll(20, TimeUnit.MILLISECONDS);
            if (m != null) return m;
            if (c.isClosed()) {
                if (acked) throw new SubmitException(SubmitException.Kind.OUTCOME_LOST,
                        "the connection was lost (the submit was acknowledged; its outcome is in the table)");
                throw new SubmitException(SubmitException.Kind.UNAVAILABLE, "the connection was lost before the answer");
            }
        }
    }

    /** A SUBMITTED UNAVAILABLE: nothing was committed, so the same submission may go to another address at once. */
    static final class Unavailable extends SubmitException {
        private static final long serialVersionUID = 1L;
        final String text;

        Unavailable(String text) {
            super(Kind.UNAVAILABLE, "unavailable: " + text);
            this.text = text;
        }
    }
}
