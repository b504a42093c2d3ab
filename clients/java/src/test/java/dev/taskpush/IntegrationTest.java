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

    /** 4. Never more handlers of a type at once than its concurrency. */
    public static void testConcurrencyBound(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        String[] xs = new String[30];
        java.util.Arrays.fill(xs, "x");
        db.insert("a", xs);
        db.insert("b", xs);
        Map<String, Integer> now = new HashMap<>(), peak = new HashMap<>();
        Handler h = task -> {
            synchronized (now) {
                int v = now.merge(task.type(), 1, Integer::sum);
                peak.merge(task.type(), v, Math::max);
            }
            Thread.sleep(20);
            synchronized (now) {
                now.merge(task.type(), -1, Integer::sum);
            }
            return null;
        };
        List<String> log = new ArrayList<>();
        started(t, Worker.builder(d.listen).options(opts(t, log).build()).handle("a", 3, h).handle("b", 2, h).build());
        db.waitRows("task_state = 2", 60);
        synchronized (now) {
            check(peak.get("a") <= 3 && peak.get("b") <= 2 && peak.get("a") >= 1 && peak.get("b") >= 1, "peaks " + peak + ", bounds a 3, b 2");
        }
    }

    /**
     * 4. A type's handlers reach its concurrency: each handler of a type waits until that many
     * run at once (the worker's runners start one another while tasks are queued), on the
     * worker's own pool and on an executor the caller gives.
     */
    public static void testConcurrencyReached(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        String[] xs = new String[8];
        java.util.Arrays.fill(xs, "x");
        db.insert("own", xs);
        db.insert("given", xs);
        Map<String, CountDownLatch> together = Map.of("own", new CountDownLatch(4), "given", new CountDownLatch(3));
        List<String> short_ = Collections.synchronizedList(new ArrayList<>());
        Handler h = task -> {
            CountDownLatch l = together.get(task.type());
            l.countDown();
            if (!l.await(Harness.WAIT.toSeconds(), TimeUnit.SECONDS)) short_.add(task.type() + ": " + l.getCount() + " short");
            return null;
        };
        java.util.concurrent.ExecutorService given = java.util.concurrent.Executors.newCachedThreadPool();
        t.cleanup(given::shutdownNow);
        List<String> log = new ArrayList<>();
        started(t, Worker.builder(d.listen).options(opts(t, log).build()).handle("own", 4, h).build());
        started(t, Worker.builder(d.listen).options(opts(t, log).name(t.name() + "-given").build())
                .handle("given", 3, h).executor(given).build());
        db.waitRows("task_state = 2", 16);
        check(short_.isEmpty(), "handlers that never saw their concurrency reached: " + short_);
    }

    /**
     * 3. An outcome does not wait for a slow handler: the DONE of a quick task that its runner
     * followed at once with a slow one (queued behind it, concurrency 1) is written meanwhile
     * (the writer thread writes what waits within a heartbeat): the slow handler returns only
     * once the quick task's row is SUCCESSFUL.
     */
    public static void testOutcomeNotHeldBySlowHandler(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        db.exec("INSERT INTO task (task_type, payload, task_priority) VALUES ('seq', 'quick', 2), ('seq', 'slow', 1)");
        List<String> order = Collections.synchronizedList(new ArrayList<>()), held = Collections.synchronizedList(new ArrayList<>());
        List<String> log = new ArrayList<>();
        started(t, Worker.builder(d.listen).options(opts(t, log).build())
                .handle("seq", 1, task -> {
                    String p = str(task.payload());
                    order.add(p);
                    try {
                        if (p.equals("slow") && order.contains("quick")) db.waitRows("payload = 'quick' AND task_state = 2", 1);
                    } catch (AssertionError e) {
                        held.add(e.getMessage());
                    }
                    return null;
                })
                .handle("other", 3, task -> null).build()); // capacity 4: both delivered at once
        db.waitRows("task_state = 2", 2);
        check(order.equals(List.of("quick", "slow")), "handlers ran in the order " + order + ", want quick (priority 2) first");
        check(held.isEmpty(), "the quick task's outcome waited for the slow handler: " + held);
    }

    /** 5, 6. EXTEND keeps a short lease alive; CANCEL sets the flag, interrupts the handler, and the slot is free again once answered. */
    public static void testExtendAndCancel(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        db.exec("INSERT INTO task (task_type, payload, timeout_ms) VALUES ('long', 'e', 800)");
        CountDownLatch cancelled = new CountDownLatch(1), startedL = new CountDownLatch(1);
        AtomicLong stuckId = new AtomicLong();
        List<String> log = new ArrayList<>();
        Worker w = started(t, Worker.builder(d.listen).options(opts(t, log).build())
                .handle("long", 1, task -> {
                    long end = System.nanoTime() + 2_500_000_000L;
                    while (System.nanoTime() < end) {
                        task.extend(Duration.ofMillis(800));
                        Thread.sleep(200);
                    }
                    return utf8("extended");
                })
                .handle("stuck", 1, task -> {
                    if (str(task.payload()).equals("a")) {
                        stuckId.set(task.id());
                        startedL.countDown();
                        try {
                            Thread.sleep(Harness.WAIT.toMillis());
                        } catch (InterruptedException e) {
                            if (task.isCancelled()) cancelled.countDown();
                            throw e;
                        }
                    }
                    return utf8("done");
                }).build());
        db.waitRows("task_state = 2 AND task_type = 'long' AND attempts = 1 AND result = 'extended'", 1);
        Worker.Stats s = w.stats();
        check(s.extendsSent() >= 5 && s.cancelsReceived() == 0, "stats after the extended task: " + s);
        db.insert("stuck", "a");
        await(startedL, "the stuck task to start");
        String ans = d.post("/cancel?id=" + stuckId.get());
        check(ans.contains("\"running\""), "POST /cancel: " + ans);
        await(cancelled, "the handler to see the cancel");
        db.waitRows("task_state = 3 AND err_msg = 'cancelled'", 1);
        db.insert("stuck", "b");
        db.waitRows("task_state = 2 AND payload = 'b'", 1);
        check(w.stats().cancelsReceived() == 1, "cancels received " + w.stats().cancelsReceived());
    }

    /** 7, 8. An idle worker stays connected over 10 heartbeat intervals; a frozen dispatcher (SIGSTOP) is lost after 3 and found again after SIGCONT. */
    public static void testHeartbeatsAndSilence(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        List<String> log = new ArrayList<>();
        Worker w = started(t, Worker.builder(d.listen).options(opts(t, log).build()).handle("hb", 2, task -> utf8("ok")).build());
        waitFor("a connection", () -> w.connectedVersion() == 3);
        Thread.sleep(10 * 200); // 10 heartbeat intervals, idle
        Worker.Stats s = w.stats();
        check(s.connections() == 1 && s.disconnects() == 0, "an idle worker reconnected: " + s);
        db.insert("hb", "1");
        db.waitRows("task_state = 2", 1);
        d.signal("STOP");
        waitFor("the frozen dispatcher declared lost", () -> w.stats().disconnects() >= 1);
        check(has(log, "dispatcher silent for"), "no 'dispatcher silent' in the log");
        d.signal("CONT");
        db.insert("hb", "2");
        db.waitRows("task_state = 2", 2);
    }

    /** 9. Tasks in flight across a SIGKILL and a restart run once: outcomes sent again, running deliveries declared (HOLDING) and adopted. */
    public static void testInventoryAcrossRestart(TestContext t) throws Exception {
        DB db = new DB(t);
        String listen = Harness.freePort();
        Daemon d = new Daemon(t, db, listen, true, null, "--adopt-grace-ms", "3000");
        db.insert("long", "early0", "early1", "early2", "late0", "late1", "late2");
        Map<Long, Integer> runs = new ConcurrentHashMap<>();
        CountDownLatch down = new CountDownLatch(1), lateGo = new CountDownLatch(1);
        List<String> log = new ArrayList<>();
        Worker w = started(t, Worker.builder(listen).options(opts(t, log).build()).handle("long", 6, task -> {
            runs.merge(task.id(), 1, Integer::sum);
            (str(task.payload()).startsWith("early") ? down : lateGo).await();
            return utf8("done-" + str(task.payload()));
        }).build());
        waitFor("six tasks running", () -> runs.size() == 6);
        d.kill();
        waitFor("the worker to see the dispatcher gone", () -> w.stats().disconnects() >= 1);
        down.countDown();
        waitFor("three outcomes kept, three tasks running", () -> w.unconfirmed() == 3 && w.held() == 3);
        d.start(listen, true);
        db.waitRows("task_state = 2 AND payload LIKE 'early%'", 3);
        waitFor("three deliveries declared", () -> w.stats().deliveriesDeclared() == 3);
        lateGo.countDown();
        db.waitRows("task_state = 2", 6);
        waitFor("every outcome confirmed", () -> w.unconfirmed() == 0);
        int got = db.count("task_state = 2 AND attempts = 1 AND result = CONCAT('done-', payload)");
        check(got == 6, got + " rows SUCCESSFUL at attempt 1, want 6");
        runs.forEach((id, c) -> check(c == 1, "task " + id + " ran " + c + " times"));
        Worker.Stats s = w.stats();
        check(s.tasksDropped() == 0 && s.outcomesForgotten() == 0 && s.outcomesResent() >= 3, "stats " + s);
    }

    /** 10, 11. A dead address, then a standby (NOT_LEADER), then the leader: the worker moves on at once (any backoff would be 30 s) and drains; the standby holds no worker; a producer given the standby first submits through the leader. */
    public static void testAddressesDeadStandbyLeader(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon leader = daemon(t, db);
        Daemon standby = new Daemon(t, db, "127.0.0.1:0", false, null);
        check(standby.stats().matches("(?s).*\"leader\"\\s*:\\s*false.*"), "the second taskpushd leads: " + standby.stats());
        String dead = Harness.freePort();
        db.insert("sb", "1", "2", "3", "4", "5");
        List<String> log = new ArrayList<>();
        Worker w = started(t, Worker.builder(dead + "," + standby.listen + "," + leader.listen)
                .options(opts(t, log).reconnect(Duration.ofSeconds(30), Duration.ofSeconds(30)).build())
                .handle("sb", 2, task -> utf8("ok")).build());
        db.waitRows("task_state = 2", 5);
        Worker.Stats s = w.stats();
        check(s.connections() == 1 && s.connectAttempts() >= 3, "stats " + s);
        check(has(log, "does not lead"), "no 'does not lead' in the log");
        check(standby.stats().matches("(?s).*\"workers\"\\s*:\\s*0[,}\\s].*"), "the standby holds workers: " + standby.stats());
        try (Client c = new Client(standby.listen + "," + leader.listen, opts(t, log).build())) {
            Receipt r = c.submit(new NewTask("sb", "submitted")).get(0);
            db.waitRows("task_id = " + r.taskId() + " AND task_state = 2", 1);
        }
        check(has(log, "answered UNAVAILABLE"), "the standby's UNAVAILABLE not seen");
    }

    /** 12. TLS with a client certificate and a token: a 3 MB payload and result among the tasks; without the certificate, or with a wrong token, no session. */
    public static void testTlsClientCertToken(TestContext t) throws Exception {
        java.nio.file.Path certs = Harness.makeCerts(t);
        java.util.function.Function<String, java.nio.file.Path> p = certs::resolve;
        java.nio.file.Files.writeString(p.apply("token"), "s3cret-java\n");
        DB db = new DB(t);
        Daemon d = new Daemon(t, db, "127.0.0.1:0", true, Tls.context(p.apply("ca.pem"), null, null),
                "--tls-cert", p.apply("server.pem").toString(), "--tls-key", p.apply("server.key").toString(),
                "--tls-ca", p.apply("ca.pem").toString(), "--token-file", p.apply("token").toString());
        db.insert("tls", "1", "2", "3");
        db.exec("INSERT INTO task (task_type, payload) SELECT 'tls', CONCAT(REPEAT('ab', 1500000), 'c')");
        javax.net.ssl.SSLContext full = Tls.context(p.apply("ca.pem"), p.apply("client.pem"), p.apply("client.key"));
        List<String> log = new ArrayList<>();
        started(t, Worker.builder(d.listen).options(opts(t, log).tls(full).token("s3cret-java").build())
                .handle("tls", 2, task -> {
                    byte[] out = new byte[task.payload().length + 1];
                    out[0] = 'r';
                    System.arraycopy(task.payload(), 0, out, 1, task.payload().length);
                    return out;
                }).build());
        db.waitRows("task_state = 2", 4);
        check(db.count("task_state = 2 AND LENGTH(result) = 3000002") == 1, "the 3 MB result");
        Object[][] cases = {
            {"no client certificate", Options.builder().tls(Tls.context(p.apply("ca.pem"), null, null)).token("s3cret-java"), ""},
            {"wrong token", Options.builder().tls(full).token("wrong"), "ERROR 3"},
        };
        for (Object[] k : cases) {
            try (Client c = new Client(d.listen, ((Options.Builder) k[1]).log(Harness.logTo(t, log)).build())) {
                c.submit(new NewTask("tls", ""));
                throw new AssertionError(k[0] + ": a session opened");
            } catch (SubmitException e) {
                check(e.kind() == SubmitException.Kind.UNAVAILABLE && e.getMessage().contains((String) k[2]), k[0] + ": " + e);
            }
        }
    }

    /** 14. close() drains: the running tasks finish, their outcomes are written and confirmed; nothing more is taken. */
    public static void testGracefulDrain(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        String[] ps = new String[40];
        for (int i = 0; i < ps.length; i++) ps[i] = "" + i;
        db.insert("drain", ps);
        CountDownLatch release = new CountDownLatch(1);
        AtomicInteger startedN = new AtomicInteger();
        List<String> log = new ArrayList<>();
        Worker w = started(t, Worker.builder(d.listen).options(opts(t, log).build()).handle("drain", 4, task -> {
            startedN.incrementAndGet();
            release.await();
            return utf8("drained");
        }).build());
        waitFor("four tasks running", () -> startedN.get() == 4);
        Thread closer = new Thread(w::close);
        closer.start();
        Thread.sleep(300); // the STOP exchange; the handlers are still held
        check(closer.isAlive() && w.held() == 4, "close() returned before its tasks finished");
        release.countDown();
        closer.join(Harness.WAIT.toMillis());
        check(!closer.isAlive(), "close() did not return after the drain");
        int n = startedN.get();
        check(db.count("task_state = 2 AND attempts = 1 AND result = 'drained'") == n, "rows SUCCESSFUL != " + n + " started");
        check(db.count("attempts = 0") == 40 - n, "rows never delivered != " + (40 - n));
        check(w.unconfirmed() == 0 && w.held() == 0, "after the drain: " + w.unconfirmed() + " unconfirmed, " + w.held() + " held");
    }

    /** The drain timeout ends a drain that a handler holds up: cancelled (interrupted), its outcome dropped, the task taken back. */
    public static void testDrainTimeoutAborts(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        db.insert("hang", "x");
        CountDownLatch startedL = new CountDownLatch(1), sawCancel = new CountDownLatch(1);
        List<String> log = new ArrayList<>();
        Worker w = started(t, Worker.builder(d.listen).options(opts(t, log).drainTimeout(Duration.ofMillis(300)).build())
                .handle("hang", 1, task -> {
                    startedL.countDown();
                    try {
                        Thread.sleep(Harness.WAIT.toMillis() * 2);
                    } catch (InterruptedException e) {
                        if (task.isCancelled()) sawCancel.countDown();
                    }
                    return utf8("too late");
                }).build());
        await(startedL, "the task to start");
        w.close();
        await(sawCancel, "the handler to be cancelled after the drain timeout");
        check(w.awaitTermination(Harness.WAIT), "the worker did not end");
        check(w.stats().tasksDropped() == 1 && w.unconfirmed() == 0, "stats " + w.stats());
        db.waitRows("task_state = 0 AND attempts = 1", 1);
        check(db.count("result = 'too late'") == 0, "the dropped outcome was written");
    }

    /** Older sessions: workers offering versions 1 and 2 drain (version 1 cannot submit). */
    public static void testProtocolVersions(TestContext t) throws Exception {
        DB db = new DB(t);
        Daemon d = daemon(t, db);
        for (int v : new int[] {1, 2}) {
            String type = "pv" + v;
            List<String> log = new ArrayList<>();
            Worker w = started(t, Worker.builder(d.listen).options(opts(t, log).protocolVersion(v).build())
                    .handle(type, 1, task -> utf8("ok")).build());
            db.insert(type, "x");
            db.waitRows("task_type = '" + type + "' AND task_state = 2", 1);
            check(w.connectedVersion() == v, "offered " + v + ", session " + w.connectedVersion());
            try {
                w.submit(new NewTask(type, ""));
                check(v != 1, "version 1 submitted");
            } catch (SubmitException e) {
                check(v == 1 && e.kind() == SubmitException.Kind.NO_SUBMIT, "version " + v + " submit: " + e);
            }
        }
    }
}
