package dev.taskpush;

import dev.taskpush.wire.Wire;
import java.io.IOException;

/** An ERROR frame from the dispatcher: the last frame of a connection, or the answer to HELLO. */
public class DispatcherException extends IOException {
    private static final long serialVersionUID = 1L;
    private final int code;

    public DispatcherException(String address, int code, String message) {
        super(address + " sent ERROR " + code + ": " + message);
        this.code = code;
    }

    /** The ERROR code (1 BAD_FRAME ... 7 NOT_LEADER, docs/protocol.md). */
    public int code() { return code; }

    /** A standby answered (PROTO_ERR_NOT_LEADER): the next address is tried at once. */
    public boolean notLeader() { return code == Wire.ERR_NOT_LEADER; }

    public boolean authRefused() { return code == Wire.ERR_AUTH; }

    public boolean versionRefused() { return code == Wire.ERR_VERSION; }
}
