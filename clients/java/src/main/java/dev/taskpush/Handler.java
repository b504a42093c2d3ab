package dev.taskpush;

/**
 * Runs one task. What it returns is the task's result (SUCCESSFUL); {@link PermanentFailure}
 * fails the task, {@link RetryAfter} retries it after a delay, any other exception (or error)
 * fails the attempt, retried with the dispatcher's backoff while attempts are left.
 *
 * <p>When the dispatcher sends CANCEL (the lease expired, an operator cancelled it) or the
 * worker stops at once, {@link Task#isCancelled()} turns true and the handler's thread is
 * interrupted: blocking calls throw InterruptedException.
 */
@FunctionalInterface
public interface Handler {
    byte[] handle(Task task) throws Exception;
}
