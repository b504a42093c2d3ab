package dev.taskpush;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Objects;

/** One task to submit: a type and a payload, and optional fields set fluently. */
public final class NewTask {
    final String type;
    final byte[] payload;
    Priority priority = Priority.NORMAL;
    String dedupKey = "", groupKey = "";
    Duration delay = Duration.ZERO, timeout = Duration.ZERO;
    int maxAttempts;

    public NewTask(String type, byte[] payload) {
        this.type = Objects.requireNonNull(type);
        this.payload = payload == null ? new byte[0] : payload;
    }

    public NewTask(String type, String payload) { this(type, payload.getBytes(StandardCharsets.UTF_8)); }

    public NewTask priority(Priority p) { priority = Objects.requireNonNull(p); return this; }
    /** At most 191 bytes; a second task with the key is a duplicate. */
    public NewTask dedupKey(String k) { dedupKey = Objects.requireNonNull(k); return this; }
    /** Fair share within a type and priority (at most 191 bytes). */
    public NewTask groupKey(String k) { groupKey = Objects.requireNonNull(k); return this; }
    /** Run no sooner than this after the insert. */
    public NewTask delay(Duration d) { delay = Objects.requireNonNull(d); return this; }
    /** The lease; zero: the dispatcher's default. */
    public NewTask timeout(Duration d) { timeout = Objects.requireNonNull(d); return this; }
    /** 0: the table's default (3); at most 1000. */
    public NewTask maxAttempts(int n) { maxAttempts = n; return this; }
}
