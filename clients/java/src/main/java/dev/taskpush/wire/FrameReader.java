package dev.taskpush.wire;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.util.Arrays;

/**
 * Reads whole frames from a stream through a buffer of its own: one read takes as many frames
 * as the stream has ready, and {@link #hasFrame} says whether the next one is already here (the
 * end of what one read brought). It never allocates on a length it has not checked against its
 * limit; a body larger than the buffer is read into an array of its own.
 */
public final class FrameReader {
    private static final int BUFFER = 64 * 1024;

    private final InputStream in;
    private volatile long maxBody;
    private final byte[] buf = new byte[BUFFER];
    private int start, end; // buf[start, end) is read and not yet taken

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

    /** True when a whole frame is buffered: the next read returns without touching the stream. */
    public boolean hasFrame() {
        int have = end - start;
        if (have < Wire.LEN_PREFIX) return false;
        long n = prefixAt(start);
        return n > 0 && n <= maxBody && have - Wire.LEN_PREFIX >= n;
    }

    /** The next frame's body; null at a clean end of stream (between frames). */
    public byte[] readBody() throws IOException {
        long n = nextLength();
        return n < 0 ? null : copyBody((int) n);
    }

    /** The next decoded frame; null at a clean end of stream. A frame that fits the buffer is decoded in place. */
    public Wire.Message read() throws IOException {
        long n = nextLength();
        if (n < 0) return null;
        if (n > buf.length) return Wire.decode(copyBody((int) n));
        fill((int) n);
        Wire.Message m = Wire.decode(buf, start, (int) n);
        start += (int) n;
        return m;
    }

    private byte[] copyBody(int n) throws IOException {
        byte[] body = new byte[n];
        int have = Math.min(end - start, n);
        System.arraycopy(buf, start, body, 0, have);
        start += have;
        if (have < n && readFully(body, have, n - have) < n - have) throw new EOFException("stream cut inside a frame");
        return body;
    }

    /** Takes the next length prefix and checks it; -1 at a clean end of stream. */
    private long nextLength() throws IOException {
        if (end - start < Wire.LEN_PREFIX) {
            int had = end - start;
            if (!fillSome(Wire.LEN_PREFIX)) {
                if (end - start == 0 && had == 0) return -1;
                throw new EOFException("stream cut inside a length prefix");
            }
        }
        long n = prefixAt(start);
        if (n == 0) throw new BadFrameException("a frame of length 0");
        if (n > maxBody) throw new TooBigException(Arrays.copyOfRange(buf, start, start + Wire.LEN_PREFIX), n, maxBody);
        start += Wire.LEN_PREFIX;
        return n;
    }

    /** Makes n bytes (n <= the buffer) available at start. */
    private void fill(int n) throws IOException {
        if (end - start < n && !fillSome(n)) throw new EOFException("stream cut inside a frame");
    }

    /** Reads until at least n bytes are buffered; false at the end of the stream first. */
    private boolean fillSome(int n) throws IOException {
        if (start == end) start = end = 0;
        if (buf.length - start < n) { // move what is left to the front
            System.arraycopy(buf, start, buf, 0, end - start);
            end -= start;
            start = 0;
        }
        while (end - start < n) {
            int r = in.read(buf, end, buf.length - end);
            if (r < 0) return false;
            end += r;
        }
        return true;
    }

    private long prefixAt(int off) {
        return ((long) (buf[off] & 0xFF) << 24) | ((buf[off + 1] & 0xFF) << 16) | ((buf[off + 2] & 0xFF) << 8)
                | (buf[off + 3] & 0xFF);
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
