import dev.taskpush.Client;
import dev.taskpush.NewTask;
import dev.taskpush.Options;
import dev.taskpush.PermanentFailure;
import dev.taskpush.Receipt;
import dev.taskpush.RetryAfter;
import dev.taskpush.SubmitException;
import dev.taskpush.Task;
import dev.taskpush.TaskGoneException;
import dev.taskpush.Tls;
import dev.taskpush.Worker;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

/**
 * The Java library's conformance worker: the command line, the payload instructions and the event
 * lines of tests/conformance/README.md, the same as the C, Python and Go conformance workers.
 * tests/conformance/driver.py compiles it against the library's classes and runs it.
 *
 * <pre>
 * java -cp taskpush.jar:. ConformanceWorker --addr A[,B] --type T --concurrency N [--token T]
 *     [--tls-ca F [--tls-cert F --tls-key F]] [--reconnect-min-ms MS --reconnect-max-ms MS]
 * java -cp taskpush.jar:. ConformanceWorker --addr A [--token T] [--tls-*] --submit TYPE --payload P
 *     [--dedup K] [--wait]
 * </pre>
 */
public final class ConformanceWorker {
    private static final long START = System.nanoTime();

    private ConformanceWorker() {}

    /** One event line, whole, at once (handlers run on several threads). */
    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static long nowMs() { return (System.nanoTime() - START) / 1_000_000; }

    static byte[] handle(Task t) throws Exception {
        String[] words = new String(t.payload(), StandardCharsets.UTF_8).split(" ", 3);
        String op = words[0], arg = words.length > 1 ? words[1] : "";
        emit("start " + t.id() + " " + t.attempt() + " " + t.epoch() + " " + t.priority().ordinal() + " " + t.type()
                + " " + nowMs());
        String outcome = "ok";
        try {
            switch (op) {
                case "ok":
                    return arg.getBytes(StandardCharsets.UTF_8);
                case "fail":
                    outcome = "fail";
                    throw new Exception(arg);
                case "fail-permanent":
                    outcome = "fail-permanent";
                    throw new PermanentFailure(arg);
                case "retry-after":
                    if (t.attempt() == 1) {
                        outcome = "retry-after";
                        throw new RetryAfter(Duration.ofMillis(Long.parseLong(arg)), "later");
                    }
                    return "after".getBytes(StandardCharsets.UTF_8);
                case "crash":
                    outcome = "crash";
                    throw new IllegalStateException("conformance crash");
                case "big": {
                    byte[] big = new byte[Integer.parseInt(arg)];
                    Arrays.fill(big, (byte) 'r');
                    return big;
                }
                case "sleep":
                case "wait-cancel": {
                    long total = op.equals("sleep") ? Long.parseLong(arg) : 60_000;
                    boolean extend = words.length > 2 && words[2].startsWith("extend") && !t.lease().isZero();
                    long step = extend ? Math.max(1, t.lease().toMillis() / 4) : 50;
                    long end = System.nanoTime() + total * 1_000_000;
                    while (System.nanoTime() < end) {
                        long left = (end - System.nanoTime()) / 1_000_000;
                        try {
                            Thread.sleep(Math.max(0, Math.min(left, step)));
                        } catch (InterruptedException e) {
                            // a CANCEL interrupts the handler's thread; isCancelled() says so below
                        }
                        if (t.isCancelled()) {
                            emit("cancelled " + t.id());
                            outcome = "cancelled";
                            throw new Exception("cancelled");
                        }
                        if (extend) {
                            try {
                                t.extend(t.lease());
                            } catch (TaskGoneException e) {
                                outcome = "gone";
                                throw e;
                            }
                        }
                    }
                    if (op.equals("wait-cancel")) {
                        outcome = "not-cancelled";
                        throw new Exception("never cancelled");
                    }
                    return "slept".getBytes(StandardCharsets.UTF_8);
                }
                default:
                    outcome = "unknown";
                    throw new PermanentFailure("unknown instruction " + op);
            }
        } finally {
            emit("end " + t.id() + " " + outcome + " " + nowMs());
        }
    }

    static int submit(Map<String, String> a, Options opts) throws Exception {
        NewTask nt = new NewTask(a.get("submit"), a.getOrDefault("payload", ""));
        if (a.containsKey("dedup")) nt.dedupKey(a.get("dedup"));
        boolean wait = a.containsKey("wait");
        try (Client c = new Client(a.get("addr"), opts)) {
            List<Receipt> rs;
            try {
                rs = wait ? c.submitWait(nt) : c.submit(nt);
            } catch (SubmitException e) {
                if (e.kind() != SubmitException.Kind.INVALID) throw e;
                emit("refused " + e.getMessage());
                return 0;
            }
            Receipt r = rs.get(0);
            emit("submitted " + r.taskId() + " " + (r.duplicate() ? "duplicate" : "new"));
            if (wait && r.outcome() != null) {
                emit("outcome " + r.taskId() + " " + (r.outcome().succeeded() ? "successful" : "failed") + " "
                        + new String(r.outcome().data(), StandardCharsets.UTF_8));
            }
        }
        return 0;
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            if (!argv[i].startsWith("--")) throw new IllegalArgumentException("unexpected " + argv[i]);
            String name = argv[i].substring(2);
            if (name.equals("wait")) a.put(name, "");
            else if (i + 1 < argv.length) a.put(name, argv[++i]);
            else throw new IllegalArgumentException("--" + name + " needs a value");
        }
        Options.Builder ob = Options.builder().name("conformance-java")
                .reconnect(Duration.ofMillis(Long.parseLong(a.getOrDefault("reconnect-min-ms", "50"))),
                        Duration.ofMillis(Long.parseLong(a.getOrDefault("reconnect-max-ms", "500"))))
                .log(System.err::println);
        if (a.containsKey("token")) ob.token(a.get("token"));
        if (a.containsKey("tls-ca")) {
            ob.tls(Tls.context(Path.of(a.get("tls-ca")), a.containsKey("tls-cert") ? Path.of(a.get("tls-cert")) : null,
                    a.containsKey("tls-key") ? Path.of(a.get("tls-key")) : null));
        }
        Options opts = ob.build();
        if (a.containsKey("submit")) System.exit(submit(a, opts));
        Worker w = Worker.builder(a.get("addr")).options(opts)
                .handle(a.get("type"), Integer.parseInt(a.getOrDefault("concurrency", "1")), ConformanceWorker::handle)
                .build();
        // SIGTERM: a graceful drain. The JVM runs shutdown hooks on it; the hook waits for run() to
        // return and the closing line to be printed, then ends the process with status 0 (the JVM
        // would otherwise exit 143, as killed by the signal, whatever the drain did).
        CountDownLatch exited = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            w.shutdown();
            try {
                exited.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            Runtime.getRuntime().halt(0);
        }));
        Thread watcher = new Thread(() -> {
            long conns = 0, discs = 0;
            while (!Thread.currentThread().isInterrupted()) {
                Worker.Stats s = w.stats();
                if (s.connections() != conns) emit("connections " + (conns = s.connections()));
                if (s.disconnects() != discs) emit("disconnects " + (discs = s.disconnects()));
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "conformance-stats");
        watcher.setDaemon(true);
        watcher.start();
        emit("ready");
        w.run();
        watcher.interrupt();
        watcher.join();
        Worker.Stats s = w.stats();
        emit("exit connections=" + s.connections() + " disconnects=" + s.disconnects());
        exited.countDown();
    }
}
