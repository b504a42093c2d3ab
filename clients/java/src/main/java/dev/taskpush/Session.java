package dev.taskpush;

import dev.taskpush.wire.BadFrameException;
import dev.taskpush.wire.FrameReader;
import dev.taskpush.wire.Wire;
import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * One session with a dispatcher, after WELCOME. Any thread queues frames ({@link #send}) and,
 * when no other thread is writing, writes what is queued itself (one thread writes at a time,
 * taking every frame queued meanwhile): a DONE costs no wake-up of another thread, and a runner
 * that runs tasks back to back only queues their DONEs ({@link #queue}) and writes them together
 * ({@link #write}). The reading thread reads as much as the socket holds at once, hands the
 * tasks of that read over together (FrameHandler.onBatchEnd), and only queues (a write that
 * blocks must not stop the reads that detect a silent peer); the session's writer thread writes
 * what it queued and what waits unwritten, sends HEARTBEAT when nothing was sent for an
 * interval, and closes a closing session. A dispatcher silent for 3 intervals is lost.
 */
final class Session {
    /** Bounds the answer to HELLO: a WELCOME or an ERROR; no TASK comes before WELCOME. */
    static final int HANDSHAKE_MAX_BODY = 65536;

    final Options.Address addr;
    final int version;
    final long hbMs;
    final long maxBody; // the dispatcher's limit for what we send
    final String server;
    private final Socket socket; // the TCP socket under a TLS one: closed without close_notify
    private final Socket io;
    private final FrameReader reader;

    private final Object lock = new Object();
    private ByteArrayOutputStream out = new ByteArrayOutputStream();
    private boolean closed, closing;
    private boolean writing; // a thread is writing: the others only queue
    private volatile long lastSendNanos = System.nanoTime();
    private Heard heard; // when the last bytes arrived

    /** Bytes, not whole frames, show the dispatcher alive: a big frame may take longer than 3
     *  heartbeats to arrive (libtaskpush, Python and Go count bytes too; conformance scenario 15). */
    private static final class Heard extends java.io.FilterInputStream {
        volatile long nanos = System.nanoTime();

        Heard(InputStream in) { super(in); }

        @Override public int read() throws IOException {
            int b = super.read();
            if (b >= 0) nanos = System.nanoTime();
            return b;
        }

        @Override public int read(byte[] buf, int off, int len) throws IOException {
            int n = super.read(buf, off, len);
            if (n > 0) nanos = System.nanoTime();
            return n;
        }
    }
    private volatile Thread readerThread;
    private Exception reason;

    interface FrameHandler {
        /** A frame but ERROR; an exception ends the session with ERROR UNEXPECTED. */
        void onFrame(Wire.Message m) throws IOException;

        /** The frames one read brought were all handed to onFrame: the reader is about to wait. */
        default void onBatchEnd() {}
    }

    private Session(Options.Address addr, int version, long hbMs, long maxBody, String server, Socket socket, Socket io,
                    FrameReader reader) {
        this.addr = addr;
        this.version = version;
        this.hbMs = hbMs;
        this.maxBody = maxBody;
        this.server = server;
        this.socket = socket;
        this.io = io;
        this.reader = reader;
    }

    /** Connects, sends HELLO and waits for WELCOME within the connect timeout. */
    static Session dial(Options.Address addr, Wire.Hello hello, Options o) throws IOException {
        int timeout = (int) Math.min(Integer.MAX_VALUE, o.connectTimeout.toMillis());
        Socket tcp = new Socket();
        boolean ok = false;
        try {
            tcp.setTcpNoDelay(true);
            tcp.connect(new InetSocketAddress(addr.host(), addr.port()), timeout);
            tcp.setSoTimeout(timeout);
            Socket io = tcp;
            if (o.tls != null) {
                SSLSocket s = (SSLSocket) o.tls.getSocketFactory().createSocket(tcp, addr.host(), addr.port(), true);
                SSLParameters p = s.getSSLParameters();
                p.setEndpointIdentificationAlgorithm("HTTPS"); // the certificate names this host
                s.setSSLParameters(p);
                s.setUseClientMode(true);
                try {
                    s.startHandshake();
                } catch (IOException e) {
                    throw new IOException("TLS handshake with " + addr + ": " + e.getMessage(), e);
                }
                io = s;
            }
            OutputStream os = io.getOutputStream();
            os.write(Wire.encode(hello));
            os.flush();
            Heard heard = new Heard(io.getInputStream());
            FrameReader fr = new FrameReader(heard, HANDSHAKE_MAX_BODY); // buffered itself
            Wire.Message m;
            try {
                m = fr.read();
            } catch (FrameReader.TooBigException e) {
                if (new String(e.prefix(), StandardCharsets.ISO_8859_1).equals("HTTP"))
                    throw new IOException(addr + ": an HTTP server answered: this is not a dispatcher's worker port "
                            + "(taskpushd's admin port?); workers connect to taskpushd --listen");
                throw new IOException(addr + ": in answer to HELLO: " + e.getMessage(), e);
            } catch (SocketTimeoutException e) {
                throw new IOException(addr + ": no answer to HELLO within " + timeout + " ms", e);
            }
            if (m == null) throw new EOFException(addr + ": closed in answer to HELLO");
            if (m instanceof Wire.ErrorFrame e) throw new DispatcherException(addr.toString(), e.code(), e.text());
            if (!(m instanceof Wire.Welcome w)) throw new IOException(addr + " answered HELLO with " + Wire.typeName(m.type()));
            // A WELCOME above our version (a newer dispatcher) is spoken to in ours, one below in its own.
            int version = Math.min(hello.version(), w.version());
            if (version < Wire.VERSION_MIN) throw new IOException(addr + " answered version " + w.version());
            long hb = Math.max(1, w.heartbeatMs());
            // No read timeout in the session: a timed read costs a poll before each read. The
            // writer thread, awake every interval anyway, closes a session silent for 3.
            io.setSoTimeout(0);
            tcp.setSoTimeout(0);
            fr.setMaxBody(Wire.MAX_BODY_DEFAULT);
            ok = true;
            Session session = new Session(addr, version, hb, w.maxBody(), new String(w.server(), StandardCharsets.UTF_8), tcp, io, fr);
            session.heard = heard;
            return session;
        } finally {
            if (!ok) tcp.close();
        }
    }

    /**
     * Dials from versions[addr] (or the first) down to lowest: a dispatcher that answers ERROR
     * VERSION is asked again one version lower, and versions remembers what it speaks.
     */
    static Session dialNegotiated(Options.Address addr, Wire.Hello hello, Map<Options.Address, Integer> versions,
                                  int lowest, Options o) throws IOException {
        int v = versions.getOrDefault(addr, o.protocolVersion);
        while (true) {
            Wire.Hello h = new Wire.Hello(v, hello.capacity(), hello.name(), hello.token(), hello.types());
            try {
                return dial(addr, h, o);
            } catch (DispatcherException e) {
                if (!e.versionRefused() || v <= lowest) throw e;
                v--;
                versions.put(addr, v);
                o.log.accept(addr + " refused protocol version " + (v + 1) + "; falling back to " + v);
            }
        }
    }

    /** m encoded, or null when it cannot be (a bound it breaks). */
    private static byte[] frameOf(Wire.Message m) {
        try {
            return Wire.encode(m);
        } catch (BadFrameException e) {
            return null;
        }
    }

    /** Queues m; false once the session is closed (or closing). */
    boolean send(Wire.Message m) {
        byte[] f = frameOf(m);
        if (f == null) return false;
        synchronized (lock) {
            if (closed || closing) return false;
            out.write(f, 0, f.length);
            if (writing) return true;
            if (Thread.currentThread() == readerThread) {
                lock.notifyAll(); // the writer thread writes it
                return true;
            }
            writing = true;
        }
        flush();
        return true;
    }

    /**
     * Queues m without writing it: the caller writes it with what follows ({@link #write}), and
     * the writer thread does within a heartbeat interval. False once the session is closed.
     */
    boolean queue(Wire.Message m) {
        byte[] f = frameOf(m);
        if (f == null) return false;
        synchronized (lock) {
            if (closed || closing) return false;
            out.write(f, 0, f.length);
            return true;
        }
    }

    /** Writes what is queued unless another thread is writing (it takes it along). */
    void write() {
        synchronized (lock) {
            if (writing || closed || out.size() == 0) return;
            writing = true;
        }
        flush();
    }

    /** Writes what is queued until nothing is; called with writing set, clears it. */
    private void flush() {
        try {
            OutputStream os = io.getOutputStream();
            while (true) {
                byte[] buf;
                synchronized (lock) {
                    if (closed || out.size() == 0) {
                        writing = false;
                        if (closing) lock.notifyAll(); // the writer thread closes it now
                        return;
                    }
                    buf = out.toByteArray();
                    if (out.size() > (1 << 20)) out = new ByteArrayOutputStream(); // a huge result's buffer is not kept
                    else out.reset();
                }
                os.write(buf);
                os.flush();
                lastSendNanos = System.nanoTime();
            }
        } catch (IOException e) {
            synchronized (lock) {
                writing = false;
            }
            shutdown(new IOException("write to " + addr + ": " + e.getMessage(), e));
        }
    }

    /** Ends the session once what is queued is written. */
    void closeAfterFlush() {
        synchronized (lock) {
            closing = true;
            lock.notifyAll();
        }
    }

    /** Ends the session at once, dropping what is queued. */
    void abort() { shutdown(new IOException("closed by this side")); }

    boolean isClosed() {
        synchronized (lock) {
            return closed;
        }
    }

    /** Waits up to ms for the session to close; true when closed. */
    boolean awaitClosed(long ms) throws InterruptedException {
        long end = System.nanoTime() + ms * 1_000_000L;
        synchronized (lock) {
            while (!closed) {
                long left = (end - System.nanoTime()) / 1_000_000L;
                if (left <= 0) return false;
                lock.wait(left);
            }
            return true;
        }
    }

    Exception reason() {
        synchronized (lock) {
            return reason;
        }
    }

    void shutdown(Exception why) {
        synchronized (lock) {
            if (closed) return;
            closed = true;
            reason = why;
            out = new ByteArrayOutputStream();
            lock.notifyAll();
        }
        // The TCP socket itself: a TLS close would first write close_notify, which can block
        // on a peer that reads nothing.
        try {
            socket.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }

    private void sendErrorNow(int code, String text) {
        if (text.length() > 200) text = text.substring(0, 200);
        try {
            socket.setSoTimeout(1000);
            io.getOutputStream().write(Wire.encode(new Wire.ErrorFrame(code, text.getBytes(StandardCharsets.UTF_8))));
            io.getOutputStream().flush();
        } catch (IOException ignored) {
            // the connection closes anyway
        }
    }

    /** Runs the session until it ends and returns why; the writer runs on a thread of factory. */
    Exception serve(FrameHandler handler, java.util.concurrent.ThreadFactory factory) {
        readerThread = Thread.currentThread();
        Thread writer = factory.newThread(this::writeLoop);
        writer.start();
        while (true) {
            try {
                if (!reader.hasFrame()) handler.onBatchEnd();
                Wire.Message m = reader.read();
                if (m == null) {
                    shutdown(new EOFException("connection closed by the dispatcher"));
                    break;
                }
                if (m instanceof Wire.ErrorFrame e) {
                    shutdown(new DispatcherException(addr.toString(), e.code(), e.text()));
                    break;
                }
                try {
                    handler.onFrame(m);
                } catch (IOException e) {
                    sendErrorNow(Wire.ERR_UNEXPECTED, e.getMessage());
                    shutdown(e);
                    break;
                }
            } catch (BadFrameException e) {
                sendErrorNow(Wire.ERR_BAD_FRAME, e.getMessage());
                shutdown(new IOException("bad frame from the dispatcher: " + e.getMessage(), e));
                break;
            } catch (IOException e) {
                shutdown(e);
                break;
            }
        }
        handler.onBatchEnd(); // tasks decoded before the end still run (version 3 keeps them)
        try {
            writer.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return reason();
    }

    /** Heartbeats, the reading thread's frames, and the close of a closing session. */
    private void writeLoop() {
        byte[] beat;
        try {
            beat = Wire.encode(new Wire.Heartbeat());
        } catch (BadFrameException e) {
            throw new IllegalStateException(e);
        }
        try {
            while (true) {
                boolean closeNow = false, silent = false;
                synchronized (lock) {
                    while (true) {
                        if (closed) return;
                        long now = System.nanoTime();
                        long quiet = 3 * hbMs - (now - heard.nanos) / 1_000_000L;
                        if (quiet <= 0) {
                            silent = true;
                            break;
                        }
                        long wait = Math.min(quiet, hbMs - (now - lastSendNanos) / 1_000_000L);
                        if (writing) { // that thread writes all that is queued
                            lock.wait(Math.max(1, wait > 0 ? wait : quiet));
                            continue;
                        }
                        if (out.size() > 0) break;
                        if (closing) {
                            closeNow = true;
                            break;
                        }
                        if (wait <= 0) {
                            out.write(beat, 0, beat.length);
                            break;
                        }
                        lock.wait(wait);
                    }
                    if (!closeNow) writing = true;
                }
                if (silent) {
                    shutdown(new IOException("dispatcher silent for " + 3 * hbMs + " ms"));
                    return;
                }
                if (closeNow) {
                    shutdown(new IOException("closed by this side"));
                    return;
                }
                flush();
            }
        } catch (InterruptedException e) {
            shutdown(new IOException("interrupted"));
        }
    }
}
