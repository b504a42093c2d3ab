package dev.taskpush.wire;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;

/** Reads whole frames from a stream; it never allocates on a length it has not checked against its limit. */
public final class FrameReader {
    private final InputStream in;
    private volatile long maxBody;
    private final byte[] head = new byte[Wire.LEN_PREFIX];

    /** A length prefix over the reader's limit; the four bytes are kept to recognise an HTTP answer. */
    public static final class TooBigException extends BadFrameException {
        private static final long serialVersionUID = 1L;
        private final byte[] prefix;

        TooBigException(byte[] prefix, long len, long max) {
            super("a body of " + len + " bytes, over the limit of " + max);
            this.prefix = prefix.clone();
        }

        public byte[] prefix() { return prefix.clone(); }
    }

    public FrameReader(InputStream in, long maxBody) {
        this.in = in;
        this.maxBody = maxBody;
    }

    public void setMaxBody(long maxBody) { this.maxBody = maxBody; }

    /** The next frame's body; null at a clean end of stream (between frames). */
    public byte[] readBody() throws IOException {
        int got = readFully(head, 0, head.length);
        if (got == 0) return null;
        if (got < head.length) throw new EOFException("stream cut inside a length prefix");
        long n = Wire.prefix(head);
        if (n == 0) throw new BadFrameException("a frame of length 0");
        if (n > maxBody) throw new TooBigException(head, n, maxBody);
        byte[] body = new byte[(int) n];
        if (readFully(body, 0, body.length) < body.length) throw new EOFException("stream cut inside a frame");
        return body;
    }

    /** The next decoded frame; null at a clean end of stream. */
    public Wire.Message read() throws IOException {
        byte[] body = readBody();
        return body == null ? null : Wire.decode(body);
    }

    private int readFully(byte[] b, int off, int len) throws IOException {
        int done = 0;
        while (done < len) {
            int r = in.read(b, off + done, len - done);
            if (r < 0) break;
            done += r;
        }
        return done;
    }
}
