package dev.taskpush;

import static dev.taskpush.TapRunner.check;

import dev.taskpush.TapRunner.TestContext;
import java.io.StringWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

/** The Java worker of docs/worker.md is under 30 lines and compiles against the library as the page says. */
public final class DocsTest {
    private DocsTest() {}

    public static void testDocsWorkerCompiles(TestContext t) throws Exception {
        String doc = Files.readString(Harness.sourceRoot().resolve("docs/worker.md"));
        int sec = doc.indexOf("\n## Java\n");
        check(sec >= 0, "docs/worker.md has no '## Java' section");
        int b = doc.indexOf("```java\n", sec), e = doc.indexOf("```", b + 8);
        check(b >= 0 && e > b, "no ```java block in the Java section");
        String code = doc.substring(b + 8, e);
        long lines = code.chars().filter(c -> c == '\n').count();
        check(lines < 30, "the documented worker has " + lines + " lines, not under 30");
        Path dir = Harness.tempDir(t);
        Path src = dir.resolve("ResizeWorker.java");
        Files.writeString(src, code);
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        check(javac != null, "no system Java compiler (a JRE, not a JDK?)");
        StringWriter out = new StringWriter();
        boolean ok = javac.getTask(out, null, null, List.of("-Xlint:all", "-Werror", "-d", dir.toString(), "-cp",
                System.getProperty("java.class.path")), null,
                javac.getStandardFileManager(null, null, null).getJavaFileObjects(src.toFile())).call();
        check(ok, "javac of the documented worker:\n" + out);
    }
}
