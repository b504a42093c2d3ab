package dev.taskpush;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

/**
 * The test runner of clients/java (no JUnit needed): every public static method named test*
 * of the classes given, taking a {@link TestContext}, is one TAP case. Integration tests of
 * one class may run in parallel (-j N), as Go's t.Parallel. A skip is impossible by design.
 *
 *     java -cp CLASSES dev.taskpush.TapRunner [-j N] [-only NAME] CLASS...
 */
public final class TapRunner {
    /** What a test uses: cleanups run last-in first-out, log lines printed when it fails. */
    public static final class TestContext {
        final String name;
        final Deque<AutoCloseable> cleanups = new ArrayDeque<>();
        final List<String> log = new ArrayList<>();

        TestContext(String name) { this.name = name; }

        public String name() { return name; }

        public synchronized void cleanup(AutoCloseable c) { cleanups.push(c); }

        public synchronized void log(String line) { log.add(line); }
    }

    record Case(String name, Method m) {}

    public static void main(String[] args) throws Exception {
        int parallel = 1;
        String only = null;
        List<Case> cases = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("-j")) { parallel = Integer.parseInt(args[++i]); continue; }
            if (args[i].equals("-only")) { only = args[++i]; continue; }
            Class<?> k = Class.forName(args[i]);
            Method[] ms = k.getDeclaredMethods();
            Arrays.sort(ms, Comparator.comparing(Method::getName));
            for (Method m : ms) {
                if (m.getName().startsWith("test") && Modifier.isStatic(m.getModifiers())
                        && Modifier.isPublic(m.getModifiers())) {
                    String name = k.getSimpleName() + "." + m.getName();
                    if (only == null || name.contains(only)) cases.add(new Case(name, m));
                }
            }
        }
        ExecutorService pool = Executors.newFixedThreadPool(parallel);
        List<Future<String>> results = new ArrayList<>();
        for (Case c : cases) results.add(pool.submit(() -> run(c)));
        int n = 0;
        boolean allOk = true;
        for (int i = 0; i < cases.size(); i++) {
            String r = results.get(i).get();
            n++;
            boolean ok = r == null;
            allOk &= ok;
            System.out.println((ok ? "ok " : "not ok ") + n + " - " + cases.get(i).name());
            if (!ok) for (String l : r.split("\n")) System.out.println("# " + l);
            System.out.flush();
        }
        pool.shutdown();
        pool.awaitTermination(1, TimeUnit.MINUTES);
        System.out.println("1.." + n);
        System.exit(allOk && n > 0 ? 0 : 1);
    }

    private static String run(Case c) {
        TestContext t = new TestContext(c.name());
        Throwable failure = null;
        try {
            c.m().invoke(null, t);
        } catch (InvocationTargetException e) {
            failure = e.getCause();
        } catch (Throwable e) {
            failure = e;
        }
        while (true) {
            AutoCloseable cl;
            synchronized (t) {
                cl = t.cleanups.poll();
            }
            if (cl == null) break;
            try {
                cl.close();
            } catch (Throwable e) {
                if (failure == null) failure = e;
                else failure.addSuppressed(e);
            }
        }
        if (failure == null) return null;
        StringWriter sw = new StringWriter();
        failure.printStackTrace(new PrintWriter(sw));
        StringBuilder sb = new StringBuilder(sw.toString());
        synchronized (t) {
            List<String> lines = t.log;
            if (!lines.isEmpty()) sb.append("---- log ----\n");
            for (String l : lines.subList(Math.max(0, lines.size() - 80), lines.size())) sb.append(l).append('\n');
        }
        return sb.toString();
    }

    /** Fails with msg unless cond holds. */
    public static void check(boolean cond, String msg) {
        if (!cond) throw new AssertionError(msg);
    }
}
