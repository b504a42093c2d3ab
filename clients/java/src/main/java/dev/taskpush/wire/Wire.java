package dev.taskpush.wire;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The taskpush wire codec of proto/PROTOCOL.md: frame layouts, bounds, encode and decode as
 * pure functions of bytes (no sockets). It refuses what the C decoder (proto/proto.c) refuses,
 * the encoder refuses what a decoder would refuse, and one message has exactly one byte
 * sequence, so a decoded frame encodes back byte for byte (tests/conformance).
 */
public final class Wire {
    private Wire() {}

    public static final int VERSION = 3; // what this library speaks
    public static final int VERSION_MIN = 1;
    public static final int LEN_PREFIX = 4;
    public static final int MAX_BODY_DEFAULT = (1 << 24) - 1 + 4096; // a MEDIUMBLOB result plus a head
    public static final int MAX_TYPE_LEN = 256;
    public static final int MAX_TYPES = 64;
    public static final int MAX_NAME_LEN = 256;
    public static final int MAX_TOKEN_LEN = 1024;
    public static final int MAX_SUBMIT_TASKS = 1000;
    public static final int MAX_DEDUP_KEY_LEN = 191;
    public static final int MAX_GROUP_KEY_LEN = 191;
    public static final int MAX_PAYLOAD_LEN = (1 << 24) - 1;
    public static final int MAX_ATTEMPTS = 1000;
    public static final int MAX_CONFIRM = 1024;
    public static final int MAX_PROGRESS_MSG = 256;
    public static final int MAX_PERMILLE = 1000;
    public static final int DELIVERY_ENTRY = 16;
    public static final int DONE_HEAD = 22;
    static final int PRIORITY_MAX = 2;

    public static final int T_HELLO = 0x01, T_WELCOME = 0x02, T_HEARTBEAT = 0x03, T_ERROR = 0x04,
            T_STOP = 0x05, T_TASK = 0x10, T_DONE = 0x11, T_EXTEND = 0x12, T_CANCEL = 0x13,
            T_CONFIRM = 0x14, T_HOLDING = 0x15, T_PROGRESS = 0x16, T_SUBMIT = 0x20,
            T_SUBMITTED = 0x21, T_OUTCOME = 0x22;

    public static final int OUTCOME_SUCCESS = 0, OUTCOME_FAIL_PERM = 1, OUTCOME_FAIL_RETRY = 2,
            OUTCOME_RETRY_AFTER = 3;

    public static final int ERR_BAD_FRAME = 1, ERR_VERSION = 2, ERR_AUTH = 3, ERR_UNEXPECTED = 4,
            ERR_SHUTDOWN = 5, ERR_TIMEOUT = 6, ERR_NOT_LEADER = 7;

    /** SUBMIT_AFTER: each entry ends with a u16 count and that many u64 ids of tasks it waits
     *  for (dependencies; a dispatcher of schema version 10 or later). */
    public static final int SUBMIT_WAIT = 0x01, SUBMIT_GROUP_KEY = 0x02, SUBMIT_AFTER = 0x04;
    static final int SUBMIT_FLAGS_KNOWN = SUBMIT_WAIT | SUBMIT_GROUP_KEY | SUBMIT_AFTER;
    private static final long[] NO_IDS = new long[0];
    public static final int STATUS_OK = 0, STATUS_INVALID = 1, STATUS_UNAVAILABLE = 2;
    public static final int RESULT_INSERTED = 0, RESULT_DUPLICATE = 1;
    public static final int STATE_SUCCESSFUL = 2, STATE_FAILED = 3;

    public static String typeName(int t) {
        switch (t) {
            case T_HELLO: return "HELLO";
            case T_WELCOME: return "WELCOME";
            case T_HEARTBEAT: return "HEARTBEAT";
            case T_ERROR: return "ERROR";
            case T_STOP: return "STOP";
            case T_TASK: return "TASK";
            case T_DONE: return "DONE";
            case T_EXTEND: return "EXTEND";
            case T_CANCEL: return "CANCEL";
            case T_CONFIRM: return "CONFIRM";
            case T_HOLDING: return "HOLDING";
            case T_PROGRESS: return "PROGRESS";
            case T_SUBMIT: return "SUBMIT";
            case T_SUBMITTED: return "SUBMITTED";
            case T_OUTCOME: return "OUTCOME";
            default: return String.format("type 0x%02x", t);
        }
    }

    /** One decoded frame. */
    public sealed interface Message permits Hello, Welcome, Heartbeat, Stop, ErrorFrame, Task, Done,
            Extend, Cancel, Confirm, Holding, Progress, Submit, Submitted, Outcome {
        int type();
    }

    /** Names one delivery: (task id, epoch, attempt); ids and counters are unsigned on the wire. */
    public record Delivery(long taskId, int epoch, int attempt) {
        // Written out: the generated ones go through method handles, slow before the JIT
        // inlines them, and a worker hashes every delivery several times.
        @Override public boolean equals(Object o) {
            return o instanceof Delivery d && d.taskId == taskId && d.epoch == epoch && d.attempt == attempt;
        }

        @Override public int hashCode() {
            return (Long.hashCode(taskId) * 31 + epoch) * 31 + attempt;
        }

        @Override public String toString() {
            return "task " + Long.toUnsignedString(taskId) + " (epoch " + Integer.toUnsignedString(epoch)
                    + ", attempt " + Integer.toUnsignedString(attempt) + ")";
        }
    }

    public record Hello(int version, long capacity, byte[] name, byte[] token, List<byte[]> types) implements Message {
        public int type() { return T_HELLO; }
    }
    public record Welcome(int version, long heartbeatMs, long maxBody, byte[] server) implements Message {
        public int type() { return T_WELCOME; }
    }
    public record Heartbeat() implements Message {
        public int type() { return T_HEARTBEAT; }
    }
    public record Stop() implements Message {
        public int type() { return T_STOP; }
    }
    public record ErrorFrame(int code, byte[] message) implements Message {
        public int type() { return T_ERROR; }
        public String text() { return new String(message, StandardCharsets.UTF_8); }
    }
    public record Task(Delivery delivery, long timeoutMs, int priority, byte[] taskType, byte[] payload) implements Message {
        public int type() { return T_TASK; }
    }
    public record Done(Delivery delivery, int outcome, long retryAfterMs, byte[] data) implements Message {
        public int type() { return T_DONE; }
    }
    public record Extend(Delivery delivery, long extendMs) implements Message {
        public int type() { return T_EXTEND; }
    }
    public record Cancel(Delivery delivery) implements Message {
        public int type() { return T_CANCEL; }
    }
    public record Confirm(List<Delivery> deliveries) implements Message {
        public int type() { return T_CONFIRM; }
    }
    public record Holding(List<Delivery> deliveries) implements Message {
        public int type() { return T_HOLDING; }
    }
    /** A worker's report on a running delivery (protocol version 4): decoded, never sent by this library. */
    public record Progress(Delivery delivery, int permille, byte[] message) implements Message {
        public int type() { return T_PROGRESS; }
    }
    /** after: the ids the task waits for, carried only with SUBMIT_AFTER (at most 65535 on the wire). */
    public record SubmitTask(int priority, int maxAttempts, long delayMs, long timeoutMs, byte[] taskType,
                             byte[] dedupKey, byte[] payload, byte[] groupKey, long[] after) {
        public SubmitTask(int priority, int maxAttempts, long delayMs, long timeoutMs, byte[] taskType,
                          byte[] dedupKey, byte[] payload, byte[] groupKey) {
            this(priority, maxAttempts, delayMs, timeoutMs, taskType, dedupKey, payload, groupKey, NO_IDS);
        }
    }
    public record Submit(long requestId, int flags, List<SubmitTask> tasks) implements Message {
        public int type() { return T_SUBMIT; }
    }
    public record SubmitResult(int result, long taskId) {}
    public record Submitted(long requestId, int status, List<SubmitResult> results, byte[] message) implements Message {
        public int type() { return T_SUBMITTED; }
    }
    public record Outcome(long requestId, long taskId, int state, byte[] data) implements Message {
        public int type() { return T_OUTCOME; }
    }

    // ---- decoding ----

    /** Reads fields from a body; every take checks the bytes left first. */
    private static final class Cursor {
        final byte[] b;
        final int end;
        int off;

        Cursor(byte[] b, int off, int end) { this.b = b; this.off = off; this.end = end; }

        int left() { return end - off; }

        void need(int n, String what) throws BadFrameException {
            if (n < 0 || left() < n) throw new BadFrameException(what + " runs past the end of the body");
        }

        int u8(String what) throws BadFrameException {
            need(1, what);
            return b[off++] & 0xFF;
        }

        int u16(String what) throws BadFrameException {
            need(2, what);
            int v = ((b[off] & 0xFF) << 8) | (b[off + 1] & 0xFF);
            off += 2;
            return v;
        }

        long u32(String what) throws BadFrameException {
            need(4, what);
            long v = ((long) (b[off] & 0xFF) << 24) | ((b[off + 1] & 0xFF) << 16) | ((b[off + 2] & 0xFF) << 8)
                    | (b[off + 3] & 0xFF);
            off += 4;
            return v;
        }

        long u64(String what) throws BadFrameException {
            need(8, what);
            long v = 0;
            for (int i = 0; i < 8; i++) v = (v << 8) | (b[off + i] & 0xFF);
            off += 8;
            return v;
        }

        byte[] bytes(int n, String what) throws BadFrameException {
            need(n, what);
            byte[] v = Arrays.copyOfRange(b, off, off + n);
            off += n;
            return v;
        }

        byte[] str(int min, int max, String what) throws BadFrameException {
            int n = u16(what + " length");
            if (n < min || n > max) throw new BadFrameException(what + " of " + n + " bytes (" + min + " to " + max + ")");
            return bytes(n, what);
        }

        byte[] rest() {
            byte[] v = Arrays.copyOfRange(b, off, end);
            off = end;
            return v;
        }

        Delivery delivery() throws BadFrameException {
            long id = u64("task_id");
            int epoch = (int) u32("epoch");
            int attempt = (int) u32("attempt");
            return new Delivery(id, epoch, attempt);
        }

        void end(int t) throws BadFrameException {
            if (left() != 0) throw new BadFrameException(left() + " bytes after the last field of " + typeName(t));
        }
    }

    /** A worker registers 1 .. 64 types with capacity >= 1; from version 2 a producer none with capacity 0. */
    static boolean helloCountsOk(int version, long capacity, int ntypes) {
        if (ntypes == 0) return version >= 2 && capacity == 0;
        return capacity > 0 && ntypes <= MAX_TYPES;
    }

    /** Decodes one frame body (the bytes after the length prefix). */
    public static Message decode(byte[] body) throws BadFrameException {
        return decode(body, 0, body.length);
    }

    /** Decodes the frame body buf[off, off + len) (a reader's buffer: the message copies what it keeps). */
    public static Message decode(byte[] buf, int off, int len) throws BadFrameException {
        if (len <= 0) throw new BadFrameException("empty body");
        if (off < 0 || len > buf.length - off) throw new IllegalArgumentException("a body outside the array");
        Cursor c = new Cursor(buf, off + 1, off + len);
        int t = buf[off] & 0xFF;
        Message m;
        switch (t) {
            case T_HELLO: {
                int version = c.u16("version");
                long capacity = c.u32("capacity");
                byte[] name = c.str(0, MAX_NAME_LEN, "name");
                byte[] token = c.str(0, MAX_TOKEN_LEN, "token");
                int ntypes = c.u16("ntypes");
                if (!helloCountsOk(version, capacity, ntypes))
                    throw new BadFrameException("capacity " + capacity + " with " + ntypes + " types in version " + version);
                List<byte[]> types = new ArrayList<>(ntypes);
                for (int i = 0; i < ntypes; i++) types.add(c.str(1, MAX_TYPE_LEN, "task type"));
                m = new Hello(version, capacity, name, token, List.copyOf(types));
                break;
            }
            case T_WELCOME: {
                int version = c.u16("version");
                long hb = c.u32("heartbeat_ms");
                long maxBody = c.u32("max_body");
                m = new Welcome(version, hb, maxBody, c.str(0, MAX_NAME_LEN, "server"));
                break;
            }
            case T_HEARTBEAT: m = new Heartbeat(); break;
            case T_STOP: m = new Stop(); break;
            case T_ERROR: {
                int code = c.u16("code");
                m = new ErrorFrame(code, c.rest());
                break;
            }
            case T_TASK: {
                Delivery d = c.delivery();
                long timeout = c.u32("timeout_ms");
                int prio = c.u8("priority");
                if (prio > PRIORITY_MAX) throw new BadFrameException("priority " + prio);
                byte[] type = c.str(1, MAX_TYPE_LEN, "task type");
                m = new Task(d, timeout, prio, type, c.rest());
                break;
            }
            case T_DONE: {
                Delivery d = c.delivery();
                int outcome = c.u8("outcome");
                long ra = c.u32("retry_after_ms");
                if (outcome > OUTCOME_RETRY_AFTER) throw new BadFrameException("outcome " + outcome);
                m = new Done(d, outcome, ra, c.rest());
                break;
            }
            case T_EXTEND: {
                Delivery d = c.delivery();
                m = new Extend(d, c.u32("extend_ms"));
                break;
            }
            case T_CANCEL: m = new Cancel(c.delivery()); break;
            case T_CONFIRM: m = new Confirm(decodeList(c)); break;
            case T_HOLDING: m = new Holding(decodeList(c)); break;
            case T_PROGRESS: {
                Delivery d = c.delivery();
                int permille = c.u16("permille");
                if (permille > MAX_PERMILLE) throw new BadFrameException("permille " + permille);
                byte[] msg = c.str(0, MAX_PROGRESS_MSG, "progress message");
                if (!progressTextOk(msg)) throw new BadFrameException("a progress message that is not UTF-8 without NUL");
                m = new Progress(d, permille, msg);
                break;
            }
            case T_SUBMIT: m = decodeSubmit(c); break;
            case T_SUBMITTED: m = decodeSubmitted(c); break;
            case T_OUTCOME: {
                long req = c.u32("request_id");
                long id = c.u64("task_id");
                int state = c.u8("state");
                if (state != STATE_SUCCESSFUL && state != STATE_FAILED) throw new BadFrameException("outcome state " + state);
                m = new Outcome(req, id, state, c.rest());
                break;
            }
            default:
                throw new BadFrameException("unknown " + typeName(t));
        }
        c.end(t);
        return m;
    }

    static boolean progressTextOk(byte[] b) {
        for (byte x : b) if (x == 0) return false;
        var dec = StandardCharsets.UTF_8.newDecoder();
        try {
            dec.decode(java.nio.ByteBuffer.wrap(b));
            return true;
        } catch (java.nio.charset.CharacterCodingException e) {
            return false;
        }
    }

    private static List<Delivery> decodeList(Cursor c) throws BadFrameException {
        int n = c.u16("n");
        if (n == 0 || n > MAX_CONFIRM) throw new BadFrameException(n + " deliveries (1 to " + MAX_CONFIRM + ")");
        if (c.left() != n * DELIVERY_ENTRY) throw new BadFrameException(c.left() + " bytes for " + n + " deliveries");
        List<Delivery> l = new ArrayList<>(n);
        for (int i = 0; i < n; i++) l.add(c.delivery());
        return List.copyOf(l);
    }

    private static Submit decodeSubmit(Cursor c) throws BadFrameException {
        long req = c.u32("request_id");
        int flags = c.u8("flags");
        int n = c.u16("ntasks");
        if ((flags & ~SUBMIT_FLAGS_KNOWN) != 0) throw new BadFrameException(String.format("SUBMIT flags 0x%02x", flags));
        if (n == 0 || n > MAX_SUBMIT_TASKS) throw new BadFrameException(n + " tasks (1 to " + MAX_SUBMIT_TASKS + ")");
        // Each entry takes at least 19 bytes: a count beyond what the body holds allocates nothing.
        if (c.left() < n * 19) throw new BadFrameException(n + " tasks in " + c.left() + " bytes");
        List<SubmitTask> tasks = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            int prio = c.u8("priority");
            int maxAttempts = c.u16("max_attempts");
            long delay = c.u32("delay_ms");
            long timeout = c.u32("timeout_ms");
            if (prio > PRIORITY_MAX || maxAttempts > MAX_ATTEMPTS)
                throw new BadFrameException("task " + i + ": priority " + prio + ", max_attempts " + maxAttempts);
            byte[] type = c.str(1, MAX_TYPE_LEN, "task type");
            byte[] dedup = c.str(0, MAX_DEDUP_KEY_LEN, "dedup_key");
            long plen = c.u32("payload length");
            if (plen > MAX_PAYLOAD_LEN) throw new BadFrameException("payload of " + plen + " bytes");
            byte[] payload = c.bytes((int) plen, "payload");
            byte[] group = (flags & SUBMIT_GROUP_KEY) != 0 ? c.str(0, MAX_GROUP_KEY_LEN, "group_key") : new byte[0];
            long[] after = NO_IDS;
            if ((flags & SUBMIT_AFTER) != 0) {
                int na = c.u16("after count");
                c.need(na * 8, "after ids"); // before anything of that size is allocated
                after = new long[na];
                for (int k = 0; k < na; k++) after[k] = c.u64("after id");
            }
            tasks.add(new SubmitTask(prio, maxAttempts, delay, timeout, type, dedup, payload, group, after));
        }
        return new Submit(req, flags, List.copyOf(tasks));
    }

    private static Submitted decodeSubmitted(Cursor c) throws BadFrameException {
        long req = c.u32("request_id");
        int status = c.u16("status");
        int n = c.u16("n");
        if (status > STATUS_UNAVAILABLE) throw new BadFrameException("SUBMITTED status " + status);
        if (n > MAX_SUBMIT_TASKS) throw new BadFrameException(n + " results");
        if ((status != STATUS_OK && n != 0) || (status == STATUS_OK && n == 0))
            throw new BadFrameException(n + " results with status " + status);
        if (c.left() < n * 9) throw new BadFrameException(n + " results in " + c.left() + " bytes");
        List<SubmitResult> results = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            int r = c.u8("result");
            long id = c.u64("task_id");
            if (r > RESULT_DUPLICATE) throw new BadFrameException("result " + r);
            results.add(new SubmitResult(r, id));
        }
        return new Submitted(req, status, List.copyOf(results), c.rest());
    }

    // ---- encoding ----

    /** A growable byte buffer that writes big-endian fields. */
    private static final class Enc {
        byte[] b = new byte[64];
        int n;

        void room(int k) {
            if (n + k > b.length) b = Arrays.copyOf(b, Math.max(b.length * 2, n + k));
        }
        void u8(int v) { room(1); b[n++] = (byte) v; }
        void u16(int v) { room(2); b[n++] = (byte) (v >>> 8); b[n++] = (byte) v; }
        void u32(long v) { room(4); for (int s = 24; s >= 0; s -= 8) b[n++] = (byte) (v >>> s); }
        void u64(long v) { room(8); for (int s = 56; s >= 0; s -= 8) b[n++] = (byte) (v >>> s); }
        void raw(byte[] v) { room(v.length); System.arraycopy(v, 0, b, n, v.length); n += v.length; }

        void str(byte[] v, int min, int max, String what) throws BadFrameException {
            if (v.length < min || v.length > max)
                throw new BadFrameException(what + " of " + v.length + " bytes (" + min + " to " + max + ")");
            u16(v.length);
            raw(v);
        }
        void delivery(Delivery d) { u64(d.taskId()); u32(Integer.toUnsignedLong(d.epoch())); u32(Integer.toUnsignedLong(d.attempt())); }
        void list(List<Delivery> l) throws BadFrameException {
            if (l.isEmpty() || l.size() > MAX_CONFIRM) throw new BadFrameException(l.size() + " deliveries (1 to " + MAX_CONFIRM + ")");
            u16(l.size());
            for (Delivery d : l) delivery(d);
        }
    }

    private static void u32Field(long v, String what) throws BadFrameException {
        if (v < 0 || v > 0xFFFFFFFFL) throw new BadFrameException(what + " " + v + " out of range");
    }

    private static void u16Field(int v, String what) throws BadFrameException {
        if (v < 0 || v > 0xFFFF) throw new BadFrameException(what + " " + v + " out of range");
    }

    /** Returns m as one frame, length prefix included; a message a decoder would refuse is refused. */
    public static byte[] encode(Message m) throws BadFrameException {
        Enc e = new Enc();
        e.u32(0);
        e.u8(m.type());
        if (m instanceof Hello v) {
            u16Field(v.version(), "version");
            u32Field(v.capacity(), "capacity");
            if (!helloCountsOk(v.version(), v.capacity(), v.types().size()))
                throw new BadFrameException("capacity " + v.capacity() + " with " + v.types().size() + " types in version " + v.version());
            e.u16(v.version());
            e.u32(v.capacity());
            e.str(v.name(), 0, MAX_NAME_LEN, "name");
            e.str(v.token(), 0, MAX_TOKEN_LEN, "token");
            e.u16(v.types().size());
            for (byte[] t : v.types()) e.str(t, 1, MAX_TYPE_LEN, "task type");
        } else if (m instanceof Welcome v) {
            u16Field(v.version(), "version");
            u32Field(v.heartbeatMs(), "heartbeat_ms");
            u32Field(v.maxBody(), "max_body");
            e.u16(v.version());
            e.u32(v.heartbeatMs());
            e.u32(v.maxBody());
            e.str(v.server(), 0, MAX_NAME_LEN, "server");
        } else if (m instanceof Heartbeat || m instanceof Stop) {
            // a type byte only
        } else if (m instanceof ErrorFrame v) {
            u16Field(v.code(), "code");
            e.u16(v.code());
            e.raw(v.message());
        } else if (m instanceof Task v) {
            if (v.priority() < 0 || v.priority() > PRIORITY_MAX) throw new BadFrameException("priority " + v.priority());
            u32Field(v.timeoutMs(), "timeout_ms");
            e.delivery(v.delivery());
            e.u32(v.timeoutMs());
            e.u8(v.priority());
            e.str(v.taskType(), 1, MAX_TYPE_LEN, "task type");
            e.raw(v.payload());
        } else if (m instanceof Done v) {
            if (v.outcome() < 0 || v.outcome() > OUTCOME_RETRY_AFTER) throw new BadFrameException("outcome " + v.outcome());
            u32Field(v.retryAfterMs(), "retry_after_ms");
            e.delivery(v.delivery());
            e.u8(v.outcome());
            e.u32(v.retryAfterMs());
            e.raw(v.data());
        } else if (m instanceof Extend v) {
            u32Field(v.extendMs(), "extend_ms");
            e.delivery(v.delivery());
            e.u32(v.extendMs());
        } else if (m instanceof Cancel v) {
            e.delivery(v.delivery());
        } else if (m instanceof Confirm v) {
            e.list(v.deliveries());
        } else if (m instanceof Holding v) {
            e.list(v.deliveries());
        } else if (m instanceof Progress v) {
            if (v.permille() < 0 || v.permille() > MAX_PERMILLE || !progressTextOk(v.message()))
                throw new BadFrameException("progress of " + v.permille() + " permille");
            e.delivery(v.delivery());
            e.u16(v.permille());
            e.str(v.message(), 0, MAX_PROGRESS_MSG, "progress message");
        } else if (m instanceof Submit v) {
            encodeSubmit(e, v);
        } else if (m instanceof Submitted v) {
            int n = v.results().size();
            if (v.status() < 0 || v.status() > STATUS_UNAVAILABLE || n > MAX_SUBMIT_TASKS || (v.status() == STATUS_OK) != (n > 0))
                throw new BadFrameException("SUBMITTED status " + v.status() + " with " + n + " results");
            u32Field(v.requestId(), "request_id");
            e.u32(v.requestId());
            e.u16(v.status());
            e.u16(n);
            for (SubmitResult r : v.results()) {
                if (r.result() < 0 || r.result() > RESULT_DUPLICATE) throw new BadFrameException("result " + r.result());
                e.u8(r.result());
                e.u64(r.taskId());
            }
            e.raw(v.message());
        } else if (m instanceof Outcome v) {
            if (v.state() != STATE_SUCCESSFUL && v.state() != STATE_FAILED) throw new BadFrameException("outcome state " + v.state());
            u32Field(v.requestId(), "request_id");
            e.u32(v.requestId());
            e.u64(v.taskId());
            e.u8(v.state());
            e.raw(v.data());
        }
        int body = e.n - LEN_PREFIX;
        if (body > MAX_BODY_DEFAULT) throw new BadFrameException("body of " + body + " bytes");
        byte[] out = Arrays.copyOf(e.b, e.n);
        out[0] = (byte) (body >>> 24);
        out[1] = (byte) (body >>> 16);
        out[2] = (byte) (body >>> 8);
        out[3] = (byte) body;
        return out;
    }

    private static void encodeSubmit(Enc e, Submit s) throws BadFrameException {
        if ((s.flags() & ~SUBMIT_FLAGS_KNOWN) != 0) throw new BadFrameException(String.format("SUBMIT flags 0x%02x", s.flags()));
        int n = s.tasks().size();
        if (n == 0 || n > MAX_SUBMIT_TASKS) throw new BadFrameException(n + " tasks (1 to " + MAX_SUBMIT_TASKS + ")");
        u32Field(s.requestId(), "request_id");
        e.u32(s.requestId());
        e.u8(s.flags());
        e.u16(n);
        int i = 0;
        for (SubmitTask t : s.tasks()) {
            if (t.priority() < 0 || t.priority() > PRIORITY_MAX || t.maxAttempts() < 0 || t.maxAttempts() > MAX_ATTEMPTS
                    || t.payload().length > MAX_PAYLOAD_LEN)
                throw new BadFrameException("task " + i + ": priority " + t.priority() + ", max_attempts " + t.maxAttempts()
                        + ", payload of " + t.payload().length + " bytes");
            u32Field(t.delayMs(), "delay_ms");
            u32Field(t.timeoutMs(), "timeout_ms");
            e.u8(t.priority());
            e.u16(t.maxAttempts());
            e.u32(t.delayMs());
            e.u32(t.timeoutMs());
            e.str(t.taskType(), 1, MAX_TYPE_LEN, "task type");
            e.str(t.dedupKey(), 0, MAX_DEDUP_KEY_LEN, "dedup_key");
            e.u32(t.payload().length);
            e.raw(t.payload());
            if ((s.flags() & SUBMIT_GROUP_KEY) != 0) {
                e.str(t.groupKey(), 0, MAX_GROUP_KEY_LEN, "group_key");
            } else if (t.groupKey().length != 0) {
                throw new BadFrameException("task " + i + " has a group_key without the GROUP_KEY flag");
            }
            long[] after = t.after() == null ? NO_IDS : t.after();
            if ((s.flags() & SUBMIT_AFTER) != 0) {
                if (after.length > 0xFFFF)
                    throw new BadFrameException("task " + i + " waits for " + after.length + " tasks (at most 65535 on the wire)");
                e.u16(after.length);
                for (long id : after) e.u64(id);
            } else if (after.length != 0) {
                throw new BadFrameException("task " + i + " has after ids without the AFTER flag");
            }
            i++;
        }
    }

    /** What {@link #check} finds in buffered bytes (proto_frame_check). */
    public enum Status { OK, NEED_MORE, TOO_BIG, BAD }

    /** Looks at buffered bytes: OK when a whole frame is there, NEED_MORE, or TOO_BIG/BAD from the prefix alone. */
    public static Status check(byte[] buf, int len, long maxBody) {
        if (len < LEN_PREFIX) return Status.NEED_MORE;
        long n = prefix(buf);
        if (n == 0) return Status.BAD;
        if (n > maxBody) return Status.TOO_BIG;
        if (len < LEN_PREFIX + n) return Status.NEED_MORE;
        return Status.OK;
    }

    /** The body length a 4-byte prefix announces. */
    public static long prefix(byte[] b) {
        return ((long) (b[0] & 0xFF) << 24) | ((b[1] & 0xFF) << 16) | ((b[2] & 0xFF) << 8) | (b[3] & 0xFF);
    }
}
