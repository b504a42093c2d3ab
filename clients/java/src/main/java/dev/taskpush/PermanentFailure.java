package dev.taskpush;

/** Thrown by a handler: the task fails for good (DONE FAIL_PERM), never retried. */
public class PermanentFailure extends Exception {
    private static final long serialVersionUID = 1L;

    public PermanentFailure(String message) { super(message); }

    public PermanentFailure(String message, Throwable cause) { super(message, cause); }
}
