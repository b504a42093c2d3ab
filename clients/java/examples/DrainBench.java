import dev.taskpush.Options;
import dev.taskpush.Worker;
import dev.taskpush.wire.FrameReader;
import dev.taskpush.wire.Wire;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * DrainBench drains preloaded no-op tasks with K Java workers (one connection each, capacity C)
 * in one JVM, as clients/go/examples/drainbench does with Go, and prints one JSON line. The clock
 * runs from the workers' start until the handlers ran N times and taskpushd has written every
 * outcome (its /stats). bench/clients.sh runs it beside taskpush-bench.
 *
 * <p>Before the clock starts, a JVM warm-up: the same K workers' code drains no-op tasks from a
 * stand-in dispatcher inside this JVM (loopback TCP, the library's own codec) for WARMUP
 * seconds (2 by default, 0: none) and then until the JIT compilers have been idle for half a
 * second (at most 30 s more), so that the library's hot paths are compiled, as C and Go are
 * ahead of time. Those workers are stopped before the clock starts; the measured ones connect
 * to taskpushd from scratch. The JSON line also gives the JVM's CPU time (user and system,
 * from /proc) in the measured seconds, cpu_s, and the warm-up's length and rate.
 *
 *     java -cp taskpush.jar:. DrainBench ADDR ADMIN N K CAPACITY [WARMUP]
 */
public final class DrainBench {
    private DrainBench() {}

    static long field(String json, String object, String name) {
        int o = json.indexOf("\"" + object + "\"");
        Matcher m = Pattern.compile("\"" + name + "\"\\s*:\\s*(\\d+)").matcher(json);
        return o >= 0 && m.find(o) ? Long.parseLong(m.group(1)) : -1;
    }

    /** Stands in for a dispatcher: WELCOME, then a TASK for every DONE (and its CONFIRM), until closed. */
    static final class StandIn implements AutoCloseable {
        final ServerSocket server = new ServerSocket(0, 128, InetAddress.getLoopbackAddress());
        final List<Socket> conns = new ArrayList<>();
        final AtomicLong nextId = new AtomicLong();

        StandIn() throws IOException {
            Thread t = new Thread(this::accept, "warmup-accept");
            t.setDaemon(true);
            t.start();
        }

        String addr() { return "127.0.0.1:" + server.getLocalPort(); }

        void accept() {
            try {
                while (true) {
                    Socket c = server.accept();
                    synchronized (conns) {
                        conns.add(c);
                    }
                    Thread t = new Thread(() -> serve(c), "warmup-conn");
                    t.setDaemon(true);
                    t.start();
                }
            } catch (IOException e) {
                // closed
            }
        }

        byte[] task() throws IOException {
            return Wire.encode(new Wire.Task(new Wire.Delivery(nextId.incrementAndGet(), 1, 1), 0, 0,
                    "default".getBytes(), new byte[0]));
        }

        void serve(Socket c) {
            try (c) {
                c.setTcpNoDelay(true);
                FrameReader r = new FrameReader(c.getInputStream(), Wire.MAX_BODY_DEFAULT);
                OutputStream os = c.getOutputStream();
                Wire.Hello h = (Wire.Hello) r.read();
                ByteArrayOutputStream out = new ByteArrayOutputStream();
                out.write(Wire.encode(new Wire.Welcome(3, 1000, Wire.MAX_BODY_DEFAULT, "warmup".getBytes())));
                for (long i = 0; i < h.capacity(); i++) out.write(task());
                List<Wire.Delivery> done = new ArrayList<>();
                while (true) {
                    out.writeTo(os);
                    os.flush();
                    out.reset();
                    do {
                        Wire.Message m = r.read();
                        if (m == null) return;
                        if (m instanceof Wire.Done d) done.add(d.delivery());
                    } while (r.hasFrame());
                    if (!done.isEmpty()) {
                        for (int i = 0; i < done.size(); i += Wire.MAX_CONFIRM)
                            out.write(Wire.encode(new Wire.Confirm(done.subList(i, Math.min(done.size(), i + Wire.MAX_CONFIRM)))));
                        for (int i = 0; i < done.size(); i++) out.write(task());
                        done.clear();
                    }
                }
            } catch (IOException | RuntimeException e) {
                // the warm-up ends by closing the connections
            }
        }

        @Override public void close() throws IOException {
            server.close();
            synchronized (conns) {
                for (Socket c : conns) c.close();
            }
        }
    }

    /** Returns how long it took and the stand-in's rate, tasks/s. */
    static double[] warmUp(int k, int capacity, double seconds) throws Exception {
        if (seconds <= 0) return new double[2];
        double rate;
        try (StandIn d = new StandIn()) {
            List<Worker> ws = new ArrayList<>();
            for (int i = 0; i < k; i++) {
                ws.add(Worker.builder(d.addr()).options(Options.builder().name("java-warmup-" + i).build())
                        .handle("default", capacity, task -> null).build().start());
            }
            long t0 = System.nanoTime(), n0 = d.nextId.get();
            Thread.sleep((long) (seconds * 1000));
            var jit = java.lang.management.ManagementFactory.getCompilationMXBean();
            long quietSince = System.nanoTime(), compiled = jit.getTotalCompilationTime();
            long giveUp = System.nanoTime() + 30_000_000_000L;
            while (System.nanoTime() - quietSince < 500_000_000L && System.nanoTime() < giveUp) {
                Thread.sleep(50);
                long c = jit.getTotalCompilationTime();
                if (c != compiled) {
                    compiled = c;
                    quietSince = System.nanoTime();
                }
            }
            seconds = (System.nanoTime() - t0) / 1e9;
            rate = (d.nextId.get() - n0) / ((System.nanoTime() - t0) / 1e9);
            for (Worker w : ws) w.abort();
            for (Worker w : ws) w.awaitTermination(Duration.ofSeconds(10));
        }
        System.gc();
        return new double[] {seconds, rate};
    }

    /** This process's CPU time (user and system) from /proc; 0 where there is none. */
    static double cpuSeconds() {
        try {
            String st = java.nio.file.Files.readString(java.nio.file.Path.of("/proc/self/stat"));
            String[] f = st.substring(st.lastIndexOf(')') + 2).split(" ");
            return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0;
        } catch (IOException | RuntimeException e) {
            return 0;
        }
    }

    public static void main(String[] args) throws Exception {
        String addr = args[0], admin = args[1];
        long n = Long.parseLong(args[2]);
        int k = Integer.parseInt(args[3]), capacity = Integer.parseInt(args[4]);
        double[] warm = warmUp(k, capacity, args.length > 5 ? Double.parseDouble(args[5]) : 2);
        AtomicLong calls = new AtomicLong();
        List<Worker> workers = new ArrayList<>();
        for (int i = 0; i < k; i++) {
            workers.add(Worker.builder(addr).options(Options.builder().name("java-bench-" + i).build())
                    .handle("default", capacity, task -> {
                        calls.incrementAndGet();
                        return null;
                    }).build());
        }
        HttpClient http = HttpClient.newHttpClient();
        HttpRequest stats = HttpRequest.newBuilder(URI.create("http://" + admin + "/stats")).build();
        double cpu0 = cpuSeconds();
        long start = System.nanoTime();
        for (Worker w : workers) w.start();
        long progress = System.nanoTime(), last = 0;
        while (true) {
            long c = calls.get();
            if (c != last) {
                last = c;
                progress = System.nanoTime();
            }
            if (c >= n) {
                String s = http.send(stats, HttpResponse.BodyHandlers.ofString()).body();
                if (field(s, "tasks", "succeeded_total") + field(s, "tasks", "failed_total") >= n
                        && field(s, "db", "pending_writes") == 0) break;
                Thread.sleep(5);
            } else {
                Thread.sleep(2);
            }
            if (System.nanoTime() - progress > 60_000_000_000L) {
                System.err.println("DrainBench: no progress for 60 s at " + c + " of " + n);
                System.exit(1);
            }
        }
        double secs = (System.nanoTime() - start) / 1e9;
        double cpu = cpuSeconds() - cpu0;
        for (Worker w : workers) w.shutdown();
        for (Worker w : workers) w.awaitTermination(Duration.ofSeconds(30));
        System.out.printf("{\"client\":\"java\",\"k\":%d,\"capacity\":%d,\"n\":%d,\"handler_runs\":%d,\"seconds\":%.3f,\"tasks_per_s\":%.1f,"
                + "\"cpu_s\":%.2f,\"warmup_s\":%.1f,\"warmup_tasks_per_s\":%.0f}%n",
                k, capacity, n, calls.get(), secs, n / secs, cpu, warm[0], warm[1]);
        System.exit(0);
    }
}
