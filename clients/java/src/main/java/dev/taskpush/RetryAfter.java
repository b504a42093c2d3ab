package dev.taskpush;

import java.time.Duration;

/** Thrown by a handler: deliver the task again after a delay (DONE RETRY_AFTER), while attempts are left. */
public class RetryAfter extends Exception {
    private static final long serialVersionUID = 1L;
    private final Duration delay;

    public RetryAfter(Duration delay, String message) {
        super(message);
        this.delay = delay;
    }

    public Duration delay() { return delay; }
}
