package dev.taskpush;

import dev.taskpush.wire.Wire;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;
import javax.net.ssl.SSLContext;

/**
 * How a {@link Worker} or a {@link Client} connects: immutable, made with {@link #builder()}.
 * Every field has a default, so {@code Options.defaults()} will do.
 */
public final class Options {
    final String name;
    final String token;
    final SSLContext tls;
    final Duration reconnectMin, reconnectMax, connectTimeout, drainTimeout;
    final int protocolVersion;
    final Consumer<String> log;

    private Options(Builder b) {
        String n = b.name != null ? b.name : defaultName();
        byte[] nb = n.getBytes(StandardCharsets.UTF_8);
        if (nb.length > Wire.MAX_NAME_LEN) { // cut at a UTF-8 boundary, so that it stays at most 256 bytes
            int end = Wire.MAX_NAME_LEN;
            while (end > 0 && (nb[end] & 0xC0) == 0x80) end--;
            n = new String(nb, 0, end, StandardCharsets.UTF_8);
        }
        this.name = n;
        this.token = b.token == null ? "" : b.token;
        if (token.getBytes(StandardCharsets.UTF_8).length > Wire.MAX_TOKEN_LEN)
            throw new IllegalArgumentException("a token of more than " + Wire.MAX_TOKEN_LEN + " bytes");
        this.tls = b.tls;
        this.reconnectMin = positive(b.reconnectMin, Duration.ofMillis(100));
        Duration max = positive(b.reconnectMax, Duration.ofSeconds(5));
        this.reconnectMax = max.compareTo(reconnectMin) < 0 ? reconnectMin : max;
        this.connectTimeout = positive(b.connectTimeout, Duration.ofSeconds(5));
        this.drainTimeout = b.drainTimeout == null ? Duration.ZERO : b.drainTimeout;
        this.protocolVersion = b.protocolVersion == 0 ? Wire.VERSION : b.protocolVersion;
        if (protocolVersion < Wire.VERSION_MIN || protocolVersion > Wire.VERSION)
            throw new IllegalArgumentException("protocol version " + protocolVersion + " (" + Wire.VERSION_MIN + " to " + Wire.VERSION + ")");
        this.log = b.log == null ? s -> { } : b.log;
    }

    private static Duration positive(Duration d, Duration dflt) {
        return d == null || d.isZero() || d.isNegative() ? dflt : d;
    }

    private static String defaultName() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (UnknownHostException e) {
            host = "localhost";
        }
        return host + ":" + ProcessHandle.current().pid();
    }

    public static Options defaults() { return builder().build(); }

    public static Builder builder() { return new Builder(); }

    public String name() { return name; }

    /** Every field of Options; unset means the default. */
    public static final class Builder {
        private String name, token;
        private SSLContext tls;
        private Duration reconnectMin, reconnectMax, connectTimeout, drainTimeout;
        private int protocolVersion;
        private Consumer<String> log;

        private Builder() {}

        /** Shown by the dispatcher in /workers; default HOSTNAME:PID. */
        public Builder name(String v) { name = v; return this; }
        /** The dispatcher's shared secret (taskpushd --token-file). */
        public Builder token(String v) { token = v; return this; }
        /** Speak TLS to a taskpushd --tls-cert; see {@link Tls#context}. */
        public Builder tls(SSLContext v) { tls = v; return this; }
        /** Bounds of the reconnect backoff (100 ms, 5 s): each round of failures doubles the ceiling. */
        public Builder reconnect(Duration min, Duration max) { reconnectMin = min; reconnectMax = max; return this; }
        /** Bounds the TCP connect, the TLS handshake and HELLO/WELCOME (5 s). */
        public Builder connectTimeout(Duration v) { connectTimeout = v; return this; }
        /** Bounds {@link Worker#close()}'s drain; past it the held tasks are cancelled. Zero: no bound. */
        public Builder drainTimeout(Duration v) { drainTimeout = v; return this; }
        /** The first HELLO's version (3); an older dispatcher that refuses it is asked one version lower. */
        public Builder protocolVersion(int v) { protocolVersion = v; return this; }
        /** Receives the library's diagnostics, from several threads; none by default (the library never prints). */
        public Builder log(Consumer<String> v) { log = v; return this; }

        public Options build() { return new Options(this); }
    }

    /** Splits "HOST:PORT[,HOST:PORT...]" (IPv6 as [::1]:7070). */
    public static List<Address> parseAddresses(String spec) {
        Objects.requireNonNull(spec, "addresses");
        List<Address> out = new ArrayList<>();
        for (String item : spec.split(",")) {
            item = item.trim();
            int colon = item.lastIndexOf(':');
            if (colon <= 0) throw new IllegalArgumentException("address '" + item + "' is not HOST:PORT");
            String host = item.substring(0, colon);
            if (host.startsWith("[") && host.endsWith("]")) host = host.substring(1, host.length() - 1);
            int port;
            try {
                port = Integer.parseInt(item.substring(colon + 1));
            } catch (NumberFormatException e) {
                port = -1;
            }
            if (host.isEmpty() || port < 1 || port > 65535) throw new IllegalArgumentException("address '" + item + "': bad host or port");
            out.add(new Address(host, port));
        }
        return List.copyOf(out);
    }

    /** One dispatcher address. */
    public record Address(String host, int port) {
        @Override public String toString() { return (host.indexOf(':') >= 0 ? "[" + host + "]" : host) + ":" + port; }
    }
}
