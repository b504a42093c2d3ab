package dev.taskpush;

import java.io.IOException;

/** A submission that was not acknowledged. */
public class SubmitException extends IOException {
    private static final long serialVersionUID = 1L;

    /** Why. */
    public enum Kind {
        /** Nothing was acknowledged (no dispatcher, a standby, the database away, the connection lost): submit again, with dedup keys to be safe. */
        UNAVAILABLE,
        /** The dispatcher refused the submission: nothing was inserted. */
        INVALID,
        /** The dispatcher speaks protocol version 1, which has no SUBMIT. */
        NO_SUBMIT,
        /** The submission was acknowledged (its rows are committed), then the connection was lost before the outcomes. */
        OUTCOME_LOST
    }

    private final Kind kind;

    public SubmitException(Kind kind, String message) {
        super(message);
        this.kind = kind;
    }

    public Kind kind() { return kind; }
}
