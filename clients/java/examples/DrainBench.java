import dev.taskpush.Options;
import dev.taskpush.Worker;
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
 *     java -cp taskpush.jar:. DrainBench ADDR ADMIN N K CAPACITY
 */
public final class DrainBench {
    private DrainBench() {}

    static long field(String json, String object, String name) {
        int o = json.indexOf("\"" + object + "\"");
        Matcher m = Pattern.compile("\"" + name + "\"\\s*:\\s*(\\d+)").matcher(json);
        return o >= 0 && m.find(o) ? Long.parseLong(m.group(1)) : -1;
    }

    public static void main(String[] args) throws Exception {
        String addr = args[0], admin = args[1];
        long n = Long.parseLong(args[2]);
        int k = Integer.parseInt(args[3]), capacity = Integer.parseInt(args[4]);
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
        for (Worker w : workers) w.shutdown();
        for (Worker w : workers) w.awaitTermination(Duration.ofSeconds(30));
        System.out.printf("{\"client\":\"java\",\"k\":%d,\"capacity\":%d,\"n\":%d,\"handler_runs\":%d,\"seconds\":%.3f,\"tasks_per_s\":%.1f}%n",
                k, capacity, n, calls.get(), secs, n / secs);
        System.exit(0);
    }
}
