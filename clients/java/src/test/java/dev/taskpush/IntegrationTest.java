package dev.taskpush;

import static dev.taskpush.Harness.has;
import static dev.taskpush.Harness.opts;
import static dev.taskpush.Harness.started;
import static dev.taskpush.Harness.waitFor;
import static dev.taskpush.TapRunner.check;

import dev.taskpush.Harness.DB;
import dev.taskpush.Harness.Daemon;
import dev.taskpush.TapRunner.TestContext;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The Java worker and client against the real taskpushd and MariaDB over TCP: the scenarios of
 * tests/conformance/README.md. Waits are bounded polls; nothing asserts how long something took.
 */
public final class IntegrationTest {
    private IntegrationTest() {}

    static String str(byte[] b) { return new String(b, StandardCharsets.UTF_8); }

    static byte[] utf8(String s) { return s.getBytes(StandardCharsets.UTF_8); }

    static Daemon daemon(TestContext t, DB db) throws Exception {
        return new Daemon(t, db, "127.0.0.1:0", true, null);
    }

    static void await(CountDownLatch l, String what) throws InterruptedException {
        check(l.await(Harness.WAIT.toSeconds(), TimeUnit.SECONDS), "timed out waiting for " + what);
    }

    /** 2. Every task runs once, and the handler sees the row's delivery. */
    public static void testDrainExactlyOnce(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        int n = 300;
        String[] payloads = new String[n];
        for (int i = 0; i < n; i++) payloads[i] = "p" + i;
        db.insert("noop", payloads);
        Map<Long, Integer> runs = new ConcurrentHashMap<>();
        List<String> bad = Collections.synchronizedList(new ArrayList<>());
        List<String> log = new ArrayList<>();
        started(t, Worker.builder(d.listen).options(opts(t, log).build()).handle("noop", 16, task -> {
            runs.merge(task.id(), 1, Integer::sum);
            if (task.attempt() != 1 || task.epoch() == 0 || task.priority() != Priority.NORMAL || !task.type().equals("noop"))
                bad.add(task.toString());
            return utf8("r-" + str(task.payload()));
        }).build());
        db.waitRows("task_state = 2", n);
        int got = db.count("task_state = 2 AND attempts = 1 AND result = CONCAT('r-', payload)");
        check(got == n, got + " rows SUCCESSFUL at attempt 1 with the handler's result, want " + n);
        check(runs.size() == n && bad.isEmpty(), runs.size() + " ids ran, want " + n + "; deliveries not as the rows: " + bad);
        runs.forEach((id, c) -> check(c == 1, "task " + id + " ran " + c + " times"));
    }

    /** 3. Every outcome a handler can give, as the dispatcher writes it. */
    public static void testOutcomes(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        db.insert("perm", "x");
        db.exec("INSERT INTO task (task_type, payload, max_attempts) VALUES ('retry', 'y', 2), ('boom', 'z', 2)");
        db.insert("later", "w");
        List<Long> laterAt = Collections.synchronizedList(new ArrayList<>());
        List<String> log = new ArrayList<>();
        started(t, Worker.builder(d.listen).options(opts(t, log).build())
                .handle("perm", 1, task -> { throw new PermanentFailure("bad input"); })
                .handle("retry", 1, task -> { throw new java.io.IOException("flaky"); })
                .handle("boom", 1, task -> { throw new IllegalStateException("handler bug"); })
                .handle("later", 1, task -> {
                    laterAt.add(System.nanoTime());
                    if (task.attempt() == 1) throw new RetryAfter(Duration.ofMillis(1500), "rate limited");
                    return utf8("ok");
                }).build());
        db.waitRows("task_state = 3 AND task_type = 'perm' AND attempts = 1 AND err_msg = 'bad input'", 1);
        db.waitRows("task_state = 3 AND task_type = 'retry' AND attempts = 2 AND err_msg = 'flaky'", 1);
        db.waitRows("task_state = 3 AND task_type = 'boom' AND attempts = 2 AND err_msg = 'handler bug'", 1);
        db.waitRows("task_state = 2 AND task_type = 'later' AND attempts = 2 AND result = 'ok'", 1);
        synchronized (laterAt) {
            check(laterAt.size() == 2 && laterAt.get(1) - laterAt.get(0) >= 1_500_000_000L, "RETRY_AFTER 1.5 s: delivered at " + laterAt);
        }
    }

    /** 13. SUBMIT is acknowledged after commit; a dedup key gives the existing id; WAIT returns the outcome; an invalid task inserts nothing. */
    public static void testSubmitCommitBeforeAck(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        List<String> log = new ArrayList<>();
        try (Client c = new Client(d.listen, opts(t, log).build())) {
            NewTask[] tasks = new NewTask[10];
            for (int i = 0; i < tasks.length; i++)
                tasks[i] = new NewTask("nobody", "" + i).priority(Priority.HIGH).dedupKey("k" + i).maxAttempts(5).delay(Duration.ofHours(1));
            List<Receipt> rs = c.submit(tasks);
            List<String> ids = new ArrayList<>();
            for (Receipt r : rs) {
                check(!r.duplicate() && r.taskId() != 0, "receipt " + r);
                ids.add(Long.toString(r.taskId()));
            }
            // Read at once: committed before the answer.
            int got = db.count("task_id IN (" + String.join(",", ids) + ") AND task_state = 0 AND task_priority = 2 AND max_attempts = 5");
            check(got == 10, got + " of 10 acknowledged rows in the table");
            Receipt dup = c.submit(new NewTask("nobody", "").dedupKey("k3")).get(0);
            check(dup.duplicate() && dup.taskId() == rs.get(3).taskId(), "duplicate: " + dup + ", want id " + rs.get(3).taskId());
            int before = db.count("1");
            try {
                c.submit(new NewTask("trailing ", "x"), new NewTask("nobody", "ok"));
                throw new AssertionError("a type with a trailing space accepted");
            } catch (SubmitException e) {
                check(e.kind() == SubmitException.Kind.INVALID, "a type with a trailing space: " + e);
            }
            check(db.count("1") == before, "an invalid submission inserted rows");

            Worker w = started(t, Worker.builder(d.listen).options(opts(t, log).build())
                    .handle("echo", 2, task -> utf8("echo:" + str(task.payload()))).build());
            Receipt wr = c.submitWait(new NewTask("echo", "hi")).get(0);
            check(wr.outcome() != null && wr.outcome().succeeded() && str(wr.outcome().data()).equals("echo:hi"), "waited outcome: " + wr);
            waitFor("a worker connection", () -> w.connectedVersion() == 3);
            Receipt r = w.submit(new NewTask("echo", "from-worker"));
            db.waitRows("task_id = " + r.taskId() + " AND task_state = 2 AND result = 'echo:from-worker'", 1);
        }
    }
}
