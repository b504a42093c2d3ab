package dev.taskpush;

/**
 * One submitted task: its id, whether its dedup key was already present (then the id is the
 * existing row's, 0 if unknown), and for {@link Client#submitWait} its outcome (null for a duplicate).
 */
public record Receipt(long taskId, boolean duplicate, Outcome outcome) {
    /** How a waited-for task ended: SUCCESSFUL (data is the result) or FAILED (data is the err_msg). */
    public record Outcome(boolean succeeded, byte[] data) {}
}
