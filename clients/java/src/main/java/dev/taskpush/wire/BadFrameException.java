package dev.taskpush.wire;

import java.io.IOException;

/** A body that does not match its type's layout, a length over the limit, or a message that cannot be encoded. */
public class BadFrameException extends IOException {
    private static final long serialVersionUID = 1L;

    public BadFrameException(String message) {
        super("bad frame: " + message);
    }
}
