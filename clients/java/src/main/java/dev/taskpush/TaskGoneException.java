package dev.taskpush;

/** The delivery was cancelled (or, in protocol versions 1 and 2, its connection lost): give up. */
public class TaskGoneException extends Exception {
    private static final long serialVersionUID = 1L;

    public TaskGoneException(String message) { super(message); }
}
