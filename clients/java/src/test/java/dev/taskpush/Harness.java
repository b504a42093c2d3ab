package dev.taskpush;

import dev.taskpush.TapRunner.TestContext;
import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.LocalTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.SSLContext;

/**
 * Fixtures of the integration tests: a database of its own on the test MariaDB
 * (scripts/tp-mariadb's TASKPUSH_TEST_MYSQL_* environment; SQL through the mariadb command-line
 * client, the library needs no driver), the build tree's real taskpushd (TASKPUSH_BUILD_ROOT),
 * and test certificates. Missing either fails the test: run through meson test.
 */
final class Harness {
    private Harness() {}

    static final Duration WAIT = Duration.ofSeconds(30); // every wait's bound; nothing asserts a duration
    static final List<String> DAEMON_FLAGS = List.of("--heartbeat-ms", "200", "--retry-backoff-ms", "50",
            "--retry-backoff-max-ms", "200", "--poll-ms", "20", "--shutdown-grace-ms", "3000", "--orphan-grace-ms", "200");
    private static final AtomicInteger SERIAL = new AtomicInteger();

    static String env(String k) {
        String v = System.getenv(k);
        return v == null ? "" : v;
    }

    static Path sourceRoot() {
        String r = env("TASKPUSH_SOURCE_ROOT");
        return Path.of(r.isEmpty() ? "../.." : r);
    }

    static void waitFor(String what, BooleanSupplier cond) throws InterruptedException {
        long end = System.nanoTime() + WAIT.toNanos();
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > end) throw new AssertionError("timed out after " + WAIT + " waiting for " + what);
            Thread.sleep(20);
        }
    }

    static Path tempDir(TestContext t) throws IOException {
        Path d = Files.createTempDirectory("tpjava");
        t.cleanup(() -> {
            try (var s = Files.walk(d)) {
                s.sorted(java.util.Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
            }
        });
        return d;
    }

    /** Runs a command, returns its stdout; fails on a non-zero exit. */
    static String run(List<String> cmd, String stdin, Path dir) throws IOException, InterruptedException {
        ProcessBuilder pb = new ProcessBuilder(cmd);
        if (dir != null) pb.directory(dir.toFile());
        Path err = Files.createTempFile("tpjava-err", ".txt");
        pb.redirectError(err.toFile());
        Process p = pb.start();
        Thread feeder = new Thread(() -> {
            try (var os = p.getOutputStream()) {
                if (stdin != null) os.write(stdin.getBytes(StandardCharsets.UTF_8));
            } catch (IOException ignored) {
                // the process ended early: its exit code says why
            }
        });
        feeder.start();
        byte[] out = p.getInputStream().readAllBytes();
        int rc = p.waitFor();
        feeder.join();
        String errText = Files.readString(err);
        Files.delete(err);
        if (rc != 0) throw new AssertionError(String.join(" ", cmd).replaceAll("-p\\S+", "-p***") + " exited " + rc + ": " + errText);
        return new String(out, StandardCharsets.UTF_8);
    }

    /** A database of the test's own, with the schema. */
    static final class DB {
        final String host = env("TASKPUSH_TEST_MYSQL_HOST"), port = env("TASKPUSH_TEST_MYSQL_PORT"),
                user = env("TASKPUSH_TEST_MYSQL_USER"), password = env("TASKPUSH_TEST_MYSQL_PASSWORD");
        final String name, url;
        String client;

        DB(TestContext t) throws IOException, InterruptedException {
            if (host.isEmpty() || port.isEmpty() || user.isEmpty())
                throw new AssertionError("TASKPUSH_TEST_MYSQL_HOST/PORT/USER are not set. Start a test server first:\n"
                        + "    eval \"$(scripts/tp-mariadb start /tmp/tpdb)\"");
            for (String c : new String[] {"mariadb", "mysql"}) {
                for (String dir : env("PATH").split(":")) {
                    if (client == null && Files.isExecutable(Path.of(dir, c))) client = Path.of(dir, c).toString();
                }
            }
            if (client == null) throw new AssertionError("no mariadb client (scripts/install-deps.sh installs mariadb-client-core)");
            String tag = t.name().replaceAll("[^A-Za-z0-9]", "_");
            if (tag.length() > 24) tag = tag.substring(tag.length() - 24);
            name = "tp_java_" + tag + "_" + ProcessHandle.current().pid() + "_" + SERIAL.incrementAndGet();
            sql("", "DROP DATABASE IF EXISTS `" + name + "`; CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4");
            sql(name, Files.readString(sourceRoot().resolve("sql/schema.sql")));
            url = "mysql://" + user + (password.isEmpty() ? "" : ":" + password) + "@" + host + ":" + port + "/" + name;
            t.cleanup(() -> {
                if (env("TASKPUSH_TEST_KEEP_DB").isEmpty()) sql("", "DROP DATABASE IF EXISTS `" + name + "`");
            });
        }

        String sql(String db, String text) throws IOException, InterruptedException {
            List<String> cmd = new ArrayList<>(List.of(client, "--no-defaults", "--protocol=tcp", "-h", host, "-P", port,
                    "-u", user, "--batch", "--skip-column-names", "--raw", "--default-character-set=utf8mb4"));
            if (!password.isEmpty()) cmd.add("-p" + password);
            if (!db.isEmpty()) cmd.add(db);
            return run(cmd, text, null);
        }

        void exec(String text) throws IOException, InterruptedException { sql(name, text); }

        List<String[]> rows(String text) throws IOException, InterruptedException {
            List<String[]> out = new ArrayList<>();
            for (String line : sql(name, text).split("\n")) if (!line.isEmpty()) out.add(line.split("\t", -1));
            return out;
        }

        int count(String where) throws IOException, InterruptedException {
            return Integer.parseInt(rows("SELECT COUNT(*) FROM task WHERE " + where).get(0)[0]);
        }

        /** One NEW row per payload (text payloads). */
        void insert(String type, String... payloads) throws IOException, InterruptedException {
            List<String> vals = new ArrayList<>();
            for (String p : payloads) vals.add("('" + type + "', '" + p.replace("'", "''") + "')");
            exec("INSERT INTO task (task_type, payload) VALUES " + String.join(",", vals));
        }

        void waitRows(String where, int n) throws InterruptedException {
            waitFor(n + " rows where " + where, () -> {
                try {
                    return count(where) >= n;
                } catch (IOException | InterruptedException e) {
                    throw new AssertionError(e);
                }
            });
        }
    }

    /** The build tree's taskpushd on loopback ports. */
    static final class Daemon {
        final TestContext t;
        final DB db;
        final List<String> extra;
        final Path ready, log;
        final SSLContext adminTls;
        Process proc;
        String listen, admin;

        Daemon(TestContext t, DB db, String listen, boolean lead, SSLContext adminTls, String... extra)
                throws IOException, InterruptedException {
            this.t = t;
            this.db = db;
            this.extra = Arrays.asList(extra);
            this.adminTls = adminTls;
            Path dir = tempDir(t);
            int n = SERIAL.incrementAndGet();
            ready = dir.resolve("ready-" + n);
            log = dir.resolve("taskpushd-" + n + ".log");
            t.cleanup(() -> {
                kill();
                List<String> lines = Files.exists(log) ? Files.readAllLines(log) : List.of();
                for (String l : lines.subList(Math.max(0, lines.size() - 40), lines.size())) t.log("taskpushd: " + l);
            });
            start(listen, lead);
        }

        void start(String listenAddr, boolean lead) throws IOException, InterruptedException {
            Files.deleteIfExists(ready);
            String build = env("TASKPUSH_BUILD_ROOT");
            if (build.isEmpty()) throw new AssertionError("TASKPUSH_BUILD_ROOT is not set: run through meson test (tests/conformance)");
            List<String> cmd = new ArrayList<>(List.of(Path.of(build, "dispatcher", "taskpushd").toString(), "--db", db.url,
                    "--listen", listenAddr, "--admin", "127.0.0.1:0", "--ready-file", ready.toString()));
            cmd.addAll(DAEMON_FLAGS);
            cmd.addAll(extra);
            ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()));
            proc = pb.start();
            Pattern lp = Pattern.compile("\"listen\"\\s*:\\s*\"([^\"]+)\""), ap = Pattern.compile("\"admin\"\\s*:\\s*\"([^\"]+)\"");
            long end = System.nanoTime() + WAIT.toNanos();
            while (true) {
                if (Files.exists(ready)) {
                    String j = Files.readString(ready);
                    Matcher l = lp.matcher(j), a = ap.matcher(j);
                    if (l.find() && a.find()) {
                        listen = l.group(1);
                        admin = a.group(1);
                        break;
                    }
                }
                if (!proc.isAlive()) throw new AssertionError("taskpushd exited early:\n" + Files.readString(log));
                if (System.nanoTime() > end) throw new AssertionError("taskpushd wrote no ready file");
                Thread.sleep(20);
            }
            // The ready file comes before leadership: a SUBMIT before it is UNAVAILABLE.
            if (lead) waitFor("taskpushd to lead", () -> stats().matches("(?s).*\"leader\"\\s*:\\s*true.*"));
        }

        HttpClient http() {
            HttpClient.Builder b = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10));
            if (adminTls != null) b.sslContext(adminTls);
            return b.build();
        }

        String url(String path) { return (adminTls != null ? "https://" : "http://") + admin + path; }

        /** /stats as text ("" when unreachable). */
        String stats() {
            try {
                return http().send(HttpRequest.newBuilder(URI.create(url("/stats"))).timeout(Duration.ofSeconds(10)).build(),
                        HttpResponse.BodyHandlers.ofString()).body();
            } catch (IOException e) {
                return "";
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return "";
            }
        }

        String post(String path) throws IOException, InterruptedException {
            return http().send(HttpRequest.newBuilder(URI.create(url(path))).header("X-Taskpush-Admin", "1")
                    .POST(HttpRequest.BodyPublishers.noBody()).timeout(Duration.ofSeconds(10)).build(),
                    HttpResponse.BodyHandlers.ofString()).body();
        }

        void signal(String sig) throws IOException, InterruptedException {
            if (proc != null && proc.isAlive()) run(List.of("kill", "-" + sig, Long.toString(proc.pid())), null, null);
        }

        /** SIGKILL, and waits until the process is gone. */
        void kill() throws InterruptedException, IOException {
            if (proc == null) return;
            if (proc.isAlive()) signal("CONT");
            proc.destroyForcibly();
            proc.waitFor(WAIT.toSeconds(), TimeUnit.SECONDS);
            proc = null;
        }
    }

    static String freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getByName("127.0.0.1"))) {
            return "127.0.0.1:" + s.getLocalPort();
        }
    }

    /** A CA, a server certificate for 127.0.0.1 and a client certificate signed by the CA (openssl, as test_tls.c). */
    static Path makeCerts(TestContext t) throws IOException, InterruptedException {
        Path dir = tempDir(t);
        String key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        String caExt = "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign";
        for (String s : List.of(
                "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext",
                "printf 'extendedKeyUsage=clientAuth\\n' > client.ext",
                "openssl req -x509 " + key + " -keyout ca.key -out ca.pem -days 2 -subj /CN=taskpush-java-ca " + caExt,
                "openssl req " + key + " -keyout server.key -out server.csr -subj /CN=taskpushd-java",
                "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem",
                "openssl req " + key + " -keyout client.key -out client.csr -subj /CN=java-worker",
                "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem"))
            run(List.of("sh", "-c", s), null, dir);
        return dir;
    }

    /** The library's diagnostics of one worker, kept for the test's log. */
    static java.util.function.Consumer<String> logTo(TestContext t, List<String> into) {
        return line -> {
            String l = LocalTime.now() + " " + line;
            synchronized (into) {
                into.add(l);
            }
            t.log(l);
        };
    }

    static boolean has(List<String> lines, String s) {
        synchronized (lines) {
            return lines.stream().anyMatch(l -> l.contains(s));
        }
    }

    /** Starts w and stops it at the test's end (abort, then wait). */
    static Worker started(TestContext t, Worker w) {
        w.start();
        t.cleanup(() -> {
            w.abort();
            if (!w.awaitTermination(WAIT)) throw new AssertionError("the worker did not stop within " + WAIT);
        });
        return w;
    }

    static Options.Builder opts(TestContext t, List<String> log) {
        return Options.builder().name(t.name()).reconnect(Duration.ofMillis(50), Duration.ofMillis(200)).log(logTo(t, log));
    }
}
